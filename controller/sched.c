/* The controller's scheduler: jobs and their subtasks, waiting queues, dispatch under the
 * per-worker in-flight bound, results, cancellation, failures, and worker groups.
 *
 * Invariants:
 *   - a subtask is in exactly one place: a rank's queue or a group's queue (PENDING), a
 *     worker's in-flight list (INFLIGHT), the deferred list (DONE, callback not yet run), or
 *     nowhere once its job completed;
 *   - a result is accepted only for an INFLIGHT subtask, from the worker holding it; so a
 *     subtask completes once, whatever arrives late or twice;
 *   - a group job goes to all its members in one step, when all have room; members
 *     waiting for a group job take nothing else meanwhile (no starvation), so all members
 *     receive group jobs in submission order;
 *   - made-up completions (cancelled while waiting, worker lost, shutdown) run from the
 *     loop, never inside the call that caused them. */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "controller/ctl_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

/* ---- lists -------------------------------------------------------------------------------- */
void list_push(sub_list *l, ctl_sub *s) {
    assert(!s->in_list);
    s->next = NULL;
    s->prev = l->tail;
    if (l->tail) l->tail->next = s;
    else l->head = s;
    l->tail = s;
    l->n++;
    s->in_list = true;
}

static void list_push_front(sub_list *l, ctl_sub *s) {
    assert(!s->in_list);
    s->prev = NULL;
    s->next = l->head;
    if (l->head) l->head->prev = s;
    else l->tail = s;
    l->head = s;
    l->n++;
    s->in_list = true;
}

void list_remove(sub_list *l, ctl_sub *s) {
    assert(s->in_list);
    if (s->prev) s->prev->next = s->next;
    else l->head = s->next;
    if (s->next) s->next->prev = s->prev;
    else l->tail = s->prev;
    s->next = s->prev = NULL;
    l->n--;
    s->in_list = false;
}

static ctl_sub *list_pop(sub_list *l) {
    ctl_sub *s = l->head;
    if (s) list_remove(l, s);
    return s;
}

static void jlist_push(job_list *l, ctl_job *j) {
    j->next = NULL;
    j->prev = l->tail;
    if (l->tail) l->tail->next = j;
    else l->head = j;
    l->tail = j;
    l->n++;
    j->queued = true;
}

static void jlist_remove(job_list *l, ctl_job *j) {
    if (j->prev) j->prev->next = j->next;
    else l->head = j->next;
    if (j->next) j->next->prev = j->prev;
    else l->tail = j->prev;
    j->next = j->prev = NULL;
    l->n--;
    j->queued = false;
}

/* ---- records ------------------------------------------------------------------------------ */
static ctl_sub *sub_new(ff_controller *c) {
    ctl_sub *s = c->sub_pool;
    if (s) {
        c->sub_pool = s->next;
    } else {
        s = ff_calloc(1, sizeof *s);
        if (!s) return NULL;
    }
    uint8_t *hdr = s->hdr;
    uint32_t hdr_cap = s->hdr_cap;
    zmq_msg_t *frames = s->frames;
    int frames_cap = s->frames_cap;
    memset(s, 0, offsetof(ctl_sub, hdr));
    s->hdr = hdr;
    s->hdr_cap = hdr_cap;
    s->hdr_len = 0;
    s->frames = frames;
    s->frames_cap = frames_cap;
    s->nframes = 0;
    if (s->err) s->err[0] = 0;
    s->next = s->prev = NULL;
    s->in_list = false;
    s->rank = s->target_rank = s->avoid_rank = -1;
    return s;
}

static void sub_release(ff_controller *c, ctl_sub *s) {
    for (int i = 0; i < s->nframes; i++) zmq_msg_close(&s->frames[i]);
    s->nframes = 0;
    if (s->res) ctl_msg_put(c, s->res);
    s->res = NULL;
    s->next = c->sub_pool;
    c->sub_pool = s;
}

static ctl_job *job_new(ff_controller *c, int n) {
    ctl_job *j = c->job_pool;
    if (j) c->job_pool = j->next;
    else if (!(j = ff_calloc(1, sizeof *j))) return NULL;
    ctl_sub **subs_keep = j->subs != &j->one ? j->subs : NULL;
    memset(j, 0, sizeof *j);
    if (n == 1) {
        free(subs_keep);
        j->subs = &j->one;
    } else {
        free(subs_keep);
        j->subs = ff_calloc((size_t)n, sizeof *j->subs);
        if (!j->subs) {
            free(j);
            return NULL;
        }
    }
    j->n = n;
    j->label = j->group_label = -1;
    return j;
}

static void job_release(ff_controller *c, ctl_job *j) {
    if (j->subs != &j->one) {
        free(j->subs);
        j->subs = NULL;
    }
    j->next = c->job_pool;
    c->job_pool = j;
}

/* Pack m's header into s and move m's frames into s (m keeps empty frames). */
static int sub_take_msg(ff_controller *c, ctl_sub *s, ff_msg *m) {
    long n = ff_msg_pack(m, c->packbuf, FF_MSG_MAX_HEADER);
    if (n < 0) return -1;
    if ((uint32_t)n > s->hdr_cap) {
        uint8_t *h = ff_realloc(s->hdr, (size_t)n);
        if (!h) return -1;
        s->hdr = h;
        s->hdr_cap = (uint32_t)n;
    }
    memcpy(s->hdr, c->packbuf, (size_t)n);
    s->hdr_len = (uint32_t)n;
    if (m->ntensors > s->frames_cap) {
        /* the old frames are closed (nframes == 0), so a plain realloc is fine */
        zmq_msg_t *f = ff_realloc(s->frames, sizeof *f * (size_t)m->ntensors);
        if (!f) return -1;
        s->frames = f;
        s->frames_cap = m->ntensors;
    }
    for (int i = 0; i < m->ntensors; i++) {
        zmq_msg_init(&s->frames[i]);
        zmq_msg_move(&s->frames[i], &m->frames[i]);
    }
    s->nframes = m->ntensors;
    return 0;
}

