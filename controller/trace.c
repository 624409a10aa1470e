/* Timelines: recording subtasks as they complete, recording what a client adds (its own
 * tracks, slices, instants, arrows and dependencies: ff_controller_trace_*), and writing it
 * all as one Chrome Trace Event JSON file (Perfetto, chrome://tracing).
 *
 * The file: process 0 is the controller, with thread 0 ("dispatch") whose slices are the
 * sends of subtasks, and one thread per client track; process r+1 is worker r, with one
 * thread per lane of execution. Slices of one track that overlap in time (an inline handler
 * next to a compute one, clock-mapping jitter, a client's overlapping slices) go to further
 * lanes, so every thread's slices nest. A flow arrow (ph s/f, cat "flow", id = subtask id)
 * links each dispatch to its execution; an arrow of cat "after" links each job to the jobs
 * that depended on it (the `after` of submit specs and client slices; an edge implied by
 * two others is not drawn). Subtask slices carry cat "subtask" and args id, job, kind,
 * group, member, status, attempts, queued, dispatch_us, result_us, after; client slices
 * that are jobs carry id, job, kind and after. Times are microseconds since the controller
 * started, on the controller's clock. A client's counters (ph C, ff_controller_trace_counter) are
 * series of a worker's process.
 *
 * Not here: reading trace files back (controller/tracesum: `fuseflow trace summary`). */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "controller/ctl_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

/* ---- recording ------------------------------------------------------------------------------ */
static uint64_t str_hash(const char *s) {
    uint64_t h = ff_hash_fnv1a(s, strlen(s), FF_HASH_FNV1A_INIT);
    return h == 0 || h == UINT64_MAX ? 1 : h;
}

int trace_intern(ctl_trace *t, const char *s) {
    uint64_t h = str_hash(s);
    intptr_t hit = (intptr_t)u64map_get(&t->string_index, h);
    if (hit && !strcmp(t->strings[hit - 1], s)) return (int)(hit - 1);
    if (hit) /* a hash collision: rare enough for a scan */
        for (int i = t->nstrings - 1; i >= 0; i--)
            if (!strcmp(t->strings[i], s)) return i;
    if (t->nstrings == t->strings_cap) {
        int cap = t->strings_cap ? 2 * t->strings_cap : 16;
        char **a = ff_realloc(t->strings, sizeof *a * (size_t)cap);
        if (!a) return -1;
        t->strings = a;
        t->strings_cap = cap;
    }
    char *d = ff_strdup(s);
    if (!d) return -1;
    t->strings[t->nstrings] = d;
    if (!hit) u64map_put(&t->string_index, h, (void *)(intptr_t)(t->nstrings + 1));
    return t->nstrings++;
}

int trace_add_after(ctl_trace *t, const uint64_t *after, int n, size_t *off) {
    if (t->nafter + (size_t)n > t->after_cap) {
        size_t cap = t->after_cap ? t->after_cap : 256;
        while (cap < t->nafter + (size_t)n) cap *= 2;
        uint64_t *a = ff_realloc(t->after, sizeof *a * cap);
        if (!a) return -1;
        t->after = a;
        t->after_cap = cap;
    }
    *off = t->nafter;
    memcpy(t->after + t->nafter, after, sizeof *after * (size_t)n);
    t->nafter += (size_t)n;
    return 0;
}

void trace_record(ctl_trace *t, const ctl_sub *s) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        trace_rec *a = realloc(t->recs, sizeof *a * cap);
        if (!a) return; /* a trace with holes beats a failed run */
        t->recs = a;
        t->cap = cap;
    }
    const ctl_job *j = s->job;
    trace_rec *r = &t->recs[t->n++];
    r->id = s->id;
    r->job = j->id;
    r->rank = s->rank;
    r->member = j->n > 1 ? s->member : -1;
    r->status = s->status;
    r->attempts = s->attempts;
    r->label = j->label;
    r->group_label = j->group_label;
    r->kind = j->kind;
    r->queued = s->queued;
    r->dispatch_ns = s->dispatch_ns;
    r->worker_start_ns = s->start_ns ? s->worker_start_ns : 0;
    r->worker_end_ns = s->start_ns ? s->worker_end_ns : 0;
    r->done_ns = s->done_ns;
    r->send_ns = s->send_ns;
    r->after_off = j->after_off;
    r->nafter = j->nafter;
}

