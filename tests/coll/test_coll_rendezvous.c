/* The unique id and the rendezvous: malformed ids, a foreign token (a stale or foreign
 * process cannot join, the group forms anyway), an id whose rendezvous is over, ranks that
 * disagree on nranks or claim the same rank, ranks that never come (named after the
 * timeout), garbage sent to the rendezvous port; and argument checks, which fail without
 * breaking the communicator. */
#include "coll_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static char *msg_slot(int rank) { return (char *)g_shared + 4096 + (size_t)rank * 1024; }
static void save_msg(int rank, const char *m) { snprintf(msg_slot(rank), 1024, "%s", m); }

typedef struct scenario {
    int kind;
} scenario;

enum { SC_FOREIGN_TOKEN, SC_NRANKS, SC_DUP, SC_MISSING, SC_GARBAGE };

/* connect to the id's rendezvous and send 128 bytes of junk */
static void send_garbage(const ff_coll_id *id) {
    char host[64];
    int port;
    if (sscanf(id->text, "ffcoll1/cpu/tcp/%63[^/]/%d/", host, &port) != 2) return;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        char junk[128];
        memset(junk, 'x', sizeof junk);
        if (write(fd, junk, sizeof junk) < 0) perror("write");
        char reply[256];
        ssize_t r = read(fd, reply, sizeof reply - 1);
        (void)r;
    }
    close(fd);
}

static int join(const ff_coll_id *id, int nranks, int rank, double timeout) {
    ff_coll_options o = {.timeout_s = timeout};
    ff_coll_comm *c = NULL;
    int rc = ff_coll_comm_init(&c, nranks, id, rank, &o);
    if (rc == 0) {
        int v = 1;
        rc = ff_coll_all_reduce(&v, &v, 1, FF_DTYPE_I32, FF_COLL_SUM, c, NULL);
        if (rc == 0 && v != nranks) rc = ff_error_set("test", NULL, "sum %d != %d", v, nranks);
    }
    ff_coll_comm_destroy(&c);
    return rc;
}

static int scenario_rank(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)c;
    (void)n;
    int fails = 0, kind = ((scenario *)arg)->kind;
    int rc;
    switch (kind) {
    case SC_FOREIGN_TOKEN:
        if (rank == 2) { /* a process with a tampered copy of the id */
            ff_coll_id bad = *id;
            char *tok = strrchr(bad.text, '/') + 1;
            tok[0] = tok[0] == 'a' ? 'b' : 'a';
            rc = join(&bad, 2, 0, 10);
            RCHECK(rc != 0, "joined with a foreign token");
            save_msg(rank, ff_error_message());
            return fails;
        }
        {
            struct timespec ts = {0, 300000000}; /* let the foreign process try first */
            nanosleep(&ts, NULL);
        }
        rc = join(id, 2, rank, 10);
        RCHECK(rc == 0, "%s", ff_error_message());
        return fails;
    case SC_NRANKS:
        rc = join(id, rank == 1 ? 2 : 3, rank, 10);
        break;
    case SC_DUP:
        rc = join(id, 3, rank == 2 ? 0 : rank, 10);
        break;
    case SC_MISSING:
        if (rank == 2) return 0; /* never joins */
        rc = join(id, 3, rank, 10);
        break;
    case SC_GARBAGE:
        if (rank == 2) {
            send_garbage(id);
            return 0;
        }
        rc = join(id, 2, rank, 10);
        RCHECK(rc == 0, "%s", ff_error_message());
        return fails;
    default: rc = -1;
    }
    RCHECK(rc != 0, "scenario %d: comm_init succeeded", kind);
    save_msg(rank, ff_error_message());
    return fails;
}

static int any_contains(int n, const char *s) {
    for (int r = 0; r < n; r++)
        if (strstr(msg_slot(r), s)) return 1;
    return 0;
}

static void show(int n) {
    for (int r = 0; r < n; r++)
        if (msg_slot(r)[0]) printf("    rank %d: %.260s\n", r, msg_slot(r));
}

static int run_scenario(int kind, double rendezvous_timeout) {
    run_opts ro = default_run();
    ro.no_comm = 1;
    ro.id_by_parent = 1;
    ro.comm_opt.timeout_s = rendezvous_timeout;
    scenario sc = {kind};
    return run_ranks(3, &ro, scenario_rank, &sc);
}

