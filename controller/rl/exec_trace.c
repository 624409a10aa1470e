/* The timeline of a run (`fuseflow run --trace FILE`): the runtime's trace of every subtask
 * (controller.h: a track per worker, dispatch arrows), plus what only the executor knows:
 *   - controller-side nodes (rewards, advantages) as slices on the controller's "executor"
 *     track, named by node and samples like the subtasks ("reward s8-15");
 *   - a track per graph node with one slice per iteration (from its first dispatch to its
 *     last result: where stages overlap under the fused schedule), and one for iterations;
 *   - flow arrows along each sample's path through the graph (generate -> log-probs ->
 *     reward -> advantage -> train), one per distinct pair of slices.
 * The runtime writes its file first; this adds events to it (times mapped onto the same
 * clock through a dispatch both know) and writes the result.
 *
 * Not here: recording subtasks (the controller does). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

typedef struct path_rec {
    int64_t it, sample, seq;
    uint64_t job;  /* controller job, or 0 for a local slice */
    int64_t local; /* index into locals */
} path_rec;

typedef struct local_slice {
    char name[96];
    int64_t start_ns, end_ns;
} local_slice;

typedef struct span {
    char track[64], name[96];
    int64_t start_ns, end_ns;
} span;

struct ex_trace {
    path_rec *recs;
    size_t n, cap;
    local_slice *locals;
    size_t nl, capl;
    span *spans;
    size_t ns, caps;
    int64_t seq;
    uint64_t calib_subtask;
    int64_t calib_ns;
};

ex_trace *ex_trace_new(void) { return ff_calloc(1, sizeof(ex_trace)); }

void ex_trace_free(ex_trace **pt) {
    if (!*pt) return;
    free((*pt)->recs), free((*pt)->locals), free((*pt)->spans);
    free(*pt);
    *pt = NULL;
}

static void add_rec(ex_trace *t, int64_t it, int64_t sample, uint64_t job, int64_t local) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        path_rec *v = realloc(t->recs, cap * sizeof *v);
        if (!v) return; /* a trace with gaps beats a failed run */
        t->recs = v;
        t->cap = cap;
    }
    t->recs[t->n++] = (path_rec){it, sample, t->seq, job, local};
}

void ex_trace_job(ex_trace *t, int64_t it, uint64_t job, const int64_t *samples, int64_t n) {
    t->seq++;
    for (int64_t i = 0; i < n; i++) add_rec(t, it, samples[i], job, -1);
}

void ex_trace_local(ex_trace *t, int64_t it, const char *name, int64_t start_ns, int64_t end_ns, const int64_t *samples, int64_t n) {
    if (t->nl == t->capl) {
        size_t cap = t->capl ? 2 * t->capl : 256;
        local_slice *v = realloc(t->locals, cap * sizeof *v);
        if (!v) return;
        t->locals = v;
        t->capl = cap;
    }
    local_slice *l = &t->locals[t->nl];
    if (n == 1) snprintf(l->name, sizeof l->name, "%s s%" PRId64, name, samples[0]);
    else snprintf(l->name, sizeof l->name, "%s s%" PRId64 "-%" PRId64 " (%" PRId64 ")", name, samples[0], samples[n - 1], n);
    l->start_ns = start_ns;
    l->end_ns = end_ns > start_ns ? end_ns : start_ns + 1000;
    t->seq++;
    for (int64_t i = 0; i < n; i++) add_rec(t, it, samples[i], 0, (int64_t)t->nl);
    t->nl++;
}

void ex_trace_span(ex_trace *t, const char *track, const char *name, int64_t start_ns, int64_t end_ns) {
    if (t->ns == t->caps) {
        size_t cap = t->caps ? 2 * t->caps : 256;
        span *v = realloc(t->spans, cap * sizeof *v);
        if (!v) return;
        t->spans = v;
        t->caps = cap;
    }
    span *s = &t->spans[t->ns++];
    snprintf(s->track, sizeof s->track, "%s", track);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->start_ns = start_ns;
    s->end_ns = end_ns > start_ns ? end_ns : start_ns + 1000;
}

