/* CUDA kernels of attention (training forward and backward over packed variable-length
 * sequences, decoding against a KV cache), of the logits (per-token log-probs and entropy,
 * forward and backward into the logits) and of sampling. fp32 arithmetic throughout; the
 * training attention reads and writes fp32 or bf16 storage (ff_attention_*_bf16). Contracts in
 * include/fuseflow/kernels.h; the CPU backend (kernels/cpu/cpu_attention.c, cpu_logits.c)
 * is the reference these are tested against (tests/kernels/test_cuda_backend.c).
 *
 * Training attention is tiled with an online softmax, so no [T, T] score matrix exists: a
 * block holds AW consecutive query rows of one head (one warp each) and walks tiles of KT
 * keys of their kv head, staged in shared memory. In a tile, lane j scores key j against
 * its warp's query (a dot over the head dimension from shared memory), the warp updates its
 * running max and sum, and then accumulates P V with lane d owning output dimensions d,
 * d + 32, ... The backward recomputes the probabilities from the saved log-sum-exp: dq by
 * query-row warps over key tiles, dk and dv by key-row warps over query tiles of every head
 * of the group, so each output row has one writer (no atomics). Memory is O(T) per head.
 *
 * This is the straightforward version: fp32 CUDA cores, no tensor cores, no pipelining of
 * the tile loads: the exact reference, and what runs under FF_CUDA_ATTENTION=fp32 (the
 * default with FF_CUDA_MATH=fp32) or for head dims the tensor-core kernels of
 * cuda_attention_tc.cu lack.
 *
 * Sampling: one block per row. Greedy is an argmax (lowest id on ties); top-k and top-p find
 * their cut by a bitwise search over a 64-bit key (probability bits, then the inverted id,
 * so the order is the CPU's: more probable first, lower id first on ties), counting or
 * summing over the row per bit; the pick is the inverse CDF over the kept tokens in
 * increasing id (a block-wide prefix sum), as the CPU's. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_internal.h"

enum { AW = 8, KT = 32, MAXD = 256, DPL = MAXD / 32, LOGIT_TPB = 512, SAMPLE_TPB = 1024 };

/* Shared memory (floats) of each attention kernel for head_dim D. */
static size_t fwd_smem(int D) { return ((size_t)AW * D + 2 * (size_t)KT * (D + 1)) * sizeof(float); }
static size_t dq_smem(int D) { return (2 * (size_t)AW * D + 2 * (size_t)KT * (D + 1)) * sizeof(float); }
static size_t dkv_smem(int D) { return (2 * (size_t)AW * D + 2 * (size_t)KT * (D + 1) + 2 * KT) * sizeof(float); }
static size_t cached_smem(int WG, int D) { return ((size_t)WG * D + 2 * (size_t)KT * (D + 1)) * sizeof(float); }

static __device__ __forceinline__ float dot_smem(const float *a, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* Stage rows [r0, r0 + n) of a [*, D] slice (row stride ld, starting at `col`) into sm
 * [n, D + 1] (padded: lane j reading row j, column d hits bank (j (D+1) + d) % 32, distinct
 * for the 32 lanes since D + 1 is odd). */
template <typename E>
static __device__ __forceinline__ void stage(float *sm, const E *src, int64_t ld, int64_t col, int r0, int n, int D,
                                             int tid, int nthreads) {
    for (int i = tid; i < n * D; i += nthreads) {
        int j = i / D, d = i - j * D;
        sm[j * (D + 1) + d] = widen(src[(int64_t)(r0 + j) * ld + col + d]);
    }
}

/* acc (lane + 32 i: element i of a [D] row) += sum over j < nk of w_j rows[j, :], where lane j
 * holds w_j and rows is [nk, D + 1] in shared memory. Every lane of the warp calls it. */
static __device__ __forceinline__ void add_rows(float (&acc)[DPL], float w, const float *rows, int nk, int D) {
    const int lane = threadIdx.x & 31;
    for (int jj = 0; jj < nk; jj++) {
        float wj = __shfl_sync(0xffffffffu, w, jj);
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int d = lane + 32 * i;
            if (d < D) acc[i] += wj * rows[jj * (D + 1) + d];
        }
    }
}

/* One tile of nk <= 32 staged keys (k_s, v_s [nk, D + 1]) in a warp's online softmax for its
 * query row q_w [D]: lane j scores key j when `ok` (its key visible), the warp's running max m,
 * sum l and unnormalised output acc (lane + 32 i: element i) take the tile in. Every lane of
 * the warp calls it (shuffles). */
static __device__ __forceinline__ void online_tile(const float *q_w, const float *k_s, const float *v_s, int nk, int D,
                                                   bool ok, float scale, float &m, float &l, float (&acc)[DPL]) {
    const int lane = threadIdx.x & 31;
    float sc = ok ? scale * dot_smem(q_w, k_s + lane * (D + 1), D) : -INFINITY;
    float mnew = fmaxf(m, warp_max(sc));
    float p = ok ? expf(sc - mnew) : 0.0f, alpha = expf(m - mnew);
    l = l * alpha + warp_sum(p);
    m = mnew;
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] *= alpha;
    add_rows(acc, p, v_s, nk, D);
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* E: the element of qkv and out, float or __nv_bfloat16 (ff_attention_fwd_bf16: widened on load,
 * out rounded on store; the sums fp32 either way). */
