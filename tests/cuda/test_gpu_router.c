/*
 * test_gpu_router.c - the CUDA top-k router (forward, backward) against the fp64 reference:
 * the cases of the CPU test tests/test_router.c (shapes, softmax/sigmoid, renorm or not,
 * f32/bf16 logits, tie grids, hand-made ties, k = 1 renormalised, sigmoid + renorm where every
 * chosen sigmoid underflows) run on the GPU through
 * cuda_mirror.h. Its argument-error and thread-count checks are CPU-specific and not run.
 * Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_router_forward(c, a, w, b, s) gpu_router_forward((c), (a))
#define moex_router_backward(c, a, w, b, s) gpu_router_backward((c), (a))
#define main cpu_suite_main
#include "../test_router.c"
#undef main

int main(void) {
    ctx = cm_context();
    tu_rng r = tu_rng_seed(20240611);
    const moex_router_score scores[2] = {MOEX_ROUTER_SOFTMAX, MOEX_ROUTER_SIGMOID};
    const moex_router_norm norms[2] = {MOEX_ROUTER_NO_RENORM, MOEX_ROUTER_RENORM};
    const moex_dtype dts[2] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16};
    const int64_t shapes[][3] = {{37, 8, 2}, {23, 5, 1}, {17, 6, 6}, {64, 64, 8}, {1, 3, 2},
                                 {50, 1, 1}, {300, 160, 8}, {129, 40, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int sc = 0; sc < 2; sc++)
            for (int nm = 0; nm < 2; nm++)
                for (int d = 0; d < 2; d++)
                    for (int grid = 0; grid < 2; grid++) {
                        router_case c = {.T = shapes[s][0], .E = shapes[s][1], .k = shapes[s][2], .score = scores[sc],
                                         .norm = norms[nm], .dt = dts[d], .grid = grid};
                        test_case(&r, &c);
                    }
    test_ties();
    test_k1_renorm_zero_grad(&r);
    test_sigmoid_renorm_tiny();
    test_empty();
    moex_context_destroy(ctx);
    return tu_finish();
}
