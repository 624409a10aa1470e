/* Training attention on tensor cores: the forward and backward of ff_attention_fwd /
 * ff_attention_bwd (causal GQA over packed variable-length sequences) with the products
 * Q K^T, P V, dO V^T, dS K, P^T dO and dS^T Q done by mma.sync (m16n8k16: bf16 operands, fp32
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
 * Tiling (FlashAttention-2's, deterministic): a block is 4 warps, each owning 16 rows; tiles of
 * 64 rows are staged as bf16 in shared memory, and everything a warp computes from them stays
 * in its registers: scores, probabilities, dP and dS are mma accumulators, and an accumulator
 * tile becomes the A operand of the next product as it is (the m16n8k16 C layout of two
 * neighbouring 8-column tiles is the A layout of one 16-column slice), so nothing round-trips
 * shared memory.
 *  - forward: a block holds 64 query rows of one head and walks tiles of 64 keys of its kv
 *    head. Each warp scores its rows (S = Q K^T), updates each row's running max and sum (the
 *    four lanes of a row exchange by shuffles), rescales its output rows and adds P V.
 *    Memory O(T) per head: no [T, T] matrix.
 *  - dq: a block holds 64 query rows of one head; per key tile it recomputes P from the saved
 *    log-sum-exp, dP = dO V^T, dS = P (dP - delta), and adds dS K to its dq rows.
 *  - dk, dv: a block holds 64 key rows of one kv head for one query head of its group and
 *    walks the query tiles from its first key to the end of its last key's sequence: it
 *    computes the transposed products directly (S^T = K Q^T, dP^T = V dO^T), so that P^T and
 *    dS^T are A operands of dV += P^T dO and dK += dS^T Q without a transpose. With several
 *    query heads a kv head, each writes its own partial rows and k_att_dkv_sum adds them in
 *    head order: Hq / Hkv times the blocks of one per kv head, for the SMs to share the causal
 *    triangle's uneven work.
 * Each output element has one writer; the sums run in a fixed order, so runs repeat bit for bit.
 *
 * Shared memory tiles are padded (bf16 rows of D + 8) so that the 8 rows an ldmatrix reads
 * fall in different banks and every row address is 16-byte aligned, as ldmatrix requires. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/cuda_internal.h"

typedef __nv_bfloat16 bf16;

/* The head dims the kernels are instantiated for: X(d) once each. */
#define FF_TC_DIMS(X) X(16) X(32) X(48) X(64) X(80) X(96) X(112) X(128)

/* TB: rows of a staged tile (queries or keys); NW warps of 16 rows each */
enum { TB = 64, NW = 4, TPB = NW * 32 };

/* ---- the warp's matrix instructions ----------------------------------------------------------
 * Register layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), for
 * lane l with g = l / 4 and c = l % 4; a 32-bit register holds two bf16, the lower index in its
 * low half:
 *   A [16 x 16] (row-major): a[0] = A(g, 2c..2c+1), a[1] = A(g+8, 2c..), a[2] = A(g, 2c+8..),
 *     a[3] = A(g+8, 2c+8..);
 *   B [16 x 8]: b0 = B(2c..2c+1, g), b1 = B(2c+8..2c+9, g);
 *   C, D [16 x 8] fp32: d[0..1] = C(g, 2c..2c+1), d[2..3] = C(g+8, 2c..2c+1).
 * ldmatrix .x4 reads four 8 x 8 bf16 matrices, lanes 8j .. 8j + 7 giving the addresses of
 * matrix j's rows; lane l gets r[j] = M_j(g, 2c..2c+1), or with .trans M_j(2c..2c+1, g). The
 * emulator (kernels/cuda/emu/) does the same with these layouts, lane by lane. */
#ifdef FF_CUDA_EMU
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *row) { ff_emu_ldmatrix_x4(r, row, 0); }
static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16 *row) { ff_emu_ldmatrix_x4(r, row, 1); }
static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    ff_emu_mma_m16n8k16_bf16(d, a, b0, b1);
}
#else
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16 *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* The A fragment of the 16 x 16 block at a (row-major, row stride ld elements). */
static __device__ __forceinline__ void load_a(uint32_t (&f)[4], const bf16 *a, int ld) {
    const int l = threadIdx.x & 31;
    ldsm_x4(f, a + ((l & 7) + 8 * ((l >> 3) & 1)) * ld + 8 * (l >> 4));
}

