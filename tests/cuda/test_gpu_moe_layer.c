/*
 * test_gpu_moe_layer.c - the CUDA MoE layer (forward, backward) against the fp64
 * reference: the cases of the CPU test tests/test_moe_layer.c (dtypes, softmax/sigmoid,
 * renorm, k = 1 and k = E, empty experts, bias modes, GLU kinds and layouts, weight forms,
 * WRITE/ACCUMULATE, determinism) and its finite-difference check of the library backward,
 * run on the GPU through cuda_mirror.h (which keeps `saved` in device memory between the
 * two calls). The saved-header checks are CPU-specific (the GPU cannot read a header
 * without a synchronisation) and not run. Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_moe_layer_forward(c, a, w, b, s) gpu_moe_forward((c), (a))
#define moex_moe_layer_backward(c, a, w, b, s) gpu_moe_backward((c), (a))
#define main cpu_suite_main
#include "../test_moe_layer.c"
#undef main

int main(void) {
    ctx = cm_context();
    tu_rng r = tu_rng_seed(4242);
    const moex_router_score SM = MOEX_ROUTER_SOFTMAX, SG = MOEX_ROUTER_SIGMOID;
    const moex_router_norm RN = MOEX_ROUTER_RENORM, RAW = MOEX_ROUTER_NO_RENORM;
    const moex_glu_kind SW = MOEX_GLU_SWIGLU, CL = MOEX_GLU_CLAMPED_SWIGLU;
    const moex_glu_layout CT = MOEX_GLU_CONTIGUOUS, IL = MOEX_GLU_INTERLEAVED_32;
    const moex_dtype F32 = MOEX_DTYPE_F32, BF = MOEX_DTYPE_BF16, F16 = MOEX_DTYPE_F16;
    const moex_grad_mode WR = MOEX_GRAD_WRITE, AC = MOEX_GRAD_ACCUMULATE;
    const moe_case cases[] = {
        {23, 16, 4, 8, 2, SM, RN, MOEX_BIAS_NONE, 0, SW, CT, F32, 1, WR, F32, 0},
        {19, 12, 5, 6, 1, SG, RAW, MOEX_BIAS_ADD, 1, SW, CT, F32, 2, WR, F32, 1},
        {13, 8, 3, 4, 3, SM, RAW, MOEX_BIAS_SCALED, 1, CL, CT, F32, 0, AC, F32, 0},
        {29, 16, 6, 32, 2, SM, RN, MOEX_BIAS_SCALED, 1, CL, IL, BF, 2, WR, BF, 0},
        {29, 16, 6, 32, 2, SM, RN, MOEX_BIAS_SCALED, 1, CL, IL, F16, 2, AC, F32, 1},
        {31, 24, 8, 8, 4, SG, RN, MOEX_BIAS_ADD, 0, SW, CT, BF, 3, WR, F32, 0},
        {7, 5, 2, 3, 1, SM, RN, MOEX_BIAS_NONE, 1, SW, CT, F32, 0, WR, F32, 0},
        {40, 9, 7, 5, 2, SG, RAW, MOEX_BIAS_SCALED, 1, CL, CT, F16, 4, WR, F16, 1},
        {1, 3, 2, 1, 2, SG, RN, MOEX_BIAS_ADD, 1, SW, CT, F32, 0, AC, F32, 0},
        {64, 20, 12, 10, 3, SM, RN, MOEX_BIAS_SCALED, 1, SW, CT, BF, 5, AC, F32, 0},
        {300, 136, 16, 64, 4, SM, RN, MOEX_BIAS_SCALED, 1, SW, CT, BF, 2, WR, F32, 0},   /* several tiles */
        {257, 72, 9, 40, 2, SG, RAW, MOEX_BIAS_ADD, 1, CL, CT, F32, 1, AC, F32, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(&r, &cases[i]);
    const moe_case lib_fd_cases[] = {
        {17, 10, 4, 6, 2, SM, RN, MOEX_BIAS_SCALED, 1, SW, CT, F32, 1, WR, F32, 0},
        {12, 8, 5, 4, 2, SG, RAW, MOEX_BIAS_ADD, 1, CL, CT, F32, 0, WR, F32, 0},
        {9, 6, 3, 4, 3, SG, RN, MOEX_BIAS_NONE, 0, SW, CT, F32, 0, WR, F32, 0},
    };
    for (size_t i = 0; i < sizeof lib_fd_cases / sizeof lib_fd_cases[0]; i++) test_library_fd(&r, &lib_fd_cases[i]);
    test_empty_and_partial(&r);
    moex_context_destroy(ctx);
    return tu_finish();
}
