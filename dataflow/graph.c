/* Dataflow graphs: the vocabulary (roles, ops, slots, column kinds), the builder, and the
 * validation that runs before anything starts (include/fuseflow/graph.h).
 *
 * Validation order: per node (role and granularity allowed for the op, required slots bound,
 * parameters resolved against the registry), then the graph (one sample-level generate, every
 * column read has a writer or comes from the data, no cycle: Kahn's algorithm gives the order
 * and the stages), then, with a run config, roles and layouts. The first problem found is the
 * error, with the node's line.
 *
 * Not here: YAML reading (run_config.c), scheduling (sched.c), node math (node_ops.c). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/internal.h"
#include "fuseflow/error.h"
#include "fuseflow/fuse.h"
#include "fuseflow/graph.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

/* ---- vocabulary ------------------------------------------------------------------------------ */

static const char *const role_names[FF_ROLE_COUNT] = {"none", "actor", "critic", "ref", "reward"};
static const char *const op_names[FF_OP_COUNT] = {"generate", "logprob", "value",        "score", "reward_fn",
                                                  "advantage", "train",  "sync_weights", "filter"};
static const char *const kind_names[FF_COL_KIND_COUNT] = {"tokens", "per_token", "scalar", "text"};
static const char *const slot_names[FF_SLOT_COUNT] = {"prompt", "response", "answer",   "logprob",    "old_logprob", "ref_logprob",
                                                      "values", "score",    "baseline", "advantages", "returns"};
static const ff_col_kind slot_kinds[FF_SLOT_COUNT] = {FF_COL_TOKENS,    FF_COL_TOKENS,    FF_COL_TEXT,      FF_COL_PER_TOKEN,
                                                      FF_COL_PER_TOKEN, FF_COL_PER_TOKEN, FF_COL_PER_TOKEN, FF_COL_SCALAR,
                                                      FF_COL_SCALAR,    FF_COL_PER_TOKEN, FF_COL_PER_TOKEN};

const char *ff_role_name(ff_role r) { return (unsigned)r < FF_ROLE_COUNT ? role_names[r] : "?"; }
const char *ff_op_name(ff_op op) { return (unsigned)op < FF_OP_COUNT ? op_names[op] : "?"; }
const char *ff_col_kind_name(ff_col_kind k) { return (unsigned)k < FF_COL_KIND_COUNT ? kind_names[k] : "?"; }
const char *ff_slot_name(ff_slot s) { return (unsigned)s < FF_SLOT_COUNT ? slot_names[s] : "?"; }
ff_col_kind ff_slot_kind(ff_slot s) { return slot_kinds[s]; }

#define R 1 /* required */
#define O 0 /* optional */
typedef struct sig {
    int n;
    ff_slot slot[6];
    bool req[6];
} sig;

static sig op_sig(ff_op op, ff_role role, bool output) {
    switch (op) {
    case FF_OP_GENERATE:
        return output ? (sig){2, {FF_SLOT_RESPONSE, FF_SLOT_LOGPROB}, {R, O}} : (sig){1, {FF_SLOT_PROMPT}, {R}};
    case FF_OP_LOGPROB:
        return output ? (sig){1, {FF_SLOT_LOGPROB}, {R}} : (sig){2, {FF_SLOT_PROMPT, FF_SLOT_RESPONSE}, {R, R}};
    case FF_OP_VALUE:
        return output ? (sig){1, {FF_SLOT_VALUES}, {R}} : (sig){2, {FF_SLOT_PROMPT, FF_SLOT_RESPONSE}, {R, R}};
    case FF_OP_SCORE:
        return output ? (sig){1, {FF_SLOT_SCORE}, {R}} : (sig){2, {FF_SLOT_PROMPT, FF_SLOT_RESPONSE}, {R, R}};
    case FF_OP_REWARD_FN:
        return output ? (sig){1, {FF_SLOT_SCORE}, {R}}
                      : (sig){3, {FF_SLOT_PROMPT, FF_SLOT_RESPONSE, FF_SLOT_ANSWER}, {R, R, O}};
    case FF_OP_ADVANTAGE:
        return output ? (sig){2, {FF_SLOT_ADVANTAGES, FF_SLOT_RETURNS}, {R, O}}
                      : (sig){5,
                              {FF_SLOT_SCORE, FF_SLOT_VALUES, FF_SLOT_BASELINE, FF_SLOT_OLD_LOGPROB, FF_SLOT_REF_LOGPROB},
                              {R, O, O, O, O}};
    case FF_OP_TRAIN:
        if (output) return (sig){0, {0}, {0}};
        if (role == FF_ROLE_CRITIC)
            return (sig){4, {FF_SLOT_PROMPT, FF_SLOT_RESPONSE, FF_SLOT_VALUES, FF_SLOT_RETURNS}, {R, R, R, R}};
        return (sig){5,
                     {FF_SLOT_PROMPT, FF_SLOT_RESPONSE, FF_SLOT_OLD_LOGPROB, FF_SLOT_ADVANTAGES, FF_SLOT_REF_LOGPROB},
                     {R, R, R, R, O}};
    case FF_OP_FILTER:
        return output ? (sig){0, {0}, {0}} : (sig){1, {FF_SLOT_SCORE}, {R}};
    default:
        return (sig){0, {0}, {0}};
    }
}
#undef R
#undef O

size_t ff_op_slots(ff_op op, ff_role role, bool output, ff_slot *slots, bool *required, size_t cap) {
    sig s = op_sig(op, role, output);
    for (int i = 0; i < s.n && (size_t)i < cap; i++) {
        if (slots) slots[i] = s.slot[i];
        if (required) required[i] = s.req[i];
    }
    return (size_t)s.n;
}

/* Which roles an op runs on (bit per role; bit 0 = no role). */
static unsigned op_roles(ff_op op) {
    switch (op) {
    case FF_OP_GENERATE:
    case FF_OP_SYNC_WEIGHTS:
        return 1u << FF_ROLE_ACTOR;
    case FF_OP_LOGPROB:
        return 1u << FF_ROLE_ACTOR | 1u << FF_ROLE_REF;
    case FF_OP_VALUE:
        return 1u << FF_ROLE_CRITIC;
    case FF_OP_SCORE:
        return 1u << FF_ROLE_REWARD;
    case FF_OP_TRAIN:
        return 1u << FF_ROLE_ACTOR | 1u << FF_ROLE_CRITIC;
    default:
        return 1u << FF_ROLE_NONE;
    }
}