/* c [16 x N] (N / 8 accumulator tiles) = A [16 x K] B^T, with a [16, K] and b [N, K] bf16
 * row-major (row strides lda, ldb): the scores Q K^T, or their transposes K Q^T. */
template <int K, int N>
static __device__ __forceinline__ void mm_nt(float (&c)[N / 8][4], const bf16 *a, int lda, const bf16 *b, int ldb) {
    const int l = threadIdx.x & 31;
    /* lane l's row of B's two 8-row matrices (n), and which 8 columns (k) */
    const bf16 *bl = b + ((l & 7) + 8 * (l >> 4)) * ldb + 8 * ((l >> 3) & 1);
#pragma unroll
    for (int n = 0; n < N / 8; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k += 16) {
        uint32_t fa[4];
        load_a(fa, a + k, lda);
#pragma unroll
        for (int n = 0; n < N; n += 16) {
            uint32_t fb[4];
            ldsm_x4(fb, bl + n * ldb + k);
            mma_bf16(c[n / 8], fa, fb[0], fb[1]);
            mma_bf16(c[n / 8 + 1], fa, fb[2], fb[3]);
        }
    }
}

/* acc [16 x N] += P [16 x K] B, with P the accumulator tiles of a product (rounded to bf16
 * here) and b [K, N] bf16 row-major (row stride ldb): P V, dS K, P^T dO, dS^T Q. */
template <int K, int N>
static __device__ __forceinline__ void mm_acc_pb(float (&acc)[N / 8][4], const float (&p)[K / 8][4], const bf16 *b,
                                                 int ldb) {
    const int l = threadIdx.x & 31;
    /* lane l's row of B's 8-row matrices (k), and which 8 columns (n) */
    const bf16 *bl = b + ((l & 7) + 8 * ((l >> 3) & 1)) * ldb + 8 * (l >> 4);
#pragma unroll
    for (int k = 0; k < K; k += 16) {
        const float(&p0)[4] = p[k / 8], (&p1)[4] = p[k / 8 + 1];
        const uint32_t fa[4] = {pack_bf16(p0[0], p0[1]), pack_bf16(p0[2], p0[3]), pack_bf16(p1[0], p1[1]),
                                pack_bf16(p1[2], p1[3])};
#pragma unroll
        for (int n = 0; n < N; n += 16) {
            uint32_t fb[4];
            ldsm_x4_t(fb, bl + k * ldb + n);
            mma_bf16(acc[n / 8], fa, fb[0], fb[1]);
            mma_bf16(acc[n / 8 + 1], fa, fb[2], fb[3]);
        }
    }
}

/* Lane l's element i of accumulator tile n: row g + 8 (i / 2) of the warp's 16 (its row slot
 * i / 2), column 8 n + 2 c + i % 2 of the tile. */
static __device__ __forceinline__ int acc_col(int n, int i) { return 8 * n + 2 * (threadIdx.x & 3) + (i & 1); }

/* the max and the sum over the four lanes that share a row */
static __device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* The warp's rows [16 x D] of acc out to dst (the lane's row slot r: dst_r is its row's first
 * element, NULL when the row is past the tokens), times mul; E: fp32 or bf16 storage. */
template <int D, typename E>
static __device__ __forceinline__ void write_rows(const float (&acc)[D / 8][4], E *const (&dst)[2], const float (&mul)[2]) {
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (dst[i >> 1]) store_as(dst[i >> 1] + acc_col(n, i), mul[i >> 1] * acc[n][i]);
}

/* 16 bytes of a staged row from their load (raw): 8 bf16 as they are, or 4 fp32 rounded (the
 * pointer's type says which) */
static __device__ __forceinline__ void put16(bf16 *dst, uint4 raw, const bf16 *) { *(uint4 *)dst = raw; }
static __device__ __forceinline__ void put16(bf16 *dst, uint4 raw, const float *) {
    float4 v;
    memcpy(&v, &raw, sizeof v);
    *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(v.x, v.y);
    *(__nv_bfloat162 *)(dst + 2) = __floats2bfloat162_rn(v.z, v.w);
}

/* Whether a slice's rows start on 16 bytes: a 16-byte aligned src, ld and col whole 16-byte
 * units (the layers' q|k|v and attention gradients are laid out so). Uniform over the block. */
template <typename E>
static __device__ __forceinline__ bool rows_on_16(const E *src, int64_t ld, int64_t col) {
    constexpr int V = 16 / (int)sizeof(E);
    return (uintptr_t)src % 16 == 0 && ld % V == 0 && col % V == 0;
}

