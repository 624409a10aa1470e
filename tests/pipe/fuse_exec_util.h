/* An actor and a critic trained together on 4 ranks (threads, the mailbox transport of
 * pipe_mailbox.h, buffered or rendezvous) by following fused instruction streams (ff_fuse_to_pipe), for
 * tests/pipe/test_fuse_exec.c and bench/bench_fuse_step.c.
 *
 * Model 0 of the instance is the actor (log-prob loss, pt_loss on its batch); the others are
 * the critic (value loss), either one pipeline or data-parallel replicas of one. Replica q of
 * n runs micro-batches [q m, (q + 1) m) of the critic's global batch, whose loss coefficients
 * are normalised by the whole batch's tokens; at its step a before_step hook sums the stage's
 * gradients over the replicas (in replica order: the same bits on every replica), and the
 * gradient norm sums over the replica's own pipeline (a group of its ranks), so each replica
 * steps as the single critic on the whole batch would. The actor's norm sums over the
 * transport (all ranks).
 *
 * A job runs a list of schedules over the same stage models, `reps` times in turn (the bench
 * alternates serial and fused steps); each run is one training step. With keep, every rank
 * exports its stages' weights at the end. Not here: checks (the callers assert). */
#ifndef FF_TEST_FUSE_EXEC_UTIL_H
#define FF_TEST_FUSE_EXEC_UTIL_H

#include <pthread.h>
#include <time.h>

#include "tests/dataflow/fuse_test_util.h"
#include "tests/pipe/pipe_mailbox.h"
#include "tests/pipe/pipe_test_util.h"

enum { FX_RANKS = 4, FX_MAXS = 4, FX_MAXREPS = 16 };

/* A group of some ranks' threads that sums in member order (the same bits for everyone). */
typedef struct fx_sub {
    int n;
    pthread_barrier_t bar;
    const void *src[FX_RANKS];
    size_t cnt[FX_RANKS];
} fx_sub;

typedef struct fx_member {
    fx_sub *g;
    int idx;
    void *tmp;
    size_t cap;
} fx_member;

static inline void *fx_post(fx_member *m, const void *src, size_t n, size_t bytes) {
    m->g->src[m->idx] = src;
    m->g->cnt[m->idx] = n;
    pthread_barrier_wait(&m->g->bar);
    for (int r = 0; r < m->g->n; r++) REQUIRE(m->g->cnt[r] == n);
    if (bytes > m->cap) {
        REQUIRE((m->tmp = realloc(m->tmp, bytes)));
        m->cap = bytes;
    }
    return m->tmp;
}

static inline int fx_sum64(void *ctx, double *buf, size_t n) {
    fx_member *m = ctx;
    double *o = fx_post(m, buf, n, n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double v = 0;
        for (int r = 0; r < m->g->n; r++) v += ((const double *)m->g->src[r])[i];
        o[i] = v;
    }
    pthread_barrier_wait(&m->g->bar);
    memcpy(buf, o, n * sizeof(double));
    return 0;
}

static inline int fx_sum32(fx_member *m, float *buf, size_t n) {
    float *o = fx_post(m, buf, n, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float v = 0;
        for (int r = 0; r < m->g->n; r++) v += ((const float *)m->g->src[r])[i];
        o[i] = v;
    }
    pthread_barrier_wait(&m->g->bar);
    memcpy(buf, o, n * sizeof(float));
    return 0;
}

typedef struct fx_job {
    const ff_fuse_instance *in;         /* the layout (stages, micro-batches) */
    const ff_pipe_schedule *sched[FX_MAXS];
    int n_sched, reps;
    const ff_model_config *cfg[2];      /* actor, critic */
    const ff_tensor_set *w[2];
    const pt_batch *g[2];               /* the actor's batch, the critic's global batch */
    bool keep;
    bool rendezvous;                    /* the transport's calls wait for their sends to be taken */
    /* measured (rank 0), after the last run of sched[measure_from]: the instance */
    int measure_from;
    ff_fuse_instance measured;
    /* out */
    ff_tensor_set *after[FX_RANKS][FF_FUSE_MAX_MODELS];
    ff_pipe_exec_stats stats[FX_MAXS][FX_MAXREPS][FX_RANKS];
    double cpu[FX_MAXS][FX_MAXREPS];    /* rank 0: the process's CPU seconds over each run */
    int ok[FX_RANKS];
    /* plumbing */
    group *mail;
    rank_ctx ctx[FX_RANKS];
    fx_sub norm[FF_FUSE_MAX_MODELS];    /* critic replica q: its pipeline's ranks */
    fx_sub dp[FF_FUSE_MAX_NODES];       /* critic stage s: the replicas' ranks of it */
} fx_job;

