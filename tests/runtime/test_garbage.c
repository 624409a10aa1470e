/* Garbage, truncated, oversized and otherwise wrong messages sent to a live controller (while
 * it runs real work) and to a live worker: each is rejected, counted under its reason and
 * answered with an error; both keep serving. A worker whose hello is answered in another
 * protocol version stops at once, naming both versions. */
#include <msgpack.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include "tests/runtime/rt_test.h"

extern char **environ;

enum { MAX_FRAME = 64 * 1024 };

/* The bad messages, as lists of frames; `want` is the reason each must be rejected for. */
typedef struct bad {
    const char *what;
    ff_reject want;
    int nframes;
    void *frames[300];
    size_t lens[300];
} bad;

static void *pack(msgpack_sbuffer *sb, size_t *len) {
    *len = sb->size;
    void *p = malloc(sb->size);
    memcpy(p, sb->data, sb->size);
    msgpack_sbuffer_destroy(sb);
    return p;
}

/* A valid RESULT header describing one U8 tensor of 100000 bytes. */
static void *result_header(size_t *len) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 9);
    msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
    msgpack_pack_int(&pk, FF_MSG_RESULT);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_int(&pk, 0);
    msgpack_pack_str(&pk, 0);
    msgpack_pack_int(&pk, 0);
    msgpack_pack_int(&pk, 0);
    msgpack_pack_int(&pk, 0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_str(&pk, 1);
    msgpack_pack_str_body(&pk, "x", 1);
    msgpack_pack_str(&pk, 2);
    msgpack_pack_str_body(&pk, "U8", 2);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_int(&pk, 100000);
    return pack(&sb, len);
}

static void *small_header(int version, int type, size_t *len) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_int(&pk, version);
    msgpack_pack_int(&pk, type);
    msgpack_pack_int(&pk, 0);
    return pack(&sb, len);
}

static int make_bad(bad *b) {
    int n = 0;
    /* not msgpack at all */
    b[n] = (bad){.what = "garbage", .want = FF_REJECT_MALFORMED, .nframes = 1, .frames = {strdup("garbage!!")}, .lens = {9}};
    n++;
    /* a heartbeat cut in half */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 9);
    for (int i = 0; i < 9; i++) msgpack_pack_int(&pk, i < 1 ? FF_PROTOCOL_VERSION : 3);
    b[n] = (bad){.what = "truncated", .want = FF_REJECT_TRUNCATED, .nframes = 1};
    b[n].frames[0] = pack(&sb, &b[n].lens[0]);
    b[n++].lens[0] /= 2;
    /* an empty message */
    b[n++] = (bad){.what = "empty", .want = FF_REJECT_TRUNCATED, .nframes = 1, .frames = {strdup("")}, .lens = {0}};
    /* a header over the limit */
    b[n++] = (bad){.what = "huge header", .want = FF_REJECT_OVERSIZED, .nframes = 1, .frames = {calloc(1, 70000)}, .lens = {70000}};
    /* a tensor frame over the limit (its header is fine) */
    b[n] = (bad){.what = "huge frame", .want = FF_REJECT_OVERSIZED, .nframes = 2};
    b[n].frames[0] = result_header(&b[n].lens[0]);
    b[n].frames[1] = calloc(1, 100000);
    b[n++].lens[1] = 100000;
    /* an unknown type, a wrong version */
    b[n] = (bad){.what = "unknown type", .want = FF_REJECT_UNKNOWN_TYPE, .nframes = 1};
    b[n].frames[0] = small_header(FF_PROTOCOL_VERSION, 42, &b[n].lens[0]);
    n++;
    b[n] = (bad){.what = "version", .want = FF_REJECT_VERSION, .nframes = 1};
    b[n].frames[0] = small_header(FF_PROTOCOL_VERSION + 1, FF_MSG_CANCEL, &b[n].lens[0]);
    n++;
    /* a frame that disagrees with its header (needs 100000 bytes, has 10) */
    b[n] = (bad){.what = "frame mismatch", .want = FF_REJECT_FRAMES, .nframes = 2};
    b[n].frames[0] = result_header(&b[n].lens[0]);
    b[n].frames[1] = calloc(1, 10);
    b[n++].lens[1] = 10;
    /* too many frames */
    b[n] = (bad){.what = "too many frames", .want = FF_REJECT_OVERSIZED, .nframes = 300};
    for (int i = 0; i < 300; i++) {
        b[n].frames[i] = strdup("x");
        b[n].lens[i] = 1;
    }
    n++;
    return n;
}

static void free_bad(bad *b, int n) {
    for (int i = 0; i < n; i++)
        for (int k = 0; k < b[i].nframes; k++) free(b[i].frames[k]);
}

static void send_bad(void *sock, const void *peer, size_t peer_len, const bad *b) {
    if (peer) REQUIRE(zmq_send(sock, peer, peer_len, ZMQ_SNDMORE) >= 0);
    for (int k = 0; k < b->nframes; k++)
        REQUIRE(zmq_send(sock, b->frames[k], b->lens[k], k + 1 < b->nframes ? ZMQ_SNDMORE : 0) >= 0);
}

