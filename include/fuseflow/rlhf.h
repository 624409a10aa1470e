/* fuseflow: the host-side math of RLHF on small per-token arrays.
 *
 * DESIGN.md: a loss is a function of per-token scalars (log-prob, old log-prob, reference
 * log-prob, advantage, value, return, mask). Each loss here returns its value and its
 * derivative with respect to the per-token log-prob (or value); the model backpropagates
 * from there. Advantage estimators turn rewards (and values) into per-token advantages and
 * returns. Everything is plain C on host float arrays, so it serves every backend and every
 * plugin. Accumulation is in double; inputs and outputs are fp32.
 *
 * Layout: a batch of variable-length responses is packed into [T] arrays with sequence
 * offsets (cu_seqlens style) and a mask:
 *
 *     offsets = {0, 3, 7}        two sequences: tokens [0,3) and [3,7), T = 7
 *     mask    = {1,1,1, 1,1,0,1} 0 = the token does not count (a tool-output token, padding)
 *
 * Names follow verl where verl has one (loss_agg_mode "token-mean", KL "low_var_kl",
 * clip_ratio_c, ...), so its users recognise them. Formulas are in docs/rlhf-math.md.
 *
 * Not here: per-token log-probs and entropy (they come from logits, in the model), the
 * optimizer, and anything that knows about graphs or workers (dataflow/).
 *
 * Misuse (NULL arrays, offsets that do not increase) asserts. Functions that allocate or take
 * ids from the caller return 0 / -1 with an ff_error message.
 */
#ifndef FUSEFLOW_RLHF_H
#define FUSEFLOW_RLHF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* A packed batch of sequences. Tokens of sequence s are [offsets[s], offsets[s+1]). */
typedef struct ff_rlhf_seqs {
    int32_t n_seq;
    const int32_t *offsets; /* [n_seq + 1], offsets[0] == 0, non-decreasing */
    const float *mask;      /* [T] 1 = the token counts, 0 = it does not; NULL = all 1 */
} ff_rlhf_seqs;

static inline int64_t ff_rlhf_seqs_tokens(const ff_rlhf_seqs *s) { return s->offsets[s->n_seq]; }

/* ---- masked aggregation (verl's loss_agg_mode) ------------------------------------------- */
/* With m the mask, n_s = sum of m over sequence s, S = number of sequences with n_s > 0:
 *   token-mean             L = sum_t m_t x_t / sum_t m_t
 *   seq-mean-token-sum     L = (1/S) sum_s sum_{t in s} m_t x_t
 *   seq-mean-token-mean    L = (1/S) sum_s (1/n_s) sum_{t in s} m_t x_t
 * A zero denominator gives L = 0 and zero weights (an all-masked batch contributes nothing). */
typedef enum {
    FF_RLHF_AGG_TOKEN_MEAN = 0,
    FF_RLHF_AGG_SEQ_MEAN_TOKEN_SUM,
    FF_RLHF_AGG_SEQ_MEAN_TOKEN_MEAN,
    FF_RLHF_AGG_COUNT
} ff_rlhf_agg_mode;

const char *ff_rlhf_agg_name(ff_rlhf_agg_mode m);
/* "token-mean", "seq-mean-token-sum", "seq-mean-token-mean". 0, or -1 + error. */
int ff_rlhf_agg_parse(const char *name, ff_rlhf_agg_mode *out);

/* Aggregate x [T]. Returns L; when w != NULL writes dL/dx_t into w [T]. Every mode is linear
 * in x (L = sum_t w_t x_t), so w does not depend on x.
 * denom > 0 replaces the batch's own normaliser (sum of the mask for token-mean, S for the
 * seq-mean modes): a micro-batch of a larger mini-batch passes the mini-batch's global count
 * so that the accumulated gradient equals the mini-batch's. denom <= 0: this batch's own. */
double ff_rlhf_agg(ff_rlhf_agg_mode mode, const ff_rlhf_seqs *s, const float *x, double denom, float *w);
/* The normaliser ff_rlhf_agg would use for this batch (sum of the mask, or S). */
double ff_rlhf_agg_denom(ff_rlhf_agg_mode mode, const ff_rlhf_seqs *s);

/* Masked mean over all tokens (statistics). 0 when the mask is all zero. */
double ff_rlhf_masked_mean(const ff_rlhf_seqs *s, const float *x);

