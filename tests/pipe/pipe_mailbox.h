/* An in-process pipeline transport for tests (fuseflow/pipe_exec.h's ff_pipe_transport): the
 * ranks are threads, a call posts its sends into a mailbox per (from, to) and waits for its
 * receives (sends are buffered, so a call never waits for its partner's to be posted; with the
 * group's `rendezvous` set, a call also waits until its partners have taken every message it
 * sent, as a blocking grouped call of NCCL sends completes only once they are received), and
 * the f64 sum meets at a barrier and adds in rank order (the same bits on every rank). Sends
 * that do not block (send_post, sends_done) post into the same mailboxes; one is done at once,
 * or with `rendezvous` once taken; the group's `blocking_sends` leaves them out of the
 * transport. Each rank counts its transfers and floats sent; fail_next breaks its next call
 * (or post) on purpose.
 *
 * Not for: checking ff_coll's own transport (tests/pipe/test_pipe_coll.c runs it). */
#ifndef FF_TEST_PIPE_MAILBOX_H
#define FF_TEST_PIPE_MAILBOX_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/pipe_exec.h"
#include "tests/test_util.h"

enum { PM_MAXR = 8 };

typedef struct msg {
    struct msg *next;
    size_t n;
    float data[];
} msg;

typedef struct chan {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    msg *head, *tail;
    int64_t posted, taken; /* messages put in and taken out */
} chan;

typedef struct group {
    int n;
    bool rendezvous; /* a call returns once its sends are taken too; a posted send is done once taken */
    bool blocking_sends; /* transport_of gives no send_post: every send goes through a call */
    chan ch[PM_MAXR][PM_MAXR]; /* [from][to] */
    pthread_barrier_t bar;
    const double *src[PM_MAXR];
    size_t cnt[PM_MAXR];
    int64_t calls[PM_MAXR], floats[PM_MAXR]; /* per rank: transfers posted, floats sent */
} group;

typedef struct rank_ctx {
    group *g;
    int rank;
    double *tmp;
    size_t cap;
    bool fail_next; /* the next call fails before it posts anything */
    /* posted sends: each one's peer and its number in that channel (ch.posted after it) */
    int *post_peer;
    int64_t *post_no;
    uint64_t n_post, cap_post, n_done;
} rank_ctx;

/* One send into the mailbox of (c->rank, x->peer); its number in that channel. */
static inline int64_t t_put(rank_ctx *c, const ff_pipe_xfer *x) {
    group *g = c->g;
    REQUIRE(x->peer >= 0 && x->peer < g->n && x->peer != c->rank);
    msg *m = malloc(sizeof *m + sizeof(float) * x->count);
    REQUIRE(m);
    m->next = NULL;
    m->n = x->count;
    memcpy(m->data, x->buf, sizeof(float) * x->count);
    chan *ch = &g->ch[c->rank][x->peer];
    pthread_mutex_lock(&ch->mu);
    if (ch->tail) ch->tail->next = m;
    else ch->head = m;
    ch->tail = m;
    const int64_t no = ++ch->posted;
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
    g->floats[c->rank] += (int64_t)x->count;
    return no;
}

static inline int t_call(void *ctx, const ff_pipe_xfer *x, int n) {
    rank_ctx *c = ctx;
    group *g = c->g;
    if (c->fail_next) {
        c->fail_next = false;
        return ff_error_set("test transport", NULL, "the group is broken (on purpose)");
    }
    for (int i = 0; i < n; i++) /* sends are buffered: post them all, then wait for the receives */
        if (x[i].kind == FF_PIPE_XFER_SEND) t_put(c, &x[i]);
    for (int i = 0; i < n; i++) {
        g->calls[c->rank]++;
        if (x[i].kind != FF_PIPE_XFER_RECV) continue;
        chan *ch = &g->ch[x[i].peer][c->rank];
        pthread_mutex_lock(&ch->mu);
        while (!ch->head) pthread_cond_wait(&ch->cv, &ch->mu);
        msg *m = ch->head;
        ch->head = m->next;
        if (!ch->head) ch->tail = NULL;
        ch->taken++;
        pthread_cond_broadcast(&ch->cv);
        pthread_mutex_unlock(&ch->mu);
        if (m->n != x[i].count) {
            fprintf(stderr, "rank %d: receive of %zu floats from rank %d met a send of %zu\n", c->rank, x[i].count,
                    x[i].peer, m->n);
            exit(1);
        }
        memcpy(x[i].buf, m->data, sizeof(float) * m->n);
        free(m);
    }
    for (int i = 0; i < n && g->rendezvous; i++) { /* every channel sent on: until all of it is taken */
        if (x[i].kind != FF_PIPE_XFER_SEND) continue;
        chan *ch = &g->ch[c->rank][x[i].peer];
        pthread_mutex_lock(&ch->mu);
        while (ch->taken < ch->posted) pthread_cond_wait(&ch->cv, &ch->mu);
        pthread_mutex_unlock(&ch->mu);
    }
    return 0;
}

