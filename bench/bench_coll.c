/* bench_coll: all-reduce bandwidth of the cpu backend between processes on this host, for
 * 1 KB to 64 MB on 2, 4 and 8 processes, beside (in the same run, on the same transport)
 * the naive all-reduce a user would otherwise write (gather to rank 0 with send/recv,
 * reduce there, send back), the same all-reduce with the shared-memory fast path off (TCP
 * only, what ranks on different hosts get), and memcpy as the ceiling of this machine.
 *
 * Bus bandwidth as nccl-tests define it: algbw = bytes / time, busbw = algbw * 2(n-1)/n
 * (what each rank's link must carry for a bandwidth-optimal all-reduce), so numbers for
 * different n compare. Time is rank 0's median per call; the alternatives alternate call
 * by call, so a noisy machine treats them alike.
 *
 *   bench_coll [--ranks 2,4,8] [--max-bytes 67108864] [--min-bytes 1024] [--quick]
 *
 * The last line is the headline: ring busbw on the largest size and rank count, with its
 * ratio to the naive all-reduce. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "bench_util.h"

#define MAX_SIZES 32

typedef struct result {
    double ff_s, tcp_s, naive_s; /* median seconds per call on rank 0 */
    double split_s;              /* [0] only: ff_coll_comm_split into two halves, on rank 0 */
    int ok;
} result;

/* gather to rank 0, reduce there, send the result back: all through the same transport */
static int naive_all_reduce(float *buf, float *tmp, size_t count, ff_coll_comm *c) {
    int n = ff_coll_comm_size(c), r = ff_coll_comm_rank(c);
    if (r != 0) {
        if (ff_coll_send(buf, count, FF_DTYPE_F32, 0, c, NULL)) return -1;
        return ff_coll_recv(buf, count, FF_DTYPE_F32, 0, c, NULL);
    }
    ff_coll_group_start();
    for (int p = 1; p < n; p++) ff_coll_recv(tmp + (size_t)(p - 1) * count, count, FF_DTYPE_F32, p, c, NULL);
    if (ff_coll_group_end()) return -1;
    for (int p = 1; p < n; p++) {
        const float *x = tmp + (size_t)(p - 1) * count;
        for (size_t i = 0; i < count; i++) buf[i] += x[i];
    }
    for (size_t i = 0; i < count; i++) buf[i] /= (float)n;
    ff_coll_group_start();
    for (int p = 1; p < n; p++) ff_coll_send(buf, count, FF_DTYPE_F32, p, c, NULL);
    return ff_coll_group_end();
}

static int iters_for(size_t bytes, int quick) {
    double target = quick ? 48e6 : 160e6; /* bytes per alternative and size */
    int it = (int)(target / (double)bytes);
    int lo = quick ? 3 : 5, hi = quick ? 40 : 200;
    return it < lo ? lo : it > hi ? hi : it;
}

/* Every iteration runs the three alternatives back to back (same conditions on a noisy
 * machine); each call is bracketed by a one-element all-reduce so that rank 0's time is
 * the call's, not the stragglers' of the call before. */
