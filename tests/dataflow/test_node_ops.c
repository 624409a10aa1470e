/* The node math the executor calls, on the PPO and GRPO examples: advantages with a KL
 * penalty equal the rlhf.h pieces put together by hand; the actor loss is the policy loss
 * plus the KL loss minus the entropy bonus, with d/dlogp checked by finite differences and
 * d/dentropy exact; the critic loss is the clipped value loss; the adaptive KL coefficient
 * moves; and the misuse paths fail cleanly. */
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

#define T 12
static int32_t off[4] = {0, 5, 9, 12};
static float mask[T] = {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1};
static int32_t group[3] = {0, 0, 1};

static void fill(ff_rng *r, float *x, double scale) {
    for (int t = 0; t < T; t++) x[t] = (float)(ff_rng_normal(r) * scale);
}

static void test_ppo_nodes(ff_registry *reg) {
    ff_run_config *run = load(reg, "ppo", 0, NULL);
    ff_node *adv = node(run, "advantage"), *actor = node(run, "train_actor"), *critic = node(run, "train_critic");
    ff_rng r;
    ff_rng_seed(&r, 4);
    float values[T], old[T], ref[T], a[T], ret[T], a2[T], r2[T], tr[T], kl[T];
    float scores[3] = {1, 0, 0.1f};
    fill(&r, values, 1), fill(&r, old, 1), fill(&r, ref, 1);
    ff_rlhf_seqs s = {3, off, mask};
    ff_node_adv_in in = {s, scores, values, NULL, old, ref, group};
    double mean_kl;
    REQUIRE(ff_node_advantage(adv, &in, a, ret, &mean_kl) == 0);
    /* by hand: score on the last token, minus 0.02 * (old - ref), GAE(1, 0.95), whitened */
    ff_rlhf_scores_to_tokens(&s, scores, tr);
    ff_rlhf_kl(FF_RLHF_KL_K1, T, old, ref, kl, NULL);
    CHECK_CLOSE(mean_kl, ff_rlhf_masked_mean(&s, kl), 1e-12, 1e-9);
    ff_rlhf_kl_penalty(&s, tr, kl, 0.02, tr);
    ff_rlhf_gae(&s, tr, values, 1.0, 0.95, a2, r2);
    ff_rlhf_whiten(&s, a2, true, a2);
    for (int t = 0; t < T; t++) {
        CHECK_CLOSE(a[t], a2[t], 1e-6, 1e-6);
        CHECK_CLOSE(ret[t], r2[t], 1e-6, 1e-6);
    }
    /* the adaptive controller: KL above target raises the coefficient */
    double c0 = adv->kl_ctl.coef;
    ff_node_kl_ctl_update(adv, 1.0, 100);
    CHECK(adv->kl_ctl.coef > c0);
    /* missing inputs */
    ff_node_adv_in bad = in;
    bad.ref_logp = NULL;
    CHECK_EQ_INT(ff_node_advantage(adv, &bad, a, ret, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "needs old_logp and ref_logp");
    bad = in;
    bad.values = NULL;
    CHECK_EQ_INT(ff_node_advantage(adv, &bad, a, ret, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "needs values");

    /* the critic: 0.5 * agg(max of clipped and unclipped squared error), clip 0.5 */
    float v[T], dv[T], dv2[T];
    for (int t = 0; t < T; t++) v[t] = values[t] + (float)(ff_rng_normal(&r) * 0.7);
    ff_critic_loss_in cin = {s, v, values, ret, 0};
    double closs, cf;
    REQUIRE(ff_node_critic_loss(critic, &cin, &closs, dv, &cf) == 0);
    ff_rlhf_value_cfg vc = {0.5, FF_RLHF_AGG_TOKEN_MEAN, 0};
    CHECK_CLOSE(closs, ff_rlhf_value_loss(&vc, &s, v, values, ret, dv2, NULL), 1e-12, 1e-9);
    for (int t = 0; t < T; t++) CHECK_CLOSE(dv[t], dv2[t], 1e-9, 1e-6);
    CHECK_EQ_INT(ff_node_critic_loss(actor, &cin, &closs, dv, &cf), -1);
    CHECK_EQ_INT(ff_node_actor_loss(critic, NULL, NULL), -1);
    ff_run_config_destroy(&run);
}

static double total_loss(ff_node *n, const ff_actor_loss_in *in, float *dlogp, float *dent) {
    ff_actor_loss_out out = {.dlogp = dlogp, .dentropy = dent};
    REQUIRE(ff_node_actor_loss(n, in, &out) == 0);
    CHECK_CLOSE(out.loss, out.pg_loss + n->train.kl_loss_coef * out.kl_loss - n->train.entropy_coeff * out.entropy, 1e-12, 1e-9);
    return out.loss;
}

static void test_actor_loss(ff_registry *reg) {
    char *over[] = {"graph.train_actor.entropy_coeff=0.01", "graph.train_actor.kl_loss.coef=0.5",
                    "graph.train_actor.loss_agg_mode=seq-mean-token-mean", "graph.train_actor.clip_ratio_high=0.28"};
    ff_run_config *run = load(reg, "grpo", 4, over);
    ff_node *actor = node(run, "train_actor");
    ff_rng r;
    ff_rng_seed(&r, 5);
    float logp[T], old[T], ref[T], adv[T], ent[T], d[T], dent[T];
    fill(&r, old, 1), fill(&r, ref, 1), fill(&r, adv, 1);
    for (int t = 0; t < T; t++) logp[t] = old[t] + (float)(ff_rng_normal(&r) * 0.3), ent[t] = (float)ff_rng_uniform(&r);
    ff_rlhf_seqs s = {3, off, mask};
    ff_actor_loss_in in = {s, logp, old, adv, ref, ent, ff_node_loss_denom(actor, &s)};
    CHECK_CLOSE(in.denom, 3, 0, 0); /* seq-mean-token-mean: three sequences */
    double L = total_loss(actor, &in, d, dent);
    /* the pieces: PPO (0.2 / 0.28, dual clip 3) + 0.5 k3 - 0.01 entropy, all seq-mean-token-mean */
    ff_rlhf_ppo_cfg pc = {0.2, 0.28, 3.0, FF_RLHF_AGG_SEQ_MEAN_TOKEN_MEAN, 3};
    double want = ff_rlhf_ppo_loss(&pc, &s, logp, old, adv, NULL, NULL) +
                  0.5 * ff_rlhf_kl_loss(FF_RLHF_KL_K3, FF_RLHF_AGG_SEQ_MEAN_TOKEN_MEAN, 3, &s, logp, ref, NULL) -
                  0.01 * ff_rlhf_agg(FF_RLHF_AGG_SEQ_MEAN_TOKEN_MEAN, &s, ent, 3, NULL);
    CHECK_CLOSE(L, want, 1e-9, 1e-6); /* the KL passes through fp32 per-token values */
    /* d loss / d logp by central differences; d loss / d entropy = -0.01 w exactly */
    for (int t = 0; t < T; t++) {
        float x = logp[t];
        logp[t] = x + 1e-3f;
        double lp = total_loss(actor, &in, NULL, NULL);
        logp[t] = x - 1e-3f;
        double lm = total_loss(actor, &in, NULL, NULL);
        logp[t] = x;
        double fd = (lp - lm) / ((double)(x + 1e-3f) - (double)(x - 1e-3f));
        CHECK_CLOSE(d[t], fd, 1e-5, 2e-3);
        float e = ent[t];
        ent[t] = e + 0.5f;
        double le = total_loss(actor, &in, NULL, NULL);
        ent[t] = e;
        CHECK_CLOSE(dent[t], (le - L) / 0.5, 1e-7, 1e-5);
    }
    /* without ref_logp the KL loss cannot run */
    in.ref_logp = NULL;
    ff_actor_loss_out out = {.dlogp = d};
    CHECK_EQ_INT(ff_node_actor_loss(actor, &in, &out), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "kl_loss needs ref_logp");

    /* rewards and filters */
    ff_node *rw = node(run, "reward");
    ff_reward_item items[2] = {{"1+1=", "2", "2", NULL}, {"1+1=", "3", "2", NULL}};
    float sc[2];
    REQUIRE(ff_node_reward(rw, items, 2, sc) == 0);
    CHECK(sc[0] == 1 && sc[1] == 0);
    CHECK_EQ_INT(ff_node_reward(actor, items, 2, sc), -1);
    float same[3] = {1, 1, 1}, mixed[3] = {1, 0, 1};
    CHECK(!ff_node_filter_keep(rw, same, 3));
    CHECK(ff_node_filter_keep(rw, mixed, 3));
    ff_run_config_destroy(&run);
}

int main(void) {
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    test_ppo_nodes(reg);
    test_actor_loss(reg);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}
