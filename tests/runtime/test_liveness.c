/* Liveness: hello/welcome (rank, host, device, capabilities), heartbeats and clock offsets,
 * death detection (a process killed, a process hung: silent past the timeout and then killed
 * by the controller), a hello for a rank that is taken, a worker joining without a rank. */
#include <ev.h>
#include <spawn.h>
#include <sys/wait.h>

#include "tests/runtime/rt_test.h"

extern char **environ;

static bool has_cap(const ff_worker_info *w, const char *cap) {
    for (int i = 0; i < w->ncaps; i++)
        if (!strcmp(w->caps[i], cap)) return true;
    return false;
}

typedef struct wait_state {
    ff_controller *c;
    int rank;
    ff_worker_state want;
    int min_samples_rtt; /* for the heartbeat wait */
} wait_state;

static bool in_state(void *ud) {
    wait_state *w = ud;
    ff_worker_info wi;
    return ff_controller_worker_info(w->c, w->rank, &wi) == 0 && wi.state == w->want;
}

static bool have_rtt(void *ud) {
    wait_state *w = ud;
    ff_worker_info wi;
    return ff_controller_worker_info(w->c, w->rank, &wi) == 0 && wi.rtt_us >= 0;
}

static bool waited;
static bool after_a_while(void *ud) {
    (void)ud;
    return waited;
}

static pid_t start_worker(const char *endpoint, const char *rank) {
    char *argv[] = {rt_self, "worker", "--connect", (char *)endpoint, "--rank", (char *)rank, "--log", "off",
                    "--connect-timeout", "5", NULL};
    if (!rank) argv[4] = NULL;
    pid_t pid;
    REQUIRE(posix_spawn(&pid, rt_self, NULL, NULL, argv, environ) == 0);
    return pid;
}

