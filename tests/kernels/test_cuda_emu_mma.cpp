/* The CUDA emulator's matrix instructions (kernels/cuda/emu/cuda_emu.cpp: ldmatrix.x4, its
 * .trans, and mma.m16n8k16 bf16 -> fp32), on which cuda_attention_tc.cu's kernels run here:
 *  - registers built element by element from the PTX ISA's fragment layouts (written out in
 *    this test, apart from the emulator's code), multiplied by two mma calls, give A B + C as
 *    the host computes it, read back through the accumulator layout;
 *  - the same A and B loaded by ldmatrix with the addresses cuda_attention_tc.cu gives its
 *    lanes (A and B^T row-major without .trans, B row-major with it) give the same registers;
 *  - what the hardware refuses fails the launch, naming it: a row address not on 16 bytes, one
 *    outside shared memory, a warp with an exited lane (each in a child process, since a fault
 *    is sticky for the rest of a process).
 * Not a test of any fuseflow kernel; whether these layouts are the hardware's only a GPU shows
 * (docs/cuda.md "The emulator"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tests/test_util.h"

typedef __nv_bfloat16 bf16;

enum { LD = 24 }; /* staged row stride, elements: 48 bytes, rows on 16 bytes */

static __device__ uint32_t bits(bf16 x) {
    uint16_t u;
    memcpy(&u, &x, 2);
    return u;
}
static __device__ uint32_t pk(bf16 lo, bf16 hi) { return bits(lo) | bits(hi) << 16; }

/* D [16 x 16] = A [16 x 16] B [16 x 16] + C, as two 8-column mma tiles. a, b, c, d: fp32
 * row-major; mode 0: registers from the layouts; 1: ldmatrix of A and of B^T; 2: B by
 * ldmatrix .trans. One warp. */
static __global__ void k_product(int mode, const float *a, const float *b, const float *c, float *d) {
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *a_s = (bf16 *)smem, *b_s = a_s + 16 * LD, *bt_s = b_s + 16 * LD;
    const int l = (int)threadIdx.x, g = l >> 2, q = l & 3;
    for (int i = l; i < 256; i += 32) {
        const int r = i / 16, k = i % 16;
        a_s[r * LD + k] = __float2bfloat16_rn(a[i]);
        b_s[r * LD + k] = __float2bfloat16_rn(b[i]);  /* B(r, k): row r of B */
        bt_s[k * LD + r] = __float2bfloat16_rn(b[i]); /* B^T */
    }
    __syncwarp();
    uint32_t fa[4], fb[4]; /* fb[0], fb[1]: columns 0-7 of B; fb[2], fb[3]: columns 8-15 */
    if (mode == 0) {
#define A_(r, k) a_s[(r) * LD + (k)]
#define B_(k, n) b_s[(k) * LD + (n)]
        fa[0] = pk(A_(g, 2 * q), A_(g, 2 * q + 1));
        fa[1] = pk(A_(g + 8, 2 * q), A_(g + 8, 2 * q + 1));
        fa[2] = pk(A_(g, 2 * q + 8), A_(g, 2 * q + 9));
        fa[3] = pk(A_(g + 8, 2 * q + 8), A_(g + 8, 2 * q + 9));
        for (int t = 0; t < 2; t++) {
            fb[2 * t] = pk(B_(2 * q, 8 * t + g), B_(2 * q + 1, 8 * t + g));
            fb[2 * t + 1] = pk(B_(2 * q + 8, 8 * t + g), B_(2 * q + 9, 8 * t + g));
        }
#undef A_
#undef B_
    } else {
        /* cuda_attention_tc.cu's load_a, mm_nt's and mm_acc_pb's lane addresses */
        ff_emu_ldmatrix_x4(fa, a_s + ((l & 7) + 8 * ((l >> 3) & 1)) * LD + 8 * (l >> 4), 0);
        if (mode == 1) ff_emu_ldmatrix_x4(fb, bt_s + ((l & 7) + 8 * (l >> 4)) * LD + 8 * ((l >> 3) & 1), 0);
        else ff_emu_ldmatrix_x4(fb, b_s + ((l & 7) + 8 * ((l >> 3) & 1)) * LD + 8 * (l >> 4), 1);
    }
    for (int t = 0; t < 2; t++) {
        float acc[4];
        for (int i = 0; i < 4; i++) acc[i] = c[(g + 8 * (i >> 1)) * 16 + 8 * t + 2 * q + (i & 1)];
        ff_emu_mma_m16n8k16_bf16(acc, fa, fb[2 * t], fb[2 * t + 1]);
        for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 16 + 8 * t + 2 * q + (i & 1)] = acc[i];
    }
}

