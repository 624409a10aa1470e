/* ff_devices_describe: a worker's cores and GPUs (its hello's ff_devices) as one phrase for
 * the logs of both sides. Reading them off the machine is the worker's (workers/devices.c). */
#include <stdio.h>
#include <string.h>

#include "fuseflow/msgs.h"

void ff_devices_describe(const ff_devices *d, char *buf, size_t cap) {
    size_t off = d->cpus != d->cores ? (size_t)snprintf(buf, cap, "%u of %u cores", d->cpus, d->cores)
                                     : (size_t)snprintf(buf, cap, "%u core%s", d->cores, d->cores == 1u ? "" : "s");
    if (d->ngpus == 0) {
        if (off < cap) snprintf(buf + off, cap - off, ", no GPU");
        return;
    }
    if (off < cap) off += (size_t)snprintf(buf + off, cap - off, ", %d GPU%s:", d->ngpus, d->ngpus == 1 ? "" : "s");
    for (int i = 0; i < d->ngpus && off < cap; i++) { /* runs of one name as "N x NAME" */
        int j = i;
        while (j + 1 < d->ngpus && !strcmp(d->gpus[j + 1], d->gpus[i])) j++;
        if (j > i) off += (size_t)snprintf(buf + off, cap - off, "%s %d x %s", i ? "," : "", j - i + 1, d->gpus[i]);
        else off += (size_t)snprintf(buf + off, cap - off, "%s %s", i ? "," : "", d->gpus[i]);
        i = j;
    }
}
