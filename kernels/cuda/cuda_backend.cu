/* The CUDA backend: device memory (cudaMalloc), one CUDA stream per ff_stream, matrix
 * products through cuBLAS, and plain kernels for the elementwise and row-wise entries of the
 * table (embedding, RMSNorm, RoPE, bias, SwiGLU, rows, vectors, AdamW, the sum of squares).
 * Attention, the logits kernels and sampling are in cuda_attention.cu (and the tensor-core
 * training attention in cuda_attention_tc.cu).
 *
 * Numbers: every tensor the interface names is fp32 (include/fuseflow/kernels.h), so the
 * parameters, gradients and AdamW state are fp32 masters by construction. ff_gemm converts
 * both operands to bf16 in the stream's scratch and multiplies them with fp32 accumulation by
 * default (FF_CUDA_MATH=bf16; the models then hold bf16 copies and activations, docs/model.md
 * "bf16 products"), or multiplies fp32 operands with TF32 tensor cores (FF_CUDA_MATH=tf32), or
 * in exact fp32 (FF_CUDA_MATH=fp32). Every other kernel computes in
 * fp32. Results differ from the CPU backend's by rounding only (tests/kernels/
 * test_cuda_backend.c states the tolerances).
 *
 * Reductions over rows (weight gradients of RMSNorm, bias, embedding) are split into fixed
 * chunks summed in a fixed order, so they do not depend on timing (no atomics), as the CPU
 * backend's.
 *
 * Streams: ff_stream_new makes a CUDA stream (cudaStreamCreate). A new buffer is zero-filled on
 * a non-blocking stream of the backend's own and waited for before ff_buffer_new returns, so
 * the fill is done before any use, and nothing touches the legacy default stream: a legacy-
 * stream call from one thread would break another thread's graph capture on a blocking stream
 * (cudaErrorStreamCaptureImplicit). Kernels are enqueued and return; ff_memcpy_d2h and ff_sumsq
 * wait for their stream, as the interface says. h2d returns once CUDA has staged the
 * pageable source (cudaMemcpyAsync's rule for pageable memory), so the source is reusable.
 *
 * cuBLAS is loaded at run time (dlopen, below), not linked.
 *
 * Graphs (ff_stream_capture_begin): CUDA stream capture, instantiated once, replayed with
 * cudaGraphLaunch; the stream's scratch is kept while graphs captured with it are alive.
 *
 * Not here: cuBLASLt epilogues, bf16 storage of activations, a memory pool
 * (allocation happens when a model or its workspace grows, not per step). None of this file
 * has run on a GPU yet (docs/cuda.md). */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <dlfcn.h>
#include <pthread.h>

#include "kernels/cuda/cuda_internal.h"

extern "C" {
#include "fuseflow/util.h"
}

/* ---- cuBLAS, loaded when the first CUDA backend is made ---------------------------------------- */

/* cuBLAS is opened with dlopen rather than linked: its libraries are hundreds of MiB, and
 * linked, every fuseflow process paged in part of them, CPU-only runs too (a CPU generate
 * peaked at 259 MiB against tests/cli/test_memory.sh's 138 MiB). Only the seven functions
 * used here. */
typedef struct blas_api {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_workspace)(cublasHandle_t, void *, size_t);
    cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    const char *(*status_string)(cublasStatus_t);
} blas_api;
static blas_api blas;
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;

#define FF_STR2(x) #x
#define FF_STR(x) FF_STR2(x)
#define CUBLAS_SONAME "libcublas.so." FF_STR(CUBLAS_VER_MAJOR)

/* 0, or -1 + error naming the library and where it was looked for. */
static int load_blas(void) {
#ifdef FF_CUDA_EMU /* the emulator's cuBLAS (kernels/cuda/emu/cuda_emu.cpp) */
    blas_api e = {ff_emu_cublasCreate,      ff_emu_cublasDestroy, ff_emu_cublasSetStream,      ff_emu_cublasSetWorkspace,
                  ff_emu_cublasSetMathMode, ff_emu_cublasGemmEx,  ff_emu_cublasGetStatusString};
    pthread_mutex_lock(&blas_mu);
    blas = e;
    pthread_mutex_unlock(&blas_mu);
    return 0;
#endif
    pthread_mutex_lock(&blas_mu);
    if (blas.gemm_ex) {
        pthread_mutex_unlock(&blas_mu);
        return 0;
    }
    /* the soname through the usual search, then beside libcudart, then the toolkit's folder */
    char beside[4096] = "";
    Dl_info di;
    if (dladdr((const void *)cudaGetDeviceCount, &di) && di.dli_fname) {
        snprintf(beside, sizeof beside, "%s", di.dli_fname);
        char *slash = strrchr(beside, '/');
        if (slash) snprintf(slash + 1, sizeof beside - (size_t)(slash + 1 - beside), "%s", CUBLAS_SONAME);
        else beside[0] = '\0';
    }
    const char *tries[] = {CUBLAS_SONAME, beside, "/usr/local/cuda/lib64/" CUBLAS_SONAME, "libcublas.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof tries / sizeof tries[0] && !h; i++)
        if (tries[i][0]) h = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        pthread_mutex_unlock(&blas_mu);
        return ff_error_set("cuda backend", "install cuBLAS (the CUDA toolkit's libcublas) or add its folder to LD_LIBRARY_PATH",
                            "cannot load %s (also tried beside libcudart and /usr/local/cuda/lib64): %s", CUBLAS_SONAME,
                            dlerror());
    }
    blas_api b;
    *(void **)&b.create = dlsym(h, "cublasCreate_v2");
    *(void **)&b.destroy = dlsym(h, "cublasDestroy_v2");
    *(void **)&b.set_stream = dlsym(h, "cublasSetStream_v2");
    *(void **)&b.set_workspace = dlsym(h, "cublasSetWorkspace_v2");
    *(void **)&b.set_math_mode = dlsym(h, "cublasSetMathMode");
    *(void **)&b.gemm_ex = dlsym(h, "cublasGemmEx");
    *(void **)&b.status_string = dlsym(h, "cublasGetStatusString");
    if (!b.create || !b.destroy || !b.set_stream || !b.set_workspace || !b.set_math_mode || !b.gemm_ex || !b.status_string) {
        pthread_mutex_unlock(&blas_mu);
        return ff_error_set("cuda backend", "install the cuBLAS of the CUDA toolkit fuseflow was built with",
                            "%s lacks a function fuseflow uses (cublasCreate_v2, cublasGemmEx, ...)", CUBLAS_SONAME);
    }
    blas = b; /* gemm_ex last of all set: the check above under the lock */
    pthread_mutex_unlock(&blas_mu);
    return 0;
}

