/* Helpers for the runtime tests. Each test program is also a worker: started with argv[1] ==
 * "worker" it runs rt_worker_main (tests/runtime/rt_worker.h), so the controller under test
 * spawns copies of the test binary itself (built with the same sanitizers) and needs no
 * other program. */
#ifndef FF_RT_TEST_H
#define FF_RT_TEST_H

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/controller.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"
#include "tests/runtime/rt_worker.h"
#include "tests/test_util.h"

#define RT_WORKER_MAIN(argc, argv)                                                   \
    do {                                                                             \
        if ((argc) > 1 && !strcmp((argv)[1], "worker"))                              \
            return rt_worker_main((argc) - 1, (argv) + 1, NULL, NULL);               \
    } while (0)

static char rt_self[4096];

/* Options for fast tests: quick heartbeats, a short death timeout, this binary as worker. */
static inline ff_controller_opts rt_opts(void) {
    ff_controller_opts o;
    ff_controller_opts_default(&o);
    ssize_t n = readlink("/proc/self/exe", rt_self, sizeof rt_self - 1);
    REQUIRE(n > 0);
    rt_self[n] = 0;
    o.worker_bin = rt_self;
    o.heartbeat_s = 0.05;
    o.timeout_s = 3.0; /* deaths in these tests come from exits (seen at once) or set their own */
    o.worker_log = "error";
    /* each worker in a process group of its own, as `fuseflow run` starts them: a test that
     * stops one (SIGSTOP, a hang) must not find it killed by SIGHUP, which the kernel sends to
     * a stopped process whose group is orphaned (a test run from a job whose shell is gone) */
    o.worker_pgroup = true;
    return o;
}

/* A controller with n local workers, all live, and a group "all" of them. */
static inline ff_controller *rt_start(ff_controller_opts *o, int n) {
    ff_controller *c = ff_controller_new(o);
    if (!c) {
        fprintf(stderr, "controller: %s\n", ff_error_message());
        exit(1);
    }
    if (n > 0) {
        REQUIRE(ff_controller_spawn(c, n) == 0);
        if (ff_controller_wait_workers(c, n, 30) != 0) {
            fprintf(stderr, "%s\n", ff_error_message());
            exit(1);
        }
        int ranks[64];
        for (int i = 0; i < n; i++) ranks[i] = i;
        REQUIRE(ff_controller_group_create(c, "all", ranks, n, NULL) == 0);
    }
    return c;
}

static inline void rt_free(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* A fresh F32 tensor [n] filled with v, handed over with rt_free. */
static inline ff_input rt_f32(const char *name, const int64_t *shape1, float v) {
    float *x = malloc(sizeof *x * (size_t)(shape1[0] ? shape1[0] : 1));
    for (int64_t i = 0; i < shape1[0]; i++) x[i] = v;
    return (ff_input){.name = name, .dtype = FF_DTYPE_F32, .ndim = 1, .shape = shape1, .data = x, .free_fn = rt_free};
}

/* Shut down and check that every local worker that was still running exited with status 0
 * (under the sanitizers a leak or an error in a worker shows up here). */
static inline void rt_shutdown_clean(ff_controller *c) {
    bool was_live[256] = {false};
    int n = ff_controller_nranks(c);
    for (int r = 0; r < n && r < 256; r++) {
        ff_worker_info wi;
        was_live[r] = ff_controller_worker_info(c, r, &wi) == 0 && wi.state == FF_WORKER_LIVE && wi.local;
    }
    REQUIRE(ff_controller_shutdown(c, 20) == 0);
    for (int r = 0; r < n && r < 256; r++) {
        ff_worker_info wi;
        if (!was_live[r] || ff_controller_worker_info(c, r, &wi) != 0) continue;
        if (wi.exit_code != 0) fprintf(stderr, "worker %d exited with %d\n", r, wi.exit_code);
        CHECK_EQ_INT(wi.exit_code, 0);
    }
}

/* Run a shell command built from fmt with two string arguments (setup steps: folders, the
 * fuseflow binary); a failing one ends the test. */
static inline void rt_sh(const char *fmt, const char *a, const char *b) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0) {
        fprintf(stderr, "failed: %s\n", cmd);
        exit(1);
    }
}

typedef struct rt_counter {
    int done, ok, failed;
    int status[FF_STATUS_END];
} rt_counter;

static inline void rt_count(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    rt_counter *k = ud;
    k->done++;
    for (int i = 0; i < n; i++) {
        if (r[i].status == FF_STATUS_OK) k->ok++;
        else k->failed++;
        if (r[i].status >= 0 && r[i].status < FF_STATUS_END) k->status[r[i].status]++;
    }
}

#endif