template <typename E>
static __global__ void k_att_fwd(const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv, int D,
                                 float scale, E *out, float *lse) {
    FF_DYN_SHARED(float, sm);
    float *q_s = sm, *k_s = q_s + AW * D, *v_s = k_s + KT * (D + 1);
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t0 = blockIdx.x * AW, t = t0 + warp;
    const bool valid = t < T;
    const int last = (t0 + AW < T ? t0 + AW : T) - 1;
    const int kbeg = ss[seq_of(ss, S, t0)], kend = last + 1;
    const int my0 = valid ? ss[seq_of(ss, S, t)] : 0;
    if (valid)
        for (int d = lane; d < D; d += 32) q_s[warp * D + d] = widen(qkv[(int64_t)t * ld + (int64_t)h * D + d]);
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    for (int k0 = kbeg; k0 < kend; k0 += KT) {
        int nk = kend - k0 < KT ? kend - k0 : KT;
        __syncthreads(); /* the previous tile is consumed (and q_s written) */
        stage(k_s, qkv, ld, (int64_t)(Hq + g) * D, k0, nk, D, threadIdx.x, blockDim.x);
        stage(v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, k0, nk, D, threadIdx.x, blockDim.x);
        __syncthreads();
        if (!valid || k0 > t || k0 + nk <= my0) continue; /* warp-uniform: no key of this tile is visible */
        const int key = k0 + lane;
        online_tile(q_s + warp * D, k_s, v_s, nk, D, lane < nk && key >= my0 && key <= t, scale, m, l, acc);
    }
    if (!valid) return;
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        if (d < D) store_as(out + (int64_t)t * Hq * D + (int64_t)h * D + d, acc[i] * inv);
    }
    if (lane == 0) lse[(int64_t)t * Hq + h] = m + logf(l);
}


void ff_cuda_attention_fwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv, int D,
                           ff_dptr out, ff_dptr lse, bool b16) {
    if (T <= 0) return;
    if (CI(s)->attention == CUDA_ATT_BF16 && ff_cuda_attention_tc_fits(D)) {
        ff_cuda_attention_fwd_tc(s, qkv, ld, seq_start, S, T, Hq, Hkv, D, out, lse, b16);
        return;
    }
    if (D > MAXD) {
        ff_error_set("cuda attention", "use a model with head_dim <= 256", "head_dim %d is above %d", D, (int)MAXD);
        ff_stream_fail(s);
        return;
    }
    ff_cuda_use_device(s);
    dim3 grid((T + AW - 1) / AW, Hq);
    const float scale = 1.0f / sqrtf((float)D);
    if (b16)
        FF_LAUNCH(k_att_fwd<__nv_bfloat16>, grid, AW * 32, fwd_smem(D), CS(s), BF(qkv), ld, I32(seq_start), S, T, Hq, Hkv,
                  D, scale, BF(out), F(lse));
    else
        FF_LAUNCH(k_att_fwd<float>, grid, AW * 32, fwd_smem(D), CS(s), F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, D, scale,
                  F(out), F(lse));
    ff_cuda_check_launch(s, b16 ? "attention_fwd_bf16" : "attention_fwd");
}

/* ---- backward --------------------------------------------------------------------------------- */

template <typename E>
static __global__ void k_att_dq(const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv, int D,
                                float scale, const float *lse, const E *dout, const float *delta, float *dqkv) {
    FF_DYN_SHARED(float, sm);
    float *q_s = sm, *do_s = q_s + AW * D, *k_s = do_s + AW * D, *v_s = k_s + KT * (D + 1);
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t0 = blockIdx.x * AW, t = t0 + warp;
    const bool valid = t < T;
    const int last = (t0 + AW < T ? t0 + AW : T) - 1;
    const int kbeg = ss[seq_of(ss, S, t0)], kend = last + 1;
    const int my0 = valid ? ss[seq_of(ss, S, t)] : 0;
    const int64_t HD = (int64_t)Hq * D;
    float lse_t = 0.0f, delta_t = 0.0f;
    if (valid) {
        for (int d = lane; d < D; d += 32) {
            q_s[warp * D + d] = widen(qkv[(int64_t)t * ld + (int64_t)h * D + d]);
            do_s[warp * D + d] = widen(dout[(int64_t)t * HD + (int64_t)h * D + d]);
        }
        lse_t = lse[(int64_t)t * Hq + h];
        delta_t = delta[(int64_t)t * Hq + h];
    }
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    for (int k0 = kbeg; k0 < kend; k0 += KT) {
        int nk = kend - k0 < KT ? kend - k0 : KT;
        __syncthreads();
        stage(k_s, qkv, ld, (int64_t)(Hq + g) * D, k0, nk, D, threadIdx.x, blockDim.x);
        stage(v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, k0, nk, D, threadIdx.x, blockDim.x);
        __syncthreads();
        if (!valid || k0 > t || k0 + nk <= my0) continue;
        int key = k0 + lane;
        bool ok = lane < nk && key >= my0 && key <= t;
        float ds = 0.0f;
        if (ok) {
            float p = expf(scale * dot_smem(q_s + warp * D, k_s + lane * (D + 1), D) - lse_t);
            float dp = dot_smem(do_s + warp * D, v_s + lane * (D + 1), D);
            ds = p * (dp - delta_t);
        }
        add_rows(acc, ds, k_s, nk, D);
    }
    if (!valid) return;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        if (d < D) dqkv[(int64_t)t * ld + (int64_t)h * D + d] = scale * acc[i];
    }
}

