/*
 * test_gpu_quantize.c - the CUDA grouped quantization (moex_group_quantize,
 * moex_group_dequantize) against the reference of tools/ref/ref_quant.h, bit for bit: the CPU
 * test tests/test_quantize.c (every recipe, format, rounding, epsilon, orientation and input
 * dtype; empty groups, G = 64, sum < T with NaN tails, poisoned output tails; specials, ties,
 * extreme amax; dequantize of arbitrary bytes; bad arguments) run on the GPU through
 * cuda_mirror.h, plus larger shapes that span many tiles of the kernels. The CPU-only check
 * that bad split values write nothing is not run (CUDA clamps, flags, and its outputs are
 * unspecified); the flag itself is checked (MOEX_ERR_BAD_SPLITS from the mirror's
 * moex_context_check_splits). Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define TQ_GPU 1
#define tu_cpu_context() cm_context()
#define moex_group_quantize(c, a, w, b, s) gpu_group_quantize((c), (a))
#define moex_group_dequantize(c, a, w, b, s) gpu_group_dequantize((c), (a))
#define main cpu_suite_main
#include "../test_quantize.c"
#undef main

int main(void) {
    cpu_suite_main();   /* prints its own tally; failures are counted below too */
    const double t0 = now_s();
    ctx = cm_context();
    tu_rng r = tu_rng_seed(16161);
    big_cases(&r, 7, 1500, 520);    /* many 128-row tiles, rows of 520 (not a multiple of 128) */
    big_cases(&r, 33, 2100, 96);    /* many groups, short rows */
    big_cases(&r, 2, 300, 4100);    /* long rows */
    printf("GPU large cases: %.2f s\n", now_s() - t0);
    moex_context_destroy(ctx);
    return tu_finish();
}
