/* CPU attention: causal grouped-query attention over packed variable-length sequences
 * (training: forward and backward) and attention against a KV cache (generation).
 *
 * Training attention is tiled like FlashAttention: a tile of 64 query rows of one head
 * against tiles of 64 keys, the scores and products of a tile done by single-threaded
 * cblas_sgemm calls that read q, k, v straight out of the fused qkv activation (its row
 * stride is the lda), with an online softmax, so no [n, n] score matrix is ever stored.
 * Tiles above the diagonal are skipped. The backward recomputes the probabilities from the
 * saved log-sum-exp; dk and dv are computed by key-tile tasks and dq by query-tile tasks,
 * so every output row has exactly one writer (no atomics, results independent of the
 * thread count). Tasks go round-robin to the OpenMP team.
 *
 * Not here: sliding windows, ALiBi, soft-capping, head_dim above FF_ATT_MAX_D. */
#include <assert.h>
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

enum { BLK = 64, FF_ATT_MAX_D = 256, MAX_REP = 64 };

static void mm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* P = exp(S - m_row) in place on an [nq, nk] tile (ld BLK) where query row r (absolute
 * index i0 + r) may see key columns c with j0 + c <= i0 + r; the rest get 0. */
FF_VEC static void tile_probs(float *S, int nq, int nk, int i0, int j0, const float *row_m) {
    for (int r = 0; r < nq; r++) {
        float *row = S + (size_t)r * BLK;
        int cmax = i0 + r - j0; /* last visible column */
        if (cmax > nk - 1) cmax = nk - 1;
        float m = row_m[r];
#pragma omp simd
        for (int c = 0; c < nk; c++) row[c] = c <= cmax ? ff_fast_expf(row[c] - m) : 0.0f;
    }
}

/* One key tile of the online softmax: new row maxima, P = exp(S - m) in place (masked),
 * running sums l and accumulators acc [nq, D] rescaled to the new maxima. */
FF_VEC static void online_softmax(float *Sb, int nq, int nk, int i0, int j0, float *m, float *l, float *acc, int D) {
    float mnew[BLK] = {0};
    for (int r = 0; r < nq; r++) {
        const float *row = Sb + (size_t)r * BLK;
        int cmax = i0 + r - j0 < nk - 1 ? i0 + r - j0 : nk - 1;
        float bm = m[r];
        for (int c = 0; c <= cmax; c++) bm = row[c] > bm ? row[c] : bm;
        mnew[r] = bm;
    }
    tile_probs(Sb, nq, nk, i0, j0, mnew);
    for (int r = 0; r < nq; r++) {
        const float *row = Sb + (size_t)r * BLK;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < nk; c++) sum += row[c];
        float alpha = ff_fast_expf(m[r] - mnew[r]);
        if (alpha != 1.0f) {
            float *a = acc + (size_t)r * D;
#pragma omp simd
            for (int d = 0; d < D; d++) a[d] *= alpha;
        }
        l[r] = l[r] * alpha + sum;
        m[r] = mnew[r];
    }
}

