/* The worker process: a DEALER in a libev loop, a compute thread, handlers by kind.
 *
 * Threads: the loop thread owns the socket, decodes messages, answers heartbeats and runs
 * FF_TASK_INLINE handlers; the compute thread runs every other handler, and group setups,
 * in arrival order. Tasks go to the compute thread through a mutex-protected FIFO and come
 * back through a second list plus ev_async_send (which may merge wake-ups, so the loop
 * drains the whole list each time). Task records are pooled by the loop thread, so a
 * steady stream of subtasks allocates nothing but ZeroMQ's own frames.
 *
 * Not here: the generic kinds (kinds.c) and group communicators (group.c). */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "msgs/transport.h"
#include "workers/worker_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"

#define MAX_KINDS 64
#define MAX_GROUPS 64

typedef struct handler {
    char kind[FF_MSG_NAME_MAX];
    ff_task_fn fn;
    void *ud;
    unsigned flags;
} handler;

struct ff_task {
    ff_worker *w;
    ff_msg in;  /* the subtask or group setup, frames kept alive while the task lives */
    ff_msg out; /* the result under construction */
    const handler *h;
    bool is_setup;
    bool status_set;
    int status;
    char err[FF_MSG_TEXT_MAX];
    int64_t start_ns, end_ns;
    uint32_t queued;
    atomic_bool cancelled;
    bool deferred; /* the handler called ff_task_defer: the result waits for ff_task_complete */
    struct ff_task *next;
};

struct ff_worker {
    ff_worker_opts o;
    char connect[1024], device[FF_MSG_NAME_MAX];
    ff_devices devices; /* its machine's cores and GPUs, for the hello */
    void *ctx, *sock, *monitor;
    struct ev_loop *loop;
    rt_zwatch zw;
    ev_async wake;   /* results from the compute thread; stop requests */
    ev_timer tick;   /* liveness, hello retries, handshake failures */
    ev_signal sigterm, sigint;
    bool handle_signals;
    bool uses_curve;
    int handshake_failures; /* without detail, before the welcome */
    bool connected, ever_connected; /* the transport's state from the monitor, for messages */
    int refusals;           /* connection attempts that failed (nothing listening) */
    ff_msg_decoder *dec;
    ff_msg ctl;      /* reused for control messages we send */
    handler kinds[MAX_KINDS];
    int nkinds;

    /* loop-thread state */
    int rank;
    bool welcomed;
    int64_t started_ns, last_rx_ns, last_hello_ns;
    int64_t probe_ns; /* when we said hello to a silent controller (0: not probing) */
    double timeout_s;
    uint64_t errors; /* rejected or unexpected messages */
    size_t ctl_max_frame; /* the controller's frame limit (its welcome) */
    ff_task *pool;
    int exit_rc;
    char exit_error[512];
    bool stopping;
    atomic_bool stop_requested;
    uint32_t busy; /* tasks queued or running (loop thread's count) */

    /* compute thread */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ff_task *q_head, *q_tail; /* waiting for the compute thread */
    ff_task *running;
    ff_task *deferred_head; /* deferred tasks, waiting for ff_task_complete */
    int ndeferred;
    ff_worker_step_fn step_fn; /* runs while tasks are deferred and none waits */
    void *step_ud;
    bool q_stop;
    ff_task *done_head, *done_tail; /* finished, waiting for the loop */
    rt_group groups[MAX_GROUPS];     /* compute thread only */
    int ngroups;
};

static _Thread_local ff_task *current_inline; /* set while an inline handler runs */

void ff_worker_opts_default(ff_worker_opts *o) {
    memset(o, 0, sizeof *o);
    o->rank = -1;
    o->device = "cpu";
    o->local_index = -1;
    o->connect_timeout_s = 30;
}

/* ---- task records ------------------------------------------------------------------------- */
static ff_task *task_get(ff_worker *w) {
    ff_task *t = w->pool;
    if (t) {
        w->pool = t->next;
    } else {
        t = ff_calloc(1, sizeof *t);
        if (!t) return NULL;
        ff_msg_init(&t->in);
        ff_msg_init(&t->out);
    }
    t->w = w;
    t->next = NULL;
    t->h = NULL;
    t->is_setup = false;
    t->status_set = false;
    t->status = FF_STATUS_OK;
    t->err[0] = 0;
    t->start_ns = t->end_ns = 0;
    t->deferred = false;
    atomic_store_explicit(&t->cancelled, false, memory_order_relaxed);
    return t;
}

static void task_put(ff_worker *w, ff_task *t) {
    ff_msg_reset(&t->in);
    ff_msg_reset(&t->out);
    t->next = w->pool;
    w->pool = t;
}

static void task_free(ff_task *t) {
    ff_msg_free(&t->in);
    ff_msg_free(&t->out);
    free(t);
}

/* ---- handlers' API ------------------------------------------------------------------------ */
uint64_t ff_task_id(const ff_task *t) { return t->in.u.subtask.id; }
const char *ff_task_kind(const ff_task *t) { return t->in.u.subtask.kind; }
const char *ff_task_group(const ff_task *t) { return t->in.u.subtask.group; }
const ff_msg_subtask *ff_task_subtask(const ff_task *t) { return &t->in.u.subtask; }
int ff_task_rank(const ff_task *t) { return t->w->rank; }
int ff_task_ninputs(const ff_task *t) { return t->in.ntensors; }

