/* fuseflow: named fp32 tensors in host memory, the hand-over format between checkpoint files
 * (safetensors, any dtype on disk) and models (which copy them into backend buffers).
 *
 * Shapes are row-major, outermost first, as in PyTorch and safetensors: a Linear weight of
 * nn.Linear(in, out) is [out, in]. The set owns names and data. */
#ifndef FUSEFLOW_TENSOR_SET_H
#define FUSEFLOW_TENSOR_SET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

#define FF_MAX_DIMS 8

typedef struct ff_host_tensor {
    char *name;
    int ndim;
    int64_t shape[FF_MAX_DIMS];
    float *data; /* numel floats, row-major */
} ff_host_tensor;

typedef struct ff_tensor_set {
    ff_host_tensor *items;
    size_t n, cap;
} ff_tensor_set;

ff_tensor_set *ff_tensor_set_new(void);
void ff_tensor_set_destroy(ff_tensor_set **s);
/* Add a zero-filled tensor. NULL + error if the name exists or memory runs out. The pointer
 * is valid until the next add. */
ff_host_tensor *ff_tensor_set_add(ff_tensor_set *s, const char *name, int ndim, const int64_t *shape);
ff_host_tensor *ff_tensor_set_find(const ff_tensor_set *s, const char *name);
int64_t ff_host_tensor_numel(const ff_host_tensor *t);
/* Does t have exactly this shape? If not, and where != NULL, sets an error: "WHERE: tensor
 * 'x' has shape [4, 8], expected [8, 4]". */
int ff_host_tensor_expect(const ff_host_tensor *t, int ndim, const int64_t *shape, const char *where);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
