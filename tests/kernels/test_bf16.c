/* The CPU backend's bf16 kernels (ff_gemm_bf16w, ff_embedding_fwd_bf16, the casts, the KV cache's):
 * - ff_gemm_bf16w equals, bit for bit, the fixed-order fp32 product (ff_cpu_gemm_fixed_nt) of
 *   the same weights widened to fp32, on the AVX-512, AVX2 + FMA and portable paths, at 1 and 2
 *   threads, for the test models' shapes, odd widths and a value head of 1; beta 1 accumulates
 *   and beta 0 ignores NaN in C; a row is the same whatever rows share its product (batch
 *   invariance); and the whole is within fp32 rounding of a double-precision sum;
 * - ff_gemm_bf16 (a bf16 product with either operand stored bf16) is within fp32 rounding of the
 *   double sum of the rounded operands' products, for each transpose and storage of A and B,
 *   with alpha and beta; an fp32 operand gives the bits of its rounded bf16 copy (so it is
 *   rounded), and beta 0 ignores NaN in C; ff_gemm_bf16_out stores those sums rounded;
 * - SwiGLU on bf16 gate|up: the fp32 kernels' bits on the widened values (the forward rounded);
 * - the LM head's gradient left in bf16 (ff_logprob_bwd_bf16): the fp32 kernel's, rounded;
 * - the casts round as include/fuseflow/dtype.h does (ties to even, NaN kept, Inf kept,
 *   overflow to Inf) and widen exactly;
 * - the bf16 embedding gives the widened rows, and zeros for token -1;
 * - a KV cache in bf16: its row scatter rounds, its paged attention equals the fp32 one on the
 *   widened cache. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/dtype.h"
#include "fuseflow/kernels.h"
#include "kernels/cpu/cpu_internal.h"
#include "tests/test_util.h"

static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 747796405u + 2891336453u;
        x[i] = (float)(seed >> 9) / 8388608.0f - 0.5f;
    }
}

static ff_dptr dev(ff_backend *be, const void *host, size_t bytes) {
    ff_buffer *b = ff_buffer_new(be, bytes ? bytes : 1);
    REQUIRE(b);
    if (host && bytes) ff_memcpy_h2d(ff_backend_stream(be), ff_dptr_of(b, 0), host, bytes);
    return ff_dptr_of(b, 0);
}

/* A [M, K] lda, W bf16 [N, K] ldw: C from the kernel against the fixed-order fp32 product of
 * the widened weights (bit for bit) and a double sum (near). */
static void gemm_case(ff_backend *be, int M, int N, int K, float beta) {
    ff_stream *st = ff_backend_stream(be);
    const int lda = K + 3, ldw = K + 5, ldc = N + 2;
    size_t na = (size_t)M * lda, nw = (size_t)N * ldw, nc = (size_t)M * ldc;
    float *a = malloc(na * 4 + 4), *w32 = malloc(nw * 4 + 4), *c0 = malloc(nc * 4 + 4), *want = malloc(nc * 4 + 4),
          *got = malloc(nc * 4 + 4);
    uint16_t *w = malloc(nw * 2 + 2);
    REQUIRE(a && w32 && c0 && want && got && w);
    fill(a, na, (uint32_t)(M * 7 + N)), fill(w32, nw, (uint32_t)(K * 3 + 1)), fill(c0, nc, 9);
    for (size_t i = 0; i < nw; i++) w[i] = ff_f32_to_bf16(w32[i] * 3.0f), w32[i] = ff_bf16_to_f32(w[i]);
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++) c0[i] = NAN;
    memcpy(want, c0, nc * 4);
    ff_cpu_gemm_fixed_nt(M, N, K, 1.0f, a, lda, w32, ldw, beta, want, ldc);
    ff_dptr A = dev(be, a, na * 4), W = dev(be, w, nw * 2), C = dev(be, c0, nc * 4);
    ff_gemm_bf16w(st, M, N, K, A, lda, W, ldw, beta, C, ldc);
    ff_memcpy_d2h(st, got, C, nc * 4);
    REQUIRE(ff_stream_sync(st) == 0);
    int differ = 0;
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            size_t at = (size_t)i * ldc + j;
            differ += memcmp(&got[at], &want[at], 4) != 0;
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)a[(size_t)i * lda + k] * w32[(size_t)j * ldw + k];
            if (beta != 0.0f) acc += (double)beta * c0[at];
            double e = fabs(acc - got[at]);
            worst = e > worst ? e : worst;
        }
    if (differ || !(worst < 1e-5 * (K + 1))) {
        fprintf(stderr, "gemm_bf16w %dx%dx%d beta %g on %s: %d elements differ from the fixed-order product, "
                        "max error against double %g\n",
                M, N, K, (double)beta, ff_backend_name(be), differ, worst);
        ff_test_failures++;
    }
    /* ld padding of C untouched */
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc && (size_t)i * ldc + j < nc; j++)
            CHECK(memcmp(&got[(size_t)i * ldc + j], &c0[(size_t)i * ldc + j], 4) == 0);
    ff_buffer_destroy(&A.buf), ff_buffer_destroy(&W.buf), ff_buffer_destroy(&C.buf);
    free(a), free(w32), free(c0), free(want), free(got), free(w);
}

