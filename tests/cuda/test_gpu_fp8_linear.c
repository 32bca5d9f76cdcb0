/*
 * test_gpu_fp8_linear.c - the CUDA FP8 grouped linear (moex_grouped_linear_fp8_forward,
 * _backward_weight, docs/ops.md 9.10) against the fp64 reference from the dequantized
 * operands: the CPU test tests/test_fp8_linear.c (every recipe pair, y dtype and bias mode,
 * groups of 0 to 129 rows, G = 1 and 256, the backward data through the weights' columnwise
 * copy, dW written and accumulated, bad arguments) run on the GPU through cuda_mirror.h.
 * Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define TFP8_GPU 1
#define tu_cpu_context() cm_context()
#define moex_grouped_linear_fp8_forward(c, a, w, b, s) gpu_fp8_forward((c), (a))
#define moex_grouped_linear_fp8_backward_weight(c, a, w, b, s) gpu_fp8_wgrad((c), (a))
#define main cpu_suite_main
#include "../test_fp8_linear.c"
#undef main

int main(void) { return cpu_suite_main(); }