void trace_free(ctl_trace *t) {
    for (int i = 0; i < t->nstrings; i++) free(t->strings[i]);
    free(t->strings);
    u64map_free(&t->string_index);
    free(t->recs);
    free(t->evs);
    free(t->tracks);
    free(t->after);
    free(t->args);
    memset(t, 0, sizeof *t);
}

/* ---- what clients add ------------------------------------------------------------------------ */
static int need_trace(const ff_controller *c, const char *what) {
    return c->trace.on ? 0 : ff_error_set(what, "set opts.trace or opts.trace_path", "tracing is off");
}

int ff_controller_trace_track(ff_controller *c, const char *name) {
    assert(name);
    if (need_trace(c, "trace track") != 0) return -1;
    ctl_trace *t = &c->trace;
    int sid = trace_intern(t, name);
    if (sid < 0) return -1;
    for (int k = 0; k < t->ntracks; k++)
        if (t->tracks[k] == sid) return k + 1;
    if (t->ntracks == t->tracks_cap) {
        int cap = t->tracks_cap ? 2 * t->tracks_cap : 8;
        int *a = ff_realloc(t->tracks, sizeof *a * (size_t)cap);
        if (!a) return -1;
        t->tracks = a;
        t->tracks_cap = cap;
    }
    t->tracks[t->ntracks++] = sid;
    return t->ntracks;
}

static trace_ev *new_ev(ff_controller *c, trace_ev_type type) {
    ctl_trace *t = &c->trace;
    if (t->nev == t->ev_cap) {
        size_t cap = t->ev_cap ? 2 * t->ev_cap : 256;
        trace_ev *a = ff_realloc(t->evs, sizeof *a * cap);
        if (!a) return NULL;
        t->evs = a;
        t->ev_cap = cap;
    }
    trace_ev *e = &t->evs[t->nev];
    memset(e, 0, sizeof *e);
    e->type = type;
    e->id = c->next_id++; /* the jobs' and subtasks' counter: an id names one thing */
    return e;
}

static int args_grow(ctl_trace *t, size_t more) {
    if (t->nargs + more <= t->args_cap) return 0;
    size_t cap = t->args_cap ? t->args_cap : 4096;
    while (cap < t->nargs + more) cap *= 2;
    char *a = ff_realloc(t->args, cap);
    if (!a) return -1;
    t->args = a;
    t->args_cap = cap;
    return 0;
}

static int args_printf(ctl_trace *t, const char *fmt, ...) FF_PRINTF(2, 3);
static int args_printf(ctl_trace *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || args_grow(t, (size_t)n + 1) != 0) return -1;
    va_start(ap, fmt);
    vsnprintf(t->args + t->nargs, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->nargs += (size_t)n;
    return 0;
}

/* s as a JSON string (len bytes; control characters escaped) */
static int args_str(ctl_trace *t, const char *s, size_t len) {
    if (args_grow(t, 6 * len + 2) != 0) return -1;
    char *o = t->args + t->nargs;
    *o++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') *o++ = '\\', *o++ = (char)ch;
        else if (ch < 0x20) o += sprintf(o, "\\u%04x", ch);
        else *o++ = (char)ch;
    }
    *o++ = '"';
    t->nargs = (size_t)(o - t->args);
    return 0;
}

