/* fuseflow: the controller, the single process that dispatches subtasks to workers.
 *
 * The controller binds a ZeroMQ ROUTER (ipc:// on one host, tcp:// across hosts, CURVE
 * when given a key file) and runs a libev loop: its own, or one the embedding program owns
 * and runs (opts.loop). Workers join with a hello (local ones are started by
 * ff_controller_spawn, remote ones run `fuseflow worker --connect ...`), get a rank, and are
 * pinged every heartbeat_s; a worker silent for timeout_s, whose process exits, or whose
 * connection drops is declared dead.
 *
 * Work is submitted as jobs. A job is one subtask sent to a rank (FF_TARGET_RANK), to
 * whichever live member of a group has room (FF_TARGET_ANY), or one subtask per member of
 * a group (FF_TARGET_GROUP: inputs replicated; FF_TARGET_GROUP_SPLIT: inputs marked split
 * are cut along dimension 0 by the members' data-parallel rank, the rest replicated). The
 * job's callback fires exactly once, with one result per subtask, from the loop.
 *
 * Backpressure: at most max_inflight subtasks are in flight per worker; the rest wait in
 * the controller, in order (per rank, per group). A group job goes out to all members at
 * once, when every member has room, so all members see group jobs in the same order (what
 * collectives need). With max_pending set, submit refuses work beyond that many waiting.
 *
 * Failures: when a worker dies, its in-flight idempotent subtasks of FF_TARGET_ANY jobs are
 * sent to another live member (up to max_attempts dispatches); every other subtask it held
 * completes with FF_STATUS_WORKER_LOST. A result is accepted only from the worker the
 * subtask is currently assigned to and only once: late, duplicate or stale results are
 * counted (stats.duplicates) and dropped, so no result is lost or counted twice.
 *
 * Timelines: with tracing on, every subtask's dispatch (controller clock), start and end
 * (worker clock, mapped onto the controller's with an offset estimated from heartbeats:
 * NTP-style, the sample with the smallest round trip wins) are kept and written as Chrome
 * Trace Event JSON (ff_controller_trace_write; docs/runtime.md describes it), with the
 * events a client adds (its own tracks, slices, instants, arrows, and dependencies between
 * jobs: ff_controller_trace_*). Reading such a file back is fuseflow/trace_summary.h.
 *
 * Threading: every function must be called from the thread that runs the loop. Callbacks
 * may submit and cancel; they must not run the loop (run, run_until, poll, wait_workers,
 * group_create) nor destroy the controller.
 */
#ifndef FUSEFLOW_CONTROLLER_H
#define FUSEFLOW_CONTROLLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/dtype.h"
#include "fuseflow/msgs.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

struct ev_loop;
typedef struct ff_controller ff_controller;

typedef struct ff_controller_opts {
    const char *endpoint;       /* bind here; NULL: a fresh ipc:// socket in $TMPDIR (or /tmp).
                                   tcp://HOST:0 picks a free port (see ff_controller_endpoint) */
    const char *curve_key_file; /* controller.key from `fuseflow keygen`: CURVE on every endpoint */
    const char *worker_key_file;/* worker.key, passed to workers spawned here when CURVE is on */
    struct ev_loop *loop;       /* the embedding program's loop (it runs it); NULL: our own */
    double heartbeat_s;         /* ping period (default 0.5) */
    double timeout_s;           /* silence after which a worker is dead (default 5) */
    int max_inflight;           /* subtasks in flight per worker (default 64) */
    int max_pending;            /* subtasks waiting in the controller; 0 = unlimited */
    int max_attempts;           /* dispatches of an idempotent subtask (default 3) */
    size_t max_frame_bytes;     /* largest tensor frame accepted (default 1 GiB) */
    const char *worker_bin;     /* program exec'd for local workers, run as `BIN worker --connect
                                   ENDPOINT --rank N --connect-timeout S [--curve FILE]
                                   [--log LEVEL]` (what `fuseflow worker` parses, into
                                   ff_worker_opts for ff_worker_serve); NULL: $FF_BIN, else
                                   this program (/proc/self/exe) */
    const char *worker_log;     /* --log level for spawned workers (NULL: they read FF_LOG) */
    bool worker_pgroup;         /* start local workers in process groups of their own, so the
                                   terminal's Ctrl-C (SIGINT to the foreground group) reaches the
                                   controller only, which can then save and shut them down */
    bool trace;                 /* record subtask timelines (ff_controller_trace_write) */
    const char *trace_path;     /* implies trace; written by ff_controller_destroy */
} ff_controller_opts;

