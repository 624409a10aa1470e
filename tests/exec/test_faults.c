/* Fault injection: `fuseflow run` (GRPO from a briefly fine-tuned model: 2 DP actor ranks, a
 * rollout pool of 2 workers, a reward from examples/reward_server.py) is hit at seeded random
 * moments by each kind of death, several cycles each, and resumed with --resume after each
 * stop:
 *   controller  the run's process (ff_exec_run in a forked child) is SIGKILLed after a
 *               random delay; its orphaned workers are collected (this test is a subreaper)
 *   trainer     a random DP rank is stopped once a random iteration's rl.train went out,
 *               then killed when the other rank waits in the gradient all-reduce
 *   generation  a rollout worker holding prompt groups is killed after a random number of
 *               groups came back (the run goes on with the other); the other is killed in
 *               the next iteration (no generation worker left: the run stops)
 *   reward      the reward server is killed after a random number of groups came back
 *   sync        a rollout worker is killed as a random iteration's weight sync goes out to
 *               the pool: the sync runs again to the live one and the run goes on to its end
 *   readonly    the output folder (a tmpfs of its own) is remounted read-only once a random
 *               iteration finished, so that iteration's checkpoint cannot be written; it is
 *               made writable again before the resume (skipped where mount is not allowed)
 * After every cycle metrics.jsonl holds iterations 1..m exactly once each (no gap, no
 * duplicate), and a run that stopped named a checkpoint that exists with the --resume
 * command. At the end each kind's run equals the uninterrupted one: metrics computed from the
 * sampled tokens (samples, rewards, accuracy, lengths, steps) exactly, the final actor
 * weights to 1e-5 (two uninterrupted runs differ by ~1e-7: batches of different shapes round
 * differently, docs/run.md "Determinism"; a lost or repeated iteration moves them by ~1e-4).
 *
 * FF_FAULT_SEED sets the seed (printed); FF_SANITIZED=1 runs 2 cycles per kind instead of 3.
 * The reward-server kind needs pyzmq; without it the other kinds use the built-in reward. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "fuseflow/executor.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/tensor_set.h"
#include "fuseflow/train_dir.h"
#include "tests/exec/kill_util.h"
#include "tests/runtime/rt_test.h"

extern char **environ;

enum { STEPS = 6, GROUPS = 8, KIND_CONTROLLER = 0, KIND_TRAINER, KIND_GENERATION, KIND_REWARD, KIND_READONLY, KIND_SYNC, KINDS };
static const char *kind_names[KINDS] = {"controller", "trainer", "generation", "reward", "readonly", "sync"};

static const char *bin, *src;
static char dir[256], endpoint[320], python[64];
static bool remote_reward;
static pid_t reward_pid = -1;
static ff_rng rng;

/* ---- processes ---------------------------------------------------------------------------------- */
/* Kill and reap the children of this process other than the reward server: the workers a
 * killed controller left (reparented here, the subreaper). Returns how many. */
static int collect_orphans(void) {
    int n = 0;
    DIR *d = opendir("/proc");
    REQUIRE(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0 || pid == reward_pid) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        char *close_paren = strrchr(buf, ')');
        int ppid = 0;
        if (close_paren && sscanf(close_paren + 1, " %*c %d", &ppid) == 1 && ppid == (int)getpid()) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            n++;
        }
    }
    closedir(d);
    return n;
}