/* The args as JSON members ("k":v,"k2":v2) in the arena. */
static int put_args(ctl_trace *t, const ff_arg *args, int nargs, trace_ev *e) {
    size_t start = t->nargs;
    for (int i = 0; i < nargs; i++) {
        const ff_arg *a = &args[i];
        if ((i && args_printf(t, ",") != 0) || args_str(t, a->key, strnlen(a->key, sizeof a->key)) != 0 ||
            args_printf(t, ":") != 0)
            return -1;
        int rc;
        switch (a->type) {
        case FF_ARG_INT: rc = args_printf(t, "%lld", (long long)a->v.i); break;
        case FF_ARG_FLOAT: rc = isfinite(a->v.f) ? args_printf(t, "%.17g", a->v.f) : args_printf(t, "null"); break;
        case FF_ARG_BOOL: rc = args_printf(t, "%s", a->v.b ? "true" : "false"); break;
        case FF_ARG_STR: rc = args_str(t, a->v.s.p, a->v.s.len); break;
        default: rc = ff_error_set("trace slice", NULL, "arg '%s' has an unknown type %d", a->key, (int)a->type);
        }
        if (rc != 0) return -1;
    }
    e->args_off = start;
    e->args_len = (uint32_t)(t->nargs - start);
    return 0;
}

uint64_t ff_controller_trace_slice(ff_controller *c, const ff_trace_slice *s) {
    assert(s && s->name && s->nafter >= 0 && s->nargs >= 0 && (s->job || !s->nafter));
    if (need_trace(c, "trace slice") != 0) return 0;
    ctl_trace *t = &c->trace;
    if (s->track < 1 || s->track > t->ntracks) {
        ff_error_set("trace slice", "use an id from ff_controller_trace_track", "'%s': no track %d", s->name, s->track);
        return 0;
    }
    if (s->end_ns < s->start_ns) {
        ff_error_set("trace slice", "times are ff_now_ns() readings, the end after the start",
                     "'%s' ends %lld ns before it starts", s->name, (long long)(s->start_ns - s->end_ns));
        return 0;
    }
    size_t nev = t->nev, nafter = t->nafter, nargs = t->nargs;
    trace_ev *e = new_ev(c, TRACE_SLICE);
    if (!e) return 0;
    const char *cat = s->cat ? s->cat : "client";
    e->job = s->job;
    e->track = s->track - 1;
    e->name = trace_intern(t, s->name);
    e->cat = trace_intern(t, cat);
    e->kind = trace_intern(t, s->kind ? s->kind : cat);
    e->start_ns = s->start_ns;
    e->end_ns = s->end_ns;
    if (e->name < 0 || e->cat < 0 || e->kind < 0 || (s->nafter && trace_add_after(t, s->after, s->nafter, &e->after_off) != 0) ||
        put_args(t, s->args, s->nargs, e) != 0) {
        t->nev = nev, t->nafter = nafter, t->nargs = nargs; /* as if never asked */
        return 0;
    }
    e->nafter = s->nafter;
    t->nev++;
    return e->id;
}

uint64_t ff_controller_trace_instant(ff_controller *c, int track, const char *name, int64_t t_ns) {
    assert(name);
    if (need_trace(c, "trace instant") != 0) return 0;
    ctl_trace *t = &c->trace;
    if (track < 1 || track > t->ntracks) {
        ff_error_set("trace instant", "use an id from ff_controller_trace_track", "'%s': no track %d", name, track);
        return 0;
    }
    trace_ev *e = new_ev(c, TRACE_INSTANT);
    if (!e) return 0;
    e->track = track - 1;
    e->name = trace_intern(t, name);
    e->cat = trace_intern(t, "instant");
    e->kind = e->cat;
    e->start_ns = e->end_ns = t_ns;
    if (e->name < 0 || e->cat < 0) return 0;
    t->nev++;
    return e->id;
}