/* Block = AW consecutive key rows of kv head g; every query head of the group, query tiles
 * from the first key row to the end of the last key row's sequence. */
template <typename E>
static __global__ void k_att_dkv(const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv, int D,
                                 float scale, const float *lse, const E *dout, const float *delta, float *dqkv) {
    FF_DYN_SHARED(float, sm);
    float *kr_s = sm, *vr_s = kr_s + AW * D, *q_s = vr_s + AW * D, *do_s = q_s + KT * (D + 1);
    float *lse_s = do_s + KT * (D + 1), *dl_s = lse_s + KT;
    const int g = blockIdx.y, rep = Hq / Hkv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = blockIdx.x * AW, j = j0 + warp;
    const bool valid = j < T;
    const int last = (j0 + AW < T ? j0 + AW : T) - 1;
    const int qbeg = j0, qend = ss[seq_of(ss, S, last) + 1];
    const int my_end = valid ? ss[seq_of(ss, S, j) + 1] : 0; /* queries j .. my_end - 1 see key j */
    const int64_t HD = (int64_t)Hq * D;
    if (valid)
        for (int d = lane; d < D; d += 32) {
            kr_s[warp * D + d] = widen(qkv[(int64_t)j * ld + (int64_t)(Hq + g) * D + d]);
            vr_s[warp * D + d] = widen(qkv[(int64_t)j * ld + (int64_t)(Hq + Hkv + g) * D + d]);
        }
    float dk[DPL], dv[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) dk[i] = dv[i] = 0.0f;
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        for (int q0 = qbeg; q0 < qend; q0 += KT) {
            int nq = qend - q0 < KT ? qend - q0 : KT;
            __syncthreads();
            stage(q_s, qkv, ld, (int64_t)h * D, q0, nq, D, threadIdx.x, blockDim.x);
            stage(do_s, dout, HD, (int64_t)h * D, q0, nq, D, threadIdx.x, blockDim.x);
            for (int i = threadIdx.x; i < nq; i += blockDim.x) {
                lse_s[i] = lse[(int64_t)(q0 + i) * Hq + h];
                dl_s[i] = delta[(int64_t)(q0 + i) * Hq + h];
            }
            __syncthreads();
            if (!valid || q0 + nq <= j || q0 >= my_end) continue;
            int row = q0 + lane;
            bool ok = lane < nq && row >= j && row < my_end;
            float p = 0.0f, ds = 0.0f;
            if (ok) {
                p = expf(scale * dot_smem(q_s + lane * (D + 1), kr_s + warp * D, D) - lse_s[lane]);
                float dp = dot_smem(do_s + lane * (D + 1), vr_s + warp * D, D);
                ds = p * (dp - dl_s[lane]);
            }
            for (int ii = 0; ii < nq; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < D) {
                        dv[i] += pi * do_s[ii * (D + 1) + d];
                        dk[i] += dsi * q_s[ii * (D + 1) + d];
                    }
                }
            }
        }
    }
    if (!valid) return;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        if (d < D) {
            dqkv[(int64_t)j * ld + (int64_t)(Hq + g) * D + d] = scale * dk[i];
            dqkv[(int64_t)j * ld + (int64_t)(Hq + Hkv + g) * D + d] = dv[i];
        }
    }
}