static ctl_group *find_group(const ff_controller *c, const char *name) {
    for (int i = 0; i < c->ngroups; i++)
        if (!strcmp(c->groups[i]->name, name)) return c->groups[i];
    return NULL;
}

static bool worker_gone(const ctl_worker *w) { return w->disconnected || (w->local && w->reaped); }

static bool worker_usable(const ctl_worker *w) { return w && w->state == FF_WORKER_LIVE && !worker_gone(w); }

static bool worker_may_come(const ctl_worker *w) {
    return w && (w->state == FF_WORKER_LIVE || w->state == FF_WORKER_SPAWNED) && !worker_gone(w);
}

/* Another member of g than `rank` that may still take work. */
static bool group_has_other(ff_controller *c, const ctl_group *g, int rank) {
    for (int i = 0; i < g->n; i++)
        if (g->ranks[i] != rank && worker_may_come(ctl_worker_get(c, g->ranks[i]))) return true;
    return false;
}

/* ---- completion ------------------------------------------------------------------------- */
static void fill_result(const ctl_sub *s, const ff_msg *res, ff_result *r) {
    memset(r, 0, sizeof *r);
    r->id = s->id;
    r->rank = s->rank;
    r->member = s->job->target == FF_TARGET_GROUP || s->job->target == FF_TARGET_GROUP_SPLIT ? s->member : -1;
    r->status = (ff_status)s->status;
    r->error = s->err ? s->err : s->status == FF_STATUS_OK ? "" : "(no text: out of memory)";
    if (res) {
        r->error = res->u.result.error;
        r->noutputs = res->ntensors;
        r->outputs = res->tensors;
        r->msg = res;
    }
    r->dispatch_ns = s->dispatch_ns;
    r->start_ns = s->start_ns;
    r->end_ns = s->end_ns;
    r->done_ns = s->done_ns;
    r->attempts = s->attempts;
    r->queued = s->queued;
}

static void finish_job(ff_controller *c, ctl_job *j, const ff_msg *single_res) {
    j->completed = true;
    u64map_del(&c->jobs, j->id);
    c->njobs--;
    c->stats.jobs_completed++;
    if (j->done) {
        if (j->n == 1) {
            ff_result r;
            fill_result(j->subs[0], single_res, &r);
            c->in_callback++;
            j->done(c, j->id, &r, 1, j->ud);
            c->in_callback--;
        } else {
            ff_result stackbuf[8];
            ff_result *rs = j->n <= 8 ? stackbuf : ff_malloc(sizeof *rs * (size_t)j->n);
            if (rs) {
                for (int i = 0; i < j->n; i++) fill_result(j->subs[i], j->subs[i]->res, &rs[i]);
                c->in_callback++;
                j->done(c, j->id, rs, j->n, j->ud);
                c->in_callback--;
                if (rs != stackbuf) free(rs);
            } else {
                ff_warn("controller: out of memory delivering job %llu", (unsigned long long)j->id);
            }
        }
    }
    for (int i = 0; i < j->n; i++) {
        u64map_del(&c->subs, j->subs[i]->id);
        sub_release(c, j->subs[i]);
    }
    job_release(c, j);
}

/* s is DONE with its status set; res is the worker's result (NULL for made-up ones). */
static void complete_sub(ff_controller *c, ctl_sub *s, ff_msg *res) {
    ctl_job *j = s->job;
    s->state = SUB_DONE;
    if (s->status == FF_STATUS_OK) c->stats.subtasks_ok++;
    else c->stats.subtasks_failed++;
    if (c->trace.on) trace_record(&c->trace, s);
    j->ndone++;
    if (j->n == 1) {
        finish_job(c, j, res);
        return;
    }
    if (res) {
        /* keep the result (its tensors) until every member answered */
        s->res = res;
        assert(res == c->rx);
        c->rx = ctl_msg_get(c);
        if (!c->rx) {
            /* cannot keep receiving without a buffer: give this one back, drop its outputs */
            c->rx = res;
            s->res = NULL;
            ff_msg_reset(res);
        }
    }
    if (j->ndone == j->n) finish_job(c, j, NULL);
}