/* Rows r0 .. r0 + TB - 1 of a [*, D] slice (row stride ld, from column col; E: fp32 or bf16
 * storage) into sm [TB, D + 8] as bf16; rows at or past lim are zero (so that masked products
 * read zeros, never stale or non-finite data). Where the slice's rows start on 16 bytes, each
 * thread moves 16 bytes a load (stage_two); else 2 elements. The same values either way. */
template <int D, typename E>
static __device__ __forceinline__ void stage_bf16(bf16 *sm, const E *src, int64_t ld, int64_t col, int r0, int lim);

/* Two tiles of the same rows (K and V, or Q and dO) as stage_bf16 stages each, with every load
 * of a group (up to 4 16-byte chunks a thread a tile) issued before its stores: the loads of a
 * tile are in flight together, where one load, then its store, then the next would wait for
 * memory once a chunk (the compiler cannot move a global load past a store through a generic
 * pointer it cannot tell from shared memory). */
template <int D, typename E>
static __device__ __forceinline__ void stage_two(bf16 *sm0, const E *src0, int64_t ld0, int64_t col0, bf16 *sm1,
                                                 const E *src1, int64_t ld1, int64_t col1, int r0, int lim) {
    constexpr int DP = D + 8, V = 16 / (int)sizeof(E), NV = D / V, PER = TB * NV / TPB, G = PER < 4 ? PER : 4;
    static_assert(D % V == 0 && (DP * sizeof(bf16)) % 16 == 0, "whole 16-byte units in a row and in a staged row");
    static_assert((TB * NV) % TPB == 0, "whole chunks a thread");
    if (!rows_on_16(src0, ld0, col0) || !rows_on_16(src1, ld1, col1)) {
        stage_bf16<D>(sm0, src0, ld0, col0, r0, lim);
        stage_bf16<D>(sm1, src1, ld1, col1, r0, lim);
        return;
    }
#pragma unroll
    for (int k0 = 0; k0 < PER; k0 += G) {
        uint4 v0[G] = {}, v1[G] = {};
#pragma unroll
        for (int k = 0; k < G; k++) {
            const int i = threadIdx.x + (k0 + k) * TPB, j = i / NV, d = (i - j * NV) * V, row = r0 + j;
            if (k0 + k < PER && row < lim) {
                v0[k] = *(const uint4 *)(src0 + (int64_t)row * ld0 + col0 + d);
                v1[k] = *(const uint4 *)(src1 + (int64_t)row * ld1 + col1 + d);
            }
        }
#pragma unroll
        for (int k = 0; k < G; k++) {
            const int i = threadIdx.x + (k0 + k) * TPB, j = i / NV, d = (i - j * NV) * V;
            if (k0 + k < PER) {
                put16(sm0 + j * DP + d, v0[k], src0);
                put16(sm1 + j * DP + d, v1[k], src1);
            }
        }
    }
}

