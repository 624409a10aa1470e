/* The CUDA emulator's runtime: the CUDA runtime calls, launches and device built-ins that the
 * headers of kernels/cuda/emu/include/ declare, and the cuBLAS gemm, all on the CPU. With it,
 * the CUDA backend's own source (the .cu files of kernels/cuda/, compiled by g++ in the emu_
 * files) runs in tests on machines without a GPU and is checked against the CPU backend
 * (docs/cuda.md "The emulator").
 *
 * Launches: one at a time (a process-wide lock), blocks one after another, each CUDA thread a
 * fiber on its own guarded stack, all on the calling thread. The highest runnable thread always
 * runs, until it waits (even the last to arrive at a barrier yields), so a thread that races
 * ahead of lower ones without a barrier is seen doing so; FF_CUDA_EMU_ORDER=low runs the lowest,
 * for races with higher ones. __syncthreads and __syncwarp are barriers that count exited
 * threads as arrived (as the hardware does); shuffles go through a per-warp exchange between
 * two warp barriers, and reading a lane that exited is a fault. A block where every live
 * thread waits is a deadlock: the launch fails, naming the barrier.
 *
 * Errors: a bad launch configuration sets the error cudaGetLastError returns; a fault inside a
 * kernel (deadlock, an ldmatrix row out of place, a shuffle with a partial mask) is printed and
 * becomes sticky, as a device fault is: every later call returns cudaErrorLaunchFailure.
 * Memory copies check their direction against the tracked device allocations.
 *
 * Streams: each queues its work, which runs only when something waits for it (below), so a
 * missing event wait between streams shows as stale data. Not here: the device's rounding
 * order, speed, register and occupancy limits. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

extern "C" {
#include "fuseflow/error.h"
}

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

/* the emulated device: an H100-sized one (its memory: device_bytes) */
enum { EMU_SMS = 132, EMU_MAX_THREADS = 1024, EMU_SMEM_DEFAULT = 48 * 1024, EMU_SMEM_OPTIN = 232448 };
static const size_t EMU_STACK = 256 * 1024;

/* ---- errors ------------------------------------------------------------------------------------ */

static std::recursive_mutex emu_mu; /* every call: one launch or copy at a time */
static cudaError_t last_error = cudaSuccess, sticky = cudaSuccess;
static int current_device = 0;

static cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}
#define EMU_ENTER()                                     \
    std::lock_guard<std::recursive_mutex> emu_lock_(emu_mu); \
    if (sticky != cudaSuccess) return sticky

struct err_name {
    cudaError_t e;
    const char *name, *text;
};
static const err_name err_names[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure (the emulator printed why)"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
};
static const err_name *find_err(cudaError_t e) {
    for (const err_name &n : err_names)
        if (n.e == e) return &n;
    return NULL;
}
const char *cudaGetErrorString(cudaError_t e) {
    const err_name *n = find_err(e);
    return n ? n->text : "unknown error";
}
const char *cudaGetErrorName(cudaError_t e) {
    const err_name *n = find_err(e);
    return n ? n->name : "cudaErrorUnknown";
}
cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    cudaError_t e = sticky != cudaSuccess ? sticky : last_error;
    last_error = cudaSuccess;
    return e;
}

/* ---- device ------------------------------------------------------------------------------------ */

/* FF_CUDA_EMU_DEVICES (1 to 16, default 1) devices, all this process's memory: a label, so that
 * the workers of a run, each given cuda:N, find their device. */
static int device_count(void) {
    const char *e = getenv("FF_CUDA_EMU_DEVICES");
    int n = e && *e ? atoi(e) : 1;
    return n < 1 ? 1 : n > 16 ? 16 : n;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    EMU_ENTER();
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = current_device;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    if (a != cudaDevAttrMultiProcessorCount) return fail(cudaErrorInvalidValue);
    *v = EMU_SMS;
    return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------------------------ */

static std::map<uintptr_t, size_t> allocs; /* base -> bytes */
static size_t alloc_total;

/* The device's memory: 80 GiB, or FF_CUDA_EMU_MEMORY bytes (at least 1 MiB; for tests of what a
 * smaller GPU refuses). Read once. */
static size_t device_bytes(void) {
    static size_t n;
    if (!n) {
        const char *e = getenv("FF_CUDA_EMU_MEMORY");
        long long v = e && *e ? atoll(e) : 0;
        n = v >= (1 << 20) ? (size_t)v : (size_t)80 << 30;
    }
    return n;
}
/* What other processes hold of it: FF_CUDA_EMU_OTHERS bytes (0 by default; at most the device).
 * cudaMemGetInfo's free leaves it out, and allocations cannot have it. Read once. */
static size_t others_bytes(void) {
    static size_t n;
    static bool read;
    if (!read) {
        const char *e = getenv("FF_CUDA_EMU_OTHERS");
        long long v = e && *e ? atoll(e) : 0;
        n = v <= 0 ? 0 : (size_t)v < device_bytes() ? (size_t)v : device_bytes();
        read = true;
    }
    return n;
}

/* Is [p, p + n) inside one device allocation? */
static bool on_device(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second && (n > 0 || a < it->first + it->second);
}
/* Does [p, p + n) touch device memory at all? (a host range must not) */
static bool touches_device(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a + (n ? n - 1 : 0));
    if (it == allocs.begin()) return false;
    --it;
    return it->first + it->second > a;
}

/* ---- streams and events: work deferred until something waits for it -------------------------
 * Each stream keeps a queue of its work (kernels, copies, gemms, host work). Nothing runs until
 * something needs it: a stream synchronization, a copy to host memory, an event another stream
 * waits for (then the recording stream runs up to that record), a free or a legacy-stream call
 * (then every stream runs). So a stream that reads what another wrote without waiting for its
 * event reads what was there before, as a device racing would. */

