/* The controller's internal state, shared by its files: controller.c (socket, workers,
 * liveness, processes), sched.c (jobs, queues, dispatch, completion, groups), trace.c
 * (timelines), zap.c (CURVE authentication). Not public API. */
#ifndef FF_CTL_INTERNAL_H
#define FF_CTL_INTERNAL_H

#include <ev.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "msgs/transport.h"
#include "fuseflow/controller.h"
#include "fuseflow/error.h"
#include "fuseflow/msgs.h"
#include "fuseflow/util.h"

/* ---- a u64 -> pointer map (open addressing, linear probing, tombstones) ------------------ */
typedef struct u64map {
    uint64_t *keys; /* 0 = empty, UINT64_MAX = deleted */
    void **vals;
    size_t cap, used, live;
} u64map;

void *u64map_get(const u64map *m, uint64_t key);
int u64map_put(u64map *m, uint64_t key, void *val); /* key != 0, != UINT64_MAX */
void u64map_del(u64map *m, uint64_t key);
void u64map_free(u64map *m);

/* ---- subtasks and jobs ------------------------------------------------------------------ */
typedef enum sub_state { SUB_NEW = 0, SUB_PENDING, SUB_INFLIGHT, SUB_DONE } sub_state;

typedef struct ctl_job ctl_job;
typedef struct ctl_group ctl_group;

typedef struct ctl_sub {
    uint64_t id;
    ctl_job *job;
    int member;      /* index within the job */
    int target_rank; /* fixed worker (RANK and group jobs), -1: any member of job->group */
    int rank;        /* worker holding it while in flight (or last holder) */
    sub_state state;
    int attempts;
    int avoid_rank;  /* a worker that refused its message: another member takes it, if any */
    int status;
    int64_t dispatch_ns, start_ns, end_ns, done_ns;
    int64_t worker_start_ns, worker_end_ns; /* as the worker reported them (its clock) */
    uint32_t queued;
    int32_t send_ns; /* time the last send took (trace) */
    ff_msg *res; /* the worker's result, kept until the whole job completes (group jobs) */
    /* wire: packed header and tensor frames, kept for re-sending */
    uint8_t *hdr;
    uint32_t hdr_len, hdr_cap;
    zmq_msg_t *frames;
    int nframes, frames_cap;
    /* the error text of results made up by the controller: FF_MSG_TEXT_MAX bytes, allocated
     * on the first failure of this (pooled) record, so the hot path carries no 4 KiB */
    char *err;
    struct ctl_sub *next, *prev; /* in a pending queue or a worker's in-flight list */
    bool in_list;
} ctl_sub;

typedef struct sub_list {
    ctl_sub *head, *tail;
    int n;
} sub_list;

struct ctl_job {
    uint64_t id;
    ff_done_fn done;
    void *ud;
    ff_target target;
    ctl_group *group; /* NULL for a rank job without group label */
    bool idempotent, internal, setup;
    int n, ndone;
    ctl_sub **subs;
    ctl_sub *one; /* subs points here when n == 1 */
    int label;    /* trace string ids */
    int group_label, kind;
    size_t after_off;
    int nafter;
    struct ctl_job *next, *prev; /* in a group's queue of group jobs */
    bool queued;
    bool completed;
    bool cancelled; /* a cancel was asked: never dispatched again */
};

typedef struct job_list {
    ctl_job *head, *tail;
    int n;
} job_list;

/* ---- workers and groups ----------------------------------------------------------------- */
#define CTL_CLOCK_SAMPLES 16

typedef struct ctl_worker {
    int rank;
    ff_worker_state state;
    bool local;
    pid_t pid;
    int pidfd;
    ev_io pid_io;
    bool reaped, disconnected;
    bool joined_live; /* has said hello at least once */
    int64_t exited_ns; /* when its local process was seen to exit */
    int64_t disconnected_ns; /* when its lost connection was first seen (local: waiting for the exit) */
    int exit_status;
    uint8_t peer[FF_MSG_MAX_ROUTING_ID];
    size_t peer_len;
    uint64_t peer_key; /* hash of peer, key in ctl->peers */
    char host[FF_MSG_NAME_MAX], device[FF_MSG_NAME_MAX];
    ff_devices devices; /* its hello's */
    int ncaps;
    char (*caps)[FF_MSG_NAME_MAX];
    size_t max_frame; /* the largest tensor frame it accepts (its hello) */
    int inflight;
    uint64_t completed;
    int64_t last_rx_ns, joined_ns;
    uint64_t ping_seq, pong_seq; /* last ping sent, last pong seen */
    int64_t sample_off[CTL_CLOCK_SAMPLES], sample_rtt[CTL_CLOCK_SAMPLES];
    int nsamples, next_sample;
    int64_t offset_ns, best_rtt_ns;
    uint32_t busy;
    uint64_t errors;
    sub_list rank_q;   /* waiting subtasks of RANK jobs */
    sub_list inflight_l;
    int *groups;       /* indices into ctl->groups */
    int ngroups, gcursor;
    char dead_reason[FF_MSG_TEXT_MAX];
    struct ff_controller *c;
} ctl_worker;

