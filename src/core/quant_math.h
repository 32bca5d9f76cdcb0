/*
 * quant_math.h - private: the element math of FP8 quantization (docs/ops.md section 9),
 * shared by every implementation (the CPU backend and the CUDA kernels: the functions are
 * __host__ __device__ under nvcc), so that all of them compute the same bits.
 *
 *   moex_fp8_encode     f32 -> E4M3 / E5M2 byte: round to nearest even, NaN -> 0x7F,
 *                       saturation to +-max (Inf included), the sign of zero kept
 *   moex_fp8_decode     the byte's value (exact in f32)
 *   moex_amax_combine   the running amax of current and block scaling (NaN propagates)
 *   moex_quant_scale    the scale rule: s = fp8_max / max(amax, eps), the quantization
 *                       multiplier (the stored dequantization scale is 1 / s)
 *   moex_mx_exponent    the OCP MX shared exponent E of a block (scale byte E + 127)
 *   moex_pow2f          2^e exactly (the MX multiplier 2^-E)
 *   moex_e8m0_value     the value of an E8M0 scale byte
 *   moex_mx_swizzled_at where scale (r, c) of a plain [R, C] scale matrix is in the
 *                       128x4-tiled layout (docs/ops.md 9.8)
 *   moex_mx_expert_scale_at  the same for per-expert (weight) scale matrices, plain or not
 */
#ifndef MOEX_QUANT_MATH_H
#define MOEX_QUANT_MATH_H

#include "moex.h"
#include "moex_half.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MOEX_QUANT_FN static __host__ __device__ __forceinline__
#else
#define MOEX_QUANT_FN static inline
#endif

/* One FP8 format: mantissa bits, exponent bias, the largest finite value and its code,
 * and emax (the exponent of the largest binade, for the MX rule). */
typedef struct moex_fp8_format {
    int mbits, bias, emax;
    float max;
    uint8_t max_code;
} moex_fp8_format;

MOEX_QUANT_FN moex_fp8_format moex_fp8_format_of(moex_dtype fp8) {
    moex_fp8_format f;
    if (fp8 == MOEX_DTYPE_E5M2) {
        f.mbits = 2, f.bias = 15, f.emax = 15, f.max = 57344.0f, f.max_code = 0x7B;
    } else {   /* MOEX_DTYPE_E4M3 */
        f.mbits = 3, f.bias = 7, f.emax = 8, f.max = 448.0f, f.max_code = 0x7E;
    }
    return f;
}

MOEX_QUANT_FN uint8_t moex_fp8_encode(float v, moex_fp8_format f) {
    if (isnan(v)) return 0x7F;
    const uint8_t sign = signbit(v) ? 0x80 : 0x00;
    const float a = fabsf(v);
    if (a >= f.max) return (uint8_t)(sign | f.max_code);
    const int emin = 1 - f.bias;                /* the smallest normal exponent */
    int e;
    frexpf(a, &e);                              /* a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1 */
    int qexp = (a == 0.0f || e - 1 < emin) ? emin : e - 1;
    /* n = a rounded to the grid of spacing 2^(qexp - mbits): the division is exact */
    const float n = rintf(ldexpf(a, f.mbits - qexp));   /* in units of that spacing */
    if (n == 0.0f) return sign;
    /* n in [1, 2^(mbits+1)]: n == 2^(mbits+1) carried into the next binade */
    int code;
    if (n >= (float)(2 << f.mbits)) {
        qexp += 1;
        code = ((qexp + f.bias) << f.mbits);
    } else if (n < (float)(1 << f.mbits)) {     /* subnormal (qexp == emin) */
        code = (int)n;
    } else {
        code = ((qexp + f.bias) << f.mbits) | ((int)n - (1 << f.mbits));
    }
    return (uint8_t)(sign | code);   /* a < max: the carry never passes max_code */
}

MOEX_QUANT_FN float moex_fp8_decode(uint8_t q, moex_fp8_format f) {
    const int ebits = 7 - f.mbits;
    const int ef = (q >> f.mbits) & ((1 << ebits) - 1), mf = q & ((1 << f.mbits) - 1);
    float v;
    if (f.mbits == 3 ? (q & 0x7F) == 0x7F : ef == 31) {   /* E4M3: only S.1111.111; E5M2: all-ones exponent */
        if (f.mbits == 3 || mf != 0) return NAN;
        v = INFINITY;
    } else if (ef == 0) {
        v = ldexpf((float)mf, 1 - f.bias - f.mbits);
    } else {
        v = ldexpf((float)((1 << f.mbits) | mf), ef - f.bias - f.mbits);
    }
    return (q & 0x80) ? -v : v;
}

