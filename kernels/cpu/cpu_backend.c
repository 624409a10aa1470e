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
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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

/* Batch invariance. OpenBLAS computes X W^T (A not transposed, B transposed: every linear's
 * forward, W stored [out, in]) of few rows with its small-matrix kernel and of more rows with
 * its blocked kernel, and the two round differently (0.3.21 here: with K = 64 inner and N =
 * 64 out, 1-18 rows against 19 or more; N = 256: 1-4). Within each kernel a row of C does not
 * depend on how many rows share the product, nor on the column block. So without care a row
 * rounds by its company: a decode step's by the batch, a prefill's by the prompts packed with
 * it, a block's by the thread split, and two runs whose subtasks arrived in another order
 * sample other tokens where a draw falls near a boundary. Here every X W^T block takes the
 * blocked kernel: one of fewer rows than the least that takes it is padded with zero rows up
 * to that count in scratch. The count is probed once per (N, K) shape (blocked_rows). Heads
 * of fewer than 16 outputs are dot products of a fixed order instead (narrow_nt).
 * The other layouts (X W, X^T Y) were measured row-invariant at every size and pass through.
 * FF_BATCH_INVARIANT=0 turns the padding off (a tiny model's decode step costs 1.3x with it,
 * bench_model; from hidden sizes of a few hundred the blocked kernel starts at 2-3 rows).
 * tests/kernels/test_gemm_invariant.c holds both facts. */

enum { MAX_SHAPES = 256 };
typedef struct shape_rows {
    int N, K, rows;
} shape_rows;
static shape_rows shapes[MAX_SHAPES];
static _Atomic int n_shapes; /* entries [0, n_shapes) are complete: readers take no lock */
static pthread_mutex_t shapes_lock = PTHREAD_MUTEX_INITIALIZER;

static void fill_probe(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
}

/* The least M in [1, R] whose rows of A W^T equal, bit for bit, those of the product of R
 * rows (R rows: the blocked kernel for every shape measured; R = 256 or fewer where that
 * costs over 2^26 multiply-adds). Regimes are by size, so the rows that match form a range
 * [m, R], found by bisection. 1 where memory runs out: no padding, as before. */
static int probe_rows(int N, int K) {
    double nk = (double)N * K;
    int R = nk * 256 <= 67108864.0 ? 256 : (int)(67108864.0 / nk);
    if (R < 2) R = 2;
    float *A = malloc(sizeof(float) * ((size_t)R * K + (size_t)N * K + 2 * (size_t)R * N));
    if (!A) return 1;
    float *W = A + (size_t)R * K, *ref = W + (size_t)N * K, *C = ref + (size_t)R * N;
    fill_probe(A, (size_t)R * K, 1);
    fill_probe(W, (size_t)N * K, 2);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, N, K, 1.0f, A, K, W, K, 0.0f, ref, N);
    int lo = 1, hi = R;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mid, N, K, 1.0f, A, K, W, K, 0.0f, C, N);
        if (memcmp(C, ref, sizeof(float) * (size_t)mid * N) == 0) hi = mid;
        else lo = mid + 1;
    }
    free(A);
    return hi;
}

