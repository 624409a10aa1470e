/* The node math the executor calls (dataflow/node_ops.c), on the examples' configs, against
 * values computed independently: by hand where the arithmetic is short (the comments show it),
 * else by tests/reference/ref_node_ops.py (verl's formulas in PyTorch, float64; its printed
 * values are the literals below). One packed batch of 3 sequences, T = 9, with a hole inside
 * sequence 1 and the last token of sequence 2 masked, so the score of sequence 2 sits on t = 7.
 * Covered: GAE with a KL penalty in the reward (and the adaptive coefficient feeding back into
 * it), GRPO, Dr. GRPO, RLOO, REINFORCE++ with a KL penalty, ReMax, the actor loss (PPO with
 * clip-higher and dual clip + k3 KL loss - entropy bonus: value, pieces, statistics, d/dlogp,
 * d/dentropy), the critic's clipped value loss, rewards and the group filter, and the misuse
 * paths. Not here: the rlhf.h kernels one by one (tests/rlhf/). */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/registry.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static ff_run_config *load(ff_registry *reg, const char *name, int n, char **over) {
    const char *src = getenv("FF_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/%s.yaml", src ? src : ".", name);
    ff_run_config *run = ff_run_config_load(path, n, over, reg);
    if (!run) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(run);
    return run;
}

static ff_node *node(ff_run_config *run, const char *name) {
    int i = ff_graph_find_node(run->graph, name);
    REQUIRE(i >= 0);
    return ff_graph_node_mut(run->graph, (size_t)i);
}

/* the batch, as in ref_node_ops.py */
#define T 9
static const int32_t off[4] = {0, 3, 7, 9};
static const float mask[T] = {1, 1, 1, 1, 1, 0, 1, 1, 0};
static const float scores[3] = {1.0f, 0.0f, 0.5f};
static const int32_t group[3] = {0, 0, 2}; /* a group of two, a group of one */
static const float values[T] = {0.5f, -0.25f, 0.125f, 0.25f, 0.75f, -1.0f, 0.375f, -0.5f, 2.0f};
static const float old_logp[T] = {-1.0f, -0.5f, -2.0f, -1.5f, -0.25f, -3.0f, -1.0f, -0.75f, -4.0f};
static const float ref_logp[T] = {-1.25f, -0.5f, -1.5f, -1.0f, -0.5f, -1.0f, -1.5f, -0.25f, -2.0f};
static const float baseline[3] = {0.25f, 0.5f, 1.0f};

static ff_rlhf_seqs seqs(void) { return (ff_rlhf_seqs){3, off, mask}; }

static void check_tokens(const char *what, const float *got, const double *want, double atol) {
    for (int t = 0; t < T; t++)
        if (!(fabs(got[t] - want[t]) <= atol + 1e-6 * fabs(want[t]))) {
            fprintf(stderr, "%s[%d] = %.9g, want %.9g\n", what, t, got[t], want[t]);
            CHECK(!"a token differs from the reference");
        }
}

static void advantage(ff_run_config *run, const float *base, float *adv, float *ret, double *mean_kl) {
    ff_node_adv_in in = {seqs(), scores, values, base, old_logp, ref_logp, group};
    DIE_IF(ff_node_advantage(node(run, "advantage"), &in, adv, ret, mean_kl));
}

