/* The run folder and data order that `fuseflow sft` and `fuseflow run` share
 * (fuseflow/train_dir.h): the permutation per epoch is the one both commands drew before
 * they shared it (so old runs resume the same), checkpoints are listed without staging
 * folders, a fresh run refuses checkpoints and --resume needs one, leftovers of dead
 * processes go and live ones stay, the config comparison honours the harmless patterns,
 * metrics are cut to the checkpoint's step on resume, commits keep the newest N. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

/* The order both commands used: Fisher-Yates over ff_rng seeded with seed * golden + epoch. */
static void reference_perm(int64_t *p, int64_t n, uint64_t seed, int64_t epoch) {
    ff_rng r;
    ff_rng_seed(&r, seed * 0x9e3779b97f4a7c15ULL + (uint64_t)epoch);
    for (int64_t i = 0; i < n; i++) p[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)ff_rng_below(&r, (uint64_t)(i + 1)), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

static void test_order(void) {
    enum { N = 37 };
    int64_t want[N];
    ff_data_order o;
    REQUIRE(ff_data_order_init(&o, N, 5, true, 0, 0) == 0);
    for (int64_t e = 0; e < 3; e++) { /* next() crosses epochs */
        reference_perm(want, N, 5, e);
        bool same = true;
        for (int i = 0; i < N; i++) same &= ff_data_order_next(&o) == want[i];
        CHECK(same);
    }
    /* seek back into epoch 1, position 10 */
    ff_data_order_seek(&o, 1, 10);
    reference_perm(want, N, 5, 1);
    CHECK_EQ_INT(ff_data_order_next(&o), want[10]);
    ff_data_order_free(&o);
    /* a position at the end of an epoch (cursor == n) starts the next one */
    REQUIRE(ff_data_order_init(&o, N, 5, true, 2, N) == 0);
    reference_perm(want, N, 5, 3);
    CHECK_EQ_INT(ff_data_order_next(&o), want[0]);
    CHECK_EQ_INT(o.epoch, 3);
    ff_data_order_free(&o);
    /* seed 1, 10 examples, epochs 0 and 1 as the commands drew them before this module (with
     * ff_rng then): checkpoints of earlier runs resume in the same order */
    static const int64_t golden[2][10] = {{1, 3, 0, 4, 9, 7, 5, 6, 8, 2}, {6, 7, 3, 5, 1, 0, 8, 2, 4, 9}};
    REQUIRE(ff_data_order_init(&o, 10, 1, true, 0, 0) == 0);
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 10; i++) CHECK_EQ_INT(ff_data_order_next(&o), golden[e][i]);
    ff_data_order_free(&o);
    /* unshuffled */
    REQUIRE(ff_data_order_init(&o, 4, 9, false, 7, 0) == 0);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(ff_data_order_next(&o), i);
    ff_data_order_free(&o);
    CHECK_EQ_INT(ff_data_order_init(&o, 4, 9, true, 0, 5), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "is not valid");
}

static void sh(const char *fmt, const char *a) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, a, a, a, a);
    REQUIRE(system(cmd) == 0);
}

static ff_config *yaml(const char *text) {
    ff_config *c = ff_config_parse(text, strlen(text), "<test>");
    REQUIRE(c);
    return c;
}

static int dead_pid(void) {
    pid_t p = fork();
    REQUIRE(p >= 0);
    if (p == 0) _exit(0);
    REQUIRE(waitpid(p, NULL, 0) == p);
    return (int)p;
}