static int find_rows(int N, int K) {
    int n = atomic_load_explicit(&n_shapes, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (shapes[i].N == N && shapes[i].K == K) return shapes[i].rows;
    return 0;
}

/* Every product asks: a known shape costs a scan without a lock; a new one is probed under it
 * (another thread may have added it meanwhile). */
static int blocked_rows(int N, int K) {
    int rows = find_rows(N, K);
    if (rows) return rows;
    pthread_mutex_lock(&shapes_lock);
    rows = find_rows(N, K);
    if (!rows) {
        rows = probe_rows(N, K);
        int n = atomic_load_explicit(&n_shapes, memory_order_relaxed);
        if (n < MAX_SHAPES) {
            shapes[n] = (shape_rows){N, K, rows};
            atomic_store_explicit(&n_shapes, n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&shapes_lock);
    return rows;
}

int ff_cpu_gemm_blocked_rows(int N, int K) { return N > 0 && K > 0 ? blocked_rows(N, K) : 1; }

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

/* A W^T of fewer than 16 outputs (a value or score head: N = 1): OpenBLAS's edge kernels
 * round such rows by the row count in no monotone way (N = 1, 2, 3, 5 measured), so these
 * are dot products of one fixed order here. They cost T K N multiply-adds, next to nothing. */
enum { NARROW = 16 };
FF_VEC static void narrow_nt(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                             float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float *a = A + (size_t)i * lda, *b = B + (size_t)j * ldb;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int k = 0; k < K; k++) s += a[k] * b[k];
            float *c = C + (size_t)i * ldc + j;
            *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
        }
}

/* One block of C, [M, N]. pad > M (X W^T only): the rows go through `scratch` ([pad, K] of A
 * then [pad, N] of C, floats) as pad rows, the rest zero, so the blocked kernel rounds them. */
static void sgemm_padded(ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc, int pad, float *scratch) {
    if (pad <= M || K == 0 || M <= 0 || N <= 0) {
        sgemm_block(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    float *Ap = scratch, *Cp = scratch + (size_t)pad * K;
    for (int i = 0; i < M; i++) memcpy(Ap + (size_t)i * K, A + (size_t)i * lda, sizeof(float) * (size_t)K);
    memset(Ap + (size_t)M * K, 0, sizeof(float) * (size_t)(pad - M) * K);
    if (beta != 0.0f)
        for (int i = 0; i < M; i++) memcpy(Cp + (size_t)i * N, C + (size_t)i * ldc, sizeof(float) * (size_t)N);
    sgemm_block(ta, tb, pad, N, K, alpha, Ap, K, B, ldb, beta, Cp, N);
    for (int i = 0; i < M; i++) memcpy(C + (size_t)i * ldc, Cp + (size_t)i * N, sizeof(float) * (size_t)N);
}

typedef struct gemm_job {
    ff_trans ta, tb;
    int M, N, K, lda, ldb, ldc, split_m, blk, nblk;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int pad[2];     /* rows to pad a block to: [0] a block of blk columns, [1] the last (split_m: 0) */
    float *scratch; /* nblk regions of `region` floats each, where a block pads */
    size_t region;
} gemm_job;

/* Blocks are blk wide, the last one takes the remainder as well (blk to 2 blk - 1), so no
 * block is a sliver that rounds otherwise. */
static void gemm_chunk(void *arg, int64_t i) {
    const gemm_job *g = arg;
    int side = g->split_m ? g->M : g->N;
    int lo = (int)i * g->blk, hi = i == g->nblk - 1 ? side : lo + g->blk;
    float *scr = g->scratch ? g->scratch + (size_t)i * g->region : NULL;
    if (g->split_m) {
        const float *Ab = g->ta == FF_NO_TRANS ? g->A + (size_t)lo * g->lda : g->A + lo;
        sgemm_padded(g->ta, g->tb, hi - lo, g->N, g->K, g->alpha, Ab, g->lda, g->B, g->ldb, g->beta,
                     g->C + (size_t)lo * g->ldc, g->ldc, g->pad[0], scr);
    } else {
        const float *Bb = g->tb == FF_NO_TRANS ? g->B + lo : g->B + (size_t)lo * g->ldb;
        sgemm_padded(g->ta, g->tb, g->M, hi - lo, g->K, g->alpha, g->A, g->lda, Bb, g->ldb, g->beta, g->C + lo,
                     g->ldc, g->pad[i == g->nblk - 1], scr);
    }
}

void ff_cpu_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr Ap, int lda,
                 ff_dptr Bp, int ldb, float beta, ff_dptr Cp, int ldc) {
    const float *A = F(Ap), *B = F(Bp);
    float *C = F(Cp);
    if (M <= 0 || N <= 0) return;
    int nt = NT(s);
    bool pads = ((cpu_impl *)s->be->impl)->invariant && ta == FF_NO_TRANS && tb == FF_TRANS && K > 0;
    if (pads && N < NARROW) {
        narrow_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    gemm_job g = {ta, tb, M, N, K, lda, ldb, ldc, M >= N, 0, 1, alpha, beta, A, B, C, {0, 0}, NULL, 0};
    /* Below about 1M multiply-adds (~10 us on one core) splitting costs more than it saves:
     * decode steps of small models stay on one thread. Otherwise split the larger side of C
     * into up to 2 blocks per thread, claimed dynamically: rows in blocks of at least 16 (and
     * at least the blocked kernel's rows), columns in multiples of 16 floats (OpenBLAS's tiles). */
    double work = (double)M * N * (K > 0 ? K : 1);
    if (nt <= 1 || work < 1048576.0) {
        g.split_m = 1, g.blk = M;
        if (pads) g.pad[0] = blocked_rows(N, K);
    } else {
        int side = g.split_m ? M : N, nb = 2 * nt;
        int blk = (side + nb - 1) / nb;
        blk = (blk + 15) / 16 * 16;
        if (blk < 16) blk = 16;
        if (g.split_m && pads) {
            g.pad[0] = blocked_rows(N, K);
            if (blk < g.pad[0]) blk = g.pad[0];
        }
        g.blk = blk < side ? blk : side;
        g.nblk = side / g.blk;
        if (pads && !g.split_m) {
            g.pad[0] = blocked_rows(g.blk, K);
            g.pad[1] = blocked_rows(N - (g.nblk - 1) * g.blk, K);
        }
    }
    int most = g.pad[0] > g.pad[1] ? g.pad[0] : g.pad[1];
    if (most > (g.split_m ? (g.nblk == 1 ? M : g.blk) : M)) {
        int wide = g.split_m ? N : N - (g.nblk - 1) * g.blk; /* the widest block */
        g.region = (size_t)most * ((size_t)K + (size_t)wide);
        g.scratch = ff_cpu_scratch(s, sizeof(float) * g.region * (size_t)g.nblk);
        if (!g.scratch) return; /* the stream has failed with the message */
    }
    if (g.nblk == 1) gemm_chunk(&g, 0);
    else ff_pool_run(POOL(s), g.nblk, gemm_chunk, &g);
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
    const char *inv = getenv("FF_BATCH_INVARIANT");
    if (inv && *inv && strcmp(inv, "0") && strcmp(inv, "1")) {
        ff_error_set("FF_BATCH_INVARIANT", "set 1 (the default: rows round alike whatever the batch) or 0 (OpenBLAS as it is)",
                     "invalid value '%s'", inv);
        cpu_destroy(be);
        return NULL;
    }
    c->invariant = !inv || !*inv || !strcmp(inv, "1");
    c->pool = ff_pool_new(be->n_threads);
    if (!c->pool) {
        cpu_destroy(be);
        return NULL;
    }
    openblas_set_num_threads(1);
    return be;
}
