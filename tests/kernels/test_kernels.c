/* The CPU kernels: every forward against a plain double-precision loop, every backward by
 * central finite differences of L = sum(R * forward(x)) for a random R (fp32 kernels, step
 * 1e-2, tolerance 2e-3 + 2e-2 |analytic|: truncation error is h^2-small and rounding of L
 * in fp32 stays below 1e-3 at these sizes), linear kernels (rope) by the adjoint identity,
 * the sampler against a plain re-implementation of its filter, and thread-count
 * independence of the kernels that promise it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/kernels.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static ff_backend *be;
static ff_stream *st;
static ff_rng rng;

static float urand(void) { return (float)(ff_rng_uniform(&rng) * 2.0 - 1.0); }

/* A device buffer holding a copy of host data (n floats or ints). */
static ff_dptr dev(const void *host, size_t bytes) {
    ff_buffer *b = ff_buffer_new(be, bytes);
    REQUIRE(b);
    if (host) ff_memcpy_h2d(st, ff_dptr_of(b, 0), host, bytes);
    return ff_dptr_of(b, 0);
}
static void dev_free(ff_dptr p) { ff_buffer_destroy(&p.buf); }
static void get(void *host, ff_dptr p, size_t bytes) { ff_memcpy_d2h(st, host, p, bytes); }
static void put(ff_dptr p, const void *host, size_t bytes) { ff_memcpy_h2d(st, p, host, bytes); }
static float *frand(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = urand() * scale;
    return x;
}
static double dotd(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* |fd - an| <= 2e-3 + 2e-2 |an| */
static void check_fd(const char *what, int i, double fd, double an) {
    if (!(fabs(fd - an) <= 2e-3 + 2e-2 * fabs(an))) {
        fprintf(stderr, "%s: d/dx[%d]: finite difference %.6g, analytic %.6g\n", what, i, fd, an);
        ff_test_failures++;
    }
}

/* ---- gemm ------------------------------------------------------------------------------------- */

static void test_gemm(void) {
    int shapes[][3] = {{3, 5, 7}, {67, 300, 33}, {300, 20, 64}, {8, 513, 129}, {5, 4, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
                size_t na = (size_t)(ta ? K : M) * lda + 1, nb = (size_t)(tb ? N : K) * ldb + 1, nc = (size_t)M * ldc;
                float *A = frand(na, 1), *B = frand(nb, 1), *C = frand(nc, 1), *C0 = malloc(nc * 4);
                memcpy(C0, C, nc * 4);
                ff_dptr a = dev(A, na * 4), b = dev(B, nb * 4), c = dev(C, nc * 4);
                ff_gemm(st, ta, tb, M, N, K, 0.5f, a, lda, b, ldb, 2.0f, c, ldc);
                get(C, c, nc * 4);
                double worst = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double acc = 0;
                        for (int k = 0; k < K; k++)
                            acc += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                   (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                        double want = 0.5 * acc + 2.0 * C0[(size_t)i * ldc + j];
                        double e = fabs(want - C[(size_t)i * ldc + j]);
                        worst = e > worst ? e : worst;
                    }
                if (!(worst < 1e-4 * (K + 1))) {
                    fprintf(stderr, "gemm %dx%dx%d ta=%d tb=%d: max error %g\n", M, N, K, ta, tb, worst);
                    ff_test_failures++;
                }
                /* beta = 0 ignores NaN in C */
                for (size_t i = 0; i < nc; i++) C[i] = NAN;
                put(c, C, nc * 4);
                ff_gemm(st, ta, tb, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
                get(C, c, nc * 4);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) CHECK(!isnan(C[(size_t)i * ldc + j]));
                dev_free(a), dev_free(b), dev_free(c);
                free(A), free(B), free(C), free(C0);
            }
}

/* ---- embedding, bias, rows --------------------------------------------------------------------- */

static void test_embedding_bias_rows(void) {
    int V = 11, H = 37, T = 50;
    int32_t tok[50];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)ff_rng_below(&rng, (uint64_t)V);
    tok[3] = tok[4] = tok[5]; /* repeats accumulate */
    tok[7] = tok[20] = -1;    /* outside the table (another vocabulary shard): zeros, no gradient */
    float *tab = frand((size_t)V * H, 1), *dout = frand((size_t)T * H, 1), *out = malloc((size_t)T * H * 4);
    float *dt = frand((size_t)V * H, 1), *dt0 = malloc((size_t)V * H * 4);
    memcpy(dt0, dt, (size_t)V * H * 4);
    ff_dptr dtok = dev(tok, sizeof tok), dtab = dev(tab, (size_t)V * H * 4), dout_d = dev(dout, (size_t)T * H * 4);
    ff_dptr dout_f = dev(NULL, (size_t)T * H * 4), ddt = dev(dt, (size_t)V * H * 4);
    ff_embedding_fwd(st, dtok, dtab, dout_f, T, H);
    get(out, dout_f, (size_t)T * H * 4);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < H; j++) CHECK(out[(size_t)t * H + j] == (tok[t] < 0 ? 0.0f : tab[(size_t)tok[t] * H + j]));
    ff_embedding_bwd(st, dtok, dout_d, ddt, T, H);
    get(dt, ddt, (size_t)V * H * 4);
    for (int v = 0; v < V; v++)
        for (int j = 0; j < H; j++) {
            double want = dt0[(size_t)v * H + j];
            for (int t = 0; t < T; t++)
                if (tok[t] == v) want += dout[(size_t)t * H + j];
            CHECK_CLOSE(dt[(size_t)v * H + j], want, 1e-5, 1e-5);
        }
    /* bias add and its gradient on a column block of a wider matrix (ld > N) */
    int N = 21, ld = 30;
    float *x = frand((size_t)T * ld, 1), *x0 = malloc((size_t)T * ld * 4), *bias = frand((size_t)N, 1);
    float *db = frand((size_t)N, 1), *db0 = malloc((size_t)N * 4);
    memcpy(x0, x, (size_t)T * ld * 4);
    memcpy(db0, db, (size_t)N * 4);
    ff_dptr dx = dev(x, (size_t)T * ld * 4), dbias = dev(bias, (size_t)N * 4), ddb = dev(db, (size_t)N * 4);
    ff_bias_add(st, dx, ld, dbias, T, N);
    get(x, dx, (size_t)T * ld * 4);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < ld; j++)
            CHECK(x[(size_t)t * ld + j] == (j < N ? x0[(size_t)t * ld + j] + bias[j] : x0[(size_t)t * ld + j]));
    ff_bias_bwd(st, dx, ld, ddb, T, N);
    get(db, ddb, (size_t)N * 4);
    for (int j = 0; j < N; j++) {
        double want = db0[j];
        for (int t = 0; t < T; t++) want += x[(size_t)t * ld + j];
        CHECK_CLOSE(db[j], want, 1e-4, 1e-5);
    }
    /* gather and scatter rows */
    int32_t rows[5] = {7, 0, 49, 7, 3};
    ff_dptr drows = dev(rows, sizeof rows), g = dev(NULL, (size_t)5 * H * 4);
    ff_gather_rows(st, dout_d, drows, g, 5, H);
    float *gh = malloc((size_t)5 * H * 4);
    get(gh, g, (size_t)5 * H * 4);
    for (int r = 0; r < 5; r++) CHECK(memcmp(gh + (size_t)r * H, dout + (size_t)rows[r] * H, (size_t)H * 4) == 0);
    int32_t srows[3] = {10, 2, 40};
    ff_dptr dsrows = dev(srows, sizeof srows);
    ff_scatter_rows(st, dtab, H, dout_d, dsrows, 3, H);
    get(out, dout_d, (size_t)T * H * 4);
    for (int r = 0; r < 3; r++) CHECK(memcmp(out + (size_t)srows[r] * H, tab + (size_t)r * H, (size_t)H * 4) == 0);
    CHECK(memcmp(out, dout, (size_t)2 * H * 4) == 0); /* untouched rows stay */
    dev_free(dtok), dev_free(dtab), dev_free(dout_d), dev_free(dout_f), dev_free(ddt), dev_free(dx), dev_free(dbias);
    dev_free(ddb), dev_free(drows), dev_free(g), dev_free(dsrows);
    free(tab), free(dout), free(out), free(dt), free(dt0), free(x), free(x0), free(bias), free(db), free(db0), free(gh);
}

