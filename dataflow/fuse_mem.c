/* The fused solver's memory descent and memory walk (fuse_internal.h fuse_mem_descend,
 * fuse_mem_walk): a schedule's peak activation memory lowered at a fixed makespan cap, by moving,
 * on a node, a backward earlier or a forward later past its peak (the descent), or by random
 * moves of a task or of a micro-batch's chain kept while the memory does not rise (the walk).
 * Not here: the search that finds the schedule (fuse_solve.c),
 * the simulator (fuse.c).
 *
 * A node's memory after each of its tasks depends on its own order alone, so moving a backward
 * before a forward (or a forward after another task that is not the same model's forward)
 * lowers that node's memory over the tasks it passes and raises it nowhere, on no node: every
 * move is a pure gain in memory, and the simulator only has to say whether the makespan stays
 * under the cap. Greedy and deterministic: the nodes by their peaks, highest first, and the
 * first move that keeps the makespan is kept. What it cannot do (docs/pipeline.md "The memory
 * descent"): the schedules the solver finds at the makespan bound peak before each node's first
 * backward, on nodes that must stay busy until one arrives, and no move on one node changes
 * when that is. */
#include <math.h>
#include <string.h>

#include "dataflow/fuse_internal.h"
#include "fuseflow/util.h"

#define DESCEND_REACH 4 /* backwards after the peak (and forwards before it) a move may take */

static void shift(ff_fuse_task *t, int64_t from, int64_t to) {
    ff_fuse_task x = t[from];
    if (from < to) memmove(t + from, t + from + 1, (size_t)(to - from) * sizeof *t);
    else memmove(t + to + 1, t + to, (size_t)(from - to) * sizeof *t);
    t[to] = x;
}

/* The first task of node n after which its memory is at its peak (-1: none). */
static int64_t first_peak(const ff_fuse_instance *in, const ff_fuse_schedule *s, int32_t n, double peak) {
    double mem = 0;
    for (int64_t p = 0; p < s->n_tasks[n]; p++) {
        ff_fuse_task t = s->tasks[n][p];
        mem += t.backward ? -in->models[t.model].act : in->models[t.model].act;
        if (!t.backward && mem >= peak - 1e-9 * fmax(1, peak)) return p;
    }
    return -1;
}

/* Try moving task `from` of node n to `to`: kept when the schedule runs and ends by cap. */
static bool try_move(fuse_ctx *c, ff_fuse_schedule *s, int32_t n, int64_t from, int64_t to, double cap, fuse_score *r, int64_t *tries) {
    shift(s->tasks[n], from, to);
    ++*tries;
    if (!fuse_run(c, s, r, NULL, NULL) && r->makespan <= cap) return true;
    shift(s->tasks[n], to, from);
    return false;
}

/* One move that lowers node n's memory at its first peak, kept if the makespan stays under cap. */
static bool lower_node(fuse_ctx *c, ff_fuse_schedule *s, int32_t n, double cap, fuse_score *r, int64_t max_tries, int64_t *tries) {
    const ff_fuse_instance *in = c->in;
    int64_t p = first_peak(in, s, n, r->node_peak[n]), len = s->n_tasks[n];
    if (p < 0 || !(r->node_peak[n] > 0)) return false;
    /* a backward after the peak to just before its forward: the nearest first */
    for (int64_t q = p + 1, seen = 0; q < len && seen < DESCEND_REACH && *tries < max_tries; q++) {
        if (!s->tasks[n][q].backward || !(in->models[s->tasks[n][q].model].act > 0)) continue; /* no gain without memory */
        seen++;
        if (try_move(c, s, n, q, p, cap, r, tries)) return true;
    }
    /* or a forward up to the peak to just after the first task past it that is not the same task
     * (the same model's forward: the move would change nothing) */
    for (int64_t f = p, seen = 0; f >= 0 && seen < DESCEND_REACH && *tries < max_tries; f--) {
        ff_fuse_task t = s->tasks[n][f];
        if (t.backward || !(in->models[t.model].act > 0)) continue;
        int64_t q = p + 1;
        while (q < len && s->tasks[n][q].model == t.model && !s->tasks[n][q].backward) q++;
        if (q >= len) continue;
        seen++;
        if (try_move(c, s, n, f, q, cap, r, tries)) return true;
    }
    return false;
}

int fuse_mem_descend(fuse_ctx *c, ff_fuse_schedule *s, double cap, int64_t max_tries, int64_t *tries) {
    const ff_fuse_instance *in = c->in;
    fuse_score r;
    *tries = 0;
    if (fuse_run(c, s, &r, NULL, NULL) || r.makespan > cap) return 0;
    int gains = 0;
    while (*tries < max_tries) {
        /* the nodes by their peaks, highest first: where the highest is stuck, a lower one's move
         * may free it (GPipe's first stage cannot start a backward before the later stages do) */
        int32_t order[FF_FUSE_MAX_NODES];
        for (int32_t n = 0; n < in->nodes; n++) {
            int32_t j = n;
            for (; j > 0 && r.node_peak[order[j - 1]] < r.node_peak[n]; j--) order[j] = order[j - 1];
            order[j] = n;
        }
        bool moved = false;
        for (int32_t j = 0; !moved && j < in->nodes && *tries < max_tries; j++) moved = lower_node(c, s, order[j], cap, &r, max_tries, tries);
        if (!moved) break; /* no node's first peak comes down by these moves */
        gains++;
    }
    if (fuse_run(c, s, &r, NULL, NULL)) return -1; /* every kept move ran */
    return gains;
}