static void start_reward_server(void) {
    if (!remote_reward || reward_pid > 0) return;
    char sock[300], script[600];
    snprintf(sock, sizeof sock, "%s/reward.sock", dir);
    snprintf(script, sizeof script, "%s/examples/reward_server.py", src);
    unlink(sock);
    char *argv[] = {python, script, "--bind", endpoint, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    REQUIRE(posix_spawn(&reward_pid, python, &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    struct stat st;
    for (int i = 0; i < 500 && stat(sock, &st) != 0; i++) usleep(10000);
    REQUIRE(stat(sock, &st) == 0);
}

static void stop_reward_server(void) {
    if (reward_pid <= 0) return;
    kill(reward_pid, SIGKILL);
    waitpid(reward_pid, NULL, 0);
    reward_pid = -1;
}

/* ---- the run -------------------------------------------------------------------------------- */
typedef struct strike {
    int kind;
    int64_t it;       /* iteration to strike in */
    int64_t after;    /* generation, reward: after this many groups came back */
    int rank;         /* trainer: the DP rank to kill */
    int kills;        /* done so far in this run */
    char what[256];   /* what was done, for the log */
} strike;

static int64_t checkpoint_iteration(const char *out) {
    int64_t *steps;
    int n = ff_checkpoint_steps(out, &steps);
    int64_t it = n ? steps[n - 1] : 0;
    free(steps);
    return it;
}

/* In a controller run's child: events go to the parent, which picks the moment to kill. */
static int event_fd = -1;
enum { EV_GENERATING = 0, EV_TRAINING, EV_ITERATION, EV_CHECKPOINT, EV_KINDS };
static const char *ev_names[EV_KINDS] = {"generating", "training", "iteration", "checkpoint"};
typedef struct ev_rec {
    int64_t iteration;
    int what;
} ev_rec;

static void on_event(void *ud, const ff_exec_event *e) {
    strike *s = ud;
    if (event_fd >= 0) {
        for (int k = 0; k < EV_KINDS; k++)
            if (!strcmp(e->what, ev_names[k])) {
                ev_rec r = {e->iteration, k};
                if (write(event_fd, &r, sizeof r) != (ssize_t)sizeof r) { /* the parent stopped listening: it kills us */ }
            }
        return;
    }
    if (!s || s->kills > 1 || (s->kind != KIND_GENERATION && s->kills)) return;
    if (s->kind == KIND_READONLY && !strcmp(e->what, "iteration") && e->iteration == s->it) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "mount -o remount,ro %s/%s", dir, kind_names[KIND_READONLY]);
        REQUIRE(system(cmd) == 0);
        snprintf(s->what, sizeof s->what, "made the output folder read-only after iteration %lld", (long long)s->it);
        s->kills++;
    }
    if (s->kind == KIND_TRAINER && !strcmp(e->what, "training") && e->iteration == s->it) {
        ff_worker_info victim, other;
        REQUIRE(ff_controller_worker_info(e->controller, s->rank, &victim) == 0);
        REQUIRE(ff_controller_worker_info(e->controller, 1 - s->rank, &other) == 0);
        kill((pid_t)victim.pid, SIGSTOP); /* the other rank steps, then waits for it */
        wait_idle((pid_t)other.pid);
        kill((pid_t)victim.pid, SIGKILL);
        snprintf(s->what, sizeof s->what, "killed DP rank %d in iteration %lld's all-reduce", s->rank, (long long)s->it);
        s->kills++;
    }
    if (s->kind == KIND_GENERATION && !strcmp(e->what, "generated") && e->iteration == s->it + s->kills &&
        e->count >= (s->kills ? 1 : s->after)) {
        /* ranks 2 and 3 are the rollout pool (placement: the actor's ranks first) */
        int pick = -1;
        for (int r = 2; r <= 3; r++) {
            ff_worker_info wi;
            REQUIRE(ff_controller_worker_info(e->controller, r, &wi) == 0);
            if (wi.state == FF_WORKER_LIVE && (pick < 0 || wi.inflight > 0)) pick = r;
        }
        if (pick < 0) return;
        ff_worker_info wi;
        REQUIRE(ff_controller_worker_info(e->controller, pick, &wi) == 0);
        kill((pid_t)wi.pid, SIGKILL);
        size_t off = strlen(s->what);
        snprintf(s->what + off, sizeof s->what - off, "%skilled rollout rank %d (%d in flight) in iteration %lld after %lld groups",
                 off ? "; " : "", pick, wi.inflight, (long long)e->iteration, (long long)e->count);
        s->kills++;
    }
    if (s->kind == KIND_SYNC && !strcmp(e->what, "syncing") && e->iteration == s->it) {
        /* a rollout rank dies while the weights go to the pool: the sync runs again to the other */
        ff_worker_info wi;
        REQUIRE(ff_controller_worker_info(e->controller, 2 + s->rank, &wi) == 0);
        if (wi.state != FF_WORKER_LIVE) return;
        kill((pid_t)wi.pid, SIGKILL);
        snprintf(s->what, sizeof s->what, "killed rollout rank %d as iteration %lld's weight sync went out", 2 + s->rank,
                 (long long)s->it);
        s->kills++;
    }
        if (s->kind == KIND_REWARD && !strcmp(e->what, "generated") && e->iteration == s->it && e->count >= s->after) {
        stop_reward_server();
        snprintf(s->what, sizeof s->what, "killed the reward server in iteration %lld after %lld groups", (long long)s->it,
                 (long long)e->count);
        s->kills++;
    }
}

static char *overrides[32];
static int n_overrides;
static char over_buf[32][512];

static void set_overrides(const char *out) {
    const char *cache = getenv("FF_BUILD_DIR");
    char c[300];
    snprintf(c, sizeof c, "%s/exec_cache", cache ? cache : "build");
    n_overrides = 0;
#define OV(...) snprintf(over_buf[n_overrides], sizeof over_buf[0], __VA_ARGS__), overrides[n_overrides] = over_buf[n_overrides], n_overrides++
    OV("trainer.out_dir=%s", out);
    OV("trainer.steps=%d", STEPS);
    OV("trainer.save_freq=1");
    OV("trainer.test_freq=0");
    OV("data.train_files=%s/arith/train.jsonl", c);
    OV("data.val_files=%s/arith/test.jsonl", c);
    OV("data.max_prompt_length=16");
    OV("data.max_response_length=6");
    OV("data.train_batch_size=%d", GROUPS);
    OV("roles.actor.model=%s/sft_small/final", c);
    OV("roles.ref.model=%s/sft_small/final", c);
    OV("roles.actor.workers=2");
    OV("roles.actor.rollout.workers=2");
    OV("roles.actor.optim.lr=1e-4");
    OV("graph.rollout.n=8");
    OV("graph.train_actor.mini_batch_size=4");
    OV("graph.train_actor.micro_batch_size=8");
    if (remote_reward) {
        OV("graph.reward.function=remote");
        OV("graph.reward.endpoint=%s", endpoint);
        OV("graph.reward.server_function=arith");
        OV("graph.reward.timeout_ms=1000"); /* a live server answers in ms; 500 left a loaded CI machine little room */
        OV("graph.reward.retries=1");
    }
#undef OV
}

/* One run of the config into out (resuming when it holds a checkpoint); the console goes to
 * log. Returns ff_exec_run's status; the error message stays in `error`. */
static int run_once(const char *out, strike *s, char *error, size_t cap) {
    set_overrides(out);
    char cfg[600], log[400];
    snprintf(cfg, sizeof cfg, "%s/examples/grpo.yaml", src);
    snprintf(log, sizeof log, "%s.log", out);
    ff_exec_opts o;
    ff_exec_opts_default(&o);
    o.config = cfg;
    o.overrides = overrides;
    o.n_overrides = n_overrides;
    o.resume = checkpoint_iteration(out) > 0;
    o.worker_bin = bin;
    o.progress = 0;
    o.out = fopen(log, "a");
    REQUIRE(o.out);
    o.on_event = on_event;
    o.event_ud = s;
    o.worker_timeout_s = 5;
    int rc = ff_exec_run(&o);
    snprintf(error, cap, "%s", rc < 0 ? ff_error_message() : "");
    fclose(o.out);
    return rc;
}

/* The run in a child process, SIGKILLed shortly (delay_us) after it reports event `what` of
 * iteration `it` (the child goes on meanwhile: the kill lands somewhere in that phase). */
static int run_killed(const char *out, int64_t it, int what, int delay_us, bool *killed) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        event_fd = fds[1];
        char err[8192];
        int rc = run_once(out, NULL, err, sizeof err);
        _exit(rc < 0 ? 1 : 0);
    }
    close(fds[1]);
    ev_rec r;
    bool hit = false;
    while (!hit && read(fds[0], &r, sizeof r) == (ssize_t)sizeof r) hit = r.iteration == it && r.what == what;
    if (hit) {
        usleep((useconds_t)delay_us);
        kill(pid, SIGKILL);
    }
    close(fds[0]); /* (after the kill: the child must not meet a closed pipe first) */
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    *killed = WIFSIGNALED(status);
    collect_orphans(); /* its workers, reparented here: in real life they exit when it goes silent */
    return *killed ? -1 : WIFEXITED(status) && WEXITSTATUS(status) == 0 ? FF_EXEC_DONE : -1;
}

