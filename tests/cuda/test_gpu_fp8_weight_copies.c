/*
 * test_gpu_fp8_weight_copies.c - the layers' FP8 recipe with the weights' copies a caller keeps
 * (moex_fp8_recipe.weights) on CUDA: the CPU test tests/test_fp8_weight_copies.c (the grouped
 * linear, the grouped MLP and the MoE layer; bitwise the call that quantizes the weights; the
 * copies of another weight give that weight's result; refusals; OFF ignores them) run on the
 * GPU through cuda_mirror.h, the kept copies quantized there too. Exits 77 (skipped) without a
 * GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_weight_quantize(c, a, w, b, s) gpu_weight_quantize((c), (a))
#define moex_grouped_linear_forward(c, a, w, b, s) gpu_gl_forward((c), (a))
#define moex_grouped_linear_backward_data(c, a, w, b, s) gpu_gl_dgrad((c), (a))
#define moex_grouped_mlp_forward(c, a, w, b, s) gpu_mlp_forward((c), (a))
#define moex_grouped_mlp_backward(c, a, w, b, s) gpu_mlp_backward((c), (a))
#define moex_moe_layer_forward(c, a, w, b, s) gpu_moe_forward((c), (a))
#define moex_moe_layer_backward(c, a, w, b, s) gpu_moe_backward((c), (a))
#define main cpu_suite_main
#include "../test_fp8_weight_copies.c"
#undef main

int main(void) { return cpu_suite_main(); }
