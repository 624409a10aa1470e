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
 * thread count). Tasks (a tile row of one head) go to the backend's thread pool.
 *
 * Not here: sliding windows, ALiBi, soft-capping, head_dim above FF_ATT_MAX_D. */
#include <assert.h>
#include <cblas.h>
#include <float.h>
#include <math.h>
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

/* The tiles of a packed batch: block b (64 rows) of the whole batch is block b - cum[s] of
 * sequence s, with cum[s] the blocks of the sequences before s. */
typedef struct att_job {
    const float *qkv, *out, *lse, *dout; /* see the kernels */
    float *o, *l, *delta, *dqkv;
    const int32_t *ss; /* [S + 1] */
    const int64_t *cum; /* [S + 1] */
    int S, ld, Hq, Hkv, D, rep;
    float scale;
} att_job;

/* Fill cum (scratch) and return the number of 64-blocks; -1 when the scratch cannot grow
 * (the stream has failed). *extra_out: `extra` bytes of the same scratch after cum (64-byte
 * aligned), for the bf16 entries' widened copies; NULL may be given when extra is 0. */
static int64_t make_blocks(ff_stream *s, const int32_t *ss, int S, int64_t **cum_out, size_t extra, float **extra_out) {
    const size_t cum_bytes = (((size_t)S + 1) * sizeof(int64_t) + 63) & ~(size_t)63;
    int64_t *cum = ff_cpu_scratch(s, cum_bytes + extra);
    if (!cum) return -1;
    if (extra_out) *extra_out = (float *)(void *)((char *)cum + cum_bytes);
    cum[0] = 0;
    for (int q = 0; q < S; q++) cum[q + 1] = cum[q] + (ss[q + 1] - ss[q] + BLK - 1) / BLK;
    *cum_out = cum;
    return cum[S];
}

