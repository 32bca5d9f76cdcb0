/*
 * test_gpu_grouped_mlp.c - the CUDA grouped MLP (forward, backward) against the fp64
 * reference: the CPU test tests/test_grouped_mlp.c (dtypes, splits kinds, GLU kinds and
 * layouts, bias modes, probs, saved/recomputed z, every gradient subset, dW modes, weight
 * forms, poisoned tails) run unchanged on the GPU through cuda_mirror.h. Exits 77
 * (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_grouped_mlp_forward(c, a, w, b, s) gpu_mlp_forward((c), (a))
#define moex_grouped_mlp_backward(c, a, w, b, s) gpu_mlp_backward((c), (a))
#include "../test_grouped_mlp.c"
