/* Element-wise reductions of the cpu backend: out = a op b (then / div for AVG's last
 * step), for F32, F64, F16, BF16, I32, I64. Plain loops the compiler vectorises. Integer
 * sums and products wrap (computed unsigned, so overflow is defined). Max and min
 * propagate NaN. Not here: which elements meet in which order (the algorithms decide, see
 * cpu_algos.c). */
#include <stdint.h>
#include <string.h>

#include "fuseflow/dtype.h"
#include "workers/coll/coll_internal.h"

bool coll_redop_supported(ff_dtype t) {
    return t == FF_DTYPE_F32 || t == FF_DTYPE_F64 || t == FF_DTYPE_F16 || t == FF_DTYPE_BF16 ||
           t == FF_DTYPE_I32 || t == FF_DTYPE_I64;
}

/* NaN-propagating max/min: if a is NaN the comparison picks a; if b is NaN it picks b. */
#define FMAX(a, b) (((a) != (a) || (a) > (b)) ? (a) : (b))
#define FMIN(a, b) (((a) != (a) || (a) < (b)) ? (a) : (b))

#define FLOAT_LOOP(T, out, a, b, n, op, div)                                   \
    do {                                                                       \
        T *o_ = (T *)(out);                                                    \
        const T *a_ = (const T *)(a), *b_ = (const T *)(b);                    \
        switch (op) {                                                          \
        case FF_COLL_SUM:                                                      \
        case FF_COLL_AVG:                                                      \
            for (size_t i = 0; i < (n); i++) o_[i] = a_[i] + b_[i];            \
            break;                                                             \
        case FF_COLL_PROD:                                                     \
            for (size_t i = 0; i < (n); i++) o_[i] = a_[i] * b_[i];            \
            break;                                                             \
        case FF_COLL_MAX:                                                      \
            for (size_t i = 0; i < (n); i++) o_[i] = FMAX(a_[i], b_[i]);       \
            break;                                                             \
        case FF_COLL_MIN:                                                      \
            for (size_t i = 0; i < (n); i++) o_[i] = FMIN(a_[i], b_[i]);       \
            break;                                                             \
        default: break;                                                        \
        }                                                                      \
        if ((div) > 1) {                                                       \
            T d_ = (T)(div);                                                   \
            for (size_t i = 0; i < (n); i++) o_[i] = o_[i] / d_;               \
        }                                                                      \
    } while (0)

/* S: signed type, U: its unsigned twin (sums and products wrap without UB). */
#define INT_LOOP(S, U, out, a, b, n, op, div)                                          \
    do {                                                                               \
        S *o_ = (S *)(out);                                                            \
        const S *a_ = (const S *)(a), *b_ = (const S *)(b);                            \
        switch (op) {                                                                  \
        case FF_COLL_SUM:                                                              \
        case FF_COLL_AVG:                                                              \
            for (size_t i = 0; i < (n); i++) o_[i] = (S)((U)a_[i] + (U)b_[i]);         \
            break;                                                                     \
        case FF_COLL_PROD:                                                             \
            for (size_t i = 0; i < (n); i++) o_[i] = (S)((U)a_[i] * (U)b_[i]);         \
            break;                                                                     \
        case FF_COLL_MAX:                                                              \
            for (size_t i = 0; i < (n); i++) o_[i] = a_[i] > b_[i] ? a_[i] : b_[i];    \
            break;                                                                     \
        case FF_COLL_MIN:                                                              \
            for (size_t i = 0; i < (n); i++) o_[i] = a_[i] < b_[i] ? a_[i] : b_[i];    \
            break;                                                                     \
        default: break;                                                                \
        }                                                                              \
        if ((div) > 1)                                                                 \
            for (size_t i = 0; i < (n); i++) o_[i] = (S)(o_[i] / (S)(div));            \
    } while (0)

static float op_f32(float a, float b, ff_coll_redop op) {
    switch (op) {
    case FF_COLL_PROD: return a * b;
    case FF_COLL_MAX: return FMAX(a, b);
    case FF_COLL_MIN: return FMIN(a, b);
    default: return a + b;
    }
}

void coll_reduce(void *out, const void *a, const void *b, size_t n, ff_dtype dtype,
                 ff_coll_redop op, int div) {
    switch (dtype) {
    case FF_DTYPE_F32: FLOAT_LOOP(float, out, a, b, n, op, div); break;
    case FF_DTYPE_F64: FLOAT_LOOP(double, out, a, b, n, op, div); break;
    case FF_DTYPE_I32: INT_LOOP(int32_t, uint32_t, out, a, b, n, op, div); break;
    case FF_DTYPE_I64: INT_LOOP(int64_t, uint64_t, out, a, b, n, op, div); break;
    case FF_DTYPE_BF16: {
        uint16_t *o = out;
        const uint16_t *x = a, *y = b;
        float d = div > 1 ? (float)div : 1.0f;
        for (size_t i = 0; i < n; i++) {
            float v = op_f32(ff_bf16_to_f32(x[i]), ff_bf16_to_f32(y[i]), op);
            o[i] = ff_f32_to_bf16(div > 1 ? v / d : v);
        }
        break;
    }
    case FF_DTYPE_F16: {
        uint16_t *o = out;
        const uint16_t *x = a, *y = b;
        float d = div > 1 ? (float)div : 1.0f;
        for (size_t i = 0; i < n; i++) {
            float v = op_f32(ff_f16_to_f32(x[i]), ff_f16_to_f32(y[i]), op);
            o[i] = ff_f16_from_f32(div > 1 ? v / d : v);
        }
        break;
    }
    default: break; /* callers check coll_redop_supported first */
    }
}