void ex_trace_dispatch(ex_trace *t, uint64_t subtask, int64_t dispatch_ns) {
    if (t->calib_subtask || !dispatch_ns) return;
    t->calib_subtask = subtask;
    t->calib_ns = dispatch_ns;
}

/* ---- writing ------------------------------------------------------------------------------------ */
typedef struct slice_at {
    int pid, tid;
    double ts, dur;
    bool ok;
} slice_at;

static int cmp_rec(const void *a, const void *b) {
    const path_rec *x = a, *y = b;
    if (x->it != y->it) return x->it < y->it ? -1 : 1;
    if (x->sample != y->sample) return x->sample < y->sample ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static void add_event(json_t *ev, json_t *e) { json_array_append_new(ev, e); }

static json_t *meta(const char *what, int pid, int tid, const char *name) {
    json_t *e = json_pack("{s:s, s:s, s:i, s:{s:s}}", "ph", "M", "name", what, "pid", pid, "args", "name", name);
    if (tid >= 0) json_object_set_new(e, "tid", json_integer(tid));
    return e;
}

static json_t *slice(const char *cat, const char *name, int pid, int tid, double ts, double dur) {
    return json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f}", "ph", "X", "cat", cat, "name", name, "pid", pid, "tid", tid, "ts", ts,
                     "dur", dur);
}