/* ---- errors, device, scratch ------------------------------------------------------------------ */

enum { BLAS_WS_BYTES = 32 << 20 }; /* cuBLAS's workspace on a stream (blas_on) */

static int cuda_fail(cudaError_t e, const char *what, const char *hint) {
    cudaGetLastError(); /* a recoverable error stays set otherwise, and the next launch check would report it as its own */
    return ff_error_set("cuda backend", hint, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void ff_cuda_use_device(const ff_stream *s) {
    int cur = -1, want = CI(s)->device;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != want) cudaSetDevice(want);
}

static void use_device_of(ff_backend *be) {
    int cur = -1, want = ((cuda_impl *)be->impl)->device;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != want) cudaSetDevice(want);
}

void ff_cuda_check_launch(ff_stream *s, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return;
    cuda_fail(e, kernel, "a kernel could not be launched; run with CUDA_LAUNCH_BLOCKING=1 to see the first failure");
    ff_stream_fail(s);
}

static int64_t cuda_mem_free(ff_backend *be) {
    use_device_of(be);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return (int64_t)free_bytes;
}

/* What an out-of-memory error adds: "cuda:0: fuseflow holds 75.2 GiB of its 79.6 GiB, 1.1 GiB
 * free" (the rest is other processes' and the CUDA context's). */
static const char *device_held(ff_backend *be, char *out, size_t cap) {
    ff_backend_memory m;
    ff_backend_memory_of(be, &m);
    char a[32], b[32], c[32];
    const int64_t free_bytes = cuda_mem_free(be);
    if (free_bytes < 0 || m.capacity <= 0) {
        snprintf(out, cap, "%s: fuseflow holds %s", be->name, ff_fmt_bytes((uint64_t)m.in_use, a, sizeof a));
        return out;
    }
    snprintf(out, cap, "%s: fuseflow holds %s of its %s, %s free", be->name, ff_fmt_bytes((uint64_t)m.in_use, a, sizeof a),
             ff_fmt_bytes((uint64_t)m.capacity, b, sizeof b), ff_fmt_bytes((uint64_t)free_bytes, c, sizeof c));
    return out;
}

void *ff_cuda_scratch(ff_stream *s, size_t bytes) {
    cuda_stream *cs = (cuda_stream *)s->impl;
    if (bytes <= cs->scratch_cap) return cs->scratch;
    if (cs->capturing) { /* growing allocates and waits: neither can be in a graph */
        ff_error_set("cuda backend", "run the same work once before capturing it, so that the scratch has its size",
                     "kernel scratch must grow to %zu bytes during a graph capture", bytes);
        ff_stream_fail(s);
        return NULL;
    }
    if (cs->graphs > 0 && cs->scratch) { /* a graph replays kernels that use the old block */
        void **r = (void **)ff_realloc(cs->retired, (size_t)(cs->n_retired + 1) * sizeof *r);
        if (!r) {
            ff_stream_fail(s);
            return NULL;
        }
        cs->retired = r;
        cs->retired[cs->n_retired++] = cs->scratch;
        cs->retired_bytes += cs->scratch_cap;
    } else if (cs->scratch) {
        cudaStreamSynchronize(cs->st); /* queued kernels may still read the old block */
        cudaFree(cs->scratch);
        ff_backend_count_bytes(s->be, -(int64_t)cs->scratch_cap);
    }
    cs->scratch = NULL;
    cs->scratch_cap = 0;
    size_t want = bytes < 1u << 20 ? 1u << 20 : bytes;
    cudaError_t e = cudaMalloc(&cs->scratch, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cs->scratch = NULL;
        char held[160], wb[32];
        ff_error_set("cuda backend", "use smaller batches (fewer sequences or tokens)",
                     "out of device memory for %s of kernel scratch (%s; %s)", ff_fmt_bytes((uint64_t)want, wb, sizeof wb),
                     cudaGetErrorString(e), device_held(s->be, held, sizeof held));
        ff_stream_fail(s);
        return NULL;
    }
    cs->scratch_cap = want;
    ff_backend_count_bytes(s->be, (int64_t)want);
    return cs->scratch;
}

/* ---- memory and streams ----------------------------------------------------------------------- */

static int cuda_alloc(ff_backend *be, size_t bytes, void **data) {
    use_device_of(be);
    *data = NULL;
    if (bytes == 0) return 0;
    cudaError_t e = cudaMalloc(data, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear it: out of memory is recoverable */
        *data = NULL;
        char held[160], want[32];
        return ff_error_set("cuda backend", "use a smaller model or batch, or a GPU with more memory",
                            "out of device memory allocating %s (%s; %s)", ff_fmt_bytes((uint64_t)bytes, want, sizeof want),
                            cudaGetErrorString(e), device_held(be, held, sizeof held));
    }
    cudaStream_t fill = ((cuda_impl *)be->impl)->fill;
    e = cudaMemsetAsync(*data, 0, bytes, fill);
    if (e == cudaSuccess) e = cudaStreamSynchronize(fill); /* done before any stream's use */
    if (e != cudaSuccess) {
        cudaFree(*data);
        *data = NULL;
        return cuda_fail(e, "zero-filling a new buffer", "check the device with nvidia-smi");
    }
    return 0;
}
static void cuda_free(ff_backend *be, void *data) {
    if (!data) return;
    use_device_of(be);
    cudaFree(data); /* waits for the device: kernels still reading the buffer finish first */
}
static char *addr(ff_dptr p) { return (char *)p.buf->data + p.off; }

