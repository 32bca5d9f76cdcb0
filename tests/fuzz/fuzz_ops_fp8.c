/*
 * fuzz_ops_fp8.c - argument builders of the moex API fuzzer for the FP8 grouped linear
 * (experimental; docs/ops.md 9.10): moex_grouped_linear_fp8_forward and
 * moex_grouped_linear_fp8_backward_weight with their size queries.
 *
 * A valid argument set: a recipe family (current scaling: TENSOR or GROUP rows with GROUP
 * weights, or TENSOR / GROUP with TENSOR / GROUP for the two columnwise copies of the backward
 * weight; BLOCK with BLOCK; MXFP8 with MXFP8, each operand's scales plain or swizzled, ops.md
 * 9.8), E4M3 or E5M2 per operand, any rounding and epsilon (validated, unused by the call),
 * shapes around the 32 / 128 blocks with T = 0 and empty groups, sum(splits) < T, y f32 / bf16 /
 * f16, the three bias modes (bias f32 or y's dtype), dw WRITE (f32, bf16 or f16) or ACCUMULATE
 * (f32; packed or discrete). The FP8 operands are either arbitrary bytes (NaN and Inf codes, any scale values:
 * negative, NaN, E8M0 0xFF) or, one case in three, what moex_group_quantize and
 * moex_weight_quantize write for random f32 values (the quantize's status is checked too).
 *
 * Tails: rows >= S of x (forward), y, probs and of BLOCK / MXFP8 rowwise scales; columns >= S
 * of the backward weight's columnwise data, columns >= b_G of its block scales; for swizzled
 * scales the bytes past the last group's tiles (ops.md 9.8). Inputs are ASan-poisoned there on
 * the CPU (never read), outputs must not be written there.
 *
 * Faults (the generic ones are in fuzz_core.c; the list is in fuzz.h): an unknown recipe,
 * rounding or scale layout, fp8 not E4M3 / E5M2, a bad epsilon, MX_SWIZZLED with a recipe
 * other than MXFP8 (each on either operand's params), bad split values, unknown bias_mode /
 * dw_mode, a *swap* (first fault only: a valid recipe, FP8 format or scale layout that the
 * tensors built for the old one do not fit), and *pairing*: one operand rebuilt (params and
 * scales) for a recipe that fits its tensors but does not pair with the other operand (BLOCK
 * with GROUP, MXFP8 with BLOCK, TENSOR weights, ...).
 *
 * Oracles after an OK run without faults (run mode): "value" (every output the exact product
 * of the dequantized operands, ops.md 9.5 / 9.10, within f32 accumulation error; elements with
 * a non-finite or huge operand, bias or result skipped; dw WRITE of an empty group 0,
 * ACCUMULATE of an empty group unchanged) and "workspace" (fz_check_rerun: a second run with a
 * fresh workspace writes bitwise the same outputs; not for ACCUMULATE).
 */
#include "fuzz.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define E4M3 MOEX_DTYPE_E4M3
#define E5M2 MOEX_DTYPE_E5M2
#define E8M0 MOEX_DTYPE_E8M0
#define F16 MOEX_DTYPE_F16

FZ_OPFNS(f8f_fns, grouped_linear_fp8_forward, moex_grouped_linear_fp8_args);
FZ_OPFNS(f8w_fns, grouped_linear_fp8_backward_weight, moex_grouped_linear_fp8_wgrad_args);

/* An FP8 operand: a copy of grouped rows (rowwise data [T, C], or columnwise [C, T]) or of
 * grouped weights (data [G, T, C]: T = N rows of each W_g, C = K), with its params. */
typedef enum { OPD_ROWS, OPD_COLS, OPD_WEIGHT } opd_kind;

typedef struct opd {
    const char *name;
    opd_kind kind;
    int64_t T, C;
    moex_quant_params *p;
    moex_quant_tensor *q;
    int td, ts;               /* the data and scales tensors                            */
} opd;

/* The case being built (the fault callbacks and the oracles need it). */
static struct {
    int wgrad;                /* the backward weight, else the forward                   */
    int64_t G, T, K, N, S;
    const int64_t *s;         /* split values (NULL in huge mode)                        */
    int real;                 /* operands from real quantize calls                       */
    opd a, b;                 /* forward: x, w; backward weight: dy, x                   */
} fc;

static const char *const recipe_names[4] = {"TENSOR", "GROUP", "BLOCK", "MXFP8"};
static const char *recipe_name(moex_quant_recipe r) { return (unsigned)r < 4u ? recipe_names[r] : "unknown"; }

static int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }
static int64_t add_sat(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }
static int64_t roundup(int64_t a, int64_t b) { return fz_mul_sat(cdiv(a, b), b); }
static bool is_current(moex_quant_recipe r) { return r == MOEX_QUANT_TENSOR || r == MOEX_QUANT_GROUP; }
static int64_t block_of(moex_quant_recipe r) {
    return r == MOEX_QUANT_BLOCK ? 128 : r == MOEX_QUANT_MXFP8 ? 32 : 0;
}
static bool swizzled(const moex_quant_params *p) { return p->scale_layout == MOEX_SCALES_MX_SWIZZLED; }