void ff_controller_opts_default(ff_controller_opts *o);

/* Bind the socket and set up the loop's watchers. NULL + error. */
ff_controller *ff_controller_new(const ff_controller_opts *o);
/* Shut down (if not done yet), write the trace (trace_path), free everything, NULL *c. */
void ff_controller_destroy(ff_controller **c);

/* The bound endpoint as workers should connect to it (tcp port resolved). */
const char *ff_controller_endpoint(const ff_controller *c);
struct ev_loop *ff_controller_loop(const ff_controller *c);

/* ---- running the loop ------------------------------------------------------------------- */
/* Run the loop until every submitted job has completed (0) or timeout_s passes (-1 + error
 * saying how many jobs are left). timeout_s <= 0 means no limit. */
int ff_controller_run(ff_controller *c, double timeout_s);
/* Run until done(ud) returns true (0) or the timeout (-1 + error). */
int ff_controller_run_until(ff_controller *c, bool (*done)(void *ud), void *ud, double timeout_s);
/* One loop iteration; blocks for at most the next event when block is true. */
void ff_controller_poll(ff_controller *c, bool block);

/* ---- workers ---------------------------------------------------------------------------- */
/* Start n local worker processes (fork/exec of worker_bin) on the next free ranks. Returns
 * the first rank, or -1 + error. They join asynchronously: ff_controller_wait_workers.
 * More than ff_controller_local_worker_limit are refused before any starts. */
int ff_controller_spawn(ff_controller *c, int n);
/* How many more local workers this machine can run next to the controller (c may be NULL:
 * none started yet): the least of 16 per core, the descriptors RLIMIT_NOFILE leaves (2 per
 * worker in the controller), RLIMIT_NPROC (8 threads per worker) and memory (32 MiB per
 * worker before any model). why (cap bytes) names the bound that binds. */
int ff_controller_local_worker_limit(const ff_controller *c, char *why, size_t cap);
/* Run the loop until at least n workers are live (0), or until the timeout or a local
 * worker exiting before its hello (-1 + error naming the ranks missing and why). */
int ff_controller_wait_workers(ff_controller *c, int n, double timeout_s);
/* Ping the live workers among ranks and run the loop until each has answered a ping sent
 * now, or has been declared dead (a local worker that exited: once its connection is gone;
 * a silent one: after opts.timeout_s), or timeout_s passed. Returns how many of ranks are
 * dead or stopped, or -1 + error (timeout, or from inside a callback). A failure that one
 * worker reports is often the echo of another's death not declared yet (a collective whose
 * peer was killed): confirm the peers before blaming the living. */
int ff_controller_confirm_live(ff_controller *c, const int *ranks, int n, double timeout_s);

typedef enum ff_worker_state {
    FF_WORKER_SPAWNED = 0, /* started here, no hello yet */
    FF_WORKER_LIVE,
    FF_WORKER_DEAD,        /* timed out, exited, or disconnected */
    FF_WORKER_STOPPED,     /* shut down on request */
} ff_worker_state;

const char *ff_worker_state_name(ff_worker_state s);

typedef struct ff_worker_info {
    int rank;
    ff_worker_state state;
    bool local;               /* spawned by this controller */
    int64_t pid;
    char host[FF_MSG_NAME_MAX];
    char device[FF_MSG_NAME_MAX];
    ff_devices devices;       /* its cores and GPUs (its hello) */
    int ncaps;
    char caps[FF_MSG_MAX_CAPS][FF_MSG_NAME_MAX];
    int inflight;             /* subtasks in flight on it now */
    uint64_t completed;       /* results accepted from it */
    double clock_offset_us;   /* its clock minus ours (estimate) */
    double rtt_us;            /* round trip of the heartbeat the estimate comes from: the true
                                 offset lies within clock_offset_us +- rtt_us / 2 (-1: none yet) */
    uint32_t busy;            /* subtasks it reported queued or running (last pong) */
    uint64_t errors;          /* messages it reported rejecting (last pong) */
    char dead_reason[FF_MSG_TEXT_MAX];
    int exit_code;            /* local workers that exited: the status, 128 + signal if killed;
                                 -1 while running (or not started here) */
} ff_worker_info;

