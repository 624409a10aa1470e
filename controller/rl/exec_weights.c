/* Frozen weights on demand on the controller's side (roles.<ref|reward>.weights: on_demand,
 * docs/run.md "Weights on demand"): which roles a freed worker is told to prefetch, and what
 * the workers report of their loads, summed per iteration into metrics.jsonl and drawn on the
 * trace. The loads themselves are the workers' (workers/rl/rlw_engine.c); the controller only
 * tells a worker ahead and counts. */
#include <string.h>

#include "controller/rl/exec_internal.h"

/* roles.<ref|reward> as the rows of ex_weights (0 ref, 1 reward) */
static const ff_role od_role[EX_OD_N] = {FF_ROLE_REF, FF_ROLE_REWARD};
static const unsigned od_bit[EX_OD_N] = {FF_RL_REF, FF_RL_REWARD};
static const char *const od_name[EX_OD_N] = {"ref", "reward"};

unsigned ex_weights_prefetch_roles(const ex_run *x, int rank) {
    unsigned bits = 0;
    for (int i = 0; i < EX_OD_N; i++)
        if (x->run->roles[od_role[i]].on_demand && rank >= 0 && rank < x->nranks && (x->rank_roles[rank] & od_bit[i])) bits |= od_bit[i];
    return bits;
}

static int od_row(const ex_run *x, int node) {
    const ff_role role = x->run->graph ? ff_graph_node(x->run->graph, (size_t)node)->role : FF_ROLE_NONE;
    for (int i = 0; i < EX_OD_N; i++)
        if (role == od_role[i] && x->run->roles[role].on_demand) return i;
    return -1;
}

void ex_weights_note(ex_run *x, const ex_job *j, const ff_result *r, int n) {
    ex_iter *I = x->cur;
    if (!I || j->iteration != I->it) return;
    ex_weights *w = &I->weights;
    for (int k = 0; k < n; k++) {
        if (r[k].status != FF_STATUS_OK) continue;
        const ff_tensor *held = ex_out_named(&r[k], FF_RL_T_WEIGHTS_HELD);
        if (held && held->dtype == FF_DTYPE_I64 && ff_tensor_numel(held) == 1) { /* a generation job's start */
            const int64_t v = *(const int64_t *)held->data;
            if (!w->gen_seen || v > w->held_gen_max) w->held_gen_max = v;
            w->gen_seen = true;
        }
        const ff_tensor *t = ex_out_named(&r[k], FF_RL_T_WEIGHTS);
        const int i = j->kind == JOB_SCORE ? od_row(x, j->node) : -1;
        if (!t || i < 0 || t->dtype != FF_DTYPE_F64 || ff_tensor_numel(t) != FF_RL_W_N) continue;
        const double *v = t->data;
        ex_weights_role *o = &w->role[i];
        const int64_t held_now = (int64_t)v[FF_RL_W_HELD];
        if (!o->infer_seen || held_now < o->held_infer_min) o->held_infer_min = held_now;
        o->infer_seen = true;
        if (v[FF_RL_W_BYTES] <= 0) continue; /* they were there already */
        const double hidden = v[FF_RL_W_LOAD_S] - v[FF_RL_W_WAITED_S];
        o->loads++;
        o->prefetched += v[FF_RL_W_PREFETCHED] > 0;
        o->bytes += (int64_t)v[FF_RL_W_BYTES];
        o->load_s += v[FF_RL_W_LOAD_S];
        o->hidden_s += hidden > 0 ? hidden : 0;
        if (r[k].start_ns) {
            char label[64];
            snprintf(label, sizeof label, "load %s weights%s", od_name[i], v[FF_RL_W_PREFETCHED] > 0 ? " (prefetch)" : "");
            ex_trace_load(x, r[k].rank, label, r[k].start_ns + (int64_t)(v[FF_RL_W_START] * 1e9),
                          r[k].start_ns + (int64_t)(v[FF_RL_W_END] * 1e9), (int64_t)v[FF_RL_W_BYTES]);
        }
    }
}

void ex_weights_metrics(const ex_run *x, const ex_iter *I, json_t *m) {
    json_t *all = NULL;
    for (int i = 0; i < EX_OD_N; i++) {
        if (!x->run->roles[od_role[i]].on_demand) continue;
        const ex_weights_role *o = &I->weights.role[i];
        json_t *e = json_object();
        json_object_set_new(e, "loads", json_integer((json_int_t)o->loads));
        json_object_set_new(e, "prefetched", json_integer((json_int_t)o->prefetched));
        json_object_set_new(e, "bytes", json_integer((json_int_t)o->bytes));
        json_object_set_new(e, "load_s", json_real(o->load_s));
        json_object_set_new(e, "hidden_s", json_real(o->hidden_s));
        /* the memory the policy promises: none at a generation job's start, all during the
         * role's inference (null: no such subtask ran) */
        json_object_set_new(e, "resident_generating", I->weights.gen_seen ? json_integer((json_int_t)I->weights.held_gen_max) : json_null());
        json_object_set_new(e, "resident_inferring", o->infer_seen ? json_integer((json_int_t)o->held_infer_min) : json_null());
        if (!all) all = json_object();
        json_object_set_new(all, od_name[i], e);
    }
    if (all) json_object_set_new(m, "weights", all);
}