/* ---- checks --------------------------------------------------------------------------------- */
typedef struct metrics {
    int n;
    json_t *line[STEPS + 1]; /* by iteration */
} metrics;

/* metrics.jsonl must hold iterations 1..n, each once; returns n, or -1 (reported). */
static int read_metrics(const char *out, metrics *m, const char *when) {
    memset(m, 0, sizeof *m);
    char path[400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    if (!f) return 0; /* killed before the first iteration */
    char line[16384];
    int bad = 0, expect = 1;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        int it = o ? (int)json_integer_value(json_object_get(o, "iteration")) : -1;
        if (!o || it != expect || it > STEPS) {
            fprintf(stderr, "%s: metrics.jsonl line %d holds iteration %d, expected %d (a gap or a duplicate)\n", when,
                    expect, it, expect);
            bad = 1;
            json_decref(o);
            break;
        }
        m->line[it] = o;
        m->n = it;
        expect++;
    }
    fclose(f);
    CHECK(!bad);
    return bad ? -1 : m->n;
}

static void free_metrics(metrics *m) {
    for (int i = 0; i <= STEPS; i++) json_decref(m->line[i]);
}

/* A stopped run's message names the dead (or what failed), and a checkpoint that exists with
 * the command that resumes from it. */
static void check_stop_message(const char *kind, const char *msg, const char *out) {
    if (!strstr(msg, "resume from the checkpoint ") && !strstr(msg, "no checkpoint was saved yet")) {
        fprintf(stderr, "%s: the stop names no checkpoint: %s\n", kind, msg);
        ff_test_failures++;
        return;
    }
    const char *p = strstr(msg, "resume from the checkpoint ");
    if (p) {
        char ck[512];
        if (sscanf(p, "resume from the checkpoint %511s", ck) == 1) {
            struct stat st;
            char state[600];
            snprintf(state, sizeof state, "%s/state.json", ck);
            if (stat(state, &st) != 0) {
                fprintf(stderr, "%s: the checkpoint named does not exist: %s\n", kind, ck);
                ff_test_failures++;
            }
        }
        CHECK_STR_CONTAINS(msg, "--resume`");
    }
    (void)out;
}

