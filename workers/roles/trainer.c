/* The actor and critic trainers: one optimizer step per mini-batch, over micro-batches whose
 * gradients accumulate; the losses are the registry's (policy loss by name, KL kind) plus
 * the entropy bonus, or the clipped value loss; normalised by the mini-batch's global
 * normaliser so that micro-batches and DP ranks add up exactly; a hook for the DP all-reduce
 * between the last backward and the step, or ZeRO-1 (the optimizer's own reduce-scatter).
 *
 * Per micro-batch: pack the samples (prompt + response), forward with activations kept,
 * gather the per-response-token outputs, compute the loss and its derivative with respect to
 * each token's log-prob / entropy / value on the host (plain C, rlhf.h), scatter them back to
 * the packed positions, backward. On a pipeline stage (ff_trainer_config.pipe) every
 * micro-batch is packed first and the executor (fuseflow/pipe_exec.h) runs them through the
 * schedule, calling the same loss on the last virtual stage's rank; the metrics are then
 * summed over the pipeline so every rank reports the same. A fused step
 * (ff_trainer_step_fused) packs the actor's and the critic's micro-batches the same way and runs
 * them in one executor of both stages on a fused schedule's streams (the critic as one or
 * several replicas in the actor's pipeline, this rank's stage of one of them); each trainer's
 * callbacks, hook and metrics are its own.
 *
 * Not here: advantages (computed before training, by the advantage node), mini-batch
 * shuffling across ranks (the executor; ff_trainer_train_batch does it for one process). */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/roles/roles_internal.h"

/* Running sums of one step's micro-batches. */
typedef struct acc {
    double loss, pg, kl, ent_agg, vloss;
    double w_clip, w_kl, w_ent, w_vclip, w_val, weight; /* token-weighted sums, and the weight */
    double ratio_max;
} acc;

/* A schedule and its executor for one micro-batch count (a pipeline stage's). */
typedef struct pipe_slot {
    int32_t micro; /* 0: empty */
    uint64_t used; /* for replacing the least recently used */
    ff_pipe_schedule s;
    ff_pipe_exec *e;
} pipe_slot;
enum { PIPE_SLOTS = 4 };

/* A fused actor+critic schedule's streams and executor (the actor trainer's cache), keyed by
 * the schedule and the instance it was made for. */
typedef struct fused_slot {
    uint64_t key; /* 0: empty */
    uint64_t used;
    const struct ff_trainer *critic; /* whose model and optimizer the executor borrows */
    ff_pipe_schedule s;
    ff_pipe_exec *e;
} fused_slot;

struct ff_trainer {
    ff_model *m;
    ff_trainer_config c;
    ff_optimizer *opt;
    rl_pack *packs;   /* [cap_packs]: micro-batch 0's alone without a pipeline, every one with */
    ff_batch *batches; /* [cap_packs] their batches (pipeline) */
    int32_t *mb_of;   /* [cap_packs] the caller's micro-batch of each scheduled one (pipeline) */
    int32_t cap_packs;
    bool piped;
    pipe_slot slots[PIPE_SLOTS];
    fused_slot fslots[PIPE_SLOTS];
    uint64_t clock;
    /* the pipelined step in progress, for the executor's callbacks */
    const ff_rl_sample *cur_samples;
    const int32_t *cur_start;
    double cur_denom;
    acc cur;
    bool reached_step;
    /* the last pipelined step (ff_trainer_last_pipe): its schedule and executor */
    const ff_pipe_schedule *last_s;
    const ff_pipe_exec *last_e;
    int64_t step_t0_ns, run_t0_ns;
};

static int reserve_packs(ff_trainer *t, int32_t n) {
    if (n <= t->cap_packs) return 0;
    const int32_t c = n + n / 2;
    rl_pack *p = ff_realloc(t->packs, sizeof *p * (size_t)c);
    if (!p) return -1;
    t->packs = p;
    memset(p + t->cap_packs, 0, sizeof *p * (size_t)(c - t->cap_packs)); /* packs beyond cap_packs hold nothing */
    ff_batch *b = ff_realloc(t->batches, sizeof *b * (size_t)c);
    if (!b) return -1;
    t->batches = b;
    int32_t *mb = ff_realloc(t->mb_of, sizeof *mb * (size_t)c);
    if (!mb) return -1;
    t->mb_of = mb;
    t->cap_packs = c;
    return 0;
}

static void slot_clear(pipe_slot *sl) {
    ff_pipe_exec_destroy(&sl->e);
    ff_pipe_schedule_clear(&sl->s);
    sl->micro = 0;
}

static void fslot_clear(fused_slot *sl) {
    ff_pipe_exec_destroy(&sl->e);
    ff_pipe_schedule_clear(&sl->s);
    sl->key = 0;
    sl->critic = NULL;
}