/* rows [r0, r0 + M) of A in one product against the same rows computed alone: a row depends on
 * nothing but itself */
static void invariance_case(ff_backend *be, int N, int K) {
    enum { R = 70 };
    ff_stream *st = ff_backend_stream(be);
    float *a = malloc((size_t)R * K * 4), *w32 = malloc((size_t)N * K * 4), *all = malloc((size_t)R * N * 4),
          *one = malloc((size_t)N * 4);
    uint16_t *w = malloc((size_t)N * K * 2);
    REQUIRE(a && w32 && all && one && w);
    fill(a, (size_t)R * K, 5), fill(w32, (size_t)N * K, 6);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = ff_f32_to_bf16(w32[i]);
    ff_dptr A = dev(be, a, (size_t)R * K * 4), W = dev(be, w, (size_t)N * K * 2), C = dev(be, NULL, (size_t)R * N * 4);
    ff_gemm_bf16w(st, R, N, K, A, K, W, K, 0.0f, C, N);
    ff_memcpy_d2h(st, all, C, (size_t)R * N * 4);
    int differ = 0;
    for (int r = 0; r < R; r += 7) {
        ff_gemm_bf16w(st, 1, N, K, ff_dptr_add(A, (size_t)r * K, 4), K, W, K, 0.0f, C, N);
        ff_memcpy_d2h(st, one, C, (size_t)N * 4);
        differ += memcmp(one, all + (size_t)r * N, (size_t)N * 4) != 0;
    }
    if (differ) {
        fprintf(stderr, "gemm_bf16w N %d K %d on %s: %d rows differ alone and in a product of %d\n", N, K,
                ff_backend_name(be), differ, R);
        ff_test_failures++;
    }
    ff_buffer_destroy(&A.buf), ff_buffer_destroy(&W.buf), ff_buffer_destroy(&C.buf);
    free(a), free(w32), free(all), free(one), free(w);
}

static void test_gemm(void) {
    static const int shapes[][3] = {{1, 64, 64},   {7, 192, 64}, {33, 256, 64}, {96, 768, 256}, {5, 19, 3},
                                    {13, 100, 71}, {40, 1, 64},  {3, 5, 0},     {300, 130, 96}, {2, 600, 520}};
    static const char *names[] = {"cpu:1", "cpu:2"};
    for (int path = FF_FIXED_PORTABLE; path <= FF_FIXED_AVX512; path++) {
        if (ff_cpu_gemm_fixed_path(path) != path) continue; /* the CPU lacks it */
        for (int b = 0; b < 2; b++) {
            ff_backend *be = ff_backend_new(names[b]);
            REQUIRE(be);
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
                gemm_case(be, shapes[i][0], shapes[i][1], shapes[i][2], 0.0f);
                gemm_case(be, shapes[i][0], shapes[i][1], shapes[i][2], 1.0f);
            }
            invariance_case(be, 64, 64);
            invariance_case(be, 768, 256);
            ff_backend_destroy(&be);
        }
    }
    ff_cpu_gemm_fixed_path(-1);
}