bool ff_op_allows_granularity(ff_op op, ff_granularity g) {
    switch (op) {
    case FF_OP_GENERATE:
        return g == FF_GRAN_SAMPLE || g == FF_GRAN_GROUP;
    case FF_OP_LOGPROB:
    case FF_OP_VALUE:
    case FF_OP_SCORE:
        return g == FF_GRAN_SAMPLE || g == FF_GRAN_MICRO_BATCH || g == FF_GRAN_BATCH;
    case FF_OP_REWARD_FN:
        return true;
    case FF_OP_ADVANTAGE:
        return g != FF_GRAN_MICRO_BATCH;
    case FF_OP_TRAIN:
        return g == FF_GRAN_MICRO_BATCH || g == FF_GRAN_BATCH;
    case FF_OP_SYNC_WEIGHTS:
        return g == FF_GRAN_BATCH;
    case FF_OP_FILTER:
        return g == FF_GRAN_GROUP;
    default:
        return false;
    }
}

static ff_granularity op_default_gran(ff_op op) {
    switch (op) {
    case FF_OP_GENERATE:
    case FF_OP_REWARD_FN:
        return FF_GRAN_SAMPLE;
    case FF_OP_LOGPROB:
    case FF_OP_VALUE:
    case FF_OP_SCORE:
    case FF_OP_TRAIN:
        return FF_GRAN_MICRO_BATCH;
    case FF_OP_FILTER:
        return FF_GRAN_GROUP;
    default:
        return FF_GRAN_BATCH;
    }
}

/* ---- the graph ------------------------------------------------------------------------------- */

struct ff_graph {
    ff_column *cols;
    size_t n_cols, cap_cols;
    ff_node *nodes;
    size_t n_nodes, cap_nodes;
    bool *gran_set;   /* [n_nodes] granularity given explicitly */
    bool *yaml;       /* [n_nodes] params attached from a YAML file */
    int *order;       /* [n_nodes] topological order */
    ff_config *own;   /* parameters of nodes built in C */
    int64_t group_size;
    int response_col;
};

ff_graph *ff_graph_new(void) {
    ff_graph *g = ff_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->own = ff_config_new();
    g->group_size = 1;
    g->response_col = -1;
    static const struct {
        const char *name;
        ff_col_kind kind;
        bool data;
    } builtin[] = {{"prompt", FF_COL_TOKENS, true},         {"answer", FF_COL_TEXT, true},
                   {"response", FF_COL_TOKENS, false},      {"old_logprob", FF_COL_PER_TOKEN, false},
                   {"ref_logprob", FF_COL_PER_TOKEN, false}, {"values", FF_COL_PER_TOKEN, false},
                   {"score", FF_COL_SCALAR, false},         {"advantages", FF_COL_PER_TOKEN, false},
                   {"returns", FF_COL_PER_TOKEN, false}};
    if (!g->own) {
        ff_graph_destroy(&g);
        return NULL;
    }
    for (size_t i = 0; i < sizeof builtin / sizeof *builtin; i++)
        if (ff_graph_add_column(g, builtin[i].name, builtin[i].kind, builtin[i].data) < 0) {
            ff_graph_destroy(&g);
            return NULL;
        }
    return g;
}

static void node_release(ff_node *n) {
    ff_advantage_destroy(&n->adv);
    ff_policy_loss_destroy(&n->train.loss);
    ff_reward_destroy(&n->reward);
}

void ff_graph_destroy(ff_graph **pg) {
    if (!pg || !*pg) return;
    ff_graph *g = *pg;
    for (size_t i = 0; i < g->n_cols; i++) free(g->cols[i].name);
    for (size_t i = 0; i < g->n_nodes; i++) {
        node_release(&g->nodes[i]);
        free(g->nodes[i].name);
        free(g->nodes[i].after);
    }
    free(g->cols), free(g->nodes), free(g->gran_set), free(g->yaml), free(g->order);
    ff_config_destroy(&g->own);
    free(g);
    *pg = NULL;
}

static bool valid_name(const char *s) {
    if (!s || !*s || strlen(s) > 64) return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-') return false;
    return true;
}

int ff_graph_find_column(const ff_graph *g, const char *name) {
    for (size_t i = 0; i < g->n_cols; i++)
        if (!strcmp(g->cols[i].name, name)) return (int)i;
    return -1;
}

int ff_graph_find_node(const ff_graph *g, const char *name) {
    for (size_t i = 0; i < g->n_nodes; i++)
        if (!strcmp(g->nodes[i].name, name)) return (int)i;
    return -1;
}

int ff_graph_add_column(ff_graph *g, const char *name, ff_col_kind kind, bool from_data) {
    if (!valid_name(name))
        return ff_error_set(name ? name : "(null)", "use letters, digits, _ and - (at most 64)", "bad column name");
    if (ff_graph_find_column(g, name) >= 0)
        return ff_error_set(name, "built-in columns need no declaration; choose another name", "column '%s' already exists",
                            name);
    if ((unsigned)kind >= FF_COL_KIND_COUNT) return ff_error_set(name, NULL, "bad column kind %d", (int)kind);
    if (g->n_cols == g->cap_cols) {
        size_t cap = g->cap_cols ? g->cap_cols * 2 : 16;
        ff_column *c = ff_realloc(g->cols, cap * sizeof *c);
        if (!c) return -1;
        g->cols = c, g->cap_cols = cap;
    }
    if (g->n_cols >= 64) return ff_error_set(name, "merge columns", "a graph has at most 64 columns");
    ff_column *c = &g->cols[g->n_cols];
    c->name = ff_strdup(name);
    if (!c->name) return -1;
    c->kind = kind, c->from_data = from_data, c->writer = -1;
    return (int)g->n_cols++;
}

int ff_graph_add_node(ff_graph *g, const char *name, ff_op op, ff_role role, ff_granularity gran) {
    if (!valid_name(name))
        return ff_error_set(name ? name : "(null)", "use letters, digits, _ and - (at most 64)", "bad node name");
    if (ff_graph_find_node(g, name) >= 0) return ff_error_set(name, "node names are unique", "node '%s' already exists", name);
    if ((unsigned)op >= FF_OP_COUNT || (unsigned)role >= FF_ROLE_COUNT || (unsigned)gran > FF_GRAN_COUNT)
        return ff_error_set(name, NULL, "bad op, role or granularity");
    if (g->n_nodes >= 64) return ff_error_set(name, NULL, "a graph has at most 64 nodes");
    if (g->n_nodes == g->cap_nodes) {
        size_t cap = g->cap_nodes ? g->cap_nodes * 2 : 8;
        ff_node *n = ff_realloc(g->nodes, cap * sizeof *n);
        if (!n) return -1;
        g->nodes = n;
        bool *gs = ff_realloc(g->gran_set, cap * sizeof *gs), *ym = gs ? ff_realloc(g->yaml, cap * sizeof *ym) : NULL;
        if (gs) g->gran_set = gs;
        if (ym) g->yaml = ym;
        if (!gs || !ym) return -1;
        g->cap_nodes = cap;
    }
    ff_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->name = ff_strdup(name);
    if (!n->name) return -1;
    n->op = op, n->role = role, n->gran = gran;
    for (int s = 0; s < FF_SLOT_COUNT; s++) n->in[s] = n->out[s] = -1;
    snprintf(n->where, sizeof n->where, "node '%s'", name);
    g->gran_set[g->n_nodes] = gran != FF_GRAN_COUNT;
    g->yaml[g->n_nodes] = false;
    return (int)g->n_nodes++;
}

