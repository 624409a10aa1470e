/* A host emulator for the tensor-core attention kernels (kernels/cuda/attention_tc_kernels.cuh):
 * the very kernels nvcc compiles, run on the CPU so that their tiling, masking and
 * shared-memory layout are tested on machines without a GPU
 * (tests/kernels/test_attention_tc_emu.c, against the CPU backend).
 *
 * How: each CUDA thread of a block is a std::thread (blocks run one after another);
 * __syncthreads and __syncwarp are barriers of 128 and 32 threads; __shfl_xor_sync and
 * __reduce_max_sync exchange through a per-warp array between two warp barriers. A WMMA
 * fragment is the whole 16 x 16 matrix in every lane (loads read all of it, mma_sync
 * multiplies it in fp32, lane 0 alone stores it), so lanes stay identical as on the device.
 * Every fragment load and store checks what the hardware requires or what would corrupt
 * memory: a 32-byte aligned pointer, a leading dimension of whole 16-byte units, and a tile
 * inside the block's dynamic shared memory. The shared memory starts filled with 0xff bytes
 * (NaN as bf16 and fp32), so a read of a tile nobody wrote shows in the results.
 *
 * What it cannot show: speed, the device's rounding of sums (the products here are summed in
 * another order), races that the threads' timing here happens to hide, register limits.
 * Not a general CUDA emulator: it provides what that one file uses and nothing else. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

extern "C" {
#include "fuseflow/error.h"
#include "kernels/cuda/emu/attention_tc_emu.h"
}

/* ---- the CUDA names the kernels use ------------------------------------------------------------ */

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct dim3 {
    unsigned x, y, z;
};
static thread_local dim3 threadIdx, blockIdx, blockDim;

static inline int min(int a, int b) { return a < b ? a : b; }

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
/* round to nearest even, NaN kept NaN (as cuda_bf16.h's __float2bfloat16_rn) */
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {(uint16_t)(u >> 16)};
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline float bf16_value(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The first fault any thread saw (then the run's result is refused). */
static std::mutex fault_mu;
static char fault_msg[256];
static std::atomic<bool> faulted{false};
static void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fault(const char *fmt, ...) {
    std::lock_guard<std::mutex> lk(fault_mu);
    if (faulted.load()) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fault_msg, sizeof fault_msg, fmt, ap);
    va_end(ap);
    faulted.store(true);
}

/* A reusable barrier of n threads. A wait past 60 s is a kernel that lost a thread at a
 * barrier (a deadlock on the device too): reported, then the process stops rather than hang. */
class emu_barrier {
  public:
    explicit emu_barrier(int n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> lk(mu_);
        unsigned long gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            gen_++;
            cv_.notify_all();
            return;
        }
        if (!cv_.wait_for(lk, std::chrono::seconds(60), [&] { return gen_ != gen; })) {
            fprintf(stderr, "attention_tc_emu: a barrier of %d threads waited 60 s with %d arrived: a thread "
                            "skipped a __syncthreads or __syncwarp\n", n_, count_);
            abort();
        }
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    int n_, count_ = 0;
    unsigned long gen_ = 0;
};

enum { EMU_THREADS = 128, EMU_WARPS = EMU_THREADS / 32 };

struct emu_block {
    emu_barrier block{EMU_THREADS};
    emu_barrier warp[EMU_WARPS] = {emu_barrier(32), emu_barrier(32), emu_barrier(32), emu_barrier(32)};
    float xf[EMU_WARPS][32];
    unsigned xu[EMU_WARPS][32];
    unsigned char *smem;
    size_t smem_bytes;
};
static thread_local emu_block *cur;

static inline int emu_warp() { return (int)threadIdx.x >> 5; }
static inline int emu_lane() { return (int)threadIdx.x & 31; }
static inline void __syncthreads() { cur->block.wait(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) fault("__syncwarp with a partial mask %#x", mask);
    cur->warp[emu_warp()].wait();
}
static inline float __shfl_xor_sync(unsigned mask, float v, int o) {
    if (mask != 0xffffffffu) fault("__shfl_xor_sync with a partial mask %#x", mask);
    const int w = emu_warp(), l = emu_lane();
    cur->xf[w][l] = v;
    cur->warp[w].wait();
    float r = cur->xf[w][l ^ o];
    cur->warp[w].wait();
    return r;
}
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
    if (mask != 0xffffffffu) fault("__reduce_max_sync with a partial mask %#x", mask);
    const int w = emu_warp(), l = emu_lane();
    cur->xu[w][l] = v;
    cur->warp[w].wait();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r = cur->xu[w][i] > r ? cur->xu[w][i] : r;
    cur->warp[w].wait();
    return r;
}

/* A fragment's tile: rows x cols elements of `elem` bytes from p with leading dimension ldm. */
static void check_tile(const char *what, const void *p, unsigned ldm, size_t elem, int rows, int cols) {
    const unsigned char *b = (const unsigned char *)p;
    if ((uintptr_t)b % 32) fault("%s: pointer %p is not 32-byte aligned (offset %td in shared memory)", what, p, b - cur->smem);
    if ((ldm * elem) % 16) fault("%s: leading dimension %u is not a multiple of 16 bytes", what, ldm);
    const size_t span = ((size_t)(rows - 1) * ldm + (size_t)cols) * elem;
    if (b < cur->smem || b + span > cur->smem + cur->smem_bytes)
        fault("%s: tile [%td, %td) outside the block's %zu bytes of shared memory", what, b - cur->smem,
              b + span - cur->smem, cur->smem_bytes);
}

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

