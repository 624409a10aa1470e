/* Batch invariance of the CPU backend's products: a row of A W^T (every linear's forward) is
 * the same bit for bit whatever the number of rows it shares the product with (a decode
 * batch, packed prompts) and whatever the thread split; the other layouts likewise. The
 * shapes are the test models' (hidden 64, intermediate 128, a vocabulary of 256, a value
 * head of 1, other narrow and odd widths where OpenBLAS's kernels switch) and two large
 * enough that the backend splits them over threads. Without the
 * padding of cpu_backend.c the 64 x 64 case fails from 19 rows on (OpenBLAS 0.3.21). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/error.h"
#include "fuseflow/kernels.h"
#include "kernels/cpu/cpu_internal.h"
#include "tests/test_util.h"

enum { MAXM = 96 };

static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 747796405u + 2891336453u;
        x[i] = (float)(seed >> 9) / 8388608.0f - 0.5f;
    }
}

/* Rows of C = A op(B) for M = 1..MAXM against the rows of the MAXM-row product: how many M
 * differ anywhere. ta/tb as ff_gemm; A is [MAXM, K] (or [K, MAXM] transposed). */
static int varying(ff_backend *be, ff_trans ta, ff_trans tb, int N, int K) {
    ff_stream *st = ff_backend_stream(be);
    size_t na = (size_t)MAXM * K, nb = (size_t)N * K, nc = (size_t)MAXM * N;
    float *a = malloc(na * 4), *b = malloc(nb * 4), *ref = malloc(nc * 4), *c = malloc(nc * 4);
    ff_buffer *A = ff_buffer_new(be, na * 4), *B = ff_buffer_new(be, nb * 4), *C = ff_buffer_new(be, nc * 4);
    REQUIRE(a && b && ref && c && A && B && C);
    fill(a, na, 1), fill(b, nb, 2);
    ff_memcpy_h2d(st, ff_dptr_f32(B, 0), b, nb * 4);
    int bad = 0;
    for (int M = MAXM; M >= 1; M--) {
        /* the first M rows of A; transposed, its first M columns (ld MAXM) */
        ff_memcpy_h2d(st, ff_dptr_f32(A, 0), a, na * 4);
        ff_gemm(st, ta, tb, M, N, K, 1.0f, ff_dptr_f32(A, 0), ta == FF_NO_TRANS ? K : MAXM, ff_dptr_f32(B, 0),
                tb == FF_TRANS ? K : N, 0.0f, ff_dptr_f32(C, 0), N);
        REQUIRE(ff_stream_sync(st) == 0);
        ff_memcpy_d2h(st, M == MAXM ? ref : c, ff_dptr_f32(C, 0), (size_t)M * N * 4);
        if (M < MAXM && memcmp(c, ref, (size_t)M * N * 4)) bad++;
    }
    ff_buffer_destroy(&A), ff_buffer_destroy(&B), ff_buffer_destroy(&C);
    free(a), free(b), free(ref), free(c);
    return bad;
}

int main(void) {
    static const int shapes[][2] = {{64, 64}, {192, 64}, {128, 64}, {64, 128}, {256, 64}, {16, 64},  {24, 64},
                                    {32, 64}, {1, 64},   {2, 64},   {3, 64},   {5, 128}, {512, 256}, {768, 256}};
    for (int threads = 1; threads <= 2; threads++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", threads);
        ff_backend *be = ff_backend_new(name);
        REQUIRE(be);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            int N = shapes[i][0], K = shapes[i][1];
            int nt = varying(be, FF_NO_TRANS, FF_TRANS, N, K);
            /* A W (a backward's dX, rows = tokens) from OpenBLAS as it is: row-invariant from 4 columns
             * wide; narrower ones are not (N = 1, 2, 3, 5 measured) and are not forwards */
            int nn = N >= 16 ? varying(be, FF_NO_TRANS, FF_NO_TRANS, N, K) : 0;
            int tn = varying(be, FF_TRANS, FF_NO_TRANS, N, K);
            printf("threads %d, N %d K %d: %s %d; sizes whose rows differ: A W^T %d, A W %d, A^T W %d\n", threads, N,
                   K, N < 16 ? "fixed-order dots, OpenBLAS's blocked kernel would be from rows" : "padded to rows",
                   ff_cpu_gemm_blocked_rows(N, K), nt, nn, tn);
            CHECK_EQ_INT(nt, 0);
            CHECK_EQ_INT(nn, 0);
            CHECK_EQ_INT(tn, 0);
        }
        ff_backend_destroy(&be);
    }
    /* the padding is what makes it so: without it, where OpenBLAS switches kernels, rows vary */
    setenv("FF_BATCH_INVARIANT", "0", 1);
    ff_backend *plain = ff_backend_new("cpu:1");
    REQUIRE(plain);
    int off = varying(plain, FF_NO_TRANS, FF_TRANS, 64, 64);
    printf("FF_BATCH_INVARIANT=0, N 64 K 64: sizes whose rows differ: %d\n", off);
    if (ff_cpu_gemm_blocked_rows(64, 64) > 1) CHECK(off > 0);
    ff_backend_destroy(&plain);
    setenv("FF_BATCH_INVARIANT", "yes", 1);
    CHECK(ff_backend_new("cpu:1") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "FF_BATCH_INVARIANT");
    CHECK_STR_CONTAINS(ff_error_message(), "'yes'");
    unsetenv("FF_BATCH_INVARIANT");
    TEST_MAIN_END();
}