/* ff_gemm_bf16, C [M, N] ldc = alpha op(A) op(B) + beta C: each transpose, each operand fp32 or
 * bf16, against the double sum over the rounded operands; an fp32 operand and its bf16 copy give
 * the same bits. */
static void gemm16_case(ff_backend *be, int M, int N, int K, ff_trans ta, ff_trans tb, float alpha, float beta) {
    ff_stream *st = ff_backend_stream(be);
    const int ar = ta == FF_TRANS ? K : M, ac = ta == FF_TRANS ? M : K, br = tb == FF_TRANS ? N : K,
              bc = tb == FF_TRANS ? K : N;
    const int lda = ac + 2, ldb = bc + 3, ldc = N + 1;
    const size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, nc = (size_t)M * ldc;
    float *a = malloc(na * 4 + 4), *b = malloc(nb * 4 + 4), *c0 = malloc(nc * 4 + 4), *got[4];
    uint16_t *a16 = malloc(na * 2 + 2), *b16 = malloc(nb * 2 + 2);
    REQUIRE(a && b && c0 && a16 && b16);
    fill(a, na, (uint32_t)(M + 3 * K)), fill(b, nb, (uint32_t)(N * 5 + 1)), fill(c0, nc, 11);
    for (size_t i = 0; i < na; i++) a[i] *= 3.0f, a16[i] = ff_f32_to_bf16(a[i]);
    for (size_t i = 0; i < nb; i++) b16[i] = ff_f32_to_bf16(b[i]);
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++) c0[i] = NAN;
    ff_dptr da = dev(be, a, na * 4), db = dev(be, b, nb * 4), dah = dev(be, a16, na * 2), dbh = dev(be, b16, nb * 2);
    ff_dptr dc = dev(be, NULL, nc * 4);
    char what[128];
    snprintf(what, sizeof what, "gemm_bf16 %dx%dx%d %c%c alpha %g beta %g", M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N',
             (double)alpha, (double)beta);
    for (int v = 0; v < 4; v++) { /* v bit 0: A as bf16, bit 1: B as bf16 */
        const bool x16 = v & 1, y16 = v & 2;
        got[v] = malloc(nc * 4 + 4);
        REQUIRE(got[v]);
        ff_memcpy_h2d(st, dc, c0, nc * 4);
        ff_gemm_bf16(st, ta, tb, M, N, K, alpha, x16 ? dah : da, x16, lda, y16 ? dbh : db, y16, ldb, beta, dc, ldc);
        ff_memcpy_d2h(st, got[v], dc, nc * 4);
        if (v && memcmp(got[v], got[0], nc * 4)) {
            fprintf(stderr, "%s: A%s B%s differs from the product of fp32 operands (not rounded alike)\n", what,
                    x16 ? " bf16" : "", y16 ? " bf16" : "");
            ff_test_failures++;
        }
    }
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const uint16_t x = ta == FF_TRANS ? a16[(size_t)k * lda + i] : a16[(size_t)i * lda + k];
                const uint16_t y = tb == FF_TRANS ? b16[(size_t)j * ldb + k] : b16[(size_t)k * ldb + j];
                const double t = (double)ff_bf16_to_f32(x) * (double)ff_bf16_to_f32(y);
                sum += t, mag += fabs(t);
            }
            const double want = alpha * sum + (beta == 0.0f ? 0.0 : beta * (double)c0[(size_t)i * ldc + j]);
            const double g = got[0][(size_t)i * ldc + j];
            if (!(fabs(g - want) <= 1e-6 * (fabs(alpha) * mag + fabs(beta) + 1e-3))) bad++;
        }
    if (bad) {
        fprintf(stderr, "%s: %d elements off the double sum of the rounded operands\n", what, bad);
        ff_test_failures++;
    }
    if (alpha == 1.0f && beta == 0.0f && K > 0) { /* ff_gemm_bf16_out: the same sums, stored rounded */
        uint16_t *g16 = malloc(nc * 2 + 2);
        REQUIRE(g16);
        for (int v = 0; v < 4; v += 3) {
            memset(g16, 0xff, nc * 2);
            ff_dptr dc16 = dev(be, g16, nc * 2);
            ff_gemm_bf16_out(st, ta, tb, M, N, K, v ? dah : da, v, lda, v ? dbh : db, v, ldb, dc16, ldc);
            ff_memcpy_d2h(st, g16, dc16, nc * 2);
            REQUIRE(ff_stream_sync(st) == 0);
            int off = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) off += g16[(size_t)i * ldc + j] != ff_f32_to_bf16(got[0][(size_t)i * ldc + j]);
            for (int i = 0; i + 1 < M; i++) /* the padding of each row untouched */
                for (int j = N; j < ldc; j++) off += g16[(size_t)i * ldc + j] != 0xffff;
            if (off) {
                fprintf(stderr, "%s: gemm_bf16_out (operands %s) differs from the rounded fp32 result in %d elements\n", what,
                        v ? "bf16" : "fp32", off);
                ff_test_failures++;
            }
            ff_buffer_destroy(&dc16.buf);
        }
        free(g16);
    }
    for (int v = 0; v < 4; v++) free(got[v]);
    ff_buffer *bufs[] = {da.buf, db.buf, dah.buf, dbh.buf, dc.buf};
    for (int i = 0; i < 5; i++) ff_buffer_destroy(&bufs[i]);
    free(a), free(b), free(c0), free(a16), free(b16);
}

