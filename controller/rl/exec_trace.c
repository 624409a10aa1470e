/* The run's timeline (`fuseflow run --trace FILE`): what only the executor knows, added to
 * the runtime controller's trace through its recorder (controller.h, ff_controller_trace_*),
 * which writes it in one file with every subtask:
 *   - controller-side nodes (rewards, advantages) as job slices on the controller's
 *     "executor" track, named by node and samples like the subtasks ("reward s8-15 (8)");
 *   - a track per graph node with one slice per iteration (from its first dispatch to its
 *     last result: where stages overlap under the fused schedule), one for iterations, and
 *     an instant where a worker was lost;
 *   - a track of the weight transitions (train -> generate syncs): one slice per sync, its
 *     ranks' first start to last end, with the bytes received in all and by the busiest rank;
 *   - with a pipeline, a track per rank with each instruction of its train steps (forwards,
 *     backwards, sends and receives, the optimizer step) as the rank timed it: the gaps
 *     between its compute slices are its bubble;
 *   - dependencies: each job's `after` names the jobs whose outputs it read, that is the
 *     writers of its input cells (each cell of the sample store remembers the job that wrote
 *     it) and the last jobs that changed the weights it runs on (loading, train steps, the
 *     sync to the generating actor). A sample's path (generate -> log-probs, values, reward
 *     -> advantage -> the train steps of its mini-batches -> sync -> the next generation) is
 *     then in the file, the writer draws it as arrows, and `fuseflow trace summary` finds
 *     the run's critical path as its longest chain of dependent jobs.
 *
 * Not here: recording subtasks and writing the file (controller/trace.c). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/pipeline.h"
#include "fuseflow/util.h"

struct ex_trace {
    ff_controller *c;
    int exec_track, iter_track;
    int stage_track[EX_MAX_NODES]; /* 0: not made yet */
    uint64_t *deps;                /* ex_trace_deps' answer */
    size_t ndeps, deps_cap;
    uint64_t weights[POOL_COUNT][EX_MAX_RANKS]; /* the jobs that last changed each pool's weights */
    int nweights[POOL_COUNT];
    bool lost[EX_MAX_RANKS]; /* workers whose loss is on the timeline */
    int pipe_track[EX_MAX_RANKS]; /* "rank R: pipeline" (0: not made yet) */
    int sync_track;               /* "weight transitions" (0: not made yet) */
    int load_track[EX_MAX_RANKS]; /* "rank R: weights": loads of frozen weights (0: not made yet) */
};

ex_trace *ex_trace_new(ff_controller *c) {
    ex_trace *t = ff_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->c = c;
    t->exec_track = ff_controller_trace_track(c, "executor (controller-side nodes)");
    t->iter_track = ff_controller_trace_track(c, "iterations");
    if (t->exec_track < 0 || t->iter_track < 0) ex_trace_free(&t);
    return t;
}

void ex_trace_free(ex_trace **pt) {
    if (!*pt) return;
    free((*pt)->deps);
    free(*pt);
    *pt = NULL;
}

