/* `fuseflow worker`: join a controller and run its subtasks (workers/worker.c does it all). */
#include "cli/commands.h"
#include "fuseflow/worker.h"

int ff_cmd_worker(int argc, char **argv) { return ff_worker_main(argc, argv); }
