/* The NCCL stand-in's API (tests/coll/nccl_emu/nccl_emu.c): the subset of <nccl.h> that
 * workers/coll/nccl/nccl_backend.c calls, with NCCL's names, types and meanings, so that file
 * builds unchanged against it and runs on the CUDA emulator's devices. Each function name is
 * a macro onto an ff_emu_ symbol, so a program may link the real libnccl beside it. */
#ifndef FF_NCCL_EMU_NCCL_H
#define FF_NCCL_EMU_NCCL_H

#include <stddef.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ff_emu_nccl_comm *ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;

typedef enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

#define NCCL_SPLIT_NOCOLOR -1
typedef struct {
    int blocking; /* 0: every call returns at once, ncclInProgress while it settles */
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {1}

#define ncclGetUniqueId ff_emu_ncclGetUniqueId
#define ncclCommInitRankConfig ff_emu_ncclCommInitRankConfig
#define ncclCommSplit ff_emu_ncclCommSplit
#define ncclCommFinalize ff_emu_ncclCommFinalize
#define ncclCommDestroy ff_emu_ncclCommDestroy
#define ncclCommAbort ff_emu_ncclCommAbort
#define ncclCommGetAsyncError ff_emu_ncclCommGetAsyncError
#define ncclCommUserRank ff_emu_ncclCommUserRank
#define ncclCommCount ff_emu_ncclCommCount
#define ncclGetErrorString ff_emu_ncclGetErrorString
#define ncclGetLastError ff_emu_ncclGetLastError
#define ncclAllReduce ff_emu_ncclAllReduce
#define ncclBroadcast ff_emu_ncclBroadcast
#define ncclReduce ff_emu_ncclReduce
#define ncclAllGather ff_emu_ncclAllGather
#define ncclReduceScatter ff_emu_ncclReduceScatter
#define ncclSend ff_emu_ncclSend
#define ncclRecv ff_emu_ncclRecv
#define ncclGroupStart ff_emu_ncclGroupStart
#define ncclGroupEnd ff_emu_ncclGroupEnd

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif
#endif
