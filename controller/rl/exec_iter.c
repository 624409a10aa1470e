/* One iteration of a run: the sample store and the loop that drives the graph's scheduling
 * view (graph.h, ff_sched_*), dispatching each ready task by its op:
 *
 *   generate           per prompt group: the group's sample tasks become one rl.generate
 *                      subtask (n responses sharing one prefill) to any generation worker,
 *                      idempotent, so a dead worker's groups run again elsewhere; a group-level
 *                      generate node (ReMax's greedy baseline) makes one response per group.
 *                      With TP the groups ready in one pass are dealt over the DP replicas,
 *                      one subtask per replica (its TP ranks decode them together, to the end)
 *                      With `migrate` (DP workers): once the open jobs' samples fall to R_t,
 *                      the workers with the fewest hand them over (rl.migrate_out), and each
 *                      migrated job's states go on to a survivor as an rl.migrate_in job
 *   logprob/value/score  one subtask over the task's samples to any worker of the role (with
 *                      TP: to all TP ranks of the least loaded replica; TP rank 0 answers)
 *   reward_fn, advantage, filter  on the controller (registry functions), reward tasks of a
 *                      pass batched into one call (a remote reward server sees them together)
 *   train, sync_weights  exec_train.c
 *
 * Results land in the sample store (a cell per column and sample) and complete the
 * scheduler's tasks, which releases downstream tasks: with `schedule: fused` a finished
 * group is scored while other groups still decode.
 *
 * Not here: the loop over iterations, evaluation (exec_run.c). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

const char *const ex_pool_names[POOL_COUNT] = {"actor", "gen", "critic", "ref", "reward"};

void ex_fail(ex_run *x, const char *fmt, ...) {
    if (x->failed[0]) return;
    char text[2 * sizeof x->failed]; /* then cut in the middle: the hint at the end survives */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ff_text_fit(x->failed, sizeof x->failed, text);
}

