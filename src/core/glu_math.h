/*
 * glu_math.h - private: the element math of the scaled GLU, in f32, shared by every
 * implementation (the CPU scaled GLU and grouped MLP, and the CUDA kernels: the functions
 * are __host__ __device__ under nvcc) so that all of them use the same formulas.
 *
 * One GLU element pairs a (the activated half) with b (the gate half) of a [2F] row:
 *   SWIGLU:          act(a) = a s(a),          g(b) = b,            s = sigmoid
 *   CLAMPED_SWIGLU:  a' = min(a, limit),       b' = clamp(b, -limit, limit) + offset,
 *                    act(a) = a' s(alpha a'),  g(b) = b'
 * Forward:  z = p * (act(a) g(b)).
 * Backward: da = (dz p) g(b) act'(a),  db = (dz p) act(a) g'(b),  dprobs term = dz (act(a) g(b)),
 * with act'(a) = s + alpha a' s (1 - s) (alpha = 1 for SWIGLU) and, for CLAMPED_SWIGLU,
 * act'(a) = 0 where a >= limit and g'(b) = 0 where |b| >= limit: 0 at the bounds themselves, as
 * torch.clamp gives it (GPT-OSS's definition is PyTorch's; in bf16 h often lands exactly on a
 * bound such as 7.0). NaN inputs stay NaN.
 *
 * Layout of the halves in a row, as segments: a row holds F / L segments of 2L columns,
 * segment k has a in columns [2Lk, 2Lk + L) and b in [2Lk + L, 2Lk + 2L), and its outputs
 * are z columns [Lk, Lk + L). CONTIGUOUS is one segment (L = F), INTERLEAVED_32 has L = 32.
 */
#ifndef MOEX_GLU_MATH_H
#define MOEX_GLU_MATH_H

#include "moex.h"

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MOEX_GLU_FN static __host__ __device__ __forceinline__
#else
#define MOEX_GLU_FN static inline
#endif

/* The constants of one GLU, resolved from moex_glu_params: SWIGLU is the clamped form with
 * no clamp (clamped = 0), alpha 1 and offset 0. */
typedef struct moex_glu_consts {
    int clamped;
    float limit, alpha, offset;
} moex_glu_consts;

MOEX_GLU_FN moex_glu_consts moex_glu_consts_of(const moex_glu_params *p) {
    moex_glu_consts c;
    c.clamped = p->kind == MOEX_GLU_CLAMPED_SWIGLU;
    c.limit = c.clamped ? p->limit : 0.0f;
    c.alpha = c.clamped ? p->alpha : 1.0f;
    c.offset = c.clamped ? p->offset : 0.0f;
    return c;
}

/* L, the length of one half-segment of a row (see the top of this file). */
MOEX_GLU_FN int64_t moex_glu_segment(moex_glu_layout layout, int64_t F) {
    return layout == MOEX_GLU_INTERLEAVED_32 ? 32 : F;
}

/* On the GPU with the hardware exp2 and reciprocal (a few ulp of f32, far below the bf16/f16
 * rounding of every output; inf and NaN behave as below): the GLU's epilogues are bound by
 * this math. */
MOEX_GLU_FN float moex_glu_sigmoid(float x) {
#if defined(__CUDA_ARCH__)
    return __fdividef(1.0f, 1.0f + __expf(-x));
#else
    return 1.0f / (1.0f + expf(-x));
#endif
}

/* a' and b' (the identity for SWIGLU); written so that NaN passes through. */
MOEX_GLU_FN float moex_glu_clamp_a(moex_glu_consts c, float a) {
    return (c.clamped && a > c.limit) ? c.limit : a;
}
MOEX_GLU_FN float moex_glu_clamp_b(moex_glu_consts c, float b) {
    if (!c.clamped) return b;
    float bc = b > c.limit ? c.limit : (b < -c.limit ? -c.limit : b);
    return bc + c.offset;
}

/* act(a) g(b): the forward value before the probability. */
MOEX_GLU_FN float moex_glu_value(moex_glu_consts c, float a, float b) {
    float ac = moex_glu_clamp_a(c, a);
    float act = ac * moex_glu_sigmoid(c.alpha * ac);
    return act * moex_glu_clamp_b(c, b);
}

/* z = p * act(a) g(b). */
MOEX_GLU_FN float moex_glu_forward(moex_glu_consts c, float a, float b, float p) {
    return p * moex_glu_value(c, a, b);
}

/* The backward of one element: da and db of z = p act(a) g(b) given dz, and the element's
 * dprobs term dz * act(a) g(b). */
MOEX_GLU_FN void moex_glu_backward(moex_glu_consts c, float a, float b, float p, float dz,
                                   float *da, float *db, float *dp_term) {
    float ac = moex_glu_clamp_a(c, a);
    float s = moex_glu_sigmoid(c.alpha * ac);
    float act = ac * s;
    float g = moex_glu_clamp_b(c, b);
    float dact = s * (1.0f + c.alpha * ac * (1.0f - s));
    float dg = 1.0f;
    if (c.clamped) {
        if (a >= c.limit) dact = 0.0f;
        if (b >= c.limit || b <= -c.limit) dg = 0.0f;
    }
    float dzp = dz * p;
    *da = dzp * g * dact;
    *db = dzp * act * dg;
    *dp_term = dz * (act * g);
}

#endif /* MOEX_GLU_MATH_H */