ff_trainer *ff_trainer_new(ff_model *m, const ff_trainer_config *c) {
    assert(m && c);
    const ff_model_config *cfg = ff_model_config_of(m);
    if (c->kind == FF_TRAIN_ACTOR) {
        if (!ff_model_has_lm_head(m)) return ff_error_set("actor trainer", NULL, "the model has no LM head"), NULL;
        if (!c->loss)
            return ff_error_set("actor trainer", "create one with ff_policy_loss_new(registry, \"vanilla\", params)",
                                "no policy loss"),
                   NULL;
        if (!(c->temperature >= 0 && isfinite(c->temperature)))
            return ff_error_set("actor trainer", NULL, "temperature %g must be >= 0", (double)c->temperature), NULL;
    } else if (c->kind == FF_TRAIN_CRITIC) {
        if (!cfg->value_head)
            return ff_error_set("critic trainer", "add a value head (ff_roles_add_value_head)", "the model has no value head"), NULL;
        if ((int)c->value.agg < 0 || c->value.agg >= FF_RLHF_AGG_COUNT)
            return ff_error_set("critic trainer", NULL, "unknown loss aggregation %d", (int)c->value.agg), NULL;
    } else {
        return ff_error_set("trainer", NULL, "unknown trainer kind %d", (int)c->kind), NULL;
    }
    if (rl_pipe_check(m, &c->pipe, c->kind == FF_TRAIN_ACTOR ? "actor trainer" : "critic trainer")) return NULL;
    if (c->zero == 1 && c->grad_hook)
        return ff_error_set("trainer", "leave grad_hook NULL: at zero 1 the optimizer reduce-scatters the gradients over dp",
                            "a gradient hook and ZeRO-1"),
               NULL;
    ff_trainer *t = ff_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->m = m;
    t->c = *c;
    t->piped = rl_pipe_on(&c->pipe);
    if (reserve_packs(t, 1)) {
        ff_trainer_destroy(&t);
        return NULL;
    }
    ff_optimizer_opts oo = {.zero = c->zero, .dp = c->dp.size > 1 ? &c->dp : NULL, .bucket = c->zero_bucket};
    t->opt = ff_optimizer_new_opts(m, &c->optim, &oo);
    if (!t->opt) ff_trainer_destroy(&t);
    return t;
}

void ff_trainer_destroy(ff_trainer **pt) {
    if (!pt || !*pt) return;
    ff_trainer *t = *pt;
    for (int i = 0; i < PIPE_SLOTS; i++) slot_clear(&t->slots[i]), fslot_clear(&t->fslots[i]);
    ff_optimizer_destroy(&t->opt);
    for (int32_t i = 0; i < t->cap_packs; i++) rl_pack_free(&t->packs[i]);
    free(t->packs);
    free(t->batches);
    free(t->mb_of);
    free(t);
    *pt = NULL;
}

ff_model *ff_trainer_model(const ff_trainer *t) { return t->m; }
ff_optimizer *ff_trainer_optimizer(const ff_trainer *t) { return t->opt; }

ff_rlhf_agg_mode ff_trainer_agg(const ff_trainer *t) {
    return t->c.kind == FF_TRAIN_ACTOR ? ff_policy_loss_agg(t->c.loss) : t->c.value.agg;
}

double ff_trainer_denom(const ff_trainer *t, const ff_rl_sample *samples, int32_t n) {
    bool tokens = ff_trainer_agg(t) == FF_RLHF_AGG_TOKEN_MEAN;
    double d = 0;
    for (int32_t i = 0; i < n; i++) {
        const ff_rl_sample *s = &samples[i];
        double counted = 0;
        for (int32_t j = 0; j < s->response_len; j++) counted += s->mask ? s->mask[j] : 1.0f;
        d += tokens ? counted : (counted > 0 ? 1 : 0);
    }
    return d;
}

static double masked_sum(const float *mask, const float *x, int32_t n, double *count) {
    double s = 0, c = 0;
    for (int32_t j = 0; j < n; j++) {
        s += (double)mask[j] * x[j];
        c += mask[j];
    }
    *count = c;
    return s;
}

/* The actor's loss on micro-batch p (samples s [k]) from the model's outputs out (logprobs,
 * entropy [T]): d(loss)/d(logp) and d(loss)/d(entropy) into d's arrays [T] (d_entropy NULLed
 * when the entropy has no coefficient), the micro-batch's loss term into d->loss. */