void ex_subtask_failed(ex_run *x, const char *fmt, ...) {
    if (x->failed[0] || x->suspect[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->suspect, sizeof x->suspect, fmt, ap);
    va_end(ap);
}

void ex_judge(ex_run *x) {
    if (!x->suspect[0] || x->failed[0]) return;
    /* a dead worker is declared within the controller's timeout (at once for a local process
     * that exited); the failure waits for that */
    int ranks[EX_MAX_RANKS];
    for (int r = 0; r < x->nranks; r++) ranks[r] = r;
    if (ff_controller_confirm_live(x->c, ranks, x->nranks, x->o.worker_timeout_s + 5) < 0)
        ff_warn("run: could not confirm the workers: %s", ff_error_message());
    ex_check_workers(x);
    if (!x->failed[0] && ex_sync_redo(x)) { /* a generation rank lost during a sync: synced again */
        x->suspect[0] = 0;
        return;
    }
    if (!x->failed[0]) ex_fail(x, "%s", x->suspect);
}

void ex_free_buf(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* ---- jobs ------------------------------------------------------------------------------------ */
ex_job *ex_job_new(ex_run *x, ex_job_kind kind, int node) {
    ex_job *j = ff_calloc(1, sizeof *j);
    if (!j) return NULL;
    j->x = x;
    j->kind = kind;
    j->node = node;
    j->iteration = x->cur ? x->cur->it : x->iteration;
    j->group = -1;
    j->pool = j->replica = -1;
    j->pair = -1;
    return j;
}

static void job_free(ex_run *x, ex_job *j) {
    if (j->replica >= 0) x->lay[j->pool].load[j->replica]--;
    free(j->tasks);
    free(j->samples);
    free(j->groups);
    free(j->mig_src);
    free(j);
}

void ex_job_release(ex_run *x, ex_job *j) {
    for (ex_job **pp = &x->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    job_free(x, j);
}

const ff_result *ex_result_of(const ff_result *r, int n) {
    for (int i = 0; i < n; i++)
        if (r[i].status != FF_STATUS_OK) return &r[i];
    return &r[0];
}

const ff_tensor *ex_out_named(const ff_result *r, const char *name) {
    for (int i = 0; i < r->noutputs; i++)
        if (!strcmp(r->outputs[i].name, name)) return &r->outputs[i];
    return NULL;
}

static void gen_done(ex_run *x, ex_job *j, const ff_result *r);
static void score_done(ex_run *x, ex_job *j, const ff_result *r);
static void migrate_out_done(ex_run *x, ex_job *j, const ff_result *r);
static void migrate_in_done(ex_run *x, ex_job *j, const ff_result *r);

static void on_done(ff_controller *c, uint64_t id, const ff_result *r, int n, void *ud) {
    (void)c, (void)id;
    ex_job *j = ud;
    ex_run *x = j->x;
    /* a subtask lost with its worker: the death is the news (it stops the run when the
     * worker held training state), whatever the handler below makes of the loss */
    for (int i = 0; i < n; i++)
        if (r[i].status == FF_STATUS_WORKER_LOST) {
            ex_check_workers(x);
            break;
        }
    if (j->kind == JOB_GEN || j->kind == JOB_SCORE) ex_weights_note(x, j, r, n);
    for (int i = 0; i < n; i++) ex_device_peak_note(x, &r[i]);
    switch (j->kind) {
    case JOB_GEN: gen_done(x, j, ex_result_of(r, n)); break;
    case JOB_SCORE: score_done(x, j, ex_result_of(r, n)); break;
    case JOB_TRAIN: ex_train_done(x, j, r, n); break;
    case JOB_SYNC: ex_sync_done(x, j, r, n); break;
    case JOB_EVAL: ex_eval_done(x, j, r, n); break;
    case JOB_INIT: ex_init_done(x, &r[0]); break;
    case JOB_MIGRATE: migrate_out_done(x, j, ex_result_of(r, n)); break;
    case JOB_MIGRATE_IN: migrate_in_done(x, j, ex_result_of(r, n)); break;
    case JOB_CTL:
        for (int i = 0; i < n; i++)
            if (r[i].status != FF_STATUS_OK)
                ex_subtask_failed(x, "worker %d: %s: %s", r[i].rank, ff_status_name(r[i].status), r[i].error);
        break;
    }
    j->done = true;
    ex_job_release(x, j);
}

uint64_t ex_submit(ex_run *x, ex_job *j, const ff_subtask_spec *spec) {
    uint64_t id = ff_controller_submit(x->c, spec, on_done, j);
    if (!id) {
        ex_fail(x, "submitting %s: %s", spec->kind, ff_error_message());
        job_free(x, j);
        return 0;
    }
    j->id = id;
    j->next = x->jobs;
    x->jobs = j;
    return id;
}

static void check_interrupt(ex_run *x) {
    if (x->o.interrupt && *x->o.interrupt >= 2) ex_fail(x, "interrupted twice: stopped without a checkpoint");
}

int ex_wait_jobs(ex_run *x) {
    while (x->jobs && !x->failed[0]) {
        check_interrupt(x);
        ff_controller_poll(x->c, true);
        ex_check_workers(x);
        ex_judge(x);
        ex_progress(x, false);
    }
    ex_judge(x); /* the last job may have failed */
    return x->failed[0] ? -1 : 0;
}

/* ---- the sample store ------------------------------------------------------------------------ */
static const ff_node *node_of(const ex_run *x, int m) { return ff_graph_node(x->run->graph, (size_t)m); }

static ex_cell *cell(ex_iter *I, int col, int64_t s) { return &I->cells[col][s]; }

static void cell_clear(ex_cell *c) {
    if (c->owned) free(c->p);
    memset(c, 0, sizeof *c);
}

static int cell_set_copy(ex_cell *c, const void *src, int32_t len, size_t elem) {
    cell_clear(c);
    c->p = ff_malloc((size_t)(len > 0 ? len : 1) * elem);
    if (!c->p) return -1;
    if (len) memcpy(c->p, src, (size_t)len * elem);
    c->len = len;
    c->has = c->owned = true;
    return 0;
}

static int grow(ex_run *x, ex_iter *I, int64_t groups) {
    int64_t samples = groups * x->group_size;
    if (groups > I->cap_groups) {
        int64_t cap = I->cap_groups ? I->cap_groups : 16;
        while (cap < groups) cap *= 2;
        int64_t *gr = ff_realloc(I->group_row, (size_t)cap * sizeof *gr);
        if (!gr) return -1;
        I->group_row = gr;
        uint64_t *gj = ff_realloc(I->gen_job, (size_t)cap * sizeof *gj);
        if (!gj) return -1;
        I->gen_job = gj;
        for (int m = 0; m < x->n_nodes; m++) {
            if (!I->pend_count[m]) continue;
            int32_t *pc = ff_realloc(I->pend_count[m], (size_t)cap * sizeof *pc);
            if (!pc) return -1;
            memset(pc + I->cap_groups, 0, (size_t)(cap - I->cap_groups) * sizeof *pc);
            I->pend_count[m] = pc;
        }
        memset(I->gen_job + I->cap_groups, 0, (size_t)(cap - I->cap_groups) * sizeof *gj);
        I->cap_groups = cap;
    }
    if (samples > I->cap_samples) {
        int64_t cap = I->cap_samples ? I->cap_samples : 64;
        while (cap < samples) cap *= 2;
        for (int c = 0; c < x->n_cols; c++) {
            ex_cell *v = ff_realloc(I->cells[c], (size_t)cap * sizeof *v);
            if (!v) return -1;
            memset(v + I->cap_samples, 0, (size_t)(cap - I->cap_samples) * sizeof *v);
            I->cells[c] = v;
            if (I->resp_text[c]) {
                char **t = ff_realloc(I->resp_text[c], (size_t)cap * sizeof *t);
                if (!t) return -1;
                memset(t + I->cap_samples, 0, (size_t)(cap - I->cap_samples) * sizeof *t);
                I->resp_text[c] = t;
            }
        }
        for (int m = 0; m < x->n_nodes; m++) {
            if (!I->pend_task[m]) continue;
            int64_t *pt = ff_realloc(I->pend_task[m], (size_t)cap * sizeof *pt);
            if (!pt) return -1;
            I->pend_task[m] = pt;
        }
        I->cap_samples = cap;
    }
    return 0;
}

/* Groups [g0, g1): draw their prompts and fill the data columns of their samples. */
static int fill_groups(ex_run *x, ex_iter *I, int64_t g0, int64_t g1) {
    if (grow(x, I, g1) != 0) return -1;
    const ff_graph *g = x->run->graph;
    for (int64_t grp = g0; grp < g1; grp++) {
        int64_t row = ff_data_order_next(&x->order);
        I->group_row[grp] = row;
        I->gen_job[grp] = 0;
        I->prompts_drawn++;
        for (int64_t s = grp * x->group_size; s < (grp + 1) * x->group_size; s++) {
            for (int c = 0; c < x->n_cols; c++) {
                const ff_column *col = ff_graph_column(g, (size_t)c);
                if (!col->from_data) continue;
                ex_cell *e = cell(I, c, s);
                cell_clear(e);
                if (c == x->prompt_col) {
                    e->p = x->train.ids[row];
                    e->len = x->train.len[row];
                } else if (c == x->answer_col) {
                    e->p = (void *)x->train.answer[row];
                } else {
                    json_t *v = json_object_get(x->train.rows[row], col->name);
                    e->p = (void *)(json_is_string(v) ? json_string_value(v) : NULL);
                }
                e->has = true;
            }
        }
    }
    I->n_groups = g1;
    return 0;
}

static ex_iter *iter_new(ex_run *x, int64_t it) {
    ex_iter *I = ff_calloc(1, sizeof *I);
    if (!I) return NULL;
    I->it = it;
    I->t0_ns = ff_now_ns();
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *n = node_of(x, m);
        if (n->op == FF_OP_GENERATE && n->gran == FF_GRAN_SAMPLE) {
            I->pend_task[m] = ff_calloc(1, sizeof(int64_t));
            I->pend_count[m] = ff_calloc(1, sizeof(int32_t));
            if (!I->pend_task[m] || !I->pend_count[m]) goto fail;
        }
    }
    for (int c = 0; c < x->n_cols; c++)
        if (ff_graph_column(x->run->graph, (size_t)c)->kind == FF_COL_TOKENS && !(I->resp_text[c] = ff_calloc(1, sizeof(char *))))
            goto fail;
    I->s = ff_sched_new(x->run->graph, x->batch, x->group_size, x->run->trainer.schedule);
    if (!I->s || fill_groups(x, I, 0, x->batch) != 0) goto fail;
    return I;
fail:
    ex_iter_free(x, &I);
    return NULL;
}

void ex_iter_free(ex_run *x, ex_iter **pi) {
    ex_iter *I = *pi;
    if (!I) return;
    ex_train_free(I);
    for (int c = 0; c < EX_MAX_COLS; c++) {
        if (I->cells[c])
            for (int64_t s = 0; s < I->cap_samples; s++) cell_clear(&I->cells[c][s]);
        free(I->cells[c]);
        if (I->resp_text[c])
            for (int64_t s = 0; s < I->cap_samples; s++) free(I->resp_text[c][s]);
        free(I->resp_text[c]);
    }
    for (int m = 0; m < EX_MAX_NODES; m++) {
        free(I->pend_task[m]);
        free(I->pend_count[m]);
        free(I->train[m].m);
    }
    free(I->group_row);
    free(I->gen_job);
    free(I->gen_pend);
    for (int i = 0; i < I->n_mig_hold; i++) job_free(x, I->mig_hold[i]);
    free(I->mig_hold);
    for (int i = 0; i < I->n_mig_pair; i++) {
        ex_mig_pair *p = &I->mig_pair[i];
        free(p->tag), free(p->rlen), free(p->tok), free(p->lp);
    }
    ff_sched_destroy(&I->s);
    free(I);
    *pi = NULL;
    (void)x;
}

/* Decoded text of a tokens column (the reward functions' input): valid UTF-8, with invalid
 * byte sequences (a byte-level model can sample any byte) replaced by U+FFFD, so every
 * reward, a remote one speaking JSON included, gets text. */
static const char *text_of(ex_run *x, ex_iter *I, int col, int64_t s) {
    if (I->resp_text[col][s]) return I->resp_text[col][s];
    ex_cell *e = cell(I, col, s);
    char *t = NULL;
    size_t len;
    if (ex_decode(x->tok, e->p, e->len, &t, &len) != 0) return NULL;
    char *clean = ff_utf8_lossy(t, len, &len);
    free(t);
    I->resp_text[col][s] = clean;
    return clean;
}

/* ---- packing samples for workers ------------------------------------------------------------- */
int ex_pack_samples(ex_run *x, ex_iter *I, const int64_t *samples, int64_t n, int resp_col, ff_input *in, int64_t *shapes) {
    int64_t P = 0, R = 0;
    for (int64_t i = 0; i < n; i++) {
        P += cell(I, x->prompt_col, samples[i])->len;
        R += cell(I, resp_col, samples[i])->len;
    }
    int32_t *p = ff_malloc((size_t)(P ? P : 1) * 4), *pl = ff_malloc((size_t)(n ? n : 1) * 4);
    int32_t *r = ff_malloc((size_t)(R ? R : 1) * 4), *rl = ff_malloc((size_t)(n ? n : 1) * 4);
    if (!p || !pl || !r || !rl) {
        free(p), free(pl), free(r), free(rl);
        return -1;
    }
    int64_t po = 0, ro = 0;
    for (int64_t i = 0; i < n; i++) {
        const ex_cell *pc = cell(I, x->prompt_col, samples[i]), *rc = cell(I, resp_col, samples[i]);
        memcpy(p + po, pc->p, (size_t)pc->len * 4);
        if (rc->len) memcpy(r + ro, rc->p, (size_t)rc->len * 4);
        pl[i] = pc->len, rl[i] = rc->len;
        po += pc->len, ro += rc->len;
    }
    in[0] = (ff_input){.name = FF_RL_T_PROMPT, .dtype = FF_DTYPE_I32, .ndim = 1, .data = p, .free_fn = ex_free_buf};
    in[1] = (ff_input){.name = FF_RL_T_PLEN, .dtype = FF_DTYPE_I32, .ndim = 1, .data = pl, .free_fn = ex_free_buf};
    in[2] = (ff_input){.name = FF_RL_T_RESP, .dtype = FF_DTYPE_I32, .ndim = 1, .data = r, .free_fn = ex_free_buf};
    in[3] = (ff_input){.name = FF_RL_T_RLEN, .dtype = FF_DTYPE_I32, .ndim = 1, .data = rl, .free_fn = ex_free_buf};
    shapes[0] = P, shapes[1] = n, shapes[2] = R, shapes[3] = n;
    for (int i = 0; i < 4; i++) in[i].shape = &shapes[i];
    return 0;
}

/* ---- generation -------------------------------------------------------------------------------- */
static void label_samples(char *buf, size_t cap, const char *node, const int64_t *s, int64_t n) {
    if (n == 1) snprintf(buf, cap, "%s s%" PRId64, node, s[0]);
    else snprintf(buf, cap, "%s s%" PRId64 "-%" PRId64, node, s[0], s[n - 1]);
}

/* One rl.generate subtask for k prompt groups of node m (their scheduler tasks): to any
 * generation worker (replica < 0; one group), or to all TP ranks of a replica. */
static int submit_gen(ex_run *x, ex_iter *I, int m, const int64_t *groups, int64_t k, const int64_t *tasks, int64_t ntasks,
                      int replica) {
    const ff_node *nd = node_of(x, m);
    bool per_group = nd->gran == FF_GRAN_GROUP;
    ex_job *j = ex_job_new(x, JOB_GEN, m);
    if (!j) return -1;
    j->group = groups[0];
    j->ngroups = k;
    j->groups = ff_malloc((size_t)k * sizeof *j->groups);
    j->ntasks = ntasks;
    j->tasks = ff_malloc((size_t)ntasks * sizeof *j->tasks);
    j->nsamples = k * x->group_size;
    j->samples = ff_malloc((size_t)j->nsamples * sizeof *j->samples);
    int64_t P = 0;
    for (int64_t q = 0; q < k; q++) P += x->train.len[I->group_row[groups[q]]];
    int32_t *prompt = ff_malloc((size_t)P * 4), *plen = ff_malloc((size_t)k * 4);
    int64_t *seed = ff_malloc((size_t)k * 8);
    if (!j->groups || !j->tasks || !j->samples || !prompt || !plen || !seed) {
        free(prompt), free(plen), free(seed), free(j->groups), free(j->tasks), free(j->samples), free(j);
        return -1;
    }
    memcpy(j->groups, groups, (size_t)k * sizeof *groups);
    memcpy(j->tasks, tasks, (size_t)ntasks * sizeof *tasks);
    for (int64_t q = 0, off = 0; q < k; q++) {
        int64_t grp = groups[q], row = I->group_row[grp];
        for (int64_t s = 0; s < x->group_size; s++) j->samples[q * x->group_size + s] = grp * x->group_size + s;
        memcpy(prompt + off, x->train.ids[row], (size_t)x->train.len[row] * 4);
        off += x->train.len[row];
        plen[q] = x->train.len[row];
        seed[q] = (int64_t)ff_seed_stream((uint64_t)x->run->trainer.seed, (uint64_t)I->it, (uint64_t)grp);
    }
    int64_t shp_p = P, shp_k = k;
    ff_input in[3] = {
        {.name = FF_RL_T_PROMPT, .dtype = FF_DTYPE_I32, .ndim = 1, .shape = &shp_p, .data = prompt, .free_fn = ex_free_buf},
        {.name = FF_RL_T_PLEN, .dtype = FF_DTYPE_I32, .ndim = 1, .shape = &shp_k, .data = plen, .free_fn = ex_free_buf},
        {.name = "seed", .dtype = FF_DTYPE_I64, .ndim = 1, .shape = &shp_k, .data = seed, .free_fn = ex_free_buf},
    };
    ff_node_sampling sp;
    ff_node_sampling_of(x->run, nd, &sp);
    ff_arg args[8] = {ff_arg_int("n", per_group ? 1 : x->group_size), ff_arg_float("temperature", sp.temperature),
                      ff_arg_float("top_p", sp.top_p), ff_arg_int("top_k", sp.top_k), ff_arg_int("max_new", sp.max_new),
                      ff_arg_float("len_median", sp.len_median), ff_arg_float("len_p99_ratio", sp.len_p99_ratio),
                      ff_arg_int("len_max", sp.len_max)};
    char label[128];
    if (k == 1) snprintf(label, sizeof label, "%s g%" PRId64, nd->name, groups[0]);
    else snprintf(label, sizeof label, "%s g%" PRId64 " +%" PRId64 " groups", nd->name, groups[0], k - 1);
    int nafter;
    const uint64_t *after = ex_trace_deps(x, m, j->samples, j->nsamples, POOL_GEN, NULL, 0, &nafter);
    ff_subtask_spec spec = {.kind = FF_RL_GENERATE, .target = FF_TARGET_ANY, .group = ex_pool_names[POOL_GEN], .args = args,
                            .nargs = 8, .inputs = in, .ninputs = 3, .idempotent = true, .after = after, .nafter = nafter,
                            .label = label};
    if (replica >= 0) ex_target_replica(x, j, POOL_GEN, replica, &spec);
    uint64_t id = ex_submit(x, j, &spec);
    if (!id) return -1;
    if (!per_group && replica < 0) I->gen_job[groups[0]] = id; /* a TP replica's job runs to its end: never cancelled */
    if (!I->st[m].t_first_ns) I->st[m].t_first_ns = ff_now_ns();
    I->st[m].dispatched += k * x->group_size;
    return 0;
}

/* With a TP generation pool: the groups ready in this pass, dealt over the replicas (the
 * least loaded first), one subtask each. */
static int flush_gen(ex_run *x, ex_iter *I) {
    for (int m = 0; m < x->n_nodes && I->n_gen_pend; m++) {
        int64_t k = 0, nt = 0;
        for (int64_t i = 0; i < I->n_gen_pend; i++) k += I->gen_pend[i].node == m;
        if (!k) continue;
        bool per_group = node_of(x, m)->gran == FF_GRAN_GROUP;
        int64_t *groups = ff_malloc((size_t)k * sizeof *groups), *tasks = ff_malloc((size_t)(k * x->group_size) * sizeof *tasks);
        if (!groups || !tasks) {
            free(groups), free(tasks);
            return -1;
        }
        int64_t q = 0;
        for (int64_t i = 0; i < I->n_gen_pend; i++) {
            if (I->gen_pend[i].node != m) continue;
            int64_t g = I->gen_pend[i].group;
            groups[q++] = g;
            if (per_group) tasks[nt++] = I->gen_pend[i].task;
            else
                for (int64_t s = 0; s < x->group_size; s++) tasks[nt++] = I->pend_task[m][g * x->group_size + s];
        }
        int D = x->lay[POOL_GEN].dp, rc = 0;
        int64_t per = per_group ? 1 : x->group_size;
        for (int c = 0, g0 = 0; c < D && rc == 0; c++) {
            int64_t n = k / D + (c < k % D);
            if (n) rc = submit_gen(x, I, m, groups + g0, n, tasks + g0 * per, n * per, ex_pick_replica(x, POOL_GEN));
            g0 += (int)n;
        }
        free(groups), free(tasks);
        if (rc) return -1;
    }
    I->n_gen_pend = 0;
    return 0;
}

static int pend_gen(ex_iter *I, int m, int64_t g, int64_t task) {
    if (I->n_gen_pend == I->cap_gen_pend) {
        int64_t cap = I->cap_gen_pend ? 2 * I->cap_gen_pend : 64;
        ex_gen_pend *v = ff_realloc(I->gen_pend, (size_t)cap * sizeof *v);
        if (!v) return -1;
        I->gen_pend = v;
        I->cap_gen_pend = cap;
    }
    I->gen_pend[I->n_gen_pend++] = (ex_gen_pend){m, g, task};
    return 0;
}

static bool group_alive(ex_run *x, ex_iter *I, int64_t grp) {
    for (int64_t s = grp * x->group_size; s < (grp + 1) * x->group_size; s++)
        if (ff_sched_sample_alive(I->s, s)) return true;
    return false;
}

static void complete_tasks(ex_run *x, ex_iter *I, const ex_job *j) {
    for (int64_t k = 0; k < j->ntasks; k++)
        if (ff_sched_complete(I->s, j->tasks[k]) != 0) ex_fail(x, "scheduler: %s", ff_error_message());
}

static bool job_alive(ex_run *x, ex_iter *I, const ex_job *j) {
    for (int64_t q = 0; q < j->ngroups; q++)
        if (group_alive(x, I, j->groups[q])) return true;
    return false;
}

/* Response src of job j (its index in the job's rl.generate outputs: [k n], or [k] for a
 * group-level node) into the cells of the samples it stands for. */
static int store_response(ex_run *x, ex_iter *I, const ex_job *j, int64_t src, const int32_t *tok, const float *lp, int32_t len) {
    const ff_node *nd = node_of(x, j->node);
    const bool per_group = nd->gran == FF_GRAN_GROUP;
    const int resp_col = nd->out[FF_SLOT_RESPONSE], lp_col = nd->out[FF_SLOT_LOGPROB];
    const int64_t q = per_group ? src : src / x->group_size, k0 = per_group ? 0 : src % x->group_size;
    const int64_t k1 = per_group ? x->group_size : k0 + 1;
    for (int64_t k = k0; k < k1; k++) {
        int64_t s = j->samples[q * x->group_size + k];
        if (cell_set_copy(cell(I, resp_col, s), tok, len, 4) != 0 || (lp_col >= 0 && cell_set_copy(cell(I, lp_col, s), lp, len, 4) != 0))
            return -1;
        cell(I, resp_col, s)->job = j->id;
        if (lp_col >= 0) cell(I, lp_col, s)->job = j->id;
    }
    return 0;
}

/* ---- long-tail migration (docs/run.md "Migration") ------------------------------------------------
 * Once per iteration, when the samples of the open generation jobs fall to R_t of the
 * iteration's, the generation workers with the fewest hand theirs to the migrate_to
 * survivors with the most: per source one move, an rl.migrate_out to it and an rl.migrate_in
 * to its survivor, both on the "migrate" group, whose communicator carries the sequence
 * states from one to the other (never through the controller). A migrated rl.generate comes
 * back with its finished samples and marks for the moved ones; a holder keeps its groups'
 * scheduler tasks until the survivor's result, whose tags name the job and response of each
 * sequence it continued. A move that fails before the states left changes nothing (the source
 * keeps them); a survivor lost after they left loses them, and its holders' groups are
 * generated again from their seeds (idempotent), as a dead source's rl.generate jobs are. */
static bool rank_live(const ex_run *x, int rank) {
    ff_worker_info wi;
    return ff_controller_worker_info(x->c, rank, &wi) == 0 && wi.state == FF_WORKER_LIVE;
}

static int migrate_node(const ex_run *x) {
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *nd = node_of(x, m);
        if (nd->op == FF_OP_GENERATE && nd->gran == FF_GRAN_SAMPLE && nd->gen.migrate != 0) return m;
    }
    return -1;
}

/* The survivor for a source's nmig samples: of the decision's survivors (never a source: a
 * survivor waits in its receive for its source's step boundary, so a source that also
 * received could wait on a peer that waits on it), the one with the fewest samples that has
 * KV slots for them, else the one with the fewest (its import then waits for free slots);
 * -1 when none lives. */
static int pick_survivor(ex_run *x, ex_iter *I, int not, int64_t nmig) {
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++)
        for (int i = 0; i < I->n_mig_to; i++)
            if (I->mig_to[i] != not && rank_live(x, I->mig_to[i]) && (pass == 1 || x->gen_slots - I->mig_load[i] >= nmig) &&
                (best < 0 || I->mig_load[i] < I->mig_load[best]))
                best = i;
    return best;
}

