/* CURVE: keys from ff_curve_keygen; workers with worker.key join over tcp and work; a worker
 * without keys, with a client key the controller does not know, or with keys from another
 * keygen run cannot join and exits with an error that says why; bad key files are refused. */
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tests/runtime/rt_test.h"

extern char **environ;

static char dir[256], dir2[256];

/* Start `worker --connect ep [--curve key]`, stderr to errfile; wait for its exit (the
 * controller's loop keeps running meanwhile). Returns its exit status (or -1). Refusals
 * arrive as handshake events within a few reconnects; the connect timeout only bounds a
 * broken case. */
static int run_worker(ff_controller *c, const char *key, const char *errfile, const char *timeout) {
    char *argv[12];
    int k = 0;
    argv[k++] = rt_self;
    argv[k++] = "worker";
    argv[k++] = "--connect";
    argv[k++] = (char *)ff_controller_endpoint(c);
    argv[k++] = "--connect-timeout";
    argv[k++] = (char *)timeout;
    if (key) {
        argv[k++] = "--curve";
        argv[k++] = (char *)key;
    }
    argv[k] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, errfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    REQUIRE(posix_spawn(&pid, rt_self, &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    int status;
    for (int i = 0; i < 30000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        ff_controller_poll(c, false);
        usleep(1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static char *slurp(const char *path) {
    size_t n;
    char *s = ff_read_file(path, &n);
    return s ? s : strdup("");
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    rt_opts();
    snprintf(dir, sizeof dir, "/tmp/ff-test-curve-XXXXXX");
    snprintf(dir2, sizeof dir2, "/tmp/ff-test-curve2-XXXXXX");
    REQUIRE(mkdtemp(dir) && mkdtemp(dir2));
    REQUIRE(ff_curve_keygen(dir) == 0);
    REQUIRE(ff_curve_keygen(dir2) == 0);
    char ckey[512], wkey[512], wkey2[512], forged[512], errf[512];
    snprintf(ckey, sizeof ckey, "%s/controller.key", dir);
    snprintf(wkey, sizeof wkey, "%s/worker.key", dir);
    snprintf(wkey2, sizeof wkey2, "%s/worker.key", dir2);
    snprintf(forged, sizeof forged, "%s/forged.key", dir);
    snprintf(errf, sizeof errf, "%s/stderr.txt", dir);
    struct stat st;
    REQUIRE(stat(ckey, &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    REQUIRE(stat(wkey, &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);

    /* bad key files are refused with a message */
    ff_controller_opts o = rt_opts();
    o.endpoint = "tcp://127.0.0.1:0";
    o.curve_key_file = wkey;
    CHECK(ff_controller_new(&o) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "this is a worker key file");
    o.curve_key_file = "/nonexistent/controller.key";
    CHECK(ff_controller_new(&o) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/controller.key");

    /* a controller with CURVE; local workers need the worker key */
    o.curve_key_file = ckey;
    ff_controller *c = ff_controller_new(&o);
    REQUIRE(c);
    CHECK(!strncmp(ff_controller_endpoint(c), "tcp://127.0.0.1:", 16));
    CHECK(ff_controller_spawn(c, 1) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "worker key");
    ff_controller_destroy(&c);
    o.worker_key_file = wkey;
    c = rt_start(&o, 2);
    rt_counter k = {0};
    for (int i = 0; i < 20; i++) {
        int64_t n = 1000;
        ff_input in = rt_f32("x", &n, (float)i);
        ff_subtask_spec s = {.kind = "sum", .target = FF_TARGET_ANY, .group = "all", .inputs = &in, .ninputs = 1};
        REQUIRE(ff_controller_submit(c, &s, rt_count, &k) > 0);
    }
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(k.ok, 20);

    /* no keys at all */
    CHECK_EQ_INT(run_worker(c, NULL, errf, "10"), 1);
    char *e = slurp(errf);
    CHECK_STR_CONTAINS(e, "pass --curve worker.key");
    free(e);

    /* the right server key but a client key of its own: the ZAP handler says no */
    char pub[41], sec[41], spub[41];
    REQUIRE(zmq_curve_keypair(pub, sec) == 0);
    char *wk = slurp(wkey);
    char *sp = strstr(wk, "server-public = ");
    REQUIRE(sp);
    memcpy(spub, sp + 16, 40);
    spub[40] = 0;
    free(wk);
    char text[512];
    snprintf(text, sizeof text, "role = worker\nserver-public = %s\nclient-public = %s\nclient-secret = %s\n", spub, pub,
             sec);
    REQUIRE(ff_write_file_atomic(forged, text, strlen(text)) == 0);
    CHECK_EQ_INT(run_worker(c, forged, errf, "10"), 1);
    e = slurp(errf);
    CHECK_STR_CONTAINS(e, "authentication failed");
    free(e);
    ff_controller_stats stt;
    ff_controller_stats_get(c, &stt);
    CHECK(stt.auth_rejected >= 1);

    /* keys from another keygen run: the server cannot even read its hello */
    CHECK_EQ_INT(run_worker(c, wkey2, errf, "10"), 1);
    e = slurp(errf);
    CHECK_STR_CONTAINS(e, "same `fuseflow keygen` run");
    free(e);
    /* the controller key file handed to a worker */
    CHECK_EQ_INT(run_worker(c, ckey, errf, "1"), 1);
    e = slurp(errf);
    CHECK_STR_CONTAINS(e, "this is a controller key file");
    free(e);

    /* none of them joined; the two real workers still serve */
    CHECK_EQ_INT(ff_controller_count_workers(c, FF_WORKER_LIVE), 2);
    CHECK_EQ_INT(ff_controller_nranks(c), 2);
    rt_counter k2 = {0};
    ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_ANY, .group = "all"};
    REQUIRE(ff_controller_submit(c, &s, rt_count, &k2) > 0);
    REQUIRE(ff_controller_run(c, 10) == 0);
    CHECK_EQ_INT(k2.ok, 1);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, dir2);
    CHECK(system(cmd) == 0);
    TEST_MAIN_END();
}
