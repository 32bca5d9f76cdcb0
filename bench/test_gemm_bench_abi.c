/*
 * test_gemm_bench_abi.c - prints the size and field offsets of the moex.h structs that
 * bench/gemm_bench.py mirrors with ctypes, in the format of `gemm_bench.py --abi`, so the
 * two outputs can be compared with diff. Not part of the CMake build:
 *
 *     cc -std=c11 -Iinclude bench/test_gemm_bench_abi.c -o /tmp/abi && /tmp/abi > /tmp/abi_c.txt
 *     python3 bench/gemm_bench.py --abi > /tmp/abi_py.txt && diff /tmp/abi_c.txt /tmp/abi_py.txt
 */
#include <stddef.h>
#include <stdio.h>

#include "moex.h"

/* "<struct> size <bytes>" then "<struct>.<field> <offset> <size>" for every field. */
#define STRUCT(S) printf("%s size %zu\n", #S, sizeof(S))
#define FIELD(S, f) printf("%s.%s %zu %zu\n", #S, #f, offsetof(S, f), sizeof(((S *)0)->f))
#define ENUM(E) printf("enum %s size %zu\n", #E, sizeof(E))

int main(void) {
    ENUM(moex_status);
    ENUM(moex_backend);
    ENUM(moex_dtype);
    ENUM(moex_bias_mode);
    ENUM(moex_grad_mode);

    STRUCT(moex_tensor);
    FIELD(moex_tensor, data);
    FIELD(moex_tensor, dtype);
    FIELD(moex_tensor, ndim);
    FIELD(moex_tensor, shape);

    STRUCT(moex_weight);
    FIELD(moex_weight, t);
    FIELD(moex_weight, ptrs);

    STRUCT(moex_grouped_linear_args);
    FIELD(moex_grouped_linear_args, x);
    FIELD(moex_grouped_linear_args, w);
    FIELD(moex_grouped_linear_args, bias_mode);
    FIELD(moex_grouped_linear_args, bias);
    FIELD(moex_grouped_linear_args, probs);
    FIELD(moex_grouped_linear_args, splits);
    FIELD(moex_grouped_linear_args, y);

    STRUCT(moex_grouped_linear_dgrad_args);
    FIELD(moex_grouped_linear_dgrad_args, dy);
    FIELD(moex_grouped_linear_dgrad_args, w);
    FIELD(moex_grouped_linear_dgrad_args, bias_mode);
    FIELD(moex_grouped_linear_dgrad_args, bias);
    FIELD(moex_grouped_linear_dgrad_args, probs);
    FIELD(moex_grouped_linear_dgrad_args, splits);
    FIELD(moex_grouped_linear_dgrad_args, dx);
    FIELD(moex_grouped_linear_dgrad_args, dbias);
    FIELD(moex_grouped_linear_dgrad_args, dprobs);

    STRUCT(moex_grouped_linear_wgrad_args);
    FIELD(moex_grouped_linear_wgrad_args, x);
    FIELD(moex_grouped_linear_wgrad_args, dy);
    FIELD(moex_grouped_linear_wgrad_args, splits);
    FIELD(moex_grouped_linear_wgrad_args, dw_mode);
    FIELD(moex_grouped_linear_wgrad_args, dw);
    return 0;
}
