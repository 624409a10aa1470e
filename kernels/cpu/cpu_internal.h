/* Shared inside the CPU backend: resolving device addresses (host memory here), the thread
 * team size, and a vectorisable exp. Not a public header. */
#ifndef FF_KERNELS_CPU_INTERNAL_H
#define FF_KERNELS_CPU_INTERNAL_H

/* GCC will not if-convert a float comparison (the clamps in ff_fast_expf, masks, maxima)
 * into a vector blend while floating-point traps are assumed possible, so those loops stay
 * scalar. Nothing here uses FP exceptions. First in every kernel file, so that all inline
 * functions of the translation unit share the setting. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend_impl.h"

/* `omp simd` is a request; under sanitizers clang cannot honour some of them and would
 * turn that into an error with -Werror. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#include "kernels/cpu/cpu_pool.h"

static inline float *F(ff_dptr p) { return p.buf ? (float *)(void *)((char *)p.buf->data + p.off) : NULL; }
/* bf16 <-> fp32 inline for the hot loops, the same as include/fuseflow/dtype.h's functions */
static inline float bf16_widen(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}
static inline uint16_t bf16_round(float x) {
    union {
        float f;
        uint32_t u;
    } v = {x};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN: quiet */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);                /* nearest even */
}
static inline int32_t *I32(ff_dptr p) { return p.buf ? (int32_t *)(void *)((char *)p.buf->data + p.off) : NULL; }
static inline int NT(const ff_stream *s) { return s->be->n_threads; }

/* FF_BATCH_INVARIANT: 0, 1 (the default: OpenBLAS padded where the probe finds its rows
 * invariant, else the fixed-order products), fixed (the fixed-order products always). */
typedef enum ff_cpu_invariance { FF_CPU_INVARIANT_OFF, FF_CPU_INVARIANT_ON, FF_CPU_INVARIANT_FIXED } ff_cpu_invariance;

/* The CPU backend's state. */
typedef struct cpu_impl {
    ff_pool *pool;
    void *scratch; /* host scratch for kernels' small tables, grown on demand */
    size_t scratch_cap;
    ff_cpu_invariance invariance; /* FF_BATCH_INVARIANT: rows of X W^T round alike whatever the batch */
} cpu_impl;

static inline ff_pool *POOL(const ff_stream *s) { return ((cpu_impl *)s->be->impl)->pool; }

/* At least `bytes` of scratch (valid until the next call; a kernel uses it for one call).
 * Allocates only when it grows. NULL when memory runs out: the stream has failed (the next
 * ff_stream_sync returns -1 with the message) and the kernel returns without computing. */
void *ff_cpu_scratch(ff_stream *s, size_t bytes);

/* fn(ctx, i0, i1) over [0, n) split into chunks run by the pool. work_per_item estimates
 * element-operations per item; below FF_PAR_MIN in all, one call on this thread. Chunks
 * hold at least FF_CHUNK_WORK of work and there are up to 4 per thread (claimed
 * dynamically); a kernel must give the same result whatever the chunking. */
typedef void (*ff_range_fn)(void *ctx, int64_t i0, int64_t i1);
void ff_cpu_for(ff_stream *s, int64_t n, double work_per_item, ff_range_fn fn, void *ctx);
#define FF_CHUNK_WORK 8192.0

/* Hot row loops are compiled for AVX-512 and AVX2 beside the baseline (x86-64-v2 is SSE4
 * only) and picked at load time by the CPU (an ifunc), so one binary runs everywhere. */
#if defined(__x86_64__) && defined(__ELF__) && !defined(FF_NO_TARGET_CLONES)
#define FF_VEC __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FF_VEC
#endif

/* Work below this many element-operations runs on the calling thread: handing chunks to
 * the pool costs a few microseconds, more than the work itself. */
#define FF_PAR_MIN 32768

/* exp(x) for x <= 0 or moderate x, in float, with no calls and no branches, so loops of it
 * vectorise. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then a degree-6 polynomial
 * (Cephes' expf coefficients): relative error about 2e-7, like expf. Inputs below -87 give
 * about 1e-38 rather than 0, which no softmax here can tell apart. */
static inline float ff_fast_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* round to nearest by adding and removing 1.5 * 2^23 (no floorf call, so it
     * vectorises without -ffast-math) */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

/* The gemm entry (cpu_backend.c). Uses the backend's scratch (ff_cpu_scratch) for an
 * A W^T product of few rows: no kernel may call it while holding that scratch. */
void ff_cpu_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, int lda,
                 ff_dptr B, int ldb, float beta, ff_dptr C, int ldc);