static double weights_diff(const char *a, const char *b) {
    ff_tensor_set *x = ff_tensor_set_new(), *y = ff_tensor_set_new();
    DIE_IF(ff_safetensors_load(a, x) != 0);
    DIE_IF(ff_safetensors_load(b, y) != 0);
    REQUIRE(x->n == y->n);
    double worst = 0;
    for (size_t i = 0; i < x->n; i++) {
        ff_host_tensor *t = &x->items[i], *u = ff_tensor_set_find(y, t->name);
        REQUIRE(u && ff_host_tensor_numel(t) == ff_host_tensor_numel(u));
        for (int64_t k = 0; k < ff_host_tensor_numel(t); k++) {
            double d = fabs((double)t->data[k] - (double)u->data[k]);
            if (d > worst || d != d) worst = d != d ? INFINITY : d;
        }
    }
    ff_tensor_set_destroy(&x);
    ff_tensor_set_destroy(&y);
    return worst;
}

static void compare_runs(const char *kind, const char *ref_out, const char *out) {
    metrics a, b;
    CHECK_EQ_INT(read_metrics(ref_out, &a, "reference"), STEPS);
    CHECK_EQ_INT(read_metrics(out, &b, kind), STEPS);
    static const char *exact[] = {"samples", "reward_mean", "acc", "response_length", "actor_steps"};
    for (int it = 1; it <= STEPS && it <= a.n && it <= b.n; it++)
        for (size_t k = 0; k < sizeof exact / sizeof *exact; k++) {
            json_t *u = json_object_get(a.line[it], exact[k]), *v = json_object_get(b.line[it], exact[k]);
            if (!u || !v || !json_equal(u, v)) {
                fprintf(stderr, "%s: iteration %d: %s %g, uninterrupted %g\n", kind, it, exact[k], json_number_value(v),
                        json_number_value(u));
                ff_test_failures++;
            }
        }
    free_metrics(&a);
    free_metrics(&b);
    char wa[600], wb[600];
    snprintf(wa, sizeof wa, "%s/checkpoints/step-%08d/actor/model.safetensors", ref_out, STEPS);
    snprintf(wb, sizeof wb, "%s/checkpoints/step-%08d/actor/model.safetensors", out, STEPS);
    double d = weights_diff(wa, wb);
    fprintf(stderr, "faults: %s: final actor weights within %.3g of the uninterrupted run's\n", kind, d);
    CHECK(d <= 1e-5);
}