/* Sequence and first row (within it) of global block b. */
static void block_of(const att_job *j, int64_t b, int *sq, int *i0) {
    int lo = 0, hi = j->S - 1;
    while (lo < hi) { /* last s with cum[s] <= b */
        int mid = (lo + hi + 1) / 2;
        if (j->cum[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    *sq = lo;
    *i0 = (int)(b - j->cum[lo]) * BLK;
}

/* Tasks one by one on this thread when the work is small, else on the pool. */
static void run_tasks(ff_stream *s, int64_t n, double work, ff_pool_fn fn, void *ctx) {
    if (NT(s) <= 1 || work < FF_PAR_MIN) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    ff_pool_run(POOL(s), n, fn, ctx);
}

/* Task = (query block, head): online softmax over the key tiles up to the diagonal. */
static void fwd_task(void *arg, int64_t task) {
    const att_job *j = arg;
    const int D = j->D, ld = j->ld, Hq = j->Hq, HD = Hq * D;
    int h = (int)(task % Hq), sq, i0;
    block_of(j, task / Hq, &sq, &i0);
    int g = h / j->rep, base = j->ss[sq], n = j->ss[sq + 1] - base;
    int nq = n - i0 < BLK ? n - i0 : BLK;
    float Sb[BLK * BLK], acc[BLK * FF_ATT_MAX_D], m[BLK], l[BLK];
    const float *Q = j->qkv + (size_t)(base + i0) * ld + (size_t)h * D;
    memset(acc, 0, sizeof(float) * (size_t)nq * D);
    for (int r = 0; r < nq; r++) m[r] = -FLT_MAX, l[r] = 0.0f;
    for (int j0 = 0; j0 < i0 + nq; j0 += BLK) {
        int nk = i0 + nq - j0 < BLK ? i0 + nq - j0 : BLK;
        const float *K = j->qkv + (size_t)(base + j0) * ld + (size_t)(Hq + g) * D;
        const float *V = j->qkv + (size_t)(base + j0) * ld + (size_t)(Hq + j->Hkv + g) * D;
        mm(CblasNoTrans, CblasTrans, nq, nk, D, j->scale, Q, ld, K, ld, 0.0f, Sb, BLK);
        online_softmax(Sb, nq, nk, i0, j0, m, l, acc, D);
        mm(CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, Sb, BLK, V, ld, 1.0f, acc, D);
    }
    for (int r = 0; r < nq; r++) {
        size_t t = (size_t)(base + i0 + r);
        float inv = 1.0f / l[r];
        float *o = j->o + t * HD + (size_t)h * D;
        const float *a = acc + (size_t)r * D;
        for (int d = 0; d < D; d++) o[d] = a[d] * inv;
        j->l[t * Hq + h] = m[r] + logf(l[r]);
    }
}

/* dst [T, n] (row stride ld) = the bf16 src [T, n] (ld) widened (exact). */
static void widen_rows(float *dst, const uint16_t *src, int T, int n, int ld) {
    for (size_t t = 0; t < (size_t)T; t++)
        for (int c = 0; c < n; c++) dst[t * (size_t)ld + (size_t)c] = bf16_widen(src[t * (size_t)ld + (size_t)c]);
}

/* b16 (ff_attention_fwd_bf16): qkv and out bf16; the fp32 tasks run on qkv widened into
 * scratch [T, ld] and write out into scratch [T, Hq D], rounded into out at the end. The
 * reference the CUDA kernels are tested against, not a fast path. */
void ff_cpu_attention_fwd(ff_stream *s, ff_dptr qkvp, int ld, ff_dptr ssp, int S, int T, int Hq, int Hkv, int D,
                          ff_dptr outp, ff_dptr lsep, bool b16) {
    assert(D <= FF_ATT_MAX_D);
    const size_t HD = (size_t)Hq * D, n_qkv = (size_t)T * (size_t)ld;
    att_job j = {.qkv = F(qkvp), .o = F(outp), .l = F(lsep), .ss = I32(ssp), .S = S, .ld = ld, .Hq = Hq, .Hkv = Hkv,
                 .D = D, .rep = Hq / Hkv, .scale = 1.0f / sqrtf((float)D)};
    int64_t *cum;
    float *wide = NULL; /* b16: qkv [T, ld], then out [T, Hq D], fp32 */
    int64_t nb = make_blocks(s, j.ss, S, &cum, b16 ? (n_qkv + (size_t)T * HD) * sizeof(float) : 0, &wide);
    if (nb < 0) return;
    j.cum = cum;
    if (b16) {
        widen_rows(wide, (const uint16_t *)(const void *)F(qkvp), T, (Hq + 2 * Hkv) * D, ld);
        j.qkv = wide;
        j.o = wide + n_qkv;
    }
    run_tasks(s, nb * Hq, 2.0 * T * BLK * Hq * D, fwd_task, &j);
    if (b16) {
        uint16_t *o16 = (uint16_t *)(void *)F(outp);
        for (size_t i = 0; i < (size_t)T * HD; i++) o16[i] = bf16_round(j.o[i]);
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

static void delta_rows(void *arg, int64_t t0, int64_t t1) {
    const att_job *j = arg;
    const int HD = j->Hq * j->D;
    for (int64_t t = t0; t < t1; t++)
        for (int h = 0; h < j->Hq; h++)
            j->delta[(size_t)t * j->Hq + h] =
                dot(j->dout + (size_t)t * HD + (size_t)h * j->D, j->out + (size_t)t * HD + (size_t)h * j->D, j->D);
}

/* dQ of (query block, head): recompute P and dS tile by tile up to the diagonal. */
static void dq_task(void *arg, int64_t task) {
    const att_job *j = arg;
    const int D = j->D, ld = j->ld, Hq = j->Hq, HD = Hq * D;
    int h = (int)(task % Hq), sq, i0;
    block_of(j, task / Hq, &sq, &i0);
    int g = h / j->rep, base = j->ss[sq], n = j->ss[sq + 1] - base;
    int nq = n - i0 < BLK ? n - i0 : BLK;
    float Pb[BLK * BLK], dSb[BLK * BLK], acc[BLK * FF_ATT_MAX_D];
    size_t t0 = (size_t)(base + i0);
    const float *Q = j->qkv + t0 * ld + (size_t)h * D, *dO = j->dout + t0 * HD + (size_t)h * D;
    memset(acc, 0, sizeof(float) * (size_t)nq * D);
    for (int j0 = 0; j0 < i0 + nq; j0 += BLK) {
        int nk = i0 + nq - j0 < BLK ? i0 + nq - j0 : BLK;
        const float *K = j->qkv + (size_t)(base + j0) * ld + (size_t)(Hq + g) * D;
        const float *V = j->qkv + (size_t)(base + j0) * ld + (size_t)(Hq + j->Hkv + g) * D;
        tile_grad(Q, K, V, dO, ld, HD, nq, nk, i0, j0, D, j->scale, j->lse + t0 * Hq + h, j->delta + t0 * Hq + h, Hq,
                  Pb, dSb);
        mm(CblasNoTrans, CblasNoTrans, nq, D, nk, j->scale, dSb, BLK, K, ld, 1.0f, acc, D);
    }
    for (int r = 0; r < nq; r++)
        memcpy(j->dqkv + (t0 + (size_t)r) * ld + (size_t)h * D, acc + (size_t)r * D, sizeof(float) * (size_t)D);
}

/* dK, dV of (key block, kv head): every query head of the group, query tiles from the
 * diagonal down. */
static void dkv_task(void *arg, int64_t task) {
    const att_job *j = arg;
    const int D = j->D, ld = j->ld, Hq = j->Hq, Hkv = j->Hkv, HD = Hq * D;
    int g = (int)(task % Hkv), sq, j0;
    block_of(j, task / Hkv, &sq, &j0);
    int base = j->ss[sq], n = j->ss[sq + 1] - base;
    int nk = n - j0 < BLK ? n - j0 : BLK;
    float Pb[BLK * BLK], dSb[BLK * BLK], dk[BLK * FF_ATT_MAX_D], dv[BLK * FF_ATT_MAX_D];
    const float *K = j->qkv + (size_t)(base + j0) * ld + (size_t)(Hq + g) * D;
    const float *V = j->qkv + (size_t)(base + j0) * ld + (size_t)(Hq + Hkv + g) * D;
    memset(dk, 0, sizeof(float) * (size_t)nk * D);
    memset(dv, 0, sizeof(float) * (size_t)nk * D);
    for (int h = g * j->rep; h < (g + 1) * j->rep; h++) {
        for (int i0 = j0; i0 < n; i0 += BLK) {
            int nq = n - i0 < BLK ? n - i0 : BLK;
            size_t t0 = (size_t)(base + i0);
            const float *Q = j->qkv + t0 * ld + (size_t)h * D, *dO = j->dout + t0 * HD + (size_t)h * D;
            tile_grad(Q, K, V, dO, ld, HD, nq, nk, i0, j0, D, j->scale, j->lse + t0 * Hq + h, j->delta + t0 * Hq + h,
                      Hq, Pb, dSb);
            mm(CblasTrans, CblasNoTrans, nk, D, nq, 1.0f, Pb, BLK, dO, HD, 1.0f, dv, D);
            mm(CblasTrans, CblasNoTrans, nk, D, nq, j->scale, dSb, BLK, Q, ld, 1.0f, dk, D);
        }
    }
    for (int c = 0; c < nk; c++) {
        float *row = j->dqkv + (size_t)(base + j0 + c) * ld;
        memcpy(row + (size_t)(Hq + g) * D, dk + (size_t)c * D, sizeof(float) * (size_t)D);
        memcpy(row + (size_t)(Hq + Hkv + g) * D, dv + (size_t)c * D, sizeof(float) * (size_t)D);
    }
}

/* b16 (ff_attention_bwd_bf16): the fp32 tasks on qkv, out and dout widened into scratch. */
void ff_cpu_attention_bwd(ff_stream *s, ff_dptr qkvp, int ld, ff_dptr ssp, const int32_t *ss_host, int S, int T,
                          int Hq, int Hkv, int D, ff_dptr outp, ff_dptr lsep, ff_dptr doutp, ff_dptr deltap,
                          ff_dptr dqkvp, bool b16) {
    (void)ssp;
    assert(D <= FF_ATT_MAX_D);
    const size_t HD = (size_t)Hq * D, n_qkv = (size_t)T * (size_t)ld;
    att_job j = {.qkv = F(qkvp), .out = F(outp), .lse = F(lsep), .dout = F(doutp), .delta = F(deltap),
                 .dqkv = F(dqkvp), .ss = ss_host, .S = S, .ld = ld, .Hq = Hq, .Hkv = Hkv, .D = D, .rep = Hq / Hkv,
                 .scale = 1.0f / sqrtf((float)D)};
    int64_t *cum;
    float *wide = NULL; /* b16: qkv [T, ld], then out and dout [T, Hq D], fp32 */
    int64_t nb = make_blocks(s, ss_host, S, &cum, b16 ? (n_qkv + 2 * (size_t)T * HD) * sizeof(float) : 0, &wide);
    if (nb < 0) return;
    j.cum = cum;
    if (b16) {
        widen_rows(wide, (const uint16_t *)(const void *)F(qkvp), T, (Hq + 2 * Hkv) * D, ld);
        widen_rows(wide + n_qkv, (const uint16_t *)(const void *)F(outp), T, (int)HD, (int)HD);
        widen_rows(wide + n_qkv + (size_t)T * HD, (const uint16_t *)(const void *)F(doutp), T, (int)HD, (int)HD);
        j.qkv = wide;
        j.out = wide + n_qkv;
        j.dout = wide + n_qkv + (size_t)T * HD;
    }
    double work = 4.0 * T * BLK * Hq * D;
    ff_cpu_for(s, T, 2.0 * Hq * D, delta_rows, &j);
    run_tasks(s, nb * Hq, work, dq_task, &j);
    run_tasks(s, nb * Hkv, work, dkv_task, &j);
}

/* a . b, b a cache row of either type (bf16 widened exactly) */
static inline __attribute__((always_inline)) float dot_row(const float *a, const void *b, size_t at, int n, bool b16) {
    if (!b16) return dot(a, (const float *)b + at, n);
    const uint16_t *h = (const uint16_t *)b + at;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * bf16_widen(h[i]);
    return s;
}

/* Query token t's rep heads of kv head g against its n first positions; the caches fp32 or
 * (b16) bf16. */
static inline __attribute__((always_inline)) void cached_body(const float *q, int ldq, const void *kc, const void *vc,
                                                              const int32_t *tab, int bs, int n, int t, int g, int rep,
                                                              int D, int KD, int HD, float scale, float *out, bool b16) {
    float acc[MAX_REP * FF_ATT_MAX_D > 16384 ? 16384 : MAX_REP * FF_ATT_MAX_D];
    float sc[MAX_REP][BLK], m[MAX_REP], l[MAX_REP];
    size_t row[BLK]; /* the cache rows of a chunk's positions: position p is in row tab[p / bs] * bs + p % bs */
    assert((size_t)rep * D <= sizeof acc / sizeof acc[0]);
    const float *Qg = q + (size_t)t * ldq + (size_t)g * rep * D; /* rep heads, contiguous */
    memset(acc, 0, sizeof(float) * (size_t)rep * D);
    for (int r = 0; r < rep; r++) m[r] = -FLT_MAX, l[r] = 0.0f;
    for (int j0 = 0; j0 < n; j0 += BLK) {
        int nk = n - j0 < BLK ? n - j0 : BLK;
        for (int c = 0, b = j0 / bs, o = j0 % bs; c < nk; c++) {
            row[c] = (size_t)tab[b] * (size_t)bs + (size_t)o;
            if (++o == bs) o = 0, b++;
        }
        for (int c = 0; c < nk; c++) {
            const size_t k_at = row[c] * KD + (size_t)g * D;
            for (int r = 0; r < rep; r++) sc[r][c] = dot_row(Qg + (size_t)r * D, kc, k_at, D, b16) * scale;
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
            const size_t v_at = row[c] * KD + (size_t)g * D;
            const float *V = (const float *)vc + v_at;
            const uint16_t *V16 = (const uint16_t *)vc + v_at;
            for (int r = 0; r < rep; r++) {
                float p = sc[r][c];
                float *a = acc + (size_t)r * D;
                if (b16) {
#pragma omp simd
                    for (int d = 0; d < D; d++) a[d] += p * bf16_widen(V16[d]);
                } else {
#pragma omp simd
                    for (int d = 0; d < D; d++) a[d] += p * V[d];
                }
            }
        }
    }
    for (int r = 0; r < rep; r++) {
        float *o = out + (size_t)t * HD + (size_t)(g * rep + r) * D;
        float inv = 1.0f / l[r];
        for (int d = 0; d < D; d++) o[d] = acc[(size_t)r * D + d] * inv;
    }
}

FF_VEC static void cached_task32(const float *q, int ldq, const void *kc, const void *vc, const int32_t *tab, int bs, int n,
                                 int t, int g, int rep, int D, int KD, int HD, float scale, float *out) {
    cached_body(q, ldq, kc, vc, tab, bs, n, t, g, rep, D, KD, HD, scale, out, false);
}
FF_VEC static void cached_task16(const float *q, int ldq, const void *kc, const void *vc, const int32_t *tab, int bs, int n,
                                 int t, int g, int rep, int D, int KD, int HD, float scale, float *out) {
    cached_body(q, ldq, kc, vc, tab, bs, n, t, g, rep, D, KD, HD, scale, out, true);
}

typedef struct cached_job {
    const float *q;
    const void *kc, *vc; /* fp32 or (b16) bf16 */
    bool b16;
    const int32_t *table, *seq, *nkeys;
    float *out;
    int ldq, table_ld, block_rows, Hkv, rep, D;
    float scale;
} cached_job;

static void cached_part(void *arg, int64_t c0, int64_t c1) {
    const cached_job *j = arg;
    for (int64_t c = c0; c < c1; c++) {
        const int t = (int)(c / j->Hkv);
        (j->b16 ? cached_task16 : cached_task32)(j->q, j->ldq, j->kc, j->vc, j->table + (size_t)j->seq[t] * (size_t)j->table_ld,
                                                  j->block_rows, j->nkeys[t], t, (int)(c % j->Hkv), j->rep, j->D, j->Hkv * j->D,
                                                  j->Hkv * j->rep * j->D, j->scale, j->out);
    }
}

static void attention_cached(ff_stream *s, ff_dptr qp, int ldq, const void *kc, const void *vc, bool b16, ff_dptr tablep,
                             int table_ld, int block_rows, ff_dptr seqp, ff_dptr nkeysp, int T, int Hq, int Hkv, int D,
                             ff_dptr outp) {
    assert(D <= FF_ATT_MAX_D && Hq / Hkv <= MAX_REP);
    cached_job j = {F(qp), kc, vc, b16, I32(tablep), I32(seqp), I32(nkeysp), F(outp), ldq, table_ld, block_rows,
                    Hkv, Hq / Hkv, D, 1.0f / sqrtf((float)D)};
    double keys = 0;
    for (int t = 0; t < T; t++) keys += j.nkeys[t];
    /* per (token, kv head): about 4 flops per key, head and dimension */
    ff_cpu_for(s, (int64_t)T * Hkv, 4.0 * (keys / T) * j.rep * D, cached_part, &j);
}

void ff_cpu_attention_cached(ff_stream *s, ff_dptr qp, int ldq, ff_dptr kcp, ff_dptr vcp, ff_dptr tablep, int S,
                             int table_ld, int block_rows, ff_dptr seqp, ff_dptr nkeysp, int T, int Hq, int Hkv, int D,
                             ff_dptr outp) {
    (void)S;
    attention_cached(s, qp, ldq, F(kcp), F(vcp), false, tablep, table_ld, block_rows, seqp, nkeysp, T, Hq, Hkv, D, outp);
}

void ff_cpu_attention_cached_bf16(ff_stream *s, ff_dptr qp, int ldq, ff_dptr kcp, ff_dptr vcp, ff_dptr tablep, int S,
                                  int table_ld, int block_rows, ff_dptr seqp, ff_dptr nkeysp, int T, int Hq, int Hkv, int D,
                                  ff_dptr outp) {
    (void)S;
    attention_cached(s, qp, ldq, F(kcp), F(vcp), true, tablep, table_ld, block_rows, seqp, nkeysp, T, Hq, Hkv, D, outp);
}
