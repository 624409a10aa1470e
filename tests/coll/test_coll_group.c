/* Grouped calls and sub-groups of the cpu backend: send/recv rings inside a group with
 * messages far larger than the socket buffers (they deadlock if not progressed together),
 * ordering of several sends to one peer, collectives queued inside a group, nested groups,
 * ncclCommSplit-style splits (color, key, no color, splits of splits, destroy order), an
 * id made by a process that is not a rank (the controller's case), and explicit loopback
 * addresses. */
#include "coll_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define BIGMSG (3u << 20) /* floats: 12 MB per message */

static float val(int rank, size_t i, int tag) { return (float)((rank * 31 + (int)(i % 1000) * 7 + tag * 5) % 101); }

static int ring_rank(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)arg;
    int fails = 0, next = (rank + 1) % n, prev = (rank + n - 1) % n;
    float *out = malloc(BIGMSG * 4), *in = malloc(BIGMSG * 4), *out2 = malloc(BIGMSG * 4), *in2 = malloc(BIGMSG * 4);
    for (size_t i = 0; i < BIGMSG; i++) {
        out[i] = val(rank, i, 1);
        out2[i] = val(rank, i, 2);
    }
    /* every rank sends to the next and receives from the previous, both directions at once */
    RCHECK(ff_coll_group_start() == 0, "start");
    RCHECK(ff_coll_send(out, BIGMSG, FF_DTYPE_F32, next, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_recv(in, BIGMSG, FF_DTYPE_F32, prev, c, NULL) == 0, "%s", ff_error_message());
    if (n > 2) {
        RCHECK(ff_coll_send(out2, BIGMSG, FF_DTYPE_F32, prev, c, NULL) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_recv(in2, BIGMSG, FF_DTYPE_F32, next, c, NULL) == 0, "%s", ff_error_message());
    }
    RCHECK(ff_coll_group_end() == 0, "%s", ff_error_message());
    for (size_t i = 0; i < BIGMSG; i++)
        if (in[i] != val(prev, i, 1) || (n > 2 && in2[i] != val(next, i, 2))) {
            RCHECK(0, "ring data wrong at %zu", i);
            break;
        }
    /* several messages to the same peer arrive in order; a zero-length one too */
    float small[3][5];
    RCHECK(ff_coll_group_start() == 0, "start");
    ff_coll_group_start(); /* nested: only the outermost end runs */
    for (int m = 0; m < 3; m++) {
        for (int i = 0; i < 5; i++) small[m][i] = (float)(rank * 100 + m * 10 + i);
        RCHECK(ff_coll_send(small[m], 5, FF_DTYPE_F32, next, c, NULL) == 0, "%s", ff_error_message());
    }
    RCHECK(ff_coll_send(NULL, 0, FF_DTYPE_F32, next, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_group_end() == 0, "%s", ff_error_message());
    float got[3][5];
    for (int m = 0; m < 3; m++)
        RCHECK(ff_coll_recv(got[m], 5, FF_DTYPE_F32, prev, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_recv(NULL, 0, FF_DTYPE_F32, prev, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_group_end() == 0, "%s", ff_error_message());
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < 5; i++) RCHECK(got[m][i] == (float)(prev * 100 + m * 10 + i), "order m=%d i=%d", m, i);
    /* collectives queued in a group run after its sends and receives, in issue order */
    float a[1000], b[1000 * 8], x = (float)rank, y = -1;
    for (int i = 0; i < 1000; i++) a[i] = val(rank, (size_t)i, 3);
    RCHECK(ff_coll_group_start() == 0, "start");
    RCHECK(ff_coll_all_reduce(a, a, 1000, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_send(&x, 1, FF_DTYPE_F32, next, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_recv(&y, 1, FF_DTYPE_F32, prev, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_all_gather(a, b, 1000, FF_DTYPE_F32, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_group_end() == 0, "%s", ff_error_message());
    RCHECK(y == (float)prev, "grouped recv got %g", y);
    for (int i = 0; i < 1000; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, (size_t)i, 3);
        if (a[i] != want) {
            RCHECK(0, "grouped all_reduce i=%d", i);
            break;
        }
        for (int r = 0; r < n; r++)
            if (b[r * 1000 + i] != want) {
                RCHECK(0, "grouped all_gather saw the reduced values only after the all_reduce");
                i = 1000;
                break;
            }
    }
    /* plain (ungrouped) ping-pong between pairs */
    if (n % 2 == 0) {
        float v = (float)rank * 2, w = -1;
        if (rank % 2 == 0) {
            RCHECK(ff_coll_send(&v, 1, FF_DTYPE_F32, rank + 1, c, NULL) == 0, "%s", ff_error_message());
            RCHECK(ff_coll_recv(&w, 1, FF_DTYPE_F32, rank + 1, c, NULL) == 0, "%s", ff_error_message());
            RCHECK(w == (float)(rank + 1) * 2, "pong %g", w);
        } else {
            RCHECK(ff_coll_recv(&w, 1, FF_DTYPE_F32, rank - 1, c, NULL) == 0, "%s", ff_error_message());
            RCHECK(ff_coll_send(&v, 1, FF_DTYPE_F32, rank - 1, c, NULL) == 0, "%s", ff_error_message());
            RCHECK(w == (float)(rank - 1) * 2, "ping %g", w);
        }
    }
    free(out);
    free(in);
    free(out2);
    free(in2);
    return fails;
}

/* member list of a color, ordered by (key, parent rank) as ncclCommSplit does */
static int split_rank(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)arg;
    int fails = 0;
    /* colors: rank % 3 (rank 0 takes no part); key: -rank, so the order is reversed */
    int color = rank == 0 ? FF_COLL_SPLIT_NOCOLOR : rank % 3;
    ff_coll_comm *sub = NULL;
    RCHECK(ff_coll_comm_split(c, color, -rank, &sub) == 0, "%s", ff_error_message());
    if (rank == 0) {
        RCHECK(sub == NULL, "no-color rank got a communicator");
    } else if (sub) {
        int members[16], m = 0;
        for (int r = n - 1; r >= 1; r--)
            if (r % 3 == color) members[m++] = r;
        RCHECK(ff_coll_comm_size(sub) == m, "size %d want %d", ff_coll_comm_size(sub), m);
        int want_rank = -1;
        for (int i = 0; i < m; i++)
            if (members[i] == rank) want_rank = i;
        RCHECK(ff_coll_comm_rank(sub) == want_rank, "rank %d want %d", ff_coll_comm_rank(sub), want_rank);
        float v[3] = {(float)rank, 1, (float)ff_coll_comm_rank(sub)};
        RCHECK(ff_coll_all_reduce(v, v, 3, FF_DTYPE_F32, FF_COLL_SUM, sub, NULL) == 0, "%s", ff_error_message());
        float sum = 0;
        for (int i = 0; i < m; i++) sum += (float)members[i];
        RCHECK(v[0] == sum && v[1] == (float)m && v[2] == (float)(m * (m - 1) / 2), "sub all_reduce %g %g %g", v[0],
               v[1], v[2]);
        /* a split of the split: everyone in one color, same order */
        ff_coll_comm *subsub = NULL;
        RCHECK(ff_coll_comm_split(sub, 7, 0, &subsub) == 0, "%s", ff_error_message());
        if (subsub) {
            int bc = ff_coll_comm_rank(subsub) == 0 ? 4242 : 0;
            RCHECK(ff_coll_broadcast(&bc, &bc, 1, FF_DTYPE_I32, 0, subsub, NULL) == 0, "%s", ff_error_message());
            RCHECK(bc == 4242, "subsub broadcast %d", bc);
            RCHECK(ff_coll_comm_rank(subsub) == ff_coll_comm_rank(sub), "subsub order");
        } else {
            RCHECK(0, "subsub missing");
        }
        ff_coll_comm_destroy(&subsub);
    }
    /* the parent still works, with the sub-communicator alive (colors 0, 2) or already
     * destroyed (color 1) */
    if (color == 1) ff_coll_comm_destroy(&sub);
    int one = 1;
    RCHECK(ff_coll_all_reduce(&one, &one, 1, FF_DTYPE_I32, FF_COLL_SUM, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(one == n, "parent all_reduce after split: %d", one);
    if (sub) { /* and the sub-communicator works after the parent's call */
        float z = 1;
        RCHECK(ff_coll_all_reduce(&z, &z, 1, FF_DTYPE_F32, FF_COLL_SUM, sub, NULL) == 0, "%s", ff_error_message());
        RCHECK(z == (float)ff_coll_comm_size(sub), "sub after parent: %g", z);
    }
    ff_coll_comm_destroy(&sub);
    return fails;
}

static int simple_rank(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)arg;
    int fails = 0;
    double v = rank + 1;
    RCHECK(ff_coll_all_reduce(&v, &v, 1, FF_DTYPE_F64, FF_COLL_SUM, c, NULL) == 0, "%s", ff_error_message());
    RCHECK(v == n * (n + 1) / 2.0, "sum %g", v);
    RCHECK(strcmp(ff_coll_comm_backend(c), "cpu") == 0 && ff_coll_comm_error(c) == NULL, "backend/error");
    return fails;
}

static bool have_ipv6_loopback(void) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

int main(void) {
    int f;
    run_opts ro = default_run();
    ro.comm_opt.timeout_s = 30;
    for (int n = 2; n <= 8; n += (n < 4 ? 1 : 4)) {
        f = run_ranks(n, &ro, ring_rank, NULL);
        printf("grouped send/recv ring, %d ranks: %s\n", n, f ? "FAILED" : "ok");
        CHECK_EQ_INT(f, 0);
    }
    f = run_ranks(7, &ro, split_rank, NULL);
    printf("split (7 ranks, colors rank %% 3, reversed keys, no color, nested): %s\n", f ? "FAILED" : "ok");
    CHECK_EQ_INT(f, 0);

    /* an id made by a process that is not a rank (a controller) */
    run_opts rp = default_run();
    rp.id_by_parent = 1;
    f = run_ranks(4, &rp, simple_rank, NULL);
    printf("id made by a non-rank process: %s\n", f ? "FAILED" : "ok");
    CHECK_EQ_INT(f, 0);

    /* explicit addresses: IPv4 loopback, and IPv6 loopback where the host has it */
    run_opts r4 = default_run();
    r4.comm_opt.host = "127.0.0.1";
    f = run_ranks(3, &r4, simple_rank, NULL);
    printf("host 127.0.0.1: %s\n", f ? "FAILED" : "ok");
    CHECK_EQ_INT(f, 0);
    if (have_ipv6_loopback()) {
        run_opts r6 = default_run();
        r6.comm_opt.host = "::1";
        f = run_ranks(3, &r6, simple_rank, NULL);
        printf("host ::1: %s\n", f ? "FAILED" : "ok");
        CHECK_EQ_INT(f, 0);
    } else {
        printf("host ::1: not available here, skipped\n");
    }

    /* the id's text travels as a string */
    ff_coll_id id, back;
    REQUIRE(ff_coll_get_unique_id(&id, "cpu", &r4.comm_opt) == 0);
    CHECK(strncmp(id.text, "ffcoll1/cpu/tcp/127.0.0.1/", 26) == 0);
    CHECK(ff_coll_id_from_string(&back, id.text, strlen(id.text)) == 0);
    CHECK(strcmp(back.text, id.text) == 0);
    CHECK(ff_coll_id_from_string(&back, id.text, strlen(id.text) + 1) == 0); /* with its NUL */
    CHECK(ff_coll_id_backend(&id) && strcmp(ff_coll_id_backend(&id), "cpu") == 0);
    TEST_MAIN_END();
}
