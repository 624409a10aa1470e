/* The CUDA backend against the CPU backend: every entry of the backend table run on both
 * with the same random inputs, outputs compared element by element (|cuda - cpu| <= atol +
 * rtol * max|cpu| per tensor, the tolerances written at each check; "+=" outputs start from
 * the same random contents on both sides, so accumulation is checked too). Forward and
 * backward entries both (the backward ones with the forward's saved tensors), in-place
 * aliasing where the interface allows it, leading dimensions wider than the rows, packed
 * sequences with an empty one, GQA, head dims that are not multiples of 32. ff_gemm is
 * checked in each FF_CUDA_MATH mode with its own tolerance (fp32 exact to rounding, TF32
 * 10-bit and bf16 8-bit mantissas), and the bf16-weight entries (ff_gemm_bf16w, the bf16
 * embedding, the casts), and ff_gemm_bf16 (bf16 products, either operand stored bf16: only the
 * summation order differs; ff_gemm_bf16_out's bf16 output and SwiGLU on bf16 gate|up a bf16
 * step apart at most).
 *
 * Needs a GPU: without CUDA in the build, or with no device, it exits 77 (SKIPPED, saying
 * which), and tests/kernels/test_cuda_skip.sh checks that it does exactly that here. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "fuseflow/kernels.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

#if !defined(FF_HAVE_CUDA) && !defined(FF_TEST_CUDA_EMU)
int main(void) {
    (void)ff_test_failures;
    SKIP("cuda backend: fuseflow was built without CUDA (no CUDA toolkit at configure time, or FF_CUDA=OFF)");
}
#else
#include "tests/cuda_test_util.h"

static ff_backend *cpu, *gpu;
static ff_stream *cst, *gst;
static ff_rng rng;
static int side; /* 0: the cpu call, 1: the cuda call */
#define S (side ? gst : cst)
#define P(d) (side ? (d).g : (d).c)
#define BOTH(call)                          \
    for (side = 0; side < 2; side++) {      \
        call;                               \
    }

/* The same bytes on both backends. */
typedef struct dual {
    ff_dptr c, g;
    size_t bytes;
} dual;

static dual dual_new(const void *host, size_t bytes) {
    dual d = {{0}, {0}, bytes};
    ff_buffer *bc = ff_buffer_new(cpu, bytes ? bytes : 4), *bg = ff_buffer_new(gpu, bytes ? bytes : 4);
    if (!bg) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(bc && bg);
    d.c = ff_dptr_of(bc, 0);
    d.g = ff_dptr_of(bg, 0);
    if (host && bytes) {
        ff_memcpy_h2d(cst, d.c, host, bytes);
        ff_memcpy_h2d(gst, d.g, host, bytes);
    }
    return d;
}
static void dual_free(dual *d) {
    ff_buffer_destroy(&d->c.buf);
    ff_buffer_destroy(&d->g.buf);
}
static float urand(void) { return (float)(ff_rng_uniform(&rng) * 2.0 - 1.0); }
static dual dual_rand(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = urand() * scale;
    dual d = dual_new(x, n * sizeof(float));
    free(x);
    return d;
}
static dual dual_i32(const int32_t *v, size_t n) { return dual_new(v, n * sizeof(int32_t)); }

/* |cuda - cpu| <= atol + rtol * max|cpu| over n floats from element `first`. */
static void cmp(const char *what, dual d, size_t first, size_t n, double atol, double rtol) {
    float *a = malloc(n * 4), *b = malloc(n * 4);
    ff_memcpy_d2h(cst, a, ff_dptr_add(d.c, first, 4), n * 4);
    ff_memcpy_d2h(gst, b, ff_dptr_add(d.g, first, 4), n * 4);
    if (ff_stream_sync(gst)) {
        fprintf(stderr, "%s: the cuda stream failed: %s\n", what, ff_error_message());
        ff_test_failures++;
    }
    double mx = 0, worst = -1;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) mx = fabs(a[i]) > mx ? fabs(a[i]) : mx;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (isnan(e) || e > worst) {
            worst = isnan(e) ? INFINITY : e;
            wi = i;
        }
    }
    double tol = atol + rtol * mx;
    if (!(worst <= tol)) {
        fprintf(stderr, "%s: max |cuda - cpu| %.3g at [%zu] (cuda %.9g, cpu %.9g), tolerance %.3g (max |cpu| %.3g)\n",
                what, worst, wi, (double)b[wi], (double)a[wi], tol, mx);
        ff_test_failures++;
    } else if (getenv("FF_TEST_VERBOSE")) {
        printf("%-44s max err %.3g (tol %.3g, max %.3g)\n", what, worst, tol, mx);
    }
    free(a);
    free(b);
}
static void cmp_all(const char *what, dual d, double atol, double rtol) { cmp(what, d, 0, d.bytes / 4, atol, rtol); }

/* ---- gemm, in each math mode ---------------------------------------------------------------------- */

static void test_gemm_on(ff_backend *g, const char *mode, double rtol) {
    ff_backend *keep = gpu;
    ff_stream *keep_st = gst;
    gpu = g;
    gst = ff_backend_stream(g);
    int shapes[][3] = {{3, 5, 7}, {67, 300, 33}, {300, 20, 64}, {8, 513, 129}, {256, 384, 512}, {5, 4, 0}};
    char what[96];
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
                dual a = dual_rand((size_t)(ta ? K : M) * lda + 1, 1), b = dual_rand((size_t)(tb ? N : K) * ldb + 1, 1);
                dual c = dual_rand((size_t)M * ldc, 1);
                BOTH(ff_gemm(S, ta, tb, M, N, K, 0.5f, P(a), lda, P(b), ldb, 2.0f, P(c), ldc));
                snprintf(what, sizeof what, "gemm %s %dx%dx%d ta=%d tb=%d", mode, M, N, K, ta, tb);
                cmp_all(what, c, 1e-5, rtol); /* the ld padding too: untouched on both */
                /* beta = 0 ignores NaN in C */
                float *nan = malloc(c.bytes);
                for (size_t i = 0; i < c.bytes / 4; i++) nan[i] = NAN;
                ff_memcpy_h2d(gst, c.g, nan, c.bytes);
                ff_memcpy_h2d(cst, c.c, nan, c.bytes);
                BOTH(ff_gemm(S, ta, tb, M, N, K, 1.0f, P(a), lda, P(b), ldb, 0.0f, P(c), ldc));
                float *got = malloc(c.bytes);
                ff_memcpy_d2h(gst, got, c.g, c.bytes);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++)
                        if (isnan(got[(size_t)i * ldc + j])) {
                            fprintf(stderr, "%s: beta 0 kept a NaN at [%d, %d]\n", what, i, j);
                            ff_test_failures++;
                            i = M;
                            break;
                        }
                free(nan);
                free(got);
                dual_free(&a), dual_free(&b), dual_free(&c);
            }
    gpu = keep;
    gst = keep_st;
}

/* ---- bf16 weights ------------------------------------------------------------------------------------ */

/* n random weights rounded to bf16, as bf16 bytes on both sides */
static dual dual_bf16(size_t n, float scale) {
    uint16_t *h = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) h[i] = ff_f32_to_bf16(urand() * scale);
    dual d = dual_new(h, n * 2);
    free(h);
    return d;
}

/* ff_gemm_bf16w (the CPU's fp32 activations against cuBLAS's bf16-rounded ones: 8-bit
 * mantissas on one side, 2.5e-2 as the bf16 gemm mode), ff_embedding_fwd_bf16 and the casts
 * (exact: the same rounding on both sides) */
