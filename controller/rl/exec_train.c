/* Training and weight sync within an iteration.
 *
 * A train node is one barrier task over the whole batch. Per epoch its samples are shuffled
 * (a function of the run seed, the iteration, the node and the epoch) and cut into
 * mini-batches of mini_batch_size prompts x n responses; each mini-batch is planned with
 * ff_mb_plan_make: an equal share per DP rank balanced by token count (Karmarkar-Karp),
 * each share cut into micro-batches of at most micro_batch_size samples. Every DP rank (a
 * replica: with TP, all its TP ranks get the same share through the replica's group) gets one
 * rl.train subtask per mini-batch with its share, its micro-batch offsets and the
 * mini-batch's global loss normaliser; the worker steps its optimizer after summing the
 * gradients over the role's group (the subtask carries the group's name, so the handler
 * finds the communicator; under TP the workers' own DP group of their TP rank). All steps
 * are submitted at once: each worker runs them in order, and every rank sees the same order,
 * which is what the all-reduces need. With graph.<actor train>.fuse (exec_fuse.c) the actor's
 * and the critic's nodes are planned alike, and once both are, the k-th mini-batch share of
 * each actor replica and those of the critic replicas in its pipeline (one, or actor pp / critic
 * pp of them) go out as one rl.train_fused subtask, which completes both nodes' steps.
 *
 * Weight sync: rl.sync on every actor rank (colocated generation in the actor's layout: a local
 * copy), or resharding (ff_reshard, fuseflow/reshard.h): each generation rank receives only
 * the pieces of its shard it lacks, from training ranks that hold them, inside the actor's
 * group (a generation layout of its own on the actor's workers: HybridFlow's micro-DP groups
 * when the layouts nest) or the "sync" group (a generation pool of its own, fed by the
 * actor's replica 0); the weights never pass through the controller.
 *
 * Not here: the iteration loop (exec_iter.c). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/microbatch.h"
#include "fuseflow/util.h"

static const ff_node *node_of(const ex_run *x, int m) { return ff_graph_node(x->run->graph, (size_t)m); }

/* Per-token columns of a train subtask: tensor name (and its name in rl.train_fused) and the
 * node's slot. */
typedef struct train_col {
    const char *name, *fused_name;
    int slot;
    bool required;
} train_col;

static const train_col actor_cols[] = {{"old_logprob", "actor.old_logprob", FF_SLOT_OLD_LOGPROB, true},
                                       {"advantages", "actor.advantages", FF_SLOT_ADVANTAGES, true},
                                       {"ref_logprob", "actor.ref_logprob", FF_SLOT_REF_LOGPROB, false}};
static const train_col critic_cols[] = {{"old_values", "critic.old_values", FF_SLOT_VALUES, true},
                                        {"returns", "critic.returns", FF_SLOT_RETURNS, true}};
/* rl.train_fused's names of the samples' tensors and the offsets, the actor's and the critic's */
static const char *const fused_names[2][5] = {{"actor.prompt", "actor.plen", "actor.resp", "actor.rlen", "actor.mb"},
                                              {"critic.prompt", "critic.plen", "critic.resp", "critic.rlen", "critic.mb"}};

static int pack_column(ex_run *x, ex_iter *I, int col, const int64_t *samples, int64_t n, int64_t R, ff_input *in, const char *name) {
    float *v = ff_malloc((size_t)(R ? R : 1) * sizeof *v);
    if (!v) return -1;
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const ex_cell *e = &I->cells[col][samples[i]];
        int32_t len = I->cells[x->resp_col][samples[i]].len;
        if (!e->has || e->len != len) {
            free(v);
            return ff_error_set("train", "a node upstream must write it for every sample",
                                "column '%s' of sample %" PRId64 " has %d values for %d response tokens",
                                ff_graph_column(x->run->graph, (size_t)col)->name, samples[i], e->has ? e->len : -1, len);
        }
        if (len) memcpy(v + off, e->p, (size_t)len * sizeof *v);
        off += len;
    }
    *in = (ff_input){.name = name, .dtype = FF_DTYPE_F32, .ndim = 1, .data = v, .free_fn = ex_free_buf};
    return 0;
}

static void free_inputs(ff_input *in, int n) {
    for (int i = 0; i < n; i++) free(in[i].data);
}

/* The tensors of node m's share sh appended at in[*nin] (shapes beside them): the samples,
 * the node's columns and the offsets "mb", under rl.train_fused's names when fused (which: 0
 * the actor, 1 the critic). 0 or -1 (in[0 .. *nin) still to free). */