void ff_cuda_attention_bwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, const int32_t *seq_start_host, int S,
                           int T, int Hq, int Hkv, int D, ff_dptr out, ff_dptr lse, ff_dptr dout, ff_dptr delta,
                           ff_dptr dqkv, bool b16) {
    (void)seq_start_host; /* the kernels find sequences on the device */
    if (T <= 0) return;
    if (CI(s)->attention == CUDA_ATT_BF16 && ff_cuda_attention_tc_fits(D)) {
        ff_cuda_attention_bwd_tc(s, qkv, ld, seq_start, S, T, Hq, Hkv, D, out, lse, dout, delta, dqkv, b16);
        return;
    }
    if (D > MAXD) {
        ff_error_set("cuda attention", "use a model with head_dim <= 256", "head_dim %d is above %d", D, (int)MAXD);
        ff_stream_fail(s);
        return;
    }
    ff_cuda_use_device(s);
    float scale = 1.0f / sqrtf((float)D);
    int64_t warps = (int64_t)T * Hq;
    const unsigned dblocks = (unsigned)((warps * 32 + 255) / 256);
    const dim3 gq((T + AW - 1) / AW, Hq), gkv((T + AW - 1) / AW, Hkv);
    if (b16) {
        FF_LAUNCH(k_att_delta<__nv_bfloat16>, dblocks, 256, 0, CS(s), BF(out), BF(dout), F(delta), warps, D);
        FF_LAUNCH(k_att_dq<__nv_bfloat16>, gq, AW * 32, dq_smem(D), CS(s), BF(qkv), ld, I32(seq_start), S, T, Hq, Hkv, D,
                  scale, F(lse), BF(dout), F(delta), F(dqkv));
        FF_LAUNCH(k_att_dkv<__nv_bfloat16>, gkv, AW * 32, dkv_smem(D), CS(s), BF(qkv), ld, I32(seq_start), S, T, Hq, Hkv, D,
                  scale, F(lse), BF(dout), F(delta), F(dqkv));
    } else {
        FF_LAUNCH(k_att_delta<float>, dblocks, 256, 0, CS(s), F(out), F(dout), F(delta), warps, D);
        FF_LAUNCH(k_att_dq<float>, gq, AW * 32, dq_smem(D), CS(s), F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, D, scale,
                  F(lse), F(dout), F(delta), F(dqkv));
        FF_LAUNCH(k_att_dkv<float>, gkv, AW * 32, dkv_smem(D), CS(s), F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, D, scale,
                  F(lse), F(dout), F(delta), F(dqkv));
    }
    ff_cuda_check_launch(s, b16 ? "attention_bwd_bf16" : "attention_bwd");
}

/* ---- against a KV cache ----------------------------------------------------------------------- */

/* Stage n cache rows of positions p0 .. p0 + n - 1 of a sequence whose block table is tab
 * (blocks of bs rows): sm[j] = src[row of p0 + j, col .. col + D). */

template <typename T>
static __device__ __forceinline__ void stage_paged(float *sm, const T *src, int64_t ld, int64_t col, const int32_t *tab,
                                                   int bs, int p0, int n, int D, int tid, int nthreads) {
    for (int i = tid; i < n * D; i += nthreads) {
        int j = i / D, d = i - j * D, p = p0 + j;
        int64_t row = (int64_t)tab[p / bs] * bs + p % bs;
        sm[j * (D + 1) + d] = widen(src[row * ld + col + d]);
    }
}

/* Decoding's attention (flash-decoding): a block per (query token, WG query heads of one kv
 * head, key split). Its warps are the heads, and they share each tile of KT cache rows that all
 * its threads stage once. So a GQA group reads its keys and values once, not once a head. The
 * split's keys [sp * chunk, min(n, (sp + 1) * chunk)) are walked with an online softmax.
 * - One split (nsplit == 1): the block writes the normalised output.
 * - Several: it writes its running max and sum, part_ml [T, Hq, nsplit, 2], and its
 *   unnormalised sum of P V, part_acc [T, Hq, nsplit, D], and k_att_combine adds the splits
 *   in order. That order is fixed, so runs repeat bit for bit.
 * Splits keep a few sequences with long contexts (the long tail of a rollout) from running a
 * few warps over thousands of keys each; attention_cached chooses their number. */
template <typename T>
static __global__ void k_att_cached(const float *q, int ldq, const T *kc, const T *vc, const int32_t *table,
                                    int table_ld, int bs, const int32_t *seq, const int32_t *nkeys, int Hq, int Hkv,
                                    int D, int WG, float scale, int chunk, int nsplit, float *out, float *part_ml,
                                    float *part_acc) {
    FF_DYN_SHARED(float, sm);
    float *q_s = sm, *k_s = q_s + WG * D, *v_s = k_s + KT * (D + 1);
    const int t = blockIdx.x, sp = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y * WG + warp, g = h / (Hq / Hkv);
    const int64_t KD = (int64_t)Hkv * D;
    const int32_t *tab = table + (int64_t)seq[t] * table_ld;
    const int n = nkeys[t], k_lo = sp * chunk, k_hi = n < k_lo + chunk ? n : k_lo + chunk;
    for (int d = lane; d < D; d += 32) q_s[warp * D + d] = q[(int64_t)t * ldq + (int64_t)h * D + d];
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    for (int k0 = k_lo; k0 < k_hi; k0 += KT) { /* block-uniform bounds: every thread reaches the barriers */
        int nk = k_hi - k0 < KT ? k_hi - k0 : KT;
        __syncthreads(); /* the previous tile is consumed (and q_s written) */
        stage_paged(k_s, kc, KD, (int64_t)g * D, tab, bs, k0, nk, D, threadIdx.x, blockDim.x);
        stage_paged(v_s, vc, KD, (int64_t)g * D, tab, bs, k0, nk, D, threadIdx.x, blockDim.x);
        __syncthreads();
        online_tile(q_s + warp * D, k_s, v_s, nk, D, lane < nk, scale, m, l, acc);
    }
    if (nsplit == 1) {
        float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int d = lane + 32 * i;
            if (d < D) out[(int64_t)t * Hq * D + (int64_t)h * D + d] = acc[i] * inv;
        }
        return;
    }
    const int64_t part = ((int64_t)t * Hq + h) * nsplit + sp; /* a split past the keys: m -inf, l 0 */
    if (lane == 0) part_ml[2 * part] = m, part_ml[2 * part + 1] = l;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = lane + 32 * i;
        if (d < D) part_acc[part * D + d] = acc[i];
    }
}