int ff_controller_trace_counter(ff_controller *c, int rank, const char *name, int64_t t_ns, const ff_arg *values, int n) {
    assert(name && values && n > 0);
    if (need_trace(c, "trace counter") != 0) return -1;
    ctl_trace *t = &c->trace;
    if (rank < 0 || rank >= c->nworkers)
        return ff_error_set("trace counter", "name a worker's rank", "'%s': no worker %d (of %d)", name, rank, c->nworkers);
    for (int i = 0; i < n; i++)
        if (values[i].type != FF_ARG_INT && values[i].type != FF_ARG_FLOAT)
            return ff_error_set("trace counter", "give numbers", "'%s': series '%s' is not a number", name, values[i].key);
    size_t nev = t->nev, nargs = t->nargs;
    trace_ev *e = new_ev(c, TRACE_COUNTER);
    if (!e) return -1;
    e->track = rank;
    e->name = trace_intern(t, name);
    e->cat = e->kind = e->name;
    e->start_ns = e->end_ns = t_ns;
    if (e->name < 0 || put_args(t, values, n, e) != 0) {
        t->nev = nev, t->nargs = nargs;
        return -1;
    }
    t->nev++;
    return 0;
}

int ff_controller_trace_flow(ff_controller *c, uint64_t from, uint64_t to, const char *name) {
    assert(name);
    if (need_trace(c, "trace flow") != 0) return -1;
    if (!from || !to || from >= c->next_id || to >= c->next_id)
        return ff_error_set("trace flow", "join ids of submitted jobs or recorded slices", "'%s': no job or slice %llu", name,
                            (unsigned long long)(!from || from >= c->next_id ? from : to));
    trace_ev *e = new_ev(c, TRACE_FLOW);
    if (!e) return -1;
    e->name = trace_intern(&c->trace, name);
    e->cat = trace_intern(&c->trace, "flow");
    e->from = from;
    e->to = to;
    if (e->name < 0 || e->cat < 0) return -1;
    c->trace.nev++;
    return 0;
}

/* ---- writing ------------------------------------------------------------------------------ */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static double us(const ctl_trace *t, int64_t ns) { return (double)(ns - t->origin_ns) / 1e3; }

static const char *str_of(const ctl_trace *t, int id) { return id >= 0 && id < t->nstrings ? t->strings[id] : "?"; }

typedef struct lane_ref {
    size_t rec;
    int64_t start;
} lane_ref;

static int cmp_lane_ref(const void *a, const void *b) {
    const lane_ref *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : (x->rec > y->rec) - (x->rec < y->rec);
}

/* Lanes of one track so that a lane's slices never overlap: greedy by start time (sorts
 * refs). lane[refs[k].rec] is set; returns the number of lanes. */
static int assign_lanes(lane_ref *refs, size_t n, const int64_t *end, int *lane) {
    qsort(refs, n, sizeof *refs, cmp_lane_ref);
    int64_t ends[64];
    int nl = 0;
    for (size_t k = 0; k < n; k++) {
        size_t ri = refs[k].rec;
        int l = 0;
        while (l < nl && ends[l] > refs[k].start) l++;
        if (l == nl) {
            if (nl < 64) nl++;
            else l = nl - 1; /* 64 overlapping lanes: let the last one take the excess */
        }
        ends[l] = end[ri];
        lane[ri] = l;
    }
    return nl;
}

/* Where a job or slice is drawn (arrows start at its end, end at its start), and what it
 * depended on. */
typedef struct node_at {
    int pid, tid;
    double ts, end; /* us */
    size_t after_off;
    int nafter;
} node_at;

/* An arrow: s just inside the end of a, f (bound to the enclosing slice) at the start of b. */
static void arrow(FILE *f, const char *cat, const char *name, uint64_t id, const node_at *a, const node_at *b) {
    double dur = a->end - a->ts, ts_out = a->end - (dur > 0.002 ? 0.001 : dur / 2);
    fprintf(f, ",\n{\"ph\":\"s\",\"cat\":\"%s\",\"name\":", cat);
    json_str(f, name);
    fprintf(f, ",\"id\":%llu,\"pid\":%d,\"tid\":%d,\"ts\":%.3f}", (unsigned long long)id, a->pid, a->tid, ts_out);
    fprintf(f, ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"%s\",\"name\":", cat);
    json_str(f, name);
    fprintf(f, ",\"id\":%llu,\"pid\":%d,\"tid\":%d,\"ts\":%.3f}", (unsigned long long)id, b->pid, b->tid, b->ts);
}