struct emu_op {
    uint64_t seq;
    std::function<void()> run;    /* or, when wait_on is set, a wait */
    struct ff_emu_stream *wait_on;
    uint64_t wait_seq;
};
struct ff_emu_stream {
    int magic;
    std::deque<emu_op> q;
    uint64_t enq_seq, done_seq;
    bool nonblocking; /* cudaStreamNonBlocking: outside the legacy stream's implicit ordering */
    /* a graph capture: work recorded here instead of queued */
    bool capturing;
    std::thread::id capture_thread;
    cudaError_t capture_err; /* the capture was invalidated */
    std::vector<std::function<void()>> captured;
};
struct ff_emu_event {
    int magic;
    ff_emu_stream *s; /* the stream of the last record (NULL: none, or the legacy stream) */
    uint64_t seq;
};
enum { STREAM_MAGIC = 0x5743, EVENT_MAGIC = 0x4576 };
static std::vector<ff_emu_stream *> streams; /* live, in creation order */

static bool stream_ok(cudaStream_t s) { return !s || s->magic == STREAM_MAGIC; }

/* Run s's work up to and including op `seq` (waits first run what they wait for). */
static void run_until(ff_emu_stream *s, uint64_t seq) {
    while (s->done_seq < seq && !s->q.empty()) {
        emu_op op = std::move(s->q.front());
        s->q.pop_front();
        if (op.wait_on) {
            if (op.wait_on->magic == STREAM_MAGIC) run_until(op.wait_on, op.wait_seq);
        } else if (sticky == cudaSuccess) {
            op.run();
        }
        s->done_seq = op.seq;
    }
}
static void run_stream(ff_emu_stream *s) { run_until(s, s->enq_seq); }
static void run_all(void) {
    for (size_t i = 0; i < streams.size(); i++) run_stream(streams[i]);
}
/* Queue work on s (record it, while s captures); on the legacy stream (NULL), everything
 * before it runs, then it does. */
static void enqueue(cudaStream_t s, std::function<void()> f) {
    if (!s) {
        run_all();
        if (sticky == cudaSuccess) f();
        return;
    }
    if (s->capturing) {
        s->captured.push_back(std::move(f));
        return;
    }
    s->q.push_back(emu_op{++s->enq_seq, std::move(f), NULL, 0});
}

/* ---- graph captures ----
 * A call that a capture cannot hold, made on a thread that captures: on stream s (NULL: any
 * call, as a sync, an allocation or a legacy-stream call is), it invalidates the captures of
 * this thread and returns the error the call then returns (cudaSuccess: no capture concerned). */
static int n_capturing;
static cudaError_t capture_refuse(cudaStream_t s, cudaError_t err) {
    if (n_capturing == 0) return cudaSuccess;
    bool hit = false;
    for (ff_emu_stream *c : streams)
        if (c->capturing && c->capture_thread == std::this_thread::get_id() && (!s || c == s)) {
            if (c->capture_err == cudaSuccess) c->capture_err = cudaErrorStreamCaptureInvalidated;
            hit = true;
        }
    return hit ? fail(err) : cudaSuccess;
}
/* A legacy-stream call, from any thread: it would order itself after every blocking stream, and
 * a blocking stream that captures cannot be waited for, so its capture is invalidated and the
 * call fails (cudaErrorStreamCaptureImplicit), whichever thread captures. */
static cudaError_t legacy_refuse(void) {
    bool hit = false;
    for (ff_emu_stream *c : streams)
        if (c->capturing && !c->nonblocking) {
            if (c->capture_err == cudaSuccess) c->capture_err = cudaErrorStreamCaptureInvalidated;
            hit = true;
        }
    return hit ? fail(cudaErrorStreamCaptureImplicit) : capture_refuse(NULL, cudaErrorStreamCaptureImplicit);
}
#define CAPTURE_REFUSE(s, err)                          \
    do {                                                \
        cudaError_t ce_ = capture_refuse((s), (err));   \
        if (ce_ != cudaSuccess) return ce_;             \
    } while (0)
/* Work on a stream whose capture was invalidated fails, as CUDA's does, and is not recorded. */
static bool capture_broken(cudaStream_t s) { return s && s->capturing && s->capture_err != cudaSuccess; }
#define CAPTURE_BROKEN(s)                                                       \
    do {                                                                        \
        if (capture_broken(s)) return fail(cudaErrorStreamCaptureInvalidated); \
    } while (0)

/* FF_CUDA_EMU_CAPTURE_FAIL=N[,M...] (or all): every capture begun on device N, M ... (on any)
 * is invalidated at once, as if its first call were one a capture cannot hold (for tests of
 * failed captures). */
static bool capture_fails_here(void) {
    const char *e = getenv("FF_CUDA_EMU_CAPTURE_FAIL");
    if (!e || !*e) return false;
    if (!strcmp(e, "all")) return true;
    for (const char *p = e; *p; p += *p == ',') {
        char *end;
        const long d = strtol(p, &end, 10);
        if (end == p) return false; /* not a list of numbers: none */
        if (d == current_device) return true;
        p = end;
    }
    return false;
}

