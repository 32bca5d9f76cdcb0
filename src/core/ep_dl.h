/*
 * ep_dl.h - private: how expert parallelism's transports reach their communication library
 * (MPI for the CPU backend, NCCL for the CUDA backend) at run time, never at link time.
 *
 * libmoex.so (and the Python package's copy of it) has no DT_NEEDED entry on libmpi or
 * libnccl: loading moex never loads either, so it can never put a second NCCL or MPI into a
 * process ahead of the one PyTorch (or the caller) uses. Each transport's functions are
 * resolved with dlopen/dlsym into a table of function pointers when moex_ep_create first runs
 * for that transport (src/cpu/ep_mpi_lib.c, src/cuda/ep_nccl_lib.c: one file per transport,
 * the only files that name the library's functions outside the transport itself); this file
 * is the loader they share.
 */
#ifndef MOEX_EP_DL_H
#define MOEX_EP_DL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library a transport needs, found in this order:
 *   1. already loaded in the process under one of `names` (dlopen with RTLD_NOLOAD): the
 *      communicator's owner (torch's NCCL, the caller's MPI) loaded it, and that copy is the
 *      one whose communicator the caller passes;
 *   2. loaded now by each of `names` in turn (the loader's search: LD_LIBRARY_PATH, the cache,
 *      a name with a '/' as a path), RTLD_NOW | RTLD_LOCAL.
 * names: n >= 1 names (a SONAME such as "libnccl.so.2", or a path); NULL entries are skipped.
 * Returns the handle (never closed: the table resolved from it lives as long as the process),
 * or NULL with why[why_len] holding each name's dlerror() text. Thread-safe (dlopen is); the
 * callers serialise the table they fill. */
void *moex_ep_dlopen(const char *const *names, int n, char *why, size_t why_len);

/* dlclose(lib) of a handle whose symbols turned out unusable (NULL: nothing). */
void moex_ep_dlclose(void *lib);

/* dlsym(lib, name), or NULL with why[why_len] = "<name>: <dlerror()>". */
void *moex_ep_dlsym(void *lib, const char *name, char *why, size_t why_len);

/* The path of the file a handle of moex_ep_dlopen is (dlinfo's link map), or "?". */
const char *moex_ep_dl_path(void *lib);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_EP_DL_H */
