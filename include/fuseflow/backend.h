/* fuseflow: the compute backend: device memory, streams and explicit host<->device copies,
 * behind opaque handles, in the style of ggml's backends.
 *
 * Model code never dereferences device memory. It allocates ff_buffers, addresses them with
 * ff_dptr (a buffer plus a byte offset), moves data with the explicit copies below and runs
 * the kernels of include/fuseflow/kernels.h on a stream. A backend is a table of functions
 * (kernels/backend_impl.h); the CPU backend (kernels/cpu/) implements it with host memory,
 * OpenBLAS and a thread pool, and a CUDA backend (kernels/cuda/) can implement the same table.
 *
 * Numbers: the CPU backend computes everything in fp32. A CUDA backend is meant to keep
 * parameters, gradients and optimizer state as fp32 masters in its buffers and compute
 * activations in bf16 internally; the interface is the same (every ff_dptr a kernel takes
 * names fp32 or int32 elements, as each kernel documents, except the bf16 weights and KV
 * cache of the kernels that say so: ff_gemm_bf16w, ff_attention_cached_bf16, ...).
 *
 * Streams: work on one stream runs in order. Kernels and copies are enqueued; on the CPU
 * backend they run before the call returns. ff_memcpy_d2h waits for the stream before it
 * returns (the host data is then ready). Different streams may run concurrently on a
 * device backend; the CPU backend runs everything on the calling thread (plus its pool's
 * workers), so one backend must not be used from two threads at once.
 *
 * Threads (CPU backend): kernels run on the backend's pool of n_threads (the calling thread
 * and n_threads - 1 workers). OpenBLAS is held at one thread of its own: the matrix products
 * are split into blocks for the same pool (each block one single-threaded cblas_sgemm), so
 * two thread pools never compete for the cores (docs/model.md, "Threads").
 */
#ifndef FUSEFLOW_BACKEND_H
#define FUSEFLOW_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef struct ff_backend ff_backend; /* a device and its kernels */
typedef struct ff_buffer ff_buffer;   /* one allocation in device memory */
typedef struct ff_stream ff_stream;   /* an ordered queue of kernels and copies */
typedef struct ff_event ff_event;     /* a point in a stream's queue that another stream can wait for */

/* An address in device memory: a buffer and a byte offset into it. Plain value; the
 * buffer is not owned. {NULL, 0} is "no tensor" where a kernel accepts one. */
typedef struct ff_dptr {
    ff_buffer *buf;
    size_t off; /* bytes */
} ff_dptr;

/* ---- backends -------------------------------------------------------------------------- */

/* The CPU backend with n_threads threads (0: the FF_NUM_THREADS environment variable, else
 * the number of cores this process may run on). NULL + error on failure. */
ff_backend *ff_backend_cpu_new(int n_threads);
/* A backend by name: "cpu", "cpu:N" (N threads), "cuda" or "cuda:N" (device N). NULL +
 * error for an unknown name or a backend that is not built or has no device here. */
ff_backend *ff_backend_new(const char *name);
void ff_backend_destroy(ff_backend **be);

const char *ff_backend_name(const ff_backend *be); /* "cpu", "cuda:0" */
int ff_backend_threads(const ff_backend *be);      /* CPU threads the kernels use */
/* Whether the backend's matrix products are bf16 (fp32 accumulation): the cuda backend unless
 * FF_CUDA_MATH says tf32 or fp32. A trainable model then keeps a bf16 copy of its weights for its products
 * (ff_gemm_bf16; docs/model.md "bf16 products"). The cpu backend's products are fp32: false. */
bool ff_backend_bf16_products(const ff_backend *be);
/* The stream the backend was created with; valid until the backend is destroyed. */
ff_stream *ff_backend_stream(ff_backend *be);

/* ---- memory ---------------------------------------------------------------------------- */

/* A zero-filled buffer of `bytes` bytes (bytes may be 0). NULL + error when out of memory.
 * Buffers must be destroyed before their backend. */