void ff_cpu_attention_fwd(ff_stream *s, ff_dptr qkvp, int ld, ff_dptr ssp, int S, int T, int Hq, int Hkv, int D,
                          ff_dptr outp, ff_dptr lsep) {
    const float *qkv = F(qkvp);        /* [T, (Hq + 2 Hkv) D] ld */
    const int32_t *ss = I32(ssp);      /* [S + 1] */
    float *out = F(outp), *lse = F(lsep); /* [T, Hq D], [T, Hq] */
    assert(D <= FF_ATT_MAX_D);
    (void)T;
    const int rep = Hq / Hkv, HD = Hq * D;
    const float scale = 1.0f / sqrtf((float)D);
    int nt = NT(s);
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float Sb[BLK * BLK], acc[BLK * FF_ATT_MAX_D], m[BLK], l[BLK];
        int64_t task = 0;
        for (int sq = 0; sq < S; sq++) {
            int base = ss[sq], n = ss[sq + 1] - ss[sq];
            for (int h = 0; h < Hq; h++) {
                int g = h / rep;
                for (int i0 = 0; i0 < n; i0 += BLK) {
                    if (task++ % nth != tid) continue;
                    int nq = n - i0 < BLK ? n - i0 : BLK;
                    const float *Q = qkv + (size_t)(base + i0) * ld + (size_t)h * D;
                    memset(acc, 0, sizeof(float) * (size_t)nq * D);
                    for (int r = 0; r < nq; r++) m[r] = -FLT_MAX, l[r] = 0.0f;
                    for (int j0 = 0; j0 < i0 + nq; j0 += BLK) {
                        int nk = i0 + nq - j0 < BLK ? i0 + nq - j0 : BLK;
                        const float *K = qkv + (size_t)(base + j0) * ld + (size_t)(Hq + g) * D;
                        const float *V = qkv + (size_t)(base + j0) * ld + (size_t)(Hq + Hkv + g) * D;
                        mm(CblasNoTrans, CblasTrans, nq, nk, D, scale, Q, ld, K, ld, 0.0f, Sb, BLK);
                        online_softmax(Sb, nq, nk, i0, j0, m, l, acc, D);
                        mm(CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, Sb, BLK, V, ld, 1.0f, acc, D);
                    }
                    for (int r = 0; r < nq; r++) {
                        size_t t = (size_t)(base + i0 + r);
                        float inv = 1.0f / l[r];
                        float *o = out + t * HD + (size_t)h * D;
                        const float *a = acc + (size_t)r * D;
#pragma omp simd
                        for (int d = 0; d < D; d++) o[d] = a[d] * inv;
                        lse[t * Hq + h] = m[r] + logf(l[r]);
                    }
                }
            }
        }
    }
}

/* dS = P * (dP - delta_row) in place on the dP tile. */
FF_VEC static void ds_from_dp(const float *Pb, float *dSb, int nq, int nk, const float *delta_rows, int Hq) {
    for (int r = 0; r < nq; r++) {
        float dl = delta_rows[(size_t)r * Hq];
        float *ds = dSb + (size_t)r * BLK;
        const float *p = Pb + (size_t)r * BLK;
#pragma omp simd
        for (int c = 0; c < nk; c++) ds[c] = p[c] * (ds[c] - dl);
    }
}

/* Probabilities of a tile from the saved lse, and dS = P * (dP - delta) where
 * dP = dO V^T; returns P in Pb and dS in dSb (both [nq, nk], ld BLK). */
static void tile_grad(const float *Q, const float *K, const float *V, const float *dO, int ld, int HD, int nq, int nk,
                      int i0, int j0, int D, float scale, const float *lse_rows, const float *delta_rows, int Hq,
                      float *Pb, float *dSb) {
    float mrow[BLK];
    for (int r = 0; r < nq; r++) mrow[r] = lse_rows[(size_t)r * Hq];
    mm(CblasNoTrans, CblasTrans, nq, nk, D, scale, Q, ld, K, ld, 0.0f, Pb, BLK);
    tile_probs(Pb, nq, nk, i0, j0, mrow);
    mm(CblasNoTrans, CblasTrans, nq, nk, D, 1.0f, dO, HD, V, ld, 0.0f, dSb, BLK);
    ds_from_dp(Pb, dSb, nq, nk, delta_rows, Hq);
}

