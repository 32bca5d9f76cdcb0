/*
 * ref_dtype.c - the reference's dtype helpers and tolerance model (see ref.h): rounding
 * fp64 values to bf16 / f16 / f32 in fp64 arithmetic (written independently of the
 * library's src/core/moex_half.h), buffer fill and read-back, unit roundoffs.
 */
#include "ref.h"

#include <math.h>
#include <string.h>

/* Rounds v to a binary format with `p` significand bits (hidden bit included), smallest
 * normal exponent emin and largest exponent emax, ties to even. */
static double round_format(double v, int p, int emin, int emax) {
    if (v != v || v == 0.0 || isinf(v)) return v;
    int ex;
    frexp(v, &ex);                 /* |v| = m 2^ex, m in [0.5, 1): exponent ex - 1 */
    int e = ex - 1;
    if (e < emin) e = emin;        /* subnormals share the smallest normal's spacing */
    double q = ldexp(1.0, e - (p - 1));
    double r = nearbyint(v / q) * q; /* v / q is exact; nearbyint rounds ties to even */
    double max = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
    if (fabs(r) > max) return v > 0 ? INFINITY : -INFINITY;
    return r;
}

static double round_bf16(double v) { return round_format(v, 8, -126, 127); }
static double round_f16(double v) { return round_format(v, 11, -14, 15); }

uint16_t ref_double_to_bf16(double v) {
    if (v != v) return 0x7fc0;
    float f = (float)round_bf16(v); /* exact: a bf16 value is a float with 16 low zero bits */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

double ref_bf16_to_double(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

uint16_t ref_double_to_f16(double v) {
    if (v != v) return 0x7e00;
    double r = round_f16(v);
    uint16_t sign = signbit(r) ? 0x8000 : 0;
    double a = fabs(r);
    if (isinf(a)) return sign | 0x7c00;
    if (a == 0.0) return sign;
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)(a / ldexp(1.0, -24)));
    int ex;
    frexp(a, &ex);
    int e = ex - 1;                                     /* a = 1.m * 2^e */
    uint16_t man = (uint16_t)((a / ldexp(1.0, e) - 1.0) * 1024.0);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | man);
}

double ref_f16_to_double(uint16_t h) {
    double sign = (h & 0x8000) ? -1.0 : 1.0;
    int e = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (e == 0x1f) return man ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexp((double)man, -24);
    return sign * ldexp(1.0 + man / 1024.0, e - 15);
}

double ref_round(moex_dtype dt, double v) {
    switch (dt) {
    case MOEX_DTYPE_F32: return (double)(float)v;
    case MOEX_DTYPE_BF16: return round_bf16(v);
    case MOEX_DTYPE_F16: return round_f16(v);
    default: return v;
    }
}

void ref_round_array(moex_dtype dt, double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] = ref_round(dt, v[i]);
}

double ref_unit_roundoff(moex_dtype dt) {
    switch (dt) {
    case MOEX_DTYPE_F32: return ldexp(1.0, -24);
    case MOEX_DTYPE_BF16: return ldexp(1.0, -8);
    case MOEX_DTYPE_F16: return ldexp(1.0, -11);
    default: return 0.0;
    }
}

void ref_store(moex_dtype dt, void *buf, int64_t i, double v) {
    switch (dt) {
    case MOEX_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case MOEX_DTYPE_BF16: ((uint16_t *)buf)[i] = ref_double_to_bf16(v); break;
    case MOEX_DTYPE_F16: ((uint16_t *)buf)[i] = ref_double_to_f16(v); break;
    case MOEX_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MOEX_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;   /* FP8 and E8M0: ref_quant.h */
    }
}

double ref_load(moex_dtype dt, const void *buf, int64_t i) {
    switch (dt) {
    case MOEX_DTYPE_F32: return (double)((const float *)buf)[i];
    case MOEX_DTYPE_BF16: return ref_bf16_to_double(((const uint16_t *)buf)[i]);
    case MOEX_DTYPE_F16: return ref_f16_to_double(((const uint16_t *)buf)[i]);
    case MOEX_DTYPE_I32: return (double)((const int32_t *)buf)[i];
    case MOEX_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    default: break;   /* FP8 and E8M0: ref_quant.h */
    }
    return NAN;
}

void ref_fill(moex_dtype dt, void *buf, const double *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) ref_store(dt, buf, i, src[i]);
}

void ref_read(moex_dtype dt, const void *buf, double *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ref_load(dt, buf, i);
}

/* ---- tolerance model ----------------------------------------------------------------- */

ref_tol_model ref_tol_for(moex_dtype out, moex_dtype mid, int mid_rounded, int64_t k) {
    ref_tol_model m;
    m.u_out = ref_unit_roundoff(out);
    m.u_mid = mid_rounded ? ref_unit_roundoff(mid) : 0.0;
    m.u_acc = ldexp(1.0, -24);
    m.k = (double)(k > 1 ? k : 1);
    m.c = REF_TOL_C;
    switch (out) {
    case MOEX_DTYPE_BF16: m.floor = ldexp(1.0, -133); break;
    case MOEX_DTYPE_F16: m.floor = ldexp(1.0, -24); break;
    default: m.floor = ldexp(1.0, -149); break;
    }
    return m;
}

double ref_tol(const ref_tol_model *m, double ref, double bound) {
    return m->c * (m->u_out * fabs(ref) + (m->u_mid + m->k * m->u_acc) * bound) + m->floor;
}
