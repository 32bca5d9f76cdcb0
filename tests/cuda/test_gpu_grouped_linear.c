/*
 * test_gpu_grouped_linear.c - the CUDA grouped linear (forward, backward-data, backward-
 * weight) against the fp64 reference: the CPU test tests/test_grouped_linear.c (every
 * dtype, splits kind, weight form, bias mode, optional output and dW mode, with poisoned
 * tails) run unchanged on the GPU through cuda_mirror.h, plus larger shapes that cross
 * several 128-row and 128-column tiles on both the vectorised (sizes multiple of 8) and
 * the guarded path. Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_grouped_linear_forward(c, a, w, b, s) gpu_gl_forward((c), (a))
#define moex_grouped_linear_backward_data(c, a, w, b, s) gpu_gl_dgrad((c), (a))
#define moex_grouped_linear_backward_weight(c, a, w, b, s) gpu_gl_wgrad((c), (a))
#define main cpu_suite_main
#include "../test_grouped_linear.c"
#undef main

int main(void) {
    cpu_suite_main();   /* prints its own tally; failures are counted below too */
    moex_context *ctx = cm_context();
    tu_rng r = tu_rng_seed(777);
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        moex_dtype dt = dts[d];
        /* tiles: vectorised K, N (multiples of 8), several row tiles per group */
        gl_cfg a = {.dt = dt, .G = 3, .T = 700, .rows = 650, .K = 136, .N = 264, .kind = TU_SPLITS_SKEWED,
                    .discrete = d == 1, .mode = MOEX_BIAS_SCALED, .bias_dt = dt, .dgrad_mask = 7,
                    .dw_mode = MOEX_GRAD_ACCUMULATE, .dw_dt = MOEX_DTYPE_F32};
        run_case(ctx, &r, &a);
        /* odd sizes on the guarded path, empty middle groups */
        gl_cfg b = {.dt = dt, .G = 4, .T = 515, .rows = 509, .K = 133, .N = 141, .kind = TU_SPLITS_EMPTY_MIDDLE,
                    .discrete = d != 1, .mode = MOEX_BIAS_ADD, .bias_dt = MOEX_DTYPE_F32, .dgrad_mask = 3,
                    .dw_mode = MOEX_GRAD_WRITE, .dw_dt = dt};
        run_case(ctx, &r, &b);
    }
    moex_context_destroy(ctx);
    return tu_finish();
}
