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
    run_backend_cases(&r);
    /* shapes of several GEMM tiles, which the CPU test keeps small */
    const moe_case big[] = {
        {.T = 300, .H = 136, .E = 16, .F = 64, .k = 4, .score = MOEX_ROUTER_SOFTMAX, .norm = MOEX_ROUTER_RENORM,
         .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1, .glu = MOEX_GLU_SWIGLU, .layout = MOEX_GLU_CONTIGUOUS,
         .dt = MOEX_DTYPE_BF16, .n_empty = 2, .dw_mode = MOEX_GRAD_WRITE, .dw_dt = MOEX_DTYPE_F32},
        {.T = 257, .H = 72, .E = 9, .F = 40, .k = 2, .score = MOEX_ROUTER_SIGMOID, .norm = MOEX_ROUTER_NO_RENORM,
         .b2_mode = MOEX_BIAS_ADD, .with_b1 = 1, .glu = MOEX_GLU_CLAMPED_SWIGLU, .layout = MOEX_GLU_CONTIGUOUS,
         .dt = MOEX_DTYPE_F32, .n_empty = 1, .dw_mode = MOEX_GRAD_ACCUMULATE, .dw_dt = MOEX_DTYPE_F32, .discrete = 1},
        /* reductions long enough that the router's GEMMs split them (logits over H, dWr over T),
         * in runs that are not whole tiles */
        {.T = 600, .H = 640, .E = 8, .F = 32, .k = 2, .score = MOEX_ROUTER_SOFTMAX, .norm = MOEX_ROUTER_RENORM,
         .b2_mode = MOEX_BIAS_NONE, .glu = MOEX_GLU_SWIGLU, .layout = MOEX_GLU_CONTIGUOUS, .dt = MOEX_DTYPE_BF16,
         .n_empty = 1, .dw_mode = MOEX_GRAD_WRITE, .dw_dt = MOEX_DTYPE_F32},
        {.T = 1100, .H = 520, .E = 5, .F = 24, .k = 2, .score = MOEX_ROUTER_SIGMOID, .norm = MOEX_ROUTER_RENORM,
         .b2_mode = MOEX_BIAS_ADD, .glu = MOEX_GLU_SWIGLU, .layout = MOEX_GLU_CONTIGUOUS, .dt = MOEX_DTYPE_F32,
         .dw_mode = MOEX_GRAD_ACCUMULATE, .dw_dt = MOEX_DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) test_case(&r, &big[i]);
    test_empty_and_partial(&r);
    moex_context_destroy(ctx);
    return tu_finish();
}
