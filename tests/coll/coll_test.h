/* Shared helpers of the collectives tests: run a function on n forked processes, one rank
 * each, joined into one communicator, with a watchdog so a hang fails the test instead of
 * stalling it. Each rank returns 0 (pass) or non-zero; ranks can publish results in a
 * shared page for the parent to compare across ranks. */
#ifndef FF_TESTS_COLL_TEST_H
#define FF_TESTS_COLL_TEST_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

/* 64 KiB shared between the parent and every rank (zeroed before each run). */
static uint8_t *g_shared;

/* fn runs in rank `rank`'s process with its communicator (NULL when make_comm is false:
 * fn then joins by itself with the id). Returns 0 on success. */
typedef int (*rank_fn)(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg);

typedef struct run_opts {
    ff_coll_options comm_opt; /* for comm_init */
    int no_comm;              /* fn joins by itself */
    int id_by_parent;         /* a process that is not a rank makes the id, as a controller would */
    int watchdog_s;           /* kill everything after this long (default 60) */
    int expect_killed_rank;   /* a rank that kills itself on purpose (-1: none) */
    const char *backend;      /* NULL: "cpu" */
    int (*setup)(int rank);   /* runs first in each rank's process (e.g. cudaSetDevice) */
} run_opts;

static inline void shared_init(void) {
    if (!g_shared) {
        g_shared = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (g_shared == MAP_FAILED) {
            perror("mmap");
            exit(1);
        }
    }
    memset(g_shared, 0, 1 << 16);
}

/* Fork n ranks; returns the number of ranks that failed (exited non-zero, crashed, or hung).
 * The id is made by rank 0, or (id_by_parent) by an extra non-rank process that stays alive
 * until every rank is done. This process itself never makes an id before forking: a
 * process must not fork while its rendezvous thread may be allocating (ASan's allocator,
 * unlike glibc's, can then stay locked in the child). */
static inline int run_ranks(int n, const run_opts *ro, rank_fn fn, void *arg) {
    shared_init();
    fflush(stdout);
    fflush(stderr);
    ff_coll_id id;
    memset(&id, 0, sizeof id);
    int pipes[64][2], done[2];
    if (n > 63 || pipe(done)) return n;
    for (int r = 0; r < n; r++)
        if (pipe(pipes[r])) return n;
    pid_t maker = -1;
    if (ro->id_by_parent) {
        maker = fork();
        if (maker == 0) {
            close(done[1]);
            int rc = ff_coll_get_unique_id(&id, ro->backend ? ro->backend : "cpu", &ro->comm_opt);
            if (rc) fprintf(stderr, "id maker: get_unique_id: %s\n", ff_error_message());
            for (int k = 0; k < n; k++)
                if (write(pipes[k][1], &id, sizeof id) != (ssize_t)sizeof id) rc = -1;
            char b;
            while (read(done[0], &b, 1) > 0) { /* until every rank closed its end */
            }
            exit(rc ? 1 : 0);
        }
    }
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) return n;
        if (pid == 0) {
            close(done[0]);
            if (ro->setup && ro->setup(r)) exit(4);
            if (!ro->id_by_parent && r == 0) {
                if (ff_coll_get_unique_id(&id, ro->backend ? ro->backend : "cpu", &ro->comm_opt)) {
                    fprintf(stderr, "rank 0: get_unique_id: %s\n", ff_error_message());
                    exit(2);
                }
                for (int k = 1; k < n; k++)
                    if (write(pipes[k][1], &id, sizeof id) != (ssize_t)sizeof id) exit(2);
            } else if (read(pipes[r][0], &id, sizeof id) != (ssize_t)sizeof id) {
                exit(2);
            }
            for (int k = 0; k < n; k++) {
                close(pipes[k][0]);
                close(pipes[k][1]);
            }
            ff_coll_comm *comm = NULL;
            if (!ro->no_comm && ff_coll_comm_init(&comm, n, &id, r, &ro->comm_opt)) {
                fprintf(stderr, "rank %d: comm_init: %s\n", r, ff_error_message());
                exit(3);
            }
            int rc = fn(comm, r, n, &id, arg);
            ff_coll_comm_destroy(&comm);
            fflush(stderr);
            exit(rc ? 1 : 0);
        }
        pids[r] = pid;
    }
    for (int k = 0; k < n; k++) {
        close(pipes[k][0]);
        close(pipes[k][1]);
    }
    close(done[0]);
    close(done[1]);
    int failed = 0, left = n;
    int64_t deadline = ff_now_ns() + (int64_t)(ro->watchdog_s ? ro->watchdog_s : 60) * 1000000000LL;
    int finished[64] = {0};
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p == 0) {
            if (ff_now_ns() > deadline) {
                fprintf(stderr, "watchdog: ranks still running after %d s, killing them\n",
                        ro->watchdog_s ? ro->watchdog_s : 60);
                for (int r = 0; r < n; r++)
                    if (!finished[r]) kill(pids[r], SIGKILL);
                if (maker > 0) kill(maker, SIGKILL);
                deadline = INT64_MAX;
                failed++;
                continue;
            }
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (p < 0) break;
        if (p == maker) {
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "the id maker failed\n");
                failed++;
            }
            maker = -1;
            continue;
        }
        int r = 0;
        while (r < n && pids[r] != p) r++;
        if (r == n) continue;
        finished[r] = 1;
        left--;
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (r == ro->expect_killed_rank && !ok) ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        if (!ok) {
            failed++;
            if (WIFSIGNALED(st))
                fprintf(stderr, "rank %d (of %d) died with signal %d\n", r, n, WTERMSIG(st));
            else
                fprintf(stderr, "rank %d (of %d) failed (exit %d)\n", r, n, WEXITSTATUS(st));
        }
    }
    if (maker > 0) {
        int st;
        waitpid(maker, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    return failed;
}

static inline run_opts default_run(void) {
    run_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.expect_killed_rank = -1;
    return ro;
}

/* Within a rank: print and count a failure. */
#define RCHECK(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            fails++;                                                            \
        }                                                                       \
    } while (0)

#endif