const ff_tensor *ff_task_input(const ff_task *t, int i) {
    assert(i >= 0 && i < t->in.ntensors);
    return &t->in.tensors[i];
}

const ff_tensor *ff_task_input_named(const ff_task *t, const char *name) {
    for (int i = 0; i < t->in.ntensors; i++)
        if (!strcmp(t->in.tensors[i].name, name)) return &t->in.tensors[i];
    ff_error_set(ff_task_kind(t), "send it with the subtask", "no input tensor named '%s' (%d inputs)", name,
                 t->in.ntensors);
    return NULL;
}

static void free_output(void *data, void *hint) {
    (void)hint;
    free(data);
}

void *ff_task_output(ff_task *t, const char *name, ff_dtype dtype, int ndim, const int64_t *shape) {
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i] > 0 ? shape[i] : 0;
    size_t bytes = (size_t)numel * ff_dtype_size(dtype);
    void *buf = NULL;
    if (bytes) {
        buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!buf) {
            ff_error_set(ff_task_kind(t), NULL, "out of memory for output '%s' (%zu bytes)", name, bytes);
            return NULL;
        }
    }
    const ff_tensor *tt = ff_msg_add_tensor(&t->out, name, dtype, ndim, shape, buf, bytes ? free_output : NULL, NULL);
    if (!tt) return NULL;
    return bytes ? buf : (void *)tt; /* a non-NULL pointer for empty tensors */
}

int ff_task_output_input(ff_task *t, int i, const char *name) {
    return ff_msg_add_tensor_ref(&t->out, &t->in, i, name) ? 0 : -1;
}

bool ff_task_cancelled(const ff_task *t) {
    return atomic_load_explicit(&((ff_task *)t)->cancelled, memory_order_relaxed);
}

int ff_task_fail(ff_task *t, ff_status status, const char *fmt, ...) {
    char text[2 * FF_MSG_TEXT_MAX]; /* formatted whole, then cut in the middle to fit */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ff_text_fit(t->err, sizeof t->err, text);
    t->status = status;
    t->status_set = true;
    return -1;
}

static rt_group *find_group(ff_worker *w, const char *name) {
    for (int i = 0; i < w->ngroups; i++)
        if (!strcmp(w->groups[i].name, name)) return &w->groups[i];
    return NULL;
}

ff_coll_comm *ff_task_comm(const ff_task *t) {
    if (current_inline == t || !t->in.u.subtask.group[0]) return NULL;
    rt_group *g = find_group(t->w, t->in.u.subtask.group);
    return g ? g->comm : NULL;
}

int ff_task_group_index(const ff_task *t) {
    if (current_inline == t) return -1;
    rt_group *g = find_group(t->w, t->in.u.subtask.group);
    return g ? g->index : -1;
}

int ff_task_group_size(const ff_task *t) {
    if (current_inline == t) return 0;
    rt_group *g = find_group(t->w, t->in.u.subtask.group);
    return g ? g->size : 0;
}

int ff_worker_rank(const ff_worker *w) { return w->rank; }

int ff_worker_register(ff_worker *w, const char *kind, ff_task_fn fn, void *ud, unsigned flags) {
    if (!kind || !kind[0] || strlen(kind) >= FF_MSG_NAME_MAX)
        return ff_error_set("worker", NULL, "kind names are 1 to %d bytes", FF_MSG_NAME_MAX - 1);
    for (int i = 0; i < w->nkinds; i++)
        if (!strcmp(w->kinds[i].kind, kind)) {
            w->kinds[i].fn = fn;
            w->kinds[i].ud = ud;
            w->kinds[i].flags = flags;
            return 0;
        }
    if (w->nkinds >= MAX_KINDS) return ff_error_set("worker", NULL, "more than %d kinds", MAX_KINDS);
    handler *h = &w->kinds[w->nkinds++];
    snprintf(h->kind, sizeof h->kind, "%s", kind);
    h->fn = fn;
    h->ud = ud;
    h->flags = flags;
    return 0;
}

static const handler *find_kind(const ff_worker *w, const char *kind) {
    for (int i = 0; i < w->nkinds; i++)
        if (!strcmp(w->kinds[i].kind, kind)) return &w->kinds[i];
    return NULL;
}

/* ---- running a task (either thread) ---------------------------------------------------------- */
static void finish_result(ff_task *t, int rc) {
    ff_msg_result *r;
    if (rc != 0) {
        int status = t->status_set ? t->status
                     : ff_task_cancelled(t) ? FF_STATUS_CANCELLED
                                            : FF_STATUS_FAILED;
        char err[FF_MSG_TEXT_MAX];
        ff_text_fit(err, sizeof err, t->status_set ? t->err : ff_error_message());
        ff_msg_begin(&t->out, FF_MSG_RESULT); /* drop partial outputs */
        r = &t->out.u.result;
        r->status = status;
        ff_text_fit(r->error, sizeof r->error, err[0] ? err : ff_status_name(status));
    } else {
        r = &t->out.u.result;
        r->status = FF_STATUS_OK;
        r->error[0] = 0;
    }
    r->id = t->is_setup ? t->in.u.group.id : t->in.u.subtask.id;
    r->start_ns = t->start_ns;
    r->end_ns = t->end_ns;
    r->queued = t->queued;
}

