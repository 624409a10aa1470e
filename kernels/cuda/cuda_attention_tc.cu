/* Training attention on tensor cores: the forward and backward of ff_attention_fwd /
 * ff_attention_bwd (causal GQA over packed variable-length sequences) with the products
 * Q K^T, P V, dO V^T, dS K, P^T dO and dS^T Q done by WMMA (bf16 operands, fp32
 * accumulation), for head dims that are multiples of 16 up to 128. They compute what the
 * CUDA-core kernels of cuda_attention.cu compute, with Q, K, V, dO and the probabilities
 * rounded to bf16. qkv, out and dout are fp32 or bf16 storage (ff_attention_*_bf16: read
 * without a rounding of their own, out rounded once on store).
 *
 * FF_CUDA_ATTENTION picks these (cuda_backend.cu); the CUDA-core kernels of cuda_attention.cu
 * remain the exact fp32 reference and serve the other head dims. A prefill's attention against
 * the paged KV cache runs here too (k_att_cached_tc, the forward's tiling over the cache's
 * blocks); decoding's steps, a token a sequence, run on cuda_attention.cu's kernel.
 *
 * Tiling (FlashAttention-2's, deterministic): a block is 4 warps, each owning 16 rows.
 *  - forward: a block holds 64 query rows of one head and walks tiles of 64 keys of its kv
 *    head (staged as bf16 in shared memory). Each warp scores its rows (S = Q K^T into
 *    shared fp32), two lanes per row update the running max and sum and write P in bf16, the
 *    warp rescales its output rows (fp32 in shared memory) and adds P V. Memory O(T) per
 *    head: no [T, T] matrix, only a [16, 64] tile per warp.
 *  - dq: a block holds 64 query rows of one head; per key tile it recomputes P from the
 *    saved log-sum-exp, dP = dO V^T, dS = P (dP - delta), and adds dS K into accumulator
 *    fragments that stay in registers across tiles.
 *  - dk, dv: a block holds 64 key rows of one kv head; it walks every query head of the group
 *    and the query tiles from its first key to the end of its last key's sequence: P^T and
 *    dS^T as above, dV += P^T dO, dK += dS^T Q in registers.
 * Each output row has one writer; the sums run in a fixed order, so runs repeat bit for bit.
 *
 * Shared memory tiles are padded (bf16 rows of D + 8, fp32 rows of 64 + 4) so that every
 * fragment pointer is 32-byte aligned, as WMMA requires. */
#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "kernels/cuda/cuda_internal.h"

using namespace nvcuda;

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;    /* B as stored */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_t;  /* B from rows of B^T */
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* TB: rows of a tile (queries or keys); NW warps of 16 rows each; SP, PP: row strides of
 * the per-warp fp32 score and bf16 probability tiles. */
/* The head dims the kernels are instantiated for: X(d) once each. */
#define FF_TC_DIMS(X) X(16) X(32) X(48) X(64) X(80) X(96) X(112) X(128)

enum { TB = 64, NW = 4, TPB = NW * 32, SP = TB + 4, PP = TB + 8 };

/* 16 bytes of a staged row: 8 bf16 copied as they are, or 4 fp32 rounded (src NULL: zeros) */
static __device__ __forceinline__ void stage16(bf16 *dst, const bf16 *src) {
    uint4 v = {0u, 0u, 0u, 0u};
    if (src) v = *(const uint4 *)src;
    *(uint4 *)dst = v;
}
static __device__ __forceinline__ void stage16(bf16 *dst, const float *src) {
    float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
    if (src) v = *(const float4 *)src;
    *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(v.x, v.y);
    *(__nv_bfloat162 *)(dst + 2) = __floats2bfloat162_rn(v.z, v.w);
}

/* Rows r0 .. r0 + TB - 1 of a [*, D] slice (row stride ld, from column col; E: fp32 or bf16
 * storage) into sm [TB, D + 8] as bf16; rows at or past lim are zero (so that masked products
 * read zeros, never stale or non-finite data). Where the slice's rows start on 16 bytes (a
 * 16-byte aligned src, ld and col whole 16-byte units; the layers' q|k|v and attention
 * gradients are laid out so), each thread moves 16 bytes a load; else 2 elements. The same
 * values either way. */
