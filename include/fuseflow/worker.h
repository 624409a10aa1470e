/* fuseflow: the worker process.
 *
 * A worker connects a ZeroMQ DEALER to the controller's ROUTER, says hello, and from then on
 * runs the subtasks it is sent. One libev loop owns the socket; handlers run on a separate
 * compute thread (one per worker: a worker is one device), so heartbeats are answered while
 * a long subtask runs. Handlers registered with FF_TASK_INLINE run on the loop thread
 * instead: for kinds that take microseconds and never block (echo, lookups), where the hop
 * to the compute thread would cost more than the work.
 *
 * A handler reads its subtask (kind, args, input tensors), writes output tensors, and
 * returns 0, or -1 with a message (ff_error_set, or ff_task_fail for a specific status).
 * Long handlers poll ff_task_cancelled() and return -1 when it turns true.
 *
 * Liveness: the controller's welcome names its heartbeat period and timeout. A worker that
 * hears nothing from the controller for that timeout says hello once more (a controller that
 * declared it dead takes it back under its rank) and, without an answer within another
 * timeout, exits on its own (no orphans); one that gets no welcome within
 * connect_timeout_s exits too. SIGTERM and SIGINT, like a
 * shutdown message, cancel queued work and exit cleanly.
 *
 * Groups: a group-setup message makes the worker join the group's communicator
 * (fuseflow/coll.h) on the compute thread, in order with its subtasks; handlers of that
 * group's subtasks get it from ff_task_comm(). The built-in "collective" kind runs
 * all-reduce, broadcast, all-gather and reduce-scatter on it.
 *
 * Not here: scheduling (the controller decides what runs where), model state (later
 * handlers keep it in their user data).
 */
#ifndef FUSEFLOW_WORKER_H
#define FUSEFLOW_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/dtype.h"
#include "fuseflow/msgs.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef struct ff_worker ff_worker;
typedef struct ff_task ff_task;
typedef struct ff_coll_comm ff_coll_comm;

typedef struct ff_worker_opts {
    const char *connect;        /* the controller's endpoint: ipc://PATH or tcp://HOST:PORT */
    int rank;                   /* requested rank, -1 (default): the controller picks */
    const char *device;         /* reported in the hello ("cpu" by default) */
    const char *curve_key_file; /* worker key file from `fuseflow keygen` (NULL: no CURVE) */
    double connect_timeout_s;   /* exit if no welcome arrives within this (default 30) */
    double orphan_timeout_s;    /* exit after this much silence from the controller
                                   (0, the default: the timeout the welcome names) */
    size_t max_frame_bytes;     /* largest tensor frame accepted (0: 1 GiB) */
    bool no_builtin_kinds;      /* do not register the generic kinds (sleep, echo, ...) */
    const char *host;           /* host name reported in the hello, by which `fuseflow run` places
                                   ranks (NULL: gethostname; a Slurm job passes its node name) */
    int local_index;            /* its place among its host's workers (its rail where the hosts
                                   have rails; a Slurm job passes SLURM_LOCALID); -1 (default):
                                   not given */
} ff_worker_opts;

void ff_worker_opts_default(ff_worker_opts *o);

/* Fill d with what this process sees of its machine (workers/devices.c): never fails, what
 * cannot be read is none; with no GPU, why (no driver, no device) goes to why. The hello
 * carries d. */
void ff_devices_probe(ff_devices *d, char *why, size_t cap);

/* Create a worker (socket configured and connected, nothing sent yet). NULL + error. */
ff_worker *ff_worker_new(const ff_worker_opts *o);
void ff_worker_destroy(ff_worker **w);

/* Handlers. */
enum { FF_TASK_INLINE = 1 }; /* run on the loop thread: must not block */
typedef int (*ff_task_fn)(ff_task *t, void *ud);
/* Register (or replace) the handler of `kind` before ff_worker_run. 0 or -1 + error. */
int ff_worker_register(ff_worker *w, const char *kind, ff_task_fn fn, void *ud, unsigned flags);

/* Run until the controller says shutdown or a signal asks for it (returns 0), or until the
 * controller is gone, refuses us or never answers (returns -1 + error naming why). */
int ff_worker_run(ff_worker *w);

/* Ask a worker to stop: ff_worker_run returns 0 soon after (thread-safe; not from a signal
 * handler). */
