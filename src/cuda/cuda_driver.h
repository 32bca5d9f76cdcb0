/*
 * cuda_driver.h - private: the CUDA driver functions moex calls (cuCtxGetCurrent,
 * cuTensorMapEncodeTiled, cuGetErrorName), reached through the runtime's entry-point query so
 * that libmoex does not link against libcuda.
 */
#ifndef MOEX_CUDA_DRIVER_H
#define MOEX_CUDA_DRIVER_H

#ifdef __cplusplus
extern "C" {
#endif

/* The driver's function `name` of the ABI of driver `version` (e.g. 12000), or NULL when the
 * driver has none (the runtime's error is cleared). */
void *moex_cuda_driver_entry(const char *name, int version);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_CUDA_DRIVER_H */
