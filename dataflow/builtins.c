/* The built-in advantage estimators, policy losses and KL estimators: thin adapters from
 * the registry's callbacks (registry.h) to the math of include/fuseflow/rlhf.h, with their
 * parameters read from the graph node (verl's names where verl has them).
 *
 * Not here: the math itself (kernels/rlhf/), rewards (reward.c; the `remote` reward is the RL
 * controller's, controller/rl/reward_remote.c). */
#include <stdlib.h>
#include <string.h>

#include "dataflow/internal.h"
#include "fuseflow/error.h"
#include "fuseflow/registry.h"
#include "fuseflow/rlhf.h"
#include "fuseflow/util.h"

/* Read a double in [lo, hi] (params may be NULL: the default). */
static int get_range(ff_cnode *params, const char *key, double dflt, double lo, double hi, double *out) {
    *out = dflt;
    if (!params) return 0;
    if (ff_cnode_get_double(params, key, dflt, out) < 0) return -1;
    if (*out < lo || *out > hi) {
        char w[256];
        ff_cnode *n = ff_cnode_find(params, key);
        return ff_error_set(n ? ff_cnode_where(n, w, sizeof w) : key, NULL, "'%s' must be in [%g, %g], got %g", key, lo, hi,
                            *out);
    }
    return 0;
}

static int get_flag(ff_cnode *params, const char *key, bool dflt, bool *out) {
    *out = dflt;
    return params && ff_cnode_get_bool(params, key, dflt, out) < 0 ? -1 : 0;
}

/* The sequence scores and a zero-length-safe temporary. */
static float *seq_scores(const ff_adv_batch *in) {
    float *s = ff_malloc(sizeof(float) * (size_t)(in->seqs.n_seq > 0 ? in->seqs.n_seq : 1));
    if (s) ff_rlhf_seq_scores(&in->seqs, in->token_rewards, s);
    return s;
}

/* ---- GAE --------------------------------------------------------------------------------- */

typedef struct gae_state {
    double gamma, lam;
    bool whiten;
} gae_state;

