/*
 * test_quant.h - what the FP8 quantization tests share (tests/test_quantize.c,
 * tests/test_weight_quantize.c, tests/test_fp8_weight_copies.c, tests/test_ep.c, and through
 * them their GPU mirrors): names, bit views, dtype limits, the tie and subnormal values the
 * input flavours draw from, the epsilons, a weight's kept FP8 copies.
 */
#ifndef MOEX_TEST_QUANT_H
#define MOEX_TEST_QUANT_H

#include "ref_quant.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline const char *recipe_name(moex_quant_recipe r) {
    switch (r) {
    case MOEX_QUANT_TENSOR: return "TENSOR";
    case MOEX_QUANT_GROUP: return "GROUP";
    case MOEX_QUANT_BLOCK: return "BLOCK";
    case MOEX_QUANT_MXFP8: return "MXFP8";
    }
    return "?";
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t bits_of_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The largest finite value of an input dtype. */
static inline double dt_max(moex_dtype dt) {
    if (dt == MOEX_DTYPE_BF16) return ldexp(2.0 - ldexp(1.0, -7), 127);
    if (dt == MOEX_DTYPE_F16) return 65504.0;
    return FLT_MAX;
}

static inline double dt_subnormal(tu_rng *r, moex_dtype dt) {
    const int lo = dt == MOEX_DTYPE_F32 ? -149 : dt == MOEX_DTYPE_BF16 ? -133 : -24;
    const int hi = dt == MOEX_DTYPE_F16 ? -14 : -126;
    return ref_round(dt, ldexp(tu_uniform(r), (int)(lo + tu_randint(r, hi - lo + 1))) + ldexp(1.0, lo));
}

/* y values equal: same NaN-ness, and for numbers the same value and sign. */
static inline int same_value(double a, double b) {
    if (a != a || b != b) return (a != a) && (b != b);
    return a == b && signbit(a) == signbit(b);
}

static inline double scale_value(moex_dtype sdt, const void *s, int64_t i) {
    return sdt == MOEX_DTYPE_E8M0 ? ref_e8m0_decode(((const uint8_t *)s)[i]) : (double)((const float *)s)[i];
}

/* The values the tie flavour draws from (positive): every finite value of the format, every
 * midpoint of two neighbours, quarter points (no tie), and values past max (the midpoint of
 * max and the next step, the next step, far beyond). */
static inline int tie_values(moex_dtype fmt, double *v) {
    int n = 0;
    double prev = -1;
    for (int c = 0; c < 128; c++) {
        double q = ref_fp8_decode(fmt, (uint8_t)c);
        if (!isfinite(q)) break;
        if (prev >= 0) {
            v[n++] = 0.5 * (prev + q);
            v[n++] = prev + 0.25 * (q - prev);
            v[n++] = prev + 0.75 * (q - prev);
        }
        v[n++] = q;
        prev = q;
    }
    const double mx = ref_fp8_max(fmt), step = fmt == MOEX_DTYPE_E4M3 ? 32 : 8192;
    v[n++] = mx + 0.5 * step;
    v[n++] = mx + 0.25 * step;
    v[n++] = mx + step;
    v[n++] = 4 * mx;
    return n;
}

static inline float pick_eps(tu_rng *r) {
    static const float e[4] = {0.3f, 0.125f, 1e-30f, 3e4f};
    return e[tu_randint(r, 4)];
}

/* A weight's FP8 copies as a caller keeps them (moex_fp8_recipe.weights): both orientations of
 * the packed weight w [G, N, K] in one buffer laid out by moex_fp8_weight_layout (checked: the
 * size query and the layout agree), quantized by moex_weight_quantize on ctx (a GPU mirror's
 * where the including file redefines it) with moex_fp8_weight_params(r). *buf: the buffer, to
 * free. */
static inline moex_fp8_weight tq_kept_copies(moex_context *ctx, const moex_fp8_recipe *r, const moex_weight *w,
                                             void **buf) {
    moex_fp8_weight kw;
    memset(&kw, 0, sizeof kw);
    size_t bytes = 0, again = 0;
    CHECK_STATUS(ctx, moex_fp8_weight_layout(ctx, r, w, NULL, NULL, &bytes), MOEX_OK);
    *buf = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    CHECK_STATUS(ctx, moex_fp8_weight_layout(ctx, r, w, *buf, &kw, &again), MOEX_OK);
    CHECK(again == bytes && kw.rowwise.data.ndim == 3 && kw.columnwise.data.shape[1] == w->t.shape[2]);
    moex_weight_quantize_args a;
    memset(&a, 0, sizeof a);
    a.w = w->t, a.params = moex_fp8_weight_params(r), a.rowwise = kw.rowwise, a.columnwise = kw.columnwise;
    CHECK_STATUS(ctx, moex_weight_quantize_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_weight_quantize(ctx, &a, ws, bytes, NULL), MOEX_OK);
    free(ws);
    return kw;
}

#endif /* MOEX_TEST_QUANT_H */