static void copy_check(ff_stream *s, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    cuda_fail(e, what, "check the device with nvidia-smi; a kernel before the copy may have failed");
    ff_stream_fail(s);
}
static void cuda_h2d(ff_stream *s, ff_dptr dst, const void *src, size_t n) {
    ff_cuda_use_device(s);
    copy_check(s, cudaMemcpyAsync(addr(dst), src, n, cudaMemcpyHostToDevice, CS(s)), "host to device copy");
}
static void cuda_d2h(ff_stream *s, void *dst, ff_dptr src, size_t n) {
    ff_cuda_use_device(s);
    copy_check(s, cudaMemcpyAsync(dst, addr(src), n, cudaMemcpyDeviceToHost, CS(s)), "device to host copy");
    copy_check(s, cudaStreamSynchronize(CS(s)), "waiting for a device to host copy");
}
static void cuda_d2d(ff_stream *s, ff_dptr dst, ff_dptr src, size_t n) {
    ff_cuda_use_device(s);
    char *d = addr(dst), *sr = addr(src);
    if (d == sr) return;
    if (d < sr + n && sr < d + n) { /* overlap: memmove semantics through the scratch */
        void *tmp = ff_cuda_scratch(s, n);
        if (!tmp) return;
        copy_check(s, cudaMemcpyAsync(tmp, sr, n, cudaMemcpyDeviceToDevice, CS(s)), "device copy");
        sr = (char *)tmp;
    }
    copy_check(s, cudaMemcpyAsync(d, sr, n, cudaMemcpyDeviceToDevice, CS(s)), "device copy");
}
static void cuda_d2d_2d(ff_stream *s, ff_dptr dst, size_t dpitch, ff_dptr src, size_t spitch, size_t width, size_t rows) {
    ff_cuda_use_device(s);
    copy_check(s, cudaMemcpy2DAsync(addr(dst), dpitch, addr(src), spitch, width, rows, cudaMemcpyDeviceToDevice, CS(s)),
               "device 2-D copy");
}
static void cuda_memset0(ff_stream *s, ff_dptr dst, size_t n) {
    ff_cuda_use_device(s);
    copy_check(s, cudaMemsetAsync(addr(dst), 0, n, CS(s)), "memset");
}
static int cuda_stream_init(ff_stream *s) {
    use_device_of(s->be);
    cuda_stream *cs = (cuda_stream *)ff_calloc(1, sizeof *cs);
    if (!cs) return -1;
    cudaError_t e = cudaStreamCreate(&cs->st);
    if (e != cudaSuccess) {
        free(cs);
        return cuda_fail(e, "creating a stream", "check the device with nvidia-smi");
    }
    s->impl = cs;
    return 0;
}
static void cuda_stream_fini(ff_stream *s) {
    cuda_stream *cs = (cuda_stream *)s->impl;
    if (!cs) return;
    ff_cuda_use_device(s);
    cudaStreamSynchronize(cs->st);
    cudaFree(cs->scratch);
    cudaFree(cs->blas_ws);
    for (int i = 0; i < cs->n_retired; i++) cudaFree(cs->retired[i]); /* graphs outlived their stream (a caller's bug) */
    free(cs->retired);
    ff_backend_count_bytes(s->be, -(int64_t)(cs->scratch_cap + cs->retired_bytes + (cs->blas_ws ? BLAS_WS_BYTES : 0)));
    cudaStreamDestroy(cs->st);
    free(cs);
    s->impl = NULL;
}
static int cuda_stream_sync(ff_stream *s) {
    ff_cuda_use_device(s);
    cudaError_t e = cudaStreamSynchronize(CS(s));
    if (e != cudaSuccess) return cuda_fail(e, "a kernel failed", "run with CUDA_LAUNCH_BLOCKING=1 to find which");
    return 0;
}
/* events: timing off (cheaper, and only ordering is asked of them) */
static int cuda_event_new(ff_backend *be, void **ev) {
    use_device_of(be);
    cudaEvent_t e;
    cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (rc != cudaSuccess) return cuda_fail(rc, "creating an event", "check the device with nvidia-smi");
    *ev = (void *)e;
    return 0;
}
static void cuda_event_free(ff_backend *be, void *ev) {
    use_device_of(be);
    cudaEventDestroy((cudaEvent_t)ev);
}
static void cuda_event_record(ff_stream *s, void *ev) {
    ff_cuda_use_device(s);
    copy_check(s, cudaEventRecord((cudaEvent_t)ev, CS(s)), "recording an event");
}
static void cuda_stream_wait(ff_stream *s, void *ev) {
    ff_cuda_use_device(s);
    copy_check(s, cudaStreamWaitEvent(CS(s), (cudaEvent_t)ev, 0), "waiting for an event");
}
static void *cuda_stream_native(ff_stream *s) { return (void *)CS(s); }

/* Graphs: CUDA stream capture in thread-local mode (this thread's unsafe calls, a sync or an
 * allocation, invalidate it; other threads' work, a collective thread's, does not). */
static int cuda_capture_begin(ff_stream *s) {
    ff_cuda_use_device(s);
    cuda_stream *cs = (cuda_stream *)s->impl;
    cudaError_t e = cudaStreamBeginCapture(cs->st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return cuda_fail(e, "beginning a graph capture", "check the device with nvidia-smi");
    cs->capturing = true;
    return 0;
}
static int cuda_capture_end(ff_stream *s, void **graph) {
    ff_cuda_use_device(s);
    cuda_stream *cs = (cuda_stream *)s->impl;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cs->st, &g);
    cs->capturing = false;
    *graph = NULL;
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return cuda_fail(e, "ending a graph capture",
                         "something in the capture could not be captured (a host copy, a wait, an allocation)");
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g); /* the executable graph keeps what it needs */
    if (e != cudaSuccess) return cuda_fail(e, "instantiating a captured graph", "check the device with nvidia-smi");
    cs->graphs++;
    *graph = (void *)x;
    return 0;
}
static bool cuda_capture_invalidated(ff_stream *s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(CS(s), &st) != cudaSuccess) {
        cudaGetLastError();
        return true; /* a capturing stream it cannot even ask about */
    }
    return st == cudaStreamCaptureStatusInvalidated;
}
static int cuda_graph_launch(ff_stream *s, void *graph) {
    ff_cuda_use_device(s);
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, CS(s));
    if (e != cudaSuccess) return cuda_fail(e, "launching a graph", "run with CUDA_LAUNCH_BLOCKING=1 to find which kernel failed");
    return 0;
}
static void cuda_graph_free(ff_stream *s, void *graph) {
    ff_cuda_use_device(s);
    cuda_stream *cs = (cuda_stream *)s->impl;
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
    if (--cs->graphs > 0 || !cs->n_retired) return;
    cudaStreamSynchronize(cs->st); /* a replay queued before may still use a retired block */
    for (int i = 0; i < cs->n_retired; i++) cudaFree(cs->retired[i]);
    cs->n_retired = 0;
    ff_backend_count_bytes(s->be, -(int64_t)cs->retired_bytes);
    cs->retired_bytes = 0;
}
static void cuda_destroy(ff_backend *be) {
    cuda_impl *c = (cuda_impl *)be->impl;
    if (c) {
        use_device_of(be);
        if (c->blas) blas.destroy(c->blas);
        if (c->fill) cudaStreamDestroy(c->fill);
        free(c);
    }
    free(be);
}