static void run_setup(ff_worker *w, ff_task *t) {
    const ff_msg_group_setup *s = &t->in.u.group;
    rt_group *g = find_group(w, s->name);
    int rc;
    if (!g && w->ngroups >= MAX_GROUPS) {
        rc = ff_task_fail(t, FF_STATUS_BAD_REQUEST, "worker is in %d groups already", MAX_GROUPS);
    } else {
        if (!g) {
            g = &w->groups[w->ngroups++];
            memset(g, 0, sizeof *g);
        }
        ff_error_clear();
        rc = rt_group_join(g, s);
        if (rc != 0) {
            /* a failed join leaves no half-made group behind */
            rt_group_leave(g);
            *g = w->groups[--w->ngroups];
        }
    }
    finish_result(t, rc);
}

static void run_task(ff_task *t) {
    ff_msg_begin(&t->out, FF_MSG_RESULT);
    t->start_ns = ff_now_ns();
    if (t->is_setup) {
        run_setup(t->w, t);
        t->end_ns = ff_now_ns();
        t->out.u.result.end_ns = t->end_ns;
        return;
    }
    int rc;
    if (ff_task_cancelled(t)) {
        rc = ff_task_fail(t, FF_STATUS_CANCELLED, "cancelled before it started");
    } else {
        ff_error_clear();
        rc = t->h->fn(t, t->h->ud);
    }
    if (t->deferred && rc == 0) return; /* completed later by ff_task_complete */
    t->deferred = false;
    t->end_ns = ff_now_ns();
    finish_result(t, rc);
}

/* ---- deferred tasks ------------------------------------------------------------------------ */
int ff_task_defer(ff_task *t) {
    if (current_inline == t || t->is_setup)
        return ff_error_set(ff_task_kind(t), "register the kind without FF_TASK_INLINE",
                            "only handlers on the compute thread can defer their task");
    assert(t->w->running == t); /* from the task's own handler */
    t->deferred = true;
    return 0;
}

/* Under w->mu: unlink t from the deferred list and queue its result for the loop. */
static void deferred_done_locked(ff_worker *w, ff_task *t) {
    for (ff_task **pp = &w->deferred_head; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            w->ndeferred--;
            break;
        }
    t->next = NULL;
    t->deferred = false;
    if (w->done_tail) w->done_tail->next = t;
    else w->done_head = t;
    w->done_tail = t;
}

void ff_task_complete(ff_task *t, int rc) {
    ff_worker *w = t->w;
    assert(t->deferred && w->running != t); /* a handler finishes its own task by returning */
    t->end_ns = ff_now_ns();
    finish_result(t, rc);
    pthread_mutex_lock(&w->mu);
    deferred_done_locked(w, t);
    pthread_mutex_unlock(&w->mu);
    ev_async_send(w->loop, &w->wake);
}

void ff_worker_set_step(ff_worker *w, ff_worker_step_fn fn, void *ud) {
    w->step_fn = fn;
    w->step_ud = ud;
}

int ff_worker_deferred(ff_worker *w) {
    pthread_mutex_lock(&w->mu);
    int n = w->ndeferred;
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* Complete every deferred task that is still open as failed (a step hook failed with
 * `why`, or the worker stops and the hook did not finish them). Under w->mu. */
static void fail_deferred_locked(ff_worker *w, ff_status status, const char *why) {
    while (w->deferred_head) {
        ff_task *t = w->deferred_head;
        t->end_ns = ff_now_ns();
        ff_task_fail(t, status, "%s", why);
        finish_result(t, -1);
        deferred_done_locked(w, t);
    }
}

/* One call of the step hook (w->mu not held). A failing hook fails every deferred task. */
static void run_step(ff_worker *w) {
    ff_error_clear();
    if (w->step_fn(w, w->step_ud) == 0) return;
    char why[FF_MSG_TEXT_MAX];
    ff_text_fit(why, sizeof why, ff_error_message());
    ff_warn("worker %d: step hook failed: %s", w->rank, why);
    pthread_mutex_lock(&w->mu);
    fail_deferred_locked(w, FF_STATUS_FAILED, why);
    pthread_mutex_unlock(&w->mu);
    ev_async_send(w->loop, &w->wake);
}

static void *compute_main(void *arg) {
    ff_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->q_head && !w->q_stop && !(w->deferred_head && w->step_fn)) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->q_head && w->q_stop) break;
        if (!w->q_head) { /* deferred work and nothing new: one step */
            pthread_mutex_unlock(&w->mu);
            run_step(w);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        ff_task *t = w->q_head;
        w->q_head = t->next;
        if (!w->q_head) w->q_tail = NULL;
        t->next = NULL;
        w->running = t;
        pthread_mutex_unlock(&w->mu);
        run_task(t);
        pthread_mutex_lock(&w->mu);
        w->running = NULL;
        if (t->deferred) {
            t->next = w->deferred_head;
            w->deferred_head = t;
            w->ndeferred++;
            continue;
        }
        if (w->done_tail) w->done_tail->next = t;
        else w->done_head = t;
        w->done_tail = t;
        pthread_mutex_unlock(&w->mu);
        ev_async_send(w->loop, &w->wake);
        pthread_mutex_lock(&w->mu);
    }
    /* Stopping: deferred tasks are cancelled; the step hook gets the chance to finish them
     * (it must complete cancelled tasks), and whatever it leaves is failed here. */
    for (int idle = 0; w->deferred_head && w->step_fn && idle < 100;) {
        for (ff_task *t = w->deferred_head; t; t = t->next) atomic_store(&t->cancelled, true);
        int before = w->ndeferred;
        pthread_mutex_unlock(&w->mu);
        run_step(w);
        pthread_mutex_lock(&w->mu);
        idle = w->ndeferred < before ? 0 : idle + 1;
    }
    fail_deferred_locked(w, FF_STATUS_CANCELLED, "worker shutting down");
    pthread_mutex_unlock(&w->mu);
    /* the compute thread owns the communicators: it tears them down */
    for (int i = 0; i < w->ngroups; i++) rt_group_leave(&w->groups[i]);
    w->ngroups = 0;
    return NULL;
}

