/* Run configs: one YAML file holds the whole run (trainer, data, roles with their models and
 * layouts, extra columns, the algorithm graph); dotted overrides change any key. Read with the
 * typed getters of config.h, so every error names file:line and every key that nothing reads
 * is an error with a suggestion. The schema is documented in docs/graphs.md.
 *
 * Not here: the graph's own checks (graph.c). */
#include <assert.h>
#include <libgen.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dataflow/internal.h"
#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

static const char *const role_keys[FF_ROLE_COUNT] = {NULL, "actor", "critic", "ref", "reward"};

static int where_of(ff_config *c, const char *path, char *buf, size_t cap) {
    ff_cnode *n = ff_cnode_find(ff_config_root(c), path);
    if (n)
        ff_cnode_where(n, buf, cap);
    else
        snprintf(buf, cap, "%s", path);
    return 0;
}

static int read_trainer(ff_run_config *run) {
    ff_config *c = run->cfg;
    ff_trainer_cfg *t = &run->trainer;
    static const char *const sched[] = {"fused", "serial"};
    int s;
    if (ff_config_get_int_in(c, "trainer.steps", 100, 1, INT64_MAX, &t->steps) < 0 || ff_config_get_int(c, "trainer.seed", 1, &t->seed) < 0 ||
        ff_config_get_enum(c, "trainer.schedule", sched, 2, FF_SCHED_FUSED, &s) < 0 ||
        ff_config_get_int_in(c, "trainer.save_freq", 0, 0, INT64_MAX, &t->save_freq) < 0 ||
        ff_config_get_int_in(c, "trainer.test_freq", 0, 0, INT64_MAX, &t->test_freq) < 0 ||
        ff_config_get_int_in(c, "trainer.max_gen_batches", 4, 1, FF_RUN_MAX_GEN_BATCHES, &t->max_gen_batches) < 0 ||
        ff_config_get_str(c, "trainer.out_dir", "runs/latest", &t->out_dir) < 0 ||
        ff_config_get_str(c, "trainer.acc_reward", "arith_exact_match", &t->acc_reward) < 0 ||
        ff_config_get_loggers(c, "trainer.logger", &t->loggers) < 0)
        return -1;
    t->schedule = (ff_schedule)s;
    ff_cnode *pl = ff_cnode_find(ff_config_root(c), "trainer.plugins");
    if (!pl) return 0;
    char w[256];
    if (ff_cnode_kind_of(pl) == FF_CNODE_SCALAR) {
        if (!ff_cnode_scalar(pl)[0]) return 0; /* `plugins:` with nothing */
        return ff_error_set(ff_cnode_where(pl, w, sizeof w), "write a list: plugins: [path/to/plugin.so]",
                            "'trainer.plugins' must be a list");
    }
    if (ff_cnode_kind_of(pl) != FF_CNODE_SEQ)
        return ff_error_set(ff_cnode_where(pl, w, sizeof w), "write a list: plugins: [path/to/plugin.so]",
                            "'trainer.plugins' must be a list");
    t->n_plugins = ff_cnode_len(pl);
    t->plugins = ff_calloc(t->n_plugins ? t->n_plugins : 1, sizeof *t->plugins);
    if (!t->plugins) return -1;
    for (size_t i = 0; i < t->n_plugins; i++) {
        ff_cnode *e = ff_cnode_at(pl, i);
        if (!ff_cnode_scalar(e))
            return ff_error_set(ff_cnode_where(e, w, sizeof w), NULL, "each plugin is a path to a shared library");
        t->plugins[i] = ff_cnode_scalar(e);
    }
    return 0;
}

/* Sizes and counts that reach the workers are 32-bit there (tensor shapes, rl.* arguments):
 * bounded here, where they are read, so a huge value is an error at its line rather than a
 * wrapped one on a worker. Bounds against the model (its context) and the machine (memory
 * for the batch) need the model folders and are checked by `fuseflow run` before it starts. */
static int read_data(ff_run_config *run) {
    ff_config *c = run->cfg;
    ff_data_cfg *d = &run->data;
    if (ff_config_get_str(c, "data.train_files", NULL, &d->train_files) < 0 ||
        ff_config_get_str(c, "data.val_files", NULL, &d->val_files) < 0 ||
        ff_config_get_str(c, "data.prompt_key", "prompt", &d->prompt_key) < 0 ||
        ff_config_get_str(c, "data.answer_key", "answer", &d->answer_key) < 0 ||
        ff_config_get_int_in(c, "data.train_batch_size", 8, 1, INT32_MAX, &d->train_batch_size) < 0 ||
        ff_config_get_int_in(c, "data.val_batch_size", 64, 1, INT32_MAX, &d->val_batch_size) < 0 ||
        ff_config_get_int_in(c, "data.max_prompt_length", 512, 1, FF_RUN_MAX_TOKENS, &d->max_prompt_length) < 0 ||
        ff_config_get_int_in(c, "data.max_response_length", 512, 1, FF_RUN_MAX_TOKENS, &d->max_response_length) < 0 ||
        ff_config_get_bool(c, "data.shuffle", true, &d->shuffle) < 0)
        return -1;
    if (!d->train_files) {
        char w[256];
        where_of(c, "data", w, sizeof w);
        return ff_error_set(w, "add data.train_files: PATH.jsonl (fuseflow dataset arith writes one)", "no training data");
    }
    return 0;
}

