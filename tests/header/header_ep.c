/* The experimental expert-parallelism header included alone compiles as C11 with -pedantic
 * -Werror: it includes moex.h (the EP MoE layer's arguments are the MoE layer's). */
#include "moex_ep.h"

#include <stdio.h>

int main(void) {
    moex_ep_moe_layer_args a = {0};
    a.layer.topk = 2;
    a.layer.fp8.mode = MOEX_FP8_OFF;
    moex_ep_info info;
    size_t bytes = 0;
    if (moex_ep_get_info(NULL, &info) != MOEX_ERR_INVALID_ARG) return 1;
    if (moex_ep_moe_layer_saved_size(NULL, &a, &bytes) != MOEX_ERR_INVALID_ARG) return 1;
    printf("moex %s: moex_ep.h alone OK as C11\n", moex_version_string());
    return 0;
}
