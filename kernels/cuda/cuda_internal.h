/* What the files of the CUDA backend share (cuda_backend.cu: device, memory, streams, matrix
 * products, the elementwise and row-wise kernels, the optimizer; cuda_attention.cu: attention
 * on CUDA cores, the logits kernels and sampling; cuda_attention_tc.cu: attention on tensor
 * cores). Not a public header: only kernels/cuda/ includes it. Device code only through the
 * launch wrappers declared here, and the device helpers at its end. */
#ifndef FF_KERNELS_CUDA_INTERNAL_H
#define FF_KERNELS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "fuseflow/error.h"
#include "kernels/backend_impl.h"
}

/* The backend's state (ff_backend.impl). */
typedef struct cuda_impl {
    int device;
    cublasHandle_t blas;
    int math; /* CUDA_MATH_*: how ff_gemm multiplies (FF_CUDA_MATH) */
    int attention; /* CUDA_ATT_*: which training attention kernels run (FF_CUDA_ATTENTION) */
    int sm_count;
    int decode_split; /* FF_CUDA_DECODE_SPLIT: decoding's attention may split its keys (cuda_attention.cu) */
    cudaStream_t fill; /* non-blocking: zero-fills new buffers, waited for at once (cuda_alloc) */
} cuda_impl;

enum { CUDA_MATH_TF32 = 0, CUDA_MATH_FP32 = 1, CUDA_MATH_BF16 = 2 };
/* CUDA_ATT_FP32: the CUDA-core kernels (cuda_attention.cu), exact fp32; CUDA_ATT_BF16: the
 * tensor-core ones (cuda_attention_tc.cu) where the head dim has one, else the fp32 ones. */
enum { CUDA_ATT_FP32 = 0, CUDA_ATT_BF16 = 1 };

/* A stream's state (ff_stream.impl): the CUDA stream and a scratch buffer on the device
 * that kernels of this stream use (per stream, so streams running concurrently never share
 * one). */
typedef struct cuda_stream {
    cudaStream_t st;
    void *scratch; /* device */
    void *blas_ws;  /* device: cuBLAS's workspace on this stream (32 MiB, made at its first product) */
    size_t scratch_cap; /* bytes */
    bool capturing;    /* a graph capture is open on st: the scratch cannot grow */
    int graphs;        /* graphs captured on st and alive: they hold the scratch they were captured with */
    void **retired;    /* [n_retired] scratch blocks outgrown while graphs hold them: freed with the last graph */
    int n_retired;
    size_t retired_bytes; /* their bytes together (ff_backend_count_bytes counts every block of the stream) */
} cuda_stream;

static inline cudaStream_t CS(const ff_stream *s) { return ((cuda_stream *)s->impl)->st; }
static inline cuda_impl *CI(const ff_stream *s) { return (cuda_impl *)s->be->impl; }
static inline float *F(ff_dptr p) { return p.buf ? (float *)((char *)p.buf->data + p.off) : NULL; }
static inline int32_t *I32(ff_dptr p) { return p.buf ? (int32_t *)((char *)p.buf->data + p.off) : NULL; }
static inline __nv_bfloat16 *BF(ff_dptr p) { return (__nv_bfloat16 *)(void *)F(p); }

/* Make the backend's device the calling thread's (a backend may be created on one thread
 * and used on another, e.g. a worker's compute thread). */
void ff_cuda_use_device(const ff_stream *s);
/* Device scratch of at least `bytes` for kernels on s (grown, never shrunk). NULL + the
 * stream failed when out of memory, or when it must grow during a graph capture. Growing waits
 * for the stream (the old block may be in use by queued kernels); a block that graphs alive on
 * s were captured with is kept until the last of them is destroyed. */
void *ff_cuda_scratch(ff_stream *s, size_t bytes);
/* After a launch: a launch error becomes the stream's failure (ff_stream_fail). */
void ff_cuda_check_launch(ff_stream *s, const char *kernel);

/* cuda_attention.cu (b16: qkv and out hold bf16) */
void ff_cuda_attention_fwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv, int D,
                           ff_dptr out, ff_dptr lse, bool b16);