void ff_graph_node_attach(ff_graph *g, int node, ff_cnode *params, const char *where) {
    g->nodes[node].params = params;
    snprintf(g->nodes[node].where, sizeof g->nodes[node].where, "%s", where);
    g->yaml[node] = true;
}

/* The closest name to s among names (edit distance <= 2), for hints. */
static const char *closest(const char *s, const char *const *names, size_t n) {
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < n; i++) {
        size_t la = strlen(s), lb = strlen(names[i]);
        if (la > 63 || lb > 63) continue;
        size_t prev[64], cur[64];
        for (size_t j = 0; j <= lb; j++) prev[j] = j;
        for (size_t a = 1; a <= la; a++) {
            cur[0] = a;
            for (size_t b = 1; b <= lb; b++) {
                size_t x = prev[b - 1] + (s[a - 1] != names[i][b - 1]), y = prev[b] + 1, z = cur[b - 1] + 1;
                cur[b] = x < y ? (x < z ? x : z) : (y < z ? y : z);
            }
            memcpy(prev, cur, (lb + 1) * sizeof *prev);
        }
        if (prev[lb] < best_d) best_d = prev[lb], best = names[i];
    }
    return best;
}

int ff_graph_bind(ff_graph *g, int node, bool output, const char *slot, const char *column) {
    ff_node *n = &g->nodes[node];
    sig s = op_sig(n->op, n->role, output);
    int k = -1;
    for (int i = 0; i < s.n; i++)
        if (!strcmp(slot_names[s.slot[i]], slot)) k = i;
    if (k < 0) {
        char list[256] = "";
        size_t off = 0;
        for (int i = 0; i < s.n && off < sizeof list; i++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "", slot_names[s.slot[i]]);
        return ff_error_set(n->where, s.n ? list : "this op has none", "op '%s' has no %s slot '%s' (its %s slots: %s)",
                            op_names[n->op], output ? "output" : "input", slot, output ? "output" : "input",
                            s.n ? list : "none");
    }
    ff_slot sl = s.slot[k];
    int c = ff_graph_find_column(g, column);
    if (c < 0) {
        const char *names[64];
        for (size_t i = 0; i < g->n_cols; i++) names[i] = g->cols[i].name;
        const char *near = closest(column, names, g->n_cols);
        char hint[256];
        if (near)
            snprintf(hint, sizeof hint, "did you mean '%s'? new columns are declared under columns:", near);
        else
            snprintf(hint, sizeof hint, "declare it under columns: (name: tokens|per_token|scalar|text)");
        return ff_error_set(n->where, hint, "node '%s' %s unknown column '%s'", n->name, output ? "writes" : "reads", column);
    }
    ff_column *col = &g->cols[c];
    if (col->kind != slot_kinds[sl])
        return ff_error_set(n->where, "bind a column of the slot's kind", "slot '%s' of node '%s' takes %s, but column '%s' is %s",
                            slot, n->name, kind_names[slot_kinds[sl]], column, kind_names[col->kind]);
    int *b = output ? n->out : n->in;
    if (b[sl] >= 0) return ff_error_set(n->where, NULL, "slot '%s' of node '%s' is bound twice", slot, n->name);
    if (output) {
        if (col->from_data)
            return ff_error_set(n->where, "write a new column instead", "node '%s' writes column '%s', which comes from the data",
                                n->name, column);
        if (col->writer >= 0)
            return ff_error_set(n->where, "each column has one writer; name the second one differently",
                                "column '%s' is written by both '%s' and '%s'", column, g->nodes[col->writer].name, n->name);
        col->writer = node;
    }
    b[sl] = c;
    return 0;
}

int ff_graph_add_after(ff_graph *g, int node, const char *other) {
    ff_node *n = &g->nodes[node];
    int o = ff_graph_find_node(g, other);
    if (o < 0) return ff_error_set(n->where, "name a node of this graph", "node '%s' runs after unknown node '%s'", n->name, other);
    if (o == node) return ff_error_set(n->where, NULL, "node '%s' cannot run after itself", n->name);
    int *a = ff_realloc(n->after, (size_t)(n->n_after + 1) * sizeof *a);
    if (!a) return -1;
    n->after = a;
    n->after[n->n_after++] = o;
    return 0;
}

int ff_graph_set_param(ff_graph *g, int node, const char *assignment) {
    ff_node *n = &g->nodes[node];
    if (g->yaml[node])
        return ff_error_set(n->where, "override it on the command line: graph.NODE.KEY=VALUE",
                            "node '%s' takes its parameters from its config file", n->name);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s.%s", n->name, assignment);
    if (ff_config_set(g->own, buf) != 0) return -1;
    return 0;
}

size_t ff_graph_n_nodes(const ff_graph *g) { return g->n_nodes; }
const ff_node *ff_graph_node(const ff_graph *g, size_t i) { return &g->nodes[i]; }
ff_node *ff_graph_node_mut(ff_graph *g, size_t i) { return &g->nodes[i]; }
size_t ff_graph_n_columns(const ff_graph *g) { return g->n_cols; }
const ff_column *ff_graph_column(const ff_graph *g, size_t i) { return &g->cols[i]; }
const int *ff_graph_order(const ff_graph *g) { return g->order; }
int64_t ff_graph_group_size(const ff_graph *g) { return g->group_size; }
int ff_graph_response_column(const ff_graph *g) { return g->response_col; }

/* ---- node parameters ------------------------------------------------------------------------- */

static int param_where_err(ff_node *n, const char *key, const char *hint, const char *what) {
    char w[256];
    ff_cnode *c = n->params ? ff_cnode_find(n->params, key) : NULL;
    return ff_error_set(c ? ff_cnode_where(c, w, sizeof w) : n->where, hint, "node '%s': %s", n->name, what);
}

static int get_i(ff_node *n, const char *key, int64_t dflt, int64_t lo, int64_t hi, int64_t *out) {
    *out = dflt;
    if (n->params && ff_cnode_get_int(n->params, key, dflt, out) < 0) return -1;
    if (*out < lo || *out > hi) {
        char what[256];
        snprintf(what, sizeof what, "'%s' must be in [%lld, %lld], got %lld", key, (long long)lo, (long long)hi, (long long)*out);
        return param_where_err(n, key, NULL, what);
    }
    return 0;
}