/* ---- rmsnorm ------------------------------------------------------------------------------------ */

static double rms_loss(ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, const float *R, int T, int H, float *tmp) {
    ff_rmsnorm_fwd(st, x, w, out, rstd, T, H, 1e-5f);
    get(tmp, out, (size_t)T * H * 4);
    return dotd(tmp, R, (size_t)T * H);
}

static void test_rmsnorm(void) {
    int T = 7, H = 45;
    size_t n = (size_t)T * H;
    float *x = frand(n, 1), *w = frand((size_t)H, 1), *R = frand(n, 1), *tmp = malloc(n * 4), *rs = malloc((size_t)T * 4);
    ff_dptr dx_in = dev(x, n * 4), dw = dev(w, (size_t)H * 4), out = dev(NULL, n * 4), rstd = dev(NULL, (size_t)T * 4);
    ff_dptr dR = dev(R, n * 4), gx = dev(NULL, n * 4), gw = dev(NULL, (size_t)H * 4);
    rms_loss(dx_in, dw, out, rstd, R, T, H, tmp);
    get(rs, rstd, (size_t)T * 4);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int j = 0; j < H; j++) ss += (double)x[(size_t)t * H + j] * x[(size_t)t * H + j];
        double r = 1.0 / sqrt(ss / H + 1e-5);
        CHECK_CLOSE(rs[t], r, 0, 1e-5);
        for (int j = 0; j < H; j++) CHECK_CLOSE(tmp[(size_t)t * H + j], x[(size_t)t * H + j] * r * w[j], 1e-6, 1e-5);
    }
    ff_rmsnorm_bwd(st, dx_in, dw, rstd, dR, gx, gw, T, H);
    float *ax = malloc(n * 4), *aw = malloc((size_t)H * 4);
    get(ax, gx, n * 4);
    get(aw, gw, (size_t)H * 4);
    const float h = 1e-2f;
    for (int k = 0; k < 12; k++) {
        int i = (int)ff_rng_below(&rng, n);
        float keep = x[i];
        x[i] = keep + h, put(dx_in, x, n * 4);
        double lp = rms_loss(dx_in, dw, out, rstd, R, T, H, tmp);
        x[i] = keep - h, put(dx_in, x, n * 4);
        double lm = rms_loss(dx_in, dw, out, rstd, R, T, H, tmp);
        x[i] = keep, put(dx_in, x, n * 4);
        check_fd("rmsnorm x", i, (lp - lm) / (2 * h), ax[i]);
        int j = (int)ff_rng_below(&rng, (uint64_t)H);
        keep = w[j];
        w[j] = keep + h, put(dw, w, (size_t)H * 4);
        lp = rms_loss(dx_in, dw, out, rstd, R, T, H, tmp);
        w[j] = keep - h, put(dw, w, (size_t)H * 4);
        lm = rms_loss(dx_in, dw, out, rstd, R, T, H, tmp);
        w[j] = keep, put(dw, w, (size_t)H * 4);
        check_fd("rmsnorm w", j, (lp - lm) / (2 * h), aw[j]);
    }
    dev_free(dx_in), dev_free(dw), dev_free(out), dev_free(rstd), dev_free(dR), dev_free(gx), dev_free(gw);
    free(x), free(w), free(R), free(tmp), free(rs), free(ax), free(aw);
}