/* ---- launch shapes ---------------------------------------------------------------------------- */

enum { TPB = 256 };
static unsigned blocks_for(int64_t n, int per_block) {
    int64_t b = (n + per_block - 1) / per_block;
    if (b > 65535 * 32) b = 65535 * 32; /* grid-stride loops cover the rest */
    return (unsigned)(b < 1 ? 1 : b);
}

/* ---- matrix products -------------------------------------------------------------------------- */

static __global__ void k_scale_mat(float *C, int M, int N, int ldc, float beta) {
    int64_t n = (int64_t)M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float *c = C + (i / N) * ldc + i % N;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

/* dst [rows, cols] dense bf16 = src [rows, cols] ld fp32 */
static __global__ void k_to_bf16(const float *src, int ld, __nv_bfloat16 *dst, int rows, int cols) {
    int64_t n = (int64_t)rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[(i / cols) * ld + i % cols]);
}

/* cuBLAS's workspace on a stream: a block of the stream's own, made at its first product (the
 * size NVIDIA gives for Hopper), so that cuBLAS never allocates by itself, which a graph capture
 * could not hold; set again with the stream at every call (cublasSetStream puts back the default
 * pool). 0, or -1 with the stream failed: out of memory, or a first product inside a capture. */
static int blas_on(ff_stream *s) {
    cuda_impl *c = CI(s);
    cuda_stream *cs = (cuda_stream *)s->impl;
    if (!cs->blas_ws) {
        if (cs->capturing) {
            ff_error_set("cuda backend", "run the same work once before capturing it, so that cuBLAS has its workspace",
                         "a stream's first matrix product is inside a graph capture");
            ff_stream_fail(s);
            return -1;
        }
        cudaError_t e = cudaMalloc(&cs->blas_ws, BLAS_WS_BYTES);
        if (e != cudaSuccess) {
            cudaGetLastError(); /* out of memory is recoverable */
            cs->blas_ws = NULL;
            char held[160];
            ff_error_set("cuda backend", "use a smaller model or batch, or a GPU with more memory",
                         "out of device memory for cuBLAS's 32 MiB workspace of a stream (%s; %s)", cudaGetErrorString(e),
                         device_held(s->be, held, sizeof held));
            ff_stream_fail(s);
            return -1;
        }
        ff_backend_count_bytes(s->be, BLAS_WS_BYTES);
    }
    if (blas.set_stream(c->blas, CS(s)) != CUBLAS_STATUS_SUCCESS ||
        blas.set_workspace(c->blas, cs->blas_ws, BLAS_WS_BYTES) != CUBLAS_STATUS_SUCCESS) {
        ff_error_set("cuda backend", "check the device with nvidia-smi", "cuBLAS refused the stream or its workspace");
        ff_stream_fail(s);
        return -1;
    }
    return 0;
}

static void blas_check(ff_stream *s, cublasStatus_t st, int M, int N, int K) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    ff_error_set("cuda backend", "check the shapes and the device (nvidia-smi)", "cuBLAS gemm %dx%dx%d failed: %s", M, N,
                 K, blas.status_string(st));
    ff_stream_fail(s);
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets the operands
 * swapped, each with its own transpose flag, m = N and n = M. */

/* The bf16 product (ff_gemm_bf16, and ff_gemm under FF_CUDA_MATH=bf16): an operand stored bf16
 * goes to cuBLAS as it is; an fp32 one is rounded into a dense bf16 copy in the stream's scratch
 * (A stored [M, K] or [K, M], B [K, N] or [N, K]); fp32 accumulation and C. */
static void gemm16(ff_stream *s, const char *what, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A,
                   bool a16, int lda, ff_dptr B, bool b16, int ldb, float beta, ff_dptr C, bool c16, int ldc) {
    ff_cuda_use_device(s);
    cuda_impl *c = CI(s);
    assert(!c16 || (K > 0 && alpha == 1.0f && beta == 0.0f)); /* ff_gemm_bf16_out */
    if (K == 0) {
        FF_LAUNCH(k_scale_mat, blocks_for((int64_t)M * N, TPB), TPB, 0, CS(s), F(C), M, N, ldc, beta);
        ff_cuda_check_launch(s, what);
        return;
    }
    const int ar = ta == FF_TRANS ? K : M, ac = ta == FF_TRANS ? M : K;
    const int br = tb == FF_TRANS ? N : K, bc = tb == FF_TRANS ? K : N;
    const size_t na = a16 ? 0 : (size_t)ar * ac, nb = b16 ? 0 : (size_t)br * bc;
    const void *pa = F(A), *pb = F(B);
    int la = lda, lb = ldb;
    if (na + nb) {
        __nv_bfloat16 *ws = (__nv_bfloat16 *)ff_cuda_scratch(s, (na + nb) * sizeof(__nv_bfloat16) + 256);
        if (!ws) return;
        __nv_bfloat16 *a_16 = ws, *b_16 = ws + ((na + 127) / 128) * 128;
        if (na) {
            FF_LAUNCH(k_to_bf16, blocks_for((int64_t)na, TPB), TPB, 0, CS(s), F(A), lda, a_16, ar, ac);
            pa = a_16;
            la = ac;
        }
        if (nb) {
            FF_LAUNCH(k_to_bf16, blocks_for((int64_t)nb, TPB), TPB, 0, CS(s), F(B), ldb, b_16, br, bc);
            pb = b_16;
            lb = bc;
        }
        ff_cuda_check_launch(s, what);
    }
    if (blas_on(s)) return;
    const cublasOperation_t oa = ta == FF_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb == FF_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
    blas_check(s,
               blas.gemm_ex(c->blas, ob, oa, N, M, K, &alpha, pb, CUDA_R_16BF, lb, pa, CUDA_R_16BF, la, &beta, F(C),
                            c16 ? CUDA_R_16BF : CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               M, N, K);
}

static void cuda_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, int lda,
                      ff_dptr B, int ldb, float beta, ff_dptr C, int ldc) {
    cuda_impl *c = CI(s);
    if (c->math == CUDA_MATH_BF16) {
        gemm16(s, "gemm (bf16)", ta, tb, M, N, K, alpha, A, false, lda, B, false, ldb, beta, C, false, ldc);
        return;
    }
    ff_cuda_use_device(s);
    if (K == 0) {
        FF_LAUNCH(k_scale_mat, blocks_for((int64_t)M * N, TPB), TPB, 0, CS(s), F(C), M, N, ldc, beta);
        ff_cuda_check_launch(s, "gemm (K = 0)");
        return;
    }
    if (blas_on(s)) return;
    cublasOperation_t oa = ta == FF_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb == FF_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t ct = c->math == CUDA_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    blas_check(s,
               blas.gemm_ex(c->blas, ob, oa, N, M, K, &alpha, F(B), CUDA_R_32F, ldb, F(A), CUDA_R_32F, lda, &beta, F(C),
                            CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT),
               M, N, K);
}