void ff_cpu_attention_bwd(ff_stream *s, ff_dptr qkvp, int ld, ff_dptr ssp, const int32_t *ss_host, int S, int T,
                          int Hq, int Hkv, int D, ff_dptr outp, ff_dptr lsep, ff_dptr doutp, ff_dptr deltap,
                          ff_dptr dqkvp) {
    const float *qkv = F(qkvp);                       /* [T, (Hq + 2 Hkv) D] ld */
    const float *out = F(outp), *lse = F(lsep);       /* [T, Hq D], [T, Hq] */
    const float *dout = F(doutp);                     /* [T, Hq D] */
    float *delta = F(deltap), *dqkv = F(dqkvp);       /* [T, Hq], [T, (Hq + 2 Hkv) D] ld */
    const int32_t *ss = ss_host;
    (void)ssp;
    assert(D <= FF_ATT_MAX_D);
    const int rep = Hq / Hkv, HD = Hq * D;
    const float scale = 1.0f / sqrtf((float)D);
    int nt = NT(s);
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float Pb[BLK * BLK], dSb[BLK * BLK], acc1[BLK * FF_ATT_MAX_D], acc2[BLK * FF_ATT_MAX_D];

        /* delta[t, h] = dO[t, h] . O[t, h] */
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < Hq; h++)
                delta[(size_t)t * Hq + h] = dot(dout + (size_t)t * HD + (size_t)h * D, out + (size_t)t * HD + (size_t)h * D, D);
        /* (implicit barrier) */

        /* dQ: query-tile tasks */
        int64_t task = 0;
        for (int sq = 0; sq < S; sq++) {
            int base = ss[sq], n = ss[sq + 1] - ss[sq];
            for (int h = 0; h < Hq; h++) {
                int g = h / rep;
                for (int i0 = 0; i0 < n; i0 += BLK) {
                    if (task++ % nth != tid) continue;
                    int nq = n - i0 < BLK ? n - i0 : BLK;
                    size_t t0 = (size_t)(base + i0);
                    const float *Q = qkv + t0 * ld + (size_t)h * D;
                    const float *dO = dout + t0 * HD + (size_t)h * D;
                    memset(acc1, 0, sizeof(float) * (size_t)nq * D);
                    for (int j0 = 0; j0 < i0 + nq; j0 += BLK) {
                        int nk = i0 + nq - j0 < BLK ? i0 + nq - j0 : BLK;
                        const float *K = qkv + (size_t)(base + j0) * ld + (size_t)(Hq + g) * D;
                        const float *V = qkv + (size_t)(base + j0) * ld + (size_t)(Hq + Hkv + g) * D;
                        tile_grad(Q, K, V, dO, ld, HD, nq, nk, i0, j0, D, scale, lse + t0 * Hq + h,
                                  delta + t0 * Hq + h, Hq, Pb, dSb);
                        mm(CblasNoTrans, CblasNoTrans, nq, D, nk, scale, dSb, BLK, K, ld, 1.0f, acc1, D);
                    }
                    for (int r = 0; r < nq; r++)
                        memcpy(dqkv + (t0 + (size_t)r) * ld + (size_t)h * D, acc1 + (size_t)r * D, sizeof(float) * (size_t)D);
                }
            }
        }
        /* dK, dV: key-tile tasks over every query head of the group */
        task = 0;
        for (int sq = 0; sq < S; sq++) {
            int base = ss[sq], n = ss[sq + 1] - ss[sq];
            for (int g = 0; g < Hkv; g++) {
                for (int j0 = 0; j0 < n; j0 += BLK) {
                    if (task++ % nth != tid) continue;
                    int nk = n - j0 < BLK ? n - j0 : BLK;
                    const float *K = qkv + (size_t)(base + j0) * ld + (size_t)(Hq + g) * D;
                    const float *V = qkv + (size_t)(base + j0) * ld + (size_t)(Hq + Hkv + g) * D;
                    memset(acc1, 0, sizeof(float) * (size_t)nk * D); /* dK */
                    memset(acc2, 0, sizeof(float) * (size_t)nk * D); /* dV */
                    for (int h = g * rep; h < (g + 1) * rep; h++) {
                        for (int i0 = j0; i0 < n; i0 += BLK) {
                            int nq = n - i0 < BLK ? n - i0 : BLK;
                            size_t t0 = (size_t)(base + i0);
                            const float *Q = qkv + t0 * ld + (size_t)h * D;
                            const float *dO = dout + t0 * HD + (size_t)h * D;
                            tile_grad(Q, K, V, dO, ld, HD, nq, nk, i0, j0, D, scale, lse + t0 * Hq + h,
                                      delta + t0 * Hq + h, Hq, Pb, dSb);
                            mm(CblasTrans, CblasNoTrans, nk, D, nq, 1.0f, Pb, BLK, dO, HD, 1.0f, acc2, D);
                            mm(CblasTrans, CblasNoTrans, nk, D, nq, scale, dSb, BLK, Q, ld, 1.0f, acc1, D);
                        }
                    }
                    for (int c = 0; c < nk; c++) {
                        float *row = dqkv + (size_t)(base + j0 + c) * ld;
                        memcpy(row + (size_t)(Hq + g) * D, acc1 + (size_t)c * D, sizeof(float) * (size_t)D);
                        memcpy(row + (size_t)(Hq + Hkv + g) * D, acc2 + (size_t)c * D, sizeof(float) * (size_t)D);
                    }
                }
            }
        }
    }
}