/* The scales of an operand (ops.md 9.4, 9.7, 9.8): ndim, shape, dtype (saturating). */
static int scales_shape(const moex_quant_params *p, opd_kind kind, int64_t G, int64_t T, int64_t C, int64_t sh[3],
                        moex_dtype *dt) {
    const int64_t B = block_of(p->recipe);
    *dt = p->recipe == MOEX_QUANT_MXFP8 ? E8M0 : F32;
    sh[1] = sh[2] = 0;
    if (swizzled(p)) {   /* one E8M0 vector: 128x4 tiles, each group / expert padded alone */
        const int64_t tiles = add_sat(cdiv(T, 128), G);
        if (kind == OPD_ROWS) sh[0] = fz_mul_sat(fz_mul_sat(tiles, 128), roundup(cdiv(C, 32), 4));
        else if (kind == OPD_COLS) sh[0] = fz_mul_sat(roundup(C, 128), fz_mul_sat(4, tiles));
        else sh[0] = fz_mul_sat(fz_mul_sat(G, roundup(T, 128)), roundup(cdiv(C, 32), 4));
        return 1;
    }
    if (!B) {
        sh[0] = p->recipe == MOEX_QUANT_GROUP ? G : 1;
        return 1;
    }
    if (kind == OPD_ROWS) {
        sh[0] = T, sh[1] = cdiv(C, B);
        return 2;
    }
    if (kind == OPD_COLS) {
        sh[0] = C, sh[1] = add_sat(cdiv(T, B), G);
        return 2;
    }
    sh[0] = G, sh[1] = p->recipe == MOEX_QUANT_BLOCK ? cdiv(T, 128) : T, sh[2] = cdiv(C, B);
    return 3;
}

static moex_tensor scales_tensor(const opd *o, const moex_quant_params *p) {
    int64_t sh[3];
    moex_dtype dt;
    moex_tensor t = {.dtype = F32};
    t.ndim = scales_shape(p, o->kind, fc.G, o->T, o->C, sh, &dt);
    t.dtype = dt;
    for (int i = 0; i < 3; i++) t.shape[i] = sh[i];
    return t;
}

/* q_g = sum over h < g of ceil(m_h / B) (g = G: all of them); -1 when the splits are unknown. */
static int64_t tiles_before(int64_t g, int64_t B) {
    if (!fc.s) return -1;
    int64_t b = 0;
    for (int64_t h = 0; h < g; h++) b = add_sat(b, cdiv(fc.s[h], B));
    return b;
}

/* Are the params valid on their own for this operand (ops.md 9.6, 9.7)? */
static bool params_ok(const moex_quant_params *p, opd_kind kind) {
    if ((unsigned)p->recipe > 3u || (p->fp8 != E4M3 && p->fp8 != E5M2)) return false;
    if (p->rounding != MOEX_SCALE_EXACT && p->rounding != MOEX_SCALE_POW2) return false;
    if (!isfinite(p->amax_epsilon) || p->amax_epsilon < 0.0f) return false;
    if (p->scale_layout != MOEX_SCALES_PLAIN && p->scale_layout != MOEX_SCALES_MX_SWIZZLED) return false;
    if (swizzled(p) && p->recipe != MOEX_QUANT_MXFP8) return false;
    return !(kind == OPD_WEIGHT && p->recipe == MOEX_QUANT_TENSOR);
}

/* ops.md 9.10: BLOCK with BLOCK, MXFP8 with MXFP8, TENSOR or GROUP rows with GROUP weights
 * (backward weight: TENSOR or GROUP with TENSOR or GROUP). */
static bool pairs(moex_quant_recipe a, moex_quant_recipe b, bool b_weight) {
    if (is_current(a)) return b_weight ? b == MOEX_QUANT_GROUP : is_current(b);
    return (a == MOEX_QUANT_BLOCK || a == MOEX_QUANT_MXFP8) && a == b;
}

static bool same_shape(const moex_tensor *t, moex_dtype dt, int nd, const int64_t *sh) {
    if (t->ndim != nd || t->dtype != dt) return false;
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != sh[i]) return false;
    return true;
}

/* Does the (untouched) operand fit its params? */
static bool opd_fits(const opd *o) {
    if (!params_ok(o->p, o->kind)) return false;
    int64_t dsh[3], ssh[3];
    int dnd = 2;
    if (o->kind == OPD_ROWS) dsh[0] = o->T, dsh[1] = o->C;
    else if (o->kind == OPD_COLS) dsh[0] = o->C, dsh[1] = o->T;
    else dnd = 3, dsh[0] = fc.G, dsh[1] = o->T, dsh[2] = o->C;
    moex_dtype sdt;
    const int snd = scales_shape(o->p, o->kind, fc.G, o->T, o->C, ssh, &sdt);
    return same_shape(&o->q->data, o->p->fp8, dnd, dsh) && same_shape(&o->q->scales, sdt, snd, ssh);
}

static bool args_fit(void) {
    return opd_fits(&fc.a) && opd_fits(&fc.b) && pairs(fc.a.p->recipe, fc.b.p->recipe, fc.b.kind == OPD_WEIGHT);
}

/* ---- building -------------------------------------------------------------------------- */

/* A dimension: run mode one around the blocks (16, 31, 32, 33, 127, 128, 129, ...) or
 * lo..40 (rarely up to 300); huge mode anything >= lo. */
static int64_t fp8_dim(fz_case *c, int64_t lo) {
    if (c->huge) return fz_dim(c, lo, 0, 0);
    const uint8_t b = fz_u8(c);
    static const int64_t v[12] = {0, 1, 16, 31, 32, 33, 127, 128, 129, 160, 256, 257};
    if (b < 64) return v[b % 12] < lo ? lo : v[b % 12];
    return fz_dim(c, lo, 40, 300);
}

/* G, T, K, N of a case. Run mode keeps the work of a case (T K N products, G N K weight
 * elements, all of it under ASan) at most 2^21: past it the largest dimension becomes 0..31
 * (T) or 1..32 (K, N) and G 1..6, so that large dimensions come one or two at a time. */
