/*
 * ep_nccl_lib.h - private: the NCCL functions that the NCCL transport of expert parallelism
 * (ep_nccl.cu) uses, as a table resolved at run time (src/core/ep_dl.h): libmoex has no link
 * dependency on libnccl, so importing moex (the Python package) never loads a NCCL that could
 * clash with PyTorch's. ep_nccl.cu calls NCCL only through this table. Compiled only when the
 * build found nccl.h (MOEX_HAVE_NCCL); NCCL 2's C ABI (types, enums, signatures) is stable
 * across its releases, so the NCCL found at run time may be another 2.x than the header's.
 */
#ifndef MOEX_EP_NCCL_LIB_H
#define MOEX_EP_NCCL_LIB_H

#include <nccl.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moex_nccl_api {
    ncclResult_t (*GetVersion)(int *version);
    const char *(*GetErrorString)(ncclResult_t result);
    const char *(*GetLastError)(ncclComm_t comm);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *asyncError);
    ncclResult_t (*CommCount)(const ncclComm_t comm, int *count);
    ncclResult_t (*CommCuDevice)(const ncclComm_t comm, int *device);
    ncclResult_t (*CommUserRank)(const ncclComm_t comm, int *rank);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*Send)(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*Recv)(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*AllGather)(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                              ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*AllReduce)(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    int version;                    /* ncclGetVersion's, e.g. 22803 */
    const char *path;               /* the file the functions came from (messages) */
} moex_nccl_api;

/* The table, resolved on the first successful call and then the same for the life of the
 * process (written once, under a lock; never unloaded). The NCCL is the one the process has
 * loaded already (PyTorch's, or the caller's who made the communicator: RTLD_NOLOAD of
 * "libnccl.so.2"), else the one the loader finds as "libnccl.so.2", else the library this build
 * found (its path at build time); $MOEX_EP_NCCL_LIBRARY (a name or a path), when set,
 * replaces both names (already loaded first, then loaded). NULL when it cannot be loaded, lacks a symbol or is not NCCL
 * 2: why[why_len] then says which library and the dlerror() text; a later call tries again.
 * Thread-safe. */
const moex_nccl_api *moex_nccl_api_load(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_EP_NCCL_LIB_H */
