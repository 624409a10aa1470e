/* The CPU backend: host memory as "device" memory, synchronous streams, matrix products
 * through OpenBLAS (or, for batch invariance where its kernels cannot give it, the fixed-order
 * product of cpu_gemm_fixed.c), the other kernels in the cpu_*.c files beside this one.
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

/* Batch invariance. Without care a row of X W^T (every linear's forward) rounds by its
 * company: a decode step's by the batch, a prefill's by the prompts packed with it, a
 * block's by the thread split, and two runs whose subtasks arrived in another order sample
 * other tokens where a draw falls near a boundary. Three facts of OpenBLAS's kernels (0.3.21)
 * cause it, all measured:
 * - Small products. X W^T of few rows takes a small-matrix kernel on some CPUs (SkylakeX:
 *   with K = 64 inner and N = 64 out, 1-18 rows against 19 or more; N = 256: 1-4).
 * - Row tails. The blocked kernel computes C in tiles of a few rows, and the rows of a last,
 *   partial tile go through edge kernels that round otherwise.
 * - Places in a tile. With the Haswell/Zen kernels (12-row tiles) a row rounds by its place
 *   in its tile too: a product whose rows start one row further down differs in every row.
 * Where OpenBLAS's rows depend only on the first two (probe_unit finds a tile, the "unit",
 * with no place effect: 1 with the SkylakeX and Sandybridge kernels), every block of X W^T
 * is padded with zero rows in scratch to a multiple of the unit and to at least the floor of
 * its shape (probe_floor, once per (N, K)), where the blocked kernel starts. Where not (Zen,
 * Haswell), X W^T is the fixed-order product of cpu_gemm_fixed.c, whose rows depend on
 * nothing but themselves. Heads of fewer than 16 outputs are dot products of a fixed order
 * (narrow_nt). The backward's layouts (X W for dX, X^T W for weight gradients) pass through:
 * nothing needs their rows invariant. FF_BATCH_INVARIANT=0 turns all of it off, =fixed takes
 * the fixed-order product everywhere. tests/kernels/test_gemm_invariant.c holds these facts;
 * bench_model prints the cost. */

enum { MAX_SHAPES = 256 };
typedef struct shape_rows {
    int N, K, rows;
} shape_rows;
static shape_rows shapes[MAX_SHAPES];
static _Atomic int n_shapes; /* entries [0, n_shapes) are complete: readers take no lock */
static _Atomic int row_unit; /* unit_rows() + 1; 0 until probed */
static pthread_mutex_t shapes_lock = PTHREAD_MUTEX_INITIALIZER;

static void fill_probe(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
}

static int round_up(int n, int unit) { return (n + unit - 1) / unit * unit; }

/* C [M, N] = A [M, K] W^T, W [N, K]: the probes' product. */
static void probe_product(int M, int N, int K, const float *A, const float *W, float *C) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N);
}

/* The least unit U (of the tiles kernels use) such that, for every M in [64, 160], the first M
 * rows of the product of round_up(M, U) rows equal those of the product of 192 (a multiple of
 * every candidate), and so do 96 rows that start 1-15 rows further down (a row's place in its
 * tile must not count either: it does with the Haswell/Zen kernels). 64 rows and more are past
 * every small-matrix regime measured at this shape (N = K = 64), so only the tiles are seen.
 * 0 where none passes: OpenBLAS's rows are not invariant here. 1 where memory runs out. */