static int get_d(ff_node *n, const char *key, double dflt, double lo, double hi, double *out) {
    *out = dflt;
    if (n->params && ff_cnode_get_double(n->params, key, dflt, out) < 0) return -1;
    if (*out < lo || *out > hi) {
        char what[256];
        snprintf(what, sizeof what, "'%s' must be in [%g, %g], got %g", key, lo, hi, *out);
        return param_where_err(n, key, NULL, what);
    }
    return 0;
}

static int get_b(ff_node *n, const char *key, bool dflt, bool *out) {
    *out = dflt;
    return n->params && ff_cnode_get_bool(n->params, key, dflt, out) < 0 ? -1 : 0;
}

static int get_s(ff_node *n, const char *key, const char *dflt, const char **out) {
    *out = dflt;
    return n->params && ff_cnode_get_str(n->params, key, dflt, out) < 0 ? -1 : 0;
}

/* `lengths: {median: M, p99_ratio: R, max: N}`: drawn response lengths (ff_gen_params). */
static int read_lengths(ff_node *n) {
    n->gen.len_median = n->gen.len_p99_ratio = 0;
    n->gen.len_max = 0;
    ff_cnode *sec = n->params ? ff_cnode_find(n->params, "lengths") : NULL;
    if (!sec) return 0;
    char w[256];
    const char *hint = "write lengths: {median: 8, p99_ratio: 10, max: 96} (a log-normal; max 0 or absent: max_tokens)";
    if (ff_cnode_kind_of(sec) != FF_CNODE_MAP)
        return ff_error_set(ff_cnode_where(sec, w, sizeof w), hint, "node '%s': 'lengths' must be a map", n->name);
    static const char *const keys[] = {"median", "p99_ratio", "max"};
    for (size_t i = 0; i < ff_cnode_len(sec); i++) {
        ff_cnode *e = ff_cnode_at(sec, i);
        const char *k = ff_cnode_key(e);
        bool known = false;
        for (size_t j = 0; j < sizeof keys / sizeof *keys; j++) known |= !strcmp(k, keys[j]);
        if (!known)
            return ff_error_set(ff_cnode_where(e, w, sizeof w), hint, "node '%s': lengths has no key '%s'",
                                n->name, k);
    }
    double med, ratio;
    int64_t mx;
    if (ff_cnode_get_double(sec, "median", 0, &med) < 0 || ff_cnode_get_double(sec, "p99_ratio", 10, &ratio) < 0 ||
        ff_cnode_get_int(sec, "max", 0, &mx) < 0)
        return -1;
    ff_cnode_mark_used(sec);
    if (!(med >= 1 && med <= 1e6))
        return ff_error_set(ff_cnode_where(sec, w, sizeof w), hint, "node '%s': lengths.median %g must be in [1, 1e6] tokens",
                            n->name, med);
    if (!(ratio >= 1 && ratio <= 1e4))
        return ff_error_set(ff_cnode_where(sec, w, sizeof w), hint,
                            "node '%s': lengths.p99_ratio %g must be in [1, 1e4] (p99 / median; 1: every length the median)",
                            n->name, ratio);
    if (mx < 0 || mx > FF_RUN_MAX_TOKENS || (mx > 0 && mx < med))
        return ff_error_set(ff_cnode_where(sec, w, sizeof w), hint, "node '%s': lengths.max %lld must be 0 or in [median, %d]",
                            n->name, (long long)mx, FF_RUN_MAX_TOKENS);
    if (n->gen.greedy)
        return ff_error_set(ff_cnode_where(sec, w, sizeof w), "draw lengths on the sample-level generate node",
                            "node '%s': a greedy (group-level) generate node draws no lengths", n->name);
    n->gen.len_median = med;
    n->gen.len_p99_ratio = ratio;
    n->gen.len_max = mx;
    return 0;
}

/* `migrate: off | auto | R_t` with `migrate_to: N` and `migrate_with: auto | kv | recompute`. */
static int read_migrate(ff_node *n) {
    const char *m, *with;
    if (get_s(n, "migrate", "off", &m) || get_i(n, "migrate_to", 0, 0, 1 << 16, &n->gen.migrate_to) ||
        get_s(n, "migrate_with", "auto", &with))
        return -1;
    char *end = NULL;
    double r = strtod(m, &end);
    if (!strcmp(m, "off") || !strcmp(m, "false")) n->gen.migrate = 0;
    else if (!strcmp(m, "auto")) n->gen.migrate = -1;
    else if (end != m && !*end && r > 0 && r <= 1) n->gen.migrate = r;
    else
        return param_where_err(n, "migrate", "write migrate: off, auto or a fraction in (0, 1] (0.25: when a quarter of the samples still decode)",
                               "'migrate' is neither off, auto nor a fraction in (0, 1]");
    if (!strcmp(with, "auto")) n->gen.migrate_with = FF_MIGRATE_WITH_AUTO;
    else if (!strcmp(with, "kv")) n->gen.migrate_with = FF_MIGRATE_WITH_KV;
    else if (!strcmp(with, "recompute")) n->gen.migrate_with = FF_MIGRATE_WITH_RECOMPUTE;
    else
        return param_where_err(n, "migrate_with",
                               "write migrate_with: auto (the cost model picks per move), kv (send the KV rows) or recompute (prefill them again)",
                               "'migrate_with' is neither auto, kv nor recompute");
    if (n->gen.migrate && n->gen.greedy)
        return param_where_err(n, "migrate", "migrate the sample-level generate node", "a greedy (group-level) generate node does not migrate");
    return 0;
}

