/*
 * fuzz_mem.c - backend memory for the moex API fuzzer: host memory for the CPU backend,
 * cudaMalloc'd device memory (copied in and out with cudaMemcpy on the legacy default
 * stream) for the CUDA backend. Only this file includes a CUDA header, and only when built
 * with MOEX_FUZZ_HAVE_CUDA (tests/fuzz/CMakeLists.txt sets it when MOEX_HAVE_CUDA is ON).
 */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#ifdef MOEX_FUZZ_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

void *fz_mem_alloc(int cuda, size_t bytes) {
#ifdef MOEX_FUZZ_HAVE_CUDA
    if (cuda) {
        void *p = NULL;
        return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
    }
#endif
    (void)cuda;
    return malloc(bytes ? bytes : 1);
}

void fz_mem_free(int cuda, void *p) {
    if (!p) return;
#ifdef MOEX_FUZZ_HAVE_CUDA
    if (cuda) {
        cudaFree(p);
        return;
    }
#endif
    (void)cuda;
    free(p);
}

void fz_mem_put(int cuda, void *dst, const void *src, size_t n) {
    if (!n) return;
#ifdef MOEX_FUZZ_HAVE_CUDA
    if (cuda) {
        cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
        return;
    }
#endif
    (void)cuda;
    memcpy(dst, src, n);
}

void fz_mem_get(int cuda, void *dst, const void *src, size_t n) {
    if (!n) return;
#ifdef MOEX_FUZZ_HAVE_CUDA
    if (cuda) {
        cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
        return;
    }
#endif
    (void)cuda;
    memcpy(dst, src, n);
}

const char *fz_mem_error(int cuda) {
#ifdef MOEX_FUZZ_HAVE_CUDA
    if (cuda) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaGetLastError();
        return e == cudaSuccess ? NULL : cudaGetErrorString(e);
    }
#endif
    (void)cuda;
    return NULL;
}

int fz_mem_have_cuda(void) {
#ifdef MOEX_FUZZ_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}