static int pack_share(ex_run *x, ex_iter *I, int m, const ex_share *sh, int which, ff_input *in, int64_t *shapes, int *nin) {
    const ff_node *nd = node_of(x, m);
    const bool actor = nd->role == FF_ROLE_ACTOR;
    const train_col *cols = actor ? actor_cols : critic_cols;
    const int ncols = actor ? 3 : 2, at = *nin;
    if (ex_pack_samples(x, I, sh->samples, sh->n, nd->in[FF_SLOT_RESPONSE], in + at, shapes + at) != 0) return -1;
    *nin += 4;
    for (int k = 0; which >= 0 && k < 4; k++) in[at + k].name = fused_names[which][k];
    const int64_t R = shapes[at + 2];
    for (int c = 0; c < ncols; c++) {
        const int col = nd->in[cols[c].slot];
        if (col < 0) continue;
        if (pack_column(x, I, col, sh->samples, sh->n, R, &in[*nin], which >= 0 ? cols[c].fused_name : cols[c].name) != 0) return -1;
        shapes[(*nin)++] = R;
    }
    int32_t *mbv = ff_malloc((size_t)(sh->nm + 1) * sizeof *mbv);
    if (!mbv) return -1;
    memcpy(mbv, sh->mb, (size_t)(sh->nm + 1) * sizeof *mbv);
    in[*nin] = (ff_input){.name = which >= 0 ? fused_names[which][4] : "mb", .dtype = FF_DTYPE_I32, .ndim = 1, .data = mbv,
                          .free_fn = ex_free_buf};
    shapes[(*nin)++] = sh->nm + 1;
    return 0;
}

/* A train job of node m over n samples (copied), step `step` of DP rank `rank_i`. */
static ex_job *train_job(ex_run *x, int m, int step, int rank_i, const int64_t *a, int64_t na, const int64_t *b, int64_t nb) {
    ex_job *j = ex_job_new(x, JOB_TRAIN, m);
    if (!j) return NULL;
    j->minibatch = step;
    j->member = rank_i;
    j->nsamples = na + nb;
    j->samples = ff_malloc((size_t)(na + nb ? na + nb : 1) * sizeof *j->samples);
    if (!j->samples) {
        free(j);
        return NULL;
    }
    if (na) memcpy(j->samples, a, (size_t)na * sizeof *a);
    if (nb) memcpy(j->samples + na, b, (size_t)nb * sizeof *b);
    return j;
}

/* One rank's share of one mini-batch, after the rank's previous step (prev, 0 at the first
 * step of the iteration: after whatever changed the pool's weights last). Its job id, or 0. */
static uint64_t submit_share(ex_run *x, ex_iter *I, int m, int pool, int step, int rank_i, const ex_share *sh, uint64_t prev) {
    const ff_node *nd = node_of(x, m);
    bool actor = nd->role == FF_ROLE_ACTOR;
    ff_input in[10];
    int64_t shapes[10];
    int nin = 0;
    if (pack_share(x, I, m, sh, -1, in, shapes, &nin) != 0) {
        free_inputs(in, nin);
        return 0;
    }
    for (int i = 0; i < nin; i++) in[i].shape = &shapes[i];
    ex_job *j = train_job(x, m, step, rank_i, sh->samples, sh->n, NULL, 0);
    if (!j) {
        free_inputs(in, nin);
        return 0;
    }
    /* fuse: auto measures the stages of its serial steps */
    const bool times = ex_fuse_measuring(x) && (m == x->fuse.actor || m == x->fuse.critic);
    ff_arg args[4] = {ff_arg_str("role", actor ? "actor" : "critic"), ff_arg_float("denom", sh->denom),
                      ff_arg_int("timeline", x->tr != NULL), ff_arg_int("stage_times", times)};
    char label[128];
    snprintf(label, sizeof label, "%s step %d (dp %d, %" PRId64 " samples)", nd->name, step, rank_i, sh->n);
    int nafter;
    const uint64_t *after = ex_trace_deps(x, m, sh->samples, sh->n, prev ? -1 : pool, &prev, 1, &nafter);
    ff_subtask_spec spec = {.kind = FF_RL_TRAIN, .args = args, .nargs = 4, .inputs = in, .ninputs = nin,
                            .after = after, .nafter = nafter, .label = label};
    ex_target_replica(x, j, pool, rank_i, &spec); /* the share goes to every TP rank of the replica */
    return ex_submit(x, j, &spec);
}

/* The critic's R shares c[0 .. R) (its replicas in one actor pipeline, the same step and
 * normaliser) as one: the samples and micro-batch offsets one after the other, and split
 * [R + 1] each replica's micro-batches in it. 0 or -1 (*out to free). */