ff_buffer *ff_buffer_new(ff_backend *be, size_t bytes);
void ff_buffer_destroy(ff_buffer **b);
size_t ff_buffer_size(const ff_buffer *b);
/* The backend's allocation counters, kept by ff_buffer_new and ff_buffer_destroy: the bytes
 * of the buffers alive now (in_use) with the device workspace the backend holds itself (on
 * cuda each stream's kernel scratch and cuBLAS workspace), the most of them at once since the
 * backend was made or the last reset (peak), and the count of buffers alive. Host memory a caller mallocs (an
 * offloaded optimizer state, ff_optimizer_offload) is not in them. capacity: the device's
 * memory in bytes (cudaMemGetInfo's total, whatever else holds some of it); 0 where the
 * buffers are host memory (cpu). */
typedef struct ff_backend_memory {
    int64_t in_use, peak, buffers, capacity;
} ff_backend_memory;
void ff_backend_memory_of(ff_backend *be, ff_backend_memory *out);
void ff_backend_memory_reset_peak(ff_backend *be); /* peak := in_use */
/* The device's free memory now (cudaMemGetInfo's free): what fuseflow can still allocate, all
 * else on the device (other processes, the CUDA context, NCCL's buffers) left out. -1 where
 * the buffers are host memory (cpu) or the device cannot say. A query of the driver: not for
 * hot loops. */
int64_t ff_backend_device_free(ff_backend *be);
ff_backend *ff_buffer_backend(const ff_buffer *b);

/* The address `byte_offset` bytes into b (asserts offset <= size). */
static inline ff_dptr ff_dptr_of(ff_buffer *b, size_t byte_offset) {
    ff_dptr p = {b, byte_offset};
    return p;
}
/* p advanced by n elements of `elem_size` bytes. */
static inline ff_dptr ff_dptr_add(ff_dptr p, size_t n, size_t elem_size) {
    p.off += n * elem_size;
    return p;
}
/* f32 / i32 element offsets, the common cases. */
static inline ff_dptr ff_dptr_f32(ff_buffer *b, size_t elem_offset) { return ff_dptr_of(b, elem_offset * 4); }
static inline bool ff_dptr_null(ff_dptr p) { return p.buf == NULL; }

/* Copies. Ranges are checked against the buffer sizes (assert: a range outside a buffer is
 * a programming error). h2d may return before the copy is done on a device backend only if
 * it took its own copy of src, so src is reusable at once. d2h waits for the stream. */
void ff_memcpy_h2d(ff_stream *s, ff_dptr dst, const void *src, size_t bytes);
void ff_memcpy_d2h(ff_stream *s, void *dst, ff_dptr src, size_t bytes);
void ff_memcpy_d2d(ff_stream *s, ff_dptr dst, ff_dptr src, size_t bytes);
void ff_memset_zero(ff_stream *s, ff_dptr dst, size_t bytes);
/* rows rows of `width` bytes: dst + r dpitch <- src + r spitch (pitches in bytes, >= width; the
 * two ranges do not overlap): a block of a row-major matrix to or from a packed buffer. */
void ff_memcpy_2d(ff_stream *s, ff_dptr dst, size_t dpitch, ff_dptr src, size_t spitch, size_t width, size_t rows);

/* ---- streams --------------------------------------------------------------------------- */

ff_stream *ff_stream_new(ff_backend *be); /* NULL + error */
void ff_stream_destroy(ff_stream **s);
ff_backend *ff_stream_backend(const ff_stream *s);
/* Wait until all work on s is done. 0, or -1 + error if a kernel failed since the last sync
 * (device errors; memory a kernel needed): kernels return nothing, the stream remembers. */
int ff_stream_sync(ff_stream *s);

/* ---- events: ordering between streams without a host wait ----------------------------------
 *
 *     ff_event_record(ready, compute);   // after the work queued on compute so far
 *     ff_stream_wait(comm, ready);       // comm's later work starts after it
 *     ... a collective on comm ...
 *     ff_event_record(done, comm);
 *     ff_stream_wait(compute, done);     // compute's later work sees the result
 *
 * On the CPU backend work is done when it is queued, so recording and waiting do nothing (and
 * cost nothing). An event is re-recorded freely; a wait sees its latest record. */