template <typename Use, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    const bool row = std::is_same<Layout, row_major>::value;
    check_tile("load_matrix_sync (bf16)", p, ldm, 2, 16, 16);
    if (faulted.load()) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = bf16_value(row ? p[r * ldm + c] : p[c * ldm + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l) {
    check_tile("load_matrix_sync (fp32)", p, ldm, 4, 16, 16);
    if (faulted.load()) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l) {
    check_tile("store_matrix_sync", p, ldm, 4, 16, 16);
    if (faulted.load() || emu_lane() != 0) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r][c];
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = v;
}
template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
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

#define FF_TC_SMEM(name) unsigned char *name = cur->smem
#include "kernels/cuda/attention_tc_kernels.cuh"

/* ---- launching --------------------------------------------------------------------------------- */

/* Run kernel(args...) over grid (gx, gy) blocks of EMU_THREADS threads with `smem` bytes of
 * dynamic shared memory. 0, or -1 and the fault. */
template <typename Kernel, typename... Args>
static int emu_launch(const char *name, unsigned gx, unsigned gy, size_t smem, Kernel kernel, Args... args) {
    faulted.store(false);
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            emu_block blk;
            blk.smem_bytes = smem;
            blk.smem = (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128);
            if (!blk.smem) return ff_error_set("attention_tc_emu", "free memory", "out of memory for %zu bytes", smem);
            memset(blk.smem, 0xff, (smem + 127) / 128 * 128);
            std::vector<std::thread> th;
            th.reserve(EMU_THREADS);
            for (unsigned t = 0; t < EMU_THREADS; t++)
                th.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    blockDim = {EMU_THREADS, 1, 1};
                    cur = &blk;
                    kernel(args...);
                });
            for (auto &x : th) x.join();
            free(blk.smem);
            if (faulted.load())
                return ff_error_set("attention_tc_emu", "fix the kernel (kernels/cuda/attention_tc_kernels.cuh)",
                                    "%s, block (%u, %u): %s", name, bx, by, fault_msg);
        }
    return 0;
}

template <int D>
static int fwd(const float *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv, float *out, float *lse) {
    return emu_launch("attention forward", (unsigned)((T + TB - 1) / TB), (unsigned)Hq, fwd_tc_smem<D>(),
                      k_att_fwd_tc<D>, qkv, ld, ss, S, T, Hq, Hkv, 1.0f / sqrtf((float)D), out, lse);
}

template <int D>
static int bwd(const float *qkv, int ld, const int32_t *ss, int S, int T, int Hq, int Hkv, const float *lse,
               const float *dout, const float *delta, float *dqkv) {
    const float scale = 1.0f / sqrtf((float)D);
    if (emu_launch("attention dq", (unsigned)((T + TB - 1) / TB), (unsigned)Hq, dq_tc_smem<D>(), k_att_dq_tc<D>, qkv,
                   ld, ss, S, T, Hq, Hkv, scale, lse, dout, delta, dqkv))
        return -1;
    return emu_launch("attention dk dv", (unsigned)((T + TB - 1) / TB), (unsigned)Hkv, dkv_tc_smem<D>(),
                      k_att_dkv_tc<D>, qkv, ld, ss, S, T, Hq, Hkv, scale, lse, dout, delta, dqkv);
}

static int no_kernel(int D) {
    return ff_error_set("attention_tc_emu", "use a head dim the kernels are built for (multiples of 16 up to 128)",
                        "no tensor-core kernel for head_dim %d", D);
}

extern "C" int ff_emu_attention_fwd_tc(const float *qkv, int ld, const int32_t *seq_start, int S, int T, int Hq,
                                       int Hkv, int D, float *out, float *lse) {
    if (T <= 0) return 0;
    switch (D) {
#define X(d) \
    case d: return fwd<d>(qkv, ld, seq_start, S, T, Hq, Hkv, out, lse);
        FF_TC_DIMS(X)
#undef X
    default: return no_kernel(D);
    }
}

extern "C" int ff_emu_attention_bwd_tc(const float *qkv, int ld, const int32_t *seq_start, int S, int T, int Hq,
                                       int Hkv, int D, const float *out, const float *lse, const float *dout,
                                       float *delta, float *dqkv) {
    if (T <= 0) return 0;
    /* delta as the device's k_att_delta_tc: one fp32 dot a (token, head), lanes' strided
     * partial sums summed in another order here */
    for (int64_t w = 0; w < (int64_t)T * Hq; w++) {
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += out[w * D + d] * dout[w * D + d];
        delta[w] = s;
    }
    switch (D) {
#define X(d) \
    case d: return bwd<d>(qkv, ld, seq_start, S, T, Hq, Hkv, lse, dout, delta, dqkv);
        FF_TC_DIMS(X)
#undef X
    default: return no_kernel(D);
    }
}
