// The public header compiles as C++ and links from C++.
#include "moex.h"

#include <cstdio>

int main() {
    float buf[6];
    moex_tensor t = moex_tensor_2d(buf, MOEX_DTYPE_F32, 2, 3);
    if (t.ndim != 2 || moex_version() != MOEX_VERSION_NUMBER) return 1;
    std::printf("moex %s: header OK as C++\n", moex_version_string());
    return 0;
}