int ex_migrate_group(ex_run *x) {
    x->mig_group = false;
    if (migrate_node(x) < 0 || ex_pool_grouped(x, POOL_GEN)) return 0; /* a TP or PP replica is refused at the first iteration */
    int ranks[EX_MAX_RANKS], n = 0;
    for (int i = 0; i < x->pool_n[POOL_GEN]; i++)
        if (rank_live(x, x->pool_ranks[POOL_GEN][i])) ranks[n++] = x->pool_ranks[POOL_GEN][i];
    if (n < 2) return 0; /* nothing can move */
    /* a move waits for the source's next step boundary; a dead or silent peer fails it within this */
    ff_group_opts go = {.backend = "cpu", .timeout_s = 30};
    if (ff_controller_group_create(x->c, "migrate", ranks, n, &go) != 0) return ff_error_wrap("migration group");
    x->mig_group = true;
    x->mig_rebuild = false;
    return 0;
}

static int member_of(const ex_run *x, int rank) {
    int n = 0;
    const int *r = ff_controller_group_ranks(x->c, "migrate", &n);
    for (int i = 0; r && i < n; i++)
        if (r[i] == rank) return i;
    return -1;
}

/* One move: rl.migrate_in to the survivor (it receives at once, between two of its steps),
 * rl.migrate_out to the source (it sends at its next step boundary). 0 / -1 (the run failed). */
static int submit_move(ex_run *x, ex_iter *I, int m, int src, int dst, int64_t open) {
    const ff_node *nd = node_of(x, m);
    const int ms = member_of(x, src), md = member_of(x, dst);
    if (ms < 0 || md < 0 || I->n_mig_pair == EX_MAX_RANKS) return 0; /* not in the group (it came back later): no move */
    const int pi = I->n_mig_pair++;
    ex_mig_pair *p = &I->mig_pair[pi];
    memset(p, 0, sizeof *p);
    p->src = src, p->dst = dst;
    ex_job *in = ex_job_new(x, JOB_MIGRATE_IN, m), *out = ex_job_new(x, JOB_MIGRATE, m);
    if (!in || !out) {
        free(in), free(out);
        ex_fail(x, "out of memory");
        return -1;
    }
    in->pair = out->pair = pi;
    char label[96];
    snprintf(label, sizeof label, "%s migrated from %d (%" PRId64 ")", nd->name, src, open);
    ff_arg ia[1] = {ff_arg_int("peer", ms)};
    ff_subtask_spec si = {.kind = FF_RL_MIGRATE_IN, .target = FF_TARGET_RANK, .rank = dst, .group = "migrate", .args = ia, .nargs = 1,
                          .label = label};
    if (!(p->in_id = ex_submit(x, in, &si))) {
        free(out);
        return -1;
    }
    const int how = nd->gen.migrate_with == FF_MIGRATE_WITH_KV ? 0 : nd->gen.migrate_with == FF_MIGRATE_WITH_RECOMPUTE ? 1 : 2;
    /* the source, freed, takes inference next: its on-demand weights start loading now */
    ff_arg oa[5] = {ff_arg_int("peer", md), ff_arg_int("how", how), ff_arg_float("link_bps", x->mig_link_bps),
                    ff_arg_float("prefill_tps", x->prefill_tps[dst]), ff_arg_int("prefetch", (int64_t)ex_weights_prefetch_roles(x, src))};
    char olabel[64];
    snprintf(olabel, sizeof olabel, "migrate out to %d (%" PRId64 ")", dst, open);
    ff_subtask_spec so = {.kind = FF_RL_MIGRATE_OUT, .target = FF_TARGET_RANK, .rank = src, .group = "migrate", .args = oa, .nargs = 5,
                          .label = olabel};
    if (!ex_submit(x, out, &so)) return -1;
    I->mig_sources++;
    if (x->o.on_event) {
        ff_exec_event e = {"migrating", I->it, dst, x->c};
        x->o.on_event(x->o.event_ud, &e);
    }
    return 0;
}

/* The stage simulated at the iteration's start on the live generation workers, from the costs
 * measured so far (exec_rollout.c): auto's R_t and survivors, the prediction at the threshold
 * that applies, and the estimates without migration that the metrics carry. Logged at debug. */
static void plan_stage(ex_run *x, ex_iter *I) {
    if (x->gen_node < 0 || ex_pool_grouped(x, POOL_GEN)) return;
    const int m = migrate_node(x);
    const double mig = m >= 0 && node_of(x, m)->gen.migrate > 0 ? node_of(x, m)->gen.migrate : -1;
    int W = 0;
    for (int i = 0; i < x->pool_n[POOL_GEN]; i++) W += rank_live(x, x->pool_ranks[POOL_GEN][i]);
    ff_node_sampling sp;
    ff_node_sampling_of(x->run, node_of(x, x->gen_node), &sp);
    ex_rollout_plan *p = &I->plan;
    /* survivors: migrate_to, or at a fixed threshold the one the KV-room rule keeps when the
     * tail fits it, or for auto the best count */
    const int64_t to = m >= 0 ? node_of(x, m)->gen.migrate_to : 0;
    if (ex_rollout_plan_stage(x, W, I->n_groups * x->group_size, sp.max_new, mig, to > 0 ? to : mig > 0 ? 1 : -1, p) != 0) {
        ff_warn("run: iteration %" PRId64 ": the stage simulation failed: %s", I->it, ff_error_message());
        memset(p, 0, sizeof *p);
        return;
    }
    if (!p->valid) {
        if (m >= 0) ff_debug("run: iteration %" PRId64 ": migrate: no costs measured yet: %s", I->it,
                             mig > 0 ? "the fixed threshold, no prediction" : "auto does not migrate (this iteration measures)");
        return;
    }
    I->mig_predicted_s = p->migrate_s;
    I->mig_rt = mig > 0 ? mig : p->rt; /* the threshold the metrics report, whether or not it is reached */
    if (m >= 0)
        ff_debug("run: iteration %" PRId64 ": migrate %s: R_t %.3g onto %d of %d workers; simulated stage %.3f s against %.3f s "
                 "without migration, %.3f s serial (decode step %.3g + %.3g batch + %.3g context ms, inference %.3g us/token)",
                 I->it, mig > 0 ? "fixed" : "auto", p->rt, p->survivors, W, p->migrate_s, p->fused_s, p->serial_s,
                 p->step_a * 1e3, p->step_b * 1e3, p->step_c * 1e3, p->infer_per_tok * 1e6);
}

/* The decision, once per iteration, when every sample was dispatched and the open jobs' fall
 * to R_t of them. */