/* A KL section (`kl_loss:` or `kl_penalty:`): type, coef, and for the penalty a controller. */
static int read_kl(ff_node *n, const ff_registry *reg, const char *key, bool penalty) {
    ff_cnode *sec = n->params ? ff_cnode_find(n->params, key) : NULL;
    if (!sec) return 0;
    char w[256];
    const char *txt = ff_cnode_scalar(sec);
    if (txt && (!txt[0] || !strcmp(txt, "null") || !strcmp(txt, "~"))) return 0; /* `kl_penalty: null` turns it off */
    if (ff_cnode_kind_of(sec) != FF_CNODE_MAP)
        return ff_error_set(ff_cnode_where(sec, w, sizeof w), "write it as {type: low_var_kl, coef: 0.001}",
                            "node '%s': '%s' must be a map", n->name, key);
    const char *type;
    double coef;
    if (ff_cnode_get_str(sec, "type", penalty ? "kl" : "low_var_kl", &type) < 0 ||
        ff_cnode_get_double(sec, "coef", 0.001, &coef) < 0)
        return -1;
    const ff_kl_def *def = ff_registry_kl(reg, type);
    if (!def) {
        ff_cnode *t = ff_cnode_find(sec, "type");
        return ff_error_wrap("%s: node '%s'", t ? ff_cnode_where(t, w, sizeof w) : n->where, n->name);
    }
    if (coef < 0) return ff_error_set(ff_cnode_where(sec, w, sizeof w), NULL, "node '%s': %s.coef must be >= 0", n->name, key);
    if (!penalty) {
        n->train.kl_loss = def;
        n->train.kl_loss_coef = coef;
        return 0;
    }
    static const char *const ctl[] = {"fixed", "adaptive"};
    int c;
    double target, horizon;
    if (ff_cnode_get_enum(sec, "controller", ctl, 2, 0, &c) < 0 || ff_cnode_get_double(sec, "target_kl", 0.1, &target) < 0 ||
        ff_cnode_get_double(sec, "horizon", 10000, &horizon) < 0)
        return -1;
    if (c == 1 && (target <= 0 || horizon <= 0))
        return ff_error_set(ff_cnode_where(sec, w, sizeof w), NULL, "node '%s': target_kl and horizon must be > 0", n->name);
    n->kl_penalty = def;
    n->kl_ctl = (ff_rlhf_kl_ctl){coef, c == 1, target, horizon};
    return 0;
}

