/* The tensor-core attention kernels (kernels/cuda/cuda_attention_tc.cu), run by the CUDA
 * emulator (kernels/cuda/emu/, a backend made with FF_CUDA_ATTENTION=bf16), against the CPU
 * backend's ff_attention_fwd / _bwd on the same inputs: packed sequences with empty ones and sequences that cross the kernels' 64-row
 * tiles, GQA, every tile-size relation (shorter than a tile, many tiles), head dims 16 to 128.
 * The inputs are bf16 values already (so the kernels' rounding of Q, K, V and dO is exact) and
 * what remains is the probabilities' and dS's rounding to bf16 and the sums' order: out, lse and
 * every column of dqkv within 1.5 % of their largest magnitude (tighter than
 * test_cuda_backend's 2e-2, whose inputs are not bf16 values), the ld padding untouched. A head
 * dim without a tensor-core kernel (24) takes the fp32 kernels: within 1e-5. And a backward
 * whose kernel scratch cannot be had fails its stream with the reason (scratch_refused). And
 * causality and sequence isolation exactly (isolation_case): what a row may not see, changed,
 * moves none of its outputs by a bit.
 *
 * Without a C++ compiler at configure time the emulator is not built and this exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "fuseflow/kernels.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

#ifndef FF_HAVE_CUDA_EMU
int main(void) {
    (void)ff_test_failures;
    SKIP("attention_tc_emu: no C++ compiler at configure time, so the emulator was not built");
}
#else
#include "kernels/cuda/emu/cuda_emu.h"
#include "tests/cuda_test_util.h"

static ff_rng rng;

static float *bf16_rand(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = ff_bf16_to_f32(ff_f32_to_bf16((float)(ff_rng_uniform(&rng) * 2 - 1) * scale));
    return x;
}

/* Forward and backward on a backend: the host arrays copied in and the outputs copied out.
 * -1 when the stream failed (its error set). */
