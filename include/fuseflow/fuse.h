/* fuseflow: RLHFuse's intra-stage fusion as a scheduling problem. Several pipelines (the actor,
 * and the critic as one or more data-parallel replicas laid out in the opposite direction) train
 * on the same nodes at once; a schedule orders every node's forwards and backwards so that each
 * model fills the others' bubbles. This header holds the problem (an instance), a schedule of
 * it, the event simulator that scores a schedule (makespan, activation memory, deadlock), lower
 * bounds, the serial baseline, the solver, and the translation of a schedule into the pipeline
 * executor's instruction streams (fuseflow/pipeline.h) that the workers follow.
 *
 * The instance (JSON, docs/pipeline.md "Fused actor and critic"):
 *     {"nodes": 4,
 *      "models": [{"name": "actor", "stages": [0,1,2,3], "micro_batches": 8,
 *                  "forward": 3, "backward": 6, "activation": 1.0}, ...]}
 * Stage s of a model runs on node stages[s]; a micro-batch's forward runs through stages
 * 0..S-1, its backward from S-1 back to 0; forward/backward are one micro-batch's time on one
 * stage; activation is what a node's memory rises by at a forward of that model there and
 * falls by at its backward. A node runs one task at a time, in the order of its list, and on a
 * node the k-th forward (and the k-th backward) of a model is that model's micro-batch k.
 *
 * Not here: measuring the times (the executor, workers/pipe), running the schedule (the
 * executor follows ff_fuse_to_pipe's streams), choosing fused against serial in a run. */
#ifndef FUSEFLOW_FUSE_H
#define FUSEFLOW_FUSE_H

#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

#define FF_FUSE_MAX_MODELS FF_PIPE_MAX_MODELS
#define FF_FUSE_MAX_NODES 64
#define FF_FUSE_MAX_MICRO 4096         /* micro-batches of one model */

typedef struct ff_fuse_model {
    char name[64];
    /* Models of one family are replicas of one model (the critic's data-parallel copies): the
     * serial baseline runs them side by side and the picture gives them one colour. The JSON
     * key "family"; without it, the name less its trailing digits ("critic1" -> "critic"). */
    char family[64];
    int32_t n_stages;                  /* S >= 1 */
    int32_t stages[FF_FUSE_MAX_NODES]; /* [S] node of each stage, all different */
    int32_t micro;                     /* micro-batches m >= 1 */
    double fwd, bwd;                   /* one micro-batch on one stage, > 0 (any unit; seconds when measured) */
    double act;                        /* activation memory of one micro-batch on one stage, >= 0 */
} ff_fuse_model;

typedef struct ff_fuse_instance {
    int32_t nodes;                     /* 1 .. FF_FUSE_MAX_NODES */
    int32_t n_models;                  /* 1 .. FF_FUSE_MAX_MODELS */
    ff_fuse_model models[FF_FUSE_MAX_MODELS];
    double hop_latency;                /* added between a stage's end and the next stage's start (0: free) */
} ff_fuse_instance;

typedef struct ff_fuse_task {
    uint8_t model;                     /* index into the instance's models */
    uint8_t backward;                  /* 0: forward ("F"), 1: backward ("B") */
} ff_fuse_task;

/* Per node, the ordered tasks: node n runs tasks[n][0 .. n_tasks[n]-1]. A complete schedule
 * has, on every node a model has a stage on, that model's m forwards and m backwards. */
typedef struct ff_fuse_schedule {
    int32_t nodes;
    int64_t *n_tasks;                  /* [nodes], owned */
    ff_fuse_task **tasks;              /* [nodes][n_tasks[n]], owned */
    int64_t *cap;                      /* [nodes] room in tasks[n], owned */
} ff_fuse_schedule;


/* ---- instances and schedules (dataflow/fuse.c) ---------------------------------------- */

/* Parse an instance from JSON text (where: the file name for errors). Checks every field and
 * range (unknown keys are errors naming the key). 0 or -1 + error. */