static void maybe_migrate(ex_run *x, ex_iter *I) {
    if (I->mig_decided) return;
    const int m = migrate_node(x);
    if (m < 0) {
        I->mig_decided = true;
        return;
    }
    const ff_node *nd = node_of(x, m);
    if (ex_pool_grouped(x, POOL_GEN)) {
        I->mig_decided = true;
        ex_fail(x, "%s: node '%s': migrate needs data-parallel generation workers (tp 1, pp 1): a TP or PP replica decodes in "
                   "lockstep and does not move its samples; write migrate: off or give generation tp 1",
                nd->where, nd->name);
        return;
    }
    const int64_t N = I->n_groups * x->group_size;
    if (I->st[m].dispatched < N) return;
    /* auto: the simulated best (plan_stage), none before anything was measured */
    const double rt = nd->gen.migrate > 0 ? nd->gen.migrate : I->plan.valid ? I->plan.rt : 0;
    if (rt <= 0) {
        I->mig_decided = true;
        return;
    }
    int live[EX_MAX_RANKS], W = 0;
    for (int i = 0; i < x->pool_n[POOL_GEN]; i++)
        if (rank_live(x, x->pool_ranks[POOL_GEN][i])) live[W++] = x->pool_ranks[POOL_GEN][i];
    const int S_min = nd->gen.migrate_to > 0 ? (int)nd->gen.migrate_to
                      : nd->gen.migrate < 0 && I->plan.survivors > 0 ? I->plan.survivors
                                                                      : 1;
    if (W <= S_min) { /* nothing to free */
        I->mig_decided = true;
        return;
    }
    int64_t open[EX_MAX_RANKS] = {0}, total = 0;
    for (ex_job *j = x->jobs; j; j = j->next) {
        if (j->kind != JOB_GEN || j->iteration != I->it) continue;
        int rk = ff_controller_job_rank(x->c, j->id);
        if (rk < 0 || rk >= EX_MAX_RANKS) return; /* still waiting for a worker: not yet */
        int64_t k = j->nsamples;
        open[rk] += k, total += k;
    }
    if (total == 0 || (double)total > rt * (double)N) return;
    I->mig_decided = true;
    I->mig_rt = rt;
    /* survivors: the live ranks with the most samples open (the fewest moves), as many as
     * migrate_to asks or, without it, the fewest whose free KV slots hold the others' */
    for (int a = 1; a < W; a++)
        for (int b = a; b > 0 && open[live[b]] > open[live[b - 1]]; b--) {
            int t = live[b];
            live[b] = live[b - 1], live[b - 1] = t;
        }
    int S = S_min;
    for (;;) {
        int64_t room = 0, rest = 0;
        for (int i = 0; i < W; i++) *(i < S ? &room : &rest) += i < S ? x->gen_slots - open[live[i]] : open[live[i]];
        if (nd->gen.migrate_to > 0 || room >= rest || S + 1 >= W) break;
        S++;
    }
    int64_t room = 0, rest = 0;
    for (int i = 0; i < W; i++) *(i < S ? &room : &rest) += i < S ? x->gen_slots - open[live[i]] : open[live[i]];
    if (S >= W || (nd->gen.migrate_to == 0 && room < rest)) { /* no survivors with room: nothing to free */
        I->mig_decided = true;
        return;
    }
    I->n_mig_to = 0;
    for (int i = 0; i < S; i++) I->mig_to[I->n_mig_to] = live[i], I->mig_load[I->n_mig_to++] = (int)open[live[i]];
    if (x->mig_rebuild && ex_migrate_group(x) != 0) { /* a failed move broke the communicator */
        ff_warn("run: no migration this iteration: %s", ff_error_message());
        return;
    }
    if (!x->mig_group) return;
    I->mig_t0_ns = ff_now_ns();
    for (int i = S; i < W; i++) {
        if (!open[live[i]]) continue;
        int si = pick_survivor(x, I, live[i], open[live[i]]);
        if (si < 0 || I->mig_to[si] == live[i]) continue; /* nowhere to go: it keeps them */
        if (submit_move(x, I, m, live[i], I->mig_to[si], open[live[i]]) != 0) return;
        I->mig_load[si] += (int)open[live[i]];
    }
}

/* Holders of pair pi whose sequences will not come: their groups again from their seeds,
 * every sample (the finished ones come out the same), the holder's tasks handed over. */
static void redo_holders(ex_run *x, ex_iter *I, int pi) {
    for (int i = 0; i < I->n_mig_hold;) {
        ex_job *h = I->mig_hold[i];
        if (h->pair != pi) {
            i++;
            continue;
        }
        I->mig_hold[i] = I->mig_hold[--I->n_mig_hold];
        ex_node_stat *st = &I->st[h->node];
        st->done -= h->nsamples - h->nmig; /* counted again when they come */
        st->tokens -= h->mig_tokens;
        ff_warn("run: the survivor of %" PRId64 " migrated samples of prompt group %" PRId64 " is lost: generating the group again",
                h->nmig, h->group);
        if (submit_gen(x, I, h->node, h->groups, h->ngroups, h->tasks, h->ntasks, -1) != 0) ex_fail(x, "resubmitting generation: %s", ff_error_message());
        st->dispatched -= h->ngroups * x->group_size; /* dispatched once */
        job_free(x, h);
    }
}

/* A move whose two results are in: the survivor's sequences into the cells of the holders'
 * samples, each holder done once all of its moved responses came; without them (the survivor
 * failed or was lost) the holders' groups run again. Tags of no holder (a source whose
 * rl.generate ran again elsewhere, or that kept them after a failed send) are dropped. */
static void finish_pair(ex_run *x, ex_iter *I, int pi) {
    ex_mig_pair *p = &I->mig_pair[pi];
    if (p->finished || !p->out_done || !p->in_done) return;
    p->finished = true;
    if (p->in_ok) {
        int64_t at = 0;
        for (int64_t i = 0; i < p->m; i++) {
            const int32_t len = p->rlen[i];
            for (int k = 0; k < I->n_mig_hold; k++) {
                ex_job *h = I->mig_hold[k];
                if (h->pair != pi || h->mig_from != (uint64_t)p->tag[2 * i]) continue;
                for (int64_t q = 0; q < h->nmig; q++)
                    if (h->mig_src[q] == p->tag[2 * i + 1] && h->mig_src[q] >= 0) {
                        if (store_response(x, I, h, h->mig_src[q], p->tok + at, p->lp + at, len) != 0) ex_fail(x, "out of memory");
                        h->mig_src[q] = -1 - h->mig_src[q]; /* came */
                        break;
                    }
                break;
            }
            at += len;
        }
        const int mn = migrate_node(x);
        if (mn >= 0) I->st[mn].tokens += at;
    }
    for (int i = 0; i < I->n_mig_hold;) {
        ex_job *h = I->mig_hold[i];
        bool all = h->pair == pi && p->in_ok;
        for (int64_t q = 0; all && q < h->nmig; q++) all = h->mig_src[q] < 0;
        if (!all) {
            i++;
            continue;
        }
        I->mig_hold[i] = I->mig_hold[--I->n_mig_hold];
        ex_node_stat *st = &I->st[h->node];
        st->done += h->nmig;
        st->t_last_ns = ff_now_ns();
        complete_tasks(x, I, h);
        if (x->o.on_event) {
            ff_exec_event e = {"generated", I->it, st->done / x->group_size, x->c};
            x->o.on_event(x->o.event_ud, &e);
        }
        job_free(x, h);
    }
    redo_holders(x, I, pi); /* what did not come */
}

/* A generation result's KV use and decode steps ("kv": the steps since that worker's previous
 * result): the iteration keeps the most blocks any rollout held, and sums the steps. */
static void kv_use(ex_iter *I, const ff_result *r) {
    const ff_tensor *kv = ex_out_named(r, FF_RL_T_KV);
    if (!kv || kv->dtype != FF_DTYPE_I64 || ff_tensor_numel(kv) != 5) return;
    const int64_t *v = kv->data;
    if (v[3] >= 0 && v[4] >= 0) I->decode_steps[0] += v[3], I->decode_steps[1] += v[4];
    if (v[1] <= 0 || v[0] < 0 || v[0] > v[1]) return;
    if (v[0] >= I->kv_use[0]) memcpy(I->kv_use, v, sizeof I->kv_use);
}

static void migrate_out_done(ex_run *x, ex_job *j, const ff_result *r) {
    ex_iter *I = x->cur;
    if (!I || j->iteration != I->it || j->pair < 0) return;
    ex_mig_pair *p = &I->mig_pair[j->pair];
    /* a source that did not migrate keeps decoding its samples; a dead one's rl.generate jobs
     * run again elsewhere (idempotent): either way no sample is lost */
    const ff_tensor *mv = r->status == FF_STATUS_OK ? ex_out_named(r, FF_RL_T_MOVED) : NULL;
    if (mv && mv->dtype == FF_DTYPE_I64 && ff_tensor_numel(mv) == 4) {
        const int64_t *v = mv->data;
        if (v[0] > 0) {
            *(v[3] == 1 ? &I->mig_recompute : &I->mig_kv) += 1;
            ff_info("run: iteration %" PRId64 ": worker %d -> %d: %" PRId64 " sequences, %" PRId64 " bytes, %" PRId64
                    " positions, %s (link %.3g MB/s, prefill %.3g tokens/s)",
                    I->it, p->src, p->dst, v[0], v[1], v[2], v[3] == 1 ? "recompute" : "kv rows", x->mig_link_bps * 1e-6, x->prefill_tps[p->dst]);
        }
    } else if (r->status != FF_STATUS_OK && r->status != FF_STATUS_CANCELLED && r->status != FF_STATUS_SHUTDOWN) {
        if (r->status != FF_STATUS_WORKER_LOST) ff_warn("run: worker %d did not migrate its samples: %s: %s", r->rank, ff_status_name(r->status), r->error);
        x->mig_rebuild = true;
    }
    p->out_done = true;
    finish_pair(x, I, j->pair);
}

static void migrate_in_done(ex_run *x, ex_job *j, const ff_result *r) {
    ex_iter *I = x->cur;
    if (!I || j->iteration != I->it || j->pair < 0) return;
    ex_mig_pair *p = &I->mig_pair[j->pair];
    p->in_done = true;
    if (r->status != FF_STATUS_OK) {
        if (r->status != FF_STATUS_CANCELLED && r->status != FF_STATUS_SHUTDOWN) {
            if (r->status != FF_STATUS_WORKER_LOST)
                ff_warn("run: worker %d did not take the samples of worker %d: %s: %s", r->rank, p->src, ff_status_name(r->status), r->error);
            x->mig_rebuild = true;
        }
        finish_pair(x, I, j->pair);
        return;
    }
    const ff_tensor *tag = ex_out_named(r, FF_RL_T_TAG), *xf = ex_out_named(r, FF_RL_T_XFER), *rlen = ex_out_named(r, FF_RL_T_RLEN);
    const ff_tensor *resp = ex_out_named(r, FF_RL_T_RESP), *lp = ex_out_named(r, FF_RL_T_LOGPROB), *stt = ex_out_named(r, FF_RL_T_STATE);
    if (stt) I->mig_via_ctl += (int64_t)stt->nbytes;
    kv_use(I, r);
    int64_t m = tag && tag->ndim == 2 ? tag->shape[0] : -1, total = 0;
    bool ok = m >= 0 && tag->dtype == FF_DTYPE_I64 && xf && xf->dtype == FF_DTYPE_F64 && ff_tensor_numel(xf) == 3 && rlen &&
              rlen->dtype == FF_DTYPE_I32 && ff_tensor_numel(rlen) == m && resp && resp->dtype == FF_DTYPE_I32 && lp &&
              lp->dtype == FF_DTYPE_F32;
    for (int64_t i = 0; ok && i < m; i++) total += ((const int32_t *)rlen->data)[i] > 0 ? ((const int32_t *)rlen->data)[i] : 0;
    if (!ok || total != ff_tensor_numel(resp) || total != ff_tensor_numel(lp)) {
        ex_fail(x, "worker %d sent a migrated generation result without the expected tensors", r->rank);
        return;
    }
    const double *xv = xf->data; /* the link as the survivor measured it: bytes over the receive's seconds */
    if (xv[0] > 0 && xv[1] > 0) x->mig_link_bps = xv[0] / xv[1];
    if (r->start_ns > I->mig_t1_ns) I->mig_t1_ns = r->start_ns;
    p->m = m, p->total = total;
    p->tag = ff_malloc((size_t)(2 * m + 1) * sizeof *p->tag);
    p->rlen = ff_malloc((size_t)(m + 1) * sizeof *p->rlen);
    p->tok = ff_malloc((size_t)(total + 1) * sizeof *p->tok);
    p->lp = ff_malloc((size_t)(total + 1) * sizeof *p->lp);
    if (!p->tag || !p->rlen || !p->tok || !p->lp) {
        ex_fail(x, "out of memory");
        return;
    }
    if (m) { /* none: everything had finished on the source (its tensors may have no data) */
        memcpy(p->tag, tag->data, (size_t)(2 * m) * sizeof *p->tag);
        memcpy(p->rlen, rlen->data, (size_t)m * sizeof *p->rlen);
    }
    if (total) {
        memcpy(p->tok, resp->data, (size_t)total * sizeof *p->tok);
        memcpy(p->lp, lp->data, (size_t)total * sizeof *p->lp);
    }
    p->in_ok = true;
    finish_pair(x, I, j->pair);
}

