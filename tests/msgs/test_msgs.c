/* Tests of the wire: every message type round-trips through pack + decode and through real
 * ZeroMQ sockets; tensor frames travel without copies (pointers and free callbacks show it);
 * each class of bad input is rejected, counted under its reason, and leaks nothing. */
#include <msgpack.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/msgs.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static char hdr[FF_MSG_MAX_HEADER];

/* pack m, then decode header + its tensor frames into out */
static int roundtrip(ff_msg_decoder *d, const ff_msg *m, ff_msg *out) {
    long n = ff_msg_pack(m, hdr, sizeof hdr);
    REQUIRE(n > 0);
    ff_frame fr[FF_MSG_MAX_TENSORS + 1];
    fr[0].data = hdr;
    fr[0].len = (size_t)n;
    for (int i = 0; i < m->ntensors; i++) {
        fr[i + 1].data = m->tensors[i].data;
        fr[i + 1].len = m->tensors[i].nbytes;
    }
    return ff_msg_decode(d, out, fr, m->ntensors + 1, NULL);
}

#define CHECK_TEXT(got, want)                                                                      \
    do {                                                                                           \
        if (strcmp((got), (want))) {                                                               \
            fprintf(stderr, "%s:%d: got \"%s\", want \"%s\"\n", __FILE__, __LINE__, (got), (want)); \
            ff_test_failures++;                                                                    \
        }                                                                                          \
    } while (0)

