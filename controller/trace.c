/* Timelines: recording subtasks as they complete, writing them as Chrome Trace Event JSON
 * (Perfetto, chrome://tracing), and summarising such a file (`fuseflow trace summary`).
 *
 * The file: process 0 is the controller, with one thread ("dispatch") whose slices are the
 * sends of subtasks; process r+1 is worker r, with one thread per lane of execution: slices
 * that overlap in time (an inline handler next to a compute one, or clock-mapping jitter)
 * go to further lanes, so every track nests. A flow arrow (ph s/f, id = subtask id) links
 * each dispatch to its execution. Subtask slices carry cat "subtask" and args id, job,
 * group, status, attempts, queued, after (the jobs it depended on). Times are microseconds
 * since the controller started, on the controller's clock. */
#include <jansson.h>
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
    free(t->after);
    memset(t, 0, sizeof *t);
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

static double us(const ctl_trace *t, int64_t ns) { return (ns - t->origin_ns) / 1e3; }

static const char *label_of(const ctl_trace *t, int id) { return id >= 0 && id < t->nstrings ? t->strings[id] : "?"; }

typedef struct lane_ref {
    size_t rec;
    int64_t start;
} lane_ref;

static int cmp_lane_ref(const void *a, const void *b) {
    const lane_ref *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : (x->rec > y->rec) - (x->rec < y->rec);
}

