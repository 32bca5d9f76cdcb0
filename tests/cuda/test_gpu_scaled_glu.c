/*
 * test_gpu_scaled_glu.c - the CUDA scaled GLU (forward, backward) against the fp64
 * reference: the CPU test tests/test_scaled_glu.c run unchanged on the GPU through
 * cuda_mirror.h (the quantized z, fused there: against the GPU's GLU then quantize, bit for
 * bit). Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_scaled_glu_forward(c, a, w, b, s) gpu_glu_forward((c), (a))
#define moex_scaled_glu_backward(c, a, w, b, s) gpu_glu_backward((c), (a))
#define moex_group_quantize(c, a, w, b, s) gpu_group_quantize((c), (a))
#include "../test_scaled_glu.c"
