/* The CUDA emulator's stand-in for <cuda_bf16.h> (kernels/cuda/emu/include/cuda_runtime.h
 * says what the emulator is): the bf16 types and the conversions fuseflow's kernels use,
 * rounding to nearest even as the device does. */
#ifndef FF_CUDA_EMU_CUDA_BF16_H
#define FF_CUDA_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

/* aligned as the toolkit's (__align__(2), __align__(4)): a pair stored or loaded through a
 * pointer that is not on 4 bytes faults on the device ("misaligned address"); here the
 * sanitizer build's UBSan reports it */
struct alignas(2) __nv_bfloat16 {
    uint16_t bits;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40)}; /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return {(uint16_t)(u >> 16)};
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}

#endif
