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

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define NCCL_SONAME "libnccl.so.2"
#ifndef MOEX_NCCL_PATH
#define MOEX_NCCL_PATH NULL
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static moex_nccl_api table;       /* written once, under `lock` */
static bool loaded;               /* under `lock` */

#define RESOLVE(field, name) MOEX_EP_RESOLVE(t, field, name, lib, ok, sym_why, sizeof sym_why)

const moex_nccl_api *moex_nccl_api_load(char *why, size_t why_len) {
    pthread_mutex_lock(&lock);
    if (loaded) {
        pthread_mutex_unlock(&lock);
        return &table;
    }
    /* $MOEX_EP_NCCL_LIBRARY (a name or path), when set, replaces the build's names */
    const char *name;
    void *lib = moex_ep_dlopen("MOEX_EP_NCCL_LIBRARY", NCCL_SONAME, MOEX_NCCL_PATH, "NCCL's library", &name, why,
                               why_len);
    if (!lib) {
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    moex_nccl_api t;
    memset(&t, 0, sizeof t);
    char sym_why[512] = "";
    bool ok = true;
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
    if (!ok) {
        snprintf(why, why_len, "NCCL's library %s (%s) lacks %s (NCCL 2.13 or later has every function moex calls)",
                 name, moex_ep_dl_path(lib), sym_why);
        moex_ep_dlclose(lib);
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    /* NCCL 2 encodes 2.x.y as 2x0y (x < 9) or 2xxyy; another major has another ABI */
    const ncclResult_t vr = t.GetVersion(&t.version);
    if (vr != ncclSuccess || t.version < 20000 || t.version >= 30000) {
        snprintf(why, why_len, "%s (%s) is not NCCL 2 (ncclGetVersion: result %d, version %d)", name,
                 moex_ep_dl_path(lib), (int)vr, t.version);
        moex_ep_dlclose(lib);
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    t.path = moex_ep_dl_path(lib);
    table = t;
    loaded = true;
    pthread_mutex_unlock(&lock);
    return &table;
}