/* out [t, h] = sum_sp e^(m_sp - M) acc_sp / sum_sp e^(m_sp - M) l_sp, M = max_sp m_sp (split 0
 * always has keys: n >= 1). A warp per (token, head). */
static __global__ void k_att_combine(const float *part_ml, const float *part_acc, int Hq, int D, int nsplit, float *out) {
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int64_t p0 = ((int64_t)t * Hq + h) * nsplit;
    float M = -INFINITY;
    for (int sp = 0; sp < nsplit; sp++) M = fmaxf(M, part_ml[2 * (p0 + sp)]);
    float L = 0.0f;
    for (int sp = 0; sp < nsplit; sp++) L += expf(part_ml[2 * (p0 + sp)] - M) * part_ml[2 * (p0 + sp) + 1];
    const float inv = 1.0f / L;
    for (int d = lane; d < D; d += 32) {
        float a = 0.0f;
        for (int sp = 0; sp < nsplit; sp++) a += expf(part_ml[2 * (p0 + sp)] - M) * part_acc[(p0 + sp) * D + d];
        out[(int64_t)t * Hq * D + (int64_t)h * D + d] = a * inv;
    }
}

/* Warps a block of k_att_cached gives its heads: the largest divisor of the group size
 * Hq / Hkv up to 16. */
static int cached_heads_per_block(int Hq, int Hkv) {
    const int G = Hq / Hkv;
    int wg = G < 16 ? G : 16;
    while (G % wg) wg--;
    return wg;
}

/* The key splits: none while the blocks (T x Hq / WG) fill the GPU four times over; else
 * enough to, in chunks of at least 128 keys of the longest context the table can hold
 * (table_ld x block_rows), whole tiles each. So the count depends on the shapes only, never on
 * n_keys (a decode step captured as a graph replays with the same), and a prefill of many
 * tokens runs unsplit. sms 0 (FF_CUDA_DECODE_SPLIT=0): no splits. */
static void cached_splits(int T, int Hq, int WG, int max_keys, int sms, int *nsplit, int *chunk) {
    const int64_t blocks = (int64_t)T * (Hq / WG), want = 4 * (int64_t)sms;
    int n = 1;
    if (sms > 0 && blocks < want) {
        int64_t by_fill = (want + blocks - 1) / blocks, by_len = (max_keys + 127) / 128;
        n = (int)(by_fill < by_len ? by_fill : by_len);
        if (n < 1) n = 1;
    }
    int c = (max_keys + n - 1) / n;
    c = (c + KT - 1) / KT * KT;
    *chunk = c;
    *nsplit = (max_keys + c - 1) / c;
}

template <typename T>
static void attention_cached(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int table_ld,
                             int block_rows, ff_dptr seq, ff_dptr n_keys, int T_, int Hq, int Hkv, int D, ff_dptr out,
                             const char *what) {
    if (T_ <= 0) return;
    if (D > MAXD) {
        ff_error_set("cuda attention", "use a model with head_dim <= 256", "head_dim %d is above %d", D, (int)MAXD);
        ff_stream_fail(s);
        return;
    }
    ff_cuda_use_device(s);
    const int WG = cached_heads_per_block(Hq, Hkv);
    int nsplit, chunk;
    cached_splits(T_, Hq, WG, table_ld * block_rows, CI(s)->decode_split ? CI(s)->sm_count : 0, &nsplit, &chunk);
    float *part_ml = NULL, *part_acc = NULL;
    if (nsplit > 1) {
        const size_t parts = (size_t)T_ * Hq * nsplit;
        part_ml = (float *)ff_cuda_scratch(s, parts * (2 + (size_t)D) * sizeof(float));
        if (!part_ml) return;
        part_acc = part_ml + 2 * parts;
    }
    FF_LAUNCH(k_att_cached<T>, dim3(T_, Hq / WG, nsplit), 32 * WG, cached_smem(WG, D), CS(s), F(q), ldq,
              (const T *)(const void *)F(kcache), (const T *)(const void *)F(vcache), I32(table), table_ld, block_rows,
              I32(seq), I32(n_keys), Hq, Hkv, D, WG, 1.0f / sqrtf((float)D), chunk, nsplit, F(out), part_ml, part_acc);
    if (nsplit > 1) FF_LAUNCH(k_att_combine, dim3(T_, Hq), 32, 0, CS(s), part_ml, part_acc, Hq, D, nsplit, F(out));
    ff_cuda_check_launch(s, what);
}