/* Receive one message (blocking up to ~10 s), or fail the test. c: a controller in this
 * process to keep serving meanwhile (the garbage may still wait in its socket when its jobs
 * are done), or NULL. */
static void recv_msg(ff_controller *c, ff_msg_decoder *d, void *sock, bool router, ff_msg *m) {
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    for (int i = 0; i < 1000; i++) {
        int rc = ff_msg_recv(d, sock, router, m, NULL);
        if (rc == 1) return;
        REQUIRE(rc == 0);
        if (c) ff_controller_poll(c, false);
        zmq_poll(&it, 1, 10);
    }
    fprintf(stderr, "no message within 10 s\n");
    exit(1);
}

static void test_controller(bad *b, int nb) {
    ff_controller_opts o = rt_opts();
    o.max_frame_bytes = MAX_FRAME;
    o.timeout_s = 30; /* the raw socket does not answer pings: keep it from being declared dead */
    ff_controller *c = rt_start(&o, 2);
    void *ctx = zmq_ctx_new();
    void *raw = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
    REQUIRE(zmq_connect(raw, ff_controller_endpoint(c)) == 0);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m;
    ff_msg_init(&m);

    /* real work interleaved with the garbage */
    rt_counter k = {0};
    for (int i = 0; i < 500; i++) {
        int64_t two = 2;
        ff_input in = rt_f32("x", &two, 1.0f);
        ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_ANY, .group = "all", .inputs = &in, .ninputs = 1};
        REQUIRE(ff_controller_submit(c, &s, rt_count, &k) > 0);
        if (i % 50 == 0 && i / 50 < nb) send_bad(raw, NULL, 0, &b[i / 50]);
    }
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(k.ok, 500);
    /* every bad message got an error reply */
    for (int i = 0; i < nb; i++) {
        recv_msg(c, d, raw, false, &m);
        CHECK(m.type == FF_MSG_ERROR && m.u.error.code == FF_ERR_MALFORMED);
    }
    /* a valid message from a peer that never said hello */
    ff_msg_begin(&m, FF_MSG_RESULT);
    m.u.result.id = 3;
    REQUIRE(ff_msg_send(raw, NULL, 0, &m) == 0);
    for (int i = 0; i < 20000 && !ff_msg_recv(d, raw, false, &m, NULL); i++) ff_controller_poll(c, false), usleep(500);
    CHECK(m.type == FF_MSG_ERROR && m.u.error.code == FF_ERR_UNKNOWN_PEER);
    /* after a hello: a result for nothing in flight is dropped as a duplicate */
    ff_msg_begin(&m, FF_MSG_HELLO);
    m.u.hello.rank = -1;
    snprintf(m.u.hello.host, sizeof m.u.hello.host, "raw");
    REQUIRE(ff_msg_send(raw, NULL, 0, &m) == 0);
    REQUIRE(ff_controller_wait_workers(c, 3, 10) == 0);
    ff_msg_begin(&m, FF_MSG_RESULT);
    m.u.result.id = 999999;
    REQUIRE(ff_msg_send(raw, NULL, 0, &m) == 0);
    ff_controller_stats st;
    for (int i = 0; i < 20000; i++) { /* up to 10 s and more: loaded machines */
        ff_controller_poll(c, false);
        ff_controller_stats_get(c, &st);
        if (st.duplicates) break;
        usleep(500);
    }
    CHECK_EQ_INT(st.duplicates, 1);
    CHECK_EQ_INT(st.unknown_peer, 1);
    CHECK_EQ_INT(st.wire.rejected, nb);
    int per[FF_REJECT_COUNT] = {0};
    for (int i = 0; i < nb; i++) per[b[i].want]++;
    for (int r = 0; r < FF_REJECT_COUNT; r++) {
        if ((int)st.wire.by_reason[r] != per[r])
            fprintf(stderr, "reason %s: %llu rejected, %d expected\n", ff_reject_name(r),
                    (unsigned long long)st.wire.by_reason[r], per[r]);
        CHECK_EQ_INT(st.wire.by_reason[r], per[r]);
    }
    /* and it still serves */
    rt_counter k2 = {0};
    ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_ANY, .group = "all"};
    REQUIRE(ff_controller_submit(c, &s, rt_count, &k2) > 0);
    REQUIRE(ff_controller_run(c, 10) == 0);
    CHECK_EQ_INT(k2.ok, 1);
    ff_msg_free(&m);
    ff_msg_decoder_destroy(&d);
    zmq_close(raw);
    zmq_ctx_term(ctx);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);
}

