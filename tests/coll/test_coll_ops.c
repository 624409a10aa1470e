/* Every collective of the cpu backend on 1 to 8 processes, with each algorithm (auto,
 * ring, direct), uneven counts (0, 1, 7, 4099, 1000003), in-place and out-of-place forms,
 * every reduction op and dtype, checked element by element against a serial computation
 * of the same result. Random-valued all-reduce results must be bitwise identical on every
 * rank and in a second run. */
#include "coll_test.h"

#include "fuseflow/dtype.h"

#define BIG 1000003

static uint64_t mix(uint64_t x) {
    x += FF_SPLITMIX64_GAMMA;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* small integers: sums, products, averages of them are exact in every float type */
static int ival(int rank, size_t i) { return (int)((rank * 7 + i * 13 + (i >> 7)) % 17) - 8; }
static float rnd(int rank, size_t i, uint64_t salt) {
    return (float)((double)(mix(((uint64_t)rank << 40) ^ i ^ salt) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct cfg {
    int algo;
    int big;        /* include the 1000003-element cases */
    int shm;        /* 0: default (every pair shares memory), 1: TCP only, 2: odd ranks TCP only */
} cfg;

/* shared-memory segments this process maps (each pair's segment shows once, deleted) */
static int mapped_segments(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int k = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "/ffcoll-")) k++;
    fclose(f);
    return k;
}

static int check_all_reduce(ff_coll_comm *c, int rank, int n, size_t count) {
    int fails = 0;
    float *send = malloc((count + 1) * 4), *recv = malloc((count + 1) * 4);
    /* the serial results, computed once: sum, max, min of the integers; the random sum */
    int *isum = malloc((count + 1) * sizeof *isum), *imax = malloc((count + 1) * sizeof *imax),
        *imin = malloc((count + 1) * sizeof *imin);
    double *rsum = malloc((count + 1) * sizeof *rsum);
    for (size_t i = 0; i < count; i++) {
        isum[i] = 0;
        imax[i] = -100;
        imin[i] = 100;
        rsum[i] = 0;
        for (int r = 0; r < n; r++) {
            int v = ival(r, i);
            isum[i] += v;
            imax[i] = v > imax[i] ? v : imax[i];
            imin[i] = v < imin[i] ? v : imin[i];
            rsum[i] += rnd(r, i, 1);
        }
    }
    for (size_t i = 0; i < count; i++) send[i] = (float)ival(rank, i);
    /* sum, out of place */
    RCHECK(ff_coll_all_reduce(send, recv, count, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0, "%s", ff_error_message());
    for (size_t i = 0; i < count; i++)
        if (recv[i] != (float)isum[i]) {
            RCHECK(0, "sum count=%zu i=%zu got %g want %d", count, i, recv[i], isum[i]);
            break;
        }
    for (size_t i = 0; i < count; i++)
        if (send[i] != (float)ival(rank, i)) {
            RCHECK(0, "sendbuf modified at %zu", i);
            break;
        }
    /* avg, max, min, in place */
    ff_coll_redop ops[] = {FF_COLL_AVG, FF_COLL_MAX, FF_COLL_MIN};
    for (int o = 0; o < 3; o++) {
        for (size_t i = 0; i < count; i++) recv[i] = (float)ival(rank, i);
        RCHECK(ff_coll_all_reduce(recv, recv, count, FF_DTYPE_F32, ops[o], c, NULL) == 0, "%s", ff_error_message());
        for (size_t i = 0; i < count; i++) {
            float want = ops[o] == FF_COLL_AVG ? (float)isum[i] / (float)n
                         : ops[o] == FF_COLL_MAX ? (float)imax[i]
                                                 : (float)imin[i];
            if (recv[i] != want) {
                RCHECK(0, "%s count=%zu i=%zu got %.9g want %.9g", ff_coll_redop_name(ops[o]), count, i, recv[i],
                       want);
                break;
            }
        }
    }
    /* random values: close to the double-precision sum; the bits are compared across ranks */
    for (size_t i = 0; i < count; i++) send[i] = rnd(rank, i, 1);
    RCHECK(ff_coll_all_reduce(send, recv, count, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0, "%s", ff_error_message());
    for (size_t i = 0; i < count; i++)
        if (!(fabs(recv[i] - rsum[i]) <= 1e-5 + 1e-5 * fabs(rsum[i]))) {
            RCHECK(0, "random sum count=%zu i=%zu got %.9g want %.9g", count, i, recv[i], rsum[i]);
            break;
        }
    if (count == BIG || count == 4099) {
        uint64_t *slot = (uint64_t *)g_shared + (count == BIG ? 0 : 64) + rank;
        *slot = ff_hash_fnv1a(recv, count * 4, FF_HASH_FNV1A_INIT);
    }
    free(send);
    free(recv);
    free(isum);
    free(imax);
    free(imin);
    free(rsum);
    return fails;
}

static int check_dtypes(ff_coll_comm *c, int rank, int n, size_t count) {
    int fails = 0;
    ff_dtype types[] = {FF_DTYPE_F64, FF_DTYPE_BF16, FF_DTYPE_F16, FF_DTYPE_I32, FF_DTYPE_I64};
    ff_coll_redop ops[] = {FF_COLL_SUM, FF_COLL_PROD, FF_COLL_AVG};
    uint8_t *buf = malloc(count * 8 + 8);
    for (int t = 0; t < 5; t++)
        for (int o = 0; o < 3; o++) {
            ff_dtype dt = types[t];
            /* prod on values in {1, 2, -1} so the product of 8 stays exact */
            for (size_t i = 0; i < count; i++) {
                double v = ops[o] == FF_COLL_PROD ? (double)((ival(rank, i) % 3 + 3) % 3 - 1 ? (ival(rank, i) & 1) + 1 : -1)
                                                  : (double)ival(rank, i);
                switch (dt) {
                case FF_DTYPE_F64: ((double *)buf)[i] = v; break;
                case FF_DTYPE_BF16: ((uint16_t *)buf)[i] = ff_f32_to_bf16((float)v); break;
                case FF_DTYPE_F16: ((uint16_t *)buf)[i] = ff_f16_from_f32((float)v); break;
                case FF_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
                default: ((int64_t *)buf)[i] = (int64_t)v; break;
                }
            }
            RCHECK(ff_coll_all_reduce(buf, buf, count, dt, ops[o], c, NULL) == 0, "%s", ff_error_message());
            for (size_t i = 0; i < count; i++) {
                double acc = ops[o] == FF_COLL_PROD ? 1 : 0;
                for (int r = 0; r < n; r++) {
                    double v = ops[o] == FF_COLL_PROD ? (double)((ival(r, i) % 3 + 3) % 3 - 1 ? (ival(r, i) & 1) + 1 : -1)
                                                      : (double)ival(r, i);
                    acc = ops[o] == FF_COLL_PROD ? acc * v : acc + v;
                }
                double want = acc;
                if (ops[o] == FF_COLL_AVG) {
                    if (dt == FF_DTYPE_I32 || dt == FF_DTYPE_I64)
                        want = (double)((long long)acc / n); /* truncated */
                    else if (dt == FF_DTYPE_F64)
                        want = acc / n;
                    else {
                        float f = (float)acc / (float)n;
                        want = dt == FF_DTYPE_BF16 ? ff_bf16_to_f32(ff_f32_to_bf16(f)) : ff_f16_to_f32(ff_f16_from_f32(f));
                    }
                }
                double got;
                switch (dt) {
                case FF_DTYPE_F64: got = ((double *)buf)[i]; break;
                case FF_DTYPE_BF16: got = ff_bf16_to_f32(((uint16_t *)buf)[i]); break;
                case FF_DTYPE_F16: got = ff_f16_to_f32(((uint16_t *)buf)[i]); break;
                case FF_DTYPE_I32: got = ((int32_t *)buf)[i]; break;
                default: got = (double)((int64_t *)buf)[i]; break;
                }
                if (got != want) {
                    RCHECK(got == want, "%s %s count=%zu i=%zu got %.9g want %.9g", ff_dtype_name(dt),
                           ff_coll_redop_name(ops[o]), count, i, got, want);
                    break;
                }
            }
        }
    free(buf);
    return fails;
}

static int check_broadcast(ff_coll_comm *c, int rank, int n, size_t count) {
    int fails = 0;
    float *a = malloc(count * 4 + 4), *b = malloc(count * 4 + 4);
    for (int pass = 0; pass < 2; pass++) {
        int root = pass == 0 ? 0 : (int)(count % (size_t)n);
        if (pass == 1 && n > 1 && root == 0) root = n - 1;
        for (size_t i = 0; i < count; i++) {
            a[i] = rank == root ? (float)ival(root, i) + 0.5f : -99.0f;
            b[i] = -77.0f;
        }
        /* pass 0: out of place (non-roots pass NULL sendbuf); pass 1: in place */
        int rc = pass == 0 ? ff_coll_broadcast(rank == root ? a : NULL, b, count, FF_DTYPE_F32, root, c, NULL)
                           : ff_coll_broadcast(a, a, count, FF_DTYPE_F32, root, c, NULL);
        RCHECK(rc == 0, "%s", ff_error_message());
        float *out = pass == 0 ? b : a;
        for (size_t i = 0; i < count; i++)
            if (out[i] != (float)ival(root, i) + 0.5f) {
                RCHECK(0, "broadcast root=%d count=%zu i=%zu got %g", root, count, i, out[i]);
                break;
            }
    }
    free(a);
    free(b);
    return fails;
}

/* all_gather / reduce_scatter with `pc` elements per rank, and the v-variants with uneven
 * counts (some zero) summing to about `total`. */
static int check_gather_scatter(ff_coll_comm *c, int rank, int n, size_t pc, size_t total) {
    int fails = 0;
    size_t full = pc * (size_t)n;
    float *send = malloc(full * 4 + 4), *recv = malloc(full * 4 + 4);
    /* all_gather, out of place and in place */
    for (size_t i = 0; i < pc; i++) send[i] = (float)ival(rank, i) + 100.0f * (float)rank;
    RCHECK(ff_coll_all_gather(send, recv, pc, FF_DTYPE_F32, c, NULL) == 0, "%s", ff_error_message());
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < pc; i++)
            if (recv[(size_t)r * pc + i] != (float)ival(r, i) + 100.0f * (float)r) {
                RCHECK(0, "all_gather pc=%zu r=%d i=%zu got %g", pc, r, i, recv[(size_t)r * pc + i]);
                r = n;
                break;
            }
    for (size_t i = 0; i < full; i++) recv[i] = -1;
    for (size_t i = 0; i < pc; i++) recv[(size_t)rank * pc + i] = (float)ival(rank, i) - 3.0f;
    RCHECK(ff_coll_all_gather(recv + (size_t)rank * pc, recv, pc, FF_DTYPE_F32, c, NULL) == 0, "%s",
           ff_error_message());
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < pc; i++)
            if (recv[(size_t)r * pc + i] != (float)ival(r, i) - 3.0f) {
                RCHECK(0, "in-place all_gather pc=%zu r=%d i=%zu", pc, r, i);
                r = n;
                break;
            }
    /* reduce_scatter (sum), out of place and in place (avg) */
    for (size_t i = 0; i < full; i++) send[i] = (float)ival(rank, i);
    RCHECK(ff_coll_reduce_scatter(send, recv, pc, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0, "%s",
           ff_error_message());
    for (size_t i = 0; i < pc; i++) {
        int want = 0;
        for (int r = 0; r < n; r++) want += ival(r, (size_t)rank * pc + i);
        if (recv[i] != (float)want) {
            RCHECK(0, "reduce_scatter pc=%zu i=%zu got %g want %d", pc, i, recv[i], want);
            break;
        }
    }
    RCHECK(ff_coll_reduce_scatter(send, send + (size_t)rank * pc, pc, FF_DTYPE_F32, FF_COLL_AVG, c, NULL) == 0, "%s",
           ff_error_message());
    for (size_t i = 0; i < pc; i++) {
        int s = 0;
        for (int r = 0; r < n; r++) s += ival(r, (size_t)rank * pc + i);
        if (send[(size_t)rank * pc + i] != (float)s / (float)n) {
            RCHECK(0, "in-place reduce_scatter avg pc=%zu i=%zu", pc, i);
            break;
        }
    }
    free(send);
    free(recv);
    /* v-variants: rank r has counts[r] = total * (r + 1) / (n * (n + 1) / 2) roughly, rank 1
     * none at all */
    size_t counts[64], off[65], sum = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = r == 1 ? 0 : total * (size_t)(r + 1) / (size_t)(n * (n + 1) / 2) + (size_t)(r % 3);
        off[r] = sum;
        sum += counts[r];
    }
    off[n] = sum;
    send = malloc(sum * 4 + 4);
    recv = malloc(sum * 4 + 4);
    for (size_t i = 0; i < counts[rank]; i++) send[i] = (float)ival(rank, i) * 2.0f;
    RCHECK(ff_coll_all_gather_v(send, recv, counts, FF_DTYPE_F32, c, NULL) == 0, "%s", ff_error_message());
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++)
            if (recv[off[r] + i] != (float)ival(r, i) * 2.0f) {
                RCHECK(0, "all_gather_v r=%d i=%zu", r, i);
                r = n;
                break;
            }
    for (size_t i = 0; i < sum; i++) send[i] = (float)ival(rank, i);
    RCHECK(ff_coll_reduce_scatter_v(send, recv, counts, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0, "%s",
           ff_error_message());
    for (size_t i = 0; i < counts[rank]; i++) {
        int want = 0;
        for (int r = 0; r < n; r++) want += ival(r, off[rank] + i);
        if (recv[i] != (float)want) {
            RCHECK(0, "reduce_scatter_v i=%zu got %g want %d", i, recv[i], want);
            break;
        }
    }
    free(send);
    free(recv);
    return fails;
}

static int ops_rank(ff_coll_comm *c, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)id;
    const cfg *k = arg;
    int fails = 0;
    RCHECK(ff_coll_comm_rank(c) == rank && ff_coll_comm_size(c) == n, "rank/size");
    /* the transport really is what was asked for: a segment per peer sharing memory */
    int want_seg = k->shm == 1 ? 0 : k->shm == 0 ? n - 1 : rank % 2 ? 0 : (n - 1) / 2;
    RCHECK(mapped_segments() == want_seg, "%d shared-memory segments mapped, expected %d", mapped_segments(),
           want_seg);
    size_t counts[] = {0, 1, 7, 4099, BIG};
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
        size_t count = counts[ci];
        if (count == BIG && !k->big) continue;
        fails += check_all_reduce(c, rank, n, count);
        if (count <= 4099) fails += check_dtypes(c, rank, n, count);
        fails += check_broadcast(c, rank, n, count);
        size_t pc = count <= 7 ? count : count / (size_t)n;
        fails += check_gather_scatter(c, rank, n, pc, count);
    }
    return fails;
}

