/* Collectives inside worker groups: the group setup builds a cpu communicator on every member
 * (member 0 makes the unique id); the "collective" kind runs all-reduce, broadcast,
 * all-gather and reduce-scatter, uneven splits included, and each result is compared with
 * the same computation done here serially. A member that dies breaks the group (its
 * collective fails on the others, later group jobs fail at once); rebuilding it works. */
#include "tests/runtime/rt_test.h"

enum { W = 4 };

typedef struct got {
    int n, done;
    int status[8], rank[8];
    int64_t rows[8], cols[8];
    float data[8][64];
    char error[8][256];
} got;

static void on_got(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    got *g = ud;
    g->n = n;
    g->done++;
    for (int i = 0; i < n && i < 8; i++) {
        g->status[i] = r[i].status;
        g->rank[i] = r[i].rank;
        snprintf(g->error[i], sizeof g->error[i], "%s", r[i].error);
        if (r[i].noutputs == 1 && r[i].outputs[0].dtype == FF_DTYPE_F32 && r[i].outputs[0].nbytes <= sizeof g->data[i]) {
            g->rows[i] = r[i].outputs[0].shape[0];
            g->cols[i] = r[i].outputs[0].ndim > 1 ? r[i].outputs[0].shape[1] : 1;
            memcpy(g->data[i], r[i].outputs[0].data, r[i].outputs[0].nbytes);
        }
    }
}

/* Run op on group `group`: x [rows, cols] with x[r][c] = f(r, c), split across members or
 * replicated. */
static got run(ff_controller *c, const char *group, const char *op, const char *redop, int root, int rows, int cols,
               bool split, float (*f)(int, int)) {
    float *x = malloc(sizeof *x * (size_t)(rows * cols));
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) x[r * cols + k] = f(r, k);
    int64_t shape[2] = {rows, cols};
    ff_input in = {.name = "x", .dtype = FF_DTYPE_F32, .ndim = 2, .shape = shape, .data = x, .free_fn = rt_free,
                   .split = split};
    ff_arg args[3] = {ff_arg_str("op", op), ff_arg_str("redop", redop), ff_arg_int("root", root)};
    ff_subtask_spec s = {.kind = "collective", .target = split ? FF_TARGET_GROUP_SPLIT : FF_TARGET_GROUP,
                         .group = group, .args = args, .nargs = 3, .inputs = &in, .ninputs = 1};
    got g;
    memset(&g, 0, sizeof g);
    REQUIRE(ff_controller_submit(c, &s, on_got, &g) > 0);
    REQUIRE(ff_controller_run(c, 60) == 0);
    return g;
}

static float f_rc(int r, int c) { return (float)(10 * r + c); }
static float f_mix(int r, int c) { return (float)((r * 7 + c * 3) % 11) - 5.0f; }

static void expect_ok(const got *g, int n) {
    CHECK_EQ_INT(g->done, 1);
    CHECK_EQ_INT(g->n, n);
    for (int i = 0; i < g->n; i++) {
        if (g->status[i] != FF_STATUS_OK) fprintf(stderr, "member %d: %s\n", i, g->error[i]);
        CHECK(g->status[i] == FF_STATUS_OK);
    }
}