/* Batch invariance (cpu_backend.c): rows of X W^T are padded to a multiple of the row
 * unit (the tile of OpenBLAS's blocked kernel here, probed once) and X W^T also to at least the
 * floor rows of its shape, from which OpenBLAS takes its blocked kernel (1 where every size
 * does; probed once per shape). */
int ff_cpu_gemm_row_unit(void); /* 0: OpenBLAS's rows are not invariant, the fixed-order products are used */
int ff_cpu_gemm_floor_rows(int N, int K);

/* cpu_gemm_fixed.c: C = alpha A B^T + beta C, every element of one fixed order of operations
 * (row-major; A [M, K], B [N, K]); single-threaded. */
void ff_cpu_gemm_fixed_nt(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                          float beta, float *C, int ldc);
/* The same with B in bf16 (alpha 1), widened exactly: equal to the fp32 product of the
 * widened weights. And ff_gemm_bf16w's entry (cpu_backend.c), which splits it over the pool. */
void ff_cpu_gemm_fixed_nt_bf16(int M, int N, int K, const float *A, int lda, const uint16_t *W, int ldw, float beta,
                               float *C, int ldc);
void ff_cpu_gemm_bf16w(ff_stream *s, int M, int N, int K, ff_dptr A, int lda, ff_dptr W, int ldw, float beta,
                       ff_dptr C, int ldc);
/* The paths of the fixed-order products; all give the same bits. Tests pick one with
 * ff_cpu_gemm_fixed_path (-1 or one the CPU lacks: the widest it has), which returns the one
 * taken. */
enum { FF_FIXED_PORTABLE = 0, FF_FIXED_AVX2 = 1, FF_FIXED_AVX512 = 2 };
int ff_cpu_gemm_fixed_path(int want);

/* The kernels of the other files, entered in the ops table by cpu_backend.c. */
void ff_cpu_embedding_fwd(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H);
void ff_cpu_embedding_fwd_bf16(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H);
void ff_cpu_cast_f32_bf16(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n);
void ff_cpu_cast_bf16_f32(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n);
void ff_cpu_embedding_bwd(ff_stream *s, ff_dptr tokens, ff_dptr dout, ff_dptr dtable, int T, int H);
void ff_cpu_rmsnorm_fwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, int T, int H, float eps);
void ff_cpu_rmsnorm_bwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr rstd, ff_dptr dout, ff_dptr dx, ff_dptr dw,
                        int T, int H);
void ff_cpu_rope(ff_stream *s, ff_dptr x, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads,
                 int D, int inverse);
void ff_cpu_bias_add(ff_stream *s, ff_dptr x, int ld, ff_dptr b, int T, int N);
void ff_cpu_bias_bwd(ff_stream *s, ff_dptr dy, int ld, ff_dptr db, int T, int N);
void ff_cpu_swiglu_fwd(ff_stream *s, ff_dptr gu, ff_dptr h, int T, int inter, bool b16);
void ff_cpu_swiglu_bwd(ff_stream *s, ff_dptr gu, ff_dptr dh, ff_dptr dgu, int T, int inter, bool b16);
void ff_cpu_attention_fwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                          int D, ff_dptr out, ff_dptr lse, bool b16);
void ff_cpu_attention_bwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, const int32_t *seq_start_host,
                          int S, int T, int Hq, int Hkv, int D, ff_dptr out, ff_dptr lse, ff_dptr dout,
                          ff_dptr delta, ff_dptr dqkv, bool b16);
void ff_cpu_attention_cached(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                             int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                             ff_dptr out);
void ff_cpu_attention_cached_bf16(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                             int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                             ff_dptr out);
void ff_cpu_scatter_rows(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N);
void ff_cpu_scatter_rows_bf16(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N);
void ff_cpu_gather_rows(ff_stream *s, ff_dptr src, ff_dptr rows, ff_dptr dst, int R, int N);
void ff_cpu_logprob_fwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V,
                        ff_dptr logprob, ff_dptr entropy, ff_dptr lse);
void ff_cpu_logprob_bwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                        ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy, bool b16);
void ff_cpu_add(ff_stream *s, ff_dptr y, ff_dptr x, int64_t n);
void ff_cpu_scale(ff_stream *s, ff_dptr x, int64_t n, float alpha);
double ff_cpu_sumsq(ff_stream *s, ff_dptr x, int64_t n);
void ff_cpu_adamw(ff_stream *s, ff_dptr param, ff_dptr grad, ff_dptr m, ff_dptr v, int64_t n, float lr, float b1,
                  float b2, float eps, float weight_decay, float bc1, float bc2, float grad_scale);
void ff_cpu_sample(ff_stream *s, ff_dptr logits, int B, int V, ff_dptr params, ff_dptr workspace, ff_dptr tokens,
                   ff_dptr logprob);

#endif
