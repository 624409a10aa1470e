/* The backend function table: what a backend (kernels/cpu/, kernels/cuda/) implements. Only
 * backends and kernels/backend.c include this; everything else uses the opaque handles of
 * include/fuseflow/backend.h and the wrappers of include/fuseflow/kernels.h, which check
 * arguments and dispatch here. */
#ifndef FF_KERNELS_BACKEND_IMPL_H
#define FF_KERNELS_BACKEND_IMPL_H

#include "fuseflow/backend.h"
#include "fuseflow/kernels.h"

typedef struct ff_backend_ops {
    /* memory: *data is the device address of `bytes` zeroed bytes */
    int (*alloc)(ff_backend *be, size_t bytes, void **data);
    void (*free)(ff_backend *be, void *data);
    void (*h2d)(ff_stream *s, ff_dptr dst, const void *src, size_t bytes);
    void (*d2h)(ff_stream *s, void *dst, ff_dptr src, size_t bytes);
    void (*d2d)(ff_stream *s, ff_dptr dst, ff_dptr src, size_t bytes);
    void (*memset0)(ff_stream *s, ff_dptr dst, size_t bytes);
    /* the device's free bytes now, or -1 when it cannot say (NULL: the buffers are host memory) */
    int64_t (*mem_free)(ff_backend *be);
    /* NULL: one d2d per row */
    void (*d2d_2d)(ff_stream *s, ff_dptr dst, size_t dpitch, ff_dptr src, size_t spitch, size_t width, size_t rows);
    int (*stream_init)(ff_stream *s);
    void (*stream_fini)(ff_stream *s);
    int (*stream_sync)(ff_stream *s);
    /* events (NULL on a backend whose work is done when queued: recording and waiting do
     * nothing); *ev is the backend's event */
    int (*event_new)(ff_backend *be, void **ev);
    void (*event_free)(ff_backend *be, void *ev);
    void (*event_record)(ff_stream *s, void *ev);
    void (*stream_wait)(ff_stream *s, void *ev);
    void *(*stream_native)(ff_stream *s); /* NULL: none */
    /* graphs (NULL: none, ff_backend_has_stream_graphs): capture_end always ends the capture, and
     * returns -1 + error when it could not make the graph; *graph is the backend's */
    int (*capture_begin)(ff_stream *s);
    int (*capture_end)(ff_stream *s, void **graph);
    int (*graph_launch)(ff_stream *s, void *graph);
    bool (*capture_invalidated)(ff_stream *s); /* the device's capture on s can no longer make a graph */
    void (*graph_free)(ff_stream *s, void *graph); /* s: the stream it was captured on */
    void (*destroy)(ff_backend *be);

    /* kernels: the signatures and contracts of include/fuseflow/kernels.h */
    void (*gemm)(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, int lda,
                 ff_dptr B, int ldb, float beta, ff_dptr C, int ldc);
    void (*gemm_bf16w)(ff_stream *s, int M, int N, int K, ff_dptr A, int lda, ff_dptr W, int ldw, float beta, ff_dptr C,
                       int ldc);
    /* c16: C holds bf16 (ff_gemm_bf16_out: alpha 1, beta 0, K >= 1) */
    void (*gemm_bf16)(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, bool a16,
                      int lda, ff_dptr B, bool b16, int ldb, float beta, ff_dptr C, bool c16, int ldc);
    void (*embedding_fwd_bf16)(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H);
    void (*cast_f32_bf16)(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n);
    void (*cast_bf16_f32)(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n);
    void (*embedding_fwd)(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H);
    void (*embedding_bwd)(ff_stream *s, ff_dptr tokens, ff_dptr dout, ff_dptr dtable, int T, int H);
    void (*rmsnorm_fwd)(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, int T, int H, float eps);
    void (*rmsnorm_bwd)(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr rstd, ff_dptr dout, ff_dptr dx, ff_dptr dw,
                        int T, int H);
    void (*rope)(ff_stream *s, ff_dptr x, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads,
                 int D, int inverse);
    void (*bias_add)(ff_stream *s, ff_dptr x, int ld, ff_dptr b, int T, int N);
    void (*bias_bwd)(ff_stream *s, ff_dptr dy, int ld, ff_dptr db, int T, int N);
    /* b16: every tensor but none holds bf16 (ff_swiglu_fwd_bf16, ff_swiglu_bwd_bf16) */
    void (*swiglu_fwd)(ff_stream *s, ff_dptr gu, ff_dptr h, int T, int inter, bool b16);
    void (*swiglu_bwd)(ff_stream *s, ff_dptr gu, ff_dptr dh, ff_dptr dgu, int T, int inter, bool b16);
    /* b16: qkv, out and dout hold bf16 (ff_attention_fwd_bf16, ff_attention_bwd_bf16) */
    void (*attention_fwd)(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                          int D, ff_dptr out, ff_dptr lse, bool b16);
    void (*attention_bwd)(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, const int32_t *seq_start_host,
                          int S, int T, int Hq, int Hkv, int D, ff_dptr out, ff_dptr lse, ff_dptr dout,
                          ff_dptr delta, ff_dptr dqkv, bool b16);
    void (*attention_cached)(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                             int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                             ff_dptr out);
    void (*attention_cached_bf16)(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                                  int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv,
                                  int D, ff_dptr out);
    void (*scatter_rows_bf16)(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N);
    void (*scatter_rows)(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N);
    void (*gather_rows)(ff_stream *s, ff_dptr src, ff_dptr rows, ff_dptr dst, int R, int N);
    void (*logprob_fwd)(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V,
                        ff_dptr logprob, ff_dptr entropy, ff_dptr lse);
    /* b16: dlogits left in bf16 in each row's first half (ff_logprob_bwd_bf16) */
    void (*logprob_bwd)(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                        ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy, bool b16);
    void (*add)(ff_stream *s, ff_dptr y, ff_dptr x, int64_t n);
    void (*scale)(ff_stream *s, ff_dptr x, int64_t n, float alpha);
    double (*sumsq)(ff_stream *s, ff_dptr x, int64_t n);
    void (*adamw)(ff_stream *s, ff_dptr param, ff_dptr grad, ff_dptr m, ff_dptr v, int64_t n, float lr, float b1,
                  float b2, float eps, float weight_decay, float bc1, float bc2, float grad_scale);
    void (*sample)(ff_stream *s, ff_dptr logits, int B, int V, ff_dptr params, ff_dptr workspace, ff_dptr tokens,
                   ff_dptr logprob);
} ff_backend_ops;