void ff_cuda_attention_bwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, const int32_t *seq_start_host, int S,
                           int T, int Hq, int Hkv, int D, ff_dptr out, ff_dptr lse, ff_dptr dout, ff_dptr delta,
                           ff_dptr dqkv, bool b16);
void ff_cuda_attention_cached(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                              int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                              ff_dptr out);
void ff_cuda_attention_cached_bf16(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                              int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                              ff_dptr out);
void ff_cuda_logprob_fwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr logprob,
                         ff_dptr entropy, ff_dptr lse);
void ff_cuda_logprob_bwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                         ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy, bool b16);
void ff_cuda_sample(ff_stream *s, ff_dptr logits, int B, int V, ff_dptr params, ff_dptr workspace, ff_dptr tokens,
                    ff_dptr logprob);
/* cuda_attention_tc.cu: the training attention on tensor cores (bf16 operands, fp32
 * accumulation) for head dims ff_cuda_attention_tc_fits (multiples of 16 up to 128); the
 * arguments as ff_attention_fwd / ff_attention_bwd's. */
int ff_cuda_attention_tc_fits(int D);
void ff_cuda_attention_fwd_tc(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                              int D, ff_dptr out, ff_dptr lse, bool b16);
void ff_cuda_attention_bwd_tc(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                              int D, ff_dptr out, ff_dptr lse, ff_dptr dout, ff_dptr delta, ff_dptr dqkv, bool b16);
/* Raise the tensor-core attention kernels' dynamic shared memory limit. 0 or -1 + error. */
/* ff_attention_cached(_bf16) of a prefill on tensor cores (k_att_cached_tc: Q, K, V rounded to
 * bf16 as the training forward's; kv16: the cache holds bf16). */
void ff_cuda_attention_cached_tc(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, bool kv16, ff_dptr table,
                                 int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                                 ff_dptr out);
int ff_cuda_attention_tc_init(void);
/* Raise the dynamic shared memory limit of the attention kernels (once, at backend creation).
 * 0 or -1 + error. */
int ff_cuda_attention_init(void);

/* ---- launches and dynamic shared memory ------------------------------------------------------ */

/* Every kernel launch is FF_LAUNCH(kernel, grid, block, shared bytes, stream, args...) and every
 * dynamic shared array FF_DYN_SHARED(type, name), so that the host emulator
 * (kernels/cuda/emu/, which defines both itself) compiles these same files with a C++ compiler. */
#ifndef FF_CUDA_EMU
#define FF_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define FF_DYN_SHARED(type, name) extern __shared__ __align__(128) type name[]
#endif

/* ---- device helpers (all files) ------------------------------------------------------------- */

#if defined(__CUDACC__) || defined(FF_CUDA_EMU)
/* The sequence of packed token t: the last s in [0, S) with ss[s] <= t (empty sequences before
 * it share its start). ss: i32 [S + 1] sequence starts. */
static __device__ __forceinline__ int seq_of(const int32_t *ss, int S, int t) {
    int lo = 0, hi = S - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ss[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
/* an element of fp32 or bf16 storage, as fp32 (bf16: widened exactly), and stored back (bf16:
 * rounded to nearest even) */
static __device__ __forceinline__ float widen(float x) { return x; }
static __device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ void store_as(float *p, float x) { *p = x; }
static __device__ __forceinline__ void store_as(__nv_bfloat16 *p, float x) { *p = __float2bfloat16(x); }
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
 * `red` is __shared__ float[32]. Calls __syncthreads. */
static __device__ __forceinline__ float block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}
/* delta[w] = dot(dout[w, :], out[w, :]) over rows w < rows of D elements (fp32 sums; out and
 * dout fp32 or bf16, E): the attention backward's per-row term, one warp a row, both attention
 * files' (blocks of 256 threads). */
template <typename E>
static __global__ void k_att_delta(const E *out, const E *dout, float *delta, int64_t rows, int D) {
    int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= rows) return;
    const E *o = out + w * D, *g = dout + w * D;
    float sdot = 0.0f;
    for (int d = lane; d < D; d += 32) sdot += widen(o[d]) * widen(g[d]);
    sdot = warp_sum(sdot);
    if (lane == 0) delta[w] = sdot;
}
static __device__ __forceinline__ float block_max(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return warp_max(v);
}
#endif

#endif
