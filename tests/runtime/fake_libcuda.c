/* A stand-in for the CUDA driver (libcuda.so.1) with the four entry points ff_devices_probe
 * calls, so that its dlopen path is tested on machines without a GPU: FAKE_CUDA_GPUS lists the
 * devices' names, comma-separated, with CUDA_VISIBLE_DEVICES (indices) applied as the real
 * driver does; none listed: cuInit fails as the driver does without a device. Not a driver: no
 * contexts, no memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_DEVICE 100 /* CUDA_ERROR_NO_DEVICE */
#define MAX 32

static char names[MAX][64];
static int count;

static void load(void) { /* read at every cuInit, so that one test process tries several */
    char all[MAX][64];
    int n = 0;
    const char *s = getenv("FAKE_CUDA_GPUS");
    while (s && *s && n < MAX) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        snprintf(all[n++], sizeof all[0], "%.*s", (int)(len < 63 ? len : 63), s);
        s = e ? e + 1 : NULL;
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    count = 0;
    if (!vis) {
        for (int i = 0; i < n; i++) memcpy(names[count++], all[i], sizeof names[0]);
        return;
    }
    for (const char *p = vis; *p && count < MAX;) { /* the driver stops at the first bad index */
        char *end;
        long i = strtol(p, &end, 10);
        if (end == p || i < 0 || i >= n) break;
        memcpy(names[count++], all[i], sizeof names[0]);
        p = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
}

/* the driver's exports, as cuda.h declares them (the build hides symbols by default) */
#define EXPORT __attribute__((visibility("default")))
EXPORT int cuInit(unsigned flags);
EXPORT int cuDeviceGetCount(int *n);
EXPORT int cuDeviceGet(int *dev, int ordinal);
EXPORT int cuDeviceGetName(char *name, int len, int dev);

int cuInit(unsigned flags) {
    (void)flags;
    load();
    return count > 0 ? 0 : NO_DEVICE;
}
int cuDeviceGetCount(int *n) {
    *n = count;
    return 0;
}
int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= count) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}
int cuDeviceGetName(char *name, int len, int dev) {
    if (dev < 0 || dev >= count || len < 1) return 101;
    snprintf(name, (size_t)len, "%s", names[dev]);
    return 0;
}
