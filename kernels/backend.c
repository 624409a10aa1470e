/* The backend-independent half of include/fuseflow/backend.h and kernels.h: handles,
 * backend selection by name, argument checks (asserts: a range outside its buffer is a
 * bug in the caller), and dispatch through the function table. No arithmetic here. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "kernels/backend_impl.h"

ff_backend *ff_backend_cpu_new_impl(int n_threads); /* kernels/cpu/cpu_backend.c */
static void prof_print(const ff_backend *be);

ff_backend *ff_backend_cpu_new(int n_threads) {
    if (n_threads < 0) {
        ff_error_set("cpu backend", "pass 0 for the default", "%d threads requested", n_threads);
        return NULL;
    }
    ff_backend *be = ff_backend_cpu_new_impl(n_threads);
    if (!be || ff_backend_finish_init(&be)) return NULL;
    return be;
}

#ifndef FF_HAVE_CUDA
/* The stand-in where kernels/cuda/ is not built (no CUDA toolkit at configure time, or
 * FF_CUDA=OFF); with it, kernels/cuda/cuda_backend.cu defines the constructor. */
ff_backend *ff_backend_cuda_new(int device) {
    ff_error_set("cuda backend", "use the cpu backend, or build on a machine with the CUDA toolkit",
                 "device %d: fuseflow was built without the CUDA backend", device);
    return NULL;
}
#endif

static int parse_suffix(const char *s, int *out) {
    if (!*s) return 0;
    if (*s != ':') return -1;
    char *end = NULL;
    long v = strtol(s + 1, &end, 10);
    if (end == s + 1 || *end || v < 0 || v > 4096) return -1;
    *out = (int)v;
    return 0;
}

ff_backend *(*ff_backend_cuda_ctor)(int device) = ff_backend_cuda_new;

ff_backend *ff_backend_new(const char *name) {
    int n = 0;
    if (name && !strncmp(name, "cpu", 3) && !parse_suffix(name + 3, &n)) return ff_backend_cpu_new(n);
    if (name && !strncmp(name, "cuda", 4) && !parse_suffix(name + 4, &n)) return ff_backend_cuda_ctor(n);
    ff_error_set("backend", "use cpu, cpu:THREADS, cuda or cuda:DEVICE", "unknown backend '%s'", name ? name : "(null)");
    return NULL;
}

int ff_backend_finish_init(ff_backend **pbe) {
    ff_backend *be = *pbe;
    const char *prof = getenv("FF_PROFILE_KERNELS");
    be->profile = prof && *prof && strcmp(prof, "0");
    be->stream = ff_stream_new(be);
    if (!be->stream) {
        ff_backend_destroy(pbe);
        return -1;
    }
    return 0;
}

void ff_backend_destroy(ff_backend **pbe) {
    if (!pbe || !*pbe) return;
    ff_backend *be = *pbe;
    if (be->profile && be->n_prof) prof_print(be);
    ff_stream_destroy(&be->stream);
    be->ops->destroy(be); /* frees impl and be */
    *pbe = NULL;
}

const char *ff_backend_name(const ff_backend *be) { return be->name; }
int ff_backend_threads(const ff_backend *be) { return be->n_threads; }
bool ff_backend_bf16_products(const ff_backend *be) { return be->bf16_products; }
ff_stream *ff_backend_stream(ff_backend *be) { return be->stream; }

/* ---- memory ------------------------------------------------------------------------------ */

/* The stream this thread is capturing a graph on, if any: captures are per thread (CUDA's
 * thread-local mode), so another thread may allocate meanwhile, this one may not. */
static _Thread_local ff_stream *tl_capture;
static bool refused_in_capture(ff_stream *s, const char *call);

ff_buffer *ff_buffer_new(ff_backend *be, size_t bytes) {
    if (tl_capture && tl_capture->be == be && refused_in_capture(tl_capture, "ff_buffer_new")) {
        ff_error_set("ff_buffer_new", "allocate before the capture (ff_stream_capture_begin) or after it ends",
                     "a new buffer of %zu bytes while this thread captures a graph on the %s backend", bytes, be->name);
        return NULL;
    }
    ff_buffer *b = ff_calloc(1, sizeof *b);
    if (!b) return NULL;
    b->be = be;
    b->size = bytes;
    if (be->ops->alloc(be, bytes, &b->data)) {
        free(b);
        return NULL;
    }
    __atomic_add_fetch(&be->mem_buffers, 1, __ATOMIC_RELAXED);
    ff_backend_count_bytes(be, (int64_t)bytes);
    return b;
}