struct ff_emu_graph {
    int magic;
    std::shared_ptr<std::vector<std::function<void()>>> ops;
};
enum { GRAPH_MAGIC = 0x4772 };

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    EMU_ENTER();
    if (!s || s->magic != STREAM_MAGIC) return fail(cudaErrorStreamCaptureUnsupported); /* not the legacy stream */
    if (s->capturing) return fail(cudaErrorInvalidValue);
    s->capturing = true;
    s->capture_thread = std::this_thread::get_id();
    s->capture_err = capture_fails_here() ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    s->captured.clear();
    n_capturing++;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
    EMU_ENTER();
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    *status = !s || !s->capturing                ? cudaStreamCaptureStatusNone
              : s->capture_err != cudaSuccess    ? cudaStreamCaptureStatusInvalidated
                                                 : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    EMU_ENTER();
    *g = NULL;
    if (!s || s->magic != STREAM_MAGIC || !s->capturing) return fail(cudaErrorInvalidValue);
    s->capturing = false;
    n_capturing--;
    std::vector<std::function<void()>> ops = std::move(s->captured);
    s->captured.clear();
    if (s->capture_err != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
    *g = new ff_emu_graph{GRAPH_MAGIC, std::make_shared<std::vector<std::function<void()>>>(std::move(ops))};
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long) {
    EMU_ENTER();
    if (!g || g->magic != GRAPH_MAGIC) return fail(cudaErrorInvalidValue);
    *x = new ff_emu_graph{GRAPH_MAGIC, std::make_shared<std::vector<std::function<void()>>>(*g->ops)};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
    EMU_ENTER();
    if (!x || x->magic != GRAPH_MAGIC || !stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    CAPTURE_REFUSE(s, cudaErrorStreamCaptureUnsupported); /* the emulator does not nest graphs */
    std::shared_ptr<std::vector<std::function<void()>>> ops = x->ops; /* a replay outlives a destroyed exec */
    enqueue(s, [ops] {
        for (const std::function<void()> &op : *ops)
            if (sticky == cudaSuccess) op();
    });
    return cudaSuccess;
}
static cudaError_t graph_destroy(ff_emu_graph *g) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    if (!g || g->magic != GRAPH_MAGIC) return fail(cudaErrorInvalidValue);
    g->magic = 0;
    delete g;
    return sticky;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) { return graph_destroy(g); }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) { return graph_destroy(x); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    EMU_ENTER();
    CAPTURE_REFUSE(NULL, cudaErrorStreamCaptureUnsupported);
    *s = new ff_emu_stream{STREAM_MAGIC, {}, 0, 0, (flags & cudaStreamNonBlocking) != 0, false, std::thread::id(), cudaSuccess, {}};
    streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    if (!s || s->magic != STREAM_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    if (s->capturing) n_capturing--;
    run_stream(s); /* its work still completes, as on a device */
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) streams.erase(streams.begin() + (long)i);
    for (ff_emu_stream *o : streams) /* waits for its work: that work is done */
        for (emu_op &op : o->q)
            if (op.wait_on == s) op.wait_on = NULL, op.run = [] {};
    s->magic = 0;
    delete s;
    return sticky;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    EMU_ENTER();
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    CAPTURE_REFUSE(NULL, cudaErrorStreamCaptureUnsupported);
    if (s) run_stream(s);
    else run_all();
    return sticky;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    EMU_ENTER();
    *e = new ff_emu_event{EVENT_MAGIC, NULL, 0};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    if (!e || e->magic != EVENT_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    e->magic = 0;
    delete e;
    return sticky;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    EMU_ENTER();
    if (!e || e->magic != EVENT_MAGIC || !stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    CAPTURE_BROKEN(s);
    CAPTURE_REFUSE(s, cudaErrorStreamCaptureUnsupported); /* the emulator does not model forked captures */
    if (!s) run_all(); /* the legacy stream: complete once everything before it is */
    e->s = s;
    e->seq = s ? s->enq_seq : 0;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    EMU_ENTER();
    if (!e || e->magic != EVENT_MAGIC || !stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    CAPTURE_BROKEN(s);
    CAPTURE_REFUSE(s, cudaErrorStreamCaptureIsolation); /* a dependency on uncaptured work */
    if (!e->s) return cudaSuccess; /* never recorded, or complete */
    if (!s) {
        run_until(e->s, e->seq);
        return cudaSuccess;
    }
    s->q.push_back(emu_op{++s->enq_seq, std::function<void()>(), e->s, e->seq});
    return cudaSuccess;
}

/* Host work on a stream, in its order. */
void ff_emu_stream_enqueue(cudaStream_t s, std::function<void()> f) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    enqueue(s, std::move(f));
}

extern "C" int ff_emu_is_device(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    return on_device(p, bytes);
}

extern "C" void ff_emu_stream_defer(void *stream, void (*fn)(void *), void *ctx) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    enqueue((cudaStream_t)stream, [fn, ctx] { fn(ctx); });
}

extern "C" int ff_emu_stream_capturing(void *stream) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    cudaStream_t s = (cudaStream_t)stream;
    return !s || !stream_ok(s) || !s->capturing ? 0 : s->capture_err != cudaSuccess ? 2 : 1;
}

extern "C" void ff_emu_stream_record(void *stream, void (*fn)(void *), void *ctx, void (*free_ctx)(void *)) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    std::shared_ptr<void> held(ctx, free_ctx); /* freed with the last graph (or queue entry) holding it */
    enqueue((cudaStream_t)stream, [fn, held] { fn(held.get()); });
}

extern "C" int ff_emu_stream_run_host(void *stream, int (*fn)(void *), void *ctx) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    cudaStream_t s = (cudaStream_t)stream;
    if (!stream_ok(s)) return ff_error_set("cuda emulator", NULL, "host work on an invalid stream %p", stream);
    if (capture_refuse(s, cudaErrorStreamCaptureUnsupported) != cudaSuccess)
        return ff_error_set("cuda emulator", "do host work before or after a graph capture", "host work on a capturing stream");
    if (s) run_stream(s);
    else run_all();
    if (sticky != cudaSuccess)
        return ff_error_set("cuda emulator", "see the fault printed above", "work queued before it failed: %s",
                            cudaGetErrorString(sticky));
    return fn ? fn(ctx) : 0;
}

cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); } /* nothing runs in the background */

