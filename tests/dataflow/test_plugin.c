/* Registries and C plugins: the built-ins are there; the example plugin
 * (examples/plugins/example_plugin.c, built as FF_BUILD_DIR/example_plugin.so) loads, and what
 * it registers works, also from a run config; and the error paths: a missing file, a file
 * that is not a library, a library without ff_plugin_init, a plugin loaded twice, a plugin
 * whose names clash, duplicate and nameless definitions. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/registry.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static char plugin_path[1024];

static void test_builtins(void) {
    ff_registry *r = ff_registry_new();
    REQUIRE(r);
    const char *names[32];
    size_t n = ff_registry_names(r, FF_REG_ADVANTAGE, names, 32);
    CHECK_EQ_INT(n, 5);
    CHECK(!strcmp(names[0], "gae") && !strcmp(names[1], "grpo") && !strcmp(names[4], "remax"));
    CHECK(ff_registry_policy_loss(r, "vanilla") && ff_registry_policy_loss(r, "gpg"));
    CHECK(ff_registry_kl(r, "low_var_kl") && ff_registry_kl(r, "k3") && ff_registry_kl(r, "mse"));
    CHECK(ff_registry_reward(r, "arith_exact_match") && ff_registry_reward(r, "format"));
    CHECK(ff_registry_origin(r, FF_REG_ADVANTAGE, "gae") == NULL);
    CHECK(ff_registry_advantage(r, "nope") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown advantage estimator 'nope'");
    /* duplicate or nameless definitions */
    ff_advantage_def d = *ff_registry_advantage(r, "grpo");
    CHECK_EQ_INT(ff_registry_add_advantage(r, &d), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "already registered");
    d.name = "";
    CHECK_EQ_INT(ff_registry_add_advantage(r, &d), -1);
    d.name = "no_compute", d.compute = NULL;
    CHECK_EQ_INT(ff_registry_add_advantage(r, &d), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no compute callback");

    /* the built-in instances compute what rlhf.h computes */
    int32_t off[3] = {0, 2, 5};
    float mask[5] = {1, 1, 1, 1, 0}, tr[5] = {0, 1, 0, 0, 0}, adv[5], ret[5];
    int32_t group[2] = {0, 0};
    ff_adv_batch in = {{2, off, mask}, tr, NULL, group, NULL};
    ff_advantage *a = ff_advantage_new(r, "grpo", NULL);
    REQUIRE(a);
    CHECK_EQ_INT(ff_advantage_granularity(a), FF_GRAN_GROUP);
    REQUIRE(ff_advantage_compute(a, &in, adv, ret) == 0);
    /* scores 1 and 0: mean 0.5, std 0.7071 -> +-0.7071 */
    CHECK_CLOSE(adv[0], 0.70710678 / (1 + 1e-6 / 0.70710678), 1e-5, 0);
    CHECK_CLOSE(adv[2], -0.70710678, 1e-5, 0);
    CHECK_CLOSE(adv[4], 0, 0, 0);
    ff_advantage_destroy(&a);
    CHECK(a == NULL);
    a = ff_advantage_new(r, "gae", NULL);
    REQUIRE(a);
    CHECK_EQ_INT(ff_advantage_compute(a, &in, adv, ret), -1); /* no values */
    CHECK_STR_CONTAINS(ff_error_message(), "needs values");
    ff_advantage_destroy(&a);
    ff_registry_destroy(&r);
}