/* ---- PPO clipped surrogate --------------------------------------------------------------- */
/* Per token, with r = exp(clamp(logp - old_logp, -20, 20)) and advantage A:
 *   l1 = -A r,  l2 = -A clip(r, 1 - clip_low, 1 + clip_high),  l = max(l1, l2)
 *   dual clip (clip_c > 1): where A < 0, l = min(l, -A clip_c)
 * L = agg(l); dlogp_t = dL/dlogp_t. Statistics are token means over the mask. */
typedef struct ff_rlhf_ppo_cfg {
    double clip_low;  /* epsilon below 1 (verl clip_ratio_low, 0.2) */
    double clip_high; /* epsilon above 1 (verl clip_ratio_high; DAPO's clip-higher uses 0.28) */
    double clip_c;    /* dual-clip bound (verl clip_ratio_c, 3.0); <= 1 turns dual clip off */
    ff_rlhf_agg_mode agg;
    double denom; /* see ff_rlhf_agg */
} ff_rlhf_ppo_cfg;

typedef struct ff_rlhf_pg_stats {
    double clipfrac;       /* fraction of tokens where the clipped term won (l2 > l1) */
    double clipfrac_lower; /* fraction where the dual clip bound won (A < 0) */
    double approx_kl;      /* mean of old_logp - logp (verl ppo_kl) */
    double ratio_mean, ratio_min, ratio_max;
} ff_rlhf_pg_stats;

/* Returns L. dlogp [T] (may be NULL), stats (may be NULL). */
double ff_rlhf_ppo_loss(const ff_rlhf_ppo_cfg *cfg, const ff_rlhf_seqs *s, const float *logp, const float *old_logp,
                        const float *adv, float *dlogp, ff_rlhf_pg_stats *stats);

/* Plain policy gradient (REINFORCE / verl's "gpg"): l = -A logp; dl/dlogp = -A. */
double ff_rlhf_pg_loss(ff_rlhf_agg_mode agg, double denom, const ff_rlhf_seqs *s, const float *logp, const float *adv,
                       float *dlogp);

/* ---- clipped value loss ------------------------------------------------------------------ */
/* vc = clip(v, old_v - clip, old_v + clip);  l = max((v - R)^2, (vc - R)^2);  L = 0.5 agg(l).
 * clip <= 0 turns clipping off (l = (v - R)^2). clipfrac: token mean of [(vc-R)^2 > (v-R)^2]. */
typedef struct ff_rlhf_value_cfg {
    double clip; /* verl critic.cliprange_value (0.5) */
    ff_rlhf_agg_mode agg;
    double denom;
} ff_rlhf_value_cfg;

double ff_rlhf_value_loss(const ff_rlhf_value_cfg *cfg, const ff_rlhf_seqs *s, const float *v, const float *old_v,
                          const float *ret, float *dv, double *clipfrac);

/* ---- KL estimators (Schulman's k1, k2, k3) ---------------------------------------------- */
/* Per token, with d = logp - ref:
 *   k1 "kl"          d                                   d/dlogp: 1
 *   abs "abs"        |d|                                 sign(d)
 *   k2 "mse"         d^2 / 2                             d
 *   k3 "low_var_kl"  clamp(e^q - q - 1, -10, 10), q = clamp(-d, -20, 20)
 *                                                        1 - e^q (0 where a clamp is active) */
typedef enum { FF_RLHF_KL_K1 = 0, FF_RLHF_KL_ABS, FF_RLHF_KL_K2, FF_RLHF_KL_K3, FF_RLHF_KL_COUNT } ff_rlhf_kl_kind;

const char *ff_rlhf_kl_name(ff_rlhf_kl_kind k);
/* verl names and aliases: kl|k1, abs, mse|k2, low_var_kl|k3. 0, or -1 + error. */
int ff_rlhf_kl_parse(const char *name, ff_rlhf_kl_kind *out);

/* kl [T] and dkl [T] = d kl / d logp (either may be NULL). */
void ff_rlhf_kl(ff_rlhf_kl_kind kind, int64_t T, const float *logp, const float *ref, float *kl, float *dkl);

/* KL as a loss term: L = agg(kl); dlogp [T] (may be NULL) gets dL/dlogp. */
double ff_rlhf_kl_loss(ff_rlhf_kl_kind kind, ff_rlhf_agg_mode agg, double denom, const ff_rlhf_seqs *s, const float *logp,
                       const float *ref, float *dlogp);

/* KL as a reward penalty: out_t = scores_t - coef * kl_t * m_t (verl apply_kl_penalty).
 * out may alias scores. */
void ff_rlhf_kl_penalty(const ff_rlhf_seqs *s, const float *token_scores, const float *kl, double coef, float *out);