void sched_fail_sub(ff_controller *c, ctl_sub *s, int status, const char *fmt, ...) {
    if (!s->err) s->err = malloc(FF_MSG_TEXT_MAX);
    if (s->err) {
        char text[2 * FF_MSG_TEXT_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
        ff_text_fit(s->err, FF_MSG_TEXT_MAX, text);
    }
    s->status = status;
    s->state = SUB_DONE;
    s->done_ns = ff_now_ns();
    list_push(&c->deferred, s);
    ctl_start_deferred(c);
}

void sched_run_deferred(ff_controller *c) {
    ctl_sub *s;
    while ((s = list_pop(&c->deferred))) complete_sub(c, s, NULL);
    if (c->repump) {
        c->repump = false;
        sched_pump_all(c);
    }
}

void sched_on_result(ff_controller *c, ctl_worker *w, ff_msg *rx) {
    const ff_msg_result *r = &rx->u.result;
    ctl_sub *s = u64map_get(&c->subs, r->id);
    if (!s || s->state != SUB_INFLIGHT || s->rank != w->rank) {
        c->stats.duplicates++;
        ff_debug("controller: dropped a result for %llu from worker %d (stale or duplicate)",
                 (unsigned long long)r->id, w->rank);
        return;
    }
    list_remove(&w->inflight_l, s);
    w->inflight--;
    c->ninflight--;
    w->completed++;
    s->done_ns = ff_now_ns();
    s->status = r->status;
    s->queued = r->queued;
    s->worker_start_ns = r->start_ns;
    s->worker_end_ns = r->end_ns;
    if (r->start_ns || r->end_ns) {
        /* the subtask ran between its dispatch and its result: keep the mapped times there */
        ctl_map_span(w, r->start_ns, r->end_ns, s->dispatch_ns, s->done_ns, &s->start_ns, &s->end_ns);
    }
    complete_sub(c, s, rx);
    sched_pump(c, w);
}

/* s, not in flight, will not be answered by w: w refused its message, or would (a frame
 * over its limit). An idempotent subtask of an ANY job tries another member; the rest fail.
 * No pumping here (we may be inside w's pump): the deferred pass pumps again. */
static void refuse(ff_controller *c, ctl_worker *w, ctl_sub *s, const char *why) {
    ctl_job *j = s->job;
    if (!c->shutting_down && !j->cancelled && j->target == FF_TARGET_ANY && j->idempotent &&
        s->attempts < c->o.max_attempts && group_has_other(c, j->group, w->rank)) {
        ff_warn("controller: %s; trying another worker of group '%s'", why, j->group->name);
        s->avoid_rank = w->rank;
        s->state = SUB_PENDING;
        c->npending++;
        c->stats.redispatched++;
        list_push_front(&j->group->any_q, s);
        c->repump = true;
        ctl_start_deferred(c);
    } else {
        sched_fail_sub(c, s, FF_STATUS_REJECTED, "%s", why);
    }
}

bool sched_rejected(ff_controller *c, ctl_worker *w, uint64_t id, const char *why) {
    ctl_sub *s = u64map_get(&c->subs, id);
    if (!s || s->state != SUB_INFLIGHT || s->rank != w->rank) return false;
    list_remove(&w->inflight_l, s);
    w->inflight--;
    c->ninflight--;
    refuse(c, w, s, why);
    sched_pump(c, w);
    return true;
}

/* ---- dispatch ------------------------------------------------------------------------------ */
int sched_send(ff_controller *c, ctl_worker *w, ctl_sub *s) {
    s->rank = w->rank;
    s->attempts++;
    for (int i = 0; i < s->nframes; i++) {
        size_t bytes = zmq_msg_size(&s->frames[i]);
        if (bytes > w->max_frame) { /* w would refuse it (or its socket drop the connection) */
            s->dispatch_ns = ff_now_ns(); /* (the trace shows it as refused at once) */
            char why[256];
            snprintf(why, sizeof why, "subtask %llu: tensor frame %d has %zu bytes, over worker %d's limit of %zu (hint: "
                     "raise the worker's max_frame_bytes (fuseflow worker --max-frame BYTES) or send smaller tensors)",
                     (unsigned long long)s->id, i, bytes, w->rank, w->max_frame);
            refuse(c, w, s, why);
            return 0;
        }
    }
    s->state = SUB_INFLIGHT;
    list_push(&w->inflight_l, s);
    w->inflight++;
    c->ninflight++;
    s->dispatch_ns = ff_now_ns();
    int rc = ff_msg_send_frames(c->sock, w->peer, w->peer_len, s->hdr, s->hdr_len, s->frames, s->nframes);
    if (c->trace.on) s->send_ns = (int32_t)(ff_now_ns() - s->dispatch_ns);
    if (rc != 0) {
        /* the ROUTER no longer knows this worker: it is gone; the death handler requeues s */
        w->disconnected = true;
        ctl_start_deferred(c);
        return -1;
    }
    return 0;
}

static bool group_has_room(const ff_controller *c, const ctl_group *g) {
    for (int i = 0; i < g->n; i++) {
        ctl_worker *w = ctl_worker_get((ff_controller *)c, g->ranks[i]);
        if (!worker_usable(w) || w->inflight >= c->o.max_inflight) return false;
    }
    return true;
}

static bool group_all_may_come(const ff_controller *c, const ctl_group *g, int *dead_rank) {
    for (int i = 0; i < g->n; i++) {
        ctl_worker *w = ctl_worker_get((ff_controller *)c, g->ranks[i]);
        if (!worker_may_come(w)) {
            *dead_rank = g->ranks[i];
            return false;
        }
    }
    return true;
}

static void send_group_job(ff_controller *c, ctl_job *j) {
    for (int i = 0; i < j->n; i++) {
        ctl_sub *s = j->subs[i];
        if (s->state == SUB_PENDING) c->npending--;
        sched_send(c, ctl_worker_get(c, s->target_rank), s);
    }
}

static void fail_job_subs(ff_controller *c, ctl_job *j, int status, const char *text) {
    for (int i = 0; i < j->n; i++) {
        ctl_sub *s = j->subs[i];
        if (s->state == SUB_PENDING || s->state == SUB_NEW) {
            if (s->state == SUB_PENDING) c->npending--;
            sched_fail_sub(c, s, status, "%s", text);
        }
    }
}

/* Try the head group jobs of w's groups. Returns true when w must hold its free slots for a
 * group job that waits for other members. */
static bool pump_group_jobs(ff_controller *c, ctl_worker *w) {
    bool hold = false;
    for (int k = 0; k < w->ngroups; k++) {
        ctl_group *g = c->groups[w->groups[k]];
        while (g->job_q.head) {
            ctl_job *j = g->job_q.head;
            int dead = -1;
            if (!group_all_may_come(c, g, &dead)) {
                jlist_remove(&g->job_q, j);
                char text[160];
                snprintf(text, sizeof text, "group '%s' lost rank %d", g->name, dead);
                fail_job_subs(c, j, FF_STATUS_WORKER_LOST, text);
                continue;
            }
            if (!group_has_room(c, g)) {
                hold = true;
                break;
            }
            jlist_remove(&g->job_q, j);
            send_group_job(c, j);
        }
    }
    return hold;
}

/* The first waiting subtask of g that w may take: not one w refused while another member
 * may take it (these are few: only refused messages set avoid_rank). */
static ctl_sub *pop_any(ff_controller *c, ctl_group *g, ctl_worker *w) {
    for (ctl_sub *s = g->any_q.head; s; s = s->next)
        if (s->avoid_rank != w->rank || !group_has_other(c, g, w->rank)) {
            list_remove(&g->any_q, s);
            return s;
        }
    return NULL;
}

void sched_pump(ff_controller *c, ctl_worker *w) {
    if (!worker_usable(w)) return;
    while (w->inflight < c->o.max_inflight) {
        if (pump_group_jobs(c, w)) return;
        if (w->inflight >= c->o.max_inflight) return;
        ctl_sub *s = list_pop(&w->rank_q);
        if (!s) {
            for (int k = 0; k < w->ngroups && !s; k++) {
                int gi = w->groups[(w->gcursor + k) % w->ngroups];
                s = pop_any(c, c->groups[gi], w);
                if (s) w->gcursor = (w->gcursor + k + 1) % w->ngroups;
            }
        }
        if (!s) return;
        c->npending--;
        if (sched_send(c, w, s) != 0) return;
    }
}

void sched_pump_all(ff_controller *c) {
    for (int r = 0; r < c->nworkers; r++) sched_pump(c, c->workers[r]);
}

/* The least loaded usable member of g with room, round-robin among equals. */
static ctl_worker *pick_member(ff_controller *c, ctl_group *g) {
    ctl_worker *best = NULL;
    unsigned rr = g->rr++;
    for (int k = 0; k < g->n; k++) {
        ctl_worker *w = ctl_worker_get(c, g->ranks[(k + rr) % (unsigned)g->n]);
        if (!worker_usable(w) || w->inflight >= c->o.max_inflight) continue;
        /* a member holding slots for a waiting group job takes no other work */
        bool holding = false;
        for (int q = 0; q < w->ngroups && !holding; q++) holding = c->groups[w->groups[q]]->job_q.head != NULL;
        if (holding) continue;
        if (!best || w->inflight < best->inflight) best = w;
    }
    return best;
}

static bool group_may_serve(const ff_controller *c, const ctl_group *g) {
    for (int i = 0; i < g->n; i++)
        if (worker_may_come(ctl_worker_get((ff_controller *)c, g->ranks[i]))) return true;
    return false;
}

/* A new job: send now what can go, queue the rest. */
static void job_start(ff_controller *c, ctl_job *j) {
    if (j->target == FF_TARGET_RANK) {
        ctl_sub *s = j->subs[0];
        ctl_worker *w = ctl_worker_get(c, s->target_rank);
        if (!worker_may_come(w)) {
            sched_fail_sub(c, s, FF_STATUS_WORKER_LOST, "rank %d is %s: %s", s->target_rank,
                           ff_worker_state_name(w->state), w->dead_reason);
            return;
        }
        s->state = SUB_PENDING;
        c->npending++;
        list_push(&w->rank_q, s);
        sched_pump(c, w);
        return;
    }
    ctl_group *g = j->group;
    if (j->target == FF_TARGET_ANY) {
        ctl_sub *s = j->subs[0];
        if (!group_may_serve(c, g)) {
            sched_fail_sub(c, s, FF_STATUS_WORKER_LOST, "group '%s' has no live member", g->name);
            return;
        }
        ctl_worker *w = g->any_q.n ? NULL : pick_member(c, g);
        if (w) {
            sched_send(c, w, s);
            return;
        }
        s->state = SUB_PENDING;
        c->npending++;
        list_push(&g->any_q, s);
        return;
    }
    /* group jobs */
    if (g->state == GROUP_BROKEN && !j->setup) {
        char text[FF_MSG_TEXT_MAX + 64];
        snprintf(text, sizeof text, "group '%s' is broken: %s (hint: create it again)", g->name, g->broken);
        fail_job_subs(c, j, FF_STATUS_WORKER_LOST, text);
        return;
    }
    for (int i = 0; i < j->n; i++) {
        j->subs[i]->state = SUB_PENDING;
        c->npending++;
    }
    jlist_push(&g->job_q, j);
    /* the pump of any member sends it when all members have room */
    pump_group_jobs(c, ctl_worker_get(c, g->ranks[0]));
}

/* ---- submit ------------------------------------------------------------------------------- */
static void free_inputs(const ff_subtask_spec *spec, int from) {
    for (int i = from; i < spec->ninputs; i++)
        if (spec->inputs[i].free_fn) spec->inputs[i].free_fn(spec->inputs[i].data, spec->inputs[i].hint);
}

static void free_buf(void *data, void *hint) {
    (void)hint;
    free(data);
}

static void discard_job(ff_controller *c, ctl_job *j, int nsubs) {
    for (int i = 0; i < nsubs; i++)
        if (j->subs[i]) sub_release(c, j->subs[i]);
    job_release(c, j);
}

/* Rows [r0, r0 + nr) of a [rows, ...] tensor: byte offset and shape. */
static size_t row_slice(const ff_input *in, int64_t r0, int64_t nr, int64_t *shape) {
    size_t row_bytes = ff_dtype_size(in->dtype);
    for (int d = 1; d < in->ndim; d++) row_bytes *= (size_t)in->shape[d];
    memcpy(shape, in->shape, sizeof *shape * (size_t)in->ndim);
    shape[0] = nr;
    return (size_t)r0 * row_bytes;
}

static int check_spec(ff_controller *c, const ff_subtask_spec *spec, ctl_group **gp) {
    *gp = NULL;
    if (c->shutting_down) return ff_error_set("submit", NULL, "the controller is shutting down");
    if (!spec->kind || !spec->kind[0] || strlen(spec->kind) >= FF_MSG_NAME_MAX)
        return ff_error_set("submit", NULL, "kind must be 1 to %d bytes", FF_MSG_NAME_MAX - 1);
    if (spec->ninputs < 0 || spec->ninputs > FF_MSG_MAX_TENSORS || (spec->ninputs && !spec->inputs))
        return ff_error_set("submit", NULL, "%d inputs (0 to %d)", spec->ninputs, FF_MSG_MAX_TENSORS);
    if (spec->nargs < 0 || spec->nargs > FF_MSG_MAX_ARGS || (spec->nargs && !spec->args))
        return ff_error_set("submit", NULL, "%d args (0 to %d)", spec->nargs, FF_MSG_MAX_ARGS);
    if (spec->group && strlen(spec->group) >= FF_MSG_NAME_MAX)
        return ff_error_set("submit", NULL, "group name longer than %d bytes", FF_MSG_NAME_MAX - 1);
    ctl_group *g = spec->group && spec->group[0] ? find_group(c, spec->group) : NULL;
    switch (spec->target) {
    case FF_TARGET_RANK:
        if (spec->rank < 0 || spec->rank >= c->nworkers || !c->workers[spec->rank])
            return ff_error_set("submit", "spawn or wait for workers first", "rank %d is unknown (%d ranks)",
                                spec->rank, c->nworkers);
        break;
    case FF_TARGET_ANY:
    case FF_TARGET_GROUP:
    case FF_TARGET_GROUP_SPLIT:
        if (!g)
            return ff_error_set("submit", "create it with ff_controller_group_create", "no group named '%s'",
                                spec->group ? spec->group : "");
        break;
    default: return ff_error_set("submit", NULL, "bad target %d", (int)spec->target);
    }
    for (int i = 0; i < spec->ninputs; i++) {
        const ff_input *in = &spec->inputs[i];
        if (in->ndim < 0 || in->ndim > FF_MSG_MAX_DIMS || (in->ndim && !in->shape))
            return ff_error_set("submit", NULL, "input %d ('%s'): %d dimensions", i, in->name ? in->name : "",
                                in->ndim);
        if (in->split && spec->target == FF_TARGET_GROUP_SPLIT && in->ndim < 1)
            return ff_error_set("submit", NULL, "input %d ('%s'): a split input needs a first dimension", i,
                                in->name ? in->name : "");
    }
    *gp = g;
    return 0;
}

uint64_t ff_controller_submit(ff_controller *c, const ff_subtask_spec *spec, ff_done_fn done, void *ud) {
    ctl_group *g;
    if (check_spec(c, spec, &g) != 0) {
        free_inputs(spec, 0);
        return 0;
    }
    bool group_job = spec->target == FF_TARGET_GROUP || spec->target == FF_TARGET_GROUP_SPLIT;
    int n = group_job ? g->n : 1;
    if (c->o.max_pending && c->npending + n > c->o.max_pending) {
        free_inputs(spec, 0);
        ff_error_set("submit", "wait for completions (ff_controller_run_until) before submitting more",
                     "backpressure: %d subtasks waiting (max_pending %d)", c->npending, c->o.max_pending);
        return 0;
    }
    ctl_job *j = job_new(c, n);
    if (!j) {
        free_inputs(spec, 0);
        return 0;
    }
    j->id = c->next_id;
    c->next_id += (uint64_t)n;
    j->done = done;
    j->ud = ud;
    j->target = spec->target;
    j->group = g;
    j->idempotent = spec->idempotent;
    for (int i = 0; i < n; i++) {
        ctl_sub *s = sub_new(c);
        if (!s) {
            discard_job(c, j, i);
            free_inputs(spec, 0);
            return 0;
        }
        s->id = j->id + (uint64_t)i;
        s->job = j;
        s->member = i;
        s->target_rank = spec->target == FF_TARGET_RANK ? spec->rank : group_job ? g->ranks[i] : -1;
        j->subs[i] = s;
    }

    /* tensors: full ones become frames of `master` once (handed over or copied); split ones
     * become shared buffers sliced per member. Each member's message refers to them. */
    ff_msg *master = NULL, *m = &c->scratch;
    ff_shared_buf *shared[FF_MSG_MAX_TENSORS];
    int handed = 0; /* inputs whose ownership moved to master or a shared buffer */
    bool simple = n == 1;
    if (!simple) {
        master = ctl_msg_get(c);
        if (!master) goto fail;
        ff_msg_begin(master, FF_MSG_SUBTASK);
    }
    if (!simple) {
        for (; handed < spec->ninputs; handed++) {
            const ff_input *in = &spec->inputs[handed];
            shared[handed] = NULL;
            if (in->split && spec->target == FF_TARGET_GROUP_SPLIT) {
                void *data = in->data;
                void (*fr)(void *, void *) = in->free_fn;
                void *hint = in->hint;
                if (!fr) { /* copy now: the caller keeps its buffer */
                    size_t bytes = ff_dtype_size(in->dtype);
                    for (int d = 0; d < in->ndim; d++) bytes *= (size_t)in->shape[d];
                    void *copy = ff_malloc(bytes ? bytes : 1);
                    if (!copy) goto fail;
                    if (bytes) memcpy(copy, data, bytes);
                    data = copy;
                    fr = free_buf;
                    hint = NULL;
                }
                shared[handed] = ff_shared_buf_new(data, fr, hint);
                if (!shared[handed]) {
                    handed++;
                    goto fail;
                }
                /* keep master's tensor indices aligned with inputs */
                if (!ff_msg_add_tensor(master, in->name, FF_DTYPE_U8, 1, (int64_t[]){0}, NULL, NULL, NULL)) {
                    handed++;
                    goto fail;
                }
            } else if (!ff_msg_add_tensor(master, in->name, in->dtype, in->ndim, in->shape, in->data, in->free_fn,
                                          in->hint)) {
                handed++;
                goto fail;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        ctl_sub *s = j->subs[i];
        ff_msg_begin(m, FF_MSG_SUBTASK);
        ff_msg_subtask *st = &m->u.subtask;
        st->id = s->id;
        snprintf(st->kind, sizeof st->kind, "%s", spec->kind);
        snprintf(st->group, sizeof st->group, "%s", spec->group ? spec->group : "");
        st->nargs = spec->nargs;
        if (spec->nargs) memcpy(st->args, spec->args, sizeof *spec->args * (size_t)spec->nargs);
        if (simple) {
            for (; handed < spec->ninputs; handed++) {
                const ff_input *in = &spec->inputs[handed];
                if (!ff_msg_add_tensor(m, in->name, in->dtype, in->ndim, in->shape, in->data, in->free_fn, in->hint)) {
                    handed++;
                    goto fail;
                }
            }
        } else {
            int dp = g->dp_rank[i], D = g->dp_size;
            for (int k = 0; k < spec->ninputs; k++) {
                const ff_input *in = &spec->inputs[k];
                if (shared[k]) {
                    int64_t rows = in->shape[0], base = rows / D, rem = rows % D;
                    int64_t r0 = dp * base + (dp < rem ? dp : rem), nr = base + (dp < rem ? 1 : 0);
                    int64_t shape[FF_MSG_MAX_DIMS];
                    size_t off = row_slice(in, r0, nr, shape);
                    if (!ff_msg_add_tensor_shared(m, in->name, in->dtype, in->ndim, shape, shared[k], off)) goto fail;
                } else if (!ff_msg_add_tensor_ref(m, master, k, NULL)) {
                    goto fail;
                }
            }
        }
        if (sub_take_msg(c, s, m) != 0) goto fail;
        ff_msg_reset(m);
    }
    if (master) {
        for (int k = 0; k < spec->ninputs; k++) ff_shared_buf_release(shared[k]);
        ctl_msg_put(c, master);
    }
    if (c->trace.on) {
        j->label = trace_intern(&c->trace, spec->label ? spec->label : spec->kind);
        j->group_label = trace_intern(&c->trace, spec->group ? spec->group : "");
        j->kind = trace_intern(&c->trace, spec->kind);
        if (spec->nafter > 0 && spec->after && trace_add_after(&c->trace, spec->after, spec->nafter, &j->after_off) == 0)
            j->nafter = spec->nafter; /* out of memory: the trace lacks the edges, not the job */
    }
    for (int i = 0; i < n; i++) u64map_put(&c->subs, j->subs[i]->id, j->subs[i]);
    u64map_put(&c->jobs, j->id, j);
    c->njobs++;
    c->stats.jobs_submitted++;
    job_start(c, j);
    return j->id;
fail : {
    char err[2 * FF_MSG_TEXT_MAX];
    snprintf(err, sizeof err, "%s", ff_error_message());
    ff_msg_reset(m);
    if (master) {
        for (int k = 0; k < handed && k < spec->ninputs; k++)
            if (spec->inputs[k].split && spec->target == FF_TARGET_GROUP_SPLIT) ff_shared_buf_release(shared[k]);
        ctl_msg_put(c, master);
    }
    free_inputs(spec, handed);
    discard_job(c, j, n);
    ff_error_set("submit", NULL, "%s", err);
    return 0;
}
}

/* ---- cancel ------------------------------------------------------------------------------- */
int ff_controller_job_rank(const ff_controller *c, uint64_t id) {
    ctl_job *j = u64map_get(&c->jobs, id);
    if (!j || j->completed || j->queued || j->n != 1 || j->subs[0]->state != SUB_INFLIGHT) return -1;
    return j->subs[0]->rank;
}

int ff_controller_cancel(ff_controller *c, uint64_t id) {
    ctl_job *j = u64map_get(&c->jobs, id);
    if (!j || j->completed) return ff_error_set("cancel", NULL, "no outstanding job %llu", (unsigned long long)id);
    j->cancelled = true;
    if (j->queued) {
        jlist_remove(&j->group->job_q, j);
        fail_job_subs(c, j, FF_STATUS_CANCELLED, "cancelled before dispatch");
        return 0;
    }
    for (int i = 0; i < j->n; i++) {
        ctl_sub *s = j->subs[i];
        if (s->state == SUB_PENDING) {
            if (j->target == FF_TARGET_RANK) list_remove(&ctl_worker_get(c, s->target_rank)->rank_q, s);
            else list_remove(&j->group->any_q, s);
            c->npending--;
            sched_fail_sub(c, s, FF_STATUS_CANCELLED, "cancelled before dispatch");
        } else if (s->state == SUB_INFLIGHT) {
            ctl_worker *w = ctl_worker_get(c, s->rank);
            ff_msg *m = &c->scratch;
            ff_msg_begin(m, FF_MSG_CANCEL);
            m->u.cancel.id = s->id;
            if (ff_msg_send(c->sock, w->peer, w->peer_len, m) != 0) {
                w->disconnected = true;
                ctl_start_deferred(c);
            }
        }
    }
    return 0;
}

/* ---- failures ------------------------------------------------------------------------------ */
void sched_worker_lost(ff_controller *c, ctl_worker *w) {
    ctl_sub *s;
    while ((s = list_pop(&w->inflight_l))) {
        w->inflight--;
        c->ninflight--;
        ctl_job *j = s->job;
        if (c->shutting_down) {
            sched_fail_sub(c, s, FF_STATUS_SHUTDOWN, "worker %d stopped before answering", w->rank);
        } else if (j->cancelled) {
            sched_fail_sub(c, s, FF_STATUS_CANCELLED, "cancelled (its worker %d died meanwhile)", w->rank);
        } else if (j->target == FF_TARGET_ANY && j->idempotent && s->attempts < c->o.max_attempts &&
                   group_may_serve(c, j->group)) {
            s->state = SUB_PENDING;
            c->npending++;
            c->stats.redispatched++;
            list_push_front(&j->group->any_q, s);
        } else {
            sched_fail_sub(c, s, FF_STATUS_WORKER_LOST, "worker %d died with it in flight (%s)%s", w->rank,
                           w->dead_reason, j->target == FF_TARGET_ANY && j->idempotent ? "; no attempts left" : "");
        }
    }
    while ((s = list_pop(&w->rank_q))) {
        c->npending--;
        sched_fail_sub(c, s, c->shutting_down ? FF_STATUS_SHUTDOWN : FF_STATUS_WORKER_LOST, "rank %d is gone (%s)",
                       w->rank, w->dead_reason);
    }
    for (int k = 0; k < w->ngroups; k++) {
        ctl_group *g = c->groups[w->groups[k]];
        if (strcmp(g->backend, "none") != 0 && g->state != GROUP_BROKEN) {
            g->state = GROUP_BROKEN;
            snprintf(g->broken, sizeof g->broken, "rank %d died (%s)", w->rank, w->dead_reason);
        }
        ctl_job *j;
        while ((j = g->job_q.head)) {
            jlist_remove(&g->job_q, j);
            char text[FF_MSG_TEXT_MAX];
            snprintf(text, sizeof text, "group '%s' lost rank %d", g->name, w->rank);
            fail_job_subs(c, j, FF_STATUS_WORKER_LOST, text);
        }
        if (!group_may_serve(c, g))
            while ((s = list_pop(&g->any_q))) {
                c->npending--;
                sched_fail_sub(c, s, FF_STATUS_WORKER_LOST, "group '%s' has no live member left", g->name);
            }
    }
    sched_pump_all(c);
}

void sched_shutdown_pending(ff_controller *c) {
    ctl_sub *s;
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w) continue;
        while ((s = list_pop(&w->rank_q))) {
            c->npending--;
            sched_fail_sub(c, s, FF_STATUS_SHUTDOWN, "the controller shut down before dispatching it");
        }
    }
    for (int i = 0; i < c->ngroups; i++) {
        ctl_group *g = c->groups[i];
        while ((s = list_pop(&g->any_q))) {
            c->npending--;
            sched_fail_sub(c, s, FF_STATUS_SHUTDOWN, "the controller shut down before dispatching it");
        }
        ctl_job *j;
        while ((j = g->job_q.head)) {
            jlist_remove(&g->job_q, j);
            fail_job_subs(c, j, FF_STATUS_SHUTDOWN, "the controller shut down before dispatching it");
        }
    }
}

void sched_shutdown_inflight(ff_controller *c) {
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w) continue;
        ctl_sub *s;
        while ((s = list_pop(&w->inflight_l))) {
            w->inflight--;
            c->ninflight--;
            sched_fail_sub(c, s, FF_STATUS_SHUTDOWN, "no answer from worker %d before the controller shut down",
                           w->rank);
        }
    }
}

