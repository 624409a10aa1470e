/* Batch invariance of the CPU backend's products: a row of A W^T (every linear's forward) is
 * the same bit for bit whatever the number of rows it shares the product with (a decode batch,
 * packed prompts), whatever its place among them and whatever the thread split; and all
 * layouts' products are right (against double sums). Checked in both modes
 * that keep rows invariant: the default (OpenBLAS padded where the backend's probe finds its
 * rows invariant, the fixed-order products of cpu_gemm_fixed.c where not) and
 * FF_BATCH_INVARIANT=fixed, so the fixed-order products are tested on every machine. The
 * shapes are the test models' (hidden 64, intermediate 128, a vocabulary of 256, a value
 * head of 1, other narrow and odd widths where OpenBLAS's kernels switch) and two large
 * enough that the backend splits them over threads. Without the padding, with the SkylakeX
 * kernels the 64 x 64 case fails from 19 rows on; with the Haswell/Zen kernels nearly every
 * row count and every place in a 12-row tile differs (OpenBLAS 0.3.21). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/error.h"
#include "fuseflow/kernels.h"
#include "kernels/cpu/cpu_internal.h"
#include "tests/test_util.h"

enum { MAXM = 96, SHIFTS = 13 };

static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 747796405u + 2891336453u;
        x[i] = (float)(seed >> 9) / 8388608.0f - 0.5f;
    }
}

typedef struct product {
    ff_backend *be;
    ff_trans ta, tb;
    int N, K;
    float *a, *b, *ref, *c; /* host: A [MAXM + SHIFTS, K] (transposed: [K, MAXM + SHIFTS]), B, C */
    ff_buffer *A, *B, *C;
} product;

static void product_init(product *p, ff_backend *be, ff_trans ta, ff_trans tb, int N, int K) {
    size_t rows = MAXM + SHIFTS, na = rows * K, nb = (size_t)N * K, nc = rows * N;
    *p = (product){be, ta, tb, N, K, malloc(na * 4), malloc(nb * 4), malloc(nc * 4), malloc(nc * 4),
                   ff_buffer_new(be, na * 4), ff_buffer_new(be, nb * 4), ff_buffer_new(be, nc * 4)};
    REQUIRE(p->a && p->b && p->ref && p->c && p->A && p->B && p->C);
    fill(p->a, na, 1), fill(p->b, nb, 2);
    ff_stream *st = ff_backend_stream(be);
    ff_memcpy_h2d(st, ff_dptr_f32(p->A, 0), p->a, na * 4);
    ff_memcpy_h2d(st, ff_dptr_f32(p->B, 0), p->b, nb * 4);
}

static void product_fini(product *p) {
    ff_buffer_destroy(&p->A), ff_buffer_destroy(&p->B), ff_buffer_destroy(&p->C);
    free(p->a), free(p->b), free(p->ref), free(p->c);
}

/* C [M, N] = rows first..first+M-1 of A times op(B), into out */
static void run(product *p, int first, int M, float *out) {
    ff_stream *st = ff_backend_stream(p->be);
    int lda = p->ta == FF_NO_TRANS ? p->K : MAXM + SHIFTS;
    ff_dptr A = ff_dptr_f32(p->A, p->ta == FF_NO_TRANS ? (size_t)first * p->K : (size_t)first);
    ff_gemm(st, p->ta, p->tb, M, p->N, p->K, 1.0f, A, lda, ff_dptr_f32(p->B, 0), p->tb == FF_TRANS ? p->K : p->N,
            0.0f, ff_dptr_f32(p->C, 0), p->N);
    REQUIRE(ff_stream_sync(st) == 0);
    ff_memcpy_d2h(st, out, ff_dptr_f32(p->C, 0), (size_t)M * p->N * 4);
}

/* How many of: M = 1..MAXM-1 rows, and MAXM rows starting 1..SHIFTS rows further down, give
 * rows that differ from the same rows of the product of rows 0..MAXM+SHIFTS-1. */
static int varying(product *p) {
    run(p, 0, MAXM + SHIFTS, p->ref);
    int bad = 0;
    for (int M = 1; M < MAXM; M++) {
        run(p, 0, M, p->c);
        bad += memcmp(p->c, p->ref, (size_t)M * p->N * 4) != 0;
    }
    for (int s = 1; s <= SHIFTS; s++) {
        run(p, s, MAXM, p->c);
        bad += memcmp(p->c, p->ref + (size_t)s * p->N, (size_t)MAXM * p->N * 4) != 0;
    }
    return bad;
}

