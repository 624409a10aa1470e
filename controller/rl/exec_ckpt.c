/* What a checkpoint of `fuseflow run` holds, and resuming from one.
 *
 * OUT/checkpoints/step-NNNNNNNN/ holds everything needed to continue exactly:
 *   actor/, critic/            model folders of the trained roles (loadable by every command)
 *   actor.optim.safetensors    AdamW state (moments and the step count), critic's likewise
 *   state.json                 iteration, seed, data order (epoch, cursor), adaptive KL
 *                              coefficients, the training set's size
 *   config.yaml                the effective run config (what --resume compares with)
 * The folder is staged as step-N.tmp-PID (the trained roles' DP rank 0 workers write their
 * parts into it, whole tensors, by TP rank 0 of replica 0, after gathering a ZeRO-1
 * optimizer's state from every DP replica; the controller writes state.json) and swapped in
 * whole (ff_train_dir_commit,
 * fuseflow/train_dir.h), so a crash never leaves half a checkpoint (and the next run in the
 * folder removes the staging folder of a dead one). The two newest are kept.
 *
 * Everything else a run draws from is a function of (seed, iteration, ...): sampling seeds,
 * mini-batch shuffles, the data order per epoch; so this is the whole state.
 *
 * Not here: when to save (exec_run.c); the run folder, metrics.jsonl and the data order
 * (fuseflow/train_dir.h, shared with `fuseflow sft`). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/modelio.h"
#include "fuseflow/util.h"

int ex_ckpt_save(ex_run *x, int64_t iteration, const ff_data_order *order_at) {
    char tmp[FF_PATH_MAX];
    if (ff_train_dir_stage(&x->td, iteration, tmp, sizeof tmp) != 0) return -1;
    const struct {
        ff_role role;
        int pool;
        const char *name;
    } parts[2] = {{FF_ROLE_ACTOR, POOL_ACTOR, "actor"}, {FF_ROLE_CRITIC, POOL_CRITIC, "critic"}};
    for (int i = 0; i < 2; i++) {
        const int pool = parts[i].pool;
        if (!ex_has_node(x, FF_OP_TRAIN, parts[i].role) || !x->pool_n[pool]) continue;
        /* its TP ranks gather, TP rank 0 of replica 0 writes; a ZeRO-1 optimizer's state is in
         * pieces on every DP replica: all of them gather it first */
        const int savers = x->run->roles[parts[i].role].layout.zero ? x->lay[pool].dp : 1;
        for (int k = 0; k < savers; k++) {
            ex_job *j = ex_job_new(x, JOB_CTL, -1);
            if (!j) goto fail;
            ff_arg args[2] = {ff_arg_str("role", parts[i].name), ff_arg_str("dir", tmp)};
            char label[64];
            snprintf(label, sizeof label, savers > 1 ? "save %s (dp %d)" : "save %s", parts[i].name, k);
            int nafter;
            const uint64_t *after = ex_trace_deps(x, -1, NULL, 0, pool, NULL, 0, &nafter);
            ff_subtask_spec spec = {.kind = FF_RL_SAVE, .args = args, .nargs = 2, .after = after, .nafter = nafter, .label = label};
            ex_target_replica(x, j, pool, k, &spec);
            if (!ex_submit(x, j, &spec)) goto fail;
        }
    }
    if (ex_wait_jobs(x) != 0) goto fail;
    json_t *st = json_object();
    json_object_set_new(st, "iteration", json_integer(iteration));
    json_object_set_new(st, "seed", json_integer(x->run->trainer.seed));
    json_object_set_new(st, "train_size", json_integer(x->train.n));
    json_object_set_new(st, "epoch", json_integer(order_at->epoch));
    json_object_set_new(st, "cursor", json_integer(order_at->cursor));
    json_t *kl = json_object();
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *n = ff_graph_node(x->run->graph, (size_t)m);
        if (n->op == FF_OP_ADVANTAGE && n->kl_penalty) json_object_set_new(kl, n->name, json_real(n->kl_ctl.coef));
    }
    json_object_set_new(st, "kl_coef", kl);
    char *text = json_dumps(st, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(st);
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/state.json", tmp);
    int rc = text ? ff_write_file_atomic(path, text, strlen(text)) : -1;
    free(text);
    if (rc != 0) goto fail;
    return ff_train_dir_commit(&x->td, iteration, tmp, x->run->cfg, 2);
fail:
    ff_atomic_dir_abort(tmp);
    return ff_error_wrap("checkpoint of iteration %" PRId64, iteration);
}

int ex_ckpt_load_state(ex_run *x, const char *dir) {
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/state.json", dir);
    json_error_t jerr;
    json_t *st = json_load_file(path, 0, &jerr);
    if (!st) {
        ff_error_set(path, NULL, "%s", jerr.text);
        return ff_checkpoint_error(path); /* names the checkpoint before it */
    }
    json_int_t it = json_integer_value(json_object_get(st, "iteration"));
    json_int_t seed = json_integer_value(json_object_get(st, "seed"));
    json_int_t size = json_integer_value(json_object_get(st, "train_size"));
    json_int_t epoch = json_integer_value(json_object_get(st, "epoch")), cursor = json_integer_value(json_object_get(st, "cursor"));
    int rc = 0;
    if (seed != x->run->trainer.seed || size != x->train.n)
        rc = ff_error_set(path, "resume with the same trainer.seed and data, or start a new trainer.out_dir",
                          "the checkpoint was made with seed %lld on %lld prompts; this run has seed %lld and %lld prompts",
                          (long long)seed, (long long)size, (long long)x->run->trainer.seed, (long long)x->train.n);
    else if (it < 0 || epoch < 0 || cursor < 0 || cursor > size) {
        ff_error_set(path, NULL, "bad iteration or data position");
        rc = ff_checkpoint_error(path);
    }
    json_t *kl = json_object_get(st, "kl_coef");
    for (int m = 0; rc == 0 && m < x->n_nodes; m++) {
        ff_node *n = ff_graph_node_mut(x->run->graph, (size_t)m);
        json_t *v = json_object_get(kl, n->name);
        if (n->op == FF_OP_ADVANTAGE && n->kl_penalty && json_is_number(v)) n->kl_ctl.coef = json_number_value(v);
    }
    if (rc == 0) {
        x->iteration = it;
        ff_data_order_free(&x->order);
        rc = ff_data_order_init(&x->order, x->train.n, (uint64_t)x->run->trainer.seed, x->run->data.shuffle, epoch, cursor);
    }
    json_decref(st);
    return rc;
}