/* A migrated rl.generate's moved samples (marks > 0 in state_len): a holder takes the job's
 * groups, samples and tasks until its move's survivor returns them. 0 / -1 (the run failed). */
static int hold_moved(ex_run *x, ex_iter *I, ex_job *j, const ff_result *r, const int64_t *marks, int64_t nresp, int64_t moved,
                      int64_t tokens) {
    int pi = -1;
    for (int i = 0; i < I->n_mig_pair; i++)
        if (I->mig_pair[i].src == r->rank) pi = i;
    if (pi < 0) {
        ex_fail(x, "worker %d migrated samples of prompt group %" PRId64 " without a move to a survivor", r->rank, j->group);
        return -1;
    }
    if (I->n_mig_hold == I->cap_mig_hold) {
        int cap = 2 * I->cap_mig_hold + 8;
        ex_job **v = ff_realloc(I->mig_hold, (size_t)cap * sizeof *v);
        if (!v) {
            ex_fail(x, "out of memory");
            return -1;
        }
        I->mig_hold = v, I->cap_mig_hold = cap;
    }
    ex_job *h = ex_job_new(x, JOB_GEN, j->node);
    int64_t *src = ff_malloc((size_t)moved * sizeof *src);
    if (!h || !src) {
        free(h), free(src);
        ex_fail(x, "out of memory");
        return -1;
    }
    h->iteration = j->iteration;
    h->group = j->group, h->ngroups = j->ngroups, h->groups = j->groups, j->groups = NULL;
    h->samples = j->samples, h->nsamples = j->nsamples, j->samples = NULL;
    h->tasks = j->tasks, h->ntasks = j->ntasks, j->tasks = NULL, j->ntasks = 0;
    for (int64_t i = 0, q = 0; i < nresp; i++)
        if (marks[i] > 0) src[q++] = i;
    h->mig_src = src, h->nmig = moved, h->mig_from = j->id, h->mig_tokens = tokens, h->pair = pi;
    I->mig_hold[I->n_mig_hold++] = h;
    if (x->o.on_event) {
        ff_exec_event e = {"migrated", I->it, I->mig_pair[pi].dst, x->c};
        x->o.on_event(x->o.event_ud, &e);
    }
    if (x->tr && ff_controller_trace_flow(x->c, j->id, I->mig_pair[pi].in_id, "migrate") != 0) ff_warn("run: trace: %s", ff_error_message());
    if (I->mig_pair[pi].finished) redo_holders(x, I, pi); /* its move was given up already */
    else finish_pair(x, I, pi);                          /* the survivor may have answered first */
    return 0;
}

static void gen_done(ex_run *x, ex_job *j, const ff_result *r) {
    ex_iter *I = x->cur;
    if (!I || j->iteration != I->it) return; /* a leftover of an abandoned iteration */
    const ff_node *nd = node_of(x, j->node);
    ex_node_stat *st = &I->st[j->node];
    if (j->ngroups == 1 && I->gen_job[j->group] == j->id) I->gen_job[j->group] = 0;
    if (r->status != FF_STATUS_OK) {
        if (!job_alive(x, I, j) || r->status == FF_STATUS_SHUTDOWN) { /* dropped on purpose */
            complete_tasks(x, I, j);
            return;
        }
        ex_subtask_failed(x, "generating prompt group %" PRId64 "%s on worker %d: %s: %s", j->group, j->ngroups > 1 ? " and others" : "",
                          r->rank, ff_status_name(r->status), r->error);
        return;
    }
    const ff_tensor *rlen = ex_out_named(r, FF_RL_T_RLEN), *resp = ex_out_named(r, FF_RL_T_RESP), *lp = ex_out_named(r, FF_RL_T_LOGPROB);
    const ff_tensor *sl = ex_out_named(r, FF_RL_T_STATE_LEN), *stt = ex_out_named(r, FF_RL_T_STATE), *pf = ex_out_named(r, FF_RL_T_PREFILL);
    if (stt) I->mig_via_ctl += (int64_t)stt->nbytes; /* states through the controller: none should come */
    kv_use(I, r);
    if (pf && pf->dtype == FF_DTYPE_F64 && ff_tensor_numel(pf) == 2 && r->rank >= 0 && r->rank < EX_MAX_RANKS &&
        ((const double *)pf->data)[1] > 0)
        x->prefill_tps[r->rank] = ((const double *)pf->data)[0] / ((const double *)pf->data)[1];
    bool per_group = nd->gran == FF_GRAN_GROUP;
    int64_t want = per_group ? 1 : x->group_size, nresp = want * j->ngroups; /* responses in all */
    if (!rlen || !resp || !lp || rlen->dtype != FF_DTYPE_I32 || rlen->shape[0] != nresp ||
        (sl && (sl->dtype != FF_DTYPE_I64 || sl->shape[0] != nresp))) {
        ex_fail(x, "worker %d sent a generation result without the expected tensors", r->rank);
        return;
    }
    const int32_t *rl = rlen->data, *tok = resp->data;
    const int64_t *slv = sl ? sl->data : NULL;
    const float *lpv = lp->data;
    int64_t *at = ff_malloc((size_t)(nresp + 1) * sizeof *at); /* where each response starts */
    if (!at) {
        ex_fail(x, "out of memory");
        return;
    }
    at[0] = 0;
    int64_t moved = 0, moved_bytes = 0;
    for (int64_t i = 0; i < nresp; i++) {
        at[i + 1] = at[i] + (rl[i] > 0 ? rl[i] : 0);
        if (slv && slv[i] > 0) moved++, moved_bytes += slv[i];
    }
    if (at[nresp] != ff_tensor_numel(resp) || at[nresp] != ff_tensor_numel(lp)) {
        free(at);
        ex_fail(x, "worker %d sent a generation result whose lengths do not add up", r->rank);
        return;
    }
    int64_t stored = 0;
    for (int64_t i = 0; i < nresp; i++) {
        if (slv && slv[i] > 0) continue; /* moved on */
        if (store_response(x, I, j, i, tok + at[i], lpv + at[i], rl[i]) != 0) {
            free(at);
            ex_fail(x, "out of memory");
            return;
        }
        stored += per_group ? x->group_size : 1;
    }
    if (j->node == x->gen_node) { /* the stage's measurements (exec_rollout.c) */
        double plen = 0;
        for (int64_t q = 0; q < j->ngroups; q++) plen += (double)x->train.len[I->group_row[j->groups[q]]];
        plen /= (double)(j->ngroups > 0 ? j->ngroups : 1);
        for (int64_t i = 0; i < nresp; i++)
            if (!(slv && slv[i] > 0)) ex_rollout_final(x, plen, rl + i, 1);
        ex_rollout_gen(x, r->rank, r->start_ns, r->end_ns, plen, rl, nresp, moved);
    }
    st->tokens += at[nresp];
    const int64_t tokens = at[nresp];
    free(at);
    st->done += stored;
    st->t_last_ns = ff_now_ns();
    if (moved) {
        I->mig_moved += moved;
        I->mig_bytes += moved_bytes;
        hold_moved(x, I, j, r, slv, nresp, moved, tokens);
        return;
    }
    complete_tasks(x, I, j);
    if (x->o.on_event && !per_group) {
        int64_t groups_done = st->done / x->group_size;
        ff_exec_event e = {"generated", I->it, groups_done, x->c};
        x->o.on_event(x->o.event_ud, &e);
    }
}

/* ---- scoring on workers ------------------------------------------------------------------------ */
static int submit_score(ex_run *x, ex_iter *I, const ff_sched_task *t) {
    const ff_node *nd = node_of(x, t->node);
    ex_job *j = ex_job_new(x, JOB_SCORE, t->node);
    if (!j) return -1;
    j->ntasks = 1;
    j->tasks = ff_malloc(sizeof *j->tasks);
    j->nsamples = t->n_samples;
    j->samples = ff_malloc((size_t)(t->n_samples ? t->n_samples : 1) * sizeof *j->samples);
    if (!j->tasks || !j->samples) {
        free(j->tasks), free(j->samples), free(j);
        return -1;
    }
    j->tasks[0] = t->id;
    memcpy(j->samples, t->samples, (size_t)t->n_samples * sizeof *t->samples);
    ff_input in[4];
    int64_t shapes[4], n = t->n_samples;
    if (ex_pack_samples(x, I, t->samples, n, nd->in[FF_SLOT_RESPONSE], in, shapes) != 0) {
        free(j->tasks), free(j->samples), free(j);
        return -1;
    }
    const char *kind = nd->op == FF_OP_LOGPROB ? FF_RL_LOGPROB : nd->op == FF_OP_VALUE ? FF_RL_VALUE : FF_RL_SCORE;
    int pool = nd->role == FF_ROLE_ACTOR ? POOL_ACTOR : nd->role == FF_ROLE_REF ? POOL_REF
               : nd->role == FF_ROLE_CRITIC                                   ? POOL_CRITIC
                                                                              : POOL_REWARD;
    const char *role = nd->role == FF_ROLE_ACTOR ? "actor" : nd->role == FF_ROLE_REF ? "ref" : "";
    ff_arg args[2] = {ff_arg_int("mb", nd->micro_batch_size), ff_arg_str("role", role)};
    char label[128];
    label_samples(label, sizeof label, nd->name, t->samples, t->n_samples);
    int nafter;
    const uint64_t *after = ex_trace_deps(x, t->node, t->samples, n, pool, NULL, 0, &nafter);
    ff_subtask_spec spec = {.kind = kind, .target = FF_TARGET_ANY, .group = ex_pool_names[pool], .args = args,
                            .nargs = nd->op == FF_OP_LOGPROB ? 2 : 1, .inputs = in, .ninputs = 4, .idempotent = true,
                            .after = after, .nafter = nafter, .label = label};
    if (ex_pool_grouped(x, pool)) ex_target_replica(x, j, pool, ex_pick_replica(x, pool), &spec);
    if (!ex_submit(x, j, &spec)) return -1;
    if (!I->st[t->node].t_first_ns) I->st[t->node].t_first_ns = ff_now_ns();
    I->st[t->node].dispatched += n;
    return 0;
}