static void test_bf16(void) {
    int shapes[][3] = {{1, 64, 64}, {7, 300, 33}, {67, 513, 129}, {256, 384, 512}, {40, 1, 64}, {5, 4, 0}};
    char what[96];
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int beta = 0; beta < 2; beta++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], lda = K + 3, ldw = K + 5, ldc = N + 2;
            dual a = dual_rand((size_t)M * lda + 1, 1), w = dual_bf16((size_t)N * ldw + 1, 1), c = dual_rand((size_t)M * ldc, 1);
            BOTH(ff_gemm_bf16w(S, M, N, K, P(a), lda, P(w), ldw, (float)beta, P(c), ldc));
            snprintf(what, sizeof what, "gemm_bf16w %dx%dx%d beta %d", M, N, K, beta);
            cmp_all(what, c, 1e-5, 2.5e-2);
            dual_free(&a), dual_free(&w), dual_free(&c);
        }
    /* ff_gemm_bf16: both sides round alike, so only the fp32 summation order differs */
    for (int t = 0; t < 8; t++) {
        const ff_trans ta = (ff_trans)(t & 1), tb = (ff_trans)((t >> 1) & 1);
        const bool x16 = t & 4, y16 = (t & 4) == 0 || t == 7;
        const int M = 37 + t, N = 70 - t, K = t == 5 ? 0 : 129, ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K,
                  bc = tb ? K : N, lda = ac + 1, ldb = bc + 2, ldc = N + 3;
        dual a = x16 ? dual_bf16((size_t)ar * lda + 1, 2) : dual_rand((size_t)ar * lda + 1, 2),
             b = y16 ? dual_bf16((size_t)br * ldb + 1, 1) : dual_rand((size_t)br * ldb + 1, 1),
             c = dual_rand((size_t)M * ldc, 1);
        BOTH(ff_gemm_bf16(S, ta, tb, M, N, K, 0.75f, P(a), x16, lda, P(b), y16, ldb, t & 1 ? 1.0f : 0.0f, P(c), ldc));
        snprintf(what, sizeof what, "gemm_bf16 %dx%dx%d %c%c A%s B%s", M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N',
                 x16 ? "16" : "32", y16 ? "16" : "32");
        cmp_all(what, c, 1e-5, 1e-4);
        dual_free(&a), dual_free(&b), dual_free(&c);
    }
    /* ff_gemm_bf16_out: the same sums stored rounded to bf16 (widened here to compare; a bf16
     * step, 2^-8, apart where the two sums straddle a rounding boundary) */
    for (int t = 0; t < 4; t++) {
        const ff_trans ta = (ff_trans)(t & 1), tb = (ff_trans)(t >> 1);
        const bool x16 = t == 3, y16 = t >= 2;
        const int M = 41 + t, N = 66 - t, K = 131, ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N,
                  lda = ac + 1, ldb = bc + 2, ldc = N + 3;
        dual a = x16 ? dual_bf16((size_t)ar * lda + 1, 2) : dual_rand((size_t)ar * lda + 1, 2),
             b = y16 ? dual_bf16((size_t)br * ldb + 1, 1) : dual_rand((size_t)br * ldb + 1, 1),
             c16 = dual_new(NULL, (size_t)M * ldc * 2), c = dual_new(NULL, (size_t)M * ldc * 4);
        BOTH(ff_gemm_bf16_out(S, ta, tb, M, N, K, P(a), x16, lda, P(b), y16, ldb, P(c16), ldc));
        BOTH(ff_cast_bf16_f32(S, P(c16), P(c), (int64_t)M * ldc));
        snprintf(what, sizeof what, "gemm_bf16_out %dx%dx%d %c%c A%s B%s", M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N',
                 x16 ? "16" : "32", y16 ? "16" : "32");
        cmp_all(what, c, 1e-6, 8e-3);
        dual_free(&a), dual_free(&b), dual_free(&c16), dual_free(&c);
    }
    enum { V = 50, H = 70, T = 9, NC = 100003 };
    const int32_t tok[T] = {0, 49, -1, 7, 7, 12, -1, 3, 48};
    dual tk = dual_i32(tok, T), table = dual_bf16((size_t)V * H, 1), out = dual_rand((size_t)T * H, 1);
    BOTH(ff_embedding_fwd_bf16(S, P(tk), P(table), P(out), T, H));
    cmp_all("embedding_fwd_bf16", out, 0, 0);
    dual x = dual_rand(NC, 1e3f), h = dual_new(NULL, (size_t)NC * 2), y = dual_new(NULL, (size_t)NC * 4);
    BOTH(ff_cast_f32_bf16(S, P(x), P(h), NC));
    BOTH(ff_cast_bf16_f32(S, P(h), P(y), NC));
    cmp_all("cast f32 -> bf16 -> f32", y, 0, 0);
    dual_free(&tk), dual_free(&table), dual_free(&out), dual_free(&x), dual_free(&h), dual_free(&y);
}

/* ---- embedding, rmsnorm, rope, bias, swiglu, rows -------------------------------------------------- */