int ex_trace_write(ex_trace *t, ff_controller *c, const char *path) {
    char tmp[FF_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.runtime.%d", path, (int)getpid());
    if (ff_controller_trace_write(c, tmp) != 0) return -1;
    json_error_t jerr;
    json_t *root = json_load_file(tmp, 0, &jerr);
    unlink(tmp);
    if (!root) return ff_error_set(path, NULL, "re-reading the runtime's trace: %s", jerr.text);
    json_t *ev = json_object_get(root, "traceEvents");
    /* the clock: a dispatch both sides know */
    double off_us = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (!cat || strcmp(cat, "dispatch")) continue;
        if ((uint64_t)json_integer_value(json_object_get(json_object_get(e, "args"), "id")) != t->calib_subtask) continue;
        off_us = json_number_value(json_object_get(e, "ts")) - (double)t->calib_ns / 1e3;
        break;
    }
    /* subtask slices by job */
    size_t nev = json_array_size(ev);
    uint64_t *jobs = calloc(nev ? nev : 1, sizeof *jobs);
    slice_at *at = calloc(nev ? nev : 1, sizeof *at);
    size_t nj = 0;
    if (!jobs || !at) {
        free(jobs), free(at);
        json_decref(root);
        return ff_error_set(path, NULL, "out of memory");
    }
    json_array_foreach(ev, i, e) {
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (!cat || strcmp(cat, "subtask")) continue;
        uint64_t job = (uint64_t)json_integer_value(json_object_get(json_object_get(e, "args"), "job"));
        jobs[nj] = job;
        at[nj] = (slice_at){(int)json_integer_value(json_object_get(e, "pid")), (int)json_integer_value(json_object_get(e, "tid")),
                            json_number_value(json_object_get(e, "ts")), json_number_value(json_object_get(e, "dur")), true};
        nj++;
    }
    /* job -> slice (the first one: a group job's members all carry the same path) */
    size_t map_cap = 2 * nj + 1;
    size_t *map = calloc(map_cap, sizeof *map);
    if (!map) {
        free(jobs), free(at);
        json_decref(root);
        return ff_error_set(path, NULL, "out of memory");
    }
    for (size_t q = 0; q < nj; q++) {
        size_t h = (size_t)(ff_hash_fnv1a(&jobs[q], sizeof jobs[q], FF_HASH_FNV1A_INIT) % map_cap);
        bool dup = false;
        for (; map[h]; h = (h + 1) % map_cap) dup |= jobs[map[h] - 1] == jobs[q];
        if (!dup) map[h] = q + 1;
    }
    /* the executor's tracks on the controller */
    add_event(ev, meta("thread_name", 0, 1, "executor (controller-side nodes)"));
    add_event(ev, meta("thread_name", 0, 2, "iterations"));
    for (size_t k = 0; k < t->nl; k++) {
        const local_slice *l = &t->locals[k];
        add_event(ev, slice("local", l->name, 0, 1, (double)l->start_ns / 1e3 + off_us, (double)(l->end_ns - l->start_ns) / 1e3));
    }
    char tracks[EX_MAX_NODES + 1][64];
    int ntracks = 0;
    for (size_t k = 0; k < t->ns; k++) {
        const span *s = &t->spans[k];
        int tid = 2;
        if (strcmp(s->track, "iterations")) {
            int q;
            for (q = 0; q < ntracks && strcmp(tracks[q], s->track); q++) {}
            if (q == ntracks && ntracks < EX_MAX_NODES) {
                snprintf(tracks[ntracks++], 64, "%s", s->track);
                char name[96];
                snprintf(name, sizeof name, "stage %s", s->track);
                add_event(ev, meta("thread_name", 0, 3 + q, name));
            }
            tid = 3 + q;
        }
        add_event(ev, slice("stage", s->name, 0, tid, (double)s->start_ns / 1e3 + off_us, (double)(s->end_ns - s->start_ns) / 1e3));
    }
    /* arrows along each sample's path: consecutive slices of the same sample */
    qsort(t->recs, t->n, sizeof *t->recs, cmp_rec);
    uint64_t flow = (uint64_t)1 << 40;
    uint64_t *seen = calloc(8192, sizeof *seen); /* (a, b) pairs already drawn: a small open hash */
    size_t seen_cap = 8192, seen_n = 0;
    for (size_t k = 0; seen && k + 1 < t->n; k++) {
        const path_rec *a = &t->recs[k], *b = &t->recs[k + 1];
        if (a->it != b->it || a->sample != b->sample) continue;
        slice_at sa = {0}, sb = {0};
        for (int w = 0; w < 2; w++) {
            const path_rec *r = w ? b : a;
            slice_at *s = w ? &sb : &sa;
            if (r->job) {
                for (size_t h = (size_t)(ff_hash_fnv1a(&r->job, sizeof r->job, FF_HASH_FNV1A_INIT) % map_cap); map[h]; h = (h + 1) % map_cap)
                    if (jobs[map[h] - 1] == r->job) {
                        *s = at[map[h] - 1];
                        break;
                    }
            } else if (r->local >= 0 && (size_t)r->local < t->nl) {
                const local_slice *l = &t->locals[r->local];
                *s = (slice_at){0, 1, (double)l->start_ns / 1e3 + off_us, (double)(l->end_ns - l->start_ns) / 1e3, true};
            }
        }
        if (!sa.ok || !sb.ok) continue;
        uint64_t key = (a->job ? a->job : (uint64_t)a->local + ((uint64_t)1 << 50)) * 1000003u ^
                       (b->job ? b->job : (uint64_t)b->local + ((uint64_t)1 << 50));
        if (!key) key = 1;
        size_t h = (size_t)(ff_hash_fnv1a(&key, sizeof key, FF_HASH_FNV1A_INIT) % seen_cap);
        bool dup = false;
        while (seen[h]) {
            if (seen[h] == key) {
                dup = true;
                break;
            }
            h = (h + 1) % seen_cap;
        }
        if (dup) continue;
        if (seen_n * 2 < seen_cap) {
            seen[h] = key;
            seen_n++;
        }
        double ts_out = sa.ts + sa.dur - (sa.dur > 0.002 ? 0.001 : sa.dur / 2);
        json_t *s = json_pack("{s:s, s:s, s:s, s:I, s:i, s:i, s:f}", "ph", "s", "cat", "sample", "name", "sample path", "id",
                              (json_int_t)flow, "pid", sa.pid, "tid", sa.tid, "ts", ts_out);
        json_t *f = json_pack("{s:s, s:s, s:s, s:s, s:I, s:i, s:i, s:f}", "ph", "f", "bp", "e", "cat", "sample", "name",
                              "sample path", "id", (json_int_t)flow, "pid", sb.pid, "tid", sb.tid, "ts", sb.ts);
        add_event(ev, s);
        add_event(ev, f);
        flow++;
    }
    free(seen), free(jobs), free(at), free(map);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) return ff_error_set(path, NULL, "out of memory writing the trace");
    int rc = ff_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}
