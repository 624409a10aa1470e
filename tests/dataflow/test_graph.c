/* Graphs and run configs: every example in examples/ loads and validates; a graph built in
 * C validates the same way; and each kind of bad config is rejected before anything starts,
 * with an error that names the line and the problem. */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/registry.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static const char *src_dir(void) {
    const char *s = getenv("FF_SOURCE_DIR");
    return s ? s : ".";
}

/* A small valid GRPO config. Line numbers matter to the tests below. */
static const char *base =
    "trainer:\n"                                          /* 1 */
    "  steps: 2\n"                                        /* 2 */
    "data:\n"                                             /* 3 */
    "  train_files: data/train.jsonl\n"                   /* 4 */
    "  train_batch_size: 4\n"                             /* 5 */
    "roles:\n"                                            /* 6 */
    "  actor:\n"                                          /* 7 */
    "    model: models/tiny\n"                            /* 8 */
    "    workers: 2\n"                                    /* 9 */
    "  ref:\n"                                            /* 10 */
    "    model: models/tiny\n"                            /* 11 */
    "    colocate_with: actor\n"                          /* 12 */
    "graph:\n"                                            /* 13 */
    "  gen:\n"                                            /* 14 */
    "    op: generate\n"                                  /* 15 */
    "    role: actor\n"                                   /* 16 */
    "    in: [prompt]\n"                                  /* 17 */
    "    out: [response, old_logprob]\n"                  /* 18 */
    "    n: 4\n"                                          /* 19 */
    "  ref:\n"                                            /* 20 */
    "    op: logprob\n"                                   /* 21 */
    "    role: ref\n"                                     /* 22 */
    "    in: [prompt, response]\n"                        /* 23 */
    "    out: [ref_logprob]\n"                            /* 24 */
    "  reward:\n"                                         /* 25 */
    "    op: reward_fn\n"                                 /* 26 */
    "    in: [prompt, response, answer]\n"                /* 27 */
    "    out: [score]\n"                                  /* 28 */
    "    function: arith_exact_match\n"                   /* 29 */
    "  adv:\n"                                            /* 30 */
    "    op: advantage\n"                                 /* 31 */
    "    in: [score]\n"                                   /* 32 */
    "    out: [advantages]\n"                             /* 33 */
    "    estimator: grpo\n"                               /* 34 */
    "  train:\n"                                          /* 35 */
    "    op: train\n"                                     /* 36 */
    "    role: actor\n"                                   /* 37 */
    "    in: [prompt, response, old_logprob, advantages, ref_logprob]\n" /* 38 */
    "    micro_batch_size: 4\n"                           /* 39 */
    "    kl_loss: {type: low_var_kl, coef: 0.001}\n"      /* 40 */
    "  sync:\n"                                           /* 41 */
    "    op: sync_weights\n"                              /* 42 */
    "    role: actor\n"                                   /* 43 */
    "    after: [train]\n";                               /* 44 */