static int gae_create(ff_cnode *p, void **state) {
    gae_state *s = ff_calloc(1, sizeof *s);
    if (!s) return -1;
    if (get_range(p, "gamma", 1.0, 0, 1, &s->gamma) || get_range(p, "lam", 1.0, 0, 1, &s->lam) ||
        get_flag(p, "whiten", true, &s->whiten)) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static ff_granularity gae_granularity(const void *state) {
    return ((const gae_state *)state)->whiten ? FF_GRAN_BATCH : FF_GRAN_SAMPLE;
}

static int gae_compute(void *state, const ff_adv_batch *in, float *adv, float *ret) {
    gae_state *s = state;
    ff_rlhf_gae(&in->seqs, in->token_rewards, in->values, s->gamma, s->lam, adv, ret);
    if (s->whiten) ff_rlhf_whiten(&in->seqs, adv, true, adv);
    return 0;
}

/* ---- GRPO, RLOO -------------------------------------------------------------------------- */

typedef struct grpo_state {
    bool norm_by_std;
    double eps;
} grpo_state;

static int grpo_create(ff_cnode *p, void **state) {
    grpo_state *s = ff_calloc(1, sizeof *s);
    if (!s) return -1;
    if (get_flag(p, "norm_by_std", true, &s->norm_by_std) || get_range(p, "eps", 1e-6, 0, 1, &s->eps)) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int grpo_compute(void *state, const ff_adv_batch *in, float *adv, float *ret) {
    grpo_state *s = state;
    float *sc = seq_scores(in);
    if (!sc) return -1;
    int rc = ff_rlhf_grpo(&in->seqs, sc, in->group, s->norm_by_std, s->eps, adv);
    free(sc);
    if (rc == 0) memcpy(ret, adv, sizeof(float) * (size_t)ff_rlhf_seqs_tokens(&in->seqs));
    return rc;
}

static int rloo_compute(void *state, const ff_adv_batch *in, float *adv, float *ret) {
    (void)state;
    float *sc = seq_scores(in);
    if (!sc) return -1;
    int rc = ff_rlhf_rloo(&in->seqs, sc, in->group, adv);
    free(sc);
    if (rc == 0) memcpy(ret, adv, sizeof(float) * (size_t)ff_rlhf_seqs_tokens(&in->seqs));
    return rc;
}

/* ---- REINFORCE++, ReMax ------------------------------------------------------------------ */

typedef struct rpp_state {
    double gamma;
} rpp_state;

static int rpp_create(ff_cnode *p, void **state) {
    rpp_state *s = ff_calloc(1, sizeof *s);
    if (!s) return -1;
    if (get_range(p, "gamma", 1.0, 0, 1, &s->gamma)) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int rpp_compute(void *state, const ff_adv_batch *in, float *adv, float *ret) {
    ff_rlhf_reinforce_pp(&in->seqs, in->token_rewards, ((rpp_state *)state)->gamma, adv, ret);
    return 0;
}

static int remax_compute(void *state, const ff_adv_batch *in, float *adv, float *ret) {
    (void)state;
    ff_rlhf_remax(&in->seqs, in->token_rewards, in->baseline, adv, ret);
    return 0;
}

/* ---- policy losses ----------------------------------------------------------------------- */

typedef struct ppo_state {
    ff_rlhf_ppo_cfg cfg;
} ppo_state;

static int read_agg(ff_cnode *p, ff_rlhf_agg_mode *out) {
    *out = FF_RLHF_AGG_TOKEN_MEAN;
    if (!p) return 0;
    static const char *const names[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"};
    int v;
    if (ff_cnode_get_enum(p, "loss_agg_mode", names, 3, FF_RLHF_AGG_TOKEN_MEAN, &v) < 0) return -1;
    *out = (ff_rlhf_agg_mode)v;
    return 0;
}

static int ppo_create(ff_cnode *p, void **state) {
    ppo_state *s = ff_calloc(1, sizeof *s);
    if (!s) return -1;
    double clip;
    /* verl: clip_ratio sets both sides; clip_ratio_low / clip_ratio_high override one side */
    if (get_range(p, "clip_ratio", 0.2, 0, 10, &clip) || get_range(p, "clip_ratio_low", clip, 0, 1, &s->cfg.clip_low) ||
        get_range(p, "clip_ratio_high", clip, 0, 10, &s->cfg.clip_high) ||
        get_range(p, "clip_ratio_c", 3.0, 0, 1e6, &s->cfg.clip_c) || read_agg(p, &s->cfg.agg)) {
        free(s);
        return -1;
    }
    if (s->cfg.clip_c != 0 && s->cfg.clip_c <= 1) {
        free(s);
        char w[256];
        ff_cnode *n = ff_cnode_find(p, "clip_ratio_c");
        return ff_error_set(n ? ff_cnode_where(n, w, sizeof w) : "clip_ratio_c", "use a bound above 1 (verl: 3.0), or 0 to turn dual clip off",
                            "clip_ratio_c must be > 1");
    }
    *state = s;
    return 0;
}

static int ppo_compute(void *state, const ff_pg_batch *in, double *loss, float *dlogp, ff_rlhf_pg_stats *stats) {
    ff_rlhf_ppo_cfg cfg = ((ppo_state *)state)->cfg;
    cfg.denom = in->denom;
    *loss = ff_rlhf_ppo_loss(&cfg, &in->seqs, in->logp, in->old_logp, in->adv, dlogp, stats);
    return 0;
}

static ff_rlhf_agg_mode ppo_agg(const void *state) { return ((const ppo_state *)state)->cfg.agg; }

typedef struct gpg_state {
    ff_rlhf_agg_mode agg;
} gpg_state;

static int gpg_create(ff_cnode *p, void **state) {
    gpg_state *s = ff_calloc(1, sizeof *s);
    if (!s) return -1;
    if (read_agg(p, &s->agg)) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int gpg_compute(void *state, const ff_pg_batch *in, double *loss, float *dlogp, ff_rlhf_pg_stats *stats) {
    (void)stats;
    *loss = ff_rlhf_pg_loss(((gpg_state *)state)->agg, in->denom, &in->seqs, in->logp, in->adv, dlogp);
    return 0;
}

static ff_rlhf_agg_mode gpg_agg(const void *state) { return ((const gpg_state *)state)->agg; }

/* ---- KL ---------------------------------------------------------------------------------- */

#define KL_FN(fn, kind)                                                                        \
    static void fn(int64_t T, const float *logp, const float *ref, float *kl, float *dkl) {   \
        ff_rlhf_kl(kind, T, logp, ref, kl, dkl);                                               \
    }
KL_FN(kl_k1, FF_RLHF_KL_K1)
KL_FN(kl_abs, FF_RLHF_KL_ABS)
KL_FN(kl_k2, FF_RLHF_KL_K2)
KL_FN(kl_k3, FF_RLHF_KL_K3)

int ff_builtins_register(ff_registry *r) {
    const ff_advantage_def advs[] = {
        {"gae", "generalised advantage estimation with a critic (gamma, lam, whiten)", FF_ADV_NEEDS_VALUES, FF_GRAN_BATCH,
         gae_create, gae_granularity, gae_compute, free},
        {"grpo", "group-normalised outcome advantage, (r - mean) / (std + eps) (norm_by_std, eps)", 0, FF_GRAN_GROUP,
         grpo_create, NULL, grpo_compute, free},
        {"rloo", "leave-one-out baseline within each group", 0, FF_GRAN_GROUP, NULL, NULL, rloo_compute, NULL},
        {"reinforce_plus_plus", "discounted returns whitened over the batch (gamma)", 0, FF_GRAN_BATCH, rpp_create, NULL,
         rpp_compute, free},
        {"remax", "returns minus the greedy response's reward (needs a baseline column)", FF_ADV_NEEDS_BASELINE,
         FF_GRAN_SAMPLE, NULL, NULL, remax_compute, NULL},
    };
    for (size_t i = 0; i < sizeof advs / sizeof *advs; i++)
        if (ff_registry_add_advantage(r, &advs[i]) != 0) return -1;
    const ff_policy_loss_def losses[] = {
        {"vanilla", "PPO clipped surrogate, dual clip and clip-higher (clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode)",
         ppo_create, ppo_compute, free, ppo_agg},
        {"gpg", "plain policy gradient, -A logp (loss_agg_mode)", gpg_create, gpg_compute, free, gpg_agg},
    };
    for (size_t i = 0; i < sizeof losses / sizeof *losses; i++)
        if (ff_registry_add_policy_loss(r, &losses[i]) != 0) return -1;
    const ff_kl_def kls[] = {
        {"kl", "k1: logp - ref", kl_k1},
        {"k1", "k1: logp - ref (alias of kl)", kl_k1},
        {"abs", "|logp - ref|", kl_abs},
        {"mse", "k2: (logp - ref)^2 / 2", kl_k2},
        {"k2", "k2: (logp - ref)^2 / 2 (alias of mse)", kl_k2},
        {"low_var_kl", "k3: e^(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]", kl_k3},
        {"k3", "k3 (alias of low_var_kl)", kl_k3},
    };
    for (size_t i = 0; i < sizeof kls / sizeof *kls; i++)
        if (ff_registry_add_kl(r, &kls[i]) != 0) return -1;
    return ff_rewards_register(r);
}