/* ---- the kinds ------------------------------------------------------------------------------ */
static void fault_kind(int kind, int cycles, const char *ref_out) {
    char out[300], err[8192];
    snprintf(out, sizeof out, "%s/%s", dir, kind_names[kind]);
    for (int c = 0; c < cycles; c++) {
        int64_t from = checkpoint_iteration(out);
        if (from >= STEPS) break;
        /* strike in one of the next two iterations, so every cycle has a run left to hit (the
         * generation kind strikes twice: in it and it + 1) */
        int64_t room = STEPS - from - (kind == KIND_GENERATION && STEPS - from > 1);
        strike s = {.kind = kind, .it = from + 1 + (int64_t)ff_rng_below(&rng, (uint64_t)(room < 2 ? room : 2)),
                    .after = 1 + (int64_t)ff_rng_below(&rng, GROUPS - 1), .rank = (int)ff_rng_below(&rng, 2)};
        int rc;
        if (kind == KIND_CONTROLLER) {
            int what = (int)ff_rng_below(&rng, EV_KINDS), us = (int)ff_rng_below(&rng, 3000);
            bool killed;
            rc = run_killed(out, s.it, what, us, &killed);
            snprintf(s.what, sizeof s.what, "%s the controller %d us after '%s' of iteration %lld",
                     killed ? "killed" : "(did not) kill", us, ev_names[what], (long long)s.it);
            CHECK(killed);
            err[0] = 0;
        } else {
            rc = run_once(out, &s, err, sizeof err);
            if (reward_pid < 0) start_reward_server(); /* killed: a new one for what follows */
            if (kind == KIND_READONLY && s.kills) {
                char cmd[400];
                snprintf(cmd, sizeof cmd, "mount -o remount,rw %s", out);
                REQUIRE(system(cmd) == 0);
            }
        }
        char when[400];
        snprintf(when, sizeof when, "%s cycle %d", kind_names[kind], c + 1);
        metrics m;
        int n = read_metrics(out, &m, when);
        free_metrics(&m);
        fprintf(stderr, "faults: %s from iteration %lld: %s; %s (metrics: iterations 1..%d)\n", when, (long long)from,
                s.what[0] ? s.what : "nothing struck", rc == FF_EXEC_DONE ? "the run finished" : "the run stopped", n);
        if (kind != KIND_CONTROLLER && rc < 0) {
            fprintf(stderr, "faults:   %.300s\n", err);
            check_stop_message(when, err, out);
            if (kind == KIND_TRAINER) {
                CHECK_STR_CONTAINS(err, "died (process ");
                CHECK_STR_CONTAINS(err, "killed by signal 9) holding the actor's training state");
                CHECK(!strstr(err, "lost its connection"));
            }
            if (kind == KIND_REWARD) CHECK_STR_CONTAINS(err, "reward server did not answer");
            if (kind == KIND_GENERATION) CHECK_STR_CONTAINS(err, "no live worker is left for the gen");
            if (kind == KIND_READONLY) CHECK_STR_CONTAINS(err, "Read-only file system");
        }
        if (kind == KIND_TRAINER || kind == KIND_REWARD || kind == KIND_READONLY) CHECK(s.kills == 0 || rc < 0);
        /* one rollout rank lost during a sync: the run goes on with the other */
        if (kind == KIND_SYNC) CHECK(s.kills == 1 && rc == FF_EXEC_DONE);
    }
    /* then on to the end, undisturbed */
    while (checkpoint_iteration(out) < STEPS) {
        if (reward_pid < 0) start_reward_server();
        int rc = run_once(out, NULL, err, sizeof err);
        if (rc < 0) fprintf(stderr, "faults: %s: the final resume failed: %s\n", kind_names[kind], err);
        REQUIRE(rc == FF_EXEC_DONE);
    }
    compare_runs(kind_names[kind], ref_out, out);
}

