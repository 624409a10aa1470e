/* Failures during `fuseflow run` (ff_exec_run with an event hook, workers from FF_BIN):
 *   1. a rollout worker (a generation pool of its own, two workers) is SIGKILLed while it
 *      holds prompt groups: the controller sends them to the other one, every prompt of the
 *      iteration gets its n responses exactly once (OUT/samples.jsonl), the run finishes;
 *   2. a worker that holds the actor's training state dies: the run stops with a message
 *      naming the checkpoint to resume from;
 *   3. an interruption before anything trained in an iteration: the checkpoint is the
 *      previous iteration's (weights and data position of its end);
 *   4. with 2 DP ranks, rank 1 is killed while rank 0 waits in the gradient all-reduce for
 *      it (rank 1 stopped first, killed once rank 0 is idle): rank 0's collective fails at
 *      once, and races the controller's death detection; the run must stop naming the dead
 *      worker and the checkpoint with the exact --resume command, never with the
 *      collective's error alone. Five times: the old code lost the race 3 times in 4.
 *   5. long-tail migration forced at once (migrate: 1.0): the survivor a move's sequence
 *      states are for is SIGKILLed as the move goes out: the source's send fails (it keeps
 *      the states and decodes them itself) or completes into the transport's buffers before
 *      the death shows (the states are lost and the controller generates the moved groups
 *      again; on a local run this is what usually happens), the dead one's own groups run
 *      again, every prompt gets its n responses exactly once, the same responses as case 1
 *      (the same seeds without migration);
 *   6. the same, the survivor stopped as the move goes out and SIGKILLed once the states left
 *      (the source's rl.generate came back migrated): the states are lost with it, and the
 *      controller generates the moved groups again from their seeds: the same check.
 */
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <sys/stat.h>

#include "fuseflow/executor.h"
#include "tests/exec/kill_util.h"
#include "tests/runtime/rt_test.h"

static const char *bin;
static char dir[256];

typedef struct hook {
    int mode; /* 1 kill a rollout worker, 2 kill the actor, 3 interrupt, 4 kill DP rank 1 mid all-reduce, 5 kill a migration's
                 target before the states leave, 6 after */
    bool done;
    int victim;
    int64_t redispatched;
    volatile sig_atomic_t *flag;
} hook;