/* What the hardware refuses. which 0: lane 5's row one element off 16 bytes; 1: lane 9's row
 * in global memory; 2: an mma after lane 31 returned. */
static __global__ void k_refused(int which, float *global) {
    FF_DYN_SHARED(unsigned char, smem);
    bf16 *s = (bf16 *)smem;
    const int l = (int)threadIdx.x;
    uint32_t r[4] = {0, 0, 0, 0};
    if (which == 0) ff_emu_ldmatrix_x4(r, s + l * LD + (l == 5), 0);
    if (which == 1) ff_emu_ldmatrix_x4(r, l == 9 ? (const void *)global : (const void *)(s + l * LD), 1);
    if (which == 2) {
        if (l == 31) return;
        float acc[4] = {0, 0, 0, 0};
        ff_emu_mma_m16n8k16_bf16(acc, r, 0, 0);
    }
}

static float vals(int i, int salt) { return (float)(((i * 37 + salt * 11) % 29) - 14) / 8.0f; }

static void check_product(int mode) {
    float a[256], b[256], c[256], d[256];
    for (int i = 0; i < 256; i++) a[i] = vals(i, 1), b[i] = vals(i, 2), c[i] = vals(i, 3) * 4.0f;
    float *da = NULL, *db = NULL, *dc = NULL, *dd = NULL;
    REQUIRE(cudaMalloc((void **)&da, sizeof a) == cudaSuccess && cudaMalloc((void **)&db, sizeof b) == cudaSuccess &&
            cudaMalloc((void **)&dc, sizeof c) == cudaSuccess && cudaMalloc((void **)&dd, sizeof d) == cudaSuccess);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice);
    FF_LAUNCH(k_product, 1, 32, 3 * 16 * LD * sizeof(bf16), (cudaStream_t)NULL, mode, da, db, dc, dd);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost), cudaSuccess);
    int wrong = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double want = c[i * 16 + j]; /* the inputs are bf16 values: exact operands, exact sums */
            for (int k = 0; k < 16; k++) want += (double)a[i * 16 + k] * b[k * 16 + j];
            if (fabs(d[i * 16 + j] - want) > 1e-6 * (1.0 + fabs(want))) {
                if (wrong++ < 3) fprintf(stderr, "mode %d: D(%d, %d) = %g, want %g\n", mode, i, j, d[i * 16 + j], want);
            }
        }
    CHECK_EQ_INT(wrong, 0);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

/* k_refused(which) in a child: the launch fails and stderr names `want` */
static void check_refused(int which, const char *want) {
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        float *g = NULL;
        if (cudaMalloc((void **)&g, 64) != cudaSuccess) _exit(2);
        FF_LAUNCH(k_refused, 1, 32, 32 * LD * sizeof(bf16), (cudaStream_t)NULL, which, g);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)NULL);
        _exit(e == cudaSuccess ? 1 : 0);
    }
    close(fd[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof buf - 1 && (k = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)k;
    buf[n] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!strstr(buf, want)) {
        fprintf(stderr, "refused case %d: stderr lacks \"%s\":\n%s\n", which, want, buf);
        CHECK(0);
    }
}

int main(void) {
    check_product(0);
    check_product(1);
    check_product(2);
    check_refused(0, "lane 5's row address");
    check_refused(1, "lane 9's row");
    check_refused(2, "exited");
    TEST_MAIN_END();
}
