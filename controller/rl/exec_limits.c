/* The limits of a run, checked in setup before any worker starts, so a run that cannot work
 * stops with one message naming the key, the value and the limit instead of growing until the
 * kernel kills it or failing on a worker with an unrelated error:
 *
 *   context    prompt + response tokens fit each used role's model (config.json's
 *              max_position_embeddings); the longest response of any generate node sizes
 *              the rollout's sequence slots (x->max_seq)
 *   memory     the controller's bytes for one iteration's samples (an upper bound of the
 *              sample store and the scheduler's tasks, below) fit half of the memory this
 *              process may use (ff_memory_limit): the workers on the machine hold the models,
 *              and messages to them copy samples on top
 *   workers    the local worker processes fit the machine (ff_controller_local_worker_limit)
 *   kv         each generation engine's KV pool (roles.actor.rollout.kv_memory) holds one group
 *              of n samples at full length
 *   dataset    a batch of prompts fits the training set (after the data is read)
 *
 * Not here: the bounds of single values (int32 range and the like), which dataflow/run_config.c
 * checks where it reads them, and the graph's own checks (dataflow/graph.c). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/modelio.h"
#include "fuseflow/util.h"

/* Per sample and node, the scheduler's task record, its sample list and queue entries
 * (dataflow/sched.c), with allocator overhead: measured about 130 bytes. */
#define SCHED_BYTES_PER_TASK 160

/* file:line of a key when the config (or an override) sets it, else the config's name. */
static const char *where_key(const ex_run *x, const char *key, char *buf, size_t cap) {
    ff_cnode *n = ff_cnode_find(ff_config_root(x->run->cfg), key);
    if (n) return ff_cnode_where(n, buf, cap);
    snprintf(buf, cap, "%s", x->run->path);
    return buf;
}

/* The response length of generate node m and the key that sets it. */
static int64_t response_of(const ex_run *x, const ff_node *n, char *key, size_t cap) {
    if (n->gen.max_tokens > 0) {
        snprintf(key, cap, "graph.%s.max_tokens", n->name);
        return n->gen.max_tokens;
    }
    snprintf(key, cap, "data.max_response_length");
    return x->run->data.max_response_length;
}

static const char *const role_key[FF_ROLE_COUNT] = {NULL, "actor", "critic", "ref", "reward"};

static int check_context(ex_run *x) {
    const ff_run_config *run = x->run;
    const int64_t P = run->data.max_prompt_length;
    int64_t R = 0;
    char rkey[160] = "data.max_response_length";
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *n = ff_graph_node(run->graph, (size_t)m);
        char k[160];
        if (n->op != FF_OP_GENERATE) continue;
        int64_t r = response_of(x, n, k, sizeof k);
        if (r > R) R = r, snprintf(rkey, sizeof rkey, "%s", k);
    }
    if (R == 0) R = run->data.max_response_length;
    x->max_seq = P + R + 1;
    for (int r = FF_ROLE_ACTOR; r < FF_ROLE_COUNT; r++) {
        const ff_role_cfg *rc = &run->roles[r];
        if (!rc->present || !rc->model || !ex_role_used(x, (ff_role)r)) continue;
        char path[FF_PATH_MAX], w[300];
        snprintf(path, sizeof path, "%s/config.json", rc->model);
        ff_model_config mc;
        if (ff_hf_config_load(path, &mc) != 0) return ff_error_wrap("roles.%s.model", role_key[r]);
        if (P + R <= mc.max_position_embeddings) continue;
        char hint[400];
        snprintf(hint, sizeof hint, "lower %s or data.max_prompt_length so that prompt + response <= %d", rkey, mc.max_position_embeddings);
        return ff_error_set(where_key(x, rkey, w, sizeof w), hint,
                            "data.max_prompt_length %" PRId64 " + %s %" PRId64 " = %" PRId64
                            " tokens do not fit the context of roles.%s.model (max_position_embeddings %d in %s)",
                            P, rkey, R, P + R, role_key[r], mc.max_position_embeddings, path);
    }
    return 0;
}

/* Bytes of one iteration's samples in the controller, an upper bound: every sequence column
 * full (prompt + response tokens of 4 bytes; a tokens column twice, for its decoded text),
 * a cell per column, and a scheduler task per node. */
