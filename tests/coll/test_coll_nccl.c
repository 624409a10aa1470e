/* The nccl backend: one process per visible GPU (up to 4), device buffers, every call
 * checked against the serial result after ff_coll_synchronize. Skips, saying why, where
 * fuseflow was built without NCCL or no CUDA device is visible. CUDA does not survive
 * fork(), so the parent never touches CUDA: a probe child counts the devices.
 * Built with FF_TEST_NCCL_EMU (coll/test_coll_nccl_emu), the same nccl_backend.c runs on the
 * NCCL stand-in (tests/coll/nccl_emu/) over 4 emulated devices. */
#ifndef FF_COLL_HAVE_NCCL
#include "tests/test_util.h"
int main(void) {
    (void)ff_test_failures;
    SKIP("nccl backend: fuseflow was built without NCCL (no CUDA toolkit or NCCL at configure time)");
}
#else
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>

#include "coll_test.h"
#ifdef FF_TEST_NCCL_EMU
#include "workers/coll/coll_internal.h"
extern const coll_nccl_ops coll_nccl_emu_ops; /* nccl_backend.c built against tests/coll/nccl_emu/ */
#endif

#define COUNT 100003 /* not divisible by 2, 3 or 4 */

static int set_device(int rank) { return cudaSetDevice(rank) == cudaSuccess ? 0 : -1; }

static float v(int rank, size_t i) { return (float)((rank * 5 + (int)(i % 97)) % 11); }