static void cuda_gemm_bf16(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, bool a16,
                           int lda, ff_dptr B, bool b16, int ldb, float beta, ff_dptr C, bool c16, int ldc) {
    gemm16(s, c16 ? "gemm_bf16_out" : "gemm_bf16", ta, tb, M, N, K, alpha, A, a16, lda, B, b16, ldb, beta, C, c16, ldc);
}

/* bf16 weights (ff_gemm_bf16w): C = A W^T with W stored bf16 [N, K] ldw, A rounded. */
static void cuda_gemm_bf16w(ff_stream *s, int M, int N, int K, ff_dptr A, int lda, ff_dptr W, int ldw, float beta,
                            ff_dptr C, int ldc) {
    gemm16(s, "gemm_bf16w", FF_NO_TRANS, FF_TRANS, M, N, K, 1.0f, A, false, lda, W, true, ldw, beta, C, false, ldc);
}

static __global__ void k_cast_f32_bf16(const float *x, __nv_bfloat16 *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(x[i]); /* round to nearest even, as ff_bf16_of */
}
static __global__ void k_cast_bf16_f32(const __nv_bfloat16 *x, float *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}
static void cuda_cast_f32_bf16(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n) {
    ff_cuda_use_device(s);
    FF_LAUNCH(k_cast_f32_bf16, blocks_for(n, TPB), TPB, 0, CS(s), F(src), BF(dst), n);
    ff_cuda_check_launch(s, "cast_f32_bf16");
}
static void cuda_cast_bf16_f32(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n) {
    ff_cuda_use_device(s);
    FF_LAUNCH(k_cast_bf16_f32, blocks_for(n, TPB), TPB, 0, CS(s), BF(src), F(dst), n);
    ff_cuda_check_launch(s, "cast_bf16_f32");
}

/* ---- column reductions ------------------------------------------------------------------------ */

/* Weight gradients sum over rows: chunk k of RCHUNK rows writes part[k, c]; a second kernel
 * adds the chunks in order. Fixed chunks: the sum does not depend on scheduling. */
enum { RCHUNK = 64 };

typedef enum { COL_BIAS, COL_RMS } col_kind;

/* part [nchunks, N]: for COL_BIAS the rows of y [T, N] ld; for COL_RMS y * x * rstd[t]
 * (y = dout, x, both [T, N]). */
static __global__ void k_col_part(col_kind kind, const float *y, int ld, const float *x, const float *rstd, int T,
                                  int N, float *part) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= N) return;
    int t0 = k * RCHUNK, t1 = t0 + RCHUNK < T ? t0 + RCHUNK : T;
    float acc = 0.0f;
    for (int t = t0; t < t1; t++) {
        float v = y[(size_t)t * ld + c];
        if (kind == COL_RMS) v *= x[(size_t)t * N + c] * rstd[t];
        acc += v;
    }
    part[(size_t)k * N + c] = acc;
}
static __global__ void k_col_finish(const float *part, int nchunks, int N, float *out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < nchunks; k++) acc += part[(size_t)k * N + c];
    out[c] += acc;
}
static void col_reduce(ff_stream *s, col_kind kind, const float *y, int ld, const float *x, const float *rstd, int T,
                       int N, float *out, const char *what) {
    if (T <= 0 || N <= 0) return;
    int nchunks = (T + RCHUNK - 1) / RCHUNK;
    float *part = (float *)ff_cuda_scratch(s, (size_t)nchunks * N * sizeof(float));
    if (!part) return;
    dim3 g((N + TPB - 1) / TPB, nchunks);
    FF_LAUNCH(k_col_part, g, TPB, 0, CS(s), kind, y, ld, x, rstd, T, N, part);
    FF_LAUNCH(k_col_finish, (N + TPB - 1) / TPB, TPB, 0, CS(s), part, nchunks, N, out);
    ff_cuda_check_launch(s, what);
}

/* ---- embedding -------------------------------------------------------------------------------- */

static __global__ void k_embedding_fwd(const int32_t *tok, const float *table, float *out, int H) {
    int t = blockIdx.x, v = tok[t];
    float *o = out + (size_t)t * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) o[c] = v < 0 ? 0.0f : table[(size_t)v * H + c];
}
static void cuda_embedding_fwd(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_embedding_fwd, T, TPB, 0, CS(s), I32(tokens), F(table), F(out), H);
    ff_cuda_check_launch(s, "embedding_fwd");
}

static __global__ void k_embedding_fwd_bf16(const int32_t *tok, const __nv_bfloat16 *table, float *out, int H) {
    int t = blockIdx.x, v = tok[t];
    float *o = out + (size_t)t * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) o[c] = v < 0 ? 0.0f : __bfloat162float(table[(size_t)v * H + c]);
}
static void cuda_embedding_fwd_bf16(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_embedding_fwd_bf16, T, TPB, 0, CS(s), I32(tokens), BF(table), F(out), H);
    ff_cuda_check_launch(s, "embedding_fwd_bf16");
}

/* Deterministic without atomics: thread (column c, group g) owns the rows v with v % G == g
 * of column c and adds the tokens in order. */
enum { EMB_GROUPS = 32 };
static __global__ void k_embedding_bwd(const int32_t *tok, const float *dout, float *dtable, int T, int H) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
    if (c >= H) return;
    for (int t = 0; t < T; t++) {
        int v = tok[t];
        if (v >= 0 && v % EMB_GROUPS == g) dtable[(size_t)v * H + c] += dout[(size_t)t * H + c];
    }
}
static void cuda_embedding_bwd(ff_stream *s, ff_dptr tokens, ff_dptr dout, ff_dptr dtable, int T, int H) {
    if (T <= 0 || H <= 0) return;
    ff_cuda_use_device(s);
    dim3 g((H + TPB - 1) / TPB, EMB_GROUPS);
    FF_LAUNCH(k_embedding_bwd, g, TPB, 0, CS(s), I32(tokens), F(dout), F(dtable), T, H);
    ff_cuda_check_launch(s, "embedding_bwd");
}