static int actor_micro(const ff_trainer *t, rl_pack *p, const ff_rl_sample *s, int32_t k, double denom,
                       const ff_forward_out *out, ff_pipe_loss_out *d, acc *a) {
    const ff_trainer_config *c = &t->c;
    float *logp = p->r[0], *ent = p->r[1], *mask = p->r[2], *old = p->r[3], *adv = p->r[4], *ref = p->r[5];
    float *dlogp = p->r[6], *w = p->r[7], *kl = p->r[8], *dkl = p->r[9], *dent = p->r[10];
    rl_pack_gather(p, out->logprobs, logp);
    rl_pack_gather(p, out->entropy, ent);
    if (rl_pack_column(p, s, NULL, RL_COL_MASK, true, 1.0f, mask) ||
        rl_pack_column(p, s, NULL, RL_COL_OLD_LOGPROB, false, 0, old) ||
        rl_pack_column(p, s, NULL, RL_COL_ADVANTAGES, false, 0, adv) ||
        (c->kl && rl_pack_column(p, s, NULL, RL_COL_REF_LOGPROB, false, 0, ref)))
        return -1;
    ff_rlhf_seqs seqs = {k, p->resp_off, mask};
    ff_pg_batch pg = {seqs, logp, old, adv, c->kl ? ref : NULL, denom};
    ff_rlhf_pg_stats st = {0};
    double pl = 0;
    if (ff_policy_loss_compute(c->loss, &pg, &pl, dlogp, &st)) return -1;
    for (int32_t j = 0; j < p->Tr; j++)
        if (!isfinite(dlogp[j])) return ff_error_set("policy loss", "check the advantages and log-probs", "non-finite gradient");
    double loss = pl, klv = 0;
    ff_rlhf_agg_mode agg = ff_policy_loss_agg(c->loss);
    if (c->kl) {
        c->kl->compute(p->Tr, logp, ref, kl, dkl);
        klv = ff_rlhf_agg(agg, &seqs, kl, denom, w);
        loss += c->kl_coef * klv;
        for (int32_t j = 0; j < p->Tr; j++) dlogp[j] += (float)(c->kl_coef * w[j] * dkl[j]);
    }
    double ent_agg = ff_rlhf_agg(agg, &seqs, ent, denom, w);
    if (c->entropy_coeff != 0) {
        loss -= c->entropy_coeff * ent_agg;
        for (int32_t j = 0; j < p->Tr; j++) dent[j] = (float)(-c->entropy_coeff * w[j]);
        rl_pack_scatter(p, dent, d->d_entropy);
    } else {
        d->d_entropy = NULL;
    }
    rl_pack_scatter(p, dlogp, d->d_logprobs);
    d->d_values = NULL;
    d->loss = loss;
    double cnt;
    double ent_sum = masked_sum(mask, ent, p->Tr, &cnt);
    a->loss += loss;
    a->pg += pl;
    a->kl += klv;
    a->ent_agg += ent_agg;
    a->w_clip += st.clipfrac * cnt;
    a->w_kl += st.approx_kl * cnt;
    a->w_ent += ent_sum;
    a->weight += cnt;
    if (cnt > 0 && st.ratio_max > a->ratio_max) a->ratio_max = st.ratio_max;
    return 0;
}

/* The critic's: d(loss)/d(value) into d->d_values [T]. */
static int critic_micro(const ff_trainer *t, rl_pack *p, const ff_rl_sample *s, int32_t k, double denom,
                        const ff_forward_out *out, ff_pipe_loss_out *d, acc *a) {
    float *v = p->r[0], *mask = p->r[2], *oldv = p->r[3], *ret = p->r[4], *dv = p->r[6];
    rl_pack_gather(p, out->values, v);
    if (rl_pack_column(p, s, NULL, RL_COL_MASK, true, 1.0f, mask) ||
        rl_pack_column(p, s, NULL, RL_COL_OLD_VALUES, false, 0, oldv) ||
        rl_pack_column(p, s, NULL, RL_COL_RETURNS, false, 0, ret))
        return -1;
    ff_rlhf_seqs seqs = {k, p->resp_off, mask};
    ff_rlhf_value_cfg vc = t->c.value;
    vc.denom = denom;
    double clipfrac = 0;
    double vl = ff_rlhf_value_loss(&vc, &seqs, v, oldv, ret, dv, &clipfrac);
    for (int32_t j = 0; j < p->Tr; j++)
        if (!isfinite(dv[j])) return ff_error_set("value loss", "check the returns", "non-finite gradient");
    rl_pack_scatter(p, dv, d->d_values);
    d->d_logprobs = d->d_entropy = NULL;
    d->loss = vl;
    double cnt;
    double vsum = masked_sum(mask, v, p->Tr, &cnt);
    a->loss += vl;
    a->vloss += vl;
    a->w_vclip += clipfrac * cnt;
    a->w_val += vsum;
    a->weight += cnt;
    return 0;
}

/* The loss of one micro-batch, the same code with and without a pipeline. */
static int micro_loss(const ff_trainer *t, rl_pack *p, const ff_rl_sample *s, int32_t k, double denom,
                      const ff_forward_out *out, ff_pipe_loss_out *d, acc *a) {
    return t->c.kind == FF_TRAIN_ACTOR ? actor_micro(t, p, s, k, denom, out, d, a) : critic_micro(t, p, s, k, denom, out, d, a);
}

static int run_hook(ff_trainer *t) {
    if (!t->c.grad_hook) return 0;
    ff_model *m = t->m;
    if (t->c.grad_hook(t->c.grad_hook_user, m, ff_model_grad_buffer(m), ff_model_param_count(m)))
        return ff_error_wrap("gradient all-reduce hook");
    return 0;
}

/* ---- without a pipeline ---- */

static int plain_micro_batches(ff_trainer *t, const ff_rl_sample *samples, const int32_t *mb_start, int32_t n_micro,
                               double denom, acc *a) {
    const bool actor = t->c.kind == FF_TRAIN_ACTOR;
    ff_forward_opts fo = {.train = true, .temperature = actor ? t->c.temperature : 0};
    rl_pack *p = &t->packs[0];
    for (int32_t b = 0; b < n_micro; b++) {
        int32_t s0 = mb_start[b], k = mb_start[b + 1] - s0;
        if (k == 0) continue;
        const ff_rl_sample *s = samples + s0;
        if (rl_pack_build(p, s, NULL, k, actor)) return -1;
        ff_batch bt = rl_pack_batch(p);
        ff_forward_out out = {0};
        if (actor) {
            out.logprobs = p->t_a;
            out.entropy = p->t_b;
        } else {
            out.values = p->t_c;
        }
        if (ff_model_forward(t->m, &bt, &fo, &out)) return -1;
        ff_pipe_loss_out d = {.d_logprobs = p->t_da, .d_entropy = p->t_db, .d_values = p->t_dc};
        if (micro_loss(t, p, s, k, denom, &out, &d, a)) return -1;
        if (ff_model_backward(t->m, d.d_logprobs, d.d_entropy, d.d_values)) return -1;
    }
    return 0;
}