/* `layout: {dp, tp, pp, vpp, sp, zero, schedule}` under base (a role, or the actor's
 * rollout), on top of dflt (NULL: dp inferred, the rest 1 / off / 0 / 1f1b). L->workers is set.
 * The degrees are checked against the workers by the planner's rule (ff_plan_layout_fit), so
 * a run and `fuseflow plan` refuse the same layouts with the same words; the checks against
 * the model (heads, vocabulary, layers) need its config.json: ff_run_config_check_layouts. */
static int read_layout(ff_cnode *base, const ff_layout *dflt, ff_layout *L, const char *what) {
    char w[256];
    static const char *const moved[] = {"dp", "tp", "pp", "zero"};
    for (int i = 0; i < 4; i++) {
        ff_cnode *old = ff_cnode_find(base, moved[i]);
        if (!old) continue;
        char hint[160];
        snprintf(hint, sizeof hint, "write %s.layout: {%s: %s}", what, moved[i], ff_cnode_scalar(old) ? ff_cnode_scalar(old) : "N");
        return ff_error_set(ff_cnode_where(old, w, sizeof w), hint, "'%s.%s' moved into the role's layout", what, moved[i]);
    }
    ff_cnode *lay = ff_cnode_find(base, "layout");
    if (lay && ff_cnode_kind_of(lay) != FF_CNODE_MAP)
        return ff_error_set(ff_cnode_where(lay, w, sizeof w), "write layout: {dp: 1, tp: 2}", "'%s.layout' must be a map", what);
    const char *sched[FF_PLAN_NSCHEDULES];
    for (int i = 0; i < FF_PLAN_NSCHEDULES; i++) sched[i] = ff_plan_schedule_name((ff_plan_schedule)i);
    int schedule;
    if (ff_cnode_get_int_in(base, "layout.dp", 0, 0, INT32_MAX, &L->dp) < 0 ||
        ff_cnode_get_int_in(base, "layout.tp", dflt ? dflt->tp : 1, 1, INT32_MAX, &L->tp) < 0 ||
        ff_cnode_get_int_in(base, "layout.pp", dflt ? dflt->pp : 1, 1, INT32_MAX, &L->pp) < 0 ||
        ff_cnode_get_int_in(base, "layout.vpp", dflt ? dflt->vpp : 1, 1, INT32_MAX, &L->vpp) < 0 ||
        ff_cnode_get_int_in(base, "layout.zero", dflt ? dflt->zero : 0, 0, 3, &L->zero) < 0 ||
        ff_cnode_get_bool(base, "layout.sp", dflt ? dflt->sp : false, &L->sp) < 0 ||
        ff_cnode_get_enum(base, "layout.schedule", sched, FF_PLAN_NSCHEDULES, dflt ? dflt->schedule : FF_PLAN_1F1B, &schedule) < 0)
        return -1;
    L->schedule = schedule;
    if (L->zero > 1)
        return ff_error_set(ff_cnode_where(ff_cnode_find(base, "layout.zero"), w, sizeof w),
                            "use zero: 1 (the optimizer state sharded over the DP ranks) or 0", "%s.layout.zero: ZeRO-2/3 are not built",
                            what);
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    in.layout.dp = L->dp, in.layout.tp = L->tp, in.layout.pp = L->pp;
    if (ff_plan_layout_fit(&in.layout, L->workers) != 0)
        return ff_error_wrap("%s: %s.layout with %lld workers (one per GPU)", ff_cnode_where(lay ? lay : base, w, sizeof w), what,
                             (long long)L->workers);
    L->dp = in.layout.dp;
    return 0;
}