static void check_validation(void) {
    ff_coll_options o = {.timeout_s = 5, .host = "127.0.0.1"};
    ff_coll_id id;
    REQUIRE(ff_coll_get_unique_id(&id, "cpu", &o) == 0);
    ff_coll_comm *c = NULL;
    CHECK(ff_coll_comm_init(&c, 0, &id, 0, &o) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "nranks 0");
    CHECK(ff_coll_comm_init(&c, 2, &id, 2, &o) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "rank 2 is outside 0..1");
    REQUIRE(ff_coll_comm_init(&c, 1, &id, 0, &o) == 0);
    float x[4] = {1, 2, 3, 4}, y[4];
    CHECK(ff_coll_all_reduce(NULL, y, 4, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "NULL buffer");
    CHECK(ff_coll_all_reduce(x, y, 4, FF_DTYPE_BOOL, FF_COLL_SUM, c, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot reduce dtype BOOL");
    CHECK(ff_coll_all_reduce(x, y, 4, FF_DTYPE_F32, (ff_coll_redop)99, c, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown reduction op");
    CHECK(ff_coll_all_reduce(x, y, 4, (ff_dtype)77, FF_COLL_SUM, c, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown dtype");
    CHECK(ff_coll_broadcast(x, y, 4, FF_DTYPE_F32, 1, c, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "root 1 is outside 0..0");
    CHECK(ff_coll_send(x, 4, FF_DTYPE_F32, 0, c, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "other than this rank");
    CHECK(ff_coll_all_gather_v(x, y, NULL, FF_DTYPE_F32, c, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "NULL counts");
    CHECK(ff_coll_group_end() != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "without group_start");
    CHECK(ff_coll_comm_split(c, -5, 0, &(ff_coll_comm *){NULL}) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "color -5");
    /* none of that broke the communicator; a one-rank all-reduce is a copy (avg: / 1) */
    CHECK(ff_coll_comm_error(c) == NULL);
    CHECK(ff_coll_all_reduce(x, y, 4, FF_DTYPE_F32, FF_COLL_AVG, c, NULL) == 0);
    CHECK(y[0] == 1 && y[3] == 4);
    CHECK(ff_coll_synchronize(c, NULL) == 0);
    ff_coll_comm_destroy(&c);
    CHECK(c == NULL);
    ff_coll_comm_destroy(&c); /* NULL is fine */

    CHECK(ff_coll_get_unique_id(&id, "gloo", NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown backend \"gloo\"");
    const char *why = NULL;
    CHECK(ff_coll_backend_available("cpu", &why));
    if (!ff_coll_backend_available("nccl", &why)) {
        CHECK(why != NULL && why[0]);
        printf("nccl backend here: unavailable (%s)\n", why);
    }
}

static void check_malformed_ids(void) {
    ff_coll_id id;
    const char *bad[] = {
        "",
        "hello",
        "ffcoll1/cpu/tcp/127.0.0.1/0/00112233445566778899aabbccddeeff",
        "ffcoll1/cpu/tcp/127.0.0.1/70000/00112233445566778899aabbccddeeff",
        "ffcoll1/cpu/tcp/not-an-ip/4000/00112233445566778899aabbccddeeff",
        "ffcoll1/cpu/tcp/127.0.0.1/4000/0011223344",
        "ffcoll1/cpu/tcp/127.0.0.1/4000/zz112233445566778899aabbccddeeff",
        "ffcoll1/cpu/udp/127.0.0.1/4000/00112233445566778899aabbccddeeff",
        "ffcoll1/cpu/tcp/127.0.0.1/4000/00112233 445566778899aabbccddeeff",
        "ffcoll1/nccl/abcd",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ff_coll_id_from_string(&id, bad[i], strlen(bad[i]));
        if (rc == 0) fprintf(stderr, "accepted malformed id '%s'\n", bad[i]);
        CHECK(rc != 0);
        CHECK(strlen(ff_error_message()) > 10);
    }
    char longid[400];
    memset(longid, 'a', sizeof longid);
    CHECK(ff_coll_id_from_string(&id, longid, sizeof longid) != 0);
    /* comm_init refuses a malformed id without touching the network */
    memset(&id, 0, sizeof id);
    snprintf(id.text, sizeof id.text, "ffcoll1/cpu/tcp/127.0.0.1/4000/nothex");
    ff_coll_comm *c = NULL;
    CHECK(ff_coll_comm_init(&c, 2, &id, 0, NULL) != 0 && c == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "malformed cpu id");
    CHECK(ff_coll_id_backend(&id) && strcmp(ff_coll_id_backend(&id), "cpu") == 0);
}

int main(void) {
    check_malformed_ids();

    int f = run_scenario(SC_FOREIGN_TOKEN, 10);
    printf("a process with a foreign token tries to join:\n");
    show(3);
    CHECK_EQ_INT(f, 0);
    CHECK_STR_CONTAINS(msg_slot(2), "wrong token");

    f = run_scenario(SC_GARBAGE, 10);
    printf("garbage sent to the rendezvous port: %s\n", f ? "FAILED" : "ignored, the group formed");
    CHECK_EQ_INT(f, 0);

    f = run_scenario(SC_NRANKS, 10);
    printf("ranks disagree on nranks:\n");
    show(3);
    CHECK_EQ_INT(f, 0);
    CHECK(any_contains(3, "ranks disagree on nranks"));

    f = run_scenario(SC_DUP, 10);
    printf("two processes claim rank 0:\n");
    show(3);
    CHECK_EQ_INT(f, 0);
    CHECK(any_contains(3, "rank 0 joined twice"));

    f = run_scenario(SC_MISSING, 1);
    printf("rank 2 never joins (rendezvous timeout 1 s):\n");
    show(3);
    CHECK_EQ_INT(f, 0);
    CHECK_STR_CONTAINS(msg_slot(0), "rank(s) 2 of 3 never joined");
    CHECK_STR_CONTAINS(msg_slot(1), "rank(s) 2 of 3 never joined");

    /* from here on this process makes ids itself, so it forks no more (see coll_test.h) */
    check_validation();

    /* an id whose rendezvous is over (everyone joined): a late process cannot reach it */
    ff_coll_options o = {.timeout_s = 10, .host = "127.0.0.1"};
    ff_coll_id id;
    REQUIRE(ff_coll_get_unique_id(&id, "cpu", &o) == 0);
    REQUIRE(join(&id, 1, 0, 10) == 0);
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL); /* let the rendezvous thread close its listener */
    CHECK(join(&id, 1, 0, 2) != 0);
    printf("stale id: %s\n", ff_error_message());
    CHECK_STR_CONTAINS(ff_error_message(), "cannot reach the rendezvous");
    TEST_MAIN_END();
}