static int resolve_node(ff_graph *g, int idx, const ff_registry *reg) {
    ff_node *n = &g->nodes[idx];
    node_release(n);
    memset(&n->gen, 0, sizeof n->gen);
    memset(&n->train, 0, sizeof n->train);
    n->kl_penalty = NULL;
    if (!g->yaml[idx]) n->params = ff_cnode_find(ff_config_root(g->own), n->name);
    /* role */
    if (!(op_roles(n->op) & (1u << n->role))) {
        char list[128] = "";
        size_t off = 0;
        for (int r = 0; r < FF_ROLE_COUNT; r++)
            if (op_roles(n->op) & (1u << r))
                off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", off ? " or " : "", r ? role_names[r] : "no role");
        return ff_error_set(n->where, list, "node '%s': op '%s' does not run on %s%s", n->name, op_names[n->op],
                            n->role ? "role " : "", n->role ? role_names[n->role] : "no role");
    }
    /* slots */
    for (int out = 0; out < 2; out++) {
        sig s = op_sig(n->op, n->role, out);
        int *b = out ? n->out : n->in;
        for (int i = 0; i < s.n; i++)
            if (s.req[i] && b[s.slot[i]] < 0)
                return ff_error_set(n->where, "bind it in the node's in:/out: list", "node '%s' (op %s) needs its %s slot '%s'",
                                    n->name, op_names[n->op], out ? "output" : "input", slot_names[s.slot[i]]);
    }
    /* op parameters */
    switch (n->op) {
    case FF_OP_GENERATE:
        if (get_i(n, "n", 1, 1, 1 << 16, &n->gen.n) || get_d(n, "temperature", 1.0, 0, 100, &n->gen.temperature) ||
            get_d(n, "top_p", 1.0, 1e-9, 1, &n->gen.top_p) || get_i(n, "top_k", 0, 0, 1 << 30, &n->gen.top_k) ||
            get_i(n, "max_tokens", 0, 0, FF_RUN_MAX_TOKENS, &n->gen.max_tokens) || get_b(n, "greedy", false, &n->gen.greedy) ||
            read_migrate(n) || read_lengths(n))
            return -1;
        break;
    case FF_OP_REWARD_FN: {
        const char *fn;
        if (get_s(n, "function", NULL, &fn)) return -1;
        if (!fn)
            return ff_error_set(n->where, "add function: arith_exact_match (or format, remote, a plugin's)",
                                "node '%s' (reward_fn) names no function", n->name);
        if (ff_registry_skips_rewards(reg)) { /* the function's keys are the scorer's to check */
            if (n->params) ff_cnode_mark_used(n->params);
            break;
        }
        n->reward = ff_reward_new(reg, fn, n->params);
        if (!n->reward) return ff_error_wrap("node '%s'", n->name);
        break;
    }
    case FF_OP_ADVANTAGE: {
        const char *est;
        if (get_s(n, "estimator", NULL, &est)) return -1;
        if (!est)
            return ff_error_set(n->where, "add estimator: gae (or grpo, rloo, reinforce_plus_plus, remax, a plugin's)",
                                "node '%s' (advantage) names no estimator", n->name);
        n->adv = ff_advantage_new(reg, est, n->params);
        if (!n->adv) return ff_error_wrap("%s: node '%s'", n->where, n->name);
        const ff_advantage_def *d = ff_advantage_def_of(n->adv);
        if ((d->needs & FF_ADV_NEEDS_VALUES) && n->in[FF_SLOT_VALUES] < 0)
            return ff_error_set(n->where, "bind a values column (from a critic's value node): in: {score: score, values: values}",
                                "node '%s': estimator '%s' needs values", n->name, est);
        if ((d->needs & FF_ADV_NEEDS_BASELINE) && n->in[FF_SLOT_BASELINE] < 0)
            return ff_error_set(n->where, "bind a baseline column: in: {score: score, baseline: COLUMN}",
                                "node '%s': estimator '%s' needs a baseline", n->name, est);
        if (read_kl(n, reg, "kl_penalty", true)) return -1;
        if (n->kl_penalty && (n->in[FF_SLOT_OLD_LOGPROB] < 0 || n->in[FF_SLOT_REF_LOGPROB] < 0))
            return ff_error_set(n->where, "bind old_logprob and ref_logprob in the node's in: map",
                                "node '%s': a KL penalty needs the old_logprob and ref_logprob slots", n->name);
        ff_granularity need = ff_advantage_granularity(n->adv);
        if (!g->gran_set[idx]) n->gran = need;
        if (n->gran < need || n->gran == FF_GRAN_MICRO_BATCH)
            return ff_error_set(n->where, need == FF_GRAN_BATCH ? "set granularity: batch" : "set granularity: group or batch",
                                "node '%s': estimator '%s' needs whole %ss, not %ss", n->name, est, ff_granularity_name(need),
                                ff_granularity_name(n->gran));
        break;
    }
    case FF_OP_TRAIN: {
        ff_train_params *t = &n->train;
        if (get_i(n, "mini_batch_size", 0, 0, 1 << 30, &t->mini_batch_size) ||
            get_i(n, "micro_batch_size", 4, 1, 1 << 20, &t->micro_batch_size) || get_i(n, "epochs", 1, 1, 1000, &t->epochs) ||
            get_b(n, "shuffle", true, &t->shuffle))
            return -1;
        if (n->role == FF_ROLE_ACTOR) {
            const char *loss;
            if (get_s(n, "loss", "vanilla", &loss) || get_d(n, "entropy_coeff", 0, -10, 10, &t->entropy_coeff)) return -1;
            t->loss = ff_policy_loss_new(reg, loss, n->params);
            if (!t->loss) return ff_error_wrap("%s: node '%s'", n->where, n->name);
            if (read_kl(n, reg, "kl_loss", false)) return -1;
            static const char *const fuses[] = {"off", "on", "auto"};
            int fuse = 0;
            if (n->params && ff_cnode_get_enum(n->params, "fuse", fuses, 3, 0, &fuse) < 0) return -1;
            t->fuse = (ff_fuse_mode)fuse;
            t->fuse_partner = -1;
            t->fuse_peak = 0;
            if (n->params && ff_cnode_find(n->params, "fuse_peak") && get_d(n, "fuse_peak", 0, 0.1, 100, &t->fuse_peak)) return -1;
            if (t->kl_loss && n->in[FF_SLOT_REF_LOGPROB] < 0)
                return ff_error_set(n->where, "bind ref_logprob (from a logprob node on role ref)",
                                    "node '%s': kl_loss needs the ref_logprob slot", n->name);
        } else {
            static const char *const aggs[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"};
            int agg = 0;
            if (get_d(n, "cliprange_value", 0.5, 0, 1e6, &t->value.clip) ||
                (n->params && ff_cnode_get_enum(n->params, "loss_agg_mode", aggs, 3, 0, &agg) < 0))
                return -1;
            t->value.agg = (ff_rlhf_agg_mode)agg;
        }
        break;
    }
    case FF_OP_FILTER: {
        static const char *const rules[] = {"nonzero_std"};
        int rule = 0;
        if (n->params && ff_cnode_get_enum(n->params, "rule", rules, 1, 0, &rule) < 0) return -1;
        break;
    }
    default:
        break;
    }
    if (!g->gran_set[idx] && n->op != FF_OP_ADVANTAGE) n->gran = op_default_gran(n->op);
    if (!ff_op_allows_granularity(n->op, n->gran))
        return ff_error_set(n->where, "see docs/graphs.md for what each op allows", "node '%s': op '%s' cannot run per %s", n->name,
                            op_names[n->op], ff_granularity_name(n->gran));
    n->micro_batch_size = 0;
    if (n->gran == FF_GRAN_MICRO_BATCH && n->op != FF_OP_TRAIN &&
        get_i(n, "micro_batch_size", 8, 1, 1 << 20, &n->micro_batch_size))
        return -1;
    return 0;
}

/* ---- graph checks ---------------------------------------------------------------------------- */

/* Kahn's algorithm over column and after edges; fills order and stages, or reports a cycle. */
static int topo_sort(ff_graph *g) {
    size_t N = g->n_nodes;
    int indeg[64] = {0};
    bool edge[64][64];
    memset(edge, 0, sizeof edge);
    for (size_t i = 0; i < N; i++) {
        ff_node *n = &g->nodes[i];
        for (int s = 0; s < FF_SLOT_COUNT; s++) {
            int c = n->in[s];
            if (c >= 0 && g->cols[c].writer >= 0) edge[g->cols[c].writer][i] = true;
        }
        for (int k = 0; k < n->n_after; k++) edge[n->after[k]][i] = true;
    }
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < N; j++) indeg[j] += edge[i][j];
    free(g->order);
    g->order = ff_malloc((N ? N : 1) * sizeof *g->order);
    if (!g->order) return -1;
    size_t done = 0;
    int queue[64], head = 0, tail = 0;
    for (size_t i = 0; i < N; i++) {
        g->nodes[i].stage = 0;
        if (!indeg[i]) queue[tail++] = (int)i;
    }
    while (head < tail) {
        int i = queue[head++];
        g->order[done++] = i;
        for (size_t j = 0; j < N; j++)
            if (edge[i][j]) {
                if (g->nodes[j].stage < g->nodes[i].stage + 1) g->nodes[j].stage = g->nodes[i].stage + 1;
                if (--indeg[j] == 0) queue[tail++] = (int)j;
            }
    }
    if (done == N) return 0;
    /* a cycle: walk back along edges between unsorted nodes until a node repeats */
    int start = -1;
    for (size_t i = 0; i < N && start < 0; i++)
        if (indeg[i]) start = (int)i;
    int path[65], len = 0, cur = start;
    bool seen[64] = {false};
    while (!seen[cur] && len < 64) {
        seen[cur] = true;
        path[len++] = cur;
        int prev = -1;
        for (size_t j = 0; j < N && prev < 0; j++)
            if (edge[j][cur] && indeg[j]) prev = (int)j;
        cur = prev;
    }
    char chain[512] = "";
    size_t off = 0;
    int from = 0;
    while (path[from] != cur) from++;
    for (int k = len - 1; k >= from && off < sizeof chain; k--)
        off += (size_t)snprintf(chain + off, sizeof chain - off, "%s -> ", g->nodes[path[k]].name);
    snprintf(chain + off, off < sizeof chain ? sizeof chain - off : 0, "%s", g->nodes[path[len - 1]].name);
    return ff_error_set(g->nodes[cur].where, "a node cannot depend on its own output; break the loop",
                        "the graph has a cycle: %s", chain);
}