/* The C entry points of tests/coll/nccl_emu/cuda_runtime_api.h (C files built against the
 * emulator: nccl_backend.c, test_coll_nccl.c), under names of their own. */
extern "C" {
int ff_emu_c_cudaGetDeviceCount(int *n) { return cudaGetDeviceCount(n); }
int ff_emu_c_cudaSetDevice(int d) { return cudaSetDevice(d); }
int ff_emu_c_cudaMalloc(void **p, size_t bytes) { return cudaMalloc(p, bytes); }
int ff_emu_c_cudaFree(void *p) { return cudaFree(p); }
int ff_emu_c_cudaMemcpy(void *dst, const void *src, size_t bytes, int kind) {
    return cudaMemcpy(dst, src, bytes, (cudaMemcpyKind)kind);
}
int ff_emu_c_cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreate(s); }
int ff_emu_c_cudaStreamDestroy(cudaStream_t s) { return cudaStreamDestroy(s); }
int ff_emu_c_cudaStreamQuery(cudaStream_t s) { return cudaStreamQuery(s); }
const char *ff_emu_c_cudaGetErrorString(int e) { return cudaGetErrorString((cudaError_t)e); }
}

/* ---- memory ------------------------------------------------------------------------------------ */

cudaError_t cudaMalloc(void **p, size_t n) {
    EMU_ENTER();
    *p = NULL;
    CAPTURE_REFUSE(NULL, cudaErrorStreamCaptureUnsupported);
    if (n == 0) return cudaSuccess;
    if (n > device_bytes() - others_bytes() - alloc_total) return fail(cudaErrorMemoryAllocation);
    void *m = malloc(n);
    if (!m) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n); /* device memory starts as garbage: NaN bytes show a read of unwritten data */
    allocs[(uintptr_t)m] = n;
    alloc_total += n;
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    EMU_ENTER();
    *free_bytes = device_bytes() - others_bytes() - alloc_total;
    *total_bytes = device_bytes();
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    EMU_ENTER();
    if (!p) return cudaSuccess;
    CAPTURE_REFUSE(NULL, cudaErrorStreamCaptureUnsupported);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) return fail(cudaErrorInvalidValue);
    run_all(); /* cudaFree waits for the device */
    alloc_total -= it->second;
    allocs.erase(it);
    free(p);
    return sticky;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    EMU_ENTER();
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    if (n && !on_device(p, n)) return fail(cudaErrorInvalidValue);
    if (!s && legacy_refuse() != cudaSuccess) return cudaErrorStreamCaptureImplicit;
    CAPTURE_BROKEN(s);
    enqueue(s, [p, v, n] { memset(p, v, n); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, NULL); }

static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    if (!n) return cudaSuccess;
    bool dd = on_device(dst, n), sd = on_device(src, n);
    bool dh = !touches_device(dst, n), sh = !touches_device(src, n);
    bool ok = (k == cudaMemcpyHostToDevice && dd && sh) || (k == cudaMemcpyDeviceToHost && dh && sd) ||
              (k == cudaMemcpyDeviceToDevice && dd && sd) || (k == cudaMemcpyHostToHost && dh && sh) ||
              (k == cudaMemcpyDefault && (dd || dh) && (sd || sh));
    if (!ok) {
        fprintf(stderr, "cuda emulator: a copy of %zu bytes of kind %d from %p (%s) to %p (%s) does not match its pointers\n",
                n, (int)k, src, sd ? "device" : sh ? "host" : "partly device", dst, dd ? "device" : dh ? "host" : "partly device");
        return fail(cudaErrorInvalidMemcpyDirection);
    }
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + n && s < d + n && d != s) {
        fprintf(stderr, "cuda emulator: a copy of %zu bytes between overlapping ranges (%p, %p): undefined on a device\n",
                n, src, dst);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
/* Host memory here is pageable, as fuseflow's is: a copy from it is staged at once (the caller
 * may reuse it on return); a copy into it returns once done, after the stream's earlier work. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
    EMU_ENTER();
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = check_copy(dst, src, n, k);
    if (e != cudaSuccess || !n || dst == src) return e;
    if (!s && legacy_refuse() != cudaSuccess) return cudaErrorStreamCaptureImplicit;
    CAPTURE_BROKEN(s);
    if (!on_device(dst, n) || !on_device(src, n)) CAPTURE_REFUSE(s, cudaErrorStreamCaptureUnsupported); /* pageable host memory */
    if (on_device(dst, n) && !on_device(src, n)) {
        std::shared_ptr<std::vector<char>> stage = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        enqueue(s, [dst, stage] { memcpy(dst, stage->data(), stage->size()); });
    } else if (!on_device(dst, n)) {
        if (s) run_stream(s);
        else run_all();
        if (sticky == cudaSuccess) memcpy(dst, src, n);
    } else {
        enqueue(s, [dst, src, n] { memcpy(dst, src, n); });
    }
    return sticky;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    return cudaMemcpyAsync(dst, src, n, k, NULL);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t s) {
    EMU_ENTER();
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
    if (k != cudaMemcpyDeviceToDevice) return fail(cudaErrorInvalidMemcpyDirection); /* the backend's only use */
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = check_copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, k);
        if (e != cudaSuccess) return e;
    }
    CAPTURE_BROKEN(s);
    enqueue(s, [=] {
        for (size_t r = 0; r < height && width; r++)
            memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
    return cudaSuccess;
}

/* ---- launches: fibers -------------------------------------------------------------------------- */

static std::map<const void *, int> smem_limit; /* kernel -> dynamic shared memory it may ask for */

cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute a, int v) {
    EMU_ENTER();
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > EMU_SMEM_OPTIN)
        return fail(cudaErrorInvalidValue);
    smem_limit[fn] = v;
    return cudaSuccess;
}

