/* Messages the other side refuses: the subtask fails (its callback gets the reason, status
 * REJECTED) instead of waiting for an answer that never comes, and an idempotent ANY
 * subtask goes to another member first.
 *   1. a frame over a worker's limit (a worker started with --max-frame): the controller,
 *      told the limit in the hello, fails the subtask before sending it, for RANK jobs,
 *      ANY jobs in a group of that worker alone, and non-idempotent ANY jobs; idempotent ANY
 *      jobs of a group with another worker all succeed there;
 *   2. a worker's decoder refuses a subtask (sent raw, past the controller's check): its
 *      error names the subtask's id, so a controller can fail it;
 *   3. the controller's decoder refuses a worker's result (a raw worker answers with a frame
 *      over the controller's limit): that subtask fails with the controller's reason;
 *   4. a worker whose result is over the controller's limit (told in the welcome) sends a
 *      REJECTED result naming the tensor instead. */
#include <spawn.h>
#include <sys/wait.h>

#include "tests/runtime/rt_test.h"

extern char **environ;

enum { LIMIT = 64 * 1024, BIG = 100 * 1000 }; /* BIG floats: 400 KB frames; BIG bytes: 100 KB */

typedef struct got {
    int done, ok, rejected;
    ff_status status;
    char error[FF_MSG_TEXT_MAX];
} got;

static void on_got(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c, (void)job, (void)n;
    got *g = ud;
    g->done++;
    g->status = r[0].status;
    if (r[0].status == FF_STATUS_OK) g->ok++;
    if (r[0].status == FF_STATUS_REJECTED) g->rejected++;
    snprintf(g->error, sizeof g->error, "%s", r[0].error);
}

static uint64_t submit_big(ff_controller *c, ff_target target, int rank, const char *group, bool idempotent, size_t floats,
                           got *g) {
    static int64_t shape[1];
    shape[0] = (int64_t)floats;
    ff_input in = rt_f32("x", shape, 1.0f);
    ff_subtask_spec s = {.kind = "echo", .target = target, .rank = rank, .group = group, .inputs = &in, .ninputs = 1,
                         .idempotent = idempotent};
    uint64_t id = ff_controller_submit(c, &s, on_got, g);
    REQUIRE(id > 0);
    return id;
}

static pid_t spawn_worker(const char *endpoint, int rank, const char *max_frame) {
    char rank_s[16];
    snprintf(rank_s, sizeof rank_s, "%d", rank);
    char *argv[] = {rt_self, "worker", "--connect", (char *)endpoint, "--rank", rank_s, "--max-frame", (char *)max_frame,
                    "--log", "off", NULL};
    pid_t pid;
    REQUIRE(posix_spawn(&pid, rt_self, NULL, NULL, argv, environ) == 0);
    return pid;
}

