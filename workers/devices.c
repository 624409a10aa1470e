/* What a worker reports of its machine in its hello (ff_devices, include/fuseflow/msgs.h):
 * the online cores, the cores its affinity mask allows (a Slurm task's CPU binding), and the
 * GPUs the CUDA driver lists. The driver is dlopen'ed (libcuda.so.1, or FF_LIBCUDA) so that
 * the same binary runs on machines without one; its device order is CUDA's, with
 * CUDA_VISIBLE_DEVICES applied (what a worker would drive), which NVML's is not.
 * This file reports; it does not pick, open or drive a device. */
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/worker.h"

/* the few driver entry points used, as cuda.h declares them (CUresult is an int enum,
 * CUdevice an int) */
typedef int (*cu_init_fn)(unsigned flags);
typedef int (*cu_count_fn)(int *count);
typedef int (*cu_get_fn)(int *dev, int ordinal);
typedef int (*cu_name_fn)(char *name, int len, int dev);

static void probe_gpus(ff_devices *d, char *why, size_t cap) {
    const char *lib = getenv("FF_LIBCUDA");
    if (!lib || !lib[0]) lib = "libcuda.so.1";
    /* kept loaded: after cuInit the driver has threads of its own, and unloading it under
     * them is not safe */
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, cap, "no CUDA driver (%s not found)", lib);
        return;
    }
    cu_init_fn init = (cu_init_fn)dlsym(h, "cuInit");
    cu_count_fn count = (cu_count_fn)dlsym(h, "cuDeviceGetCount");
    cu_get_fn get = (cu_get_fn)dlsym(h, "cuDeviceGet");
    cu_name_fn name = (cu_name_fn)dlsym(h, "cuDeviceGetName");
    int n = 0, rc;
    if (!init || !count || !get || !name) {
        snprintf(why, cap, "%s lacks the CUDA driver API", lib);
        return;
    }
    if ((rc = init(0)) != 0 || (rc = count(&n)) != 0) { /* 100: CUDA_ERROR_NO_DEVICE */
        snprintf(why, cap, "the CUDA driver lists no device (error %d)", rc);
        return;
    }
    if (n == 0) snprintf(why, cap, "the CUDA driver lists no device");
    for (int i = 0; i < n && d->ngpus < FF_MSG_MAX_GPUS; i++) {
        int dev;
        char *s = d->gpus[d->ngpus];
        if (get(&dev, i) != 0 || name(s, FF_MSG_NAME_MAX, dev) != 0) snprintf(s, FF_MSG_NAME_MAX, "GPU %d", i);
        s[FF_MSG_NAME_MAX - 1] = 0;
        if (!s[0]) snprintf(s, FF_MSG_NAME_MAX, "GPU %d", i);
        d->ngpus++;
    }
}

void ff_devices_probe(ff_devices *d, char *why, size_t cap) {
    memset(d, 0, sizeof *d);
    d->local_index = -1;
    if (cap) why[0] = 0;
    long on = sysconf(_SC_NPROCESSORS_ONLN);
    d->cores = on > 0 ? (uint32_t)on : 1;
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    d->cpus = n > 0 ? (uint32_t)n : d->cores;
    probe_gpus(d, why, cap);
}
