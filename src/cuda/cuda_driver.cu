/*
 * cuda_driver.cu - driver functions through the runtime's entry-point query (cuda_driver.h).
 */
#include <cuda_runtime.h>

#include "cuda_driver.h"

extern "C" void *moex_cuda_driver_entry(const char *name, int version) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}
