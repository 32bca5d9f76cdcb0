/* The public header compiles as C11 with -pedantic -Werror, and its inline helpers work. */
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
    printf("moex %s: header OK as C11\n", moex_version_string());
    return 0;
}
