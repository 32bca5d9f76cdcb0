/*
 * moex_half.h - private: bf16 and f16 <-> f32 conversion on the host, round to nearest even.
 * Storage is uint16_t; NaN stays NaN, infinities and subnormals are exact where representable.
 */
#ifndef MOEX_HALF_H
#define MOEX_HALF_H

#include <stdint.h>
#include <string.h>

/* The bits of an f32, and the f32 of given bits (also in CUDA device code: quant_math.h). */
#if defined(__CUDACC__)
#define MOEX_BITS_FN static __host__ __device__ __forceinline__
#else
#define MOEX_BITS_FN static inline
#endif

MOEX_BITS_FN uint32_t moex_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

MOEX_BITS_FN float moex_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float moex_bf16_to_f32(uint16_t h) { return moex_bits_f32((uint32_t)h << 16); }

static inline uint16_t moex_f32_to_bf16(float f) {
    uint32_t u = moex_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float moex_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    return moex_bits_f32(u);
}

static inline uint16_t moex_f32_to_f16(float f) {
    const uint32_t u = moex_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);            /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);           /* rounds to inf */
    if (a < 0x38800000u) {                                             /* f16 subnormal or 0 */
        if (a < 0x33000000u) return (uint16_t)sign;                    /* < half the smallest */
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);                              /* 14 + (113 - exp) */
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u;                                      /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

#endif /* MOEX_HALF_H */