static int join_shares(const ex_share *c, int R, ex_share *out, int32_t *split) {
    *out = (ex_share){.denom = c[0].denom};
    int64_t n = 0;
    int32_t nm = 0;
    for (int b = 0; b < R; b++) n += c[b].n, nm += c[b].nm;
    out->samples = ff_malloc((size_t)(n ? n : 1) * sizeof *out->samples);
    out->mb = ff_malloc((size_t)(nm + 1) * sizeof *out->mb);
    if (!out->samples || !out->mb) return -1;
    out->mb[0] = 0;
    split[0] = 0;
    for (int b = 0; b < R; b++) {
        for (int32_t q = 1; q <= c[b].nm; q++) out->mb[out->nm + q] = (int32_t)out->n + c[b].mb[q];
        if (c[b].n) memcpy(out->samples + out->n, c[b].samples, (size_t)c[b].n * sizeof *out->samples);
        out->n += c[b].n, out->nm += c[b].nm;
        split[b + 1] = out->nm;
    }
    return 0;
}

/* The actor's share a and its pipeline's R critic replicas' c[0 .. R) of their mini-batches
 * `step` in one rl.train_fused subtask to every rank of actor replica rank_i, with the plan's
 * instance and schedule. */
static uint64_t submit_fused(ex_run *x, ex_iter *I, int step, int rank_i, const ex_share *a, const ex_share *c, int R,
                             const ex_fuse_plan *p, uint64_t prev) {
    const int ma = x->fuse.actor, mc = x->fuse.critic;
    ff_input in[20];
    int64_t shapes[20];
    int nin = 0;
    ex_share cj;
    int32_t *split = ff_malloc((size_t)(R + 1) * sizeof *split);
    int32_t *sv = ff_malloc((size_t)p->n_sched * sizeof *sv);
    const int jrc = split ? join_shares(c, R, &cj, split) : -1;
    if (!sv || jrc || pack_share(x, I, ma, a, 0, in, shapes, &nin) != 0 || pack_share(x, I, mc, &cj, 1, in, shapes, &nin) != 0) {
        free(sv), free(split);
        if (split) free(cj.samples), free(cj.mb);
        free_inputs(in, nin);
        return 0;
    }
    memcpy(sv, p->sched, (size_t)p->n_sched * sizeof *sv);
    in[nin] = (ff_input){.name = FF_RL_T_FUSE_SCHEDULE, .dtype = FF_DTYPE_I32, .ndim = 1, .data = sv, .free_fn = ex_free_buf};
    shapes[nin++] = p->n_sched;
    in[nin] = (ff_input){.name = "critic.split", .dtype = FF_DTYPE_I32, .ndim = 1, .data = split, .free_fn = ex_free_buf};
    shapes[nin++] = R + 1;
    for (int i = 0; i < nin; i++) in[i].shape = &shapes[i];
    ex_job *j = train_job(x, ma, step, rank_i, a->samples, a->n, cj.samples, cj.n);
    free(cj.samples), free(cj.mb);
    if (!j) {
        free_inputs(in, nin);
        return 0;
    }
    j->fused = true;
    ff_arg args[4] = {ff_arg_float("denom_actor", a->denom), ff_arg_float("denom_critic", c[0].denom),
                      ff_arg_int("timeline", x->tr != NULL), ff_arg_str("fuse_instance", p->json)};
    char label[160];
    snprintf(label, sizeof label, "%s + %s step %d fused (dp %d, %" PRId64 " + %" PRId64 " samples)", node_of(x, ma)->name,
             node_of(x, mc)->name, step, rank_i, a->n, j->nsamples - a->n);
    int nafter;
    const uint64_t *after = ex_trace_deps(x, ma, j->samples, j->nsamples, prev ? -1 : POOL_ACTOR, &prev, 1, &nafter);
    ff_subtask_spec spec = {.kind = FF_RL_TRAIN_FUSED, .args = args, .nargs = 4, .inputs = in, .ninputs = nin,
                            .after = after, .nafter = nafter, .label = label};
    ex_target_replica(x, j, POOL_ACTOR, rank_i, &spec);
    return ex_submit(x, j, &spec);
}

static void shares_free(ex_shares *sh) {
    for (int i = 0; sh->v && i < sh->n_steps * sh->dp; i++) free(sh->v[i].samples), free(sh->v[i].mb);
    free(sh->v);
    memset(sh, 0, sizeof *sh);
}

/* Node t->node's mini-batches of this iteration: its bookkeeping (I->train) and every DP
 * rank's share of every step into *out (none: the node's task completes here). */