/* ---- context switches ----
 * On x86-64, a switch saves and restores the callee-saved registers and the floating-point
 * control words and nothing else (ucontext's swapcontext also makes a system call for the
 * signal mask each time: most of the emulator's time). Elsewhere, ucontext. */
struct emu_ctx {
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t uc;
#endif
};
static void fiber_main(void);

#if defined(__x86_64__)
extern "C" void ff_emu_switch(void **save_sp, void *load_sp);
extern "C" void ff_emu_fiber_entry(void);
extern "C" void ff_emu_fiber_start(void) { fiber_main(); }
asm(".text\n"
    ".globl ff_emu_switch\n"
    ".type ff_emu_switch, @function\n"
    "ff_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size ff_emu_switch, .-ff_emu_switch\n"
    ".globl ff_emu_fiber_entry\n"
    ".type ff_emu_fiber_entry, @function\n"
    "ff_emu_fiber_entry:\n"
    "  call ff_emu_fiber_start\n"
    "  ud2\n"
    ".size ff_emu_fiber_entry, .-ff_emu_fiber_entry\n");

/* A fresh fiber's stack, laid out as ff_emu_switch leaves a switched-out one: its first switch
 * "returns" into ff_emu_fiber_entry with the stack 16-byte aligned for the call it makes. */
static void ctx_init(emu_ctx *c, char *stack, size_t size) {
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 80);
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    memset(sp, 0, 80);
    memcpy(sp, &mxcsr, 4);
    memcpy((char *)sp + 4, &fpucw, 2);
    sp[7] = (uint64_t)(uintptr_t)ff_emu_fiber_entry; /* at top - 24 */
    c->sp = sp;
}
static void ctx_switch(emu_ctx *from, emu_ctx *to) { ff_emu_switch(&from->sp, to->sp); }
#else
static void ctx_init(emu_ctx *c, char *stack, size_t size) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, fiber_main, 0);
}
static void ctx_switch(emu_ctx *from, emu_ctx *to) { swapcontext(&from->uc, &to->uc); }
#endif

enum fiber_state { RUNNABLE, WAIT_BLOCK, WAIT_WARP, DONE };
struct fiber {
    emu_ctx ctx;
    ff_emu_thread_ids ids;
    int tid, lane, warp;
    fiber_state state;
    const char *waits_at;
    void *fake_stack; /* ASan's, while switched out */
};
struct block_state {
    int n;           /* threads */
    int block_arrived, exited;
    int warp_arrived[EMU_MAX_THREADS / 32], warp_exited[EMU_MAX_THREADS / 32], warp_size[EMU_MAX_THREADS / 32];
    uint64_t xchg[EMU_MAX_THREADS / 32][32];
    uint32_t mma_ab[EMU_MAX_THREADS / 32][32][6]; /* each lane's A and B registers (ff_emu_mma_m16n8k16_bf16) */
    unsigned char *dyn;
    size_t dyn_bytes;
    const std::function<void()> *body;
};

static char *stacks[EMU_MAX_THREADS]; /* mapped once, a guard page below each */
static fiber fibers[EMU_MAX_THREADS];
static block_state blk;
static fiber *cur_fiber;
static emu_ctx sched_ctx;
[[maybe_unused]] static const void *sched_stack_bottom;
[[maybe_unused]] static size_t sched_stack_size;
static bool launch_faulted;
static const char *launch_name;

void ff_emu_fault(const char *fmt, ...) {
    if (launch_faulted) return;
    launch_faulted = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda emulator: kernel %s, block (%u, %u, %u), thread %d: %s\n", launch_name ? launch_name : "?",
            cur_fiber ? cur_fiber->ids.block_idx.x : 0, cur_fiber ? cur_fiber->ids.block_idx.y : 0,
            cur_fiber ? cur_fiber->ids.block_idx.z : 0, cur_fiber ? cur_fiber->tid : -1, msg);
}
int ff_emu_lane(void) { return cur_fiber ? cur_fiber->lane : 0; }
int ff_emu_check_smem(const void *p, size_t bytes) {
    const unsigned char *b = (const unsigned char *)p;
    return !(b >= blk.dyn && b + bytes <= blk.dyn + blk.dyn_bytes);
}
const ff_emu_thread_ids *ff_emu_ids(void) { return &cur_fiber->ids; }
unsigned char *ff_emu_dyn_smem(void) { return blk.dyn; }

/* The runnable threads of the block, one bit each: the scheduler resumes the highest, or with
 * FF_CUDA_EMU_ORDER=low the lowest. One order shows a thread reading, without a barrier, what a
 * lower thread writes (it reads first), the other what a higher one writes: a kernel's tests
 * run in both orders (CMakeLists.txt: the _emu_low copies), so a race either way changes
 * results that they check. */
static uint64_t runnable[EMU_MAX_THREADS / 64];
static bool order_low;
static void set_state(fiber *f, fiber_state st) {
    f->state = st;
    if (st == RUNNABLE) runnable[f->tid / 64] |= 1ull << (f->tid % 64);
    else runnable[f->tid / 64] &= ~(1ull << (f->tid % 64));
}
static int next_runnable(void) {
    if (order_low) {
        for (int w = 0; w < EMU_MAX_THREADS / 64; w++)
            if (runnable[w]) return w * 64 + __builtin_ctzll(runnable[w]);
        return -1;
    }
    for (int w = EMU_MAX_THREADS / 64 - 1; w >= 0; w--)
        if (runnable[w]) return w * 64 + 63 - __builtin_clzll(runnable[w]);
    return -1;
}

/* Switch from the running fiber to the scheduler, which resumes the next runnable thread in the
 * order (this one again, if it still is first). */
static void to_scheduler(bool finishing) {
    fiber *f = cur_fiber;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(finishing ? NULL : &f->fake_stack, sched_stack_bottom, sched_stack_size);
#else
    (void)finishing;
#endif
    ctx_switch(&f->ctx, &sched_ctx);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, NULL, NULL);
