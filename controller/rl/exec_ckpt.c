/* Checkpoints of a run and its metrics file.
 *
 * OUT/checkpoints/step-NNNNNNNN/ holds everything needed to continue exactly:
 *   actor/, critic/            model folders of the trained roles (loadable by every command)
 *   actor.optim.safetensors    AdamW state (moments and the step count), critic's likewise
 *   state.json                 iteration, seed, data order (epoch, cursor), adaptive KL
 *                              coefficients, the training set's size
 * The folder is staged as step-N.tmp-PID (the trained roles' DP rank 0 workers write their
 * parts into it, the controller writes state.json) and swapped in whole (ff_atomic_dir), so
 * a crash never leaves half a checkpoint. The two newest are kept.
 *
 * Everything else a run draws from is a function of (seed, iteration, ...): sampling seeds,
 * mini-batch shuffles, the data order per epoch; so this is the whole state.
 *
 * Not here: when to save (exec_run.c). */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/modelio.h"
#include "fuseflow/util.h"

int ex_ckpt_find(const char *out_dir, char *dir, size_t cap, int64_t *iteration) {
    int64_t *steps;
    int n = ff_checkpoint_steps(out_dir, &steps);
    if (n == 0) return -1; /* steps is NULL */
    *iteration = steps[n - 1];
    snprintf(dir, cap, "%s/checkpoints/step-%08" PRId64, out_dir, steps[n - 1]);
    free(steps);
    return 0;
}

static void prune(const char *out_dir, int keep) {
    int64_t *steps;
    int n = ff_checkpoint_steps(out_dir, &steps);
    for (int i = 0; i < n - keep; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/checkpoints/step-%08" PRId64, out_dir, steps[i]);
        ff_remove_tree(dir);
    }
    free(steps);
}

int ex_ckpt_save(ex_run *x, int64_t iteration, const ex_order *order_at) {
    char dir[4096], tmp[4200], abs_out[PATH_MAX];
    if (!realpath(x->run->trainer.out_dir, abs_out)) return ff_error_set(x->run->trainer.out_dir, NULL, "the output folder is gone");
    snprintf(dir, sizeof dir, "%s/checkpoints/step-%08" PRId64, abs_out, iteration);
    if (ff_atomic_dir_begin(dir, tmp, sizeof tmp) != 0) return -1;
    const struct {
        ff_role role;
        int pool;
        const char *name;
    } parts[2] = {{FF_ROLE_ACTOR, POOL_ACTOR, "actor"}, {FF_ROLE_CRITIC, POOL_CRITIC, "critic"}};
    for (int i = 0; i < 2; i++) {
        if (!ex_has_node(x, FF_OP_TRAIN, parts[i].role) || !x->pool_n[parts[i].pool]) continue;
        ex_job *j = ex_job_new(x, JOB_CTL, -1);
        if (!j) goto fail;
        ff_arg args[2] = {ff_arg_str("role", parts[i].name), ff_arg_str("dir", tmp)};
        char label[64];
        snprintf(label, sizeof label, "save %s", parts[i].name);
        ff_subtask_spec spec = {.kind = FF_RL_SAVE, .target = FF_TARGET_RANK, .rank = x->pool_ranks[parts[i].pool][0],
                                .args = args, .nargs = 2, .label = label};
        if (!ex_submit(x, j, &spec)) goto fail;
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
    char path[4300];
    snprintf(path, sizeof path, "%s/state.json", tmp);
    int rc = text ? ff_write_file_atomic(path, text, strlen(text)) : -1;
    free(text);
    if (rc != 0) goto fail;
    if (ff_atomic_dir_commit(tmp, dir) != 0) return -1;
    snprintf(x->last_ckpt, sizeof x->last_ckpt, "%s", dir);
    x->last_ckpt_iter = iteration;
    prune(abs_out, 2);
    return 0;
fail:
    ff_atomic_dir_abort(tmp);
    return ff_error_wrap("checkpoint %s", dir);
}

int ex_ckpt_load_state(ex_run *x, const char *dir) {
    char path[4200];
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
        ex_order_free(&x->order);
        rc = ex_order_init(&x->order, x->train.n, (uint64_t)x->run->trainer.seed, x->run->data.shuffle, epoch, cursor);
    }
    json_decref(st);
    return rc;
}

/* ---- metrics.jsonl ------------------------------------------------------------------------------ */
int ex_metrics_truncate(const char *path, int64_t iteration) {
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) {
        ff_error_clear();
        return 0;
    }
    char *keep = ff_malloc(len + 1);
    if (!keep) {
        free(text);
        return -1;
    }
    size_t kn = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line + 1) : strlen(line);
        json_error_t e;
        json_t *o = json_loadb(line, n, 0, &e);
        if (o && json_integer_value(json_object_get(o, "iteration")) <= iteration) {
            memcpy(keep + kn, line, n);
            kn += n;
        }
        json_decref(o);
        line += n;
    }
    int rc = ff_write_file_atomic(path, keep, kn);
    free(text);
    free(keep);
    return rc;
}

int ex_metrics_append(ex_run *x, json_t *m) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", x->run->trainer.out_dir);
    FILE *f = fopen(path, "a");
    if (!f) return ff_error_set(path, NULL, "cannot append metrics");
    char *line = json_dumps(m, JSON_COMPACT | JSON_REAL_PRECISION(10));
    if (line) fprintf(f, "%s\n", line);
    free(line);
    int rc = fclose(f);
    return rc ? ff_error_set(path, NULL, "cannot write metrics") : 0;
}
