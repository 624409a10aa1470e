/* kernels/cuda/cuda_attention_tc.cu compiled for the emulator (cuda_emu.h): the stand-in headers
 * of include/ first, the CUDA source inside namespace ff_emu so that its functions do not clash with the
 * real backend's where both are linked. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "kernels/backend_impl.h"
}

#define ff_backend_cuda_new ff_backend_cuda_emu_new
namespace ff_emu {
#include "kernels/cuda/cuda_attention_tc.cu"
} // namespace ff_emu