static void test_gemm16(void) {
    ff_backend *be = ff_backend_cpu_new(2);
    REQUIRE(be);
    CHECK(!ff_backend_bf16_products(be)); /* the cpu backend's own products stay fp32 */
    const int shapes[][3] = {{1, 1, 1}, {5, 7, 33}, {17, 40, 64}, {64, 48, 96}, {3, 5, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            gemm16_case(be, shapes[s][0], shapes[s][1], shapes[s][2], (ff_trans)(t & 1), (ff_trans)(t >> 1),
                        t == 3 ? 0.5f : 1.0f, t == 1 || t == 2 ? 1.0f : 0.0f);
    ff_backend_destroy(&be);
}

/* SwiGLU on bf16 storage (ff_swiglu_fwd_bf16, ff_swiglu_bwd_bf16): the fp32 kernels on the
 * widened gate|up and output gradient, bit for bit, each output rounded. */
static void test_swiglu16(void) {
    ff_backend *be = ff_backend_new("cpu:2");
    REQUIRE(be);
    ff_stream *st = ff_backend_stream(be);
    enum { T = 37, I = 45 };
    float gu[T * 2 * I], dh[T * I], h32[T * I], dgu32[T * 2 * I];
    uint16_t gu16[T * 2 * I], h16[T * I], dhb[T * I], dgu16[T * 2 * I];
    fill(gu, (size_t)T * 2 * I, 5), fill(dh, (size_t)T * I, 6);
    for (int i = 0; i < T * 2 * I; i++) gu16[i] = ff_f32_to_bf16(gu[i] * 8.0f), gu[i] = ff_bf16_to_f32(gu16[i]);
    for (int i = 0; i < T * I; i++) dhb[i] = ff_f32_to_bf16(dh[i]), dh[i] = ff_bf16_to_f32(dhb[i]);
    ff_dptr dgu = dev(be, gu, sizeof gu), dgu_16 = dev(be, gu16, sizeof gu16), ddh = dev(be, dh, sizeof dh),
            ddh16 = dev(be, dhb, sizeof dhb);
    ff_dptr dh32 = dev(be, NULL, sizeof h32), dh16 = dev(be, NULL, sizeof h16), dg32 = dev(be, NULL, sizeof dgu32),
            dg16 = dev(be, NULL, sizeof dgu16);
    ff_swiglu_fwd(st, dgu, dh32, T, I);
    ff_swiglu_fwd_bf16(st, dgu_16, dh16, T, I);
    ff_swiglu_bwd(st, dgu, ddh, dg32, T, I);
    ff_swiglu_bwd_bf16(st, dgu_16, ddh16, dg16, T, I);
    ff_memcpy_d2h(st, h32, dh32, sizeof h32), ff_memcpy_d2h(st, h16, dh16, sizeof h16);
    ff_memcpy_d2h(st, dgu32, dg32, sizeof dgu32), ff_memcpy_d2h(st, dgu16, dg16, sizeof dgu16);
    REQUIRE(ff_stream_sync(st) == 0);
    int off = 0;
    for (int i = 0; i < T * I; i++) off += h16[i] != ff_f32_to_bf16(h32[i]);
    CHECK_EQ_INT(off, 0);
    off = 0;
    for (int i = 0; i < T * 2 * I; i++) off += dgu16[i] != ff_f32_to_bf16(dgu32[i]);
    CHECK_EQ_INT(off, 0);
    ff_buffer *bufs[] = {dgu.buf, dgu_16.buf, ddh.buf, ddh16.buf, dh32.buf, dh16.buf, dg32.buf, dg16.buf};
    for (int i = 0; i < 8; i++) ff_buffer_destroy(&bufs[i]);
    ff_backend_destroy(&be);
}

/* ff_logprob_bwd_bf16: the fp32 kernel's dlogits, rounded, in each row's first half (ld 2V):
 * with log-prob and entropy gradients, targets in the row, -1 (none) and -2 (another shard's),
 * rows of several of the kernel's blocks and of fewer columns than one. */
static void test_logprob16(void) {
    ff_backend *be = ff_backend_new("cpu:2");
    REQUIRE(be);
    ff_stream *st = ff_backend_stream(be);
    const int Vs[] = {7, 1000};
    for (int vi = 0; vi < 2; vi++) {
        enum { T = 5 };
        const int V = Vs[vi];
        const int32_t tg[T] = {3, -1, -2, V - 1, 0};
        float *z = malloc((size_t)T * V * 4), *want = malloc((size_t)T * V * 4), *got = malloc((size_t)T * V * 4);
        float lse[T], ent[T], dlp[T] = {0.7f, 1.0f, -0.4f, 1.3f, 0.2f}, dent[T] = {0.1f, -0.3f, 0.05f, 0.0f, 0.6f};
        REQUIRE(z && want && got);
        fill(z, (size_t)T * V, (uint32_t)V);
        for (int i = 0; i < T * V; i++) z[i] *= 6.0f;
        ff_dptr dz = dev(be, z, (size_t)T * V * 4), dt = dev(be, tg, sizeof tg), dl = dev(be, NULL, sizeof lse),
                de = dev(be, NULL, sizeof ent), ddl = dev(be, dlp, sizeof dlp), dde = dev(be, dent, sizeof dent);
        ff_logprob_fwd(st, dz, dt, 0.8f, T, V, (ff_dptr){0}, de, dl);
        ff_logprob_bwd(st, dz, dt, 0.8f, T, V, dl, ddl, dde, de);
        ff_memcpy_d2h(st, want, dz, (size_t)T * V * 4);
        ff_memcpy_h2d(st, dz, z, (size_t)T * V * 4);
        ff_logprob_bwd_bf16(st, dz, dt, 0.8f, T, V, dl, ddl, dde, de);
        ff_memcpy_d2h(st, got, dz, (size_t)T * V * 4);
        REQUIRE(ff_stream_sync(st) == 0);
        int off = 0;
        for (int t = 0; t < T; t++) {
            const uint16_t *row = (const uint16_t *)(const void *)(got + (size_t)t * V);
            for (int v = 0; v < V; v++) off += row[v] != ff_f32_to_bf16(want[(size_t)t * V + v]);
        }
        if (off) {
            fprintf(stderr, "logprob_bwd_bf16 V %d: %d of %d elements are not the fp32 gradient rounded\n", V, off, T * V);
            ff_test_failures++;
        }
        ff_buffer *bufs[] = {dz.buf, dt.buf, dl.buf, de.buf, ddl.buf, dde.buf};
        for (int i = 0; i < 6; i++) ff_buffer_destroy(&bufs[i]);
        free(z), free(want), free(got);
    }
    ff_backend_destroy(&be);
}

static void test_casts(void) {
    ff_backend *be = ff_backend_new("cpu:2");
    REQUIRE(be);
    ff_stream *st = ff_backend_stream(be);
    enum { N = 100003 };
    float *x = malloc(N * 4), *back = malloc(N * 4);
    uint16_t *h = malloc(N * 2);
    REQUIRE(x && back && h);
    fill(x, N, 11);
    for (int i = 0; i < N; i++) x[i] = ldexpf(x[i], i % 40 - 10);
    /* exact ties: 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7 (to even: 1), and
     * 1 + 3 * 2^-8 between 1 + 2^-7 and 1 + 2^-6 (to even: 1 + 2^-6); NaN, Inf, the largest
     * finite fp32 (rounds up to Inf), a negative zero, a subnormal */
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, NAN, INFINITY, -INFINITY, 3.4028235e38f, -0.0f, 1e-40f};
    const uint16_t special_want[] = {0x3f80, 0x3f82, 0, 0x7f80, 0xff80, 0x7f80, 0x8000, ff_f32_to_bf16(1e-40f)};
    const int ns = (int)(sizeof special / sizeof special[0]);
    memcpy(x, special, sizeof special);
    ff_dptr X = dev(be, x, N * 4), H = dev(be, NULL, N * 2), B = dev(be, NULL, N * 4);
    ff_cast_f32_bf16(st, X, H, N);
    ff_cast_bf16_f32(st, H, B, N);
    ff_memcpy_d2h(st, h, H, N * 2);
    ff_memcpy_d2h(st, back, B, N * 4);
    REQUIRE(ff_stream_sync(st) == 0);
    int wrong = 0, inexact = 0;
    for (int i = 0; i < N; i++) {
        wrong += h[i] != ff_f32_to_bf16(x[i]);
        inexact += memcmp(&back[i], &(float){ff_bf16_to_f32(h[i])}, 4) != 0;
    }
    CHECK(wrong == 0);
    CHECK(inexact == 0);
    for (int i = 0; i < ns; i++) {
        if (isnan(special[i])) CHECK(isnan(back[i]));
        else CHECK(h[i] == special_want[i]);
    }
    /* relative rounding error at most 2^-8 (8 significant bits) for normal numbers */
    double worst = 0;
    for (int i = ns; i < N; i++)
        if (fabsf(x[i]) > 1e-30f) {
            double e = fabs((double)back[i] - x[i]) / fabs((double)x[i]);
            worst = e > worst ? e : worst;
        }
    CHECK(worst <= 0x1p-8);
    CHECK(worst > 0x1p-10); /* and it does round */
    ff_buffer_destroy(&X.buf), ff_buffer_destroy(&H.buf), ff_buffer_destroy(&B.buf);
    free(x), free(back), free(h);
    ff_backend_destroy(&be);
}

static void test_embedding(void) {
    ff_backend *be = ff_backend_new("cpu:2");
    REQUIRE(be);
    ff_stream *st = ff_backend_stream(be);
    enum { V = 50, H = 37, T = 9 };
    float t32[V * H], out[T * H];
    uint16_t t16[V * H];
    fill(t32, V * H, 3);
    for (int i = 0; i < V * H; i++) t16[i] = ff_f32_to_bf16(t32[i]);
    const int32_t tok[T] = {0, 49, -1, 7, 7, 12, -1, 3, 48};
    ff_dptr Tk = dev(be, tok, sizeof tok), Tb = dev(be, t16, sizeof t16), O = dev(be, NULL, sizeof out);
    ff_embedding_fwd_bf16(st, Tk, Tb, O, T, H);
    ff_memcpy_d2h(st, out, O, sizeof out);
    REQUIRE(ff_stream_sync(st) == 0);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++) {
            float want = tok[t] < 0 ? 0.0f : ff_bf16_to_f32(t16[tok[t] * H + c]);
            CHECK(memcmp(&out[t * H + c], &want, 4) == 0);
        }
    ff_buffer_destroy(&Tk.buf), ff_buffer_destroy(&Tb.buf), ff_buffer_destroy(&O.buf);
    ff_backend_destroy(&be);
}