typedef enum group_state { GROUP_SETUP = 0, GROUP_READY, GROUP_BROKEN } group_state;

struct ctl_group {
    char name[FF_MSG_NAME_MAX];
    char backend[FF_MSG_NAME_MAX];
    int n;
    int *ranks;
    int *dp_rank;
    int dp_size;
    double timeout_s;
    group_state state;
    char broken[FF_MSG_TEXT_MAX];
    unsigned rr;      /* round-robin cursor of ANY dispatch */
    sub_list any_q;   /* waiting subtasks of ANY jobs */
    job_list job_q;   /* waiting group jobs */
    int label;
};

/* ---- trace records ---------------------------------------------------------------------- */
typedef struct trace_rec {
    uint64_t id, job;
    int rank, member, status, attempts, label, group_label, kind;
    uint32_t queued;
    int64_t dispatch_ns, done_ns, send_ns;
    int64_t worker_start_ns, worker_end_ns; /* worker clock: mapped when the trace is written,
                                               with the best offset estimate by then */
    size_t after_off;
    int nafter;
} trace_rec;

/* What a client added (ff_controller_trace_*): slices and instants on its tracks, arrows. */
typedef enum trace_ev_type { TRACE_SLICE = 0, TRACE_INSTANT, TRACE_FLOW, TRACE_COUNTER } trace_ev_type;

typedef struct trace_ev {
    uint64_t id;
    trace_ev_type type;
    bool job;
    int track;                /* index into ctl_trace.tracks (TRACE_COUNTER: the worker's rank) */
    int name, cat, kind;      /* string ids */
    int64_t start_ns, end_ns; /* controller clock */
    uint64_t from, to;        /* TRACE_FLOW: the slices or jobs it joins */
    size_t after_off, args_off;
    int nafter;
    uint32_t args_len; /* JSON members ("k":v,...) at args_off in ctl_trace.args */
} trace_ev;

typedef struct ctl_trace {
    bool on;
    trace_rec *recs;
    size_t n, cap;
    trace_ev *evs;
    size_t nev, ev_cap;
    int *tracks; /* string id of each track's name */
    int ntracks, tracks_cap;
    uint64_t *after;
    size_t nafter, after_cap;
    char *args;
    size_t nargs, args_cap;
    char **strings;
    int nstrings, strings_cap;
    u64map string_index; /* hash of a string -> its id + 1 */
    int64_t origin_ns;
} ctl_trace;

int trace_intern(ctl_trace *t, const char *s); /* id of s, -1 on out of memory */
int trace_add_after(ctl_trace *t, const uint64_t *after, int n, size_t *off);
void trace_record(ctl_trace *t, const ctl_sub *s);
void trace_free(ctl_trace *t);

/* ---- the controller -------------------------------------------------------------------- */
struct ff_controller {
    ff_controller_opts o;
    char endpoint[1024], bound[1024], ipc_path[1024];
    char worker_bin[FF_PATH_MAX], worker_key[FF_PATH_MAX], worker_log[32], trace_path[FF_PATH_MAX];
    void *ctx, *sock;
    struct ev_loop *loop;
    bool own_loop;
    rt_zwatch zw;
    ev_timer hb_timer;
    ev_timer settle_timer; /* re-checks workers whose process exited (settle_workers) */
    int64_t last_tick_ns;
    ev_idle deferred_idle;
    ev_timer wake_timer; /* run_until's deadline */
    ff_msg_decoder *dec;
    ff_msg *rx;          /* receive buffer (swapped out when a group job keeps a result) */
    ff_msg *msg_pool[64];
    int nmsg_pool;
    ff_msg scratch;      /* building outgoing messages */
    uint8_t *packbuf;    /* FF_MSG_MAX_HEADER bytes */