/* ---- loop thread ------------------------------------------------------------------------ */
/* A result tensor the controller would refuse (its socket might even drop us) goes out as a
 * REJECTED result naming it instead. */
static void check_result_size(ff_worker *w, ff_task *t) {
    for (int i = 0; i < t->out.ntensors; i++) {
        const ff_tensor *o = &t->out.tensors[i];
        if (o->nbytes <= w->ctl_max_frame) continue;
        ff_msg_result keep = t->out.u.result;
        char why[FF_MSG_TEXT_MAX];
        snprintf(why, sizeof why, "worker %d: result tensor '%s' of %s has %zu bytes, over the controller's limit of %zu "
                 "(hint: raise the controller's max_frame_bytes or return smaller tensors)", w->rank, o->name,
                 t->is_setup ? "group-setup" : t->in.u.subtask.kind, o->nbytes, w->ctl_max_frame);
        ff_msg_begin(&t->out, FF_MSG_RESULT);
        t->out.u.result = keep;
        t->out.u.result.status = FF_STATUS_REJECTED;
        ff_text_fit(t->out.u.result.error, sizeof t->out.u.result.error, why);
        return;
    }
}

static void send_result(ff_worker *w, ff_task *t) {
    check_result_size(w, t);
    if (ff_msg_send(w->sock, NULL, 0, &t->out) != 0)
        ff_warn("worker %d: result of %llu not sent: %s", w->rank, (unsigned long long)t->out.u.result.id,
                ff_error_message());
    w->busy--;
    task_put(w, t);
}

static void drain_done(ff_worker *w) {
    pthread_mutex_lock(&w->mu);
    ff_task *t = w->done_head;
    w->done_head = w->done_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (t) {
        ff_task *next = t->next;
        send_result(w, t);
        t = next;
    }
}

static void send_hello(ff_worker *w) {
    ff_msg *m = &w->ctl;
    ff_msg_begin(m, FF_MSG_HELLO);
    ff_msg_hello *h = &m->u.hello;
    h->rank = w->o.rank;
    h->pid = getpid();
    if (w->o.host && w->o.host[0]) snprintf(h->host, sizeof h->host, "%s", w->o.host);
    else if (gethostname(h->host, sizeof h->host) != 0) snprintf(h->host, sizeof h->host, "unknown");
    h->host[sizeof h->host - 1] = 0;
    snprintf(h->device, sizeof h->device, "%s", w->device);
    h->devices = w->devices;
    for (int i = 0; i < w->nkinds && h->ncaps < FF_MSG_MAX_CAPS - 2; i++)
        snprintf(h->caps[h->ncaps++], FF_MSG_NAME_MAX, "%s", w->kinds[i].kind);
    h->ncaps += rt_coll_caps(h->caps + h->ncaps, FF_MSG_MAX_CAPS - h->ncaps);
    h->max_frame = w->o.max_frame_bytes ? w->o.max_frame_bytes : (uint64_t)1 << 30;
    if (ff_msg_send(w->sock, NULL, 0, m) != 0) ff_warn("worker: hello not sent: %s", ff_error_message());
    w->last_hello_ns = ff_now_ns();
}

static void worker_exit(ff_worker *w, int rc, const char *fmt, ...) FF_PRINTF(3, 4);
static void worker_exit(ff_worker *w, int rc, const char *fmt, ...) {
    if (w->stopping) return;
    w->stopping = true;
    w->exit_rc = rc;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->exit_error, sizeof w->exit_error, fmt, ap);
        va_end(ap);
    }
    ev_break(w->loop, EVBREAK_ALL);
}