template <int D, typename E>
static __device__ __forceinline__ void stage_bf16(bf16 *sm, const E *src, int64_t ld, int64_t col, int r0, int lim) {
    constexpr int DP = D + 8, HD = D / 2, V = 16 / (int)sizeof(E), NV = D / V;
    if (rows_on_16(src, ld, col)) {
        for (int i = threadIdx.x; i < TB * NV; i += blockDim.x) {
            const int j = i / NV, d = (i - j * NV) * V, row = r0 + j;
            uint4 v = uint4{0u, 0u, 0u, 0u};
            if (row < lim) v = *(const uint4 *)(src + (int64_t)row * ld + col + d);
            put16(sm + j * DP + d, v, src);
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

/* One tile of 64 keys in the forward's online softmax, for the warp's 16 rows: with q_w the
 * warp's query rows and k_s, v_s the tile's keys and values (staged, row stride D + 8), and
 * seen(r, c) whether key c of the tile is visible to the lane's row slot r, update each row's
 * running max m and sum l and its output rows o (unnormalised): rescale, add P V. A row that
 * sees no key of the tile keeps m, l and its output exactly (alpha 1, P 0). MASK false: every
 * key of the tile is visible to every row of the warp (seen is not asked: a tile below the
 * diagonal, inside one sequence, as most are).
 *
 * In base 2 (FlashAttention-2's): sl2 is the softmax scale times log2(e) and m the running max
 * of the scores times sl2, so that each probability is one exp2f (the SFU's instruction, where
 * expf first multiplies by log2(e) in two parts for its accuracy): at head dim 64 a tile has as
 * many exponentials as 256 FLOPs of products each, the ratio of the H100's two peaks. */
template <int D, bool MASK, typename Seen>
static __device__ __forceinline__ void online_tile(const bf16 *q_w, const bf16 *k_s, const bf16 *v_s, float sl2,
                                                   float (&m)[2], float (&l)[2], float (&o)[D / 8][4], Seen seen) {
    constexpr int DP = D + 8;
    float s[TB / 8][4]; /* scores, then probabilities */
    mm_nt<D, TB>(s, q_w, DP, k_s, DP);
    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}, alpha[2];
#pragma unroll
    for (int n = 0; n < TB / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (!MASK || seen(i >> 1, acc_col(n, i))) mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i] * sl2);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float mnew = fmaxf(m[r], quad_max(mx[r]));
        alpha[r] = mnew == -INFINITY ? 1.0f : exp2f(m[r] - mnew);
        m[r] = mnew;
    }
#pragma unroll
    for (int n = 0; n < TB / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float p = !MASK || seen(i >> 1, acc_col(n, i)) ? exp2f(s[n][i] * sl2 - m[i >> 1]) : 0.0f;
            s[n][i] = p;
            sum[i >> 1] += p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + quad_sum(sum[r]);
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[n][i] *= alpha[i >> 1];
    mm_acc_pb<TB, D>(o, s, v_s, DP);
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Q, K and V tiles in bf16 */
template <int D>
static inline size_t fwd_tc_smem() {
    return (size_t)3 * TB * (D + 8) * sizeof(bf16);
}

/* E: the storage of qkv and out, float or bf16 (ff_attention_fwd_bf16) */
template <int D, typename E>
static __global__ void __launch_bounds__(TPB) k_att_fwd_tc(const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq,
                                                           int Hkv, float scale, E *out, float *lse) {
    constexpr int DP = D + 8;
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *q_s = (bf16 *)smem, *k_s = q_s + TB * DP, *v_s = k_s + TB * DP;
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the last query blocks (the most key tiles under the causal mask) first, so that the
     * grid's tail is its shortest blocks */
    const int t0 = (gridDim.x - 1 - blockIdx.x) * TB, kbeg = ss[seq_of(ss, S, t0)], kend = min(t0 + TB, T);
    /* the warp's rows w0 .. wlast (none when wlast < w0); the lane's rows t[r] = w0 + lane / 4 + 8 r */
    const int w0 = t0 + warp * 16, wlast = min(w0 + 16, T) - 1, wmy0 = w0 <= wlast ? ss[seq_of(ss, S, w0)] : 0;
    /* a tile of keys k0 .. k0 + 63 is visible whole to the warp's 16 rows when they all exist
     * and the tile lies inside the last row's sequence, at or before the first row */
    const int wmy_last = w0 <= wlast ? ss[seq_of(ss, S, wlast)] : 0;
    const bool w_whole = wlast == w0 + 15;
    const float sl2 = scale * (float)M_LOG2E;
    int t[2], my0[2];
    bool valid[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        t[r] = w0 + (lane >> 2) + 8 * r;
        valid[r] = t[r] < T;
        my0[r] = valid[r] ? ss[seq_of(ss, S, t[r])] : 0;
    }

    stage_bf16<D>(q_s, qkv, ld, (int64_t)h * D, t0, T);
    float o[D / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int k0 = kbeg; k0 < kend; k0 += TB) {
        __syncthreads(); /* the previous tile is consumed */
        stage_two<D>(k_s, qkv, ld, (int64_t)(Hq + g) * D, v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, k0, kend);
        __syncthreads();
        if (w0 > wlast || k0 > wlast || k0 + TB <= wmy0) continue; /* warp-uniform: no key visible */
        auto seen = [&](int r, int c) {
            const int key = k0 + c;
            return valid[r] && key >= my0[r] && key <= t[r];
        };
        if (w_whole && k0 >= wmy_last && k0 + TB - 1 <= w0) /* warp-uniform */
            online_tile<D, false>(q_s + warp * 16 * DP, k_s, v_s, sl2, m, l, o, seen);
        else
            online_tile<D, true>(q_s + warp * 16 * DP, k_s, v_s, sl2, m, l, o, seen);
    }
    /* every valid row saw at least its own key: l > 0 */
    E *dst[2];
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        dst[r] = valid[r] ? out + (int64_t)t[r] * Hq * D + (int64_t)h * D : nullptr;
        inv[r] = valid[r] ? 1.0f / l[r] : 0.0f;
        if (valid[r] && (lane & 3) == 0) lse[(int64_t)t[r] * Hq + h] = m[r] * (float)M_LN2 + logf(l[r]);
    }
    write_rows<D>(o, dst, inv);
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
    return fwd_tc_smem<D>() + TCC_SMALL * sizeof(int);
}

template <int D, typename KV>
static __global__ void __launch_bounds__(TPB)
    k_att_cached_tc(const float *q, int ldq, const KV *kc, const KV *vc, const int32_t *table, int table_ld, int bs,
                    const int32_t *seq, const int32_t *nkeys, int T, int Hq, int Hkv, float scale, float *out) {
    constexpr int DP = D + 8;
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *q_s = (bf16 *)smem, *k_s = q_s + TB * DP, *v_s = k_s + TB * DP;
    int *row_seq = (int *)(v_s + TB * DP), *row_n = row_seq + TB, *warp_in = row_n + TB, *cur_s = warp_in + NW;
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t KD = (int64_t)Hkv * D;
    const int t0 = blockIdx.x * TB;
    int t[2], my_seq[2], my_n[2];
    bool valid[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        t[r] = t0 + warp * 16 + (lane >> 2) + 8 * r;
        valid[r] = t[r] < T;
        my_seq[r] = valid[r] ? seq[t[r]] : -1;
        my_n[r] = valid[r] ? nkeys[t[r]] : 0;
    }

    for (int i = threadIdx.x; i < TB; i += blockDim.x) {
        row_seq[i] = t0 + i < T ? seq[t0 + i] : -1; /* -1: no row, or a row done */
        row_n[i] = t0 + i < T ? nkeys[t0 + i] : 0;
    }
    stage_bf16<D>(q_s, q, ldq, (int64_t)h * D, t0, T);
    float o[D / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
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
        const bool wmine = warp_in[warp] != 0;
        for (int k0 = 0; k0 < kmax; k0 += TB) {
            __syncthreads(); /* the previous tile is consumed */
            stage_paged_bf16<D>(k_s, kc, KD, (int64_t)g * D, tab, bs, k0, kmax);
            stage_paged_bf16<D>(v_s, vc, KD, (int64_t)g * D, tab, bs, k0, kmax);
            __syncthreads();
            if (!wmine) continue; /* warp-uniform: none of its rows is of this sequence */
            online_tile<D, true>(q_s + warp * 16 * DP, k_s, v_s, scale * (float)M_LOG2E, m, l, o,
                                 [&](int r, int c) { return my_seq[r] == cur && k0 + c < my_n[r]; });
        }
    }
    /* every row saw at least one key: n_keys >= 1, l > 0 */
    float *dst[2];
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        dst[r] = valid[r] ? out + (int64_t)t[r] * Hq * D + (int64_t)h * D : nullptr;
        inv[r] = valid[r] ? 1.0f / l[r] : 0.0f;
    }
    write_rows<D>(o, dst, inv);
}