int ff_controller_trace_write(const ff_controller *c, const char *path) {
    const ctl_trace *t = &c->trace;
    if (!t->on) return ff_error_set(path, "set opts.trace or opts.trace_path", "tracing is off");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return ff_error_set(path, NULL, "out of memory");
    /* lanes per worker: greedy by start time so each lane's slices never overlap */
    int *lane = ff_calloc(t->n ? t->n : 1, sizeof *lane);
    lane_ref *refs = ff_malloc(sizeof *refs * (t->n ? t->n : 1));
    int *max_lane = ff_calloc((size_t)(c->nworkers ? c->nworkers : 1), sizeof *max_lane);
    int64_t *st = ff_calloc(t->n ? t->n : 1, sizeof *st), *en = ff_calloc(t->n ? t->n : 1, sizeof *en);
    if (!lane || !refs || !max_lane || !st || !en) {
        fclose(f);
        free(buf);
        free(lane);
        free(refs);
        free(max_lane);
        free(st);
        free(en);
        return -1;
    }
    /* worker times onto our clock with the best offset estimate we have now (it improves as
     * heartbeats come in), kept between the dispatch and the result, where they happened */
    for (size_t i = 0; i < t->n; i++) {
        const trace_rec *rec = &t->recs[i];
        const ctl_worker *w = rec->rank >= 0 && rec->rank < c->nworkers ? c->workers[rec->rank] : NULL;
        if (!w || (!rec->worker_start_ns && !rec->worker_end_ns)) continue;
        int64_t a = ctl_map_clock(w, rec->worker_start_ns), b = ctl_map_clock(w, rec->worker_end_ns);
        if (a < rec->dispatch_ns) a = rec->dispatch_ns;
        if (a > rec->done_ns) a = rec->done_ns;
        if (b < a) b = a;
        if (b > rec->done_ns) b = rec->done_ns;
        st[i] = a;
        en[i] = b;
    }
    for (int r = 0; r < c->nworkers; r++) {
        size_t n = 0;
        for (size_t i = 0; i < t->n; i++)
            if (t->recs[i].rank == r && st[i]) refs[n++] = (lane_ref){i, st[i]};
        qsort(refs, n, sizeof *refs, cmp_lane_ref);
        int64_t ends[64];
        int nl = 0;
        for (size_t k = 0; k < n; k++) {
            size_t ri = refs[k].rec;
            int l = 0;
            while (l < nl && ends[l] > st[ri]) l++;
            if (l == nl) {
                if (nl < 64) nl++;
                else l = nl - 1; /* 64 overlapping lanes: let the last one take the excess */
            }
            ends[l] = en[ri];
            lane[refs[k].rec] = l;
        }
        max_lane[r] = nl;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"fuseflow\",\"endpoint\":");
    json_str(f, c->bound);
    fprintf(f, "},\"traceEvents\":[\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"controller\"}},\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":0,\"args\":{\"sort_index\":0}},\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"dispatch\"}}");
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
    for (size_t i = 0; i < t->n; i++) {
        const trace_rec *rec = &t->recs[i];
        const char *label = label_of(t, rec->label), *group = label_of(t, rec->group_label);
        bool ran = st[i] != 0 && rec->rank >= 0;
        /* the dispatch on the controller */
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"dispatch\",\"name\":");
        json_str(f, label);
        fprintf(f, ",\"pid\":0,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"id\":%llu,\"rank\":%d}}",
                us(t, rec->dispatch_ns), rec->send_ns / 1e3, (unsigned long long)rec->id, rec->rank);
        if (!ran) continue;
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"subtask\",\"name\":");
        json_str(f, label);
        fprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"id\":%llu,\"job\":%llu,\"group\":", rec->rank + 1,
                lane[i] + 1, us(t, st[i]), (en[i] - st[i]) / 1e3, (unsigned long long)rec->id,
                (unsigned long long)rec->job);
        json_str(f, group);
        fprintf(f, ",\"member\":%d,\"status\":\"%s\",\"attempts\":%d,\"queued\":%u,\"dispatch_us\":%.3f,\"result_us\":%.3f,"
                   "\"after\":[",
                rec->member, ff_status_name(rec->status), rec->attempts, rec->queued, us(t, rec->dispatch_ns),
                us(t, rec->done_ns));
        for (int k = 0; k < rec->nafter; k++)
            fprintf(f, "%s%llu", k ? "," : "", (unsigned long long)t->after[rec->after_off + (size_t)k]);
        fprintf(f, "]}}");
        /* the arrow from dispatch to execution */
        fprintf(f, ",\n{\"ph\":\"s\",\"cat\":\"flow\",\"name\":\"dispatch\",\"id\":%llu,\"pid\":0,\"tid\":0,\"ts\":%.3f}",
                (unsigned long long)rec->id, us(t, rec->dispatch_ns));
        fprintf(f, ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"flow\",\"name\":\"dispatch\",\"id\":%llu,\"pid\":%d,\"tid\":%d,"
                   "\"ts\":%.3f}",
                (unsigned long long)rec->id, rec->rank + 1, lane[i] + 1, us(t, st[i]));
    }
    fprintf(f, "\n]}\n");
    fclose(f);
    free(lane);
    free(refs);
    free(max_lane);
    free(st);
    free(en);
    int rc = ff_write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}

/* ---- summary ------------------------------------------------------------------------------ */
typedef struct ival {
    double a, b;
} ival;

static int cmp_ival(const void *x, const void *y) {
    const ival *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* total length of the union of intervals (sorts them) */
static double union_len(ival *v, size_t n) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_ival);
    double total = 0, a = v[0].a, b = v[0].b;
    for (size_t i = 1; i < n; i++) {
        if (v[i].a > b) {
            total += b - a;
            a = v[i].a;
            b = v[i].b;
        } else if (v[i].b > b) {
            b = v[i].b;
        }
    }
    return total + (b - a);
}

typedef struct ev_rec {
    int pid;
    const char *group;
    uint64_t job;
    double ts, end;
    const char *name;
    json_t *after;
} ev_rec;

typedef struct job_rec {
    uint64_t id;
    double start, end;
    const char *name;
    json_t *after;
    int state; /* 0 new, 1 visiting, 2 done */
    double best;
    long next; /* index of the next job on its best chain (the one it depends on), -1 */
    int count;
} job_rec;