static void on_timer(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)t;
    (void)revents;
    waited = true;
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    ff_controller_opts o = rt_opts();
    o.timeout_s = 2.0; /* a hang is declared after it; a sanitized worker on a loaded machine can
                        * miss a beat or two, so not much shorter */
    ff_controller *c = rt_start(&o, 3);

    /* what each hello told the controller */
    for (int r = 0; r < 3; r++) {
        ff_worker_info wi;
        REQUIRE(ff_controller_worker_info(c, r, &wi) == 0);
        CHECK(wi.state == FF_WORKER_LIVE && wi.local && wi.pid > 0 && wi.host[0]);
        CHECK(!strcmp(wi.device, "cpu"));
        CHECK(has_cap(&wi, "echo") && has_cap(&wi, "sleep") && has_cap(&wi, "collective") && has_cap(&wi, "coll:cpu"));
    }
    CHECK(ff_controller_worker_info(c, 7, &(ff_worker_info){0}) == -1);

    /* heartbeats give clock samples; on one host the clocks are the same, so the estimate
     * must lie within half the round trip it came from */
    wait_state ws = {c, 0, FF_WORKER_LIVE, 0};
    REQUIRE(ff_controller_run_until(c, have_rtt, &ws, 10) == 0);
    ev_timer t;
    ev_timer_init(&t, on_timer, 0.3, 0);
    ev_timer_start(ff_controller_loop(c), &t);
    REQUIRE(ff_controller_run_until(c, after_a_while, NULL, 10) == 0);
    for (int r = 0; r < 3; r++) {
        ff_worker_info wi;
        ff_controller_worker_info(c, r, &wi);
        CHECK(wi.rtt_us > 0);
        CHECK(wi.clock_offset_us <= wi.rtt_us / 2 + 1 && wi.clock_offset_us >= -wi.rtt_us / 2 - 1);
        CHECK_EQ_INT(wi.errors, 0);
    }

    /* a hung worker: silent past the timeout, declared dead, killed by the controller */
    ff_worker_info w1;
    ff_controller_worker_info(c, 1, &w1);
    REQUIRE(kill((pid_t)w1.pid, SIGSTOP) == 0);
    ws = (wait_state){c, 1, FF_WORKER_DEAD, 0};
    REQUIRE(ff_controller_run_until(c, in_state, &ws, 30) == 0);
    ff_controller_worker_info(c, 1, &w1);
    CHECK_STR_CONTAINS(w1.dead_reason, "silent for");
    /* it was SIGKILLed (a stopped process dies of SIGKILL) and reaped: no process left */
    for (int i = 0; i < 2000 && kill((pid_t)w1.pid, 0) == 0; i++) {
        ff_controller_poll(c, false);
        usleep(1000);
    }
    CHECK(kill((pid_t)w1.pid, 0) == -1);

    /* a killed worker: its process exit is noticed */
    ff_worker_info w2;
    ff_controller_worker_info(c, 2, &w2);
    REQUIRE(kill((pid_t)w2.pid, SIGKILL) == 0);
    ws = (wait_state){c, 2, FF_WORKER_DEAD, 0};
    REQUIRE(ff_controller_run_until(c, in_state, &ws, 30) == 0);
    ff_controller_worker_info(c, 2, &w2);
    CHECK(strstr(w2.dead_reason, "killed by signal 9") || strstr(w2.dead_reason, "connection is gone"));

    /* subtasks for a dead rank fail at once (from the loop, not inside submit) */
    rt_counter k = {0};
    ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_RANK, .rank = 2};
    REQUIRE(ff_controller_submit(c, &s, rt_count, &k) > 0);
    CHECK_EQ_INT(k.done, 0);
    REQUIRE(ff_controller_run(c, 10) == 0);
    CHECK_EQ_INT(k.status[FF_STATUS_WORKER_LOST], 1);

    /* a second worker asking for live rank 0 is refused and exits with an error */
    pid_t dup = start_worker(ff_controller_endpoint(c), "0");
    int status = -1;
    for (int i = 0; i < 10000 && waitpid(dup, &status, WNOHANG) == 0; i++) {
        ff_controller_poll(c, false);
        usleep(1000);
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    ff_worker_info w0;
    ff_controller_worker_info(c, 0, &w0);
    CHECK(w0.state == FF_WORKER_LIVE);

    /* a worker without a rank gets a new one; a worker may rejoin a dead rank */
    pid_t extra = start_worker(ff_controller_endpoint(c), NULL);
    pid_t again = start_worker(ff_controller_endpoint(c), "2");
    REQUIRE(ff_controller_wait_workers(c, 3, 30) == 0);
    CHECK_EQ_INT(ff_controller_nranks(c), 4);
    ff_worker_info w3;
    REQUIRE(ff_controller_worker_info(c, 3, &w3) == 0);
    CHECK(w3.state == FF_WORKER_LIVE && !w3.local && w3.pid == extra);
    ff_controller_worker_info(c, 2, &w2);
    CHECK(w2.state == FF_WORKER_LIVE && w2.pid == again);
    ff_subtask_spec s3 = {.kind = "echo", .target = FF_TARGET_RANK, .rank = 3};
    REQUIRE(ff_controller_submit(c, &s3, rt_count, &k) > 0);
    REQUIRE(ff_controller_run(c, 10) == 0);
    CHECK_EQ_INT(k.ok, 1);

    /* a remote worker stopped past the timeout is declared dead (it cannot be killed from
     * here); when it wakes up it says hello again (its stale messages are refused) and gets
     * its rank back */
    ff_controller_stats st0;
    ff_controller_stats_get(c, &st0);
    REQUIRE(kill(extra, SIGSTOP) == 0);
    ws = (wait_state){c, 3, FF_WORKER_DEAD, 0};
    REQUIRE(ff_controller_run_until(c, in_state, &ws, 30) == 0);
    REQUIRE(kill(extra, SIGCONT) == 0);
    ws.want = FF_WORKER_LIVE;
    REQUIRE(ff_controller_run_until(c, in_state, &ws, 30) == 0);
    ff_controller_worker_info(c, 3, &w3);
    CHECK(w3.pid == extra);
    CHECK_EQ_INT(ff_controller_nranks(c), 4); /* the same rank, not a new one */
    ff_controller_stats st1;
    ff_controller_stats_get(c, &st1);
    CHECK_EQ_INT(st1.workers_joined, st0.workers_joined + 1);
    REQUIRE(ff_controller_submit(c, &s3, rt_count, &k) > 0);
    REQUIRE(ff_controller_run(c, 10) == 0);
    CHECK_EQ_INT(k.ok, 2);
    ff_controller_stats st;
    ff_controller_stats_get(c, &st);
    CHECK_EQ_INT(st.workers_died, 3);
    CHECK_EQ_INT(st.duplicates, 0);
    rt_shutdown_clean(c);
    /* workers it did not start stop too (they are not its children: check they exit) */
    CHECK(waitpid(extra, &status, 0) == extra && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(waitpid(again, &status, 0) == again && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ff_controller_destroy(&c);
    TEST_MAIN_END();
}