/* ---- RMSNorm ---------------------------------------------------------------------------------- */

static __global__ void k_rmsnorm_fwd(const float *x, const float *w, float *out, float *rstd, int H, float eps) {
    __shared__ float red[32];
    int t = blockIdx.x;
    const float *xr = x + (size_t)t * H;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < H; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)H + eps);
    if (threadIdx.x == 0) rstd[t] = r;
    float *o = out + (size_t)t * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) o[c] = xr[c] * r * w[c];
}
static void cuda_rmsnorm_fwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, int T, int H, float eps) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_rmsnorm_fwd, T, TPB, 0, CS(s), F(x), F(w), F(out), F(rstd), H, eps);
    ff_cuda_check_launch(s, "rmsnorm_fwd");
}

/* dx += rstd * (w dout - x k), k = rstd^2 / H * sum(w dout x) */
static __global__ void k_rmsnorm_bwd_dx(const float *x, const float *w, const float *rstd, const float *dout, float *dx,
                                        int H) {
    __shared__ float red[32];
    int t = blockIdx.x;
    const float *xr = x + (size_t)t * H, *gr = dout + (size_t)t * H;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < H; c += blockDim.x) dot += w[c] * gr[c] * xr[c];
    dot = block_sum(dot, red);
    float r = rstd[t], k = dot * r * r / (float)H;
    float *d = dx + (size_t)t * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) d[c] += r * (w[c] * gr[c] - xr[c] * k);
}
static void cuda_rmsnorm_bwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr rstd, ff_dptr dout, ff_dptr dx, ff_dptr dw,
                             int T, int H) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_rmsnorm_bwd_dx, T, TPB, 0, CS(s), F(x), F(w), F(rstd), F(dout), F(dx), H);
    ff_cuda_check_launch(s, "rmsnorm_bwd");
    col_reduce(s, COL_RMS, F(dout), H, F(x), F(rstd), T, H, F(dw), "rmsnorm_bwd (dw)");
}

/* ---- rotary embedding, bias, SwiGLU ----------------------------------------------------------- */

static __global__ void k_rope(float *x, int ld, const int32_t *pos, const float *cs, const float *sn, int T,
                              int n_heads, int D, float sign) {
    int half = D / 2;
    int64_t n = (int64_t)T * n_heads * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int k = (int)(i % half), h = (int)((i / half) % n_heads);
        int64_t t = i / ((int64_t)half * n_heads);
        float *v = x + t * ld + (int64_t)h * D;
        size_t p = (size_t)pos[t] * half + k;
        float c = cs[p], si = sign * sn[p], a = v[k], b = v[k + half];
        v[k] = a * c - b * si;
        v[k + half] = b * c + a * si;
    }
}
static void cuda_rope(ff_stream *s, ff_dptr x, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads,
                      int D, int inverse) {
    int64_t n = (int64_t)T * n_heads * (D / 2);
    if (n <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_rope, blocks_for(n, TPB), TPB, 0, CS(s), F(x), ld, I32(pos), F(cos_t), F(sin_t), T, n_heads, D,
                                                 inverse ? -1.0f : 1.0f);
    ff_cuda_check_launch(s, "rope");
}

static __global__ void k_bias_add(float *x, int ld, const float *b, int T, int N) {
    int64_t n = (int64_t)T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[(i / N) * ld + i % N] += b[i % N];
}
static void cuda_bias_add(ff_stream *s, ff_dptr x, int ld, ff_dptr b, int T, int N) {
    if ((int64_t)T * N <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_bias_add, blocks_for((int64_t)T * N, TPB), TPB, 0, CS(s), F(x), ld, F(b), T, N);
    ff_cuda_check_launch(s, "bias_add");
}
static void cuda_bias_bwd(ff_stream *s, ff_dptr dy, int ld, ff_dptr db, int T, int N) {
    ff_cuda_use_device(s);
    col_reduce(s, COL_BIAS, F(dy), ld, NULL, NULL, T, N, F(db), "bias_bwd");
}

/* E: float, or __nv_bfloat16 (ff_swiglu_*_bf16: every tensor in bf16; fp32 math) */
template <typename E>
static __global__ void k_swiglu_fwd(const E *gu, E *h, int T, int inter) {
    int64_t n = (int64_t)T * inter;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / inter, c = i % inter;
        float g = widen(gu[t * 2 * inter + c]), u = widen(gu[t * 2 * inter + inter + c]);
        store_as(h + i, g / (1.0f + expf(-g)) * u);
    }
}
static void cuda_swiglu_fwd(ff_stream *s, ff_dptr gu, ff_dptr h, int T, int inter, bool b16) {
    if ((int64_t)T * inter <= 0) return;
    ff_cuda_use_device(s);
    if (b16)
        FF_LAUNCH(k_swiglu_fwd<__nv_bfloat16>, blocks_for((int64_t)T * inter, TPB), TPB, 0, CS(s), (const __nv_bfloat16 *)F(gu),
                  (__nv_bfloat16 *)F(h), T, inter);
    else FF_LAUNCH(k_swiglu_fwd<float>, blocks_for((int64_t)T * inter, TPB), TPB, 0, CS(s), F(gu), F(h), T, inter);
    ff_cuda_check_launch(s, "swiglu_fwd");
}
/* dgu may alias gu (fp32): each thread reads its g, u before writing its dg, du. */
template <typename E>
static __global__ void k_swiglu_bwd(const E *gu, const E *dh, E *dgu, int T, int inter) {
    int64_t n = (int64_t)T * inter;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / inter, c = i % inter, gi = t * 2 * inter + c;
        float g = widen(gu[gi]), u = widen(gu[gi + inter]), d = widen(dh[i]);
        float sg = 1.0f / (1.0f + expf(-g));
        store_as(dgu + gi, d * u * sg * (1.0f + g * (1.0f - sg)));
        store_as(dgu + gi + inter, d * (g * sg));
    }
}
static void cuda_swiglu_bwd(ff_stream *s, ff_dptr gu, ff_dptr dh, ff_dptr dgu, int T, int inter, bool b16) {
    if ((int64_t)T * inter <= 0) return;
    ff_cuda_use_device(s);
    if (b16)
        FF_LAUNCH(k_swiglu_bwd<__nv_bfloat16>, blocks_for((int64_t)T * inter, TPB), TPB, 0, CS(s),
                  (const __nv_bfloat16 *)F(gu), (const __nv_bfloat16 *)F(dh), (__nv_bfloat16 *)F(dgu), T, inter);
    else FF_LAUNCH(k_swiglu_bwd<float>, blocks_for((int64_t)T * inter, TPB), TPB, 0, CS(s), F(gu), F(dh), F(dgu), T, inter);
    ff_cuda_check_launch(s, "swiglu_bwd");
}

