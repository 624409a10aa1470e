/* Two pipeline stages as threads for the generation tests (ff_gen_pipe): a one-message
 * mailbox from stage 0 to stage 1, and a broadcast through a barrier.
 *
 * Not for: more than two stages, or sends from stage 1 (refused). */
#ifndef FF_TESTS_MODEL_TWO_STAGES_H
#define FF_TESTS_MODEL_TWO_STAGES_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/model.h"

typedef struct two_stages {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    float *msg; /* stage 0's last send, until taken */
    size_t n;
    pthread_barrier_t bar;
    float *shared;
    size_t shared_n;
} two_stages;

static inline int ts_send(void *ctx, int peer, const float *buf, size_t n) {
    two_stages *t = ctx;
    if (peer != 1) return -1;
    float *m = malloc(n * 4);
    memcpy(m, buf, n * 4);
    pthread_mutex_lock(&t->mu);
    while (t->msg) pthread_cond_wait(&t->cv, &t->mu);
    t->msg = m, t->n = n;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 0;
}
static inline int ts_recv(void *ctx, int peer, float *buf, size_t n) {
    two_stages *t = ctx;
    if (peer != 0) return -1;
    pthread_mutex_lock(&t->mu);
    while (!t->msg) pthread_cond_wait(&t->cv, &t->mu);
    int rc = t->n == n ? 0 : -1;
    if (!rc) memcpy(buf, t->msg, n * 4);
    free(t->msg);
    t->msg = NULL;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return rc;
}
static inline int ts_bcast(void *ctx, int root, float *buf, size_t n, int rank) {
    two_stages *t = ctx;
    if (rank == root) t->shared = buf, t->shared_n = n;
    pthread_barrier_wait(&t->bar);
    int rc = t->shared_n == n ? 0 : -1;
    if (rank != root && !rc) memcpy(buf, t->shared, n * 4);
    pthread_barrier_wait(&t->bar);
    return rc;
}
static inline int ts_bcast0(void *ctx, int root, float *buf, size_t n) { return ts_bcast(ctx, root, buf, n, 0); }
static inline int ts_bcast1(void *ctx, int root, float *buf, size_t n) { return ts_bcast(ctx, root, buf, n, 1); }

static inline void ts_init(two_stages *t) {
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_barrier_init(&t->bar, NULL, 2);
}

static inline void ts_destroy(two_stages *t) {
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_barrier_destroy(&t->bar);
}

/* The device calls on the cpu backend: its buffers are host memory */
static inline int ts_dsend(void *ctx, ff_stream *st, int peer, ff_dptr buf, size_t n) {
    (void)st;
    return ts_send(ctx, peer, ff_dptr_addr(buf), n);
}
static inline int ts_drecv(void *ctx, ff_stream *st, int peer, ff_dptr buf, size_t n) {
    (void)st;
    return ts_recv(ctx, peer, ff_dptr_addr(buf), n);
}
static inline int ts_dbcast0(void *ctx, ff_stream *st, int root, ff_dptr buf, size_t n) {
    (void)st;
    return ts_bcast(ctx, root, ff_dptr_addr(buf), n, 0);
}
static inline int ts_dbcast1(void *ctx, ff_stream *st, int root, ff_dptr buf, size_t n) {
    (void)st;
    return ts_bcast(ctx, root, ff_dptr_addr(buf), n, 1);
}

/* Stage s's side of the pair (dev: with the device calls too). */
static inline ff_gen_pipe ts_pipe(two_stages *t, int s) {
    return (ff_gen_pipe){.rank = s, .size = 2, .ctx = t, .send = ts_send, .recv = ts_recv, .broadcast = s ? ts_bcast1 : ts_bcast0};
}
static inline ff_gen_pipe ts_pipe_dev(two_stages *t, int s) {
    ff_gen_pipe p = ts_pipe(t, s);
    p.dev_send = ts_dsend, p.dev_recv = ts_drecv, p.dev_broadcast = s ? ts_dbcast1 : ts_dbcast0;
    return p;
}

#endif
