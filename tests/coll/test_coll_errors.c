/* Failure paths of the cpu backend: a peer killed before or in the middle of collectives
 * (every other rank's call fails promptly, naming it, without waiting for the timeout), a
 * hung peer (the timeout, naming whom we wait for), mismatched calls (count, dtype, op,
 * send/recv count), a peer that destroyed its communicator, an explicit abort, and calls on
 * a broken communicator. Every rank must come back with an error; none may hang (the
 * harness's watchdog fails the test if one does). */
#include "coll_test.h"

#include <pthread.h>

#define N_BIG (1u << 20)

/* each rank's error message, for the parent to read */
static char *msg_slot(int rank) { return (char *)g_shared + 4096 + (size_t)rank * 1024; }
static void save_msg(int rank, const char *m) { snprintf(msg_slot(rank), 1024, "%s", m); }

/* ---- a rank killed before the call: the others are in an all-reduce waiting for it ---- */
static int killed_before(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)n;
    int fails = 0, algo = *(int *)arg, checks_before = ff_test_failures; /* inherited from the parent */
    (void)algo;
    float *buf = calloc(N_BIG, 4);
    int rc = ff_coll_all_reduce(buf, buf, N_BIG, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
    if (rank == 2) kill(getpid(), SIGKILL);
    /* The warm-up may already fail where rank 2's last bytes were still in flight when it
     * died (its socket resets): either way the first failed call names it. */
    if (rc == 0) {
        int64_t t0 = ff_now_ns();
        rc = ff_coll_all_reduce(buf, buf, N_BIG, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
        RCHECK(rc != 0, "all_reduce succeeded without rank 2");
        char m[1024];
        snprintf(m, sizeof m, "[failed after %.1f ms] %s", (ff_now_ns() - t0) / 1e6, ff_error_message());
        save_msg(rank, m);
    } else {
        save_msg(rank, ff_error_message());
    }
    /* the communicator is broken now: the next call fails at once */
    RCHECK(ff_coll_all_reduce(buf, buf, 4, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) != 0, "broken comm worked");
    CHECK_STR_CONTAINS(ff_error_message(), "broken by an earlier error");
    RCHECK(ff_coll_comm_error(c) != NULL, "comm_error is NULL");
    free(buf);
    return fails + (ff_test_failures - checks_before);
}

/* ---- a rank killed in the middle of a stream of large all-reduces -------------------- */
static void *killer(void *arg) {
    int ms = *(int *)arg;
    struct timespec ts = {0, (long)ms * 1000000};
    nanosleep(&ts, NULL);
    kill(getpid(), SIGKILL);
    return NULL;
}

static int killed_during(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)n;
    (void)arg;
    int fails = 0;
    float *buf = calloc(N_BIG, 4);
    if (rank == 1) {
        static int ms = 40;
        pthread_t th;
        pthread_create(&th, NULL, killer, &ms);
    }
    int rc = 0, i;
    for (i = 0; i < 100000 && rc == 0; i++) rc = ff_coll_all_reduce(buf, buf, N_BIG, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
    RCHECK(rc != 0, "100000 all_reduces succeeded although rank 1 was killed");
    save_msg(rank, ff_error_message());
    free(buf);
    return fails;
}

/* ---- a rank that stays alive but never calls ----------------------------------------- */
static int hung(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)n;
    (void)arg;
    int fails = 0;
    float v[64] = {0};
    if (rank == 1) {
        struct timespec ts = {1, 500000000}; /* longer than the 0.5 s timeout */
        nanosleep(&ts, NULL);
        return 0;
    }
    RCHECK(ff_coll_all_reduce(v, v, 64, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) != 0, "all_reduce without rank 1");
    save_msg(rank, ff_error_message());
    return fails;
}

/* ---- mismatched calls ------------------------------------------------------------------ */
enum { MM_COUNT, MM_DTYPE, MM_OP, MM_P2P, MM_ROOT };