static void enqueue(ff_worker *w, ff_task *t) {
    t->queued = w->busy;
    w->busy++;
    pthread_mutex_lock(&w->mu);
    if (w->q_tail) w->q_tail->next = t;
    else w->q_head = t;
    w->q_tail = t;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* A subtask arrived in t->in. Returns true when t was consumed. */
static bool on_subtask(ff_worker *w, ff_task *t) {
    const handler *h = find_kind(w, t->in.u.subtask.kind);
    if (!h) {
        t->queued = w->busy++;
        ff_msg_begin(&t->out, FF_MSG_RESULT);
        t->start_ns = t->end_ns = ff_now_ns();
        ff_task_fail(t, FF_STATUS_UNKNOWN_KIND, "no handler for kind '%s' on worker %d", t->in.u.subtask.kind,
                     w->rank);
        finish_result(t, -1);
        send_result(w, t);
        return true;
    }
    t->h = h;
    if (h->flags & FF_TASK_INLINE) {
        t->queued = w->busy++;
        current_inline = t;
        run_task(t);
        current_inline = NULL;
        send_result(w, t);
        return true;
    }
    enqueue(w, t);
    return true;
}

static void on_cancel(ff_worker *w, uint64_t id) {
    ff_task *found = NULL;
    pthread_mutex_lock(&w->mu);
    ff_task **pp = &w->q_head, *prev = NULL;
    for (ff_task *t = w->q_head; t; prev = t, t = t->next) {
        if (!t->is_setup && t->in.u.subtask.id == id) {
            *pp = t->next;
            if (w->q_tail == t) w->q_tail = prev;
            found = t;
            break;
        }
        pp = &t->next;
    }
    if (!found && w->running && !w->running->is_setup && w->running->in.u.subtask.id == id)
        atomic_store(&w->running->cancelled, true);
    for (ff_task *t = w->deferred_head; t && !found; t = t->next)
        if (t->in.u.subtask.id == id) atomic_store(&t->cancelled, true);
    pthread_mutex_unlock(&w->mu);
    if (found) {
        found->next = NULL;
        ff_msg_begin(&found->out, FF_MSG_RESULT);
        found->start_ns = found->end_ns = ff_now_ns();
        ff_task_fail(found, FF_STATUS_CANCELLED, "cancelled while queued");
        finish_result(found, -1);
        send_result(w, found);
    }
}

static void on_heartbeat(ff_worker *w, const ff_msg_heartbeat *ping, int64_t t1) {
    if (ping->reply) {
        w->errors++;
        return;
    }
    ff_msg *m = &w->ctl;
    ff_msg_begin(m, FF_MSG_HEARTBEAT);
    ff_msg_heartbeat *h = &m->u.heartbeat;
    h->seq = ping->seq;
    h->reply = true;
    h->t0 = ping->t0;
    h->t1 = t1;
    h->busy = w->busy;
    h->errors = w->errors + ff_msg_decoder_stats(w->dec)->rejected;
    h->t2 = ff_now_ns();
    (void)ff_msg_send(w->sock, NULL, 0, m);
}

static void on_readable(rt_zwatch *zw) {
    ff_worker *w = zw->ud;
    for (int n = 0; n < RT_RECV_BATCH && !w->stopping; n++) {
        ff_task *t = task_get(w);
        if (!t) break;
        ff_reject why;
        int rc = ff_msg_recv(w->dec, w->sock, false, &t->in, &why);
        int64_t now = ff_now_ns();
        if (rc <= 0) {
            if (rc == -1 && why == FF_REJECT_VERSION && !w->welcomed) {
                /* a controller of another fuseflow version: retrying the hello cannot help */
                task_put(w, t);
                worker_exit(w, -1, "the controller speaks another protocol: %s", ff_error_message());
                break;
            }
            if (rc == -1) {
                /* naming the refused subtask (or group setup) lets the controller fail it
                 * instead of waiting for a result that will never come */
                int rt = t->in.rejected_type;
                uint64_t ref = rt == FF_MSG_SUBTASK || rt == FF_MSG_GROUP_SETUP ? t->in.rejected_id : 0;
                char text[FF_MSG_TEXT_MAX];
                snprintf(text, sizeof text, "worker %d rejected %s %llu: %s", w->rank, ff_msg_type_name(rt),
                         (unsigned long long)ref, ff_error_message());
                if (!ref) snprintf(text, sizeof text, "worker %d rejected a message: %s", w->rank, ff_error_message());
                ff_warn("%s", text);
                ff_msg_send_error(w->sock, NULL, 0, FF_ERR_MALFORMED, ref, text);
                w->last_rx_ns = now; /* the controller is alive, if confused */
            }
            task_put(w, t);
            if (rc == 0 || rc == -2) break;
            continue;
        }
        w->last_rx_ns = now;
        switch (t->in.type) {
        case FF_MSG_WELCOME:
            if (!w->welcomed) {
                w->rank = t->in.u.welcome.rank;
                w->welcomed = true;
                w->ctl_max_frame = t->in.u.welcome.max_frame ? (size_t)t->in.u.welcome.max_frame : (size_t)1 << 30;
                if (w->o.orphan_timeout_s <= 0) w->timeout_s = t->in.u.welcome.timeout_ms / 1000.0;
                ff_debug("worker %d: welcomed (heartbeat %u ms, timeout %u ms)", w->rank, t->in.u.welcome.heartbeat_ms,
                         t->in.u.welcome.timeout_ms);
            }
            task_put(w, t);
            break;
        case FF_MSG_HEARTBEAT:
            on_heartbeat(w, &t->in.u.heartbeat, now);
            task_put(w, t);
            break;
        case FF_MSG_SUBTASK:
            if (!w->welcomed) {
                w->errors++;
                task_put(w, t);
                break;
            }
            on_subtask(w, t);
            break;
        case FF_MSG_GROUP_SETUP:
            t->is_setup = true;
            enqueue(w, t);
            break;
        case FF_MSG_CANCEL:
            on_cancel(w, t->in.u.cancel.id);
            task_put(w, t);
            break;
        case FF_MSG_SHUTDOWN:
            ff_debug("worker %d: shutdown (%s)", w->rank, t->in.u.shutdown.reason);
            task_put(w, t);
            worker_exit(w, 0, NULL);
            break;
        case FF_MSG_ERROR:
            if (!w->welcomed && t->in.u.error.code == FF_ERR_REJECTED) {
                worker_exit(w, -1, "the controller refused this worker: %s", t->in.u.error.text);
            } else if (t->in.u.error.code == FF_ERR_UNKNOWN_PEER && w->welcomed) {
                /* the controller forgot us (declared us dead, or restarted): say hello again */
                ff_warn("worker %d: controller says: %s; saying hello again", w->rank, t->in.u.error.text);
                w->welcomed = false;
                w->o.rank = w->rank; /* ask for the same rank back */
                send_hello(w);
            } else {
                ff_warn("worker %d: controller reports: %s", w->rank, t->in.u.error.text);
            }
            task_put(w, t);
            break;
        default:
            w->errors++;
            ff_msg_send_error(w->sock, NULL, 0, FF_ERR_UNEXPECTED, 0, "a worker does not take this message type");
            task_put(w, t);
            break;
        }
    }
}

static void on_wake(struct ev_loop *loop, ev_async *a, int revents) {
    (void)loop;
    (void)revents;
    ff_worker *w = a->data;
    drain_done(w);
    if (atomic_load(&w->stop_requested)) worker_exit(w, 0, NULL);
}

static void on_signal(struct ev_loop *loop, ev_signal *s, int revents) {
    (void)loop;
    (void)revents;
    ff_worker *w = s->data;
    ff_debug("worker %d: signal %d, stopping", w->rank, s->signum);
    worker_exit(w, 0, NULL);
}

static const char *handshake_event_name(uint16_t ev) {
    switch (ev) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: return "authentication failed";
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL: return "protocol mismatch";
    default: return "handshake failed";
    }
}