static int check_memory(ex_run *x) {
    const ff_run_config *run = x->run;
    bool filter = ex_has_node(x, FF_OP_FILTER, FF_ROLE_COUNT);
    int64_t prompts = x->batch * (filter ? run->trainer.max_gen_batches : 1); /* dynamic sampling draws more */
    int64_t samples = prompts * x->group_size;
    int64_t seq = x->max_seq - 1;
    int64_t per = (int64_t)x->n_nodes * SCHED_BYTES_PER_TASK;
    for (int c = 0; c < x->n_cols; c++) {
        ff_col_kind k = ff_graph_column(run->graph, (size_t)c)->kind;
        per += (int64_t)sizeof(ex_cell) + (k == FF_COL_TOKENS ? 8 * seq : k == FF_COL_PER_TOKEN ? 4 * seq : 0);
    }
    double need = (double)samples * (double)per; /* may pass 2^64 */
    char what[64], b1[32], b2[32], w[300];
    uint64_t mem = ff_memory_limit(what, sizeof what), allowed = mem / 2;
    if (need <= (double)allowed) return 0;
    ff_fmt_bytes(need >= 1.8e19 ? UINT64_MAX : (uint64_t)need, b1, sizeof b1);
    char hint[300], drawn[160] = "";
    snprintf(hint, sizeof hint, "lower data.train_batch_size or n%s, or the token lengths: about %" PRId64 " samples fit",
             filter ? " (or trainer.max_gen_batches)" : "", (int64_t)(allowed / (uint64_t)per));
    if (filter)
        snprintf(drawn, sizeof drawn, " (data.train_batch_size %" PRId64 " x trainer.max_gen_batches %" PRId64 ": a filter draws more)",
                 x->batch, run->trainer.max_gen_batches);
    return ff_error_set(where_key(x, filter ? "trainer.max_gen_batches" : "data.train_batch_size", w, sizeof w), hint,
                        "%" PRId64 " prompts%s x n %" PRId64 " = %" PRId64 " samples per iteration need about %s in the controller "
                        "(%" PRId64 " bytes each: %d columns of up to %" PRId64 " tokens, %d nodes), more than half of %s (%s)",
                        prompts, drawn, x->group_size, samples, b1, per, x->n_cols, seq, x->n_nodes, what, ff_fmt_bytes(mem, b2, sizeof b2));
}

static int check_workers(ex_run *x) {
    char why[200], w[300];
    int most = ff_controller_local_worker_limit(NULL, why, sizeof why);
    if (x->nranks <= most) return 0;
    return ff_error_set(where_key(x, "roles.actor.workers", w, sizeof w), "give the roles fewer workers",
                        "the run needs %d local worker processes; this machine runs at most %d next to the controller (%s)", x->nranks,
                        most, why);
}

int64_t ex_gen_slots(const ex_run *x) {
    int64_t slots = x->batch * x->group_size / (x->lay[POOL_GEN].dp ? x->lay[POOL_GEN].dp : 1); /* per replica */
    if (slots < 16) slots = 16;
    if (slots > 256) slots = 256;
    if (slots < x->group_size) slots = x->group_size;
    return slots;
}

int64_t ex_gen_kv_pool(const ex_run *x, int32_t *block_rows, int64_t *per_seq) {
    const ff_role_cfg *ac = &x->run->roles[FF_ROLE_ACTOR];
    const int32_t ms = (int32_t)x->max_seq, bs = ac->rollout_kv_block < ms ? (int32_t)ac->rollout_kv_block : ms;
    *block_rows = bs;
    *per_seq = (ms + bs - 1) / bs;
    return ff_rollout_kv_blocks((int32_t)ex_gen_slots(x), ms, bs, ac->rollout_kv_memory);
}

/* A generation engine's KV pool (roles.actor.rollout.kv_memory of every slot at max_seq) holds
 * at least one group of n samples at full length, so that no request is ever too big for it
 * (model/generate.c refuses those at submit, mid-run). */
static int check_kv(ex_run *x) {
    if (!ex_has_node(x, FF_OP_GENERATE, FF_ROLE_COUNT)) return 0;
    const ff_role_cfg *ac = &x->run->roles[FF_ROLE_ACTOR];
    const int64_t slots = ex_gen_slots(x);
    const int32_t ms = (int32_t)x->max_seq;
    int32_t bs;
    int64_t per;
    const int64_t pool = ex_gen_kv_pool(x, &bs, &per);
    if (pool >= x->group_size * per) return 0;
    char w[300], hint[200];
    snprintf(hint, sizeof hint, "raise roles.actor.rollout.kv_memory to at least %.4g (or lower n or the lengths)",
             (double)(x->group_size * per) / (double)(slots * per));
    return ff_error_set(where_key(x, "roles.actor.rollout.kv_memory", w, sizeof w), hint,
                        "roles.actor.rollout.kv_memory %g gives each generation engine %" PRId64 " KV blocks of %d positions (of %" PRId64
                        " for its %" PRId64 " slots at %d positions); one group of n %" PRId64 " samples may fill %" PRId64,
                        ac->rollout_kv_memory, pool, bs, slots * per, slots, ms, x->group_size, x->group_size * per);
}

int ex_check_limits(ex_run *x) { return check_context(x) || check_memory(x) || check_workers(x) || check_kv(x) ? -1 : 0; }

/* The data order hands out every prompt once per epoch (exec_data.c); a batch larger than
 * the training set would hold a prompt twice, from two epochs, in one batch. Dynamic
 * sampling (a filter node) may draw past the end of the set within an iteration: that is the
 * next epoch beginning, as between iterations. */
int ex_check_dataset(ex_run *x) {
    if (x->batch <= x->train.n) return 0;
    char w[300], hint[200];
    snprintf(hint, sizeof hint, "lower data.train_batch_size to at most %" PRId64 ", or add prompts%s", x->train.n,
             x->train.skipped ? " (or raise data.max_prompt_length)" : "");
    return ff_error_set(where_key(x, "data.train_batch_size", w, sizeof w), hint,
                        "data.train_batch_size %" PRId64 " is more than the %" PRId64 " prompts of %s (%" PRId64
                        " skipped as longer than data.max_prompt_length): a batch takes each prompt at most once",
                        x->batch, x->train.n, x->run->data.train_files, x->train.skipped);
}
