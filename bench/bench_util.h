/* What the benchmarks share: the clock in seconds, a barrier over a communicator, and the
 * median of repeated timings. Static inline, so a bench that uses none of the collectives
 * needs no ff_coll at link time. Not here: anything a test or the libraries use. */
#ifndef FUSEFLOW_BENCH_UTIL_H
#define FUSEFLOW_BENCH_UTIL_H

#include <stdlib.h>

#include "fuseflow/coll.h"
#include "fuseflow/util.h"

static inline double now_s(void) { return (double)ff_now_ns() * 1e-9; }

/* every rank of c here before any goes on: a one-float all-reduce. 0 or -1 + error */
static inline int barrier(ff_coll_comm *c) {
    float x = 0;
    return ff_coll_all_reduce(&x, &x, 1, FF_DTYPE_F32, FF_COLL_SUM, c, NULL);
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the median of v[n] (n >= 1), sorting v in place */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