/* ---- rope ------------------------------------------------------------------------------------------ */

static void test_rope(void) {
    int T = 9, nh = 3, D = 8, ld = 40, maxpos = 32, half = D / 2;
    float *cs = malloc((size_t)maxpos * half * 4), *sn = malloc((size_t)maxpos * half * 4);
    for (int p = 0; p < maxpos; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pow(10000.0, -2.0 * i / D);
            cs[p * half + i] = (float)cos(a), sn[p * half + i] = (float)sin(a);
        }
    int32_t pos[9] = {0, 1, 2, 30, 5, 0, 7, 1, 31};
    size_t n = (size_t)T * ld;
    float *x = frand(n, 1), *y = malloc(n * 4), *r = frand(n, 1), *z = malloc(n * 4);
    ff_dptr dcs = dev(cs, (size_t)maxpos * half * 4), dsn = dev(sn, (size_t)maxpos * half * 4), dpos = dev(pos, sizeof pos);
    ff_dptr dx = dev(x, n * 4);
    ff_rope_fwd(st, ff_dptr_add(dx, 4, 4), ld, dpos, dcs, dsn, T, nh, D); /* heads start at column 4 */
    get(y, dx, n * 4);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < ld; c++) {
            int hc = c - 4;
            double want = x[(size_t)t * ld + c];
            if (hc >= 0 && hc < nh * D) {
                int h = hc / D, i = hc % D;
                const float *v = x + (size_t)t * ld + 4 + (size_t)h * D;
                double a = pos[t] * pow(10000.0, -2.0 * (i % half) / D);
                want = i < half ? v[i] * cos(a) - v[i + half] * sin(a) : v[i] * cos(a) + v[i - half] * sin(a);
            }
            CHECK_CLOSE(y[(size_t)t * ld + c], want, 1e-5, 1e-5);
        }
    /* backward is the adjoint: <R, rope(x)> = <rope_bwd(R), x> on the head columns */
    ff_dptr dr = dev(r, n * 4);
    ff_rope_bwd(st, ff_dptr_add(dr, 4, 4), ld, dpos, dcs, dsn, T, nh, D);
    get(z, dr, n * 4);
    double lhs = 0, rhs = 0;
    for (int t = 0; t < T; t++)
        for (int c = 4; c < 4 + nh * D; c++) {
            lhs += (double)r[(size_t)t * ld + c] * y[(size_t)t * ld + c];
            rhs += (double)z[(size_t)t * ld + c] * x[(size_t)t * ld + c];
        }
    CHECK_CLOSE(lhs, rhs, 1e-4, 1e-5);
    /* and the inverse: bwd(fwd(x)) = x */
    ff_rope_bwd(st, ff_dptr_add(dx, 4, 4), ld, dpos, dcs, dsn, T, nh, D);
    get(y, dx, n * 4);
    for (size_t i = 0; i < n; i++) CHECK_CLOSE(y[i], x[i], 1e-5, 0);
    dev_free(dcs), dev_free(dsn), dev_free(dpos), dev_free(dx), dev_free(dr);
    free(cs), free(sn), free(x), free(y), free(r), free(z);
}

/* ---- swiglu ------------------------------------------------------------------------------------------ */

static double swiglu_loss(ff_dptr gu, ff_dptr h, const float *R, int T, int I, float *tmp) {
    ff_swiglu_fwd(st, gu, h, T, I);
    get(tmp, h, (size_t)T * I * 4);
    return dotd(tmp, R, (size_t)T * I);
}

static void test_swiglu(void) {
    int T = 5, I = 19;
    size_t n2 = (size_t)T * 2 * I, n = (size_t)T * I;
    float *gu = frand(n2, 4), *R = frand(n, 1), *tmp = malloc(n * 4), *a = malloc(n2 * 4);
    ff_dptr dgu = dev(gu, n2 * 4), dh = dev(NULL, n * 4), dR = dev(R, n * 4), dd = dev(NULL, n2 * 4);
    swiglu_loss(dgu, dh, R, T, I, tmp);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < I; j++) {
            double g = gu[(size_t)t * 2 * I + j], u = gu[(size_t)t * 2 * I + I + j];
            CHECK_CLOSE(tmp[(size_t)t * I + j], g / (1 + exp(-g)) * u, 1e-6, 1e-5);
        }
    ff_swiglu_bwd(st, dgu, dR, dd, T, I);
    get(a, dd, n2 * 4);
    const float h = 1e-2f;
    for (int k = 0; k < 20; k++) {
        int i = (int)ff_rng_below(&rng, n2);
        float keep = gu[i];
        gu[i] = keep + h, put(dgu, gu, n2 * 4);
        double lp = swiglu_loss(dgu, dh, R, T, I, tmp);
        gu[i] = keep - h, put(dgu, gu, n2 * 4);
        double lm = swiglu_loss(dgu, dh, R, T, I, tmp);
        gu[i] = keep, put(dgu, gu, n2 * 4);
        check_fd("swiglu", i, (lp - lm) / (2 * h), a[i]);
    }
    /* in place (dgu aliasing gu) gives the same */
    ff_swiglu_bwd(st, dgu, dR, dgu, T, I);
    float *b = malloc(n2 * 4);
    get(b, dgu, n2 * 4);
    CHECK(memcmp(a, b, n2 * 4) == 0);
    dev_free(dgu), dev_free(dh), dev_free(dR), dev_free(dd);
    free(gu), free(R), free(tmp), free(a), free(b);
}