static void on_event(void *ud, const ff_exec_event *e) {
    hook *h = ud;
    /* ranks 1 and 2 generate; both are stopped once iteration 1 is done, so the groups of
     * iteration 2 they are sent cannot be answered before one of them is killed (a tiny model
     * generates in well under a millisecond: a running victim may have answered already) */
    if (h->mode == 1 && !strcmp(e->what, "iteration") && e->iteration == 1)
        for (int r = 1; r <= 2; r++) {
            ff_worker_info wi;
            REQUIRE(ff_controller_worker_info(e->controller, r, &wi) == 0);
            kill((pid_t)wi.pid, SIGSTOP);
        }
    if (h->mode == 1 && !h->done && !strcmp(e->what, "generating") && e->iteration == 2) {
        for (int r = 1; r <= 2; r++) { /* take one that holds groups, let the other go on */
            ff_worker_info wi;
            REQUIRE(ff_controller_worker_info(e->controller, r, &wi) == 0);
            if (!h->done && wi.inflight > 0) {
                kill((pid_t)wi.pid, SIGKILL);
                h->victim = r;
                h->done = true;
            }
        }
        for (int r = 1; r <= 2; r++) {
            ff_worker_info wi;
            REQUIRE(ff_controller_worker_info(e->controller, r, &wi) == 0);
            if (r != h->victim) kill((pid_t)wi.pid, SIGCONT);
        }
    }
    if (h->mode == 1 && !strcmp(e->what, "iteration") && e->iteration == 2) {
        ff_controller_stats st;
        ff_controller_stats_get(e->controller, &st);
        h->redispatched = (int64_t)st.redispatched;
    }
    if (h->mode == 2 && !h->done && !strcmp(e->what, "checkpoint") && e->iteration == 1) {
        ff_worker_info wi;
        if (ff_controller_worker_info(e->controller, 0, &wi) == 0) kill((pid_t)wi.pid, SIGKILL);
        h->done = true;
    }
    if (h->mode == 4 && !h->done && !strcmp(e->what, "training") && e->iteration == 2) {
        ff_worker_info w0, w1;
        REQUIRE(ff_controller_worker_info(e->controller, 0, &w0) == 0 && ff_controller_worker_info(e->controller, 1, &w1) == 0);
        kill((pid_t)w1.pid, SIGSTOP); /* rank 0 computes its share, then waits for rank 1 */
        wait_idle((pid_t)w0.pid);
        kill((pid_t)w1.pid, SIGKILL);
        h->victim = 1;
        h->done = true;
    }
    if (h->mode == 5 && !h->done && !strcmp(e->what, "migrating")) { /* the first move of the run */
        ff_worker_info wi;
        REQUIRE(ff_controller_worker_info(e->controller, (int)e->count, &wi) == 0);
        kill((pid_t)wi.pid, SIGKILL);
        h->victim = (int)e->count;
        h->done = true;
    }
    if (h->mode == 6 && h->victim == 0 && !strcmp(e->what, "migrating")) { /* it cannot decode what it gets */
        ff_worker_info wi;
        REQUIRE(ff_controller_worker_info(e->controller, (int)e->count, &wi) == 0);
        kill((pid_t)wi.pid, SIGSTOP);
        h->victim = (int)e->count;
    }
    if (h->mode == 6 && !h->done && h->victim && !strcmp(e->what, "migrated")) { /* the states left the source */
        CHECK_EQ_INT((int)e->count, h->victim);
        ff_worker_info wi;
        REQUIRE(ff_controller_worker_info(e->controller, h->victim, &wi) == 0);
        kill((pid_t)wi.pid, SIGKILL);
        h->done = true;
    }
    if (h->mode == 3 && !h->done && !strcmp(e->what, "generated") && e->iteration == 2) {
        *h->flag = 1;
        h->done = true;
    }
}

static char cfg_path[512];

/* OUT/samples.jsonl: each of the 3 iterations' groups x 4 samples exactly once; iteration
 * 1's responses into resp, or (same) compared with resp. */
static void check_samples(const char *out, int groups, char resp[8][4][256], bool same) {
    char path[600];
    snprintf(path, sizeof path, "%s/samples.jsonl", out);
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    int count[4][8][4] = {{{0}}}, lines = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        REQUIRE(o);
        int it = (int)json_integer_value(json_object_get(o, "iteration")), g = (int)json_integer_value(json_object_get(o, "group"));
        int s = (int)json_integer_value(json_object_get(o, "sample"));
        REQUIRE(it >= 1 && it <= 3 && g >= 0 && g < groups && s >= 0 && s < 4);
        count[it][g][s]++;
        lines++;
        const char *r = json_string_value(json_object_get(o, "response"));
        if (it == 1 && same && strcmp(resp[g][s], r ? r : "")) {
            fprintf(stderr, "iteration 1 group %d sample %d: '%s', without migration '%s'\n", g, s, r ? r : "", resp[g][s]);
            CHECK(false);
        }
        else if (it == 1) snprintf(resp[g][s], 256, "%s", r ? r : "");
        json_decref(o);
    }
    fclose(f);
    CHECK_EQ_INT(lines, 3 * groups * 4);
    for (int it = 1; it <= 3; it++)
        for (int g = 0; g < groups; g++)
            for (int s = 0; s < 4; s++) CHECK_EQ_INT(count[it][g][s], 1);
}