static int read_role(ff_run_config *run, ff_role r) {
    ff_role_cfg *rc = &run->roles[r];
    char path[64];
    snprintf(path, sizeof path, "roles.%s", role_keys[r]);
    ff_cnode *base = ff_cnode_find(ff_config_root(run->cfg), path);
    if (!base) return 0;
    char w[256];
    ff_cnode_where(base, rc->where, sizeof rc->where);
    if (ff_cnode_kind_of(base) != FF_CNODE_MAP)
        return ff_error_set(rc->where, "give the role a map: {model: PATH, workers: N}", "'%s' must be a map", path);
    rc->present = true;
    const char *colo;
    static const char *const names[] = {"actor", "critic", "ref", "reward"};
    int colo_i = -1;
    if (ff_cnode_get_str(base, "model", NULL, &rc->model) < 0 ||
        ff_cnode_get_enum(base, "colocate_with", names, 4, -1, &colo_i) < 0 || ff_cnode_get_str(base, "colocate_with", NULL, &colo) < 0)
        return -1;
    rc->colocate_with = colo_i < 0 ? FF_ROLE_NONE : (ff_role)(colo_i + 1);
    if (rc->colocate_with == r)
        return ff_error_set(rc->where, NULL, "role '%s' cannot be colocated with itself", role_keys[r]);
    int64_t dflt_workers = 1;
    if (rc->colocate_with) {
        const ff_role_cfg *other = &run->roles[rc->colocate_with];
        if (!other->present)
            return ff_error_set(rc->where, "define that role (with its workers) too", "role '%s' is colocated with '%s', which is not defined",
                                role_keys[r], names[colo_i]);
        if (other->colocate_with)
            return ff_error_set(rc->where, "colocate every role with the same one", "role '%s' is colocated with '%s', which is itself colocated",
                                role_keys[r], names[colo_i]);
        dflt_workers = other->layout.workers;
    }
    if (ff_cnode_get_int_in(base, "workers", dflt_workers, 1, INT32_MAX, &rc->layout.workers) < 0) return -1;
    if (rc->colocate_with && rc->layout.workers != run->roles[rc->colocate_with].layout.workers)
        return ff_error_set(rc->where, "colocated roles share their worker processes: give them the same number",
                            "role '%s' has %lld workers but is colocated with '%s', which has %lld", role_keys[r],
                            (long long)rc->layout.workers, names[colo_i], (long long)run->roles[rc->colocate_with].layout.workers);
    /* the compute backend of the role's workers: a colocated role shares its target's processes,
     * so it must name the same one (it defaults to it) */
    static const char *const backends[] = {"cpu", "cuda"};
    int be = 0;
    const bool colo_cuda = rc->colocate_with && run->roles[rc->colocate_with].cuda;
    if (ff_cnode_get_enum(base, "backend", backends, 2, colo_cuda, &be) < 0) return -1;
    rc->cuda = be == 1;
    if (rc->colocate_with && rc->cuda != colo_cuda)
        return ff_error_set(ff_cnode_where(ff_cnode_find(base, "backend"), w, sizeof w),
                            "give colocated roles the same backend (or drop the key: it follows the role it is colocated with)",
                            "'%s.backend: %s', but it is colocated with '%s', whose backend is %s", path, backends[be], names[colo_i],
                            backends[colo_cuda]);
    /* a colocated role shares the processes of its target and, unless it says otherwise, its layout */
    if (read_layout(base, rc->colocate_with ? &run->roles[rc->colocate_with].layout : NULL, &rc->layout, path) < 0) return -1;
    /* generation is not pipelined: on the actor's workers its layout defaults to the actor's
     * TP with the rest of the workers as DP replicas */
    rc->rollout = rc->layout;
    if (rc->rollout.pp > 1) {
        rc->rollout.pp = 1, rc->rollout.vpp = 1, rc->rollout.schedule = FF_PLAN_1F1B;
        rc->rollout.dp = rc->rollout.workers / rc->rollout.tp;
    }
    rc->rollout_kv_block = 16;
    rc->rollout_kv_memory = 1.0;
    /* the KV cache in bf16 on cuda unless told otherwise, as a bf16 model's is in HF and vLLM
     * (bf16 products, the cuda default, round the rollout's log-probs there anyway) */
    rc->rollout_kv16 = rc->cuda;
    ff_cnode *ro = ff_cnode_find(base, "rollout");
    if (ro) {
        if (r != FF_ROLE_ACTOR)
            return ff_error_set(ff_cnode_where(ro, w, sizeof w), "only the actor generates", "'%s.rollout' is only for the actor", path);
        if (ff_cnode_kind_of(ro) != FF_CNODE_MAP)
            return ff_error_set(ff_cnode_where(ro, w, sizeof w), "write rollout: {workers: N, layout: {tp: M}}",
                                "'%s.rollout' must be a map", path);
        char what[80];
        snprintf(what, sizeof what, "%s.rollout", path);
        ff_layout d = rc->rollout;
        d.dp = 0; /* inferred from the workers unless given */
        int64_t rw = 0; /* a generation pool of its own (`fuseflow run` reshards the weights into it) */
        if (ff_cnode_get_int_in(ro, "workers", 0, 0, INT32_MAX, &rw) < 0) return -1;
        if (rw > 0) { /* its own workers: data parallel over them unless its layout says otherwise */
            rc->rollout_workers = rw;
            rc->rollout.workers = rw;
            d = (ff_layout){.workers = rw, .tp = 1, .pp = 1, .vpp = 1, .schedule = FF_PLAN_1F1B};
        }
        if (read_layout(ro, &d, &rc->rollout, what) < 0) return -1;
        static const char *const wire[] = {"fp32", "bf16"};
        int dt;
        if (ff_cnode_get_enum(ro, "sync_dtype", wire, 2, 0, &dt) < 0) return -1;
        rc->rollout_bf16 = dt == 1;
        /* a delta patches the copy that the last sync wrote: only a pool keeps it (the
         * colocated copy gives its weights back after each sync) */
        if (ff_cnode_get_bool(ro, "sync_delta", false, &rc->rollout_delta) < 0) return -1;
        /* the paged KV cache of generation (model/generate.c): block size and pool share */
        if (ff_cnode_get_int_in(ro, "kv_block", 16, 1, 1 << 16, &rc->rollout_kv_block) < 0 ||
            ff_cnode_get_double_in(ro, "kv_memory", 1.0, 1e-6, 1.0, &rc->rollout_kv_memory) < 0)
            return -1;
        /* a pool of its own on cuda holds bf16 unless told otherwise (or a delta patches it): its
         * decode steps then read 2 bytes a weight, where fp32 ones are rounded into scratch for
         * every product under bf16 products; the colocated copy is a view (fp32, in place) */
        static const char *const dtypes[] = {"fp32", "bf16"};
        int wd;
        if (ff_cnode_get_enum(ro, "dtype", dtypes, 2, rc->cuda && rw > 0 && !rc->rollout_delta, &wd) < 0) return -1;
        rc->rollout_w16 = wd == 1;
        if (ff_cnode_get_enum(ro, "kv_dtype", dtypes, 2, rc->rollout_kv16, &wd) < 0) return -1;
        rc->rollout_kv16 = wd == 1;
        bool graphs = true;
        if (ff_cnode_get_bool(ro, "graphs", true, &graphs) < 0) return -1;
        rc->rollout_eager = !graphs;
        if (rc->rollout_w16 && rc->rollout_delta)
            return ff_error_set(ff_cnode_where(ro, w, sizeof w), "drop sync_delta (each sync then sends the whole weights) or keep dtype: fp32",
                                "'%s.rollout.sync_delta' patches the copy's fp32 weights; with 'dtype: bf16' they are rounded where "
                                "they are stored, so the delta would be taken against other values than the ones sent",
                                path);
        if (rc->rollout_delta && rw == 0)
            return ff_error_set(ff_cnode_where(ro, w, sizeof w), "give the generation a pool of its own (roles.actor.rollout.workers: N) or drop sync_delta",
                                "'%s.rollout.sync_delta' needs generation workers of their own: the copy on the actor's workers "
                                "releases its weights after each sync, so a delta has nothing to patch",
                                path);
    }
    /* on by default: it only moves memory (the results are the same bits) and costs a host
     * copy of the AdamW state per iteration, the colocated actor's peak being the point */
    if (ff_cnode_find(base, "offload") && r != FF_ROLE_ACTOR)
        return ff_error_set(ff_cnode_where(ff_cnode_find(base, "offload"), w, sizeof w), "drop it: the actor's optimizer state is the one moved",
                            "'%s.offload' is only for the actor (its state while its colocated copy generates)", path);
    if (ff_cnode_get_bool(base, "offload", r == FF_ROLE_ACTOR, &rc->offload) < 0) return -1;
    /* frozen roles only: a trained role's weights change every step and train where they are */
    static const char *const residence[] = {"resident", "on_demand"};
    int res = 0;
    if (ff_cnode_get_enum(base, "weights", residence, 2, 0, &res) < 0) return -1;
    if (res == 1 && r != FF_ROLE_REF && r != FF_ROLE_REWARD)
        return ff_error_set(ff_cnode_where(ff_cnode_find(base, "weights"), w, sizeof w), "drop it, or set it on roles.ref or roles.reward",
                            "'%s.weights: on_demand' is only for the frozen roles (ref, reward): the %s trains its weights", path,
                            role_keys[r]);
    rc->on_demand = res == 1;
    /* the stored type of a frozen role's weight matrices; trained roles keep fp32 masters. A
     * frozen role on cuda holds bf16 unless told otherwise (as GPU RLHF frameworks hold their
     * reference): half the bytes; on the cpu, fp32 */
    static const char *const dtypes[] = {"fp32", "bf16"};
    int wd = 0;
    const bool frozen = r == FF_ROLE_REF || r == FF_ROLE_REWARD;
    if (ff_cnode_get_enum(base, "dtype", dtypes, 2, frozen && rc->cuda, &wd) < 0) return -1;
    if (wd == 1 && r != FF_ROLE_REF && r != FF_ROLE_REWARD)
        return ff_error_set(ff_cnode_where(ff_cnode_find(base, "dtype"), w, sizeof w),
                            r == FF_ROLE_ACTOR ? "drop it; roles.actor.rollout.dtype: bf16 stores the generating copy in bf16"
                                               : "drop it, or set it on roles.ref or roles.reward",
                            "'%s.dtype: bf16' is only for the frozen roles (ref, reward): the %s trains fp32 weights", path,
                            role_keys[r]);
    rc->w16 = wd == 1;
    if (r == FF_ROLE_ACTOR || r == FF_ROLE_CRITIC) {
        ff_optim_cfg *o = &rc->optim;
        ff_cnode *ob = ff_cnode_find(base, "optim");
        ff_cnode *opt = ob ? ob : base; /* absent: defaults (getters on a map without the keys) */
        if (ob && ff_cnode_kind_of(ob) != FF_CNODE_MAP)
            return ff_error_set(ff_cnode_where(ob, w, sizeof w), "write optim: {lr: 1e-5}", "'%s.optim' must be a map", path);
        if (ob) {
            if (ff_cnode_get_double(opt, "lr", 1e-6, &o->lr) < 0 || ff_cnode_get_double(opt, "weight_decay", 0.01, &o->weight_decay) < 0 ||
                ff_cnode_get_double(opt, "eps", 1e-8, &o->eps) < 0 || ff_cnode_get_double(opt, "grad_clip", 1.0, &o->grad_clip) < 0 ||
                ff_cnode_get_double(opt, "min_lr_ratio", 0.0, &o->min_lr_ratio) < 0 ||
                ff_cnode_get_int(opt, "warmup_steps", 0, &o->warmup_steps) < 0)
                return -1;
            static const char *const sch[] = {"constant", "cosine"};
            int s;
            if (ff_cnode_get_enum(opt, "lr_schedule", sch, 2, 0, &s) < 0) return -1;
            o->lr_schedule = sch[s];
            o->beta1 = 0.9, o->beta2 = 0.999;
            ff_cnode *betas = ff_cnode_find(opt, "betas");
            if (betas) {
                if (ff_cnode_kind_of(betas) != FF_CNODE_SEQ || ff_cnode_len(betas) != 2 ||
                    ff_cnode_get_double(betas, "0", 0.9, &o->beta1) < 0 || ff_cnode_get_double(betas, "1", 0.999, &o->beta2) < 0)
                    return ff_error_set(ff_cnode_where(betas, w, sizeof w), "write betas: [0.9, 0.999]", "'%s.optim.betas' must be two numbers",
                                        path);
            }
        } else {
            *o = (ff_optim_cfg){1e-6, 0.01, 0.9, 0.999, 1e-8, 1.0, 0.0, 0, "constant"};
        }
        if (o->lr <= 0 || o->lr > 1 || o->beta1 < 0 || o->beta1 >= 1 || o->beta2 < 0 || o->beta2 >= 1 || o->eps <= 0 ||
            o->grad_clip < 0 || o->weight_decay < 0 || o->warmup_steps < 0 || o->min_lr_ratio < 0 || o->min_lr_ratio > 1)
            return ff_error_set(ob ? ff_cnode_where(ob, w, sizeof w) : rc->where, "lr in (0, 1], betas in [0, 1), eps > 0, the rest >= 0",
                                "'%s.optim' has a value out of range", path);
    }
    return 0;
}