static inline int t_send_post(void *ctx, const ff_pipe_xfer *x) {
    rank_ctx *c = ctx;
    if (c->fail_next) {
        c->fail_next = false;
        return ff_error_set("test transport", NULL, "the group is broken (on purpose)");
    }
    if (c->n_post == c->cap_post) {
        c->cap_post = c->cap_post ? 2 * c->cap_post : 64;
        REQUIRE((c->post_peer = realloc(c->post_peer, sizeof(int) * c->cap_post)));
        REQUIRE((c->post_no = realloc(c->post_no, sizeof(int64_t) * c->cap_post)));
    }
    c->g->calls[c->rank]++;
    c->post_peer[c->n_post] = x->peer;
    c->post_no[c->n_post++] = t_put(c, x);
    return 0;
}

static inline int t_sends_done(void *ctx, bool wait, uint64_t *done) {
    rank_ctx *c = ctx;
    group *g = c->g;
    while (c->n_done < c->n_post) {
        chan *ch = &g->ch[c->rank][c->post_peer[c->n_done]];
        pthread_mutex_lock(&ch->mu);
        while (wait && g->rendezvous && ch->taken < c->post_no[c->n_done]) pthread_cond_wait(&ch->cv, &ch->mu);
        const bool taken = !g->rendezvous || ch->taken >= c->post_no[c->n_done];
        pthread_mutex_unlock(&ch->mu);
        if (!taken) break;
        c->n_done++;
    }
    *done = c->n_done;
    return 0;
}

static inline int t_sum64(void *ctx, double *buf, size_t n) {
    rank_ctx *c = ctx;
    group *g = c->g;
    g->src[c->rank] = buf;
    g->cnt[c->rank] = n;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < g->n; r++) REQUIRE(g->cnt[r] == n);
    if (n > c->cap) {
        REQUIRE((c->tmp = realloc(c->tmp, sizeof(double) * n)));
        c->cap = n;
    }
    for (size_t i = 0; i < n; i++) { /* rank order on every rank: the same bits */
        double s = 0;
        for (int r = 0; r < g->n; r++) s += g->src[r][i];
        c->tmp[i] = s;
    }
    pthread_barrier_wait(&g->bar);
    memcpy(buf, c->tmp, sizeof(double) * n);
    return 0;
}

static inline group *group_new(int n) {
    group *g = calloc(1, sizeof *g);
    REQUIRE(g);
    g->n = n;
    pthread_barrier_init(&g->bar, NULL, (unsigned)n);
    for (int a = 0; a < PM_MAXR; a++)
        for (int b = 0; b < PM_MAXR; b++) {
            pthread_mutex_init(&g->ch[a][b].mu, NULL);
            pthread_cond_init(&g->ch[a][b].cv, NULL);
        }
    return g;
}

static inline void group_free(group **pg) {
    group *g = *pg;
    for (int a = 0; a < PM_MAXR; a++)
        for (int b = 0; b < PM_MAXR; b++) {
            CHECK(g->ch[a][b].head == NULL); /* every send was received */
            pthread_mutex_destroy(&g->ch[a][b].mu);
            pthread_cond_destroy(&g->ch[a][b].cv);
        }
    pthread_barrier_destroy(&g->bar);
    free(g);
    *pg = NULL;
}

static inline ff_pipe_transport transport_of(rank_ctx *c) {
    const bool post = !c->g->blocking_sends;
    return (ff_pipe_transport){.rank = c->rank, .size = c->g->n, .ctx = c, .call = t_call, .all_reduce_sum_f64 = t_sum64,
                               .send_post = post ? t_send_post : NULL, .sends_done = post ? t_sends_done : NULL};
}

/* What the rank's context holds (after its last use). */
static inline void rank_ctx_clear(rank_ctx *c) {
    free(c->tmp), free(c->post_peer), free(c->post_no);
    c->tmp = NULL, c->cap = 0;
    c->post_peer = NULL, c->post_no = NULL;
    c->n_post = c->cap_post = c->n_done = 0;
}

#endif
