/* The devices a worker reports in its hello (ff_devices_probe, workers/devices.c):
 *   - the cores: the machine's online ones, and those its affinity allows (a Slurm task's
 *     binding), which a narrowed mask narrows;
 *   - the GPUs through the CUDA driver, dlopen'ed: with a stand-in driver
 *     (tests/runtime/fake_libcuda.c) their names in order, CUDA_VISIBLE_DEVICES applied, and
 *     none, with the reason, when the driver lists no device or is not there at all. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/worker.h"
#include "tests/test_util.h"

int main(void) {
    ff_devices d;
    char why[160];

    /* cores */
    setenv("FF_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    ff_devices_probe(&d, why, sizeof why);
    cpu_set_t set;
    REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
    CHECK_EQ_INT(d.cores, sysconf(_SC_NPROCESSORS_ONLN));
    CHECK_EQ_INT(d.cpus, CPU_COUNT(&set));
    CHECK_EQ_INT(d.ngpus, 0);
    CHECK_STR_CONTAINS(why, "no CUDA driver (/nonexistent/libcuda.so.1 not found)");
    int first = -1;
    for (int i = 0; i < CPU_SETSIZE && first < 0; i++)
        if (CPU_ISSET(i, &set)) first = i;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    ff_devices_probe(&d, why, sizeof why);
    CHECK_EQ_INT(d.cpus, 1);
    CHECK_EQ_INT(d.cores, sysconf(_SC_NPROCESSORS_ONLN));
    REQUIRE(sched_setaffinity(0, sizeof set, &set) == 0);

    /* GPUs through the stand-in driver */
    setenv("FF_LIBCUDA", FF_FAKE_LIBCUDA, 1);
    setenv("FAKE_CUDA_GPUS", "NVIDIA H200,NVIDIA H200,NVIDIA A100-SXM4-80GB", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    ff_devices_probe(&d, why, sizeof why);
    CHECK_EQ_INT(d.ngpus, 3);
    CHECK(!strcmp(d.gpus[0], "NVIDIA H200") && !strcmp(d.gpus[2], "NVIDIA A100-SXM4-80GB"));
    CHECK_EQ_INT(why[0], 0);
    char text[512];
    d.cores = d.cpus = 8;
    ff_devices_describe(&d, text, sizeof text);
    CHECK_STR_CONTAINS(text, "8 cores, 3 GPUs: 2 x NVIDIA H200, NVIDIA A100-SXM4-80GB");
    setenv("CUDA_VISIBLE_DEVICES", "2", 1); /* a task bound to the third */
    ff_devices_probe(&d, why, sizeof why);
    CHECK_EQ_INT(d.ngpus, 1);
    CHECK(!strcmp(d.gpus[0], "NVIDIA A100-SXM4-80GB"));
    setenv("CUDA_VISIBLE_DEVICES", "", 1); /* none visible */
    ff_devices_probe(&d, why, sizeof why);
    CHECK_EQ_INT(d.ngpus, 0);
    CHECK_STR_CONTAINS(why, "the CUDA driver lists no device (error 100)");
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("FAKE_CUDA_GPUS", "", 1); /* a driver without devices */
    ff_devices_probe(&d, why, sizeof why);
    CHECK_EQ_INT(d.ngpus, 0);
    CHECK_STR_CONTAINS(why, "error 100");
    /* more than a hello carries: the first FF_MSG_MAX_GPUS */
    char many[4096] = "";
    for (int i = 0; i < FF_MSG_MAX_GPUS + 4; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%sG%d", i ? "," : "", i);
    setenv("FAKE_CUDA_GPUS", many, 1);
    ff_devices_probe(&d, why, sizeof why);
    CHECK_EQ_INT(d.ngpus, FF_MSG_MAX_GPUS);
    CHECK(!strcmp(d.gpus[FF_MSG_MAX_GPUS - 1], "G15"));
    TEST_MAIN_END();
}