template <int D, typename E>
static __device__ __forceinline__ void stage_bf16(bf16 *sm, const E *src, int64_t ld, int64_t col, int r0, int lim) {
    constexpr int DP = D + 8, HD = D / 2, V = 16 / (int)sizeof(E), NV = D / V;
    static_assert(D % V == 0 && (DP * sizeof(bf16)) % 16 == 0, "whole 16-byte units in a row and in a staged row");
    if ((uintptr_t)src % 16 == 0 && ld % V == 0 && col % V == 0) { /* uniform over the block */
        for (int i = threadIdx.x; i < TB * NV; i += blockDim.x) {
            const int j = i / NV, d = (i - j * NV) * V, row = r0 + j;
            stage16(sm + j * DP + d, row < lim ? src + (int64_t)row * ld + col + d : (const E *)nullptr);
        }
        return;
    }
    for (int i = threadIdx.x; i < TB * HD; i += blockDim.x) {
        int j = i / HD, d = (i - j * HD) * 2, row = r0 + j;
        float x = 0.0f, y = 0.0f;
        if (row < lim) {
            const E *p = src + (int64_t)row * ld + col + d;
            x = widen(p[0]);
            y = widen(p[1]);
        }
        *(__nv_bfloat162 *)(sm + j * DP + d) = __floats2bfloat162_rn(x, y);
    }
}

/* c[16, N] (fp32, row stride ldc) = a[16, K] b[N, K]^T, a and b bf16 row-major. */
template <int K>
static __device__ __forceinline__ void mm_abt(float *c, int ldc, int N, const bf16 *a, int lda, const bf16 *b,
                                              int ldb) {
    for (int n = 0; n < N; n += 16) {
        frag_c acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < K; k += 16) {
            frag_a fa;
            frag_b_t fb;
            wmma::load_matrix_sync(fa, a + k, lda);
            wmma::load_matrix_sync(fb, b + (int64_t)n * ldb + k, ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + n, acc, ldc, wmma::mem_row_major);
    }
}

/* acc[n] += a[16, K] b[K, 16 n .. 16 n + 15] for each of the N / 16 fragments; a and b
 * bf16 row-major. */
