/* The CUDA emulator's stand-in for <cublas_v2.h> (kernels/cuda/emu/include/cuda_runtime.h
 * says what the emulator is): the types of the six cuBLAS functions cuda_backend.cu loads, which
 * kernels/cuda/emu/cuda_emu.cpp implements with cuBLAS's column-major semantics (and its
 * argument checks), so that the backend's row-major mapping is tested too. */
#ifndef FF_CUDA_EMU_CUBLAS_V2_H
#define FF_CUDA_EMU_CUBLAS_V2_H

#include <cuda_runtime.h>

#define CUBLAS_VER_MAJOR 13

typedef struct ff_emu_blas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t ff_emu_cublasCreate(cublasHandle_t *h);
cublasStatus_t ff_emu_cublasDestroy(cublasHandle_t h);
cublasStatus_t ff_emu_cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t ff_emu_cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t ff_emu_cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
cublasStatus_t ff_emu_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                   cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t comp, cublasGemmAlgo_t algo);
const char *ff_emu_cublasGetStatusString(cublasStatus_t s);

#endif