static void test_worker(bad *b, int nb) {
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/ff-test-garbage-%d.sock", (int)getpid());
    REQUIRE(zmq_bind(router, ep) == 0);
    char maxf[32];
    snprintf(maxf, sizeof maxf, "%d", MAX_FRAME);
    char *argv[] = {rt_self, "worker", "--connect", ep, "--max-frame", maxf, "--log", "off", NULL};
    pid_t pid;
    REQUIRE(posix_spawn(&pid, rt_self, NULL, NULL, argv, environ) == 0);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m, out;
    ff_msg_init(&m);
    ff_msg_init(&out);
    recv_msg(NULL, d, router, true, &m);
    REQUIRE(m.type == FF_MSG_HELLO);
    uint8_t peer[256];
    size_t pl = m.peer_len;
    memcpy(peer, m.peer, pl);
    ff_msg_begin(&out, FF_MSG_WELCOME);
    out.u.welcome = (ff_msg_welcome){.rank = 5, .heartbeat_ms = 1000, .timeout_ms = 30000, .max_inflight = 8};
    REQUIRE(ff_msg_send(router, peer, pl, &out) == 0);
    for (int i = 0; i < nb; i++) {
        send_bad(router, peer, pl, &b[i]);
        recv_msg(NULL, d, router, true, &m);
        CHECK(m.type == FF_MSG_ERROR && m.u.error.code == FF_ERR_MALFORMED);
    }
    /* a message a worker has no use for */
    ff_msg_begin(&out, FF_MSG_HELLO);
    REQUIRE(ff_msg_send(router, peer, pl, &out) == 0);
    recv_msg(NULL, d, router, true, &m);
    CHECK(m.type == FF_MSG_ERROR && m.u.error.code == FF_ERR_UNEXPECTED);
    /* still serving: an echo comes back intact */
    ff_msg_begin(&out, FF_MSG_SUBTASK);
    out.u.subtask.id = 77;
    snprintf(out.u.subtask.kind, sizeof out.u.subtask.kind, "echo");
    float v[3] = {1.5f, -2, 3};
    REQUIRE(ff_msg_add_tensor(&out, "v", FF_DTYPE_F32, 1, (int64_t[]){3}, v, NULL, NULL));
    REQUIRE(ff_msg_send(router, peer, pl, &out) == 0);
    recv_msg(NULL, d, router, true, &m);
    CHECK(m.type == FF_MSG_RESULT && m.u.result.id == 77 && m.u.result.status == FF_STATUS_OK && m.ntensors == 1);
    if (m.ntensors == 1) CHECK(!memcmp(m.tensors[0].data, v, sizeof v));
    /* its heartbeat reports what it rejected */
    ff_msg_begin(&out, FF_MSG_HEARTBEAT);
    out.u.heartbeat.seq = 1;
    out.u.heartbeat.t0 = ff_now_ns();
    REQUIRE(ff_msg_send(router, peer, pl, &out) == 0);
    recv_msg(NULL, d, router, true, &m);
    CHECK(m.type == FF_MSG_HEARTBEAT && m.u.heartbeat.reply);
    CHECK_EQ_INT(m.u.heartbeat.errors, nb + 1);
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

/* A controller of another version answers the hello: the worker exits 1 at once (not after
 * its 30 s connect timeout) and says which versions met. */
static void test_worker_version(void) {
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    char ep[128], log[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/ff-test-garbage-v-%d.sock", (int)getpid());
    snprintf(log, sizeof log, "/tmp/ff-test-garbage-v-%d.log", (int)getpid());
    REQUIRE(zmq_bind(router, ep) == 0);
    char *argv[] = {rt_self, "worker", "--connect", ep, "--connect-timeout", "30", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int64_t t0 = ff_now_ns();
    REQUIRE(posix_spawn(&pid, rt_self, &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m;
    ff_msg_init(&m);
    recv_msg(NULL, d, router, true, &m);
    REQUIRE(m.type == FF_MSG_HELLO);
    size_t len;
    void *h = small_header(FF_PROTOCOL_VERSION + 1, FF_MSG_WELCOME, &len);
    REQUIRE(zmq_send(router, m.peer, m.peer_len, ZMQ_SNDMORE) >= 0);
    REQUIRE(zmq_send(router, h, len, 0) >= 0);
    free(h);
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    CHECK((ff_now_ns() - t0) / 1000000000 < 10);
    char *text = ff_read_file(log, NULL), want[128];
    snprintf(want, sizeof want, "the controller speaks another protocol: message: protocol version %d, this side speaks %d",
             FF_PROTOCOL_VERSION + 1, FF_PROTOCOL_VERSION);
    CHECK(text && strstr(text, want));
    if (text && !strstr(text, want)) fprintf(stderr, "worker said: %s\n", text);
    free(text);
    unlink(log);
    ff_msg_free(&m);
    ff_msg_decoder_destroy(&d);
    zmq_close(router);
    zmq_ctx_term(ctx);
    unlink(ep + strlen("ipc://"));
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    rt_opts(); /* sets rt_self */
    static bad b[16];
    int nb = make_bad(b);
    test_controller(b, nb);
    test_worker(b, nb);
    test_worker_version();
    free_bad(b, nb);
    TEST_MAIN_END();
}