/* A prefill (at least 64 tokens, 8 a sequence on average, rows of a sequence mostly together)
 * on tensor cores where the training attention runs there (FF_CUDA_ATTENTION=bf16 and its head
 * dims); decoding's steps (a token a sequence) on the CUDA-core kernel above. */
static bool cached_on_tc(ff_stream *s, int T, int S, int D) {
    return CI(s)->attention == CUDA_ATT_BF16 && ff_cuda_attention_tc_fits(D) && T >= 64 && T >= 8 * S;
}

void ff_cuda_attention_cached(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                              int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                              ff_dptr out) {
    if (cached_on_tc(s, T, S, D)) {
        ff_cuda_attention_cached_tc(s, q, ldq, kcache, vcache, false, table, table_ld, block_rows, seq, n_keys, T, Hq, Hkv,
                                    D, out);
        return;
    }
    attention_cached<float>(s, q, ldq, kcache, vcache, table, table_ld, block_rows, seq, n_keys, T, Hq, Hkv, D, out,
                            "attention_cached");
}

void ff_cuda_attention_cached_bf16(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                                   int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                                   ff_dptr out) {
    if (cached_on_tc(s, T, S, D)) {
        ff_cuda_attention_cached_tc(s, q, ldq, kcache, vcache, true, table, table_ld, block_rows, seq, n_keys, T, Hq, Hkv,
                                    D, out);
        return;
    }
    attention_cached<__nv_bfloat16>(s, q, ldq, kcache, vcache, table, table_ld, block_rows, seq, n_keys, T, Hq, Hkv, D,
                                    out, "attention_cached_bf16");
}

int ff_cuda_attention_init(void) {
    struct {
        const void *fn;
        size_t bytes;
    } k[] = {{(const void *)k_att_fwd<float>, fwd_smem(MAXD)},
             {(const void *)k_att_fwd<__nv_bfloat16>, fwd_smem(MAXD)},
             {(const void *)k_att_dq<float>, dq_smem(MAXD)},
             {(const void *)k_att_dq<__nv_bfloat16>, dq_smem(MAXD)},
             {(const void *)k_att_dkv<float>, dkv_smem(MAXD)},
             {(const void *)k_att_dkv<__nv_bfloat16>, dkv_smem(MAXD)},
             {(const void *)k_att_cached<float>, cached_smem(16, MAXD)},
             {(const void *)k_att_cached<__nv_bfloat16>, cached_smem(16, MAXD)}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        cudaError_t e = cudaFuncSetAttribute(k[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k[i].bytes);
        if (e != cudaSuccess) {
            cudaGetLastError(); /* not left for the next launch check to report */
            return ff_error_set("cuda backend", "the attention kernels need a GPU with >= 96 KiB of shared memory per block",
                                "cudaFuncSetAttribute(%zu bytes): %s", k[i].bytes, cudaGetErrorString(e));
        }
    }
    return ff_cuda_attention_tc_init();
}

/* ---- log-probs and entropy -------------------------------------------------------------------- */

static __global__ void k_logprob_fwd(const float *logits, const int32_t *targets, float it, int V, float *lp, float *ent,
                                     float *lse) {
    __shared__ float red[32];
    const int t = blockIdx.x;
    const float *z = logits + (int64_t)t * V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
    mx = block_max(mx, red) * it; /* it > 0 keeps the argmax */
    float sum = 0.0f, wsum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float zs = z[v] * it - mx, e = expf(zs);
        sum += e;
        wsum += e * zs;
    }
    sum = block_sum(sum, red);
    wsum = block_sum(wsum, red);
    if (threadIdx.x != 0) return;
    float l = logf(sum), L = mx + l;
    lse[t] = L;
    if (ent) ent[t] = l - wsum / sum;
    if (lp) {
        int y = targets[t];
        lp[t] = y >= 0 ? z[y] * it - L : 0.0f;
    }
}

void ff_cuda_logprob_fwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr logprob,
                         ff_dptr entropy, ff_dptr lse) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_logprob_fwd, T, LOGIT_TPB, 0, CS(s), F(logits), I32(targets), inv_temp, V, F(logprob), F(entropy), F(lse));
    ff_cuda_check_launch(s, "logprob_fwd");
}