static void test_roundtrip_all_types(void) {
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m, o;
    ff_msg_init(&m);
    ff_msg_init(&o);

    ff_msg_begin(&m, FF_MSG_HELLO);
    m.u.hello.rank = -1;
    m.u.hello.pid = 4242;
    snprintf(m.u.hello.host, sizeof m.u.hello.host, "node7");
    snprintf(m.u.hello.device, sizeof m.u.hello.device, "cuda:3");
    m.u.hello.ncaps = 2;
    snprintf(m.u.hello.caps[0], FF_MSG_NAME_MAX, "echo");
    snprintf(m.u.hello.caps[1], FF_MSG_NAME_MAX, "coll:cpu");
    m.u.hello.devices.cores = 16;
    m.u.hello.devices.cpus = 4;
    m.u.hello.devices.ngpus = 2;
    m.u.hello.devices.local_index = 5;
    snprintf(m.u.hello.devices.gpus[0], FF_MSG_NAME_MAX, "NVIDIA H200");
    snprintf(m.u.hello.devices.gpus[1], FF_MSG_NAME_MAX, "NVIDIA H100 80GB HBM3");
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.type == FF_MSG_HELLO);
    CHECK_EQ_INT(o.u.hello.rank, -1);
    CHECK_EQ_INT(o.u.hello.pid, 4242);
    CHECK(!strcmp(o.u.hello.host, "node7") && !strcmp(o.u.hello.device, "cuda:3"));
    CHECK_EQ_INT(o.u.hello.ncaps, 2);
    CHECK(!strcmp(o.u.hello.caps[1], "coll:cpu"));
    CHECK(o.u.hello.devices.cores == 16 && o.u.hello.devices.cpus == 4 && o.u.hello.devices.ngpus == 2);
    CHECK_EQ_INT(o.u.hello.devices.local_index, 5);
    CHECK(!strcmp(o.u.hello.devices.gpus[1], "NVIDIA H100 80GB HBM3"));
    char text[256];
    ff_devices_describe(&o.u.hello.devices, text, sizeof text);
    CHECK_TEXT(text, "4 of 16 cores, 2 GPUs: NVIDIA H200, NVIDIA H100 80GB HBM3");
    snprintf(o.u.hello.devices.gpus[1], FF_MSG_NAME_MAX, "NVIDIA H200");
    o.u.hello.devices.cpus = 16;
    ff_devices_describe(&o.u.hello.devices, text, sizeof text);
    CHECK_TEXT(text, "16 cores, 2 GPUs: 2 x NVIDIA H200");
    o.u.hello.devices = (ff_devices){.cores = 1, .cpus = 1};
    ff_devices_describe(&o.u.hello.devices, text, sizeof text);
    CHECK_TEXT(text, "1 core, no GPU");
    m.u.hello.devices.ngpus = FF_MSG_MAX_GPUS + 1; /* more than the wire takes: refused when packed */
    CHECK(ff_msg_pack(&m, text, sizeof text) < 0);
    m.u.hello.devices.ngpus = 0;

    ff_msg_begin(&m, FF_MSG_WELCOME);
    m.u.welcome = (ff_msg_welcome){.rank = 3, .heartbeat_ms = 50, .timeout_ms = 400, .max_inflight = 64};
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.type == FF_MSG_WELCOME && o.u.welcome.rank == 3 && o.u.welcome.heartbeat_ms == 50 &&
          o.u.welcome.timeout_ms == 400 && o.u.welcome.max_inflight == 64);

    ff_msg_begin(&m, FF_MSG_HEARTBEAT);
    m.u.heartbeat = (ff_msg_heartbeat){.seq = 9, .reply = true, .t0 = -5, .t1 = INT64_MAX, .t2 = 77, .busy = 3,
                                       .errors = 12};
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.u.heartbeat.seq == 9 && o.u.heartbeat.reply && o.u.heartbeat.t0 == -5 &&
          o.u.heartbeat.t1 == INT64_MAX && o.u.heartbeat.t2 == 77 && o.u.heartbeat.busy == 3 &&
          o.u.heartbeat.errors == 12);

    ff_msg_begin(&m, FF_MSG_SUBTASK);
    m.u.subtask.id = 1ULL << 40;
    snprintf(m.u.subtask.kind, sizeof m.u.subtask.kind, "axpy");
    snprintf(m.u.subtask.group, sizeof m.u.subtask.group, "actor");
    m.u.subtask.args[0] = ff_arg_float("alpha", 2.5);
    m.u.subtask.args[1] = ff_arg_int("n", -7);
    m.u.subtask.args[2] = ff_arg_str("mode", "fast");
    m.u.subtask.args[3] = ff_arg_bool("flag", true);
    m.u.subtask.nargs = 4;
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t shp[2] = {2, 3};
    REQUIRE(ff_msg_add_tensor(&m, "x", FF_DTYPE_F32, 2, shp, x, NULL, NULL));
    int64_t ids[3] = {10, 20, 30};
    int64_t s1 = 3;
    REQUIRE(ff_msg_add_tensor(&m, "ids", FF_DTYPE_I64, 1, &s1, ids, NULL, NULL));
    REQUIRE(ff_msg_add_tensor(&m, "empty", FF_DTYPE_BF16, 1, (int64_t[]){0}, NULL, NULL, NULL));
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.type == FF_MSG_SUBTASK && o.u.subtask.id == 1ULL << 40);
    CHECK(!strcmp(o.u.subtask.kind, "axpy") && !strcmp(o.u.subtask.group, "actor"));
    double alpha;
    int64_t nn;
    const char *sp;
    size_t sl;
    CHECK(ff_msg_arg_float(&o.u.subtask, "alpha", &alpha) == 0 && alpha == 2.5);
    CHECK(ff_msg_arg_int(&o.u.subtask, "n", &nn) == 0 && nn == -7);
    CHECK(ff_msg_arg_float(&o.u.subtask, "n", &alpha) == 0 && alpha == -7.0); /* ints convert */
    CHECK(ff_msg_arg_str(&o.u.subtask, "mode", &sp, &sl) == 0 && sl == 4 && !memcmp(sp, "fast", 4));
    CHECK(ff_msg_arg_int(&o.u.subtask, "flag", &nn) == 0 && nn == 1);
    CHECK(ff_msg_arg_int(&o.u.subtask, "missing", &nn) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "missing argument 'missing'");
    CHECK(ff_msg_arg_int(&o.u.subtask, "mode", &nn) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "'mode' is a string");
    REQUIRE(o.ntensors == 3);
    CHECK(!strcmp(o.tensors[0].name, "x") && o.tensors[0].dtype == FF_DTYPE_F32 && o.tensors[0].ndim == 2 &&
          o.tensors[0].shape[0] == 2 && o.tensors[0].shape[1] == 3 && o.tensors[0].nbytes == 24);
    CHECK(!memcmp(o.tensors[0].data, x, sizeof x));
    CHECK(((int64_t *)o.tensors[1].data)[2] == 30);
    CHECK(o.tensors[2].nbytes == 0 && ff_tensor_numel(&o.tensors[2]) == 0);

    ff_msg_begin(&m, FF_MSG_RESULT);
    m.u.result.id = 5;
    m.u.result.status = FF_STATUS_FAILED;
    snprintf(m.u.result.error, sizeof m.u.result.error, "axpy: bad");
    m.u.result.start_ns = 100;
    m.u.result.end_ns = 250;
    m.u.result.queued = 2;
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.u.result.id == 5 && o.u.result.status == FF_STATUS_FAILED && !strcmp(o.u.result.error, "axpy: bad") &&
          o.u.result.start_ns == 100 && o.u.result.end_ns == 250 && o.u.result.queued == 2 && o.ntensors == 0);

    ff_msg_begin(&m, FF_MSG_ERROR);
    m.u.error.code = FF_ERR_MALFORMED;
    m.u.error.ref = 77;
    snprintf(m.u.error.text, sizeof m.u.error.text, "nope");
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.u.error.code == FF_ERR_MALFORMED && o.u.error.ref == 77 && !strcmp(o.u.error.text, "nope"));

    ff_msg_begin(&m, FF_MSG_CANCEL);
    m.u.cancel.id = 99;
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.type == FF_MSG_CANCEL && o.u.cancel.id == 99);

    ff_msg_begin(&m, FF_MSG_SHUTDOWN);
    snprintf(m.u.shutdown.reason, sizeof m.u.shutdown.reason, "done");
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.type == FF_MSG_SHUTDOWN && !strcmp(o.u.shutdown.reason, "done"));

    ff_msg_begin(&m, FF_MSG_GROUP_SETUP);
    m.u.group.id = 3;
    snprintf(m.u.group.name, sizeof m.u.group.name, "actor");
    m.u.group.index = 1;
    REQUIRE(ff_msg_set_members(&m, (int32_t[]){4, 2, 9}, 3) == 0);
    snprintf(m.u.group.backend, sizeof m.u.group.backend, "nccl");
    m.u.group.unique_id_len = 128;
    for (int i = 0; i < 128; i++) m.u.group.unique_id[i] = (uint8_t)(i * 7);
    m.u.group.timeout_ms = 7000;
    REQUIRE(roundtrip(d, &m, &o) == 0);
    CHECK(o.type == FF_MSG_GROUP_SETUP && o.u.group.id == 3 && !strcmp(o.u.group.name, "actor") &&
          o.u.group.index == 1 && o.u.group.nmembers == 3 && o.u.group.members[2] == 9 &&
          !strcmp(o.u.group.backend, "nccl") && o.u.group.unique_id_len == 128 && o.u.group.unique_id[5] == 35 &&
          o.u.group.timeout_ms == 7000);

    const ff_msg_stats *st = ff_msg_decoder_stats(d);
    CHECK_EQ_INT(st->received, 9);
    CHECK_EQ_INT(st->rejected, 0);
    ff_msg_free(&m);
    ff_msg_free(&o);
    ff_msg_decoder_destroy(&d);
    CHECK(d == NULL);
}