#endif
}

/* Release the block's or a warp's barrier when every thread of it arrived or exited. */
static void release_block(void) {
    if (!blk.block_arrived || blk.block_arrived + blk.exited != blk.n) return;
    blk.block_arrived = 0;
    for (int i = 0; i < blk.n; i++)
        if (fibers[i].state == WAIT_BLOCK) set_state(&fibers[i], RUNNABLE);
}
static void release_warp(int w) {
    if (!blk.warp_arrived[w] || blk.warp_arrived[w] + blk.warp_exited[w] != blk.warp_size[w]) return;
    blk.warp_arrived[w] = 0;
    for (int i = w * 32; i < w * 32 + blk.warp_size[w]; i++)
        if (fibers[i].state == WAIT_WARP) set_state(&fibers[i], RUNNABLE);
}

static void fiber_main(void) {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &sched_stack_bottom, &sched_stack_size);
#endif
    if (!launch_faulted) (*blk.body)();
    fiber *f = cur_fiber;
    set_state(f, DONE);
    blk.exited++;
    blk.warp_exited[f->warp]++;
    release_block(); /* exited threads count as arrived */
    release_warp(f->warp);
    to_scheduler(true);
}

/* Wait at a barrier: every waiter, the last to arrive too, goes back to the scheduler, so that
 * after the barrier the first thread in the order runs first. */
static void wait_at(fiber_state st, const char *what) {
    fiber *f = cur_fiber;
    set_state(f, st);
    f->waits_at = what;
    if (st == WAIT_BLOCK) {
        blk.block_arrived++;
        release_block();
    } else {
        blk.warp_arrived[f->warp]++;
        release_warp(f->warp);
    }
    to_scheduler(false);
}

void __syncthreads(void) { wait_at(WAIT_BLOCK, "__syncthreads"); }
static void warp_barrier(const char *what) { wait_at(WAIT_WARP, what); }

void __syncwarp(unsigned mask) {
    if (mask != 0xffffffffu) ff_emu_fault("__syncwarp with the partial mask %#x (the kernels use whole warps)", mask);
    warp_barrier("__syncwarp");
}

uint64_t ff_emu_shfl(unsigned mask, uint64_t v, int src, int xr) {
    fiber *f = cur_fiber;
    if (mask != 0xffffffffu) ff_emu_fault("a shuffle with the partial mask %#x (the kernels use whole warps)", mask);
    if (blk.warp_size[f->warp] != 32) ff_emu_fault("a shuffle in a warp of %d threads", blk.warp_size[f->warp]);
    blk.xchg[f->warp][f->lane] = v;
    warp_barrier("a shuffle");
    int from = src >= 0 ? (src & 31) : (f->lane ^ xr) & 31;
    if (fibers[f->warp * 32 + from].state == DONE) ff_emu_fault("a shuffle reads lane %d, which has exited", from);
    uint64_t r = blk.xchg[f->warp][from];
    warp_barrier("a shuffle");
    return r;
}

unsigned __reduce_max_sync(unsigned mask, unsigned v) {
    fiber *f = cur_fiber;
    if (mask != 0xffffffffu) ff_emu_fault("__reduce_max_sync with the partial mask %#x", mask);
    blk.xchg[f->warp][f->lane] = v;
    warp_barrier("__reduce_max_sync");
    unsigned r = 0;
    for (int i = 0; i < 32; i++) {
        if (fibers[f->warp * 32 + i].state == DONE) ff_emu_fault("__reduce_max_sync over lane %d, which has exited", i);
        r = (unsigned)blk.xchg[f->warp][i] > r ? (unsigned)blk.xchg[f->warp][i] : r;
    }
    warp_barrier("__reduce_max_sync");
    return r;
}

/* The warp's lanes all here, none exited and none short (what the warp-wide matrix
 * instructions require); else a fault naming what. */
static bool whole_warp(const char *what) {
    fiber *f = cur_fiber;
    if (blk.warp_size[f->warp] != 32 || blk.warp_exited[f->warp]) {
        ff_emu_fault("%s in a warp of %d threads, %d of them exited (it needs all 32)", what, blk.warp_size[f->warp],
                     blk.warp_exited[f->warp]);
        return false;
    }
    return true;
}

void ff_emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans) {
    fiber *f = cur_fiber;
    const char *what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    if ((uintptr_t)row % 16) {
        ff_emu_fault("%s: lane %d's row address %p is not 16-byte aligned", what, f->lane, row);
        row = NULL;
    } else if (ff_emu_check_smem(row, 16)) {
        ff_emu_fault("%s: lane %d's row %p is not inside the block's shared memory", what, f->lane, row);
        row = NULL;
    }
    blk.xchg[f->warp][f->lane] = (uint64_t)(uintptr_t)row;
    warp_barrier(what);
    const bool ok = whole_warp(what);
    const int g = f->lane >> 2, q = f->lane & 3;
    for (int j = 0; j < 4; j++) { /* matrix j: rows given by lanes 8j .. 8j + 7 */
        uint32_t v = 0;
        for (int i = 0; i < 2 && ok; i++) {
            const int src = trans ? 8 * j + 2 * q + i : 8 * j + g, col = trans ? g : 2 * q + i;
            const uint16_t *p = (const uint16_t *)(uintptr_t)blk.xchg[f->warp][src];
            v |= (uint32_t)(p ? p[col] : 0) << (16 * i);
        }
        r[j] = v;
    }
    warp_barrier(what);
}