static void score_done(ex_run *x, ex_job *j, const ff_result *r) {
    ex_iter *I = x->cur;
    if (!I || j->iteration != I->it) return;
    const ff_node *nd = node_of(x, j->node);
    if (r->status != FF_STATUS_OK) {
        bool any = false;
        for (int64_t k = 0; k < j->nsamples; k++) any |= ff_sched_sample_alive(I->s, j->samples[k]);
        if (!any || r->status == FF_STATUS_SHUTDOWN) {
            complete_tasks(x, I, j);
            return;
        }
        ex_subtask_failed(x, "node '%s' on worker %d: %s: %s", nd->name, r->rank, ff_status_name(r->status), r->error);
        return;
    }
    const char *name = nd->op == FF_OP_LOGPROB ? FF_RL_T_LOGPROB : nd->op == FF_OP_VALUE ? FF_RL_T_VALUES : FF_RL_T_SCORE;
    int slot = nd->op == FF_OP_LOGPROB ? FF_SLOT_LOGPROB : nd->op == FF_OP_VALUE ? FF_SLOT_VALUES : FF_SLOT_SCORE;
    int col = nd->out[slot];
    const ff_tensor *o = ex_out_named(r, name);
    const float *v = o ? o->data : NULL;
    int64_t off = 0, need = 0;
    int resp_col = nd->in[FF_SLOT_RESPONSE];
    for (int64_t k = 0; k < j->nsamples; k++) need += nd->op == FF_OP_SCORE ? 1 : cell(I, resp_col, j->samples[k])->len;
    if (!o || o->dtype != FF_DTYPE_F32 || ff_tensor_numel(o) != need) {
        ex_fail(x, "node '%s': worker %d sent %s with the wrong size", nd->name, r->rank, name);
        return;
    }
    for (int64_t k = 0; k < j->nsamples; k++) {
        int64_t s = j->samples[k];
        if (nd->op == FF_OP_SCORE) {
            ex_cell *e = cell(I, col, s);
            cell_clear(e);
            e->v = v[k];
            e->has = true;
        } else {
            int32_t len = cell(I, resp_col, s)->len;
            if (cell_set_copy(cell(I, col, s), v + off, len, 4) != 0) {
                ex_fail(x, "out of memory");
                return;
            }
            off += len;
        }
        cell(I, col, s)->job = j->id;
    }
    int64_t tokens = off;
    for (int64_t k = 0; k < j->nsamples; k++) tokens += x->train.len[I->group_row[j->samples[k] / x->group_size]];
    ex_rollout_infer(x, j->node, r->rank, r->start_ns, r->end_ns, tokens);
    I->st[j->node].done += j->nsamples;
    I->st[j->node].tokens += off;
    I->st[j->node].t_last_ns = ff_now_ns();
    complete_tasks(x, I, j);
}

/* ---- controller-side nodes ------------------------------------------------------------------- */
/* The scheduler keeps handed-out tasks until they complete: look them up by id. */
typedef struct local_task {
    int64_t id;
    int node;
    int64_t group;
    const int64_t *samples;
    int64_t n;
} local_task;

static int run_reward(ex_run *x, ex_iter *I, int m, local_task *ts, int nts) {
    ff_node *nd = ff_graph_node_mut(x->run->graph, (size_t)m);
    int64_t total = 0;
    for (int i = 0; i < nts; i++) total += ts[i].n;
    ff_reward_item *items = ff_calloc((size_t)(total ? total : 1), sizeof *items);
    float *scores = ff_calloc((size_t)(total ? total : 1), sizeof *scores);
    int64_t *all = ff_malloc((size_t)(total ? total : 1) * sizeof *all);
    int rc = -1;
    if (!items || !scores || !all) goto out;
    int resp_col = nd->in[FF_SLOT_RESPONSE], ans_col = nd->in[FF_SLOT_ANSWER];
    int64_t k = 0;
    for (int i = 0; i < nts; i++)
        for (int64_t q = 0; q < ts[i].n; q++, k++) {
            int64_t s = ts[i].samples[q], row = I->group_row[s / x->group_size];
            all[k] = s;
            items[k].prompt = x->train.prompt[row];
            items[k].response = text_of(x, I, resp_col, s);
            if (!items[k].response) goto out;
            items[k].answer = ans_col >= 0 ? cell(I, ans_col, s)->p : NULL;
            items[k].metadata = ex_dataset_meta(&x->train, row, x->run->data.prompt_key, x->run->data.answer_key);
        }
    int64_t t0 = ff_now_ns();
    if (ff_node_reward(nd, items, (size_t)total, scores) != 0) goto out;
    int64_t t1 = ff_now_ns();
    uint64_t job = ex_trace_local(x, m, t0, t1, all, total);
    int col = nd->out[FF_SLOT_SCORE];
    for (int64_t q = 0; q < total; q++) {
        ex_cell *e = cell(I, col, all[q]);
        cell_clear(e);
        e->v = scores[q];
        e->has = true;
        e->job = job;
    }
    if (!I->st[m].t_first_ns) I->st[m].t_first_ns = t0;
    I->st[m].t_last_ns = t1;
    I->st[m].dispatched += total;
    I->st[m].done += total;
    rc = 0;
out:
    free(items), free(scores), free(all);
    return rc;
}

static int run_advantage(ex_run *x, ex_iter *I, local_task *t) {
    ff_node *nd = ff_graph_node_mut(x->run->graph, (size_t)t->node);
    int64_t n = t->n;
    int rc = -1;
    int32_t *off = ff_malloc((size_t)(n + 1) * sizeof *off), *grp = ff_malloc((size_t)(n ? n : 1) * sizeof *grp);
    float *scores = ff_malloc((size_t)(n ? n : 1) * sizeof *scores), *base = NULL;
    float *cols[4] = {NULL, NULL, NULL, NULL}; /* values, old, ref, - */
    float *adv = NULL, *ret = NULL;
    if (!off || !grp || !scores) goto out;
    off[0] = 0;
    for (int64_t i = 0; i < n; i++) off[i + 1] = off[i] + cell(I, x->resp_col, t->samples[i])->len;
    int64_t T = off[n];
    /* group ids in [0, n): the first sample of each group's index */
    for (int64_t i = 0; i < n; i++) {
        int64_t g = t->samples[i] / x->group_size;
        grp[i] = (int32_t)i;
        for (int64_t q = 0; q < i; q++)
            if (t->samples[q] / x->group_size == g) {
                grp[i] = grp[q];
                break;
            }
        scores[i] = cell(I, nd->in[FF_SLOT_SCORE], t->samples[i])->v;
    }
    if (nd->in[FF_SLOT_BASELINE] >= 0) {
        if (!(base = ff_malloc((size_t)(n ? n : 1) * sizeof *base))) goto out;
        for (int64_t i = 0; i < n; i++) base[i] = cell(I, nd->in[FF_SLOT_BASELINE], t->samples[i])->v;
    }
    const int slots[3] = {FF_SLOT_VALUES, FF_SLOT_OLD_LOGPROB, FF_SLOT_REF_LOGPROB};
    for (int k = 0; k < 3; k++) {
        int col = nd->in[slots[k]];
        if (col < 0) continue;
        if (!(cols[k] = ff_malloc((size_t)(T ? T : 1) * sizeof(float)))) goto out;
        for (int64_t i = 0; i < n; i++) {
            ex_cell *e = cell(I, col, t->samples[i]);
            if (e->len != off[i + 1] - off[i]) {
                ex_fail(x, "node '%s': column '%s' of sample %" PRId64 " has %d values for %d response tokens", nd->name,
                        ff_graph_column(x->run->graph, (size_t)col)->name, t->samples[i], e->len, off[i + 1] - off[i]);
                goto out;
            }
            if (e->len) memcpy(cols[k] + off[i], e->p, (size_t)e->len * sizeof(float));
        }
    }
    adv = ff_malloc((size_t)(T ? T : 1) * sizeof *adv);
    ret = ff_malloc((size_t)(T ? T : 1) * sizeof *ret);
    if (!adv || !ret) goto out;
    ff_node_adv_in ai = {.seqs = {(int32_t)n, off, NULL}, .scores = scores, .values = cols[0], .baseline = base,
                         .old_logp = cols[1], .ref_logp = cols[2], .group = grp};
    double mean_kl = 0;
    int64_t t0 = ff_now_ns();
    if (ff_node_advantage(nd, &ai, adv, ret, &mean_kl) != 0) goto out;
    int64_t t1 = ff_now_ns();
    if (nd->kl_penalty) {
        I->kl_sum[t->node] += mean_kl * (double)T;
        I->kl_w[t->node] += (double)T;
    }
    uint64_t job = ex_trace_local(x, t->node, t0, t1, t->samples, n);
    int ac = nd->out[FF_SLOT_ADVANTAGES], rcol = nd->out[FF_SLOT_RETURNS];
    for (int64_t i = 0; i < n; i++) {
        int32_t len = off[i + 1] - off[i];
        if (cell_set_copy(cell(I, ac, t->samples[i]), adv + off[i], len, 4) != 0 ||
            (rcol >= 0 && cell_set_copy(cell(I, rcol, t->samples[i]), ret + off[i], len, 4) != 0))
            goto out;
        cell(I, ac, t->samples[i])->job = job;
        if (rcol >= 0) cell(I, rcol, t->samples[i])->job = job;
    }
    if (!I->st[t->node].t_first_ns) I->st[t->node].t_first_ns = t0;
    I->st[t->node].t_last_ns = t1;
    I->st[t->node].dispatched += n;
    I->st[t->node].done += n;
    rc = 0;
out:
    free(off), free(grp), free(scores), free(base), free(adv), free(ret);
    for (int k = 0; k < 4; k++) free(cols[k]);
    return rc;
}

static void cancel_dead_groups(ex_run *x, ex_iter *I) {
    for (int64_t g = 0; g < I->n_groups; g++)
        if (I->gen_job[g] && !group_alive(x, I, g)) {
            ff_controller_cancel(x->c, I->gen_job[g]); /* its callback completes the tasks */
            I->gen_job[g] = 0;
        }
}

/* Run the controller-side tasks gathered in one pass: rewards batched per node. */
static int run_local(ex_run *x, ex_iter *I, local_task *lt, int64_t n) {
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *nd = node_of(x, m);
        if (nd->op != FF_OP_REWARD_FN) continue;
        local_task *sel = ff_malloc((size_t)n * sizeof *sel);
        if (!sel) return -1;
        int k = 0;
        for (int64_t i = 0; i < n; i++)
            if (lt[i].node == m) sel[k++] = lt[i];
        int rc = k ? run_reward(x, I, m, sel, k) : 0;
        free(sel);
        if (rc) {
            ex_fail(x, "%s", ff_error_message());
            return -1;
        }
        for (int64_t i = 0; i < n; i++)
            if (lt[i].node == m && ff_sched_complete(I->s, lt[i].id) != 0) return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        const ff_node *nd = node_of(x, lt[i].node);
        if (nd->op == FF_OP_ADVANTAGE) {
            if (run_advantage(x, I, &lt[i]) != 0) {
                if (!x->failed[0]) ex_fail(x, "%s", ff_error_message());
                return -1;
            }
            if (ff_sched_complete(I->s, lt[i].id) != 0) return -1;
        } else if (nd->op == FF_OP_FILTER) {
            float stack[4096], *sc = lt[i].n <= 4096 ? stack : ff_malloc((size_t)lt[i].n * sizeof *sc); /* a group's scores */
            if (!sc) {
                ex_fail(x, "out of memory for the scores of a group of %" PRId64 " samples", lt[i].n);
                return -1;
            }
            for (int64_t q = 0; q < lt[i].n; q++) sc[q] = cell(I, nd->in[FF_SLOT_SCORE], lt[i].samples[q])->v;
            bool keep = ff_node_filter_keep(nd, sc, (size_t)lt[i].n);
            if (sc != stack) free(sc);
            int64_t t0 = ff_now_ns();
            if (ff_sched_complete_filter(I->s, lt[i].id, keep) != 0) return -1;
            I->st[lt[i].node].done += lt[i].n;
            I->st[lt[i].node].dispatched += lt[i].n;
            if (!I->st[lt[i].node].t_first_ns) I->st[lt[i].node].t_first_ns = t0;
            I->st[lt[i].node].t_last_ns = ff_now_ns();
            cancel_dead_groups(x, I);
        }
    }
    return 0;
}