/* ---- over a pipeline ---- */

static int pipe_loss(void *ctx, int32_t micro, const ff_batch *b, const ff_forward_out *out, ff_pipe_loss_out *d) {
    (void)b;
    ff_trainer *t = ctx;
    const int32_t mb = t->mb_of[micro];
    if (mb < 0) { /* an empty share's filler: no loss, zero gradients (d's arrays come zeroed) */
        d->d_entropy = NULL;
        d->loss = 0;
        return 0;
    }
    const int32_t s0 = t->cur_start[mb], k = t->cur_start[mb + 1] - s0;
    return micro_loss(t, &t->packs[micro], t->cur_samples + s0, k, t->cur_denom, out, d, &t->cur);
}

static int pipe_before_step(void *ctx, ff_model *m) {
    (void)m;
    ff_trainer *t = ctx;
    t->reached_step = true;
    return run_hook(t);
}

/* The executor of n_micro micro-batches: cached, the least recently used replaced. */
static ff_pipe_exec *pipe_exec_for(ff_trainer *t, int32_t n_micro) {
    pipe_slot *sl = NULL;
    for (int i = 0; i < PIPE_SLOTS && !sl; i++)
        if (t->slots[i].micro == n_micro) sl = &t->slots[i];
    if (!sl) {
        sl = &t->slots[0];
        for (int i = 1; i < PIPE_SLOTS; i++)
            if (t->slots[i].used < sl->used) sl = &t->slots[i];
        slot_clear(sl);
        const bool actor = t->c.kind == FF_TRAIN_ACTOR;
        if (rl_pipe_schedule(t->m, &t->c.pipe, n_micro, false, &sl->s)) return NULL;
        ff_pipe_exec_model em = {.model = t->m, .opt = t->opt, .temperature = actor ? t->c.temperature : 0,
                                 .logprobs = actor, .entropy = actor, .values = !actor, .loss = pipe_loss, .loss_ctx = t,
                                 .before_step = pipe_before_step, .step_ctx = t};
        if (!(sl->e = ff_pipe_exec_new(&sl->s, t->c.pipe.transport->rank, t->c.pipe.transport, &em))) {
            slot_clear(sl);
            return NULL;
        }
        sl->micro = n_micro;
    }
    sl->used = ++t->clock;
    return sl->e;
}

/* The non-empty micro-batches packed for the schedule (t->batches, t->mb_of), the step's
 * samples and normaliser kept for the loss callbacks. An empty share (n_real 0) gets filler
 * micro-batches (one, or pp for the interleaved schedule), so that the hook, the tied
 * embeddings' sum and the step are the same code as with samples. *n_sched: how many. */
static int pipe_pack(ff_trainer *t, const ff_rl_sample *samples, const int32_t *mb_start, int32_t n_micro, double denom,
                     int32_t n_real, int32_t *n_sched_out) {
    const ff_roles_pipe *pp = &t->c.pipe;
    const int32_t P = pp->transport->size;
    const int32_t n_sched = n_real > 0 ? n_real : pp->kind == FF_PIPE_INTERLEAVED ? P : 1;
    if (pp->kind == FF_PIPE_INTERLEAVED && n_sched % P)
        return ff_error_set("pipeline", "plan each share into a multiple of pp micro-batches (micro_batch_size, micro_batch_tokens), or use the 1f1b schedule",
                            "the interleaved schedule runs micro-batches in groups of pp %d, and this step has %d non-empty micro-batches",
                            P, n_sched);
    if (reserve_packs(t, n_sched)) return -1;
    const bool actor = t->c.kind == FF_TRAIN_ACTOR;
    for (int32_t b = 0, j = 0; b < n_micro; b++) {
        const int32_t s0 = mb_start[b], k = mb_start[b + 1] - s0;
        if (k == 0) continue;
        if (rl_pack_build(&t->packs[j], samples + s0, NULL, k, actor)) return ff_error_wrap("micro-batch %d", b);
        t->batches[j] = rl_pack_batch(&t->packs[j]);
        t->mb_of[j++] = b;
    }
    for (int32_t j = n_real; j < n_sched; j++) {
        if (rl_pack_build(&t->packs[j], rl_pipe_pad(), NULL, 1, actor)) return -1;
        t->batches[j] = rl_pack_batch(&t->packs[j]);
        t->mb_of[j] = -1;
    }
    t->cur_samples = samples;
    t->cur_start = mb_start;
    t->cur_denom = denom;
    t->reached_step = false;
    t->cur = (acc){0};
    *n_sched_out = n_sched;
    return 0;
}

/* The packed micro-batches through the schedule: the backwards, the hook and the optimizer
 * step. *stepped: the run reached the step (a failure there is the optimizer's: a skipped
 * update, on every rank alike). */