static int read_columns(ff_run_config *run) {
    ff_cnode *cols = ff_cnode_find(ff_config_root(run->cfg), "columns");
    if (!cols) return 0;
    char w[256];
    if (ff_cnode_kind_of(cols) != FF_CNODE_MAP)
        return ff_error_set(ff_cnode_where(cols, w, sizeof w), "write columns: {name: tokens|per_token|scalar|text}",
                            "'columns' must be a map");
    static const char *const kinds[] = {"tokens", "per_token", "scalar", "text"};
    for (size_t i = 0; i < ff_cnode_len(cols); i++) {
        ff_cnode *e = ff_cnode_at(cols, i);
        int kind;
        bool from_data = false;
        if (ff_cnode_kind_of(e) == FF_CNODE_SCALAR) {
            if (ff_cnode_get_enum(e, "", kinds, 4, -1, &kind) < 0) return -1;
        } else if (ff_cnode_kind_of(e) == FF_CNODE_MAP) {
            if (ff_cnode_get_enum(e, "kind", kinds, 4, -1, &kind) < 0 || ff_cnode_get_bool(e, "from_data", false, &from_data) < 0)
                return -1;
        } else {
            kind = -1;
        }
        if (kind < 0)
            return ff_error_set(ff_cnode_where(e, w, sizeof w), "give its kind: tokens, per_token, scalar or text",
                                "column '%s' has no kind", ff_cnode_key(e));
        if (ff_graph_add_column(run->graph, ff_cnode_key(e), (ff_col_kind)kind, from_data) < 0)
            return ff_error_wrap("%s", ff_cnode_where(e, w, sizeof w));
    }
    return 0;
}