    ctl_worker **workers; /* by rank */
    int nworkers, workers_cap;
    u64map peers;         /* hash(routing id) -> ctl_worker */
    ctl_group **groups;
    int ngroups, groups_cap;

    u64map subs, jobs;
    uint64_t next_id;
    ctl_sub *sub_pool;
    ctl_job *job_pool;
    sub_list deferred;    /* made-up completions waiting for the loop */
    int njobs, npending, ninflight;
    int in_callback; /* a job callback is running: the loop must not be re-entered */
    bool repump;     /* a refused subtask went back to its group's queue: pump from the loop */
    bool shutting_down, shut_down;
    ff_controller_stats stats;
    uint64_t rejected_logged;

    /* CURVE */
    bool curve;
    void *zap_sock;
    pthread_t zap_thread;
    bool zap_started;
    atomic_bool zap_stop;
    atomic_ulong auth_rejected;
    uint8_t client_key[32];

    ctl_trace trace;
};

/* controller.c */
ctl_worker *ctl_worker_get(ff_controller *c, int rank);
/* Declare a worker dead: requeue or fail its subtasks, break its groups. Not from inside a
 * dispatch loop (sched.c defers it through w->disconnected). */
void ctl_worker_died(ff_controller *c, ctl_worker *w, const char *fmt, ...) FF_PRINTF(3, 4);
/* A subtask's worker-clock span onto ours, inside [dispatch_ns, done_ns] (where it ran),
 * keeping its measured duration where the window holds it. */
void ctl_map_span(const ctl_worker *w, int64_t worker_start, int64_t worker_end, int64_t dispatch_ns, int64_t done_ns,
                  int64_t *start_ns, int64_t *end_ns);
/* One worker's subtask spans as ctl_map_span put them (st, en on our clock) with their times
 * on the worker's clock (wstart, wend) and their results' (done, ours), put back in the order
 * the worker ran them. The one offset estimate maps them in order, but keeping each inside its
 * own [dispatch, result] window moves one span and not the next where the estimate is off by
 * more than a short subtask (a subtask dispatched while the one before it still ran), and a
 * span that started after another ended, on the worker's clock, could start before that one's
 * end on ours: a train step drawn before the step it followed. Such a span is moved later,
 * whole, to start at that end (its result came after the other's, so it stays inside its
 * window, cut only where it is longer than what is left of it). Spans that overlapped on the
 * worker (an inline handler beside a compute one) keep their places. Sorts s by wstart. */
typedef struct ctl_span {
    int64_t wstart, wend, done; /* worker clock; done: ours */
    int64_t st, en;             /* ours, in and out */
    size_t id;                  /* the caller's */
} ctl_span;
void ctl_keep_worker_order(ctl_span *s, size_t n);
ff_msg *ctl_msg_get(ff_controller *c);
void ctl_msg_put(ff_controller *c, ff_msg *m);
void ctl_start_deferred(ff_controller *c);

/* sched.c */
/* Put s in flight on w. 0 (sent, or refused at once: a frame over w's limit), or -1 (worker
 * disconnected). */
int sched_send(ff_controller *c, ctl_worker *w, ctl_sub *s);
void sched_pump(ff_controller *c, ctl_worker *w);
void sched_pump_all(ff_controller *c);
void sched_on_result(ff_controller *c, ctl_worker *w, ff_msg *rx);
void sched_fail_sub(ff_controller *c, ctl_sub *s, int status, const char *fmt, ...) FF_PRINTF(4, 5);
/* The message of subtask `id` in flight on w was refused by the other side's decoder (w
 * refused the subtask, or we refused w's result): no answer will come, so it completes as
 * FF_STATUS_REJECTED with `why`, or, idempotent and of an ANY job, goes to another member.
 * False when no such subtask is in flight on w (stale, or already answered). */
bool sched_rejected(ff_controller *c, ctl_worker *w, uint64_t id, const char *why);
void sched_run_deferred(ff_controller *c);
void sched_worker_lost(ff_controller *c, ctl_worker *w);
void sched_shutdown_pending(ff_controller *c);
void sched_shutdown_inflight(ff_controller *c);
void sched_free(ff_controller *c);
void list_remove(sub_list *l, ctl_sub *s);
void list_push(sub_list *l, ctl_sub *s);

/* zap.c */
int zap_start(ff_controller *c);
void zap_stop(ff_controller *c);

#endif