static void test_gae_kl_penalty(ff_registry *reg) {
    /* ppo.yaml: GAE (lam 0.95; gamma 0.5 here, so that a dropped gamma shows), whitened; k1 KL
     * penalty with coef 0.02, adaptive controller (target 0.05, horizon 1000) */
    char *over[] = {"graph.advantage.gamma=0.5"};
    ff_run_config *run = load(reg, "ppo", 1, over);
    ff_node *n = node(run, "advantage");
    float adv[T], ret[T];
    double mean_kl;
    advantage(run, NULL, adv, ret, &mean_kl);
    /* k1 = old - ref on the 7 counted tokens: 0.25, 0, -0.5, -0.5, 0.25, 0.5, -0.5; mean -0.5/7 */
    CHECK_CLOSE(mean_kl, -0.5 / 7.0, 1e-9, 0);
    /* sequence 2 by hand: r_7 = 0.5 - 0.02 x (-0.5) = 0.51, delta_7 = 0.51 - (-0.5) = 1.01 = A_7,
     * ret_7 = A_7 + V_7 = 0.51; t = 8 is masked: A = 0 carried from past the end, ret = V = 2 */
    static const double want_adv[T] = {-0.594498912, 0.831015736, 1.04471804, -0.509571123, -1.25262562,
                                       -0.739353778, -0.739353778, 1.22031566,  -0.198513109};
    static const double want_ret[T] = {0.218115625, 0.482875, 1.01, 0.028571875, -0.000375, -1.385, -0.01, 0.51, 2};
    check_tokens("gae adv", adv, want_adv, 1e-6);
    check_tokens("gae ret", ret, want_ret, 1e-6);

    /* the adaptive coefficient: KL 1.0 against 0.05 is clipped to e = +0.2, so 100 steps of a
     * 1000-step horizon give 0.02 x (1 + 0.2 x 0.1) = 0.0204 */
    CHECK_CLOSE(n->kl_ctl.coef, 0.02, 0, 1e-12);
    ff_node_kl_ctl_update(n, 1.0, 100);
    CHECK_CLOSE(n->kl_ctl.coef, 0.0204, 0, 1e-12);
    /* the next advantage uses it: r_7 = 0.5 + 0.0204 x 0.5 = 0.5102 */
    advantage(run, NULL, adv, ret, NULL);
    static const double want_ret2[T] = {0.21806075, 0.48297, 1.0102, 0.02867925, -0.00057, -1.3852, -0.0102, 0.5102, 2};
    check_tokens("gae ret at coef 0.0204", ret, want_ret2, 1e-6);
    /* KL 0.04 (e = -0.2): 0.0204 x 0.98 = 0.019992; at the target nothing moves */
    ff_node_kl_ctl_update(n, 0.04, 100);
    CHECK_CLOSE(n->kl_ctl.coef, 0.019992, 0, 1e-9);
    ff_node_kl_ctl_update(n, 0.05, 100);
    CHECK_CLOSE(n->kl_ctl.coef, 0.019992, 0, 1e-9);

    /* missing inputs */
    ff_node_adv_in bad = {seqs(), scores, values, NULL, old_logp, NULL, group};
    CHECK_EQ_INT(ff_node_advantage(n, &bad, adv, ret, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "needs old_logp and ref_logp");
    bad.ref_logp = ref_logp, bad.values = NULL;
    CHECK_EQ_INT(ff_node_advantage(n, &bad, adv, ret, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "needs values");
    ff_run_config_destroy(&run);
}

static void test_outcome_advantages(ff_registry *reg) {
    float adv[T], ret[T];
    /* grpo.yaml: group 0 scores 1 and 0, mean 0.5, unbiased std sqrt(0.5): +-0.5 / (0.70710678 +
     * 1e-6) = +-0.707105781; the group of one has mean 0 and std 1: 0.5 / (1 + 1e-6) = 0.4999995.
     * Broadcast over each sequence, times the mask. */
    ff_run_config *run = load(reg, "grpo", 0, NULL);
    advantage(run, NULL, adv, ret, NULL);
    const double g = 0.707105781, g1 = 0.4999995;
    const double want_grpo[T] = {g, g, g, -g, -g, 0, -g, g1, 0};
    check_tokens("grpo adv", adv, want_grpo, 1e-7);
    check_tokens("grpo ret", ret, want_grpo, 1e-7);
    ff_run_config_destroy(&run);
    /* Dr. GRPO (norm_by_std false): r - mean, +-0.5; the group of one keeps its 0.5 */
    char *nostd[] = {"graph.advantage.norm_by_std=false"};
    run = load(reg, "grpo", 1, nostd);
    advantage(run, NULL, adv, ret, NULL);
    static const double want_dr[T] = {0.5, 0.5, 0.5, -0.5, -0.5, 0, -0.5, 0.5, 0};
    check_tokens("dr grpo adv", adv, want_dr, 1e-7);
    ff_run_config_destroy(&run);
    /* rloo.yaml: r_i minus the mean of the others, 1 - 0 = 1 and 0 - 1 = -1; alone, r = 0.5 */
    run = load(reg, "rloo", 0, NULL);
    advantage(run, NULL, adv, ret, NULL);
    static const double want_rloo[T] = {1, 1, 1, -1, -1, 0, -1, 0.5, 0};
    check_tokens("rloo adv", adv, want_rloo, 1e-7);
    ff_run_config_destroy(&run);

    /* reinforce_pp.yaml: k1 penalty 0.01, gamma 0.5 here. Returns by hand for sequence 1:
     * r_6 = 0 - 0.01 x 0.5 = -0.005, the hole carries G_6, r_4 = -0.01 x 0.25 = -0.0025,
     * G_4 = -0.0025 + 0.5 x (-0.005) = -0.005, r_3 = 0.005, G_3 = 0.005 - 0.0025 = 0.0025;
     * then whitened over the 7 counted tokens (reference), times the mask */
    char *rpp[] = {"graph.advantage.gamma=0.5"};
    run = load(reg, "reinforce_pp", 1, rpp);
    advantage(run, NULL, adv, ret, NULL);
    static const double want_rpp_ret[T] = {0.24875, 0.5025, 1.005, 0.0025, -0.005, -0.005, -0.005, 0.505, 0};
    static const double want_rpp_adv[T] = {-0.19407857, 0.478569351, 1.81061105, -0.846845271, -0.86672649,
                                           0,           -0.86672649, 0.485196424, 0};
    check_tokens("reinforce++ ret", ret, want_rpp_ret, 1e-7);
    check_tokens("reinforce++ adv", adv, want_rpp_adv, 1e-6);
    ff_run_config_destroy(&run);

    /* remax.yaml: the return is the score up to the scored token (0 after it), minus the
     * greedy baseline: 1 - 0.25, 0 - 0.5, 0.5 - 1.0, times the mask */
    run = load(reg, "remax", 0, NULL);
    advantage(run, baseline, adv, ret, NULL);
    static const double want_remax_ret[T] = {1, 1, 1, 0, 0, 0, 0, 0.5, 0};
    static const double want_remax_adv[T] = {0.75, 0.75, 0.75, -0.5, -0.5, 0, -0.5, -0.5, 0};
    check_tokens("remax ret", ret, want_remax_ret, 1e-7);
    check_tokens("remax adv", adv, want_remax_adv, 1e-7);
    ff_run_config_destroy(&run);
}

static void test_critic_loss(ff_registry *reg) {
    /* ppo.yaml's critic: cliprange_value 0.5, token-mean. Per counted token, with vc = v clipped
     * to old +- 0.5, l = max((v - R)^2, (vc - R)^2):
     *   t0 0.25 | t1 2.25 | t2 0.5625 | t3 v = 2 clipped to 1, R = 2: max(0, 1) = 1, the clipped
     *   term wins (d/dv 0) | t4 0.5625 | t6 0.0625 | t7 0.25
     * loss = 0.5 x 4.9375 / 7 = 0.352678571; clipfrac 1/7; dv = 0.5 x 2 (v - R) / 7 where the
     * unclipped term wins */
    ff_run_config *run = load(reg, "ppo", 0, NULL);
    ff_node *critic = node(run, "train_critic"), *actor = node(run, "train_actor");
    static const float v[T] = {0.5f, 1.5f, -0.25f, 2.0f, 2.0f, 9.0f, 0.25f, -1.5f, 7.0f};
    static const float old_v[T] = {0.25f, 0.5f, 0.0f, 0.5f, 1.0f, 0.0f, 0.25f, -0.5f, 0.0f};
    static const float R[T] = {1.0f, 0.0f, -1.0f, 2.0f, 1.25f, 0.0f, 0.5f, -1.0f, 0.0f};
    ff_critic_loss_in cin = {seqs(), v, old_v, R, 0};
    CHECK_CLOSE(ff_node_loss_denom(critic, &cin.seqs), 7, 0, 0);
    double loss, clipfrac;
    float dv[T];
    REQUIRE(ff_node_critic_loss(critic, &cin, &loss, dv, &clipfrac) == 0);
    CHECK_CLOSE(loss, 4.9375 / 14.0, 1e-12, 0);
    CHECK_CLOSE(clipfrac, 1.0 / 7.0, 1e-12, 0);
    const double want_dv[T] = {-0.5 / 7, 1.5 / 7, 0.75 / 7, 0, 0.75 / 7, 0, -0.25 / 7, -0.5 / 7, 0};
    check_tokens("critic dv", dv, want_dv, 1e-8);
    CHECK_EQ_INT(ff_node_critic_loss(actor, &cin, &loss, dv, &clipfrac), -1);
    CHECK_EQ_INT(ff_node_actor_loss(critic, NULL, NULL), -1);
    ff_run_config_destroy(&run);
}

static void test_actor_loss(ff_registry *reg) {
    char *over[] = {"graph.train_actor.entropy_coeff=0.01", "graph.train_actor.kl_loss.coef=0.5",
                    "graph.train_actor.loss_agg_mode=seq-mean-token-mean", "graph.train_actor.clip_ratio_high=0.28"};
    ff_run_config *run = load(reg, "grpo", 4, over);
    ff_node *actor = node(run, "train_actor");
    /* logp - old = d, and the advantage, per token:
     *   t0 d 0, A 1: r 1, unclipped             t1 d 0.5, A 1: r 1.6487 > 1.28, clipped
     *   t2 d -0.5, A 1: r 0.6065 < 0.8, the unclipped term wins (max), d/dlogp -A r
     *   t3 d -0.5, A -1: clipped at 0.8         t4 d 1.5, A -1: r 4.48, dual clip at 3
     *   t6 d 0.125, A -0.5: unclipped           t7 d 0.1875, A 2: r 1.2062, inside [0.8, 1.28]
     *                                           (it would be clipped at a clip_ratio_high of 0.2)
     * t5 (hole) and t8 (masked) carry garbage that must not count. */
    static const float old[T] = {-2, -2, -2, -2, -2, -2, -2, -2, -2};
    static const float logp[T] = {-2.0f, -1.5f, -2.5f, -2.5f, -0.5f, -2.0f, -1.875f, -1.8125f, -2.0f};
    static const float adv[T] = {1, 1, 1, -1, -1, 5, -0.5f, 2, 5};
    static const float ref[T] = {-2.25f, -1.5f, -2.0f, -3.0f, -1.0f, -2.0f, -1.5f, -2.0f, -2.0f};
    static const float ent[T] = {0.5f, 1.0f, 1.5f, 2.0f, 0.25f, 9.0f, 0.75f, 1.25f, 9.0f};
    ff_rlhf_seqs s = seqs();
    ff_actor_loss_in in = {s, logp, old, adv, ref, ent, ff_node_loss_denom(actor, &s)};
    CHECK_CLOSE(in.denom, 3, 0, 0); /* seq-mean-token-mean: three sequences */
    float d[T], dent[T];
    ff_actor_loss_out out = {.dlogp = d, .dentropy = dent};
    REQUIRE(ff_node_actor_loss(actor, &in, &out) == 0);
    /* entropy by hand: per sequence means 1, 1, 1.25; their mean 13/12. The rest: reference. */
    CHECK_CLOSE(out.entropy, 13.0 / 12.0, 1e-9, 0);
    CHECK_CLOSE(out.pg_loss, -0.639704214, 1e-8, 0);
    CHECK_CLOSE(out.kl_loss, 0.0577957936, 1e-8, 0);
    CHECK_CLOSE(out.loss, -0.621639651, 1e-8, 0); /* pg + 0.5 kl - 0.01 entropy */
    /* statistics over the 7 counted tokens: clipped t1, t3; dual clip t4; mean of old - logp
     * = -(0 + 0.5 - 0.5 - 0.5 + 1.5 + 0.125 + 0.1875) / 7 = -0.1875; largest ratio e^1.5 */
    CHECK_CLOSE(out.stats.clipfrac, 2.0 / 7.0, 1e-12, 0);
    CHECK_CLOSE(out.stats.clipfrac_lower, 1.0 / 7.0, 1e-12, 0);
    CHECK_CLOSE(out.stats.approx_kl, -0.1875, 1e-9, 0);
    CHECK_CLOSE(out.stats.ratio_max, 4.48168907, 1e-7, 0);
    /* d loss / d logp by autograd in the reference; by hand for t7: w = 1/3, the surrogate gives
     * -A r = -2 e^0.1875 and 0.5 k3 gives 0.5 (1 - e^(ref - logp)) = 0.5 (1 - e^-0.1875):
     * (-2.41246 + 0.08548) / 3 = -0.775658 */
    static const double want_d[T] = {-0.0988222657, 0, -0.103432366, 0.0218594078, 0.0218594078, 0, 0.037675391, -0.775658353, 0};
    check_tokens("actor dlogp", d, want_d, 1e-8);
    /* d loss / d entropy = -0.01 w: w = 1/9 on sequences 0 and 1, 1/3 on sequence 2's token */
    const double want_dent[T] = {-0.01 / 9, -0.01 / 9, -0.01 / 9, -0.01 / 9, -0.01 / 9, 0, -0.01 / 9, -0.01 / 3, 0};
    check_tokens("actor dentropy", dent, want_dent, 1e-10);
    /* without ref_logp the KL loss cannot run */
    in.ref_logp = NULL;
    CHECK_EQ_INT(ff_node_actor_loss(actor, &in, &out), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "kl_loss needs ref_logp");

    /* rewards and filters */
    ff_node *rw = node(run, "reward");
    ff_reward_item items[2] = {{"1+1=", "2", "2", NULL}, {"1+1=", "3", "2", NULL}};
    float sc[2];
    REQUIRE(ff_node_reward(rw, items, 2, sc) == 0);
    CHECK(sc[0] == 1 && sc[1] == 0);
    CHECK_EQ_INT(ff_node_reward(actor, items, 2, sc), -1);
    float same[3] = {1, 1, 1}, mixed[3] = {1, 0, 1}, last[3] = {1, 1, 0};
    CHECK(!ff_node_filter_keep(rw, same, 3));
    CHECK(ff_node_filter_keep(rw, mixed, 3));
    CHECK(ff_node_filter_keep(rw, last, 3));
    ff_run_config_destroy(&run);
}

int main(void) {
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    test_gae_kl_penalty(reg);
    test_outcome_advantages(reg);
    test_critic_loss(reg);
    test_actor_loss(reg);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}