/* ---- groups -------------------------------------------------------------------------------- */
typedef struct wait_job {
    bool done;
    bool ok;
    char error[FF_MSG_TEXT_MAX + 64];
    char id_text[FF_MSG_MAX_UNIQUE_ID + 1];
} wait_job;

static void on_internal_done(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    wait_job *wj = ud;
    wj->done = true;
    wj->ok = true;
    for (int i = 0; i < n; i++) {
        if (r[i].status != FF_STATUS_OK) {
            wj->ok = false;
            snprintf(wj->error, sizeof wj->error, "rank %d: %s: %s", r[i].rank, ff_status_name(r[i].status),
                     r[i].error);
            return;
        }
    }
    if (n == 1 && r[0].noutputs == 1 && r[0].outputs[0].dtype == FF_DTYPE_U8 &&
        r[0].outputs[0].nbytes <= FF_MSG_MAX_UNIQUE_ID) {
        memcpy(wj->id_text, r[0].outputs[0].data, r[0].outputs[0].nbytes);
        wj->id_text[r[0].outputs[0].nbytes] = 0;
    }
}

static bool wait_job_done(void *ud) { return ((wait_job *)ud)->done; }

/* Wait for an internal job; on timeout, cancel it and drop its callback (the wait_job lives
 * on our caller's stack). */