static int plan_node(ex_run *x, ex_iter *I, const ff_sched_task *t, ex_shares *out) {
    const ff_node *nd = node_of(x, t->node);
    int m = t->node, pool = nd->role == FF_ROLE_ACTOR ? POOL_ACTOR : POOL_CRITIC;
    int dp = x->lay[pool].dp; /* the replicas (each share replicated to a replica's TP ranks) */
    int64_t n = t->n_samples;
    I->training_started = true;
    int64_t mbs = nd->train.mini_batch_size * x->group_size;
    if (mbs <= 0 || mbs > n) mbs = n;
    int epochs = nd->train.epochs > 0 ? (int)nd->train.epochs : 1;
    int per_epoch = n ? (int)((n + mbs - 1) / mbs) : 0;
    ex_train *tr = &I->train[m];
    free(tr->m);
    *tr = (ex_train){.node = m, .task = t->id, .pool = pool, .n_steps = epochs * per_epoch, .n_ranks = dp, .active = true};
    tr->pending = tr->n_steps * dp;
    tr->m = ff_calloc((size_t)(tr->pending ? tr->pending : 1), sizeof *tr->m);
    *out = (ex_shares){.n_steps = tr->n_steps, .dp = dp};
    out->v = ff_calloc((size_t)(tr->pending ? tr->pending : 1), sizeof *out->v);
    int64_t *order = ff_malloc((size_t)(n ? n : 1) * sizeof *order);
    int64_t *tok = ff_malloc((size_t)(n ? n : 1) * sizeof *tok);
    int32_t *off = ff_malloc((size_t)(n + 1) * sizeof *off);
    int rc = -1;
    if (!tr->m || !out->v || !order || !tok || !off) goto out;
    if (!I->st[m].t_first_ns) I->st[m].t_first_ns = ff_now_ns();
    I->st[m].dispatched += n;
    if (tr->pending == 0) { /* nothing to train on (every group filtered out) */
        tr->active = false;
        out->n_steps = 0;
        rc = ff_sched_complete(I->s, t->id);
        goto out;
    }
    int step = 0;
    for (int e = 0; e < epochs; e++) {
        for (int64_t i = 0; i < n; i++) order[i] = t->samples[i];
        if (nd->train.shuffle) {
            ff_rng r;
            ff_rng_seed(&r, ff_seed_stream((uint64_t)x->run->trainer.seed, (uint64_t)I->it, FF_SEED_TAG_TRAIN_ORDER + (uint64_t)m * 1024 + (uint64_t)e));
            for (int64_t i = n - 1; i > 0; i--) {
                int64_t j = (int64_t)ff_rng_below(&r, (uint64_t)i + 1), v = order[i];
                order[i] = order[j];
                order[j] = v;
            }
        }
        for (int64_t s0 = 0; s0 < n; s0 += mbs, step++) {
            int64_t k = n - s0 < mbs ? n - s0 : mbs;
            off[0] = 0;
            for (int64_t i = 0; i < k; i++) {
                int64_t s = order[s0 + i];
                int32_t rl = I->cells[x->resp_col][s].len;
                tok[i] = I->cells[x->prompt_col][s].len + rl;
                off[i + 1] = off[i] + rl;
            }
            ff_rlhf_seqs seqs = {(int32_t)k, off, NULL};
            double denom = ff_node_loss_denom(nd, &seqs);
            ff_mb_plan plan;
            if (ff_mb_plan_make(tok, (int32_t)k, dp, (int32_t)nd->train.micro_batch_size, 0, &plan) != 0) goto out;
            for (int r = 0; r < dp; r++) {
                ex_share *sh = &out->v[step * dp + r];
                const int32_t nmb = plan.rank_mb[r + 1] - plan.rank_mb[r];
                sh->samples = ff_malloc((size_t)(k ? k : 1) * sizeof *sh->samples);
                sh->mb = ff_malloc((size_t)(nmb + 2) * sizeof *sh->mb);
                sh->denom = denom;
                if (!sh->samples || !sh->mb) {
                    ff_mb_plan_free(&plan);
                    goto out;
                }
                sh->mb[0] = 0;
                for (int32_t q = plan.rank_mb[r]; q < plan.rank_mb[r + 1]; q++) {
                    for (int32_t u = plan.mb_start[q]; u < plan.mb_start[q + 1]; u++) sh->samples[sh->n++] = order[s0 + plan.items[u]];
                    sh->mb[++sh->nm] = (int32_t)sh->n;
                }
                if (sh->nm == 0) sh->mb[++sh->nm] = 0; /* a rank without samples still steps (the all-reduce) */
            }
            ff_mb_plan_free(&plan);
        }
    }
    rc = 0;
out:
    free(order), free(tok), free(off);
    return rc;
}

static void announce(ex_run *x, ex_iter *I, int n_steps) {
    if (x->o.on_event) {
        ff_exec_event e = {"training", I->it, n_steps, x->c};
        x->o.on_event(x->o.event_ud, &e);
    }
}

/* Node m's shares as rl.train subtasks: each rank's steps in order. */
static int submit_serial(ex_run *x, ex_iter *I, int m, const ex_shares *sh) {
    const int pool = node_of(x, m)->role == FF_ROLE_ACTOR ? POOL_ACTOR : POOL_CRITIC;
    uint64_t prev[EX_MAX_RANKS] = {0}; /* each rank's last step */
    for (int step = 0; step < sh->n_steps; step++)
        for (int r = 0; r < sh->dp; r++)
            if (!(prev[r] = submit_share(x, I, m, pool, step, r, &sh->v[step * sh->dp + r], prev[r]))) return -1;
    if (sh->n_steps) ex_trace_weights(x, pool, prev, sh->dp);
    announce(x, I, sh->n_steps);
    return 0;
}