/* Number of ranks ever seen (the highest rank + 1). */
int ff_controller_nranks(const ff_controller *c);
/* Ranks in a state (ff_worker_state); -1 counts every rank ever seen. */
int ff_controller_count_workers(const ff_controller *c, int state);
/* 0 and *out, or -1 + error for a rank never seen. */
int ff_controller_worker_info(const ff_controller *c, int rank, ff_worker_info *out);
/* What the worker computes on, as its client knows it once it has placed its work (`fuseflow run`
 * gives a worker that said "cpu" in its hello a GPU): ff_worker_info.device and the trace's
 * process name say it from then on. 0, or -1 + error for a rank never seen. */
int ff_controller_set_worker_device(ff_controller *c, int rank, const char *device);

/* ---- groups ----------------------------------------------------------------------------- */
typedef struct ff_group_opts {
    const char *backend;   /* collectives: "none" (default), "cpu", "nccl" */
    double timeout_s;      /* setup and collective timeout (default 60) */
    const int *dp_rank;    /* data-parallel rank of each member (NULL: member index) */
} ff_group_opts;

/* Create (or rebuild, same name) a group of live ranks and tell each member; with a
 * collectives backend the members build their communicator (member 0 makes the unique id).
 * Runs the loop until every member confirmed (0) or one failed / the timeout (-1 + error). */
int ff_controller_group_create(ff_controller *c, const char *name, const int *ranks, int n,
                               const ff_group_opts *o);
/* Members of a group (*n set), or NULL + error. */
const int *ff_controller_group_ranks(const ff_controller *c, const char *name, int *n);

/* ---- jobs ------------------------------------------------------------------------------- */
typedef enum ff_target {
    FF_TARGET_RANK = 0,     /* spec.rank */
    FF_TARGET_ANY,          /* the least loaded live member of spec.group */
    FF_TARGET_GROUP,        /* every member of spec.group, inputs replicated */
    FF_TARGET_GROUP_SPLIT,  /* every member; inputs with split=true cut by DP rank along dim 0 */
} ff_target;

/* An input tensor. With free_fn the bytes are handed over without a copy and freed with
 * free_fn(data, hint) once no frame needs them (possibly on a ZeroMQ thread); without,
 * they are copied during submit. */
typedef struct ff_input {
    const char *name;
    ff_dtype dtype;
    int ndim;
    const int64_t *shape;
    void *data;
    void (*free_fn)(void *data, void *hint);
    void *hint;
    bool split; /* FF_TARGET_GROUP_SPLIT: cut along dim 0 (else every member gets it all) */
} ff_input;

typedef struct ff_subtask_spec {
    const char *kind;
    ff_target target;
    int rank;              /* FF_TARGET_RANK */
    const char *group;     /* the other targets (also labels a rank's subtask when set) */
    const ff_arg *args;
    int nargs;
    const ff_input *inputs;
    int ninputs;
    bool idempotent;       /* may run again elsewhere if its worker dies (FF_TARGET_ANY) */
    const uint64_t *after; /* jobs (or job slices) it waited for: the trace's dependencies */
    int nafter;
    const char *label;     /* its name in the trace (default: kind) */
} ff_subtask_spec;

typedef struct ff_result {
    uint64_t id;              /* the subtask (one per member for group jobs) */
    int rank;                 /* the worker that answered (or last held it) */
    int member;               /* index in the group for group jobs, else -1 */
    ff_status status;
    const char *error;        /* "" when OK */
    int noutputs;
    const ff_tensor *outputs; /* valid only during the callback */
    int64_t dispatch_ns;      /* controller clock (ff_now_ns): last dispatch */
    int64_t start_ns, end_ns; /* on the worker, mapped to the controller clock (0 if never run) */
    int64_t done_ns;          /* when the result arrived */
    int attempts;             /* dispatches */
    uint32_t queued;          /* subtasks the worker held (queued or running) when it arrived */
    const ff_msg *msg;        /* the worker's result message (NULL for results made up here):
                                 ff_tensor_ref_new(msg, i) keeps output i past the callback,
                                 without a copy */
} ff_result;

typedef void (*ff_done_fn)(ff_controller *c, uint64_t job, const ff_result *results, int nresults, void *ud);

/* Submit a job. Returns its id (> 0), or 0 + error (unknown kind name or group, rank never
 * seen, bad inputs, max_pending reached); on error, inputs' free_fn have been called. The
 * callback never runs inside submit. */
uint64_t ff_controller_submit(ff_controller *c, const ff_subtask_spec *spec, ff_done_fn done, void *ud);

/* Cancel a job: waiting subtasks complete as FF_STATUS_CANCELLED at once, running ones are
 * asked to stop (their result says what happened). 0, or -1 if the job is unknown or done. */
int ff_controller_cancel(ff_controller *c, uint64_t job);

