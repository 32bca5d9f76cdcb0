/* The experimental FP8 header included alone compiles as C11 with -pedantic -Werror: it
 * includes moex.h, so the stable API comes with it. */
#include "moex_fp8.h"

#include <stdio.h>

int main(void) {
    unsigned char data[4];
    float scale = 1.0f;
    moex_quant_tensor qt = {.data = moex_tensor_2d(data, MOEX_DTYPE_E4M3, 2, 2),
                            .scales = moex_tensor_1d(&scale, MOEX_DTYPE_F32, 1)};
    moex_grouped_linear_fp8_args a = {0};
    a.x_params.recipe = MOEX_QUANT_TENSOR;
    a.x = qt;
    size_t bytes = 0;
    if (moex_grouped_linear_fp8_forward_workspace_size(NULL, &a, &bytes) != MOEX_ERR_INVALID_ARG) return 1;
    moex_fp8_recipe r = {.mode = MOEX_FP8_CURRENT, .dtypes = MOEX_FP8_HYBRID, .pow2_scales = 0, .amax_epsilon = 0.0f};
    moex_grouped_mlp_args m = {0};
    m.fp8 = r;
    if (m.fp8.dtypes != MOEX_FP8_HYBRID || moex_version() != MOEX_VERSION_NUMBER) return 1;
    printf("moex %s: moex_fp8.h alone OK as C11\n", moex_version_string());
    return 0;
}
