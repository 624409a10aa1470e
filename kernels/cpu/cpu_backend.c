/* The CPU backend: host memory as "device" memory, synchronous streams, matrix products
 * through OpenBLAS, the other kernels in the cpu_*.c files beside this one.
 *
 * Threads: OpenBLAS is set to one thread and every product is split into row or column
 * blocks across this backend's OpenMP team, one single-threaded cblas_sgemm per thread.
 * Debian's default OpenBLAS is the pthreads build; letting it run its own threads beside
 * OpenMP's makes both pools spin for the same 2 cores. One pool, ours, avoids that, and the
 * split costs nothing measurable at our shapes (bench/bench_model.c prints sgemm alone).
 * openblas_set_num_threads is process-wide: anything else in the process that calls
 * OpenBLAS gets one thread too. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/util.h"
#include "kernels/cpu/cpu_internal.h"

/* ---- memory and streams -------------------------------------------------------------------- */

static int cpu_alloc(ff_backend *be, size_t bytes, void **data) {
    (void)be;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, rounded)) {
        return ff_error_set("cpu backend", "use a smaller model or batch", "out of memory allocating %zu bytes",
                            bytes);
    }
    memset(p, 0, rounded);
    *data = p;
    return 0;
}
static void cpu_free(ff_backend *be, void *data) {
    (void)be;
    free(data);
}
static char *addr(ff_dptr p) { return (char *)p.buf->data + p.off; }
static void cpu_h2d(ff_stream *s, ff_dptr dst, const void *src, size_t n) {
    (void)s;
    memcpy(addr(dst), src, n);
}
static void cpu_d2h(ff_stream *s, void *dst, ff_dptr src, size_t n) {
    (void)s;
    memcpy(dst, addr(src), n);
}
static void cpu_d2d(ff_stream *s, ff_dptr dst, ff_dptr src, size_t n) {
    (void)s;
    memmove(addr(dst), addr(src), n);
}
static void cpu_memset0(ff_stream *s, ff_dptr dst, size_t n) {
    (void)s;
    memset(addr(dst), 0, n);
}
static int cpu_stream_init(ff_stream *s) {
    (void)s;
    return 0;
}
static void cpu_stream_fini(ff_stream *s) { (void)s; }
static int cpu_stream_sync(ff_stream *s) {
    (void)s;
    return 0;
}
static void cpu_destroy(ff_backend *be) { free(be); }

/* ---- matrix products ----------------------------------------------------------------------- */

static void sgemm_block(ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K == 0) { /* C = beta C; cblas may treat K = 0 as an argument error */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, ta == FF_TRANS ? CblasTrans : CblasNoTrans, tb == FF_TRANS ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void ff_cpu_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr Ap, int lda,
                 ff_dptr Bp, int ldb, float beta, ff_dptr Cp, int ldc) {
    const float *A = F(Ap), *B = F(Bp);
    float *C = F(Cp);
    int nt = NT(s);
    /* Below about 1M multiply-adds (~10 us on one core) a fork/join and the second thread's
     * wake-up cost more than they save, and on a busy machine a barrier can wait for a
     * descheduled thread far longer. Decode steps of small models stay on one thread. */
    double work = (double)M * N * (K > 0 ? K : 1);
    if (nt <= 1 || work < 1048576.0) {
        sgemm_block(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Split the larger side of C. Column blocks are multiples of 16 floats so that every
     * block but the last stays aligned to OpenBLAS's register tiles. */
    int split_m = M >= N;
#pragma omp parallel num_threads(nt)
    {
        int id = omp_get_thread_num(), n = omp_get_num_threads();
        if (split_m) {
            int m0 = (int)((int64_t)M * id / n), m1 = (int)((int64_t)M * (id + 1) / n);
            const float *Ab = ta == FF_NO_TRANS ? A + (size_t)m0 * lda : A + m0;
            sgemm_block(ta, tb, m1 - m0, N, K, alpha, Ab, lda, B, ldb, beta, C + (size_t)m0 * ldc, ldc);
        } else {
            int blocks = (N + 15) / 16;
            int n0 = (int)((int64_t)blocks * id / n) * 16, n1 = (int)((int64_t)blocks * (id + 1) / n) * 16;
            if (n1 > N) n1 = N;
            const float *Bb = tb == FF_NO_TRANS ? B + n0 : B + (size_t)n0 * ldb;
            sgemm_block(ta, tb, M, n1 - n0, K, alpha, A, lda, Bb, ldb, beta, C + n0, ldc);
        }
    }
}

/* ---- the table ----------------------------------------------------------------------------- */

static const ff_backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .h2d = cpu_h2d,
    .d2h = cpu_d2h,
    .d2d = cpu_d2d,
    .memset0 = cpu_memset0,
    .stream_init = cpu_stream_init,
    .stream_fini = cpu_stream_fini,
    .stream_sync = cpu_stream_sync,
    .destroy = cpu_destroy,
    .gemm = ff_cpu_gemm,
    .embedding_fwd = ff_cpu_embedding_fwd,
    .embedding_bwd = ff_cpu_embedding_bwd,
    .rmsnorm_fwd = ff_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = ff_cpu_rmsnorm_bwd,
    .rope = ff_cpu_rope,
    .bias_add = ff_cpu_bias_add,
    .bias_bwd = ff_cpu_bias_bwd,
    .swiglu_fwd = ff_cpu_swiglu_fwd,
    .swiglu_bwd = ff_cpu_swiglu_bwd,
    .attention_fwd = ff_cpu_attention_fwd,
    .attention_bwd = ff_cpu_attention_bwd,
    .attention_cached = ff_cpu_attention_cached,
    .scatter_rows = ff_cpu_scatter_rows,
    .gather_rows = ff_cpu_gather_rows,
    .logprob_fwd = ff_cpu_logprob_fwd,
    .logprob_bwd = ff_cpu_logprob_bwd,
    .add = ff_cpu_add,
    .scale = ff_cpu_scale,
    .sumsq = ff_cpu_sumsq,
    .adamw = ff_cpu_adamw,
    .sample = ff_cpu_sample,
};

ff_backend *ff_backend_cpu_new_impl(int n_threads);
ff_backend *ff_backend_cpu_new_impl(int n_threads) {
    if (n_threads == 0) {
        const char *env = getenv("FF_NUM_THREADS");
        if (env && *env) {
            char *end = NULL;
            long v = strtol(env, &end, 10);
            if (*end || v < 1 || v > 4096) {
                ff_error_set("FF_NUM_THREADS", "set a positive thread count or unset it", "invalid value '%s'", env);
                return NULL;
            }
            n_threads = (int)v;
        } else {
            n_threads = omp_get_max_threads();
        }
    }
    ff_backend *be = ff_calloc(1, sizeof *be);
    if (!be) return NULL;
    be->ops = &cpu_ops;
    be->n_threads = n_threads < 1 ? 1 : n_threads;
    snprintf(be->name, sizeof be->name, "cpu");
    openblas_set_num_threads(1);
    return be;
}