static void fp8_dims(fz_case *c) {
    fc.G = fz_dim(c, 1, 6, 40);
    fc.T = fp8_dim(c, 0);
    fc.K = fp8_dim(c, 1);
    fc.N = fp8_dim(c, 1);
    if (c->huge) return;
    const int64_t cap = (int64_t)1 << 21;
    while (fc.T * fc.K * fc.N > cap) {
        if (fc.T >= fc.K && fc.T >= fc.N) fc.T %= 32;
        else if (fc.K >= fc.N) fc.K = 1 + fc.K % 32;
        else fc.N = 1 + fc.N % 32;
    }
    if (fc.G * fc.N * fc.K > cap) fc.G = 1 + fc.G % 6;
}

/* Valid params of one operand, of the recipe given. */
static moex_quant_params fp8_params(fz_case *c, moex_quant_recipe r) {
    const uint8_t b = fz_u8(c);
    static const float eps[8] = {0.0f, 0.0f, -0.0f, 1e-12f, 1.0f, 1e30f, FLT_MAX, 1e-45f};
    moex_quant_params q;
    memset(&q, 0, sizeof q);
    q.recipe = r;
    q.fp8 = b & 1 ? E5M2 : E4M3;
    q.rounding = (moex_scale_rounding)((b >> 1) & 1);
    q.amax_epsilon = eps[(b >> 2) % 8];
    if (r == MOEX_QUANT_MXFP8 && (b & 0x20)) q.scale_layout = MOEX_SCALES_MX_SWIZZLED;
    return q;
}

/* The recipes of the two operands: a valid pairing. */
static void fp8_recipes(fz_case *c, moex_quant_recipe *ra, moex_quant_recipe *rb, bool b_weight) {
    const uint8_t b = fz_u8(c);
    switch (b % 3) {
    case 0:
        *ra = (b >> 2) & 1 ? MOEX_QUANT_GROUP : MOEX_QUANT_TENSOR;
        *rb = b_weight || ((b >> 3) & 1) ? MOEX_QUANT_GROUP : MOEX_QUANT_TENSOR;
        break;
    case 1: *ra = *rb = MOEX_QUANT_BLOCK; break;
    default: *ra = *rb = MOEX_QUANT_MXFP8; break;
    }
}

/* The split tensor (G tied to the weights or dw: never free); returns S. */
static int64_t fp8_splits(fz_case *c, moex_tensor *t) {
    int64_t *s = fz_i64s(c, fc.G);
    const int64_t S = fz_make_splits(c, s, fc.G, fc.T);
    *t = moex_tensor_1d(NULL, I64, fc.G);
    fz_set_i64(c, fz_tensor_reg(c, "splits", t, FZ_IN, FZ_REQUIRED, DT(I64)), s, fc.G);
    fc.s = s;
    fc.S = S;
    return S;
}

/* Registers an operand's data and scales (inputs), with their tails. */
static void opd_reg(fz_case *c, opd *o, const char *dname, const char *sname) {
    const moex_quant_params *p = o->p;
    if (o->kind == OPD_ROWS) o->q->data = moex_tensor_2d(NULL, p->fp8, o->T, o->C);
    else if (o->kind == OPD_COLS) o->q->data = moex_tensor_2d(NULL, p->fp8, o->C, o->T);
    else o->q->data = moex_tensor_3d(NULL, p->fp8, fc.G, o->T, o->C);
    o->td = fz_tensor_reg(c, dname, &o->q->data, FZ_IN, FZ_REQUIRED, DT(p->fp8));
    if (o->kind == OPD_ROWS) fz_tail(c, o->td, fc.S);
    if (o->kind == OPD_COLS) fz_tail_cols(c, o->td, fc.S);
    o->q->scales = scales_tensor(o, p);
    o->ts = fz_tensor_reg(c, sname, &o->q->scales, FZ_IN, FZ_REQUIRED, DT(o->q->scales.dtype));
    const int64_t B = block_of(p->recipe);
    if (o->kind == OPD_WEIGHT || !B) return;
    if (swizzled(p)) {   /* the bytes past the last group's tiles */
        const int64_t qG = tiles_before(fc.G, 128);
        if (qG < 0) return;
        fz_tail(c, o->ts, o->kind == OPD_ROWS ? fz_mul_sat(fz_mul_sat(qG, 128), roundup(cdiv(o->C, 32), 4))
                                              : fz_mul_sat(fz_mul_sat(qG, 4), roundup(o->C, 128)));
    } else if (o->kind == OPD_ROWS) {
        fz_tail(c, o->ts, fc.S);
    } else {
        const int64_t bG = tiles_before(fc.G, B);
        if (bG >= 0) fz_tail_cols(c, o->ts, bG);
    }
}

static void note_opd(fz_case *c, const opd *o) {
    fz_note(c, " %s: %s %s %s eps %g%s", o->name, recipe_name(o->p->recipe), moex_dtype_name(o->p->fp8),
            o->p->rounding == MOEX_SCALE_POW2 ? "POW2" : "EXACT", (double)o->p->amax_epsilon,
            swizzled(o->p) ? " swizzled" : "");
}

/* ---- real operands: what the quantize calls write --------------------------------------- */

static float rand_value(fz_case *c) {
    const uint64_t r = fz_rand(c);
    if (c->specials && (r & 63) == 0) {
        static const float sp[6] = {NAN, INFINITY, -INFINITY, 0.0f, 1e-40f, 3e38f};
        return sp[(r >> 8) % 6];
    }
    const float v = (float)((double)((r >> 11) & 0xFFFFFF) / 16777216.0 * 4.0 - 2.0);
    return ldexpf(v, (int)((r >> 40) % 16) - 8);   /* magnitudes 2^-8 .. 2^8 */
}

