/*
 * cuda_check.h - private: turning CUDA runtime errors into moex statuses.
 *
 * CUDA_TRY(ctx, op, call) runs `call`; on an error it records "<op>: <call> failed: <cuda
 * message>" in ctx and returns MOEX_ERR_CUDA from the enclosing function. It never exits.
 * CUDA_TRY_LAUNCH(ctx, op) checks the last kernel launch the same way.
 */
#ifndef MOEX_CUDA_CHECK_H
#define MOEX_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "moex_impl.h"

#define CUDA_TRY(ctx, op, call)                                                                \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        if (err_ != cudaSuccess)                                                               \
            return moex_fail((ctx), MOEX_ERR_CUDA, "%s: %s failed: %s (%s)", (op), #call,      \
                             cudaGetErrorString(err_), cudaGetErrorName(err_));                \
    } while (0)

#define CUDA_TRY_LAUNCH(ctx, op) CUDA_TRY(ctx, op, cudaGetLastError())

#endif /* MOEX_CUDA_CHECK_H */