/* base with the first occurrence of `from` replaced by `to` (a fresh string). */
static char *edit(const char *from, const char *to) {
    const char *p = strstr(base, from);
    REQUIRE(p);
    size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
    char *s = malloc(n);
    REQUIRE(s);
    snprintf(s, n, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
    return s;
}

static ff_run_config *load_text(ff_registry *reg, const char *text, int n_over, char *const *over) {
    return ff_run_config_parse(text, "t.yaml", n_over, over, reg);
}

/* Expect the text (after overrides) to be rejected with a message holding all needles. */
static void expect_error(ff_registry *reg, const char *text, int n_over, char *const *over, const char *n1, const char *n2) {
    ff_run_config *run = load_text(reg, text, n_over, over);
    if (run) {
        fprintf(stderr, "expected an error containing '%s'\n", n1);
        ff_run_config_destroy(&run);
        CHECK(0);
        return;
    }
    CHECK_STR_CONTAINS(ff_error_message(), n1);
    if (n2) CHECK_STR_CONTAINS(ff_error_message(), n2);
}

static void expect_edit_error(ff_registry *reg, const char *from, const char *to, const char *n1, const char *n2) {
    char *t = edit(from, to);
    expect_error(reg, t, 0, NULL, n1, n2);
    free(t);
}

static void test_base_and_examples(ff_registry *reg) {
    ff_run_config *run = load_text(reg, base, 0, NULL);
    if (!run) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(run);
    ff_graph *g = run->graph;
    CHECK_EQ_INT(ff_graph_n_nodes(g), 6);
    CHECK_EQ_INT(ff_graph_group_size(g), 4);
    CHECK_EQ_INT(ff_graph_response_column(g), ff_graph_find_column(g, "response"));
    const ff_node *adv = ff_graph_node(g, (size_t)ff_graph_find_node(g, "adv"));
    CHECK_EQ_INT(adv->gran, FF_GRAN_GROUP); /* the estimator's own unit by default */
    CHECK_EQ_INT(adv->stage, 2);
    const ff_node *tr = ff_graph_node(g, (size_t)ff_graph_find_node(g, "train"));
    CHECK_EQ_INT(tr->train.mini_batch_size, 4); /* defaults to the whole batch */
    CHECK(tr->train.kl_loss && !strcmp(tr->train.kl_loss->name, "low_var_kl"));
    CHECK_CLOSE(tr->train.kl_loss_coef, 0.001, 0, 1e-12);
    CHECK_EQ_INT(run->roles[FF_ROLE_REF].layout.workers, 2); /* inherited from the colocation */
    CHECK_EQ_INT(run->roles[FF_ROLE_REF].colocate_with, FF_ROLE_ACTOR);
    CHECK_EQ_INT(run->roles[FF_ROLE_ACTOR].layout.zero, 0); /* the default */
    CHECK(!run->roles[FF_ROLE_ACTOR].rollout_w16 && !run->roles[FF_ROLE_REF].w16); /* cpu: fp32 */
    CHECK(!run->roles[FF_ROLE_ACTOR].rollout_kv16);
    ff_run_config_destroy(&run);
    /* on cuda a frozen role and a generation pool of its own hold bf16 weights unless told
     * otherwise; the colocated copy (a view) and a pool patched by deltas keep fp32; the KV
     * cache is bf16 (kv_dtype: fp32 keeps fp32) */
    {
        char *o_pool[] = {"roles.actor.backend=cuda", "roles.actor.rollout.workers=2"};
        char *o_colo[] = {"roles.actor.backend=cuda"};
        char *o_delta[] = {"roles.actor.backend=cuda", "roles.actor.rollout.workers=2", "roles.actor.rollout.sync_delta=true"};
        char *o_fp32[] = {"roles.actor.backend=cuda", "roles.actor.rollout.workers=2", "roles.actor.rollout.dtype=fp32"};
        char **os[] = {o_pool, o_colo, o_delta, o_fp32};
        const int ns[] = {2, 1, 3, 3};
        const bool want[] = {true, false, false, false};
        for (int i = 0; i < 4; i++) {
            run = load_text(reg, base, ns[i], os[i]);
            if (!run) fprintf(stderr, "%s\n", ff_error_message());
            REQUIRE(run);
            CHECK_EQ_INT(run->roles[FF_ROLE_ACTOR].rollout_w16, want[i]);
            CHECK(run->roles[FF_ROLE_ACTOR].rollout_kv16); /* a bf16 KV cache on cuda, with or without a rollout section */
            CHECK(run->roles[FF_ROLE_REF].w16); /* colocated with the actor: on cuda too */
            ff_run_config_destroy(&run);
        }
        char *o_kv[] = {"roles.actor.backend=cuda", "roles.actor.rollout.kv_dtype=fp32"};
        run = load_text(reg, base, 2, o_kv);
        REQUIRE(run);
        CHECK(!run->roles[FF_ROLE_ACTOR].rollout_kv16);
        ff_run_config_destroy(&run);
    }
    run = load_text(reg, base, 0, NULL);
    REQUIRE(run);
    g = run->graph;
    /* topological order: gen first, sync last */
    const int *order = ff_graph_order(g);
    CHECK_EQ_INT(order[0], ff_graph_find_node(g, "gen"));
    CHECK_EQ_INT(order[5], ff_graph_find_node(g, "sync"));
    /* files are checked separately */
    CHECK_EQ_INT(ff_run_config_check_files(run), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "t.yaml:4");
    CHECK_STR_CONTAINS(ff_error_message(), "data/train.jsonl");
    ff_run_config_destroy(&run);

    /* overrides in verl's dotted style */
    char *over[] = {"graph.adv.estimator=rloo", "graph.gen.n=8", "graph.train.clip_ratio_high=0.28", "data.train_batch_size=8"};
    run = load_text(reg, base, 4, over);
    if (!run) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(run);
    g = run->graph;
    CHECK_EQ_INT(ff_graph_group_size(g), 8);
    CHECK(!strcmp(ff_advantage_def_of(ff_graph_node(g, (size_t)ff_graph_find_node(g, "adv"))->adv)->name, "rloo"));
    ff_run_config_destroy(&run);

    static const char *examples[] = {"grpo", "ppo", "rloo", "reinforce_pp", "remax", "dapo"};
    for (size_t i = 0; i < sizeof examples / sizeof *examples; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/examples/%s.yaml", src_dir(), examples[i]);
        run = ff_run_config_load(path, 0, NULL, reg);
        if (!run) fprintf(stderr, "%s: %s\n", path, ff_error_message());
        CHECK(run != NULL);
        if (!run) continue;
        /* each ends with training and a weight sync */
        const int *o = ff_graph_order(run->graph);
        size_t N = ff_graph_n_nodes(run->graph);
        CHECK_EQ_INT(ff_graph_node(run->graph, (size_t)o[N - 1])->op, FF_OP_SYNC_WEIGHTS);
        ff_run_config_destroy(&run);
    }
    /* the PPO example switched to KL as a loss term, as its header says */
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/ppo.yaml", src_dir());
    char *ppo_over[] = {"graph.advantage.kl_penalty=null", "graph.train_actor.kl_loss={type: low_var_kl, coef: 0.001}"};
    run = ff_run_config_load(path, 2, ppo_over, reg);
    if (!run) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(run);
    CHECK(ff_graph_node(run->graph, (size_t)ff_graph_find_node(run->graph, "advantage"))->kl_penalty == NULL);
    CHECK(ff_graph_node(run->graph, (size_t)ff_graph_find_node(run->graph, "train_actor"))->train.kl_loss != NULL);
    ff_run_config_destroy(&run);
}

static void test_errors(ff_registry *reg) {
    /* unknown op, with its line */
    expect_edit_error(reg, "op: generate", "op: generat", "t.yaml:15", "must be one of: generate");
    /* unknown column, with a suggestion */
    expect_edit_error(reg, "in: [prompt, response]", "in: [prompt, respnse]", "t.yaml:23", "did you mean 'response'");
    /* a column read that nothing writes */
    expect_edit_error(reg, "in: [prompt, response, old_logprob, advantages, ref_logprob]",
                      "in: [prompt, response, old_logprob, returns, ref_logprob]", "reads column 'returns', but no node writes it",
                      "t.yaml:35");
    /* a cycle */
    expect_edit_error(reg, "    function: arith_exact_match\n", "    function: arith_exact_match\n    after: [adv]\n",
                      "the graph has a cycle", "adv -> reward");
    /* a role without a model */
    expect_edit_error(reg, "  sync:\n", "  values:\n    op: value\n    role: critic\n    in: [prompt, response]\n    out: [values]\n  sync:\n",
                      "role 'critic', which has no model", "t.yaml:41");
    /* the batch does not divide the layout */
    expect_edit_error(reg, "train_batch_size: 4", "train_batch_size: 3", "cannot be dealt whole to rollout dp=2", "t.yaml:7");
    expect_edit_error(reg, "    micro_batch_size: 4\n", "    micro_batch_size: 3\n", "micro_batch_size 3 does not divide", "t.yaml:39");
    /* layouts: the degrees against the workers by the planner's rule; the old keys name the new place */
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    layout: {dp: 3}\n", "= 3, but the cluster has 2 GPUs",
                      "t.yaml:10: roles.actor.layout with 2 workers");
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    layout: {tp: 3}\n", "TP x CP x PP = 3 does not divide the 2 GPUs",
                      "roles.actor.layout with 2 workers");
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    dp: 3\n", "'roles.actor.dp' moved into the role's layout",
                      "write roles.actor.layout: {dp: 3}");
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    rollout: {tp: 2}\n", "'roles.actor.rollout.tp' moved",
                      "write roles.actor.rollout.layout: {tp: 2}");
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    layout: {schedule: 2f2b}\n", "must be one of: 1f1b", "t.yaml:10");
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    layout: {zero: 4}\n", "'roles.actor.layout.zero' must be in [0, 3]",
                      "t.yaml:10");
    /* ZeRO: 0 or 1 */
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    layout: {zero: 2}\n", "roles.actor.layout.zero: ZeRO-2/3 are not built",
                      "t.yaml:10");
    expect_edit_error(reg, "    workers: 2\n", "    workers: 2\n    zero: 1\n", "'roles.actor.zero' moved into the role's layout",
                      "write roles.actor.layout: {zero: 1}");
    /* unknown registry names */
    expect_edit_error(reg, "estimator: grpo", "estimator: grpoo", "unknown advantage estimator 'grpoo'", "known: gae, grpo, rloo");
    expect_edit_error(reg, "    micro_batch_size: 4\n", "    micro_batch_size: 4\n    loss: ppo2\n", "unknown policy loss 'ppo2'",
                      "vanilla");
    expect_edit_error(reg, "function: arith_exact_match", "function: exact", "unknown reward function 'exact'", "arith_exact_match");
    expect_edit_error(reg, "type: low_var_kl", "type: k4", "unknown KL estimator 'k4'", "t.yaml:40");
    /* a misspelled parameter, found by the unknown-key check */
    expect_edit_error(reg, "    micro_batch_size: 4\n", "    micro_batch_size: 4\n    clip_ratio_hgh: 0.28\n",
                      "unknown key 'graph.train.clip_ratio_hgh'", "did you mean 'graph.train.clip_ratio_high'");
    expect_edit_error(reg, "trainer:\n", "trainr:\n", "unknown key 'trainr'", "did you mean 'trainer'");
    /* kinds, writers, slots */
    expect_edit_error(reg, "out: [score]", "out: [advantages]", "takes scalar, but column 'advantages' is per_token", "t.yaml:28");
    expect_edit_error(reg, "out: [ref_logprob]", "out: [old_logprob]", "written by both 'gen' and 'ref'", NULL);
    expect_edit_error(reg, "out: [response, old_logprob]", "out: [prompt, old_logprob]", "comes from the data", "t.yaml:18:");
    expect_edit_error(reg, "in: [prompt, response, old_logprob, advantages, ref_logprob]", "in: [prompt, response, old_logprob]",
                      "needs its input slot 'advantages'", "t.yaml:35");
    expect_edit_error(reg, "in: [prompt, response, answer]", "in: [prompt, response, answer, score]", "has 3 input slots", "t.yaml:27");
    expect_edit_error(reg, "in: [score]", "in: {scores: score}", "no input slot 'scores'", "t.yaml:32");
    /* granularity and roles */
    expect_edit_error(reg, "estimator: grpo", "estimator: grpo\n    granularity: sample", "needs whole groups", NULL);
    expect_edit_error(reg, "estimator: grpo", "estimator: gae", "estimator 'gae' needs values", NULL);
    expect_edit_error(reg, "    role: ref\n", "    role: critic\n", "op 'logprob' does not run on role critic", "t.yaml:20");
    expect_edit_error(reg, "    op: sync_weights\n", "    op: sync_weights\n    granularity: sample\n", "cannot run per sample", NULL);
    expect_edit_error(reg, "    n: 4\n", "    n: 4\n    granularity: group\n", "no sample-level generate node", NULL);
    expect_edit_error(reg, "after: [train]", "after: [trian]", "unknown node 'trian'", "t.yaml:44");
    expect_edit_error(reg, "    n: 4\n", "    n: 0\n", "'n' must be in [1,", "t.yaml:19");
    /* plugins that are not there */
    expect_edit_error(reg, "  steps: 2\n", "  steps: 2\n  plugins: [no/such/plugin.so]\n", "plugin file not found", "t.yaml:3");
    /* a whole config that is not YAML */
    expect_error(reg, "graph: [\n", 0, NULL, "YAML syntax error", NULL);
    char *bad_over[] = {"graph.adv.estimator"};
    expect_error(reg, base, 1, bad_over, "not an override", NULL);
}