int ff_fuse_instance_parse(const char *json, const char *where, ff_fuse_instance *out);
int ff_fuse_instance_read(const char *path, ff_fuse_instance *out);

int ff_fuse_schedule_init(ff_fuse_schedule *s, int32_t nodes); /* empty lists; 0 or -1 + error */
void ff_fuse_schedule_free(ff_fuse_schedule *s);                  /* and zero it; safe on a zeroed one */
int ff_fuse_schedule_push(ff_fuse_schedule *s, int32_t node, ff_fuse_task t);
int ff_fuse_schedule_copy(const ff_fuse_schedule *src, ff_fuse_schedule *dst);
/* {"schedule": [[[model, "F"|"B"], ...] per node]} (other keys ignored, so a `--json` answer
 * reads back). 0 or -1 + error. */
int ff_fuse_schedule_parse(const ff_fuse_instance *in, const char *json, const char *where, ff_fuse_schedule *out);

/* ---- scoring ------------------------------------------------------------------------- */

typedef struct ff_fuse_sim {
    double makespan;                      /* end of the last task */
    double peak_activation;               /* max over nodes of node_peak */
    double node_peak[FF_FUSE_MAX_NODES];  /* the highest activation memory on each node */
    double node_busy[FF_FUSE_MAX_NODES];  /* compute time on each node */
} ff_fuse_sim;

/* Simulate: every task starts when its node is free and its dependency (the same micro-batch's
 * previous stage, plus hop_latency) is done. 0, or -1 + error naming the problem when the
 * schedule is incomplete, has a task of a model on a node without its stage, or deadlocks
 * (naming a node and the task it waits at). */
int ff_fuse_simulate(const ff_fuse_instance *in, const ff_fuse_schedule *s, ff_fuse_sim *out);

/* Lower bounds. makespan: of any valid schedule (per node, the preemptive one-machine bound
 * over its tasks with the earliest start and the least remaining time each can have, which
 * covers every model's own critical path). peak_activation: of any schedule that reaches
 * that makespan (ff_fuse_peak_bound at it). docs/pipeline.md "Fused actor and critic". */
void ff_fuse_lower_bounds(const ff_fuse_instance *in, double *makespan, double *peak_activation);
/* The least peak activation memory of any valid schedule whose makespan is at most
 * `makespan`: a faster schedule must keep more micro-batches in flight. At a makespan below
 * the makespan bound (no schedule) it still returns the bound's formula. */
double ff_fuse_peak_bound(const ff_fuse_instance *in, double makespan);

/* The serial baseline: each model's 1F1B, one model after the other (in the instance's order;
 * replicas of one family run side by side). 0 or -1 + error. */
int ff_fuse_serial(const ff_fuse_instance *in, ff_fuse_schedule *out);

/* ---- the solver (dataflow/fuse_solve.c) ---------------------------------------------- */

typedef struct ff_fuse_solve_opts {
    double seconds;   /* wall-clock budget (0: 10 s); it stops earlier at the bounds (dataflow/fuse_solve.c) */
    uint64_t seed;
    int threads;      /* 0: the machine's cores */
    int64_t max_rounds; /* 0: none; else stop after this many rounds of the search (a round: a fixed
                         * number of evaluations per thread), so that the schedule depends on the
                         * instance, the seed and the threads only, never on the machine's load */
    double makespan_slack; /* 0 .. 1 (0: makespan first). F > 0: the least peak activation it finds among
                            * the schedules within (1 + F) x its best makespan (dataflow/fuse_solve.c) */
} ff_fuse_solve_opts;

typedef struct ff_fuse_solve_stats {
    double seconds;          /* spent */
    int64_t evaluations;     /* schedules decoded or simulated */
    bool optimal;            /* makespan equals the lower bound */
} ff_fuse_solve_stats;