/* ---- dispatch ------------------------------------------------------------------------------------ */
static int dispatch(ex_run *x, ex_iter *I, const ff_sched_task *t, local_task *lt, int64_t *nlt, int64_t cap) {
    const ff_node *nd = node_of(x, t->node);
    switch (nd->op) {
    case FF_OP_GENERATE:
        if (nd->gran == FF_GRAN_GROUP)
            return ex_pool_grouped(x, POOL_GEN) ? pend_gen(I, t->node, t->group, t->id) : submit_gen(x, I, t->node, &t->group, 1, &t->id, 1, -1);
        {
            int64_t s = t->samples[0], g = s / x->group_size;
            I->pend_task[t->node][s] = t->id;
            if (++I->pend_count[t->node][g] < x->group_size) return 0;
            I->pend_count[t->node][g] = 0;
            if (ex_pool_grouped(x, POOL_GEN)) return pend_gen(I, t->node, g, -1); /* dealt over the replicas after the pass */
            int64_t *tasks = ff_malloc((size_t)x->group_size * sizeof *tasks);
            if (!tasks) return -1;
            for (int64_t k = 0; k < x->group_size; k++) tasks[k] = I->pend_task[t->node][g * x->group_size + k];
            int rc = submit_gen(x, I, t->node, &g, 1, tasks, x->group_size, -1);
            free(tasks);
            return rc;
        }
    case FF_OP_LOGPROB:
    case FF_OP_VALUE:
    case FF_OP_SCORE: return submit_score(x, I, t);
    case FF_OP_REWARD_FN:
    case FF_OP_ADVANTAGE:
    case FF_OP_FILTER:
        if (*nlt == cap) return ff_error_set("executor", NULL, "too many controller-side tasks at once");
        lt[(*nlt)++] = (local_task){t->id, t->node, t->group, t->samples, t->n_samples};
        return 0;
    case FF_OP_TRAIN: return ex_train_start(x, I, t);
    case FF_OP_SYNC_WEIGHTS: return ex_sync_start(x, I, t);
    default: return ff_error_set(nd->where, NULL, "node '%s': op %s is not executed", nd->name, ff_op_name(nd->op));
    }
}

/* Dynamic sampling: draw more prompts while the scheduler wants groups and the budget
 * (trainer.max_gen_batches x train_batch_size prompts per iteration) allows. */
static int refill(ex_run *x, ex_iter *I) {
    int64_t want = ff_sched_groups_wanted(I->s);
    if (want <= 0) return 0;
    int64_t budget = x->run->trainer.max_gen_batches * x->batch - I->prompts_drawn;
    if (budget <= 0) {
        ff_sched_source_exhausted(I->s);
        return 1;
    }
    int64_t k = want < budget ? want : budget;
    int64_t first = ff_sched_add_groups(I->s, k);
    if (first < 0 || fill_groups(x, I, first, first + k) != 0) return -1;
    return 1;
}

int ex_iteration(ex_run *x, int64_t it) {
    ex_iter *I = iter_new(x, it);
    if (!I) {
        ex_fail(x, "iteration %" PRId64 ": %s", it, ff_error_message());
        return -1;
    }
    x->cur = I;
    plan_stage(x, I);
    int64_t cap = 4096;
    local_task *lt = ff_malloc((size_t)cap * sizeof *lt);
    if (!lt) {
        ex_fail(x, "out of memory");
        return -1;
    }
    int interrupted = 0;
    while (!x->failed[0]) {
        const ff_sched_task *t;
        int rc;
        int64_t nlt = 0;
        while ((rc = ff_sched_next(I->s, &t)) == 1)
            if (dispatch(x, I, t, lt, &nlt, cap) != 0) {
                ex_fail(x, "%s", ff_error_message());
                break;
            }
        if (!x->failed[0] && flush_gen(x, I) != 0) ex_fail(x, "%s", ff_error_message());
        if (x->failed[0]) break;
        if (!I->announced && x->o.on_event) { /* the first wave is out: generation runs */
            I->announced = true;
            ff_exec_event e = {"generating", I->it, I->n_groups, x->c};
            x->o.on_event(x->o.event_ud, &e);
        }
        if (nlt) {
            if (run_local(x, I, lt, nlt) != 0 && !x->failed[0]) ex_fail(x, "%s", ff_error_message());
            continue;
        }
        int r = refill(x, I); /* the scheduler may be stuck only for want of groups */
        if (r < 0) {
            ex_fail(x, "%s", ff_error_message());
            break;
        }
        if (r > 0) continue;
        if (rc < 0) {
            ex_fail(x, "scheduler: %s", ff_error_message());
            break;
        }
        if (ff_sched_finished(I->s)) break;
        if (x->o.interrupt && *x->o.interrupt && !I->training_started) {
            interrupted = 1; /* nothing trained yet: the weights are those of the last iteration */
            break;
        }
        maybe_migrate(x, I);
        if (x->failed[0]) break;
        ff_controller_poll(x->c, true);
        ex_check_workers(x);
        ex_judge(x);
        check_interrupt(x);
        ex_progress(x, false);
    }
    ex_judge(x);
    free(lt);
    if (interrupted || x->failed[0]) {
        /* abandon the iteration: cancel what runs and let the callbacks drain */
        for (ex_job *j = x->jobs; j; j = j->next)
            if (j->iteration == it) ff_controller_cancel(x->c, j->id);
        x->cur = NULL;
        while (x->jobs) {
            ff_controller_poll(x->c, true);
            if (ff_controller_jobs_outstanding(x->c) == 0) break;
        }
        ex_iter_free(x, &I);
        return interrupted ? 1 : -1;
    }
    return 0;
}

/* ---- the iteration's metrics --------------------------------------------------------------------- */
void ex_device_peak_note(ex_run *x, const ff_result *r) {
    const ff_tensor *t = r->status == FF_STATUS_OK ? ex_out_named(r, FF_RL_T_DEVICE_PEAK) : NULL;
    if (!t || t->dtype != FF_DTYPE_I64 || ff_tensor_numel(t) != FF_RL_DP_N || r->rank < 0 || r->rank >= x->nranks) return;
    const int64_t *d = t->data, peak = d[FF_RL_DP_PEAK], held = d[FF_RL_DP_HELD], least = ff_rl_device_least_free(d);
    if (peak > x->device_peak[r->rank]) x->device_peak[r->rank] = peak;
    int64_t *mf = &x->device_min_free[r->rank];
    if (least >= 0 && (*mf < 0 || least < *mf)) *mf = least;
    if (!x->tr) return;
    /* --trace: the worker's device memory as a counter on its process, at each result */
    const ff_arg v[2] = {ff_arg_float("peak since its last result", (double)peak / 1048576.0),
                         ff_arg_float("held at the result", (double)held / 1048576.0)};
    if (ff_controller_trace_counter(x->c, r->rank, "device memory (MiB)", ff_now_ns(), v, 2) != 0)
        ff_warn("run: trace: %s", ff_error_message());
}

/* "device_memory": [{"rank", "peak_bytes", "capacity_bytes"}, ...], the ranks on a device that
 * reported since the previous metrics line; their peaks start again. */
static void device_metrics(ex_run *x, json_t *m) {
    json_t *a = NULL;
    for (int r = 0; r < x->nranks; r++) {
        if (x->device_peak[r] <= 0) continue;
        if (!a && !(a = json_array())) return;
        json_t *e = json_pack("{s:i, s:I, s:I}", "rank", r, "peak_bytes", (json_int_t)x->device_peak[r], "capacity_bytes",
                              (json_int_t)x->loaded[r].mem[FF_RL_MEM_DEV_CAP]);
        if (e && x->device_min_free[r] >= 0) json_object_set_new(e, "min_free_bytes", json_integer((json_int_t)x->device_min_free[r]));
        json_array_append_new(a, e);
        x->device_peak[r] = 0;
        x->device_min_free[r] = -1;
    }
    if (a) json_object_set_new(m, "device_memory", a);
}