static int check_layout(ff_graph *g, const ff_run_config *run) {
    int64_t n = g->group_size, B = run->data.train_batch_size, total = B * n;
    if (total > INT32_MAX) { /* sample indices and rl.* shapes are 32-bit on the workers */
        char w[256];
        ff_cnode *bn = ff_cnode_find(ff_config_root(run->cfg), "data.train_batch_size");
        return ff_error_set(bn ? ff_cnode_where(bn, w, sizeof w) : "data.train_batch_size", "lower data.train_batch_size or n",
                            "a batch of %lld samples (train_batch_size %lld x n %lld) is past %d", (long long)total, (long long)B,
                            (long long)n, INT32_MAX);
    }
    for (size_t i = 0; i < g->n_nodes; i++) {
        ff_node *nd = &g->nodes[i];
        if (nd->role == FF_ROLE_NONE) continue;
        const ff_role_cfg *rc = &run->roles[nd->role];
        if (!rc->present || !rc->model || !rc->model[0])
            return ff_error_set(nd->where, "add roles.<role>.model: PATH (a Hugging Face folder)",
                                "node '%s' runs on role '%s', which has no model", nd->name, role_names[nd->role]);
        const ff_layout *L = nd->op == FF_OP_GENERATE ? &rc->rollout : &rc->layout;
        const char *which = nd->op == FF_OP_GENERATE ? "rollout dp" : "dp";
        if (nd->op == FF_OP_GENERATE && B % L->dp != 0)
            return ff_error_set(rc->where, "each generation rank takes whole groups (they share one prefill): make data.train_batch_size a multiple of it",
                                "data.train_batch_size %lld prompts (groups of n=%lld) cannot be dealt whole to %s=%lld ranks of role '%s'",
                                (long long)B, (long long)n, which, (long long)L->dp, role_names[nd->role]);
        if (total % L->dp != 0)
            return ff_error_set(rc->where, "change dp, data.train_batch_size or n",
                                "a batch of %lld samples (train_batch_size %lld x n %lld) does not split over %s=%lld ranks of role '%s'",
                                (long long)total, (long long)B, (long long)n, which, (long long)L->dp, role_names[nd->role]);
        if (nd->op == FF_OP_TRAIN) {
            ff_train_params *t = &nd->train;
            if (t->mini_batch_size == 0) t->mini_batch_size = B;
            if (B % t->mini_batch_size != 0)
                return param_where_err(nd, "mini_batch_size", "use a divisor of data.train_batch_size",
                                       "mini_batch_size does not divide data.train_batch_size");
            int64_t per_rank = t->mini_batch_size * n;
            if (per_rank % L->dp != 0)
                return param_where_err(nd, "mini_batch_size", "mini_batch_size x n must be a multiple of dp",
                                       "a mini-batch does not split over the role's dp ranks");
            per_rank /= L->dp;
            if (per_rank % t->micro_batch_size != 0) {
                char what[256];
                snprintf(what, sizeof what, "micro_batch_size %lld does not divide the %lld samples each rank gets per mini-batch",
                         (long long)t->micro_batch_size, (long long)per_rank);
                return param_where_err(nd, "micro_batch_size", "choose a divisor", what);
            }
        }
    }
    return 0;
}

/* Does node a read (through columns or `after`, transitively) what node b writes? */
static bool depends_on(const ff_graph *g, int a, int b, int depth) {
    if (depth > 64) return false;
    const ff_node *n = &g->nodes[a];
    for (int s = 0; s < FF_SLOT_COUNT; s++) {
        const int c = n->in[s], w = c >= 0 ? g->cols[c].writer : -1;
        if (w >= 0 && (w == b || depends_on(g, w, b, depth + 1))) return true;
    }
    for (int k = 0; k < n->n_after; k++)
        if (n->after[k] == b || depends_on(g, n->after[k], b, depth + 1)) return true;
    return false;
}

/* `fuse` of the actor's train node: the critic's train node beside it, both roles on the same
 * workers, the critic's pipeline nested in the actor's (its pp dividing the actor's, its dp the
 * rest: ff_run_config_critic_place), the same number of mini-batches. `on` refuses what breaks
 * them (naming the key, and what to write instead); `auto` falls back to off with the reason
 * in fuse_note. */
static int check_fuse(ff_graph *g, const ff_run_config *run) {
    for (size_t i = 0; i < g->n_nodes; i++) {
        ff_node *nd = &g->nodes[i];
        if (nd->op != FF_OP_TRAIN || nd->role != FF_ROLE_ACTOR || nd->train.fuse == FF_FUSE_OFF) continue;
        ff_train_params *t = &nd->train;
        const bool on = t->fuse == FF_FUSE_ON;
        const char *hint = NULL;
        char why[256] = "";
        int partner = -1;
        for (size_t j = 0; j < g->n_nodes; j++)
            if (g->nodes[j].op == FF_OP_TRAIN && g->nodes[j].role == FF_ROLE_CRITIC && partner < 0) partner = (int)j;
        const ff_role_cfg *ra = &run->roles[FF_ROLE_ACTOR], *rc = &run->roles[FF_ROLE_CRITIC];
        const ff_layout *A = &ra->layout, *C = &rc->layout;
        if (partner < 0) {
            hint = "add a train node on role critic (PPO's train_critic), or set fuse: off";
            snprintf(why, sizeof why, "fuse trains the critic with the actor, and the graph has no critic train node");
        } else if (rc->colocate_with != FF_ROLE_ACTOR) {
            hint = "set roles.critic.colocate_with: actor, or fuse: off";
            snprintf(why, sizeof why, "fuse needs the critic on the actor's workers (roles.critic.colocate_with: actor)");
        } else if (A->pp < 2 || C->pp < 2 || A->pp % C->pp) {
            hint = "give roles.critic.layout a pp >= 2 that divides the actor's (the same pp, or the actor's / 2 or / 3), or set fuse: off";
            snprintf(why, sizeof why,
                     "fuse needs the actor and the critic pipelined (pp >= 2), the critic's pp dividing the actor's (actor pp %lld, critic pp %lld)",
                     (long long)A->pp, (long long)C->pp);
        } else if (A->tp != 1 || C->tp != 1 || C->dp != A->dp * (A->pp / C->pp)) {
            hint = "use tp 1 for both roles and critic dp = actor dp x actor pp / critic pp (the same workers), or set fuse: off";
            snprintf(why, sizeof why,
                     "fuse runs tp 1 stages, the critic as actor pp / critic pp replicas in each actor pipeline (actor tp %lld pp %lld dp %lld, "
                     "critic tp %lld pp %lld dp %lld)",
                     (long long)A->tp, (long long)A->pp, (long long)A->dp, (long long)C->tp, (long long)C->pp, (long long)C->dp);
        } else if (A->pp / C->pp > FF_FUSE_MAX_MODELS - 1) {
            hint = "give the critic a larger pp (fewer replicas in each actor pipeline), or set fuse: off";
            snprintf(why, sizeof why, "a fused pipeline holds at most %d critic replicas (actor pp %lld / critic pp %lld = %lld)",
                     FF_FUSE_MAX_MODELS - 1, (long long)A->pp, (long long)C->pp, (long long)(A->pp / C->pp));
        } else if (A->vpp > 1 || C->vpp > 1 || A->schedule == FF_PLAN_INTERLEAVED || C->schedule == FF_PLAN_INTERLEAVED) {
            hint = "use vpp 1 with the 1f1b schedule, or set fuse: off";
            snprintf(why, sizeof why, "the fused schedule has one stage of each model per rank (no interleaved chunks, vpp %lld / %lld)",
                     (long long)A->vpp, (long long)C->vpp);
        } else if (A->zero || C->zero) {
            hint = "set zero: 0 on both roles' layouts, or fuse: off";
            snprintf(why, sizeof why, "the fused step does not shard the optimizer state (zero %lld / %lld)", (long long)A->zero,
                     (long long)C->zero);
        } else {
            const ff_node *cn = &g->nodes[partner];
            const ff_train_params *ct = &cn->train;
            if (ct->mini_batch_size != t->mini_batch_size || ct->epochs != t->epochs) {
                hint = "give both train nodes the same mini_batch_size and epochs (mini-batch k of the actor trains with mini-batch k of the critic), or set fuse: off";
                snprintf(why, sizeof why, "node '%s' has mini_batch_size %lld x epochs %lld, node '%s' %lld x %lld", nd->name,
                         (long long)t->mini_batch_size, (long long)t->epochs, cn->name, (long long)ct->mini_batch_size,
                         (long long)ct->epochs);
            } else if (depends_on(g, (int)i, partner, 0) || depends_on(g, partner, (int)i, 0)) {
                hint = "let both train nodes read the same upstream columns (neither after the other), or set fuse: off";
                snprintf(why, sizeof why, "nodes '%s' and '%s' depend on each other, so they cannot train in one step", nd->name, cn->name);
            }
        }
        if (!why[0]) {
            t->fuse_partner = partner;
            continue;
        }
        if (on) return param_where_err(nd, "fuse", hint, why);
        t->fuse = FF_FUSE_OFF;
        snprintf(t->fuse_note, sizeof t->fuse_note, "%s", why);
    }
    return 0;
}