/* Bind with errors located at the entry's line rather than the node's. */
static int bind_at(ff_graph *g, int node, bool output, const char *slot, const char *col, ff_cnode *entry) {
    ff_node *n = ff_graph_node_mut(g, (size_t)node);
    char saved[sizeof n->where];
    memcpy(saved, n->where, sizeof saved);
    ff_cnode_where(entry, n->where, sizeof n->where);
    int rc = ff_graph_bind(g, node, output, slot, col);
    memcpy(n->where, saved, sizeof saved);
    return rc;
}

/* in:/out: as a list (positional, in the op's slot order) or a map (slot: column). */
static int read_bindings(ff_run_config *run, int node, ff_cnode *nm, const char *key, bool output) {
    ff_cnode *b = ff_cnode_find(nm, key);
    if (!b) return 0;
    ff_graph *g = run->graph;
    const ff_node *n = ff_graph_node(g, (size_t)node);
    char w[256];
    ff_slot slots[8];
    size_t ns = ff_op_slots(n->op, n->role, output, slots, NULL, 8);
    if (ff_cnode_kind_of(b) == FF_CNODE_SCALAR && !ff_cnode_scalar(b)[0]) return 0; /* `out:` left empty */
    if (ff_cnode_kind_of(b) == FF_CNODE_SEQ) {
        if (ff_cnode_len(b) > ns)
            return ff_error_set(ff_cnode_where(b, w, sizeof w), "use the map form {slot: column} to see which is which",
                                "node '%s' (op %s) has %zu %s slots, but %s lists %zu columns", n->name, ff_op_name(n->op), ns,
                                output ? "output" : "input", key, ff_cnode_len(b));
        for (size_t i = 0; i < ff_cnode_len(b); i++) {
            ff_cnode *e = ff_cnode_at(b, i);
            const char *col = ff_cnode_scalar(e);
            if (!col) return ff_error_set(ff_cnode_where(e, w, sizeof w), NULL, "a column name must be text");
            if (bind_at(g, node, output, ff_slot_name(slots[i]), col, e) != 0) return -1;
        }
        return 0;
    }
    if (ff_cnode_kind_of(b) == FF_CNODE_MAP) {
        for (size_t i = 0; i < ff_cnode_len(b); i++) {
            ff_cnode *e = ff_cnode_at(b, i);
            const char *col = ff_cnode_scalar(e);
            if (!col) return ff_error_set(ff_cnode_where(e, w, sizeof w), NULL, "a column name must be text");
            if (bind_at(g, node, output, ff_cnode_key(e), col, e) != 0) return -1;
        }
        return 0;
    }
    return ff_error_set(ff_cnode_where(b, w, sizeof w), "write a list [a, b] or a map {slot: column}",
                        "node '%s': '%s' must be a list or a map", n->name, key);
}