/* ---- attention ------------------------------------------------------------------------------------------ */

/* out [T, Hq D] by plain double loops over the packed layout */
static void attention_ref(const float *qkv, int ld, const int32_t *ss, int S, int Hq, int Hkv, int D, double *out) {
    int rep = Hq / Hkv;
    double scale = 1.0 / sqrt(D);
    for (int s = 0; s < S; s++)
        for (int t = ss[s]; t < ss[s + 1]; t++)
            for (int h = 0; h < Hq; h++) {
                int g = h / rep;
                const float *q = qkv + (size_t)t * ld + (size_t)h * D;
                double mx = -1e300, sum = 0;
                int n = t - ss[s] + 1;
                double *sc = malloc((size_t)n * sizeof(double));
                for (int j = 0; j < n; j++) {
                    const float *k = qkv + (size_t)(ss[s] + j) * ld + (size_t)(Hq + g) * D;
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)q[i] * k[i];
                    sc[j] = d * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j < n; j++) sum += (sc[j] = exp(sc[j] - mx));
                double *o = out + (size_t)t * Hq * D + (size_t)h * D;
                for (int i = 0; i < D; i++) o[i] = 0;
                for (int j = 0; j < n; j++) {
                    const float *v = qkv + (size_t)(ss[s] + j) * ld + (size_t)(Hq + Hkv + g) * D;
                    for (int i = 0; i < D; i++) o[i] += sc[j] / sum * v[i];
                }
                free(sc);
            }
}

static double att_loss(ff_dptr qkv, int ld, ff_dptr ss, int S, int T, int Hq, int Hkv, int D, ff_dptr out, ff_dptr lse,
                       const float *R, float *tmp) {
    ff_attention_fwd(st, qkv, ld, ss, S, T, Hq, Hkv, D, out, lse);
    get(tmp, out, (size_t)T * Hq * D * 4);
    return dotd(tmp, R, (size_t)T * Hq * D);
}