static inline int fx_replicas(const fx_job *j) { return j->in->n_models - 1; }

typedef struct fx_rank {
    fx_job *j;
    int rank;
    fx_member norm_m[FF_FUSE_MAX_MODELS], dp_m[FF_FUSE_MAX_MODELS];
    ff_model_comm norm_c[FF_FUSE_MAX_MODELS];
    struct fx_loss {
        const pt_batch *g;
        int32_t m0;
    } loss[FF_FUSE_MAX_MODELS];
    float *grads;
    size_t grads_cap;
} fx_rank;

/* CPU seconds of the whole process (every rank's threads) */
static inline double fx_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int fx_loss_fn(void *ctx, int32_t micro, const ff_batch *b, const ff_forward_out *out, ff_pipe_loss_out *d) {
    const struct fx_loss *l = ctx;
    (void)b;
    d->loss = pt_loss_of(l->g, l->m0 + micro, out, d->d_logprobs, d->d_entropy, d->d_values);
    return 0;
}

/* The critic replicas' data parallelism: the stage's gradients summed over the replicas. */
typedef struct fx_dp_ctx {
    fx_rank *r;
    int model;
} fx_dp_ctx;

static inline int fx_dp_step(void *ctx, ff_model *m) {
    fx_dp_ctx *c = ctx;
    fx_rank *r = c->r;
    const size_t n = (size_t)ff_model_param_count(m);
    if (n > r->grads_cap) {
        REQUIRE((r->grads = realloc(r->grads, sizeof(float) * n)));
        r->grads_cap = n;
    }
    if (ff_model_read_grads(m, r->grads)) return -1;
    fx_sum32(&r->dp_m[c->model], r->grads, n);
    return ff_model_write_grads(m, r->grads);
}

static inline void *fx_rank_main(void *arg) {
    fx_rank *r = arg;
    fx_job *j = r->j;
    const int rank = r->rank, M = j->in->n_models, R = fx_replicas(j);
    ff_pipe_transport t = transport_of(&j->ctx[rank]);
    ff_model_comm all;
    ff_pipe_model_comm(&t, &all);
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_model *m[FF_FUSE_MAX_MODELS] = {0};
    ff_optimizer *o[FF_FUSE_MAX_MODELS] = {0};
    ff_pipe_exec_model em[FF_FUSE_MAX_MODELS];
    fx_dp_ctx dpc[FF_FUSE_MAX_MODELS];
    memset(em, 0, sizeof em);
    const ff_pipe_schedule *s0 = j->sched[0];
    for (int i = 0; i < M; i++) {
        const int32_t st = fz_stage_on(&j->in->models[i], rank);
        if (st < 0) continue;
        const bool critic = i > 0;
        int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
        ff_model_stage stage;
        REQUIRE(ff_pipe_stage_layers(s0, i, rank, first, count, &stage) == 0);
        stage.comm = &all;
        if (critic && R > 1) { /* the replica's own pipeline sums the norm; the replicas of the stage sum the gradients */
            r->norm_m[i] = (fx_member){.g = &j->norm[i], .idx = st};
            r->norm_c[i] = (ff_model_comm){.rank = st, .size = j->norm[i].n, .ctx = &r->norm_m[i], .all_reduce_sum_f64 = fx_sum64};
            stage.comm = &r->norm_c[i];
            r->dp_m[i] = (fx_member){.g = &j->dp[st], .idx = i - 1};
            dpc[i] = (fx_dp_ctx){.r = r, .model = i};
        }
        m[i] = ff_model_new_opts(be, j->cfg[critic], j->w[critic], &(ff_model_opts){.stage = &stage});
        if (!m[i]) fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
        REQUIRE(m[i] && (o[i] = ff_optimizer_new(m[i], &ac)));
        r->loss[i] = (struct fx_loss){.g = j->g[critic], .m0 = critic && R > 1 ? (i - 1) * j->in->models[i].micro : 0};
        em[i] = (ff_pipe_exec_model){.model = m[i], .opt = o[i], .temperature = PT_TEMP, .logprobs = !critic, .values = critic,
                                     .loss = fx_loss_fn, .loss_ctx = &r->loss[i],
                                     .before_step = critic && R > 1 ? fx_dp_step : NULL, .step_ctx = &dpc[i]};
    }
    ff_pipe_exec *e[FX_MAXS];
    for (int q = 0; q < j->n_sched; q++) {
        e[q] = ff_pipe_exec_new(j->sched[q], rank, &t, em);
        if (!e[q]) fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
        REQUIRE(e[q]);
    }
    ff_pipe_run run = {.measure = true};
    for (int i = 0; i < M; i++) run.micro[i] = j->g[i > 0]->b + r->loss[i].m0;
    bool ok = true;
    for (int k = 0; k < j->reps && ok; k++)
        for (int q = 0; q < j->n_sched && ok; q++) {
            const double c0 = fx_cpu_s();
            if (ff_pipe_exec_run(e[q], &run, &j->stats[q][k][rank])) {
                fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
                ok = false;
            }
            if (rank == 0) j->cpu[q][k] = fx_cpu_s() - c0;
        }
    if (ok && rank == 0 && j->measure_from >= 0) {
        ff_pipe_fuse_model fm[FF_FUSE_MAX_MODELS];
        for (int i = 0; i < M; i++) {
            const pt_batch *g = j->g[i > 0];
            fm[i] = (ff_pipe_fuse_model){.name = j->in->models[i].name, .cfg = j->cfg[i > 0], .tokens = (double)g->off[g->n] / g->n};
        }
        if (ff_pipe_fuse_instance(e[j->measure_from], fm, &j->measured)) fprintf(stderr, "%s\n", ff_error_message()), ok = false;
    }
    for (int i = 0; i < M && ok && j->keep; i++)
        if (m[i]) REQUIRE((j->after[rank][i] = ff_tensor_set_new()) && ff_model_export_weights(m[i], j->after[rank][i]) == 0);
    j->ok[rank] = ok;
    for (int q = 0; q < j->n_sched; q++) ff_pipe_exec_destroy(&e[q]);
    for (int i = 0; i < M; i++) {
        ff_optimizer_destroy(&o[i]);
        ff_model_destroy(&m[i]);
        free(r->norm_m[i].tmp), free(r->dp_m[i].tmp);
    }
    free(r->grads);
    ff_backend_destroy(&be);
    return NULL;
}

