/* X W^T of a fixed order (every linear's forward), for batch invariance where OpenBLAS's
 * kernels are not (cpu_backend.c decides). Every element of C is computed by the same sequence of correctly
 * rounded operations whatever M, N, the block it falls in, its place in the block and the
 * CPU, so a row of C is the same bit for bit whatever rows share the product, on every
 * x86-64 machine. fma(a, b, s) is IEEE's fused multiply-add: the AVX2 + FMA path issues it
 * 8 lanes at a time, the AVX-512 path 16 (two columns' 8 lanes to a register), the portable
 * path calls fmaf, and the three agree bit for bit.
 *
 *   X W^T, C [M, N] = A [M, K] B [N, K]^T: 8 partial sums, lane l = fma over k = l mod 8 in
 *   order for k < K8 = K - K mod 8; s = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
 *   then s = fma(a_k, b_k, s) for k = K8..K-1.
 * Then C = alpha s (beta = 0) or alpha s + beta C.
 *
 *
 * The same product with W in bf16 (ff_gemm_bf16w: an inference model's bf16 weights) widens
 * each weight exactly to fp32 where it is loaded, so it equals the fp32 product of the rounded
 * weights bit for bit, batch invariant on every CPU alike.
 *
 * Single-threaded: the caller splits C into blocks, and any split gives the same C. Not here:
 * the other layouts (backward products stay with OpenBLAS: nothing needs their rows
 * invariant). Speed: register tiles of 4 rows by 2 columns (AVX2) or 8 rows by 4 columns
 * (AVX-512), B in panels of 64 rows that stay in cache (bench_model prints the cost against
 * OpenBLAS). */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "kernels/cpu/cpu_internal.h"

static inline void put(float *c, float s, float alpha, float beta) {
    *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
}

enum { PANEL = 64 }; /* rows of B kept in cache across the row tiles */

/* ---- the definition, one element at a time (the portable path) ----------------------------- */

/* b[k] widened to fp32 (exact for bf16), for B of either type */
static inline float b_at(const void *B, size_t i, bool b16) {
    return b16 ? bf16_widen(((const uint16_t *)B)[i]) : ((const float *)B)[i];
}

static float dot_nt(const float *a, const void *b, int K, bool b16) {
    float lane[8] = {0};
    int K8 = K / 8 * 8;
    for (int k = 0; k < K8; k += 8)
        for (int l = 0; l < 8; l++) lane[l] = fmaf(a[k + l], b_at(b, (size_t)(k + l), b16), lane[l]);
    float s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (int k = K8; k < K; k++) s = fmaf(a[k], b_at(b, (size_t)k, b16), s);
    return s;
}

static void nt_portable(int M, int N, int K, float alpha, const float *A, int lda, const void *B, int ldb, float beta,
                        float *C, int ldc, bool b16) {
    const size_t esz = b16 ? 2 : 4;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            put(C + (size_t)i * ldc + j, dot_nt(A + (size_t)i * lda, (const char *)B + (size_t)j * ldb * esz, K, b16),
                alpha, beta);
}

/* ---- AVX2 + FMA: the same operations, 8 lanes at a time ------------------------------------ */

#define FMA_TARGET __attribute__((target("avx2,fma")))