/* The micro-batches a share runs in the pipeline: its non-empty ones, or one filler. */
static int32_t scheduled_micro(const ex_share *s) {
    int32_t k = 0;
    for (int32_t b = 0; b < s->nm; b++) k += s->mb[b + 1] > s->mb[b];
    return k ? k : 1;
}

/* The plan of step `step` of actor replica d: its share's micro-batches and those of its
 * pipeline's R critic replicas (d x R ..). NULL + error. */
static const ex_fuse_plan *plan_of(ex_run *x, const ex_shares *A, const ex_shares *C, int step, int d) {
    const int R = C->dp / A->dp;
    int32_t mc[FF_FUSE_MAX_MODELS - 1];
    for (int b = 0; b < R; b++) mc[b] = scheduled_micro(&C->v[step * C->dp + d * R + b]);
    return ex_fuse_plan_for(x, scheduled_micro(&A->v[step * A->dp + d]), mc);
}

/* Both nodes planned: fused subtasks where the plans say so (on; auto: enough gain) for every
 * step, else the two nodes' serial subtasks (auto's first iteration: measured). The critic's
 * replicas d x R .. (d + 1) x R - 1 train in actor replica d's pipeline. */
static int submit_pair(ex_run *x, ex_iter *I) {
    const ex_shares *A = &I->fuse_sh[0], *C = &I->fuse_sh[1];
    const int R = ex_fuse_reps(x);
    bool fuse = A->n_steps > 0 && A->n_steps == C->n_steps && C->dp == A->dp * R;
    if (fuse && ex_fuse_measuring(x)) {
        for (int w = 0; w < 2; w++)
            for (int k = 0; k < I->fuse_sh[w].n_steps * I->fuse_sh[w].dp; k++) {
                const ex_share *sh = &I->fuse_sh[w].v[k];
                double tok = 0;
                for (int64_t i = 0; i < sh->n; i++)
                    tok += I->cells[x->prompt_col][sh->samples[i]].len + I->cells[x->resp_col][sh->samples[i]].len;
                if (sh->n) ex_fuse_tokens(x, w, tok / scheduled_micro(sh));
            }
        fuse = false;
    }
    if (!fuse && A->n_steps && C->n_steps)
        fprintf(x->out, "run: fuse: iteration %" PRId64 " has %d actor and %d critic mini-batches: trained one after the other\n", I->it,
                A->n_steps, C->n_steps);
    double gain = 0, peak_ratio = 0;
    for (int step = 0; fuse && step < A->n_steps; step++)
        for (int d = 0; fuse && d < A->dp; d++) {
            const ex_fuse_plan *p = plan_of(x, A, C, step, d);
            if (!p) return -1;
            fuse = p->use;
            gain += p->gain / (A->n_steps * A->dp);
            if (p->peak_serial > 0) peak_ratio = fmax(peak_ratio, p->peak_fused / p->peak_serial);
        }
    I->fuse_used = fuse;
    I->fuse_gain = gain;
    I->fuse_peak_ratio = peak_ratio;
    if (!fuse) return submit_serial(x, I, x->fuse.actor, A) || submit_serial(x, I, x->fuse.critic, C) ? -1 : 0;
    uint64_t prev[EX_MAX_RANKS] = {0}, cprev[EX_MAX_RANKS] = {0};
    for (int step = 0; step < A->n_steps; step++)
        for (int r = 0; r < A->dp; r++) {
            const ex_fuse_plan *p = plan_of(x, A, C, step, r);
            if (!p || !(prev[r] = submit_fused(x, I, step, r, &A->v[step * A->dp + r], &C->v[step * C->dp + r * R], R, p, prev[r])))
                return -1;
        }
    for (int r = 0; r < C->dp; r++) cprev[r] = prev[r / R];
    ex_trace_weights(x, POOL_ACTOR, prev, A->dp);
    ex_trace_weights(x, POOL_CRITIC, cprev, C->dp);
    announce(x, I, A->n_steps);
    return 0;
}

int ex_train_start(ex_run *x, ex_iter *I, const ff_sched_task *t) {
    const ff_node *nd = node_of(x, t->node);
    const int which = x->fuse.mode == FF_FUSE_OFF ? -1 : t->node == x->fuse.actor ? 0 : t->node == x->fuse.critic ? 1 : -1;
    ex_shares sh;
    int rc = plan_node(x, I, t, &sh);
    if (rc == 0 && which < 0) rc = submit_serial(x, I, t->node, &sh);
    if (rc || which < 0) {
        shares_free(&sh);
    } else { /* fusion: wait for the partner's shares */
        shares_free(&I->fuse_sh[which]);
        I->fuse_sh[which] = sh;
        I->fuse_sh[which].ready = true;
        if (I->fuse_sh[1 - which].ready) {
            rc = submit_pair(x, I);
            shares_free(&I->fuse_sh[0]);
            shares_free(&I->fuse_sh[1]);
        }
    }
    if (rc && !x->failed[0]) ex_fail(x, "node '%s': %s", nd->name, ff_error_message());
    return rc;
}

