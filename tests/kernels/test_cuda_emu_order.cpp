/* The CUDA emulator's two thread orders (kernels/cuda/emu/cuda_emu.cpp, FF_CUDA_EMU_ORDER):
 * a kernel that reads, without a barrier, what another thread of its block writes gives
 * another result in one of the orders, whichever of the two threads is the higher; with the
 * barrier both orders give the right one. This is what the _emu_low copies of the CUDA tests
 * count on to show a missing __syncthreads or __syncwarp. Not a test of any fuseflow kernel. */
#include <stdlib.h>

#include <cuda_runtime.h>

#include "tests/test_util.h"

enum { N = 64 };

/* out[i] = what thread i + step (mod N) wrote: step 1 reads a higher thread's value (but the
 * last), step N - 1 a lower one's. barrier 0 leaves out the __syncthreads between. */
static __global__ void k_neighbour(int step, int barrier, int *out) {
    __shared__ int sm[N];
    const int i = (int)threadIdx.x;
    sm[i] = 1000 + i;
    if (barrier) __syncthreads();
    out[i] = sm[(i + step) % N];
    __syncthreads(); /* every read done: the next launch finds stale values */
    sm[i] = -1;
}

/* How many threads read the value their neighbour wrote, in order `order`; -1 when the launch
 * failed. */
static int run(const char *order, int step, int barrier) {
    setenv("FF_CUDA_EMU_ORDER", order, 1);
    int *d = NULL, h[N];
    if (cudaMalloc((void **)&d, sizeof h) != cudaSuccess) return -1;
    FF_LAUNCH(k_neighbour, 1, N, 0, (cudaStream_t)NULL, step, barrier, d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess) return -1;
    int right = 0;
    for (int i = 0; i < N; i++) right += h[i] == 1000 + (i + step) % N;
    return right;
}

int main(void) {
    /* with the barrier: every thread reads its neighbour's value, in both orders */
    CHECK_EQ_INT(run("high", 1, 1), N);
    CHECK_EQ_INT(run("low", 1, 1), N);
    CHECK_EQ_INT(run("high", N - 1, 1), N);
    CHECK_EQ_INT(run("low", N - 1, 1), N);
    /* without it: reading a higher thread's write (step 1) goes wrong lowest first, and only
     * there (the last thread reads thread 0, the one read that order gets right); reading a
     * lower thread's write goes wrong highest first */
    CHECK_EQ_INT(run("high", 1, 0), N - 1);
    CHECK_EQ_INT(run("low", 1, 0), 1);
    CHECK_EQ_INT(run("high", N - 1, 0), 1);
    CHECK_EQ_INT(run("low", N - 1, 0), N - 1);
    /* an order it does not know fails the launch, naming the variable (stderr) */
    CHECK_EQ_INT(run("random", 1, 1), -1);
    TEST_MAIN_END();
}
