/* fuseflow tests: a minimal assertion kit. A test is a program; it prints what failed (file,
 * line, expression, values) and exits non-zero. CHECK continues, REQUIRE stops the test.
 * A test that cannot run here (no GPU, no network namespaces) calls SKIP(reason), which
 * prints the reason and exits 77, the code ctest reports as skipped. */
#ifndef FF_TEST_UTIL_H
#define FF_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"

static int ff_test_failures = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ff_test_failures++;                                                       \
        }                                                                             \
    } while (0)

#define REQUIRE(cond)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                                   \
    do {                                                                                                     \
        long long a_ = (long long)(a), b_ = (long long)(b);                                                  \
        if (a_ != b_) {                                                                                      \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n", __FILE__, __LINE__, #a, a_, #b, b_); \
            ff_test_failures++;                                                                              \
        }                                                                                                    \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, atol, rtol)                                                                  \
    do {                                                                                               \
        double a_ = (double)(a), b_ = (double)(b);                                                     \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_))) {                                            \
            fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.9g, %s = %.9g (atol %g, rtol %g)\n", __FILE__, \
                    __LINE__, #a, a_, #b, b_, (double)(atol), (double)(rtol));                         \
            ff_test_failures++;                                                                        \
        }                                                                                              \
    } while (0)

#define CHECK_STR_CONTAINS(haystack, needle)                                                                 \
    do {                                                                                                     \
        const char *h_ = (haystack), *n_ = (needle);                                                         \
        if (!h_ || !strstr(h_, n_)) {                                                                        \
            fprintf(stderr, "%s:%d: expected \"%s\" to contain \"%s\"\n", __FILE__, __LINE__, h_ ? h_ : "(null)", n_); \
            ff_test_failures++;                                                                              \
        }                                                                                                    \
    } while (0)

/* A fuseflow call that must succeed: on failure, its error message and exit. */
#define DIE_IF(cond)                                                                          \
    do {                                                                                      \
        if (cond) {                                                                           \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond, ff_error_message()); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define SKIP(...)                              \
    do {                                       \
        fprintf(stderr, "SKIPPED: ");          \
        fprintf(stderr, __VA_ARGS__);          \
        fprintf(stderr, "\n");                 \
        exit(77);                              \
    } while (0)

#define TEST_MAIN_END()                                                          \
    do {                                                                         \
        if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures); \
        return ff_test_failures ? 1 : 0;                                         \
    } while (0)

#endif
