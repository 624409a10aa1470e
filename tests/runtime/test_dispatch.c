/* Dispatch: to a rank, to any member of a group, to a whole group (replicated and split by
 * DP rank); results and their timings; backpressure (in-flight bound, max_pending); cancel
 * (waiting, queued on the worker, running); handler failures; submit errors; a program that
 * owns its loop; shutdown completing everything. Workers are copies of this binary. */
#include <ev.h>
#include <stdatomic.h>

#include "tests/runtime/rt_test.h"

static atomic_int frees;
static void count_free(void *data, void *hint) {
    (void)hint;
    free(data);
    atomic_fetch_add(&frees, 1);
}

typedef struct echo_check {
    int done, bad;
    float want;
} echo_check;

static void on_echo(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    echo_check *e = ud;
    e->done++;
    if (n != 1 || r[0].status != FF_STATUS_OK || r[0].noutputs != 1 || r[0].attempts != 1 ||
        ((const float *)r[0].outputs[0].data)[0] != e->want || r[0].outputs[0].shape[0] != 3)
        e->bad++;
    /* timings are on the controller's clock, in causal order */
    if (!(r[0].dispatch_ns <= r[0].start_ns && r[0].start_ns <= r[0].end_ns && r[0].end_ns <= r[0].done_ns)) e->bad++;
}

static void test_any_and_rank(ff_controller *c) {
    enum { N = 200 };
    echo_check ec[N];
    int64_t three = 3;
    for (int i = 0; i < N; i++) {
        ec[i] = (echo_check){0, 0, (float)i};
        ff_input in = rt_f32("x", &three, (float)i);
        ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_ANY, .group = "all", .inputs = &in, .ninputs = 1};
        REQUIRE(ff_controller_submit(c, &s, on_echo, &ec[i]) > 0);
    }
    REQUIRE(ff_controller_run(c, 30) == 0);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(ec[i].done, 1);
        CHECK_EQ_INT(ec[i].bad, 0);
    }
    /* to a rank: the result says who ran it */
    rt_counter k = {0};
    for (int r = 0; r < 3; r++) {
        int64_t four = 4;
        ff_input in = rt_f32("x", &four, 2.0f);
        ff_subtask_spec s = {.kind = "sum", .target = FF_TARGET_RANK, .rank = r, .inputs = &in, .ninputs = 1};
        REQUIRE(ff_controller_submit(c, &s, rt_count, &k) > 0);
    }
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(k.ok, 3);
}

/* An output kept past its callback without a copy (what a sample store does). */
static void on_keep(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    (void)n;
    ff_tensor_ref **keep = ud;
    REQUIRE(r[0].status == FF_STATUS_OK && r[0].msg && r[0].noutputs == 1);
    *keep = ff_tensor_ref_new(r[0].msg, 0);
    REQUIRE(*keep && (*keep)->t.data == r[0].outputs[0].data);
}

static void test_keep_output(ff_controller *c) {
    int64_t n = 1 << 18; /* 1 MiB */
    ff_input in = rt_f32("big", &n, 0);
    for (int64_t i = 0; i < n; i++) ((float *)in.data)[i] = (float)i;
    ff_tensor_ref *keep = NULL;
    ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_RANK, .rank = 0, .inputs = &in, .ninputs = 1};
    REQUIRE(ff_controller_submit(c, &s, on_keep, &keep) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    REQUIRE(keep);
    /* more traffic reuses the receive buffers; the kept tensor is untouched */
    rt_counter k = {0};
    for (int i = 0; i < 50; i++) {
        int64_t m = 1000;
        ff_input x = rt_f32("x", &m, -1);
        ff_subtask_spec e = {.kind = "echo", .target = FF_TARGET_RANK, .rank = 0, .inputs = &x, .ninputs = 1};
        REQUIRE(ff_controller_submit(c, &e, rt_count, &k) > 0);
    }
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK(!strcmp(keep->t.name, "big") && keep->t.nbytes == (size_t)n * 4);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += ((const float *)keep->t.data)[i] != (float)i;
    CHECK_EQ_INT(bad, 0);
    ff_tensor_ref_free(&keep);
}

typedef struct group_check {
    int n;
    int ranks[8], members[8];
    float sums[8];
    int64_t rows[8];
    float first[8];
    int status[8];
} group_check;

static void on_group(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    group_check *g = ud;
    g->n = n;
    for (int i = 0; i < n && i < 8; i++) {
        g->ranks[i] = r[i].rank;
        g->members[i] = r[i].member;
        g->status[i] = r[i].status;
        if (r[i].noutputs >= 1) {
            const ff_tensor *o = &r[i].outputs[0];
            g->sums[i] = ((const float *)o->data)[0];
            g->rows[i] = o->shape[0];
            g->first[i] = ((const float *)o->data)[0];
        }
    }
}