/* ---- backward: dq ----------------------------------------------------------------------------- */

/* Q, dO, K and V tiles in bf16 */
template <int D>
static inline size_t dq_tc_smem() {
    return (size_t)4 * TB * (D + 8) * sizeof(bf16);
}

template <int D, typename E>
static __global__ void __launch_bounds__(TPB) k_att_dq_tc(const E *qkv, int ld, const int32_t *ss, int S, int T,
                                                          int Hq, int Hkv, float scale, const float *lse,
                                                          const E *dout, const float *delta, float *dqkv) {
    constexpr int DP = D + 8;
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *q_s = (bf16 *)smem, *do_s = q_s + TB * DP, *k_s = do_s + TB * DP, *v_s = k_s + TB * DP;
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t HD = (int64_t)Hq * D;
    /* the last query blocks first, as the forward's */
    const int t0 = (gridDim.x - 1 - blockIdx.x) * TB, kbeg = ss[seq_of(ss, S, t0)], kend = min(t0 + TB, T);
    const int w0 = t0 + warp * 16, wlast = min(w0 + 16, T) - 1, wmy0 = w0 <= wlast ? ss[seq_of(ss, S, w0)] : 0;
    const int wmy_last = w0 <= wlast ? ss[seq_of(ss, S, wlast)] : 0; /* as the forward's */
    const bool w_whole = wlast == w0 + 15;
    const float sl2 = scale * (float)M_LOG2E; /* P = exp2(S sl2 - lse log2(e)), as the forward's */
    int t[2], my0[2];
    bool valid[2];
    float lse2[2], delta_t[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        t[r] = w0 + (lane >> 2) + 8 * r;
        valid[r] = t[r] < T;
        my0[r] = valid[r] ? ss[seq_of(ss, S, t[r])] : 0;
        lse2[r] = valid[r] ? lse[(int64_t)t[r] * Hq + h] * (float)M_LOG2E : 0.0f;
        delta_t[r] = valid[r] ? delta[(int64_t)t[r] * Hq + h] : 0.0f;
    }

    stage_two<D>(q_s, qkv, ld, (int64_t)h * D, do_s, dout, HD, (int64_t)h * D, t0, T);
    float acc[D / 8][4] = {};
    for (int k0 = kbeg; k0 < kend; k0 += TB) {
        __syncthreads();
        stage_two<D>(k_s, qkv, ld, (int64_t)(Hq + g) * D, v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, k0, kend);
        __syncthreads();
        if (w0 > wlast || k0 > wlast || k0 + TB <= wmy0) continue; /* warp-uniform */
        float s[TB / 8][4], dp[TB / 8][4]; /* S = Q K^T, dP = dO V^T; then dS in s */
        mm_nt<D, TB>(s, q_s + warp * 16 * DP, DP, k_s, DP);
        mm_nt<D, TB>(dp, do_s + warp * 16 * DP, DP, v_s, DP);
        auto to_ds = [&](auto masked) { /* masked: std::bool_constant, the forward's MASK */
#pragma unroll
            for (int n = 0; n < TB / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = i >> 1, key = k0 + acc_col(n, i);
                    float ds = 0.0f;
                    if (!decltype(masked)::value || (valid[r] && key >= my0[r] && key <= t[r]))
                        ds = exp2f(s[n][i] * sl2 - lse2[r]) * (dp[n][i] - delta_t[r]);
                    s[n][i] = ds;
                }
        };
        if (w_whole && k0 >= wmy_last && k0 + TB - 1 <= w0) to_ds(std::false_type{}); /* warp-uniform */
        else to_ds(std::true_type{});
        mm_acc_pb<TB, D>(acc, s, k_s, DP);
    }
    float *dst[2];
    const float mul[2] = {scale, scale};
#pragma unroll
    for (int r = 0; r < 2; r++) dst[r] = valid[r] ? dqkv + (int64_t)t[r] * ld + (int64_t)h * D : nullptr;
    write_rows<D>(acc, dst, mul);
}

