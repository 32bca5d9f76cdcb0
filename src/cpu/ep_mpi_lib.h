/*
 * ep_mpi_lib.h - private: the MPI functions and predefined handles that the MPI transport of
 * expert parallelism (ep_mpi.c) uses, as a table resolved at run time (src/core/ep_dl.h):
 * libmoex has no link dependency on libmpi. ep_mpi.c calls MPI only through this table and
 * names no predefined handle (MPI_BYTE ...) itself: under Open MPI those are addresses of
 * libmpi's global objects (ompi_mpi_byte ...), which would make libmoex need libmpi at load
 * time. Compiled only when the build found an mpi.h (MOEX_HAVE_MPI); the table's types are
 * that header's, so the MPI found at run time must be of the same ABI (the same
 * implementation, as with any link against it).
 */
#ifndef MOEX_EP_MPI_LIB_H
#define MOEX_EP_MPI_LIB_H

#include <mpi.h>
#include <stddef.h>

typedef struct moex_mpi_api {
    int (*Initialized)(int *flag);
    int (*Comm_rank)(MPI_Comm comm, int *rank);
    int (*Comm_size)(MPI_Comm comm, int *size);
    int (*Error_string)(int errorcode, char *string, int *resultlen);
    int (*Allgather)(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                     MPI_Datatype recvtype, MPI_Comm comm);
    int (*Alltoall)(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                    MPI_Datatype recvtype, MPI_Comm comm);
    int (*Alltoallv)(const void *sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                     void *recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype,
                     MPI_Comm comm);
    int (*Type_contiguous)(int count, MPI_Datatype oldtype, MPI_Datatype *newtype);
    int (*Type_commit)(MPI_Datatype *datatype);
    int (*Type_free)(MPI_Datatype *datatype);
    /* the predefined handles, as mpi.h names them, resolved in the loaded library */
    MPI_Datatype byte;              /* MPI_BYTE */
    MPI_Datatype int64;             /* MPI_INT64_T */
    MPI_Comm comm_null;             /* MPI_COMM_NULL */
    const char *path;               /* the file the functions came from (messages) */
} moex_mpi_api;

/* The table, resolved on the first successful call and then the same for the life of the
 * process (written once, under a lock; never unloaded). The MPI library is the one the process
 * has loaded already (the caller's, who made the communicator: RTLD_NOLOAD), else the one
 * the loader finds under the SONAME of the MPI this build compiled against, else that
 * library's path at build time; $MOEX_EP_MPI_LIBRARY (a name or a path), when set, replaces
 * both names (already loaded first, then loaded). NULL when it cannot be loaded or lacks a symbol: why[why_len]
 * then says which library and the dlerror() text; a later call tries again. Thread-safe. */
const moex_mpi_api *moex_mpi_api_load(char *why, size_t why_len);

/* What the loader looks for, for messages: the SONAME, e.g. "libmpi.so.40". */
const char *moex_mpi_api_soname(void);

#endif /* MOEX_EP_MPI_LIB_H */
