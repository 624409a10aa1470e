/* bench_cuda_emu: bench/bench_cuda.c with the CUDA emulator (kernels/cuda/emu/) behind
 * ff_backend_new("cuda"), so that tests/kernels/test_bench_cuda_emu.sh runs the GPU benchmark's
 * own code (its measurements, headlines and side-by-side attention) on machines without a GPU
 * before a GPU session spends its minutes on it. Its numbers mean nothing. */
#define main bench_cuda_main
#include "bench/bench_cuda.c"
#undef main
#include "kernels/backend_impl.h"
#include "kernels/cuda/emu/cuda_emu.h"

int main(int argc, char **argv) {
    ff_backend_cuda_ctor = ff_backend_cuda_emu_new;
    return bench_cuda_main(argc, argv);
}