static int pipe_micro_batches(ff_trainer *t, const ff_rl_sample *samples, const int32_t *mb_start, int32_t n_micro,
                              double denom, int32_t n_real, ff_optim_stats *os, double *bubble, bool *stepped) {
    int32_t n_sched;
    if (pipe_pack(t, samples, mb_start, n_micro, denom, n_real, &n_sched)) return -1;
    ff_pipe_exec *e = pipe_exec_for(t, n_sched);
    if (!e) return -1;
    ff_pipe_run r = {.micro = {t->batches}};
    ff_pipe_exec_stats st;
    t->run_t0_ns = ff_now_ns();
    int rc = ff_pipe_exec_run(e, &r, &st);
    *stepped = t->reached_step;
    t->last_e = e;
    t->last_s = ff_pipe_exec_schedule(e);
    if (rc == 0) *os = st.optim[0], *bubble = st.bubble_fraction;
    return rc;
}

/* The sums over the pipeline: the loss terms come from the last virtual stage's rank and are
 * zero on the others, so the sums are that rank's values, exactly (ratio_max too: x + 0). */
static int pipe_sum_acc(ff_trainer *t, acc *a) {
    double v[] = {a->loss, a->pg, a->kl, a->ent_agg, a->vloss, a->w_clip, a->w_kl, a->w_ent, a->w_vclip, a->w_val, a->weight, a->ratio_max};
    const ff_pipe_transport *tr = t->c.pipe.transport;
    if (tr->all_reduce_sum_f64(tr->ctx, v, sizeof v / sizeof v[0])) return ff_error_wrap("pipeline: the sum of the metrics");
    *a = (acc){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
    return 0;
}

/* A step's share, checked: offsets (NULL: one micro-batch of all n, in *whole), the
 * normaliser (<= 0: the share's own), the non-empty micro-batches and their samples. */
typedef struct share {
    const ff_rl_sample *samples;
    int32_t n, n_micro;
    const int32_t *mb;
    double denom;
    int32_t whole[2];
    int64_t n_sched, n_samples;
} share;

static int share_check(const ff_trainer *t, share *sh) {
    if (!sh->mb) {
        sh->whole[0] = 0, sh->whole[1] = sh->n;
        sh->mb = sh->whole;
        sh->n_micro = 1;
    }
    const int32_t *mb = sh->mb;
    if (sh->n_micro < 1 || mb[0] != 0 || mb[sh->n_micro] != sh->n)
        return ff_error_set("trainer step", "micro-batch offsets must run from 0 to the number of samples",
                            "offsets [%d .. %d] over %d micro-batches do not cover %d samples", mb[0], mb[sh->n_micro], sh->n_micro,
                            sh->n);
    for (int32_t b = 0; b < sh->n_micro; b++)
        if (mb[b + 1] < mb[b]) return ff_error_set("trainer step", NULL, "micro-batch %d has a negative size", b);
    if (sh->denom <= 0) sh->denom = ff_trainer_denom(t, sh->samples, sh->n);
    sh->n_sched = sh->n_samples = 0;
    for (int32_t b = 0; b < sh->n_micro; b++) {
        sh->n_sched += mb[b + 1] > mb[b];
        sh->n_samples += mb[b + 1] - mb[b];
    }
    return 0;
}

/* After the run: the sums over the pipeline, the metrics, the return code of the step. orc:
 * the optimizer's (-1 for a skipped update). */
static int step_finish(ff_trainer *t, const share *sh, acc a, int orc, const ff_optim_stats *os, double bubble, int64_t t0,
                       ff_train_metrics *metrics) {
    const bool actor = t->c.kind == FF_TRAIN_ACTOR;
    ff_model_zero_grad(t->m);
    if (t->piped && pipe_sum_acc(t, &a)) return ff_error_wrap("%s trainer step", actor ? "actor" : "critic");
    if (metrics) {
        metrics->steps = orc == 0;
        metrics->skipped = orc != 0;
        metrics->micro_batches = sh->n_sched;
        metrics->samples = sh->n_samples;
        metrics->tokens = (int64_t)llround(a.weight);
        metrics->loss = a.loss;
        double wt = a.weight > 0 ? a.weight : 1;
        if (actor) {
            metrics->pg_loss = a.pg;
            metrics->kl_loss = a.kl;
            metrics->entropy = a.ent_agg;
            metrics->clipfrac = a.w_clip / wt;
            metrics->approx_kl = a.w_kl / wt;
            metrics->entropy_mean = a.w_ent / wt;
            metrics->ratio_max = a.ratio_max;
        } else {
            metrics->value_loss = a.vloss;
            metrics->vf_clipfrac = a.w_vclip / wt;
            metrics->value_mean = a.w_val / wt;
        }
        metrics->grad_norm = os->grad_norm;
        metrics->lr = os->lr;
        metrics->time_s = (double)(ff_now_ns() - t0) * 1e-9;
        metrics->pipe_bubble = bubble;
    }
    if (orc) return ff_error_wrap("%s trainer step", actor ? "actor" : "critic");
    return 0;
}

/* A run that failed after reaching the step is the optimizer's failure: a skipped update
 * (a non-finite norm inside the executor, the same on every rank). */
static void skipped_step(const ff_trainer *t, ff_optim_stats *os) {
    os->grad_norm = NAN;
    os->lr = ff_adamw_lr_at(&t->c.optim, ff_optimizer_steps_done(t->opt) + 1);
}

int ff_trainer_step(ff_trainer *t, const ff_rl_sample *samples, int32_t n, const int32_t *mb_start, int32_t n_micro,
                    double denom, ff_train_metrics *metrics) {
    assert(t && (samples || n == 0) && n >= 0);
    int64_t t0 = ff_now_ns();
    const bool actor = t->c.kind == FF_TRAIN_ACTOR;
    t->last_e = NULL;
    t->last_s = NULL;
    t->step_t0_ns = t0;
    share sh = {.samples = samples, .n = n, .mb = mb_start, .n_micro = n_micro, .denom = denom};
    if (share_check(t, &sh)) return -1;
    if (metrics) memset(metrics, 0, sizeof *metrics);
    /* nothing to learn from and no other rank to join: an AdamW step on zero gradients would
     * still move the weights (momentum), so there is none */
    if (n == 0 && !t->c.grad_hook && !(t->c.zero && t->c.dp.size > 1)) return 0;
    acc a = {0};
    ff_optim_stats os = {0};
    double bubble = 0;
    int orc = 0; /* the optimizer's: -1 for a skipped update */
    ff_model_zero_grad(t->m);
    if (t->piped) {
        bool stepped = false;
        if (pipe_micro_batches(t, samples, sh.mb, sh.n_micro, sh.denom, (int32_t)sh.n_sched, &os, &bubble, &stepped)) {
            if (!stepped) goto fail;
            orc = -1;
            skipped_step(t, &os);
        }
        a = t->cur;
    } else {
        if (plain_micro_batches(t, samples, sh.mb, sh.n_micro, sh.denom, &a)) goto fail;
        if (run_hook(t)) goto fail;
        orc = ff_optimizer_step(t->opt, &os);
    }
    return step_finish(t, &sh, a, orc, &os, bubble, t0, metrics);
fail:
    ff_model_zero_grad(t->m);
    return ff_error_wrap("%s trainer step", actor ? "actor" : "critic");
}

/* ---- the fused actor+critic step ------------------------------------------------------------ */

static uint64_t fused_key(const ff_fuse_instance *in, const ff_fuse_schedule *sc) {
    uint64_t h = FF_HASH_FNV1A_INIT;
    h = ff_hash_fnv1a(&in->nodes, sizeof in->nodes, h);
    h = ff_hash_fnv1a(&in->n_models, sizeof in->n_models, h);
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        const double v[3] = {m->fwd, m->bwd, m->act};
        h = ff_hash_fnv1a(&m->n_stages, sizeof m->n_stages, h);
        h = ff_hash_fnv1a(m->stages, sizeof m->stages[0] * (size_t)m->n_stages, h);
        h = ff_hash_fnv1a(&m->micro, sizeof m->micro, h);
        h = ff_hash_fnv1a(v, sizeof v, h);
    }
    for (int32_t n = 0; n < sc->nodes; n++) {
        h = ff_hash_fnv1a(&sc->n_tasks[n], sizeof sc->n_tasks[n], h);
        h = ff_hash_fnv1a(sc->tasks[n], sizeof sc->tasks[n][0] * (size_t)sc->n_tasks[n], h);
    }
    return h ? h : 1;
}