static int mismatch(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)n;
    int fails = 0, kind = *(int *)arg;
    float v[5000] = {0};
    int rc = 0;
    switch (kind) {
    case MM_COUNT:
        rc = ff_coll_all_reduce(v, v, rank == 1 ? 999 : 1000, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
        break;
    case MM_DTYPE:
        rc = ff_coll_all_reduce(v, v, 1000, rank == 1 ? FF_DTYPE_I32 : FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
        break;
    case MM_OP:
        if (rank == 0) { /* a broadcast root only sends: it learns at its next call */
            rc = ff_coll_broadcast(v, v, 1000, FF_DTYPE_F32, 0, c, NULL);
            if (rc == 0) rc = ff_coll_all_reduce(v, v, 1000, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
        } else {
            rc = ff_coll_all_reduce(v, v, 1000, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
        }
        break;
    case MM_P2P:
        if (rank == 0) rc = ff_coll_send(v, 10, FF_DTYPE_F32, 1, c, NULL);
        if (rank == 1) rc = ff_coll_recv(v, 20, FF_DTYPE_F32, 0, c, NULL);
        if (rank == 0) { /* the sender learns on its next call with rank 1 */
            RCHECK(rc == 0, "send: %s", ff_error_message());
            rc = ff_coll_recv(v, 1, FF_DTYPE_F32, 1, c, NULL);
        }
        break;
    }
    if (kind == MM_P2P && rank > 1) return 0;
    RCHECK(rc != 0, "mismatched call %d succeeded", kind);
    save_msg(rank, ff_error_message());
    return fails;
}

/* ---- a peer that destroys its communicator while another waits for it --------------- */
static int left(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)n;
    (void)arg;
    int fails = 0;
    if (rank == 1) return 0; /* the harness destroys it */
    float v = 0;
    RCHECK(ff_coll_recv(&v, 1, FF_DTYPE_F32, 1, c, NULL) != 0, "recv from a rank that left succeeded");
    save_msg(rank, ff_error_message());
    return fails;
}

/* ---- an explicit abort (as the runtime does when the controller reports a dead member) -- */
static int aborts(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)n;
    (void)arg;
    int fails = 0;
    float v[100] = {0};
    if (rank == 0) {
        ff_coll_comm_abort(c, "controller reports worker 7 lost");
        RCHECK(ff_coll_all_reduce(v, v, 100, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) != 0, "aborted comm worked");
    } else {
        RCHECK(ff_coll_all_reduce(v, v, 100, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) != 0, "all_reduce after abort");
    }
    save_msg(rank, ff_error_message());
    return fails;
}

/* ---- ff_coll_comm_twin: its own backend gives the group; an unavailable one fails on every
 * rank alike, naming it, and the group stays usable ----------------------------------------- */
static int twins(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)arg;
    int fails = 0;
    ff_coll_comm *t = NULL;
    RCHECK(ff_coll_comm_twin(c, "cpu", &t) == 0 && t == c, "the cpu twin of a cpu group is the group");
    const char *why = NULL;
    if (!ff_coll_backend_available("nccl", &why)) {
        RCHECK(ff_coll_comm_twin(c, "nccl", &t) != 0 && t == NULL, "an nccl twin without NCCL");
        save_msg(rank, ff_error_message());
        RCHECK(strstr(ff_error_message(), "nccl") != NULL, "the message names the backend: %s", ff_error_message());
        RCHECK(rank == 0 || strstr(ff_error_message(), "rank 0 could not") != NULL, "the others learn it from rank 0: %s",
               ff_error_message());
    }
    float v[3] = {(float)rank, 1, 2};
    RCHECK(ff_coll_all_reduce(v, v, 3, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0, "the group after: %s", ff_error_message());
    RCHECK(v[0] == (float)(n * (n - 1) / 2) && v[1] == (float)n, "the group's sum after");
    return fails;
}

static void run_all(void);

static int count_containing(int n, int skip, const char *a, const char *b) {
    int k = 0;
    for (int r = 0; r < n; r++) {
        if (r == skip) continue;
        const char *m = msg_slot(r);
        if (strstr(m, a) && (!b || strstr(m, b))) k++;
    }
    return k;
}

static void show(int n, int skip) {
    for (int r = 0; r < n; r++)
        if (r != skip) printf("    rank %d: %.300s\n", r, msg_slot(r));
}

int main(void) {
    run_opts rt = default_run();
    CHECK_EQ_INT(run_ranks(3, &rt, twins, NULL), 0);
    if (!ff_coll_backend_available("nccl", NULL)) {
        printf("an nccl twin without NCCL:\n");
        show(3, -1);
    }
    /* each failure is detected differently over shared memory (the default between
     * processes of one host) and over TCP (across hosts): run everything on both */
    for (int tcp = 0; tcp < 2; tcp++) {
        if (tcp) setenv("FF_COLL_SHM", "0", 1);
        printf("==== transport: %s\n", tcp ? "TCP only" : "shared memory (same host)");
        run_all();
    }
    TEST_MAIN_END();
}

static void run_all(void) {
    int f;
    for (int algo = FF_COLL_ALGO_RING; algo <= FF_COLL_ALGO_DIRECT; algo++) {
        run_opts ro = default_run();
        ro.comm_opt.timeout_s = 20; /* far longer than a prompt failure takes */
        ro.comm_opt.algo = algo;
        ro.expect_killed_rank = 2;
        f = run_ranks(4, &ro, killed_before, &algo);
        printf("rank 2 killed before an all_reduce (%s):\n", algo == FF_COLL_ALGO_RING ? "ring" : "direct");
        show(4, 2);
        CHECK_EQ_INT(f, 0);
        /* every surviving rank names rank 2, and none of them waited for the timeout */
        CHECK_EQ_INT(count_containing(4, 2, "rank 2 died", NULL), 3);
        CHECK_EQ_INT(count_containing(4, 2, "nothing moved", NULL), 0);
    }

    run_opts rd = default_run();
    rd.comm_opt.timeout_s = 20;
    rd.expect_killed_rank = 1;
    f = run_ranks(4, &rd, killed_during, NULL);
    printf("rank 1 killed during a stream of 4 MB all_reduces:\n");
    show(4, 1);
    CHECK_EQ_INT(f, 0);
    CHECK_EQ_INT(count_containing(4, 1, "rank 1 died", NULL), 3);
    CHECK_EQ_INT(count_containing(4, 1, "nothing moved", NULL), 0);

    run_opts rh = default_run();
    rh.comm_opt.timeout_s = 0.5;
    f = run_ranks(3, &rh, hung, NULL);
    printf("rank 1 alive but never calls (timeout 0.5 s):\n");
    show(3, 1);
    CHECK_EQ_INT(f, 0);
    /* Every rank failed by the timeout; whichever timed out first told the others, and
     * each says whom it was still waiting for, so the chain leads to rank 1: rank 0 (the
     * star's root) waits for it. */
    CHECK_EQ_INT(count_containing(3, 1, "nothing moved for 0.5 s", NULL), 2);
    CHECK(count_containing(3, 1, "FF_COLL_TIMEOUT_S", NULL) >= 1);
    CHECK_STR_CONTAINS(msg_slot(0), "waiting for rank 1");

    const char *names[] = {"count", "dtype", "op", "send/recv count"};
    for (int algo = FF_COLL_ALGO_RING; algo <= FF_COLL_ALGO_DIRECT; algo++)
        for (int kind = MM_COUNT; kind <= MM_P2P; kind++) {
            run_opts rm = default_run();
            rm.comm_opt.timeout_s = 20;
            rm.comm_opt.algo = algo;
            f = run_ranks(4, &rm, mismatch, &kind);
            printf("mismatched %s (%s):\n", names[kind], algo == FF_COLL_ALGO_RING ? "ring" : "direct");
            show(kind == MM_P2P ? 2 : 4, -1);
            CHECK_EQ_INT(f, 0);
            CHECK(count_containing(4, -1, "mismatched calls", NULL) >= 1);
            CHECK_EQ_INT(count_containing(4, -1, "nothing moved", NULL), 0);
            if (kind == MM_COUNT) CHECK(count_containing(4, -1, "count=999", "count=1000") >= 1);
            if (kind == MM_DTYPE) CHECK(count_containing(4, -1, "I32", "F32") >= 1);
            /* rank 1 reads rank 0's broadcast frame, unless rank 0 (whose next call is then
             * out of step) is faster to notice and its notice arrives first: either way a
             * message names the misalignment */
            if (kind == MM_OP)
                CHECK(count_containing(4, -1, "broadcast", "all_reduce") +
                          count_containing(4, -1, "collective #1 (this rank: #2)", NULL) >= 1);
            if (kind == MM_P2P) {
                CHECK_STR_CONTAINS(msg_slot(1), "send(count=10");
                CHECK_STR_CONTAINS(msg_slot(1), "recv(count=20");
                CHECK_STR_CONTAINS(msg_slot(0), "rank 1 aborted the communicator");
            }
        }

    run_opts rl = default_run();
    rl.comm_opt.timeout_s = 20;
    f = run_ranks(2, &rl, left, NULL);
    printf("rank 1 destroyed its communicator while rank 0 waits:\n");
    show(2, 1);
    CHECK_EQ_INT(f, 0);
    CHECK_STR_CONTAINS(msg_slot(0), "rank 1 destroyed its communicator");

    run_opts ra = default_run();
    ra.comm_opt.timeout_s = 20;
    f = run_ranks(3, &ra, aborts, NULL);
    printf("rank 0 aborts:\n");
    show(3, -1);
    CHECK_EQ_INT(f, 0);
    /* directly from rank 0, or passed on by the other rank: either way the origin and reason */
    CHECK_EQ_INT(count_containing(3, 0, "rank 0 called ff_coll_comm_abort: controller reports worker 7 lost", NULL), 2);
    CHECK_STR_CONTAINS(msg_slot(0), "broken");
    CHECK_STR_CONTAINS(msg_slot(0), "rank 0 called ff_coll_comm_abort: controller reports worker 7 lost");
}