void ex_train_free(ex_iter *I) {
    shares_free(&I->fuse_sh[0]);
    shares_free(&I->fuse_sh[1]);
}

/* One train result's metrics row into node m's step (of DP replica `member`; tokens counted;
 * the node's task done with its last step). */
static void train_row(ex_run *x, ex_iter *I, int m, int step, int member, const double *row) {
    ex_train *tr = &I->train[m];
    memcpy(tr->m[step * tr->n_ranks + member], row, sizeof tr->m[0]);
    I->st[m].tokens += (int64_t)row[FF_RL_M_TOKENS];
    if (--tr->pending == 0) {
        I->st[m].done = I->st[m].dispatched;
        I->st[m].t_last_ns = ff_now_ns();
        if (ff_sched_complete(I->s, tr->task) != 0) ex_fail(x, "scheduler: %s", ff_error_message());
    }
}

/* A rank's FF_RL_T_OFFLOAD (way 0: at the sync, 1: back at the actor's step) into I. */
static void offload_of(ex_iter *I, const ff_result *r, int way) {
    const ff_tensor *o = ex_out_named(r, FF_RL_T_OFFLOAD);
    if (!o || o->dtype != FF_DTYPE_F64 || ff_tensor_numel(o) != 3) return;
    const double *v = o->data;
    I->off_bytes[way] += v[0];
    I->off_grads[way] += v[1];
    if (v[2] > I->off_s[way]) I->off_s[way] = v[2];
    I->off_seen = true;
}

/* A fused step's critic rows: each rank reports its critic replica's (the same on every rank
 * of it), so one rank of each of the replicas in actor replica j->member's pipeline. */
static void critic_rows(ex_run *x, ex_iter *I, const ex_job *j, const ff_result *rs, int n) {
    const ex_layout *C = &x->lay[POOL_CRITIC];
    const int R = ex_fuse_reps(x);
    bool seen[FF_FUSE_MAX_MODELS - 1] = {false};
    int got = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < x->pool_n[POOL_CRITIC] && x->pool_ranks[POOL_CRITIC][k] != rs[i].rank) k++;
        const int cr = k < x->pool_n[POOL_CRITIC] ? C->dp_idx[k] : -1, b = cr - j->member * R;
        const ff_tensor *mt = ex_out_named(&rs[i], FF_RL_T_METRICS);
        if (b < 0 || b >= R || seen[b] || !mt || mt->dtype != FF_DTYPE_F64 || ff_tensor_numel(mt) < 2 * FF_RL_NM) continue;
        seen[b] = true, got++;
        train_row(x, I, x->fuse.critic, j->minibatch, cr, (const double *)mt->data + FF_RL_NM);
    }
    if (got != R) ex_fail(x, "fused step %d: %d of the %d critic replicas of actor replica %d reported metrics", j->minibatch, got, R, j->member);
}

void ex_train_done(ex_run *x, ex_job *j, const ff_result *rs, int n) {
    const ff_result *r = ex_result_of(rs, n); /* TP ranks of a replica report the same metrics */
    ex_iter *I = x->cur;
    if (!I || j->iteration != I->it) return;
    const ff_node *nd = node_of(x, j->node);
    char name[160];
    if (j->fused) snprintf(name, sizeof name, "%s + %s", nd->name, node_of(x, x->fuse.critic)->name);
    else snprintf(name, sizeof name, "%s", nd->name);
    if (r[0].status != FF_STATUS_OK) {
        /* (the gradient all-reduce fails on the survivors when a rank dies) */
        ex_subtask_failed(x, "node '%s', step %d on worker %d: %s: %s", name, j->minibatch, r[0].rank,
                          ff_status_name(r[0].status), r[0].error);
        return;
    }
    const ff_tensor *mt = ex_out_named(&r[0], FF_RL_T_METRICS);
    const int64_t want = j->fused ? 2 * FF_RL_NM : FF_RL_NM;
    if (!mt || mt->dtype != FF_DTYPE_F64 || ff_tensor_numel(mt) < want) {
        ex_fail(x, "node '%s': worker %d sent no training metrics", name, r[0].rank);
        return;
    }
    for (int i = 0; i < n; i++) ex_trace_pipeline(x, &rs[i], name), offload_of(I, &rs[i], 1);
    const double *v = mt->data;
    if (!j->fused) ex_fuse_measured(x, j->node, ex_out_named(&r[0], FF_RL_T_STAGE_TIMES));
    train_row(x, I, j->node, j->minibatch, j->member, v);
    if (j->fused) critic_rows(x, I, j, rs, n);
}

