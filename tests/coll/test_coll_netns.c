/* Ranks on two "hosts": network namespaces A and B joined by a veth pair (10.x.y.1 and
 * 10.x.y.2), so each side has its own network stack and address, as two machines would.
 * Ranks 0 and 2 run in A, 1 and 3 in B (every ring step crosses the link); rank 0 makes the
 * id (its rendezvous listens on A's address), the others read it from a file. Each rank runs
 * an uneven ring all-reduce, an all_gather_v, a grouped send/recv ring and a split, and
 * checks the results. Run over TCP only (FF_COLL_SHM=0, as across real hosts) and with the
 * default transport; then, over TCP only, rank 3 (in B) is killed and the others' all-reduce
 * must fail naming it; then the link is cut under a live communicator (no reset ever comes, as
 * when a host vanishes): A's next all-reduce must fail within 20 s, not at its 30 s timeout
 * (the peer connections' keepalive and TCP_USER_TIMEOUT). Skipped (77) where network
 * namespaces cannot be made (needs root).
 *
 * The same binary is the rank: test_coll_netns --rank R --nranks N --id-file F. */
#include "coll_test.h"

#include <fcntl.h>
#include <sys/stat.h>

#define COUNT 300007

static float v(int rank, size_t i) { return (float)((rank * 3 + (int)(i % 13)) % 7); }