/* ---- rows ------------------------------------------------------------------------------------- */

/* dst[rows[r], :] = src[r, :] (scatter) or dst[r, :] = src[rows[r], :] (gather) */
static __global__ void k_rows(const float *src, int lds, float *dst, int ldd, const int32_t *rows, int N, int scatter) {
    int r = blockIdx.x;
    const float *sr = src + (size_t)(scatter ? r : rows[r]) * lds;
    float *dr = dst + (size_t)(scatter ? rows[r] : r) * ldd;
    for (int c = threadIdx.x; c < N; c += blockDim.x) dr[c] = sr[c];
}
static void cuda_scatter_rows(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_rows, T, TPB, 0, CS(s), F(src), lds, F(dst), N, I32(rows), N, 1);
    ff_cuda_check_launch(s, "scatter_rows");
}
static __global__ void k_scatter_bf16(const float *src, int lds, __nv_bfloat16 *dst, const int32_t *rows, int N) {
    int r = blockIdx.x;
    const float *sr = src + (size_t)r * lds;
    __nv_bfloat16 *dr = dst + (size_t)rows[r] * N;
    for (int c = threadIdx.x; c < N; c += blockDim.x) dr[c] = __float2bfloat16(sr[c]);
}
static void cuda_scatter_rows_bf16(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N) {
    if (T <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_scatter_bf16, T, TPB, 0, CS(s), F(src), lds, BF(dst), I32(rows), N);
    ff_cuda_check_launch(s, "scatter_rows_bf16");
}
static void cuda_gather_rows(ff_stream *s, ff_dptr src, ff_dptr rows, ff_dptr dst, int R, int N) {
    if (R <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_rows, R, TPB, 0, CS(s), F(src), N, F(dst), N, I32(rows), N, 0);
    ff_cuda_check_launch(s, "gather_rows");
}

/* ---- vectors and the optimizer ---------------------------------------------------------------- */

static __global__ void k_add(float *y, const float *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}
static void cuda_add(ff_stream *s, ff_dptr y, ff_dptr x, int64_t n) {
    if (n <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_add, blocks_for(n, TPB), TPB, 0, CS(s), F(y), F(x), n);
    ff_cuda_check_launch(s, "add");
}
static __global__ void k_scale(float *x, int64_t n, float alpha) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= alpha;
}
static void cuda_scale(ff_stream *s, ff_dptr x, int64_t n, float alpha) {
    if (n <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_scale, blocks_for(n, TPB), TPB, 0, CS(s), F(x), n, alpha);
    ff_cuda_check_launch(s, "scale");
}

/* A fixed grid of SUMSQ_BLOCKS partial sums in double, then one block adds them: the result
 * is the same on every run. */
enum { SUMSQ_BLOCKS = 1024 };
static __global__ void k_sumsq_part(const float *x, int64_t n, double *part) {
    __shared__ double red[TPB];
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc += (double)x[i] * (double)x[i];
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int o = TPB / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = red[0];
}
static __global__ void k_sumsq_finish(double *part, int nparts) {
    __shared__ double red[TPB];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += part[i];
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int o = TPB / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[0] = red[0];
}
static double cuda_sumsq(ff_stream *s, ff_dptr x, int64_t n) {
    if (n <= 0) return 0.0;
    ff_cuda_use_device(s);
    double *part = (double *)ff_cuda_scratch(s, SUMSQ_BLOCKS * sizeof(double));
    if (!part) return NAN;
    FF_LAUNCH(k_sumsq_part, SUMSQ_BLOCKS, TPB, 0, CS(s), F(x), n, part);
    FF_LAUNCH(k_sumsq_finish, 1, TPB, 0, CS(s), part, SUMSQ_BLOCKS);
    ff_cuda_check_launch(s, "sumsq");
    double r = NAN;
    cudaError_t e = cudaMemcpyAsync(&r, part, sizeof r, cudaMemcpyDeviceToHost, CS(s));
    if (e == cudaSuccess) e = cudaStreamSynchronize(CS(s));
    if (e != cudaSuccess) {
        copy_check(s, e, "sumsq result");
        return NAN;
    }
    return r;
}

/* The operation order of ff_cpu_adamw (torch.optim.AdamW's single-tensor path). */
static __global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float decay, float b1, float b2,
                               float step_size, float bc2_sqrt, float eps, float grad_scale) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i] * grad_scale;
        float pi = p[i] * decay;
        float mi = m[i] * b1 + (1.0f - b1) * gi;
        float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
}
static void cuda_adamw(ff_stream *s, ff_dptr param, ff_dptr grad, ff_dptr m, ff_dptr v, int64_t n, float lr, float b1,
                       float b2, float eps, float weight_decay, float bc1, float bc2, float grad_scale) {
    if (n <= 0) return;
    ff_cuda_use_device(s);
    FF_LAUNCH(k_adamw, blocks_for(n, TPB), TPB, 0, CS(s), F(param), F(grad), F(m), F(v), n, 1.0f - lr * weight_decay, b1, b2,
                                                  lr / bc1, sqrtf(bc2), eps, grad_scale);
    ff_cuda_check_launch(s, "adamw");
}

/* ---- the table -------------------------------------------------------------------------------- */

