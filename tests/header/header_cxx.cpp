// The public headers compile as C++ and link from C++: moex.h (with the experimental
// moex_fp8.h and moex_ep.h it includes), here included after moex_ep.h.
#include "moex_ep.h"
#include "moex.h"

#include <cstdio>

int main() {
    float buf[6];
    moex_tensor t = moex_tensor_2d(buf, MOEX_DTYPE_F32, 2, 3);
    if (t.ndim != 2 || moex_version() != MOEX_VERSION_NUMBER) return 1;
    moex_group_quantize_args q = {};
    size_t bytes = 0;
    if (moex_group_quantize_workspace_size(nullptr, &q, &bytes) != MOEX_ERR_INVALID_ARG) return 1;
    if (moex_ep_get_info(nullptr, nullptr) != MOEX_ERR_INVALID_ARG) return 1;
    std::printf("moex %s: header OK as C++\n", moex_version_string());
    return 0;
}