static int read_graph(ff_run_config *run) {
    ff_cnode *gr = ff_cnode_find(ff_config_root(run->cfg), "graph");
    char w[256];
    if (gr && ff_cnode_kind_of(gr) != FF_CNODE_MAP && ff_cnode_scalar(gr) && ff_cnode_scalar(gr)[0])
        return ff_error_set(ff_cnode_where(gr, w, sizeof w), "see examples/grpo.yaml",
                            "'graph' must be a map of nodes, not the plain value '%s'", ff_cnode_scalar(gr));
    if (gr && ff_cnode_kind_of(gr) == FF_CNODE_SEQ)
        return ff_error_set(ff_cnode_where(gr, w, sizeof w), "see examples/grpo.yaml", "'graph' must be a map of nodes, not a list");
    if (!gr || ff_cnode_kind_of(gr) != FF_CNODE_MAP || !ff_cnode_len(gr))
        return ff_error_set(gr ? ff_cnode_where(gr, w, sizeof w) : run->path, "see examples/grpo.yaml",
                            "the config has no graph: a map of nodes under 'graph:'");
    static const char *const ops[] = {"generate", "logprob", "value", "score", "reward_fn",
                                      "advantage", "train", "sync_weights", "filter"};
    static const char *const roles[] = {"none", "actor", "critic", "ref", "reward"};
    static const char *const grans[] = {"sample", "group", "micro_batch", "batch"};
    for (size_t i = 0; i < ff_cnode_len(gr); i++) {
        ff_cnode *nm = ff_cnode_at(gr, i);
        ff_cnode_where(nm, w, sizeof w);
        if (ff_cnode_kind_of(nm) != FF_CNODE_MAP)
            return ff_error_set(w, "a node is a map: {op: ..., role: ..., in: [...], out: [...]}", "node '%s' is not a map", ff_cnode_key(nm));
        int op, role, gran;
        if (ff_cnode_get_enum(nm, "op", ops, FF_OP_COUNT, -1, &op) < 0 || ff_cnode_get_enum(nm, "role", roles, FF_ROLE_COUNT, 0, &role) < 0 ||
            ff_cnode_get_enum(nm, "granularity", grans, FF_GRAN_COUNT, FF_GRAN_COUNT, &gran) < 0)
            return -1;
        if (op < 0) return ff_error_set(w, "add op: generate|logprob|value|score|reward_fn|advantage|train|sync_weights|filter",
                                        "node '%s' has no op", ff_cnode_key(nm));
        int k = ff_graph_add_node(run->graph, ff_cnode_key(nm), (ff_op)op, (ff_role)role, (ff_granularity)gran);
        if (k < 0) return ff_error_wrap("%s", w);
        ff_graph_node_attach(run->graph, k, nm, w);
        if (read_bindings(run, k, nm, "in", false) || read_bindings(run, k, nm, "out", true)) return -1;
        ff_cnode *after = ff_cnode_find(nm, "after");
        if (after) {
            size_t na = ff_cnode_kind_of(after) == FF_CNODE_SEQ ? ff_cnode_len(after) : 1;
            for (size_t j = 0; j < na; j++) {
                ff_cnode *e = ff_cnode_kind_of(after) == FF_CNODE_SEQ ? ff_cnode_at(after, j) : after;
                char ew[256];
                ff_cnode_where(e, ew, sizeof ew);
                if (!ff_cnode_scalar(e)) return ff_error_set(ew, "write after: [node, ...]", "'after' lists node names");
                /* the node may come later in the file: resolved below */
            }
        }
    }
    /* after: edges, now that every node exists */
    for (size_t i = 0; i < ff_cnode_len(gr); i++) {
        ff_cnode *nm = ff_cnode_at(gr, i);
        ff_cnode *after = ff_cnode_find(nm, "after");
        if (!after) continue;
        size_t na = ff_cnode_kind_of(after) == FF_CNODE_SEQ ? ff_cnode_len(after) : 1;
        for (size_t j = 0; j < na; j++) {
            ff_cnode *e = ff_cnode_kind_of(after) == FF_CNODE_SEQ ? ff_cnode_at(after, j) : after;
            char ew[256];
            if (ff_graph_add_after(run->graph, (int)i, ff_cnode_scalar(e)) != 0)
                return ff_error_wrap("%s", ff_cnode_where(e, ew, sizeof ew));
        }
    }
    return 0;
}

