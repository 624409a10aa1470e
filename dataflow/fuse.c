/* The fused actor+critic scheduling problem (fuseflow/fuse.h): instances and schedules from
 * JSON, the event simulator that scores a schedule, the serial baseline and the SVG timeline.
 * Not here: the lower bounds (fuse_bound.c), the solver (fuse_solve.c), the executor's streams
 * (fuse_pipe.c).
 *
 * The simulator needs no event queue: a node runs its list in order and every task waits for
 * one other task (the same micro-batch's previous step), so a task's start is known as soon
 * as that one has ended; a node is looked at again when a task it waits for ends. */
#include "fuseflow/fuse.h"

#include <assert.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/fuse_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

/* A complete schedule of the largest instance stays far below this (4 models x 64 stages x
 * 4096 micro-batches x 2 would be 2M); bigger inputs are refused before allocating. */
#define MAX_TASKS (1 << 22)

/* ---- instances -------------------------------------------------------------------------- */

static int check_keys(json_t *obj, const char *const *keys, const char *where, const char *what) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        bool known = false;
        for (int i = 0; keys[i]; i++) known |= !strcmp(k, keys[i]);
        if (!known) {
            char list[256] = "";
            for (int i = 0; keys[i]; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", keys[i]);
            return ff_error_set(where, list, "%s: unknown key '%s' (the keys are: %s)", what, k, list);
        }
    }
    return 0;
}

