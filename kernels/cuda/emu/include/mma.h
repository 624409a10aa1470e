/* The CUDA emulator's stand-in for <mma.h> (kernels/cuda/emu/include/cuda_runtime.h says what
 * the emulator is): nvcuda::wmma's 16 x 16 x 16 bf16 fragments with fp32 accumulators. A
 * fragment is the whole logical matrix in every lane: loads read all of it, mma_sync multiplies
 * it in fp32 (its own summation order, not the tensor cores'), and lane 0 alone stores it, so
 * a lane that reads a stored tile without a __syncwarp reads it before it is there. Every load
 * and store checks what the hardware requires or what would corrupt memory: a 32-byte aligned
 * pointer, a leading dimension of whole 16-byte units, and a tile inside the block's dynamic
 * shared memory; a violation fails the launch, naming it. */
#ifndef FF_CUDA_EMU_MMA_H
#define FF_CUDA_EMU_MMA_H

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* cuda_emu.cpp: fail the running launch with this message; the running fiber's lane */
void ff_emu_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int ff_emu_lane(void);
/* 0 when [p, p + bytes) lies in the running block's dynamic shared memory */
int ff_emu_check_smem(const void *p, size_t bytes);

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator knows the 16 x 16 x 16 shape only");
    float x[16][16]; /* the logical matrix: A(i, k), B(k, j) or C(i, j) */
};

static inline bool tile_ok(const char *what, const void *p, unsigned ldm, size_t elem) {
    if ((uintptr_t)p % 32) {
        ff_emu_fault("%s: pointer %p is not 32-byte aligned", what, p);
        return false;
    }
    if ((ldm * elem) % 16) {
        ff_emu_fault("%s: leading dimension %u is not a multiple of 16 bytes", what, ldm);
        return false;
    }
    if (ff_emu_check_smem(p, (15 * (size_t)ldm + 16) * elem)) {
        ff_emu_fault("%s: the 16 x 16 tile at %p (leading dimension %u) is not inside the block's shared memory", what,
                     p, ldm);
        return false;
    }
    return true;
}

template <typename Use, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f, const __nv_bfloat16 *p,
                                    unsigned ldm) {
    const bool row = std::is_same<Layout, row_major>::value;
    if (!tile_ok("load_matrix_sync (bf16)", p, ldm, 2)) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = __bfloat162float(row ? p[r * ldm + c] : p[c * ldm + r]);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t l) {
    if (!tile_ok("load_matrix_sync (fp32)", p, ldm, 4)) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t l) {
    if (!tile_ok("store_matrix_sync", p, ldm, 4) || ff_emu_lane() != 0) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r][c];
}
static inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = v;
}
template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    float t[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.x[i][j];
            for (int k = 0; k < 16; k++) s += a.x[i][k] * b.x[k][j];
            t[i][j] = s;
        }
    memcpy(d.x, t, sizeof t);
}
} // namespace wmma
} // namespace nvcuda

#endif