/* Metrics of the iteration's train nodes, combined over ranks (loss parts add up: each rank's
 * uses the global normaliser) and steps (means), fractions weighted by counted tokens. */
void ex_train_metrics(ex_run *x, ex_iter *I, json_t *out) {
    if (x->fuse.mode != FF_FUSE_OFF) {
        json_t *f = json_object();
        json_object_set_new(f, "on", json_boolean(I->fuse_used));
        json_object_set_new(f, "predicted_gain", json_real(I->fuse_gain));
        if (I->fuse_peak_ratio > 0) json_object_set_new(f, "predicted_peak_ratio", json_real(I->fuse_peak_ratio));
        json_object_set_new(out, "fuse", f);
    }
    for (int m = 0; m < x->n_nodes; m++) {
        const ex_train *tr = &I->train[m];
        if (!tr->m || !tr->n_steps) continue;
        bool actor = node_of(x, m)->role == FF_ROLE_ACTOR;
        double loss = 0, pg = 0, kl = 0, vl = 0, gn = 0, rmax = 0, lr = 0, steps = 0, skipped = 0, bubble = 0;
        double w = 0, clip = 0, akl = 0, ent = 0, vclip = 0, vmean = 0;
        for (int s = 0; s < tr->n_steps; s++) {
            for (int r = 0; r < tr->n_ranks; r++) {
                const double *v = tr->m[s * tr->n_ranks + r];
                loss += v[FF_RL_M_LOSS], pg += v[FF_RL_M_PG], kl += v[FF_RL_M_KL], vl += v[FF_RL_M_VLOSS];
                double t = v[FF_RL_M_TOKENS];
                w += t, clip += v[FF_RL_M_CLIP] * t, akl += v[FF_RL_M_APPROX_KL] * t, ent += v[FF_RL_M_ENT_MEAN] * t;
                vclip += v[FF_RL_M_VCLIP] * t, vmean += v[FF_RL_M_VMEAN] * t;
                if (v[FF_RL_M_RATIO_MAX] > rmax) rmax = v[FF_RL_M_RATIO_MAX];
            }
            const double *r0 = tr->m[s * tr->n_ranks];
            gn += r0[FF_RL_M_GNORM], lr = r0[FF_RL_M_LR], steps += r0[FF_RL_M_STEPS], skipped += r0[FF_RL_M_SKIPPED];
            bubble += r0[FF_RL_M_BUBBLE];
        }
        double S = tr->n_steps, W = w > 0 ? w : 1;
        /* over a pipeline: the mean of the steps' bubbles (replica 0's) */
        if (x->lay[tr->pool].pp > 1) json_object_set_new(out, actor ? "actor_pipe_bubble" : "critic_pipe_bubble", json_real(bubble / S));
        if (actor) {
            json_object_set_new(out, "actor_loss", json_real(loss / S));
            json_object_set_new(out, "pg_loss", json_real(pg / S));
            json_object_set_new(out, "kl_loss", json_real(kl / S));
            json_object_set_new(out, "entropy", json_real(ent / W));
            json_object_set_new(out, "clipfrac", json_real(clip / W));
            json_object_set_new(out, "approx_kl", json_real(akl / W));
            json_object_set_new(out, "ratio_max", json_real(rmax));
            json_object_set_new(out, "grad_norm", json_real(gn / S));
            json_object_set_new(out, "lr", json_real(lr));
            json_object_set_new(out, "actor_steps", json_integer((json_int_t)steps));
            if (skipped) json_object_set_new(out, "actor_steps_skipped", json_integer((json_int_t)skipped));
        } else {
            json_object_set_new(out, "value_loss", json_real(vl / S));
            json_object_set_new(out, "vf_clipfrac", json_real(vclip / W));
            json_object_set_new(out, "value_mean", json_real(vmean / W));
            json_object_set_new(out, "critic_grad_norm", json_real(gn / S));
            json_object_set_new(out, "critic_lr", json_real(lr));
            json_object_set_new(out, "critic_steps", json_integer((json_int_t)steps));
        }
    }
}

/* ---- weight sync ---------------------------------------------------------------------------------- */