/* max(m, |x|) with NaN winning (m starts at 0). */
MOEX_QUANT_FN float moex_amax_combine(float m, float x) {
    const float a = fabsf(x);
    return (isnan(a) || a > m) ? a : m;
}

/* The quantization multiplier s of a set with this amax (docs/ops.md 9.2). */
MOEX_QUANT_FN float moex_quant_scale(float amax, float eps, float fp8_max, moex_scale_rounding rounding) {
    const float a = (isnan(amax) || amax > eps) ? amax : eps;
    if (isnan(a) || isinf(a) || a == 0.0f) return 1.0f;
    float s = fp8_max / a;
    if (isinf(s)) s = FLT_MAX;
    if (rounding == MOEX_SCALE_POW2) {
        int e;
        frexpf(s, &e);
        s = ldexpf(1.0f, e - 1);
    }
    return s;
}

/* 2^e exactly, for e in [-149, 127] (subnormal below -126). */
MOEX_QUANT_FN float moex_pow2f(int e) {
    return moex_bits_f32(e >= -126 ? (uint32_t)(e + 127) << 23 : 1u << (e + 149));
}

/* The value of an E8M0 scale byte: 2^(b - 127), 0xFF NaN. */
MOEX_QUANT_FN float moex_e8m0_value(uint8_t b) {
    return b == 0xFF ? moex_bits_f32(0x7FC00000u) : moex_pow2f((int)b - 127);
}

/* The MX shared exponent of a block whose largest non-NaN magnitude is amax (9.3):
 * floor(log2(amax)) - emax, clamped to [-127, 127], from the bits. */
MOEX_QUANT_FN int moex_mx_exponent(float amax, moex_fp8_format f) {
    if (!(amax > 0.0f)) return -127;            /* 0, or no non-NaN element */
    if (isinf(amax)) return 127;
    const uint32_t b = moex_f32_bits(amax);
    int l2 = (int)(b >> 23) - 127;              /* normal */
    if ((b >> 23) == 0)                         /* subnormal: b * 2^-149 */
        for (l2 = -149; l2 < -127 && (b >> (l2 + 150)) != 0; l2++) {}
    const int E = l2 - f.emax;
    return E < -127 ? -127 : E > 127 ? 127 : E;
}

/* max(m, |x|) over the non-NaN x (the MX amax). */
MOEX_QUANT_FN float moex_mx_amax_combine(float m, float x) {
    const float a = fabsf(x);
    return a > m ? a : m;   /* false for NaN */
}

/* The byte offset of scale (r, c) of a plain [R, C] E8M0 scale matrix in the 128x4-tiled
 * ("swizzled") layout of docs/ops.md 9.8; cols4 = roundup(C, 4). The matrix takes
 * roundup(R, 128) * cols4 bytes. */
MOEX_QUANT_FN int64_t moex_mx_swizzled_at(int64_t r, int64_t c, int64_t cols4) {
    return ((r >> 7) * (cols4 >> 2) + (c >> 2)) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (c & 3);
}

/* Where the E8M0 scale (r, c) of expert g's plain [R, C] scale matrix is, the G experts'
 * matrices one after the other: plain, [G*R, C] row-major; swizzled (9.8), each matrix
 * padded to [roundup(R, 128), roundup(C, 4)] in the 128x4-tiled layout. Weights: rowwise
 * R = N, C = ceil(K/32), (n, k/32); columnwise R = K, C = ceil(N/32), (k, n/32). */
MOEX_QUANT_FN int64_t moex_mx_expert_scale_at(int64_t R, int64_t C, int swizzled, int64_t g, int64_t r,
                                              int64_t c) {
    if (!swizzled) return (g * R + r) * C + c;
    const int64_t cols4 = 4 * ((C + 3) / 4);
    return g * 128 * ((R + 127) / 128) * cols4 + moex_mx_swizzled_at(r, c, cols4);
}

#endif /* MOEX_QUANT_MATH_H */