static void test_folder(void) {
    char dir[] = "/tmp/ff_test_train_dir_XXXXXX", out[300], path[600];
    REQUIRE(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/out", dir);
    static const char *const harmless[] = {"trainer.test_freq", "roles.*.workers", NULL};
    ff_train_dir_spec spec = {.cmd = "run", .out = out, .out_key = "trainer.out_dir", .step_key = "iteration", .harmless = harmless};
    ff_train_dir d;
    REQUIRE(ff_train_dir_open(&d, &spec) == 0);
    CHECK_EQ_INT(d.checkpoint_step, -1);
    char note[600];
    CHECK_STR_CONTAINS(ff_train_dir_resume_note(&d, note, sizeof note), "no checkpoint was saved");
    ff_config *cfg = yaml("trainer: {steps: 4, test_freq: 1}\nroles: {actor: {workers: 1, rollout: {workers: 1}}}\n");
    REQUIRE(ff_train_dir_start(&d, cfg) == 0);
    for (int it = 1; it <= 3; it++) {
        json_t *m = json_pack("{s:i, s:f}", "iteration", it, "loss", 0.5);
        CHECK_EQ_INT(ff_train_dir_metrics(&d, m), 0);
        json_decref(m);
        char tmp[4300];
        REQUIRE(ff_train_dir_stage(&d, it, tmp, sizeof tmp) == 0);
        CHECK_EQ_INT(ff_train_dir_commit(&d, it, tmp, cfg, 2), 0);
    }
    int64_t *steps;
    CHECK_EQ_INT(ff_checkpoint_steps(out, &steps), 2); /* keep 2 */
    CHECK(steps && steps[0] == 2 && steps[1] == 3);
    free(steps);
    snprintf(path, sizeof path, "%s/checkpoints/step-00000003/config.yaml", out);
    CHECK(access(path, F_OK) == 0);
    ff_train_dir_close(&d);

    /* a fresh run refuses the folder; leftovers of a dead process go, a live one's stay */
    CHECK_EQ_INT(ff_train_dir_open(&d, &spec), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "holds checkpoints of an earlier run");
    int dead = dead_pid();
    char name[700];
    snprintf(name, sizeof name, "%s/checkpoints/step-00000004.tmp-%d", out, dead);
    sh("mkdir -p %s/x && touch %s/x/model.safetensors", name);
    char live[700];
    snprintf(live, sizeof live, "%s/checkpoints/step-00000005.tmp-%d", out, (int)getppid());
    sh("mkdir -p %s", live);
    spec.resume = true;
    REQUIRE(ff_train_dir_open(&d, &spec) == 0);
    CHECK(access(name, F_OK) != 0);
    CHECK(access(live, F_OK) == 0);
    CHECK_EQ_INT(d.checkpoint_step, 3); /* staging folders are not checkpoints */
    CHECK_STR_CONTAINS(ff_train_dir_resume_note(&d, note, sizeof note), "step-00000003 (iteration 3) with --resume");

    /* harmless patterns: test_freq and roles.*.workers; roles.actor.rollout.workers is not */
    ff_config *ok = yaml("trainer: {steps: 4, test_freq: 9}\nroles: {actor: {workers: 3, rollout: {workers: 1}}}\n");
    CHECK_EQ_INT(ff_train_dir_check_config(&d, ok, false), 0);
    CHECK_EQ_INT(d.changes, 0);
    CHECK(d.pending && strstr(d.pending, "\"harmless\":true"));
    ff_config *bad = yaml("trainer: {steps: 6, test_freq: 1}\nroles: {actor: {workers: 1, rollout: {workers: 2}}}\nextra: 1\n");
    CHECK_EQ_INT(ff_train_dir_check_config(&d, bad, false), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "this config changes the run: extra: (absent) -> 1, roles.actor.rollout.workers: 1 -> 2, trainer.steps: 4 -> 6");
    /* many differences: the first 12 listed, the rest counted, the hint kept */
    char many[2000] = "";
    for (int i = 0; i < 20; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "key_number_%02d: a_longer_value_%d\n", i, i);
    ff_config *lots = yaml(many);
    CHECK_EQ_INT(ff_train_dir_check_config(&d, lots, false), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "key_number_00: (absent) -> a_longer_value_0");
    CHECK_STR_CONTAINS(ff_error_message(), " more (hint: resume with the config and overrides of that run");
    ff_config_destroy(&lots);
    CHECK_EQ_INT(ff_train_dir_check_config(&d, bad, true), 0);
    CHECK_EQ_INT(d.changes, 3);
    /* start: config.yaml kept, metrics cut to the checkpoint's iteration, changes recorded */
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "a");
    REQUIRE(f);
    fputs("{\"iteration\": 4}\nnot json\n", f);
    fclose(f);
    REQUIRE(ff_train_dir_start(&d, bad) == 0);
    size_t len;
    char *text = ff_read_file(path, &len);
    REQUIRE(text);
    CHECK(strstr(text, "\"iteration\":3") && !strstr(text, "\"iteration\": 4") && !strstr(text, "not json"));
    free(text);
    snprintf(path, sizeof path, "%s/config.yaml", out);
    text = ff_read_file(path, &len);
    REQUIRE(text);
    CHECK(strstr(text, "steps: 4") != NULL);
    free(text);
    snprintf(path, sizeof path, "%s/config_changes.jsonl", out);
    text = ff_read_file(path, &len);
    REQUIRE(text);
    CHECK_STR_CONTAINS(text, "{\"key\":\"trainer.steps\",\"was\":\"4\",\"now\":\"6\",\"harmless\":false}");
    free(text);
    ff_train_dir_close(&d);
    ff_config_destroy(&ok);
    ff_config_destroy(&bad);
    ff_config_destroy(&cfg);

    /* a file the command writes must not be a folder */
    snprintf(path, sizeof path, "%s/o2/samples.jsonl", dir);
    sh("mkdir -p %s", path);
    static const char *const files[] = {"samples.jsonl", NULL};
    snprintf(out, sizeof out, "%s/o2", dir);
    ff_train_dir_spec s2 = {.cmd = "run", .out = out, .out_key = "trainer.out_dir", .step_key = "iteration", .files = files};
    CHECK_EQ_INT(ff_train_dir_open(&d, &s2), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "samples.jsonl: `fuseflow run` writes this file, but it is a folder");
    sh("rm -rf %s", dir);
}

