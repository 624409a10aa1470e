/* `fuseflow trace summary FILE`: reads a timeline file back and reports busy and idle time
 * per worker, group and controller track, and the longest chain of dependent jobs
 * (fuseflow/trace_summary.h says what each number is).
 *
 * It knows the file, not the controller: subtask slices (cat "subtask", args job, group),
 * job slices (any slice with an integer args.job: subtasks and a client's controller-side
 * work, with args kind and after), pipeline slices (cat "pipe compute" and "pipe step" on
 * process 0's "rank R: pipeline" tracks), process and thread names. Not here: recording or
 * writing traces (controller/trace.c). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/trace_summary.h"
#include "fuseflow/util.h"

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

/* A slice the summary counts: a subtask on a worker, or a job of the client's. */
typedef struct slice_rec {
    int pid, tid;
    bool subtask;
    bool is_job;
    uint64_t job;
    double ts, end;
    const char *name, *kind, *group;
    json_t *after;
} slice_rec;

typedef struct job_rec {
    uint64_t id;
    double start, end;
    const char *name, *kind;
    json_t *after;
    int state; /* 0 new, 1 visiting, 2 done */
    double best;
    long next; /* the job before it on its best chain (one it depended on), -1 */
    int count;
} job_rec;

static int cmp_job(const void *a, const void *b) {
    const job_rec *x = a, *y = b;
    if (x->id != y->id) return (x->id > y->id) - (x->id < y->id);
    return (x->start > y->start) - (x->start < y->start);
}