void ff_backend_count_bytes(ff_backend *be, int64_t delta) {
    const int64_t now = __atomic_add_fetch(&be->mem_in_use, delta, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&be->mem_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&be->mem_peak, &peak, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

void ff_buffer_destroy(ff_buffer **pb) {
    if (!pb || !*pb) return;
    ff_backend_count_bytes((*pb)->be, -(int64_t)(*pb)->size);
    __atomic_sub_fetch(&(*pb)->be->mem_buffers, 1, __ATOMIC_RELAXED);
    (*pb)->be->ops->free((*pb)->be, (*pb)->data);
    free(*pb);
    *pb = NULL;
}

size_t ff_buffer_size(const ff_buffer *b) { return b->size; }

void ff_backend_memory_of(ff_backend *be, ff_backend_memory *out) {
    out->in_use = __atomic_load_n(&be->mem_in_use, __ATOMIC_RELAXED);
    out->peak = __atomic_load_n(&be->mem_peak, __ATOMIC_RELAXED);
    out->buffers = __atomic_load_n(&be->mem_buffers, __ATOMIC_RELAXED);
    out->capacity = be->mem_capacity;
}

int64_t ff_backend_device_free(ff_backend *be) { return be->ops->mem_free ? be->ops->mem_free(be) : -1; }

void ff_backend_memory_reset_peak(ff_backend *be) {
    __atomic_store_n(&be->mem_peak, __atomic_load_n(&be->mem_in_use, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}
ff_backend *ff_buffer_backend(const ff_buffer *b) { return b->be; }

/* p must address `bytes` bytes inside its buffer, on the stream's backend. */
static void need(const ff_stream *s, ff_dptr p, size_t bytes) {
    (void)s;
    (void)p;
    (void)bytes;
    assert(p.buf && p.buf->be == s->be);
    assert(p.off <= p.buf->size && bytes <= p.buf->size - p.off);
}
/* A [rows, cols] ld matrix of elem-byte elements at p; need_mat: of floats. */
static void need_mat_of(const ff_stream *s, ff_dptr p, int rows, int cols, int ld, size_t elem) {
    assert(rows >= 0 && cols >= 0 && ld >= cols);
    if (rows > 0 && cols > 0) need(s, p, (((size_t)rows - 1) * (size_t)ld + (size_t)cols) * elem);
}
static void need_mat(const ff_stream *s, ff_dptr p, int rows, int cols, int ld) { need_mat_of(s, p, rows, cols, ld, 4); }
static void need_opt(const ff_stream *s, ff_dptr p, size_t bytes) {
    if (!ff_dptr_null(p)) need(s, p, bytes);
}

/* A call a graph capture cannot hold, made on a capturing stream: it fails the capture (the
 * first such call is what ff_stream_capture_end reports) and does nothing. True if so. */
static bool refused_in_capture(ff_stream *s, const char *call) {
    if (!s->capturing) return false;
    if (!s->capture_error[0])
        snprintf(s->capture_error, sizeof s->capture_error,
                 "%s inside a graph capture (a graph holds kernels and device copies only: do it before or after the capture)",
                 call);
    return true;
}

void ff_memcpy_h2d(ff_stream *s, ff_dptr dst, const void *src, size_t bytes) {
    need(s, dst, bytes);
    if (refused_in_capture(s, "ff_memcpy_h2d")) return;
    if (bytes) s->be->ops->h2d(s, dst, src, bytes);
}
void ff_memcpy_d2h(ff_stream *s, void *dst, ff_dptr src, size_t bytes) {
    need(s, src, bytes);
    if (refused_in_capture(s, "ff_memcpy_d2h")) return;
    if (bytes) s->be->ops->d2h(s, dst, src, bytes);
}
void ff_memcpy_d2d(ff_stream *s, ff_dptr dst, ff_dptr src, size_t bytes) {
    need(s, dst, bytes);
    need(s, src, bytes);
    if (bytes) s->be->ops->d2d(s, dst, src, bytes);
}
void ff_memcpy_2d(ff_stream *s, ff_dptr dst, size_t dpitch, ff_dptr src, size_t spitch, size_t width, size_t rows) {
    assert(dpitch >= width && spitch >= width);
    if (!rows || !width) return;
    need(s, dst, (rows - 1) * dpitch + width);
    need(s, src, (rows - 1) * spitch + width);
    if (rows == 1 || (dpitch == width && spitch == width)) {
        s->be->ops->d2d(s, dst, src, rows * width);
    } else if (s->be->ops->d2d_2d) {
        s->be->ops->d2d_2d(s, dst, dpitch, src, spitch, width, rows);
    } else {
        for (size_t r = 0; r < rows; r++) s->be->ops->d2d(s, ff_dptr_add(dst, r * dpitch, 1), ff_dptr_add(src, r * spitch, 1), width);
    }
}
void ff_memset_zero(ff_stream *s, ff_dptr dst, size_t bytes) {
    need(s, dst, bytes);
    if (bytes) s->be->ops->memset0(s, dst, bytes);
}

/* ---- streams ----------------------------------------------------------------------------- */

ff_stream *ff_stream_new(ff_backend *be) {
    ff_stream *s = ff_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->be = be;
    if (be->ops->stream_init(s)) {
        free(s);
        return NULL;
    }
    return s;
}
void ff_stream_destroy(ff_stream **ps) {
    if (!ps || !*ps) return;
    (*ps)->be->ops->stream_fini(*ps);
    free(*ps);
    *ps = NULL;
}
ff_backend *ff_stream_backend(const ff_stream *s) { return s->be; }
int ff_stream_sync(ff_stream *s) {
    if (refused_in_capture(s, "ff_stream_sync"))
        return ff_error_set("ff_stream_sync", "end the capture first (ff_stream_capture_end)", "the stream is capturing a graph");
    int rc = s->be->ops->stream_sync(s);
    if (!s->error[0]) return rc;
    ff_error_set(NULL, NULL, "%s", s->error);
    s->error[0] = '\0';
    return -1;
}
/* ---- events, addresses ---------------------------------------------------------------------- */

ff_event *ff_event_new(ff_backend *be) {
    ff_event *e = ff_calloc(1, sizeof *e);
    if (!e) return NULL;
    e->be = be;
    if (be->ops->event_new && be->ops->event_new(be, &e->impl)) {
        free(e);
        return NULL;
    }
    return e;
}
void ff_event_destroy(ff_event **pe) {
    if (!pe || !*pe) return;
    if ((*pe)->be->ops->event_free) (*pe)->be->ops->event_free((*pe)->be, (*pe)->impl);
    free(*pe);
    *pe = NULL;
}
void ff_event_record(ff_event *e, ff_stream *s) {
    assert(e && s && e->be == s->be);
    if (refused_in_capture(s, "ff_event_record")) return;
    if (s->be->ops->event_record) s->be->ops->event_record(s, e->impl);
}
void ff_stream_wait(ff_stream *s, ff_event *e) {
    assert(e && s && e->be == s->be);
    if (refused_in_capture(s, "ff_stream_wait")) return;
    if (s->be->ops->stream_wait) s->be->ops->stream_wait(s, e->impl);
}
void *ff_dptr_addr(ff_dptr p) {
    assert(p.buf && p.off <= p.buf->size);
    return (char *)p.buf->data + p.off;
}
void *ff_stream_native(ff_stream *s) { return s->be->ops->stream_native ? s->be->ops->stream_native(s) : NULL; }
bool ff_backend_shares_memory_with(const ff_backend *be, const char *coll) {
    if (!coll) return false;
    if (!strcmp(coll, "cpu")) return !strcmp(be->name, "cpu");
    return !strcmp(coll, "nccl") && !strncmp(be->name, "cuda", 4);
}

void ff_stream_fail(ff_stream *s) {
    if (!s->error[0]) snprintf(s->error, sizeof s->error, "%s", ff_error_message()); /* the first failure */
}

/* ---- graphs ---------------------------------------------------------------------------------- */

struct ff_stream_graph {
    ff_stream *s; /* captured on, and replayed on */
    void *impl;
};

bool ff_backend_has_stream_graphs(const ff_backend *be) { return be->ops->capture_begin != NULL; }

bool ff_stream_capturing(const ff_stream *s) { return s->capturing; }

bool ff_stream_capture_failed(ff_stream *s) {
    if (!s->capturing) return false;
    return s->capture_error[0] || s->error[0] || (s->be->ops->capture_invalidated && s->be->ops->capture_invalidated(s));
}

int ff_stream_capture_begin(ff_stream *s) {
    assert(!s->capturing && !tl_capture); /* one capture per thread at a time */
    const char *where = "ff_stream_capture_begin";
    if (!s->be->ops->capture_begin)
        return ff_error_set(where, "run the work as it is queued (ff_backend_has_stream_graphs says where graphs exist)",
                            "the %s backend has no graphs", s->be->name);
    if (s->be->profile)
        return ff_error_set(where, "unset FF_PROFILE_KERNELS to capture graphs",
                            "kernel profiling waits for every kernel, which a graph cannot hold");
    if (s->error[0]) return ff_stream_sync(s); /* an earlier failure: reported, not captured */
    if (s->be->ops->capture_begin(s)) return -1;
    s->capturing = true;
    s->capture_error[0] = '\0';
    tl_capture = s;
    return 0;
}

int ff_stream_capture_end(ff_stream *s, ff_stream_graph **out) {
    assert(s->capturing && out && tl_capture == s); /* ended on the thread that began it */
    *out = NULL;
    void *impl = NULL;
    int rc = s->be->ops->capture_end(s, &impl);
    s->capturing = false;
    tl_capture = NULL;
    if (s->capture_error[0] || s->error[0]) { /* a refused call, or a kernel that failed while captured */
        if (impl) s->be->ops->graph_free(s, impl);
        ff_error_set("graph capture", NULL, "%s", s->capture_error[0] ? s->capture_error : s->error);
        s->capture_error[0] = s->error[0] = '\0';
        return -1;
    }
    if (rc) return -1;
    ff_stream_graph *g = ff_calloc(1, sizeof *g);
    if (!g) {
        s->be->ops->graph_free(s, impl);
        return -1;
    }
    g->s = s;
    g->impl = impl;
    *out = g;
    return 0;
}

int ff_stream_graph_launch(ff_stream_graph *g, ff_stream *s) {
    assert(g && s == g->s && !s->capturing);
    return s->be->ops->graph_launch(s, g->impl);
}

void ff_stream_graph_destroy(ff_stream_graph **pg) {
    if (!pg || !*pg) return;
    (*pg)->s->be->ops->graph_free((*pg)->s, (*pg)->impl);
    free(*pg);
    *pg = NULL;
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* FF_PROFILE_KERNELS=1: wall time per kernel (after a stream sync), printed to stderr when
 * the backend is destroyed. Off by default; then it costs one branch per kernel. */
static void prof_add(ff_stream *s, const char *name, int64_t t0) {
    ff_backend *be = s->be;
    be->ops->stream_sync(s); /* the wait alone: a kernel's failure stays for the caller's sync */
    int64_t dt = ff_now_ns() - t0;
    int i = 0;
    while (i < be->n_prof && be->prof[i].name != name) i++;
    if (i == be->n_prof) {
        if (be->n_prof == (int)(sizeof be->prof / sizeof be->prof[0])) return;
        be->prof[be->n_prof++].name = name;
    }
    be->prof[i].ns += dt;
    be->prof[i].calls++;
}

#define PROF_AS(op, name, ...)                                     \
    do {                                                           \
        int64_t t0_ = s->be->profile ? ff_now_ns() : 0;            \
        s->be->ops->op(__VA_ARGS__);                               \
        if (s->be->profile) prof_add(s, (name), t0_);              \
    } while (0)
#define PROF(op, ...) PROF_AS(op, #op, __VA_ARGS__)
/* products by their transposes (a layer's forward NT, input gradients NN, weight gradients TN) */
static const char *const gemm_names[2][2] = {{"gemm NN", "gemm NT"}, {"gemm TN", "gemm TT"}};
static const char *const gemm16_names[2][2] = {{"gemm_bf16 NN", "gemm_bf16 NT"}, {"gemm_bf16 TN", "gemm_bf16 TT"}};

static void prof_print(const ff_backend *be) {
    int64_t total = 0;
    for (int i = 0; i < be->n_prof; i++) total += be->prof[i].ns;
    fprintf(stderr, "kernel profile (%s backend, %d threads): %.1f ms in kernels\n", be->name, be->n_threads, total * 1e-6);
    for (int i = 0; i < be->n_prof; i++)
        fprintf(stderr, "  %-18s %9lld calls %10.2f ms %5.1f%%\n", be->prof[i].name, (long long)be->prof[i].calls,
                be->prof[i].ns * 1e-6, total ? 100.0 * (double)be->prof[i].ns / (double)total : 0.0);
}

void ff_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, int lda, ff_dptr B,
             int ldb, float beta, ff_dptr C, int ldc) {
    assert(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K > 0) {
        if (ta == FF_NO_TRANS) need_mat(s, A, M, K, lda);
        else need_mat(s, A, K, M, lda);
        if (tb == FF_NO_TRANS) need_mat(s, B, K, N, ldb);
        else need_mat(s, B, N, K, ldb);
    }
    need_mat(s, C, M, N, ldc);
    PROF_AS(gemm, gemm_names[ta][tb], s, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void ff_gemm_bf16w(ff_stream *s, int M, int N, int K, ff_dptr A, int lda, ff_dptr W, int ldw, float beta, ff_dptr C,
                   int ldc) {
    assert(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K > 0) {
        need_mat(s, A, M, K, lda);
        assert(ldw >= K);
        need(s, W, (((size_t)N - 1) * (size_t)ldw + (size_t)K) * 2);
    }
    need_mat(s, C, M, N, ldc);
    PROF(gemm_bf16w, s, M, N, K, A, lda, W, ldw, beta, C, ldc);
}

void ff_gemm_bf16(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, bool a16, int lda,
                  ff_dptr B, bool b16, int ldb, float beta, ff_dptr C, int ldc) {
    assert(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    if (K > 0) {
        const size_t ea = a16 ? 2 : 4, eb = b16 ? 2 : 4;
        if (ta == FF_NO_TRANS) need_mat_of(s, A, M, K, lda, ea);
        else need_mat_of(s, A, K, M, lda, ea);
        if (tb == FF_NO_TRANS) need_mat_of(s, B, K, N, ldb, eb);
        else need_mat_of(s, B, N, K, ldb, eb);
    }
    need_mat(s, C, M, N, ldc);
    PROF_AS(gemm_bf16, gemm16_names[ta][tb], s, ta, tb, M, N, K, alpha, A, a16, lda, B, b16, ldb, beta, C, false, ldc);
}

void ff_gemm_bf16_out(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, ff_dptr A, bool a16, int lda,
                      ff_dptr B, bool b16, int ldb, ff_dptr C16, int ldc) {
    assert(M >= 0 && N >= 0 && K > 0);
    if (M == 0 || N == 0) return;
    const size_t ea = a16 ? 2 : 4, eb = b16 ? 2 : 4;
    if (ta == FF_NO_TRANS) need_mat_of(s, A, M, K, lda, ea);
    else need_mat_of(s, A, K, M, lda, ea);
    if (tb == FF_NO_TRANS) need_mat_of(s, B, K, N, ldb, eb);
    else need_mat_of(s, B, N, K, ldb, eb);
    need_mat_of(s, C16, M, N, ldc, 2);
    PROF_AS(gemm_bf16, gemm16_names[ta][tb], s, ta, tb, M, N, K, 1.0f, A, a16, lda, B, b16, ldb, 0.0f, C16, true, ldc);
}

void ff_embedding_fwd_bf16(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H) {
    need(s, tokens, (size_t)T * 4);
    need_mat(s, out, T, H, H);
    (void)table;
    PROF(embedding_fwd_bf16, s, tokens, table, out, T, H);
}
void ff_cast_f32_bf16(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n) {
    assert(n >= 0);
    need(s, src, (size_t)n * 4);
    need(s, dst, (size_t)n * 2);
    if (n) PROF(cast_f32_bf16, s, src, dst, n);
}
void ff_cast_bf16_f32(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n) {
    assert(n >= 0);
    need(s, src, (size_t)n * 2);
    need(s, dst, (size_t)n * 4);
    if (n) PROF(cast_bf16_f32, s, src, dst, n);
}

void ff_embedding_fwd(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H) {
    need(s, tokens, (size_t)T * 4);
    need_mat(s, out, T, H, H);
    (void)table;
    PROF(embedding_fwd, s, tokens, table, out, T, H);
}
void ff_embedding_bwd(ff_stream *s, ff_dptr tokens, ff_dptr dout, ff_dptr dtable, int T, int H) {
    need(s, tokens, (size_t)T * 4);
    need_mat(s, dout, T, H, H);
    (void)dtable;
    PROF(embedding_bwd, s, tokens, dout, dtable, T, H);
}

void ff_rmsnorm_fwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, int T, int H, float eps) {
    need_mat(s, x, T, H, H);
    need(s, w, (size_t)H * 4);
    need_mat(s, out, T, H, H);
    need(s, rstd, (size_t)T * 4);
    PROF(rmsnorm_fwd, s, x, w, out, rstd, T, H, eps);
}
void ff_rmsnorm_bwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr rstd, ff_dptr dout, ff_dptr dx, ff_dptr dw, int T,
                    int H) {
    need_mat(s, x, T, H, H);
    need(s, w, (size_t)H * 4);
    need(s, rstd, (size_t)T * 4);
    need_mat(s, dout, T, H, H);
    need_mat(s, dx, T, H, H);
    need(s, dw, (size_t)H * 4);
    PROF(rmsnorm_bwd, s, x, w, rstd, dout, dx, dw, T, H);
}

void ff_rope_fwd(ff_stream *s, ff_dptr x, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads,
                 int D) {
    assert(D % 2 == 0);
    need_mat(s, x, T, n_heads * D, ld);
    need(s, pos, (size_t)T * 4);
    PROF(rope, s, x, ld, pos, cos_t, sin_t, T, n_heads, D, 0);
}
void ff_rope_bwd(ff_stream *s, ff_dptr dx, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads,
                 int D) {
    assert(D % 2 == 0);
    need_mat(s, dx, T, n_heads * D, ld);
    need(s, pos, (size_t)T * 4);
    PROF(rope, s, dx, ld, pos, cos_t, sin_t, T, n_heads, D, 1);
}

void ff_bias_add(ff_stream *s, ff_dptr x, int ld, ff_dptr b, int T, int N) {
    need_mat(s, x, T, N, ld);
    need(s, b, (size_t)N * 4);
    PROF(bias_add, s, x, ld, b, T, N);
}
void ff_bias_bwd(ff_stream *s, ff_dptr dy, int ld, ff_dptr db, int T, int N) {
    need_mat(s, dy, T, N, ld);
    need(s, db, (size_t)N * 4);
    PROF(bias_bwd, s, dy, ld, db, T, N);
}

void ff_swiglu_fwd(ff_stream *s, ff_dptr gu, ff_dptr h, int T, int inter) {
    need_mat(s, gu, T, 2 * inter, 2 * inter);
    need_mat(s, h, T, inter, inter);
    PROF(swiglu_fwd, s, gu, h, T, inter, false);
}
void ff_swiglu_bwd(ff_stream *s, ff_dptr gu, ff_dptr dh, ff_dptr dgu, int T, int inter) {
    need_mat(s, gu, T, 2 * inter, 2 * inter);
    need_mat(s, dh, T, inter, inter);
    need_mat(s, dgu, T, 2 * inter, 2 * inter);
    PROF(swiglu_bwd, s, gu, dh, dgu, T, inter, false);
}
void ff_swiglu_fwd_bf16(ff_stream *s, ff_dptr gu16, ff_dptr h16, int T, int inter) {
    need_mat_of(s, gu16, T, 2 * inter, 2 * inter, 2);
    need_mat_of(s, h16, T, inter, inter, 2);
    PROF_AS(swiglu_fwd, "swiglu_fwd_bf16", s, gu16, h16, T, inter, true);
}
void ff_swiglu_bwd_bf16(ff_stream *s, ff_dptr gu16, ff_dptr dh16, ff_dptr dgu16, int T, int inter) {
    need_mat_of(s, gu16, T, 2 * inter, 2 * inter, 2);
    need_mat_of(s, dh16, T, inter, inter, 2);
    need_mat_of(s, dgu16, T, 2 * inter, 2 * inter, 2);
    PROF_AS(swiglu_bwd, "swiglu_bwd_bf16", s, gu16, dh16, dgu16, T, inter, true);
}

/* The arguments both training attentions check; e: the bytes of an element of qkv and out. */
static void need_att(const ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv, int D,
                     ff_dptr out, ff_dptr lse, size_t e) {
    assert(Hkv > 0 && Hq % Hkv == 0);
    need_mat_of(s, qkv, T, (Hq + 2 * Hkv) * D, ld, e);
    need(s, seq_start, ((size_t)S + 1) * 4);
    need_mat_of(s, out, T, Hq * D, Hq * D, e);
    need(s, lse, (size_t)T * (size_t)Hq * 4);
}
static void need_att_bwd(const ff_stream *s, const int32_t *seq_start_host, int S, int T, int Hq, int Hkv, int D,
                         ff_dptr dout, ff_dptr delta, ff_dptr dqkv, int ld, size_t e) {
    assert(seq_start_host[0] == 0 && seq_start_host[S] == T);
    (void)seq_start_host, (void)S; /* read by the assertion alone */
    need_mat_of(s, dout, T, Hq * D, Hq * D, e);
    need(s, delta, (size_t)T * (size_t)Hq * 4);
    need_mat(s, dqkv, T, (Hq + 2 * Hkv) * D, ld);
}
void ff_attention_fwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv, int D,
                      ff_dptr out, ff_dptr lse) {
    need_att(s, qkv, ld, seq_start, S, T, Hq, Hkv, D, out, lse, 4);
    PROF(attention_fwd, s, qkv, ld, seq_start, S, T, Hq, Hkv, D, out, lse, false);
}
void ff_attention_fwd_bf16(ff_stream *s, ff_dptr qkv16, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv, int D,
                           ff_dptr out16, ff_dptr lse) {
    need_att(s, qkv16, ld, seq_start, S, T, Hq, Hkv, D, out16, lse, 2);
    PROF_AS(attention_fwd, "attention_fwd_bf16", s, qkv16, ld, seq_start, S, T, Hq, Hkv, D, out16, lse, true);
}
void ff_attention_bwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, const int32_t *seq_start_host, int S,
                      int T, int Hq, int Hkv, int D, ff_dptr out, ff_dptr lse, ff_dptr dout, ff_dptr delta,
                      ff_dptr dqkv) {
    need_att(s, qkv, ld, seq_start, S, T, Hq, Hkv, D, out, lse, 4);
    need_att_bwd(s, seq_start_host, S, T, Hq, Hkv, D, dout, delta, dqkv, ld, 4);
    PROF(attention_bwd, s, qkv, ld, seq_start, seq_start_host, S, T, Hq, Hkv, D, out, lse, dout, delta, dqkv, false);
}
void ff_attention_bwd_bf16(ff_stream *s, ff_dptr qkv16, int ld, ff_dptr seq_start, const int32_t *seq_start_host, int S,
                           int T, int Hq, int Hkv, int D, ff_dptr out16, ff_dptr lse, ff_dptr dout16, ff_dptr delta,
                           ff_dptr dqkv) {
    need_att(s, qkv16, ld, seq_start, S, T, Hq, Hkv, D, out16, lse, 2);
    need_att_bwd(s, seq_start_host, S, T, Hq, Hkv, D, dout16, delta, dqkv, ld, 2);
    PROF_AS(attention_bwd, "attention_bwd_bf16", s, qkv16, ld, seq_start, seq_start_host, S, T, Hq, Hkv, D, out16, lse, dout16,
            delta, dqkv, true);
}
/* The arguments both cached attentions check (the caches' element type is the kernel's). */
static void need_cached(const ff_stream *s, ff_dptr q, int ldq, ff_dptr table, int S, int table_ld, int block_rows, ff_dptr seq,
                        ff_dptr n_keys, int T, int Hq, int Hkv, int D, ff_dptr out) {
    assert(Hkv > 0 && Hq % Hkv == 0 && S >= 1 && table_ld >= 1 && block_rows >= 1);
    (void)block_rows, (void)Hkv; /* read by the assertion only */
    need_mat(s, q, T, Hq * D, ldq);
    need(s, table, (size_t)S * (size_t)table_ld * 4);
    need(s, seq, (size_t)T * 4);
    need(s, n_keys, (size_t)T * 4);
    need_mat(s, out, T, Hq * D, Hq * D);
}
void ff_attention_cached(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                         int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                         ff_dptr out) {
    need_cached(s, q, ldq, table, S, table_ld, block_rows, seq, n_keys, T, Hq, Hkv, D, out);
    PROF(attention_cached, s, q, ldq, kcache, vcache, table, S, table_ld, block_rows, seq, n_keys, T, Hq, Hkv, D, out);
}
void ff_attention_cached_bf16(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                              int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                              ff_dptr out) {
    need_cached(s, q, ldq, table, S, table_ld, block_rows, seq, n_keys, T, Hq, Hkv, D, out);
    PROF(attention_cached_bf16, s, q, ldq, kcache, vcache, table, S, table_ld, block_rows, seq, n_keys, T, Hq, Hkv, D, out);
}
void ff_scatter_rows_bf16(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N) {
    need_mat(s, src, T, N, lds);
    need(s, rows, (size_t)T * 4);
    PROF(scatter_rows_bf16, s, src, lds, dst, rows, T, N);
}
void ff_scatter_rows(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N) {
    need_mat(s, src, T, N, lds);
    need(s, rows, (size_t)T * 4);
    PROF(scatter_rows, s, src, lds, dst, rows, T, N);
}
void ff_gather_rows(ff_stream *s, ff_dptr src, ff_dptr rows, ff_dptr dst, int R, int N) {
    need(s, rows, (size_t)R * 4);
    need_mat(s, dst, R, N, N);
    PROF(gather_rows, s, src, rows, dst, R, N);
}

void ff_logprob_fwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr logprob,
                    ff_dptr entropy, ff_dptr lse) {
    need_mat(s, logits, T, V, V);
    need_opt(s, targets, (size_t)T * 4);
    need_opt(s, logprob, (size_t)T * 4);
    need_opt(s, entropy, (size_t)T * 4);
    need(s, lse, (size_t)T * 4);
    assert(ff_dptr_null(logprob) || !ff_dptr_null(targets));
    PROF(logprob_fwd, s, logits, targets, inv_temp, T, V, logprob, entropy, lse);
}
static void logprob_bwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                        ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy, bool b16) {
    need_mat(s, logits, T, V, V);
    need_opt(s, targets, (size_t)T * 4);
    need(s, lse, (size_t)T * 4);
    need_opt(s, dlogprob, (size_t)T * 4);
    need_opt(s, dentropy, (size_t)T * 4);
    assert(ff_dptr_null(dlogprob) || !ff_dptr_null(targets));
    assert(ff_dptr_null(dentropy) || !ff_dptr_null(entropy));
    need_opt(s, entropy, (size_t)T * 4);
    PROF_AS(logprob_bwd, b16 ? "logprob_bwd_bf16" : "logprob_bwd", s, logits, targets, inv_temp, T, V, lse, dlogprob,
            dentropy, entropy, b16);
}
void ff_logprob_bwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                    ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy) {
    logprob_bwd(s, logits, targets, inv_temp, T, V, lse, dlogprob, dentropy, entropy, false);
}
void ff_logprob_bwd_bf16(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                         ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy) {
    logprob_bwd(s, logits, targets, inv_temp, T, V, lse, dlogprob, dentropy, entropy, true);
}

