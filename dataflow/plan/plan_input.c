/* Planner inputs from a configuration tree (a YAML file plus dotted overrides, or the command's
 * flags turned into overrides): the sections model, workload, layout and cluster, with units
 * ("80GB", "400Gb/s", "400T") and shorthands ("TP8-PP16-DP128", "tp,cp,pp,dp"). Unknown keys
 * are errors (ff_config_check_unused). Not here: checking that the layout is possible
 * (ff_plan_resolve). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

/* ---- quantities ------------------------------------------------------------------------- */

enum { Q_BYTES, Q_RATE, Q_FLOPS };

typedef struct unit {
    const char *name;
    int kind;
    double scale;
} unit;

static const unit units[] = {
    {"B", Q_BYTES, 1.0},          {"kB", Q_BYTES, 1e3},         {"KB", Q_BYTES, 1e3},          {"MB", Q_BYTES, 1e6},
    {"GB", Q_BYTES, 1e9},         {"TB", Q_BYTES, 1e12},        {"KiB", Q_BYTES, 1024.0},      {"MiB", Q_BYTES, 1048576.0},
    {"GiB", Q_BYTES, 1073741824.0}, {"TiB", Q_BYTES, 1099511627776.0},
    {"B/s", Q_RATE, 1.0},         {"MB/s", Q_RATE, 1e6},        {"GB/s", Q_RATE, 1e9},         {"TB/s", Q_RATE, 1e12},
    {"GBps", Q_RATE, 1e9},        {"Mb/s", Q_RATE, 1e6 / 8},    {"Gb/s", Q_RATE, 1e9 / 8},     {"Tb/s", Q_RATE, 1e12 / 8},
    {"Gbit/s", Q_RATE, 1e9 / 8},  {"Gbps", Q_RATE, 1e9 / 8},    {"Tbps", Q_RATE, 1e12 / 8},
    {"FLOP/s", Q_FLOPS, 1.0},     {"G", Q_FLOPS, 1e9},          {"GFLOP/s", Q_FLOPS, 1e9},     {"T", Q_FLOPS, 1e12},
    {"TF", Q_FLOPS, 1e12},        {"TFLOP/s", Q_FLOPS, 1e12},   {"TFLOPS", Q_FLOPS, 1e12},     {"P", Q_FLOPS, 1e15},
    {"PF", Q_FLOPS, 1e15},        {"PFLOP/s", Q_FLOPS, 1e15},
};
#define NUNITS (sizeof units / sizeof units[0])

static const unit *find_unit(const char *name) {
    for (size_t i = 0; i < NUNITS; i++)
        if (!strcmp(units[i].name, name)) return &units[i];
    return NULL;
}

int ff_plan_parse_quantity(const char *text, const char *default_unit, double *out) {
    static const char *const kind_names[] = {"a size such as 80GB", "a bandwidth such as 450GB/s or 400Gb/s",
                                             "a rate such as 400T (TFLOP/s)"};
    const unit *du = find_unit(default_unit);
    if (!du) return ff_error_set(default_unit, NULL, "not a unit");
    char *end;
    double v = strtod(text, &end);
    if (end == text || !isfinite(v) || v <= 0)
        return ff_error_set(text, NULL, "expected a positive number with a unit: %s", kind_names[du->kind]);
    while (*end == ' ') end++;
    const unit *u = *end ? find_unit(end) : du;
    if (!u) return ff_error_set(text, NULL, "unknown unit '%s': expected %s", end, kind_names[du->kind]);
    if (u->kind != du->kind) return ff_error_set(text, NULL, "wrong kind of unit '%s': expected %s", end, kind_names[du->kind]);
    *out = v * u->scale;
    return 0;
}

/* ---- rank order and layout shorthands ---------------------------------------------------- */

static int dim_of(const char *tok, size_t len) {
    static const char *const names[] = {"tp", "cp", "pp", "dp", "ep"};
    for (int d = 0; d < FF_PLAN_NDIMS; d++)
        if (len == 2 && !strncasecmp(tok, names[d], 2)) return d;
    return -1;
}