/* Quantizes random f32 values into the operand's (materialized) data and scales: the
 * operand's own recipe, format and layout; false when the backend does not support it. */
static bool quantize_into(fz_case *c, const opd *o, const moex_tensor *splits) {
    const int64_t n = o->kind == OPD_WEIGHT ? fc.G * o->T * o->C : o->T * o->C;
    float *h = (float *)fz_alloc(c, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = rand_value(c);
    void *src = fz_mem_alloc(c->cuda, (size_t)n * sizeof(float) + 1);
    if (!src) fz_fail(c, "harness", "out of memory");
    fz_mem_put(c->cuda, src, h, (size_t)n * sizeof(float));
    moex_quant_tensor none;
    memset(&none, 0, sizeof none);
    moex_group_quantize_args ga;
    moex_weight_quantize_args wa;
    memset(&ga, 0, sizeof ga);
    memset(&wa, 0, sizeof wa);
    size_t need = 0;
    moex_status st;
    const char *fn;
    if (o->kind == OPD_WEIGHT) {
        fn = "moex_weight_quantize";
        wa.w = moex_tensor_3d(src, F32, fc.G, o->T, o->C);
        wa.params = *o->p;
        wa.rowwise = *o->q;
        wa.columnwise = none;
        st = moex_weight_quantize_workspace_size(fz_g.ctx, &wa, &need);
    } else {
        fn = "moex_group_quantize";
        ga.x = moex_tensor_2d(src, F32, o->T, o->C);
        ga.splits = *splits;
        ga.params = *o->p;
        ga.rowwise = o->kind == OPD_ROWS ? *o->q : none;
        ga.columnwise = o->kind == OPD_COLS ? *o->q : none;
        st = moex_group_quantize_workspace_size(fz_g.ctx, &ga, &need);
    }
    void *ws = NULL;
    if (st == MOEX_OK && need) {
        ws = fz_mem_alloc(c->cuda, need);
        if (!ws) fz_fail(c, "harness", "out of memory (%zu bytes)", need);
    }
    if (st == MOEX_OK)
        st = o->kind == OPD_WEIGHT ? moex_weight_quantize(fz_g.ctx, &wa, ws, need, NULL)
                                   : moex_group_quantize(fz_g.ctx, &ga, ws, need, NULL);
    if (st == MOEX_OK && moex_context_check_splits(fz_g.ctx, NULL) != MOEX_OK) st = MOEX_ERR_INTERNAL;
    fz_mem_free(c->cuda, ws);
    fz_mem_free(c->cuda, src);
    if (st != MOEX_OK && st != MOEX_ERR_UNSUPPORTED)
        fz_fail(c, "quantize", "%s of the valid operand %s (%s %s) failed: %s (\"%s\")", fn, o->name,
                recipe_name(o->p->recipe), swizzled(o->p) ? "swizzled" : "plain", moex_status_string(st),
                moex_last_error(fz_g.ctx));
    return st == MOEX_OK;
}

/* ---- faults ------------------------------------------------------------------------------ */

/* A fault of one operand's params (kind % 6): unknown recipe, rounding or scale layout,
 * params.fp8 not an FP8 format, a bad epsilon, MX_SWIZZLED with a recipe other than MXFP8. */
static bool params_fault(fz_case *c, const opd *o, unsigned kind, uint64_t p) {
    moex_quant_params *q = o->p;
    switch (kind % 6) {
    case 0:
        q->recipe = (moex_quant_recipe)fz_bad_enum(c, p, 4);
        fz_fault(c, FZ_STRUCT, "enum: %s_params.recipe = %d", o->name, (int)q->recipe);
        return true;
    case 1:
        q->rounding = (moex_scale_rounding)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: %s_params.rounding = %d", o->name, (int)q->rounding);
        return true;
    case 2:
        q->scale_layout = (moex_scale_layout)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: %s_params.scale_layout = %d", o->name, (int)q->scale_layout);
        return true;
    case 3: {
        static const int32_t v[10] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16, MOEX_DTYPE_I32, MOEX_DTYPE_I64,
                                      MOEX_DTYPE_E8M0, MOEX_DTYPE_E8M0 + 1, -1, 99, INT32_MIN};
        const moex_dtype old = q->fp8;
        q->fp8 = (moex_dtype)v[p % 10];
        fz_fault(c, FZ_STRUCT, "fp8: %s_params.fp8 %s -> %d (not E4M3 / E5M2)", o->name, moex_dtype_name(old),
                 (int)q->fp8);
        return true;
    }
    case 4: {
        static const float v[8] = {-1.0f, -1e-30f, -1e-45f, -FLT_MAX, NAN, -NAN, INFINITY, -INFINITY};
        q->amax_epsilon = v[p % 8];
        fz_fault(c, FZ_STRUCT, "epsilon: %s_params.amax_epsilon = %g", o->name, (double)q->amax_epsilon);
        return true;
    }
    default:
        if (q->recipe == MOEX_QUANT_MXFP8) return false;
        q->scale_layout = MOEX_SCALES_MX_SWIZZLED;
        fz_fault(c, FZ_STRUCT, "layout: %s_params.scale_layout MX_SWIZZLED with recipe %s", o->name,
                 recipe_name(q->recipe));
        return true;
    }
}

/* A swap (the first fault only): a valid recipe, FP8 format or scale layout of one operand
 * that the tensors built for the old one do not fit (or that no longer pairs); it freezes
 * every tensor, so that no later fault can make them fit again. */
