/* The tensor-core attention kernels (kernels/cuda/attention_tc_kernels.cuh) run on the host
 * by an emulator (attention_tc_emu.cpp), for tests on machines without a GPU. Host arrays,
 * the arguments and layouts of ff_attention_fwd / ff_attention_bwd (include/fuseflow/kernels.h);
 * head_dim a multiple of 16 up to 128. Slow (a thread per CUDA thread): small cases only.
 * Not a backend: nothing but tests calls these. */
#ifndef FF_KERNELS_CUDA_EMU_ATTENTION_TC_EMU_H
#define FF_KERNELS_CUDA_EMU_ATTENTION_TC_EMU_H

#include <stdint.h>

/* 0, or -1 and an error naming the kernel, the block and what it did wrong (a misaligned or
 * out-of-bounds fragment tile, a partial warp mask) or an unsupported head_dim. */
int ff_emu_attention_fwd_tc(const float *qkv, int ld, const int32_t *seq_start, int S, int T, int Hq, int Hkv, int D,
                            float *out, float *lse);
/* delta [T, Hq] is workspace, written; dqkv [T, (Hq + 2 Hkv) D] ld, its q, k and v columns
 * written (=). */
int ff_emu_attention_bwd_tc(const float *qkv, int ld, const int32_t *seq_start, int S, int T, int Hq, int Hkv, int D,
                            const float *out, const float *lse, const float *dout, float *delta, float *dqkv);

#endif
