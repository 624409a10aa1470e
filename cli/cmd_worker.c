/* `fuseflow worker`: join a controller and run its subtasks (workers/worker.c does it all),
 * including the RL kinds `fuseflow run` sends (workers/rl/, include/fuseflow/rl_worker.h). */
#include <stdio.h>

#include "cli/commands.h"
#include "fuseflow/error.h"
#include "fuseflow/rl_worker.h"
#include "fuseflow/worker.h"

int ff_cmd_worker(int argc, char **argv) {
    ff_rlworker *r = ff_rlworker_new();
    if (!r) {
        fprintf(stderr, "fuseflow worker: %s\n", ff_error_message());
        return 1;
    }
    int rc = ff_worker_main_ex(argc, argv, ff_rlworker_setup, r);
    ff_rlworker_destroy(&r);
    return rc;
}