/* Jobs whose callback has not run yet; subtasks waiting; subtasks in flight. */
/* The rank running a one-subtask job's subtask now, or -1 (waiting, done, unknown id, a
 * group job): where an FF_TARGET_ANY job went. */
int ff_controller_job_rank(const ff_controller *c, uint64_t job);
int ff_controller_jobs_outstanding(const ff_controller *c);
int ff_controller_pending(const ff_controller *c);
int ff_controller_inflight(const ff_controller *c);

/* ---- shutting down ---------------------------------------------------------------------- */
/* Complete waiting subtasks as FF_STATUS_SHUTDOWN, tell every worker to stop, collect the
 * results they still send, wait for local workers to exit (SIGKILL after timeout_s), and
 * complete anything unanswered as FF_STATUS_SHUTDOWN. 0, or -1 + error if a local worker
 * had to be killed. */
int ff_controller_shutdown(ff_controller *c, double timeout_s);

/* ---- statistics ------------------------------------------------------------------------- */
typedef struct ff_controller_stats {
    uint64_t jobs_submitted, jobs_completed;
    uint64_t subtasks_ok, subtasks_failed; /* failed: any status but OK */
    uint64_t redispatched;   /* subtasks sent again after their worker died */
    uint64_t duplicates;     /* results dropped: stale, duplicate, or from the wrong worker */
    uint64_t workers_joined, workers_died;
    uint64_t auth_rejected;  /* CURVE clients refused */
    uint64_t unknown_peer;   /* messages from peers that never said hello */
    uint64_t unexpected;     /* valid messages that make no sense at the controller */
    ff_msg_stats wire;       /* decoder counters: received, rejected by reason */
} ff_controller_stats;

void ff_controller_stats_get(const ff_controller *c, ff_controller_stats *out);

/* ---- timelines -------------------------------------------------------------------------- */
/* Write the recorded subtasks and what clients added (below) as one Chrome Trace Event JSON
 * file (opens in Perfetto; docs/runtime.md describes it). 0 / -1. */
int ff_controller_trace_write(const ff_controller *c, const char *path);

/* A client's own events in the same trace (an RL controller's controller-side work, its
 * stages): on tracks of process 0 (the controller), at times on the controller's clock
 * (ff_now_ns). Each call fails (-1 or 0 + error) when tracing is off.
 *
 * Dependencies: a job's `after` (ff_subtask_spec.after, ff_trace_slice.after) names the jobs
 * it waited for, by id: a submitted job's, or a slice recorded with job set. The file shows
 * each dependency as an arrow (cat "after") and keeps the lists in the slices' args, from
 * which `fuseflow trace summary` finds the longest chain of dependent jobs. */

/* The track called name: its id (>= 1; the same name gives the same track), -1 + error. */
int ff_controller_trace_track(ff_controller *c, const char *name);

typedef struct ff_trace_slice {
    int track;                /* from ff_controller_trace_track */
    const char *name;
    const char *cat;          /* its category (NULL: "client") */
    int64_t start_ns, end_ns; /* controller clock (ff_now_ns); end >= start */
    bool job;                 /* a unit of work: it takes part in chains of dependent jobs, and
                                 jobs submitted later may name its id in their after */
    const char *kind;         /* a job's kind in the summary (NULL: cat) */
    const uint64_t *after;    /* jobs only: the jobs (or job slices) it waited for */
    int nafter;
    const ff_arg *args;       /* shown with it (copied) */
    int nargs;
} ff_trace_slice;

/* Record a slice: its id (> 0, an id no job or subtask has), or 0 + error. */
uint64_t ff_controller_trace_slice(ff_controller *c, const ff_trace_slice *s);
/* Record an instant event on a track: its id, or 0 + error. */
uint64_t ff_controller_trace_instant(ff_controller *c, int track, const char *name, int64_t t_ns);
/* A sample of counters in worker `rank`'s process (Trace Event ph C: Perfetto draws each
 * series as a graph over time): values are numbers (FF_ARG_INT or FF_ARG_FLOAT), one series
 * per key, under `name`. 0 / -1 + error (no such worker, a value that is not a number). */
int ff_controller_trace_counter(ff_controller *c, int rank, const char *name, int64_t t_ns, const ff_arg *values, int n);
/* An arrow from the end of `from` to the start of `to`, each a job (drawn at its first
 * subtask that ran) or a recorded slice. Arrows to things that never ran are left out of
 * the file. 0 / -1 + error (an id never given out). */
int ff_controller_trace_flow(ff_controller *c, uint64_t from, uint64_t to, const char *name);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
