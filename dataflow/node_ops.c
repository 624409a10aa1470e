/* The math of graph nodes, for the executor: advantage (token rewards, KL penalty, the
 * estimator), the actor's loss (policy loss + KL loss - entropy bonus), the critic's loss,
 * rewards and group filters. Host functions on the packed arrays of include/fuseflow/rlhf.h;
 * see include/fuseflow/graph.h for the contracts.
 *
 * Not here: scheduling (sched.c), the model's forward and backward (model/). */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/util.h"

int ff_node_advantage(ff_node *n, const ff_node_adv_in *in, float *adv, float *ret, double *mean_kl) {
    if (n->op != FF_OP_ADVANTAGE || !n->adv) return ff_error_set(n->where, "validate the graph first", "not an advantage node");
    int64_t T = ff_rlhf_seqs_tokens(&in->seqs);
    size_t cnt = (size_t)(T > 0 ? T : 1);
    float *tr = ff_malloc(cnt * sizeof *tr);
    if (!tr) return -1;
    ff_rlhf_scores_to_tokens(&in->seqs, in->scores, tr);
    if (mean_kl) *mean_kl = 0;
    if (n->kl_penalty) {
        if (!in->old_logp || !in->ref_logp) {
            free(tr);
            return ff_error_set(n->where, NULL, "node '%s': the KL penalty needs old_logp and ref_logp", n->name);
        }
        float *kl = ff_malloc(cnt * sizeof *kl);
        if (!kl) {
            free(tr);
            return -1;
        }
        n->kl_penalty->compute(T, in->old_logp, in->ref_logp, kl, NULL);
        if (mean_kl) *mean_kl = ff_rlhf_masked_mean(&in->seqs, kl);
        ff_rlhf_kl_penalty(&in->seqs, tr, kl, n->kl_ctl.coef, tr);
        free(kl);
    }
    ff_adv_batch b = {in->seqs, tr, in->values, in->group, in->baseline};
    int rc = ff_advantage_compute(n->adv, &b, adv, ret);
    free(tr);
    if (rc != 0) return ff_error_wrap("node '%s'", n->name);
    return 0;
}

void ff_node_kl_ctl_update(ff_node *n, double mean_kl, int64_t n_steps) { ff_rlhf_kl_ctl_update(&n->kl_ctl, mean_kl, n_steps); }

double ff_node_loss_denom(const ff_node *n, const ff_rlhf_seqs *s) {
    ff_rlhf_agg_mode m = n->role == FF_ROLE_CRITIC ? n->train.value.agg
                         : n->train.loss         ? ff_policy_loss_agg(n->train.loss)
                                                 : FF_RLHF_AGG_TOKEN_MEAN;
    return ff_rlhf_agg_denom(m, s);
}

int ff_node_actor_loss(ff_node *n, const ff_actor_loss_in *in, ff_actor_loss_out *out) {
    if (n->op != FF_OP_TRAIN || n->role != FF_ROLE_ACTOR || !n->train.loss)
        return ff_error_set(n->where, "validate the graph first", "not an actor train node");
    int64_t T = ff_rlhf_seqs_tokens(&in->seqs);
    size_t cnt = (size_t)(T > 0 ? T : 1);
    ff_pg_batch pg = {in->seqs, in->logp, in->old_logp, in->adv, in->ref_logp, in->denom};
    memset(&out->stats, 0, sizeof out->stats);
    out->kl_loss = out->entropy = 0;
    if (ff_policy_loss_compute(n->train.loss, &pg, &out->pg_loss, out->dlogp, &out->stats) != 0)
        return ff_error_wrap("node '%s'", n->name);
    out->loss = out->pg_loss;
    ff_rlhf_agg_mode agg = ff_policy_loss_agg(n->train.loss);
    float *w = NULL;
    if (n->train.kl_loss || (n->train.entropy_coeff != 0 && in->entropy)) {
        w = ff_malloc(cnt * sizeof *w);
        if (!w) return -1;
    }
    if (n->train.kl_loss) {
        if (!in->ref_logp) {
            free(w);
            return ff_error_set(n->where, NULL, "node '%s': kl_loss needs ref_logp", n->name);
        }
        float *kl = ff_malloc(cnt * sizeof *kl), *dkl = ff_malloc(cnt * sizeof *dkl);
        if (!kl || !dkl) {
            free(kl), free(dkl), free(w);
            return -1;
        }
        n->train.kl_loss->compute(T, in->logp, in->ref_logp, kl, dkl);
        out->kl_loss = ff_rlhf_agg(agg, &in->seqs, kl, in->denom, w);
        out->loss += n->train.kl_loss_coef * out->kl_loss;
        if (out->dlogp)
            for (int64_t t = 0; t < T; t++) out->dlogp[t] += (float)(n->train.kl_loss_coef * w[t] * dkl[t]);
        free(kl), free(dkl);
    }
    if (out->dentropy)
        for (int64_t t = 0; t < T; t++) out->dentropy[t] = 0;
    if (n->train.entropy_coeff != 0 && in->entropy) {
        out->entropy = ff_rlhf_agg(agg, &in->seqs, in->entropy, in->denom, w);
        out->loss -= n->train.entropy_coeff * out->entropy;
        if (out->dentropy)
            for (int64_t t = 0; t < T; t++) out->dentropy[t] = (float)(-n->train.entropy_coeff * w[t]);
    }
    free(w);
    return 0;
}

int ff_node_critic_loss(ff_node *n, const ff_critic_loss_in *in, double *loss, float *dvalues, double *clipfrac) {
    if (n->op != FF_OP_TRAIN || n->role != FF_ROLE_CRITIC)
        return ff_error_set(n->where, "validate the graph first", "not a critic train node");
    ff_rlhf_value_cfg cfg = n->train.value;
    cfg.denom = in->denom;
    *loss = ff_rlhf_value_loss(&cfg, &in->seqs, in->values, in->old_values, in->returns, dvalues, clipfrac);
    return 0;
}

int ff_node_reward(ff_node *n, const ff_reward_item *items, size_t count, float *scores) {
    if (!n->reward) return ff_error_set(n->where, "validate the graph first", "not a reward_fn node");
    if (ff_reward_score(n->reward, items, count, scores) != 0) return ff_error_wrap("node '%s'", n->name);
    return 0;
}

void ff_node_sampling_of(const ff_run_config *run, const ff_node *gen, ff_node_sampling *out) {
    out->temperature = gen->gen.greedy ? 0.0f : (float)gen->gen.temperature;
    out->top_k = (int32_t)gen->gen.top_k;
    out->top_p = (float)gen->gen.top_p;
    int64_t mx = gen->gen.max_tokens > 0 ? gen->gen.max_tokens : run->data.max_response_length;
    out->max_new = (int32_t)(mx > 0 ? mx : 1);
    out->len_median = (float)gen->gen.len_median;
    out->len_p99_ratio = (float)gen->gen.len_p99_ratio;
    out->len_max = (int32_t)gen->gen.len_max;
}

bool ff_node_filter_keep(const ff_node *n, const float *s, size_t count) {
    (void)n; /* one rule for now: nonzero_std */
    for (size_t i = 1; i < count; i++)
        if (s[i] != s[0]) return true;
    return false;
}