int ex_sync_start(ex_run *x, ex_iter *I, const ff_sched_task *t) {
    if (x->gen_separate && ex_sync_group(x) != 0) return -1;
    ex_job *j = ex_job_new(x, JOB_SYNC, t->node);
    if (!j) return -1;
    j->ntasks = 1;
    j->tasks = ff_malloc(sizeof *j->tasks);
    if (!j->tasks) {
        free(j);
        return -1;
    }
    j->tasks[0] = t->id;
    const bool reshard = x->gen_separate || x->gen_relaid;
    ff_arg a = ff_arg_str("mode", reshard ? "reshard" : "local");
    char label[128];
    snprintf(label, sizeof label, "%s (%s)", node_of(x, t->node)->name,
             !reshard ? "local copy" : x->gen_hybrid ? "micro-DP gather" : x->gen_separate ? "to the generation pool" : "reshard");
    int nafter;
    const uint64_t *after = ex_trace_deps(x, t->node, NULL, 0, POOL_ACTOR, NULL, 0, &nafter);
    ff_subtask_spec spec = {.kind = FF_RL_SYNC, .target = FF_TARGET_GROUP,
                            .group = x->gen_separate ? "sync" : ex_pool_names[POOL_ACTOR], .args = &a, .nargs = 1,
                            .after = after, .nafter = nafter, .label = label};
    if (!I->st[t->node].t_first_ns) I->st[t->node].t_first_ns = ff_now_ns();
    uint64_t id = ex_submit(x, j, &spec);
    ex_trace_weights(x, POOL_GEN, &id, 1); /* generation runs on the synced weights */
    if (id && x->o.on_event) {
        ff_exec_event e = {"syncing", I->it, 1, x->c};
        x->o.on_event(x->o.event_ud, &e);
    }
    return id ? 0 : -1;
}

bool ex_sync_redo(ex_run *x) {
    if (!x->sync_redo.pending || x->failed[0] || !x->cur || x->cur->it != x->sync_redo.iteration) return false;
    x->sync_redo.pending = false;
    /* only a generation rank of the group lost during the sync (an actor rank's death fails the
     * run in ex_check_workers) explains the failure */
    int n = 0;
    const int *ranks = ff_controller_group_ranks(x->c, "sync", &n);
    bool lost = false;
    for (int i = 0; ranks && i < n; i++) {
        ff_worker_info wi;
        lost = lost || (ff_controller_worker_info(x->c, ranks[i], &wi) == 0 && wi.state == FF_WORKER_DEAD);
    }
    if (!ranks) ff_error_clear();
    if (!lost) return false;
    fprintf(x->out, "run: a generation worker died during the weight sync; syncing again to the live ones\n");
    ff_sched_task t = {.id = x->sync_redo.task, .node = x->sync_redo.node};
    if (ex_sync_start(x, x->cur, &t) != 0) {
        ex_fail(x, "weight sync: %s", ff_error_message());
        return true;
    }
    return true;
}

void ex_sync_done(ex_run *x, ex_job *j, const ff_result *r, int n) {
    ex_iter *I = x->cur;
    if (!I || j->iteration != I->it) return;
    for (int i = 0; i < n; i++)
        if (r[i].status != FF_STATUS_OK) {
            if (x->gen_separate && !x->sync_redo.pending)
                x->sync_redo = (struct ex_sync_redo){true, j->node, j->tasks[0], j->iteration};
            ex_subtask_failed(x, "weight sync on worker %d: %s: %s", r[i].rank, ff_status_name(r[i].status), r[i].error);
            return;
        }
    x->sync_redo.pending = false;
    /* what moved: the bytes each rank received, and how long the ranks took together */
    int64_t t0 = 0, t1 = 0, bytes = 0, most = 0;
    for (int i = 0; i < n; i++) {
        const ff_tensor *g = ex_out_named(&r[i], FF_RL_T_RECEIVED);
        if (!g || g->dtype != FF_DTYPE_I64 || ff_tensor_numel(g) != 1) {
            ex_fail(x, "weight sync: worker %d sent no '%s' I64 [1]", r[i].rank, FF_RL_T_RECEIVED);
            return;
        }
        int64_t b = *(const int64_t *)g->data;
        bytes += b;
        const ff_tensor *d = ex_out_named(&r[i], FF_RL_T_SYNC_DELTA);
        if (d && d->dtype == FF_DTYPE_I64 && ff_tensor_numel(d) == 3) {
            for (int k = 0; k < 3; k++) I->sync_delta[k] += ((const int64_t *)d->data)[k];
            I->sync_is_delta = true;
        }
        if (b > most) most = b;
        offload_of(I, &r[i], 0);
        if (r[i].start_ns && (!t0 || r[i].start_ns < t0)) t0 = r[i].start_ns;
        if (r[i].end_ns > t1) t1 = r[i].end_ns;
    }
    I->sync_bytes += bytes;
    if (most > I->sync_bytes_max) I->sync_bytes_max = most;
    if (t0 && t1 > t0) I->sync_ns += t1 - t0;
    char label[96];
    snprintf(label, sizeof label, "%s: %.2f MB received, %.2f MB at most on a rank", x->gen_hybrid ? "micro-DP gather" : "weight sync",
             (double)bytes / 1e6, (double)most / 1e6);
    ex_trace_transition(x, label, t0, t1, bytes, most);
    I->st[j->node].t_last_ns = ff_now_ns();
    for (int64_t k = 0; k < j->ntasks; k++)
        if (ff_sched_complete(I->s, j->tasks[k]) != 0) ex_fail(x, "scheduler: %s", ff_error_message());
}