static long find_job(const job_rec *jobs, size_t n, uint64_t id) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (jobs[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && jobs[lo].id == id ? (long)lo : -1;
}

/* Longest chain ending at job i (by the sum of job durations), iterative DFS over `after`. */
static int chain(job_rec *jobs, size_t n, size_t i) {
    size_t cap = 64, top = 0;
    size_t *stack = ff_malloc(sizeof *stack * cap);
    if (!stack) return -1;
    stack[top++] = i;
    while (top) {
        size_t k = stack[top - 1];
        job_rec *j = &jobs[k];
        if (j->state == 2) {
            top--;
            continue;
        }
        size_t na = json_is_array(j->after) ? json_array_size(j->after) : 0;
        if (j->state == 0) {
            j->state = 1;
            for (size_t a = 0; a < na; a++) {
                long d = find_job(jobs, n, (uint64_t)json_integer_value(json_array_get(j->after, a)));
                if (d < 0 || jobs[d].state != 0) continue;
                if (top == cap) {
                    size_t *s2 = ff_realloc(stack, sizeof *stack * (cap *= 2));
                    if (!s2) {
                        free(stack);
                        return -1;
                    }
                    stack = s2;
                }
                stack[top++] = (size_t)d;
            }
            continue;
        }
        /* state 1: its dependencies are done (a cycle's back edge counts as absent) */
        double best = 0;
        long next = -1;
        int count = 0;
        for (size_t a = 0; a < na; a++) {
            long d = find_job(jobs, n, (uint64_t)json_integer_value(json_array_get(j->after, a)));
            if (d >= 0 && jobs[d].state == 2 && (next < 0 || jobs[d].best > best)) {
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
    return 0;
}

/* names[pid] (process names) or names[tid] of process 0 (thread names), grown as needed */
static int set_name(const char ***names, int *n, int at, const char *name) {
    if (at >= *n) {
        const char **a = ff_realloc(*names, sizeof *a * (size_t)(at + 1));
        if (!a) return -1;
        for (int k = *n; k <= at; k++) a[k] = NULL;
        *names = a;
        *n = at + 1;
    }
    (*names)[at] = name;
    return 0;
}

typedef struct summary {
    const char *path;
    slice_rec *sl;
    size_t n, nsub;
    const char **pname, **tname;
    int npid, ntid;
    double t0, t1;
    job_rec *jobs;
    size_t nj;
    ival *iv;
    struct pipe_rec {
        int tid;
        bool step; /* a rank's train step (else a forward or backward in it) */
        double ts, end;
    } *pipe;
    size_t npipe;
} summary;

static int read_events(summary *S, json_t *events) {
    size_t nev = json_array_size(events);
    S->sl = ff_calloc(nev ? nev : 1, sizeof *S->sl);
    S->pipe = ff_calloc(nev ? nev : 1, sizeof *S->pipe);
    if (!S->sl || !S->pipe) return -1;
    S->t0 = 1e300, S->t1 = -1e300;
    for (size_t i = 0; i < nev; i++) {
        json_t *e = json_array_get(events, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        json_t *pidj = json_object_get(e, "pid");
        if (!ph || !json_is_integer(pidj)) continue;
        json_int_t pid = json_integer_value(pidj), tid = json_integer_value(json_object_get(e, "tid"));
        if (pid < 0 || pid > 1 << 20 || tid < 0 || tid > 1 << 20) continue;
        json_t *args = json_object_get(e, "args");
        if (!strcmp(ph, "M")) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            const char *v = json_string_value(json_object_get(args, "name"));
            if (nm && v && !strcmp(nm, "process_name") && set_name(&S->pname, &S->npid, (int)pid, v) != 0) return -1;
            if (nm && v && !strcmp(nm, "thread_name") && pid == 0 && set_name(&S->tname, &S->ntid, (int)tid, v) != 0) return -1;
            continue;
        }
        if (strcmp(ph, "X") != 0) continue;
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (cat && pid == 0 && (!strcmp(cat, "pipe compute") || !strcmp(cat, "pipe step"))) {
            double ts = json_number_value(json_object_get(e, "ts"));
            S->pipe[S->npipe++] = (struct pipe_rec){(int)tid, !strcmp(cat, "pipe step"), ts, ts + json_number_value(json_object_get(e, "dur"))};
            continue;
        }
        bool subtask = cat && !strcmp(cat, "subtask");
        json_t *job = json_object_get(args, "job");
        if (!subtask && !json_is_integer(job)) continue;
        slice_rec *r = &S->sl[S->n++];
        r->pid = (int)pid;
        r->tid = (int)tid;
        r->subtask = subtask;
        r->is_job = json_is_integer(job);
        r->job = (uint64_t)json_integer_value(job);
        r->ts = json_number_value(json_object_get(e, "ts"));
        r->end = r->ts + json_number_value(json_object_get(e, "dur"));
        r->name = json_string_value(json_object_get(e, "name"));
        r->kind = json_string_value(json_object_get(args, "kind"));
        r->group = json_string_value(json_object_get(args, "group"));
        r->after = json_object_get(args, "after");
        if (!r->name) r->name = "?";
        if (!r->kind) r->kind = r->name;
        if (!r->group) r->group = "";
        if (r->ts < S->t0) S->t0 = r->ts;
        if (r->end > S->t1) S->t1 = r->end;
        S->nsub += subtask;
    }
    return 0;
}

static json_t *workers_json(summary *S, double span) {
    json_t *jw = json_array();
    int maxpid = 0;
    for (size_t i = 0; i < S->n; i++)
        if (S->sl[i].subtask && S->sl[i].pid > maxpid) maxpid = S->sl[i].pid;
    for (int pid = 0; pid <= maxpid; pid++) {
        size_t k = 0;
        for (size_t i = 0; i < S->n; i++)
            if (S->sl[i].subtask && S->sl[i].pid == pid) S->iv[k++] = (ival){S->sl[i].ts, S->sl[i].end};
        if (!k) continue;
        double busy = union_len(S->iv, k);
        char fallback[32];
        snprintf(fallback, sizeof fallback, "pid %d", pid);
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(pid < S->npid && S->pname[pid] ? S->pname[pid] : fallback));
        json_object_set_new(o, "pid", json_integer(pid));
        json_object_set_new(o, "subtasks", json_integer((json_int_t)k));
        json_object_set_new(o, "busy_us", json_real(busy));
        json_object_set_new(o, "idle_us", json_real(span - busy));
        json_array_append_new(jw, o);
    }
    return jw;
}

/* groups: busy is the sum over members of each member's busy time on the group's work */
static json_t *groups_json(summary *S, double span) {
    json_t *jg = json_array();
    int maxpid = 0;
    for (size_t i = 0; i < S->n; i++)
        if (S->sl[i].pid > maxpid) maxpid = S->sl[i].pid;
    for (size_t i = 0; i < S->n; i++) {
        const char *g = S->sl[i].group;
        if (!S->sl[i].subtask || !g[0]) continue;
        bool seen = false;
        for (size_t q = 0; q < json_array_size(jg) && !seen; q++)
            seen = !strcmp(json_string_value(json_object_get(json_array_get(jg, q), "name")), g);
        if (seen) continue;
        double busy = 0;
        int members = 0;
        size_t count = 0;
        for (int pid = 0; pid <= maxpid; pid++) {
            size_t k = 0;
            for (size_t e = 0; e < S->n; e++)
                if (S->sl[e].subtask && S->sl[e].pid == pid && !strcmp(S->sl[e].group, g))
                    S->iv[k++] = (ival){S->sl[e].ts, S->sl[e].end};
            if (!k) continue;
            members++;
            count += k;
            busy += union_len(S->iv, k);
        }
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(g));
        json_object_set_new(o, "members", json_integer(members));
        json_object_set_new(o, "subtasks", json_integer((json_int_t)count));
        json_object_set_new(o, "busy_us", json_real(busy));
        json_object_set_new(o, "idle_us", json_real(members * span - busy));
        json_array_append_new(jg, o);
    }
    return jg;
}

/* the controller's own jobs (client slices on process 0), per thread */
static json_t *controller_json(summary *S) {
    json_t *jc = json_array();
    int maxtid = -1;
    for (size_t i = 0; i < S->n; i++)
        if (!S->sl[i].subtask && S->sl[i].pid == 0 && S->sl[i].tid > maxtid) maxtid = S->sl[i].tid;
    for (int tid = 0; tid <= maxtid; tid++) {
        size_t k = 0;
        for (size_t i = 0; i < S->n; i++)
            if (!S->sl[i].subtask && S->sl[i].pid == 0 && S->sl[i].tid == tid) S->iv[k++] = (ival){S->sl[i].ts, S->sl[i].end};
        if (!k) continue;
        char fallback[32];
        snprintf(fallback, sizeof fallback, "tid %d", tid);
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(tid < S->ntid && S->tname[tid] ? S->tname[tid] : fallback));
        json_object_set_new(o, "tid", json_integer(tid));
        json_object_set_new(o, "jobs", json_integer((json_int_t)k));
        json_object_set_new(o, "busy_us", json_real(union_len(S->iv, k)));
        json_array_append_new(jc, o);
    }
    return jc;
}

/* Pipeline ranks (the RL executor's "rank R: pipeline" tracks, their lanes merged): each
 * rank's compute inside its train steps against the steps' length, the rest its bubble. */
static json_t *pipeline_json(summary *S) {
    json_t *jp = json_array();
    for (size_t i = 0; i < S->npipe; i++) {
        const char *tn = S->pipe[i].tid < S->ntid ? S->tname[S->pipe[i].tid] : NULL;
        if (!tn) continue;
        size_t base = strcspn(tn, "(");
        while (base > 0 && tn[base - 1] == ' ') base--;
        bool seen = false;
        for (size_t q = 0; q < json_array_size(jp) && !seen; q++) {
            const char *nm = json_string_value(json_object_get(json_array_get(jp, q), "name"));
            seen = strlen(nm) == base && !strncmp(nm, tn, base);
        }
        if (seen) continue;
        double step = 0;
        size_t k = 0, steps = 0;
        for (size_t e = 0; e < S->npipe; e++) {
            const char *te = S->pipe[e].tid < S->ntid ? S->tname[S->pipe[e].tid] : NULL;
            if (!te || strncmp(te, tn, base) || (te[base] && te[base] != ' ')) continue;
            if (S->pipe[e].step) step += S->pipe[e].end - S->pipe[e].ts, steps++;
            else S->iv[k++] = (ival){S->pipe[e].ts, S->pipe[e].end};
        }
        double compute = union_len(S->iv, k);
        json_t *o = json_object();
        json_object_set_new(o, "name", json_stringn(tn, base));
        json_object_set_new(o, "steps", json_integer((json_int_t)steps));
        json_object_set_new(o, "compute_us", json_real(compute));
        json_object_set_new(o, "step_us", json_real(step));
        json_object_set_new(o, "bubble", json_real(step > 0 ? 1.0 - compute / step : 0));
        json_array_append_new(jp, o);
    }
    return jp;
}

/* Jobs (a group job's subtasks merged: first start to last end) and the longest chain. */
static json_t *chain_json(summary *S) {
    size_t n = 0;
    for (size_t i = 0; i < S->n; i++) {
        const slice_rec *r = &S->sl[i];
        if (r->is_job)
            S->jobs[n++] = (job_rec){.id = r->job, .start = r->ts, .end = r->end, .name = r->name, .kind = r->kind,
                                     .after = r->after, .next = -1};
    }
    qsort(S->jobs, n, sizeof *S->jobs, cmp_job);
    size_t nj = 0;
    for (size_t i = 0; i < n; i++) {
        if (nj && S->jobs[nj - 1].id == S->jobs[i].id) {
            if (S->jobs[i].end > S->jobs[nj - 1].end) S->jobs[nj - 1].end = S->jobs[i].end;
            continue;
        }
        S->jobs[nj++] = S->jobs[i];
    }
    S->nj = nj;
    long best = -1;
    for (size_t i = 0; i < nj; i++) {
        if (chain(S->jobs, nj, i) != 0) return NULL;
        if (best < 0 || S->jobs[i].best > S->jobs[best].best) best = (long)i;
    }
    json_t *jc = json_object();
    if (best < 0) return jc;
    json_t *ids = json_array(), *names = json_array(), *links = json_array(), *kinds = json_array();
    for (long k = best; k >= 0; k = S->jobs[k].next) {
        const job_rec *j = &S->jobs[k];
        json_array_insert_new(ids, 0, json_integer((json_int_t)j->id));
        json_array_insert_new(names, 0, json_string(j->name));
        json_t *l = json_object();
        json_object_set_new(l, "job", json_integer((json_int_t)j->id));
        json_object_set_new(l, "name", json_string(j->name));
        json_object_set_new(l, "kind", json_string(j->kind));
        json_object_set_new(l, "start_us", json_real(j->start));
        json_object_set_new(l, "end_us", json_real(j->end));
        json_array_insert_new(links, 0, l);
    }
    double wait = 0, prev_end = 0;
    for (size_t i = 0; i < json_array_size(links); i++) {
        json_t *l = json_array_get(links, i);
        double a = json_real_value(json_object_get(l, "start_us")), b = json_real_value(json_object_get(l, "end_us"));
        double w = i && a > prev_end ? a - prev_end : 0;
        json_object_set_new(l, "wait_us", json_real(w));
        wait += w;
        prev_end = b;
        const char *kind = json_string_value(json_object_get(l, "kind"));
        json_t *o = NULL;
        for (size_t q = 0; q < json_array_size(kinds) && !o; q++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(kinds, q), "kind")), kind)) o = json_array_get(kinds, q);
        if (!o) {
            o = json_object();
            json_object_set_new(o, "kind", json_string(kind));
            json_object_set_new(o, "jobs", json_integer(0));
            json_object_set_new(o, "busy_us", json_real(0));
            json_array_append_new(kinds, o);
        }
        json_object_set_new(o, "jobs", json_integer(json_integer_value(json_object_get(o, "jobs")) + 1));
        json_object_set_new(o, "busy_us", json_real(json_real_value(json_object_get(o, "busy_us")) + (b - a)));
    }
    double first = json_real_value(json_object_get(json_array_get(links, 0), "start_us"));
    json_object_set_new(jc, "jobs", ids);
    json_object_set_new(jc, "names", names);
    json_object_set_new(jc, "length", json_integer(S->jobs[best].count));
    json_object_set_new(jc, "busy_us", json_real(S->jobs[best].best));
    json_object_set_new(jc, "elapsed_us", json_real(S->jobs[best].end - first));
    json_object_set_new(jc, "wait_us", json_real(wait));
    json_object_set_new(jc, "kinds", kinds);
    json_object_set_new(jc, "links", links);
    return jc;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static long long integer(json_t *o, const char *k) { return (long long)json_integer_value(json_object_get(o, k)); }