FMA_TARGET static inline float sum_lanes(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* 8 elements of B from i on, widened to fp32: a bf16 is the upper half of its fp32 */
FMA_TARGET static inline __attribute__((always_inline)) __m256 load_b(const void *B, size_t i, bool b16) {
    if (!b16) return _mm256_loadu_ps((const float *)B + i);
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)B + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* rm <= 4 rows by rn <= 2 columns of X W^T; constant rm, rn and b16 unroll and specialise it */
FMA_TARGET static inline __attribute__((always_inline)) void nt_tile(int rm, int rn, int K, float alpha,
                                                                     const float *A, int lda, const void *B,
                                                                     int ldb, float beta, float *C, int ldc,
                                                                     bool b16) {
    __m256 acc[4][2];
    for (int r = 0; r < rm; r++)
        for (int c = 0; c < rn; c++) acc[r][c] = _mm256_setzero_ps();
    int K8 = K / 8 * 8;
    for (int k = 0; k < K8; k += 8) {
        __m256 b[2];
        for (int c = 0; c < rn; c++) b[c] = load_b(B, (size_t)c * ldb + (size_t)k, b16);
        for (int r = 0; r < rm; r++) {
            __m256 a = _mm256_loadu_ps(A + (size_t)r * lda + k);
            for (int c = 0; c < rn; c++) acc[r][c] = _mm256_fmadd_ps(a, b[c], acc[r][c]);
        }
    }
    float sums[4][2];
    if (rm == 4 && rn == 2) {
        /* the 8 lane trees at once: hadd adds neighbours, so two rounds of it and the two
         * halves give ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) for 4 sums a time */
        for (int h = 0; h < 2; h++) {
            __m256 q = _mm256_hadd_ps(_mm256_hadd_ps(acc[2 * h][0], acc[2 * h][1]),
                                      _mm256_hadd_ps(acc[2 * h + 1][0], acc[2 * h + 1][1]));
            __m128 t = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
            float f[4];
            _mm_storeu_ps(f, t);
            sums[2 * h][0] = f[0], sums[2 * h][1] = f[1], sums[2 * h + 1][0] = f[2], sums[2 * h + 1][1] = f[3];
        }
    } else {
        for (int r = 0; r < rm; r++)
            for (int c = 0; c < rn; c++) sums[r][c] = sum_lanes(acc[r][c]);
    }
    for (int r = 0; r < rm; r++)
        for (int c = 0; c < rn; c++) {
            const float *a = A + (size_t)r * lda;
            float s = sums[r][c];
            for (int k = K8; k < K; k++) s = fmaf(a[k], b_at(B, (size_t)c * ldb + (size_t)k, b16), s);
            put(C + (size_t)r * ldc + c, s, alpha, beta);
        }
}

/* B + j rows, of either type */
static inline const void *b_row(const void *B, int j, int ldb, bool b16) {
    return (const char *)B + (size_t)j * (size_t)ldb * (b16 ? 2 : 4);
}

FMA_TARGET static inline __attribute__((always_inline)) void nt_fma(int M, int N, int K, float alpha, const float *A,
                                                                    int lda, const void *B, int ldb, float beta,
                                                                    float *C, int ldc, bool b16) {
    for (int j0 = 0; j0 < N; j0 += PANEL) {
        int j1 = N - j0 < PANEL ? N : j0 + PANEL;
        for (int i = 0; i < M; i += 4) {
            const float *Ai = A + (size_t)i * lda;
            float *Ci = C + (size_t)i * ldc;
            int rm = M - i < 4 ? M - i : 4, j = j0;
            if (rm == 4) {
                for (; j + 2 <= j1; j += 2) nt_tile(4, 2, K, alpha, Ai, lda, b_row(B, j, ldb, b16), ldb, beta, Ci + j, ldc, b16);
                if (j < j1) nt_tile(4, 1, K, alpha, Ai, lda, b_row(B, j, ldb, b16), ldb, beta, Ci + j, ldc, b16);
            } else {
                for (; j + 2 <= j1; j += 2)
                    nt_tile(rm, 2, K, alpha, Ai, lda, b_row(B, j, ldb, b16), ldb, beta, Ci + j, ldc, b16);
                if (j < j1) nt_tile(rm, 1, K, alpha, Ai, lda, b_row(B, j, ldb, b16), ldb, beta, Ci + j, ldc, b16);
            }
        }
    }
}
FMA_TARGET static void nt_fma32(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                                float beta, float *C, int ldc) {
    nt_fma(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false);
}
FMA_TARGET static void nt_fma16(int M, int N, int K, const float *A, int lda, const uint16_t *W, int ldw, float beta,
                                float *C, int ldc) {
    nt_fma(M, N, K, 1.0f, A, lda, W, ldw, beta, C, ldc, true);
}

/* ---- AVX-512: the same lanes, two columns to a register --------------------------------------
 * A 512-bit accumulator holds the 8 lanes of column j in its lower half and those of column
 * j + 1 in its upper half; A's 8 elements are broadcast to both halves, so every lane runs the
 * fma sequence of the definition above and the two agree bit for bit. 16 lanes a
 * multiply-add and 32 registers: a tile of 8 rows by 4 columns (16 accumulators) keeps the
 * two FMA ports busy, twice the AVX2 tile's work per instruction. */

#define AVX512_TARGET __attribute__((target("avx512f")))

/* columns j and j + 1 (pointers b0, b1) at k: [b0[k..k+7] | b1[k..k+7]], widened from bf16 */
AVX512_TARGET static inline __attribute__((always_inline)) __m512 load_b2(const void *b0, const void *b1, int k, bool b16) {
    if (!b16) {
        __m512 lo = _mm512_castps256_ps512(_mm256_loadu_ps((const float *)b0 + k));
        return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_loadu_ps((const float *)b1 + k)), 1));
    }
    __m256i h = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)b0 + k)));
    h = _mm256_inserti128_si256(h, _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)b1 + k)), 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* rm <= 8 rows by 4 columns (cols: their pointers; a missing column repeats the last one and
 * its results are dropped, nc <= 4 kept) */