int main(void) {
    bin = getenv("FF_BIN");
    src = getenv("FF_SOURCE_DIR");
    if (!bin || !src) SKIP("FF_BIN and FF_SOURCE_DIR are not set; run through ctest");
    ff_log_set_level(FF_LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); /* a killed controller's workers come to us */
    const char *seed_s = getenv("FF_FAULT_SEED");
    uint64_t seed = seed_s ? strtoull(seed_s, NULL, 10) : 20240611;
    ff_rng_seed(&rng, seed);
    int cycles = getenv("FF_SANITIZED") && !strcmp(getenv("FF_SANITIZED"), "1") ? 2 : 3;
    fprintf(stderr, "faults: seed %llu (FF_FAULT_SEED), %d cycles per kind\n", (unsigned long long)seed, cycles);

    /* inputs: the exec tests' shared cache (tests/exec/lib.sh) */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "bash -c 'source \"%s/tests/exec/lib.sh\" && prepare_sft_small'", src);
    REQUIRE(system(cmd) == 0);
    snprintf(dir, sizeof dir, "/tmp/ff_faults_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    REQUIRE(system(cmd) == 0);
    snprintf(endpoint, sizeof endpoint, "ipc://%s/reward.sock", dir);
    snprintf(python, sizeof python, "/usr/bin/python3");
    remote_reward = system("/usr/bin/python3 -c 'import zmq' > /dev/null 2>&1") == 0;
    if (!remote_reward) fprintf(stderr, "faults: no pyzmq for /usr/bin/python3: the built-in reward, no reward-server kind\n");
    start_reward_server();

    char ref_out[300], err[8192];
    snprintf(ref_out, sizeof ref_out, "%s/reference", dir);
    int64_t t0 = ff_now_ns();
    int rc = run_once(ref_out, NULL, err, sizeof err);
    double ref_s = (ff_now_ns() - t0) / 1e9;
    if (rc != FF_EXEC_DONE) fprintf(stderr, "faults: the uninterrupted run failed: %s\n", err);
    REQUIRE(rc == FF_EXEC_DONE);
    fprintf(stderr, "faults: uninterrupted run: %d iterations in %.2f s\n", STEPS, ref_s);

    /* the read-only kind's output folder is a filesystem of its own */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/%s && mount -t tmpfs -o size=512m tmpfs %s/%s 2> /dev/null", dir,
             kind_names[KIND_READONLY], dir, kind_names[KIND_READONLY]);
    bool can_mount = system(cmd) == 0;
    if (!can_mount) fprintf(stderr, "faults: mount -t tmpfs is not allowed here: no read-only kind\n");
    for (int k = 0; k < KINDS; k++) {
        if (k == KIND_REWARD && !remote_reward) continue;
        if (k == KIND_READONLY && !can_mount) continue;
        fault_kind(k, cycles, ref_out);
    }
    if (can_mount) {
        snprintf(cmd, sizeof cmd, "umount %s/%s", dir, kind_names[KIND_READONLY]);
        if (system(cmd) != 0) fprintf(stderr, "could not unmount %s/%s\n", dir, kind_names[KIND_READONLY]);
    }
    stop_reward_server();
    CHECK_EQ_INT(collect_orphans(), 0); /* nothing else was left running */
    if (!ff_test_failures) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        fprintf(stderr, "faults: the runs are in %s\n", dir);
    }
    TEST_MAIN_END();
}