static float bf16_bits(uint32_t reg, int half) {
    uint32_t u = (reg >> (16 * half) & 0xffffu) << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

void ff_emu_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    fiber *f = cur_fiber;
    uint32_t *mine = blk.mma_ab[f->warp][f->lane];
    memcpy(mine, a, 4 * sizeof *a);
    mine[4] = b0, mine[5] = b1;
    warp_barrier("mma.m16n8k16");
    if (whole_warp("mma.m16n8k16")) {
        const uint32_t(*ab)[6] = blk.mma_ab[f->warp];
        const int g = f->lane >> 2, q = f->lane & 3;
        for (int i = 0; i < 4; i++) { /* d[i]: row g (i < 2) or g + 8, column 2q + i % 2 */
            const int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
            float sum = d[i];
            for (int k = 0; k < 16; k++) {
                /* A(row, k): lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8);
                 * B(k, col): lane 4 col + (k % 8) / 2, register 4 + (k >= 8); low half: k even */
                const float x = bf16_bits(ab[4 * (row & 7) + (k & 7) / 2][(row >> 3) + 2 * (k >> 3)], k & 1);
                const float y = bf16_bits(ab[4 * col + (k & 7) / 2][4 + (k >> 3)], k & 1);
                sum += x * y;
            }
            d[i] = sum;
        }
    }
    warp_barrier("mma.m16n8k16");
}

static bool map_stacks(void) {
    if (stacks[0]) return true;
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < EMU_MAX_THREADS; i++) {
        void *m = mmap(NULL, EMU_STACK + (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, (size_t)page, PROT_NONE); /* an overflowing fiber faults here, not in its neighbour */
        stacks[i] = (char *)m + page;
    }
    return true;
}

static void run_block(dim3 grid, dim3 block, dim3 bidx) {
    const int n = (int)(block.x * block.y * block.z);
    blk.n = n;
    blk.block_arrived = blk.exited = 0;
    for (int w = 0; w < (n + 31) / 32; w++) {
        blk.warp_arrived[w] = blk.warp_exited[w] = 0;
        blk.warp_size[w] = n - w * 32 < 32 ? n - w * 32 : 32;
    }
    if (blk.dyn_bytes) memset(blk.dyn, 0xff, blk.dyn_bytes); /* shared memory starts as garbage */
    memset(runnable, 0, sizeof runnable);
    for (int t = 0; t < n; t++) {
        fiber &f = fibers[t];
        f.tid = t;
        f.lane = t % 32;
        f.warp = t / 32;
        set_state(&f, RUNNABLE);
        f.waits_at = NULL;
        f.fake_stack = NULL;
        f.ids.thread_idx = dim3((unsigned)t % block.x, (unsigned)t / block.x % block.y, (unsigned)t / (block.x * block.y));
        f.ids.block_idx = bidx;
        f.ids.block_dim = block;
        f.ids.grid_dim = grid;
        ctx_init(&f.ctx, stacks[t], EMU_STACK);
    }
    for (;;) {
        int t = next_runnable();
        if (t < 0) break;
        fiber &f = fibers[t];
        cur_fiber = &f;
        void *save = NULL;
#if EMU_ASAN
        __sanitizer_start_switch_fiber(&save, stacks[t], EMU_STACK);
#endif
        ctx_switch(&sched_ctx, &f.ctx);
#if EMU_ASAN
        __sanitizer_finish_switch_fiber(save, NULL, NULL);
#endif
        (void)save;
        cur_fiber = NULL;
    }
    if (blk.exited == n) return;
    for (int t = 0; t < n; t++) /* every live thread waits: report the first, abandon the block */
        if (fibers[t].state != DONE) {
            cur_fiber = &fibers[t];
            ff_emu_fault("deadlock: every live thread waits; this one at %s while %d of %d threads have exited",
                         fibers[t].waits_at ? fibers[t].waits_at : "?", blk.exited, n);
            cur_fiber = NULL;
            return;
        }
}

/* Run a launch's blocks now (its stream's turn came). */
static void run_launch(const char *name, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    static unsigned char *dyn;
    static size_t dyn_cap;
    if (smem > dyn_cap) {
        free(dyn);
        dyn = (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128);
        dyn_cap = dyn ? smem : 0;
        if (!dyn) {
            fprintf(stderr, "cuda emulator: kernel %s: no memory for %zu bytes of shared memory\n", name, smem);
            sticky = cudaErrorLaunchFailure;
            return;
        }
    }
    blk.dyn = dyn;
    blk.dyn_bytes = smem;
    blk.body = &body;
    launch_faulted = false;
    launch_name = name;
    for (unsigned z = 0; z < grid.z && !launch_faulted; z++)
        for (unsigned y = 0; y < grid.y && !launch_faulted; y++)
            for (unsigned x = 0; x < grid.x && !launch_faulted; x++) run_block(grid, block, dim3(x, y, z));
    if (launch_faulted) sticky = cudaErrorLaunchFailure;
    launch_name = NULL;
}

void ff_emu_launch(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   std::function<void()> body) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    if (sticky != cudaSuccess) return;
    const uint64_t nt = (uint64_t)block.x * block.y * block.z;
    auto lim = smem_limit.find(fn);
    const size_t limit = lim == smem_limit.end() ? (size_t)EMU_SMEM_DEFAULT : (size_t)lim->second;
    if (!stream_ok(s) || nt == 0 || nt > EMU_MAX_THREADS || block.z > 64 || grid.x == 0 || grid.y == 0 ||
        grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
        fprintf(stderr, "cuda emulator: kernel %s: bad launch configuration: grid (%u, %u, %u), block (%u, %u, %u)\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (smem > limit) {
        fprintf(stderr, "cuda emulator: kernel %s asks for %zu bytes of dynamic shared memory, above its limit of %zu "
                        "(cudaFuncSetAttribute raises it)\n", name, smem, limit);
        last_error = cudaErrorInvalidValue;
        return;
    }
    if (!map_stacks()) {
        last_error = cudaErrorMemoryAllocation;
        return;
    }
    const char *order = getenv("FF_CUDA_EMU_ORDER");
    if (order && *order && strcmp(order, "high") != 0 && strcmp(order, "low") != 0) {
        fprintf(stderr, "cuda emulator: FF_CUDA_EMU_ORDER is '%s': set it to high (the default) or low\n", order);
        last_error = cudaErrorInvalidValue;
        return;
    }
    const bool low = order && strcmp(order, "low") == 0;
    if (capture_broken(s)) {
        last_error = cudaErrorStreamCaptureInvalidated;
        return;
    }
    enqueue(s, [name, grid, block, smem, body, low] {
        order_low = low;
        run_launch(name, grid, block, smem, body);
    });
}

