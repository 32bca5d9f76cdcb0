/*
 * cpu_convert.h - private: moving f32/bf16/f16 data to and from f32 on the CPU.
 *
 * The CPU backend computes in f32. Inputs of any float dtype are loaded into f32 buffers
 * (whole rows, or a tile of a matrix), and f32 results are stored into the output dtype,
 * rounded once (to nearest even, see moex_half.h). These functions are single-threaded:
 * call them from inside a moex_cpu_parallel_for chunk, one row range per chunk.
 * Every `ld` is the distance, in elements, between consecutive rows of a matrix.
 */
#ifndef MOEX_CPU_CONVERT_H
#define MOEX_CPU_CONVERT_H

#include "moex_half.h"
#include "moex_impl.h"

/* The address of element i of an array of dtype dt starting at base. i == 0 gives base
 * untouched: an empty tensor's data may be NULL, and NULL + 0 is undefined behaviour. */
static inline void *moex_cpu_at(void *base, moex_dtype dt, int64_t i) {
    return i == 0 ? base : (char *)base + (size_t)i * moex_dtype_size(dt);
}
static inline const void *moex_cpu_cat(const void *base, moex_dtype dt, int64_t i) {
    return i == 0 ? base : (const char *)base + (size_t)i * moex_dtype_size(dt);
}

/* Element i of an array of dtype dt, as f32; and its store, rounded once. */
static inline float moex_cpu_load1(const void *base, moex_dtype dt, int64_t i) {
    switch (dt) {
    case MOEX_DTYPE_BF16: return moex_bf16_to_f32(((const uint16_t *)base)[i]);
    case MOEX_DTYPE_F16: return moex_f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}
static inline void moex_cpu_store1(void *base, moex_dtype dt, int64_t i, float v) {
    switch (dt) {
    case MOEX_DTYPE_BF16: ((uint16_t *)base)[i] = moex_f32_to_bf16(v); break;
    case MOEX_DTYPE_F16: ((uint16_t *)base)[i] = moex_f32_to_f16(v); break;
    default: ((float *)base)[i] = v; break;
    }
}

/* dst[j] = f32(src[j]) for j < n. */
void moex_cpu_load_f32(float *dst, const void *src, moex_dtype dt, int64_t n);

/* dst[j] = dt(src[j]) for j < n, rounded once. */
void moex_cpu_store_f32(void *dst, moex_dtype dt, const float *src, int64_t n);

/* A tile of `rows` x `cols`: dst[r * ldd + c] = f32(src[r * lds + c]).
 * src points at the tile's first element (row r0, column c0 of the source matrix). */
void moex_cpu_load_tile_f32(float *dst, int64_t ldd, const void *src, moex_dtype dt, int64_t lds,
                            int64_t rows, int64_t cols);

/* A tile of `rows` x `cols`: dst[r * ldd + c] = dt(src[r * lds + c]), rounded once. */
void moex_cpu_store_tile_f32(void *dst, moex_dtype dt, int64_t ldd, const float *src, int64_t lds,
                             int64_t rows, int64_t cols);

#endif /* MOEX_CPU_CONVERT_H */