/* The largest |C - C_double| over the reference product, relative to sum |a b| */
static double wrong(const product *p) {
    int rows = MAXM + SHIFTS, ld = rows;
    double worst = 0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < p->N; j++) {
            double s = 0, mag = 0;
            for (int k = 0; k < p->K; k++) {
                double x = p->ta == FF_NO_TRANS ? p->a[(size_t)i * p->K + k] : p->a[(size_t)k * ld + i];
                double y = p->tb == FF_TRANS ? p->b[(size_t)j * p->K + k] : p->b[(size_t)k * p->N + j];
                s += x * y, mag += fabs(x * y);
            }
            double e = fabs(p->ref[(size_t)i * p->N + j] - s) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
        }
    return worst;
}

static int check(ff_backend *be, ff_trans ta, ff_trans tb, int N, int K, double *err) {
    product p;
    product_init(&p, be, ta, tb, N, K);
    int bad = varying(&p);
    double e = wrong(&p);
    if (e > *err) *err = e;
    product_fini(&p);
    return bad;
}

/* accumulating (beta = 1): C += A W^T and C += A W, in the fixed mode */
static void check_beta(ff_backend *be, int M, int N, int K) {
    ff_stream *st = ff_backend_stream(be);
    float *a = malloc((size_t)M * K * 4), *b = malloc((size_t)N * K * 4), *c = malloc((size_t)M * N * 4);
    ff_buffer *A = ff_buffer_new(be, (size_t)M * K * 4), *B = ff_buffer_new(be, (size_t)N * K * 4),
              *C = ff_buffer_new(be, (size_t)M * N * 4);
    REQUIRE(a && b && c && A && B && C);
    fill(a, (size_t)M * K, 5), fill(b, (size_t)N * K, 6), fill(c, (size_t)M * N, 7);
    ff_memcpy_h2d(st, ff_dptr_f32(A, 0), a, (size_t)M * K * 4);
    ff_memcpy_h2d(st, ff_dptr_f32(B, 0), b, (size_t)N * K * 4);
    ff_memcpy_h2d(st, ff_dptr_f32(C, 0), c, (size_t)M * N * 4);
    for (int tb = 0; tb < 2; tb++) {
        ff_trans t = tb ? FF_TRANS : FF_NO_TRANS;
        ff_gemm(st, FF_NO_TRANS, t, M, N, K, 0.5f, ff_dptr_f32(A, 0), K, ff_dptr_f32(B, 0), tb ? K : N, 1.0f,
                ff_dptr_f32(C, 0), N);
    }
    float *got = malloc((size_t)M * N * 4);
    REQUIRE(got && ff_stream_sync(st) == 0);
    ff_memcpy_d2h(st, got, ff_dptr_f32(C, 0), (size_t)M * N * 4);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = c[(size_t)i * N + j];
            for (int k = 0; k < K; k++) s += 0.5 * a[(size_t)i * K + k] * b[(size_t)j * K + k];
            for (int k = 0; k < K; k++) s += 0.5 * a[(size_t)i * K + k] * b[(size_t)k * N + j];
            CHECK_CLOSE(got[(size_t)i * N + j], s, 1e-4, 1e-4);
        }
    ff_buffer_destroy(&A), ff_buffer_destroy(&B), ff_buffer_destroy(&C);
    free(a), free(b), free(c), free(got);
}