struct ff_backend {
    const ff_backend_ops *ops;
    char name[32];
    int n_threads;
    ff_stream *stream; /* the default stream */
    void *impl;        /* the backend's own state */
    bool bf16_products; /* ff_backend_bf16_products: set by the constructor */
    bool profile;      /* FF_PROFILE_KERNELS: time every kernel (kernels/backend.c) */
    int n_prof;
    struct {
        const char *name;
        int64_t ns, calls;
    } prof[64];
    /* ff_backend_memory: the bytes of the buffers alive (and of the backend's own workspace,
     * ff_backend_count_bytes), their most so far, the count of buffers
     * (updated with __atomic builtins, a buffer may be destroyed on another thread than the one
     * that computes; plain fields, as this header is also C++'s in kernels/cuda/) */
    int64_t mem_in_use, mem_peak, mem_buffers;
    int64_t mem_capacity; /* ff_backend_memory's capacity: set by the constructor (0: host memory) */
};

struct ff_buffer {
    ff_backend *be;
    size_t size; /* bytes */
    void *data;  /* device address */
};

struct ff_event {
    ff_backend *be;
    void *impl;
};

struct ff_stream {
    ff_backend *be;
    void *impl;
    char error[512]; /* a kernel's failure (kernels return nothing): the next ff_stream_sync reports and clears it */
    bool capturing;  /* between ff_stream_capture_begin and _end */
    char capture_error[256]; /* the first call a capture could not hold (ff_stream_capture_end reports it) */
};

/* Keep the current error message (ff_error_message) as the stream's failure, for the next
 * ff_stream_sync to return: how a kernel that cannot run (out of memory) fails. */
void ff_stream_fail(ff_stream *s);
/* Device memory a backend holds outside buffers (a CUDA stream's kernel scratch and cuBLAS
 * workspace) counted in ff_backend_memory's in_use and peak: delta bytes more (negative:
 * fewer). Any thread. */
void ff_backend_count_bytes(ff_backend *be, int64_t delta);

/* Finish a backend whose ops, name, n_threads and impl are set: create its default
 * stream. 0 or -1 + error (the backend is then destroyed and *pbe NULLed). */
int ff_backend_finish_init(ff_backend **pbe);

/* The CUDA backend's constructor (kernels/cuda/), or NULL + error where it is not built. */
ff_backend *ff_backend_cuda_new(int device);
/* What ff_backend_new("cuda[:N]") calls: ff_backend_cuda_new, unless a program replaced it
 * before making any backend (the CUDA emulator's build of the command, tests/exec/fuseflow_emu.c,
 * puts ff_backend_cuda_emu_new here). */
extern ff_backend *(*ff_backend_cuda_ctor)(int device);

#endif