static int rank_main(int rank, int n, const char *id_file) {
    ff_coll_id id;
    if (rank == 0) {
        if (ff_coll_get_unique_id(&id, "cpu", NULL)) {
            fprintf(stderr, "rank 0: %s\n", ff_error_message());
            return 1;
        }
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s.tmp", id_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fputs(id.text, f) < 0 || fclose(f) || rename(tmp, id_file)) return 1;
        printf("  rank 0 (namespace A) made %s\n", id.text);
        fflush(stdout);
    } else {
        char text[FF_COLL_ID_LEN] = "";
        for (int tries = 0; tries < 2000; tries++) { /* up to 20 s */
            FILE *f = fopen(id_file, "r");
            if (f) {
                size_t k = fread(text, 1, sizeof text - 1, f);
                fclose(f);
                text[k] = '\0';
                break;
            }
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        if (ff_coll_id_from_string(&id, text, strlen(text))) {
            fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
            return 1;
        }
    }
    ff_coll_options o = {.timeout_s = 30};
    ff_coll_comm *c = NULL;
    if (ff_coll_comm_init(&c, n, &id, rank, &o)) {
        fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
        return 1;
    }
    int fails = 0;
    float *buf = malloc(COUNT * 4 * (size_t)n);
    const char *die = getenv("FF_TEST_DIE_RANK");
    if (die) { /* the killed-peer case: one rank dies, every other call must fail naming it */
        int d = atoi(die);
        if (rank == d) kill(getpid(), SIGKILL);
        int rc = ff_coll_all_reduce(buf, buf, COUNT, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
        char want[64];
        snprintf(want, sizeof want, "rank %d died", d);
        RCHECK(rc != 0 && strstr(ff_error_message(), want), "expected '%s', got: %s", want,
               rc ? ff_error_message() : "success");
        printf("  rank %d (namespace %c): %.160s\n", rank, rank % 2 ? 'B' : 'A', ff_error_message());
        ff_coll_comm_destroy(&c);
        free(buf);
        return fails ? 1 : 0;
    }
    for (size_t i = 0; i < COUNT; i++) buf[i] = v(rank, i);
    RCHECK(ff_coll_all_reduce(buf, buf, COUNT, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0, "%s", ff_error_message());
    if (getenv("FF_TEST_CUT")) { /* the cut link: say ready, B goes quiet, A reduces again once it is cut */
        char f[600];
        snprintf(f, sizeof f, "%s.ready%d", id_file, rank);
        close(open(f, O_CREAT | O_WRONLY, 0600));
        if (rank % 2) pause(); /* killed by the parent */
        snprintf(f, sizeof f, "%s.cut", id_file);
        while (access(f, F_OK) != 0) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        int64_t t0 = ff_now_ns();
        int rc = ff_coll_all_reduce(buf, buf, COUNT, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
        double took = (double)(ff_now_ns() - t0) * 1e-9;
        RCHECK(rc != 0 && took < 20, "after the cut: %s in %.1f s", rc ? ff_error_message() : "success", took);
        printf("  rank %d (namespace A): failed after %.1f s: %.120s\n", rank, took, ff_error_message());
        ff_coll_comm_destroy(&c);
        free(buf);
        return fails ? 1 : 0;
    }
    for (size_t i = 0; i < COUNT; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += v(r, i);
        if (buf[i] != want) {
            RCHECK(0, "all_reduce i=%zu got %g want %g", i, buf[i], want);
            break;
        }
    }
    size_t counts[8], total = 0;
    for (int r = 0; r < n; r++) total += counts[r] = (size_t)(1000 * r + 3);
    float mine[4000], *all = malloc(total * 4);
    for (size_t i = 0; i < counts[rank]; i++) mine[i] = (float)(rank * 10000 + (int)i);
    RCHECK(ff_coll_all_gather_v(mine, all, counts, FF_DTYPE_F32, c, NULL) == 0, "%s", ff_error_message());
    for (int r = 0, off = 0; r < n; off += (int)counts[r], r++)
        for (size_t i = 0; i < counts[r]; i++)
            if (all[off + (int)i] != (float)(r * 10000 + (int)i)) {
                RCHECK(0, "all_gather_v r=%d i=%zu", r, i);
                break;
            }
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    float out = (float)rank, in = -1;
    RCHECK(ff_coll_group_start() == 0, "start");
    ff_coll_send(&out, 1, FF_DTYPE_F32, next, c, NULL);
    ff_coll_recv(&in, 1, FF_DTYPE_F32, prev, c, NULL);
    RCHECK(ff_coll_group_end() == 0, "%s", ff_error_message());
    RCHECK(in == (float)prev, "ring got %g", in);
    ff_coll_comm *side = NULL; /* the ranks of each namespace */
    RCHECK(ff_coll_comm_split(c, rank % 2, rank, &side) == 0 && side, "%s", ff_error_message());
    if (side) {
        int one = 1;
        RCHECK(ff_coll_all_reduce(&one, &one, 1, FF_DTYPE_I32, FF_COLL_SUM, side, NULL) == 0, "%s",
               ff_error_message());
        RCHECK(one == n / 2, "split sum %d", one);
        ff_coll_comm_destroy(&side);
    }
    printf("  rank %d (namespace %c): %s\n", rank, rank % 2 ? 'B' : 'A', fails ? "FAILED" : "all checks passed");
    ff_coll_comm_destroy(&c);
    free(buf);
    free(all);
    return fails ? 1 : 0;
}

static int sh(const char *cmd) { return system(cmd) == 0 ? 0 : -1; }

int main(int argc, char **argv) {
    if (argc == 7 && !strcmp(argv[1], "--rank"))
        return rank_main(atoi(argv[2]), atoi(argv[4]), argv[6]);
    char nsa[32], nsb[32], va[32], vb[32], cmd[1024];
    int id = (int)getpid();
    snprintf(nsa, sizeof nsa, "ffca%d", id);
    snprintf(nsb, sizeof nsb, "ffcb%d", id);
    snprintf(va, sizeof va, "ffxa%d", id % 100000);
    snprintf(vb, sizeof vb, "ffxb%d", id % 100000);
    snprintf(cmd, sizeof cmd, "ip netns add %s 2>/dev/null", nsa);
    if (geteuid() != 0 || sh(cmd)) SKIP("cannot create network namespaces here (needs root and CAP_SYS_ADMIN)");
    int a = 20 + id % 200, b = (id / 200) % 250;
    snprintf(cmd, sizeof cmd,
             "ip netns add %s && ip link add %s type veth peer name %s && ip link set %s netns %s && "
             "ip link set %s netns %s && ip -n %s addr add 10.%d.%d.1/24 dev %s && "
             "ip -n %s addr add 10.%d.%d.2/24 dev %s && ip -n %s link set %s up && ip -n %s link set %s up && "
             "ip -n %s link set lo up && ip -n %s link set lo up",
             nsb, va, vb, va, nsa, vb, nsb, nsa, a, b, va, nsb, a, b, vb, nsa, va, nsb, vb, nsa, nsb);
    if (sh(cmd)) {
        snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", nsa, nsb);
        sh(cmd);
        SKIP("network namespaces exist but a veth link cannot be made here");
    }
    char self[512];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(k > 0);
    self[k] = '\0';
    const char *modes[] = {"0", "1", "0", "0"};
    for (int m = 0; m < 4; m++) {
        char id_file[256];
        snprintf(id_file, sizeof id_file, "/tmp/ff-coll-netns-%d-%d.id", id, m);
        unlink(id_file);
        int n = 4;
        pid_t pids[4];
        for (int r = 0; r < n; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                char rs[8], ns[8];
                snprintf(rs, sizeof rs, "%d", r);
                snprintf(ns, sizeof ns, "%d", n);
                setenv("FF_COLL_SHM", modes[m], 1);
                if (m == 2) setenv("FF_TEST_DIE_RANK", "3", 1);
                if (m == 3) setenv("FF_TEST_CUT", "1", 1);
                execlp("ip", "ip", "netns", "exec", r % 2 ? nsb : nsa, self, "--rank", rs, "--nranks", ns,
                       "--id-file", id_file, (char *)NULL);
                _exit(127);
            }
        }
        int bad = 0;
        int64_t deadline = ff_now_ns() + 60000000000LL;
        if (m == 3) { /* every rank has a live communicator: cut the link, then let A go on */
            char f[600];
            for (int r = 0; r < n; r++) {
                snprintf(f, sizeof f, "%s.ready%d", id_file, r);
                while (access(f, F_OK) != 0 && ff_now_ns() < deadline) {
                    struct timespec ts = {0, 10000000};
                    nanosleep(&ts, NULL);
                }
                unlink(f);
            }
            snprintf(cmd, sizeof cmd, "ip -n %s link set %s down", nsa, va);
            CHECK(sh(cmd) == 0);
            snprintf(f, sizeof f, "%s.cut", id_file);
            close(open(f, O_CREAT | O_WRONLY, 0600));
        }
        for (int left = n; left > 0;) {
            int st;
            pid_t p = waitpid(-1, &st, WNOHANG);
            if (p > 0) {
                left--;
                bool killed = m == 2 && p == pids[3] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
                if (m == 3 && (p == pids[1] || p == pids[3])) continue; /* B, killed below */
                if (m == 3 && p == pids[0]) kill(pids[1], SIGKILL), kill(pids[3], SIGKILL);
                if (!killed && (!WIFEXITED(st) || WEXITSTATUS(st))) bad++;
                /* `ip netns exec` may exit with the signal's status instead of dying of it */
                if (m == 2 && p == pids[3] && WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL) bad--;
                continue;
            }
            if (ff_now_ns() > deadline) {
                for (int r = 0; r < n; r++) kill(pids[r], SIGKILL);
                fprintf(stderr, "watchdog: ranks still running after 60 s\n");
                bad++;
                deadline = INT64_MAX;
            }
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
        unlink(id_file);
        if (m == 3) {
            char f[600];
            snprintf(f, sizeof f, "%s.cut", id_file);
            unlink(f);
        }
        printf("4 ranks across two network namespaces (%s): %s\n",
               m == 0 ? "TCP only, as across hosts" : m == 1 ? "default transport" : m == 2 ? "TCP only, rank 3 killed" : "TCP only, the link cut",
               bad ? "FAILED" : "ok");
        CHECK_EQ_INT(bad, 0);
    }
    snprintf(cmd, sizeof cmd, "ip netns del %s; ip netns del %s", nsa, nsb);
    sh(cmd);
    TEST_MAIN_END();
}