static void test_attention(void) {
    const int Hq = 4, Hkv = 2, D = 8, QKV = (Hq + 2 * Hkv) * D, ld = QKV + 3;
    int32_t ss[] = {0, 1, 71, 84, 150};
    const int S = 4, T = 150;
    size_t n = (size_t)T * ld, no = (size_t)T * Hq * D;
    float *qkv = frand(n, 1.5f), *R = frand(no, 1), *out = malloc(no * 4), *tmp = malloc(no * 4);
    double *ref = malloc(no * sizeof(double));
    ff_dptr dq = dev(qkv, n * 4), dss = dev(ss, sizeof ss), dout = dev(NULL, no * 4), dlse = dev(NULL, (size_t)T * Hq * 4);
    ff_dptr dR = dev(R, no * 4), ddelta = dev(NULL, (size_t)T * Hq * 4), dg = dev(NULL, n * 4);
    att_loss(dq, ld, dss, S, T, Hq, Hkv, D, dout, dlse, R, out);
    attention_ref(qkv, ld, ss, S, Hq, Hkv, D, ref);
    double worst = 0;
    for (size_t i = 0; i < no; i++) worst = fmax(worst, fabs(out[i] - ref[i]));
    if (!(worst < 2e-5)) {
        fprintf(stderr, "attention forward: max error %g\n", worst);
        ff_test_failures++;
    }
    ff_attention_bwd(st, dq, ld, dss, ss, S, T, Hq, Hkv, D, dout, dlse, dR, ddelta, dg);
    float *an = malloc(n * 4);
    get(an, dg, n * 4);
    const float h = 1e-2f;
    int rows[] = {0, 1, 2, 70, 71, 83, 84, 85, 140, 149};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        for (int part = 0; part < 3; part++) {
            int col = part == 0 ? (int)ff_rng_below(&rng, (uint64_t)Hq * D)
                                : (part == 1 ? Hq * D : (Hq + Hkv) * D) + (int)ff_rng_below(&rng, (uint64_t)Hkv * D);
            int i = rows[k] * ld + col;
            float keep = qkv[i];
            qkv[i] = keep + h, put(dq, qkv, n * 4);
            double lp = att_loss(dq, ld, dss, S, T, Hq, Hkv, D, dout, dlse, R, tmp);
            qkv[i] = keep - h, put(dq, qkv, n * 4);
            double lm = att_loss(dq, ld, dss, S, T, Hq, Hkv, D, dout, dlse, R, tmp);
            qkv[i] = keep, put(dq, qkv, n * 4);
            check_fd(part == 0 ? "attention q" : part == 1 ? "attention k" : "attention v", i, (lp - lm) / (2 * h), an[i]);
        }
    /* the three padding columns beyond QKV are never written */
    att_loss(dq, ld, dss, S, T, Hq, Hkv, D, dout, dlse, R, tmp);
    ff_attention_bwd(st, dq, ld, dss, ss, S, T, Hq, Hkv, D, dout, dlse, dR, ddelta, dg);

    /* one thread gives bit-identical results (tiles and writers do not depend on threads) */
    ff_backend *be1 = ff_backend_cpu_new(1);
    ff_stream *st1 = ff_backend_stream(be1);
    ff_buffer *b1 = ff_buffer_new(be1, n * 4 + no * 4 * 3 + (size_t)T * Hq * 4 * 2 + n * 4 + sizeof ss);
    size_t o = 0;
    ff_dptr q1 = ff_dptr_of(b1, o);
    o += n * 4;
    ff_dptr out1 = ff_dptr_of(b1, o);
    o += no * 4;
    ff_dptr R1 = ff_dptr_of(b1, o);
    o += no * 4;
    ff_dptr lse1 = ff_dptr_of(b1, o);
    o += (size_t)T * Hq * 4;
    ff_dptr del1 = ff_dptr_of(b1, o);
    o += (size_t)T * Hq * 4;
    ff_dptr g1 = ff_dptr_of(b1, o);
    o += n * 4;
    ff_dptr ss1 = ff_dptr_of(b1, o);
    ff_memcpy_h2d(st1, q1, qkv, n * 4);
    ff_memcpy_h2d(st1, R1, R, no * 4);
    ff_memcpy_h2d(st1, ss1, ss, sizeof ss);
    ff_attention_fwd(st1, q1, ld, ss1, S, T, Hq, Hkv, D, out1, lse1);
    ff_attention_bwd(st1, q1, ld, ss1, ss, S, T, Hq, Hkv, D, out1, lse1, R1, del1, g1);
    float *o1 = malloc(no * 4), *gg1 = malloc(n * 4), *gg2 = malloc(n * 4);
    ff_memcpy_d2h(st1, o1, out1, no * 4);
    ff_memcpy_d2h(st1, gg1, g1, n * 4);
    get(tmp, dout, no * 4);
    get(gg2, dg, n * 4);
    CHECK(memcmp(o1, tmp, no * 4) == 0);
    for (int t = 0; t < T; t++) CHECK(memcmp(gg1 + (size_t)t * ld, gg2 + (size_t)t * ld, (size_t)QKV * 4) == 0);
    ff_buffer_destroy(&b1);
    ff_backend_destroy(&be1);

    /* attention against a paged KV cache equals the packed forward: each sequence's k, v go
     * into blocks of 7 rows taken from a shuffled pool, and a last sequence shares the first
     * one's full blocks (a common prompt) with a block of its own for the rest */
    const int KD = Hkv * D, bs = 7, tld = 100 / bs + 2;
    int nblk = 0;
    for (int s = 0; s < S; s++) nblk += (ss[s + 1] - ss[s] + bs - 1) / bs;
    nblk += 2; /* the sharing sequence's own block, and one never used */
    int32_t *perm = malloc((size_t)nblk * 4), *table = malloc((size_t)(S + 1) * tld * 4);
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) { /* a fixed shuffle */
        int k = (int)((unsigned)(i * 2654435761u) % (unsigned)(i + 1)), x = perm[i];
        perm[i] = perm[k], perm[k] = x;
    }
    for (int i = 0; i < (S + 1) * tld; i++) table[i] = -1; /* entries past a sequence's end are never read */
    size_t crow = (size_t)nblk * bs;
    float *kc = calloc(crow * KD, 4), *vc = calloc(crow * KD, 4);
    int32_t *seq = malloc((size_t)(T + bs) * 4), *nk = malloc((size_t)(T + bs) * 4);
    int used = 0;
    for (int s = 0; s < S; s++) {
        for (int p = 0; p < ss[s + 1] - ss[s]; p += bs) table[s * tld + p / bs] = perm[used++];
        for (int t = ss[s]; t < ss[s + 1]; t++) {
            int p = t - ss[s];
            size_t row = (size_t)table[s * tld + p / bs] * bs + (size_t)(p % bs);
            memcpy(kc + row * KD, qkv + (size_t)t * ld + (size_t)Hq * D, (size_t)KD * 4);
            memcpy(vc + row * KD, qkv + (size_t)t * ld + (size_t)(Hq + Hkv) * D, (size_t)KD * 4);
            seq[t] = s;
            nk[t] = p + 1;
        }
    }
    /* sequence S: the longest sequence's blocks but its last, then a copy of the rows of that
     * last block in a block of its own; its queries are that sequence's at those positions */
    int big = 0;
    for (int s = 0; s < S; s++)
        if (ss[s + 1] - ss[s] > ss[big + 1] - ss[big]) big = s;
    const int blen = ss[big + 1] - ss[big], full = (blen - 1) / bs;
    for (int i = 0; i < full; i++) table[S * tld + i] = table[big * tld + i];
    table[S * tld + full] = perm[used++];
    const int T2 = T + blen - full * bs;
    for (int t = T; t < T2; t++) {
        int j = t - T;
        size_t src = (size_t)table[big * tld + full] * bs + (size_t)j, dst = (size_t)table[S * tld + full] * bs + (size_t)j;
        memcpy(kc + dst * KD, kc + src * KD, (size_t)KD * 4);
        memcpy(vc + dst * KD, vc + src * KD, (size_t)KD * 4);
        seq[t] = S;
        nk[t] = full * bs + j + 1;
    }
    const size_t no2 = (size_t)T2 * Hq * D;
    float *q2 = malloc((size_t)T2 * ld * 4), *got2 = malloc(no2 * 4);
    double *ref2 = malloc(no2 * sizeof(double));
    memcpy(q2, qkv, (size_t)T * ld * 4);
    memcpy(ref2, ref, no * sizeof(double));
    for (int t = T; t < T2; t++) { /* the same query as the shared sequence's at that position */
        int src = ss[big] + nk[t] - 1;
        memcpy(q2 + (size_t)t * ld, qkv + (size_t)src * ld, (size_t)ld * 4);
        memcpy(ref2 + (size_t)t * Hq * D, ref + (size_t)src * Hq * D, (size_t)Hq * D * sizeof(double));
    }
    ff_dptr dkc = dev(kc, crow * KD * 4), dvc = dev(vc, crow * KD * 4), dtab = dev(table, (size_t)(S + 1) * tld * 4);
    ff_dptr dseq = dev(seq, (size_t)T2 * 4), dnk = dev(nk, (size_t)T2 * 4), dco = dev(NULL, no2 * 4);
    ff_dptr dq2 = dev(q2, (size_t)T2 * ld * 4);
    ff_attention_cached(st, dq2, ld, dkc, dvc, dtab, S + 1, tld, bs, dseq, dnk, T2, Hq, Hkv, D, dco);
    get(got2, dco, no2 * 4);
    worst = 0;
    for (size_t i = 0; i < no2; i++) worst = fmax(worst, fabs(got2[i] - ref2[i]));
    if (!(worst < 2e-5)) {
        fprintf(stderr, "paged cached attention (blocks of %d, %d tokens): max error %g\n", bs, T2, worst);
        ff_test_failures++;
    }
    dev_free(dkc), dev_free(dvc), dev_free(dtab), dev_free(dseq), dev_free(dnk), dev_free(dco), dev_free(dq2);
    free(kc), free(vc), free(table), free(perm), free(seq), free(nk), free(q2), free(ref2), free(got2);
    dev_free(dq), dev_free(dss), dev_free(dout), dev_free(dlse), dev_free(dR), dev_free(ddelta), dev_free(dg);
    free(qkv), free(R), free(out), free(tmp), free(ref), free(an), free(o1), free(gg1), free(gg2);
}