/* z <- (-a p - b p (log p + H)) it, then z[y] += a it; see ff_cpu_logprob_bwd */
static __global__ void k_logprob_bwd(float *logits, const int32_t *targets, float it, int V, const float *lse,
                                     const float *dlp, const float *dent, const float *ent) {
    const int t = blockIdx.x;
    float *z = logits + (int64_t)t * V;
    float a = 0.0f;
    int y = -1;
    if (dlp && targets && targets[t] != -1) { /* <= -2: the target is in another shard */
        a = dlp[t];
        y = targets[t];
    }
    const float L = lse[t], b = dent ? dent[t] : 0.0f, H = dent ? ent[t] : 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float logp = z[v] * it - L, p = expf(logp);
        z[v] = (-a * p - b * p * (logp + H)) * it;
    }
    __syncthreads(); /* z[y] above was another thread's write */
    if (threadIdx.x == 0 && y >= 0) z[y] += a * it;
}

/* The bf16 form (ff_logprob_bwd_bf16), in place: the row in blocks of LP16_PER elements a
 * thread, in order; each block read and computed (the target's term too) before a barrier, then
 * stored as bf16 over the row's first half. A block's stores land on fp32 elements of itself or
 * of earlier blocks, all read by then; a later block's elements are never written before it is
 * read. The values are the fp32 kernel's, rounded. */
enum { LP16_PER = 8 };
static __global__ void k_logprob_bwd16(float *logits, const int32_t *targets, float it, int V, const float *lse,
                                       const float *dlp, const float *dent, const float *ent) {
    const int t = blockIdx.x;
    float *z = logits + (int64_t)t * V;
    __nv_bfloat16 *o = (__nv_bfloat16 *)z;
    float a = 0.0f;
    int y = -1;
    if (dlp && targets && targets[t] != -1) {
        a = dlp[t];
        y = targets[t];
    }
    const float L = lse[t], b = dent ? dent[t] : 0.0f, H = dent ? ent[t] : 0.0f;
    const int chunk = LP16_PER * blockDim.x;
    for (int v0 = 0; v0 < V; v0 += chunk) {
        float d[LP16_PER];
        for (int k = 0; k < LP16_PER; k++) {
            const int v = v0 + k * blockDim.x + threadIdx.x;
            if (v >= V) continue;
            float logp = z[v] * it - L, p = expf(logp);
            d[k] = (-a * p - b * p * (logp + H)) * it;
            if (v == y) d[k] += a * it;
        }
        __syncthreads(); /* the block read before any of it is written */
        for (int k = 0; k < LP16_PER; k++) {
            const int v = v0 + k * blockDim.x + threadIdx.x;
            if (v < V) o[v] = __float2bfloat16(d[k]);
        }
    }
}

void ff_cuda_logprob_bwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                         ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy, bool b16) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    if (b16)
        FF_LAUNCH(k_logprob_bwd16, T, LOGIT_TPB, 0, CS(s), F(logits), I32(targets), inv_temp, V, F(lse), F(dlogprob),
                  F(dentropy), F(entropy));
    else FF_LAUNCH(k_logprob_bwd, T, LOGIT_TPB, 0, CS(s), F(logits), I32(targets), inv_temp, V, F(lse), F(dlogprob), F(dentropy),
                   F(entropy));
    ff_cuda_check_launch(s, "logprob_bwd");
}

/* ---- sampling ----------------------------------------------------------------------------------- */

/* Order key: larger = kept first (more probable, then lower id). p >= 0, so its bits order
 * as the values. */
static __device__ __forceinline__ uint64_t order_key(float p, int v) {
    return ((uint64_t)__float_as_uint(p) << 32) | (uint64_t)(0xffffffffu - (uint32_t)v);
}

/* Block sums over the row of p where key >= thr: count (as float, exact below 2^24) or mass. */
static __device__ float kept_sum(const float *p, int V, uint64_t thr, bool mass, float *red) {
    float acc = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        if (order_key(p[v], v) >= thr) acc += mass ? p[v] : 1.0f;
    return block_sum(acc, red);
}