/* ---- the walk ---------------------------------------------------------------------------- */

#define WALK_MEAN_WEIGHT 0.1 /* energy: peak + this x the mean node peak (the max alone is a plateau) */
#define WALK_REACH 3         /* a task moves up to this many places */
#define CHAIN_REACH 2        /* a chain's tasks move up to this many places each */
#define WALK_STALE 200000    /* simulations without a lower energy before the walk stops (20000 stopped it at
                              * 4-5 s of bench_fuse's 9.5 with 1.5-3.75x peaks that 200000 lowered by 0-20%) */

typedef struct moved {
    int32_t node;
    int64_t from, to;
} moved;

static double walk_energy(const ff_fuse_instance *in, const fuse_score *r) {
    double sum = 0;
    for (int32_t n = 0; n < in->nodes; n++) sum += r->node_peak[n];
    return r->peak + WALK_MEAN_WEIGHT * sum / in->nodes;
}

/* The position of the k-th task (model, backward) on node n, or -1. */
static int64_t nth_task(const ff_fuse_schedule *s, int32_t n, uint8_t model, uint8_t backward, int32_t k) {
    for (int64_t p = 0; p < s->n_tasks[n]; p++)
        if (s->tasks[n][p].model == model && s->tasks[n][p].backward == backward && k-- == 0) return p;
    return -1;
}

int fuse_mem_walk(fuse_ctx *c, ff_fuse_schedule *s, double cap, double peak_floor, uint64_t seed, int64_t max_tries, int64_t deadline_ns, int64_t *tries) {
    const ff_fuse_instance *in = c->in;
    fuse_score r;
    *tries = 0;
    if (fuse_run(c, s, &r, NULL, NULL) || r.makespan > cap) return 0;
    double start_peak = r.peak;
    ff_rng rng;
    ff_rng_seed(&rng, ff_seed_stream(seed, 0x77616c6b, 0)); /* "walk" */
    moved undo[FF_FUSE_MAX_NODES];
    int lowered = 0;
    int64_t stale = 0;
    double e = walk_energy(in, &r);
    while (*tries < max_tries && stale < WALK_STALE && r.peak > peak_floor * (1 + 1e-9)) {
        if (deadline_ns > 0 && (*tries & 63) == 0 && ff_now_ns() >= deadline_ns) break;
        ++*tries; /* every draw, so a schedule with no move to make still ends */
        stale++;
        int nu = 0;
        if (ff_rng_below(&rng, 2)) { /* one task of one node, up to WALK_REACH places */
            int32_t n = (int32_t)ff_rng_below(&rng, (uint64_t)in->nodes);
            int64_t len = s->n_tasks[n];
            if (len < 2) continue;
            int64_t from = (int64_t)ff_rng_below(&rng, (uint64_t)len), d = 1 + (int64_t)ff_rng_below(&rng, WALK_REACH);
            int64_t to = ff_rng_below(&rng, 2) ? from + d : from - d;
            if (to < 0 || to >= len) continue;
            shift(s->tasks[n], from, to);
            undo[nu++] = (moved){n, from, to};
        } else { /* micro-batch k's forward (or backward) of a model on its stages from s0 on, each
                  * moved by the same places: its whole chain runs earlier or later, which one
                  * node's move cannot do without stalling the next */
            int32_t i = (int32_t)ff_rng_below(&rng, (uint64_t)in->n_models);
            const ff_fuse_model *m = &in->models[i];
            uint8_t bwd = (uint8_t)ff_rng_below(&rng, 2);
            int32_t k = (int32_t)ff_rng_below(&rng, (uint64_t)m->micro), s0 = (int32_t)ff_rng_below(&rng, (uint64_t)m->n_stages);
            int64_t d = 1 + (int64_t)ff_rng_below(&rng, CHAIN_REACH);
            if (ff_rng_below(&rng, 2)) d = -d;
            for (int32_t st = s0; st < m->n_stages; st++) {
                int32_t n = m->stages[st];
                int64_t from = nth_task(s, n, (uint8_t)i, bwd, k), to = from + d;
                if (from < 0 || to < 0 || to >= s->n_tasks[n]) continue;
                shift(s->tasks[n], from, to);
                undo[nu++] = (moved){n, from, to};
            }
            if (!nu) continue;
        }
        fuse_score t;
        if (!fuse_run(c, s, &t, NULL, NULL) && t.makespan <= cap) {
            double et = walk_energy(in, &t);
            /* plateaus are walked (the max moves by many small steps); the peak itself never rises */
            if (et <= e + 1e-12 * fmax(1, e) && t.peak <= r.peak + 1e-12 * fmax(1, r.peak)) {
                lowered += t.peak < r.peak - 1e-9 * fmax(1, r.peak);
                if (et < e - 1e-9 * fmax(1, e)) stale = 0;
                e = et, r = t;
                continue;
            }
        }
        while (nu--) shift(s->tasks[undo[nu].node], undo[nu].to, undo[nu].from);
    }
    if (fuse_run(c, s, &r, NULL, NULL) || r.makespan > cap || r.peak > start_peak * (1 + 1e-9)) return -1; /* every kept move ran */
    return lowered;
}