static void check_monitor(ff_worker *w) {
    if (!w->monitor) return;
    for (;;) {
        zmq_msg_t a;
        zmq_msg_init(&a);
        if (zmq_msg_recv(&a, w->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&a);
            return;
        }
        uint16_t ev = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&a) >= 6) {
            memcpy(&ev, zmq_msg_data(&a), 2);
            memcpy(&value, (char *)zmq_msg_data(&a) + 2, 4);
        }
        int more = zmq_msg_more(&a);
        zmq_msg_close(&a);
        while (more) { /* the endpoint frame */
            zmq_msg_init(&a);
            if (zmq_msg_recv(&a, w->monitor, ZMQ_DONTWAIT) < 0) more = 0;
            else more = zmq_msg_more(&a);
            zmq_msg_close(&a);
        }
        switch (ev) {
        case ZMQ_EVENT_CONNECTED:
            w->connected = w->ever_connected = true;
            continue;
        case ZMQ_EVENT_DISCONNECTED:
            w->connected = false;
            continue;
        case ZMQ_EVENT_CONNECT_RETRIED:
            w->connected = false;
            w->refusals++;
            continue;
        default:
            break;
        }
        /* Only a mechanism mismatch says that one side uses CURVE and the other does not; a
         * connection dropped during the handshake may be CURVE keys of another keygen run,
         * or a controller that ran out of descriptors, crashed or is not a fuseflow one. */
        const char *hint;
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            hint = w->uses_curve ? "the controller does not use CURVE: start this worker without --curve"
                                 : "the controller uses CURVE: pass --curve worker.key from its `fuseflow keygen` run";
        else if (w->uses_curve)
            hint = "check that worker.key comes from the same `fuseflow keygen` run as the controller's controller.key";
        else /* a CURVE controller drops a plain worker this way too when the mismatch goes unreported */
            hint = "check the controller's stderr: it may have run out of file descriptors (ulimit -n) or exited; "
                   "if it was started with --curve, pass --curve worker.key from its `fuseflow keygen` run; "
                   "or the endpoint is not a fuseflow controller";
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
            worker_exit(w, -1, "%s: the controller refused the connection (%s, code %u) (hint: %s)", w->connect,
                        handshake_event_name(ev), value, hint);
            return;
        }
        /* no detail: the server dropped our hello; a few in a row before any welcome is an answer */
        if (!w->welcomed && ++w->handshake_failures >= 5) {
            worker_exit(w, -1, "%s: the controller closed the connection during the handshake %d times in a row (%s) (hint: %s)",
                        w->connect, w->handshake_failures, zmq_strerror((int)value), hint);
            return;
        }
        if (w->handshake_failures <= 1)
            ff_warn("worker: %s: the connection closed during the handshake (%s); retrying", w->connect, zmq_strerror((int)value));
    }
}