/* The same graph built through the C API. */
static void test_c_api(ff_registry *reg) {
    ff_graph *g = ff_graph_new();
    REQUIRE(g);
    int gen = ff_graph_add_node(g, "gen", FF_OP_GENERATE, FF_ROLE_ACTOR, FF_GRAN_COUNT);
    int rw = ff_graph_add_node(g, "reward", FF_OP_REWARD_FN, FF_ROLE_NONE, FF_GRAN_COUNT);
    int adv = ff_graph_add_node(g, "adv", FF_OP_ADVANTAGE, FF_ROLE_NONE, FF_GRAN_COUNT);
    int tr = ff_graph_add_node(g, "train", FF_OP_TRAIN, FF_ROLE_ACTOR, FF_GRAN_COUNT);
    REQUIRE(gen >= 0 && rw >= 0 && adv >= 0 && tr >= 0);
    CHECK_EQ_INT(ff_graph_add_node(g, "gen", FF_OP_GENERATE, FF_ROLE_ACTOR, FF_GRAN_COUNT), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "already exists");
    REQUIRE(ff_graph_bind(g, gen, false, "prompt", "prompt") == 0);
    REQUIRE(ff_graph_bind(g, gen, true, "response", "response") == 0);
    REQUIRE(ff_graph_bind(g, gen, true, "logprob", "old_logprob") == 0);
    REQUIRE(ff_graph_bind(g, rw, false, "prompt", "prompt") == 0);
    REQUIRE(ff_graph_bind(g, rw, false, "response", "response") == 0);
    REQUIRE(ff_graph_bind(g, rw, true, "score", "score") == 0);
    REQUIRE(ff_graph_bind(g, adv, false, "score", "score") == 0);
    REQUIRE(ff_graph_bind(g, adv, true, "advantages", "advantages") == 0);
    const char *slots[] = {"prompt", "response", "old_logprob", "advantages"};
    for (int i = 0; i < 4; i++) REQUIRE(ff_graph_bind(g, tr, false, slots[i], slots[i]) == 0);
    CHECK_EQ_INT(ff_graph_bind(g, tr, false, "values", "values"), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no input slot 'values'");
    REQUIRE(ff_graph_set_param(g, gen, "n=4") == 0);
    REQUIRE(ff_graph_set_param(g, rw, "function=format") == 0);
    REQUIRE(ff_graph_set_param(g, adv, "estimator=grpo") == 0);
    REQUIRE(ff_graph_set_param(g, tr, "clip_ratio_high=0.28") == 0);
    REQUIRE(ff_graph_set_param(g, tr, "kl_loss.coef=0.01") == 0); /* kl_loss without ref_logprob: an error */
    CHECK_EQ_INT(ff_graph_validate(g, reg, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "kl_loss needs the ref_logprob slot");
    REQUIRE(ff_graph_set_param(g, tr, "kl_loss=null") == 0);
    if (ff_graph_validate(g, reg, NULL) != 0) fprintf(stderr, "%s\n", ff_error_message());
    CHECK_EQ_INT(ff_graph_validate(g, reg, NULL), 0);
    CHECK_EQ_INT(ff_graph_group_size(g), 4);
    CHECK_EQ_INT(ff_graph_node(g, (size_t)adv)->gran, FF_GRAN_GROUP);
    /* a misspelled parameter of a C-built node */
    REQUIRE(ff_graph_set_param(g, adv, "norm_by_sdt=false") == 0);
    CHECK_EQ_INT(ff_graph_validate(g, reg, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "did you mean 'adv.norm_by_std'");
    ff_graph_destroy(&g);

    /* an empty graph, a cycle through after */
    g = ff_graph_new();
    CHECK_EQ_INT(ff_graph_validate(g, reg, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no nodes");
    ff_graph_destroy(&g);
}

/* A registry that skips rewards (the workers'): reward nodes are not instantiated, so a
 * function the controller alone registers (`remote`) and its keys are no error there,
 * while the default registry refuses both. */
static void test_skip_rewards(void) {
    char *over[] = {"graph.reward.function=remote", "graph.reward.endpoint=ipc:///nonexistent/ff_test.sock"};
    ff_registry *plain = ff_registry_new(), *skip = ff_registry_new();
    REQUIRE(plain && skip);
    ff_registry_skip_rewards(skip);
    CHECK(!ff_registry_skips_rewards(plain) && ff_registry_skips_rewards(skip));
    ff_run_config *run = load_text(plain, base, 2, over);
    CHECK(run == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "remote");
    ff_run_config_destroy(&run);
    run = load_text(skip, base, 2, over);
    if (!run) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(run);
    const ff_node *rw = ff_graph_node(run->graph, (size_t)ff_graph_find_node(run->graph, "reward"));
    CHECK(rw->reward == NULL);
    ff_run_config_destroy(&run);
    /* other sections' keys are still checked */
    char *bad[] = {"graph.reward.function=remote", "graph.train.no_such_key=1"};
    CHECK(load_text(skip, base, 2, bad) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "no_such_key");
    ff_registry_destroy(&plain);
    ff_registry_destroy(&skip);
}

/* Every section of a run config is typed: written as a plain value or a list (in the file, or
 * by an override replacing it) it is an error at its line, never a section of defaults. */
static void test_typed_sections(ff_registry *reg) {
    static const struct {
        const char *from, *to, *where;
    } file_cases[] = {
        {"trainer:\n  steps: 2\n", "trainer: fast\n", "t.yaml:1: 'trainer' is a section"},
        {"data:\n  train_files: data/train.jsonl\n  train_batch_size: 4\n", "data: 7\n", "t.yaml:3: 'data' is a section"},
        {"data:\n  train_files: data/train.jsonl\n  train_batch_size: 4\n", "data: [1, 2]\n", "t.yaml:3: 'data' is a section"},
        {"roles:\n  actor:\n    model: models/tiny\n    workers: 2\n  ref:\n    model: models/tiny\n    colocate_with: actor\n",
         "roles: 5\n", "t.yaml:6: 'roles' must be a map"},
        {"  actor:\n    model: models/tiny\n    workers: 2\n", "  actor: fast\n", "t.yaml:7: 'roles.actor' must be a map"},
        {"  ref:\n    model: models/tiny\n    colocate_with: actor\n", "  ref: [1]\n", "t.yaml:10: 'roles.ref' must be a map"},
        {"    workers: 2\n", "    workers: 2\n    optim: fast\n", "t.yaml:10: 'roles.actor.optim' must be a map"},
        {"    workers: 2\n", "    workers: 2\n    rollout: [1]\n", "t.yaml:10: 'roles.actor.rollout' must be a map"},
        {"  gen:\n    op: generate\n    role: actor\n    in: [prompt]\n    out: [response, old_logprob]\n    n: 4\n", "  gen: fast\n",
         "t.yaml:14: node 'gen' is not a map"},
        {"kl_loss: {type: low_var_kl, coef: 0.001}", "kl_loss: 5", "t.yaml:40: node 'train': 'kl_loss' must be a map"},
        {"  steps: 2\n", "  steps: 2\n  plugins: {a: 1}\n", "t.yaml:3: 'trainer.plugins' must be a list"},
        {"    after: [train]\n", "    after: [train]\ncolumns: 5\n", "t.yaml:45: 'columns' must be a map"},
    };
    for (size_t i = 0; i < sizeof file_cases / sizeof *file_cases; i++)
        expect_edit_error(reg, file_cases[i].from, file_cases[i].to, file_cases[i].where, NULL);
    /* the graph section itself */
    char text[4096];
    snprintf(text, sizeof text, "%.*sgraph: 5\n", (int)(strstr(base, "graph:\n") - base), base);
    expect_error(reg, text, 0, NULL, "t.yaml:13: 'graph' must be a map of nodes, not the plain value '5'", NULL);

    /* overrides that replace a section by a plain value or a list: every top-level section
     * and the sections inside roles and graph nodes */
    static const char *const sections[] = {"trainer",       "data",        "roles",     "roles.actor",         "roles.ref",
                                           "roles.actor.optim", "roles.actor.rollout", "columns", "graph", "graph.gen",
                                           "graph.train.kl_loss", "graph.adv.kl_penalty"};
    for (size_t i = 0; i < sizeof sections / sizeof *sections; i++)
        for (int list = 0; list < 2; list++) {
            char over[128], where[160];
            snprintf(over, sizeof over, "%s=%s", sections[i], list ? "[1]" : "5");
            snprintf(where, sizeof where, "override '%s'", over);
            char *ov[] = {over};
            expect_error(reg, base, 1, ov, where, "map");
        }
    /* a null section is empty: its keys take their defaults, and overrides fill it */
    char *t = edit("trainer:\n  steps: 2\n", "trainer:\n");
    char *ov[] = {"trainer.steps=3"};
    ff_run_config *run = load_text(reg, t, 1, ov);
    CHECK(run != NULL);
    if (run) CHECK_EQ_INT(run->trainer.steps, 3);
    ff_run_config_destroy(&run);
    free(t);
}

/* Sizes the workers receive are range-checked where they are read. */
static void test_size_bounds(ff_registry *reg) {
    static const struct {
        const char *over, *needle;
    } cases[] = {
        {"data.max_response_length=3000000000", "'data.max_response_length' must be in [1, 1073741824], got 3000000000"},
        {"data.max_response_length=4294967400", "'data.max_response_length' must be in [1, 1073741824], got 4294967400"},
        {"data.max_response_length=3e9", "must be an integer, got '3e9' (hint: write the digits: 3000000000)"},
        {"data.max_prompt_length=4294967297", "'data.max_prompt_length' must be in [1, 1073741824], got 4294967297"},
        {"data.max_prompt_length=0", "'data.max_prompt_length' must be in [1, 1073741824], got 0"},
        {"data.train_batch_size=4294967296", "'data.train_batch_size' must be in [1, 2147483647], got 4294967296"},
        {"data.val_batch_size=-1", "'data.val_batch_size' must be in [1, 2147483647], got -1"},
        {"trainer.max_gen_batches=1099511627776", "'trainer.max_gen_batches' must be in [1, 1048576]"},
        {"roles.actor.workers=4294967298", "'roles.actor.workers' must be in [1, 2147483647], got 4294967298"},
        {"roles.actor.layout.tp=4294967296", "'roles.actor.layout.tp' must be in [1, 2147483647]"},
        {"graph.gen.max_tokens=4294967400", "'max_tokens' must be in [0, 1073741824], got 4294967400"},
        {"graph.gen.n=3000000000", "'n' must be in [1, 65536], got 3000000000"},
        {"graph.train.micro_batch_size=4294967300", "'micro_batch_size' must be in [1, 1048576]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *ov[] = {(char *)cases[i].over};
        char where[160];
        snprintf(where, sizeof where, "override '%s'", cases[i].over);
        expect_error(reg, base, 1, ov, where, cases[i].needle);
    }
    /* samples per batch (prompts x n) index 32-bit arrays on the workers */
    char *ov[] = {"data.train_batch_size=65536", "graph.gen.n=65536"};
    expect_error(reg, base, 2, ov, "a batch of 4294967296 samples (train_batch_size 65536 x n 65536) is past 2147483647", NULL);
}

int main(void) {
    test_skip_rewards();
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    test_base_and_examples(reg);
    test_errors(reg);
    test_c_api(reg);
    test_typed_sections(reg);
    test_size_bounds(reg);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}