template <int N, int K>
static __device__ __forceinline__ void mm_ab_acc(frag_c (&acc)[N / 16], const bf16 *a, int lda, const bf16 *b,
                                                 int ldb) {
#pragma unroll
    for (int k = 0; k < K; k += 16) {
        frag_a fa;
        wmma::load_matrix_sync(fa, a + k, lda);
#pragma unroll
        for (int n = 0; n < N / 16; n++) {
            frag_b fb;
            wmma::load_matrix_sync(fb, b + (int64_t)k * ldb + n * 16, ldb);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

/* The warp's 16 accumulated rows [16, D] out through its spill tile (fp32, row stride D + 4):
 * lanes 2r and 2r + 1 write halves of row r to dst (the row's first element; nothing when the
 * row is past the tokens), times mul. The warp's reads of the tile before are done; after, the
 * tile may be used again. */
template <int D>
static __device__ __forceinline__ void write_rows(frag_c (&acc)[D / 16], float *spill, bool valid, float *dst,
                                                  float mul) {
    constexpr int OP = D + 4, HDC = D / 2;
    const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 16; n++) wmma::store_matrix_sync(spill + n * 16, acc[n], OP, wmma::mem_row_major);
    __syncwarp();
    if (valid)
        for (int c = half * HDC; c < (half + 1) * HDC; c++) dst[c] = mul * spill[r * OP + c];
    __syncwarp();
}

/* One tile of 64 keys in the forward's online softmax, for the warp's 16 rows (lanes 2r and
 * 2r + 1 share row r, each half of its columns): with the warp's unscaled scores S = Q K^T in
 * srow and seen(c) saying whether key c of the tile is visible to the lane's row, update the
 * row's running max m and sum l, write P (bf16) to prow, rescale the warp's output rows o_w and
 * add P V (v_s: the tile's values). A row that sees no key of the tile keeps m, l and its output
 * exactly (alpha 1, P 0). */
template <int D, typename Seen>
static __device__ __forceinline__ void online_tile(const float *srow, bf16 *prow, float *o_w, const bf16 *p_w, const bf16 *v_s,
                                                   float scale, float &m, float &l, Seen seen) {
    constexpr int DP = D + 8, OP = D + 4, HDC = D / 2;
    const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float *orow = o_w + r * OP;
    float mx = -INFINITY;
    for (int c = half * (TB / 2); c < (half + 1) * (TB / 2); c++)
        if (seen(c)) mx = fmaxf(mx, srow[c] * scale);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mnew = fmaxf(m, mx), alpha = mnew == -INFINITY ? 1.0f : expf(m - mnew);
    float sum = 0.0f;
    for (int c = half * (TB / 2); c < (half + 1) * (TB / 2); c++) {
        float p = seen(c) ? expf(srow[c] * scale - mnew) : 0.0f;
        prow[c] = __float2bfloat16_rn(p);
        sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = mnew;
    for (int c = half * HDC; c < (half + 1) * HDC; c++) orow[c] *= alpha;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D; n += 16) {
        frag_c acc;
        wmma::load_matrix_sync(acc, o_w + n, OP, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < TB; kk += 16) {
            frag_a fa;
            frag_b fb;
            wmma::load_matrix_sync(fa, p_w + kk, PP);
            wmma::load_matrix_sync(fb, v_s + kk * DP + n, DP);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(o_w + n, acc, OP, wmma::mem_row_major);
    }
    __syncwarp();
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* The forward's shared memory (fwd_tc_smem), as the training forward and the cached prefill
 * lay it out: Q, K and V tiles in bf16, then per warp its scores (fp32), probabilities (bf16)
 * and output rows (fp32); end: what follows them. */
template <int D>
struct fwd_tiles {
    bf16 *q, *k, *v, *p;
    float *s, *o;
    unsigned char *end;
    __device__ explicit fwd_tiles(unsigned char *smem) {
        constexpr int DP = D + 8, OP = D + 4;
        q = (bf16 *)smem, k = q + TB * DP, v = k + TB * DP;
        s = (float *)(v + TB * DP);
        p = (bf16 *)(s + NW * 16 * SP);
        o = (float *)(p + NW * 16 * PP);
        end = (unsigned char *)(o + NW * 16 * OP);
    }
};

template <int D>
static inline size_t fwd_tc_smem() {
    return (size_t)3 * TB * (D + 8) * sizeof(bf16) + (size_t)NW * 16 * SP * sizeof(float) +
           (size_t)NW * 16 * PP * sizeof(bf16) + (size_t)NW * 16 * (D + 4) * sizeof(float);
}

/* E: the storage of qkv and out, float or bf16 (ff_attention_fwd_bf16) */
template <int D, typename E>
static __global__ void __launch_bounds__(TPB) k_att_fwd_tc(const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq,
                                                           int Hkv, float scale, E *out, float *lse) {
    constexpr int DP = D + 8, OP = D + 4, HDC = D / 2;
    FF_DYN_SHARED(unsigned char, smem);
    const fwd_tiles<D> tl(smem);
    bf16 *q_s = tl.q, *k_s = tl.k, *v_s = tl.v, *p_all = tl.p;
    float *s_all = tl.s, *o_all = tl.o;
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *s_w = s_all + warp * 16 * SP, *o_w = o_all + warp * 16 * OP;
    bf16 *p_w = p_all + warp * 16 * PP;
    const int t0 = blockIdx.x * TB, kbeg = ss[seq_of(ss, S, t0)], kend = min(t0 + TB, T);
    /* the warp's rows w0 .. wlast (none when wlast < w0); lanes 2r and 2r + 1 share row r,
     * each half of its columns */
    const int w0 = t0 + warp * 16, wlast = min(w0 + 16, T) - 1, wmy0 = w0 <= wlast ? ss[seq_of(ss, S, w0)] : 0;
    const int r = lane >> 1, half = lane & 1, t = w0 + r;
    const bool valid = t < T;
    const int my0 = valid ? ss[seq_of(ss, S, t)] : 0;
    float *orow = o_w + r * OP;
    const float *srow = s_w + r * SP;
    bf16 *prow = p_w + r * PP;

    stage_bf16<D>(q_s, qkv, ld, (int64_t)h * D, t0, T);
    for (int c = half * HDC; c < (half + 1) * HDC; c++) orow[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int k0 = kbeg; k0 < kend; k0 += TB) {
        __syncthreads(); /* the previous tile is consumed */
        stage_bf16<D>(k_s, qkv, ld, (int64_t)(Hq + g) * D, k0, kend);
        stage_bf16<D>(v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, k0, kend);
        __syncthreads();
        if (w0 > wlast || k0 > wlast || k0 + TB <= wmy0) continue; /* warp-uniform: no key visible */
        mm_abt<D>(s_w, SP, TB, q_s + warp * 16 * DP, DP, k_s, DP);
        __syncwarp();
        online_tile<D>(srow, prow, o_w, p_w, v_s, scale, m, l, [&](int c) {
            const int key = k0 + c;
            return valid && key >= my0 && key <= t;
        });
    }
    if (!valid) return; /* every valid row saw at least its own key: l > 0 */
    const float inv = 1.0f / l;
    for (int c = half * HDC; c < (half + 1) * HDC; c++) store_as(out + (int64_t)t * Hq * D + (int64_t)h * D + c, orow[c] * inv);
    if (half == 0) lse[(int64_t)t * Hq + h] = m + logf(l);
}

/* ---- a prefill against the paged KV cache ------------------------------------------------------ */

/* Cache rows of positions p0 .. p0 + TB - 1 of a sequence (block table tab, blocks of bs rows)
 * into sm [TB, D + 8] as bf16; positions at or past lim are zero. */
template <int D, typename KV>
static __device__ __forceinline__ void stage_paged_bf16(bf16 *sm, const KV *src, int64_t ld, int64_t col,
                                                        const int32_t *tab, int bs, int p0, int lim) {
    constexpr int DP = D + 8;
    for (int i = threadIdx.x; i < TB * D; i += blockDim.x) {
        int j = i / D, d = i - j * D, p = p0 + j;
        float x = 0.0f;
        if (p < lim) x = widen(src[((int64_t)tab[p / bs] * bs + p % bs) * ld + col + d]);
        sm[j * DP + d] = __float2bfloat16_rn(x);
    }
}

/* The forward of k_att_fwd_tc for 64 query rows of one head whose keys are in a paged cache:
 * row t attends to positions 0 .. n_keys[t] - 1 of sequence seq[t]. The block takes the
 * sequences of its rows one after another (in the order their first rows come): for each, it
 * walks tiles of 64 of its positions up to the longest of its rows' key counts, each warp with
 * a row of that sequence scoring, the others' rows masked (their running max, sum and output
 * unchanged). A prefill's rows of one prompt are together, so a block sees one sequence, or a
 * few where short prompts are packed. */
enum { TCC_SMALL = 2 * TB + NW + 2 }; /* ints of the block's row table */

template <int D>
static inline size_t cached_tc_smem() {
    return (size_t)3 * TB * (D + 8) * sizeof(bf16) + (size_t)NW * 16 * SP * sizeof(float) +
           (size_t)NW * 16 * PP * sizeof(bf16) + (size_t)NW * 16 * (D + 4) * sizeof(float) + TCC_SMALL * sizeof(int);
}

template <int D, typename KV>
static __global__ void __launch_bounds__(TPB)
    k_att_cached_tc(const float *q, int ldq, const KV *kc, const KV *vc, const int32_t *table, int table_ld, int bs,
                    const int32_t *seq, const int32_t *nkeys, int T, int Hq, int Hkv, float scale, float *out) {
    constexpr int DP = D + 8, OP = D + 4, HDC = D / 2;
    FF_DYN_SHARED(unsigned char, smem);
    const fwd_tiles<D> tl(smem);
    bf16 *q_s = tl.q, *k_s = tl.k, *v_s = tl.v, *p_all = tl.p;
    float *s_all = tl.s, *o_all = tl.o;
    int *row_seq = (int *)tl.end, *row_n = row_seq + TB, *warp_in = row_n + TB, *cur_s = warp_in + NW;
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t KD = (int64_t)Hkv * D;
    float *s_w = s_all + warp * 16 * SP, *o_w = o_all + warp * 16 * OP;
    bf16 *p_w = p_all + warp * 16 * PP;
    const int t0 = blockIdx.x * TB;
    const int r = lane >> 1, half = lane & 1, rb = warp * 16 + r, t = t0 + rb;
    const bool valid = t < T;
    float *orow = o_w + r * OP;
    const float *srow = s_w + r * SP;
    bf16 *prow = p_w + r * PP;

    for (int i = threadIdx.x; i < TB; i += blockDim.x) {
        row_seq[i] = t0 + i < T ? seq[t0 + i] : -1; /* -1: no row, or a row done */
        row_n[i] = t0 + i < T ? nkeys[t0 + i] : 0;
    }
    stage_bf16<D>(q_s, q, ldq, (int64_t)h * D, t0, T);
    for (int c = half * HDC; c < (half + 1) * HDC; c++) orow[c] = 0.0f;
    const int my_seq = valid ? seq[t] : -1, my_n = valid ? nkeys[t] : 0;
    float m = -INFINITY, l = 0.0f;
    for (;;) {
        __syncthreads(); /* row_seq final for this round, the previous tiles consumed */
        if (threadIdx.x == 0) { /* the next sequence: the first row not done; its rows marked done */
            int cur = -1, kmax = 0;
            for (int i = 0; i < TB; i++)
                if (row_seq[i] >= 0) {
                    cur = row_seq[i];
                    break;
                }
            for (int w = 0; w < NW; w++) warp_in[w] = 0;
            for (int i = 0; cur >= 0 && i < TB; i++)
                if (row_seq[i] == cur) {
                    kmax = max(kmax, row_n[i]);
                    warp_in[i / 16] = 1;
                    row_seq[i] = -1;
                }
            cur_s[0] = cur;
            cur_s[1] = kmax;
        }
        __syncthreads();
        const int cur = cur_s[0], kmax = cur_s[1];
        if (cur < 0) break;
        const int32_t *tab = table + (int64_t)cur * table_ld;
        const bool mine = my_seq == cur, wmine = warp_in[warp] != 0;
        for (int k0 = 0; k0 < kmax; k0 += TB) {
            __syncthreads(); /* the previous tile is consumed */
            stage_paged_bf16<D>(k_s, kc, KD, (int64_t)g * D, tab, bs, k0, kmax);
            stage_paged_bf16<D>(v_s, vc, KD, (int64_t)g * D, tab, bs, k0, kmax);
            __syncthreads();
            if (!wmine) continue; /* warp-uniform: none of its rows is of this sequence */
            mm_abt<D>(s_w, SP, TB, q_s + warp * 16 * DP, DP, k_s, DP);
            __syncwarp();
            online_tile<D>(srow, prow, o_w, p_w, v_s, scale, m, l, [&](int c) { return mine && k0 + c < my_n; });
        }
    }
    if (!valid) return; /* every row saw at least one key: n_keys >= 1, l > 0 */
    const float inv = 1.0f / l;
    for (int c = half * HDC; c < (half + 1) * HDC; c++) out[(int64_t)t * Hq * D + (int64_t)h * D + c] = orow[c] * inv;
}

/* ---- backward: dq ----------------------------------------------------------------------------- */

template <int D>
static inline size_t dq_tc_smem() {
    return (size_t)4 * TB * (D + 8) * sizeof(bf16) + (size_t)NW * 2 * 16 * SP * sizeof(float) +
           (size_t)NW * 16 * PP * sizeof(bf16);
}

template <int D, typename E>
static __global__ void __launch_bounds__(TPB) k_att_dq_tc(const E *qkv, int ld, const int32_t *ss, int S, int T,
                                                          int Hq, int Hkv, float scale, const float *lse,
                                                          const E *dout, const float *delta, float *dqkv) {
    constexpr int DP = D + 8, OP = D + 4;
    static_assert(16 * OP <= 2 * 16 * SP, "the accumulators' spill tile fits the warp's two score tiles");
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *q_s = (bf16 *)smem, *do_s = q_s + TB * DP, *k_s = do_s + TB * DP, *v_s = k_s + TB * DP;
    float *f_all = (float *)(v_s + TB * DP);
    bf16 *ds_all = (bf16 *)(f_all + NW * 2 * 16 * SP);
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *s_w = f_all + warp * 2 * 16 * SP, *dp_w = s_w + 16 * SP;
    bf16 *ds_w = ds_all + warp * 16 * PP;
    const int64_t HD = (int64_t)Hq * D;
    const int t0 = blockIdx.x * TB, kbeg = ss[seq_of(ss, S, t0)], kend = min(t0 + TB, T);
    const int w0 = t0 + warp * 16, wlast = min(w0 + 16, T) - 1, wmy0 = w0 <= wlast ? ss[seq_of(ss, S, w0)] : 0;
    const int r = lane >> 1, half = lane & 1, t = w0 + r;
    const bool valid = t < T;
    const int my0 = valid ? ss[seq_of(ss, S, t)] : 0;
    const float lse_t = valid ? lse[(int64_t)t * Hq + h] : 0.0f, delta_t = valid ? delta[(int64_t)t * Hq + h] : 0.0f;

    stage_bf16<D>(q_s, qkv, ld, (int64_t)h * D, t0, T);
    stage_bf16<D>(do_s, dout, HD, (int64_t)h * D, t0, T);
    frag_c acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
    for (int k0 = kbeg; k0 < kend; k0 += TB) {
        __syncthreads();
        stage_bf16<D>(k_s, qkv, ld, (int64_t)(Hq + g) * D, k0, kend);
        stage_bf16<D>(v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, k0, kend);
        __syncthreads();
        if (w0 > wlast || k0 > wlast || k0 + TB <= wmy0) continue;
        mm_abt<D>(s_w, SP, TB, q_s + warp * 16 * DP, DP, k_s, DP);
        mm_abt<D>(dp_w, SP, TB, do_s + warp * 16 * DP, DP, v_s, DP);
        __syncwarp();
        for (int c = half * (TB / 2); c < (half + 1) * (TB / 2); c++) {
            int key = k0 + c;
            float ds = 0.0f;
            if (valid && key >= my0 && key <= t) {
                float p = expf(s_w[r * SP + c] * scale - lse_t);
                ds = p * (dp_w[r * SP + c] - delta_t);
            }
            ds_w[r * PP + c] = __float2bfloat16_rn(ds);
        }
        __syncwarp();
        mm_ab_acc<D, TB>(acc, ds_w, PP, k_s, DP);
    }
    write_rows<D>(acc, s_w, valid, dqkv + (int64_t)t * ld + (int64_t)h * D, scale);
}

/* ---- backward: dk, dv ------------------------------------------------------------------------- */

template <int D>
static inline size_t dkv_tc_smem() {
    return (size_t)4 * TB * (D + 8) * sizeof(bf16) + (size_t)NW * 2 * 16 * SP * sizeof(float) +
           (size_t)NW * 16 * PP * sizeof(bf16) + (size_t)2 * TB * sizeof(float);
}

template <int D, typename E>
static __global__ void __launch_bounds__(TPB) k_att_dkv_tc(const E *qkv, int ld, const int32_t *ss, int S, int T,
                                                           int Hq, int Hkv, float scale, const float *lse,
                                                           const E *dout, const float *delta, float *dqkv) {
    constexpr int DP = D + 8, OP = D + 4;
    static_assert(16 * OP <= 2 * 16 * SP, "the accumulators' spill tile fits the warp's two score tiles");
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *k_s = (bf16 *)smem, *v_s = k_s + TB * DP, *q_s = v_s + TB * DP, *do_s = q_s + TB * DP;
    float *f_all = (float *)(do_s + TB * DP);
    bf16 *p_all = (bf16 *)(f_all + NW * 2 * 16 * SP);
    float *lse_s = (float *)(p_all + NW * 16 * PP), *dl_s = lse_s + TB;
    const int g = blockIdx.y, rep = Hq / Hkv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *s_w = f_all + warp * 2 * 16 * SP, *dp_w = s_w + 16 * SP;
    bf16 *p_w = p_all + warp * 16 * PP;
    const int64_t HD = (int64_t)Hq * D;
    const int j0 = blockIdx.x * TB, last = min(j0 + TB, T) - 1;
    const int qbeg = j0, qend = ss[seq_of(ss, S, last) + 1];
    /* the warp's keys jw0 .. jwlast; lanes 2r, 2r + 1 share key row r; queries j .. my_end - 1
     * see key j */
    const int jw0 = j0 + warp * 16, jwlast = min(jw0 + 16, T) - 1;
    const int r = lane >> 1, half = lane & 1, j = jw0 + r;
    const bool valid = j < T;
    const int my_end = valid ? ss[seq_of(ss, S, j) + 1] : 0;
    const int wend = (int)__reduce_max_sync(0xffffffffu, (unsigned)my_end);

    stage_bf16<D>(k_s, qkv, ld, (int64_t)(Hq + g) * D, j0, T);
    stage_bf16<D>(v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, j0, T);
    frag_c dk[D / 16], dv[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        for (int q0 = qbeg; q0 < qend; q0 += TB) {
            __syncthreads();
            stage_bf16<D>(q_s, qkv, ld, (int64_t)h * D, q0, qend);
            stage_bf16<D>(do_s, dout, HD, (int64_t)h * D, q0, qend);
            for (int i = threadIdx.x; i < TB; i += blockDim.x) {
                bool in = q0 + i < qend;
                lse_s[i] = in ? lse[(int64_t)(q0 + i) * Hq + h] : 0.0f;
                dl_s[i] = in ? delta[(int64_t)(q0 + i) * Hq + h] : 0.0f;
            }
            __syncthreads();
            if (jw0 > jwlast || q0 + TB <= jw0 || q0 >= wend) continue; /* warp-uniform */
            /* S^T [16 keys, TB queries] = K_w Q^T, then P^T in place (fp32) and in bf16 */
            mm_abt<D>(s_w, SP, TB, k_s + warp * 16 * DP, DP, q_s, DP);
            __syncwarp();
            for (int c = half * (TB / 2); c < (half + 1) * (TB / 2); c++) {
                int tq = q0 + c;
                float p = valid && tq >= j && tq < my_end ? expf(s_w[r * SP + c] * scale - lse_s[c]) : 0.0f;
                s_w[r * SP + c] = p;
                p_w[r * PP + c] = __float2bfloat16_rn(p);
            }
            __syncwarp();
            mm_ab_acc<D, TB>(dv, p_w, PP, do_s, DP);
            /* dP^T = V_w dO^T, dS^T = P^T (dP^T - delta) into the bf16 tile P^T occupied */
            mm_abt<D>(dp_w, SP, TB, v_s + warp * 16 * DP, DP, do_s, DP);
            __syncwarp();
            for (int c = half * (TB / 2); c < (half + 1) * (TB / 2); c++) {
                int tq = q0 + c;
                float ds = valid && tq >= j && tq < my_end ? s_w[r * SP + c] * (dp_w[r * SP + c] - dl_s[c]) : 0.0f;
                p_w[r * PP + c] = __float2bfloat16_rn(ds);
            }
            __syncwarp();
            mm_ab_acc<D, TB>(dk, p_w, PP, q_s, DP);
        }
    }
    write_rows<D>(dk, s_w, valid, dqkv + (int64_t)j * ld + (int64_t)(Hq + g) * D, scale);
    write_rows<D>(dv, s_w, valid, dqkv + (int64_t)j * ld + (int64_t)(Hq + Hkv + g) * D, 1.0f);
}

/* ---- launchers -------------------------------------------------------------------------------- */

template <int D, typename E>
static void fwd_tc(ff_stream *s, const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv, E *out,
                   float *lse) {
    FF_LAUNCH((k_att_fwd_tc<D, E>), dim3((T + TB - 1) / TB, Hq), TPB, fwd_tc_smem<D>(), CS(s), 
        qkv, ld, ss, S, T, Hq, Hkv, 1.0f / sqrtf((float)D), out, lse);
}

template <int D, typename E>
static void bwd_tc(ff_stream *s, const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv,
                   const float *lse, const E *dout, const float *delta, float *dqkv) {
    const float scale = 1.0f / sqrtf((float)D);
    FF_LAUNCH((k_att_dq_tc<D, E>), dim3((T + TB - 1) / TB, Hq), TPB, dq_tc_smem<D>(), CS(s), qkv, ld, ss, S, T, Hq, Hkv, scale,
                                                                                lse, dout, delta, dqkv);
    FF_LAUNCH((k_att_dkv_tc<D, E>), dim3((T + TB - 1) / TB, Hkv), TPB, dkv_tc_smem<D>(), CS(s), qkv, ld, ss, S, T, Hq, Hkv, scale,
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

/* A head dim without tensor-core kernels (callers check ff_cuda_attention_tc_fits first). */
static void no_tc_kernel(ff_stream *s, int D) {
    ff_error_set("cuda attention", "use FF_CUDA_ATTENTION=fp32", "no tensor-core kernel for head_dim %d", D);
    ff_stream_fail(s);
}


void ff_cuda_attention_fwd_tc(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                              int D, ff_dptr out, ff_dptr lse, bool b16) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    switch (D) {
#define X(d)                                                                         \
    case d:                                                                          \
        if (b16) fwd_tc<d>(s, BF(qkv), ld, I32(seq_start), S, T, Hq, Hkv, BF(out), F(lse)); \
        else fwd_tc<d>(s, F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, F(out), F(lse));       \
        break;
        FF_TC_DIMS(X)
#undef X
    default:
        no_tc_kernel(s, D);
        return;
    }
    ff_cuda_check_launch(s, b16 ? "attention_fwd_bf16 (tensor cores)" : "attention_fwd (tensor cores)");
}

void ff_cuda_attention_bwd_tc(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv,
                              int D, ff_dptr out, ff_dptr lse, ff_dptr dout, ff_dptr delta, ff_dptr dqkv, bool b16) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    const int64_t rows = (int64_t)T * Hq;
    const unsigned dblocks = (unsigned)((rows * 32 + 255) / 256);
    if (b16) FF_LAUNCH(k_att_delta<bf16>, dblocks, 256, 0, CS(s), BF(out), BF(dout), F(delta), rows, D);
    else FF_LAUNCH(k_att_delta<float>, dblocks, 256, 0, CS(s), F(out), F(dout), F(delta), rows, D);
    switch (D) {
#define X(d)                                                                                                  \
    case d:                                                                                                   \
        if (b16) bwd_tc<d>(s, BF(qkv), ld, I32(seq_start), S, T, Hq, Hkv, F(lse), BF(dout), F(delta), F(dqkv)); \
        else bwd_tc<d>(s, F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, F(lse), F(dout), F(delta), F(dqkv));     \
        break;
        FF_TC_DIMS(X)
#undef X
    default:
        no_tc_kernel(s, D);
        return;
    }
    ff_cuda_check_launch(s, b16 ? "attention_bwd_bf16 (tensor cores)" : "attention_bwd (tensor cores)");
}

void ff_cuda_attention_cached_tc(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, bool kv16, ff_dptr table,
                                 int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                                 ff_dptr out) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    const float scale = 1.0f / sqrtf((float)D);
    const dim3 grid((T + TB - 1) / TB, Hq);
    switch (D) {
#define X(d)                                                                                                             \
    case d:                                                                                                              \
        if (kv16)                                                                                                        \
            FF_LAUNCH((k_att_cached_tc<d, bf16>), grid, TPB, cached_tc_smem<d>(), CS(s), F(q), ldq,                      \
                      (const bf16 *)(const void *)F(kcache), (const bf16 *)(const void *)F(vcache), I32(table), table_ld, \
                      block_rows, I32(seq), I32(n_keys), T, Hq, Hkv, scale, F(out));                                     \
        else                                                                                                             \
            FF_LAUNCH((k_att_cached_tc<d, float>), grid, TPB, cached_tc_smem<d>(), CS(s), F(q), ldq, F(kcache),          \
                      F(vcache), I32(table), table_ld, block_rows, I32(seq), I32(n_keys), T, Hq, Hkv, scale, F(out));    \
        break;
        FF_TC_DIMS(X)
#undef X
    default:
        no_tc_kernel(s, D);
        return;
    }
    ff_cuda_check_launch(s, kv16 ? "attention_cached_bf16 (tensor cores)" : "attention_cached (tensor cores)");
}

int ff_cuda_attention_tc_init(void) {
    struct {
        const void *fn;
        size_t bytes;
    } k[] = {
#define X(d)                                                      \
    {(const void *)k_att_fwd_tc<d, float>, fwd_tc_smem<d>()},                           \
        {(const void *)k_att_fwd_tc<d, bf16>, fwd_tc_smem<d>()},                        \
        {(const void *)k_att_dq_tc<d, float>, dq_tc_smem<d>()},                         \
        {(const void *)k_att_dq_tc<d, bf16>, dq_tc_smem<d>()},                          \
        {(const void *)k_att_dkv_tc<d, float>, dkv_tc_smem<d>()},                       \
        {(const void *)k_att_dkv_tc<d, bf16>, dkv_tc_smem<d>()},                        \
        {(const void *)k_att_cached_tc<d, float>, cached_tc_smem<d>()},                  \
        {(const void *)k_att_cached_tc<d, bf16>, cached_tc_smem<d>()},
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