static void test_example_plugin(void) {
    if (access(plugin_path, R_OK) != 0) {
        fprintf(stderr, "%s is missing: build the target ff_example_plugin\n", plugin_path);
        CHECK(0);
        return;
    }
    ff_registry *r = ff_registry_new();
    REQUIRE(r);
    if (ff_registry_load_plugin(r, plugin_path) != 0) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(ff_registry_advantage(r, "group_median") && ff_registry_policy_loss(r, "clipped_adv_pg"));
    CHECK(ff_registry_kl(r, "sq") && ff_registry_reward(r, "short_answer"));
    CHECK(!strcmp(ff_registry_origin(r, FF_REG_ADVANTAGE, "group_median"), plugin_path));
    /* loading it twice is an error */
    CHECK_EQ_INT(ff_registry_load_plugin(r, plugin_path), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "already loaded");

    /* the estimator: score - median of the group; groups {0, 1, 2} and {3, 4} */
    int32_t off[6] = {0, 1, 2, 3, 4, 5};
    float tr[5] = {1, 5, 2, 7, 3}, adv[5], ret[5];
    int32_t group[5] = {0, 0, 0, 1, 1};
    ff_adv_batch in = {{5, off, NULL}, tr, NULL, group, NULL};
    ff_advantage *a = ff_advantage_new(r, "group_median", NULL);
    REQUIRE(a);
    REQUIRE(ff_advantage_compute(a, &in, adv, ret) == 0);
    CHECK_CLOSE(adv[0], -1, 1e-6, 0);
    CHECK_CLOSE(adv[1], 3, 1e-6, 0);
    CHECK_CLOSE(adv[3], 2, 1e-6, 0);
    CHECK_CLOSE(adv[4], -2, 1e-6, 0);
    ff_advantage_destroy(&a);

    /* the policy loss against its formula, token-mean: L = mean(-clip(A) logp) */
    float logp[5] = {-1, -2, -0.5f, -3, -1}, adv2[5] = {3, -0.5f, 1, -4, 0.25f}, d[5];
    ff_pg_batch pg = {{5, off, NULL}, logp, logp, adv2, NULL, 0};
    ff_policy_loss *l = ff_policy_loss_new(r, "clipped_adv_pg", NULL);
    REQUIRE(l);
    double loss;
    ff_rlhf_pg_stats st;
    REQUIRE(ff_policy_loss_compute(l, &pg, &loss, d, &st) == 0);
    double want = (-2.0 * -1 + 0.5 * -2 - 1 * -0.5 + 2 * -3 - 0.25 * -1) / 5;
    CHECK_CLOSE(loss, want, 1e-6, 0);
    CHECK_CLOSE(d[0], -2.0 / 5, 1e-7, 0);
    CHECK_CLOSE(d[3], 2.0 / 5, 1e-7, 0);
    CHECK_CLOSE(st.clipfrac, 2.0 / 5, 1e-12, 0);
    ff_policy_loss_destroy(&l);

    /* the reward */
    ff_reward *w = ff_reward_new(r, "short_answer", NULL);
    REQUIRE(w);
    ff_reward_item items[2] = {{"q", "42", "42", NULL}, {"q", "a very long answer", "42", NULL}};
    float sc[2];
    REQUIRE(ff_reward_score(w, items, 2, sc) == 0);
    CHECK(sc[0] == 1 && sc[1] == 0);
    ff_reward_destroy(&w);
    ff_registry_destroy(&r);

    /* a plugin whose names clash with what is registered fails with its path in the message */
    r = ff_registry_new();
    ff_kl_def clash = {"sq", "taken first", ff_registry_kl(r, "kl")->compute};
    REQUIRE(ff_registry_add_kl(r, &clash) == 0);
    CHECK_EQ_INT(ff_registry_load_plugin(r, plugin_path), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "KL estimator 'sq' is already registered");
    CHECK_STR_CONTAINS(ff_error_message(), "example_plugin.so");
    ff_registry_destroy(&r);
}

/* A run config that loads the plugin and uses its names, with parameters read by the plugin
 * (and a misspelled one caught by the unknown-key check). */
static void test_plugin_in_config(void) {
    char text[4096];
    const char *fmt =
        "trainer: {plugins: [%s]}\n"
        "data: {train_files: t.jsonl, train_batch_size: 2}\n"
        "roles: {actor: {model: m}}\n"
        "graph:\n"
        "  gen: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 2}\n"
        "  reward: {op: reward_fn, in: [prompt, response], out: [score], function: short_answer, max_chars: 4}\n"
        "  adv: {op: advantage, in: [score], out: [advantages], estimator: group_median, %s: 2.0}\n"
        "  train: {op: train, role: actor, in: [prompt, response, old_logprob, advantages], loss: clipped_adv_pg, adv_clip: 1.5}\n";
    ff_registry *r = ff_registry_new();
    snprintf(text, sizeof text, fmt, plugin_path, "scale");
    ff_run_config *run = ff_run_config_parse(text, "p.yaml", 0, NULL, r);
    if (!run) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(run);
    ff_run_config_destroy(&run);
    ff_registry_destroy(&r);

    r = ff_registry_new();
    snprintf(text, sizeof text, fmt, plugin_path, "scael");
    run = ff_run_config_parse(text, "p.yaml", 0, NULL, r);
    CHECK(run == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "did you mean 'graph.adv.scale'");
    ff_registry_destroy(&r);

    /* without the plugin, its names are unknown */
    r = ff_registry_new();
    snprintf(text, sizeof text, fmt, "", "scale");
    char *p = strstr(text, "plugins: []");
    REQUIRE(p);
    run = ff_run_config_parse(text, "p.yaml", 0, NULL, r);
    CHECK(run == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown reward function 'short_answer'");
    ff_registry_destroy(&r);
}

static void test_bad_plugins(void) {
    ff_registry *r = ff_registry_new();
    CHECK_EQ_INT(ff_registry_load_plugin(r, "/no/such/plugin.so"), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "plugin file not found");
    /* a file that is not a shared library */
    const char *src = getenv("FF_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/grpo.yaml", src ? src : ".");
    CHECK_EQ_INT(ff_registry_load_plugin(r, path), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot load plugin");
    /* a real shared library without the init symbol: libjansson */
    Dl_info info;
    REQUIRE(dladdr((void *)json_loads, &info) && info.dli_fname);
    CHECK_EQ_INT(ff_registry_load_plugin(r, info.dli_fname), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "has no symbol 'ff_plugin_init'");
    ff_registry_destroy(&r);
}

int main(void) {
    const char *b = getenv("FF_BUILD_DIR");
    snprintf(plugin_path, sizeof plugin_path, "%s/example_plugin.so", b ? b : "build");
    test_builtins();
    test_example_plugin();
    test_plugin_in_config();
    test_bad_plugins();
    TEST_MAIN_END();
}
