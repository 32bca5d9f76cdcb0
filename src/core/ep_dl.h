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

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>   /* MOEX_EP_RESOLVE */

#ifdef __cplusplus
extern "C" {
#endif

/* The library a transport needs (`what`, for messages: "NCCL's library"), by the names
 * $env_var (a name or path) when it is set, else `soname` (such as "libnccl.so.2") and then
 * `path` (the build's; NULL: none), found in this order:
 *   1. already loaded in the process under one of the names (dlopen with RTLD_NOLOAD): the
 *      communicator's owner (torch's NCCL, the caller's MPI) loaded it, and that copy is the
 *      one whose communicator the caller passes;
 *   2. loaded now by each name in turn (the loader's search: LD_LIBRARY_PATH, the cache, a
 *      name with a '/' as a path), RTLD_NOW | RTLD_LOCAL.
 * Returns the handle (never closed: the table resolved from it lives as long as the process)
 * and *name, the first name tried; or NULL with why[why_len] = "cannot load <what> <name>
 * [($env_var)] (<each name's dlerror()>)". Thread-safe (dlopen is); the callers serialise the
 * table they fill. */
void *moex_ep_dlopen(const char *env_var, const char *soname, const char *path, const char *what, const char **name,
                     char *why, size_t why_len);

/* A fill's symbol lookup: the library, whether every symbol so far was found, and what
 * dlsym said of the first one missing. */
typedef struct moex_ep_resolver {
    void *lib;
    bool ok;
    char why[512];
} moex_ep_resolver;

/* A transport's library: moex_ep_dlopen's env_var, soname, path and what, and a hint that
 * follows the message of a missing symbol ("" for none). */
typedef struct moex_ep_dl_lib {
    const char *env_var, *soname, *path, *what, *lacks_hint;
} moex_ep_dl_lib;

/* A transport's table, filled once per process: `fill` resolves the library's symbols into
 * `table` (zeroed before) with MOEX_EP_RESOLVE(r, ...) and checks what else it needs. It
 * returns false when r->ok is false (a symbol is missing: the load then says "<what> <name>
 * (<path>) lacks <r->why><lacks_hint>") or when something else is wrong, with why[why_len] set. */
typedef bool (*moex_ep_dl_fill)(moex_ep_resolver *r, const char *name, void *table, char *why, size_t why_len);
typedef struct moex_ep_dl_once {
    pthread_mutex_t lock;
    bool loaded;                    /* under `lock`: the table is filled */
} moex_ep_dl_once;
#define MOEX_EP_DL_ONCE_INIT {PTHREAD_MUTEX_INITIALIZER, false}

/* Under once->lock: `table` (table_bytes) when it is filled; else moex_ep_dlopen of lib and
 * fill, and `table` when both succeed; else NULL with why[why_len] set, the library closed and
 * the table left unfilled (a later call tries again). */
const void *moex_ep_dl_load_once(moex_ep_dl_once *once, const moex_ep_dl_lib *lib, moex_ep_dl_fill fill, void *table,
                                 size_t table_bytes, char *why, size_t why_len);

/* dlclose(lib) of a handle whose symbols turned out unusable (NULL: nothing). */
void moex_ep_dlclose(void *lib);

/* dlsym(lib, name), or NULL with why[why_len] = "<name>: <dlerror()>". */
void *moex_ep_dlsym(void *lib, const char *name, char *why, size_t why_len);

/* The path of the file a handle of moex_ep_dlopen is (dlinfo's link map), or "?". */
const char *moex_ep_dl_path(void *lib);

/* table.field = dlsym(r->lib, "name") while r->ok holds (else r->ok = false, r->why saying
 * which symbol is missing); the field's type is checked against the header's declaration of
 * `name` at compile time (sizeof's operand is not evaluated: no reference to the symbol is
 * made). */
#define MOEX_EP_RESOLVE(r, table, field, name)                                                        \
    do {                                                                                              \
        (void)sizeof((table).field = name);                                                           \
        void *p_ = (r)->ok ? moex_ep_dlsym((r)->lib, #name, (r)->why, sizeof (r)->why) : NULL;        \
        if (!p_) (r)->ok = false;                                                                     \
        else memcpy(&(table).field, &p_, sizeof p_); /* object to function pointer (POSIX dlsym) */   \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* MOEX_EP_DL_H */