static void test_rowwise(void) {
    int V = 300, H = 200, T = 157;
    int32_t tok[157];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)ff_rng_below(&rng, (uint64_t)V);
    tok[3] = tok[4] = tok[5] = tok[90];
    tok[7] = tok[20] = -1;
    dual dtok = dual_i32(tok, (size_t)T), table = dual_rand((size_t)V * H, 1), out = dual_rand((size_t)T * H, 1);
    BOTH(ff_embedding_fwd(S, P(dtok), P(table), P(out), T, H));
    cmp_all("embedding_fwd", out, 0, 0); /* a copy: exact */
    dual dtab = dual_rand((size_t)V * H, 1);
    BOTH(ff_embedding_bwd(S, P(dtok), P(out), P(dtab), T, H));
    cmp_all("embedding_bwd (+=)", dtab, 1e-6, 1e-6);

    /* RMSNorm forward and backward */
    dual x = dual_rand((size_t)T * H, 2), w = dual_rand((size_t)H, 1), y = dual_new(NULL, (size_t)T * H * 4);
    dual rstd = dual_new(NULL, (size_t)T * 4);
    BOTH(ff_rmsnorm_fwd(S, P(x), P(w), P(y), P(rstd), T, H, 1e-5f));
    cmp_all("rmsnorm_fwd out", y, 1e-6, 1e-5);
    cmp_all("rmsnorm_fwd rstd", rstd, 1e-6, 1e-5);
    dual dy = dual_rand((size_t)T * H, 1), dx = dual_rand((size_t)T * H, 1), dw = dual_rand((size_t)H, 1);
    BOTH(ff_rmsnorm_bwd(S, P(x), P(w), P(rstd), P(dy), P(dx), P(dw), T, H));
    cmp_all("rmsnorm_bwd dx (+=)", dx, 1e-6, 1e-5);
    cmp_all("rmsnorm_bwd dw (+=)", dw, 1e-5, 1e-5);

    /* RoPE forward then backward on a column block (ld wider than the heads) */
    int nh = 3, D = 24, ld = nh * D + 10, maxpos = 400;
    int32_t pos[157];
    for (int t = 0; t < T; t++) pos[t] = (int32_t)ff_rng_below(&rng, (uint64_t)maxpos);
    float *cs = malloc((size_t)maxpos * D / 2 * 4), *sn = malloc((size_t)maxpos * D / 2 * 4);
    for (int p = 0; p < maxpos; p++)
        for (int i = 0; i < D / 2; i++) {
            double a = p * pow(10000.0, -2.0 * i / D);
            cs[p * D / 2 + i] = (float)cos(a);
            sn[p * D / 2 + i] = (float)sin(a);
        }
    dual dpos = dual_i32(pos, (size_t)T), dcs = dual_new(cs, (size_t)maxpos * D / 2 * 4);
    dual dsn = dual_new(sn, (size_t)maxpos * D / 2 * 4), xr = dual_rand((size_t)T * ld, 1);
    BOTH(ff_rope_fwd(S, P(xr), ld, P(dpos), P(dcs), P(dsn), T, nh, D));
    cmp_all("rope_fwd", xr, 1e-6, 1e-6);
    dual dr = dual_rand((size_t)T * ld, 1);
    BOTH(ff_rope_bwd(S, P(dr), ld, P(dpos), P(dcs), P(dsn), T, nh, D));
    cmp_all("rope_bwd", dr, 1e-6, 1e-6);
    free(cs);
    free(sn);

    /* bias on a column block */
    int N = 77, ldb = 90;
    dual xb = dual_rand((size_t)T * ldb, 1), bias = dual_rand((size_t)N, 1), db = dual_rand((size_t)N, 1);
    BOTH(ff_bias_add(S, P(xb), ldb, P(bias), T, N));
    cmp_all("bias_add", xb, 1e-6, 1e-6);
    BOTH(ff_bias_bwd(S, P(xb), ldb, P(db), T, N));
    cmp_all("bias_bwd (+=)", db, 1e-5, 1e-5);

    /* SwiGLU, the backward both out of place and in place (dgu aliasing gu) */
    int I = 150;
    dual gu = dual_rand((size_t)T * 2 * I, 4), h = dual_new(NULL, (size_t)T * I * 4), dh = dual_rand((size_t)T * I, 1);
    dual dgu = dual_new(NULL, (size_t)T * 2 * I * 4);
    BOTH(ff_swiglu_fwd(S, P(gu), P(h), T, I));
    cmp_all("swiglu_fwd", h, 1e-5, 1e-5); /* the CPU's fast exp: about 1e-6 relative */
    BOTH(ff_swiglu_bwd(S, P(gu), P(dh), P(dgu), T, I));
    cmp_all("swiglu_bwd", dgu, 1e-5, 1e-5);
    BOTH(ff_swiglu_bwd(S, P(gu), P(dh), P(gu), T, I));
    cmp_all("swiglu_bwd in place", gu, 1e-5, 1e-5);
    /* on bf16 gate|up (the forward's output bf16 too: widened to compare, a bf16 step apart at
     * most where the two exps straddle a rounding boundary) */
    dual gu16 = dual_bf16((size_t)T * 2 * I, 4), h16 = dual_new(NULL, (size_t)T * I * 2);
    BOTH(ff_swiglu_fwd_bf16(S, P(gu16), P(h16), T, I));
    BOTH(ff_cast_bf16_f32(S, P(h16), P(h), (int64_t)T * I));
    cmp_all("swiglu_fwd_bf16", h, 1e-6, 8e-3);
    dual dh16 = dual_bf16((size_t)T * I, 1), dgu16 = dual_new(NULL, (size_t)T * 2 * I * 2);
    BOTH(ff_swiglu_bwd_bf16(S, P(gu16), P(dh16), P(dgu16), T, I));
    BOTH(ff_cast_bf16_f32(S, P(dgu16), P(dgu), (int64_t)T * 2 * I));
    cmp_all("swiglu_bwd_bf16", dgu, 1e-6, 8e-3);
    dual_free(&gu16), dual_free(&h16), dual_free(&dh16), dual_free(&dgu16);

    /* rows */
    int32_t rows[40];
    for (int r = 0; r < 40; r++) rows[r] = (int32_t)((r * 7) % 50); /* distinct targets for scatter */
    dual drows = dual_i32(rows, 40), src = dual_rand((size_t)40 * ldb, 1), dst = dual_rand((size_t)50 * N, 1);
    BOTH(ff_scatter_rows(S, P(src), ldb, P(dst), P(drows), 40, N));
    cmp_all("scatter_rows", dst, 0, 0);
    dual g = dual_rand((size_t)40 * N, 1);
    BOTH(ff_gather_rows(S, P(dst), P(drows), P(g), 40, N));
    cmp_all("gather_rows", g, 0, 0);

    dual *all[] = {&dtok, &table, &out, &dtab, &x, &w, &y, &rstd, &dy, &dx, &dw, &dpos, &dcs, &dsn, &xr, &dr,
                   &xb, &bias, &db, &gu, &h, &dh, &dgu, &drows, &src, &dst, &g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

/* ---- attention ------------------------------------------------------------------------------------ */

/* The bytes of d (side `side`) to the host. */
static void *host_of(dual d, int on) {
    void *h = malloc(d.bytes);
    ff_stream *st = on ? gst : cst;
    ff_memcpy_d2h(st, h, on ? d.g : d.c, d.bytes);
    REQUIRE(ff_stream_sync(st) == 0);
    return h;
}
static void same_bits(const char *what, int on, dual a, dual b) {
    void *x = host_of(a, on), *y = host_of(b, on);
    if (a.bytes != b.bytes || memcmp(x, y, a.bytes)) {
        fprintf(stderr, "%s (%s): not bit for bit\n", what, on ? "cuda" : "cpu");
        ff_test_failures++;
    }
    free(x), free(y);
}

/* ff_attention_fwd_bf16 / _bwd_bf16 on each side against that side's fp32 kernels on the widened
 * values, bit for bit: out16 the fp32 output rounded, lse and dqkv the same bits (widening is
 * exact, and the kernels sum alike for either storage; dout rounded to bf16 for both). And the
 * two sides' bf16 entries against each other (dqkv from the same out16 on both: the CPU's,
 * copied). */
static void attention_bf16_case(const char *kind, dual qkv, int ld, dual dss, const int32_t *ss, int S_, int T, int Hq,
                                int Hkv, int D, dual dout, double tol) {
    const size_t HD = (size_t)Hq * D, nq = (size_t)T * ld;
    char what[160];
    dual q16 = dual_new(NULL, nq * 2), qw = dual_new(NULL, nq * 4), o32 = dual_new(NULL, (size_t)T * HD * 4),
         l32 = dual_new(NULL, (size_t)T * Hq * 4), o16 = dual_new(NULL, (size_t)T * HD * 2),
         l16 = dual_new(NULL, (size_t)T * Hq * 4), r16 = dual_new(NULL, (size_t)T * HD * 2),
         ow = dual_new(NULL, (size_t)T * HD * 4), delta = dual_new(NULL, (size_t)T * Hq * 4),
         g32 = dual_rand(nq, 1), g16 = dual_new(NULL, nq * 4), do16 = dual_new(NULL, (size_t)T * HD * 2),
         dow = dual_new(NULL, (size_t)T * HD * 4);
    BOTH(ff_cast_f32_bf16(S, P(qkv), P(q16), (int64_t)nq));
    BOTH(ff_cast_bf16_f32(S, P(q16), P(qw), (int64_t)nq));
    BOTH(ff_attention_fwd(S, P(qw), ld, P(dss), S_, T, Hq, Hkv, D, P(o32), P(l32)));
    BOTH(ff_attention_fwd_bf16(S, P(q16), ld, P(dss), S_, T, Hq, Hkv, D, P(o16), P(l16)));
    BOTH(ff_cast_f32_bf16(S, P(o32), P(r16), (int64_t)(T * HD)));
    for (int on = 0; on < 2; on++) {
        snprintf(what, sizeof what, "attention_fwd_bf16 (%s) out16 T=%d D=%d: the fp32 output rounded", kind, T, D);
        same_bits(what, on, o16, r16);
        snprintf(what, sizeof what, "attention_fwd_bf16 (%s) lse T=%d D=%d", kind, T, D);
        same_bits(what, on, l16, l32);
    }
    BOTH(ff_cast_bf16_f32(S, P(o16), P(ow), (int64_t)(T * HD)));
    snprintf(what, sizeof what, "attention_fwd_bf16 (%s) out16 T=%d Hq=%d Hkv=%d D=%d", kind, T, Hq, Hkv, D);
    cmp_all(what, ow, 1e-5, (tol ? tol : 0) + 8e-3); /* and a bf16 step where the sums round across one */
    /* the backward from the same out16 on both sides */
    void *o16c = host_of(o16, 0);
    ff_memcpy_h2d(gst, o16.g, o16c, o16.bytes);
    free(o16c);
    BOTH(ff_cast_bf16_f32(S, P(o16), P(ow), (int64_t)(T * HD)));
    BOTH(ff_memcpy_d2d(S, P(g16), P(g32), nq * 4)); /* the same ld padding on both outputs */
    BOTH(ff_cast_f32_bf16(S, P(dout), P(do16), (int64_t)(T * HD)));
    BOTH(ff_cast_bf16_f32(S, P(do16), P(dow), (int64_t)(T * HD)));
    BOTH(ff_attention_bwd(S, P(qw), ld, P(dss), ss, S_, T, Hq, Hkv, D, P(ow), P(l32), P(dow), P(delta), P(g32)));
    BOTH(ff_attention_bwd_bf16(S, P(q16), ld, P(dss), ss, S_, T, Hq, Hkv, D, P(o16), P(l32), P(do16), P(delta), P(g16)));
    for (int on = 0; on < 2; on++) {
        snprintf(what, sizeof what, "attention_bwd_bf16 (%s) dqkv T=%d D=%d: the fp32 kernel's on the widened values", kind,
                 T, D);
        same_bits(what, on, g16, g32);
    }
    snprintf(what, sizeof what, "attention_bwd_bf16 (%s) dqkv T=%d Hq=%d Hkv=%d D=%d", kind, T, Hq, Hkv, D);
    cmp_all(what, g16, 1e-5, tol ? 2 * tol : 2e-4);
    dual *all[] = {&q16, &qw, &o32, &l32, &o16, &l16, &r16, &ow, &delta, &g32, &g16, &do16, &dow};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dual_free(all[i]);
}

/* tol: 0 for the fp32 kernels (1e-5 relative), else the relative tolerance of the tensor-core
 * ones (bf16 operands). */
static void test_attention_case(const int32_t *lens, int S_, int Hq, int Hkv, int D, double tol) {
    int32_t ss[16];
    ss[0] = 0;
    for (int s = 0; s < S_; s++) ss[s + 1] = ss[s] + lens[s];
    int T = ss[S_], W = (Hq + 2 * Hkv) * D, ld = W + 6, HD = Hq * D;
    const char *kind = tol ? "tensor cores" : "fp32";
    char what[160];
    dual qkv = dual_rand((size_t)T * ld, 1.5f), dss = dual_i32(ss, (size_t)S_ + 1);
    dual out = dual_new(NULL, (size_t)T * HD * 4), lse = dual_new(NULL, (size_t)T * Hq * 4);
    BOTH(ff_attention_fwd(S, P(qkv), ld, P(dss), S_, T, Hq, Hkv, D, P(out), P(lse)));
    snprintf(what, sizeof what, "attention_fwd (%s) out T=%d Hq=%d Hkv=%d D=%d", kind, T, Hq, Hkv, D);
    cmp_all(what, out, 1e-5, tol ? tol : 1e-4);
    snprintf(what, sizeof what, "attention_fwd (%s) lse T=%d Hq=%d Hkv=%d D=%d", kind, T, Hq, Hkv, D);
    cmp_all(what, lse, 1e-5, tol ? tol : 1e-5);
    dual dout = dual_rand((size_t)T * HD, 1), delta = dual_new(NULL, (size_t)T * Hq * 4);
    dual dqkv = dual_rand((size_t)T * ld, 1); /* the ld padding must stay as it is on both */
    BOTH(ff_attention_bwd(S, P(qkv), ld, P(dss), ss, S_, T, Hq, Hkv, D, P(out), P(lse), P(dout), P(delta), P(dqkv)));
    snprintf(what, sizeof what, "attention_bwd (%s) dqkv T=%d Hq=%d Hkv=%d D=%d", kind, T, Hq, Hkv, D);
    cmp_all(what, dqkv, 1e-5, tol ? 2 * tol : 2e-4);
    if (tol) { /* one writer per row, sums in a fixed order: a second run gives the same bits */
        size_t n = (size_t)T * ld;
        float *a = malloc(n * 4), *b = malloc(n * 4);
        ff_memcpy_d2h(gst, a, dqkv.g, n * 4);
        side = 1;
        ff_attention_bwd(S, P(qkv), ld, P(dss), ss, S_, T, Hq, Hkv, D, P(out), P(lse), P(dout), P(delta), P(dqkv));
        ff_memcpy_d2h(gst, b, dqkv.g, n * 4);
        CHECK(ff_stream_sync(gst) == 0);
        snprintf(what, sizeof what, "attention_bwd (%s) repeats bit for bit T=%d D=%d", kind, T, D);
        if (memcmp(a, b, n * 4)) {
            fprintf(stderr, "%s: it does not\n", what);
            ff_test_failures++;
        }
        free(a), free(b);
    }
    attention_bf16_case(kind, qkv, ld, dss, ss, S_, T, Hq, Hkv, D, dout, tol);
    dual_free(&qkv), dual_free(&dss), dual_free(&out), dual_free(&lse), dual_free(&dout), dual_free(&delta);
    dual_free(&dqkv);
}

/* Every case on the fp32 kernels, and with tol on the tensor-core ones (the kernels of
 * tests/kernels/test_attention_tc_emu.c's emulator), through a backend made with
 * FF_CUDA_ATTENTION=bf16. */
static void attention_cases(double tol) {
    int32_t a[] = {37, 0, 70, 1, 100};
    test_attention_case(a, 5, 4, 2, 16, tol);
    int32_t b[] = {130, 3};
    test_attention_case(b, 2, 2, 1, 64, tol);
    int32_t c[] = {45, 64};
    test_attention_case(c, 2, 3, 3, 80, tol); /* head_dim not a multiple of 32 */
    int32_t d[] = {33};
    test_attention_case(d, 1, 2, 1, 128, tol);
    int32_t e[] = {5, 9, 1, 17, 0, 12, 3, 30, 8, 2, 21, 11, 6};
    test_attention_case(e, 13, 2, 2, 48, tol); /* tiles start and end inside sequences */
}

/* A prefill against the paged KV cache: 179 query rows of 3 sequences (70 of one, 9 of
 * another, 100 of a third whose first 30 positions were cached before: a second chunk), the
 * 9-row one and the last rows interleaved with the third inside 64-row tiles, on a cache of 40
 * blocks of 16 rows named out of order; fp32 and bf16 caches. On a backend with tensor-core
 * attention this is k_att_cached_tc (Q, K, V and the probabilities rounded to bf16), else
 * the CUDA-core kernel. */
static void cached_prefill_case(double tol, const char *what) {
    enum { BS = 16, NB = 40, TLD = 10, T = 179, S3 = 3, HQ = 8, HKV = 2, D = 64 };
    int32_t tab[S3 * TLD], sq[T], nk[T], pos[S3] = {0, 0, 30};
    for (int i = 0; i < S3 * TLD; i++) tab[i] = (i * 7 + 3) % NB;
    int t = 0;
    for (int i = 0; i < 70; i++) sq[t] = 1, nk[t++] = ++pos[1];
    for (int i = 0; i < 9; i++) sq[t] = 0, nk[t++] = ++pos[0];
    for (int i = 0; i < 80; i++) sq[t] = 2, nk[t++] = ++pos[2];
    for (int i = 0; i < 20; i++) { /* interleaved: sequence 2's last rows with sequence 1's next ones */
        const int which = i % 2 ? 1 : 2;
        sq[t] = which, nk[t++] = ++pos[which];
    }
    REQUIRE(t == T);
    dual q = dual_rand((size_t)T * HQ * D, 1), kc = dual_rand((size_t)NB * BS * HKV * D, 1),
         vc = dual_rand((size_t)NB * BS * HKV * D, 1), dt = dual_i32(tab, S3 * TLD), ds = dual_i32(sq, T), dn = dual_i32(nk, T),
         o = dual_new(NULL, (size_t)T * HQ * D * 4);
    char w[128];
    BOTH(ff_attention_cached(S, P(q), HQ * D, P(kc), P(vc), P(dt), S3, TLD, BS, P(ds), P(dn), T, HQ, HKV, D, P(o)));
    snprintf(w, sizeof w, "attention_cached, a prefill (%s)", what);
    cmp_all(w, o, tol * 1e-1, tol);
    dual k16 = dual_bf16((size_t)NB * BS * HKV * D, 1), v16 = dual_bf16((size_t)NB * BS * HKV * D, 1);
    BOTH(ff_attention_cached_bf16(S, P(q), HQ * D, P(k16), P(v16), P(dt), S3, TLD, BS, P(ds), P(dn), T, HQ, HKV, D, P(o)));
    snprintf(w, sizeof w, "attention_cached_bf16, a prefill (%s)", what);
    cmp_all(w, o, tol * 1e-1, tol);
    dual_free(&q), dual_free(&kc), dual_free(&vc), dual_free(&dt), dual_free(&ds), dual_free(&dn), dual_free(&o);
    dual_free(&k16), dual_free(&v16);
}

static void test_attention(void) {
    attention_cases(0);
    cached_prefill_case(1e-4, "CUDA cores");
    setenv("FF_CUDA_ATTENTION", "bf16", 1);
    ff_backend *g_tc = gpu_new("cuda");
    unsetenv("FF_CUDA_ATTENTION");
    REQUIRE(g_tc);
    ff_backend *keep = gpu;
    ff_stream *keep_st = gst;
    gpu = g_tc;
    gst = ff_backend_stream(g_tc);
    attention_cases(2e-2); /* bf16 Q, K, V, dO and probabilities: ~0.4 % each */
    cached_prefill_case(2e-2, "tensor cores");
    gpu = keep;
    gst = keep_st;
    ff_backend_destroy(&g_tc);
    setenv("FF_CUDA_ATTENTION", "fp16", 1);
    CHECK(gpu_new("cuda") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "FF_CUDA_ATTENTION");
    unsetenv("FF_CUDA_ATTENTION");
    setenv("FF_CUDA_DECODE_SPLIT", "yes", 1);
    CHECK(gpu_new("cuda") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "FF_CUDA_DECODE_SPLIT");
    unsetenv("FF_CUDA_DECODE_SPLIT");

    /* against a paged KV cache: 15 blocks of 13 rows, 3 sequences whose tables name them out of
     * order, the last two sharing their first two blocks (a common prompt) */
    int Hq = 6, Hkv = 2, D = 40, bs = 13, rows = 15 * bs, T = 7, tld = 5;
    int32_t table[15] = {14, 3, 7, 9, 0, /**/ 5, 11, 1, 12, 2, /**/ 5, 11, 4, 6, 8};
    int32_t seq[7] = {0, 0, 1, 1, 2, 2, 2}, nk[7] = {1, 17, 33, 60, 2, 27, 59};
    dual q = dual_rand((size_t)T * (Hq * D + 8), 1), kc = dual_rand((size_t)rows * Hkv * D, 1);
    dual vc = dual_rand((size_t)rows * Hkv * D, 1), dtab = dual_i32(table, 15), dseq = dual_i32(seq, 7);
    dual dnk = dual_i32(nk, 7), o = dual_new(NULL, (size_t)T * Hq * D * 4);
    BOTH(ff_attention_cached(S, P(q), Hq * D + 8, P(kc), P(vc), P(dtab), 3, tld, bs, P(dseq), P(dnk), T, Hq, Hkv, D, P(o)));
    cmp_all("attention_cached", o, 1e-5, 1e-4);
    /* the same on a bf16 cache (the same bf16 bytes on both sides, widened alike), and the
     * rounding scatter that fills one */
    dual kc16 = dual_bf16((size_t)rows * Hkv * D, 1), vc16 = dual_bf16((size_t)rows * Hkv * D, 1);
    BOTH(ff_attention_cached_bf16(S, P(q), Hq * D + 8, P(kc16), P(vc16), P(dtab), 3, tld, bs, P(dseq), P(dnk), T, Hq, Hkv, D,
                                  P(o)));
    cmp_all("attention_cached_bf16", o, 1e-5, 1e-4);
    int32_t to[7] = {3, 190, 0, 17, 44, 101, 5};
    dual dto = dual_i32(to, 7);
    BOTH(ff_scatter_rows_bf16(S, P(q), Hq * D + 8, P(kc16), P(dto), T, Hkv * D));
    cmp_all("scatter_rows_bf16 (the cache's bytes as floats)", kc16, 0, 0);
    dual_free(&kc16), dual_free(&vc16), dual_free(&dto);
    dual_free(&dtab), dual_free(&dseq);
    dual_free(&q), dual_free(&kc), dual_free(&vc), dual_free(&dnk), dual_free(&o);

    /* decoding's long contexts: 2 sequences of up to 40 blocks of 16 rows (640 keys: the keys
     * split over blocks, combined after), a GQA group of 7 heads sharing each staged tile,
     * contexts that end on a split's edge, just past it, and at the table's end; fp32 and bf16
     * caches */
    {
        enum { BS = 16, NB = 80, TLD = 40, T2 = 6, HQ = 14, HKV = 2, D2 = 64 };
        int32_t tab2[2 * TLD], seq2[T2] = {0, 0, 1, 1, 1, 0}, nk2[T2] = {1, 128, 129, 640, 301, 33};
        for (int i = 0; i < 2 * TLD; i++) tab2[i] = (i * 37 + 5) % NB; /* a permutation of the 80 blocks */
        dual q2 = dual_rand((size_t)T2 * HQ * D2, 1), k2 = dual_rand((size_t)NB * BS * HKV * D2, 1),
             v2 = dual_rand((size_t)NB * BS * HKV * D2, 1), t2 = dual_i32(tab2, 2 * TLD), s2 = dual_i32(seq2, T2),
             n2 = dual_i32(nk2, T2), o2 = dual_new(NULL, (size_t)T2 * HQ * D2 * 4);
        BOTH(ff_attention_cached(S, P(q2), HQ * D2, P(k2), P(v2), P(t2), 2, TLD, BS, P(s2), P(n2), T2, HQ, HKV, D2, P(o2)));
        cmp_all("attention_cached, long contexts (keys split)", o2, 1e-5, 1e-4);
        dual k16 = dual_bf16((size_t)NB * BS * HKV * D2, 1), v16 = dual_bf16((size_t)NB * BS * HKV * D2, 1);
        BOTH(ff_attention_cached_bf16(S, P(q2), HQ * D2, P(k16), P(v16), P(t2), 2, TLD, BS, P(s2), P(n2), T2, HQ, HKV, D2,
                                      P(o2)));
        cmp_all("attention_cached_bf16, long contexts (keys split)", o2, 1e-5, 1e-4);
        dual_free(&q2), dual_free(&k2), dual_free(&v2), dual_free(&t2), dual_free(&s2), dual_free(&n2), dual_free(&o2);
        dual_free(&k16), dual_free(&v16);
    }
}

/* ---- logits and sampling --------------------------------------------------------------------------- */

static void test_logits(void) {
    int T = 23, V = 5003;
    int32_t tg[23];
    for (int t = 0; t < T; t++) tg[t] = (int32_t)ff_rng_below(&rng, (uint64_t)V);
    tg[2] = -1;
    tg[9] = -2;
    dual z = dual_rand((size_t)T * V, 6), dt = dual_i32(tg, (size_t)T);
    dual lp = dual_new(NULL, (size_t)T * 4), ent = dual_new(NULL, (size_t)T * 4), lse = dual_new(NULL, (size_t)T * 4);
    BOTH(ff_logprob_fwd(S, P(z), P(dt), 0.7f, T, V, P(lp), P(ent), P(lse)));
    cmp_all("logprob_fwd logprob", lp, 1e-4, 1e-5);
    cmp_all("logprob_fwd entropy", ent, 1e-4, 1e-5);
    cmp_all("logprob_fwd lse", lse, 1e-4, 1e-5);
    dual lse2 = dual_new(NULL, (size_t)T * 4);
    ff_dptr none = {0};
    BOTH(ff_logprob_fwd(S, P(z), none, 1.0f, T, V, none, none, P(lse2))); /* no targets, lse only */
    cmp_all("logprob_fwd lse only", lse2, 1e-4, 1e-5);
    dual dlp = dual_rand((size_t)T, 1), dent = dual_rand((size_t)T, 1);
    BOTH(ff_logprob_bwd(S, P(z), P(dt), 0.7f, T, V, P(lse), P(dlp), P(dent), P(ent)));
    cmp_all("logprob_bwd (logprob and entropy)", z, 1e-6, 1e-4);
    dual z2 = dual_rand((size_t)T * V, 6);
    BOTH(ff_logprob_fwd(S, P(z2), P(dt), 1.0f, T, V, P(lp), none, P(lse)));
    BOTH(ff_logprob_bwd(S, P(z2), P(dt), 1.0f, T, V, P(lse), P(dlp), none, none));
    cmp_all("logprob_bwd (logprob only)", z2, 1e-6, 1e-4);
    /* dlogits left in bf16 in each row's first half (two of the CUDA kernel's blocks a row):
     * widened, the first V of each 2V; a bf16 step apart where the sums straddle a rounding */
    dual z3 = dual_rand((size_t)T * V, 6), wide = dual_new(NULL, (size_t)T * 2 * V * 4);
    BOTH(ff_logprob_fwd(S, P(z3), P(dt), 0.7f, T, V, P(lp), P(ent), P(lse)));
    BOTH(ff_logprob_bwd_bf16(S, P(z3), P(dt), 0.7f, T, V, P(lse), P(dlp), P(dent), P(ent)));
    BOTH(ff_cast_bf16_f32(S, P(z3), P(wide), (int64_t)T * 2 * V));
    for (int t = 0; t < T; t++) {
        char what[64];
        snprintf(what, sizeof what, "logprob_bwd_bf16 row %d", t);
        cmp(what, wide, (size_t)t * 2 * V, (size_t)V, 1e-6, 8e-3);
    }
    dual_free(&z3), dual_free(&wide);
    dual_free(&z), dual_free(&dt), dual_free(&lp), dual_free(&ent), dual_free(&lse), dual_free(&lse2);
    dual_free(&dlp), dual_free(&dent), dual_free(&z2);

    /* sampling: greedy, plain temperature, top-k, top-p, both, each logprob mode */
    enum { B = 12 };
    int Vs = 3001;
    ff_sample_params sp[B];
    for (int b = 0; b < B; b++) {
        sp[b] = (ff_sample_params){.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .logprob_mode = b % 3,
                                   .uniform = (float)ff_rng_uniform(&rng)};
        if (b < 2) sp[b].temperature = 0.0f;
        if (b >= 4) sp[b].temperature = 0.8f;
        if (b >= 5 && b < 7) sp[b].top_k = 7 + b;
        if (b >= 7 && b < 9) sp[b].top_p = 0.6f;
        if (b >= 9) sp[b].top_k = 50, sp[b].top_p = 0.9f;
    }
    dual logits = dual_rand((size_t)B * Vs, 4), params = dual_new(sp, sizeof sp);
    dual ws = dual_new(NULL, (size_t)B * Vs * 8), tok = dual_new(NULL, B * 4), slp = dual_new(NULL, B * 4);
    BOTH(ff_sample(S, P(logits), B, Vs, P(params), P(ws), P(tok), P(slp)));
    int32_t tc[B], tgpu[B];
    ff_memcpy_d2h(cst, tc, tok.c, sizeof tc);
    ff_memcpy_d2h(gst, tgpu, tok.g, sizeof tgpu);
    int near_edge = 0;
    for (int b = 0; b < B; b++) {
        if (tc[b] == tgpu[b]) continue;
        /* the two backends sum the row's probabilities in different orders, so a draw within a
         * rounding error of a bucket's edge may land on either side: the CPU, its uniform moved
         * by 2e-5 either way, must then pick the CUDA token; any other difference is a fault */
        bool edge = false;
        for (int sgn = -1; sgn <= 1 && !edge; sgn += 2) {
            ff_sample_params q = sp[b];
            q.uniform = fminf(fmaxf(q.uniform + 2e-5f * (float)sgn, 0.0f), 0.99999994f);
            dual qp = dual_new(&q, sizeof q), qt = dual_new(NULL, 4), ql = dual_new(NULL, 4);
            side = 0;
            ff_sample(cst, ff_dptr_add(logits.c, (size_t)b * Vs, 4), 1, Vs, qp.c, ws.c, qt.c, ql.c);
            int32_t got;
            ff_memcpy_d2h(cst, &got, qt.c, sizeof got);
            edge = got == tgpu[b];
            dual_free(&qp), dual_free(&qt), dual_free(&ql);
        }
        fprintf(stderr, "sample row %d (temp %g top_k %d top_p %g): cuda picked %d, cpu %d%s\n", b, (double)sp[b].temperature,
                sp[b].top_k, (double)sp[b].top_p, tgpu[b], tc[b], edge ? " (a draw at a bucket's edge: the cpu picks it too 2e-5 away)" : "");
        if (edge) near_edge++;
        else ff_test_failures++;
    }
    CHECK(near_edge <= 1); /* an edge is rare (about 1e-4 of draws); more is a fault */
    /* the logprob of the token each side picked (an edge row's differ: compared where they agree) */
    float lc[B], lg[B];
    ff_memcpy_d2h(cst, lc, slp.c, sizeof lc);
    ff_memcpy_d2h(gst, lg, slp.g, sizeof lg);
    if (ff_stream_sync(gst)) {
        fprintf(stderr, "sample: the cuda stream failed: %s\n", ff_error_message());
        ff_test_failures++;
    }
    for (int b = 0; b < B; b++)
        if (tc[b] == tgpu[b]) CHECK_CLOSE(lg[b], lc[b], 1e-4, 1e-5);
    dual_free(&logits), dual_free(&params), dual_free(&ws), dual_free(&tok), dual_free(&slp);
}

/* ---- vectors, the optimizer, streams --------------------------------------------------------------- */

static void test_vectors(void) {
    int64_t n = 1000003;
    dual y = dual_rand((size_t)n, 1), x = dual_rand((size_t)n, 1);
    BOTH(ff_add(S, P(y), P(x), n));
    cmp_all("add", y, 1e-7, 0);
    BOTH(ff_scale(S, P(y), n, -0.37f));
    cmp_all("scale", y, 1e-7, 0);
    double sc = ff_sumsq(cst, y.c, n), sg = ff_sumsq(gst, y.g, n);
    CHECK_CLOSE(sg, sc, 0, 1e-5); /* double partial sums on the GPU, float blocks of 4096 on the CPU */
    CHECK(ff_sumsq(gst, y.g, 0) == 0.0);
    dual p = dual_rand((size_t)n, 1), m = dual_rand((size_t)n, 0.01f), v = dual_rand((size_t)n, 0.01f);
    BOTH(ff_scale(S, P(v), n, 0.0f)); /* v >= 0: zero, then one step makes it g^2-positive */
    for (int step = 1; step <= 3; step++) {
        float bc1 = 1.0f - powf(0.9f, (float)step), bc2 = 1.0f - powf(0.999f, (float)step);
        BOTH(ff_adamw(S, P(p), P(x), P(m), P(v), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, bc1, bc2, 0.5f));
    }
    cmp_all("adamw param", p, 1e-6, 1e-6);
    cmp_all("adamw exp_avg", m, 1e-7, 1e-6);
    cmp_all("adamw exp_avg_sq", v, 1e-9, 1e-6);
    dual_free(&y), dual_free(&x), dual_free(&p), dual_free(&m), dual_free(&v);

    /* copies on the device: overlapping d2d has memmove semantics */
    int32_t host[1000], back[1000];
    for (int i = 0; i < 1000; i++) host[i] = i;
    dual a = dual_i32(host, 1000);
    BOTH(ff_memcpy_d2d(S, ff_dptr_add(P(a), 10, 4), P(a), 900 * 4));
    BOTH(ff_memset_zero(S, ff_dptr_add(P(a), 950, 4), 50 * 4));
    ff_memcpy_d2h(gst, back, a.g, sizeof back);
    CHECK(back[9] == 9 && back[10] == 0 && back[909] == 899 && back[910] == 910 && back[949] == 949 && back[950] == 0);
    cmp_all("d2d overlapping, memset", a, 0, 0);
    dual_free(&a);

    /* a second stream runs and syncs by itself */
    ff_stream *s2 = ff_stream_new(gpu);
    REQUIRE(s2 && ff_stream_backend(s2) == gpu);
    ff_buffer *b = ff_buffer_new(gpu, 4096);
    REQUIRE(b);
    int32_t z[1024];
    ff_memcpy_d2h(s2, z, ff_dptr_of(b, 0), sizeof z);
    int zero = 1;
    for (int i = 0; i < 1024; i++) zero &= z[i] == 0;
    CHECK(zero); /* new buffers are zero-filled */
    ff_memcpy_h2d(s2, ff_dptr_of(b, 0), host, 4000);
    CHECK(ff_stream_sync(s2) == 0);
    ff_memcpy_d2h(s2, z, ff_dptr_of(b, 0), 4000);
    CHECK(memcmp(z, host, 4000) == 0);
    ff_buffer_destroy(&b);

    /* the stream's own workspace (cuBLAS's 32 MiB, made at its first product; the kernel
     * scratch the bf16 rounding of an fp32 product takes) is in the backend's counters, and
     * leaves them with the stream */
    ff_backend_memory m0, m1, m2;
    ff_buffer *A = ff_buffer_new(gpu, 64 * 64 * 4), *C = ff_buffer_new(gpu, 64 * 64 * 4);
    REQUIRE(A && C);
    ff_backend_memory_of(gpu, &m0);
    ff_gemm(s2, FF_NO_TRANS, FF_TRANS, 64, 64, 64, 1.0f, ff_dptr_of(A, 0), 64, ff_dptr_of(A, 0), 64, 0.0f, ff_dptr_of(C, 0), 64);
    CHECK(ff_stream_sync(s2) == 0);
    ff_backend_memory_of(gpu, &m1);
    CHECK(m1.buffers == m0.buffers);
    CHECK(m1.in_use - m0.in_use >= (int64_t)(32 << 20) + (ff_backend_bf16_products(gpu) ? (1 << 20) : 0));
    CHECK(m1.peak >= m1.in_use);
    ff_stream_destroy(&s2);
    ff_backend_memory_of(gpu, &m2);
    CHECK(m2.in_use == m0.in_use);
    ff_buffer_destroy(&A), ff_buffer_destroy(&C);

    /* the device's free memory: within its capacity beside what fuseflow holds, and 64 MiB less
     * (at least) with a 64 MiB buffer alive; none on the cpu */
    const int64_t free0 = ff_backend_device_free(gpu);
    ff_backend_memory_of(gpu, &m0);
    CHECK(free0 > 0 && m0.in_use + free0 <= m0.capacity);
    ff_buffer *big = ff_buffer_new(gpu, (size_t)64 << 20);
    REQUIRE(big);
    CHECK(ff_backend_device_free(gpu) <= free0 - ((int64_t)64 << 20));
    ff_buffer_destroy(&big);
    CHECK(ff_backend_device_free(cpu) == -1);

    /* out of memory is an error, not a crash, and says what fuseflow holds of the device */
    CHECK(ff_buffer_new(gpu, (size_t)1 << 50) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "out of device memory allocating 1.0 PiB");
    CHECK_STR_CONTAINS(ff_error_message(), "fuseflow holds");
    CHECK_STR_CONTAINS(ff_error_message(), " free");

    /* a stream's cuBLAS workspace that does not fit: the product fails its stream with the
     * same account, and the device works again once memory is freed. Filling the device takes
     * its whole memory (the emulator's in host memory: only where FF_CUDA_EMU_MEMORY makes it
     * small, as the _emu_low variant does). */
    ff_backend_memory_of(gpu, &m0);
#ifdef FF_TEST_CUDA_EMU
    const bool fill = m0.capacity <= ((int64_t)2 << 30);
#else
    const bool fill = true;
#endif
    if (!fill) return;
    ff_stream *s3 = ff_stream_new(gpu);
    ff_buffer *a16 = ff_buffer_new(gpu, 16 * 16 * 2), *c32 = ff_buffer_new(gpu, 16 * 16 * 4);
    REQUIRE(s3 && a16 && c32);
    enum { MAX_FILL = 1024 };
    ff_buffer *hold[MAX_FILL];
    const int nh = gpu_fill(gpu, hold, MAX_FILL);
    CHECK(nh < MAX_FILL); /* filled: under 1 MiB is left */
    ff_gemm_bf16(s3, FF_NO_TRANS, FF_TRANS, 16, 16, 16, 1.0f, ff_dptr_of(a16, 0), true, 16, ff_dptr_of(a16, 0), true, 16, 0.0f,
                 ff_dptr_of(c32, 0), 16);
    CHECK(ff_stream_sync(s3) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "out of device memory for cuBLAS's 32 MiB workspace");
    CHECK_STR_CONTAINS(ff_error_message(), "fuseflow holds");
    ff_stream_destroy(&s3);
    for (int i = 0; i < nh; i++) ff_buffer_destroy(&hold[i]);
    s3 = ff_stream_new(gpu);
    REQUIRE(s3);
    ff_gemm_bf16(s3, FF_NO_TRANS, FF_TRANS, 16, 16, 16, 1.0f, ff_dptr_of(a16, 0), true, 16, ff_dptr_of(a16, 0), true, 16, 0.0f,
                 ff_dptr_of(c32, 0), 16);
    CHECK(ff_stream_sync(s3) == 0);
    ff_stream_destroy(&s3);
    ff_buffer_destroy(&a16), ff_buffer_destroy(&c32);
}

/* Events order two streams with no host wait: 64 MiB copied on one, then read on the other
 * after waiting for an event recorded behind the copy (without the wait the second stream
 * could read the buffer before it is filled). The native stream is a real one, and NCCL
 * reads this memory. */
static void test_events(void) {
    const size_t n = (size_t)16 << 20; /* floats */
    float *h = malloc(n * 4), *back = malloc(n * 4);
    REQUIRE(h && back);
    for (size_t i = 0; i < n; i++) h[i] = (float)(i % 1009);
    ff_buffer *a = ff_buffer_new(gpu, n * 4), *b = ff_buffer_new(gpu, n * 4);
    ff_stream *s1 = ff_stream_new(gpu), *s2 = ff_stream_new(gpu);
    ff_event *ev = ff_event_new(gpu);
    REQUIRE(a && b && s1 && s2 && ev);
    CHECK(ff_stream_native(s1) != NULL && ff_stream_native(s1) != ff_stream_native(s2));
    CHECK(ff_backend_shares_memory_with(gpu, "nccl") && !ff_backend_shares_memory_with(gpu, "cpu"));
    CHECK(ff_dptr_addr(ff_dptr_of(a, 0)) != NULL);
    ff_memcpy_h2d(s1, ff_dptr_of(a, 0), h, n * 4);
    ff_event_record(ev, s1);
    ff_stream_wait(s2, ev);
    ff_memcpy_d2d(s2, ff_dptr_of(b, 0), ff_dptr_of(a, 0), n * 4);
    ff_memcpy_d2h(s2, back, ff_dptr_of(b, 0), n * 4);
    CHECK(ff_stream_sync(s1) == 0 && ff_stream_sync(s2) == 0);
    CHECK(!memcmp(back, h, n * 4));
    /* a 2-D block on the device (cudaMemcpy2DAsync): 100 rows of 37 floats from a pitch of 513
     * floats into a pitch of 40, against the CPU's loop */
    ff_memset_zero(s2, ff_dptr_of(b, 0), 4000 * 4);
    ff_memcpy_2d(s2, ff_dptr_f32(b, 3), 40 * 4, ff_dptr_f32(a, 11), 513 * 4, 37 * 4, 100);
    ff_memcpy_d2h(s2, back, ff_dptr_of(b, 0), 4000 * 4);
    int ok2d = 1;
    for (int i = 0; i < 4000; i++) {
        const int r = (i - 3) / 40, c = (i - 3) % 40;
        const float want = i >= 3 && r < 100 && c < 37 ? h[11 + (size_t)r * 513 + (size_t)c] : 0.0f;
        ok2d &= back[i] == want;
    }
    CHECK(ok2d);
    ff_event_destroy(&ev);
    ff_stream_destroy(&s1);
    ff_stream_destroy(&s2);
    ff_buffer_destroy(&a);
    ff_buffer_destroy(&b);
    free(h);
    free(back);
}

/* Graphs (ff_stream_capture_begin): a capture runs nothing; a replay gives the eager run's bits
 * on whatever inputs the buffers hold at launch; what a capture cannot hold fails it, naming
 * the call, and leaves the stream usable; a scratch outgrown after a capture is kept for the
 * graph. The cpu backend has none. */
enum { GM = 24, GN = 40, GK = 64, HUGE_M = 9000 };
static void graph_work(ff_stream *s, ff_buffer *a, ff_buffer *w16, ff_buffer *w, ff_buffer *c, ff_buffer *o, int m) {
    /* c [m, GN] = a [m, GK] w16^T (bf16 weights, a rounded in the scratch); c += a w^T; o = rmsnorm(c) */
    ff_gemm_bf16w(s, m, GN, GK, ff_dptr_of(a, 0), GK, ff_dptr_of(w16, 0), GK, 0.0f, ff_dptr_of(c, 0), GN);
    ff_gemm(s, FF_NO_TRANS, FF_TRANS, m, GN, GK, 1.0f, ff_dptr_of(a, 0), GK, ff_dptr_of(w, 0), GK, 1.0f, ff_dptr_of(c, 0), GN);
    ff_rmsnorm_fwd(s, ff_dptr_of(c, 0), ff_dptr_f32(w, 0), ff_dptr_f32(o, 0), ff_dptr_f32(o, (size_t)m * GN), m, GN, 1e-5f);
    ff_memcpy_d2d(s, ff_dptr_f32(o, (size_t)m * (GN + 1)), ff_dptr_of(c, 0), (size_t)m * GN * 4);
}
/* a buffer made on another thread while the main one captures (a worker's other threads) */
typedef struct alloc_job {
    ff_buffer *b;
    char err[512];
} alloc_job;
static void *alloc_elsewhere(void *arg) {
    alloc_job *j = arg;
    if (!(j->b = ff_buffer_new(gpu, (size_t)1 << 20))) snprintf(j->err, sizeof j->err, "%s", ff_error_message());
    return NULL;
}
static void test_graphs(void) {
    CHECK(!ff_backend_has_stream_graphs(cpu) && ff_backend_has_stream_graphs(gpu));
    CHECK(ff_stream_capture_begin(cst) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "has no graphs");

    ff_stream *s = ff_stream_new(gpu);
    const size_t big = 4 * GM; /* rows of the largest eager call */
    /* a bf16w product of HUGE_M rows outgrows the scratch's first 1 MiB; the capture's asks twice that */
    ff_buffer *ha_big = ff_buffer_new(gpu, (size_t)2 * HUGE_M * GK * 4), *hc_big = ff_buffer_new(gpu, (size_t)2 * HUGE_M * GN * 4);
    REQUIRE(ha_big && hc_big);
    ff_buffer *a = ff_buffer_new(gpu, big * GK * 4), *w = ff_buffer_new(gpu, GN * GK * 4), *w16 = ff_buffer_new(gpu, GN * GK * 2),
              *c = ff_buffer_new(gpu, big * GN * 4), *o = ff_buffer_new(gpu, big * (2 * GN + 1) * 4);
    const size_t no = (size_t)GM * (2 * GN + 1); /* floats of o one call writes */
    float *ha = malloc(big * GK * 4), *hw = malloc(GN * GK * 4), *eager = malloc(no * 4), *replay = malloc(no * 4);
    REQUIRE(s && a && w && w16 && c && o && ha && hw && eager && replay);
    for (size_t i = 0; i < (size_t)GN * GK; i++) hw[i] = urand();
    ff_memcpy_h2d(s, ff_dptr_of(w, 0), hw, GN * GK * 4);
    ff_cast_f32_bf16(s, ff_dptr_of(w, 0), ff_dptr_of(w16, 0), GN * GK);

    /* the eager run first: the scratch takes its size */
    graph_work(s, a, w16, w, c, o, GM);
    CHECK(ff_stream_sync(s) == 0);
    ff_memset_zero(s, ff_dptr_of(o, 0), no * 4);
    ff_stream_graph *g = NULL;
    REQUIRE(ff_stream_capture_begin(s) == 0);
    graph_work(s, a, w16, w, c, o, GM);
    REQUIRE(ff_stream_capture_end(s, &g) == 0 && g);
    ff_memcpy_d2h(s, replay, ff_dptr_of(o, 0), no * 4);
    int untouched = 1;
    for (size_t i = 0; i < no; i++) untouched &= replay[i] == 0.0f;
    CHECK(untouched); /* captured, not run */

    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < (size_t)GM * GK; i++) ha[i] = urand() * (float)(round + 1);
        ff_memcpy_h2d(s, ff_dptr_of(a, 0), ha, (size_t)GM * GK * 4);
        graph_work(s, a, w16, w, c, o, GM);
        ff_memcpy_d2h(s, eager, ff_dptr_of(o, 0), no * 4);
        ff_memset_zero(s, ff_dptr_of(o, 0), no * 4);
        ff_memset_zero(s, ff_dptr_of(c, 0), (size_t)GM * GN * 4);
        if (round == 2) /* the scratch outgrown between capture and replay: the graph keeps its block */
            ff_gemm_bf16w(s, HUGE_M, GN, GK, ff_dptr_of(ha_big, 0), GK, ff_dptr_of(w16, 0), GK, 0.0f, ff_dptr_of(hc_big, 0), GN);
        CHECK(ff_stream_graph_launch(g, s) == 0);
        ff_memcpy_d2h(s, replay, ff_dptr_of(o, 0), no * 4);
        CHECK(ff_stream_sync(s) == 0);
        CHECK(!memcmp(eager, replay, no * 4));
        float mx = 0;
        for (size_t i = 0; i < no; i++) mx = fmaxf(mx, fabsf(replay[i]));
        CHECK(mx > 0.1f); /* it computed something */
    }

    /* another thread allocates (and zero-fills) during a capture: both go on */
    {
        ff_stream_graph *g2 = NULL;
        alloc_job job = {NULL, ""};
        pthread_t th;
        REQUIRE(ff_stream_capture_begin(s) == 0);
        graph_work(s, a, w16, w, c, o, GM);
        REQUIRE(pthread_create(&th, NULL, alloc_elsewhere, &job) == 0);
        pthread_join(th, NULL);
        if (!job.b) fprintf(stderr, "a buffer made on another thread during a capture: %s\n", job.err);
        CHECK(job.b != NULL);
        CHECK(ff_stream_capture_end(s, &g2) == 0 && g2);
        if (!g2) fprintf(stderr, "the capture beside another thread's allocation: %s\n", ff_error_message());
        if (job.b) {
            float z[4] = {1, 1, 1, 1};
            ff_memcpy_d2h(s, z, ff_dptr_of(job.b, (1 << 20) - 16), 16);
            CHECK(z[0] == 0 && z[1] == 0 && z[2] == 0 && z[3] == 0);
        }
        ff_stream_graph_destroy(&g2);
        ff_buffer_destroy(&job.b);
    }

    /* what a capture cannot hold: it fails, naming the call; nothing ran; the stream goes on;
     * ff_stream_capture_failed says so before the end (and not on a capture that is fine) */
    ff_stream_graph *bad = NULL;
    CHECK(!ff_stream_capture_failed(s));
    REQUIRE(ff_stream_capture_begin(s) == 0);
    graph_work(s, a, w16, w, c, o, GM);
    CHECK(!ff_stream_capture_failed(s));
    ff_memcpy_h2d(s, ff_dptr_of(a, 0), hw, 4);
    CHECK(ff_stream_capture_failed(s));
    CHECK(ff_stream_capture_end(s, &bad) == -1 && !bad);
    CHECK(!ff_stream_capture_failed(s));
    CHECK_STR_CONTAINS(ff_error_message(), "ff_memcpy_h2d inside a graph capture");