static int cmp_job(const void *a, const void *b) {
    const job_rec *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static long find_job(job_rec *jobs, size_t n, uint64_t id) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (jobs[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && jobs[lo].id == id ? (long)lo : -1;
}

/* Longest chain ending at job i (by the sum of job durations), iterative DFS over `after`. */
static void chain(job_rec *jobs, size_t n, size_t i) {
    size_t cap = 64, top = 0;
    size_t *stack = malloc(sizeof *stack * cap);
    if (!stack) return;
    stack[top++] = i;
    while (top) {
        size_t k = stack[top - 1];
        job_rec *j = &jobs[k];
        if (j->state == 2) {
            top--;
            continue;
        }
        if (j->state == 0) {
            j->state = 1;
            size_t na = json_is_array(j->after) ? json_array_size(j->after) : 0;
            for (size_t a = 0; a < na; a++) {
                long d = find_job(jobs, n, (uint64_t)json_integer_value(json_array_get(j->after, a)));
                if (d >= 0 && jobs[d].state == 0) {
                    if (top == cap) {
                        size_t *s2 = realloc(stack, sizeof *stack * (cap *= 2));
                        if (!s2) {
                            free(stack);
                            return;
                        }
                        stack = s2;
                    }
                    stack[top++] = (size_t)d;
                }
            }
            continue;
        }
        /* state 1: its dependencies are done (a cycle's back edge counts as absent) */
        double best = 0;
        long next = -1;
        int count = 0;
        size_t na = json_is_array(j->after) ? json_array_size(j->after) : 0;
        for (size_t a = 0; a < na; a++) {
            long d = find_job(jobs, n, (uint64_t)json_integer_value(json_array_get(j->after, a)));
            if (d >= 0 && jobs[d].state == 2 && jobs[d].best > best) {
                best = jobs[d].best;
                next = d;
                count = jobs[d].count;
            }
        }
        j->best = best + (j->end - j->start);
        j->next = next;
        j->count = count + 1;
        j->state = 2;
        top--;
    }
    free(stack);
}

int ff_trace_summary(const char *path, FILE *out, bool json) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return ff_error_set(path, "is it a trace written by fuseflow --trace?", "line %d: %s", jerr.line, jerr.text);
    json_t *events = json_is_object(root) ? json_object_get(root, "traceEvents") : root;
    if (!json_is_array(events)) {
        json_decref(root);
        return ff_error_set(path, NULL, "no traceEvents array");
    }
    size_t nev = json_array_size(events);
    ev_rec *ev = ff_calloc(nev ? nev : 1, sizeof *ev);
    const char **pname = NULL;
    int npid = 0;
    if (!ev) {
        json_decref(root);
        return -1;
    }
    size_t n = 0;
    double t0 = 1e300, t1 = -1e300;
    for (size_t i = 0; i < nev; i++) {
        json_t *e = json_array_get(events, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        json_t *pidj = json_object_get(e, "pid");
        if (!ph || !json_is_integer(pidj)) continue;
        int pid = (int)json_integer_value(pidj);
        if (pid < 0 || pid > 1 << 20) continue;
        if (!strcmp(ph, "M")) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm && !strcmp(nm, "process_name")) {
                if (pid >= npid) {
                    const char **p2 = realloc(pname, sizeof *p2 * (size_t)(pid + 1));
                    if (!p2) continue;
                    for (int k = npid; k <= pid; k++) p2[k] = NULL;
                    pname = p2;
                    npid = pid + 1;
                }
                pname[pid] = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
            }
            continue;
        }
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (strcmp(ph, "X") != 0 || !cat || strcmp(cat, "subtask") != 0) continue;
        json_t *args = json_object_get(e, "args");
        ev_rec *r = &ev[n];
        r->pid = pid;
        r->ts = json_number_value(json_object_get(e, "ts"));
        r->end = r->ts + json_number_value(json_object_get(e, "dur"));
        r->name = json_string_value(json_object_get(e, "name"));
        r->group = json_string_value(json_object_get(args, "group"));
        r->job = (uint64_t)json_integer_value(json_object_get(args, "job"));
        r->after = json_object_get(args, "after");
        if (!r->name) r->name = "?";
        if (!r->group) r->group = "";
        if (r->ts < t0) t0 = r->ts;
        if (r->end > t1) t1 = r->end;
        n++;
    }
    if (n == 0) {
        free(ev);
        free(pname);
        json_decref(root);
        return ff_error_set(path, "record a run with --trace", "no subtask events (cat \"subtask\", ph \"X\")");
    }
    double span = t1 - t0;
    ival *iv = ff_malloc(sizeof *iv * n);
    job_rec *jobs = ff_calloc(n, sizeof *jobs);
    if (!iv || !jobs) {
        free(iv);
        free(jobs);
        free(ev);
        free(pname);
        json_decref(root);
        return -1;
    }
    json_t *js = json_object();
    json_t *jw = json_array(), *jg = json_array();
    json_object_set_new(js, "file", json_string(path));
    json_object_set_new(js, "subtasks", json_integer((json_int_t)n));
    json_object_set_new(js, "span_us", json_real(span));
    /* workers */
    int maxpid = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].pid > maxpid) maxpid = ev[i].pid;
    for (int pid = 0; pid <= maxpid; pid++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (ev[i].pid == pid) iv[k++] = (ival){ev[i].ts, ev[i].end};
        if (!k) continue;
        double busy = union_len(iv, k);
        char fallback[32];
        snprintf(fallback, sizeof fallback, "pid %d", pid);
        const char *name = pid < npid && pname[pid] ? pname[pid] : fallback;
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(name));
        json_object_set_new(o, "pid", json_integer(pid));
        json_object_set_new(o, "subtasks", json_integer((json_int_t)k));
        json_object_set_new(o, "busy_us", json_real(busy));
        json_object_set_new(o, "idle_us", json_real(span - busy));
        json_array_append_new(jw, o);
    }
    /* groups: busy is the sum over members of each member's busy time on the group's work */
    for (size_t i = 0; i < n; i++) {
        const char *g = ev[i].group;
        if (!g[0]) continue;
        bool seen = false;
        for (size_t q = 0; q < json_array_size(jg) && !seen; q++)
            seen = !strcmp(json_string_value(json_object_get(json_array_get(jg, q), "name")), g);
        if (seen) continue;
        double busy = 0;
        int members = 0;
        size_t count = 0;
        for (int pid = 0; pid <= maxpid; pid++) {
            size_t k = 0;
            for (size_t e = 0; e < n; e++)
                if (ev[e].pid == pid && !strcmp(ev[e].group, g)) iv[k++] = (ival){ev[e].ts, ev[e].end};
            if (!k) continue;
            members++;
            count += k;
            busy += union_len(iv, k);
        }
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(g));
        json_object_set_new(o, "members", json_integer(members));
        json_object_set_new(o, "subtasks", json_integer((json_int_t)count));
        json_object_set_new(o, "busy_us", json_real(busy));
        json_object_set_new(o, "idle_us", json_real(members * span - busy));
        json_array_append_new(jg, o);
    }
    /* jobs and the longest chain */
    size_t nj = 0;
    for (size_t i = 0; i < n; i++) {
        long k = -1;
        for (size_t q = nj; q-- > 0;)
            if (jobs[q].id == ev[i].job) {
                k = (long)q;
                break;
            }
        if (k < 0) {
            k = (long)nj++;
            jobs[k] = (job_rec){.id = ev[i].job, .start = ev[i].ts, .end = ev[i].end, .name = ev[i].name,
                                .after = ev[i].after, .next = -1};
        }
        if (ev[i].ts < jobs[k].start) jobs[k].start = ev[i].ts;
        if (ev[i].end > jobs[k].end) jobs[k].end = ev[i].end;
    }
    qsort(jobs, nj, sizeof *jobs, cmp_job);
    long best = -1;
    for (size_t i = 0; i < nj; i++) {
        chain(jobs, nj, i);
        if (best < 0 || jobs[i].best > jobs[best].best) best = (long)i;
    }
    json_t *jc = json_object(), *jids = json_array(), *jnames = json_array();
    double first = 0, last = 0;
    if (best >= 0) {
        last = jobs[best].end;
        for (long k = best; k >= 0; k = jobs[k].next) {
            json_array_insert_new(jids, 0, json_integer((json_int_t)jobs[k].id));
            json_array_insert_new(jnames, 0, json_string(jobs[k].name));
            first = jobs[k].start;
        }
        json_object_set_new(jc, "jobs", jids);
        json_object_set_new(jc, "names", jnames);
        json_object_set_new(jc, "length", json_integer(jobs[best].count));
        json_object_set_new(jc, "busy_us", json_real(jobs[best].best));
        json_object_set_new(jc, "elapsed_us", json_real(last - first));
    } else {
        json_decref(jids);
        json_decref(jnames);
    }
    json_object_set_new(js, "workers", jw);
    json_object_set_new(js, "groups", jg);
    json_object_set_new(js, "longest_chain", jc);

    if (json) {
        char *s = json_dumps(js, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
        if (s) fprintf(out, "%s\n", s);
        free(s);
    } else {
        fprintf(out, "trace %s: %zu subtasks, %zu jobs, span %.3f ms\n\n", path, n, nj, span / 1e3);
        fprintf(out, "%-44s %9s %11s %11s %7s\n", "worker", "subtasks", "busy ms", "idle ms", "busy %");
        for (size_t i = 0; i < json_array_size(jw); i++) {
            json_t *o = json_array_get(jw, i);
            double b = json_real_value(json_object_get(o, "busy_us"));
            fprintf(out, "%-44.44s %9lld %11.3f %11.3f %6.1f%%\n", json_string_value(json_object_get(o, "name")),
                    (long long)json_integer_value(json_object_get(o, "subtasks")), b / 1e3,
                    json_real_value(json_object_get(o, "idle_us")) / 1e3, span > 0 ? 100 * b / span : 0);
        }
        if (json_array_size(jg)) {
            fprintf(out, "\n%-32s %8s %9s %11s %11s %7s\n", "group", "members", "subtasks", "busy ms", "idle ms", "busy %");
            for (size_t i = 0; i < json_array_size(jg); i++) {
                json_t *o = json_array_get(jg, i);
                double b = json_real_value(json_object_get(o, "busy_us"));
                long long m = json_integer_value(json_object_get(o, "members"));
                fprintf(out, "%-32.32s %8lld %9lld %11.3f %11.3f %6.1f%%\n", json_string_value(json_object_get(o, "name")),
                        m, (long long)json_integer_value(json_object_get(o, "subtasks")), b / 1e3,
                        json_real_value(json_object_get(o, "idle_us")) / 1e3, span > 0 && m ? 100 * b / (m * span) : 0);
            }
        }
        if (best >= 0) {
            fprintf(out, "\nlongest chain of dependent jobs: %d jobs, %.3f ms of work, %.3f ms from first start to last end\n",
                    jobs[best].count, jobs[best].best / 1e3, (last - first) / 1e3);
            size_t nids = json_array_size(jids);
            for (size_t i = 0; i < nids; i++) {
                if (nids > 12 && i == 5) {
                    fprintf(out, "  ... %zu more ...\n", nids - 10);
                    i = nids - 5;
                }
                fprintf(out, "  job %lld %s\n", (long long)json_integer_value(json_array_get(jids, i)),
                        json_string_value(json_array_get(jnames, i)));
            }
        }
    }
    json_decref(js);
    free(iv);
    free(jobs);
    free(ev);
    free(pname);
    json_decref(root);
    return 0;
}
