/*
 * test_gpu_fp8_layers.c - the layers' FP8 recipe on CUDA (moex_fp8_recipe, docs/ops.md 9.11):
 * the CPU test tests/test_fp8_layers.c (the grouped linear's three calls, the grouped MLP's
 * forward and backward and the MoE layer in BLOCK, CURRENT and MXFP8, HYBRID, the row classes,
 * G = 1, gradient subsets, dW written and accumulated, mode OFF bitwise the plain path) run on
 * the GPU through cuda_mirror.h, with the FP8 tensor cores' accumulation in the tolerance;
 * discrete weights (and dW) with their pointer arrays in device memory. Exits 77 (skipped)
 * without a GPU.
 */
#include "cuda_mirror.h"

#define TFP8_GPU 1
#define tu_cpu_context() cm_context()
#define moex_grouped_linear_forward(c, a, w, b, s) gpu_gl_forward((c), (a))
#define moex_grouped_linear_backward_data(c, a, w, b, s) gpu_gl_dgrad((c), (a))
#define moex_grouped_linear_backward_weight(c, a, w, b, s) gpu_gl_wgrad((c), (a))
#define moex_grouped_mlp_forward(c, a, w, b, s) gpu_mlp_forward((c), (a))
#define moex_grouped_mlp_backward(c, a, w, b, s) gpu_mlp_backward((c), (a))
#define moex_moe_layer_forward(c, a, w, b, s) gpu_moe_forward((c), (a))
#define moex_moe_layer_backward(c, a, w, b, s) gpu_moe_backward((c), (a))
#define main cpu_suite_main
#include "../test_fp8_layers.c"
#undef main

int main(void) { return cpu_suite_main(); }