/* ---- log-probs and entropy ------------------------------------------------------------------------------ */

static double lp_loss(ff_dptr z, ff_dptr tg, float it, int T, int V, ff_dptr lp, ff_dptr ent, ff_dptr lse,
                      const float *a, const float *b, float *tl, float *te) {
    ff_logprob_fwd(st, z, tg, it, T, V, lp, ent, lse);
    get(tl, lp, (size_t)T * 4);
    get(te, ent, (size_t)T * 4);
    return dotd(tl, a, (size_t)T) + dotd(te, b, (size_t)T);
}

static void test_logprob(void) {
    const int T = 6, V = 300;
    const float it = 1.0f / 0.8f;
    size_t n = (size_t)T * V;
    float *z = frand(n, 3), *a = frand((size_t)T, 1), *b = frand((size_t)T, 1), *tl = malloc((size_t)T * 4);
    float *te = malloc((size_t)T * 4), *g = malloc(n * 4);
    int32_t tg[6] = {0, 299, -1, 17, 17, 150};
    ff_dptr dz = dev(z, n * 4), dtg = dev(tg, sizeof tg), dlp = dev(NULL, (size_t)T * 4), dent = dev(NULL, (size_t)T * 4);
    ff_dptr dlse = dev(NULL, (size_t)T * 4), da = dev(a, (size_t)T * 4), db = dev(b, (size_t)T * 4);
    lp_loss(dz, dtg, it, T, V, dlp, dent, dlse, a, b, tl, te);
    for (int t = 0; t < T; t++) {
        double mx = -1e300, s = 0, hsum = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, z[(size_t)t * V + v] * (double)it);
        for (int v = 0; v < V; v++) s += exp(z[(size_t)t * V + v] * (double)it - mx);
        double lse = mx + log(s);
        for (int v = 0; v < V; v++) {
            double lp = z[(size_t)t * V + v] * (double)it - lse;
            hsum -= exp(lp) * lp;
        }
        CHECK_CLOSE(tl[t], tg[t] >= 0 ? z[(size_t)t * V + tg[t]] * (double)it - lse : 0.0, 1e-5, 1e-5);
        CHECK_CLOSE(te[t], hsum, 1e-5, 1e-5);
    }
    ff_logprob_bwd(st, dz, dtg, it, T, V, dlse, da, db, dent); /* dz now holds dlogits */
    get(g, dz, n * 4);
    put(dz, z, n * 4);
    const float h = 1e-2f;
    for (int k = 0; k < 30; k++) {
        int i = k < 6 ? (int)((size_t)k * V + (size_t)(tg[k] >= 0 ? tg[k] : 0)) : (int)ff_rng_below(&rng, n);
        float keep = z[i];
        z[i] = keep + h, put(dz, z, n * 4);
        double lp = lp_loss(dz, dtg, it, T, V, dlp, dent, dlse, a, b, tl, te);
        z[i] = keep - h, put(dz, z, n * 4);
        double lm = lp_loss(dz, dtg, it, T, V, dlp, dent, dlse, a, b, tl, te);
        z[i] = keep, put(dz, z, n * 4);
        check_fd("logprob/entropy logits", i, (lp - lm) / (2 * h), g[i]);
    }
    /* without an entropy gradient, entropy may be null in both directions */
    lp_loss(dz, dtg, it, T, V, dlp, dent, dlse, a, b, tl, te);
    ff_logprob_fwd(st, dz, dtg, it, T, V, dlp, (ff_dptr){0}, dlse);
    ff_logprob_bwd(st, dz, dtg, it, T, V, dlse, da, (ff_dptr){0}, (ff_dptr){0});
    float *g2 = malloc(n * 4);
    get(g2, dz, n * 4);
    for (int t = 0; t < T; t++) {
        double sum = 0;
        for (int v = 0; v < V; v++) sum += g2[(size_t)t * V + v];
        CHECK_CLOSE(sum, 0.0, 1e-5, 0); /* d logp / d z sums to zero over the vocabulary */
    }
    /* vocabulary shards (tensor parallelism): the backward over columns [0, V1) and [V1, V)
     * alone, with the whole row's lse and entropy and the targets of the other shard as -2,
     * gives the whole row's gradient, element for element */
    const int V1 = 120, Vs[2] = {V1, V - V1};
    put(dz, z, n * 4);
    lp_loss(dz, dtg, it, T, V, dlp, dent, dlse, a, b, tl, te);
    for (int sh = 0; sh < 2; sh++) {
        const int c0 = sh ? V1 : 0, W = Vs[sh];
        float *zs = malloc((size_t)T * W * 4), *gs = malloc((size_t)T * W * 4);
        int32_t tgs[6];
        for (int t = 0; t < T; t++) {
            memcpy(zs + (size_t)t * W, z + (size_t)t * V + c0, (size_t)W * 4);
            tgs[t] = tg[t] < 0 ? -1 : tg[t] >= c0 && tg[t] < c0 + W ? tg[t] - c0 : -2;
        }
        ff_dptr dzs = dev(zs, (size_t)T * W * 4), dtgs = dev(tgs, sizeof tgs);
        ff_logprob_bwd(st, dzs, dtgs, it, T, W, dlse, da, db, dent);
        get(gs, dzs, (size_t)T * W * 4);
        for (int t = 0; t < T; t++)
            CHECK(memcmp(gs + (size_t)t * W, g + (size_t)t * V + c0, (size_t)W * 4) == 0);
        dev_free(dzs), dev_free(dtgs);
        free(zs), free(gs);
    }
    dev_free(dz), dev_free(dtg), dev_free(dlp), dev_free(dent), dev_free(dlse), dev_free(da), dev_free(db);
    free(z), free(a), free(b), free(tl), free(te), free(g), free(g2);
}