static bool swap_fault(fz_case *c, const opd *o, uint64_t p) {
    if (c->nfaults) return false;
    moex_quant_params *q = o->p;
    const moex_quant_params old = *q;
    char what[96];
    switch (p % 3) {
    case 0:
        q->recipe = (moex_quant_recipe)((old.recipe + 1 + (int)((p >> 8) % 3)) % 4);
        if (q->recipe != MOEX_QUANT_MXFP8) q->scale_layout = MOEX_SCALES_PLAIN;
        snprintf(what, sizeof what, "%s_params.recipe %s -> %s", o->name, recipe_name(old.recipe),
                 recipe_name(q->recipe));
        break;
    case 1:
        q->fp8 = old.fp8 == E4M3 ? E5M2 : E4M3;
        snprintf(what, sizeof what, "%s_params.fp8 %s -> %s", o->name, moex_dtype_name(old.fp8),
                 moex_dtype_name(q->fp8));
        break;
    default:
        if (old.recipe != MOEX_QUANT_MXFP8) return false;
        q->scale_layout = swizzled(&old) ? MOEX_SCALES_PLAIN : MOEX_SCALES_MX_SWIZZLED;
        snprintf(what, sizeof what, "%s_params.scale_layout %s -> %s", o->name, swizzled(&old) ? "swizzled" : "plain",
                 swizzled(q) ? "swizzled" : "plain");
        break;
    }
    if (args_fit()) {   /* e.g. TENSOR -> GROUP with G = 1 */
        *q = old;
        return false;
    }
    for (int i = 0; i < c->ntens; i++) c->tens[i].touched = 1;
    c->used_dtype = c->used_mismatch = 1;
    fz_fault(c, FZ_STRUCT, "swap: %s, which the tensors do not fit", what);
    return true;
}

/* Pairing: operand o gets a recipe of another family (or TENSOR weights), its scales rebuilt
 * to fit it, so that each operand fits its params but the two do not pair. */
static bool pairing_fault(fz_case *c, const opd *o, const opd *other, uint64_t p) {
    fz_tensor *S = &c->tens[o->ts];
    if (S->touched) return false;
    moex_quant_recipe cand[4];
    int n = 0;
    for (int r = 0; r < 4; r++) {
        moex_quant_params t = *o->p;
        t.recipe = (moex_quant_recipe)r;
        if (t.recipe != MOEX_QUANT_MXFP8) t.scale_layout = MOEX_SCALES_PLAIN;
        const bool ok = o == &fc.b ? pairs(other->p->recipe, t.recipe, o->kind == OPD_WEIGHT)
                                   : pairs(t.recipe, other->p->recipe, other->kind == OPD_WEIGHT);
        if (!ok && (params_ok(&t, o->kind) || (o->kind == OPD_WEIGHT && r == MOEX_QUANT_TENSOR))) cand[n++] = t.recipe;
    }
    if (!n) return false;
    const moex_quant_recipe old = o->p->recipe;
    o->p->recipe = cand[p % (uint64_t)n];
    if (o->p->recipe != MOEX_QUANT_MXFP8) o->p->scale_layout = MOEX_SCALES_PLAIN;
    o->q->scales = scales_tensor(o, o->p);
    S->dtypes_ok = DT(o->q->scales.dtype);
    S->tail_row = S->tail_col = -1;
    S->touched = 1;
    c->fault_ti = o->ts;
    fz_fault(c, FZ_STRUCT, "pairing: %s_params.recipe %s -> %s (scales rebuilt) with %s_params.recipe %s", o->name,
             recipe_name(old), recipe_name(o->p->recipe), other->name, recipe_name(other->p->recipe));
    return true;
}

/* The family's faults (kind % 7): params of either operand (kind / 7 picks the operand, then
 * the params fault), swap, pairing, split values, and the op's enum (bias_mode / dw_mode). */
static bool fp8_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    const opd *o = (kind / 7) & 1 ? &fc.b : &fc.a, *other = o == &fc.a ? &fc.b : &fc.a;
    switch (kind % 7) {
    case 0:
    case 1: return params_fault(c, o, kind / 14 + kind % 7, p);
    case 2: return swap_fault(c, o, p);
    case 3: return pairing_fault(c, o, other, p);
    case 4:
    case 5: return fz_fault_split_values(c, fz_find(c, "splits"), fc.T, p);
    default:
        if (fc.wgrad) {
            moex_grouped_linear_fp8_wgrad_args *a = (moex_grouped_linear_fp8_wgrad_args *)args;
            a->dw_mode = (moex_grad_mode)fz_bad_enum(c, p, 2);
            fz_fault(c, FZ_STRUCT, "enum: dw_mode = %d", (int)a->dw_mode);
        } else {
            moex_grouped_linear_fp8_args *a = (moex_grouped_linear_fp8_args *)args;
            a->bias_mode = (moex_bias_mode)fz_bad_enum(c, p, 3);
            fz_fault(c, FZ_STRUCT, "enum: bias_mode = %d", (int)a->bias_mode);
        }
        return true;
    }
}

/* ---- the value oracle ---------------------------------------------------------------------- */

/* The bytes of tensor ti after the last call; before it (snap) with before = true. */
static const unsigned char *bytes_of_tensor(fz_case *c, int ti, bool before) {
    const fz_tensor *T = &c->tens[ti];
    if (T->buf < 0) return NULL;
    const fz_buf *b = &c->bufs[T->buf];
    return (before ? b->snap : b->now) + b->lead + T->at;
}