/* The hint for a damaged checkpoint names the one before it (or says to start again), and
 * nothing outside OUT/checkpoints/step-N gets it. */
static void test_checkpoint_hint(void) {
    char dir[128], cmd[400], hint[4096];
    snprintf(dir, sizeof dir, "/tmp/ff_ckhint_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/checkpoints/step-00000003/actor %s/checkpoints/step-00000007 "
             "%s/checkpoints/step-00000009.tmp-5", dir, dir, dir, dir);
    REQUIRE(system(cmd) == 0);
    char path[256];
    snprintf(path, sizeof path, "%s/checkpoints/step-00000007/actor/model.safetensors", dir);
    CHECK_EQ_INT(ff_checkpoint_hint(path, hint, sizeof hint), 0);
    char want[512];
    snprintf(want, sizeof want, "the checkpoint %s/checkpoints/step-00000007 is damaged; the one before it is "
             "%s/checkpoints/step-00000003: move the damaged one away (mv %s/checkpoints/step-00000007 "
             "%s/checkpoints/step-00000007.damaged) and run the same command with --resume", dir, dir, dir, dir);
    CHECK_STR_CONTAINS(hint, want);
    snprintf(path, sizeof path, "%s/checkpoints/step-00000003/state.json", dir);
    CHECK_EQ_INT(ff_checkpoint_hint(path, hint, sizeof hint), 0);
    CHECK_STR_CONTAINS(hint, "holds none before it");
    CHECK_STR_CONTAINS(hint, "start again without --resume");
    /* a staging folder, a model folder, a relative checkpoint of the current folder */
    snprintf(path, sizeof path, "%s/checkpoints/step-00000009.tmp-5/x", dir);
    CHECK_EQ_INT(ff_checkpoint_hint(path, hint, sizeof hint), -1);
    CHECK_EQ_INT(ff_checkpoint_hint("models/tiny/model.safetensors", hint, sizeof hint), -1);
    CHECK_EQ_INT(ff_checkpoint_hint("checkpoints/step-12", hint, sizeof hint), 0);
    CHECK_STR_CONTAINS(hint, "the checkpoint checkpoints/step-12 is damaged and ./checkpoints holds none before it");
    /* ff_checkpoint_error adds it once, and leaves other errors alone */
    snprintf(path, sizeof path, "%s/checkpoints/step-00000007/actor", dir);
    ff_error_set("model.safetensors", NULL, "cut short");
    CHECK_EQ_INT(ff_checkpoint_error(path), -1);
    CHECK_EQ_INT(ff_checkpoint_error(path), -1);
    const char *m = ff_error_message();
    CHECK_STR_CONTAINS(m, "model.safetensors: cut short (hint: the checkpoint ");
    CHECK(strstr(strstr(m, "(hint:") + 1, "(hint:") == NULL);
    ff_error_set("x", NULL, "other");
    ff_checkpoint_error("/models/x");
    CHECK(!strcmp(ff_error_message(), "x: other"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

int main(void) {
    test_checkpoint_hint();
    ff_log_set_level(FF_LOG_WARN);
    test_order();
    test_folder();
    TEST_MAIN_END();
}
