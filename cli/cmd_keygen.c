/* `fuseflow keygen DIR`: CURVE keys for a controller and its remote workers. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "fuseflow/msgs.h"
#include "fuseflow/error.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow keygen DIR\n\n"
            "Write DIR/controller.key and DIR/worker.key (mode 0600): ZeroMQ CURVE keys that encrypt and\n"
            "authenticate the controller's endpoint. Only workers holding worker.key can join.\n\n"
            "  controller:  fuseflow runtime-demo --listen tcp://0.0.0.0:5555 --curve DIR/controller.key ...\n"
            "  each worker: fuseflow worker --connect tcp://CONTROLLER:5555 --curve DIR/worker.key\n\n"
            "Copy worker.key to the worker hosts over a secure channel (scp); keep controller.key on the\n"
            "controller's host.\n");
}

int ff_cmd_keygen(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        usage(stderr);
        return 2;
    }
    if (ff_curve_keygen(argv[1]) != 0) {
        fprintf(stderr, "fuseflow keygen: %s\n", ff_error_message());
        return 1;
    }
    printf("wrote %s/controller.key (the controller's; keep it there)\n", argv[1]);
    printf("wrote %s/worker.key (copy it to each worker host)\n", argv[1]);
    return 0;
}