static int get_number(json_t *obj, const char *key, bool required, double lo, bool lo_open, double def, const char *where,
                      const char *what, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return ff_error_set(where, NULL, "%s: missing \"%s\"", what, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return ff_error_set(where, NULL, "%s: \"%s\" must be a number", what, key);
    double x = json_number_value(v);
    if (!isfinite(x) || (lo_open ? x <= lo : x < lo) || x > 1e15)
        return ff_error_set(where, NULL, "%s: \"%s\" is %g; it must be %s %g", what, key, x, lo_open ? "above" : "at least", lo);
    *out = x;
    return 0;
}

static int get_int(json_t *obj, const char *key, int64_t lo, int64_t hi, const char *where, const char *what, int32_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return ff_error_set(where, NULL, "%s: missing \"%s\"", what, key);
    if (!json_is_integer(v)) return ff_error_set(where, NULL, "%s: \"%s\" must be an integer", what, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return ff_error_set(where, NULL, "%s: \"%s\" is %lld; it must be in %lld .. %lld", what, key, (long long)x, (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return 0;
}

/* The name less its trailing digits: critic0, critic1 -> critic. */
static void default_family(const char *name, char *out, size_t cap) {
    size_t n = strlen(name);
    while (n > 1 && isdigit((unsigned char)name[n - 1])) n--;
    snprintf(out, cap, "%.*s", (int)n, name);
}

static int parse_model(json_t *jm, int idx, int32_t nodes, const char *where, ff_fuse_model *m) {
    static const char *const keys[] = {"name", "family", "stages", "micro_batches", "forward", "backward", "activation", NULL};
    char what[96];
    snprintf(what, sizeof what, "models[%d]", idx);
    if (!json_is_object(jm)) return ff_error_set(where, NULL, "%s must be an object", what);
    if (check_keys(jm, keys, where, what)) return -1;
    json_t *jn = json_object_get(jm, "name");
    if (!jn) return ff_error_set(where, NULL, "%s: missing \"name\"", what);
    if (!json_is_string(jn) || !json_string_length(jn) || json_string_length(jn) >= sizeof m->name)
        return ff_error_set(where, NULL, "%s: \"name\" must be a string of 1 to %zu characters", what, sizeof m->name - 1);
    snprintf(m->name, sizeof m->name, "%s", json_string_value(jn));
    snprintf(what, sizeof what, "models[%d] (%s)", idx, m->name);
    json_t *jf = json_object_get(jm, "family");
    if (jf) {
        if (!json_is_string(jf) || !json_string_length(jf) || json_string_length(jf) >= sizeof m->family)
            return ff_error_set(where, NULL, "%s: \"family\" must be a string of 1 to %zu characters", what, sizeof m->family - 1);
        snprintf(m->family, sizeof m->family, "%s", json_string_value(jf));
    } else {
        default_family(m->name, m->family, sizeof m->family);
    }
    json_t *js = json_object_get(jm, "stages");
    if (!js) return ff_error_set(where, NULL, "%s: missing \"stages\"", what);
    if (!json_is_array(js) || json_array_size(js) < 1 || json_array_size(js) > (size_t)nodes)
        return ff_error_set(where, "stage s of the model runs on node stages[s]", "%s: \"stages\" must be a list of 1 to %d node numbers (the nodes)", what,
                            (int)nodes);
    m->n_stages = (int32_t)json_array_size(js);
    bool used[FF_FUSE_MAX_NODES] = {0};
    for (int32_t s = 0; s < m->n_stages; s++) {
        json_t *v = json_array_get(js, (size_t)s);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nodes)
            return ff_error_set(where, NULL, "%s: stage %d is on node %s; the nodes are 0 .. %d", what, (int)s,
                                json_is_integer(v) ? "out of range" : "not an integer", (int)nodes - 1);
        int32_t n = (int32_t)json_integer_value(v);
        if (used[n])
            return ff_error_set(where, "a model has at most one stage per node", "%s: node %d holds two of its stages", what, (int)n);
        used[n] = true;
        m->stages[s] = n;
    }
    if (get_int(jm, "micro_batches", 1, FF_FUSE_MAX_MICRO, where, what, &m->micro)) return -1;
    if (get_number(jm, "forward", true, 0, true, 0, where, what, &m->fwd)) return -1;
    if (get_number(jm, "backward", true, 0, true, 0, where, what, &m->bwd)) return -1;
    if (get_number(jm, "activation", false, 0, false, 1.0, where, what, &m->act)) return -1;
    return 0;
}

int ff_fuse_instance_parse(const char *json, const char *where, ff_fuse_instance *out) {
    static const char *const keys[] = {"nodes", "models", "hop_latency", NULL};
    memset(out, 0, sizeof *out);
    if (!where) where = "instance";
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ff_error_set(where, "an instance is {\"nodes\": N, \"models\": [...]}", "line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) {
        ff_error_set(where, NULL, "an instance must be a JSON object {\"nodes\": N, \"models\": [...]}");
        goto done;
    }
    if (check_keys(root, keys, where, "instance")) goto done;
    if (get_int(root, "nodes", 1, FF_FUSE_MAX_NODES, where, "instance", &out->nodes)) goto done;
    if (get_number(root, "hop_latency", false, 0, false, 0, where, "instance", &out->hop_latency)) goto done;
    json_t *jms = json_object_get(root, "models");
    if (!jms) {
        ff_error_set(where, NULL, "instance: missing \"models\"");
        goto done;
    }
    if (!json_is_array(jms) || json_array_size(jms) < 1 || json_array_size(jms) > FF_FUSE_MAX_MODELS) {
        ff_error_set(where, "the actor and the critic's replicas", "\"models\" must be a list of 1 to %d models", FF_FUSE_MAX_MODELS);
        goto done;
    }
    out->n_models = (int32_t)json_array_size(jms);
    int64_t tasks = 0;
    for (int i = 0; i < out->n_models; i++) {
        if (parse_model(json_array_get(jms, (size_t)i), i, out->nodes, where, &out->models[i])) goto done;
        for (int j = 0; j < i; j++)
            if (!strcmp(out->models[j].name, out->models[i].name)) {
                ff_error_set(where, "give every model its own name", "models[%d] and models[%d] are both named '%s'", j, i, out->models[i].name);
                goto done;
            }
        tasks += 2 * (int64_t)out->models[i].micro * out->models[i].n_stages;
    }
    if (tasks > MAX_TASKS) {
        ff_error_set(where, "fewer micro-batches or stages", "the instance has %lld tasks; at most %d are supported", (long long)tasks, MAX_TASKS);
        goto done;
    }
    rc = 0;
done:
    json_decref(root);
    if (rc) memset(out, 0, sizeof *out);
    return rc;
}

int ff_fuse_instance_read(const char *path, ff_fuse_instance *out) {
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) return -1;
    int rc = ff_fuse_instance_parse(text, path, out);
    free(text);
    return rc;
}

/* ---- schedules -------------------------------------------------------------------------- */

int ff_fuse_schedule_init(ff_fuse_schedule *s, int32_t nodes) {
    memset(s, 0, sizeof *s);
    if (nodes < 1 || nodes > FF_FUSE_MAX_NODES) return ff_error_set("schedule", NULL, "%d nodes; it must be 1 .. %d", (int)nodes, FF_FUSE_MAX_NODES);
    s->n_tasks = ff_calloc((size_t)nodes, sizeof *s->n_tasks);
    s->tasks = ff_calloc((size_t)nodes, sizeof *s->tasks);
    s->cap = ff_calloc((size_t)nodes, sizeof *s->cap);
    if (!s->n_tasks || !s->tasks || !s->cap) {
        ff_fuse_schedule_free(s);
        return -1;
    }
    s->nodes = nodes;
    return 0;
}

void ff_fuse_schedule_free(ff_fuse_schedule *s) {
    if (s->tasks)
        for (int32_t n = 0; n < s->nodes; n++) free(s->tasks[n]);
    free(s->tasks);
    free(s->n_tasks);
    free(s->cap);
    memset(s, 0, sizeof *s);
}

int ff_fuse_schedule_push(ff_fuse_schedule *s, int32_t node, ff_fuse_task t) {
    if (node < 0 || node >= s->nodes) return ff_error_set("schedule", NULL, "node %d is out of range (0 .. %d)", (int)node, (int)s->nodes - 1);
    if (s->n_tasks[node] >= MAX_TASKS) return ff_error_set("schedule", NULL, "node %d: more than %d tasks", (int)node, MAX_TASKS);
    if (s->n_tasks[node] == s->cap[node]) {
        int64_t cap = s->cap[node] ? 2 * s->cap[node] : 64;
        ff_fuse_task *p = ff_realloc(s->tasks[node], (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->tasks[node] = p;
        s->cap[node] = cap;
    }
    s->tasks[node][s->n_tasks[node]++] = t;
    return 0;
}

int ff_fuse_schedule_copy(const ff_fuse_schedule *src, ff_fuse_schedule *dst) {
    if (ff_fuse_schedule_init(dst, src->nodes)) return -1;
    for (int32_t n = 0; n < src->nodes; n++) {
        if (!src->n_tasks[n]) continue;
        dst->tasks[n] = ff_malloc((size_t)src->n_tasks[n] * sizeof **dst->tasks);
        if (!dst->tasks[n]) {
            ff_fuse_schedule_free(dst);
            return -1;
        }
        memcpy(dst->tasks[n], src->tasks[n], (size_t)src->n_tasks[n] * sizeof **dst->tasks);
        dst->n_tasks[n] = dst->cap[n] = src->n_tasks[n];
    }
    return 0;
}

int ff_fuse_schedule_parse(const ff_fuse_instance *in, const char *json, const char *where, ff_fuse_schedule *out) {
    memset(out, 0, sizeof *out);
    if (!where) where = "schedule";
    json_error_t jerr;
    json_t *root = json_loads(json, 0, &jerr);
    if (!root) return ff_error_set(where, "a schedule is {\"schedule\": [[[model, \"F\"|\"B\"], ...] per node]}", "line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
    int rc = -1;
    json_t *js = json_is_object(root) ? json_object_get(root, "schedule") : NULL;
    if (!js || !json_is_array(js)) {
        ff_error_set(where, "the output of `fuseflow schedule fuse --json` has one", "no \"schedule\" list (per node, the list of [model, \"F\"|\"B\"])");
        goto done;
    }
    if (json_array_size(js) != (size_t)in->nodes) {
        ff_error_set(where, "one list per node, in node order", "\"schedule\" has %zu node lists; the instance has %d nodes", json_array_size(js), (int)in->nodes);
        goto done;
    }
    if (ff_fuse_schedule_init(out, in->nodes)) goto done;
    for (int32_t n = 0; n < in->nodes; n++) {
        json_t *list = json_array_get(js, (size_t)n);
        if (!json_is_array(list)) {
            ff_error_set(where, NULL, "schedule[%d] must be a list of [model, \"F\"|\"B\"]", (int)n);
            goto done;
        }
        size_t j;
        json_t *t;
        json_array_foreach(list, j, t) {
            json_t *jm = json_array_get(t, 0), *jd = json_array_get(t, 1);
            const char *d = json_string_value(jd);
            if (!json_is_array(t) || json_array_size(t) != 2 || !json_is_integer(jm) || !d || (strcmp(d, "F") && strcmp(d, "B"))) {
                ff_error_set(where, NULL, "schedule[%d][%zu] must be [model index, \"F\" or \"B\"]", (int)n, j);
                goto done;
            }
            json_int_t m = json_integer_value(jm);
            if (m < 0 || m >= in->n_models) {
                ff_error_set(where, NULL, "schedule[%d][%zu]: model %lld is out of range (the instance has %d models)", (int)n, j, (long long)m, (int)in->n_models);
                goto done;
            }
            if (ff_fuse_schedule_push(out, n, (ff_fuse_task){.model = (uint8_t)m, .backward = d[0] == 'B'})) goto done;
        }
    }
    rc = 0;
done:
    json_decref(root);
    if (rc) ff_fuse_schedule_free(out);
    return rc;
}

/* ---- the simulator ---------------------------------------------------------------------- */

int fuse_ctx_init(fuse_ctx *c, const ff_fuse_instance *in) {
    memset(c, 0, sizeof *c);
    c->in = in;
    memset(c->stage_of, -1, sizeof c->stage_of);
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        c->off[i + 1] = c->off[i] + (int64_t)m->n_stages * m->micro;
        for (int32_t s = 0; s < m->n_stages; s++) {
            c->stage_of[i][m->stages[s]] = s;
            c->tasks[m->stages[s]] += 2 * (int64_t)m->micro;
        }
    }
    size_t items = (size_t)c->off[in->n_models];
    c->f_end = ff_malloc(items * sizeof *c->f_end);
    c->b_end = ff_malloc(items * sizeof *c->b_end);
    c->stack = ff_malloc((size_t)in->nodes * sizeof *c->stack);
    if (!c->f_end || !c->b_end || !c->stack) {
        fuse_ctx_free(c);
        return -1;
    }
    return 0;
}

void fuse_ctx_free(fuse_ctx *c) {
    free(c->f_end);
    free(c->b_end);
    free(c->stack);
    memset(c, 0, sizeof *c);
}

int fuse_run(fuse_ctx *c, const ff_fuse_schedule *s, fuse_score *r, double **start, double **end) {
    const ff_fuse_instance *in = c->in;
    const int32_t N = in->nodes;
    const double hop = in->hop_latency;
    int64_t pos[FF_FUSE_MAX_NODES] = {0};
    int32_t fc[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES] = {{0}}, bc[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES] = {{0}};
    double free_at[FF_FUSE_MAX_NODES] = {0}, mem[FF_FUSE_MAX_NODES] = {0};
    size_t items = (size_t)c->off[in->n_models];
    for (size_t i = 0; i < items; i++) c->f_end[i] = c->b_end[i] = -1;
    int32_t sp = 0;
    for (int32_t n = N - 1; n >= 0; n--) {
        c->stack[sp++] = n;
        c->queued[n] = true;
        r->node_peak[n] = r->node_busy[n] = 0;
    }
    while (sp) {
        int32_t n = c->stack[--sp];
        c->queued[n] = false;
        while (pos[n] < s->n_tasks[n]) {
            ff_fuse_task t = s->tasks[n][pos[n]];
            const ff_fuse_model *m = &in->models[t.model];
            int32_t st = c->stage_of[t.model][n];
            double *ends = c->off[t.model] + (t.backward ? c->b_end : c->f_end);
            double ready, dur;
            int32_t k, next = -1; /* the node whose task waits for this one */
            if (!t.backward) {
                k = fc[t.model][n];
                if (st == 0) ready = 0;
                else if ((ready = c->f_end[c->off[t.model] + (int64_t)(st - 1) * m->micro + k]) < 0) break;
                else ready += hop;
                dur = m->fwd;
                next = st + 1 < m->n_stages ? m->stages[st + 1] : n;
            } else {
                k = bc[t.model][n];
                if (k >= fc[t.model][n]) break; /* before its own forward here: stuck for good */
                if (st == m->n_stages - 1) ready = c->f_end[c->off[t.model] + (int64_t)st * m->micro + k];
                else if ((ready = c->b_end[c->off[t.model] + (int64_t)(st + 1) * m->micro + k]) < 0) break;
                else ready += hop;
                dur = m->bwd;
                if (st > 0) next = m->stages[st - 1];
            }
            double t0 = ready > free_at[n] ? ready : free_at[n];
            free_at[n] = t0 + dur;
            ends[(int64_t)st * m->micro + k] = free_at[n];
            if (start) start[n][pos[n]] = t0;
            if (end) end[n][pos[n]] = free_at[n];
            r->node_busy[n] += dur;
            if (!t.backward) {
                fc[t.model][n]++;
                mem[n] += m->act;
                if (mem[n] > r->node_peak[n]) r->node_peak[n] = mem[n];
            } else {
                bc[t.model][n]++;
                mem[n] -= m->act;
            }
            pos[n]++;
            if (next >= 0 && next != n && !c->queued[next]) {
                c->stack[sp++] = next;
                c->queued[next] = true;
            }
        }
    }
    r->makespan = r->peak = 0;
    r->stuck = -1;
    for (int32_t n = 0; n < N; n++) {
        if (pos[n] < s->n_tasks[n] && r->stuck < 0) r->stuck = n;
        if (free_at[n] > r->makespan) r->makespan = free_at[n];
        if (r->node_peak[n] > r->peak) r->peak = r->node_peak[n];
    }
    return r->stuck >= 0;
}

/* Every model's m forwards and m backwards on each node it has a stage on, and nothing else. */
static int check_complete(const fuse_ctx *c, const ff_fuse_schedule *s) {
    const ff_fuse_instance *in = c->in;
    if (s->nodes != in->nodes) return ff_error_set("schedule", NULL, "it has %d nodes; the instance has %d", (int)s->nodes, (int)in->nodes);
    for (int32_t n = 0; n < in->nodes; n++) {
        int64_t cnt[FF_FUSE_MAX_MODELS][2] = {{0}};
        for (int64_t j = 0; j < s->n_tasks[n]; j++) {
            ff_fuse_task t = s->tasks[n][j];
            if (t.model >= in->n_models)
                return ff_error_set("schedule", NULL, "node %d, task %lld: model %d is out of range (the instance has %d)", (int)n, (long long)j, t.model, (int)in->n_models);
            if (c->stage_of[t.model][n] < 0)
                return ff_error_set("schedule", "a model's tasks go on the nodes of its \"stages\"", "node %d, task %lld: %s has no stage on node %d", (int)n,
                                    (long long)j, in->models[t.model].name, (int)n);
            cnt[t.model][t.backward ? 1 : 0]++;
        }
        for (int i = 0; i < in->n_models; i++) {
            if (c->stage_of[i][n] < 0) continue;
            for (int d = 0; d < 2; d++)
                if (cnt[i][d] != in->models[i].micro)
                    return ff_error_set("schedule", "every micro-batch's forward and backward on every stage", "incomplete: node %d has %lld %s of %s; it needs %d",
                                        (int)n, (long long)cnt[i][d], d ? "backwards" : "forwards", in->models[i].name, (int)in->models[i].micro);
        }
    }
    return 0;
}

/* After a deadlock: the first task of node n's list that did not run (n_tasks when all
 * did), and whether it is a backward placed before its own forward. */
static int64_t stuck_at(const fuse_ctx *c, const ff_fuse_schedule *s, int32_t n, int64_t *micro, bool *early) {
    const ff_fuse_instance *in = c->in;
    int64_t fc[FF_FUSE_MAX_MODELS] = {0}, bc[FF_FUSE_MAX_MODELS] = {0}, j = 0;
    *early = false;
    *micro = 0;
    for (; j < s->n_tasks[n]; j++) { /* replay the node's list */
        ff_fuse_task t = s->tasks[n][j];
        const ff_fuse_model *m = &in->models[t.model];
        int32_t st = c->stage_of[t.model][n];
        int64_t k = t.backward ? bc[t.model] : fc[t.model];
        *micro = k;
        double e;
        if (!t.backward) e = st == 0 ? 0 : c->f_end[c->off[t.model] + (int64_t)(st - 1) * m->micro + k];
        else if (k >= fc[t.model]) e = -1, *early = true;
        else e = st == m->n_stages - 1 ? 0 : c->b_end[c->off[t.model] + (int64_t)(st + 1) * m->micro + k];
        if (e < 0) break;
        (t.backward ? bc : fc)[t.model]++;
    }
    return j;
}

/* Name a node that is stuck and what it waits for: one with a backward before its forward if
 * there is one (that one is wrong on its own), else the first unfinished node. */
static int explain_deadlock(const fuse_ctx *c, const ff_fuse_schedule *s) {
    const ff_fuse_instance *in = c->in;
    int32_t node = -1;
    int64_t at = 0, micro = 0;
    for (int32_t n = 0; n < in->nodes; n++) {
        int64_t k = 0;
        bool early;
        int64_t j = stuck_at(c, s, n, &k, &early);
        if (j == s->n_tasks[n]) continue;
        if (node < 0 || early) node = n, at = j, micro = k;
        if (early) {
            const ff_fuse_model *m = &in->models[s->tasks[n][j].model];
            return ff_error_set("schedule", "on a node, a model's k-th backward comes after its k-th forward",
                                "deadlock: node %d, task %lld (%s B of micro-batch %lld) comes before that micro-batch's forward on the node", (int)n,
                                (long long)j, m->name, (long long)k);
        }
    }
    assert(node >= 0);
    ff_fuse_task t = s->tasks[node][at];
    const ff_fuse_model *m = &in->models[t.model];
    int32_t st = c->stage_of[t.model][node], ws = t.backward ? st + 1 : st - 1;
    return ff_error_set("schedule", "reorder the node lists: each node waits for another in a cycle",
                        "deadlock: node %d waits at its task %lld (%s %c of micro-batch %lld, stage %d) for %s %c of micro-batch %lld on node %d (stage %d), which never runs",
                        (int)node, (long long)at, m->name, t.backward ? 'B' : 'F', (long long)micro, (int)st, m->name, t.backward ? 'B' : 'F', (long long)micro,
                        (int)m->stages[ws], (int)ws);
}

int ff_fuse_simulate(const ff_fuse_instance *in, const ff_fuse_schedule *s, ff_fuse_sim *out) {
    memset(out, 0, sizeof *out);
    fuse_ctx c;
    if (fuse_ctx_init(&c, in)) return -1;
    int rc = check_complete(&c, s);
    if (!rc) {
        fuse_score r;
        if (fuse_run(&c, s, &r, NULL, NULL)) {
            rc = explain_deadlock(&c, s);
        } else {
            out->makespan = r.makespan;
            out->peak_activation = r.peak;
            memcpy(out->node_peak, r.node_peak, sizeof out->node_peak);
            memcpy(out->node_busy, r.node_busy, sizeof out->node_busy);
        }
    }
    fuse_ctx_free(&c);
    return rc;
}

/* ---- the serial baseline ---------------------------------------------------------------- */

/* 1F1B at stage s of S: min(S - s - 1, m) warm-up forwards, then a forward and a backward in
 * turn, then the remaining backwards. */
static int push_1f1b(ff_fuse_schedule *out, int model, const ff_fuse_model *m, int32_t s) {
    int32_t warm = m->n_stages - s - 1 < m->micro ? m->n_stages - s - 1 : m->micro, node = m->stages[s];
    ff_fuse_task F = {.model = (uint8_t)model, .backward = 0}, B = {.model = (uint8_t)model, .backward = 1};
    for (int32_t k = 0; k < warm; k++)
        if (ff_fuse_schedule_push(out, node, F)) return -1;
    for (int32_t k = warm; k < m->micro; k++)
        if (ff_fuse_schedule_push(out, node, F) || ff_fuse_schedule_push(out, node, B)) return -1;
    for (int32_t k = 0; k < warm; k++)
        if (ff_fuse_schedule_push(out, node, B)) return -1;
    return 0;
}

/* Families in the order of their first model; a family's models (replicas) side by side: each
 * node gets them in the instance's order, so they share a node only if the instance says so.
 * There is no barrier between families: a node starts the next family's tasks when it is done
 * with its own part of the previous one, so this is at most the sum of the 1F1B makespans. */
int ff_fuse_serial(const ff_fuse_instance *in, ff_fuse_schedule *out) {
    if (ff_fuse_schedule_init(out, in->nodes)) return -1;
    bool done[FF_FUSE_MAX_MODELS] = {0};
    for (int i = 0; i < in->n_models; i++) {
        if (done[i]) continue;
        for (int j = i; j < in->n_models; j++) {
            if (done[j] || strcmp(in->models[j].family, in->models[i].family)) continue;
            done[j] = true;
            for (int32_t s = 0; s < in->models[j].n_stages; s++)
                if (push_1f1b(out, j, &in->models[j], s)) {
                    ff_fuse_schedule_free(out);
                    return -1;
                }
        }
    }
    return 0;
}

/* ---- the picture ------------------------------------------------------------------------ */

static bool first_of_family(const ff_fuse_instance *in, int i) {
    for (int j = 0; j < i; j++)
        if (!strcmp(in->models[j].family, in->models[i].family)) return false;
    return true;
}

/* Families numbered in the order of their first model: the colour of a model. */
static int family_index(const ff_fuse_instance *in, int model) {
    int idx = 0;
    for (int i = 0; i < in->n_models; i++) {
        if (!first_of_family(in, i)) continue;
        if (!strcmp(in->models[i].family, in->models[model].family)) return idx;
        idx++;
    }
    return idx;
}

int ff_fuse_write_svg(const ff_fuse_instance *in, const ff_fuse_schedule *s, const char *path) {
    static const unsigned palette[FF_FUSE_MAX_MODELS] = {0x4e79a7, 0xf28e2b, 0x59a14f, 0xe15759};
    fuse_ctx c;
    if (fuse_ctx_init(&c, in)) return -1;
    int rc = -1;
    double **start = ff_calloc((size_t)in->nodes, sizeof *start), **end = ff_calloc((size_t)in->nodes, sizeof *end);
    ff_strbuf b = {0};
    if (!start || !end || check_complete(&c, s)) goto done;
    for (int32_t n = 0; n < in->nodes; n++) {
        start[n] = ff_malloc(((size_t)s->n_tasks[n] + 1) * sizeof **start);
        end[n] = ff_malloc(((size_t)s->n_tasks[n] + 1) * sizeof **end);
        if (!start[n] || !end[n]) goto done;
    }
    fuse_score r;
    if (fuse_run(&c, s, &r, start, end)) {
        explain_deadlock(&c, s);
        goto done;
    }
    const double left = 70, width = 1100, top = 46, row = 28, bar = 22;
    double span = r.makespan > 0 ? r.makespan : 1, sx = width / span, height = top + row * in->nodes + 44;
    ff_strbuf_printf(&b,
                     "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
                     "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                     "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%d nodes, %d models: makespan %.6g, peak activation %.6g</text>\n",
                     left + width + 20, height, left, (int)in->nodes, (int)in->n_models, r.makespan, r.peak);
    for (int32_t n = 0; n < in->nodes; n++) {
        double y = top + row * n;
        ff_strbuf_printf(&b, "<text x=\"8\" y=\"%.1f\">node %d</text>\n<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.0f\" fill=\"#f2f2f2\"/>\n", y + bar * 0.7,
                         (int)n, left, y, width, bar);
        int32_t cnt[FF_FUSE_MAX_MODELS][2] = {{0}};
        for (int64_t j = 0; j < s->n_tasks[n]; j++) {
            ff_fuse_task t = s->tasks[n][j];
            unsigned rgb = palette[family_index(in, t.model) % FF_FUSE_MAX_MODELS], ch[3] = {rgb >> 16 & 255, rgb >> 8 & 255, rgb & 255};
            if (!t.backward) /* forwards lighter */
                for (int q = 0; q < 3; q++) ch[q] = (unsigned)(ch[q] + (255 - ch[q]) * 0.45 + 0.5);
            int32_t k = cnt[t.model][t.backward]++;
            double x0 = left + start[n][j] * sx, w = (end[n][j] - start[n][j]) * sx;
            ff_strbuf_printf(&b,
                             "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"#%02x%02x%02x\" stroke=\"white\" stroke-width=\"0.5\">"
                             "<title>node %d: %s %c%d, %.6g - %.6g</title></rect>\n",
                             x0, y, w, bar, ch[0], ch[1], ch[2], (int)n, in->models[t.model].name, t.backward ? 'B' : 'F', (int)k, start[n][j], end[n][j]);
            if (w >= 16)
                ff_strbuf_printf(&b, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"%s\">%d</text>\n", x0 + w / 2, y + bar * 0.7,
                                 t.backward ? "white" : "black", (int)k);
        }
    }
    double ya = top + row * in->nodes + 14;
    for (int t = 0; t <= 10; t++)
        ff_strbuf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">%.4g</text>\n", left + width * t / 10, ya, span * t / 10);
    ff_strbuf_printf(&b, "<g transform=\"translate(%.0f,%.1f)\">", left, ya + 12);
    double x = 0;
    for (int i = 0; i < in->n_models; i++) {
        if (!first_of_family(in, i)) continue; /* one entry per family */
        unsigned rgb = palette[family_index(in, i) % FF_FUSE_MAX_MODELS];
        ff_strbuf_printf(&b, "<rect x=\"%.0f\" width=\"12\" height=\"12\" fill=\"#%06x\"/><text x=\"%.0f\" y=\"10\">%s</text>", x, rgb, x + 16, in->models[i].family);
        x += 30 + 7.0 * (double)strlen(in->models[i].family);
    }
    ff_strbuf_printf(&b, "<text x=\"%.0f\" y=\"10\">(light: forward, dark: backward; the number is the micro-batch)</text></g>\n</svg>\n", x + 10);
    if (b.failed) {
        ff_error_set(path, NULL, "cannot build the picture (out of memory)");
        goto done;
    }
    rc = ff_write_file_atomic(path, b.p, b.len);
done:
    if (start)
        for (int32_t n = 0; n < in->nodes; n++) free(start[n]);
    if (end)
        for (int32_t n = 0; n < in->nodes; n++) free(end[n]);
    free(start);
    free(end);
    free(b.p);
    fuse_ctx_free(&c);
    return rc;
}