/* The executor of a fused schedule on this rank: cached by (instance, schedule), the least
 * recently used replaced. ci: the instance's model of the critic replica on this rank. */
static ff_pipe_exec *fused_exec_for(ff_trainer *a, const ff_trainer *c, const ff_fuse_instance *in, const ff_fuse_schedule *sc, int ci) {
    const uint64_t key = fused_key(in, sc);
    fused_slot *sl = NULL;
    for (int i = 0; i < PIPE_SLOTS && !sl; i++)
        if (a->fslots[i].key == key && a->fslots[i].critic == c) sl = &a->fslots[i];
    if (!sl) {
        sl = &a->fslots[0];
        for (int i = 1; i < PIPE_SLOTS; i++)
            if (a->fslots[i].used < sl->used) sl = &a->fslots[i];
        fslot_clear(sl);
        int64_t layers[FF_FUSE_MAX_MODELS];
        layers[0] = ff_model_config_of(a->m)->num_hidden_layers;
        for (int i = 1; i < in->n_models; i++) layers[i] = ff_model_config_of(c->m)->num_hidden_layers;
        if (ff_fuse_to_pipe(in, sc, layers, &sl->s)) return NULL;
        /* the other critic replicas have no instructions here: left zero */
        ff_pipe_exec_model em[FF_FUSE_MAX_MODELS] = {
            {.model = a->m, .opt = a->opt, .temperature = a->c.temperature, .logprobs = true, .entropy = true, .loss = pipe_loss,
             .loss_ctx = a, .before_step = pipe_before_step, .step_ctx = a}};
        em[ci] = (ff_pipe_exec_model){.model = c->m, .opt = c->opt, .values = true, .loss = pipe_loss, .loss_ctx = (void *)c,
                                      .before_step = pipe_before_step, .step_ctx = (void *)c};
        if (!(sl->e = ff_pipe_exec_new(&sl->s, a->c.pipe.transport->rank, a->c.pipe.transport, em))) {
            fslot_clear(sl);
            return NULL;
        }
        sl->key = key;
        sl->critic = c;
    }
    sl->used = ++a->clock;
    return sl->e;
}

