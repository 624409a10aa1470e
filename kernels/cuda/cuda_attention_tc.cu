/* Training attention on tensor cores: the launchers of the kernels of
 * attention_tc_kernels.cuh (which says how they tile), the delta kernel the backward starts
 * with, and the shared-memory set-up. FF_CUDA_ATTENTION picks these (cuda_backend.cu); the
 * CUDA-core kernels of cuda_attention.cu remain the exact fp32 reference and serve the other
 * head dims. Not here: the KV-cache attention of decoding. */
#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "kernels/cuda/cuda_internal.h"

#define FF_TC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#include "kernels/cuda/attention_tc_kernels.cuh"

/* ---- launchers -------------------------------------------------------------------------------- */

/* delta[t, h] = dot(dout[t, h, :], out[t, h, :]) (fp32, as the CUDA-core backward's). */
static __global__ void k_att_delta_tc(const float *out, const float *dout, float *delta, int64_t rows, int D) {
    int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= rows) return;
    const float *o = out + w * D, *gr = dout + w * D;
    float sdot = 0.0f;
    for (int d = lane; d < D; d += 32) sdot += o[d] * gr[d];
    sdot = warp_sum(sdot);
    if (lane == 0) delta[w] = sdot;
}

template <int D>
static void fwd_tc(ff_stream *s, const float *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv,
                   float *out, float *lse) {
    k_att_fwd_tc<D><<<dim3((T + TB - 1) / TB, Hq), TPB, fwd_tc_smem<D>(), CS(s)>>>(
        qkv, ld, ss, S, T, Hq, Hkv, 1.0f / sqrtf((float)D), out, lse);
}

template <int D>
static void bwd_tc(ff_stream *s, const float *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv,
                   const float *lse, const float *dout, const float *delta, float *dqkv) {
    const float scale = 1.0f / sqrtf((float)D);
    k_att_dq_tc<D><<<dim3((T + TB - 1) / TB, Hq), TPB, dq_tc_smem<D>(), CS(s)>>>(qkv, ld, ss, S, T, Hq, Hkv, scale,
                                                                                lse, dout, delta, dqkv);
    k_att_dkv_tc<D><<<dim3((T + TB - 1) / TB, Hkv), TPB, dkv_tc_smem<D>(), CS(s)>>>(qkv, ld, ss, S, T, Hq, Hkv, scale,
                                                                                   lse, dout, delta, dqkv);
}

int ff_cuda_attention_tc_fits(int D) {
    switch (D) {
#define X(d) case d:
        FF_TC_DIMS(X)
#undef X
        return 1;
    default:
        return 0;
    }
}

void ff_cuda_attention_fwd_tc(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                              int D, ff_dptr out, ff_dptr lse) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    switch (D) {
#define X(d)                                                                               \
    case d:                                                                                \
        fwd_tc<d>(s, F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, F(out), F(lse));          \
        break;
        FF_TC_DIMS(X)
#undef X
    default:
        ff_error_set("cuda attention", "use FF_CUDA_ATTENTION=fp32", "no tensor-core kernel for head_dim %d", D);
        ff_stream_fail(s);
        return;
    }
    ff_cuda_check_launch(s, "attention_fwd (tensor cores)");
}

void ff_cuda_attention_bwd_tc(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                              int D, ff_dptr out, ff_dptr lse, ff_dptr dout, ff_dptr delta, ff_dptr dqkv) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    const int64_t rows = (int64_t)T * Hq;
    k_att_delta_tc<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, CS(s)>>>(F(out), F(dout), F(delta), rows, D);
    switch (D) {
#define X(d)                                                                                             \
    case d:                                                                                              \
        bwd_tc<d>(s, F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, F(lse), F(dout), F(delta), F(dqkv));    \
        break;
        FF_TC_DIMS(X)
#undef X
    default:
        ff_error_set("cuda attention", "use FF_CUDA_ATTENTION=fp32", "no tensor-core kernel for head_dim %d", D);
        ff_stream_fail(s);
        return;
    }
    ff_cuda_check_launch(s, "attention_bwd (tensor cores)");
}

int ff_cuda_attention_tc_init(void) {
    struct {
        const void *fn;
        size_t bytes;
    } k[] = {
#define X(d)                                                      \
    {(const void *)k_att_fwd_tc<d>, fwd_tc_smem<d>()},           \
        {(const void *)k_att_dq_tc<d>, dq_tc_smem<d>()},         \
        {(const void *)k_att_dkv_tc<d>, dkv_tc_smem<d>()},
        FF_TC_DIMS(X)
#undef X
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        cudaError_t e = cudaFuncSetAttribute(k[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k[i].bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return ff_error_set("cuda backend",
                                "the tensor-core attention needs a GPU with >= 112 KiB of shared memory per block "
                                "(sm_80 or later), or set FF_CUDA_ATTENTION=fp32",
                                "cudaFuncSetAttribute(%zu bytes): %s", k[i].bytes, cudaGetErrorString(e));
        }
    }
    return 0;
}
