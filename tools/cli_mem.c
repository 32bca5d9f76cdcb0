/*
 * cli_mem.c - backend memory and timing for the `moex` tool: host memory, its available
 * bytes and the wall clock for the CPU backend; cudaMalloc, cudaMemcpy, cudaMemGetInfo and
 * CUDA events on the legacy default stream for the CUDA backend (compiled only with MOEX_HAVE_CUDA, so a CPU build
 * never needs a CUDA header).
 */
#include "cli_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#ifdef MOEX_HAVE_CUDA
#include <cuda_runtime_api.h>

static int cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "moex: %s failed: %s\n", what, cudaGetErrorString(e));
    return -1;
}
#endif

void *cli_mem_alloc(moex_backend b, size_t bytes) {
    if (bytes == 0) return NULL;
#ifdef MOEX_HAVE_CUDA
    if (b == MOEX_BACKEND_CUDA) {
        void *p = NULL;
        if (cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc") != 0) return NULL;
        return p;
    }
#endif
    (void)b;
    return malloc(bytes);
}

void cli_mem_free(moex_backend b, void *p) {
    if (!p) return;
#ifdef MOEX_HAVE_CUDA
    if (b == MOEX_BACKEND_CUDA) {
        cudaFree(p);
        return;
    }
#endif
    (void)b;
    free(p);
}

/* A copy between host and backend memory: cudaMemcpy to or from the device on CUDA,
 * memcpy on the CPU. */
static int mem_copy(moex_backend b, void *dst, const void *src, size_t bytes, int to_device) {
    if (bytes == 0) return 0;
#ifdef MOEX_HAVE_CUDA
    if (b == MOEX_BACKEND_CUDA)
        return cuda_ok(cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
                       "cudaMemcpy");
#endif
    (void)b;
    (void)to_device;
    memcpy(dst, src, bytes);
    return 0;
}

int cli_mem_upload(moex_backend b, void *dst, const void *src, size_t bytes) {
    return mem_copy(b, dst, src, bytes, 1);
}

int cli_mem_download(moex_backend b, void *dst, const void *src, size_t bytes) {
    return mem_copy(b, dst, src, bytes, 0);
}

int cli_mem_zero(moex_backend b, void *dst, size_t bytes) {
    if (bytes == 0) return 0;
#ifdef MOEX_HAVE_CUDA
    if (b == MOEX_BACKEND_CUDA) return cuda_ok(cudaMemset(dst, 0, bytes), "cudaMemset");
#endif
    (void)b;
    memset(dst, 0, bytes);
    return 0;
}

int cli_mem_sync(moex_backend b) {
#ifdef MOEX_HAVE_CUDA
    if (b == MOEX_BACKEND_CUDA) return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
    (void)b;
    return 0;
}

/* ---- available memory ------------------------------------------------------------ */

/* MemAvailable of /proc/meminfo in bytes, or 0 when it cannot be read (not Linux). */
static size_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    fclose(f);
    if (!found) return 0;
    return kib > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kib * 1024;
}

static size_t host_available(void) {
    size_t bytes = meminfo_available();
    if (bytes) return bytes;
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
        return (size_t)pages > SIZE_MAX / (size_t)page ? SIZE_MAX : (size_t)pages * (size_t)page;
#endif
    return SIZE_MAX;
}

size_t cli_mem_available(moex_backend b) {
#ifdef MOEX_HAVE_CUDA
    if (b == MOEX_BACKEND_CUDA) {
        size_t free_bytes = 0, total = 0;
        if (cuda_ok(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo") != 0) return SIZE_MAX;
        return free_bytes;
    }
#endif
    (void)b;
    return host_available();
}

/* ---- timing ------------------------------------------------------------------------- */

int cli_timer_init(cli_timer *t, moex_backend b) {
    t->backend = b;
    t->t0 = 0.0;
    t->ev0 = t->ev1 = NULL;
#ifdef MOEX_HAVE_CUDA
    if (b == MOEX_BACKEND_CUDA) {
        cudaEvent_t e0, e1;
        if (cuda_ok(cudaEventCreate(&e0), "cudaEventCreate") != 0) return -1;
        if (cuda_ok(cudaEventCreate(&e1), "cudaEventCreate") != 0) {
            cudaEventDestroy(e0);
            return -1;
        }
        t->ev0 = e0;
        t->ev1 = e1;
    }
#endif
    return 0;
}

void cli_timer_start(cli_timer *t) {
#ifdef MOEX_HAVE_CUDA
    if (t->backend == MOEX_BACKEND_CUDA) {
        cudaEventRecord((cudaEvent_t)t->ev0, 0);
        return;
    }
#endif
    t->t0 = cli_now();
}

double cli_timer_stop(cli_timer *t) {
#ifdef MOEX_HAVE_CUDA
    if (t->backend == MOEX_BACKEND_CUDA) {
        float ms = 0.0f;
        cudaEventRecord((cudaEvent_t)t->ev1, 0);
        cudaEventSynchronize((cudaEvent_t)t->ev1);
        cudaEventElapsedTime(&ms, (cudaEvent_t)t->ev0, (cudaEvent_t)t->ev1);
        return 1e-3 * (double)ms;
    }
#endif
    return cli_now() - t->t0;
}

void cli_timer_destroy(cli_timer *t) {
#ifdef MOEX_HAVE_CUDA
    if (t->ev0) cudaEventDestroy((cudaEvent_t)t->ev0);
    if (t->ev1) cudaEventDestroy((cudaEvent_t)t->ev1);
#endif
    t->ev0 = t->ev1 = NULL;
}