static int rank_main(int n, int rank, const ff_coll_id *id_shm, const ff_coll_id *id_tcp, const size_t *sizes,
                     int nsizes, int quick, result *out) {
    ff_coll_options o = {.timeout_s = 120};
    ff_coll_comm *c = NULL, *t = NULL;
    if (ff_coll_comm_init(&c, n, id_shm, rank, &o)) goto fail;
    setenv("FF_COLL_SHM", "0", 1); /* the second communicator: TCP only, as across hosts */
    if (ff_coll_comm_init(&t, n, id_tcp, rank, &o)) goto fail;
    size_t maxb = sizes[nsizes - 1];
    float *buf = malloc(maxb), *tmp = rank == 0 ? malloc(maxb * (size_t)(n - 1)) : NULL;
    double *d = malloc(3 * 200 * sizeof *d);
    if (!buf || (rank == 0 && !tmp) || !d) goto fail;
    for (size_t i = 0; i < maxb / 4; i++) buf[i] = (float)(i % 7);
    /* a sub-group: how much a split costs (connections and shared memory for the halves) */
    if (barrier(c)) goto fail;
    double ts = now_s();
    ff_coll_comm *half = NULL;
    if (ff_coll_comm_split(c, rank < n / 2, rank, &half) || barrier(half)) goto fail;
    double split_s = now_s() - ts;
    ff_coll_comm_destroy(&half);
    for (int s = 0; s < nsizes; s++) {
        size_t count = sizes[s] / 4;
        int it = iters_for(sizes[s], quick);
        /* warm-up (first touch, scratch growth) */
        if (ff_coll_all_reduce(buf, buf, count, FF_DTYPE_F32, FF_COLL_AVG, c, NULL) ||
            ff_coll_all_reduce(buf, buf, count, FF_DTYPE_F32, FF_COLL_AVG, t, NULL) ||
            naive_all_reduce(buf, tmp, count, c))
            goto fail;
        for (int i = 0; i < it; i++) {
            double t0, t1;
            if (barrier(c)) goto fail;
            t0 = now_s();
            if (ff_coll_all_reduce(buf, buf, count, FF_DTYPE_F32, FF_COLL_AVG, c, NULL)) goto fail;
            t1 = now_s();
            d[i] = t1 - t0;
            if (barrier(t)) goto fail;
            t0 = now_s();
            if (ff_coll_all_reduce(buf, buf, count, FF_DTYPE_F32, FF_COLL_AVG, t, NULL)) goto fail;
            t1 = now_s();
            d[200 + i] = t1 - t0;
            if (barrier(c)) goto fail;
            t0 = now_s();
            if (naive_all_reduce(buf, tmp, count, c)) goto fail;
            t1 = now_s();
            d[400 + i] = t1 - t0;
        }
        if (rank == 0)
            out[s] = (result){.ff_s = median(d, it), .tcp_s = median(d + 200, it), .naive_s = median(d + 400, it),
                              .split_s = split_s, .ok = 1};
    }
    ff_coll_comm_destroy(&c);
    ff_coll_comm_destroy(&t);
    free(buf);
    free(tmp);
    free(d);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
    ff_coll_comm_destroy(&c);
    ff_coll_comm_destroy(&t);
    return 1;
}

static double memcpy_gbs(size_t bytes) {
    char *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    int it = iters_for(bytes, 0) * 2;
    double t0 = now_s();
    for (int i = 0; i < it; i++) {
        memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
        __asm__ volatile("" ::: "memory");
    }
    double t = (now_s() - t0) / it;
    free(a);
    free(b);
    return (double)bytes / t / 1e9;
}

static void usage(void) {
    printf("usage: bench_coll [--ranks 2,4,8] [--min-bytes N] [--max-bytes N] [--quick]\n"
           "  all-reduce bus bandwidth of ff_coll's cpu backend (TCP between processes on this host)\n"
           "  beside a naive gather-reduce-send-back all-reduce and memcpy, sizes x4 from min to max.\n");
}

