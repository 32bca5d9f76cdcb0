/* The public header compiles as C11 with -pedantic -Werror, and its inline helpers work.
 * moex.h alone declares the whole API, the experimental moex_fp8.h and moex_ep.h included:
 * a program written before they were split out (using FP8 and EP through moex.h) compiles
 * unchanged. */
#include "moex.h"

#include <stdio.h>

int main(void) {
    float buf[6];
    moex_tensor t = moex_tensor_2d(buf, MOEX_DTYPE_F32, 2, 3);
    moex_weight w = moex_weight_packed(moex_tensor_3d(buf, MOEX_DTYPE_F32, 1, 2, 3));
    if (t.ndim != 2 || t.shape[1] != 3 || w.ptrs != NULL || w.t.shape[0] != 1) return 1;
    if (moex_version() != MOEX_VERSION_NUMBER) {
        fprintf(stderr, "header %d, library %u\n", MOEX_VERSION_NUMBER, moex_version());
        return 1;
    }
    /* FP8 (moex_fp8.h) and EP (moex_ep.h) through moex.h: types, enums and functions */
    moex_grouped_linear_args gl = {0};
    gl.fp8.mode = MOEX_FP8_BLOCK;
    moex_group_quantize_args q = {0};
    q.params.recipe = MOEX_QUANT_BLOCK;
    q.params.fp8 = MOEX_DTYPE_E4M3;
    size_t bytes = 0;
    moex_ep_config cfg = {0};
    cfg.comm_kind = MOEX_EP_COMM_MPI;
    moex_ep *ep = NULL;
    if (gl.fp8.mode != MOEX_FP8_BLOCK || moex_group_quantize_workspace_size(NULL, &q, &bytes) != MOEX_ERR_INVALID_ARG ||
        moex_ep_create(&ep, NULL, &cfg) != MOEX_ERR_INVALID_ARG || ep != NULL) {
        fprintf(stderr, "the FP8 or EP entry points did not refuse a NULL context\n");
        return 1;
    }
    printf("moex %s: header OK as C11 (FP8 and EP declared through moex.h)\n", moex_version_string());
    return 0;
}