static int run_attention(ff_backend *be, const float *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv,
                          int D, float *out, float *lse, const float *dout, float *dqkv) {
    ff_stream *st = ff_backend_stream(be);
    const size_t nq = (size_t)T * ld, no = (size_t)T * Hq * D, nl = (size_t)T * Hq;
    ff_buffer *b_qkv = ff_buffer_new(be, nq * 4), *b_ss = ff_buffer_new(be, (size_t)(S + 1) * 4);
    ff_buffer *b_out = ff_buffer_new(be, no * 4), *b_lse = ff_buffer_new(be, nl * 4);
    ff_buffer *b_dout = ff_buffer_new(be, no * 4), *b_delta = ff_buffer_new(be, nl * 4), *b_dqkv = ff_buffer_new(be, nq * 4);
    REQUIRE(b_qkv && b_ss && b_out && b_lse && b_dout && b_delta && b_dqkv);
    ff_dptr qd = ff_dptr_of(b_qkv, 0), sd = ff_dptr_of(b_ss, 0), od = ff_dptr_of(b_out, 0), ldp = ff_dptr_of(b_lse, 0);
    ff_dptr dod = ff_dptr_of(b_dout, 0), dld = ff_dptr_of(b_delta, 0), dqd = ff_dptr_of(b_dqkv, 0);
    ff_memcpy_h2d(st, qd, qkv, nq * 4);
    ff_memcpy_h2d(st, sd, ss, (size_t)(S + 1) * 4);
    ff_memcpy_h2d(st, dod, dout, no * 4);
    ff_memcpy_h2d(st, dqd, dqkv, nq * 4);
    ff_attention_fwd(st, qd, ld, sd, S, T, Hq, Hkv, D, od, ldp);
    ff_attention_bwd(st, qd, ld, sd, ss, S, T, Hq, Hkv, D, od, ldp, dod, dld, dqd);
    ff_memcpy_d2h(st, out, od, no * 4);
    ff_memcpy_d2h(st, lse, ldp, nl * 4);
    ff_memcpy_d2h(st, dqkv, dqd, nq * 4);
    int rc = ff_stream_sync(st);
    ff_buffer *all[] = {b_qkv, b_ss, b_out, b_lse, b_dout, b_delta, b_dqkv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ff_buffer_destroy(&all[i]);
    return rc;
}

/* max |a - b| over rows x cols (row stride ld, from column c0) within rtol of max |a|. */
static void check_close(const char *what, const float *a, const float *b, int rows, int ld, int c0, int cols, double rtol) {
    double mx = 0, worst = -1;
    int wr = 0, wc = 0;
    for (int r = 0; r < rows; r++)
        for (int c = c0; c < c0 + cols; c++) mx = fmax(mx, fabs(a[(size_t)r * ld + c]));
    for (int r = 0; r < rows; r++)
        for (int c = c0; c < c0 + cols; c++) {
            double e = fabs((double)a[(size_t)r * ld + c] - (double)b[(size_t)r * ld + c]);
            if (isnan(e) || e > worst) {
                worst = isnan(e) ? INFINITY : e;
                wr = r, wc = c;
            }
        }
    if (!(worst <= rtol * mx)) {
        fprintf(stderr, "%s: max |emu - cpu| %.3g at row %d col %d (emu %.7g, cpu %.7g), tolerance %.3g\n", what, worst,
                wr, wc, (double)b[(size_t)wr * ld + wc], (double)a[(size_t)wr * ld + wc], rtol * mx);
        ff_test_failures++;
    } else if (getenv("FF_TEST_VERBOSE")) {
        printf("%-40s max err %.3g (max %.3g)\n", what, worst, mx);
    }
}

/* pad: qkv's and dqkv's columns past q|k|v (6: rows off 16 bytes, the kernels' staging 2
 * elements a load; 8: on 16 bytes, 16 bytes a load, K and V or Q and dO together) */
static void run_case_ld(ff_backend *cpu, ff_backend *emu, const int32_t *lens, int S, int Hq, int Hkv, int D, int pad,
                        double tol) {
    int32_t ss[64];
    ss[0] = 0;
    for (int s = 0; s < S; s++) ss[s + 1] = ss[s] + lens[s];
    const int T = ss[S], W = (Hq + 2 * Hkv) * D, ld = W + pad, HD = Hq * D;
    char what[96];
    float *qkv = bf16_rand((size_t)T * ld, 1.5f), *dout = bf16_rand((size_t)T * HD, 1.0f);
    float *dq0 = bf16_rand((size_t)T * ld, 1.0f); /* the padding must survive both */
    float *out_c = malloc((size_t)T * HD * 4), *lse_c = malloc((size_t)T * Hq * 4), *dqkv_c = malloc((size_t)T * ld * 4);
    float *out_e = malloc((size_t)T * HD * 4), *lse_e = malloc((size_t)T * Hq * 4), *dqkv_e = malloc((size_t)T * ld * 4);
    memcpy(dqkv_c, dq0, (size_t)T * ld * 4);
    memcpy(dqkv_e, dq0, (size_t)T * ld * 4);
    REQUIRE(run_attention(cpu, qkv, ld, ss, S, T, Hq, Hkv, D, out_c, lse_c, dout, dqkv_c) == 0);
    int rc = run_attention(emu, qkv, ld, ss, S, T, Hq, Hkv, D, out_e, lse_e, dout, dqkv_e);
    snprintf(what, sizeof what, "T=%d S=%d Hq=%d Hkv=%d D=%d ld+%d", T, S, Hq, Hkv, D, pad);
    if (rc) {
        fprintf(stderr, "%s: the emulated stream failed: %s\n", what, ff_error_message());
        ff_test_failures++;
    } else {
        char w2[160];
        snprintf(w2, sizeof w2, "%s out", what);
        check_close(w2, out_c, out_e, T, HD, 0, HD, tol);
        snprintf(w2, sizeof w2, "%s lse", what);
        check_close(w2, lse_c, lse_e, T, Hq, 0, Hq, tol);
        snprintf(w2, sizeof w2, "%s dq", what);
        check_close(w2, dqkv_c, dqkv_e, T, ld, 0, HD, tol);
        snprintf(w2, sizeof w2, "%s dk", what);
        check_close(w2, dqkv_c, dqkv_e, T, ld, HD, Hkv * D, tol);
        snprintf(w2, sizeof w2, "%s dv", what);
        check_close(w2, dqkv_c, dqkv_e, T, ld, HD + Hkv * D, Hkv * D, tol);
        int pad_ok = 1;
        for (int t = 0; t < T; t++)
            pad_ok &= !memcmp(dqkv_e + (size_t)t * ld + W, dq0 + (size_t)t * ld + W, (size_t)(ld - W) * 4);
        if (!pad_ok) {
            fprintf(stderr, "%s: the emulated backward wrote into the ld padding\n", what);
            ff_test_failures++;
        }
    }
    free(qkv), free(dout), free(dq0), free(out_c), free(lse_c), free(dqkv_c), free(out_e), free(lse_e), free(dqkv_e);
}

static void run_case(ff_backend *cpu, ff_backend *emu, const int32_t *lens, int S, int Hq, int Hkv, int D, double tol) {
    run_case_ld(cpu, emu, lens, S, Hq, Hkv, D, 6, tol);
}

/* Causality and sequence isolation, bit for bit (the kernels are deterministic): with the K and
 * V columns of rows [lo, hi) changed, out, lse and dq of rows [clo, chi) must not move; with the
 * Q columns and dout of rows [lo, hi) changed (kv false), dk and dv of rows [clo, chi) must not.
 * A tile taken as visible whole where one of its keys (or, for dk/dv, queries) is not moves
 * them, however little that key weighs, which a tolerance might miss. */
static void isolation_case(ff_backend *emu, const int32_t *lens, int S, int Hq, int Hkv, int D, bool kv, int lo, int hi,
                           int clo, int chi) {
    int32_t ss[64];
    ss[0] = 0;
    for (int s = 0; s < S; s++) ss[s + 1] = ss[s] + lens[s];
    const int T = ss[S], ld = (Hq + 2 * Hkv) * D, HD = Hq * D;
    float *qkv = bf16_rand((size_t)T * ld, 1.5f), *dout = bf16_rand((size_t)T * HD, 1.0f);
    float *qkv2 = malloc((size_t)T * ld * 4), *dout2 = malloc((size_t)T * HD * 4);
    float *out[2], *lse[2], *dqkv[2];
    REQUIRE(qkv2 && dout2);
    memcpy(qkv2, qkv, (size_t)T * ld * 4);
    memcpy(dout2, dout, (size_t)T * HD * 4);
    for (int t = lo; t < hi; t++) {
        if (kv)
            for (int c = HD; c < ld; c++) qkv2[(size_t)t * ld + c] = -qkv[(size_t)t * ld + c] + 0.25f;
        else {
            for (int c = 0; c < HD; c++) qkv2[(size_t)t * ld + c] = -qkv[(size_t)t * ld + c] + 0.25f;
            for (int c = 0; c < HD; c++) dout2[(size_t)t * HD + c] = -dout[(size_t)t * HD + c] + 0.5f;
        }
    }
    for (int v = 0; v < 2; v++) {
        out[v] = malloc((size_t)T * HD * 4), lse[v] = malloc((size_t)T * Hq * 4), dqkv[v] = calloc((size_t)T * ld, 4);
        REQUIRE(out[v] && lse[v] && dqkv[v]);
        REQUIRE(run_attention(emu, v ? qkv2 : qkv, ld, ss, S, T, Hq, Hkv, D, out[v], lse[v], v ? dout2 : dout, dqkv[v]) == 0);
    }
    bool same = true;
    for (int t = clo; t < chi; t++) {
        if (kv) {
            same &= !memcmp(out[0] + (size_t)t * HD, out[1] + (size_t)t * HD, (size_t)HD * 4);
            same &= !memcmp(lse[0] + (size_t)t * Hq, lse[1] + (size_t)t * Hq, (size_t)Hq * 4);
            same &= !memcmp(dqkv[0] + (size_t)t * ld, dqkv[1] + (size_t)t * ld, (size_t)HD * 4);
        } else {
            same &= !memcmp(dqkv[0] + (size_t)t * ld + HD, dqkv[1] + (size_t)t * ld + HD, (size_t)(ld - HD) * 4);
        }
    }
    if (!same) {
        fprintf(stderr, "T=%d S=%d Hq=%d Hkv=%d D=%d: with the %s of rows [%d, %d) changed, %s of rows [%d, %d) moved\n", T, S,
                Hq, Hkv, D, kv ? "K and V" : "Q and dout", lo, hi, kv ? "out, lse or dq" : "dk or dv", clo, chi);
        ff_test_failures++;
    }
    free(qkv), free(dout), free(qkv2), free(dout2);
    for (int v = 0; v < 2; v++) free(out[v]), free(lse[v]), free(dqkv[v]);
}

/* A GQA backward's dk/dv partial rows live in the stream's kernel scratch (2 x T x Hq x D
 * fp32): with the device full, the backward fails its stream, naming the scratch and what
 * fuseflow holds, and a new stream runs it once memory is free again. Filling the device takes
 * its whole memory (host memory here): only where FF_CUDA_EMU_MEMORY makes it small, as the
 * _emu_low copy does. */
static void scratch_refused(ff_backend *emu) {
    ff_backend_memory m0;
    ff_backend_memory_of(emu, &m0);
    if (m0.capacity > ((int64_t)2 << 30)) return;
    enum { T = 512, HQ = 8, HKV = 1, D = 64, LD = (HQ + 2 * HKV) * D, MAX_FILL = 1024 }; /* partials: 2 MiB */
    const int32_t ss[2] = {0, T};
    float *qkv = bf16_rand((size_t)T * LD, 1.0f), *dout = bf16_rand((size_t)T * HQ * D, 1.0f);
    ff_buffer *b_qkv = ff_buffer_new(emu, (size_t)T * LD * 4), *b_ss = ff_buffer_new(emu, sizeof ss);
    ff_buffer *b_out = ff_buffer_new(emu, (size_t)T * HQ * D * 4), *b_dout = ff_buffer_new(emu, (size_t)T * HQ * D * 4);
    ff_buffer *b_lse = ff_buffer_new(emu, (size_t)T * HQ * 4), *b_delta = ff_buffer_new(emu, (size_t)T * HQ * 4);
    ff_buffer *b_dqkv = ff_buffer_new(emu, (size_t)T * LD * 4);
    ff_stream *st = ff_stream_new(emu);
    REQUIRE(qkv && dout && b_qkv && b_ss && b_out && b_dout && b_lse && b_delta && b_dqkv && st);
    ff_dptr qd = ff_dptr_of(b_qkv, 0), sd = ff_dptr_of(b_ss, 0), od = ff_dptr_of(b_out, 0), ldp = ff_dptr_of(b_lse, 0);
    ff_dptr dod = ff_dptr_of(b_dout, 0), dld = ff_dptr_of(b_delta, 0), dqd = ff_dptr_of(b_dqkv, 0);
    ff_memcpy_h2d(st, qd, qkv, (size_t)T * LD * 4);
    ff_memcpy_h2d(st, sd, ss, sizeof ss);
    ff_memcpy_h2d(st, dod, dout, (size_t)T * HQ * D * 4);
    ff_attention_fwd(st, qd, LD, sd, 1, T, HQ, HKV, D, od, ldp);
    CHECK(ff_stream_sync(st) == 0);
    ff_buffer *hold[MAX_FILL];
    const int nh = gpu_fill(emu, hold, MAX_FILL);
    CHECK(nh < MAX_FILL); /* filled: under 1 MiB is left */
    ff_attention_bwd(st, qd, LD, sd, ss, 1, T, HQ, HKV, D, od, ldp, dod, dld, dqd);
    CHECK(ff_stream_sync(st) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "of kernel scratch");
    CHECK_STR_CONTAINS(ff_error_message(), "fuseflow holds");
    ff_stream_destroy(&st);
    for (int i = 0; i < nh; i++) ff_buffer_destroy(&hold[i]);
    st = ff_stream_new(emu);
    REQUIRE(st);
    ff_attention_bwd(st, qd, LD, sd, ss, 1, T, HQ, HKV, D, od, ldp, dod, dld, dqd);
    CHECK(ff_stream_sync(st) == 0);
    ff_stream_destroy(&st);
    ff_buffer *all[] = {b_qkv, b_ss, b_out, b_dout, b_lse, b_delta, b_dqkv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ff_buffer_destroy(&all[i]);
    free(qkv), free(dout);
}

int main(void) {
    ff_rng_seed(&rng, 41);
    ff_backend *cpu = ff_backend_cpu_new(2);
    setenv("FF_CUDA_MATH", "fp32", 1);
    setenv("FF_CUDA_ATTENTION", "bf16", 1);
    ff_backend *emu = ff_backend_cuda_emu_new(0);
    unsetenv("FF_CUDA_MATH");
    unsetenv("FF_CUDA_ATTENTION");
    REQUIRE(cpu && emu);

    /* test_cuda_backend's cases: empty sequences, a one-token one, GQA, D 16 / 64 / 80 / 128 */
    int32_t a[] = {37, 0, 70, 1, 100};
    run_case(cpu, emu, a, 5, 4, 2, 16, 1.5e-2);
    int32_t b[] = {130, 3};
    run_case(cpu, emu, b, 2, 2, 1, 64, 1.5e-2);
    int32_t c[] = {45, 64};
    run_case(cpu, emu, c, 2, 3, 3, 80, 1.5e-2);
    int32_t d[] = {33};
    run_case(cpu, emu, d, 1, 2, 1, 128, 1.5e-2);
    /* one sequence over four tiles, 4 query heads a kv head */
    int32_t e[] = {200};
    run_case(cpu, emu, e, 1, 4, 1, 32, 1.5e-2);
    /* many short sequences, so that tiles start and end inside sequences everywhere */
    int32_t f[] = {5, 9, 1, 17, 0, 12, 3, 30, 8, 2, 21, 11, 6};
    run_case(cpu, emu, f, 13, 2, 2, 48, 1.5e-2);
    /* a head dim without a tensor-core kernel takes the fp32 ones */
    int32_t g[] = {20, 31};
    run_case(cpu, emu, g, 2, 2, 1, 24, 1e-5);
    /* rows on 16 bytes: the staging's 16-byte loads */
    run_case_ld(cpu, emu, b, 2, 2, 1, 64, 8, 1.5e-2);
    run_case_ld(cpu, emu, e, 1, 4, 1, 32, 8, 1.5e-2);
    run_case_ld(cpu, emu, f, 13, 2, 2, 48, 8, 1.5e-2);

    /* causality at a tile's edge: a sequence from row 2, so that a 64-key tile ends one key past
     * the first row of a warp (keys 2 .. 65 against rows 64 .. 79); and dk/dv's query passes
     * of 32 (head dim 64) and 64 (head dim 32), GQA's partial rows */
    int32_t h[] = {2, 300};
    isolation_case(emu, h, 2, 4, 1, 64, true, 65, 302, 0, 65);
    isolation_case(emu, h, 2, 4, 1, 32, true, 65, 302, 0, 65);
    isolation_case(emu, h, 2, 4, 1, 64, false, 0, 80, 80, 302);
    isolation_case(emu, h, 2, 4, 1, 32, false, 0, 80, 80, 302);
    /* two sequences meeting inside a block (at row 63, where a 32-query pass of the block's
     * first warp ends one query into the second), both ways */
    int32_t k2[] = {63, 100};
    isolation_case(emu, k2, 2, 2, 1, 64, true, 0, 63, 63, 163);
    isolation_case(emu, k2, 2, 2, 1, 64, true, 63, 163, 0, 63);
    isolation_case(emu, k2, 2, 2, 1, 64, false, 63, 163, 0, 63);
    isolation_case(emu, k2, 2, 2, 1, 64, false, 0, 63, 63, 163);
    scratch_refused(emu);

    ff_backend_destroy(&emu);
    ff_backend_destroy(&cpu);
    TEST_MAIN_END();
}
#endif
