/*
 * test_gpu_permute.c - the CUDA permute and unpermute (forward, backward) against the fp64
 * reference: the cases of the CPU test tests/test_permute.c (distinct and repeated ids,
 * skipped and single experts, k = E, E = 1, T = 0, with and without probs, every dtype)
 * plus larger ones that span several 2048-entry chunks of the device counting sort, and rows
 * longer than one pass of the copy kernels over 16-byte pieces (and rows that are not whole
 * pieces: their element-wise path), run on the GPU through cuda_mirror.h. The CPU-specific
 * bad-id checks (which require that nothing is written) and thread-count checks are not run;
 * test_gpu_bad_splits.c checks the GPU's flag for bad ids. Exits 77 (skipped) without a GPU.
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
        {.T = 37, .H = 24, .k = 2, .E = 8, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 23, .H = 7, .k = 1, .E = 5, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 19, .H = 5, .k = 4, .E = 4, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 31, .H = 9, .k = 3, .E = 6, .ids = IDS_REPEATS, .with_probs = 1},
        {.T = 29, .H = 13, .k = 2, .E = 9, .ids = IDS_SKIP_SOME, .with_probs = 1},
        {.T = 17, .H = 6, .k = 1, .E = 7, .ids = IDS_ONE_EXPERT, .with_probs = 1},
        {.T = 11, .H = 3, .k = 2, .E = 1, .ids = IDS_REPEATS},
        {.T = 1, .H = 1, .k = 1, .E = 3, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 0, .H = 8, .k = 2, .E = 4, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 200, .H = 65, .k = 3, .E = 16, .ids = IDS_SKIP_SOME},
        {.T = 1500, .H = 40, .k = 4, .E = 128, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 3000, .H = 17, .k = 2, .E = 33, .ids = IDS_REPEATS, .with_probs = 1},
        {.T = 2100, .H = 8, .k = 1, .E = 7, .ids = IDS_ONE_EXPERT, .with_probs = 1},
        /* rows longer than one pass of the copy kernels' threads over 16-byte pieces */
        {.T = 300, .H = 4104, .k = 3, .E = 16, .ids = IDS_SKIP_SOME, .with_probs = 1},
        {.T = 64, .H = 4100, .k = 6, .E = 9, .ids = IDS_REPEATS, .with_probs = 1},
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