static ff_backend_ops make_ops(void) {
    ff_backend_ops o;
    memset(&o, 0, sizeof o);
    o.alloc = cuda_alloc;
    o.free = cuda_free;
    o.h2d = cuda_h2d;
    o.d2h = cuda_d2h;
    o.d2d = cuda_d2d;
    o.memset0 = cuda_memset0;
    o.mem_free = cuda_mem_free;
    o.d2d_2d = cuda_d2d_2d;
    o.stream_init = cuda_stream_init;
    o.stream_fini = cuda_stream_fini;
    o.stream_sync = cuda_stream_sync;
    o.event_new = cuda_event_new;
    o.event_free = cuda_event_free;
    o.event_record = cuda_event_record;
    o.stream_wait = cuda_stream_wait;
    o.stream_native = cuda_stream_native;
    o.capture_begin = cuda_capture_begin;
    o.capture_end = cuda_capture_end;
    o.graph_launch = cuda_graph_launch;
    o.capture_invalidated = cuda_capture_invalidated;
    o.graph_free = cuda_graph_free;
    o.destroy = cuda_destroy;
    o.gemm = cuda_gemm;
    o.gemm_bf16w = cuda_gemm_bf16w;
    o.gemm_bf16 = cuda_gemm_bf16;
    o.embedding_fwd_bf16 = cuda_embedding_fwd_bf16;
    o.cast_f32_bf16 = cuda_cast_f32_bf16;
    o.cast_bf16_f32 = cuda_cast_bf16_f32;
    o.embedding_fwd = cuda_embedding_fwd;
    o.embedding_bwd = cuda_embedding_bwd;
    o.rmsnorm_fwd = cuda_rmsnorm_fwd;
    o.rmsnorm_bwd = cuda_rmsnorm_bwd;
    o.rope = cuda_rope;
    o.bias_add = cuda_bias_add;
    o.bias_bwd = cuda_bias_bwd;
    o.swiglu_fwd = cuda_swiglu_fwd;
    o.swiglu_bwd = cuda_swiglu_bwd;
    o.attention_fwd = ff_cuda_attention_fwd;
    o.attention_bwd = ff_cuda_attention_bwd;
    o.attention_cached = ff_cuda_attention_cached;
    o.scatter_rows = cuda_scatter_rows;
    o.attention_cached_bf16 = ff_cuda_attention_cached_bf16;
    o.scatter_rows_bf16 = cuda_scatter_rows_bf16;
    o.gather_rows = cuda_gather_rows;
    o.logprob_fwd = ff_cuda_logprob_fwd;
    o.logprob_bwd = ff_cuda_logprob_bwd;
    o.add = cuda_add;
    o.scale = cuda_scale;
    o.sumsq = cuda_sumsq;
    o.adamw = cuda_adamw;
    o.sample = ff_cuda_sample;
    return o;
}
static const ff_backend_ops cuda_ops = make_ops();

/* FF_CUDA_MATH: bf16 (the default, the issue's "matrix products in bf16 with fp32
 * accumulation": a trainable model's weights' bf16 copy, its activations in bf16; what RL
 * frameworks train in), tf32 (fp32 operands on TF32 tensor cores) or fp32 (exact). */
static int math_from_env(int *math) {
    const char *m = getenv("FF_CUDA_MATH");
    if (!m || !*m || !strcmp(m, "bf16")) *math = CUDA_MATH_BF16;
    else if (!strcmp(m, "tf32")) *math = CUDA_MATH_TF32;
    else if (!strcmp(m, "fp32")) *math = CUDA_MATH_FP32;
    else return ff_error_set("FF_CUDA_MATH", "use bf16 (the default), tf32 or fp32", "unknown value '%s'", m);
    return 0;
}

/* FF_CUDA_ATTENTION: bf16 (tensor cores) unless the products are exact fp32, where the
 * attention is too. */
static int attention_from_env(int math, int *att) {
    const char *a = getenv("FF_CUDA_ATTENTION");
    if (!a || !*a) *att = math == CUDA_MATH_FP32 ? CUDA_ATT_FP32 : CUDA_ATT_BF16;
    else if (!strcmp(a, "fp32")) *att = CUDA_ATT_FP32;
    else if (!strcmp(a, "bf16")) *att = CUDA_ATT_BF16;
    else
        return ff_error_set("FF_CUDA_ATTENTION",
                            "use bf16 (tensor cores; the default unless FF_CUDA_MATH=fp32) or fp32 (CUDA cores, exact)",
                            "unknown value '%s'", a);
    return 0;
}

/* FF_CUDA_DECODE_SPLIT: 1 (the default) lets decoding's attention split its keys over blocks
 * (cuda_attention.cu, k_att_cached); 0 keeps one block a (token, head group), for comparison. */
static int split_from_env(int *split) {
    const char *v = getenv("FF_CUDA_DECODE_SPLIT");
    if (!v || !*v || !strcmp(v, "1")) *split = 1;
    else if (!strcmp(v, "0")) *split = 0;
    else return ff_error_set("FF_CUDA_DECODE_SPLIT", "use 1 (the default: split long contexts' keys) or 0", "unknown value '%s'", v);
    return 0;
}

extern "C" ff_backend *ff_backend_cuda_new(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        ff_error_set("cuda backend", "use the cpu backend (--device cpu, device: cpu), or run where nvidia-smi lists a GPU",
                     "no CUDA device: cudaGetDeviceCount says %s",
                     e != cudaSuccess ? cudaGetErrorString(e) : "there are 0 devices");
        return NULL;
    }
    if (device >= n) {
        ff_error_set("cuda backend", "pick a device below the count (CUDA_VISIBLE_DEVICES renumbers them)",
                     "device cuda:%d requested but %d CUDA device%s visible", device, n, n == 1 ? " is" : "s are");
        return NULL;
    }
    int math = 0, att = 0, split = 1;
    if (math_from_env(&math) || attention_from_env(math, &att) || split_from_env(&split)) return NULL;
    e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cuda_fail(e, "selecting the device", "check the device with nvidia-smi");
        return NULL;
    }
    ff_backend *be = (ff_backend *)ff_calloc(1, sizeof *be);
    cuda_impl *c = (cuda_impl *)ff_calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return NULL;
    }
    be->ops = &cuda_ops;
    be->impl = c;
    be->n_threads = 1;
    snprintf(be->name, sizeof be->name, "cuda:%d", device);
    c->device = device;
    c->math = math;
    be->bf16_products = math == CUDA_MATH_BF16;
    c->attention = att;
    c->decode_split = split;
    cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) be->mem_capacity = (int64_t)total_bytes;
    else cudaGetLastError(); /* unknown: the model's LM head keeps its host-memory budget */
    e = cudaStreamCreateWithFlags(&c->fill, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->fill = NULL;
        cuda_fail(e, "creating the zero-fill stream", "check the device with nvidia-smi");
        cuda_destroy(be);
        return NULL;
    }
    if (load_blas()) {
        cuda_destroy(be);
        return NULL;
    }
    cublasStatus_t bs = blas.create(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        ff_error_set("cuda backend", "check the CUDA installation (libcublas) and the device",
                     "cublasCreate failed: %s", blas.status_string(bs));
        cuda_destroy(be);
        return NULL;
    }
    if (math == CUDA_MATH_TF32) blas.set_math_mode(c->blas, CUBLAS_TF32_TENSOR_OP_MATH);
    if (ff_cuda_attention_init()) {
        cuda_destroy(be);
        return NULL;
    }
    if (ff_backend_finish_init(&be)) return NULL;
    return be;
}