/* 1: rank 0 a local worker (1 GiB limit), rank 1 a worker with a 64 KiB one. */
static void test_worker_limit(void) {
    ff_controller_opts o = rt_opts();
    ff_controller *c = rt_start(&o, 1);
    char lim[32];
    snprintf(lim, sizeof lim, "%d", LIMIT);
    pid_t small = spawn_worker(ff_controller_endpoint(c), 1, lim);
    REQUIRE(ff_controller_wait_workers(c, 2, 30) == 0);
    REQUIRE(ff_controller_group_create(c, "small", (int[]){1}, 1, NULL) == 0);
    REQUIRE(ff_controller_group_create(c, "both", (int[]){0, 1}, 2, NULL) == 0);

    got rank_job = {0}, any_small = {0}, fits = {0};
    submit_big(c, FF_TARGET_RANK, 1, NULL, false, BIG, &rank_job);
    submit_big(c, FF_TARGET_ANY, 0, "small", true, BIG, &any_small);
    submit_big(c, FF_TARGET_RANK, 1, NULL, false, LIMIT / 8, &fits); /* 32 KiB: under the limit */
    REQUIRE(ff_controller_run(c, 20) == 0);                           /* nothing waits forever */
    CHECK_EQ_INT(rank_job.rejected, 1);
    CHECK_STR_CONTAINS(rank_job.error, "tensor frame 0 has 400000 bytes, over worker 1's limit of 65536");
    CHECK_STR_CONTAINS(rank_job.error, "--max-frame");
    CHECK_EQ_INT(any_small.rejected, 1);
    CHECK_EQ_INT(fits.ok, 1);

    /* idempotent ANY jobs over both workers: those that met the small one ran on the other */
    ff_controller_stats st0, st1;
    ff_controller_stats_get(c, &st0);
    got idem = {0}, plain = {0};
    for (int i = 0; i < 6; i++) submit_big(c, FF_TARGET_ANY, 0, "both", true, BIG, &idem);
    REQUIRE(ff_controller_run(c, 20) == 0);
    ff_controller_stats_get(c, &st1);
    CHECK_EQ_INT(idem.ok, 6);
    CHECK(st1.redispatched > st0.redispatched);
    /* the same, not idempotent: those sent to the small one fail, the others succeed */
    for (int i = 0; i < 6; i++) submit_big(c, FF_TARGET_ANY, 0, "both", false, BIG, &plain);
    REQUIRE(ff_controller_run(c, 20) == 0);
    CHECK_EQ_INT(plain.done, 6);
    CHECK(plain.rejected >= 1 && plain.ok >= 1);
    CHECK_EQ_INT(plain.ok + plain.rejected, 6);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
    int status;
    REQUIRE(waitpid(small, &status, 0) == small);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void recv_one(ff_msg_decoder *d, void *sock, bool router, ff_msg *m, ff_controller *c) {
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    for (int i = 0; i < 2000; i++) {
        int rc = ff_msg_recv(d, sock, router, m, NULL);
        if (rc == 1) return;
        REQUIRE(rc == 0);
        if (c) ff_controller_poll(c, false);
        zmq_poll(&it, 1, 5);
    }
    fprintf(stderr, "no message within 10 s\n");
    exit(1);
}

/* 2: a raw controller sends a worker (64 KiB limit) a subtask with a 100 KB frame. */
static void test_worker_decoder(void) {
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    char ep[128], lim[32];
    snprintf(ep, sizeof ep, "ipc:///tmp/ff-test-reject-%d.sock", (int)getpid());
    snprintf(lim, sizeof lim, "%d", LIMIT);
    REQUIRE(zmq_bind(router, ep) == 0);
    pid_t pid = spawn_worker(ep, 0, lim);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m, out;
    ff_msg_init(&m);
    ff_msg_init(&out);
    recv_one(d, router, true, &m, NULL);
    REQUIRE(m.type == FF_MSG_HELLO);
    CHECK_EQ_INT(m.u.hello.max_frame, LIMIT); /* the limit the controller checks against */
    uint8_t peer[256];
    size_t pl = m.peer_len;
    memcpy(peer, m.peer, pl);
    ff_msg_begin(&out, FF_MSG_WELCOME);
    out.u.welcome = (ff_msg_welcome){.rank = 0, .heartbeat_ms = 1000, .timeout_ms = 30000, .max_inflight = 8};
    REQUIRE(ff_msg_send(router, peer, pl, &out) == 0);
    ff_msg_begin(&out, FF_MSG_SUBTASK);
    out.u.subtask.id = 4242;
    snprintf(out.u.subtask.kind, sizeof out.u.subtask.kind, "echo");
    REQUIRE(ff_msg_add_tensor(&out, "x", FF_DTYPE_U8, 1, (int64_t[]){BIG}, calloc(1, BIG), rt_free, NULL));
    REQUIRE(ff_msg_send(router, peer, pl, &out) == 0);
    recv_one(d, router, true, &m, NULL);
    CHECK(m.type == FF_MSG_ERROR && m.u.error.code == FF_ERR_MALFORMED);
    CHECK_EQ_INT(m.u.error.ref, 4242);
    CHECK_STR_CONTAINS(m.u.error.text, "worker 0 rejected subtask 4242");
    CHECK_STR_CONTAINS(m.u.error.text, "tensor frame 0 has 100000 bytes (limit 65536)");
    ff_msg_begin(&out, FF_MSG_SHUTDOWN);
    REQUIRE(ff_msg_send(router, peer, pl, &out) == 0);
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ff_msg_free(&m);
    ff_msg_free(&out);
    ff_msg_decoder_destroy(&d);
    zmq_close(router);
    zmq_ctx_term(ctx);
    unlink(ep + strlen("ipc://"));
}

/* 3: a raw worker answers a subtask with a result frame over the controller's limit. */
static void test_controller_decoder(void) {
    ff_controller_opts o = rt_opts();
    o.max_frame_bytes = LIMIT;
    o.timeout_s = 30; /* the raw worker does not answer pings */
    ff_controller *c = rt_start(&o, 0);
    void *ctx = zmq_ctx_new();
    void *raw = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
    REQUIRE(zmq_connect(raw, ff_controller_endpoint(c)) == 0);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m;
    ff_msg_init(&m);
    ff_msg_begin(&m, FF_MSG_HELLO);
    m.u.hello.rank = 0;
    snprintf(m.u.hello.host, sizeof m.u.hello.host, "raw");
    REQUIRE(ff_msg_send(raw, NULL, 0, &m) == 0);
    REQUIRE(ff_controller_wait_workers(c, 1, 10) == 0);
    do recv_one(d, raw, false, &m, c);
    while (m.type != FF_MSG_WELCOME);
    CHECK_EQ_INT(m.u.welcome.max_frame, LIMIT);
    got g = {0};
    uint64_t id = submit_big(c, FF_TARGET_RANK, 0, NULL, false, 4, &g);
    do recv_one(d, raw, false, &m, c);
    while (m.type != FF_MSG_SUBTASK);
    CHECK_EQ_INT(m.u.subtask.id, id);
    ff_msg_begin(&m, FF_MSG_RESULT);
    m.u.result.id = id;
    REQUIRE(ff_msg_add_tensor(&m, "x", FF_DTYPE_U8, 1, (int64_t[]){BIG}, calloc(1, BIG), rt_free, NULL));
    REQUIRE(ff_msg_send(raw, NULL, 0, &m) == 0);
    REQUIRE(ff_controller_run(c, 10) == 0);
    CHECK_EQ_INT(g.rejected, 1);
    CHECK_STR_CONTAINS(g.error, "the controller rejected the result of worker 0");
    CHECK_STR_CONTAINS(g.error, "tensor frame 0 has 100000 bytes (limit 65536)");
    ff_msg_free(&m);
    ff_msg_decoder_destroy(&d);
    zmq_close(raw);
    zmq_ctx_term(ctx);
    ff_controller_shutdown(c, 2);
    ff_controller_destroy(&c);
}

/* 4: a real worker whose echo would come back over the controller's limit. */
static void test_result_limit(void) {
    ff_controller_opts o = rt_opts();
    o.max_frame_bytes = LIMIT;
    ff_controller *c = rt_start(&o, 1);
    got big = {0}, small = {0};
    /* the input goes out (the worker's limit is 1 GiB); its echo may not come back */
    submit_big(c, FF_TARGET_RANK, 0, NULL, false, BIG, &big);
    submit_big(c, FF_TARGET_RANK, 0, NULL, false, 4, &small);
    REQUIRE(ff_controller_run(c, 20) == 0);
    CHECK_EQ_INT(big.rejected, 1);
    CHECK_STR_CONTAINS(big.error, "result tensor 'x' of echo has 400000 bytes, over the controller's limit of 65536");
    CHECK_EQ_INT(small.ok, 1);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    ff_log_set_level(FF_LOG_ERROR);
    rt_opts(); /* sets rt_self */
    test_worker_limit();
    test_worker_decoder();
    test_controller_decoder();
    test_result_limit();
    TEST_MAIN_END();
}