static void after_list(FILE *f, const ctl_trace *t, size_t off, int n) {
    fprintf(f, "\"after\":[");
    for (int k = 0; k < n; k++) fprintf(f, "%s%llu", k ? "," : "", (unsigned long long)t->after[off + (size_t)k]);
    fprintf(f, "]");
}

/* One arrow per dependency, from each job a job depended on, except those implied by another
 * of its dependencies (b in after(B) and a in after(b): a -> B is not drawn). */
static void dependency_arrows(FILE *f, const ctl_trace *t, const node_at *nodes, size_t nn, const u64map *where) {
    u64map implied = {0}, drawn = {0};
    uint64_t flow = 1;
    for (size_t k = 0; k < nn; k++) {
        const node_at *B = &nodes[k];
        if (!B->nafter) continue;
        void *stamp = (void *)(intptr_t)(k + 1);
        const uint64_t *after = t->after + B->after_off;
        for (int i = 0; i < B->nafter; i++) {
            intptr_t b = (intptr_t)u64map_get(where, after[i]);
            if (!b) continue;
            const node_at *nb = &nodes[b - 1];
            for (int q = 0; q < nb->nafter; q++) u64map_put(&implied, t->after[nb->after_off + (size_t)q], stamp);
        }
        for (int i = 0; i < B->nafter; i++) {
            intptr_t a = (intptr_t)u64map_get(where, after[i]);
            if (!a || u64map_get(&implied, after[i]) == stamp || u64map_get(&drawn, after[i]) == stamp) continue;
            u64map_put(&drawn, after[i], stamp);
            arrow(f, "after", "after", flow++, &nodes[a - 1], B);
        }
    }
    u64map_free(&implied);
    u64map_free(&drawn);
}