void ex_iter_metrics(ex_run *x, json_t *m) {
    ex_iter *I = x->cur;
    double rsum = 0, lsum = 0, acc = 0, klsum = 0, klw = 0, n = 0;
    int old_col = x->logprob_col, ref_col = -1;
    for (int k = 0; k < x->n_nodes; k++) {
        const ff_node *nd = node_of(x, k);
        if (nd->op == FF_OP_LOGPROB && nd->role == FF_ROLE_REF) ref_col = nd->out[FF_SLOT_LOGPROB];
    }
    int64_t N = I->n_groups * x->group_size;
    ff_reward_item *items = ff_calloc((size_t)(N ? N : 1), sizeof *items);
    float *hit = ff_calloc((size_t)(N ? N : 1), sizeof *hit);
    int64_t ni = 0;
    for (int64_t s = 0; s < N; s++) {
        if (!ff_sched_sample_alive(I->s, s)) continue;
        n++;
        if (x->score_col >= 0) rsum += cell(I, x->score_col, s)->v;
        ex_cell *r = cell(I, x->resp_col, s);
        lsum += r->len;
        if (old_col >= 0 && ref_col >= 0) {
            const float *a = cell(I, old_col, s)->p, *b = cell(I, ref_col, s)->p;
            for (int32_t q = 0; q < r->len; q++) klsum += (double)a[q] - (double)b[q];
            klw += r->len;
        }
        int64_t row = I->group_row[s / x->group_size];
        if (items && x->train.answer[row]) {
            items[ni].prompt = x->train.prompt[row];
            items[ni].response = text_of(x, I, x->resp_col, s);
            items[ni].answer = x->train.answer[row];
            if (items[ni].response) ni++;
        }
    }
    if (items && hit && ni && ff_reward_score(x->exact, items, (size_t)ni, hit) == 0)
        for (int64_t q = 0; q < ni; q++) acc += hit[q] >= 1.0f; /* a perfect answer (trainer.acc_reward) */
    free(items), free(hit);
    json_object_set_new(m, "iteration", json_integer(I->it));
    json_object_set_new(m, "samples", json_integer((json_int_t)n));
    if (x->run->trainer.max_gen_batches > 0 && I->prompts_drawn != x->batch)
        json_object_set_new(m, "prompts_drawn", json_integer(I->prompts_drawn));
    if (x->score_col >= 0) json_object_set_new(m, "reward_mean", json_real(n ? rsum / n : 0));
    if (ni) json_object_set_new(m, "acc", json_real(acc / (double)ni));
    json_object_set_new(m, "response_length", json_real(n ? lsum / n : 0));
    /* the weight sync: bytes received over the ranks, the most one rank received, and the
     * ranks' time together (a local copy moves none) */
    if (ex_has_node(x, FF_OP_SYNC_WEIGHTS, FF_ROLE_COUNT)) {
        json_t *ws = json_object();
        json_object_set_new(ws, "bytes", json_integer((json_int_t)I->sync_bytes));
        json_object_set_new(ws, "bytes_max_rank", json_integer((json_int_t)I->sync_bytes_max));
        json_object_set_new(ws, "time_s", json_real((double)I->sync_ns * 1e-9));
        if (I->sync_is_delta) { /* roles.actor.rollout.sync_delta: the share of compared elements that changed */
            json_t *d = json_object();
            json_object_set_new(d, "changed_fraction", json_real(I->sync_delta[0] ? (double)I->sync_delta[1] / (double)I->sync_delta[0] : 1.0));
            json_object_set_new(d, "bytes_saved", json_integer((json_int_t)I->sync_delta[2]));
            json_object_set_new(ws, "delta", d);
        }
        json_object_set_new(m, "weight_sync", ws);
    }
    ex_weights_metrics(x, I, m);
    if (I->off_seen) { /* roles.actor.offload: what left the backend for generation and came back */
        json_t *o = json_object();
        json_object_set_new(o, "bytes", json_integer((json_int_t)I->off_bytes[0]));
        json_object_set_new(o, "grad_bytes", json_integer((json_int_t)I->off_grads[0]));
        json_object_set_new(o, "time_s", json_real(I->off_s[0]));
        json_object_set_new(o, "reload_bytes", json_integer((json_int_t)I->off_bytes[1]));
        json_object_set_new(o, "reload_time_s", json_real(I->off_s[1]));
        json_object_set_new(m, "offload", o);
    }
    if (migrate_node(x) >= 0) { /* long-tail migration: what moved, from the decision to the last move's start */
        json_t *mg = json_object();
        json_object_set_new(mg, "moved", json_integer((json_int_t)I->mig_moved));
        json_object_set_new(mg, "bytes", json_integer((json_int_t)I->mig_bytes));
        json_object_set_new(mg, "time_s", json_real(I->mig_moved && I->mig_t1_ns > I->mig_t0_ns ? (double)(I->mig_t1_ns - I->mig_t0_ns) * 1e-9 : 0));
        json_object_set_new(mg, "threshold", json_real(I->mig_rt));
        /* the simulated stage at the threshold used, and what it saves against the simulated
         * stage without migration (null before anything was measured) */
        json_object_set_new(mg, "predicted_s", I->plan.valid ? json_real(I->mig_predicted_s) : json_null());
        json_object_set_new(mg, "saved_s", I->plan.valid ? json_real(I->plan.fused_s - I->mig_predicted_s) : json_null());
        json_object_set_new(mg, "sources", json_integer(I->mig_sources));
        /* how each move went (migrate_with, auto: the cost model's pick), and the state bytes
         * that reached the controller (0: they went from worker to worker) */
        json_object_set_new(mg, "kv", json_integer((json_int_t)I->mig_kv));
        json_object_set_new(mg, "recompute", json_integer((json_int_t)I->mig_recompute));
        json_object_set_new(mg, "via_controller", json_integer((json_int_t)I->mig_via_ctl));
        json_object_set_new(m, "migrate", mg);
    }
    if (I->kv_use[1] > 0) { /* the rollouts' paged KV cache (roles.actor.rollout.kv_memory sizes the pool) */
        json_t *kv = json_object();
        json_object_set_new(kv, "peak_blocks", json_integer((json_int_t)I->kv_use[0]));
        json_object_set_new(kv, "pool_blocks", json_integer((json_int_t)I->kv_use[1]));
        json_object_set_new(kv, "block_positions", json_integer((json_int_t)I->kv_use[2]));
        json_object_set_new(kv, "peak_share", json_real((double)I->kv_use[0] / (double)I->kv_use[1]));
        json_object_set_new(m, "rollout_kv", kv);
    }
    if (I->decode_steps[0] + I->decode_steps[1] > 0) { /* decode steps as CUDA graphs (docs/cuda.md "Graphs") */
        json_t *ds = json_object();
        json_object_set_new(ds, "graph_steps", json_integer((json_int_t)I->decode_steps[0]));
        json_object_set_new(ds, "eager_steps", json_integer((json_int_t)I->decode_steps[1]));
        json_object_set_new(m, "rollout_decode", ds);
    }
    if (klw > 0) json_object_set_new(m, "kl", json_real(klsum / klw));
    device_metrics(x, m);
    for (int k = 0; k < x->n_nodes; k++) {
        ff_node *nd = ff_graph_node_mut(x->run->graph, (size_t)k);
        if (nd->op == FF_OP_ADVANTAGE && nd->kl_penalty) {
            json_object_set_new(m, "kl_penalty", json_real(I->kl_w[k] > 0 ? I->kl_sum[k] / I->kl_w[k] : 0));
            json_object_set_new(m, "kl_coef", json_real(nd->kl_ctl.coef));
        }
    }
    ex_train_metrics(x, I, m);
}

void ex_iter_finish(ex_run *x) {
    ex_iter *I = x->cur;
    ex_rollout_finish(x, I);
    /* adaptive KL controllers move once per iteration, by the batch's mean KL */
    for (int k = 0; k < x->n_nodes; k++) {
        ff_node *nd = ff_graph_node_mut(x->run->graph, (size_t)k);
        if (nd->op == FF_OP_ADVANTAGE && nd->kl_penalty && I->kl_w[k] > 0)
            ff_node_kl_ctl_update(nd, I->kl_sum[k] / I->kl_w[k], I->n_groups * x->group_size);
    }
}

/* The samples of the iteration, one JSON line each (--dump-samples). */
void ex_dump_samples(ex_run *x, FILE *f) {
    ex_iter *I = x->cur;
    for (int64_t s = 0; s < I->n_groups * x->group_size; s++) {
        if (!ff_sched_sample_alive(I->s, s)) continue;
        int64_t g = s / x->group_size, row = I->group_row[g];
        json_t *o = json_object();
        json_object_set_new(o, "iteration", json_integer(I->it));
        json_object_set_new(o, "group", json_integer(g));
        json_object_set_new(o, "sample", json_integer(s % x->group_size));
        json_object_set_new(o, "row", json_integer(row));
        json_object_set_new(o, "prompt", json_string(x->train.prompt[row]));
        const char *t = text_of(x, I, x->resp_col, s);
        json_object_set_new(o, "response", json_string(t ? t : ""));
        json_object_set_new(o, "response_tokens", json_integer(cell(I, x->resp_col, s)->len));
        if (x->score_col >= 0) json_object_set_new(o, "score", json_real(cell(I, x->score_col, s)->v));
        char *line = json_dumps(o, JSON_COMPACT);
        if (line) fprintf(f, "%s\n", line);
        free(line);
        json_decref(o);
    }
}

/* ---- progress ------------------------------------------------------------------------------------ */
void ex_progress(ex_run *x, bool force) {
    if (!x->tty || x->o.progress == 0) return;
    int64_t now = ff_now_ns();
    if (!force && now - x->progress_ns < 100000000LL) return;
    x->progress_ns = now;
    char line[512];
    int off = 0;
    ex_iter *I = x->cur;
    if (!I) {
        if (x->eval_total > 0) {
            snprintf(line, sizeof line, "\r\033[Kiter %" PRId64 " | eval %" PRId64 "/%" PRId64 " held-out prompts", x->iteration,
                     x->eval_done, x->eval_total);
            fputs(line, x->out);
            fflush(x->out);
        }
        return;
    }
    off += snprintf(line + off, sizeof line - (size_t)off, "\r\033[Kiter %" PRId64 "/%" PRId64, I->it, x->run->trainer.steps);
    int64_t N = I->n_groups * x->group_size;
    const int *order = ff_graph_order(x->run->graph);
    int shown = 0;
    for (int k = 0; k < x->n_nodes && shown < 3; k++) {
        int m = order[k];
        const ff_node *nd = node_of(x, m);
        if (nd->op == FF_OP_SYNC_WEIGHTS) continue;
        bool train = nd->op == FF_OP_TRAIN;
        if (train ? (I->train[m].active && I->train[m].pending == 0) : I->st[m].done >= N) continue;
        if (train && I->train[m].active)
            off += snprintf(line + off, sizeof line - (size_t)off, " | %s %d/%d steps", nd->name,
                            I->train[m].n_steps - I->train[m].pending / (I->train[m].n_ranks ? I->train[m].n_ranks : 1),
                            I->train[m].n_steps);
        else if (!train)
            off += snprintf(line + off, sizeof line - (size_t)off, " | %s %" PRId64 "/%" PRId64, nd->name, I->st[m].done, N);
        else
            off += snprintf(line + off, sizeof line - (size_t)off, " | %s waiting", nd->name);
        shown++;
    }
    if (x->iter_time_avg > 0) {
        double left = x->iter_time_avg * (double)(x->run->trainer.steps - I->it + 1) - (double)(now - I->t0_ns) * 1e-9;
        if (left < 0) left = 0;
        off += snprintf(line + off, sizeof line - (size_t)off, " | ETA %dm%02ds", (int)(left / 60), (int)left % 60);
    }
    fputs(line, x->out);
    fflush(x->out);
}

/* ---- workers that die ---------------------------------------------------------------------------- */
void ex_check_workers(ex_run *x) {
    int dead = ff_controller_count_workers(x->c, FF_WORKER_DEAD);
    if (dead == x->known_dead) return;
    x->known_dead = dead;
    for (int r = 0; r < x->nranks; r++) {
        ff_worker_info wi;
        if (ff_controller_worker_info(x->c, r, &wi) != 0 || wi.state != FF_WORKER_DEAD) continue;
        ex_trace_lost(x, r, wi.dead_reason[0] ? wi.dead_reason : "gone");
        unsigned roles = x->rank_roles[r];
        if (roles & (FF_RL_ACTOR | FF_RL_CRITIC)) { /* ff_exec_run adds where to resume from */
            ex_fail(x, "worker %d (pid %lld) died (%s) holding the %s's training state", r, (long long)wi.pid,
                    wi.dead_reason[0] ? wi.dead_reason : "gone", (roles & FF_RL_ACTOR) ? "actor" : "critic");
            return;
        }
    }
    /* a TP replica that lost a rank cannot run its model (rebuilding it is not done yet) */
    for (int r = 0; r < x->nranks; r++) {
        ff_worker_info wi;
        if (ff_controller_worker_info(x->c, r, &wi) != 0 || wi.state != FF_WORKER_DEAD || !ex_pool_grouped(x, x->rank_pool[r])) continue;
        ex_fail(x, "worker %d (pid %lld) died (%s): it was a TP or PP rank of the %s, whose replica cannot run without it", r, (long long)wi.pid,
                wi.dead_reason[0] ? wi.dead_reason : "gone", ex_pool_names[x->rank_pool[r]]);
        return;
    }
    /* a stateless worker: its idempotent subtasks go to the others of its group */
    for (int p = 0; p < POOL_COUNT; p++) {
        if (!x->pool_n[p]) continue;
        int live = 0;
        for (int i = 0; i < x->pool_n[p]; i++) {
            ff_worker_info wi;
            if (ff_controller_worker_info(x->c, x->pool_ranks[p][i], &wi) == 0 && wi.state == FF_WORKER_LIVE) live++;
        }
        if (!live) {
            ex_fail(x, "no live worker is left for the %s (all %d died)", ex_pool_names[p], x->pool_n[p]);
            return;
        }
    }
    if (x->tty) fputs("\r\033[K", x->out);
    fprintf(x->out, "run: a worker died; its subtasks go to the other workers of its group\n");
}
