/* fuseflow: the executor (the RL controller), `fuseflow run` as a library: a run config's
 * algorithm graph executed on worker processes, iteration after iteration.
 *
 * Controller side (ff_exec_run): the run config is loaded and checked (docs/graphs.md),
 * the roles are placed on worker ranks (colocated roles share processes; the actor's
 * generation runs on the training ranks or, with roles.actor.rollout.workers, on a pool of
 * its own), local workers are started, and each iteration runs the graph through the
 * scheduling view of graph.h: sample-level nodes run per sample (generation per prompt
 * group, n responses sharing one prefill) as soon as their inputs exist, group nodes per
 * prompt group, batch nodes and training as barriers, or stage after stage with
 * `schedule: serial`. Rewards, advantages and filters run on the controller (the
 * registry's functions); generation, log-probs, values, reward models and training run on
 * workers. Training draws mini-batches at random from the whole batch, splits each over the
 * role's DP ranks and into micro-batches balanced by token count (roles.h), one optimizer
 * step per mini-batch with gradients all-reduced inside the group; the actor's weights then
 * go to the generating actor (a local copy when colocated, a broadcast inside a "sync"
 * group otherwise; never through the controller). Metrics go to the console and
 * OUT_DIR/metrics.jsonl, held-out exact match every trainer.test_freq iterations,
 * checkpoints every trainer.save_freq iterations and on interruption; docs/run.md has the
 * details (subtask kinds, checkpoint layout, failure rules).
 *
 * The workers serve the rl.* kinds of include/fuseflow/rl_protocol.h (include/fuseflow/rl_worker.h).
 */
#ifndef FUSEFLOW_EXECUTOR_H
#define FUSEFLOW_EXECUTOR_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- controller side -------------------------------------------------------------------------- */
struct ff_controller;

/* What a test or a tool can watch (opts.on_event). */
typedef struct ff_exec_event {
    const char *what;         /* "started" (workers ready), "generating" (an iteration's first
                                 prompts went out), "generated" (a prompt group's responses
                                 arrived), "training" (a train node's rl.train subtasks went
                                 out), "syncing" (a weight sync went out), "iteration" (one
                                 finished), "checkpoint" (saved), "migrating" (a move's
                                 rl.migrate_in went out to its survivor), "migrated" (a
                                 migrated rl.generate came back: its moved samples continue on
                                 the survivor) */
    int64_t iteration;
    int64_t count;            /* "generated": groups done so far in this iteration;
                                 "training": optimizer steps of the node; "migrating",
                                 "migrated": the survivor's rank */
    struct ff_controller *controller;
} ff_exec_event;

typedef struct ff_exec_opts {
    const char *config;        /* run config (YAML) */
    int n_overrides;
    char *const *overrides;    /* "key.sub=value", applied in order */
    int workers;               /* > 0: data-parallel width of the actor (roles.actor.workers=N, and
                                  of the roles colocated with it); 0: as the config says */
    bool resume;               /* continue from the newest checkpoint in OUT_DIR/checkpoints (refused
                                  when the config changes the run: fuseflow/train_dir.h) */
    bool resume_with_changes;  /* with resume: continue even so (the changes are recorded) */
    const char *trace_path;    /* write the run's timeline here (Chrome JSON, Perfetto) */
    const char *worker_bin;    /* program for local workers (NULL: $FF_BIN, else this one) */
    int threads;               /* CPU threads per worker (0: cores / workers, at least 1) */
    int64_t val_limit;         /* held-out prompts per evaluation (0: all) */
    int64_t stop_after;        /* stop with a checkpoint after this iteration (0: run to the end) */
    bool dump_samples;         /* OUT_DIR/samples.jsonl: every sample's prompt, response, score */
    FILE *out;                 /* console: metrics lines and progress (NULL: stdout) */
    int progress;              /* live progress line: 1 on, 0 off, -1 (default) when out is a terminal */
    volatile sig_atomic_t *interrupt; /* set non-zero (Ctrl-C) to save a checkpoint and stop */
    double worker_timeout_s;   /* a worker silent this long is dead (default 10) */
    void (*on_event)(void *ud, const ff_exec_event *e);
    void *event_ud;
    char *out_dir;             /* non-NULL: receives trainer.out_dir (FF_PATH_MAX bytes, util.h) as
                                  soon as the config is read, for what the caller writes there */
    /* Across hosts (docs/run.md "Across hosts"): the controller binds listen (NULL: a fresh
     * ipc:// socket, every worker local), starts local_workers of the run's workers here and
     * waits up to expect_timeout_s for the rest to join (`fuseflow worker --connect LISTEN
     * --curve worker.key`); the ranks are then placed by host, a TP group on one host. */
    const char *listen;        /* tcp://HOST:PORT (or any endpoint ff_controller_opts takes) */
    const char *curve_key_file;/* controller.key (`fuseflow keygen`): CURVE on the listen endpoint */
    const char *worker_key_file;/* worker.key for the local workers (NULL: beside curve_key_file) */
    int local_workers;         /* workers started here: -1 (default) all without listen, 0 with it */
    double expect_timeout_s;   /* wait this long for the workers to join (0: 60 s locally, 600 s
                                  with listen) */
} ff_exec_opts;

void ff_exec_opts_default(ff_exec_opts *o);

/* Exit states of ff_exec_run. */
enum {
    FF_EXEC_DONE = 0,        /* every iteration ran (or stop_after was reached) */
    FF_EXEC_INTERRUPTED = 1, /* stopped on request, with a checkpoint to resume from */
};

/* Run it. Everything it will write (OUT_DIR, its files, the trace) is checked before any
 * work starts. FF_EXEC_DONE or FF_EXEC_INTERRUPTED, or -1 + error (bad config, missing
 * files, an output that cannot be written, a resume whose config differs, a worker that
 * cannot load its model, a dead worker that held training state, a failed write: the
 * message names the problem and, once the run began, the checkpoint to resume from).
 * Workers are shut down either way. */
int ff_exec_run(const ff_exec_opts *o);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