#ifdef FF_TEST_CUDA_EMU
    /* a capture CUDA invalidated that fuseflow has not seen fail yet (nothing queued in it):
     * the device's own answer (the emulator's FF_CUDA_EMU_CAPTURE_FAIL invalidates it at once) */
    setenv("FF_CUDA_EMU_CAPTURE_FAIL", "all", 1);
    REQUIRE(ff_stream_capture_begin(s) == 0);
    CHECK(ff_stream_capture_failed(s));
    CHECK(ff_stream_capture_end(s, &bad) == -1 && !bad);
    unsetenv("FF_CUDA_EMU_CAPTURE_FAIL");
#endif
    float first = 0;
    ff_memcpy_d2h(s, &first, ff_dptr_of(a, 0), 4);
    CHECK(first == ha[0]);
    REQUIRE(ff_stream_capture_begin(s) == 0);
    CHECK(ff_stream_sync(s) == -1);
    CHECK(ff_stream_capture_end(s, &bad) == -1 && !bad);
    CHECK_STR_CONTAINS(ff_error_message(), "ff_stream_sync inside");
    REQUIRE(ff_stream_capture_begin(s) == 0);
    CHECK(ff_buffer_new(gpu, 64) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "captures a graph");
    ff_buffer *elsewhere = ff_buffer_new(cpu, 64); /* another backend: not this capture's */
    CHECK(elsewhere != NULL);
    ff_buffer_destroy(&elsewhere);
    CHECK(ff_stream_capture_end(s, &bad) == -1 && !bad);
    CHECK_STR_CONTAINS(ff_error_message(), "ff_buffer_new inside");
    REQUIRE(ff_stream_capture_begin(s) == 0);
    graph_work(s, a, w16, w, c, o, 4 * GM); /* fits the scratch */
    ff_gemm_bf16w(s, 2 * HUGE_M, GN, GK, ff_dptr_of(ha_big, 0), GK, ff_dptr_of(w16, 0), GK, 0.0f, ff_dptr_of(hc_big, 0), GN); /* grows it */
    CHECK(ff_stream_capture_end(s, &bad) == -1 && !bad);
    CHECK_STR_CONTAINS(ff_error_message(), "scratch must grow");
    graph_work(s, a, w16, w, c, o, GM);
    CHECK(ff_stream_sync(s) == 0);
    /* a stream whose first product is inside a capture: cuBLAS has no workspace of the
     * stream's yet, and making one cannot be held (the emulator's cuBLAS would allocate its
     * pool); once a product ran eagerly, the same capture holds */
    ff_stream *fresh = ff_stream_new(gpu);
    REQUIRE(fresh);
