/* An in-process ff_model_comm for tests: the ranks of a group are threads, which meet at a
 * barrier, read each other's buffers and reduce in rank order (so an all-reduce and a
 * reduce-scatter give the same bits for the same inputs, and every rank gets the same bits).
 * Each rank counts the bytes it would send: ring all-reduce 2 (d - 1) / d of the buffer,
 * all-gather (d - 1) times its part, reduce-scatter the parts of the other ranks (a direct
 * exchange: every rank sends each owner its slice).
 *
 * Not for: mismatched calls (a mismatch aborts the test with both calls named). */
#ifndef FF_TESTS_MODEL_THREAD_COMM_H
#define FF_TESTS_MODEL_THREAD_COMM_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/model.h"
#include "tests/test_util.h"

enum { TC_MAXR = 8 };
typedef enum { TC_SUM, TC_MAX, TC_SUM64, TC_GATHER, TC_RS_V, TC_AG_V, TC_NOPS } tc_op;
static const char *const tc_op_name[TC_NOPS] = {"all-reduce sum f32", "all-reduce max f32", "all-reduce sum f64",
                                                 "all-gather f32",     "reduce-scatter-v f32", "all-gather-v f32"};

typedef struct tc_group {
    int n;
    pthread_barrier_t bar;
    const void *src[TC_MAXR];
    size_t cnt[TC_MAXR];
    const size_t *counts[TC_MAXR];
    int op[TC_MAXR];
} tc_group;

typedef struct tc_rank {
    tc_group *g;
    int rank;
    bool counting;       /* set by the rank's own thread */
    double sent;         /* bytes, while counting */
    int64_t calls[TC_NOPS];
    void *tmp;
    size_t cap;
} tc_rank;

static inline void tc_group_init(tc_group *g, int n) {
    memset(g, 0, sizeof *g);
    g->n = n;
    REQUIRE(n >= 1 && n <= TC_MAXR && pthread_barrier_init(&g->bar, NULL, (unsigned)n) == 0);
}
static inline void tc_group_destroy(tc_group *g) { pthread_barrier_destroy(&g->bar); }
static inline void tc_rank_free(tc_rank *c) {
    free(c->tmp);
    c->tmp = NULL;
    c->cap = 0;
}

static inline size_t tc_sum_counts(const tc_group *g, const size_t *counts) {
    size_t s = 0;
    for (int r = 0; r < g->n; r++) s += counts[r];
    return s;
}

/* Post src; wait for every rank; check that all called the same. Returns scratch of bytes. */
static inline void *tc_post(tc_rank *c, int op, const void *src, size_t n, const size_t *counts, size_t bytes) {
    tc_group *g = c->g;
    g->src[c->rank] = src;
    g->cnt[c->rank] = n;
    g->op[c->rank] = op;
    g->counts[c->rank] = counts;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < g->n; r++) {
        bool same = g->op[r] == op && g->cnt[r] == n;
        if (same && counts) same = !memcmp(g->counts[r], counts, (size_t)g->n * sizeof *counts);
        if (!same) {
            fprintf(stderr, "rank %d: %s of %zu, rank %d: %s of %zu: the ranks disagree\n", c->rank, tc_op_name[op], n, r,
                    tc_op_name[g->op[r]], g->cnt[r]);
            exit(1);
        }
    }
    if (bytes > c->cap) {
        c->tmp = realloc(c->tmp, bytes);
        REQUIRE(c->tmp);
        c->cap = bytes;
    }
    if (c->counting) c->calls[op]++;
    return c->tmp;
}

static inline void tc_count(tc_rank *c, double bytes) {
    if (c->counting) c->sent += bytes;
}

static inline int tc_sum(void *ctx, float *buf, size_t n) {
    tc_rank *c = ctx;
    float *o = tc_post(c, TC_SUM, buf, n, NULL, n * 4);
    for (size_t i = 0; i < n; i++) {
        float s = ((const float *)c->g->src[0])[i];
        for (int r = 1; r < c->g->n; r++) s += ((const float *)c->g->src[r])[i];
        o[i] = s;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 4);
    tc_count(c, 2.0 * (c->g->n - 1) / c->g->n * (double)n * 4);
    return 0;
}

