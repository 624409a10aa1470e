/* SIGKILL a worker in the middle of 10,000 subtasks: every subtask completes exactly once,
 * with the right result, on the others (idempotent subtasks are sent again). Then the same
 * with non-idempotent subtasks: those the dead worker held complete once, as WORKER_LOST. */
#include "tests/runtime/rt_test.h"

enum { N = 10000 };

typedef struct state {
    ff_controller *c;
    int calls[N];
    int ok[N];
    int done;
    int kill_at;
    pid_t victim;
    int victim_rank;
    bool killed;
    int lost, wrong;
} state;

typedef struct task {
    state *s;
    int i;
} task;

static task tasks[N];

static void on_done(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    task *t = ud;
    state *s = t->s;
    s->calls[t->i]++;
    s->done++;
    if (n != 1) s->wrong++;
    if (r[0].status == FF_STATUS_OK) {
        if (r[0].noutputs == 1 && r[0].outputs[0].dtype == FF_DTYPE_I64 && *(const int64_t *)r[0].outputs[0].data == t->i)
            s->ok[t->i]++;
        else
            s->wrong++;
    } else if (r[0].status == FF_STATUS_WORKER_LOST) {
        s->lost++;
    } else {
        s->wrong++;
    }
    /* kill from a result of the victim itself: it certainly holds other subtasks now */
    if (!s->killed && s->done >= s->kill_at && r[0].rank == s->victim_rank) {
        kill(s->victim, SIGKILL);
        s->killed = true;
    }
}

static void submit(state *s, int i, bool idempotent) {
    int64_t *v = malloc(sizeof *v);
    *v = i;
    int64_t one = 1;
    ff_input in = {.name = "i", .dtype = FF_DTYPE_I64, .ndim = 1, .shape = &one, .data = v, .free_fn = rt_free};
    ff_subtask_spec spec = {.kind = "echo", .target = FF_TARGET_ANY, .group = "all", .inputs = &in, .ninputs = 1,
                            .idempotent = idempotent};
    tasks[i] = (task){s, i};
    REQUIRE(ff_controller_submit(s->c, &spec, on_done, &tasks[i]) > 0);
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    ff_controller_opts o = rt_opts();
    o.max_inflight = 32;
    static state s;
    s.c = rt_start(&o, 4);
    ff_worker_info wi;
    REQUIRE(ff_controller_worker_info(s.c, 1, &wi) == 0);
    s.victim = (pid_t)wi.pid;
    s.victim_rank = 1;
    s.kill_at = 2000;
    for (int i = 0; i < N; i++) submit(&s, i, true);
    REQUIRE(ff_controller_run(s.c, 120) == 0);
    CHECK(s.killed);
    CHECK_EQ_INT(s.done, N);
    CHECK_EQ_INT(s.wrong, 0);
    CHECK_EQ_INT(s.lost, 0);
    int once = 0;
    for (int i = 0; i < N; i++) once += s.calls[i] == 1 && s.ok[i] == 1;
    CHECK_EQ_INT(once, N);
    ff_controller_stats st;
    ff_controller_stats_get(s.c, &st);
    CHECK_EQ_INT(st.workers_died, 1);
    CHECK(st.redispatched >= 1); /* the victim held subtasks when it died */
    CHECK_EQ_INT(st.subtasks_ok, N + 4); /* + the group setup of rt_start */
    REQUIRE(ff_controller_worker_info(s.c, 1, &wi) == 0);
    CHECK(wi.state == FF_WORKER_DEAD);
    /* noticed through its process exit or through its vanished connection, whichever came first */
    CHECK(strstr(wi.dead_reason, "killed by signal 9") || strstr(wi.dead_reason, "connection is gone"));
    printf("killed worker 1 after %d results; %llu subtasks sent again; all %d completed once\n", s.kill_at,
           (unsigned long long)st.redispatched, N);

    /* not idempotent: what the dead worker held is reported lost, once; the rest runs */
    memset(s.calls, 0, sizeof s.calls);
    memset(s.ok, 0, sizeof s.ok);
    s.done = s.lost = s.wrong = 0;
    s.killed = false;
    s.kill_at = 500;
    REQUIRE(ff_controller_worker_info(s.c, 2, &wi) == 0);
    s.victim = (pid_t)wi.pid;
    s.victim_rank = 2;
    for (int i = 0; i < 2000; i++) submit(&s, i, false);
    REQUIRE(ff_controller_run(s.c, 60) == 0);
    CHECK(s.killed);
    CHECK_EQ_INT(s.done, 2000);
    CHECK_EQ_INT(s.wrong, 0);
    CHECK(s.lost >= 1);
    int exactly_once = 0, ok = 0;
    for (int i = 0; i < 2000; i++) {
        exactly_once += s.calls[i] == 1;
        ok += s.ok[i];
    }
    CHECK_EQ_INT(exactly_once, 2000);
    CHECK_EQ_INT(ok + s.lost, 2000);
    ff_controller_stats_get(s.c, &st);
    CHECK_EQ_INT(st.duplicates, 0);

    /* a cancelled subtask whose worker dies before answering is not sent elsewhere */
    int pair[2] = {0, 3};
    REQUIRE(ff_controller_group_create(s.c, "pair", pair, 2, NULL) == 0);
    ff_arg a = ff_arg_float("ms", 600000);
    ff_subtask_spec slp = {.kind = "sleep", .target = FF_TARGET_ANY, .group = "pair", .args = &a, .nargs = 1,
                           .idempotent = true};
    rt_counter k = {0};
    uint64_t job = ff_controller_submit(s.c, &slp, rt_count, &k);
    REQUIRE(job > 0);
    int holder = -1;
    for (int r = 0; r < 4; r++) {
        ff_worker_info w;
        if (ff_controller_worker_info(s.c, r, &w) == 0 && w.inflight == 1) holder = r;
    }
    REQUIRE(holder == 0 || holder == 3);
    ff_controller_worker_info(s.c, holder, &wi);
    REQUIRE(kill((pid_t)wi.pid, SIGSTOP) == 0); /* it cannot answer the cancel... */
    REQUIRE(ff_controller_cancel(s.c, job) == 0);
    REQUIRE(kill((pid_t)wi.pid, SIGKILL) == 0); /* ...and dies with it */
    uint64_t before = st.redispatched;
    REQUIRE(ff_controller_run(s.c, 30) == 0);
    CHECK_EQ_INT(k.status[FF_STATUS_CANCELLED], 1);
    ff_controller_stats_get(s.c, &st);
    CHECK_EQ_INT(st.redispatched, before);
    rt_shutdown_clean(s.c);
    ff_controller_destroy(&s.c);
    TEST_MAIN_END();
}
