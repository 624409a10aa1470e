/* What the CUDA tests (tests/kernels/test_cuda_backend.c, tests/model/test_model_cuda.c,
 * tests/kernels/test_attention_tc_emu.c) share: gpu_new(name) makes their GPU backend. Built with FF_TEST_CUDA_EMU (their copies
 * kernels/test_cuda_backend_emu, model/test_model_cuda_emu), it is the CUDA emulator's
 * (kernels/cuda/emu/): the same checks, on the CPU, of the kernels' and the host code's logic,
 * not of the device's speed or its streams' concurrency. Otherwise ff_backend_new. */
#ifndef FF_TESTS_CUDA_TEST_UTIL_H
#define FF_TESTS_CUDA_TEST_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"

#ifdef FF_TEST_CUDA_EMU
#include "kernels/cuda/emu/cuda_emu.h"
static inline ff_backend *gpu_new(const char *name) {
    const char *c = strchr(name, ':');
    return ff_backend_cuda_emu_new(c ? atoi(c + 1) : 0);
}
#else
#define gpu_new ff_backend_new
#endif

/* Fill be's device with buffers, 1 GiB at a time and halving down to 1 MiB, until under 1 MiB is
 * left: hold gets them (at most max); their count, max meaning it did not fill. The caller
 * destroys them. Takes the device's whole memory: for a small one (FF_CUDA_EMU_MEMORY) or a GPU. */
static inline int gpu_fill(ff_backend *be, ff_buffer **hold, int max) {
    int n = 0;
    for (size_t chunk = (size_t)1 << 30; chunk >= (1u << 20) && n < max;) {
        if ((hold[n] = ff_buffer_new(be, chunk)) != NULL) n++;
        else chunk /= 2;
    }
    return n;
}

#endif