/* A plugin path as written, or relative to the config file's folder when that exists. */
static int load_plugins(ff_run_config *run, ff_registry *reg) {
    for (size_t i = 0; i < run->trainer.n_plugins; i++) {
        const char *p = run->trainer.plugins[i];
        char buf[FF_PATH_MAX];
        struct stat st;
        if (p[0] != '/' && stat(p, &st) != 0 && run->path) {
            char *copy = ff_strdup(run->path);
            if (!copy) return -1;
            snprintf(buf, sizeof buf, "%s/%s", dirname(copy), p);
            free(copy);
            if (stat(buf, &st) == 0) p = buf;
        }
        if (ff_registry_load_plugin(reg, p) != 0) {
            char w[256];
            ff_cnode *n = ff_cnode_at(ff_cnode_find(ff_config_root(run->cfg), "trainer.plugins"), i);
            return ff_error_wrap("%s", ff_cnode_where(n, w, sizeof w));
        }
    }
    return 0;
}

static ff_run_config *finish(ff_config *cfg, const char *name, int n_over, char *const *over, ff_registry *reg) {
    if (!cfg) return NULL;
    ff_run_config *run = ff_calloc(1, sizeof *run);
    if (!run) {
        ff_config_destroy(&cfg);
        return NULL;
    }
    run->cfg = cfg;
    run->path = ff_strdup(name ? name : "<string>");
    run->graph = ff_graph_new();
    if (!run->path || !run->graph || ff_config_apply_overrides(cfg, n_over, over) != 0 || read_trainer(run) || read_data(run) ||
        load_plugins(run, reg)) {
        ff_run_config_destroy(&run);
        return NULL;
    }
    /* roles in an order where a colocation target comes first */
    static const ff_role order[] = {FF_ROLE_ACTOR, FF_ROLE_CRITIC, FF_ROLE_REF, FF_ROLE_REWARD};
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < 4; i++) {
            ff_role r = order[i];
            char path[64];
            snprintf(path, sizeof path, "roles.%s.colocate_with", role_keys[r]);
            bool colo = ff_cnode_find(ff_config_root(cfg), path) != NULL;
            if (colo != (pass == 1)) continue;
            if (read_role(run, r) != 0) {
                ff_run_config_destroy(&run);
                return NULL;
            }
        }
    ff_cnode *roles = ff_cnode_find(ff_config_root(cfg), "roles");
    if (roles && ff_cnode_kind_of(roles) != FF_CNODE_MAP) {
        char w[256];
        ff_error_set(ff_cnode_where(roles, w, sizeof w), "write roles: {actor: {model: PATH}}", "'roles' must be a map");
        ff_run_config_destroy(&run);
        return NULL;
    }
    if (read_columns(run) || read_graph(run) || ff_graph_validate(run->graph, reg, run) || ff_config_check_unused(cfg)) {
        ff_run_config_destroy(&run);
        return NULL;
    }
    return run;
}

ff_run_config *ff_run_config_load(const char *path, int n_overrides, char *const *overrides, ff_registry *reg) {
    return finish(ff_config_load(path), path, n_overrides, overrides, reg);
}

ff_run_config *ff_run_config_parse(const char *text, const char *name, int n_overrides, char *const *overrides,
                                   ff_registry *reg) {
    return finish(ff_config_parse(text, strlen(text), name), name, n_overrides, overrides, reg);
}

int32_t ff_rollout_kv_blocks(int32_t slots, int32_t max_seq, int32_t block_rows, double kv_memory) {
    assert(slots >= 1 && max_seq >= 1 && block_rows >= 1 && kv_memory > 0 && kv_memory <= 1);
    const double full = (double)slots * (double)((max_seq + block_rows - 1) / block_rows);
    double n = ceil(full * kv_memory - 1e-9); /* 1e-9: a share that is exact in decimal stays exact */
    return n < 1 ? 1 : n > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)n;
}