static void write_config(const char *out, int gen_workers, int actor_workers, int batch, const char *gen_extra) {
    char model[512], data[512];
    snprintf(model, sizeof model, "%s/m", dir);
    snprintf(data, sizeof data, "%s/a", dir);
    FILE *f = fopen(cfg_path, "w");
    REQUIRE(f);
    fprintf(f,
            "trainer: {steps: 3, seed: 5, save_freq: 1, out_dir: %s}\n"
            "data: {train_files: %s/train.jsonl, train_batch_size: %d, max_prompt_length: 16, max_response_length: 24}\n"
            "roles:\n  actor: {model: %s, workers: %d, optim: {lr: 1.0e-3}%s}\n"
            "  ref: {model: %s, colocate_with: actor}\n"
            "graph:\n"
            "  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4%s}\n"
            "  ref_logprob: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob]}\n"
            "  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: arith_exact_match}\n"
            "  adv: {op: advantage, in: [score], out: [advantages], estimator: grpo}\n"
            "  train: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob], mini_batch_size: 4, "
            "micro_batch_size: 8}\n"
            "  sync: {op: sync_weights, role: actor, after: [train]}\n",
            out, data, batch, model, actor_workers, gen_workers ? ", rollout: {workers: 2}" : "", model, gen_extra);
    fclose(f);
}

static int run(hook *h, volatile sig_atomic_t *flag) {
    ff_exec_opts o;
    ff_exec_opts_default(&o);
    o.config = cfg_path;
    o.worker_bin = bin;
    o.dump_samples = true;
    o.progress = 0;
    o.out = fopen("/dev/null", "w");
    o.on_event = on_event;
    o.event_ud = h;
    o.interrupt = flag;
    o.worker_timeout_s = 5;
    int rc = ff_exec_run(&o);
    fclose(o.out);
    return rc;
}