/* ---- cuBLAS ------------------------------------------------------------------------------------ */

/* ws: the workspace the caller gave (cublasSetWorkspace); NULL: cuBLAS's own pool, which it
 * grows by allocating, so a product on a capturing stream without one invalidates the capture
 * here (cuBLAS may have its pool from earlier products; fuseflow never counts on it).
 * cublasSetStream puts the pool back, as cuBLAS does. */
struct ff_emu_blas {
    cudaStream_t stream;
    cublasMath_t math;
    void *ws;
};

cublasStatus_t ff_emu_cublasCreate(cublasHandle_t *h) {
    *h = new ff_emu_blas{NULL, CUBLAS_DEFAULT_MATH, NULL};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t ff_emu_cublasDestroy(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t ff_emu_cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h || !stream_ok(s)) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    h->ws = NULL;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t ff_emu_cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !on_device(ws, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = bytes ? ws : NULL;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t ff_emu_cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}
const char *ff_emu_cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

/* TF32: the 10-bit mantissa of the tensor cores' inputs, rounded to nearest even */
static float tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u += 0xfffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}
static float elem(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_16BF) {
        __nv_bfloat16 h;
        memcpy(&h, (const char *)p + i * 2, 2);
        return __bfloat162float(h);
    }
    return ((const float *)p)[i];
}

/* Column-major, as cuBLAS: C[m, n] (ldc) = alpha op(A)[m, k] op(B)[k, n] + beta C; C is not
 * read when beta is 0. Operands must be device memory; sums in fp32, in k order. C is fp32, or
 * bf16 with bf16 operands (the result rounded to nearest even). */
cublasStatus_t ff_emu_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                   cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t comp, cublasGemmAlgo_t) {
    std::lock_guard<std::recursive_mutex> lk(emu_mu);
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (sticky != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
    const int arows = ta == CUBLAS_OP_N ? m : k, acols = ta == CUBLAS_OP_N ? k : m;
    const int brows = tb == CUBLAS_OP_N ? k : n, bcols = tb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool f32 = at == CUDA_R_32F && bt == CUDA_R_32F, b16 = at == CUDA_R_16BF && bt == CUDA_R_16BF;
    if (!(ct == CUDA_R_32F || (b16 && ct == CUDA_R_16BF)) || !(f32 || b16) || (b16 && comp != CUBLAS_COMPUTE_32F) ||
        (comp != CUBLAS_COMPUTE_32F && comp != CUBLAS_COMPUTE_32F_FAST_TF32))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    if (capture_broken(h->stream)) return CUBLAS_STATUS_EXECUTION_FAILED; /* its launch fails */
    if (!h->ws && h->stream && h->stream->capturing && capture_refuse(h->stream, cudaErrorStreamCaptureInvalidated) != cudaSuccess)
        return CUBLAS_STATUS_ALLOC_FAILED; /* its pool would grow: an allocation the capture cannot hold */
    const size_t ae = at == CUDA_R_16BF ? 2 : 4, be = bt == CUDA_R_16BF ? 2 : 4;
    if ((k && (!on_device(A, ((size_t)(acols - 1) * lda + arows) * ae) ||
               !on_device(B, ((size_t)(bcols - 1) * ldb + brows) * be))) ||
        !on_device(C, ((size_t)(n - 1) * ldc + m) * (ct == CUDA_R_16BF ? 2 : 4))) {
        fprintf(stderr, "cuda emulator: cublasGemmEx %dx%dx%d: an operand is not (wholly) device memory\n", m, n, k);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const bool round = f32 && comp == CUBLAS_COMPUTE_32F_FAST_TF32;
    const float al = *(const float *)alpha, bet = *(const float *)beta;
    enqueue(h->stream, [=] { /* in the handle's stream's order, as cuBLAS */
        std::vector<float> a((size_t)m * k), b((size_t)n * k); /* op(A) row i, op(B) column j, contiguous in k */
        for (int i = 0; i < m; i++)
            for (int l = 0; l < k; l++) {
                float x = elem(A, at, ta == CUBLAS_OP_N ? (size_t)l * lda + i : (size_t)i * lda + l);
                a[(size_t)i * k + l] = round ? tf32(x) : x;
            }
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++) {
                float x = elem(B, bt, tb == CUBLAS_OP_N ? (size_t)j * ldb + l : (size_t)l * ldb + j);
                b[(size_t)j * k + l] = round ? tf32(x) : x;
            }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float sum = 0.0f;
                const float *ai = &a[(size_t)i * k], *bj = &b[(size_t)j * k];
                for (int l = 0; l < k; l++) sum += ai[l] * bj[l];
                const size_t at = (size_t)j * ldc + i;
                const float v = bet == 0.0f ? al * sum : al * sum + bet * elem(C, ct, at);
                if (ct == CUDA_R_16BF) {
                    const __nv_bfloat16 h16 = __float2bfloat16(v);
                    memcpy((char *)C + at * 2, &h16, 2);
                } else {
                    ((float *)C)[at] = v;
                }
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}
