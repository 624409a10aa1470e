/* Element types and conversions (see include/fuseflow/dtype.h). Bit manipulation only; no
 * dependency on compiler half-precision support. */
#include "fuseflow/dtype.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} g_types[FF_DTYPE_COUNT] = {
    [FF_DTYPE_F32] = {"F32", 4}, [FF_DTYPE_F16] = {"F16", 2}, [FF_DTYPE_BF16] = {"BF16", 2},
    [FF_DTYPE_F64] = {"F64", 8}, [FF_DTYPE_I8] = {"I8", 1},   [FF_DTYPE_U8] = {"U8", 1},
    [FF_DTYPE_I16] = {"I16", 2}, [FF_DTYPE_I32] = {"I32", 4}, [FF_DTYPE_I64] = {"I64", 8},
    [FF_DTYPE_BOOL] = {"BOOL", 1},
};

size_t ff_dtype_size(ff_dtype t) { return (unsigned)t < FF_DTYPE_COUNT ? g_types[t].size : 0; }
const char *ff_dtype_name(ff_dtype t) { return (unsigned)t < FF_DTYPE_COUNT ? g_types[t].name : "?"; }

int ff_dtype_parse(const char *name, ff_dtype *out) {
    for (int i = 0; i < FF_DTYPE_COUNT; i++)
        if (!strcmp(name, g_types[i].name)) {
            *out = (ff_dtype)i;
            return 0;
        }
    return -1;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ff_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t ff_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

float ff_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return bits_f32(u);
}

uint16_t ff_f16_from_f32(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflows to inf */
    if (absu < 0x38800000u) {                                  /* subnormal or zero in f16 */
        /* value = absu as float; f16 subnormal unit is 2^-24 */
        float a = bits_f32(absu);
        float scaled = a * 16777216.0f; /* / 2^-24 */
        uint32_t m = (uint32_t)nearbyintf(scaled);
        return (uint16_t)(sign | m);
    }
    uint32_t exp = (absu >> 23) - 127 + 15;
    uint32_t man = absu & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* nearest even; may carry into exp */
    return (uint16_t)(sign | h);
}

int ff_dtype_to_f32(ff_dtype from, const void *src, float *dst, size_t n) {
    switch (from) {
    case FF_DTYPE_F32: memcpy(dst, src, n * 4); return 0;
    case FF_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = ff_f16_to_f32(s[i]);
        return 0;
    }
    case FF_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = ff_bf16_to_f32(s[i]);
        return 0;
    }
    case FF_DTYPE_F64: {
        const double *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
        return 0;
    }
    case FF_DTYPE_I8: { const int8_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case FF_DTYPE_U8: { const uint8_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case FF_DTYPE_I16: { const int16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case FF_DTYPE_I32: { const int32_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    case FF_DTYPE_I64: { const int64_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; return 0; }
    default: return -1;
    }
}

int ff_dtype_from_f32(ff_dtype to, const float *src, void *dst, size_t n) {
    switch (to) {
    case FF_DTYPE_F32: memcpy(dst, src, n * 4); return 0;
    case FF_DTYPE_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = ff_f16_from_f32(src[i]);
        return 0;
    }
    case FF_DTYPE_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = ff_f32_to_bf16(src[i]);
        return 0;
    }
    default: return -1;
    }
}