static int nccl_rank(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)arg;
    int fails = 0;
    RCHECK(strcmp(ff_coll_comm_backend(c), "nccl") == 0, "backend %s", ff_coll_comm_backend(c));
    cudaStream_t st;
    RCHECK(cudaStreamCreate(&st) == cudaSuccess, "stream");
    size_t full = (size_t)COUNT * (size_t)n;
    float *h = malloc(full * 4), *d = NULL, *d2 = NULL;
    RCHECK(cudaMalloc((void **)&d, full * 4) == cudaSuccess && cudaMalloc((void **)&d2, full * 4) == cudaSuccess,
           "cudaMalloc");
    /* all_reduce sum and avg, in place */
    for (size_t i = 0; i < COUNT; i++) h[i] = v(rank, i);
    cudaMemcpy(d, h, COUNT * 4, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_all_reduce(d, d, COUNT, FF_DTYPE_F32, FF_COLL_SUM, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    cudaMemcpy(h, d, COUNT * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < COUNT; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += v(r, i);
        if (h[i] != want) {
            RCHECK(0, "all_reduce i=%zu got %g want %g", i, h[i], want);
            break;
        }
    }
    /* broadcast from the last rank */
    for (size_t i = 0; i < COUNT; i++) h[i] = rank == n - 1 ? v(99, i) : -1;
    cudaMemcpy(d, h, COUNT * 4, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_broadcast(d, d, COUNT, FF_DTYPE_F32, n - 1, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    cudaMemcpy(h, d, COUNT * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < COUNT; i++)
        if (h[i] != v(99, i)) {
            RCHECK(0, "broadcast i=%zu", i);
            break;
        }
    /* all_gather, then reduce_scatter of the gathered buffer */
    for (size_t i = 0; i < COUNT; i++) h[i] = v(rank, i) + 1000.0f * (float)rank;
    cudaMemcpy(d, h, COUNT * 4, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_all_gather(d, d2, COUNT, FF_DTYPE_F32, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_reduce_scatter(d2, d, COUNT, FF_DTYPE_F32, FF_COLL_SUM, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    cudaMemcpy(h, d, COUNT * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < COUNT; i++) /* every rank contributed the same gathered buffer */
        if (h[i] != (float)n * (v(rank, i) + 1000.0f * (float)rank)) {
            RCHECK(0, "all_gather + reduce_scatter i=%zu got %g", i, h[i]);
            break;
        }
    /* all_gather_v with uneven counts (rank 0 contributes nothing) */
    size_t counts[8], off = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = r == 0 ? 0 : (size_t)(1000 * r + 7);
        off += counts[r];
    }
    for (size_t i = 0; i < counts[rank]; i++) h[i] = (float)rank * 3 + (float)(i % 5);
    cudaMemcpy(d, h, counts[rank] * 4 + 4, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_all_gather_v(d, d2, counts, FF_DTYPE_F32, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    cudaMemcpy(h, d2, off * 4, cudaMemcpyDeviceToHost);
    size_t o = 0;
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < counts[r]; i++)
            if (h[o + i] != (float)r * 3 + (float)(i % 5)) {
                RCHECK(0, "all_gather_v r=%d i=%zu", r, i);
                break;
            }
        o += counts[r];
    }
    /* reduce_scatter_v (grouped reduces) with the same uneven counts: rank r's part is the sum
     * over ranks of its slice of their full buffers */
    for (size_t i = 0; i < off; i++) h[i] = (float)(rank + 1) * (float)(i % 13);
    cudaMemcpy(d, h, off * 4, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_reduce_scatter_v(d, d2, counts, FF_DTYPE_F32, FF_COLL_SUM, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    size_t mine = 0;
    for (int r = 0; r < rank; r++) mine += counts[r];
    cudaMemcpy(h, d2, counts[rank] * 4 + 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < counts[rank]; i++)
        if (h[i] != (float)(n * (n + 1) / 2) * (float)((mine + i) % 13)) {
            RCHECK(0, "reduce_scatter_v i=%zu got %g", i, h[i]);
            break;
        }
    /* the other reductions and types: max over int32, avg over fp32, and an int16 broadcast
     * (NCCL has no int16: moved as bytes) */
    int32_t *hi = (int32_t *)h;
    for (size_t i = 0; i < COUNT; i++) hi[i] = (int32_t)(i % 1000) * (rank + 1) - 500 * rank;
    cudaMemcpy(d, hi, COUNT * 4, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_all_reduce(d, d2, COUNT, FF_DTYPE_I32, FF_COLL_MAX, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    cudaMemcpy(hi, d2, COUNT * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < COUNT; i++) {
        int32_t want = INT32_MIN;
        for (int r = 0; r < n; r++) {
            int32_t x = (int32_t)(i % 1000) * (r + 1) - 500 * r;
            want = x > want ? x : want;
        }
        if (hi[i] != want) {
            RCHECK(0, "all_reduce max i=%zu got %d want %d", i, hi[i], want);
            break;
        }
    }
    for (size_t i = 0; i < COUNT; i++) h[i] = v(rank, i);
    cudaMemcpy(d, h, COUNT * 4, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_all_reduce(d, d2, COUNT, FF_DTYPE_F32, FF_COLL_AVG, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    cudaMemcpy(h, d2, COUNT * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < COUNT; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += v(r, i);
        if (fabsf(h[i] - want / (float)n) > 1e-5f * (1.0f + want)) {
            RCHECK(0, "all_reduce avg i=%zu got %g want %g", i, h[i], want / (float)n);
            break;
        }
    }
    int16_t *hs = (int16_t *)h;
    for (size_t i = 0; i < COUNT; i++) hs[i] = (int16_t)(rank == 0 ? (int)(i % 30000) - 15000 : 7);
    cudaMemcpy(d, hs, COUNT * 2, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_broadcast(d, d2, COUNT, FF_DTYPE_I16, 0, c, st) == 0, "%s", ff_error_message());
    RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
    cudaMemcpy(hs, d2, COUNT * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < COUNT; i++)
        if (hs[i] != (int16_t)((int)(i % 30000) - 15000)) {
            RCHECK(0, "int16 broadcast i=%zu got %d", i, hs[i]);
            break;
        }
    /* grouped ring of sends and receives */
    if (n > 1) {
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        for (size_t i = 0; i < COUNT; i++) h[i] = v(rank, i);
        cudaMemcpy(d, h, COUNT * 4, cudaMemcpyHostToDevice);
        RCHECK(ff_coll_group_start() == 0, "start");
        RCHECK(ff_coll_send(d, COUNT, FF_DTYPE_F32, next, c, st) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_recv(d2, COUNT, FF_DTYPE_F32, prev, c, st) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_group_end() == 0, "%s", ff_error_message());
        RCHECK(ff_coll_synchronize(c, st) == 0, "%s", ff_error_message());
        cudaMemcpy(h, d2, COUNT * 4, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < COUNT; i++)
            if (h[i] != v(prev, i)) {
                RCHECK(0, "ring recv i=%zu", i);
                break;
            }
    }
    /* split: every rank alone (color = rank), then an all_reduce there is a copy */
    ff_coll_comm *solo = NULL;
    RCHECK(ff_coll_comm_split(c, rank, 0, &solo) == 0 && solo, "%s", ff_error_message());
    if (solo) {
        RCHECK(ff_coll_comm_size(solo) == 1 && ff_coll_comm_rank(solo) == 0, "split shape");
        RCHECK(ff_coll_all_reduce(d, d2, 16, FF_DTYPE_F32, FF_COLL_SUM, solo, st) == 0, "%s", ff_error_message());
        RCHECK(ff_coll_synchronize(solo, st) == 0, "%s", ff_error_message());
        ff_coll_comm_destroy(&solo);
    }
    cudaFree(d);
    cudaFree(d2);
    cudaStreamDestroy(st);
    free(h);
    return fails;
}

/* ff_coll_comm_twin: a cpu group's NCCL twin (how a worker's models get device collectives)
 * sums device buffers; asked again it is the same communicator; the group still works */
static int twin_rank(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    (void)arg;
    int fails = 0;
    ff_coll_comm *t = NULL, *t2 = NULL;
    RCHECK(ff_coll_comm_twin(c, "nccl", &t) == 0 && t, "twin: %s", ff_error_message());
    if (!t) return fails;
    RCHECK(!strcmp(ff_coll_comm_backend(t), "nccl") && ff_coll_comm_rank(t) == rank && ff_coll_comm_size(t) == n, "twin's shape");
    RCHECK(ff_coll_comm_twin(c, "nccl", &t2) == 0 && t2 == t, "the same twin again");
    float h[64], *d = NULL;
    for (int i = 0; i < 64; i++) h[i] = (float)(rank + i);
    RCHECK(cudaMalloc((void **)&d, sizeof h) == cudaSuccess, "cudaMalloc");
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    RCHECK(ff_coll_all_reduce(d, d, 64, FF_DTYPE_F32, FF_COLL_SUM, t, NULL) == 0 && ff_coll_synchronize(t, NULL) == 0, "%s",
           ff_error_message());
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++) RCHECK(h[i] == (float)(n * (n - 1) / 2 + n * i), "twin sum at %d: %g", i, h[i]);
    cudaFree(d);
    float v = 1;
    RCHECK(ff_coll_all_reduce(&v, &v, 1, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0 && v == (float)n, "the cpu group after");
    return fails; /* the harness destroys c, and the twin with it */
}

int main(void) {
#ifdef FF_TEST_NCCL_EMU
    coll_nccl = &coll_nccl_emu_ops;        /* nccl_backend.c on the NCCL stand-in and the CUDA emulator */
    setenv("FF_CUDA_EMU_DEVICES", "4", 1); /* 4 emulated devices: 4 ranks */
#endif
    /* probe in a child: the parent must not initialise CUDA before forking the ranks */
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    pid_t p = fork();
    if (p == 0) {
        const char *why = NULL;
        int n = 0;
        char msg[256] = "";
        if (ff_coll_backend_available("nccl", &why))
            cudaGetDeviceCount(&n);
        else
            snprintf(msg, sizeof msg, "%s", why ? why : "unavailable");
        if (write(pfd[1], msg, sizeof msg) < 0) _exit(255);
        _exit(n > 8 ? 8 : n);
    }
    char msg[256] = "";
    if (read(pfd[0], msg, sizeof msg) < 0) msg[0] = '\0';
    int st = 0;
    waitpid(p, &st, 0);
    int ngpu = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    if (ngpu == 0) SKIP("nccl backend unavailable here: %s", msg[0] ? msg : "no CUDA device");
    int n = ngpu > 4 ? 4 : ngpu;
    run_opts ro = default_run();
    ro.backend = "nccl";
    ro.setup = set_device;
    ro.comm_opt.timeout_s = 60;
    ro.watchdog_s = 120;
    int f = run_ranks(n, &ro, nccl_rank, NULL);
    printf("nccl: %d rank(s), one per GPU: %s\n", n, f ? "FAILED" : "ok");
    CHECK_EQ_INT(f, 0);
    run_opts rt = default_run(); /* a cpu group, each rank on its GPU, and its NCCL twin */
    rt.setup = set_device;
    rt.comm_opt.timeout_s = 60;
    rt.watchdog_s = 120;
    f = run_ranks(n, &rt, twin_rank, NULL);
    printf("nccl twin of a cpu group: %d rank(s): %s\n", n, f ? "FAILED" : "ok");
    CHECK_EQ_INT(f, 0);
    TEST_MAIN_END();
}
#endif