/* A valid schedule, makespan first, peak activation memory second, into *out (initialised
 * here); with makespan_slack F > 0, the least peak among those within (1 + F) x the best makespan
 * its makespan search found (a trade: a little time for memory). At the makespan bound (or the
 * slack's cap) most of the time left goes to editing the best schedule's node lists while the peak
 * falls (dataflow/fuse_mem.c). Of the schedules tied on both it looks for one whose executor streams (ff_fuse_to_pipe,
 * whose transfers block) run fastest. Deterministic for a seed and a thread count when it stops
 * before the time: at both bounds, when the peak at the makespan bound stopped improving, or
 * after max_rounds rounds. 0 or -1 + error. */
int ff_fuse_solve(const ff_fuse_instance *in, const ff_fuse_solve_opts *o, ff_fuse_schedule *out,
                  ff_fuse_solve_stats *stats);

/* Under a memory cap: the fastest schedule whose peak activation is at most peak_cap (the
 * instance's units; e.g. a multiple of the serial 1F1B's peak). ff_fuse_solve at o's makespan
 * slack 0, then, where its peak is over the cap, at slacks of 1%, 2%, 5%, 10%, 20%, 50% and 100%
 * (o->makespan_slack is ignored), the first whose peak fits. *slack: the slack of the schedule
 * in *out, or -1 where none fits (*out then holds the one with the least peak of those tried).
 * 0 or -1 + error (the solver's). */
int ff_fuse_solve_capped(const ff_fuse_instance *in, const ff_fuse_solve_opts *o, double peak_cap, ff_fuse_schedule *out,
                         ff_fuse_solve_stats *stats, double *slack);

/* An SVG of the per-node timeline (one row per node, one colour per model family). */
int ff_fuse_write_svg(const ff_fuse_instance *in, const ff_fuse_schedule *s, const char *path);

/* ---- execution (dataflow/fuse_pipe.c) ------------------------------------------------- */

/* The executor's instruction streams for a valid schedule: one pipeline model per instance
 * model (model i of the schedule is model i of the instance), ranks = nodes, each node's
 * forwards and backwards in the schedule's order, each send right after its producer and each
 * receive before its consumer (sends that do not block: out->eager_sends; they cannot
 * deadlock), and one OPTIMIZER_STEP per model on each of its ranks after its last backward
 * there. layers[i] (or NULL: none placed) splits model i's layers over
 * its stages evenly. *out is initialised here. 0 or -1 + error. */
int ff_fuse_to_pipe(const ff_fuse_instance *in, const ff_fuse_schedule *s, const int64_t *layers,
                    ff_pipe_schedule *out);

/* What runs: the makespan of s's executor streams (ff_fuse_to_pipe) in the pipeline simulator
 * (ff_pipe_simulate) with the instance's times and hop latency, sends not blocking as the
 * executor makes them. It equals ff_fuse_simulate's makespan (the streams wait only where the
 * fused schedule waits for an input; tests/dataflow/test_fuse_pipe.c). -1 + error. */
double ff_fuse_streams_makespan(const ff_fuse_instance *in, const ff_fuse_schedule *s);

/* ---- activation memory of a stage (dataflow/fuse_act.c) ------------------------------------- */

#define FF_FUSE_ACT_COEFF 34.0 /* bytes per token per hidden unit of one layer (the planner's default) */

/* The activation bytes one micro-batch of `tokens` keeps on a stage of `layers` layers of
 * hidden size `hidden`: layers x ff_plan_layer_activation_bytes(34, tokens, hidden), Megatron's
 * count of a layer's saved 16-bit activations (no attention scores: a fused kernel), not
 * fuseflow's fp32 workspace; what the solver weighs is the models' ratio. The instance's `act`
 * wherever a run measures it (ff_pipe_fuse_instance, `fuseflow run`'s fuse: auto). */
double ff_fuse_stage_activation(double layers, double tokens, int64_t hidden);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