static int probe_unit(void) {
    static const int candidates[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
    enum { N = 64, K = 64, REF = 192, LO = 64, HI = 160, SHIFTED = 96, SHIFTS = 15 };
    float *A = malloc(sizeof(float) * ((size_t)REF * K + (size_t)N * K + 2 * (size_t)REF * N));
    if (!A) return 1;
    float *W = A + (size_t)REF * K, *ref = W + (size_t)N * K, *C = ref + (size_t)REF * N;
    fill_probe(A, (size_t)REF * K, 3);
    fill_probe(W, (size_t)N * K, 4);
    probe_product(REF, N, K, A, W, ref);
    int unit = 0;
    for (size_t u = 0; u < sizeof candidates / sizeof candidates[0] && !unit; u++) {
        int U = candidates[u], ok = 1;
        for (int M = LO; M <= HI && ok; M++) {
            probe_product(round_up(M, U), N, K, A, W, C);
            ok = memcmp(C, ref, sizeof(float) * (size_t)M * N) == 0;
        }
        for (int sh = 1; sh <= SHIFTS && ok; sh++) {
            probe_product(round_up(SHIFTED, U), N, K, A + (size_t)sh * K, W, C);
            ok = memcmp(C, ref + (size_t)sh * N, sizeof(float) * (size_t)SHIFTED * N) == 0;
        }
        if (ok) unit = U;
    }
    free(A);
    return unit;
}

/* The least M in [1, R] whose rows of A W^T, padded to the unit, equal bit for bit those of
 * the product of R rows (R: 256 rounded down to the unit, fewer where that costs over 2^26
 * multiply-adds). Regimes are by size, so the rows that match form a range [m, R], found by
 * bisection. 1 where memory runs out: no floor, the unit alone. */
static int probe_floor(int N, int K, int unit) {
    double nk = (double)N * K;
    int R = nk * 256 <= 67108864.0 ? 256 : (int)(67108864.0 / nk);
    R = R / unit * unit;
    if (R < unit) R = unit;
    float *A = malloc(sizeof(float) * ((size_t)R * K + (size_t)N * K + 2 * (size_t)R * N));
    if (!A) return 1;
    float *W = A + (size_t)R * K, *ref = W + (size_t)N * K, *C = ref + (size_t)R * N;
    fill_probe(A, (size_t)R * K, 1);
    fill_probe(W, (size_t)N * K, 2);
    probe_product(R, N, K, A, W, ref);
    int lo = 1, hi = R;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        probe_product(round_up(mid, unit), N, K, A, W, C);
        if (memcmp(C, ref, sizeof(float) * (size_t)mid * N) == 0) hi = mid;
        else lo = mid + 1;
    }
    free(A);
    return hi;
}

/* The row unit, or 0 where OpenBLAS's rows are not invariant (the fixed-order products of
 * cpu_gemm_fixed.c are used instead). Stored as unit + 1: 0 is "not probed yet". */
static int unit_rows(void) {
    int stored = atomic_load_explicit(&row_unit, memory_order_acquire);
    if (stored) return stored - 1;
    pthread_mutex_lock(&shapes_lock);
    stored = atomic_load_explicit(&row_unit, memory_order_relaxed);
    if (!stored) {
        stored = probe_unit() + 1;
        atomic_store_explicit(&row_unit, stored, memory_order_release);
    }
    pthread_mutex_unlock(&shapes_lock);
    return stored - 1;
}

