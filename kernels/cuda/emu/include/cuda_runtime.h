/* The CUDA emulator's stand-in for <cuda_runtime.h>: what the .cu files of kernels/cuda/ use of the CUDA
 * runtime and of device code, so that g++ compiles those files unchanged (FF_CUDA_EMU set, this
 * folder first on the include path) and they run on the CPU. kernels/cuda/emu/cuda_emu.cpp
 * implements it; docs/cuda.md "The emulator" says what it checks and what it cannot show.
 *
 * The model: emulated devices whose memory is host memory, tracked, so a copy whose direction
 * does not match its pointers is refused. Work on a stream is queued and runs only when
 * something waits for it (a stream sync, a copy to the host, an event another stream waits
 * for, a free), so a stream that reads another's results without waiting for its event reads
 * stale data, as on a device. A launch runs its blocks one after another; each CUDA thread of
 * a block is a fiber, and the highest runnable one always runs until it waits at a barrier, so
 * a thread that reads what a lower thread writes, or overwrites what a lower thread still
 * reads, without a barrier between, does so in the wrong order here (FF_CUDA_EMU_ORDER=low:
 * the lowest runs, for the other direction). Not a general CUDA: only the names fuseflow's
 * kernels use. */
#ifndef FF_CUDA_EMU_CUDA_RUNTIME_H
#define FF_CUDA_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#ifndef FF_CUDA_EMU
#error "kernels/cuda/emu/include is the emulator's: compile with -DFF_CUDA_EMU"
#endif

/* ---- qualifiers ------------------------------------------------------------------------------ */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* blocks run one at a time on one host thread: a static is the running block's shared memory */
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* vector types (the toolkit's vector_types.h), aligned as on the device, so that a vector
 * access through a misaligned pointer is undefined here too (the sanitizer build's UBSan reports
 * it) */
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

/* ---- runtime types --------------------------------------------------------------------------- */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorStreamCaptureImplicit = 906,
} cudaError_t;

typedef struct ff_emu_stream *cudaStream_t;
typedef struct ff_emu_event *cudaEvent_t;
typedef struct ff_emu_graph *cudaGraph_t;
typedef struct ff_emu_graph *cudaGraphExec_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1, cudaStreamCaptureStatusInvalidated = 2 };

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#define cudaEventDisableTiming 0x02u

/* ---- runtime API ----------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes); /* of the emulator's 80 GiB */
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
#define cudaStreamNonBlocking 0x01u
/* A non-blocking stream does not take part in the legacy stream's implicit ordering, so a
 * legacy-stream call does not conflict with its capture. */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s); /* the stream's work runs now: cudaSuccess, or its fault */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute a, int v);
/* Graphs: while a stream captures, its work is recorded, not queued; on the capturing thread a
 * call a capture cannot hold (a sync, an allocation or free, a copy to or from host memory on
 * the capturing stream, a legacy-stream call, an event) invalidates it, as in thread-local
 * mode: later work on the stream fails (cudaErrorStreamCaptureInvalidated) and
 * cudaStreamEndCapture then fails. A launched graph queues its recorded work again.
 * FF_CUDA_EMU_CAPTURE_FAIL=N[,M...] (or all) invalidates every capture on device N, M ... (on
 * any) from its start. */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x);

/* ---- device built-ins ------------------------------------------------------------------------ */

struct ff_emu_thread_ids {
    dim3 thread_idx, block_idx, block_dim, grid_dim;
};
/* the running fiber's ids (valid inside a kernel only) */
const ff_emu_thread_ids *ff_emu_ids(void);
#define threadIdx (ff_emu_ids()->thread_idx)
#define blockIdx (ff_emu_ids()->block_idx)
#define blockDim (ff_emu_ids()->block_dim)
#define gridDim (ff_emu_ids()->grid_dim)

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
/* lane `src` of the calling warp's value (8 bytes at most), after every lane gave its own */
uint64_t ff_emu_shfl(unsigned mask, uint64_t v, int src_lane, int xor_mask);
template <typename T>
static inline T ff_emu_shfl_t(unsigned mask, T v, int src, int xr) {
    static_assert(sizeof(T) <= 8, "shuffles of 8 bytes at most");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = ff_emu_shfl(mask, u, src, xr);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    (void)width;
    return ff_emu_shfl_t(mask, v, src, -1);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    (void)width;
    return ff_emu_shfl_t(mask, v, -1, lane_mask);
}
unsigned __reduce_max_sync(unsigned mask, unsigned v);
/* The warp-wide matrix instructions cuda_attention_tc.cu issues by inline assembly on the device
 * (its comment gives their register layouts), lane by lane: every lane of a whole warp gives its
 * part, then takes its own. ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: row is the lane's
 * row address (16-byte aligned, inside the block's dynamic shared memory, else a fault naming
 * it). mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with d as C and D: its sums in fp32
 * in k order, not the tensor cores' order. */
void ff_emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans);
void ff_emu_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

/* One host thread runs every fiber and fibers switch only at barriers: a read-modify-write is
 * atomic as it stands. */
template <typename T>
static inline T atomicMin(T *p, T v) {
    T o = *p;
    if (v < o) *p = v;
    return o;
}
template <typename T>
static inline T atomicMax(T *p, T v) {
    T o = *p;
    if (v > o) *p = v;
    return o;
}
template <typename T>
static inline T atomicAdd(T *p, T v) {
    T o = *p;
    *p = o + v;
    return o;
}

static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- launches -------------------------------------------------------------------------------- */

/* Queue body, to run once per thread of grid x block with `smem` bytes of dynamic shared memory
 * when stream s's turn comes; a bad configuration (block over 1024 threads, dynamic shared
 * memory over the kernel's limit, an empty grid) sets the error cudaGetLastError returns at
 * once, as a failed launch does. */
void ff_emu_launch(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   std::function<void()> body);
/* the running block's dynamic shared memory (128-byte aligned, starting as 0xff bytes) */
unsigned char *ff_emu_dyn_smem(void);
/* Host work queued on stream s, in its order (NULL: the legacy stream: after all queued work). */
void ff_emu_stream_enqueue(cudaStream_t s, std::function<void()> f);

/* The arguments are evaluated at the launch, as CUDA does, and kept by value until it runs. */
template <typename K, typename... A>
static inline void ff_emu_launch_args(const char *name, K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                      A... args) {
    ff_emu_launch(name, (const void *)kernel, grid, block, smem, s, [kernel, args...]() { kernel(args...); });
}
#define FF_LAUNCH(kernel, grid, block, smem, stream, ...) \
    ff_emu_launch_args(#kernel, kernel, dim3(grid), dim3(block), (size_t)(smem), (stream), __VA_ARGS__)
#define FF_DYN_SHARED(type, name) type *name = (type *)ff_emu_dyn_smem()

#endif