static const char *str(json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

static void print_text(FILE *out, const summary *S, json_t *js) {
    double span = num(js, "span_us");
    json_t *jw = json_object_get(js, "workers"), *jg = json_object_get(js, "groups");
    json_t *jctl = json_object_get(js, "controller"), *jc = json_object_get(js, "longest_chain");
    fprintf(out, "trace %s: %zu subtasks, %zu jobs, span %.3f ms\n\n", S->path, S->nsub, S->nj, span / 1e3);
    fprintf(out, "%-44s %9s %11s %11s %7s\n", "worker", "subtasks", "busy ms", "idle ms", "busy %");
    for (size_t i = 0; i < json_array_size(jw); i++) {
        json_t *o = json_array_get(jw, i);
        double b = num(o, "busy_us");
        fprintf(out, "%-44.44s %9lld %11.3f %11.3f %6.1f%%\n", str(o, "name"), integer(o, "subtasks"), b / 1e3,
                num(o, "idle_us") / 1e3, span > 0 ? 100 * b / span : 0);
    }
    if (json_array_size(jg)) {
        fprintf(out, "\n%-32s %8s %9s %11s %11s %7s\n", "group", "members", "subtasks", "busy ms", "idle ms", "busy %");
        for (size_t i = 0; i < json_array_size(jg); i++) {
            json_t *o = json_array_get(jg, i);
            double b = num(o, "busy_us");
            long long m = integer(o, "members");
            fprintf(out, "%-32.32s %8lld %9lld %11.3f %11.3f %6.1f%%\n", str(o, "name"), m, integer(o, "subtasks"), b / 1e3,
                    num(o, "idle_us") / 1e3, span > 0 && m ? 100 * b / ((double)m * span) : 0);
        }
    }
    if (json_array_size(jctl)) {
        fprintf(out, "\n%-44s %9s %11s %19s\n", "controller-side work", "jobs", "busy ms", "busy %");
        for (size_t i = 0; i < json_array_size(jctl); i++) {
            json_t *o = json_array_get(jctl, i);
            double b = num(o, "busy_us");
            fprintf(out, "%-44.44s %9lld %11.3f %18.1f%%\n", str(o, "name"), integer(o, "jobs"), b / 1e3,
                    span > 0 ? 100 * b / span : 0);
        }
    }
    json_t *jp = json_object_get(js, "pipeline");
    if (json_array_size(jp)) {
        fprintf(out, "\n%-32s %8s %11s %11s %8s\n", "pipeline rank", "steps", "compute ms", "steps ms", "bubble");
        for (size_t i = 0; i < json_array_size(jp); i++) {
            json_t *o = json_array_get(jp, i);
            fprintf(out, "%-32.32s %8lld %11.3f %11.3f %7.1f%%\n", str(o, "name"), integer(o, "steps"), num(o, "compute_us") / 1e3,
                    num(o, "step_us") / 1e3, 100 * num(o, "bubble"));
        }
    }
    json_t *links = json_object_get(jc, "links");
    size_t nl = json_array_size(links);
    if (!nl) return;
    fprintf(out, "\nlongest chain of dependent jobs: %lld jobs, %.3f ms of work, %.3f ms from first start to last end\n",
            integer(jc, "length"), num(jc, "busy_us") / 1e3, num(jc, "elapsed_us") / 1e3);
    json_t *kinds = json_object_get(jc, "kinds");
    fprintf(out, "  by kind:");
    for (size_t i = 0; i < json_array_size(kinds); i++) {
        json_t *o = json_array_get(kinds, i);
        fprintf(out, "%s %s %lld x %.3f ms", i ? "," : "", str(o, "kind"), integer(o, "jobs"), num(o, "busy_us") / 1e3);
    }
    fprintf(out, "%s waiting %.3f ms\n", json_array_size(kinds) ? "," : "", num(jc, "wait_us") / 1e3);
    fprintf(out, "  %10s %10s %9s  %s\n", "start ms", "end ms", "wait ms", "job");
    for (size_t i = 0; i < nl; i++) {
        if (nl > 24 && i == 10) {
            fprintf(out, "  ... %zu more ...\n", nl - 20);
            i = nl - 10;
        }
        json_t *l = json_array_get(links, i);
        fprintf(out, "  %10.3f %10.3f %9.3f  job %lld %s (%s)\n", num(l, "start_us") / 1e3, num(l, "end_us") / 1e3,
                num(l, "wait_us") / 1e3, integer(l, "job"), str(l, "name"), str(l, "kind"));
    }
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
    summary S = {.path = path};
    json_t *js = NULL;
    int rc = -1;
    if (read_events(&S, events) != 0) goto out;
    if (S.nsub == 0) {
        ff_error_set(path, "record a run with --trace", "no subtask events (cat \"subtask\", ph \"X\")");
        goto out;
    }
    S.iv = ff_malloc(sizeof *S.iv * (S.n > S.npipe ? S.n : S.npipe)); /* the busy intervals of one track at a time */
    S.jobs = ff_calloc(S.n, sizeof *S.jobs);
    if (!S.iv || !S.jobs) goto out;
    double span = S.t1 - S.t0;
    js = json_object();
    json_object_set_new(js, "file", json_string(path));
    json_object_set_new(js, "subtasks", json_integer((json_int_t)S.nsub));
    json_object_set_new(js, "span_us", json_real(span));
    json_object_set_new(js, "workers", workers_json(&S, span));
    json_object_set_new(js, "groups", groups_json(&S, span));
    json_object_set_new(js, "controller", controller_json(&S));
    json_object_set_new(js, "pipeline", pipeline_json(&S));
    json_t *jc = chain_json(&S);
    if (!jc) goto out;
    json_object_set_new(js, "jobs", json_integer((json_int_t)S.nj));
    json_object_set_new(js, "longest_chain", jc);
    if (json) {
        char *s = json_dumps(js, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
        if (!s) {
            ff_error_set(path, NULL, "out of memory printing the summary");
            goto out;
        }
        fprintf(out, "%s\n", s);
        free(s);
    } else {
        print_text(out, &S, js);
    }
    rc = 0;
out:
    json_decref(js);
    free(S.iv);
    free(S.jobs);
    free(S.sl);
    free(S.pipe);
    free(S.pname);
    free(S.tname);
    json_decref(root);
    return rc;
}