/* OCP FP8 (ops.md 9.1): E4M3 0x7F / 0xFF NaN, no Inf; E5M2 IEEE-like. */
static float fp8_value(uint8_t b, moex_dtype f) {
    float v;
    if (f == E4M3) {
        const int e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7) return NAN;
        v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    } else {
        const int e = (b >> 2) & 31, m = b & 3;
        if (e == 31) v = m ? NAN : INFINITY;
        else v = e ? ldexpf((float)(4 + m), e - 17) : ldexpf((float)m, -16);
    }
    return (b & 0x80) ? -v : v;
}

/* Scale (r, c) of a 128x4-tiled matrix whose padded column count is Cp (ops.md 9.8). */
static int64_t swz(int64_t r, int64_t col, int64_t Cp) {
    return ((r / 128) * (Cp / 4) + col / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + col % 4;
}

/* The dequantized operand as f32 (ops.md 9.5: float(q) * scale, the product in f32), as a
 * [T, C] (rows) or [G, T, C] (weights) host array; rows >= S of grouped copies are left 0. */
static float *dequantized(fz_case *c, const opd *o) {
    const moex_quant_params *p = o->p;
    const int64_t G = fc.G, T = o->T, C = o->C, B = block_of(p->recipe);
    const int64_t rows = o->kind == OPD_WEIGHT ? G * T : T;
    float *v = (float *)fz_alloc(c, (size_t)(rows * C) * sizeof(float) + 1);
    const unsigned char *d = bytes_of_tensor(c, o->td, false), *s = bytes_of_tensor(c, o->ts, false);
    const bool e8 = p->recipe == MOEX_QUANT_MXFP8;
    int64_t off = 0;
    for (int64_t g = 0; g < G; g++) {
        const int64_t m = o->kind == OPD_WEIGHT ? T : fc.s[g];
        const int64_t qg = tiles_before(g, 128), bg = B ? tiles_before(g, B) : 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t k = 0; k < C; k++) {
                const int64_t t = off + i;   /* the row of v */
                int64_t di, si;
                if (o->kind == OPD_ROWS) di = t * C + k;
                else if (o->kind == OPD_COLS) di = k * T + t;
                else di = (g * T + i) * C + k;
                if (p->recipe == MOEX_QUANT_TENSOR) {
                    si = 0;
                } else if (p->recipe == MOEX_QUANT_GROUP) {
                    si = g;
                } else if (swizzled(p)) {
                    if (o->kind == OPD_ROWS) {
                        const int64_t Cp = roundup(cdiv(C, 32), 4);
                        si = qg * 128 * Cp + swz(i, k / 32, Cp);
                    } else if (o->kind == OPD_COLS) {
                        si = qg * 4 * roundup(C, 128) + swz(k, i / 32, roundup(cdiv(m, 32), 4));
                    } else {
                        const int64_t Cp = roundup(cdiv(C, 32), 4);
                        si = g * roundup(T, 128) * Cp + swz(i, k / 32, Cp);
                    }
                } else if (o->kind == OPD_ROWS) {
                    si = t * cdiv(C, B) + k / B;
                } else if (o->kind == OPD_COLS) {
                    si = k * (cdiv(T, B) + G) + bg + i / B;
                } else if (p->recipe == MOEX_QUANT_BLOCK) {
                    si = (g * cdiv(T, 128) + i / 128) * cdiv(C, 128) + k / 128;
                } else {
                    si = (g * T + i) * cdiv(C, 32) + k / 32;
                }
                float scale;
                if (e8) scale = s[si] == 0xFF ? NAN : ldexpf(1.0f, (int)s[si] - 127);
                else memcpy(&scale, s + 4 * si, 4);
                v[t * C + k] = fp8_value(d[di], p->fp8) * scale;
            }
        off += m;
    }
    return v;
}

typedef struct term_sum {
    double sum, mag;          /* the exact sum of the terms, and of their magnitudes   */
    bool skip;                /* a non-finite or huge term                             */
} term_sum;

static void add_term(term_sum *z, float a, float b) {
    const double t = (double)a * (double)b;
    if (!isfinite(a) || !isfinite(b) || fabs(t) > 1e30) z->skip = true;
    z->sum += t;
    z->mag += fabs(t);
}

/* The tolerance of an f32 sum of n products of f32 operands (ops.md 9.10: each operand is its
 * dequantized value rounded to f32), before the output's rounding. */
static double tolerance(fz_case *c, const term_sum *z, int64_t n) {
    double tol = z->mag * (double)(n + 2) * 0x1p-23 + (double)(n + 1) * 0x1p-140;
    if (c->cuda) tol += z->mag * 0x1p-11;   /* the FP8 tensor cores' accumulation (ops.md 9.10) */
    return tol;
}

