/*
 * ep_nccl_lib.c - the NCCL transport's function table (ep_nccl_lib.h), resolved with
 * dlopen/dlsym when moex_ep_create first runs over NCCL.
 *
 * Why a table in libmoex rather than a plugin library linked against libnccl: the transport
 * uses thirteen NCCL functions and no global object; resolving them here keeps one library
 * (libmoex.so and libmoex.a work alike, nothing more to install, find or keep in step) and
 * the transport's code unchanged but for the `api->` in front of each call (docs/ops.md 10.5).
 * Which NCCL: the process's own when one is loaded (PyTorch's from its nvidia-nccl wheel, or
 * the caller's), so moex and the communicator's owner always share one NCCL.
 *
 * Build-time definition (CMakeLists.txt): MOEX_NCCL_PATH, the path of the libnccl the build
 * found (the last place tried); may be absent.
 */
#include "ep_nccl_lib.h"

#include "ep_dl.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define NCCL_SONAME "libnccl.so.2"
#ifndef MOEX_NCCL_PATH
#define MOEX_NCCL_PATH NULL
#endif

static moex_ep_dl_once once = MOEX_EP_DL_ONCE_INIT;
static moex_nccl_api table;       /* filled once, under once.lock */

#define RESOLVE(field, name) MOEX_EP_RESOLVE(r, *t, field, name)

static bool fill(moex_ep_resolver *r, const char *name, void *table_, char *why, size_t why_len) {
    moex_nccl_api *t = table_;
    RESOLVE(GetVersion, ncclGetVersion);
    RESOLVE(GetErrorString, ncclGetErrorString);
    RESOLVE(GetLastError, ncclGetLastError);
    RESOLVE(CommGetAsyncError, ncclCommGetAsyncError);
    RESOLVE(CommCount, ncclCommCount);
    RESOLVE(CommCuDevice, ncclCommCuDevice);
    RESOLVE(CommUserRank, ncclCommUserRank);
    RESOLVE(GroupStart, ncclGroupStart);
    RESOLVE(GroupEnd, ncclGroupEnd);
    RESOLVE(Send, ncclSend);
    RESOLVE(Recv, ncclRecv);
    RESOLVE(AllGather, ncclAllGather);
    RESOLVE(AllReduce, ncclAllReduce);
    if (!r->ok) return false;
    /* NCCL 2 encodes 2.x.y as 2x0y (x < 9) or 2xxyy; another major has another ABI */
    const ncclResult_t vr = t->GetVersion(&t->version);
    if (vr != ncclSuccess || t->version < 20000 || t->version >= 30000) {
        snprintf(why, why_len, "%s (%s) is not NCCL 2 (ncclGetVersion: result %d, version %d)", name,
                 moex_ep_dl_path(r->lib), (int)vr, t->version);
        return false;
    }
    t->path = moex_ep_dl_path(r->lib);
    return true;
}

const moex_nccl_api *moex_nccl_api_load(char *why, size_t why_len) {
    /* $MOEX_EP_NCCL_LIBRARY (a name or path), when set, replaces the build's names */
    static const moex_ep_dl_lib lib = {"MOEX_EP_NCCL_LIBRARY", NCCL_SONAME, MOEX_NCCL_PATH, "NCCL's library",
                                       " (NCCL 2.13 or later has every function moex calls)"};
    return moex_ep_dl_load_once(&once, &lib, fill, &table, sizeof table, why, why_len);
}
