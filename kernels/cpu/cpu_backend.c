/* The CPU backend: host memory as "device" memory, synchronous streams, matrix products
 * through OpenBLAS, the other kernels in the cpu_*.c files beside this one.
 *
 * Threads: OpenBLAS is set to one thread and every product is split into row or column
 * blocks run by this backend's thread pool (cpu_pool.c), one single-threaded cblas_sgemm
 * per block. Debian's default OpenBLAS is the pthreads build; letting it run its own
 * threads beside ours makes two pools spin for the same cores. One pool, ours, avoids that,
 * and the split costs nothing measurable at our shapes (bench/bench_model.c prints sgemm
 * alone). openblas_set_num_threads is process-wide: anything else in the process that calls
 * OpenBLAS gets one thread too. */
#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/util.h"
#include "kernels/cpu/cpu_internal.h"

/* ---- memory and streams -------------------------------------------------------------------- */

/* Buffers are zeroed by calloc, not by a memset after posix_memalign: a large block comes
 * from fresh mapped pages that the C library does not clear, so its pages become resident
 * when first written. A KV cache sized for the longest sequence, workspaces and the
 * parameters while they are copied in cost what they hold, not what they could. The data
 * starts 64-byte aligned inside the block, which is found again through the pointer stored
 * just before it. */
static int cpu_alloc(ff_backend *be, size_t bytes, void **data) {
    (void)be;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    char *block = rounded <= SIZE_MAX - 64 ? calloc(1, rounded + 64) : NULL;
    if (!block) {
        return ff_error_set("cpu backend", "use a smaller model or batch", "out of memory allocating %zu bytes",
                            bytes);
    }
    char *p = block + 64 - (uintptr_t)block % 64; /* >= block + 16: room for the pointer */
    ((void **)p)[-1] = block;
    *data = p;
    return 0;
}
static void cpu_free(ff_backend *be, void *data) {
    (void)be;
    if (data) free(((void **)data)[-1]);
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
static void cpu_destroy(ff_backend *be) {
    cpu_impl *c = be->impl;
    if (c) {
        ff_pool_destroy(&c->pool);
        free(c->scratch);
        free(c);
    }
    free(be);
}

void *ff_cpu_scratch(ff_stream *s, size_t bytes) {
    cpu_impl *c = s->be->impl;
    if (bytes > c->scratch_cap) {
        free(c->scratch);
        c->scratch_cap = 0;
        c->scratch = malloc(bytes);
        if (!c->scratch) {
            ff_error_set("cpu backend", "use smaller batches (fewer sequences or tokens)",
                         "out of memory for %zu bytes of kernel scratch", bytes);
            ff_stream_fail(s);
            return NULL;
        }
        c->scratch_cap = bytes;
    }
    return c->scratch;
}

typedef struct range_job {
    ff_range_fn fn;
    void *ctx;
    int64_t n, per;
} range_job;

static void range_chunk(void *arg, int64_t i) {
    const range_job *j = arg;
    int64_t i0 = i * j->per, i1 = i0 + j->per < j->n ? i0 + j->per : j->n;
    j->fn(j->ctx, i0, i1);
}

void ff_cpu_for(ff_stream *s, int64_t n, double work_per_item, ff_range_fn fn, void *ctx) {
    if (n <= 0) return;
    int nt = NT(s);
    if (nt <= 1 || (double)n * work_per_item < FF_PAR_MIN) {
        fn(ctx, 0, n);
        return;
    }
    int64_t per = (int64_t)ceil(FF_CHUNK_WORK / (work_per_item > 0 ? work_per_item : 1.0));
    if (per < 1) per = 1;
    int64_t most = 4 * (int64_t)nt;
    if ((n + per - 1) / per > most) per = (n + most - 1) / most;
    range_job j = {fn, ctx, n, per};
    ff_pool_run(POOL(s), (n + per - 1) / per, range_chunk, &j);
}

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

typedef struct gemm_job {
    ff_trans ta, tb;
    int M, N, K, lda, ldb, ldc, split_m, blk;
    float alpha, beta;
    const float *A, *B;
    float *C;
} gemm_job;

static void gemm_chunk(void *arg, int64_t i) {
    const gemm_job *g = arg;
    if (g->split_m) {
        int m0 = (int)i * g->blk, m1 = m0 + g->blk < g->M ? m0 + g->blk : g->M;
        const float *Ab = g->ta == FF_NO_TRANS ? g->A + (size_t)m0 * g->lda : g->A + m0;
        sgemm_block(g->ta, g->tb, m1 - m0, g->N, g->K, g->alpha, Ab, g->lda, g->B, g->ldb, g->beta,
                    g->C + (size_t)m0 * g->ldc, g->ldc);
    } else {
        int n0 = (int)i * g->blk, n1 = n0 + g->blk < g->N ? n0 + g->blk : g->N;
        const float *Bb = g->tb == FF_NO_TRANS ? g->B + n0 : g->B + (size_t)n0 * g->ldb;
        sgemm_block(g->ta, g->tb, g->M, n1 - n0, g->K, g->alpha, g->A, g->lda, Bb, g->ldb, g->beta, g->C + n0, g->ldc);
    }
}

void ff_cpu_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr Ap, int lda,
                 ff_dptr Bp, int ldb, float beta, ff_dptr Cp, int ldc) {
    const float *A = F(Ap), *B = F(Bp);
    float *C = F(Cp);
    int nt = NT(s);
    /* Below about 1M multiply-adds (~10 us on one core) splitting costs more than it saves:
     * decode steps of small models stay on one thread. */
    double work = (double)M * N * (K > 0 ? K : 1);
    if (nt <= 1 || work < 1048576.0) {
        sgemm_block(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Split the larger side of C into up to 2 blocks per thread, claimed dynamically: rows
     * in blocks of at least 16, columns in multiples of 16 floats (OpenBLAS's tiles). */
    gemm_job g = {ta, tb, M, N, K, lda, ldb, ldc, M >= N, 0, alpha, beta, A, B, C};
    int side = g.split_m ? M : N, nb = 2 * nt;
    int blk = (side + nb - 1) / nb;
    blk = (blk + 15) / 16 * 16;
    if (blk < 16) blk = 16;
    g.blk = blk;
    ff_pool_run(POOL(s), (side + blk - 1) / blk, gemm_chunk, &g);
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
            cpu_set_t set;
            n_threads = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        }
    }
    ff_backend *be = ff_calloc(1, sizeof *be);
    cpu_impl *c = ff_calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return NULL;
    }
    be->ops = &cpu_ops;
    be->impl = c;
    be->n_threads = n_threads < 1 ? 1 : n_threads;
    snprintf(be->name, sizeof be->name, "cpu");
    c->pool = ff_pool_new(be->n_threads);
    if (!c->pool) {
        cpu_destroy(be);
        return NULL;
    }
    openblas_set_num_threads(1);
    return be;
}