/* The instance's model of the critic replica whose stage is on actor rank r (c's pipeline rank
 * there), checked against both pipelines; -1 + error. */
static int fused_critic_model(const ff_trainer *a, const ff_trainer *c, const ff_fuse_instance *in, const char *w) {
    const int32_t P = a->c.pipe.transport->size, r = a->c.pipe.transport->rank;
    const int32_t Pc = c->c.pipe.transport->size, rc = c->c.pipe.transport->rank;
    if (in->nodes != P || in->n_models < 2 || in->n_models != 1 + P / Pc || in->models[0].n_stages != P)
        return ff_error_set(w, "an instance of the actor on every rank and one critic model per critic replica of the pipeline",
                            "instance of %d nodes, %d models, for an actor at pp %d and a critic at pp %d", (int)in->nodes,
                            (int)in->n_models, (int)P, (int)Pc);
    int ci = -1;
    for (int i = 1; i < in->n_models; i++) {
        if (in->models[i].n_stages != Pc)
            return ff_error_set(w, "give every critic replica the critic's stages", "model %s has %d stages, the critic's pipeline %d",
                                in->models[i].name, (int)in->models[i].n_stages, (int)Pc);
        for (int32_t k = 0; k < Pc; k++)
            if (in->models[i].stages[k] == r) ci = ci == -1 && k == rc ? i : -2; /* -2: a wrong stage, or two, here */
    }
    /* the stages on this rank must be the ones the instance places here */
    if (in->models[0].stages[r] != r || ci < 0)
        return ff_error_set(w, "lay the actor's stage k on rank k and each critic replica's as its pipeline places it",
                            "rank %d holds actor stage %d and critic stage %d, and the instance places other stages there", (int)r, (int)r,
                            (int)rc);
    return ci;
}

int ff_trainer_step_fused(ff_trainer *a, ff_trainer *c, const ff_fuse_instance *in, const ff_fuse_schedule *sched,
                          const ff_trainer_share *as, const ff_trainer_share *cs, ff_train_metrics *am, ff_train_metrics *cm) {
    assert(a && c && in && sched && as && cs);
    const char *w = "fused actor+critic step";
    const int64_t t0 = ff_now_ns();
    a->last_e = c->last_e = NULL;
    a->last_s = c->last_s = NULL;
    a->step_t0_ns = c->step_t0_ns = t0;
    if (a->c.kind != FF_TRAIN_ACTOR || c->c.kind != FF_TRAIN_CRITIC)
        return ff_error_set(w, "give the actor's trainer first, then the critic's", "trainers of kinds %d and %d", (int)a->c.kind,
                            (int)c->c.kind);
    if (!a->piped || !c->piped || a->c.pipe.transport->size % c->c.pipe.transport->size || a->c.zero || c->c.zero ||
        rl_pipe_vpp(&a->c.pipe) != 1 || rl_pipe_vpp(&c->c.pipe) != 1)
        return ff_error_set(w, "fuse two pipelined trainers, the critic's pp dividing the actor's, one chunk per stage, without ZeRO",
                            "the trainers' pipelines do not fuse (pp %d and %d)", a->piped ? a->c.pipe.transport->size : 1,
                            c->piped ? c->c.pipe.transport->size : 1);
    const int ci = fused_critic_model(a, c, in, w);
    if (ci < 0) return -1;
    share sa = {.samples = as->samples, .n = as->n, .mb = as->mb_start, .n_micro = as->n_micro, .denom = as->denom};
    share sc = {.samples = cs->samples, .n = cs->n, .mb = cs->mb_start, .n_micro = cs->n_micro, .denom = cs->denom};
    if (share_check(a, &sa) || share_check(c, &sc)) return ff_error_wrap("%s", w);
    if (am) memset(am, 0, sizeof *am);
    if (cm) memset(cm, 0, sizeof *cm);
    int32_t na, nc;
    ff_model_zero_grad(a->m);
    ff_model_zero_grad(c->m);
    if (pipe_pack(a, sa.samples, sa.mb, sa.n_micro, sa.denom, (int32_t)sa.n_sched, &na) ||
        pipe_pack(c, sc.samples, sc.mb, sc.n_micro, sc.denom, (int32_t)sc.n_sched, &nc))
        return ff_error_wrap("%s", w);
    if (in->models[0].micro != na || in->models[ci].micro != nc)
        return ff_error_set(w, "make the instance with the micro-batches the shares have (non-empty ones, or 1 for an empty share)",
                            "the instance has %d actor and %d %s micro-batches, the shares %d and %d", (int)in->models[0].micro,
                            (int)in->models[ci].micro, in->models[ci].name, (int)na, (int)nc);
    ff_pipe_exec *e = fused_exec_for(a, c, in, sched, ci);
    if (!e) return ff_error_wrap("%s", w);
    ff_pipe_run run = {.micro = {a->batches}};
    run.micro[ci] = c->batches;
    ff_pipe_exec_stats st;
    a->run_t0_ns = c->run_t0_ns = ff_now_ns();
    const int rc = ff_pipe_exec_run(e, &run, &st);
    a->last_e = e;
    a->last_s = ff_pipe_exec_schedule(e);
    ff_optim_stats os[2] = {st.optim[0], st.optim[ci]};
    int orc[2] = {0, 0};
    if (rc) {
        /* a failure before a model's step fails the step; at or after it, it is that
         * optimizer's skipped update (as ff_trainer_step) */
        ff_trainer *t2[2] = {a, c};
        for (int i = 0; i < 2; i++) {
            if (!t2[i]->reached_step) {
                ff_model_zero_grad(a->m);
                ff_model_zero_grad(c->m);
                return ff_error_wrap("%s", w);
            }
            orc[i] = -1;
            skipped_step(t2[i], &os[i]);
        }
    }
    const double bubble = rc ? 0 : st.bubble_fraction;
    const int ra = step_finish(a, &sa, a->cur, orc[0], &os[0], bubble, t0, am);
    const int rcr = step_finish(c, &sc, c->cur, orc[1], &os[1], bubble, t0, cm);
    return ra || rcr ? -1 : 0;
}