/* ---- optimizer vector ops ----------------------------------------------------------------------------------- */

static void test_vector_ops(void) {
    const int64_t n = 10007;
    float *p = frand((size_t)n, 1), *g = frand((size_t)n, 1), *m = frand((size_t)n, 0.1f), *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(urand()) * 0.01f;
    ff_dptr dp = dev(p, (size_t)n * 4), dg = dev(g, (size_t)n * 4), dm = dev(m, (size_t)n * 4), dv = dev(v, (size_t)n * 4);
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    CHECK_CLOSE(ff_sumsq(st, dg, n), ss, 0, 1e-6);
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.99f, eps = 1e-8f, wd = 0.1f, bc1 = 0.19f, bc2 = 0.0199f, gs = 0.5f;
    ff_adamw(st, dp, dg, dm, dv, n, lr, b1, b2, eps, wd, bc1, bc2, gs);
    float *p2 = malloc((size_t)n * 4), *m2 = malloc((size_t)n * 4), *v2 = malloc((size_t)n * 4);
    get(p2, dp, (size_t)n * 4), get(m2, dm, (size_t)n * 4), get(v2, dv, (size_t)n * 4);
    for (int64_t i = 0; i < n; i += 97) {
        double gi = (double)g[i] * gs, mi = b1 * (double)m[i] + (1 - b1) * gi, vi = b2 * (double)v[i] + (1 - b2) * gi * gi;
        double pi = p[i] * (1 - (double)lr * wd) - lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + eps);
        CHECK_CLOSE(m2[i], mi, 1e-7, 1e-5);
        CHECK_CLOSE(v2[i], vi, 1e-9, 1e-5);
        CHECK_CLOSE(p2[i], pi, 1e-6, 1e-5);
    }
    ff_scale(st, dg, n, -2.0f);
    ff_add(st, dg, dg, n); /* y += y: -4 g */
    get(p2, dg, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) CHECK(p2[i] == -4.0f * g[i]);
    dev_free(dp), dev_free(dg), dev_free(dm), dev_free(dv);
    free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2);
}

/* ---- sampling ------------------------------------------------------------------------------------------------ */