/* The KL coefficient controller (verl kl_ctrl): fixed, or adaptive (Ziegler et al.):
 *   e = clip(kl / target - 1, -0.2, 0.2);  coef *= 1 + e * n_steps / horizon */
typedef struct ff_rlhf_kl_ctl {
    double coef;
    bool adaptive;
    double target;  /* target KL (adaptive) */
    double horizon; /* steps (adaptive) */
} ff_rlhf_kl_ctl;
void ff_rlhf_kl_ctl_update(ff_rlhf_kl_ctl *c, double current_kl, int64_t n_steps);

/* ---- advantages and returns -------------------------------------------------------------- */
/* Sequence score = sum of its token rewards (masked or not, as verl). scores [n_seq]. */
void ff_rlhf_seq_scores(const ff_rlhf_seqs *s, const float *token_rewards, float *scores);
/* Token rewards from sequence scores: the score sits on the last counted token of each
 * sequence, zeros elsewhere (a sequence with no counted token gets nothing). out [T]. */
void ff_rlhf_scores_to_tokens(const ff_rlhf_seqs *s, const float *scores, float *out);

/* GAE (Schulman et al. 2016) per sequence, by the backward recursion:
 *   delta_t = r_t + gamma V_{t'} - V_t,  A_t = delta_t + gamma lam A_{t'}
 * where t' is the next counted token of the same sequence (V, A = 0 past the end). Tokens
 * with m_t = 0 are skipped by the recursion: they get the A of the next counted token, as
 * verl does for observation tokens, and their own V in ret. ret_t = A_t + V_t for every
 * token. adv and ret are [T]; no whitening here. */
void ff_rlhf_gae(const ff_rlhf_seqs *s, const float *rewards, const float *values, double gamma, double lam, float *adv,
                 float *ret);

/* The same GAE as one matrix product (RLHFuse): the counted tokens of each sequence are
 * gathered into a padded matrix of deltas D [B, L], and A = D C with the lower-triangular
 * C [L, L], C[l][t] = (gamma lam)^(l - t) for l >= t, else 0; that is
 * A[b][t] = sum_{l >= t} (gamma lam)^(l - t) D[b][l]. Equal to ff_rlhf_gae up to rounding.
 * 0, or -1 + error when allocation fails. */
int ff_rlhf_gae_matrix(const ff_rlhf_seqs *s, const float *rewards, const float *values, double gamma, double lam,
                       float *adv, float *ret);

/* Masked whitening (verl masked_whiten): mean and unbiased variance over counted tokens;
 * out_t = (x_t - mean) / sqrt(var + 1e-8), plus mean again when !shift_mean. Applied to every
 * token (counted or not). out may alias x. One counted token or fewer: out = x - mean
 * (variance undefined; nothing is scaled). */
void ff_rlhf_whiten(const ff_rlhf_seqs *s, const float *x, bool shift_mean, float *out);

/* Outcome advantages: one scalar per sequence broadcast over its tokens (times the mask).
 * group [n_seq] holds each sequence's group (prompt) id in [0, n_seq); sequences with the
 * same id are the n responses to one prompt. adv [T]. 0, or -1 + error (a bad group id). */

/* GRPO: a_i = (r_i - mean_g) / (std_g + eps), std unbiased; norm_by_std = false gives
 * r_i - mean_g (Dr. GRPO). A group of one has mean 0 and std 1 (as verl). */
int ff_rlhf_grpo(const ff_rlhf_seqs *s, const float *scores, const int32_t *group, bool norm_by_std, double eps, float *adv);
/* RLOO: a_i = r_i - mean of the other responses of the group = n/(n-1) (r_i - mean_g);
 * a group of one gets a_i = r_i. */
int ff_rlhf_rloo(const ff_rlhf_seqs *s, const float *scores, const int32_t *group, float *adv);
/* REINFORCE++: discounted returns G_t = r_t + gamma G_{t'} per sequence (t' as in GAE), then
 * adv = whiten(G) over the whole batch, times the mask. ret [T] = G. */
void ff_rlhf_reinforce_pp(const ff_rlhf_seqs *s, const float *token_rewards, double gamma, float *adv, float *ret);
/* ReMax: ret_t = sum of the sequence's rewards from t on (gamma = 1); adv_t = (ret_t -
 * baseline_s) m_t, baseline [n_seq] = reward of the greedy response to the same prompt. */
void ff_rlhf_remax(const ff_rlhf_seqs *s, const float *token_rewards, const float *baseline, float *adv, float *ret);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