static void push_dep(ex_trace *t, uint64_t job) {
    if (!job) return;
    if (t->ndeps == t->deps_cap) {
        size_t cap = t->deps_cap ? 2 * t->deps_cap : 256;
        uint64_t *v = realloc(t->deps, cap * sizeof *v);
        if (!v) return; /* a trace with gaps beats a failed run */
        t->deps = v;
        t->deps_cap = cap;
    }
    t->deps[t->ndeps++] = job;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

const uint64_t *ex_trace_deps(ex_run *x, int node, const int64_t *samples, int64_t n, int pool, const uint64_t *extra, int nextra,
                              int *nout) {
    *nout = 0;
    ex_trace *t = x->tr;
    if (!t) return NULL;
    t->ndeps = 0;
    if (node >= 0 && x->cur) {
        const ff_node *nd = ff_graph_node(x->run->graph, (size_t)node);
        for (int slot = 0; slot < FF_SLOT_COUNT; slot++) {
            int col = nd->in[slot];
            if (col < 0) continue;
            for (int64_t i = 0; i < n; i++) push_dep(t, x->cur->cells[col][samples[i]].job);
        }
    }
    if (pool >= 0)
        for (int i = 0; i < t->nweights[pool]; i++) push_dep(t, t->weights[pool][i]);
    for (int i = 0; i < nextra; i++) push_dep(t, extra[i]);
    qsort(t->deps, t->ndeps, sizeof *t->deps, cmp_u64);
    size_t k = 0;
    for (size_t i = 0; i < t->ndeps; i++)
        if (!k || t->deps[k - 1] != t->deps[i]) t->deps[k++] = t->deps[i];
    t->ndeps = k;
    *nout = (int)k;
    return t->deps;
}

void ex_trace_weights(ex_run *x, int pool, const uint64_t *jobs, int n) {
    ex_trace *t = x->tr;
    if (!t) return;
    if (n > EX_MAX_RANKS) n = EX_MAX_RANKS;
    memcpy(t->weights[pool], jobs, (size_t)n * sizeof *jobs);
    t->nweights[pool] = n;
}

uint64_t ex_trace_local(ex_run *x, int node, int64_t start_ns, int64_t end_ns, const int64_t *samples, int64_t n) {
    ex_trace *t = x->tr;
    if (!t || n <= 0) return 0;
    const ff_node *nd = ff_graph_node(x->run->graph, (size_t)node);
    char name[128];
    if (n == 1) snprintf(name, sizeof name, "%s s%" PRId64, nd->name, samples[0]);
    else snprintf(name, sizeof name, "%s s%" PRId64 "-%" PRId64 " (%" PRId64 ")", nd->name, samples[0], samples[n - 1], n);
    int nafter;
    const uint64_t *after = ex_trace_deps(x, node, samples, n, -1, NULL, 0, &nafter);
    ff_arg args[3] = {ff_arg_str("node", nd->name), ff_arg_int("iteration", x->cur ? x->cur->it : x->iteration),
                      ff_arg_int("samples", n)};
    ff_trace_slice s = {.track = t->exec_track, .name = name, .cat = "local", .kind = ff_op_name(nd->op), .start_ns = start_ns,
                        .end_ns = end_ns, .job = true, .after = after, .nafter = nafter, .args = args, .nargs = 3};
    return ff_controller_trace_slice(t->c, &s);
}

void ex_trace_span(ex_run *x, int node, const char *name, int64_t start_ns, int64_t end_ns) {
    ex_trace *t = x->tr;
    if (!t) return;
    int track = t->iter_track;
    if (node >= 0) {
        if (!t->stage_track[node]) {
            char tn[128];
            snprintf(tn, sizeof tn, "stage %s", ff_graph_node(x->run->graph, (size_t)node)->name);
            t->stage_track[node] = ff_controller_trace_track(t->c, tn);
        }
        track = t->stage_track[node];
    }
    ff_trace_slice s = {.track = track, .name = name, .cat = "stage", .start_ns = start_ns,
                        .end_ns = end_ns > start_ns ? end_ns : start_ns};
    if (track > 0) ff_controller_trace_slice(t->c, &s);
}

void ex_trace_pipeline(ex_run *x, const ff_result *r, const char *node) {
    ex_trace *t = x->tr;
    const ff_tensor *pt = ex_out_named(r, FF_RL_T_PIPE_TIMES);
    if (!t || !pt || r->rank < 0 || r->rank >= EX_MAX_RANKS || !r->start_ns) return;
    if (pt->dtype != FF_DTYPE_F64 || pt->ndim != 2 || pt->shape[1] != 5) {
        ex_fail(x, "node '%s': worker %d sent %s of another shape than [n, 5] F64", node, r->rank, FF_RL_T_PIPE_TIMES);
        return;
    }
    if (!t->pipe_track[r->rank]) {
        char tn[64];
        snprintf(tn, sizeof tn, "rank %d: pipeline", r->rank);
        t->pipe_track[r->rank] = ff_controller_trace_track(t->c, tn);
        if (t->pipe_track[r->rank] <= 0) return;
    }
    /* forwards "F3", backwards "B3" (chunk .c with interleaving), transfers by their op's
     * name; the gaps between the compute slices are the rank's bubble */
    const double *v = pt->data;
    double first = 1e300, last = -1e300;
    for (int64_t i = 0; i < pt->shape[0]; i++, v += 5) {
        int op = (int)v[0];
        if (op < 0 || op >= FF_PIPE_NOPS || !(v[4] >= v[3])) continue;
        if (v[3] < first) first = v[3];
        if (v[4] > last) last = v[4];
        char name[64];
        if ((op == FF_PIPE_FORWARD || op == FF_PIPE_BACKWARD) && v[2] > 0)
            snprintf(name, sizeof name, "%c%d.%d", op == FF_PIPE_FORWARD ? 'F' : 'B', (int)v[1], (int)v[2]);
        else if (op == FF_PIPE_FORWARD || op == FF_PIPE_BACKWARD)
            snprintf(name, sizeof name, "%c%d", op == FF_PIPE_FORWARD ? 'F' : 'B', (int)v[1]);
        else if (op == FF_PIPE_OPTIMIZER_STEP)
            snprintf(name, sizeof name, "optimizer step");
        else
            snprintf(name, sizeof name, "%s %d", ff_pipe_op_name((ff_pipe_op)op), (int)v[1]);
        const bool compute = op == FF_PIPE_FORWARD || op == FF_PIPE_BACKWARD;
        ff_trace_slice s = {.track = t->pipe_track[r->rank], .name = name, .cat = compute ? "pipe compute" : "pipe transfer",
                            .start_ns = r->start_ns + (int64_t)(v[3] * 1e9), .end_ns = r->start_ns + (int64_t)(v[4] * 1e9)};
        ff_controller_trace_slice(t->c, &s);
    }
    if (last < first) return;
    /* the step on this rank, first instruction to last: its bubble is what compute leaves */
    ff_trace_slice s = {.track = t->pipe_track[r->rank], .name = node, .cat = "pipe step",
                        .start_ns = r->start_ns + (int64_t)(first * 1e9), .end_ns = r->start_ns + (int64_t)(last * 1e9)};
    ff_controller_trace_slice(t->c, &s);
}

void ex_trace_transition(ex_run *x, const char *label, int64_t start_ns, int64_t end_ns, int64_t bytes, int64_t bytes_max) {
    ex_trace *t = x->tr;
    if (!t || !start_ns || end_ns < start_ns) return;
    if (!t->sync_track && (t->sync_track = ff_controller_trace_track(t->c, "weight transitions")) <= 0) return;
    ff_arg args[3] = {ff_arg_int("iteration", x->cur ? x->cur->it : x->iteration), ff_arg_int("bytes", bytes),
                      ff_arg_int("bytes_max_rank", bytes_max)};
    ff_trace_slice s = {.track = t->sync_track, .name = label, .cat = "weight sync", .start_ns = start_ns, .end_ns = end_ns,
                        .args = args, .nargs = 3};
    ff_controller_trace_slice(t->c, &s);
}

void ex_trace_lost(ex_run *x, int rank, const char *why) {
    ex_trace *t = x->tr;
    if (!t || rank < 0 || rank >= EX_MAX_RANKS || t->lost[rank]) return;
    t->lost[rank] = true;
    char name[256];
    snprintf(name, sizeof name, "worker %d lost (%s)", rank, why);
    ff_controller_trace_instant(t->c, t->iter_track, name, ff_now_ns());
}

void ex_trace_load(ex_run *x, int rank, const char *label, int64_t start_ns, int64_t end_ns, int64_t bytes) {
    ex_trace *t = x->tr;
    if (!t || rank < 0 || rank >= EX_MAX_RANKS || end_ns < start_ns) return;
    if (!t->load_track[rank]) {
        char tn[64];
        snprintf(tn, sizeof tn, "rank %d: weights", rank);
        if ((t->load_track[rank] = ff_controller_trace_track(t->c, tn)) <= 0) return;
    }
    ff_arg a[1] = {ff_arg_int("bytes", bytes)};
    ff_trace_slice s = {.track = t->load_track[rank], .name = label, .cat = "weights load", .start_ns = start_ns, .end_ns = end_ns,
                        .args = a, .nargs = 1};
    ff_controller_trace_slice(t->c, &s);
}
