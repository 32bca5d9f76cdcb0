/*
 * test_gpu_weight_quantize.c - the CUDA grouped weight quantization (moex_weight_quantize,
 * moex_weight_dequantize, docs/ops.md 9.7) against the reference of tools/ref/ref_quant.h,
 * bit for bit: the CPU test tests/test_weight_quantize.c (GROUP / BLOCK / MXFP8, both
 * formats, roundings, epsilons, orientations and weight dtypes; N and K off the 32 / 128
 * grid; G, N, K = 0; specials, ties, extreme amax; dequantize of both copies and of
 * arbitrary bytes; bad arguments) run on the GPU through cuda_mirror.h, plus larger weights
 * that span many blocks of the kernels. The overlap checks are not run (the mirror gives
 * every tensor its own device copy). Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define TWQ_GPU 1
#define tu_cpu_context() cm_context()
#define moex_weight_quantize(c, a, w, b, s) gpu_weight_quantize((c), (a))
#define moex_weight_dequantize(c, a, w, b, s) gpu_weight_dequantize((c), (a))
#define main cpu_suite_main
#include "../test_weight_quantize.c"
#undef main

int main(void) {
    cpu_suite_main();   /* prints its own tally; failures are counted below too */
    const double t0 = now_s();
    ctx = cm_context();
    tu_rng r = tu_rng_seed(16171);
    big_cases(&r, 2, 1030, 520);    /* many 128x128 blocks; N and K off the 128 grid */
    big_cases(&r, 33, 96, 160);     /* many experts */
    big_cases(&r, 1, 300, 4100);    /* long rows (rowwise MX blocks, BLOCK columns) */
    big_cases(&r, 1, 4100, 96);     /* long columns (columnwise MX blocks) */
    printf("GPU large cases: %.2f s\n", now_s() - t0);
    moex_context_destroy(ctx);
    return tu_finish();
}