static __global__ void k_sample(const float *logits, int V, const ff_sample_params *params, float *probs,
                                int32_t *tokens, float *logprob) {
    __shared__ float red[32];
    __shared__ float pre[SAMPLE_TPB];
    __shared__ int best_v[32];
    __shared__ float best_z[32];
    __shared__ int pick_s, last_s;
    const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
    const float *z = logits + (int64_t)b * V;
    float *p = probs + (int64_t)b * V;
    const ff_sample_params sp = params[b];

    /* argmax, lowest id on ties */
    float bz = -INFINITY;
    int bv = V;
    for (int v = tid; v < V; v += blockDim.x)
        if (z[v] > bz) bz = z[v], bv = v; /* increasing v: the first of equal values stays */
    for (int o = 16; o > 0; o >>= 1) {
        float oz = __shfl_xor_sync(0xffffffffu, bz, o);
        int ov = __shfl_xor_sync(0xffffffffu, bv, o);
        if (oz > bz || (oz == bz && ov < bv)) bz = oz, bv = ov;
    }
    if (lane == 0) best_z[w] = bz, best_v[w] = bv;
    __syncthreads();
    if (tid == 0) {
        for (int i = 1; i < nw; i++)
            if (best_z[i] > best_z[0] || (best_z[i] == best_z[0] && best_v[i] < best_v[0]))
                best_z[0] = best_z[i], best_v[0] = best_v[i];
        if (best_v[0] >= V) best_v[0] = 0; /* all -inf or NaN: the CPU's am stays 0 */
    }
    __syncthreads();
    const int am = best_v[0];
    const float mx = z[am];
    float s1 = 0.0f;
    for (int v = tid; v < V; v += blockDim.x) s1 += expf(z[v] - mx);
    s1 = block_sum(s1, red);
    const float lse1 = mx + logf(s1);
    if (sp.temperature <= 0.0f) {
        if (tid == 0) {
            tokens[b] = am;
            logprob[b] = sp.logprob_mode == 2 ? 0.0f : z[am] - lse1;
        }
        return;
    }
    const float it = 1.0f / sp.temperature;
    float sum = 0.0f;
    for (int v = tid; v < V; v += blockDim.x) {
        p[v] = expf((z[v] - mx) * it);
        sum += p[v];
    }
    sum = block_sum(sum, red); /* also orders the p writes before the reads below */
    const float lseT = mx * it + logf(sum);
    float kept = sum;
    uint64_t thr = 0; /* keep the tokens with key >= thr */
    if ((sp.top_k > 0 && sp.top_k < V) || sp.top_p < 1.0f) {
        float mass = sum;
        if (sp.top_k > 0 && sp.top_k < V) { /* the top_k-th key: the largest thr with count(key >= thr) >= k */
            uint64_t ans = 0;
            for (int bit = 63; bit >= 0; bit--) {
                uint64_t cand = ans | ((uint64_t)1 << bit);
                if (kept_sum(p, V, cand, false, red) >= (float)sp.top_k) ans = cand;
            }
            thr = ans;
            mass = kept_sum(p, V, thr, true, red);
        }
        if (sp.top_p < 1.0f) { /* the largest thr whose kept mass still reaches top_p of the top-k mass */
            float target = sp.top_p * mass;
            uint64_t ans = 0;
            for (int bit = 63; bit >= 0; bit--) {
                uint64_t cand = ans | ((uint64_t)1 << bit);
                uint64_t c = cand > thr ? cand : thr;
                if (kept_sum(p, V, c, true, red) >= target) ans = cand;
            }
            thr = ans > thr ? ans : thr;
        }
        kept = kept_sum(p, V, thr, true, red);
    }
    /* inverse CDF over the kept tokens in increasing id: thread i owns ids [c0, c1) */
    const float u = sp.uniform * kept;
    const int per = (V + (int)blockDim.x - 1) / (int)blockDim.x, c0 = tid * per, c1 = c0 + per < V ? c0 + per : V;
    float local = 0.0f;
    int mylast = -1;
    for (int v = c0; v < c1; v++) {
        float pv = p[v];
        if (pv > 0.0f && order_key(pv, v) >= thr) local += pv, mylast = v;
    }
    pre[tid] = local;
    if (tid == 0) pick_s = V, last_s = -1;
    __syncthreads();
    for (int o = 1; o < (int)blockDim.x; o <<= 1) { /* inclusive scan (Hillis-Steele) */
        float add = tid >= o ? pre[tid - o] : 0.0f;
        __syncthreads();
        pre[tid] += add;
        __syncthreads();
    }
    if (mylast >= 0) atomicMax(&last_s, mylast);
    /* thread i owns [pre[i-1], pre[i]): the same floats bound neighbours, so the ranges tile with
     * no gap (pre[i] - local rounds, and could leave u in nobody's range); within it, its own sum
     * may round below u, and then its last kept id is the one (not the row's last: far away) */
    const float before = tid > 0 ? pre[tid - 1] : 0.0f;
    if (before <= u && u < pre[tid]) {
        float acc = before;
        int hit = mylast;
        for (int v = c0; v < c1; v++) {
            float pv = p[v];
            if (!(pv > 0.0f && order_key(pv, v) >= thr)) continue;
            acc += pv;
            if (acc > u) {
                hit = v;
                break;
            }
        }
        if (hit >= 0) atomicMin(&pick_s, hit);
    }
    __syncthreads();
    if (tid != 0) return;
    int pick = pick_s < V ? pick_s : last_s >= 0 ? last_s : am; /* rounding left u past the end */
    tokens[b] = pick;
    switch (sp.logprob_mode) {
    case 1: logprob[b] = z[pick] * it - lseT; break;
    case 2: logprob[b] = logf(p[pick] / kept); break;
    default: logprob[b] = z[pick] - lse1; break;
    }
}

void ff_cuda_sample(ff_stream *s, ff_dptr logits, int B, int V, ff_dptr params, ff_dptr workspace, ff_dptr tokens,
                    ff_dptr logprob) {
    if (B <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_sample, B, SAMPLE_TPB, 0, CS(s), F(logits), V, (const ff_sample_params *)(void *)I32(params), F(workspace),
                                          I32(tokens), F(logprob));
    ff_cuda_check_launch(s, "sample");
}
