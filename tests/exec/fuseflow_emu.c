/* fuseflow_emu: the `fuseflow` command built with the CUDA emulator (kernels/cuda/emu/) behind
 * ff_backend_new("cuda[:N]") and ff_coll's own NCCL backend (workers/coll/nccl/nccl_backend.c)
 * built against the NCCL stand-in (tests/coll/nccl_emu/), for tests that run GPU roles end to
 * end on machines without a GPU (tests/exec/test_run_cuda_gpu.sh and test_run_cuda_coll_emu.sh
 * with FF_CUDA_EMU_BIN). cli/main.c is compiled into it with its `main` renamed to
 * ff_cli_main; the workers the controller starts are this same program (through FF_BIN), so
 * they compute on the emulated devices and their NCCL twins run nccl_backend.c on the stand-in.
 * Not installed: a test tool only. */
#undef main
#include "kernels/backend_impl.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "workers/coll/coll_internal.h"

int ff_cli_main(int argc, char **argv);
extern const coll_nccl_ops coll_nccl_emu_ops; /* nccl_backend.c built against tests/coll/nccl_emu/ */

int main(int argc, char **argv) {
    ff_backend_cuda_ctor = ff_backend_cuda_emu_new;
    coll_nccl = &coll_nccl_emu_ops;
    return ff_cli_main(argc, argv);
}
