/* Sends that do not block (ff_coll_send_post, ff_coll_sends_done) on the cpu backend: a send
 * larger than the transport takes at once (16 MiB: the shared-memory FIFO is 1 MiB) returns at
 * once while the receiver is not receiving yet, and stays not done (sends_done counts only the
 * small one before it) until the receiver takes it; posted and grouped sends to one peer keep
 * their order (the k-th send, posted or not, carries the k-th receive); a collective completes
 * the posted sends first; the data arrive intact; a posted send inside a group or to itself is
 * refused. Over shared memory and over TCP. Failure: a peer killed while a posted send to it is in flight makes sends_done fail
 * promptly, naming it, and the communicator broken; no rank hangs (the harness's watchdog). */
#include "coll_test.h"

#define N_SMALL 10
#define N_BIG (4u << 20) /* floats: 16 MiB */

/* rank 0 sets it once it has checked that the big send is still in flight */
static volatile int *go_flag(void) { return (volatile int *)g_shared; }

static void wait_flag(void) {
    while (!*go_flag()) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static int order(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)n, (void)id, (void)arg;
    int fails = 0;
    float *big = malloc(sizeof(float) * N_BIG), small[N_SMALL], last[N_SMALL], reply[N_SMALL];
    REQUIRE(big);
    if (rank == 0) {
        for (uint32_t i = 0; i < N_BIG; i++) big[i] = (float)(i % 1000) + 0.5f;
        for (int i = 0; i < N_SMALL; i++) small[i] = (float)i, last[i] = (float)(100 + i);
        uint64_t done = 99;
        RCHECK(ff_coll_send_post(small, N_SMALL, FF_DTYPE_F32, 1, c) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_sends_done(c, false, &done) == 0 && done == 1, "the small send: done %llu", (unsigned long long)done);
        RCHECK(ff_coll_send_post(big, N_BIG, FF_DTYPE_F32, 1, c) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_sends_done(c, false, &done) == 0 && done == 1, "the big send done before its receive: %llu",
               (unsigned long long)done);
        RCHECK(ff_coll_send_post(last, N_SMALL, FF_DTYPE_F32, 1, c) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_sends_done(c, false, &done) == 0 && done == 1, "done %llu past the big send", (unsigned long long)done);
        /* refused: inside a group, to itself */
        ff_coll_group_start();
        RCHECK(ff_coll_send_post(small, N_SMALL, FF_DTYPE_F32, 1, c) == -1, "a post inside a group");
        CHECK_STR_CONTAINS(ff_error_message(), "called inside a group");
        ff_coll_group_end();
        RCHECK(ff_coll_send_post(small, N_SMALL, FF_DTYPE_F32, 0, c) == -1, "a post to itself");
        CHECK_STR_CONTAINS(ff_error_message(), "peer 0 is not a rank");
        RCHECK(ff_coll_comm_error(c) == NULL, "a refused post broke the communicator");
        *go_flag() = 1;
        /* a grouped exchange behind the posted sends on the same channel */
        ff_coll_group_start();
        ff_coll_send(small, N_SMALL, FF_DTYPE_F32, 1, c, NULL);
        ff_coll_recv(reply, N_SMALL, FF_DTYPE_F32, 1, c, NULL);
        RCHECK(ff_coll_group_end() == 0, "%s", ff_error_message());
        RCHECK(reply[3] == 3.0f * 2, "reply %g", reply[3]);
        RCHECK(ff_coll_sends_done(c, true, &done) == 0 && done == 3, "waited: done %llu", (unsigned long long)done);
        /* a collective completes what is posted before it */
        RCHECK(ff_coll_send_post(big, N_BIG, FF_DTYPE_F32, 1, c) == 0, "%s", ff_error_message());
        double one = 1;
        RCHECK(ff_coll_all_reduce(&one, &one, 1, FF_DTYPE_F64, FF_COLL_SUM, c, NULL) == 0 && one == 2, "%s", ff_error_message());
        RCHECK(ff_coll_sends_done(c, false, &done) == 0 && done == 4, "after the all_reduce: done %llu", (unsigned long long)done);
    } else {
        wait_flag(); /* nothing received until rank 0 saw its big send in flight */
        RCHECK(ff_coll_recv(small, N_SMALL, FF_DTYPE_F32, 0, c, NULL) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_recv(big, N_BIG, FF_DTYPE_F32, 0, c, NULL) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_recv(last, N_SMALL, FF_DTYPE_F32, 0, c, NULL) == 0, "%s", ff_error_message());
        RCHECK(small[9] == 9 && last[0] == 100 && big[0] == 0.5f && big[N_BIG - 1] == (float)((N_BIG - 1) % 1000) + 0.5f,
               "the posted data: %g %g %g", small[9], last[0], big[N_BIG - 1]);
        float got[N_SMALL];
        for (int i = 0; i < N_SMALL; i++) reply[i] = 2.0f * (float)i;
        ff_coll_group_start();
        ff_coll_recv(got, N_SMALL, FF_DTYPE_F32, 0, c, NULL);
        ff_coll_send(reply, N_SMALL, FF_DTYPE_F32, 0, c, NULL);
        RCHECK(ff_coll_group_end() == 0 && got[5] == 5, "%s", ff_error_message());
        RCHECK(ff_coll_recv(big, N_BIG, FF_DTYPE_F32, 0, c, NULL) == 0 && big[1] == 1.5f, "%s", ff_error_message());
        double one = 1;
        RCHECK(ff_coll_all_reduce(&one, &one, 1, FF_DTYPE_F64, FF_COLL_SUM, c, NULL) == 0 && one == 2, "%s", ff_error_message());
    }
    free(big);
    return fails;
}

/* rank 1 dies with rank 0's big send to it in flight */
static int killed(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)n, (void)id, (void)arg;
    int fails = 0;
    if (rank == 1) {
        wait_flag();
        kill(getpid(), SIGKILL);
    }
    float *big = calloc(N_BIG, sizeof(float));
    REQUIRE(big);
    RCHECK(ff_coll_send_post(big, N_BIG, FF_DTYPE_F32, 1, c) == 0, "%s", ff_error_message());
    *go_flag() = 1;
    const int64_t t0 = ff_now_ns();
    uint64_t done = 0;
    RCHECK(ff_coll_sends_done(c, true, &done) == -1, "the send to a killed rank was done");
    const double ms = (double)(ff_now_ns() - t0) / 1e6;
    CHECK_STR_CONTAINS(ff_error_message(), "rank 1 died");
    RCHECK(ms < 10000, "it took %.0f ms (the timeout is 20 s)", ms);
    printf("rank 1 killed with a 16 MiB posted send in flight, after %.1f ms: %s\n", ms, ff_error_message());
    RCHECK(ff_coll_comm_error(c) != NULL, "the communicator is not broken");
    RCHECK(ff_coll_sends_done(c, false, &done) == -1, "a broken communicator's sends_done worked");
    CHECK_STR_CONTAINS(ff_error_message(), "broken by an earlier error");
    free(big);
    return fails;
}

int main(void) {
    for (int tcp = 0; tcp < 2; tcp++) { /* shared memory, then TCP only */
        if (tcp) setenv("FF_COLL_SHM", "0", 1);
        run_opts ro = default_run();
        ro.comm_opt.timeout_s = 20;
        CHECK_EQ_INT(run_ranks(2, &ro, order, NULL), 0);
        run_opts rk = default_run();
        rk.comm_opt.timeout_s = 20;
        rk.expect_killed_rank = 1;
        CHECK_EQ_INT(run_ranks(2, &rk, killed, NULL), 0);
    }
    unsetenv("FF_COLL_SHM");
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}