void ff_run_config_destroy(ff_run_config **pr) {
    if (!pr || !*pr) return;
    ff_run_config *r = *pr;
    ff_graph_destroy(&r->graph); /* before the tree its nodes' params point into */
    ff_config_destroy(&r->cfg);
    free(r->trainer.plugins);
    free(r->path);
    free(r);
    *pr = NULL;
}

int ff_run_config_check_files(const ff_run_config *run) {
    struct stat st;
    char w[256];
    const char *files[2] = {run->data.train_files, run->data.val_files};
    const char *keys[2] = {"data.train_files", "data.val_files"};
    for (int i = 0; i < 2; i++) {
        if (!files[i] || (stat(files[i], &st) == 0 && S_ISREG(st.st_mode))) continue;
        where_of(run->cfg, keys[i], w, sizeof w);
        return ff_error_set(w, "make it with `fuseflow dataset arith --out DIR`, or fix the path", "%s '%s' does not exist", keys[i],
                            files[i]);
    }
    for (int r = 1; r < FF_ROLE_COUNT; r++) {
        const ff_role_cfg *rc = &run->roles[r];
        if (!rc->present || !rc->model) continue;
        char cfgjson[FF_PATH_MAX];
        snprintf(cfgjson, sizeof cfgjson, "%s/config.json", rc->model);
        if (stat(cfgjson, &st) == 0) continue;
        char key[64];
        snprintf(key, sizeof key, "roles.%s.model", role_keys[r]);
        where_of(run->cfg, key, w, sizeof w);
        return ff_error_set(w, "point it at a Hugging Face model folder (fuseflow init writes one)",
                            "%s '%s' has no config.json", key, rc->model);
    }
    return 0;
}

/* ---- layouts against the models ---------------------------------------------------------- */
int ff_run_config_plan_input(const ff_run_config *run, ff_role r, bool rollout, struct ff_plan_input *in) {
    const ff_role_cfg *rc = &run->roles[r];
    const ff_layout *L = rollout ? &rc->rollout : &rc->layout;
    char key[64], w[256], path[FF_PATH_MAX];
    snprintf(key, sizeof key, "roles.%s%s", role_keys[r], rollout ? ".rollout" : "");
    ff_cnode *base = ff_cnode_find(ff_config_root(run->cfg), key);
    ff_cnode *lay = base ? ff_cnode_find(base, "layout") : NULL;
    if (lay || base) ff_cnode_where(lay ? lay : base, w, sizeof w);
    else snprintf(w, sizeof w, "%s", run->path);
    ff_plan_input_defaults(in);
    snprintf(path, sizeof path, "%s/config.json", rc->model ? rc->model : ".");
    if (!rc->model || ff_plan_model_from_hf_config(path, &in->model) != 0)
        return ff_error_wrap("%s: %s.model", w, key);
    in->model.vocab_unpadded = true; /* the model engine splits the vocabulary as it is */
    /* what the planner checks here is the layout against the model; the micro-batches of a step
     * come from its token-balanced plan, which the trainer checks at each step (interleaved:
     * a multiple of pp), so the planner sees the fewest that fit, and with sequence
     * parallelism the sequence rounded up to a multiple of TP (the engine splits any count) */
    int64_t seq = run->data.max_prompt_length + run->data.max_response_length;
    if (L->sp && L->tp > 1) seq = (seq + L->tp - 1) / L->tp * L->tp;
    in->workload.seq = seq;
    in->workload.micro_batch = 1;
    in->workload.micro_batches = L->schedule == FF_PLAN_INTERLEAVED && L->pp > 1 ? L->pp : 1;
    in->cluster.gpus = in->cluster.domain = L->workers;
    ff_plan_layout *pl = &in->layout;
    pl->tp = L->tp, pl->pp = L->pp, pl->dp = L->dp, pl->vpp = L->vpp;
    pl->sequence_parallel = L->sp;
    pl->zero = (int)L->zero;
    pl->schedule = (ff_plan_schedule)L->schedule;
    if (ff_plan_resolve(in) != 0)
        return ff_error_wrap("%s: %s.layout (dp %lld, tp %lld, pp %lld on %lld workers) cannot run %s", w, key, (long long)L->dp,
                             (long long)L->tp, (long long)L->pp, (long long)L->workers, path);
    return 0;
}

int ff_run_config_check_layouts(const ff_run_config *run) {
    for (int r = FF_ROLE_ACTOR; r < FF_ROLE_COUNT; r++) {
        if (!run->roles[r].present || !run->roles[r].model) continue;
        ff_plan_input in;
        if (ff_run_config_plan_input(run, (ff_role)r, false, &in) != 0) return -1;
        if (r == FF_ROLE_ACTOR && ff_run_config_plan_input(run, (ff_role)r, true, &in) != 0) return -1;
    }
    return 0;
}
