/*
 * cpu_convert.c - f32/bf16/f16 <-> f32 rows and tiles (contracts in cpu_convert.h).
 * The loops are written so that the compiler can vectorise the bf16 and f32 cases.
 */
#include "cpu_convert.h"

#include "moex_half.h"

#include <string.h>

void moex_cpu_load_f32(float *dst, const void *src, moex_dtype dt, int64_t n) {
    if (dt == MOEX_DTYPE_F32) {
        memmove(dst, src, (size_t)n * sizeof(float));
    } else if (dt == MOEX_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t j = 0; j < n; j++) {
            uint32_t u = (uint32_t)s[j] << 16;
            memcpy(&dst[j], &u, sizeof u);
        }
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t j = 0; j < n; j++) dst[j] = moex_f16_to_f32(s[j]);
    }
}

void moex_cpu_store_f32(void *dst, moex_dtype dt, const float *src, int64_t n) {
    if (dt == MOEX_DTYPE_F32) {
        memmove(dst, src, (size_t)n * sizeof(float));
    } else if (dt == MOEX_DTYPE_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t j = 0; j < n; j++) d[j] = moex_f32_to_bf16(src[j]);
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t j = 0; j < n; j++) d[j] = moex_f32_to_f16(src[j]);
    }
}

void moex_cpu_load_tile_f32(float *dst, int64_t ldd, const void *src, moex_dtype dt, int64_t lds,
                            int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        moex_cpu_load_f32(dst + r * ldd, moex_cpu_cat(src, dt, r * lds), dt, cols);
}

void moex_cpu_store_tile_f32(void *dst, moex_dtype dt, int64_t ldd, const float *src, int64_t lds,
                             int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        moex_cpu_store_f32(moex_cpu_at(dst, dt, r * ldd), dt, src + r * lds, cols);
}
