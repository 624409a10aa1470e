/* ff_controller_opts.worker_pgroup: local workers start in process groups of their own, so a
 * terminal's Ctrl-C (SIGINT to the foreground process group) reaches only the controller,
 * which can checkpoint and then shut them down (`fuseflow run`). Without it they share the
 * controller's group. Either way they still stop cleanly on shutdown. */
#include "tests/runtime/rt_test.h"

static pid_t worker_pid(ff_controller *c, int rank) {
    ff_worker_info wi;
    REQUIRE(ff_controller_worker_info(c, rank, &wi) == 0);
    return (pid_t)wi.pid;
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    for (int own = 0; own < 2; own++) {
        ff_controller_opts o = rt_opts();
        o.worker_pgroup = own;
        ff_controller *c = rt_start(&o, 1);
        pid_t pid = worker_pid(c, 0);
        pid_t pg = getpgid(pid);
        REQUIRE(pg > 0);
        if (own) {
            CHECK(pg != getpgid(0));
            CHECK_EQ_INT(pg, pid); /* the leader of its own group */
        } else {
            CHECK_EQ_INT(pg, getpgid(0));
        }
        rt_shutdown_clean(c);
        ff_controller_destroy(&c);
    }
    TEST_MAIN_END();
}