static int odd_ranks_tcp(int rank) {
    if (rank % 2) setenv("FF_COLL_SHM", "0", 1);
    return 0;
}

int main(void) {
    int nr[] = {1, 2, 3, 4, 5, 8};
    int algos[] = {FF_COLL_ALGO_AUTO, FF_COLL_ALGO_RING, FF_COLL_ALGO_DIRECT, FF_COLL_ALGO_STAR};
    int failures = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t ni = 0; ni < sizeof nr / sizeof *nr; ni++) {
            int n = nr[ni];
            cfg k = {.algo = algos[a],
                     .big = (algos[a] == FF_COLL_ALGO_AUTO || algos[a] == FF_COLL_ALGO_RING) &&
                            (n == 2 || n == 3 || n == 8)};
            run_opts ro = default_run();
            ro.comm_opt.algo = algos[a];
            ro.comm_opt.timeout_s = 30;
            int64_t t0 = ff_now_ns();
            int f = run_ranks(n, &ro, ops_rank, &k);
            printf("ops: %d ranks, algo %d: %s (%.2f s)\n", n, algos[a], f ? "FAILED" : "ok", (ff_now_ns() - t0) / 1e9);
            failures += f;
            if (f) continue;
            /* every rank holds the same bits */
            uint64_t *h = (uint64_t *)g_shared;
            for (int r = 1; r < n; r++) {
                CHECK(h[r] == h[0]);
                CHECK(h[64 + r] == h[64]);
            }
            if (k.big && n == 3) { /* and a second run reproduces them */
                uint64_t first = h[0];
                f = run_ranks(n, &ro, ops_rank, &k);
                failures += f;
                CHECK(f == 0 && h[0] == first);
            }
        }
    /* the same over TCP only (FF_COLL_SHM=0: no shared-memory fast path), as across hosts */
    setenv("FF_COLL_SHM", "0", 1);
    int tcp_n[] = {2, 3, 8};
    for (size_t a = 0; a < 2; a++)
        for (size_t ni = 0; ni < 3; ni++) {
            int n = tcp_n[ni];
            cfg k = {.algo = algos[a], .big = n == 3, .shm = 1};
            run_opts ro = default_run();
            ro.comm_opt.algo = algos[a];
            ro.comm_opt.timeout_s = 30;
            int f = run_ranks(n, &ro, ops_rank, &k);
            printf("ops over TCP: %d ranks, algo %d: %s\n", n, algos[a], f ? "FAILED" : "ok");
            failures += f;
        }
    unsetenv("FF_COLL_SHM");
    /* mixed: odd ranks refuse shared memory, so even-even pairs use it and every other pair
     * falls back to TCP, inside one communicator */
    for (size_t a = 0; a < 2; a++) {
        cfg k = {.algo = algos[a], .big = 0, .shm = 2};
        run_opts ro = default_run();
        ro.comm_opt.algo = algos[a];
        ro.comm_opt.timeout_s = 30;
        ro.setup = odd_ranks_tcp;
        int f = run_ranks(5, &ro, ops_rank, &k);
        printf("ops, odd ranks without shared memory: 5 ranks, algo %d: %s\n", algos[a], f ? "FAILED" : "ok");
        failures += f;
    }
    CHECK_EQ_INT(failures, 0);
    TEST_MAIN_END();
}
