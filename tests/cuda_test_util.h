/* What the CUDA tests (tests/kernels/test_cuda_backend.c, tests/model/test_model_cuda.c) share:
 * gpu_new(name) makes their GPU backend. Built with FF_TEST_CUDA_EMU (their copies
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

#endif
