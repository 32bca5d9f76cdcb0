/*
 * sm90_context.cu - the per-device state of the Hopper grouped GEMMs
 * (moex_sm90_context_create / _destroy, sm90_grouped_gemm.h): everything a launch would
 * otherwise ask the driver every time, asked once. The CUDA backend makes one per moex
 * context (cuda_sm90.cu); tests and benchmarks make their own.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_driver.h"
#include "sm90_common.cuh"

const char *sm90_map_failure(const moex_sm90_context *c, const char *kernel, const char *operand, CUresult r) {
    static thread_local char msg[256];
    const char *name = NULL;
    if (r == CUDA_ERROR_MISALIGNED_ADDRESS) {
        snprintf(msg, sizeof msg, "%s: the tensor map of %s: its address is not 16-byte aligned", kernel, operand);
        return msg;
    }
    if (c->error_name == NULL || c->error_name(r, &name) != CUDA_SUCCESS || name == NULL) name = "an unknown CUresult";
    snprintf(msg, sizeof msg, "%s: the tensor map of %s: cuTensorMapEncodeTiled returned %s (%d)", kernel, operand,
             name, (int)r);
    return msg;
}

static moex_status sm90_context_fill(moex_sm90_context *c, const char **why) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&c->dev.sms, cudaDevAttrMultiProcessorCount, c->device) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90: cudaDeviceGetAttribute failed");
    }
    if (major != 9 || minor != 0 || c->dev.sms < 1)
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90: the device is not a compute capability 9.0 GPU");
    cudaFuncAttributes fa;
    if (sm90_rows_probe(&fa) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90: the kernels are not in this binary");
    }
    if (fa.binaryVersion != 90) SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90: this binary has no sm_90a kernels");
    c->encode = (PFN_cuTensorMapEncodeTiled_v12000)moex_cuda_driver_entry("cuTensorMapEncodeTiled", 12000);
    c->error_name = (PFN_cuGetErrorName_v6000)moex_cuda_driver_entry("cuGetErrorName", 6000);
    if (c->encode == NULL) SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90: the driver gives no cuTensorMapEncodeTiled");
    const char *w = "";
    if (sm90_rows_prepare(c->dev.sms, &c->dev.rows_cluster_slots, &w) != cudaSuccess ||
        sm90_wgrad_prepare(c->dev.sms, &c->dev.wgrad_cluster_slots, &w) != cudaSuccess ||
        sm90_fp8_prepare(c->dev.sms, &c->dev.fp8_cluster_slots, &w) != cudaSuccess ||
        sm90_fp8_wgrad_prepare(c->dev.sms, &c->dev.fp8_cluster_slots, &w) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, w);
    }
    return MOEX_OK;
}

extern "C" moex_status moex_sm90_context_create(int device, moex_sm90_context **out, const char **why) {
    *out = NULL;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90: cudaSetDevice failed");
    }
    moex_sm90_context *c = (moex_sm90_context *)calloc(1, sizeof *c);
    moex_status st = MOEX_ERR_OUT_OF_MEMORY;
    if (c == NULL) {
        if (why != NULL) *why = "sm90: out of host memory";
    } else {
        c->device = device;
        st = sm90_context_fill(c, why);
    }
    if (cudaSetDevice(prev) != cudaSuccess) {
        cudaGetLastError();
        if (st == MOEX_OK) {
            st = MOEX_ERR_CUDA;
            if (why != NULL) *why = "sm90: cudaSetDevice (restoring the caller's device) failed";
        }
    }
    if (st != MOEX_OK) {
        free(c);
        return st;
    }
    *out = c;
    return MOEX_OK;
}

extern "C" void moex_sm90_context_destroy(moex_sm90_context *c) { free(c); }