static void on_tick(struct ev_loop *loop, ev_timer *tm, int revents) {
    (void)loop;
    (void)revents;
    ff_worker *w = tm->data;
    check_monitor(w);
    if (w->stopping) return;
    int64_t now = ff_now_ns();
    if (!w->welcomed) {
        if ((now - w->started_ns) / 1e9 > w->o.connect_timeout_s) {
            /* say what the transport saw: nothing listening, a connection that went away, or
             * a controller that holds the connection but does not answer */
            if (!w->ever_connected)
                worker_exit(w, -1, "%s: no welcome within %.1f s: nothing accepted a connection (%d attempts) (hint: check the "
                            "endpoint and that the controller runs)", w->connect, w->o.connect_timeout_s, w->refusals);
            else if (!w->connected)
                worker_exit(w, -1, "%s: no welcome within %.1f s: the controller closed the connection and accepted no new one "
                            "(hint: check the controller's stderr: it may have exited, or run out of file descriptors (ulimit -n))",
                            w->connect, w->o.connect_timeout_s);
            else
                worker_exit(w, -1, "%s: no welcome within %.1f s: connected, but the controller did not answer (hint: it may be "
                            "overloaded, or the endpoint is not a fuseflow controller%s)", w->connect, w->o.connect_timeout_s,
                            w->uses_curve ? "; check its CURVE keys" : "");
            return;
        }
        if ((now - w->last_hello_ns) / 1e9 > 1.0) send_hello(w);
        return;
    }
    double silent = (now - w->last_rx_ns) / 1e9;
    if (w->timeout_s <= 0 || silent <= w->timeout_s || rt_zsock_readable(w->sock)) {
        w->probe_ns = 0;
        return;
    }
    /* Silent past the timeout. We may have been stopped or starved rather than the
     * controller gone: say hello once (a live controller answers; one that declared us
     * dead takes us back under the same rank) and give it another timeout. */
    if (!w->probe_ns) {
        w->probe_ns = now;
        w->o.rank = w->rank;
        send_hello(w);
        return;
    }
    if ((now - w->probe_ns) / 1e9 > w->timeout_s)
        worker_exit(w, -1, "worker %d: nothing from the controller at %s for %.2f s (timeout %.2f s, and no answer "
                    "to a hello): it is gone, exiting", w->rank, w->connect, silent, w->timeout_s);
}

/* ---- life cycle --------------------------------------------------------------------------- */
ff_worker *ff_worker_new(const ff_worker_opts *o) {
    if (!o->connect || !o->connect[0]) {
        ff_error_set("worker", "pass --connect ENDPOINT", "no controller endpoint");
        return NULL;
    }
    ff_worker *w = ff_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->o = *o;
    w->ctl_max_frame = (size_t)1 << 30; /* until the welcome says */
    snprintf(w->connect, sizeof w->connect, "%s", o->connect);
    snprintf(w->device, sizeof w->device, "%s", o->device ? o->device : "cpu");
    char why[160], seen[512];
    ff_devices_probe(&w->devices, why, sizeof why);
    w->devices.local_index = o->local_index;
    ff_devices_describe(&w->devices, seen, sizeof seen);
    ff_debug("worker: %s%s%s", seen, why[0] ? ": " : "", why);
    w->o.connect = w->connect;
    w->o.device = w->device;
    w->o.curve_key_file = NULL; /* the path is not kept, only whether there was one */
    w->uses_curve = o->curve_key_file != NULL;
    if (w->o.connect_timeout_s <= 0) w->o.connect_timeout_s = 30;
    w->timeout_s = o->orphan_timeout_s;
    w->rank = -1;
    ff_msg_init(&w->ctl);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->dec = ff_msg_decoder_new(o->max_frame_bytes);
    w->ctx = zmq_ctx_new();
    if (!w->dec || !w->ctx) goto fail;
    w->sock = zmq_socket(w->ctx, ZMQ_DEALER);
    if (!w->sock) {
        ff_error_set("worker", NULL, "zmq_socket: %s", zmq_strerror(errno));
        goto fail;
    }
    size_t frame_cap = o->max_frame_bytes ? o->max_frame_bytes : (size_t)1 << 30;
    if (rt_socket_setup(w->sock, 2 * frame_cap + FF_MSG_MAX_HEADER) != 0) goto fail;
    if (o->curve_key_file) {
        rt_curve_keys k;
        if (rt_curve_load(o->curve_key_file, false, &k) != 0) goto fail;
        if (zmq_setsockopt(w->sock, ZMQ_CURVE_SERVERKEY, k.server_public, 40) ||
            zmq_setsockopt(w->sock, ZMQ_CURVE_PUBLICKEY, k.client_public, 40) ||
            zmq_setsockopt(w->sock, ZMQ_CURVE_SECRETKEY, k.client_secret, 40)) {
            ff_error_set(o->curve_key_file, "libzmq must be built with libsodium", "CURVE keys: %s",
                         zmq_strerror(errno));
            goto fail;
        }
        memset(&k, 0, sizeof k);
    }
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://ff-worker-monitor-%p", (void *)w);
    if (zmq_socket_monitor(w->sock, mon,
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
                               ZMQ_EVENT_DISCONNECTED) == 0) {
        w->monitor = zmq_socket(w->ctx, ZMQ_PAIR);
        int zero = 0;
        if (w->monitor) zmq_setsockopt(w->monitor, ZMQ_LINGER, &zero, sizeof zero);
        if (w->monitor && zmq_connect(w->monitor, mon) != 0) {
            zmq_close(w->monitor);
            w->monitor = NULL;
        }
    }
    if (zmq_connect(w->sock, w->connect) != 0) {
        ff_error_set(w->connect, "endpoints look like ipc:///tmp/ff.sock or tcp://HOST:PORT", "cannot connect: %s",
                     zmq_strerror(errno));
        goto fail;
    }
    w->loop = ev_loop_new(EVFLAG_AUTO);
    if (!w->loop) {
        ff_error_set("worker", NULL, "ev_loop_new failed");
        goto fail;
    }
    ev_async_init(&w->wake, on_wake);
    w->wake.data = w;
    ev_async_start(w->loop, &w->wake);
    if (!o->no_builtin_kinds && rt_register_builtin_kinds(w) != 0) goto fail;
    return w;
fail:
    ff_worker_destroy(&w);
    return NULL;
}

