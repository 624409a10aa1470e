/* No orphans: a worker whose controller goes silent, or whose controller process is killed,
 * exits on its own after the announced timeout; one that never gets a welcome gives up after
 * its connect timeout. Orphaned grandchildren are adopted by this test (a subreaper) so their
 * exit status can be checked. */
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "tests/runtime/rt_test.h"

extern char **environ;

/* waitpid with a generous bound (not a timing assertion: it only keeps a broken worker
 * from hanging the test). Returns the status, or -1 if it never exited. */
static int wait_exit(pid_t pid, double bound_s) {
    int status;
    int64_t end = ff_now_ns() + (int64_t)(bound_s * 1e9);
    while (ff_now_ns() < end) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        usleep(2000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static void silent_controller(void) {
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/ff-test-orphan-%d.sock", (int)getpid());
    REQUIRE(zmq_bind(router, ep) == 0);
    char *argv[] = {rt_self, "worker", "--connect", ep, "--log", "off", NULL};
    pid_t pid;
    REQUIRE(posix_spawn(&pid, rt_self, NULL, NULL, argv, environ) == 0);
    ff_msg_decoder *d = ff_msg_decoder_new(0);
    ff_msg m;
    ff_msg_init(&m);
    zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq_poll(&it, 1, 10000) == 1);
    REQUIRE(ff_msg_recv(d, router, true, &m, NULL) == 1 && m.type == FF_MSG_HELLO);
    uint8_t peer[256];
    size_t pl = m.peer_len;
    memcpy(peer, m.peer, pl);
    ff_msg_begin(&m, FF_MSG_WELCOME);
    m.u.welcome = (ff_msg_welcome){.rank = 0, .heartbeat_ms = 50, .timeout_ms = 300, .max_inflight = 4};
    REQUIRE(ff_msg_send(router, peer, pl, &m) == 0);
    /* ... and never a word again: the worker must leave by itself */
    int status = wait_exit(pid, 30);
    CHECK(status != -1);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    ff_msg_free(&m);
    ff_msg_decoder_destroy(&d);
    zmq_close(router);
    zmq_ctx_term(ctx);
    unlink(ep + 6);
}

static void no_controller(void) {
    char *argv[] = {rt_self, "worker", "--connect", "ipc:///tmp/ff-test-nobody-here.sock", "--connect-timeout", "0.3",
                    "--log", "off", NULL};
    pid_t pid;
    REQUIRE(posix_spawn(&pid, rt_self, NULL, NULL, argv, environ) == 0);
    int status = wait_exit(pid, 30);
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1);
}

/* A controller process with two local workers is SIGKILLed: its workers exit on their own. */
static void killed_controller(void) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t ctl = fork();
    REQUIRE(ctl >= 0);
    if (ctl == 0) {
        close(fds[0]);
        ff_controller_opts o = rt_opts();
        o.timeout_s = 1.0; /* short, but long enough that a worker slow to start (sanitized, a
                            * loaded machine) is not declared dead before the kill */
        ff_controller *c = rt_start(&o, 2);
        for (int r = 0; r < 2; r++) {
            ff_worker_info wi;
            ff_controller_worker_info(c, r, &wi);
            pid_t p = (pid_t)wi.pid;
            if (write(fds[1], &p, sizeof p) != sizeof p) _exit(3);
        }
        for (;;) ff_controller_poll(c, true); /* until killed */
    }
    close(fds[1]);
    pid_t workers[2];
    size_t got = 0;
    while (got < sizeof workers) {
        ssize_t r = read(fds[0], (char *)workers + got, sizeof workers - got);
        REQUIRE(r > 0);
        got += (size_t)r;
    }
    close(fds[0]);
    REQUIRE(kill(ctl, SIGKILL) == 0);
    int status;
    REQUIRE(waitpid(ctl, &status, 0) == ctl);
    /* its socket file stays behind (a killed process cleans nothing up) */
    char sock[128];
    snprintf(sock, sizeof sock, "%s/fuseflow-%d-0.sock", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)ctl);
    unlink(sock);
    /* the workers were the controller's children; as subreaper we inherit them */
    for (int i = 0; i < 2; i++) {
        int ws = wait_exit(workers[i], 30);
        CHECK(ws != -1);
        CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 1);
    }
}

/* SIGTERM (or SIGINT) stops a worker cleanly: exit status 0. */
static void terminated(void) {
    char *argv[] = {rt_self, "worker", "--connect", "ipc:///tmp/ff-test-nobody-here-2.sock", "--log", "off", NULL};
    /* started as the controller starts workers: the signals blocked until handled */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    posix_spawnattr_setsigmask(&attr, &mask);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    pid_t pid;
    REQUIRE(posix_spawn(&pid, rt_self, NULL, &attr, argv, environ) == 0);
    posix_spawnattr_destroy(&attr);
    kill(pid, SIGTERM); /* at once: it waits, pending, until the worker handles it */
    int status = wait_exit(pid, 30);
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    rt_opts();
    REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    silent_controller();
    no_controller();
    killed_controller();
    terminated();
    TEST_MAIN_END();
}