int ff_plan_parse_order(const char *text, ff_plan_layout *l) {
    int order[FF_PLAN_NDIMS], n = 0, seen[FF_PLAN_NDIMS] = {0};
    const char *p = text;
    while (*p) {
        while (*p == ',' || *p == '-' || *p == ' ' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        const char *q = p;
        while (*q && *q != ',' && *q != '-' && *q != ' ' && *q != ']') q++;
        int d = dim_of(p, (size_t)(q - p));
        if (d < 0)
            return ff_error_set(text, "use tp, cp, pp, dp (and ep), innermost first", "rank order: unknown dimension '%.*s'", (int)(q - p), p);
        if (seen[d]++) return ff_error_set(text, "name each dimension once", "rank order: '%.*s' appears twice", (int)(q - p), p);
        if (n == FF_PLAN_NDIMS) return ff_error_set(text, NULL, "rank order: too many dimensions");
        order[n++] = d;
        p = q;
    }
    for (int d = 0; d < FF_PLAN_NDIMS; d++)
        if (d != FF_PLAN_EP && !seen[d])
            return ff_error_set(text, "list tp, cp, pp and dp (ep optional), innermost first", "rank order lacks '%s'", ff_plan_dim_name(d));
    memcpy(l->order, order, sizeof order);
    l->n_order = n;
    return 0;
}

int ff_plan_parse_layout(const char *text, ff_plan_layout *l) {
    const char *p = text;
    int got = 0;
    while (*p) {
        while (*p == '-' || *p == ',' || *p == '_' || *p == ' ') p++;
        if (!*p) break;
        const char *q = p;
        while (isalpha((unsigned char)*q)) q++;
        size_t nlen = (size_t)(q - p);
        char *end;
        long long v = strtoll(q, &end, 10);
        if (nlen == 0 || end == q || v < 1)
            return ff_error_set(text, "write degrees like TP8-CP1-PP16-DP128 (also EP4, VPP2)", "layout: cannot read '%s'", p);
        int64_t *dst = NULL;
        if (nlen == 2 && !strncasecmp(p, "tp", 2)) dst = &l->tp;
        else if (nlen == 2 && !strncasecmp(p, "cp", 2)) dst = &l->cp;
        else if (nlen == 2 && !strncasecmp(p, "pp", 2)) dst = &l->pp;
        else if (nlen == 2 && !strncasecmp(p, "dp", 2)) dst = &l->dp;
        else if (nlen == 2 && !strncasecmp(p, "ep", 2)) dst = &l->ep;
        else if (nlen == 3 && !strncasecmp(p, "vpp", 3)) dst = &l->vpp;
        if (!dst) return ff_error_set(text, "use TP, CP, PP, DP, EP or VPP", "layout: unknown dimension '%.*s'", (int)nlen, p);
        *dst = v;
        got++;
        p = end;
    }
    if (!got) return ff_error_set(text, "write degrees like TP8-PP16-DP128", "layout: no degrees");
    return 0;
}

/* ---- the tree ------------------------------------------------------------------------------ */

static int get_count(ff_cnode *r, const char *path, int64_t *v) {
    int64_t x;
    int rc = ff_cnode_get_int(r, path, *v, &x);
    if (rc < 0) return -1;
    if (rc == 0) {
        if (x < 0) {
            char w[256];
            return ff_error_set(ff_cnode_where(ff_cnode_find(r, path), w, sizeof w), NULL, "'%s' must not be negative, got %lld", path,
                                (long long)x);
        }
        *v = x;
    }
    return 0;
}

static int get_flag(ff_cnode *r, const char *path, bool *v) { return ff_cnode_get_bool(r, path, *v, v) < 0 ? -1 : 0; }

static int get_quantity(ff_cnode *r, const char *path, const char *unit_name, double *v) {
    const char *s;
    int rc = ff_cnode_get_str(r, path, NULL, &s);
    if (rc < 0) return -1;
    if (rc == 1) return 0;
    if (ff_plan_parse_quantity(s, unit_name, v)) {
        char w[256];
        return ff_error_wrap("%s: '%s'", ff_cnode_where(ff_cnode_find(r, path), w, sizeof w), path);
    }
    return 0;
}

static int get_dtype_bytes(ff_cnode *r, const char *path, int *v) {
    static const char *const names[] = {"bf16", "fp32"};
    int which;
    int rc = ff_cnode_get_enum(r, path, names, 2, *v == 4 ? 1 : 0, &which);
    if (rc < 0) return -1;
    *v = which ? 4 : 2;
    return 0;
}

static int read_model(ff_cnode *r, const char *base_dir, ff_plan_model *m) {
    const char *preset, *config, *name;
    if (ff_cnode_get_str(r, "model.preset", NULL, &preset) < 0 || ff_cnode_get_str(r, "model.config", NULL, &config) < 0) return -1;
    memset(m, 0, sizeof *m);
    m->gated_mlp = true; /* a model from flags is Llama-like unless told otherwise */
    if (preset && config) return ff_error_set("model", "give one of them", "both a preset ('%s') and a config.json ('%s')", preset, config);
    if (preset && ff_plan_model_preset(preset, m)) return -1;
    if (config) {
        char path[FF_PATH_MAX];
        if (config[0] != '/' && base_dir && base_dir[0]) snprintf(path, sizeof path, "%s/%s", base_dir, config);
        else snprintf(path, sizeof path, "%s", config);
        if (ff_plan_model_from_hf_config(path, m)) return -1;
    }
    if (ff_cnode_get_str(r, "model.name", NULL, &name) < 0) return -1;
    if (name) snprintf(m->name, sizeof m->name, "%s", name);
    if (get_count(r, "model.layers", &m->layers) || get_count(r, "model.hidden", &m->hidden) || get_count(r, "model.heads", &m->heads) ||
        get_count(r, "model.kv_heads", &m->kv_heads) || get_count(r, "model.head_dim", &m->head_dim) ||
        get_count(r, "model.ffn", &m->ffn) || get_count(r, "model.vocab", &m->vocab) ||
        get_count(r, "model.pos_embeddings", &m->pos_embeddings) || get_count(r, "model.experts", &m->experts) ||
        get_count(r, "model.experts_per_token", &m->experts_per_token) || get_count(r, "model.moe_layers", &m->moe_layers) ||
        get_count(r, "model.expert_ffn", &m->expert_ffn))
        return -1;
    if (get_flag(r, "model.tied_embeddings", &m->tied_embeddings) || get_flag(r, "model.gated_mlp", &m->gated_mlp) ||
        get_flag(r, "model.linear_bias", &m->linear_bias) || get_flag(r, "model.layernorm", &m->layernorm))
        return -1;
    if (!m->name[0]) snprintf(m->name, sizeof m->name, "custom");
    if (m->head_dim == 0 && m->heads > 0 && m->hidden % m->heads == 0) m->head_dim = m->hidden / m->heads;
    if (m->kv_heads == 0) m->kv_heads = m->heads;
    return 0;
}

static int read_workload(ff_cnode *r, ff_plan_workload *w) {
    if (get_count(r, "workload.seq", &w->seq) || get_count(r, "workload.micro_batch", &w->micro_batch) ||
        get_count(r, "workload.micro_batches", &w->micro_batches) || get_count(r, "workload.global_batch", &w->global_batch) ||
        get_dtype_bytes(r, "workload.grad_reduce", &w->grad_reduce_bytes) || get_dtype_bytes(r, "workload.grad_accum", &w->grad_bytes))
        return -1;
    if (ff_cnode_get_double(r, "workload.act_coeff", w->act_coeff, &w->act_coeff) < 0) return -1;
    return 0;
}

static int read_layout(ff_cnode *r, ff_plan_layout *l) {
    const char *s;
    int rc = ff_cnode_get_str(r, "layout.degrees", NULL, &s);
    if (rc < 0) return -1;
    if (rc == 0 && ff_plan_parse_layout(s, l)) return -1;
    int64_t zero = l->zero;
    if (get_count(r, "layout.tp", &l->tp) || get_count(r, "layout.cp", &l->cp) || get_count(r, "layout.pp", &l->pp) ||
        get_count(r, "layout.dp", &l->dp) || get_count(r, "layout.ep", &l->ep) || get_count(r, "layout.vpp", &l->vpp) ||
        get_count(r, "layout.zero", &zero) || get_count(r, "layout.layers_first", &l->layers_first) ||
        get_count(r, "layout.layers_last", &l->layers_last))
        return -1;
    l->zero = (int)(zero > 9 ? 9 : zero);
    if (get_flag(r, "layout.sp", &l->sequence_parallel) || get_flag(r, "layout.checkpoint", &l->checkpoint)) return -1;
    static const char *const sched[] = {"1f1b", "gpipe", "interleaved", "afab"};
    int v;
    if (ff_cnode_get_enum(r, "layout.schedule", sched, 4, (int)l->schedule, &v) < 0) return -1;
    l->schedule = (ff_plan_schedule)v;
    const char *zs_names[FF_PLAN_NZS];
    for (int i = 0; i < FF_PLAN_NZS; i++) zs_names[i] = ff_plan_zero_schedule_name((ff_plan_zero_schedule)i);
    if (ff_cnode_get_enum(r, "layout.zero_schedule", zs_names, FF_PLAN_NZS, (int)l->zero_schedule, &v) < 0) return -1;
    l->zero_schedule = (ff_plan_zero_schedule)v;
    ff_cnode *o = ff_cnode_find(r, "layout.order");
    if (o && ff_cnode_kind_of(o) == FF_CNODE_SEQ) {
        char buf[128] = "";
        for (size_t i = 0; i < ff_cnode_len(o); i++) {
            const char *t = ff_cnode_scalar(ff_cnode_at(o, i));
            if (!t) return ff_error_set("layout.order", "write a list like [tp, cp, pp, dp]", "not a list of names");
            strncat(buf, i ? "," : "", sizeof buf - strlen(buf) - 1);
            strncat(buf, t, sizeof buf - strlen(buf) - 1);
        }
        if (ff_plan_parse_order(buf, l)) return -1;
    } else if (o) {
        const char *t = ff_cnode_scalar(o);
        if (!t) return ff_error_set("layout.order", "write a list like [tp, cp, pp, dp]", "not a list");
        if (ff_plan_parse_order(t, l)) return -1;
    }
    return 0;
}

static int read_cluster(ff_cnode *r, ff_plan_cluster *c) {
    const char *preset;
    if (ff_cnode_get_str(r, "cluster.preset", NULL, &preset) < 0) return -1;
    if (preset && ff_plan_cluster_preset(preset, c)) return -1;
    int64_t gpus = 0;
    if (get_count(r, "cluster.gpus", &gpus) || get_count(r, "cluster.gpus_per_domain", &c->domain) ||
        get_count(r, "cluster.radix", &c->radix))
        return -1;
    c->gpus = gpus; /* 0: from the layout's degrees */
    if (get_quantity(r, "cluster.hbm", "GB", &c->hbm_bytes) || get_quantity(r, "cluster.nvlink", "GB/s", &c->nvlink_bps) ||
        get_quantity(r, "cluster.nic", "Gb/s", &c->nic_bps) || get_quantity(r, "cluster.flops", "TFLOP/s", &c->flops))
        return -1;
    double us;
    if (ff_cnode_get_double(r, "cluster.nvlink_latency_us", c->nvlink_latency_s * 1e6, &us) < 0) return -1;
    c->nvlink_latency_s = us * 1e-6;
    if (ff_cnode_get_double(r, "cluster.nic_latency_us", c->nic_latency_s * 1e6, &us) < 0) return -1;
    c->nic_latency_s = us * 1e-6;
    static const char *const topo[] = {"clos", "rail-only"};
    int v;
    if (ff_cnode_get_enum(r, "cluster.topology", topo, 2, (int)c->topology, &v) < 0) return -1;
    c->topology = (ff_plan_topology)v;
    if (ff_cnode_get_double(r, "cluster.oversubscription", c->oversubscription, &c->oversubscription) < 0) return -1;
    return 0;
}

int ff_plan_input_from_config(ff_config *cfg, const char *base_dir, ff_plan_input *out) {
    ff_plan_input_defaults(out);
    ff_cnode *r = ff_config_root(cfg);
    if (read_model(r, base_dir, &out->model) || read_workload(r, &out->workload) || read_layout(r, &out->layout) ||
        read_cluster(r, &out->cluster))
        return -1;
    if (out->cluster.gpus == 0) { /* from the degrees when DP is given, else one DP replica */
        ff_plan_layout *l = &out->layout;
        out->cluster.gpus = l->tp * l->cp * l->pp * (l->dp > 0 ? l->dp : 1);
    }
    return 0;
}
