/* Fused schedules for the tests and benches of the fused actor+critic execution
 * (tests/dataflow/test_fuse_pipe.c, tests/pipe/test_fuse_exec.c, bench/bench_fuse_step.c):
 * instances of the layouts they run, and schedules made by hand beside ff_fuse_serial's and
 * ff_fuse_solve's: greedy list schedules (whichever ready task starts first, by a priority,
 * within 1F1B's activation limits) and random valid schedules (a random order of the tasks that
 * respects every dependency), timed by the fused simulator's rule as they are built (a task
 * starts when its node is free and its input is done).
 *
 * Not a check of anything: the callers assert. */
#ifndef FF_TEST_FUSE_UTIL_H
#define FF_TEST_FUSE_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/fuse.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

enum { FZ_MAXM = 64 }; /* micro-batches per model */

static inline ff_fuse_model fz_model(const char *name, int32_t n, const int32_t *stages, int32_t micro, double f, double b,
                                     double act) {
    ff_fuse_model m = {.n_stages = n, .micro = micro, .fwd = f, .bwd = b, .act = act};
    snprintf(m.name, sizeof m.name, "%s", name);
    size_t fl = strlen(name); /* the parser's default family: the name less its trailing digits */
    while (fl > 1 && name[fl - 1] >= '0' && name[fl - 1] <= '9') fl--;
    snprintf(m.family, sizeof m.family, "%.*s", (int)fl, name);
    for (int32_t k = 0; k < n; k++) m.stages[k] = stages[k];
    return m;
}

/* The two layouts of the correctness proof on 4 nodes: actor PP 4 with the critic as PP 2 x 2
 * replicas in the reverse direction ([1, 0] and [3, 2]), or as PP 4 reversed. */
static inline ff_fuse_instance fz_layout(bool replicas, int32_t actor_micro, int32_t critic_micro, double af, double cf) {
    ff_fuse_instance in = {.nodes = 4};
    in.models[in.n_models++] = fz_model("actor", 4, (const int32_t[]){0, 1, 2, 3}, actor_micro, af, 2 * af, 1);
    if (replicas) {
        in.models[in.n_models++] = fz_model("critic0", 2, (const int32_t[]){1, 0}, critic_micro, cf, 2 * cf, 1);
        in.models[in.n_models++] = fz_model("critic1", 2, (const int32_t[]){3, 2}, critic_micro, cf, 2 * cf, 1);
    } else {
        in.models[in.n_models++] = fz_model("critic", 4, (const int32_t[]){3, 2, 1, 0}, critic_micro, cf, 2 * cf, 1);
    }
    return in;
}

static inline void fz_free(ff_fuse_schedule *s) { ff_fuse_schedule_free(s); }

static inline int32_t fz_stage_on(const ff_fuse_model *m, int32_t n) {
    for (int32_t k = 0; k < m->n_stages; k++)
        if (m->stages[k] == n) return k;
    return -1;
}

/* The serial baseline (ff_fuse_serial), which must succeed. */
static inline void fz_serial(const ff_fuse_instance *in, ff_fuse_schedule *s) {
    if (ff_fuse_serial(in, s)) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(s->n_tasks);
}

/* The state of a schedule being built task by task, with the fused simulator's times. */
typedef struct fz_build {
    const ff_fuse_instance *in;
    ff_fuse_schedule *s;
    int32_t nf[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES], nb[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES]; /* by stage */
    double fe[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES][FZ_MAXM], be[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES][FZ_MAXM];
    double free_at[FF_FUSE_MAX_NODES];
    double makespan;
} fz_build;

static inline void fz_build_init(fz_build *b, const ff_fuse_instance *in, ff_fuse_schedule *s) {
    memset(b, 0, sizeof *b);
    b->in = in, b->s = s;
    for (int i = 0; i < in->n_models; i++) REQUIRE(in->models[i].micro <= FZ_MAXM);
    REQUIRE(ff_fuse_schedule_init(s, in->nodes) == 0);
}

/* When model i's next forward (back: backward) on stage st could start, or -1 when its input
 * is not done yet or it has none left. */