/* The documented rule, written plainly: the kept set and the pick for uniform u. */
static int sample_ref(const float *z, int V, float temp, int top_k, float top_p, float u, double *prob_of_pick) {
    double *p = malloc((size_t)V * sizeof(double)), mx = -1e300, s = 0;
    int *keep = calloc((size_t)V, sizeof(int));
    for (int v = 0; v < V; v++) mx = fmax(mx, z[v]);
    for (int v = 0; v < V; v++) s += (p[v] = exp((z[v] - mx) / temp));
    for (int v = 0; v < V; v++) p[v] /= s;
    int k = top_k > 0 && top_k < V ? top_k : V;
    /* rank = number of tokens ahead in (prob desc, id asc) */
    double mass = 0;
    for (int v = 0; v < V; v++) {
        int rank = 0;
        for (int w = 0; w < V; w++) rank += p[w] > p[v] || (p[w] == p[v] && w < v);
        keep[v] = rank < k ? rank + 1 : 0; /* 1-based rank among the kept */
        if (keep[v]) mass += p[v];
    }
    if (top_p < 1) { /* smallest prefix by rank with mass >= top_p * mass */
        double acc = 0;
        int last = 0;
        for (int r = 1; r <= k; r++)
            for (int v = 0; v < V; v++)
                if (keep[v] == r) {
                    acc += p[v];
                    if (!last && acc >= top_p * mass) last = r;
                }
        for (int v = 0; v < V; v++)
            if (keep[v] > last) keep[v] = 0;
    }
    double kept = 0;
    for (int v = 0; v < V; v++) kept += keep[v] ? p[v] : 0;
    double acc = 0;
    int pick = -1;
    for (int v = 0; v < V && pick < 0; v++) {
        if (!keep[v]) continue;
        acc += p[v] / kept;
        if (acc > u) pick = v;
    }
    if (pick < 0)
        for (int v = V - 1; v >= 0 && pick < 0; v--)
            if (keep[v]) pick = v;
    *prob_of_pick = p[pick] / kept;
    free(p);
    free(keep);
    return pick;
}

static void test_sample(void) {
    const int V = 50, B = 64;
    float *z = malloc((size_t)B * V * 4);
    for (int b = 0; b < B; b++)
        for (int v = 0; v < V; v++) z[(size_t)b * V + v] = urand() * 3 + (v == 7 ? 2.0f : 0.0f);
    z[5] = z[6]; /* a tie */
    ff_sample_params *sp = calloc((size_t)B, sizeof *sp);
    struct {
        float temp, top_p;
        int top_k, mode;
    } cfg[] = {{1, 1, 0, 0}, {0.7f, 1, 5, 2}, {1.3f, 0.6f, 0, 2}, {1, 0.9f, 10, 1}, {0, 1, 0, 0}, {0, 1, 0, 2}, {1, 1, 1, 0}};
    ff_dptr dz = dev(z, (size_t)B * V * 4), dsp = dev(NULL, (size_t)B * sizeof *sp), dws = dev(NULL, (size_t)B * V * 8);
    ff_dptr dtok = dev(NULL, (size_t)B * 4), dlp = dev(NULL, (size_t)B * 4);
    int32_t tok[64];
    float lp[64];
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int b = 0; b < B; b++) {
            sp[b].temperature = cfg[c].temp;
            sp[b].top_p = cfg[c].top_p;
            sp[b].top_k = cfg[c].top_k;
            sp[b].logprob_mode = cfg[c].mode;
            sp[b].uniform = (float)b / B + 0.3f / B;
        }
        put(dsp, sp, (size_t)B * sizeof *sp);
        ff_sample(st, dz, B, V, dsp, dws, dtok, dlp);
        get(tok, dtok, sizeof tok);
        get(lp, dlp, sizeof lp);
        for (int b = 0; b < B; b++) {
            const float *zr = z + (size_t)b * V;
            double mx = -1e300, s = 0;
            int am = 0;
            for (int v = 0; v < V; v++) {
                mx = fmax(mx, zr[v]);
                if (zr[v] > zr[am]) am = v;
            }
            for (int v = 0; v < V; v++) s += exp(zr[v] - mx);
            double lse1 = mx + log(s);
            if (cfg[c].temp == 0 || cfg[c].top_k == 1) {
                CHECK_EQ_INT(tok[b], am);
                if (cfg[c].temp == 0) CHECK_CLOSE(lp[b], cfg[c].mode == 2 ? 0.0 : zr[am] - lse1, 1e-5, 0);
                continue;
            }
            double pp;
            int want = sample_ref(zr, V, cfg[c].temp, cfg[c].top_k, cfg[c].top_p, sp[b].uniform, &pp);
            CHECK_EQ_INT(tok[b], want);
            double wlp;
            if (cfg[c].mode == 2) {
                wlp = log(pp);
            } else if (cfg[c].mode == 1) {
                double mt = -1e300, st2 = 0;
                for (int v = 0; v < V; v++) mt = fmax(mt, zr[v] / cfg[c].temp);
                for (int v = 0; v < V; v++) st2 += exp(zr[v] / cfg[c].temp - mt);
                wlp = zr[want] / cfg[c].temp - (mt + log(st2));
            } else {
                wlp = zr[want] - lse1;
            }
            CHECK_CLOSE(lp[b], wlp, 1e-4, 1e-4);
        }
    }
    dev_free(dz), dev_free(dsp), dev_free(dws), dev_free(dtok), dev_free(dlp);
    free(z), free(sp);
}

int main(void) {
    ff_rng_seed(&rng, 42);
    be = ff_backend_cpu_new(2);
    REQUIRE(be);
    st = ff_backend_stream(be);
    test_gemm();
    test_embedding_bias_rows();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_attention();
    test_logprob();
    test_vector_ops();
    test_sample();
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}
