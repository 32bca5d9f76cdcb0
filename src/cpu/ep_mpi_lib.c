/*
 * ep_mpi_lib.c - the MPI transport's function table (ep_mpi_lib.h), resolved with
 * dlopen/dlsym when moex_ep_create first runs over MPI.
 *
 * Why a table in libmoex rather than a plugin library linked against libmpi: the transport
 * uses nine MPI functions and three predefined handles; resolving them here keeps one library
 * (libmoex.so and libmoex.a work alike, nothing more to install, find or keep in step) and
 * the transport's code unchanged but for the `api->` in front of each call (docs/ops.md 10.5).
 *
 * Predefined handles. mpi.h defines MPI_BYTE, MPI_INT64_T and MPI_COMM_NULL either as
 * constants (MPICH and its derivatives: integers, no symbol) or, under Open MPI, as the
 * address of a global object of libmpi through OMPI_PREDEFINED_GLOBAL(type, global).
 * Redefining that macro below makes the header's own definitions name the object by its
 * symbol, looked up in the loaded library: whatever the header's handles name is what gets
 * resolved, and the object code references no libmpi symbol (tests/python/
 * test_import_order.py checks libmoex.so's undefined symbols).
 *
 * Build-time definitions (CMakeLists.txt): MOEX_MPI_SONAME, the SONAME of the MPI library
 * the build found ("libmpi.so.40"), and MOEX_MPI_PATH, its path; either may be absent.
 */
#include "ep_mpi_lib.h"

#include "ep_dl.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#ifndef MOEX_MPI_SONAME
#define MOEX_MPI_SONAME "libmpi.so"
#endif
#ifndef MOEX_MPI_PATH
#define MOEX_MPI_PATH NULL
#endif

static moex_ep_dl_once once = MOEX_EP_DL_ONCE_INIT;
static moex_mpi_api table;        /* filled once, under once.lock */

const char *moex_mpi_api_soname(void) { return MOEX_MPI_SONAME; }

/* A global object of the loaded libmpi by name (an Open MPI predefined handle); NULL, and
 * r->ok cleared, when it is missing. */
static void *global_of(moex_ep_resolver *r, const char *name) {
    if (!r->ok) return NULL;
    void *p = moex_ep_dlsym(r->lib, name, r->why, sizeof r->why);
    if (!p) r->ok = false;
    return p;
}

#ifdef OMPI_PREDEFINED_GLOBAL
#undef OMPI_PREDEFINED_GLOBAL
#define OMPI_PREDEFINED_GLOBAL(type, global) ((type)global_of(r, #global))
#endif

#define RESOLVE(field, name) MOEX_EP_RESOLVE(r, *t, field, name)

/* The table, one RESOLVE a function: a plain list (grep finds each MPI name), alike in shape
 * with cuda/ep_nccl_lib.c's fill by design (the loading both share is ep_dl.c's). */
static bool fill(moex_ep_resolver *r, const char *name, void *table_, char *why, size_t why_len) {
    moex_mpi_api *t = table_;
    RESOLVE(Initialized, MPI_Initialized);
    RESOLVE(Comm_rank, MPI_Comm_rank);
    RESOLVE(Comm_size, MPI_Comm_size);
    RESOLVE(Error_string, MPI_Error_string);
    RESOLVE(Allgather, MPI_Allgather);
    RESOLVE(Alltoall, MPI_Alltoall);
    RESOLVE(Alltoallv, MPI_Alltoallv);
    RESOLVE(Type_contiguous, MPI_Type_contiguous);
    RESOLVE(Type_commit, MPI_Type_commit);
    RESOLVE(Type_free, MPI_Type_free);
    /* the header's handles: constants, or (Open MPI) global_of() through the macro above */
    if (r->ok) t->byte = MPI_BYTE;
    if (r->ok) t->int64 = MPI_INT64_T;
    if (r->ok) t->comm_null = MPI_COMM_NULL;
    if (!r->ok) return false;
    t->path = moex_ep_dl_path(r->lib);
    return true;
}

const moex_mpi_api *moex_mpi_api_load(char *why, size_t why_len) {
    /* $MOEX_EP_MPI_LIBRARY (a name or path), when set, replaces the build's names */
    static const moex_ep_dl_lib lib = {"MOEX_EP_MPI_LIBRARY", MOEX_MPI_SONAME, MOEX_MPI_PATH, "the MPI library", ""};
    return moex_ep_dl_load_once(&once, &lib, fill, &table, sizeof table, why, why_len);
}