static inline int tc_max(void *ctx, float *buf, size_t n) {
    tc_rank *c = ctx;
    float *o = tc_post(c, TC_MAX, buf, n, NULL, n * 4);
    for (size_t i = 0; i < n; i++) {
        float s = ((const float *)c->g->src[0])[i];
        for (int r = 1; r < c->g->n; r++) {
            float v = ((const float *)c->g->src[r])[i];
            s = v > s ? v : s;
        }
        o[i] = s;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 4);
    tc_count(c, 2.0 * (c->g->n - 1) / c->g->n * (double)n * 4);
    return 0;
}

static inline int tc_sum64(void *ctx, double *buf, size_t n) {
    tc_rank *c = ctx;
    double *o = tc_post(c, TC_SUM64, buf, n, NULL, n * 8);
    for (size_t i = 0; i < n; i++) {
        double s = ((const double *)c->g->src[0])[i];
        for (int r = 1; r < c->g->n; r++) s += ((const double *)c->g->src[r])[i];
        o[i] = s;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 8);
    tc_count(c, 2.0 * (c->g->n - 1) / c->g->n * (double)n * 8);
    return 0;
}

static inline int tc_gather(void *ctx, const float *in, float *out, size_t n) {
    tc_rank *c = ctx;
    tc_post(c, TC_GATHER, in, n, NULL, 0);
    for (int r = 0; r < c->g->n; r++) memcpy(out + (size_t)r * n, c->g->src[r], n * 4);
    pthread_barrier_wait(&c->g->bar);
    tc_count(c, (double)(c->g->n - 1) * (double)n * 4);
    return 0;
}

static inline int tc_rs_v(void *ctx, const float *in, float *out, const size_t *counts) {
    tc_rank *c = ctx;
    tc_group *g = c->g;
    size_t N = tc_sum_counts(g, counts), d0 = 0;
    tc_post(c, TC_RS_V, in, N, counts, 0);
    for (int r = 0; r < c->rank; r++) d0 += counts[r];
    for (size_t i = 0; i < counts[c->rank]; i++) {
        float s = ((const float *)g->src[0])[d0 + i];
        for (int r = 1; r < g->n; r++) s += ((const float *)g->src[r])[d0 + i];
        out[i] = s;
    }
    pthread_barrier_wait(&g->bar); /* the others have read this rank's input */
    tc_count(c, (double)(N - counts[c->rank]) * 4);
    return 0;
}

static inline int tc_ag_v(void *ctx, const float *in, float *out, const size_t *counts) {
    tc_rank *c = ctx;
    tc_group *g = c->g;
    size_t N = tc_sum_counts(g, counts), off = 0;
    tc_post(c, TC_AG_V, in, N, counts, 0);
    for (int r = 0; r < g->n; r++) {
        if (out + off != g->src[r]) memcpy(out + off, g->src[r], counts[r] * 4); /* in place: already there */
        off += counts[r];
    }
    pthread_barrier_wait(&g->bar);
    tc_count(c, (double)(g->n - 1) * (double)counts[c->rank] * 4);
    return 0;
}

/* The device-buffer calls (ff_model_comm's dev_): on the cpu backend an address is host
 * memory, as with the cpu ff_coll beside it in a worker; the same arithmetic as above. */
static inline int tc_dev_sum(void *ctx, ff_stream *st, ff_dptr buf, size_t n) {
    (void)st;
    return tc_sum(ctx, ff_dptr_addr(buf), n);
}
static inline int tc_dev_rs_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return tc_rs_v(ctx, ff_dptr_addr(in), ff_dptr_addr(out), counts);
}
static inline int tc_dev_ag_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return tc_ag_v(ctx, ff_dptr_addr(in), ff_dptr_addr(out), counts);
}

static inline ff_model_comm tc_comm(tc_rank *c) {
    return (ff_model_comm){.rank = c->rank, .size = c->g->n, .ctx = c, .all_reduce_sum = tc_sum, .all_reduce_max = tc_max,
                           .all_reduce_sum_f64 = tc_sum64, .all_gather = tc_gather, .reduce_scatter_sum_v = tc_rs_v,
                           .all_gather_v = tc_ag_v};
}
/* tc_comm with the device-buffer calls too */
static inline ff_model_comm tc_comm_dev(tc_rank *c) {
    ff_model_comm m = tc_comm(c);
    m.dev_all_reduce_sum = tc_dev_sum;
    m.dev_reduce_scatter_sum_v = tc_dev_rs_v;
    m.dev_all_gather_v = tc_dev_ag_v;
    return m;
}

#endif