const ff_pipe_exec *ff_trainer_last_pipe(const ff_trainer *t, const ff_pipe_schedule **s, double *t0_s) {
    if (!t->last_e) return NULL;
    if (s) *s = t->last_s;
    if (t0_s) *t0_s = (double)(t->run_t0_ns - t->step_t0_ns) * 1e-9;
    return t->last_e;
}

/* ---- whole batches in one process -------------------------------------------------------------- */

static void add_metrics(ff_train_metrics *sum, const ff_train_metrics *m) {
    sum->steps += m->steps;
    sum->skipped += m->skipped;
    sum->micro_batches += m->micro_batches;
    sum->tokens += m->tokens;
    sum->samples += m->samples;
    sum->loss += m->loss;
    sum->pg_loss += m->pg_loss;
    sum->kl_loss += m->kl_loss;
    sum->entropy += m->entropy;
    sum->clipfrac += m->clipfrac;
    sum->approx_kl += m->approx_kl;
    if (m->ratio_max > sum->ratio_max) sum->ratio_max = m->ratio_max;
    sum->entropy_mean += m->entropy_mean;
    sum->value_loss += m->value_loss;
    sum->vf_clipfrac += m->vf_clipfrac;
    sum->value_mean += m->value_mean;
    sum->grad_norm += m->grad_norm;
    sum->lr = m->lr;
    sum->time_s += m->time_s;
}

int ff_trainer_train_batch(ff_trainer *t, const ff_rl_sample *samples, int32_t n, const ff_train_batch_opts *o,
                           ff_train_metrics *metrics) {
    assert(t && o && (samples || n == 0));
    if (metrics) memset(metrics, 0, sizeof *metrics);
    if (n == 0) return 0;
    int32_t epochs = o->epochs > 0 ? o->epochs : 1;
    int32_t mbs = o->mini_batch_size > 0 && o->mini_batch_size < n ? o->mini_batch_size : n;
    int32_t *order = ff_malloc((size_t)n * sizeof *order);
    int64_t *tok = ff_malloc((size_t)n * sizeof *tok);
    ff_rl_sample *mini = ff_malloc((size_t)mbs * sizeof *mini);
    ff_train_metrics sum = {0}, one;
    int rc = -1, steps = 0;
    if (!order || !tok || !mini) goto out;
    for (int32_t e = 0; e < epochs; e++) {
        for (int32_t i = 0; i < n; i++) order[i] = i;
        if (o->shuffle) {
            ff_rng r;
            ff_rng_seed(&r, ff_seed_stream(o->seed, (uint64_t)e, FF_SEED_TAG_TRAINER_SHUFFLE));
            for (int32_t i = n - 1; i > 0; i--) {
                int32_t j = (int32_t)ff_rng_below(&r, (uint64_t)i + 1);
                int32_t x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
        }
        for (int32_t s0 = 0; s0 < n; s0 += mbs) {
            int32_t k = n - s0 < mbs ? n - s0 : mbs;
            for (int32_t i = 0; i < k; i++) tok[i] = ff_rl_sample_tokens(&samples[order[s0 + i]]);
            ff_mb_plan plan;
            if (ff_mb_plan_make(tok, k, 1, o->micro_batch_size, o->micro_batch_tokens, &plan)) goto out;
            for (int32_t i = 0; i < k; i++) mini[i] = samples[order[s0 + plan.items[i]]];
            int src = ff_trainer_step(t, mini, k, plan.mb_start, plan.n_micro, 0, &one);
            ff_mb_plan_free(&plan);
            if (src) goto out;
            add_metrics(&sum, &one);
            steps++;
        }
    }
    rc = 0;
out:
    if (metrics && steps > 0) {
        double d = steps;
        sum.loss /= d, sum.pg_loss /= d, sum.kl_loss /= d, sum.entropy /= d, sum.clipfrac /= d, sum.approx_kl /= d;
        sum.entropy_mean /= d, sum.value_loss /= d, sum.vf_clipfrac /= d, sum.value_mean /= d, sum.grad_norm /= d;
        *metrics = sum;
    }
    free(order);
    free(tok);
    free(mini);
    return rc;
}