int main(int argc, char **argv) {
    int ranks[8] = {2, 4, 8}, nr = 3, quick = 0;
    size_t minb = 1024, maxb = 64u << 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            nr = 0;
            for (char *t = strtok(argv[++i], ","); t && nr < 8; t = strtok(NULL, ",")) ranks[nr++] = atoi(t);
        } else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) {
            maxb = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc) {
            minb = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else {
            usage();
            return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
        }
    }
    for (int i = 0; i < nr; i++)
        if (ranks[i] < 2 || ranks[i] > 64) {
            fprintf(stderr, "bench_coll: --ranks takes counts from 2 to 64\n");
            return 2;
        }
    if (minb < 4 || maxb < minb) {
        fprintf(stderr, "bench_coll: need 4 <= --min-bytes <= --max-bytes\n");
        return 2;
    }
    size_t sizes[MAX_SIZES];
    int ns = 0;
    for (size_t b = minb; b <= maxb && ns < MAX_SIZES; b *= 4) sizes[ns++] = b & ~(size_t)3;
    result *res = mmap(NULL, sizeof(result) * MAX_SIZES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double mc[MAX_SIZES];
    for (int s = 0; s < ns; s++) mc[s] = memcpy_gbs(sizes[s]);
    printf("ff_coll cpu backend, all-reduce (F32 avg, in place), processes on one host with %ld cores;\n"
           "busbw = bytes/t * 2(n-1)/n; median per call; ff = auto algorithm over shared memory, ff tcp = the same\n"
           "over TCP only (FF_COLL_SHM=0, as across hosts), naive = gather to rank 0 + reduce + send back\n",
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("%5s %10s %11s %11s %11s %11s %9s %11s\n", "ranks", "bytes", "ff time", "ff busbw", "ff tcp", "naive",
           "ff/naive", "memcpy");
    double head_ff = 0, head_naive = 0, head_mc = 0, head_tcp = 0;
    int head_n = 0;
    size_t head_b = 0;
    for (int k = 0; k < nr; k++) {
        int n = ranks[k];
        memset(res, 0, sizeof(result) * MAX_SIZES);
        fflush(stdout);
        /* rank 0 makes the id (this process makes none: it forks) */
        int pfd[2];
        if (pipe(pfd)) return 1;
        pid_t pids[64];
        for (int r = 0; r < n; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                ff_coll_id id[2];
                if (r == 0) {
                    if (ff_coll_get_unique_id(&id[0], "cpu", NULL) || ff_coll_get_unique_id(&id[1], "cpu", NULL)) {
                        fprintf(stderr, "%s\n", ff_error_message());
                        exit(1);
                    }
                    for (int p = 1; p < n; p++)
                        if (write(pfd[1], id, sizeof id) != (ssize_t)sizeof id) exit(1);
                } else if (read(pfd[0], id, sizeof id) != (ssize_t)sizeof id) {
                    exit(1);
                }
                close(pfd[0]);
                close(pfd[1]);
                exit(rank_main(n, r, &id[0], &id[1], sizes, ns, quick, res));
            }
        }
        close(pfd[0]);
        close(pfd[1]);
        int bad = 0;
        for (int r = 0; r < n; r++) {
            int st;
            waitpid(pids[r], &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
        }
        if (bad) {
            fprintf(stderr, "bench_coll: a rank failed with %d ranks\n", n);
            return 1;
        }
        double f = 2.0 * (n - 1) / n;
        printf("%5d ranks: ff_coll_comm_split into two halves (new connections and shared memory) %.2f ms\n", n,
               res[0].split_s * 1e3);
        for (int s = 0; s < ns; s++) {
            double ff = (double)sizes[s] / res[s].ff_s / 1e9 * f, nv = (double)sizes[s] / res[s].naive_s / 1e9 * f;
            double tcp = (double)sizes[s] / res[s].tcp_s / 1e9 * f;
            printf("%5d %10zu %8.1f us %6.3f GB/s %6.3f GB/s %6.3f GB/s %8.2fx %6.2f GB/s\n", n, sizes[s],
                   res[s].ff_s * 1e6, ff, tcp, nv, ff / nv, mc[s]);
            if (n >= head_n && sizes[s] >= head_b) {
                head_n = n;
                head_b = sizes[s];
                head_ff = ff;
                head_naive = nv;
                head_tcp = tcp;
                head_mc = mc[s];
            }
        }
        fflush(stdout);
    }
    printf("coll_allreduce_busbw_%dproc_%zuMB: %.3f GB/s (target: >= 1.2x the naive gather-reduce-send-back "
           "all-reduce on the same transport; naive %.3f GB/s, ratio %.2fx; over TCP only %.3f GB/s; memcpy %.2f GB/s)\n",
           head_n, head_b >> 20, head_ff, head_naive, head_ff / head_naive, head_tcp, head_mc);
    return 0;
}