static void check_forward(fz_case *c, const moex_grouped_linear_fp8_args *a) {
    if (!fc.s || a->y.ndim != 2) return;
    const float *xv = dequantized(c, &fc.a), *wv = dequantized(c, &fc.b);
    const int64_t K = fc.K, N = fc.N;
    const unsigned char *y = bytes_of_tensor(c, fz_find(c, "y"), false);
    const int tb = fz_find(c, "bias"), tp = fz_find(c, "probs");
    const unsigned char *bias = a->bias_mode != MOEX_BIAS_NONE ? bytes_of_tensor(c, tb, false) : NULL;
    const unsigned char *probs = a->bias_mode == MOEX_BIAS_SCALED ? bytes_of_tensor(c, tp, false) : NULL;
    int64_t t = 0;
    for (int64_t g = 0; g < fc.G; g++)
        for (int64_t i = 0; i < fc.s[g]; i++, t++)
            for (int64_t n = 0; n < N; n++) {
                term_sum z = {0, 0, false};
                for (int64_t k = 0; k < K; k++) add_term(&z, xv[t * K + k], wv[(g * N + n) * K + k]);
                if (bias) {
                    const float b = fz_load_float(bias, a->bias.dtype, g * N + n);
                    add_term(&z, probs ? fz_load_float(probs, F32, t) : 1.0f, b);
                }
                if (z.skip) continue;
                double tol = tolerance(c, &z, K);
                const double want = z.sum, aw = fabs(want) + tol;
                if (a->y.dtype == BF16) tol += aw * 0x1p-8 + 0x1p-133;
                if (a->y.dtype == F16) {
                    if (aw > 65000.0) continue;   /* may round to Inf */
                    tol += aw * 0x1p-11 + 0x1p-25;
                }
                const float got = fz_load_float(y, a->y.dtype, t * N + n);
                if (!(fabs((double)got - want) <= tol))
                    fz_fail(c, "value", "y[%lld, %lld] = %a, want %a within %g (group %lld: sum over k of x[t, k] "
                            "w[g, n, k] dequantized%s, ops.md 9.10)", (long long)t, (long long)n, (double)got, want,
                            tol, (long long)g, bias ? " plus the bias" : "");
            }
}

static void check_wgrad(fz_case *c, const moex_grouped_linear_fp8_wgrad_args *a) {
    if (!fc.s) return;
    const float *dyv = dequantized(c, &fc.a), *xv = dequantized(c, &fc.b);
    const int64_t K = fc.K, N = fc.N;
    const fz_tensor *D = &c->tens[fz_find(c, "dw")];
    const bool acc = a->dw_mode == MOEX_GRAD_ACCUMULATE;
    const moex_dtype dt = a->dw.t.dtype;
    const int64_t es = dt == F32 ? 4 : 2;
    int64_t off = 0;
    for (int64_t g = 0; g < fc.G; g++) {
        const int64_t m = fc.s[g];
        const unsigned char *now, *old;
        if (D->discrete) {
            if (D->mat_buf[g] < 0) return;
            const fz_buf *b = &c->bufs[D->mat_buf[g]];
            now = b->now + b->lead, old = b->snap + b->lead;
        } else {
            now = bytes_of_tensor(c, fz_find(c, "dw"), false), old = bytes_of_tensor(c, fz_find(c, "dw"), true);
            now += es * g * N * K, old += es * g * N * K;
        }
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                const float got = fz_load_float(now, dt, n * K + k);
                const float prev = acc ? fz_load_float(old, F32, n * K + k) : 0.0f;
                if (m == 0) {
                    if (acc ? !(got == prev || (isnan(got) && isnan(prev))) : got != 0.0f)
                        fz_fail(c, "value", "dw[%lld, %lld, %lld] = %a of an empty group, want %a (%s)", (long long)g,
                                (long long)n, (long long)k, (double)got, acc ? (double)prev : 0.0,
                                acc ? "ACCUMULATE: unchanged" : "WRITE: 0");
                    continue;
                }
                term_sum z = {0, 0, false};
                for (int64_t i = 0; i < m; i++) add_term(&z, dyv[(off + i) * N + n], xv[(off + i) * K + k]);
                add_term(&z, prev, 1.0f);
                if (z.skip) continue;
                double tol = tolerance(c, &z, m);
                const double aw = fabs(z.sum) + tol;   /* a 16-bit dW: the f32 sum rounded once */
                if (dt == BF16) tol += aw * 0x1p-8 + 0x1p-133;
                if (dt == F16) {
                    if (aw > 65000.0) continue;   /* may round to Inf */
                    tol += aw * 0x1p-11 + 0x1p-25;
                }
                if (!(fabs((double)got - z.sum) <= tol))
                    fz_fail(c, "value", "dw[%lld, %lld, %lld] = %a, want %a within %g (%s the sum over the group's "
                            "%lld rows of dy[t, n] x[t, k] dequantized, ops.md 9.10)", (long long)g, (long long)n,
                            (long long)k, (double)got, z.sum, tol, acc ? "the old value plus" : "", (long long)m);
            }
        off += m;
    }
}

/* ---- the flow --------------------------------------------------------------------------- */

/* fz_flow with the operands quantized for real (one case in three) before the valid query,
 * then the value and workspace oracles after a valid OK run. */
static void fp8_flow(fz_case *c, const fz_opfns *f, void *args, const moex_tensor *splits, bool rerun) {
    fz_materialize(c);
    if (fc.real && !c->huge) {
        const bool qa = quantize_into(c, &fc.a, splits), qb = quantize_into(c, &fc.b, splits);
        fz_note(c, " [operands quantized: %s %d, %s %d]", fc.a.name, qa, fc.b.name, qb);
    }
    if (c->legal_alias && !c->huge) fz_legal_alias(c);
    size_t need = 0;
    const moex_status st = fz_query(c, f->qname, f->query, args, &need);
    if (st != MOEX_OK && !c->huge) return;   /* UNSUPPORTED (anything else failed above) */
    c->ws_need = st == MOEX_OK ? need : 0;
    fz_faults(c, fp8_fault, args);
    if (c->nfaults) {
        size_t n2 = 0;
        fz_query(c, f->qname, f->query, args, &n2);
    }
    if (c->huge && !fz_must_fail(c)) return;   /* huge shapes cannot be backed by memory */
    fz_workspace(c);
    if (fz_run(c, f->rname, f->run, args) != MOEX_OK || c->nfaults || c->huge) return;
    if (!c->alias.active) {
        if (fc.wgrad) check_wgrad(c, (const moex_grouped_linear_fp8_wgrad_args *)args);
        else check_forward(c, (const moex_grouped_linear_fp8_args *)args);
    }
    if (rerun) fz_check_rerun(c, f, args);
}