static int wait_internal(ff_controller *c, uint64_t id, wait_job *wj, double timeout_s) {
    if (ff_controller_run_until(c, wait_job_done, wj, timeout_s) == 0) return 0;
    ctl_job *j = u64map_get(&c->jobs, id);
    if (j) {
        j->done = NULL;
        ff_controller_cancel(c, id);
    }
    return -1;
}

static void group_unlink_members(ff_controller *c, ctl_group *g, int gi) {
    for (int i = 0; i < g->n; i++) {
        ctl_worker *w = ctl_worker_get(c, g->ranks[i]);
        if (!w) continue;
        for (int k = 0; k < w->ngroups; k++)
            if (w->groups[k] == gi) {
                w->groups[k] = w->groups[--w->ngroups];
                break;
            }
        w->gcursor = 0;
    }
}

/* ff_group_opts.timeout_s's default: a group's setup connects every pair of members (TCP, shared
 * memory) and a collective may wait on the slowest rank's compute, so this is generous; a
 * hung member still fails the call instead of blocking it for good. */
#define GROUP_TIMEOUT_DEFAULT_S 60

int ff_controller_group_create(ff_controller *c, const char *name, const int *ranks, int n, const ff_group_opts *o) {
    ff_group_opts d = {0};
    if (!o) o = &d;
    const char *backend = o->backend && o->backend[0] ? o->backend : "none";
    double timeout_s = o->timeout_s > 0 ? o->timeout_s : GROUP_TIMEOUT_DEFAULT_S;
    if (!name || !name[0] || strlen(name) >= FF_MSG_NAME_MAX)
        return ff_error_set("group", NULL, "names are 1 to %d bytes", FF_MSG_NAME_MAX - 1);
    if (strcmp(backend, "none") && strcmp(backend, "cpu") && strcmp(backend, "nccl"))
        return ff_error_set(name, "use none, cpu or nccl", "unknown collective backend '%s'", backend);
    if (n < 1 || n > FF_MSG_MAX_MEMBERS) return ff_error_set(name, NULL, "%d members (1 to %d)", n, FF_MSG_MAX_MEMBERS);
    for (int i = 0; i < n; i++) {
        ctl_worker *w = ctl_worker_get(c, ranks[i]);
        if (!worker_usable(w))
            return ff_error_set(name, "wait for the workers first (ff_controller_wait_workers)",
                                "rank %d is not a live worker", ranks[i]);
        for (int k = 0; k < i; k++)
            if (ranks[k] == ranks[i]) return ff_error_set(name, NULL, "rank %d listed twice", ranks[i]);
        if (o->dp_rank && (o->dp_rank[i] < 0 || o->dp_rank[i] >= n))
            return ff_error_set(name, NULL, "member %d: dp rank %d outside [0, %d)", i, o->dp_rank[i], n);
    }
    ctl_group *g = find_group(c, name);
    int gi;
    if (g) {
        for (gi = 0; gi < c->ngroups && c->groups[gi] != g; gi++) {}
        if (g->job_q.n || g->any_q.n)
            return ff_error_set(name, "wait for its jobs to finish", "cannot rebuild a group with jobs waiting");
        group_unlink_members(c, g, gi);
        free(g->ranks);
        free(g->dp_rank);
        g->ranks = g->dp_rank = NULL;
    } else {
        if (c->ngroups == c->groups_cap) {
            int cap = c->groups_cap ? 2 * c->groups_cap : 8;
            ctl_group **a = ff_realloc(c->groups, sizeof *a * (size_t)cap);
            if (!a) return -1;
            c->groups = a;
            c->groups_cap = cap;
        }
        g = ff_calloc(1, sizeof *g);
        if (!g) return -1;
        snprintf(g->name, sizeof g->name, "%s", name);
        gi = c->ngroups;
        c->groups[c->ngroups++] = g;
    }
    g->ranks = ff_malloc(sizeof *g->ranks * (size_t)n);
    g->dp_rank = ff_malloc(sizeof *g->dp_rank * (size_t)n);
    if (!g->ranks || !g->dp_rank) return -1;
    memcpy(g->ranks, ranks, sizeof *ranks * (size_t)n);
    g->n = n;
    g->dp_size = 0;
    for (int i = 0; i < n; i++) {
        g->dp_rank[i] = o->dp_rank ? o->dp_rank[i] : i;
        if (g->dp_rank[i] + 1 > g->dp_size) g->dp_size = g->dp_rank[i] + 1;
    }
    snprintf(g->backend, sizeof g->backend, "%s", backend);
    g->timeout_s = timeout_s;
    g->state = GROUP_SETUP;
    g->broken[0] = 0;
    for (int i = 0; i < n; i++) {
        ctl_worker *w = ctl_worker_get(c, ranks[i]);
        int *a = ff_realloc(w->groups, sizeof *a * (size_t)(w->ngroups + 1));
        if (!a) return -1;
        w->groups = a;
        w->groups[w->ngroups++] = gi;
    }

    /* 1. member 0 makes the communicator's unique id (it has the backend; we may not) */
    wait_job wj = {0};
    if (strcmp(backend, "none") != 0) {
        ff_arg args[2] = {ff_arg_str("backend", backend), ff_arg_float("timeout_s", timeout_s)};
        ff_subtask_spec spec = {.kind = "coll.unique_id", .target = FF_TARGET_RANK, .rank = ranks[0],
                                .args = args, .nargs = 2};
        uint64_t id = ff_controller_submit(c, &spec, on_internal_done, &wj);
        if (!id || wait_internal(c, id, &wj, timeout_s) != 0 || !wj.ok || !wj.id_text[0]) {
            g->state = GROUP_BROKEN;
            snprintf(g->broken, sizeof g->broken, "no unique id: %s",
                     !id || !wj.done ? ff_error_message() : wj.error[0] ? wj.error : "empty reply");
            return ff_error_set(name, NULL, "%s", g->broken);
        }
    }

    /* 2. every member joins: a group job whose subtasks are group-setup messages */
    ctl_job *j = job_new(c, n);
    if (!j) return -1;
    j->id = c->next_id;
    c->next_id += (uint64_t)n;
    j->target = FF_TARGET_GROUP;
    j->group = g;
    j->internal = j->setup = true;
    j->done = on_internal_done;
    char id_text[sizeof wj.id_text];
    memcpy(id_text, wj.id_text, sizeof id_text);
    memset(&wj, 0, sizeof wj);
    j->ud = &wj;
    ff_msg *m = &c->scratch;
    for (int i = 0; i < n; i++) {
        ctl_sub *s = sub_new(c);
        if (!s) {
            discard_job(c, j, i);
            return -1;
        }
        j->subs[i] = s;
        s->id = j->id + (uint64_t)i;
        s->job = j;
        s->member = i;
        s->target_rank = ranks[i];
        ff_msg_begin(m, FF_MSG_GROUP_SETUP);
        ff_msg_group_setup *gs = &m->u.group;
        gs->id = s->id;
        snprintf(gs->name, sizeof gs->name, "%s", name);
        gs->index = i;
        snprintf(gs->backend, sizeof gs->backend, "%s", backend);
        gs->unique_id_len = (uint32_t)strlen(id_text);
        memcpy(gs->unique_id, id_text, gs->unique_id_len);
        gs->timeout_ms = (uint32_t)(timeout_s * 1000);
        if (ff_msg_set_members(m, ranks, n) != 0 || sub_take_msg(c, s, m) != 0) {
            discard_job(c, j, i + 1);
            return -1;
        }
    }
    if (c->trace.on) {
        j->label = trace_intern(&c->trace, "group-setup");
        j->group_label = trace_intern(&c->trace, name);
        j->kind = j->label;
    }
    for (int i = 0; i < n; i++) u64map_put(&c->subs, j->subs[i]->id, j->subs[i]);
    u64map_put(&c->jobs, j->id, j);
    c->njobs++;
    c->stats.jobs_submitted++;
    uint64_t setup_id = j->id;
    job_start(c, j);
    if (wait_internal(c, setup_id, &wj, timeout_s) != 0 || !wj.ok) {
        g->state = GROUP_BROKEN;
        snprintf(g->broken, sizeof g->broken, "setup failed: %s", wj.done ? wj.error : ff_error_message());
        return ff_error_set(name, NULL, "%s", g->broken);
    }
    g->state = GROUP_READY;
    return 0;
}