/* ---- backward: dk, dv ------------------------------------------------------------------------- */

/* K, V, Q and dO tiles in bf16, then the query tile's log-sum-exp and delta */
template <int D>
static inline size_t dkv_tc_smem() {
    return (size_t)4 * TB * (D + 8) * sizeof(bf16) + (size_t)2 * TB * sizeof(float);
}

/* Block (x, h): key rows 64 x .. 64 x + 63 of kv head h / (Hq / Hkv), against query head h. Its
 * dK (times scale) and dV rows go to dk_out and dv_out (row stride ld_out, from the head's first
 * column: dqkv itself, or with several query heads a kv head the head's partial rows). NQ:
 * the query columns a warp scores at once (32 from head dim 64 up: at head dim 64, 138 registers
 * where 64 took 174, two blocks an SM). */
template <int D, typename E>
static __global__ void __launch_bounds__(TPB) k_att_dkv_tc(const E *qkv, int ld, const int32_t *ss, int S, int T,
                                                           int Hq, int Hkv, float scale, const float *lse,
                                                           const E *dout, const float *delta, float *dk_out,
                                                           float *dv_out, int64_t ld_out, int64_t head_stride) {
    constexpr int DP = D + 8, NQ = D >= 64 ? 32 : 64;
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *k_s = (bf16 *)smem, *v_s = k_s + TB * DP, *q_s = v_s + TB * DP, *do_s = q_s + TB * DP;
    float *lse_s = (float *)(do_s + TB * DP), *dl_s = lse_s + TB;
    const int h = blockIdx.y, g = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t HD = (int64_t)Hq * D;
    const int j0 = blockIdx.x * TB, last = min(j0 + TB, T) - 1;
    const int qbeg = j0, qend = ss[seq_of(ss, S, last) + 1];
    /* the warp's keys jw0 .. jwlast; the lane's keys j[r] = jw0 + lane / 4 + 8 r; queries
     * j .. my_end - 1 see key j */
    const int jw0 = j0 + warp * 16, jwlast = min(jw0 + 16, T) - 1;
    /* queries q .. q + NQ - 1 see the warp's 16 keys whole when the keys all exist and the
     * queries lie at or after the last key, inside the first key's sequence */
    const bool w_whole = jwlast == jw0 + 15;
    const int wend_first = jw0 <= jwlast ? ss[seq_of(ss, S, jw0) + 1] : 0;
    const float sl2 = scale * (float)M_LOG2E; /* P = exp2(S sl2 - lse log2(e)), as the forward's */
    int j[2], my_end[2];
    bool valid[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        j[r] = jw0 + (lane >> 2) + 8 * r;
        valid[r] = j[r] < T;
        my_end[r] = valid[r] ? ss[seq_of(ss, S, j[r]) + 1] : 0;
    }
    const int wend = (int)__reduce_max_sync(0xffffffffu, (unsigned)max(my_end[0], my_end[1]));

    stage_two<D>(k_s, qkv, ld, (int64_t)(Hq + g) * D, v_s, qkv, ld, (int64_t)(Hq + Hkv + g) * D, j0, T);
    const bf16 *k_w = k_s + warp * 16 * DP, *v_w = v_s + warp * 16 * DP;
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    for (int q0 = qbeg; q0 < qend; q0 += TB) {
        __syncthreads();
        stage_two<D>(q_s, qkv, ld, (int64_t)h * D, do_s, dout, HD, (int64_t)h * D, q0, qend);
        for (int i = threadIdx.x; i < TB; i += blockDim.x) {
            bool in = q0 + i < qend;
            lse_s[i] = in ? lse[(int64_t)(q0 + i) * Hq + h] * (float)M_LOG2E : 0.0f;
            dl_s[i] = in ? delta[(int64_t)(q0 + i) * Hq + h] : 0.0f;
        }
        __syncthreads();
        if (jw0 > jwlast || q0 + TB <= jw0 || q0 >= wend) continue; /* warp-uniform */
#pragma unroll
        for (int c0 = 0; c0 < TB; c0 += NQ) {
            float st[NQ / 8][4], dpt[NQ / 8][4]; /* S^T = K_w Q^T, then P^T; dP^T = V_w dO^T, then dS^T */
            mm_nt<D, NQ>(st, k_w, DP, q_s + c0 * DP, DP);
            auto to_p = [&](auto masked) { /* masked: std::bool_constant, the forward's MASK */
#pragma unroll
                for (int n = 0; n < NQ / 8; n++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int r = i >> 1, c = c0 + acc_col(n, i), tq = q0 + c;
                        st[n][i] = !decltype(masked)::value || (valid[r] && tq >= j[r] && tq < my_end[r])
                                       ? exp2f(st[n][i] * sl2 - lse_s[c])
                                       : 0.0f;
                    }
            };
            if (w_whole && q0 + c0 >= jw0 + 15 && q0 + c0 + NQ <= wend_first) to_p(std::false_type{}); /* warp-uniform */
            else to_p(std::true_type{});
            mm_acc_pb<NQ, D>(dv, st, do_s + c0 * DP, DP);
            mm_nt<D, NQ>(dpt, v_w, DP, do_s + c0 * DP, DP);
#pragma unroll
            for (int n = 0; n < NQ / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) dpt[n][i] = st[n][i] * (dpt[n][i] - dl_s[c0 + acc_col(n, i)]); /* P^T 0: dS^T 0 */
            mm_acc_pb<NQ, D>(dk, dpt, q_s + c0 * DP, DP);
        }
    }
    float *dkd[2], *dvd[2];
    const int64_t hoff = (int64_t)(h % (Hq / Hkv)) * head_stride;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        dkd[r] = valid[r] ? dk_out + hoff + (int64_t)j[r] * ld_out + (int64_t)g * D : nullptr;
        dvd[r] = valid[r] ? dv_out + hoff + (int64_t)j[r] * ld_out + (int64_t)g * D : nullptr;
    }
    const float mk[2] = {scale, scale}, mv[2] = {1.0f, 1.0f};
    write_rows<D>(dk, dkd, mk);
    write_rows<D>(dv, dvd, mv);
}