void ff_worker_stop(ff_worker *w) {
    atomic_store(&w->stop_requested, true);
    if (w->loop) ev_async_send(w->loop, &w->wake);
}

/* Cancel what is queued and interrupt what runs; wait for the compute thread to finish,
 * then send every result it produced. */
static void stop_compute(ff_worker *w) {
    if (!w->thread_started) return;
    pthread_mutex_lock(&w->mu);
    ff_task *q = w->q_head;
    w->q_head = w->q_tail = NULL;
    if (w->running) atomic_store(&w->running->cancelled, true);
    w->q_stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    while (q) {
        ff_task *next = q->next;
        q->next = NULL;
        ff_msg_begin(&q->out, FF_MSG_RESULT);
        q->start_ns = q->end_ns = ff_now_ns();
        if (q->is_setup) ff_task_fail(q, FF_STATUS_CANCELLED, "worker shutting down");
        else ff_task_fail(q, FF_STATUS_CANCELLED, "worker shutting down");
        finish_result(q, -1);
        send_result(w, q);
        q = next;
    }
    pthread_join(w->thread, NULL);
    w->thread_started = false;
    drain_done(w);
}

int ff_worker_run(ff_worker *w) {
    if (pthread_create(&w->thread, NULL, compute_main, w) != 0)
        return ff_error_set("worker", NULL, "cannot start the compute thread");
    w->thread_started = true;
    if (rt_zwatch_start(&w->zw, w->loop, w->sock, on_readable, w) != 0) {
        stop_compute(w);
        return -1;
    }
    ev_timer_init(&w->tick, on_tick, 0.05, 0.05);
    w->tick.data = w;
    ev_timer_start(w->loop, &w->tick);
    if (w->handle_signals) {
        ev_signal_init(&w->sigterm, on_signal, SIGTERM);
        ev_signal_init(&w->sigint, on_signal, SIGINT);
        w->sigterm.data = w->sigint.data = w;
        ev_signal_start(w->loop, &w->sigterm);
        ev_signal_start(w->loop, &w->sigint);
        /* a parent may start us with them blocked, so none is lost before this point */
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGTERM);
        sigaddset(&s, SIGINT);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    }
    w->started_ns = w->last_rx_ns = ff_now_ns();
    send_hello(w);
    ev_run(w->loop, 0);
    stop_compute(w);
    rt_zwatch_stop(&w->zw);
    ev_timer_stop(w->loop, &w->tick);
    if (w->handle_signals) {
        ev_signal_stop(w->loop, &w->sigterm);
        ev_signal_stop(w->loop, &w->sigint);
    }
    if (w->exit_rc != 0) return ff_error_set(NULL, NULL, "%s", w->exit_error);
    /* a clean exit: give the last results a moment to leave */
    int linger = 1000;
    zmq_setsockopt(w->sock, ZMQ_LINGER, &linger, sizeof linger);
    return 0;
}

void ff_worker_destroy(ff_worker **pw) {
    ff_worker *w = *pw;
    if (!w) return;
    if (w->thread_started) stop_compute(w);
    while (w->pool) {
        ff_task *t = w->pool;
        w->pool = t->next;
        task_free(t);
    }
    if (w->monitor) {
        zmq_socket_monitor(w->sock, NULL, 0);
        zmq_close(w->monitor);
    }
    if (w->sock) zmq_close(w->sock);
    if (w->ctx) zmq_ctx_term(w->ctx);
    if (w->loop) {
        ev_async_stop(w->loop, &w->wake);
        ev_loop_destroy(w->loop);
    }
    ff_msg_decoder_destroy(&w->dec);
    ff_msg_free(&w->ctl);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    *pw = NULL;
}

/* ---- serving ----------------------------------------------------------------------------------- */
int ff_worker_serve(const ff_worker_opts *o, ff_worker_setup_fn setup, void *ud) {
    /* until the loop handles them, SIGTERM/SIGINT wait (threads started meanwhile inherit
     * the mask, so the loop thread is the one that gets them) */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    ff_worker *w = ff_worker_new(o);
    if (!w) return -1;
    w->handle_signals = true;
    if (setup && setup(w, ud) != 0) {
        ff_error_wrap("setup");
        ff_worker_destroy(&w);
        return -1;
    }
    int rc = ff_worker_run(w);
    ff_worker_destroy(&w);
    return rc;
}