static void test_group_jobs(ff_controller *c) {
    /* replicate: every member sums the whole input */
    group_check g = {0};
    int64_t eight = 8;
    ff_input in = rt_f32("x", &eight, 1.0f);
    ff_subtask_spec s = {.kind = "sum", .target = FF_TARGET_GROUP, .group = "all", .inputs = &in, .ninputs = 1};
    REQUIRE(ff_controller_submit(c, &s, on_group, &g) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(g.n, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(g.members[i], i);
        CHECK_EQ_INT(g.ranks[i], i);
        CHECK(g.sums[i] == 8.0f);
    }
    /* split: 7 rows over 3 DP ranks -> 3, 2, 2 rows, in order; the scale input is replicated */
    group_check h = {0};
    float *rows = malloc(sizeof *rows * 14);
    for (int i = 0; i < 14; i++) rows[i] = (float)(i / 2); /* row r holds r */
    int64_t shape[2] = {7, 2};
    int64_t one = 1;
    ff_input ins[2] = {{.name = "x", .dtype = FF_DTYPE_F32, .ndim = 2, .shape = shape, .data = rows,
                        .free_fn = count_free, .split = true},
                       rt_f32("y", &one, 5.0f)};
    atomic_store(&frees, 0);
    ff_subtask_spec sp = {.kind = "echo", .target = FF_TARGET_GROUP_SPLIT, .group = "all", .inputs = ins, .ninputs = 2};
    REQUIRE(ff_controller_submit(c, &sp, on_group, &h) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(h.n, 3);
    CHECK_EQ_INT(h.rows[0], 3);
    CHECK_EQ_INT(h.rows[1], 2);
    CHECK_EQ_INT(h.rows[2], 2);
    CHECK(h.first[0] == 0.0f && h.first[1] == 3.0f && h.first[2] == 5.0f);
    /* the split buffer is freed once, after every member's frame is gone (ZeroMQ may free it
     * on its I/O thread a moment after the last send completes) */
    for (int i = 0; i < 10000 && atomic_load(&frees) == 0; i++) usleep(1000); /* up to 10 s: loaded machines */
    CHECK_EQ_INT(atomic_load(&frees), 1);
    /* explicit DP ranks: members 0 and 1 share DP rank 0 (a TP pair) and get the same rows */
    int ranks[3] = {0, 1, 2}, dp[3] = {0, 0, 1};
    ff_group_opts go = {.dp_rank = dp};
    REQUIRE(ff_controller_group_create(c, "tp", ranks, 3, &go) == 0);
    group_check t = {0};
    float *r5 = malloc(sizeof *r5 * 5);
    for (int i = 0; i < 5; i++) r5[i] = (float)i;
    int64_t s5[1] = {5};
    ff_input in5 = {.name = "x", .dtype = FF_DTYPE_F32, .ndim = 1, .shape = s5, .data = r5, .free_fn = rt_free,
                    .split = true};
    ff_subtask_spec st = {.kind = "echo", .target = FF_TARGET_GROUP_SPLIT, .group = "tp", .inputs = &in5, .ninputs = 1};
    REQUIRE(ff_controller_submit(c, &st, on_group, &t) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(t.n, 3);
    CHECK(t.rows[0] == 3 && t.rows[1] == 3 && t.rows[2] == 2);
    CHECK(t.first[0] == 0.0f && t.first[1] == 0.0f && t.first[2] == 3.0f);
    int bad_dp[3] = {0, 5, 1};
    go.dp_rank = bad_dp;
    CHECK(ff_controller_group_create(c, "tp2", ranks, 3, &go) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "dp rank 5");
}

typedef struct bp_check {
    int done, failed;
    uint32_t max_queued;
    int max_inflight;
} bp_check;

static void on_bp(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)job;
    (void)n;
    bp_check *b = ud;
    b->done++;
    if (r[0].status != FF_STATUS_OK) b->failed++;
    /* the worker's own count of what it held when this subtask arrived */
    if (r[0].queued > b->max_queued) b->max_queued = r[0].queued;
    if (ff_controller_inflight(c) > b->max_inflight) b->max_inflight = ff_controller_inflight(c);
}

static void test_backpressure(void) {
    ff_controller_opts o = rt_opts();
    o.max_inflight = 2;
    ff_controller *c = rt_start(&o, 2);
    bp_check b = {0};
    for (int i = 0; i < 30; i++) {
        ff_arg a = ff_arg_float("ms", 2);
        ff_subtask_spec s = {.kind = "sleep", .target = FF_TARGET_ANY, .group = "all", .args = &a, .nargs = 1};
        REQUIRE(ff_controller_submit(c, &s, on_bp, &b) > 0);
    }
    /* two workers, two slots each: four in flight, the rest wait in the controller */
    CHECK_EQ_INT(ff_controller_inflight(c), 4);
    CHECK_EQ_INT(ff_controller_pending(c), 26);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(b.done, 30);
    CHECK_EQ_INT(b.failed, 0);
    CHECK(b.max_inflight <= 4);
    CHECK(b.max_queued <= 1); /* never more than 2 on a worker: itself and one other */
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);

    /* max_pending: submit refuses beyond it, and frees the refused inputs */
    o.max_inflight = 1;
    o.max_pending = 3;
    c = rt_start(&o, 1);
    atomic_store(&frees, 0);
    rt_counter k = {0};
    int accepted = 0;
    for (int i = 0; i < 6; i++) {
        float *x = malloc(sizeof *x);
        *x = 1;
        int64_t one = 1;
        ff_input in = {.name = "x", .dtype = FF_DTYPE_F32, .ndim = 1, .shape = &one, .data = x, .free_fn = count_free};
        ff_arg a = ff_arg_float("ms", 5);
        ff_subtask_spec s = {.kind = "sleep", .target = FF_TARGET_RANK, .rank = 0, .args = &a, .nargs = 1,
                             .inputs = &in, .ninputs = 1};
        if (ff_controller_submit(c, &s, rt_count, &k) > 0) accepted++;
        else CHECK_STR_CONTAINS(ff_error_message(), "backpressure");
    }
    CHECK_EQ_INT(accepted, 4); /* 1 in flight + 3 waiting */
    CHECK_EQ_INT(atomic_load(&frees), 2);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(k.ok, 4);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
    for (int i = 0; i < 10000 && atomic_load(&frees) < 6; i++) usleep(1000); /* up to 10 s */
    CHECK_EQ_INT(atomic_load(&frees), 6); /* every input freed exactly once */
}

typedef struct one_result {
    int done;
    ff_status status;
    char error[256];
    int noutputs;
} one_result;

static void on_one(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    (void)n;
    one_result *o = ud;
    o->done++;
    o->status = r[0].status;
    o->noutputs = r[0].noutputs;
    snprintf(o->error, sizeof o->error, "%s", r[0].error);
}

static bool one_done(void *ud) { return ((one_result *)ud)->done > 0; }

static uint64_t sleep_on(ff_controller *c, int rank, double ms, one_result *out) {
    ff_arg a = ff_arg_float("ms", ms);
    ff_subtask_spec s = {.kind = "sleep", .target = FF_TARGET_RANK, .rank = rank, .args = &a, .nargs = 1};
    uint64_t id = ff_controller_submit(c, &s, on_one, out);
    REQUIRE(id > 0);
    return id;
}

static void test_cancel(void) {
    ff_controller_opts o = rt_opts();
    o.max_inflight = 2;
    ff_controller *c = rt_start(&o, 1);
    /* long sleeps: without a working cancel they would take minutes, and their status would
     * say ok rather than cancelled */
    one_result running = {0}, queued = {0}, waiting = {0};
    uint64_t a = sleep_on(c, 0, 600000, &running);
    uint64_t b = sleep_on(c, 0, 600000, &queued);  /* on the worker, behind a */
    uint64_t w = sleep_on(c, 0, 600000, &waiting); /* in the controller: 2 in flight already */
    CHECK_EQ_INT(ff_controller_pending(c), 1);
    REQUIRE(ff_controller_cancel(c, w) == 0);
    CHECK_EQ_INT(waiting.done, 0); /* never inside the call */
    REQUIRE(ff_controller_run_until(c, one_done, &waiting, 10) == 0);
    CHECK(waiting.status == FF_STATUS_CANCELLED);
    CHECK_STR_CONTAINS(waiting.error, "before dispatch");
    REQUIRE(ff_controller_cancel(c, b) == 0);
    REQUIRE(ff_controller_run_until(c, one_done, &queued, 10) == 0);
    CHECK(queued.status == FF_STATUS_CANCELLED);
    CHECK_STR_CONTAINS(queued.error, "while queued");
    REQUIRE(ff_controller_cancel(c, a) == 0);
    REQUIRE(ff_controller_run_until(c, one_done, &running, 10) == 0);
    CHECK(running.status == FF_STATUS_CANCELLED);
    CHECK(ff_controller_cancel(c, a) == -1); /* done: nothing to cancel */
    CHECK(ff_controller_cancel(c, 123456) == -1);
    /* the worker is still fine */
    one_result after = {0};
    sleep_on(c, 0, 1, &after);
    REQUIRE(ff_controller_run(c, 10) == 0);
    CHECK(after.status == FF_STATUS_OK);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
}

static void test_failures_and_errors(ff_controller *c) {
    one_result f = {0}, u = {0}, bad = {0};
    ff_arg m = ff_arg_str("message", "boom 42");
    ff_subtask_spec s = {.kind = "fail", .target = FF_TARGET_ANY, .group = "all", .args = &m, .nargs = 1};
    REQUIRE(ff_controller_submit(c, &s, on_one, &f) > 0);
    ff_subtask_spec su = {.kind = "no-such-kind", .target = FF_TARGET_RANK, .rank = 1};
    REQUIRE(ff_controller_submit(c, &su, on_one, &u) > 0);
    ff_arg neg = ff_arg_str("ms", "soon");
    ff_subtask_spec sb = {.kind = "sleep", .target = FF_TARGET_RANK, .rank = 2, .args = &neg, .nargs = 1};
    REQUIRE(ff_controller_submit(c, &sb, on_one, &bad) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK(f.status == FF_STATUS_FAILED);
    CHECK_STR_CONTAINS(f.error, "boom 42");
    CHECK(u.status == FF_STATUS_UNKNOWN_KIND);
    CHECK_STR_CONTAINS(u.error, "no-such-kind");
    CHECK(bad.status == FF_STATUS_BAD_REQUEST);
    CHECK_STR_CONTAINS(bad.error, "'ms' is a string");

    /* submit errors: nothing runs, inputs are freed */
    atomic_store(&frees, 0);
    int64_t one = 1;
    float *x = malloc(sizeof *x);
    ff_input in = {.name = "x", .dtype = FF_DTYPE_F32, .ndim = 1, .shape = &one, .data = x, .free_fn = count_free};
    ff_subtask_spec e1 = {.kind = "echo", .target = FF_TARGET_ANY, .group = "nope", .inputs = &in, .ninputs = 1};
    CHECK(ff_controller_submit(c, &e1, on_one, NULL) == 0);
    CHECK_STR_CONTAINS(ff_error_message(), "no group named 'nope'");
    CHECK_EQ_INT(atomic_load(&frees), 1);
    ff_subtask_spec e2 = {.kind = "echo", .target = FF_TARGET_RANK, .rank = 99};
    CHECK(ff_controller_submit(c, &e2, on_one, NULL) == 0);
    CHECK_STR_CONTAINS(ff_error_message(), "rank 99 is unknown");
    ff_subtask_spec e3 = {.kind = "", .target = FF_TARGET_RANK, .rank = 0};
    CHECK(ff_controller_submit(c, &e3, on_one, NULL) == 0);
    int bad_ranks[2] = {0, 0};
    CHECK(ff_controller_group_create(c, "dup", bad_ranks, 2, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "listed twice");
    ff_group_opts go = {.backend = "mpi"};
    CHECK(ff_controller_group_create(c, "g", bad_ranks, 1, &go) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown collective backend");
}

/* A program that owns its loop: the controller only adds watchers; the program runs it. */
static void on_owned(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)job;
    (void)n;
    int *left = ud;
    if (r[0].status == FF_STATUS_OK && --*left == 0) ev_break(ff_controller_loop(c), EVBREAK_ALL);
}

static void test_own_loop(void) {
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    ff_controller_opts o = rt_opts();
    o.loop = loop;
    ff_controller *c = rt_start(&o, 2);
    int left = 50;
    for (int i = 0; i < 50; i++) {
        int64_t two = 2;
        ff_input in = rt_f32("x", &two, 1.0f);
        ff_subtask_spec s = {.kind = "sum", .target = FF_TARGET_ANY, .group = "all", .inputs = &in, .ninputs = 1};
        REQUIRE(ff_controller_submit(c, &s, on_owned, &left) > 0);
    }
    ev_run(loop, 0); /* the program's own loop; on_owned breaks it */
    CHECK_EQ_INT(left, 0);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
    ev_loop_destroy(loop);
}

static void test_shutdown(void) {
    ff_controller_opts o = rt_opts();
    o.max_inflight = 1;
    ff_controller *c = rt_start(&o, 2);
    rt_counter k = {0};
    for (int i = 0; i < 6; i++) {
        ff_arg a = ff_arg_float("ms", 600000);
        ff_subtask_spec s = {.kind = "sleep", .target = FF_TARGET_ANY, .group = "all", .args = &a, .nargs = 1};
        REQUIRE(ff_controller_submit(c, &s, rt_count, &k) > 0);
    }
    ff_worker_info w0;
    REQUIRE(ff_controller_worker_info(c, 0, &w0) == 0);
    REQUIRE(ff_controller_shutdown(c, 10) == 0); /* the workers stop on their own: none killed */
    CHECK_EQ_INT(k.done, 6);
    CHECK_EQ_INT(k.status[FF_STATUS_SHUTDOWN], 4);  /* never dispatched */
    CHECK_EQ_INT(k.status[FF_STATUS_CANCELLED], 2); /* interrupted on the workers */
    CHECK_EQ_INT(ff_controller_count_workers(c, FF_WORKER_STOPPED), 2);
    for (int r = 0; r < 2; r++) {
        ff_worker_info wi;
        ff_controller_worker_info(c, r, &wi);
        CHECK_EQ_INT(wi.exit_code, 0);
    }
    CHECK(kill((pid_t)w0.pid, 0) == -1); /* the process is gone (and reaped) */
    ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_RANK, .rank = 0};
    CHECK(ff_controller_submit(c, &s, rt_count, &k) == 0);
    CHECK_STR_CONTAINS(ff_error_message(), "shutting down");
    ff_controller_destroy(&c);
}

/* A kind of the program's own, registered through ff_worker_serve's setup (the docs' example). */
static int kind_scale(ff_task *t, void *ud) {
    (void)ud;
    double k;
    const ff_tensor *x = ff_task_input_named(t, "x");
    if (!x || ff_msg_arg_float(ff_task_subtask(t), "k", &k) != 0)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s", ff_error_message());
    float *y = ff_task_output(t, "y", FF_DTYPE_F32, x->ndim, x->shape);
    if (!y) return -1;
    for (int64_t i = 0; i < ff_tensor_numel(x); i++) y[i] = (float)k * ((const float *)x->data)[i];
    return 0;
}

static int setup_worker(ff_worker *w, void *ud) {
    (void)ud;
    return ff_worker_register(w, "scale", kind_scale, NULL, 0);
}

static void on_scale(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    (void)n;
    int *ok = ud;
    *ok = r[0].status == FF_STATUS_OK && r[0].noutputs == 1 && !strcmp(r[0].outputs[0].name, "y") &&
          ((const float *)r[0].outputs[0].data)[2] == 7.5f;
}

static void test_custom_kind(ff_controller *c) {
    int ok = 0;
    int64_t three = 3;
    ff_input in = rt_f32("x", &three, 2.5f);
    ff_arg k = ff_arg_float("k", 3);
    ff_subtask_spec s = {.kind = "scale", .target = FF_TARGET_ANY, .group = "all", .args = &k, .nargs = 1,
                         .inputs = &in, .ninputs = 1};
    REQUIRE(ff_controller_submit(c, &s, on_scale, &ok) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK(ok);
    ff_worker_info wi;
    ff_controller_worker_info(c, 0, &wi);
    bool has = false;
    for (int i = 0; i < wi.ncaps; i++) has |= !strcmp(wi.caps[i], "scale");
    CHECK(has); /* announced in the hello */
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "worker")) return rt_worker_main(argc - 1, argv + 1, setup_worker, NULL);
    ff_controller_opts o = rt_opts();
    ff_controller *c = rt_start(&o, 3);
    /* past what the machine runs: refused before any process starts, the bound named */
    char why[200];
    int most = ff_controller_local_worker_limit(c, why, sizeof why);
    CHECK(most >= 1 && most < 100000);
    CHECK(why[0] != 0);
    CHECK_EQ_INT(ff_controller_spawn(c, 100000), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot start 100000 local workers: this machine runs at most");
    CHECK_STR_CONTAINS(ff_error_message(), why);
    CHECK_EQ_INT(ff_controller_nranks(c), 3);
    test_any_and_rank(c);
    test_group_jobs(c);
    test_keep_output(c);
    test_custom_kind(c);
    test_failures_and_errors(c);
    ff_controller_stats st;
    ff_controller_stats_get(c, &st);
    CHECK_EQ_INT(st.duplicates, 0);
    CHECK_EQ_INT(st.wire.rejected, 0);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
    CHECK(c == NULL);
    test_backpressure();
    test_cancel();
    test_own_loop();
    test_shutdown();
    TEST_MAIN_END();
}