static int find_rows(int N, int K) {
    int n = atomic_load_explicit(&n_shapes, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (shapes[i].N == N && shapes[i].K == K) return shapes[i].rows;
    return 0;
}

/* Every X W^T asks: a known shape costs a scan without a lock; a new one is probed under it
 * (another thread may have added it meanwhile). */
static int floor_rows(int N, int K) {
    int rows = find_rows(N, K);
    if (rows) return rows;
    int unit = unit_rows();
    if (unit < 1) return 1; /* the fixed-order products: no floor */
    pthread_mutex_lock(&shapes_lock);
    rows = find_rows(N, K);
    if (!rows) {
        rows = probe_floor(N, K, unit);
        int n = atomic_load_explicit(&n_shapes, memory_order_relaxed);
        if (n < MAX_SHAPES) {
            shapes[n] = (shape_rows){N, K, rows};
            atomic_store_explicit(&n_shapes, n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&shapes_lock);
    return rows;
}

int ff_cpu_gemm_floor_rows(int N, int K) { return N > 0 && K > 0 ? floor_rows(N, K) : 1; }
int ff_cpu_gemm_row_unit(void) { return unit_rows(); }

/* The rows a block of M rows is computed as: a multiple of the unit, at least the floor. */
static int padded_rows(int M, int unit, int floor) {
    int rows = round_up(M, unit);
    return rows > floor ? rows : floor;
}

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

/* One block of C = A B^T, [M, N]. rows > M: the rows go through `scratch` ([rows, K]
 * of A then [rows, N] of C, floats) as `rows` rows, the rest zero, so that the kernel tiles
 * them as it tiles every other block. */
static void sgemm_padded(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                         float beta, float *C, int ldc, int rows, float *scratch) {
    if (rows <= M || K == 0 || M <= 0 || N <= 0) {
        sgemm_block(FF_NO_TRANS, FF_TRANS, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    float *Ap = scratch, *Cp = scratch + (size_t)rows * K;
    for (int i = 0; i < M; i++) memcpy(Ap + (size_t)i * K, A + (size_t)i * lda, sizeof(float) * (size_t)K);
    memset(Ap + (size_t)M * K, 0, sizeof(float) * (size_t)(rows - M) * K);
    if (beta != 0.0f)
        for (int i = 0; i < M; i++) memcpy(Cp + (size_t)i * N, C + (size_t)i * ldc, sizeof(float) * (size_t)N);
    sgemm_block(FF_NO_TRANS, FF_TRANS, rows, N, K, alpha, Ap, K, B, ldb, beta, Cp, N);
    for (int i = 0; i < M; i++) memcpy(C + (size_t)i * ldc, Cp + (size_t)i * N, sizeof(float) * (size_t)N);
}

/* C is cut into a grid of blocks, one product each: row blocks of rb rows (the thread split)
 * and column blocks of cb columns; the last block of each kind takes the remainder as well
 * (rb to 2 rb - 1), so none is a sliver. How C is computed (the kind):
 * - GEMM_PLAIN: OpenBLAS as it is (FF_BATCH_INVARIANT=0, and the backward's layouts).
 * - GEMM_PADDED: OpenBLAS, rows padded to the unit (and the floor). Rows are invariant, so
 *   any split of them is, and rb is a multiple of the unit so that only the last row block
 *   pads (it has a scratch region per column block). Column blocks are not invariant (a
 *   block boundary changes the columns around it, measured up to 16 on Zen), so they are a
 *   function of N alone (INV_COLS wide) and every product of N columns cuts them alike.
 * - GEMM_FIXED: the fixed-order product, where OpenBLAS's rows are not invariant (or
 *   FF_BATCH_INVARIANT=fixed): any split gives the same C. */
enum { INV_COLS = 128 };
typedef enum gemm_kind { GEMM_PLAIN, GEMM_PADDED, GEMM_FIXED } gemm_kind;
typedef struct gemm_job {
    ff_trans ta, tb;
    gemm_kind kind;
    int M, N, K, lda, ldb, ldc;
    int rb, nrb, cb, ncb;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int unit;       /* GEMM_PADDED: rows are padded to a multiple of it */
    int floor[2];   /* and to at least: [0] a block of cb columns, [1] the last column block */
    float *scratch; /* ncb regions of `region` floats each, where the last row block pads */
    size_t region;
} gemm_job;

static void gemm_chunk(void *arg, int64_t i) {
    const gemm_job *g = arg;
    int ri = (int)(i / g->ncb), ci = (int)(i % g->ncb);
    int r0 = ri * g->rb, r1 = ri == g->nrb - 1 ? g->M : r0 + g->rb;
    int c0 = ci * g->cb, c1 = ci == g->ncb - 1 ? g->N : c0 + g->cb;
    int M = r1 - r0, N = c1 - c0;
    const float *Ab = g->ta == FF_NO_TRANS ? g->A + (size_t)r0 * g->lda : g->A + r0;
    const float *Bb = g->tb == FF_NO_TRANS ? g->B + c0 : g->B + (size_t)c0 * g->ldb;
    float *Cb = g->C + (size_t)r0 * g->ldc + c0;
    if (g->kind == GEMM_FIXED) {
        ff_cpu_gemm_fixed_nt(M, N, g->K, g->alpha, Ab, g->lda, Bb, g->ldb, g->beta, Cb, g->ldc);
    } else if (g->kind == GEMM_PLAIN) {
        sgemm_block(g->ta, g->tb, M, N, g->K, g->alpha, Ab, g->lda, Bb, g->ldb, g->beta, Cb, g->ldc);
    } else {
        float *scr = g->scratch && ri == g->nrb - 1 ? g->scratch + (size_t)ci * g->region : NULL;
        int rows = padded_rows(M, g->unit, g->floor[ci == g->ncb - 1]);
        sgemm_padded(M, N, g->K, g->alpha, Ab, g->lda, Bb, g->ldb, g->beta, Cb, g->ldc, scr ? rows : M, scr);
    }
}

void ff_cpu_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr Ap, int lda,
                 ff_dptr Bp, int ldb, float beta, ff_dptr Cp, int ldc) {
    const float *A = F(Ap), *B = F(Bp);
    float *C = F(Cp);
    if (M <= 0 || N <= 0) return;
    int nt = NT(s);
    ff_cpu_invariance inv = ((cpu_impl *)s->be->impl)->invariance;
    gemm_kind kind = GEMM_PLAIN;
    int unit = 1;
    if (inv != FF_CPU_INVARIANT_OFF && ta == FF_NO_TRANS && tb == FF_TRANS && K > 0) {
        if (N < NARROW) {
            narrow_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
        unit = inv == FF_CPU_INVARIANT_FIXED ? 0 : unit_rows();
        kind = unit ? GEMM_PADDED : GEMM_FIXED;
    }
    bool floors = kind == GEMM_PADDED;
    gemm_job g = {ta, tb, kind, M, N, K, lda, ldb, ldc, M, 1, N, 1, alpha, beta, A, B, C, unit ? unit : 1,
                  {1, 1}, NULL, 0};
    /* Below about 1M multiply-adds (~10 us on one core) splitting costs more than it saves:
     * decode steps of small models stay on one thread. Otherwise aim at 2 blocks per thread,
     * claimed dynamically: the larger side of C is split, rows in blocks of at least 16 (for
     * GEMM_PADDED a multiple of the unit, at least the floor), columns in multiples of 16
     * floats (OpenBLAS's tiles); for GEMM_PADDED the columns are cut alike whatever the
     * threads. */
    double work = (double)M * N * (K > 0 ? K : 1);
    bool split = nt > 1 && work >= 1048576.0;
    if (kind == GEMM_PADDED) g.cb = N < 2 * INV_COLS ? N : INV_COLS;
    else if (split && M < N) g.cb = round_up((N + 2 * nt - 1) / (2 * nt), 16);
    if (g.cb > N) g.cb = N;
    g.ncb = N / g.cb;
    if (floors) {
        g.floor[0] = floor_rows(g.cb, K);
        g.floor[1] = floor_rows(N - (g.ncb - 1) * g.cb, K);
    }
    int fl = g.floor[0] > g.floor[1] ? g.floor[0] : g.floor[1];
    if (split && (M >= N || g.ncb < 2 * nt)) {
        int want = (2 * nt + g.ncb - 1) / g.ncb; /* row blocks */
        int rb = round_up(round_up((M + want - 1) / want, 16), g.unit);
        if (rb < fl) rb = fl;
        g.rb = rb < M ? rb : M;
        g.nrb = M / g.rb;
    }
    int last = M - (g.nrb - 1) * g.rb; /* rows of the last row block */
    int most = padded_rows(last, g.unit, fl);
    if (kind == GEMM_PADDED && most > last) {
        int wide = N - (g.ncb - 1) * g.cb; /* the widest column block: the last */
        g.region = (size_t)most * ((size_t)K + (size_t)wide);
        g.scratch = ff_cpu_scratch(s, sizeof(float) * g.region * (size_t)g.ncb);
        if (!g.scratch) return; /* the stream has failed with the message */
    }
    int chunks = g.nrb * g.ncb;
    if (chunks == 1 || !split) {
        for (int i = 0; i < chunks; i++) gemm_chunk(&g, i);
    } else {
        ff_pool_run(POOL(s), chunks, gemm_chunk, &g);
    }
}

/* ff_gemm_bf16w: the fixed-order product over bf16 weights (cpu_gemm_fixed.c), whose every
 * element is computed alike whatever block it falls in, so any split is batch invariant. C is
 * cut into column blocks of whole panels (the larger side when rows are few) and row blocks
 * of 16, about 2 blocks per thread, as ff_cpu_gemm cuts its products. */
typedef struct gemm16_job {
    int M, N, K, lda, ldw, ldc, rb, nrb, cb, ncb;
    float beta;
    const float *A;
    const uint16_t *W;
    float *C;
} gemm16_job;

static void gemm16_chunk(void *arg, int64_t i) {
    const gemm16_job *g = arg;
    int ri = (int)(i / g->ncb), ci = (int)(i % g->ncb);
    int r0 = ri * g->rb, r1 = ri == g->nrb - 1 ? g->M : r0 + g->rb;
    int c0 = ci * g->cb, c1 = ci == g->ncb - 1 ? g->N : c0 + g->cb;
    ff_cpu_gemm_fixed_nt_bf16(r1 - r0, c1 - c0, g->K, g->A + (size_t)r0 * g->lda, g->lda, g->W + (size_t)c0 * g->ldw,
                              g->ldw, g->beta, g->C + (size_t)r0 * g->ldc + c0, g->ldc);
}

void ff_cpu_gemm_bf16w(ff_stream *s, int M, int N, int K, ff_dptr Ap, int lda, ff_dptr Wp, int ldw, float beta,
                       ff_dptr Cp, int ldc) {
    gemm16_job g = {M, N, K, lda, ldw, ldc, M, 1, N, 1, beta, F(Ap), (const uint16_t *)(const void *)F(Wp), F(Cp)};
    const int nt = NT(s);
    const double work = (double)M * N * (K > 0 ? K : 1);
    if (nt > 1 && work >= 1048576.0) {
        const int want = 2 * nt;
        if (M < N) {
            g.cb = round_up((N + want - 1) / want, 64);
            g.ncb = g.cb < N ? N / g.cb : 1;
            if (g.ncb == 1) g.cb = N;
        }
        if (g.ncb < want) {
            int rows = round_up((M + (want / g.ncb) - 1) / (want / g.ncb), 16);
            g.rb = rows < M ? rows : M;
            g.nrb = M / g.rb;
        }
    }
    const int chunks = g.nrb * g.ncb;
    if (chunks == 1) gemm16_chunk(&g, 0);
    else ff_pool_run(POOL(s), chunks, gemm16_chunk, &g);
}

/* ff_gemm_bf16 on the CPU: the definition as a loop, for tests (the cpu backend's own products
 * are fp32, ff_backend_bf16_products). Each element of C sums bf16(a) bf16(b) over k in order in
 * fp32; rows of C are split over the pool. */
typedef struct gemmbf_job {
    ff_trans ta, tb;
    int M, N, K, lda, ldb, ldc;
    bool a16, b16, c16;
    float alpha, beta;
    const void *A, *B;
    void *C; /* fp32, or bf16 (c16: alpha 1, beta 0) */
} gemmbf_job;

/* element (r, c) of a stored matrix, as bf16 widened */
static inline float bf_at(const void *X, bool x16, int ld, int r, int c) {
    const size_t i = (size_t)r * (size_t)ld + (size_t)c;
    return x16 ? bf16_widen(((const uint16_t *)X)[i]) : bf16_widen(bf16_round(((const float *)X)[i]));
}

static void gemmbf_rows(void *arg, int64_t i) {
    const gemmbf_job *g = arg;
    const int r = (int)i;
    for (int j = 0; j < g->N; j++) {
        float acc = 0.0f;
        for (int k = 0; k < g->K; k++) {
            const float a = g->ta == FF_NO_TRANS ? bf_at(g->A, g->a16, g->lda, r, k) : bf_at(g->A, g->a16, g->lda, k, r);
            const float b = g->tb == FF_NO_TRANS ? bf_at(g->B, g->b16, g->ldb, k, j) : bf_at(g->B, g->b16, g->ldb, j, k);
            acc += a * b;
        }
        const size_t at = (size_t)r * g->ldc + j;
        if (g->c16) {
            ((uint16_t *)g->C)[at] = bf16_round(acc);
            continue;
        }
        float *c = (float *)g->C + at;
        *c = g->beta == 0.0f ? g->alpha * acc : g->alpha * acc + g->beta * *c;
    }
}

static void cpu_gemm_bf16(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, bool a16,
                          int lda, ff_dptr B, bool b16, int ldb, float beta, ff_dptr C, bool c16, int ldc) {
    gemmbf_job g = {ta, tb, M, N, K, lda, ldb, ldc, a16, b16, c16, alpha, beta, F(A), F(B), F(C)};
    if (NT(s) > 1 && (double)M * N * (K > 0 ? K : 1) >= 65536.0) ff_pool_run(POOL(s), M, gemmbf_rows, &g);
    else
        for (int r = 0; r < M; r++) gemmbf_rows(&g, r);
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
    .gemm_bf16w = ff_cpu_gemm_bf16w,
    .gemm_bf16 = cpu_gemm_bf16,
    .embedding_fwd_bf16 = ff_cpu_embedding_fwd_bf16,
    .cast_f32_bf16 = ff_cpu_cast_f32_bf16,
    .cast_bf16_f32 = ff_cpu_cast_bf16_f32,
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
    .attention_cached_bf16 = ff_cpu_attention_cached_bf16,
    .scatter_rows_bf16 = ff_cpu_scatter_rows_bf16,
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
    if (!inv || !*inv || !strcmp(inv, "1")) {
        c->invariance = FF_CPU_INVARIANT_ON;
    } else if (!strcmp(inv, "0")) {
        c->invariance = FF_CPU_INVARIANT_OFF;
    } else if (!strcmp(inv, "fixed")) {
        c->invariance = FF_CPU_INVARIANT_FIXED;
    } else {
        ff_error_set("FF_BATCH_INVARIANT",
                     "set 1 (the default: rows round alike whatever the batch), fixed (always the fixed-order "
                     "products) or 0 (OpenBLAS as it is)",
                     "invalid value '%s'", inv);
        cpu_destroy(be);
        return NULL;
    }
    c->pool = ff_pool_new(be->n_threads);
    if (!c->pool) {
        cpu_destroy(be);
        return NULL;
    }
    openblas_set_num_threads(1);
    return be;
}