int main(void) {
    bin = getenv("FF_BIN");
    if (!bin) SKIP("FF_BIN (the fuseflow binary) is not set; run through ctest");
    ff_log_set_level(FF_LOG_ERROR);
    snprintf(dir, sizeof dir, "/tmp/ff_run_kill_%d", (int)getpid());
    rt_sh("rm -rf %s && mkdir -p %s", dir, dir);
    char model[512], data[512], out[512];
    snprintf(model, sizeof model, "%s/m", dir);
    snprintf(data, sizeof data, "%s/a", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/run.yaml", dir);
    rt_sh("%s init --preset tiny --out %s num_hidden_layers=2 hidden_size=64 intermediate_size=128 > /dev/null", bin, model);
    rt_sh("%s dataset arith --digits 2 --train 200 --test 10 --out %s > /dev/null", bin, data);

    /* 1. a rollout worker dies with groups in flight */
    snprintf(out, sizeof out, "%s/o1", dir);
    write_config(out, 2, 1, 8, "");
    hook h = {.mode = 1};
    volatile sig_atomic_t flag = 0;
    int rc = run(&h, &flag);
    if (rc < 0) fprintf(stderr, "run: %s\n", ff_error_message());
    CHECK_EQ_INT(rc, FF_EXEC_DONE);
    CHECK(h.done);
    CHECK(h.redispatched > 0); /* the victim held groups; they ran again elsewhere */
    char path[600];
    static char resp1[8][4][256];
    check_samples(out, 8, resp1, false);

    /* 5. a migration's target dies as the states go out */
    snprintf(out, sizeof out, "%s/o5", dir);
    write_config(out, 2, 1, 4, ", migrate: 1.0"); /* 8 samples a worker: a survivor has room */
    hook h5 = {.mode = 5};
    rc = run(&h5, &flag);
    if (rc < 0) fprintf(stderr, "run: %s\n", ff_error_message());
    CHECK_EQ_INT(rc, FF_EXEC_DONE);
    CHECK(h5.done); /* a migration happened and its target was killed */
    check_samples(out, 4, resp1, true);

    /* 6. a migration's target dies after the states left. The move can find the source's
     * samples all ended (a loaded machine holds the controller back while the source decodes):
     * then nothing leaves, the stopped survivor is found dead and its groups run again, and the
     * run is tried again (every try still gives every prompt its responses exactly once) */
    hook h6 = {.mode = 6};
    for (int attempt = 0; attempt < 4 && !h6.done; attempt++) {
        snprintf(out, sizeof out, "%s/o6_%d", dir, attempt);
        write_config(out, 2, 1, 4, ", migrate: 1.0");
        h6 = (hook){.mode = 6};
        rc = run(&h6, &flag);
        if (rc < 0) fprintf(stderr, "run: %s\n", ff_error_message());
        CHECK_EQ_INT(rc, FF_EXEC_DONE);
        check_samples(out, 4, resp1, true);
        if (!h6.done) fprintf(stderr, "case 6, try %d: the move found nothing to send; again\n", attempt + 1);
    }
    CHECK(h6.done); /* the source's jobs came back migrated, then the survivor was killed */

    /* 2. the actor's worker dies after the checkpoint of iteration 1 */
    snprintf(out, sizeof out, "%s/o2", dir);
    write_config(out, 0, 1, 8, "");
    hook h2 = {.mode = 2};
    rc = run(&h2, &flag);
    CHECK_EQ_INT(rc, -1);
    CHECK_STR_CONTAINS(ff_error_message(), "holding the actor's training state");
    CHECK_STR_CONTAINS(ff_error_message(), "step-00000001");
    CHECK_STR_CONTAINS(ff_error_message(), "`fuseflow run ");
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml --resume`");

    /* 4. DP rank 1 killed while rank 0 waits in the all-reduce, five times */
    for (int cycle = 0; cycle < 5; cycle++) {
        snprintf(out, sizeof out, "%s/o4_%d", dir, cycle);
        write_config(out, 0, 2, 8, "");
        hook h4 = {.mode = 4};
        rc = run(&h4, &flag);
        const char *msg = ff_error_message();
        if (rc != -1 || !strstr(msg, "worker 1 (pid")) fprintf(stderr, "cycle %d: rc %d: %s\n", cycle, rc, msg);
        CHECK(h4.done);
        CHECK_EQ_INT(rc, -1);
        CHECK_STR_CONTAINS(msg, "worker 1 (pid");
        CHECK_STR_CONTAINS(msg, "killed by signal 9");
        CHECK_STR_CONTAINS(msg, "holding the actor's training state");
        CHECK_STR_CONTAINS(msg, "checkpoints/step-00000001 (iteration 1)");
        CHECK_STR_CONTAINS(msg, "run.yaml --resume`");
        CHECK(!strstr(msg, "lost its connection")); /* the collective's echo of the death */
    }

    /* 3. interrupted while iteration 2 generates: the checkpoint of iteration 1 */
    snprintf(out, sizeof out, "%s/o3", dir);
    write_config(out, 0, 1, 8, "");
    hook h3 = {.mode = 3, .flag = &flag};
    flag = 0;
    rc = run(&h3, &flag);
    CHECK_EQ_INT(rc, FF_EXEC_INTERRUPTED);
    snprintf(path, sizeof path, "%s/checkpoints/step-00000001/state.json", out);
    json_error_t je;
    json_t *st = json_load_file(path, 0, &je);
    CHECK(st != NULL);
    if (st) {
        CHECK_EQ_INT(json_integer_value(json_object_get(st, "iteration")), 1);
        CHECK_EQ_INT(json_integer_value(json_object_get(st, "cursor")), 8); /* one batch of prompts drawn */
        json_decref(st);
    }
    snprintf(path, sizeof path, "%s/checkpoints/step-00000002", out);
    struct stat sb;
    CHECK(stat(path, &sb) != 0);
    rt_sh("rm -rf %s%s", dir, "");
    TEST_MAIN_END();
}
