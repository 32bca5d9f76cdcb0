/*
 * test_gpu_permute.c - the CUDA permute and unpermute (forward, backward) against the fp64
 * reference: the cases of the CPU test tests/test_permute.c (distinct and repeated ids,
 * skipped and single experts, k = E, E = 1, T = 0, with and without probs, every dtype)
 * plus larger ones that span several 2048-entry chunks of the device counting sort, run
 * on the GPU through cuda_mirror.h. The CPU-specific bad-id checks (which require that
 * nothing is written) and thread-count checks are not run; test_gpu_bad_splits.c checks
 * the GPU's flag for bad ids. Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_permute_forward(c, a, w, b, s) gpu_permute_forward((c), (a))
#define moex_permute_backward(c, a, w, b, s) gpu_permute_backward((c), (a))
#define moex_unpermute_forward(c, a, w, b, s) gpu_unpermute_forward((c), (a))
#define moex_unpermute_backward(c, a, w, b, s) gpu_unpermute_backward((c), (a))
#define main cpu_suite_main
#include "../test_permute.c"
#undef main

int main(void) {
    ctx = cm_context();
    tu_rng r = tu_rng_seed(77);
    const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    const perm_case shapes[] = {
        {37, 24, 2, 8, 0, IDS_DISTINCT, 1},   {23, 7, 1, 5, 0, IDS_DISTINCT, 1},
        {19, 5, 4, 4, 0, IDS_DISTINCT, 1},    {31, 9, 3, 6, 0, IDS_REPEATS, 1},
        {29, 13, 2, 9, 0, IDS_SKIP_SOME, 1},  {17, 6, 1, 7, 0, IDS_ONE_EXPERT, 1},
        {11, 3, 2, 1, 0, IDS_REPEATS, 0},     {1, 1, 1, 3, 0, IDS_DISTINCT, 1},
        {0, 8, 2, 4, 0, IDS_DISTINCT, 1},     {200, 65, 3, 16, 0, IDS_SKIP_SOME, 0},
        {1500, 40, 4, 128, 0, IDS_DISTINCT, 1}, {3000, 17, 2, 33, 0, IDS_REPEATS, 1},
        {2100, 8, 1, 7, 0, IDS_ONE_EXPERT, 1},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 3; d++) {
            perm_case c = shapes[s];
            c.dt = dts[d];
            test_case(&r, &c);
        }
    moex_context_destroy(ctx);
    return tu_finish();
}