const int *ff_controller_group_ranks(const ff_controller *c, const char *name, int *n) {
    ctl_group *g = find_group(c, name);
    if (!g) {
        ff_error_set("group", NULL, "no group named '%s'", name);
        return NULL;
    }
    *n = g->n;
    return g->ranks;
}

void sched_free(ff_controller *c) {
    /* anything left belongs to jobs that never completed (destroy without shutdown) */
    for (size_t i = 0; i < c->jobs.cap; i++) {
        if (c->jobs.keys[i] == 0 || c->jobs.keys[i] == UINT64_MAX) continue;
        ctl_job *j = c->jobs.vals[i];
        for (int k = 0; k < j->n; k++) sub_release(c, j->subs[k]);
        job_release(c, j);
    }
    u64map_free(&c->jobs);
    u64map_free(&c->subs);
    while (c->sub_pool) {
        ctl_sub *s = c->sub_pool;
        c->sub_pool = s->next;
        free(s->hdr);
        free(s->frames);
        free(s->err);
        free(s);
    }
    while (c->job_pool) {
        ctl_job *j = c->job_pool;
        c->job_pool = j->next;
        if (j->subs != &j->one) free(j->subs);
        free(j);
    }
    for (int i = 0; i < c->ngroups; i++) {
        free(c->groups[i]->ranks);
        free(c->groups[i]->dp_rank);
        free(c->groups[i]);
    }
    free(c->groups);
    c->groups = NULL;
    c->ngroups = 0;
}