void ff_add(ff_stream *s, ff_dptr y, ff_dptr x, int64_t n) {
    need(s, y, (size_t)n * 4);
    need(s, x, (size_t)n * 4);
    PROF(add, s, y, x, n);
}
void ff_scale(ff_stream *s, ff_dptr x, int64_t n, float alpha) {
    need(s, x, (size_t)n * 4);
    PROF(scale, s, x, n, alpha);
}
double ff_sumsq(ff_stream *s, ff_dptr x, int64_t n) {
    need(s, x, (size_t)n * 4);
    if (refused_in_capture(s, "ff_sumsq")) return 0.0;
    int64_t t0 = s->be->profile ? ff_now_ns() : 0;
    double r = s->be->ops->sumsq(s, x, n);
    if (s->be->profile) prof_add(s, "sumsq", t0);
    return r;
}
void ff_adamw(ff_stream *s, ff_dptr param, ff_dptr grad, ff_dptr m, ff_dptr v, int64_t n, float lr, float b1,
              float b2, float eps, float weight_decay, float bc1, float bc2, float grad_scale) {
    need(s, param, (size_t)n * 4);
    need(s, grad, (size_t)n * 4);
    need(s, m, (size_t)n * 4);
    need(s, v, (size_t)n * 4);
    PROF(adamw, s, param, grad, m, v, n, lr, b1, b2, eps, weight_decay, bc1, bc2, grad_scale);
}
void ff_sample(ff_stream *s, ff_dptr logits, int B, int V, ff_dptr params, ff_dptr workspace, ff_dptr tokens,
               ff_dptr logprob) {
    need_mat(s, logits, B, V, V);
    need(s, params, (size_t)B * sizeof(ff_sample_params));
    need(s, workspace, (size_t)B * (size_t)V * 8);
    need(s, tokens, (size_t)B * 4);
    need(s, logprob, (size_t)B * 4);
    PROF(sample, s, logits, B, V, params, workspace, tokens, logprob);
}