int ff_controller_trace_write(const ff_controller *c, const char *path) {
    const ctl_trace *t = &c->trace;
    if (!t->on) return ff_error_set(path, "set opts.trace or opts.trace_path", "tracing is off");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return ff_error_set(path, NULL, "out of memory");
    size_t nr = t->n ? t->n : 1, ne = t->nev ? t->nev : 1, nmax = nr > ne ? nr : ne;
    int *lane = ff_calloc(nr, sizeof *lane), *ev_lane = ff_calloc(ne, sizeof *ev_lane);
    lane_ref *refs = ff_malloc(sizeof *refs * nmax);
    int *max_lane = ff_calloc((size_t)(c->nworkers ? c->nworkers : 1), sizeof *max_lane);
    int *track_tid = ff_calloc((size_t)t->ntracks + 1, sizeof *track_tid); /* first tid of each track; [ntracks]: the end */
    int64_t *st = ff_calloc(nr, sizeof *st), *en = ff_calloc(nr, sizeof *en), *ev_end = ff_calloc(ne, sizeof *ev_end);
    ctl_span *spans = ff_malloc(sizeof *spans * nr);
    node_at *nodes = ff_calloc(t->n + t->nev + 1, sizeof *nodes);
    u64map where = {0}; /* job or slice id -> index in nodes + 1 */
    int rc = -1;
    if (!lane || !ev_lane || !refs || !max_lane || !track_tid || !st || !en || !ev_end || !spans || !nodes) goto out;
    /* worker times onto our clock with the best offset estimate we have now (it improves as
     * heartbeats come in), kept between the dispatch and the result, where they happened */
    for (size_t i = 0; i < t->n; i++) {
        const trace_rec *rec = &t->recs[i];
        const ctl_worker *w = rec->rank >= 0 && rec->rank < c->nworkers ? c->workers[rec->rank] : NULL;
        if (!w || (!rec->worker_start_ns && !rec->worker_end_ns)) continue;
        ctl_map_span(w, rec->worker_start_ns, rec->worker_end_ns, rec->dispatch_ns, rec->done_ns, &st[i], &en[i]);
    }
    for (int r = 0; r < c->nworkers; r++) {
        size_t n = 0;
        for (size_t i = 0; i < t->n; i++) {
            const trace_rec *rec = &t->recs[i];
            if (rec->rank == r && st[i])
                spans[n++] = (ctl_span){rec->worker_start_ns, rec->worker_end_ns, rec->done_ns, st[i], en[i], i};
        }
        ctl_keep_worker_order(spans, n); /* in the order the worker ran them */
        for (size_t k = 0; k < n; k++) {
            st[spans[k].id] = spans[k].st, en[spans[k].id] = spans[k].en;
            refs[k] = (lane_ref){spans[k].id, spans[k].st};
        }
        max_lane[r] = assign_lanes(refs, n, en, lane);
    }
    /* the client's tracks: threads 1, 2, ... of process 0, a track with overlapping slices
     * taking several */
    for (size_t i = 0; i < t->nev; i++) ev_end[i] = t->evs[i].end_ns;
    track_tid[0] = 1;
    for (int k = 0; k < t->ntracks; k++) {
        size_t n = 0;
        for (size_t i = 0; i < t->nev; i++)
            if (t->evs[i].type == TRACE_SLICE && t->evs[i].track == k) refs[n++] = (lane_ref){i, t->evs[i].start_ns};
        int nl = assign_lanes(refs, n, ev_end, ev_lane);
        track_tid[k + 1] = track_tid[k] + (nl ? nl : 1);
    }

    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"fuseflow\",\"endpoint\":");
    json_str(f, c->bound);
    fprintf(f, "},\"traceEvents\":[\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"controller\"}},\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":0,\"args\":{\"sort_index\":0}},\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"dispatch\"}}");
    for (int k = 0; k < t->ntracks; k++)
        for (int tid = track_tid[k]; tid < track_tid[k + 1]; tid++) {
            char name[512];
            if (tid == track_tid[k]) snprintf(name, sizeof name, "%s", str_of(t, t->tracks[k]));
            else snprintf(name, sizeof name, "%s (lane %d)", str_of(t, t->tracks[k]), tid - track_tid[k] + 1);
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":", tid);
            json_str(f, name);
            fprintf(f, "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":0,\"tid\":%d,\"args\":{\"sort_index\":%d}}", tid,
                    tid);
        }
    for (int r = 0; r < c->nworkers; r++) {
        const ctl_worker *w = c->workers[r];
        if (!w || !max_lane[r]) continue;
        char name[256];
        snprintf(name, sizeof name, "worker %d (%s, pid %lld, %s)", r, w->host[0] ? w->host : "?", (long long)w->pid,
                 w->device[0] ? w->device : "?");
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":", r + 1);
        json_str(f, name);
        fprintf(f, "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}}", r + 1,
                r + 1);
        for (int l = 0; l < max_lane[r]; l++)
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s%.0d\"}}",
                    r + 1, l + 1, l ? "lane " : "compute", l ? l + 1 : 0);
    }

    /* subtasks: the dispatch, the execution, the arrow between them */
    size_t nn = 0;
    for (size_t i = 0; i < t->n; i++) {
        const trace_rec *rec = &t->recs[i];
        const char *label = str_of(t, rec->label), *group = str_of(t, rec->group_label);
        bool ran = st[i] != 0 && rec->rank >= 0;
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"dispatch\",\"name\":");
        json_str(f, label);
        fprintf(f, ",\"pid\":0,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"id\":%llu,\"rank\":%d}}",
                us(t, rec->dispatch_ns), rec->send_ns / 1e3, (unsigned long long)rec->id, rec->rank);
        if (!ran) continue;
        node_at at = {rec->rank + 1, lane[i] + 1, us(t, st[i]), us(t, en[i]), rec->after_off, rec->nafter};
        if (!u64map_get(&where, rec->job)) { /* a group job is drawn at its first member that ran */
            nodes[nn++] = at;
            u64map_put(&where, rec->job, (void *)(intptr_t)nn);
        }
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"subtask\",\"name\":");
        json_str(f, label);
        fprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"id\":%llu,\"job\":%llu,\"kind\":", at.pid,
                at.tid, at.ts, (double)(en[i] - st[i]) / 1e3, (unsigned long long)rec->id, (unsigned long long)rec->job);
        json_str(f, str_of(t, rec->kind));
        fprintf(f, ",\"group\":");
        json_str(f, group);
        fprintf(f, ",\"member\":%d,\"status\":\"%s\",\"attempts\":%d,\"queued\":%u,\"dispatch_us\":%.3f,\"result_us\":%.3f,",
                rec->member, ff_status_name(rec->status), rec->attempts, rec->queued, us(t, rec->dispatch_ns),
                us(t, rec->done_ns));
        after_list(f, t, rec->after_off, rec->nafter);
        fprintf(f, "}}");
        node_at d = {0, 0, us(t, rec->dispatch_ns), us(t, rec->dispatch_ns), 0, 0};
        arrow(f, "flow", "dispatch", rec->id, &d, &at);
    }
    /* the client's slices and instants */
    for (size_t i = 0; i < t->nev; i++) {
        const trace_ev *e = &t->evs[i];
        if (e->type == TRACE_FLOW) continue;
        if (e->type == TRACE_COUNTER) { /* a series of the worker's process */
            fprintf(f, ",\n{\"ph\":\"C\",\"name\":");
            json_str(f, str_of(t, e->name));
            fprintf(f, ",\"pid\":%d,\"ts\":%.3f,\"args\":{%.*s}}", e->track + 1, us(t, e->start_ns), (int)e->args_len,
                    t->args + e->args_off);
            continue;
        }
        node_at at = {0, track_tid[e->track] + (e->type == TRACE_SLICE ? ev_lane[i] : 0), us(t, e->start_ns), us(t, e->end_ns),
                      e->after_off, e->job ? e->nafter : 0};
        nodes[nn++] = at;
        u64map_put(&where, e->id, (void *)(intptr_t)nn);
        if (e->type == TRACE_INSTANT) fprintf(f, ",\n{\"ph\":\"i\",\"s\":\"t\",\"cat\":");
        else fprintf(f, ",\n{\"ph\":\"X\",\"cat\":");
        json_str(f, str_of(t, e->cat));
        fprintf(f, ",\"name\":");
        json_str(f, str_of(t, e->name));
        fprintf(f, ",\"pid\":0,\"tid\":%d,\"ts\":%.3f", at.tid, at.ts);
        if (e->type == TRACE_SLICE) fprintf(f, ",\"dur\":%.3f", (double)(e->end_ns - e->start_ns) / 1e3);
        fprintf(f, ",\"args\":{\"id\":%llu", (unsigned long long)e->id);
        if (e->job) {
            fprintf(f, ",\"job\":%llu,\"kind\":", (unsigned long long)e->id);
            json_str(f, str_of(t, e->kind));
            fprintf(f, ",");
            after_list(f, t, e->after_off, e->nafter);
        }
        if (e->args_len) fprintf(f, ",%.*s", (int)e->args_len, t->args + e->args_off);
        fprintf(f, "}}");
    }
    /* arrows: the client's, then the dependencies */
    for (size_t i = 0; i < t->nev; i++) {
        const trace_ev *e = &t->evs[i];
        if (e->type != TRACE_FLOW) continue;
        intptr_t a = (intptr_t)u64map_get(&where, e->from), b = (intptr_t)u64map_get(&where, e->to);
        if (a && b) arrow(f, "flow", str_of(t, e->name), e->id, &nodes[a - 1], &nodes[b - 1]);
    }
    dependency_arrows(f, t, nodes, nn, &where);
    fprintf(f, "\n]}\n");
    rc = 0;
out:
    fclose(f);
    if (rc == 0) rc = ff_write_file_atomic(path, buf, len);
    free(buf);
    free(lane), free(ev_lane), free(refs), free(max_lane), free(track_tid);
    free(st), free(en), free(ev_end), free(spans), free(nodes);
    u64map_free(&where);
    return rc;
}