AVX512_TARGET static inline __attribute__((always_inline)) void z_tile(int rm, int nc, int K, float alpha, const float *A,
                                                                         int lda, const void *const cols[4], float beta,
                                                                         float *C, int ldc, bool b16) {
    __m512 acc[8][2];
    for (int r = 0; r < rm; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const int K8 = K / 8 * 8;
    for (int k = 0; k < K8; k += 8) {
        const __m512 b01 = load_b2(cols[0], cols[1], k, b16), b23 = load_b2(cols[2], cols[3], k, b16);
        for (int r = 0; r < rm; r++) {
            const __m512 a = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(A + (size_t)r * lda + k))));
            acc[r][0] = _mm512_fmadd_ps(a, b01, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b23, acc[r][1]);
        }
    }
    for (int r = 0; r < rm; r++) {
        float l[2][16];
        _mm512_storeu_ps(l[0], acc[r][0]);
        _mm512_storeu_ps(l[1], acc[r][1]);
        const float *a = A + (size_t)r * lda;
        for (int c = 0; c < nc; c++) {
            const float *x = l[c / 2] + 8 * (c % 2);
            float s = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
            for (int k = K8; k < K; k++) s = fmaf(a[k], b_at(cols[c], (size_t)k, b16), s);
            put(C + (size_t)r * ldc + c, s, alpha, beta);
        }
    }
}

AVX512_TARGET static inline __attribute__((always_inline)) void nt_z(int M, int N, int K, float alpha, const float *A,
                                                                       int lda, const void *B, int ldb, float beta,
                                                                       float *C, int ldc, bool b16) {
    for (int j0 = 0; j0 < N; j0 += PANEL) {
        const int j1 = N - j0 < PANEL ? N : j0 + PANEL;
        for (int i = 0; i < M; i += 8) {
            const int rm = M - i < 8 ? M - i : 8;
            for (int j = j0; j < j1; j += 4) {
                const int nc = j1 - j < 4 ? j1 - j : 4;
                const void *cols[4];
                for (int c = 0; c < 4; c++) cols[c] = b_row(B, j + (c < nc ? c : nc - 1), ldb, b16);
                const float *Ai = A + (size_t)i * lda;
                float *Ci = C + (size_t)i * ldc + j;
                switch (rm) { /* constant row counts: each unrolled */
                case 8: z_tile(8, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                case 7: z_tile(7, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                case 6: z_tile(6, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                case 5: z_tile(5, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                case 4: z_tile(4, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                case 3: z_tile(3, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                case 2: z_tile(2, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                default: z_tile(1, nc, K, alpha, Ai, lda, cols, beta, Ci, ldc, b16); break;
                }
            }
        }
    }
}
AVX512_TARGET static void nt_z32(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                                 float beta, float *C, int ldc) {
    nt_z(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false);
}
AVX512_TARGET static void nt_z16(int M, int N, int K, const float *A, int lda, const uint16_t *W, int ldw, float beta,
                                 float *C, int ldc) {
    nt_z(M, N, K, 1.0f, A, lda, W, ldw, beta, C, ldc, true);
}

/* ---- entry points -------------------------------------------------------------------------- */

/* The widest path the CPU has (FF_FIXED_*), or the one a test asked for; -1: not asked yet (a
 * race between threads is benign: all store the same value). */
static _Atomic int path = -1;

static int best_path(void) {
    if (__builtin_cpu_supports("avx512f")) return FF_FIXED_AVX512;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? FF_FIXED_AVX2 : FF_FIXED_PORTABLE;
}

static int use_path(void) {
    int p = atomic_load_explicit(&path, memory_order_relaxed);
    if (p < 0) {
        p = best_path();
        atomic_store_explicit(&path, p, memory_order_relaxed);
    }
    return p;
}

int ff_cpu_gemm_fixed_path(int want) {
    const int best = best_path();
    const int p = want < 0 || want > best ? best : want;
    atomic_store_explicit(&path, p, memory_order_relaxed);
    return p;
}

void ff_cpu_gemm_fixed_nt(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                          float beta, float *C, int ldc) {
    switch (use_path()) {
    case FF_FIXED_AVX512: nt_z32(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); break;
    case FF_FIXED_AVX2: nt_fma32(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); break;
    default: nt_portable(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false); break;
    }
}

void ff_cpu_gemm_fixed_nt_bf16(int M, int N, int K, const float *A, int lda, const uint16_t *W, int ldw, float beta,
                               float *C, int ldc) {
    switch (use_path()) {
    case FF_FIXED_AVX512: nt_z16(M, N, K, A, lda, W, ldw, beta, C, ldc); break;
    case FF_FIXED_AVX2: nt_fma16(M, N, K, A, lda, W, ldw, beta, C, ldc); break;
    default: nt_portable(M, N, K, 1.0f, A, lda, W, ldw, beta, C, ldc, true); break;
    }
}