/* dK and dV of each kv head: the sum of its query heads' partial rows, in head order.
 * part: fp32 [2 (dK, dV)][rep][T, Hkv * D]; one thread an element of dqkv's K and V columns. */
static __global__ void k_att_dkv_sum(const float *part, int rep, int T, int64_t KD, int Hq, int D, int ld, float *dqkv) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, n = (int64_t)T * KD;
    if (i >= 2 * n) return;
    const int64_t which = i / n, e = i - which * n, t = e / KD, col = e - t * KD;
    const float *p = part + which * rep * n + e;
    float sum = 0.0f;
    for (int k = 0; k < rep; k++) sum += p[k * n];
    dqkv[t * ld + (int64_t)Hq * D + which * KD + col] = sum;
}

/* ---- launchers -------------------------------------------------------------------------------- */

template <int D, typename E>
static void fwd_tc(ff_stream *s, const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv, E *out,
                   float *lse) {
    FF_LAUNCH((k_att_fwd_tc<D, E>), dim3((T + TB - 1) / TB, Hq), TPB, fwd_tc_smem<D>(), CS(s), qkv, ld, ss, S, T, Hq,
              Hkv, 1.0f / sqrtf((float)D), out, lse);
}

/* With several query heads a kv head, the dk/dv blocks write partial rows into the stream's
 * scratch (fp32 [2][rep][T, Hkv * D]) and k_att_dkv_sum adds them: 0, or -1 with the stream
 * failed when that scratch cannot be had. */