/* Run the job; 0 when every rank ran every step. */
static inline int fx_run(fx_job *j) {
    REQUIRE(j->in->nodes == FX_RANKS && j->n_sched >= 1 && j->n_sched <= FX_MAXS && j->reps >= 1 && j->reps <= FX_MAXREPS);
    const int M = j->in->n_models, R = fx_replicas(j);
    j->mail = group_new(FX_RANKS);
    j->mail->rendezvous = j->rendezvous;
    if (R > 1) {
        for (int i = 1; i < M; i++) {
            j->norm[i] = (fx_sub){.n = j->in->models[i].n_stages};
            pthread_barrier_init(&j->norm[i].bar, NULL, (unsigned)j->norm[i].n);
        }
        for (int32_t st = 0; st < j->in->models[1].n_stages; st++) {
            j->dp[st] = (fx_sub){.n = R};
            pthread_barrier_init(&j->dp[st].bar, NULL, (unsigned)R);
        }
    }
    fx_rank r[FX_RANKS];
    pthread_t th[FX_RANKS];
    memset(r, 0, sizeof r);
    for (int q = 0; q < FX_RANKS; q++) {
        j->ctx[q] = (rank_ctx){.g = j->mail, .rank = q};
        r[q].j = j, r[q].rank = q;
        REQUIRE(pthread_create(&th[q], NULL, fx_rank_main, &r[q]) == 0);
    }
    int failed = 0;
    for (int q = 0; q < FX_RANKS; q++) {
        pthread_join(th[q], NULL);
        failed += !j->ok[q];
        rank_ctx_clear(&j->ctx[q]);
    }
    if (R > 1) {
        for (int i = 1; i < M; i++) pthread_barrier_destroy(&j->norm[i].bar);
        for (int32_t st = 0; st < j->in->models[1].n_stages; st++) pthread_barrier_destroy(&j->dp[st].bar);
    }
    group_free(&j->mail);
    return failed ? -1 : 0;
}

static inline void fx_job_clear(fx_job *j) {
    for (int q = 0; q < FX_RANKS; q++)
        for (int i = 0; i < FF_FUSE_MAX_MODELS; i++) ff_tensor_set_destroy(&j->after[q][i]);
}

/* Model i's whole weights after the job: the union of its ranks' exports. */
static inline ff_tensor_set *fx_model_after(const fx_job *j, int i) {
    ff_tensor_set *sets[FX_RANKS];
    int n = 0;
    for (int32_t k = 0; k < j->in->models[i].n_stages; k++) sets[n++] = j->after[j->in->models[i].stages[k]][i];
    return pt_merge(sets, n, NULL);
}

#endif