/* ---- the builders ------------------------------------------------------------------------- */

void fz_op_fp8_fwd(fz_case *c) {
    moex_grouped_linear_fp8_args *a = (moex_grouped_linear_fp8_args *)fz_alloc(c, sizeof *a);
    memset(&fc, 0, sizeof fc);
    fp8_dims(c);
    const moex_dtype dt = fz_act_dtype(c), bdt = fz_chance(c, 128) ? F32 : dt;
    moex_quant_recipe rx, rw;
    fp8_recipes(c, &rx, &rw, true);
    a->x_params = fp8_params(c, rx);
    a->w_params = fp8_params(c, rw);
    a->bias_mode = (moex_bias_mode)fz_pick(c, 3);
    fc.real = fz_pick(c, 3) == 0;
    const int64_t S = fp8_splits(c, &a->splits);
    fc.a = (opd){.name = "x", .kind = OPD_ROWS, .T = fc.T, .C = fc.K, .p = &a->x_params, .q = &a->x, .td = -1,
                 .ts = -1};
    fc.b = (opd){.name = "w", .kind = OPD_WEIGHT, .T = fc.N, .C = fc.K, .p = &a->w_params, .q = &a->w, .td = -1,
                 .ts = -1};
    opd_reg(c, &fc.a, "x.data", "x.scales");
    opd_reg(c, &fc.b, "w.data", "w.scales");
    a->y = moex_tensor_2d(NULL, dt, fc.T, fc.N);
    fz_tail(c, fz_tensor_reg(c, "y", &a->y, FZ_OUT, FZ_REQUIRED, DT(F32) | DT(BF16) | DT(F16)), S);
    a->bias = moex_tensor_2d(NULL, bdt, fc.G, fc.N);
    fz_tensor_reg(c, "bias", &a->bias, FZ_IN, a->bias_mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : FZ_REQUIRED,
                  DT(dt) | DT(F32));
    /* probs [T] f32, SCALED only (moex.h): given with NONE or ADD it must be refused, as the
     * plain grouped linear refuses it (README, finding fp8-1) */
    a->probs = moex_tensor_1d(NULL, F32, fc.T);
    fz_tail(c, fz_tensor_reg(c, "probs", &a->probs, FZ_IN,
                             a->bias_mode == MOEX_BIAS_SCALED ? FZ_REQUIRED : FZ_FORBIDDEN, DT(F32)), S);
    fz_note(c, "G=%lld T=%lld K=%lld N=%lld S=%lld y %s bias_mode=%d bias %s%s", (long long)fc.G, (long long)fc.T,
            (long long)fc.K, (long long)fc.N, (long long)S, moex_dtype_name(dt), (int)a->bias_mode,
            moex_dtype_name(bdt), fc.real ? " quantized" : " random bytes");
    note_opd(c, &fc.a);
    note_opd(c, &fc.b);
    fp8_flow(c, &f8f_fns, a, &a->splits, true);
}

void fz_op_fp8_wgrad(fz_case *c) {
    moex_grouped_linear_fp8_wgrad_args *a = (moex_grouped_linear_fp8_wgrad_args *)fz_alloc(c, sizeof *a);
    memset(&fc, 0, sizeof fc);
    fc.wgrad = 1;
    fp8_dims(c);
    moex_quant_recipe rdy, rx;
    fp8_recipes(c, &rdy, &rx, false);
    a->dy_params = fp8_params(c, rdy);
    a->x_params = fp8_params(c, rx);
    a->dw_mode = (moex_grad_mode)fz_pick(c, 2);
    fc.real = fz_pick(c, 3) == 0;
    const int64_t S = fp8_splits(c, &a->splits);
    fc.a = (opd){.name = "dy", .kind = OPD_COLS, .T = fc.T, .C = fc.N, .p = &a->dy_params, .q = &a->dy, .td = -1,
                 .ts = -1};
    fc.b = (opd){.name = "x", .kind = OPD_COLS, .T = fc.T, .C = fc.K, .p = &a->x_params, .q = &a->x, .td = -1,
                 .ts = -1};
    opd_reg(c, &fc.a, "dy.data", "dy.scales");
    opd_reg(c, &fc.b, "x.data", "x.scales");
    const bool acc = a->dw_mode == MOEX_GRAD_ACCUMULATE;
    static const moex_dtype dw_dts[3] = {F32, BF16, F16};   /* WRITE: f32 or 16-bit; += into f32 only */
    a->dw = moex_weight_packed(moex_tensor_3d(NULL, acc ? F32 : dw_dts[fz_pick(c, 3)], fc.G, fc.N, fc.K));
    fz_weight_reg(c, "dw", &a->dw, acc ? FZ_ACC : FZ_OUT, FZ_REQUIRED | FZ_DISCRETE_OK,
                  acc ? DT(F32) : DT(F32) | DT(BF16) | DT(F16));
    fz_note(c, "G=%lld T=%lld K=%lld N=%lld S=%lld dw_mode=%d%s%s", (long long)fc.G, (long long)fc.T, (long long)fc.K,
            (long long)fc.N, (long long)S, (int)a->dw_mode, c->tens[fz_find(c, "dw")].discrete ? " discrete" : "",
            fc.real ? " quantized" : " random bytes");
    note_opd(c, &fc.a);
    note_opd(c, &fc.b);
    fp8_flow(c, &f8w_fns, a, &a->splits, !acc);
}