#define FRESH_GEMM() \
    ff_gemm(fresh, FF_NO_TRANS, FF_TRANS, GM, GN, GK, 1.0f, ff_dptr_of(a, 0), GK, ff_dptr_of(w, 0), GK, 0.0f, ff_dptr_of(c, 0), GN)
    REQUIRE(ff_stream_capture_begin(fresh) == 0);
    FRESH_GEMM(); /* fp32 products (this backend's): no scratch */
    CHECK(ff_stream_capture_end(fresh, &bad) == -1 && !bad);
    CHECK_STR_CONTAINS(ff_error_message(), "first matrix product is inside a graph capture");
    FRESH_GEMM();
    CHECK(ff_stream_sync(fresh) == 0);
    REQUIRE(ff_stream_capture_begin(fresh) == 0);
    FRESH_GEMM();
    CHECK(ff_stream_capture_end(fresh, &bad) == 0 && bad);
#undef FRESH_GEMM
    ff_stream_graph_destroy(&bad);
    ff_stream_destroy(&fresh);

    ff_stream_graph_destroy(&g);
    ff_stream_destroy(&s);
    ff_buffer_destroy(&ha_big);
    ff_buffer_destroy(&hc_big);
    ff_buffer_destroy(&a);
    ff_buffer_destroy(&w);
    ff_buffer_destroy(&w16);
    ff_buffer_destroy(&c);
    ff_buffer_destroy(&o);
    free(ha);
    free(hw);
    free(eager);
    free(replay);
}