static inline double fz_ready(const fz_build *b, int i, int32_t st, bool back) {
    const ff_fuse_model *m = &b->in->models[i];
    const int32_t k = back ? b->nb[i][st] : b->nf[i][st];
    if (k >= m->micro) return -1;
    double dep;
    if (!back) dep = st == 0 ? 0 : b->nf[i][st - 1] > k ? b->fe[i][st - 1][k] + b->in->hop_latency : -1;
    else if (st == m->n_stages - 1) dep = b->nf[i][st] > k ? b->fe[i][st][k] : -1;
    else dep = b->nb[i][st + 1] > k ? b->be[i][st + 1][k] + b->in->hop_latency : -1;
    if (dep < 0) return -1;
    const double fr = b->free_at[m->stages[st]];
    return dep > fr ? dep : fr;
}

static inline void fz_take(fz_build *b, int i, int32_t st, bool back, double start) {
    const ff_fuse_model *m = &b->in->models[i];
    const int32_t n = m->stages[st];
    const double e = start + (back ? m->bwd : m->fwd);
    if (back) b->be[i][st][b->nb[i][st]++] = e;
    else b->fe[i][st][b->nf[i][st]++] = e;
    b->free_at[n] = e;
    b->makespan = e > b->makespan ? e : b->makespan;
    REQUIRE(ff_fuse_schedule_push(b->s, n, (ff_fuse_task){(uint8_t)i, back}) == 0);
}

/* Greedy: the task that can start first, ties to backwards (prefer_forward: forwards) and then
 * to the models in order from `first`; a model keeps at most min(S - s, m) forwards in flight
 * on stage s (1F1B's room) while some other task is ready. */
static inline double fz_greedy(const ff_fuse_instance *in, bool prefer_forward, int first, ff_fuse_schedule *s) {
    fz_build *b = calloc(1, sizeof *b);
    REQUIRE(b);
    fz_build_init(b, in, s);
    const int64_t M = in->n_models;
    int64_t left = 0;
    for (int i = 0; i < M; i++) left += 2 * (int64_t)in->models[i].micro * in->models[i].n_stages;
    for (; left > 0; left--) {
        int bi = -1, bst = -1;
        bool bback = false;
        double bt = 0;
        for (int capped = 1; capped >= 0 && bi < 0; capped--)
            for (int r = 0; r < M; r++) {
                const int i = (first + r) % (int)M;
                const ff_fuse_model *m = &in->models[i];
                for (int32_t st = 0; st < m->n_stages; st++)
                    for (int o = 0; o < 2; o++) {
                        const bool back = prefer_forward ? o == 1 : o == 0;
                        const int32_t room = m->n_stages - st < m->micro ? m->n_stages - st : m->micro;
                        if (!back && capped && b->nf[i][st] - b->nb[i][st] >= room) continue;
                        const double t = fz_ready(b, i, st, back);
                        if (t < 0) continue;
                        if (bi < 0 || t < bt) bi = i, bst = st, bback = back, bt = t;
                    }
            }
        REQUIRE(bi >= 0);
        fz_take(b, bi, bst, bback, bt);
    }
    const double mk = b->makespan;
    free(b);
    return mk;
}

/* A random valid schedule: any ready task (its input scheduled before it), uniformly. */
static inline void fz_random(const ff_fuse_instance *in, uint64_t seed, ff_fuse_schedule *s) {
    fz_build *b = calloc(1, sizeof *b);
    REQUIRE(b);
    fz_build_init(b, in, s);
    ff_rng r;
    ff_rng_seed(&r, seed);
    int cand[4 * FF_FUSE_MAX_MODELS * FF_FUSE_MAX_NODES][3];
    for (;;) {
        int nc = 0;
        for (int i = 0; i < in->n_models; i++)
            for (int32_t st = 0; st < in->models[i].n_stages; st++)
                for (int back = 0; back < 2; back++)
                    if (fz_ready(b, i, st, back) >= 0) cand[nc][0] = i, cand[nc][1] = st, cand[nc][2] = back, nc++;
        if (!nc) break;
        const int q = (int)ff_rng_below(&r, (uint64_t)nc);
        fz_take(b, cand[q][0], cand[q][1], cand[q][2], fz_ready(b, cand[q][0], cand[q][1], cand[q][2]));
    }
    free(b);
}

/* The fused simulator's makespan of a valid schedule (ff_fuse_simulate), -1 when it refuses it. */
static inline double fz_makespan(const ff_fuse_instance *in, const ff_fuse_schedule *s) {
    ff_fuse_sim sim;
    return ff_fuse_simulate(in, s, &sim) ? -1 : sim.makespan;
}

#endif
