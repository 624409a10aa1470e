/* fuseflow: element types shared by checkpoints (safetensors), message tensor frames and
 * kernel backends, with the conversions between them. Names follow safetensors ("F32",
 * "BF16", ...). bf16 and f16 convert to f32 exactly; f32 to bf16/f16 rounds to nearest even. */
#ifndef FUSEFLOW_DTYPE_H
#define FUSEFLOW_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef enum ff_dtype {
    FF_DTYPE_F32 = 0,
    FF_DTYPE_F16,
    FF_DTYPE_BF16,
    FF_DTYPE_F64,
    FF_DTYPE_I8,
    FF_DTYPE_U8,
    FF_DTYPE_I16,
    FF_DTYPE_I32,
    FF_DTYPE_I64,
    FF_DTYPE_BOOL,
    FF_DTYPE_COUNT
} ff_dtype;

size_t ff_dtype_size(ff_dtype t);              /* bytes per element */
const char *ff_dtype_name(ff_dtype t);         /* "F32", "BF16", ... */
/* Parse a safetensors dtype name; 0 and *out set, or -1 (no error message set: the caller
 * knows the file and names it). */
int ff_dtype_parse(const char *name, ff_dtype *out);

float ff_bf16_to_f32(uint16_t h);
uint16_t ff_f32_to_bf16(float f);
float ff_f16_to_f32(uint16_t h);
uint16_t ff_f16_from_f32(float f);

/* n elements of type `from` at src to f32 at dst (F32, F16, BF16, F64 and the integer types).
 * Returns 0, or -1 for BOOL (no message). */
int ff_dtype_to_f32(ff_dtype from, const void *src, float *dst, size_t n);
/* n f32 values to `to` (F32, F16 or BF16). Returns 0 or -1 for other types. */
int ff_dtype_from_f32(ff_dtype to, const float *src, void *dst, size_t n);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