ff_event *ff_event_new(ff_backend *be); /* NULL + error */
void ff_event_destroy(ff_event **e);
void ff_event_record(ff_event *e, ff_stream *s);
void ff_stream_wait(ff_stream *s, ff_event *e); /* s and e on the same backend */

/* ---- graphs: a stream's work recorded once, replayed with one launch -------------------------
 *
 *     ff_stream_capture_begin(s);        // from here, work queued on s is recorded, not run
 *     ... kernels and device-to-device copies on s ...
 *     ff_stream_capture_end(s, &g);      // 0: g holds them; -1 + error: nothing was run, redo it
 *     ff_stream_graph_launch(g, s);             // queues all of it again: one launch instead of many
 *
 * A replay runs the same kernels with the same arguments at the same addresses: what changes
 * between replays is only the contents of the buffers they read (upload new inputs with
 * ff_memcpy_h2d before the launch). So a graph is valid while every buffer it touches is alive
 * and the caller's shapes are the captured ones. A capture holds kernels and device copies
 * only: a host copy (either way), ff_stream_sync, ff_sumsq or an event on the stream, or a new
 * buffer made by the capturing thread, fails it (the call does nothing; ff_stream_capture_end
 * returns -1 naming the first). A capture belongs to its thread: one at a time per thread,
 * ended where it began; other threads go on meanwhile. Kernels whose scratch must grow fail it too: run the same work once
 * before capturing it. On the cuda backend a graph is a CUDA graph (cudaStreamBeginCapture);
 * the cpu backend runs work as it is queued and has none (ff_backend_has_stream_graphs), and kernel
 * profiling (FF_PROFILE_KERNELS) turns them off. A graph replays on the stream it was captured
 * on, and is destroyed before that stream. A library that enqueues on ff_stream_native(s) while
 * s captures (NCCL's collectives: ff_stream_capturing says when) is recorded with the rest and
 * replayed in its place; it must enqueue on s itself then, not on a stream ordered by events. */
typedef struct ff_stream_graph ff_stream_graph;
bool ff_backend_has_stream_graphs(const ff_backend *be);
int ff_stream_capture_begin(ff_stream *s);              /* 0, or -1 + error (no graphs here) */
int ff_stream_capture_end(ff_stream *s, ff_stream_graph **out); /* 0, or -1 + error and *out NULL */
int ff_stream_graph_launch(ff_stream_graph *g, ff_stream *s);         /* 0, or -1 + error */
bool ff_stream_capturing(const ff_stream *s); /* between ff_stream_capture_begin and _end */
/* While s captures: whether the capture has already failed (a call it refused, a kernel that
 * failed, or the device's capture invalidated), so that _end will fail. A library about to
 * enqueue on s (a collective) should not: work on an invalidated capture fails, and NCCL would
 * take its communicator down with it. false when s does not capture. */
bool ff_stream_capture_failed(ff_stream *s);
void ff_stream_graph_destroy(ff_stream_graph **g);

/* ---- handing device memory to another library --------------------------------------------
 *
 * A collectives library that reads the backend's memory (NCCL beside a cuda backend; the cpu
 * ff_coll beside the cpu backend) takes raw addresses and the native stream. These give them;
 * nothing else may use them (model code never dereferences device memory). */
void *ff_dptr_addr(ff_dptr p);         /* the device address of p (a host address on the cpu backend) */
void *ff_stream_native(ff_stream *s);  /* the cudaStream_t of a cuda stream; NULL on the cpu backend */
/* Whether collectives library `coll` ("cpu", "nccl": ff_coll_comm_backend) reads this
 * backend's memory: "cpu" with the cpu backend, "nccl" with a cuda one. */
bool ff_backend_shares_memory_with(const ff_backend *be, const char *coll);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