/* Query token t's rep heads of kv head g against its cache rows. */
FF_VEC static void cached_task(const float *q, int ldq, const float *kc, const float *vc, const int32_t *row0,
                               const int32_t *nkeys, int t, int g, int rep, int D, int KD, int HD, float scale,
                               float *out) {
    float acc[MAX_REP * FF_ATT_MAX_D > 16384 ? 16384 : MAX_REP * FF_ATT_MAX_D];
    float sc[MAX_REP][BLK], m[MAX_REP], l[MAX_REP];
    assert((size_t)rep * D <= sizeof acc / sizeof acc[0]);
    const float *Qg = q + (size_t)t * ldq + (size_t)g * rep * D; /* rep heads, contiguous */
    memset(acc, 0, sizeof(float) * (size_t)rep * D);
    for (int r = 0; r < rep; r++) m[r] = -FLT_MAX, l[r] = 0.0f;
    int n = nkeys[t];
    for (int j0 = 0; j0 < n; j0 += BLK) {
        int nk = n - j0 < BLK ? n - j0 : BLK;
        for (int c = 0; c < nk; c++) {
            const float *K = kc + (size_t)(row0[t] + j0 + c) * KD + (size_t)g * D;
            for (int r = 0; r < rep; r++) sc[r][c] = dot(Qg + (size_t)r * D, K, D) * scale;
        }
        for (int r = 0; r < rep; r++) {
            float bm = m[r];
            for (int c = 0; c < nk; c++) bm = sc[r][c] > bm ? sc[r][c] : bm;
            float alpha = ff_fast_expf(m[r] - bm), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int c = 0; c < nk; c++) {
                sc[r][c] = ff_fast_expf(sc[r][c] - bm);
                sum += sc[r][c];
            }
            float *a = acc + (size_t)r * D;
            if (alpha != 1.0f) {
#pragma omp simd
                for (int d = 0; d < D; d++) a[d] *= alpha;
            }
            l[r] = l[r] * alpha + sum;
            m[r] = bm;
        }
        for (int c = 0; c < nk; c++) {
            const float *V = vc + (size_t)(row0[t] + j0 + c) * KD + (size_t)g * D;
            for (int r = 0; r < rep; r++) {
                float p = sc[r][c];
                float *a = acc + (size_t)r * D;
#pragma omp simd
                for (int d = 0; d < D; d++) a[d] += p * V[d];
            }
        }
    }
    for (int r = 0; r < rep; r++) {
        float *o = out + (size_t)t * HD + (size_t)(g * rep + r) * D;
        float inv = 1.0f / l[r];
        for (int d = 0; d < D; d++) o[d] = acc[(size_t)r * D + d] * inv;
    }
}

void ff_cpu_attention_cached(ff_stream *s, ff_dptr qp, int ldq, ff_dptr kcp, ff_dptr vcp, ff_dptr row0p,
                             ff_dptr nkeysp, int T, int Hq, int Hkv, int D, ff_dptr outp) {
    const float *q = F(qp);                          /* [T, Hq D] ldq */
    const float *kc = F(kcp), *vc = F(vcp);          /* [rows, Hkv D] */
    const int32_t *row0 = I32(row0p), *nkeys = I32(nkeysp); /* [T] */
    float *out = F(outp);                            /* [T, Hq D] */
    const int rep = Hq / Hkv, KD = Hkv * D, HD = Hq * D;
    assert(D <= FF_ATT_MAX_D && rep <= MAX_REP);
    const float scale = 1.0f / sqrtf((float)D);
    double work = 0;
    for (int t = 0; t < T; t++) work += (double)nkeys[t] * HD * 2;
    int nt = work < FF_PAR_MIN ? 1 : NT(s);
#pragma omp parallel for collapse(2) num_threads(nt) schedule(dynamic, 1)
    for (int t = 0; t < T; t++)
        for (int g = 0; g < Hkv; g++) cached_task(q, ldq, kc, vc, row0, nkeys, t, g, rep, D, KD, HD, scale, out);
}
