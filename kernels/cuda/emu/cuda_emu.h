/* The CUDA backend run by the emulator (kernels/cuda/emu/): the .cu files of kernels/cuda/
 * compiled by a C++ compiler against the stand-in headers of include/ and run on the CPU. For
 * tests only (the CUDA tests' emulator copies, tests/exec/fuseflow_emu.c, bench_cuda_emu): it
 * checks the backend's kernels and host logic, streams and events included, without a GPU; not
 * its speed (docs/cuda.md "The emulator"). */
#ifndef FF_KERNELS_CUDA_EMU_CUDA_EMU_H
#define FF_KERNELS_CUDA_EMU_CUDA_EMU_H

#include "fuseflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* As ff_backend_new("cuda:N"): FF_CUDA_MATH and FF_CUDA_ATTENTION read the same way; the
 * backend is named "cuda:N"; FF_CUDA_EMU_DEVICES devices exist (1 by default). NULL + error
 * otherwise. */
ff_backend *ff_backend_cuda_emu_new(int device);

/* Host work in an emulated stream's order, now: the stream's queued work runs (and what it
 * waits for), then fn(ctx), whose result this returns; -1 + error when queued work had failed
 * or the stream is not one. stream: the cudaStream_t of ff_stream_native (NULL: the legacy
 * stream, after everything queued). What the emulator's NCCL stand-in runs a collective with
 * (tests/exec/fuseflow_emu.c): at once, as NCCL would start it, so peers never wait on work an
 * emulated stream has not been asked for yet. */
int ff_emu_stream_run_host(void *stream, int (*fn)(void *), void *ctx);
/* 1 when [p, p + bytes) lies inside one emulated device allocation, else 0. */
int ff_emu_is_device(const void *p, size_t bytes);
/* fn(ctx) queued on an emulated stream, to run when its turn comes (with the stream's other work:
 * when something waits for it); fn owns ctx. NULL stream: at once, after everything queued. */
void ff_emu_stream_defer(void *stream, void (*fn)(void *), void *ctx);
/* 1 while the emulated stream captures a graph, 2 while that capture is invalidated (work on the
 * stream then fails), else 0. */
int ff_emu_stream_capturing(void *stream);
/* fn(ctx) as the stream's work: queued (run once), or, while the stream captures, recorded in
 * the graph and run at each of its replays, in its place among the graph's kernels (what NCCL
 * does with a collective enqueued during a capture). ctx is freed with free_ctx once nothing
 * holds it: the queue entry run, the last graph made from the capture destroyed. */
void ff_emu_stream_record(void *stream, void (*fn)(void *), void *ctx, void (*free_ctx)(void *));

#ifdef __cplusplus
}
#endif

#endif