void ff_worker_stop(ff_worker *w);

/* Rank the controller assigned (-1 before the welcome). */
int ff_worker_rank(const ff_worker *w);

/* A whole worker process's life: make the worker, call setup(w, ud) (NULL: none; the place
 * to register a program's own kinds next to the generic ones), run it with SIGTERM/SIGINT
 * as "stop", destroy it. 0 after a shutdown request or a signal; -1 + error when the worker
 * cannot start, setup fails ("setup: ...") or ff_worker_run fails. ud stays the caller's.
 * Parsing a command line into the options is the program's: `fuseflow worker`
 * (cli/cmd_worker.c) reads the one ff_controller_spawn passes (controller.h). */
typedef int (*ff_worker_setup_fn)(ff_worker *w, void *ud);
int ff_worker_serve(const ff_worker_opts *o, ff_worker_setup_fn setup, void *ud);

/* ---- inside a handler --------------------------------------------------------------- */
uint64_t ff_task_id(const ff_task *t);
const char *ff_task_kind(const ff_task *t);
const char *ff_task_group(const ff_task *t); /* "" when none */
const ff_msg_subtask *ff_task_subtask(const ff_task *t); /* args: ff_msg_arg_int(...) etc. */
int ff_task_rank(const ff_task *t);          /* this worker's rank */

int ff_task_ninputs(const ff_task *t);
const ff_tensor *ff_task_input(const ff_task *t, int i);
/* By name; NULL + error naming the tensor and the kind when absent. */
const ff_tensor *ff_task_input_named(const ff_task *t, const char *name);

/* A new output tensor: returns a buffer of numel * dtype size bytes (64-byte aligned,
 * uninitialised) that travels to the controller without a copy. NULL + error. */
void *ff_task_output(ff_task *t, const char *name, ff_dtype dtype, int ndim, const int64_t *shape);
/* Send input i back as an output (shared, not copied); name NULL keeps the input's. */
int ff_task_output_input(ff_task *t, int i, const char *name);

/* Has the controller cancelled this subtask (or is the worker shutting down)? */
bool ff_task_cancelled(const ff_task *t);
/* Fail with a specific status (FF_STATUS_BAD_REQUEST, ...) and message; returns -1. */
int ff_task_fail(ff_task *t, ff_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- deferred tasks: work that spans several subtasks ---------------------------------
 * Continuous batching needs many subtasks in flight inside one engine (a generation batch
 * that requests join and leave). A handler on the compute thread may defer its task: it
 * calls ff_task_defer(t), keeps t (its inputs stay valid), and returns 0; no result goes
 * out yet. The task is finished later, on the compute thread, by ff_task_complete(t, rc)
 * (rc 0: OK with the outputs added by ff_task_output; -1: failed with the current error or
 * ff_task_fail's status). While deferred tasks exist and no new subtask waits, the compute
 * thread calls the worker's step hook again and again (ff_worker_set_step): the place to
 * advance the engine one step and complete what finished. New subtasks run between steps,
 * in arrival order, so requests join a running batch.
 * Cancellation: ff_task_cancelled(t) turns true for a deferred task the controller cancels;
 * the hook should complete it with -1 (status CANCELLED). When the worker stops, every
 * deferred task is cancelled and the hook is called until none is left (after 100 calls
 * that finish nothing, the rest fail as cancelled; never touch them afterwards). A hook that
 * returns -1 fails every deferred task with its error (the hook must forget them all).
 * Inline handlers cannot defer. */
int ff_task_defer(ff_task *t);
/* Finish a deferred task (compute thread; not from the task's own handler). */
void ff_task_complete(ff_task *t, int rc);
typedef int (*ff_worker_step_fn)(ff_worker *w, void *ud);
/* Set the step hook (before ff_worker_run). ud stays the caller's. */
void ff_worker_set_step(ff_worker *w, ff_worker_step_fn fn, void *ud);
/* Deferred tasks not completed yet (any thread). */
int ff_worker_deferred(ff_worker *w);

/* The communicator of the subtask's group on this worker, or NULL (not a member, no group
 * set up, or called from an inline handler). */
ff_coll_comm *ff_task_comm(const ff_task *t);
/* This worker's index in the subtask's group, -1 when not a member. */
int ff_task_group_index(const ff_task *t);
int ff_task_group_size(const ff_task *t);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
