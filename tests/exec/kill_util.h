/* Helpers of the tests that kill processes at chosen moments (test_run_kill.c,
 * test_faults.c). */
#ifndef FF_TEST_EXEC_KILL_UTIL_H
#define FF_TEST_EXEC_KILL_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

/* CPU time of a process, all its threads (ns, from schedstat: exact, unlike utime). */
static inline int64_t cpu_ns(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int64_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p2[128];
        snprintf(p2, sizeof p2, "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
        FILE *f = fopen(p2, "r");
        long long ns = 0;
        if (f && fscanf(f, "%lld", &ns) == 1) sum += ns;
        if (f) fclose(f);
    }
    closedir(d);
    return sum;
}

/* Until pid is idle (under 1 ms of CPU per 10 ms, five times running: it waits, in the
 * all-reduce for the stopped peer; its loop and poll timers still tick), at most 5 s. */
static inline void wait_idle(pid_t pid) {
    int64_t last = cpu_ns(pid);
    for (int i = 0, still = 0; i < 500 && still < 5; i++) {
        usleep(10000);
        int64_t now = cpu_ns(pid);
        still = now - last < 1000000 ? still + 1 : 0;
        last = now;
    }
}

#endif