int main(void) {
    ff_backend *probe = gpu_new("cuda");
    if (!probe) {
        const char *msg = ff_error_message();
        if (strstr(msg, "no CUDA device")) SKIP("no CUDA device (%s)", msg);
        fprintf(stderr, "the cuda backend failed for another reason than a missing device: %s\n", msg);
        return 1;
    }
    ff_backend_destroy(&probe);
    ff_rng_seed(&rng, 7);
    cpu = ff_backend_cpu_new(2);
    setenv("FF_CUDA_MATH", "fp32", 1); /* the kernels other than gemm do not depend on it */
    gpu = gpu_new("cuda:0");
    REQUIRE(cpu && gpu);
    CHECK(!strcmp(ff_backend_name(gpu), "cuda:0"));
    cst = ff_backend_stream(cpu);
    gst = ff_backend_stream(gpu);

    test_gemm_on(gpu, "fp32", 1e-5);
    setenv("FF_CUDA_MATH", "tf32", 1);
    ff_backend *g_tf32 = gpu_new("cuda");
    setenv("FF_CUDA_MATH", "bf16", 1);
    ff_backend *g_bf16 = gpu_new("cuda");
    unsetenv("FF_CUDA_MATH");
    REQUIRE(g_tf32 && g_bf16);
    test_gemm_on(g_tf32, "tf32", 5e-3);  /* 10-bit mantissa inputs, fp32 sums: ~1e-3 relative at K 512 */
    test_gemm_on(g_bf16, "bf16", 2.5e-2); /* 8-bit mantissa inputs */
    CHECK(ff_backend_bf16_products(g_bf16) && !ff_backend_bf16_products(g_tf32) && !ff_backend_bf16_products(gpu));
    ff_backend_destroy(&g_tf32);
    ff_backend_destroy(&g_bf16);
    ff_backend *g_default = gpu_new("cuda"); /* FF_CUDA_MATH unset: bf16 products */
    REQUIRE(g_default);
    CHECK(ff_backend_bf16_products(g_default));
    ff_backend_destroy(&g_default);
    setenv("FF_CUDA_MATH", "int4", 1);
    CHECK(gpu_new("cuda") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "FF_CUDA_MATH");
    unsetenv("FF_CUDA_MATH");
    CHECK(gpu_new("cuda:4095") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "requested but");

    test_events();
    test_graphs();
    test_bf16();
    test_rowwise();
    test_attention();
    test_logits();
    test_vectors();
    CHECK(ff_stream_sync(gst) == 0);

    ff_backend_destroy(&gpu);
    ff_backend_destroy(&cpu);
    TEST_MAIN_END();
}
#endif