bool ff_run_config_critic_place(const ff_run_config *run, int64_t pp_rank, int64_t dp_rank, int64_t *c_pp_rank, int64_t *c_dp_rank) {
    const ff_role_cfg *ra = &run->roles[FF_ROLE_ACTOR], *rc = &run->roles[FF_ROLE_CRITIC];
    const ff_layout *A = &ra->layout, *C = &rc->layout;
    if (!rc->present || rc->colocate_with != FF_ROLE_ACTOR || A->tp != 1 || C->tp != 1 || C->pp < 2 || A->pp % C->pp ||
        C->dp != A->dp * (A->pp / C->pp))
        return false;
    bool fused = false;
    for (size_t i = 0; run->graph && i < run->graph->n_nodes; i++) {
        const ff_node *n = &run->graph->nodes[i];
        fused = fused || (n->op == FF_OP_TRAIN && n->role == FF_ROLE_ACTOR && n->train.fuse != FF_FUSE_OFF);
    }
    if (C->pp == A->pp && !fused) return false;
    const int64_t r = A->pp / C->pp, q = pp_rank % C->pp;
    *c_pp_rank = fused ? C->pp - 1 - q : q;
    *c_dp_rank = dp_rank * r + pp_rank / C->pp;
    return true;
}

int ff_graph_validate(ff_graph *g, const ff_registry *reg, const ff_run_config *run) {
    if (!g->n_nodes) return ff_error_set("graph", "add nodes (see examples/grpo.yaml)", "the graph has no nodes");
    /* nodes are resolved in order, so group_size is known before the layout checks */
    g->response_col = -1;
    g->group_size = 1;
    for (size_t i = 0; i < g->n_nodes; i++)
        if (resolve_node(g, (int)i, reg) != 0) return -1;
    int main_gen = -1;
    for (size_t i = 0; i < g->n_nodes; i++) {
        ff_node *n = &g->nodes[i];
        if (n->op != FF_OP_GENERATE || n->gran != FF_GRAN_SAMPLE) continue;
        if (main_gen >= 0)
            return ff_error_set(n->where, "make the other one per group (granularity: group), e.g. a greedy baseline",
                                "node '%s' is a second sample-level generate node (the first is '%s')", n->name,
                                g->nodes[main_gen].name);
        main_gen = (int)i;
    }
    if (main_gen < 0)
        return ff_error_set("graph", "add a node with op: generate, role: actor", "the graph has no sample-level generate node");
    g->group_size = g->nodes[main_gen].gen.n;
    g->response_col = g->nodes[main_gen].out[FF_SLOT_RESPONSE];
    /* every column read is written by a node or comes from the data */
    for (size_t i = 0; i < g->n_nodes; i++) {
        ff_node *n = &g->nodes[i];
        for (int s = 0; s < FF_SLOT_COUNT; s++) {
            int c = n->in[s];
            if (c < 0 || g->cols[c].from_data || g->cols[c].writer >= 0) continue;
            return ff_error_set(n->where, "add a node that writes it, or declare it as from_data under columns:",
                                "node '%s' reads column '%s', but no node writes it and the data does not provide it", n->name,
                                g->cols[c].name);
        }
    }
    if (topo_sort(g) != 0) return -1;
    if (run && (check_layout(g, run) != 0 || check_fuse(g, run) != 0)) return -1;
    /* nodes built in C keep their parameters in g->own; YAML ones are checked with the run config */
    bool any_c = false;
    for (size_t i = 0; i < g->n_nodes; i++) any_c |= !g->yaml[i];
    if (any_c && ff_config_check_unused(g->own) != 0) return -1;
    return 0;
}

void ff_graph_print(const ff_graph *g, FILE *out) {
    fprintf(out, "graph: %zu nodes, %zu columns, group size %lld\n", g->n_nodes, g->n_cols, (long long)g->group_size);
    for (size_t k = 0; k < g->n_nodes; k++) {
        const ff_node *n = &g->nodes[g->order ? (size_t)g->order[k] : k];
        fprintf(out, "  [stage %d] %-14s %-12s %-6s per %-11s", n->stage, n->name, op_names[n->op],
                n->role ? role_names[n->role] : "-", ff_granularity_name(n->gran));
        fprintf(out, " in:");
        int any = 0;
        for (int s = 0; s < FF_SLOT_COUNT; s++)
            if (n->in[s] >= 0) fprintf(out, "%s%s", any++ ? "," : " ", g->cols[n->in[s]].name);
        fprintf(out, "  out:");
        any = 0;
        for (int s = 0; s < FF_SLOT_COUNT; s++)
            if (n->out[s] >= 0) fprintf(out, "%s%s", any++ ? "," : " ", g->cols[n->out[s]].name);
        if (n->adv) fprintf(out, "  estimator=%s", ff_advantage_def_of(n->adv)->name);
        if (n->kl_penalty) fprintf(out, "  kl_penalty=%s(%g)", n->kl_penalty->name, n->kl_ctl.coef);
        if (n->train.kl_loss) fprintf(out, "  kl_loss=%s(%g)", n->train.kl_loss->name, n->train.kl_loss_coef);
        if (n->op == FF_OP_GENERATE) fprintf(out, "  n=%lld%s", (long long)n->gen.n, n->gen.greedy ? " greedy" : "");
        fputc('\n', out);
    }
}
