/* fuseflow_emu: the `fuseflow` command built with the CUDA emulator (kernels/cuda/emu/) behind
 * ff_backend_new("cuda[:N]"), for tests that run GPU roles end to end on machines without a GPU
 * (tests/exec/test_run_cuda_gpu.sh with FF_CUDA_EMU_BIN). cli/main.c is compiled into it with its
 * `main` renamed to ff_cli_main; the workers the controller starts are this same program, so
 * they compute on the emulated device too. Not installed: a test tool only. */
#undef main
#include "kernels/backend_impl.h"
#include "kernels/cuda/emu/cuda_emu.h"

int ff_cli_main(int argc, char **argv);

int main(int argc, char **argv) {
    ff_backend_cuda_ctor = ff_backend_cuda_emu_new;
    return ff_cli_main(argc, argv);
}
