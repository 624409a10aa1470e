/* The CUDA emulator's runtime API for C files (tests/coll/nccl_emu/): what nccl_backend.c and
 * tests/coll/test_coll_nccl.c call of <cuda_runtime_api.h>, answered by the emulator
 * (kernels/cuda/emu/cuda_emu.cpp, its ff_emu_c_ functions) instead of libcudart, so that those
 * C files build unchanged against it and run on emulated devices. Each name is a macro onto an
 * ff_emu_c_ symbol: a program may link the real libcudart beside the emulator without a clash.
 * Not a general CUDA: only these names. */
#ifndef FF_NCCL_EMU_CUDA_RUNTIME_API_H
#define FF_NCCL_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int cudaError_t; /* the emulator's error codes (cudaError in its C++ header) */
#define cudaSuccess 0
#define cudaErrorNotReady 600
typedef struct ff_emu_stream *cudaStream_t; /* the emulator's streams */
enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3,
       cudaMemcpyDefault = 4 };

#define cudaGetDeviceCount ff_emu_c_cudaGetDeviceCount
#define cudaSetDevice ff_emu_c_cudaSetDevice
#define cudaMalloc ff_emu_c_cudaMalloc
#define cudaFree ff_emu_c_cudaFree
#define cudaMemcpy ff_emu_c_cudaMemcpy
#define cudaStreamCreate ff_emu_c_cudaStreamCreate
#define cudaStreamDestroy ff_emu_c_cudaStreamDestroy
#define cudaStreamQuery ff_emu_c_cudaStreamQuery
#define cudaGetErrorString ff_emu_c_cudaGetErrorString

cudaError_t ff_emu_c_cudaGetDeviceCount(int *n);
cudaError_t ff_emu_c_cudaSetDevice(int d);
cudaError_t ff_emu_c_cudaMalloc(void **p, size_t bytes);
cudaError_t ff_emu_c_cudaFree(void *p);
cudaError_t ff_emu_c_cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);
cudaError_t ff_emu_c_cudaStreamCreate(cudaStream_t *s);
cudaError_t ff_emu_c_cudaStreamDestroy(cudaStream_t s);
/* The emulator runs the stream's queued work now (nothing runs in the background), so the
 * answer is cudaSuccess, or the sticky fault of a failed kernel; never cudaErrorNotReady. */
cudaError_t ff_emu_c_cudaStreamQuery(cudaStream_t s);
const char *ff_emu_c_cudaGetErrorString(cudaError_t e);

#ifdef __cplusplus
}
#endif
#endif