/* Build a raw header with msgpack directly, to produce what our packer never would. */
typedef struct raw {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} raw;

static void raw_begin(raw *r) {
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static int decode_raw(ff_msg_decoder *d, ff_msg *o, const void *h, size_t n, const ff_frame *tensors, int nt,
                      ff_reject *why) {
    ff_frame fr[8];
    fr[0].data = h;
    fr[0].len = n;
    for (int i = 0; i < nt; i++) fr[i + 1] = tensors[i];
    return ff_msg_decode(d, o, fr, nt + 1, why);
}

static void expect_reject(ff_msg_decoder *d, ff_msg *o, const void *h, size_t n, const ff_frame *t, int nt,
                          ff_reject want, const char *text, int line) {
    ff_reject why = FF_REJECT_COUNT;
    uint64_t before = ff_msg_decoder_stats(d)->by_reason[want];
    int rc = decode_raw(d, o, h, n, t, nt, &why);
    if (rc != -1 || why != want) {
        fprintf(stderr, "line %d: rc %d reason %s (wanted %s): %s\n", line, rc, ff_reject_name(why),
                ff_reject_name(want), ff_error_message());
        ff_test_failures++;
        return;
    }
    CHECK_EQ_INT(ff_msg_decoder_stats(d)->by_reason[want], before + 1);
    if (text) CHECK_STR_CONTAINS(ff_error_message(), text);
    CHECK(o->ntensors == 0);
}
#define EXPECT_REJECT(h, n, t, nt, want, text) expect_reject(d, &o, h, n, t, nt, want, text, __LINE__)

static void test_rejections(void) {
    ff_msg_decoder *d = ff_msg_decoder_new(1024);
    ff_msg m, o;
    ff_msg_init(&m);
    ff_msg_init(&o);

    EXPECT_REJECT("", 0, NULL, 0, FF_REJECT_TRUNCATED, "empty header");
    EXPECT_REJECT("\xc1\x00\x01", 3, NULL, 0, FF_REJECT_MALFORMED, "0xc1");
    /* an array claiming 4 billion items, 5 bytes long: must not allocate */
    EXPECT_REJECT("\xdd\xff\xff\xff\xff", 5, NULL, 0, FF_REJECT_TRUNCATED, "ends early");
    EXPECT_REJECT("\xdf\xff\xff\xff\xff\x01", 6, NULL, 0, FF_REJECT_TRUNCATED, NULL);
    EXPECT_REJECT("\xdb\xff\xff\xff\xff", 5, NULL, 0, FF_REJECT_TRUNCATED, NULL);
    /* deep nesting */
    char deep[64];
    memset(deep, 0x91, sizeof deep);
    deep[63] = 0x01;
    EXPECT_REJECT(deep, sizeof deep, NULL, 0, FF_REJECT_MALFORMED, "nested deeper");
    /* not an array, trailing bytes, extension type */
    EXPECT_REJECT("\x01", 1, NULL, 0, FF_REJECT_MALFORMED, "not an array");
    EXPECT_REJECT("\x92\x01\x08\x00", 4, NULL, 0, FF_REJECT_MALFORMED, "trailing");
    EXPECT_REJECT("\xd4\x01\x01", 3, NULL, 0, FF_REJECT_MALFORMED, NULL);

    raw r;
    /* wrong version, unknown type, wrong field count, wrong field type */
    raw_begin(&r);
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_int(&r.pk, 99);
    msgpack_pack_int(&r.pk, FF_MSG_CANCEL);
    msgpack_pack_int(&r.pk, 1);
    EXPECT_REJECT(r.sb.data, r.sb.size, NULL, 0, FF_REJECT_VERSION, "protocol version 99");
    msgpack_sbuffer_destroy(&r.sb);

    raw_begin(&r);
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_int(&r.pk, FF_PROTOCOL_VERSION);
    msgpack_pack_int(&r.pk, 42);
    msgpack_pack_int(&r.pk, 1);
    EXPECT_REJECT(r.sb.data, r.sb.size, NULL, 0, FF_REJECT_UNKNOWN_TYPE, "unknown message type 42");
    msgpack_sbuffer_destroy(&r.sb);

    raw_begin(&r);
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_int(&r.pk, FF_PROTOCOL_VERSION);
    msgpack_pack_int(&r.pk, FF_MSG_CANCEL);
    msgpack_pack_int(&r.pk, 1);
    msgpack_pack_int(&r.pk, 1);
    EXPECT_REJECT(r.sb.data, r.sb.size, NULL, 0, FF_REJECT_MALFORMED, "4 header fields, expected 3");
    msgpack_sbuffer_destroy(&r.sb);

    raw_begin(&r);
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_int(&r.pk, FF_PROTOCOL_VERSION);
    msgpack_pack_int(&r.pk, FF_MSG_CANCEL);
    msgpack_pack_int(&r.pk, -1);
    EXPECT_REJECT(r.sb.data, r.sb.size, NULL, 0, FF_REJECT_MALFORMED, "'id' is not a non-negative integer");
    msgpack_sbuffer_destroy(&r.sb);

    /* a string with a NUL inside, and an oversized string */
    raw_begin(&r);
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_int(&r.pk, FF_PROTOCOL_VERSION);
    msgpack_pack_int(&r.pk, FF_MSG_SHUTDOWN);
    msgpack_pack_str(&r.pk, 3);
    msgpack_pack_str_body(&r.pk, "a\0b", 3);
    EXPECT_REJECT(r.sb.data, r.sb.size, NULL, 0, FF_REJECT_MALFORMED, "NUL byte");
    msgpack_sbuffer_destroy(&r.sb);
    raw_begin(&r);
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_int(&r.pk, FF_PROTOCOL_VERSION);
    msgpack_pack_int(&r.pk, FF_MSG_SHUTDOWN);
    char big[FF_MSG_TEXT_MAX + 4];
    memset(big, 'x', sizeof big);
    msgpack_pack_str(&r.pk, sizeof big);
    msgpack_pack_str_body(&r.pk, big, sizeof big);
    EXPECT_REJECT(r.sb.data, r.sb.size, NULL, 0, FF_REJECT_OVERSIZED, "'reason' has 4100 bytes (at most 4095)");
    msgpack_sbuffer_destroy(&r.sb);

    /* an oversized header */
    char *huge = calloc(1, FF_MSG_MAX_HEADER + 10);
    huge[0] = (char)0x92;
    EXPECT_REJECT(huge, FF_MSG_MAX_HEADER + 10, NULL, 0, FF_REJECT_OVERSIZED, "header of");
    free(huge);

    /* tensors: frames that disagree with the header */
    ff_msg_begin(&m, FF_MSG_SUBTASK);
    m.u.subtask.id = 1;
    snprintf(m.u.subtask.kind, sizeof m.u.subtask.kind, "echo");
    float x[4] = {1, 2, 3, 4};
    int64_t s4 = 4;
    REQUIRE(ff_msg_add_tensor(&m, "x", FF_DTYPE_F32, 1, &s4, x, NULL, NULL));
    long n = ff_msg_pack(&m, hdr, sizeof hdr);
    REQUIRE(n > 0);
    ff_frame good = {x, sizeof x}, short_f = {x, 12}, extra[2] = {{x, 16}, {x, 4}};
    ff_frame over = {calloc(1, 2048), 2048};
    CHECK(decode_raw(d, &o, hdr, (size_t)n, &good, 1, NULL) == 0);
    EXPECT_REJECT(hdr, (size_t)n, &short_f, 1, FF_REJECT_FRAMES, "needs 16 bytes but its frame has 12");
    EXPECT_REJECT(hdr, (size_t)n, extra, 2, FF_REJECT_FRAMES, "describes 1 tensors but 2");
    EXPECT_REJECT(hdr, (size_t)n, NULL, 0, FF_REJECT_FRAMES, "describes 1 tensors but 0");
    EXPECT_REJECT(hdr, (size_t)n, &over, 1, FF_REJECT_OVERSIZED, "limit 1024");
    CHECK(o.rejected_type == FF_MSG_SUBTASK && o.rejected_id == 1); /* so the sender can be told which */
    m.u.subtask.id = 1ULL << 40;                                     /* a wider id */
    long n40 = ff_msg_pack(&m, hdr, sizeof hdr);
    EXPECT_REJECT(hdr, (size_t)n40, &over, 1, FF_REJECT_OVERSIZED, "limit 1024");
    CHECK(o.rejected_type == FF_MSG_SUBTASK && o.rejected_id == 1ULL << 40);
    m.u.subtask.id = 1;
    n = ff_msg_pack(&m, hdr, sizeof hdr);
    free((void *)over.data);
    /* every proper prefix of a valid header is rejected without a crash (and names the id
     * once the prefix holds it) */
    for (long cut = 1; cut < n; cut++) {
        ff_reject why;
        CHECK(decode_raw(d, &o, hdr, (size_t)cut, &good, 1, &why) == -1);
        CHECK(o.rejected_id == 0 || (o.rejected_id == 1 && cut >= 4));
    }
    EXPECT_REJECT("garbage!", 8, NULL, 0, FF_REJECT_MALFORMED, NULL);
    CHECK(o.rejected_type == 0 && o.rejected_id == 0);
    /* frames after a message type that carries none */
    ff_msg_begin(&m, FF_MSG_CANCEL);
    m.u.cancel.id = 1;
    n = ff_msg_pack(&m, hdr, sizeof hdr);
    EXPECT_REJECT(hdr, (size_t)n, &good, 1, FF_REJECT_FRAMES, "carries none");
    /* too many frames */
    ff_frame many[FF_MSG_MAX_TENSORS + 2];
    for (int i = 0; i < FF_MSG_MAX_TENSORS + 2; i++) many[i] = good;
    many[0].data = hdr;
    many[0].len = (size_t)n;
    ff_reject why;
    CHECK(ff_msg_decode(d, &o, many, FF_MSG_MAX_TENSORS + 2, &why) == -1 && why == FF_REJECT_OVERSIZED);
    /* a group setup whose index is outside its members */
    ff_msg_begin(&m, FF_MSG_GROUP_SETUP);
    snprintf(m.u.group.name, sizeof m.u.group.name, "g");
    snprintf(m.u.group.backend, sizeof m.u.group.backend, "cpu");
    ff_msg_set_members(&m, (int32_t[]){0, 1}, 2);
    m.u.group.index = 2;
    n = ff_msg_pack(&m, hdr, sizeof hdr);
    EXPECT_REJECT(hdr, (size_t)n, NULL, 0, FF_REJECT_MALFORMED, "index 2 outside 2 members");

    /* the decoder still works after all that */
    ff_msg_begin(&m, FF_MSG_CANCEL);
    m.u.cancel.id = 8;
    CHECK(roundtrip(d, &m, &o) == 0 && o.u.cancel.id == 8);
    const ff_msg_stats *st = ff_msg_decoder_stats(d);
    CHECK(st->rejected >= 20);
    CHECK_EQ_INT(st->received - st->rejected, 2);

    /* packing refuses what decoding would refuse */
    ff_msg_begin(&m, FF_MSG_SUBTASK);
    memset(m.u.subtask.kind, 'k', sizeof m.u.subtask.kind); /* unterminated */
    CHECK(ff_msg_pack(&m, hdr, sizeof hdr) == -1);
    ff_msg_begin(&m, FF_MSG_SUBTASK);
    snprintf(m.u.subtask.kind, sizeof m.u.subtask.kind, "k");
    m.u.subtask.args[0] = ff_arg_int("a", 1);
    m.u.subtask.args[1] = ff_arg_int("a", 2);
    m.u.subtask.nargs = 2;
    CHECK(ff_msg_pack(&m, hdr, sizeof hdr) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "given twice");
    CHECK(ff_msg_pack(&m, hdr, 4) == -1);

    ff_msg_free(&m);
    ff_msg_free(&o);
    ff_msg_decoder_destroy(&d);
}

static atomic_int freed;
static void count_free(void *data, void *hint) {
    (void)hint;
    free(data);
    atomic_fetch_add(&freed, 1);
}

/* Over real sockets (inproc keeps pointers, so zero copy is visible): a ROUTER and a
 * DEALER exchange a subtask whose tensor is handed over with a free function. */
static void test_sockets_zero_copy(void) {
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER), *dealer = zmq_socket(ctx, ZMQ_DEALER);
    REQUIRE(zmq_bind(router, "inproc://wire") == 0);
    REQUIRE(zmq_setsockopt(dealer, ZMQ_ROUTING_ID, "w1", 2) == 0);
    REQUIRE(zmq_connect(dealer, "inproc://wire") == 0);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m, o;
    ff_msg_init(&m);
    ff_msg_init(&o);
    atomic_store(&freed, 0);

    /* dealer -> router: a hello; the router learns the routing id */
    ff_msg_begin(&m, FF_MSG_HELLO);
    m.u.hello.rank = 2;
    REQUIRE(ff_msg_send(dealer, NULL, 0, &m) == 0);
    int rc;
    while ((rc = ff_msg_recv(d, router, true, &o, NULL)) == 0) zmq_poll(NULL, 0, 1);
    REQUIRE(rc == 1);
    CHECK(o.type == FF_MSG_HELLO && o.peer_len == 2 && !memcmp(o.peer, "w1", 2) && o.u.hello.rank == 2);

    /* router -> dealer: a subtask with a 1 MiB tensor handed over without a copy */
    size_t nf = 1 << 18;
    float *big = malloc(nf * sizeof *big);
    for (size_t i = 0; i < nf; i++) big[i] = (float)i;
    ff_msg_begin(&m, FF_MSG_SUBTASK);
    m.u.subtask.id = 17;
    snprintf(m.u.subtask.kind, sizeof m.u.subtask.kind, "sum");
    int64_t shape = (int64_t)nf;
    REQUIRE(ff_msg_add_tensor(&m, "x", FF_DTYPE_F32, 1, &shape, big, count_free, NULL));
    CHECK(m.tensors[0].data == big);
    REQUIRE(ff_msg_send(router, o.peer, o.peer_len, &m) == 0);
    /* sent twice: the frame is shared, not consumed */
    REQUIRE(ff_msg_send(router, o.peer, o.peer_len, &m) == 0);
    ff_msg_reset(&m);
    ff_msg o2;
    ff_msg_init(&o2);
    while ((rc = ff_msg_recv(d, dealer, false, &o2, NULL)) == 0) zmq_poll(NULL, 0, 1);
    REQUIRE(rc == 1);
    CHECK(o2.u.subtask.id == 17 && o2.ntensors == 1);
    CHECK(o2.tensors[0].data == big); /* inproc delivered the very same bytes */
    CHECK(((float *)o2.tensors[0].data)[12345] == 12345.0f);
    ff_msg o3;
    ff_msg_init(&o3);
    while ((rc = ff_msg_recv(d, dealer, false, &o3, NULL)) == 0) zmq_poll(NULL, 0, 1);
    REQUIRE(rc == 1);
    CHECK(o3.tensors[0].data == big);
    CHECK_EQ_INT(atomic_load(&freed), 0);
    /* forward the received tensor into a result (a reference, still no copy) */
    ff_msg_begin(&m, FF_MSG_RESULT);
    m.u.result.id = 17;
    REQUIRE(ff_msg_add_tensor_ref(&m, &o2, 0, "y"));
    CHECK(m.tensors[0].data == big && !strcmp(m.tensors[0].name, "y"));
    REQUIRE(ff_msg_send(dealer, NULL, 0, &m) == 0);
    /* keep one received tensor beyond its message: still the same bytes, no copy */
    ff_tensor_ref *kept = ff_tensor_ref_new(&o3, 0);
    REQUIRE(kept);
    CHECK(kept->t.data == big && kept->t.nbytes == nf * sizeof(float) && !strcmp(kept->t.name, "x"));
    ff_msg_free(&o2);
    ff_msg_free(&o3);
    ff_msg_reset(&m);
    while ((rc = ff_msg_recv(d, router, true, &o, NULL)) == 0) zmq_poll(NULL, 0, 1);
    REQUIRE(rc == 1);
    CHECK(o.type == FF_MSG_RESULT && o.tensors[0].data == big);
    CHECK_EQ_INT(atomic_load(&freed), 0);
    ff_msg_reset(&o);
    CHECK_EQ_INT(atomic_load(&freed), 0); /* `kept` still holds it */
    CHECK(((float *)kept->t.data)[777] == 777.0f);
    ff_tensor_ref_free(&kept);
    CHECK(kept == NULL);
    CHECK_EQ_INT(atomic_load(&freed), 1); /* the last reference is gone: freed exactly once */

    /* a frame delivered at an odd address is realigned, not read misaligned */
    char *odd = malloc(4 * sizeof(float) + 1);
    float v[4] = {1.5f, 2.5f, 3.5f, 4.5f};
    memcpy(odd + 1, v, sizeof v);
    ff_msg_begin(&m, FF_MSG_RESULT);
    m.u.result.id = 18;
    int64_t s4 = 4;
    /* hand the odd pointer over; free the real allocation */
    REQUIRE(ff_msg_add_tensor(&m, "v", FF_DTYPE_F32, 1, &s4, odd + 1, NULL, NULL));
    zmq_msg_close(&m.frames[0]);
    REQUIRE(zmq_msg_init_data(&m.frames[0], odd + 1, sizeof v, NULL, NULL) == 0);
    REQUIRE(ff_msg_send(dealer, NULL, 0, &m) == 0);
    ff_msg_reset(&m);
    while ((rc = ff_msg_recv(d, router, true, &o, NULL)) == 0) zmq_poll(NULL, 0, 1);
    REQUIRE(rc == 1);
    CHECK(((uintptr_t)o.tensors[0].data & 3) == 0);
    CHECK(((float *)o.tensors[0].data)[3] == 4.5f);
    CHECK(ff_msg_decoder_stats(d)->realigned == 1);
    ff_msg_reset(&o);
    free(odd);

    /* garbage over the socket: counted, then the next good message still arrives */
    zmq_send(dealer, "\xdd\xff\xff\xff\xff", 5, 0);
    zmq_send(dealer, "junk", 4, ZMQ_SNDMORE);
    zmq_send(dealer, "more", 4, 0);
    ff_msg_begin(&m, FF_MSG_CANCEL);
    m.u.cancel.id = 5;
    ff_msg_send(dealer, NULL, 0, &m);
    int got = 0, bad = 0;
    for (int tries = 0; got == 0 && tries < 2000;) {
        ff_reject why;
        rc = ff_msg_recv(d, router, true, &o, &why);
        if (rc == 0) {
            zmq_poll(NULL, 0, 1);
            tries++;
        } else if (rc == -1) {
            bad++;
            CHECK(o.peer_len == 2); /* the sender is known, so an error reply is possible */
        } else if (rc == 1) {
            got = 1;
            CHECK(o.type == FF_MSG_CANCEL && o.u.cancel.id == 5);
        }
    }
    CHECK_EQ_INT(bad, 2);
    CHECK_EQ_INT(got, 1);

    /* shared buffers: rows of one batch in several frames, freed once at the end */
    float *batch = malloc(6 * sizeof *batch);
    for (int i = 0; i < 6; i++) batch[i] = (float)i;
    atomic_store(&freed, 0);
    ff_shared_buf *sb = ff_shared_buf_new(batch, count_free, NULL);
    ff_msg a, b;
    ff_msg_init(&a);
    ff_msg_init(&b);
    ff_msg_begin(&a, FF_MSG_SUBTASK);
    ff_msg_begin(&b, FF_MSG_SUBTASK);
    REQUIRE(ff_msg_add_tensor_shared(&a, "x", FF_DTYPE_F32, 1, (int64_t[]){3}, sb, 0));
    REQUIRE(ff_msg_add_tensor_shared(&b, "x", FF_DTYPE_F32, 1, (int64_t[]){3}, sb, 3 * sizeof(float)));
    CHECK(((float *)b.tensors[0].data)[0] == 3.0f);
    ff_shared_buf_release(sb);
    ff_msg_free(&a);
    CHECK_EQ_INT(atomic_load(&freed), 0);
    ff_msg_free(&b);
    CHECK_EQ_INT(atomic_load(&freed), 1);

    ff_msg_free(&m);
    ff_msg_free(&o);
    ff_msg_decoder_destroy(&d);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(router);
    zmq_close(dealer);
    zmq_ctx_term(ctx);
}