static void test_ops(ff_controller *c) {
    /* all-reduce over the rows each member holds (one each) */
    const char *redops[3] = {"sum", "avg", "max"};
    for (int k = 0; k < 3; k++) {
        got g = run(c, "all", "all_reduce", redops[k], 0, W, 5, true, f_mix);
        expect_ok(&g, W);
        for (int col = 0; col < 5; col++) {
            double want = k == 2 ? -1e30 : 0;
            for (int r = 0; r < W; r++) {
                double v = f_mix(r, col);
                if (k == 2) want = v > want ? v : want;
                else want += v;
            }
            if (k == 1) want /= W;
            for (int m = 0; m < W; m++) CHECK_CLOSE(g.data[m][col], want, 1e-6, 1e-6);
        }
    }
    /* broadcast from member 2 */
    got b = run(c, "all", "broadcast", "sum", 2, W, 3, true, f_rc);
    expect_ok(&b, W);
    for (int m = 0; m < W; m++)
        for (int col = 0; col < 3; col++) CHECK(b.data[m][col] == f_rc(2, col));
    /* all-gather of uneven slices: 7 rows over 4 members (2, 2, 2, 1) come back whole */
    got a = run(c, "all", "all_gather", "sum", 0, 7, 3, true, f_rc);
    expect_ok(&a, W);
    for (int m = 0; m < W; m++) {
        CHECK_EQ_INT(a.rows[m], 7);
        for (int r = 0; r < 7; r++)
            for (int col = 0; col < 3; col++) CHECK(a.data[m][r * 3 + col] == f_rc(r, col));
    }
    /* reduce-scatter of a replicated [7, 3]: the sum is 4x, member m gets its rows */
    got rs = run(c, "all", "reduce_scatter", "sum", 0, 7, 3, false, f_mix);
    expect_ok(&rs, W);
    int start = 0;
    for (int m = 0; m < W; m++) {
        int nrows = 7 / W + (m < 7 % W);
        CHECK_EQ_INT(rs.rows[m], nrows);
        for (int r = 0; r < nrows; r++)
            for (int col = 0; col < 3; col++) CHECK(rs.data[m][r * 3 + col] == W * f_mix(start + r, col));
        start += nrows;
    }
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    ff_controller_opts o = rt_opts();
    o.timeout_s = 3;
    ff_controller *c = ff_controller_new(&o);
    REQUIRE(c);
    REQUIRE(ff_controller_spawn(c, W) == 0);
    REQUIRE(ff_controller_wait_workers(c, W, 30) == 0);
    int all[W] = {0, 1, 2, 3};
    ff_group_opts cpu = {.backend = "cpu", .timeout_s = 30};
    if (ff_controller_group_create(c, "all", all, W, &cpu) != 0) {
        fprintf(stderr, "%s\n", ff_error_message());
        return 1;
    }
    test_ops(c);

    /* a sub-group, members in a chosen order */
    int pair[2] = {3, 1};
    REQUIRE(ff_controller_group_create(c, "pair", pair, 2, &cpu) == 0);
    got p = run(c, "pair", "all_reduce", "sum", 0, 2, 2, true, f_rc);
    expect_ok(&p, 2);
    CHECK(p.rank[0] == 3 && p.rank[1] == 1);
    CHECK(p.data[0][0] == 10 && p.data[1][1] == 12);

    /* no communicator in a group without a backend */
    int one[1] = {0};
    REQUIRE(ff_controller_group_create(c, "plain", one, 1, NULL) == 0);
    got n = run(c, "plain", "all_reduce", "sum", 0, 1, 1, false, f_rc);
    CHECK(n.status[0] == FF_STATUS_BAD_REQUEST);
    CHECK_STR_CONTAINS(n.error[0], "no communicator");
    got u = run(c, "all", "all_shuffle", "sum", 0, W, 1, true, f_rc);
    CHECK(u.status[0] == FF_STATUS_BAD_REQUEST);
    CHECK_STR_CONTAINS(u.error[0], "unknown op");

    /* a member dies while the others wait for it inside an all-reduce */
    ff_worker_info w2;
    ff_controller_worker_info(c, 2, &w2);
    ff_arg slp = ff_arg_float("ms", 600000);
    ff_subtask_spec hold = {.kind = "sleep", .target = FF_TARGET_RANK, .rank = 2, .args = &slp, .nargs = 1};
    rt_counter hk = {0};
    REQUIRE(ff_controller_submit(c, &hold, rt_count, &hk) > 0); /* member 2 is busy... */
    float *x = calloc(W, sizeof *x);
    int64_t shape[2] = {W, 1};
    ff_input in = {.name = "x", .dtype = FF_DTYPE_F32, .ndim = 2, .shape = shape, .data = x, .free_fn = rt_free,
                   .split = true};
    ff_arg args[1] = {ff_arg_str("op", "all_reduce")};
    ff_subtask_spec s = {.kind = "collective", .target = FF_TARGET_GROUP_SPLIT, .group = "all", .args = args,
                         .nargs = 1, .inputs = &in, .ninputs = 1};
    got d;
    memset(&d, 0, sizeof d);
    REQUIRE(ff_controller_submit(c, &s, on_got, &d) > 0); /* ...so the others block in the all-reduce */
    kill((pid_t)w2.pid, SIGKILL);
    REQUIRE(ff_controller_run(c, 60) == 0);
    CHECK_EQ_INT(d.n, W);
    CHECK(d.status[2] == FF_STATUS_WORKER_LOST);
    for (int m = 0; m < W; m++)
        if (m != 2) CHECK(d.status[m] == FF_STATUS_FAILED); /* the collective failed, naming the dead peer */
    CHECK_EQ_INT(hk.status[FF_STATUS_WORKER_LOST], 1);
    /* the group is broken now: group jobs fail at once, with a hint */
    got br = run(c, "all", "all_reduce", "sum", 0, W, 1, true, f_rc);
    CHECK(br.status[0] == FF_STATUS_WORKER_LOST);
    CHECK_STR_CONTAINS(br.error[0], "broken");
    /* rebuilt from the survivors, it works again */
    int three[3] = {0, 1, 3};
    REQUIRE(ff_controller_group_create(c, "all", three, 3, &cpu) == 0);
    got ok = run(c, "all", "all_reduce", "sum", 0, 3, 2, true, f_rc);
    expect_ok(&ok, 3);
    CHECK(ok.data[0][0] == 30 && ok.data[2][1] == 33);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
    TEST_MAIN_END();
}