/* the KV cache in bf16: scatter_rows_bf16 rounds exactly, and attention through shuffled block
 * tables (one sequence sharing another's blocks) on bf16 caches equals it on the same caches
 * widened to fp32 (the sums may run in another vector order: 1e-6) */
static void test_kv(void) {
    ff_backend *be = ff_backend_new("cpu:2");
    REQUIRE(be);
    ff_stream *st = ff_backend_stream(be);
    enum { Hq = 4, Hkv = 2, D = 24, KD = Hkv * D, BS = 5, NB = 9, ROWS = NB * BS, T = 3, S = 2, LD = 4 };
    float q[T * Hq * D], k32[ROWS * KD], v32[ROWS * KD], src[ROWS * KD], o32[T * Hq * D], o16[T * Hq * D];
    uint16_t k16[ROWS * KD], v16[ROWS * KD], got[ROWS * KD];
    fill(q, T * Hq * D, 21), fill(k32, ROWS * KD, 22), fill(v32, ROWS * KD, 23), fill(src, ROWS * KD, 24);
    for (int i = 0; i < ROWS * KD; i++) {
        k16[i] = ff_f32_to_bf16(k32[i] * 4), k32[i] = ff_bf16_to_f32(k16[i]);
        v16[i] = ff_f32_to_bf16(v32[i]), v32[i] = ff_bf16_to_f32(v16[i]);
    }
    const int32_t table[S * LD] = {7, 2, 5, 0, 7, 2, 8, 1}; /* sequence 1 shares sequence 0's first two blocks */
    const int32_t seq[T] = {0, 1, 1}, nkeys[T] = {17, 12, 20};
    int32_t rows[ROWS];
    for (int i = 0; i < ROWS; i++) rows[i] = (i * 7) % ROWS;
    ff_dptr Q = dev(be, q, sizeof q), K32 = dev(be, k32, sizeof k32), V32 = dev(be, v32, sizeof v32), K16 = dev(be, k16, sizeof k16),
            V16 = dev(be, v16, sizeof v16), Tb = dev(be, table, sizeof table), Sq = dev(be, seq, sizeof seq),
            Nk = dev(be, nkeys, sizeof nkeys), O32 = dev(be, NULL, sizeof o32), O16 = dev(be, NULL, sizeof o16),
            Src = dev(be, src, sizeof src), Rw = dev(be, rows, sizeof rows), Dst = dev(be, NULL, sizeof got);
    ff_attention_cached(st, Q, Hq * D, K32, V32, Tb, S, LD, BS, Sq, Nk, T, Hq, Hkv, D, O32);
    ff_attention_cached_bf16(st, Q, Hq * D, K16, V16, Tb, S, LD, BS, Sq, Nk, T, Hq, Hkv, D, O16);
    ff_scatter_rows_bf16(st, Src, KD, Dst, Rw, ROWS, KD);
    ff_memcpy_d2h(st, o32, O32, sizeof o32);
    ff_memcpy_d2h(st, o16, O16, sizeof o16);
    ff_memcpy_d2h(st, got, Dst, sizeof got);
    REQUIRE(ff_stream_sync(st) == 0);
    double worst = 0, big = 0;
    for (int i = 0; i < T * Hq * D; i++) worst = fmax(worst, fabs((double)o16[i] - o32[i])), big = fmax(big, fabs((double)o32[i]));
    CHECK(big > 0.01 && worst <= 1e-6 * big);
    int wrong = 0;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < KD; c++) wrong += got[rows[r] * KD + c] != ff_f32_to_bf16(src[r * KD + c]);
    CHECK(wrong == 0);
    ff_dptr all[] = {Q, K32, V32, K16, V16, Tb, Sq, Nk, O32, O16, Src, Rw, Dst};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ff_buffer_destroy(&all[i].buf);
    ff_backend_destroy(&be);
}

int main(void) {
    test_gemm();
    test_gemm16();
    test_swiglu16();
    test_logprob16();
    test_casts();
    test_embedding();
    test_kv();
    TEST_MAIN_END();
}