/* Error texts up to FF_MSG_TEXT_MAX - 1 bytes travel whole; longer ones are cut in the
 * middle, so the file named first and the problem told last both arrive. */
static void test_long_texts(void) {
    static char path[3000], text[8000];
    memset(path, 'd', sizeof path);
    for (size_t i = 0; i + 1 < sizeof path; i += 50) path[i] = '/';
    path[sizeof path - 1] = 0;
    snprintf(text, sizeof text, "%s/model.safetensors: tensor 'w' ends at byte 9 (hint: the file is damaged)", path);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m, o;
    ff_msg_init(&m);
    ff_msg_init(&o);
    ff_msg_begin(&m, FF_MSG_RESULT);
    m.u.result.id = 5;
    m.u.result.status = FF_STATUS_FAILED;
    ff_text_fit(m.u.result.error, sizeof m.u.result.error, text); /* 3 KB: fits */
    CHECK(roundtrip(d, &m, &o) == 0 && !strcmp(o.u.result.error, text));
    /* twice as long: the middle goes */
    char twice[16000];
    snprintf(twice, sizeof twice, "%s%s", path, text);
    ff_text_fit(m.u.result.error, sizeof m.u.result.error, twice);
    CHECK_EQ_INT(strlen(m.u.result.error), FF_MSG_TEXT_MAX - 1);
    CHECK(roundtrip(d, &m, &o) == 0);
    CHECK(!strncmp(o.u.result.error, "/ddd", 4));
    CHECK_STR_CONTAINS(o.u.result.error, "...");
    CHECK_STR_CONTAINS(o.u.result.error, "/model.safetensors: tensor 'w' ends at byte 9 (hint: the file is damaged)");
    /* in place, and tiny buffers */
    char small[16];
    ff_text_fit(small, sizeof small, "0123456789abcdefghij");
    CHECK(!strcmp(small, "012345...efghij"));
    ff_text_fit(small, sizeof small, "short");
    CHECK(!strcmp(small, "short"));
    char tiny[4];
    ff_text_fit(tiny, sizeof tiny, "abcdef");
    CHECK(!strcmp(tiny, "abc"));
    char inplace[32] = "0123456789abcdefghijklmnopqrstu";
    ff_text_fit(inplace, 12, inplace);
    CHECK(!strcmp(inplace, "0123...rstu"));
    /* ff_msg_send_error packs 4 KB texts (it used a 512-byte buffer and sent nothing) */
    void *ctx = zmq_ctx_new();
    void *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    REQUIRE(zmq_bind(a, "inproc://texts") == 0 && zmq_connect(b, "inproc://texts") == 0);
    ff_msg_send_error(a, NULL, 0, FF_ERR_MALFORMED, 77, twice);
    int rc = 0;
    for (int i = 0; i < 1000 && (rc = ff_msg_recv(d, b, false, &o, NULL)) == 0; i++) zmq_poll(NULL, 0, 1);
    CHECK(rc == 1 && o.type == FF_MSG_ERROR && o.u.error.ref == 77);
    CHECK_STR_CONTAINS(o.u.error.text, "(hint: the file is damaged)");
    int zero = 0;
    zmq_setsockopt(a, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(b, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
    /* the thread's error message (8 KiB) keeps the end of a message too long for it */
    ff_error_set(twice, "resume from step-1", "%s", twice);
    CHECK(!strncmp(ff_error_message(), "/ddd", 4));
    CHECK_STR_CONTAINS(ff_error_message(), "(hint: resume from step-1)");
    ff_msg_free(&m);
    ff_msg_free(&o);
    ff_msg_decoder_destroy(&d);
}

int main(void) {
    test_long_texts();
    test_roundtrip_all_types();
    test_rejections();
    test_sockets_zero_copy();
    TEST_MAIN_END();
}