template <int D, typename E>
static int bwd_tc(ff_stream *s, const E *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv,
                  const float *lse, const E *dout, const float *delta, float *dqkv) {
    const float scale = 1.0f / sqrtf((float)D);
    const int rep = Hq / Hkv;
    const int64_t KD = (int64_t)Hkv * D, n = (int64_t)T * KD;
    FF_LAUNCH((k_att_dq_tc<D, E>), dim3((T + TB - 1) / TB, Hq), TPB, dq_tc_smem<D>(), CS(s), qkv, ld, ss, S, T, Hq,
              Hkv, scale, lse, dout, delta, dqkv);
    if (rep == 1) {
        FF_LAUNCH((k_att_dkv_tc<D, E>), dim3((T + TB - 1) / TB, Hq), TPB, dkv_tc_smem<D>(), CS(s), qkv, ld, ss, S, T,
                  Hq, Hkv, scale, lse, dout, delta, dqkv + (int64_t)Hq * D, dqkv + (int64_t)Hq * D + KD, (int64_t)ld,
                  (int64_t)0);
        return 0;
    }
    float *part = (float *)ff_cuda_scratch(s, (size_t)(2 * rep * n) * sizeof(float));
    if (!part) return -1;
    FF_LAUNCH((k_att_dkv_tc<D, E>), dim3((T + TB - 1) / TB, Hq), TPB, dkv_tc_smem<D>(), CS(s), qkv, ld, ss, S, T, Hq,
              Hkv, scale, lse, dout, delta, part, part + rep * n, KD, n);
    FF_LAUNCH(k_att_dkv_sum, (unsigned)((2 * n + 255) / 256), 256, 0, CS(s), part, rep, T, KD, Hq, D, ld, dqkv);
    return 0;
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
    int rc = 0;
    switch (D) {
#define X(d)                                                                                                  \
    case d:                                                                                                   \
        rc = b16 ? bwd_tc<d>(s, BF(qkv), ld, I32(seq_start), S, T, Hq, Hkv, F(lse), BF(dout), F(delta), F(dqkv)) \
                 : bwd_tc<d>(s, F(qkv), ld, I32(seq_start), S, T, Hq, Hkv, F(lse), F(dout), F(delta), F(dqkv));  \
        break;
        FF_TC_DIMS(X)
#undef X
    default:
        no_tc_kernel(s, D);
        return;
    }
    if (rc) return; /* the stream failed: no scratch for the partial dK, dV rows */
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
                                "the tensor-core attention needs a GPU with >= 69 KiB of shared memory per block "
                                "(sm_80 or later), or set FF_CUDA_ATTENTION=fp32",
                                "cudaFuncSetAttribute(%zu bytes): %s", k[i].bytes, cudaGetErrorString(e));
        }
    }
    return 0;
}