int main(void) {
    static const int shapes[][2] = {{64, 64}, {192, 64}, {128, 64}, {64, 128}, {256, 64}, {16, 64},  {24, 64},
                                    {32, 64}, {1, 64},   {2, 64},   {3, 64},   {5, 128}, {40, 37}, {512, 256},
                                    {768, 256}};
    static const char *modes[] = {"1", "fixed"};
    float *fixed_rows[2] = {NULL, NULL}; /* the 768 x 256 product at 1 and 2 threads, fixed mode */
    for (int mode = 0; mode < 2; mode++) {
        setenv("FF_BATCH_INVARIANT", modes[mode], 1);
        for (int threads = 1; threads <= 2; threads++) {
            char name[16];
            snprintf(name, sizeof name, "cpu:%d", threads);
            ff_backend *be = ff_backend_new(name);
            REQUIRE(be);
            double err = 0;
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
                int N = shapes[i][0], K = shapes[i][1];
                int nt = check(be, FF_NO_TRANS, FF_TRANS, N, K, &err);
                /* A W (dX) and A^T W (a weight gradient) are backward products, OpenBLAS as it
                 * is: nothing needs their rows invariant; printed, and checked for right sums */
                int nn = check(be, FF_NO_TRANS, FF_NO_TRANS, N, K, &err);
                int tn = check(be, FF_TRANS, FF_NO_TRANS, N, K, &err);
                int unit = ff_cpu_gemm_row_unit();
                printf("FF_BATCH_INVARIANT=%s, threads %d, N %d K %d: %s; cases whose rows differ (of %d): A W^T %d, "
                       "A W %d, A^T W %d (these two OpenBLAS as it is)\n",
                       modes[mode], threads, N, K,
                       N < 16              ? "fixed-order dots"
                       : mode == 1 || !unit ? "fixed-order products"
                                            : "OpenBLAS padded",
                       MAXM - 1 + SHIFTS, nt, nn, tn);
                CHECK_EQ_INT(nt, 0);
                if (mode == 1 && N == 768) {
                    product p;
                    product_init(&p, be, FF_NO_TRANS, FF_TRANS, N, K);
                    run(&p, 0, MAXM, p.c);
                    fixed_rows[threads - 1] = p.c, p.c = NULL;
                    product_fini(&p);
                }
            }
            printf("  largest error against double sums, relative to sum |a b|: %.2e\n", err);
            CHECK(err < 1e-5);
            if (mode == 1) check_beta(be, 37, 24, 19);
            ff_backend_destroy(&be);
        }
    }
    /* the fixed-order products do not depend on the thread count either, nor on the path
     * (AVX-512, AVX2 + FMA or fmaf per element) */
    {
        setenv("FF_BATCH_INVARIANT", "fixed", 1);
        ff_backend *be = ff_backend_new("cpu:1");
        REQUIRE(be);
        static const int odd[][3] = {{96, 768, 256}, {37, 40, 37}, {5, 19, 3}, {13, 100, 71}, {9, 67, 8}, {17, 3, 130}};
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
            product p;
            product_init(&p, be, FF_NO_TRANS, FF_TRANS, odd[i][1], odd[i][2]);
            ff_cpu_gemm_fixed_path(FF_FIXED_PORTABLE);
            run(&p, 1, odd[i][0], p.ref);
            for (int path = FF_FIXED_AVX2; path <= FF_FIXED_AVX512; path++) {
                if (ff_cpu_gemm_fixed_path(path) != path) continue; /* the CPU lacks it */
                run(&p, 1, odd[i][0], p.c);
                if (memcmp(p.ref, p.c, (size_t)odd[i][0] * odd[i][1] * 4)) {
                    fprintf(stderr, "fixed-order product %dx%dx%d: path %d differs from the portable one\n", odd[i][0],
                            odd[i][1], odd[i][2], path);
                    ff_test_failures++;
                }
            }
            ff_cpu_gemm_fixed_path(-1);
            product_fini(&p);
        }
        ff_backend_destroy(&be);
    }
    REQUIRE(fixed_rows[0] && fixed_rows[1]);
    CHECK(memcmp(fixed_rows[0], fixed_rows[1], (size_t)MAXM * 768 * 4) == 0);
    free(fixed_rows[0]), free(fixed_rows[1]);
    printf("row unit of OpenBLAS here: %d (0: its rows are not invariant, the fixed-order products are used)\n",
           ff_cpu_gemm_row_unit());

    /* the padding or the fixed order is what makes it so: without, rows vary here */
    setenv("FF_BATCH_INVARIANT", "0", 1);
    ff_backend *plain = ff_backend_new("cpu:1");
    REQUIRE(plain);
    product p;
    product_init(&p, plain, FF_NO_TRANS, FF_TRANS, 64, 64);
    int off = varying(&p);
    product_fini(&p);
    printf("FF_BATCH_INVARIANT=0, N 64 K 64: cases whose rows differ: %d\n", off);
    if (ff_cpu_gemm_floor_rows(64, 64) > 1 || ff_cpu_gemm_row_unit() != 1) CHECK(off > 0);
    ff_backend_destroy(&plain);
    setenv("FF_BATCH_INVARIANT", "yes", 1);
    CHECK(ff_backend_new("cpu:1") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "FF_BATCH_INVARIANT");
    CHECK_STR_CONTAINS(ff_error_message(), "'yes'");
    CHECK_STR_CONTAINS(ff_error_message(), "fixed");
    unsetenv("FF_BATCH_INVARIANT");
    TEST_MAIN_END();
}
