/*
 * fuzz_ops_quant.c - argument builders of the moex API fuzzer for grouped quantization
 * (experimental; docs/ops.md section 9): moex_group_quantize and moex_group_dequantize with
 * their size queries. A valid argument set (recipe TENSOR, GROUP, BLOCK or MXFP8, E4M3 or
 * E5M2, rounding, epsilon, x / y dtype, shapes with T = 0, K = 0 and K, T off the 32 / 128
 * blocks, empty groups, sum(splits) < T, the rowwise and / or columnwise copy, amax and
 * dbias present or absent, the orientation of a dequantize), the operations' own faults
 * (the generic ones are in fuzz_core.c; the fault list is in fuzz.h), and four oracles of
 * this family after a valid run (fuzz.h, THE ORACLES): "amax" and "scale" (TENSOR, GROUP:
 * the exact f32 rule of ops.md 9.2), "dbias" (the column sums of each group's rows: 0 for an
 * empty group, else within an f32 sum's error) and "workspace" (a second run with a fresh
 * workspace of other bytes writes the same outputs, bit for bit).
 *
 * Tails: rows >= S of x, y, rowwise data and block scales; columns >= S of columnwise data
 * ([K, T]) and columns >= b_G of columnwise block scales (fz_tail_cols).
 */
#include "fuzz.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define E4M3 MOEX_DTYPE_E4M3
#define E5M2 MOEX_DTYPE_E5M2
#define E8M0 MOEX_DTYPE_E8M0

FZ_OPFNS(qz_fns, group_quantize, moex_group_quantize_args);
FZ_OPFNS(dq_fns, group_dequantize, moex_group_dequantize_args);

/* The case being built (the fault callbacks need it). */
static struct {
    int64_t G, T, K;
} qc;

static const char *const recipe_names[4] = {"TENSOR", "GROUP", "BLOCK", "MXFP8"};

static const char *recipe_name(moex_quant_recipe r) {
    return (unsigned)r < 4u ? recipe_names[r] : "unknown";
}

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }
static int64_t add_sat(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }
static int64_t block_of(moex_quant_recipe r) {
    return r == MOEX_QUANT_BLOCK ? 128 : r == MOEX_QUANT_MXFP8 ? 32 : 0;
}
static moex_dtype scale_dtype(moex_quant_recipe r) { return r == MOEX_QUANT_MXFP8 ? E8M0 : F32; }

/* The scales of one orientation (ops.md 9.4): ndim and shape. */
static int scales_shape(moex_quant_recipe r, moex_quant_orientation o, int64_t G, int64_t T, int64_t K,
                        int64_t sh[2]) {
    const int64_t B = block_of(r);
    if (!B) {
        sh[0] = r == MOEX_QUANT_GROUP ? G : 1;
        sh[1] = 0;
        return 1;
    }
    if (o == MOEX_QUANT_ROWWISE) {
        sh[0] = T;
        sh[1] = ceil_div(K, B);
    } else {
        sh[0] = K;
        sh[1] = add_sat(ceil_div(T, B), G);
    }
    return 2;
}

static moex_tensor scales_tensor(moex_quant_recipe r, moex_quant_orientation o, int64_t G, int64_t T, int64_t K) {
    int64_t sh[2];
    return scales_shape(r, o, G, T, K, sh) == 1 ? moex_tensor_1d(NULL, scale_dtype(r), sh[0])
                                                : moex_tensor_2d(NULL, scale_dtype(r), sh[0], sh[1]);
}

/* b_G = sum over g of ceil(m_g / B): the columnwise block scale columns written (-1: unknown). */
static int64_t tiles_written(const int64_t *s, int64_t G, int64_t B) {
    if (!s || !B) return -1;
    int64_t b = 0;
    for (int64_t g = 0; g < G; g++) b = add_sat(b, ceil_div(s[g], B));
    return b;
}

/* A dimension: run mode 0..40 (rarely up to 300) or one around the blocks (31, 32, 33, 127,
 * 128, 129, ...); huge mode anything. */
static int64_t quant_dim(fz_case *c) {
    if (c->huge) return fz_dim(c, 0, 0, 0);
    const uint8_t b = fz_u8(c);
    static const int64_t v[12] = {0, 1, 31, 32, 33, 127, 128, 129, 160, 255, 256, 257};
    if (b < 64) return v[b % 12];
    return fz_dim(c, 0, 40, 300);
}

static moex_quant_params quant_params(fz_case *c) {
    const uint8_t b = fz_u8(c), e = fz_u8(c);
    static const float eps[12] = {0.0f, 0.0f, 0.0f, -0.0f, 1e-12f, 1e-4f, 1.0f, 448.0f, 1e30f, FLT_MAX, 1e-45f,
                                  FLT_MIN};
    moex_quant_params q;
    memset(&q, 0, sizeof q);
    q.recipe = (moex_quant_recipe)(b % 4);
    q.fp8 = (b >> 2) & 1 ? E5M2 : E4M3;
    q.rounding = (moex_scale_rounding)((b >> 3) & 1);
    q.amax_epsilon = eps[e % 12];
    return q;
}

static bool is_shape(const moex_tensor *t, moex_dtype dt, int nd, int64_t d0, int64_t d1) {
    return t->ndim == nd && t->dtype == dt && t->shape[0] == d0 && (nd < 2 || t->shape[1] == d1);
}

/* One copy (data and scales) as params and orientation want it (absent: both absent). */
static bool copy_fits(const moex_quant_tensor *q, const moex_quant_params *p, moex_quant_orientation o, bool present) {
    if (!present) return q->data.ndim == 0 && q->scales.ndim == 0;
    const int64_t d0 = o == MOEX_QUANT_ROWWISE ? qc.T : qc.K, d1 = o == MOEX_QUANT_ROWWISE ? qc.K : qc.T;
    int64_t sh[2];
    const int nd = scales_shape(p->recipe, o, qc.G, qc.T, qc.K, sh);
    return is_shape(&q->data, p->fp8, 2, d0, d1) && is_shape(&q->scales, scale_dtype(p->recipe), nd, sh[0], sh[1]);
}

/* Do the (untouched) tensors fit the params (a valid recipe and fp8)? */
static bool quantize_fits(const moex_group_quantize_args *a) {
    const bool row = a->rowwise.data.ndim != 0, col = a->columnwise.data.ndim != 0;
    if (!copy_fits(&a->rowwise, &a->params, MOEX_QUANT_ROWWISE, row) ||
        !copy_fits(&a->columnwise, &a->params, MOEX_QUANT_COLUMNWISE, col))
        return false;
    if (a->dbias.ndim != 0 && !is_shape(&a->dbias, F32, 2, qc.G, qc.K)) return false;
    if (a->amax.ndim == 0) return true;
    if (block_of(a->params.recipe)) return false;
    return is_shape(&a->amax, F32, 1, a->params.recipe == MOEX_QUANT_GROUP ? qc.G : 1, 0);
}

static bool dequantize_fits(const moex_group_dequantize_args *a) {
    return copy_fits(&a->src, &a->params, a->orientation, true);
}

/* ---- faults -------------------------------------------------------------------------------- */

/* The faults shared by both operations: an unknown recipe or rounding, params.fp8 not an FP8
 * format, a bad epsilon, bad split values (kind % 5). */
static bool params_fault(fz_case *c, moex_quant_params *q, unsigned kind, uint64_t p) {
    switch (kind % 5) {
    case 0:
        q->recipe = (moex_quant_recipe)fz_bad_enum(c, p, 4);
        fz_fault(c, FZ_STRUCT, "enum: params.recipe = %d", (int)q->recipe);
        return true;
    case 1:
        q->rounding = (moex_scale_rounding)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: params.rounding = %d", (int)q->rounding);
        return true;
    case 2: {
        static const int32_t v[10] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16, MOEX_DTYPE_I32, MOEX_DTYPE_I64,
                                      MOEX_DTYPE_E8M0, MOEX_DTYPE_E8M0 + 1, -1, 99, INT32_MIN};
        const moex_dtype old = q->fp8;
        q->fp8 = (moex_dtype)v[p % 10];
        fz_fault(c, FZ_STRUCT, "fp8: params.fp8 %s -> %d (not E4M3 / E5M2)", moex_dtype_name(old), (int)q->fp8);
        return true;
    }
    case 3: {
        static const float v[8] = {-1.0f, -1e-30f, -1e-45f, -FLT_MAX, NAN, -NAN, INFINITY, -INFINITY};
        q->amax_epsilon = v[p % 8];
        fz_fault(c, FZ_STRUCT, "epsilon: params.amax_epsilon = %g", (double)q->amax_epsilon);
        return true;
    }
    default: return fz_fault_split_values(c, fz_find(c, "splits"), qc.T, p);
    }
}

/* A swap: a valid recipe, fp8 format or (dequantize) orientation other than the one the
 * tensors were built for, when they no longer fit it. The first fault only; it then freezes
 * every tensor (no later fault may make them fit again). */
static bool swap_fault(fz_case *c, moex_quant_params *q, moex_quant_orientation *orient, bool (*fits)(const void *),
                       const void *args, uint64_t p) {
    if (c->nfaults) return false;
    const moex_quant_params old = *q;
    const moex_quant_orientation oo = orient ? *orient : MOEX_QUANT_ROWWISE;
    char what[96];
    switch (p % (orient ? 3u : 2u)) {
    case 0:
        q->recipe = (moex_quant_recipe)((old.recipe + 1 + (int)((p >> 8) % 3)) % 4);
        snprintf(what, sizeof what, "params.recipe %s -> %s", recipe_name(old.recipe), recipe_name(q->recipe));
        break;
    case 1:
        q->fp8 = old.fp8 == E4M3 ? E5M2 : E4M3;
        snprintf(what, sizeof what, "params.fp8 %s -> %s", moex_dtype_name(old.fp8), moex_dtype_name(q->fp8));
        break;
    default:
        *orient = oo == MOEX_QUANT_ROWWISE ? MOEX_QUANT_COLUMNWISE : MOEX_QUANT_ROWWISE;
        snprintf(what, sizeof what, "orientation %d -> %d", (int)oo, (int)*orient);
        break;
    }
    if (fits(args)) {   /* e.g. TENSOR -> GROUP with G = 1, the orientation with T = K */
        *q = old;
        if (orient) *orient = oo;
        return false;
    }
    for (int i = 0; i < c->ntens; i++) c->tens[i].touched = 1;
    c->used_dtype = c->used_mismatch = 1;
    fz_fault(c, FZ_STRUCT, "swap: %s, which the tensors do not fit", what);
    return true;
}

static bool qz_fits(const void *a) { return quantize_fits((const moex_group_quantize_args *)a); }
static bool dq_fits(const void *a) { return dequantize_fits((const moex_group_dequantize_args *)a); }

static bool qz_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_group_quantize_args *a = (moex_group_quantize_args *)args;
    if (kind % 6 == 5) return swap_fault(c, &a->params, NULL, qz_fits, a, p);
    return params_fault(c, &a->params, kind % 6, p);
}

static bool dq_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_group_dequantize_args *a = (moex_group_dequantize_args *)args;
    switch (kind % 7) {
    case 5: return swap_fault(c, &a->params, &a->orientation, dq_fits, a, p);
    case 6:
        a->orientation = (moex_quant_orientation)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: orientation = %d", (int)a->orientation);
        return true;
    default: return params_fault(c, &a->params, kind % 7, p);
    }
}

/* ---- the oracles of a valid run ------------------------------------------------------------ */

/* The bytes of tensor ti after the last call (NULL when it has no buffer). */
static const unsigned char *after(fz_case *c, int ti) {
    const fz_tensor *T = &c->tens[ti];
    if (T->buf < 0) return NULL;
    return c->bufs[T->buf].now + c->bufs[T->buf].lead + T->at;
}

static float f16_to_f32(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 0x3FF;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

float fz_load_float(const unsigned char *p, moex_dtype dt, int64_t i) {
    if (dt == F32) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    if (dt == BF16) {
        const uint32_t u = (uint32_t)h << 16;
        float v;
        memcpy(&v, &u, 4);
        return v;
    }
    return f16_to_f32(h);
}

/* ops.md 9.2: the stored scale 1/s of a set with this amax. */
static float expected_scale(float amax, const moex_quant_params *q) {
    const float fmax = q->fp8 == E5M2 ? 57344.0f : 448.0f;
    const float a = isnan(amax) ? amax : amax > q->amax_epsilon ? amax : q->amax_epsilon;
    float s = 1.0f;
    if (!isnan(a) && !isinf(a) && a != 0.0f) {
        s = fmax / a;
        if (isinf(s)) s = FLT_MAX;
    }
    if (q->rounding == MOEX_SCALE_POW2) {
        int e;
        frexpf(s, &e);   /* s = m 2^e, m in [0.5, 1) */
        s = ldexpf(1.0f, e - 1);
    }
    return 1.0f / s;
}

static bool same_f32(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* TENSOR, GROUP: amax (present) and the scales of both copies, from x as the call saw it. */
static void check_current(fz_case *c, const moex_group_quantize_args *a, int tx, int ts, int tamax, int trs, int tcs) {
    const moex_quant_params *q = &a->params;
    if (block_of(q->recipe)) return;
    const int64_t *s = c->tens[ts].i64, K = qc.K;
    const unsigned char *x = after(c, tx);
    const int64_t sets = q->recipe == MOEX_QUANT_GROUP ? qc.G : 1;
    int64_t r0 = 0;
    for (int64_t g = 0; g < sets; g++) {
        int64_t r1 = r0;
        if (q->recipe == MOEX_QUANT_GROUP) r1 += s[g];
        else
            for (int64_t h = 0; h < qc.G; h++) r1 += s[h];
        float m = 0.0f;
        for (int64_t i = r0 * K; i < r1 * K && x; i++) {
            const float v = fz_load_float(x, a->x.dtype, i);
            if (isnan(m)) break;
            m = isnan(v) ? v : fabsf(v) > m ? fabsf(v) : m;
        }
        float got;
        if (tamax >= 0 && a->amax.ndim != 0) {
            memcpy(&got, after(c, tamax) + 4 * g, 4);
            if (!same_f32(got, m))
                fz_fail(c, "amax", "%s amax[%lld] = %a, want %a: max |x| over rows [%lld, %lld) (ops.md 9.2, 9.4)",
                        recipe_name(q->recipe), (long long)g, (double)got, (double)m, (long long)r0, (long long)r1);
        }
        const float want = expected_scale(m, q);
        const int tsc[2] = {trs, tcs};
        for (int k = 0; k < 2; k++) {
            if (tsc[k] < 0 || c->tens[tsc[k]].t->ndim == 0 || !after(c, tsc[k])) continue;
            memcpy(&got, after(c, tsc[k]) + 4 * g, 4);
            if (!same_f32(got, want))
                fz_fail(c, "scale", "%s %s[%lld] = %a, want %a: 1/s for amax %a, epsilon %g, %s (ops.md 9.2)",
                        recipe_name(q->recipe), c->tens[tsc[k]].name, (long long)g, (double)got, (double)want,
                        (double)m, (double)q->amax_epsilon, q->rounding == MOEX_SCALE_POW2 ? "POW2" : "EXACT");
        }
        r0 = r1;
    }
}

/* dbias [G, K] (ops.md 9.4): dbias[g, k] = the f32 sum of x[t, k] over group g's rows, 0 for
 * an empty group; its order is the backend's, so a column is checked against the exact sum
 * within an f32 sum's error bound (columns holding a non-finite or huge value: skipped). */
static void check_dbias(fz_case *c, const moex_group_quantize_args *a, int tx, int ts, int tdb) {
    if (tdb < 0 || a->dbias.ndim == 0 || qc.K == 0) return;
    const int64_t *s = c->tens[ts].i64;
    const unsigned char *x = after(c, tx), *db = after(c, tdb);
    int64_t r0 = 0;
    for (int64_t g = 0; g < qc.G; g++) {
        const int64_t r1 = r0 + s[g];
        for (int64_t k = 0; k < qc.K; k++) {
            float got;
            memcpy(&got, db + 4 * (g * qc.K + k), 4);
            double sum = 0.0, mag = 0.0;
            bool skip = false;
            for (int64_t t = r0; t < r1 && !skip; t++) {
                const float v = fz_load_float(x, a->x.dtype, t * qc.K + k);
                skip = !isfinite(v) || fabsf(v) > 1e30f;
                sum += v;
                mag += fabs((double)v);
            }
            if (skip) continue;
            const double tol = (double)(r1 - r0) * mag * 0x1p-23 + 0x1p-140;
            if (r1 == r0 ? got != 0.0f : !(fabs((double)got - sum) <= tol))
                fz_fail(c, "dbias", "dbias[%lld, %lld] = %a, want %a (the sum of x[t, %lld] over rows [%lld, %lld), "
                        "within %g)", (long long)g, (long long)k, (double)got, sum, (long long)k, (long long)r0,
                        (long long)r1, tol);
        }
        r0 = r1;
    }
}

/* The workspace oracle: the call again with a fresh workspace (other bytes, another
 * misalignment) must write the same outputs (docs/conventions.md 6: the workspace's contents
 * on entry never affect results; moex.h: determinism). */
void fz_check_rerun(fz_case *c, const fz_opfns *f, const void *args) {
    unsigned char *keep[FZ_MAX_TENSORS];
    for (int i = 0; i < c->ntens; i++) {
        const fz_tensor *T = &c->tens[i];
        keep[i] = NULL;
        if (T->role != FZ_OUT || T->buf < 0 || T->t->ndim == 0) continue;
        const fz_buf *b = &c->bufs[T->buf];
        keep[i] = (unsigned char *)fz_alloc(c, b->total);
        memcpy(keep[i], b->now, b->total);
    }
    fz_workspace(c);
    if (fz_run(c, f->rname, f->run, args) != MOEX_OK) return;   /* judged there */
    for (int i = 0; i < c->ntens; i++) {
        if (!keep[i]) continue;
        const fz_buf *b = &c->bufs[c->tens[i].buf];
        if (memcmp(keep[i], b->now, b->total) == 0) continue;
        size_t at = 0;
        while (keep[i][at] == b->now[at]) at++;
        fz_fail(c, "workspace", "a second run with another workspace (%zu bytes) wrote other values into %s "
                "(byte %lld: %#x, then %#x): results depend on the workspace's contents",
                c->ws_bytes, c->tens[i].name, (long long)at - (long long)(b->lead + c->tens[i].at),
                keep[i][at], b->now[at]);
    }
}

/* fz_flow, then the oracles of a valid run. */
static void quant_flow(fz_case *c, const fz_opfns *f, void *args, fz_fault_fn faults,
                       const moex_group_quantize_args *qa) {
    fz_materialize(c);
    if (c->legal_alias && !c->huge) fz_legal_alias(c);
    size_t need = 0;
    moex_status st = fz_query(c, f->qname, f->query, args, &need);
    if (st != MOEX_OK && !c->huge) return;   /* UNSUPPORTED (anything else failed above) */
    c->ws_need = st == MOEX_OK ? need : 0;
    fz_faults(c, faults, args);
    if (c->nfaults) {
        size_t n2 = 0;
        fz_query(c, f->qname, f->query, args, &n2);
    }
    if (c->huge && !fz_must_fail(c)) return;   /* huge shapes cannot be backed by memory */
    fz_workspace(c);
    if (fz_run(c, f->rname, f->run, args) != MOEX_OK || c->nfaults || c->huge) return;
    if (qa) {
        check_current(c, qa, fz_find(c, "x"), fz_find(c, "splits"), fz_find(c, "amax"), fz_find(c, "rowwise.scales"),
                      fz_find(c, "columnwise.scales"));
        check_dbias(c, qa, fz_find(c, "x"), fz_find(c, "splits"), fz_find(c, "dbias"));
    }
    fz_check_rerun(c, f, args);
}

/* ---- the builders ---------------------------------------------------------------------------- */

/* splits [G] over T rows (valid); returns S, leaves the values in *s (NULL: huge mode). */
static int64_t quant_splits(fz_case *c, moex_tensor *t, bool g_tied, int64_t **s) {
    *s = fz_i64s(c, qc.G);
    const int64_t S = fz_make_splits(c, *s, qc.G, qc.T);
    *t = moex_tensor_1d(NULL, I64, qc.G);
    const int ts = fz_tensor_reg(c, "splits", t, FZ_IN, FZ_REQUIRED | (g_tied ? 0 : FZ_FREE0), DT(I64));
    fz_set_i64(c, ts, *s, qc.G);
    return S;
}

/* One copy of orientation o: data and scales (OUT for quantize, IN for dequantize), with the
 * tails; absent: its scales registered as forbidden (scales without data). */
static void quant_copy(fz_case *c, moex_quant_tensor *q, const moex_quant_params *p, moex_quant_orientation o,
                       bool present, unsigned data_flags, fz_role role, int64_t S, int64_t bG, const char *dname,
                       const char *sname) {
    q->scales = scales_tensor(p->recipe, o, qc.G, qc.T, qc.K);
    if (!present) {
        fz_tensor_reg(c, sname, &q->scales, role, FZ_FORBIDDEN, DT(scale_dtype(p->recipe)));
        return;
    }
    const bool row = o == MOEX_QUANT_ROWWISE;
    q->data = row ? moex_tensor_2d(NULL, p->fp8, qc.T, qc.K) : moex_tensor_2d(NULL, p->fp8, qc.K, qc.T);
    const int td = fz_tensor_reg(c, dname, &q->data, role, data_flags, DT(p->fp8));
    if (row) fz_tail(c, td, S);
    else fz_tail_cols(c, td, S);
    const int tsc = fz_tensor_reg(c, sname, &q->scales, role, FZ_REQUIRED, DT(scale_dtype(p->recipe)));
    if (block_of(p->recipe)) {
        if (row) fz_tail(c, tsc, S);
        else if (bG >= 0) fz_tail_cols(c, tsc, bG);
    }
}

void fz_op_quantize(fz_case *c) {
    moex_group_quantize_args *a = (moex_group_quantize_args *)fz_alloc(c, sizeof *a);
    qc.G = fz_dim(c, 1, 6, 40);
    qc.T = quant_dim(c);
    qc.K = quant_dim(c);
    const moex_dtype dt = fz_act_dtype(c);
    a->params = quant_params(c);
    const uint8_t opt = fz_u8(c);
    bool row = opt & 1, col = (opt & 2) != 0;
    if (!row && !col) row = !(col = (opt & 4) != 0);
    const int64_t B = block_of(a->params.recipe);
    const bool amax = !B && (opt & 8), dbias = (opt & 16) != 0;
    int64_t *s;
    const int64_t S =
        quant_splits(c, &a->splits, a->params.recipe == MOEX_QUANT_GROUP || (B && col) || dbias, &s);
    const int64_t bG = tiles_written(s, qc.G, B);
    a->x = moex_tensor_2d(NULL, dt, qc.T, qc.K);
    fz_tail(c, fz_tensor_reg(c, "x", &a->x, FZ_IN, FZ_REQUIRED, DT(F32) | DT(BF16) | DT(MOEX_DTYPE_F16)), S);
    /* data: required when it is the only copy (absent, none is left); with both, absent is
     * legal (and its scales then forbidden: two faults would cancel) */
    quant_copy(c, &a->rowwise, &a->params, MOEX_QUANT_ROWWISE, row, col ? 0 : FZ_REQUIRED, FZ_OUT, S, bG,
               "rowwise.data", "rowwise.scales");
    quant_copy(c, &a->columnwise, &a->params, MOEX_QUANT_COLUMNWISE, col, row ? 0 : FZ_REQUIRED, FZ_OUT, S, bG,
               "columnwise.data", "columnwise.scales");
    a->amax = moex_tensor_1d(NULL, F32, a->params.recipe == MOEX_QUANT_GROUP ? qc.G : 1);
    if (!B && !amax) a->amax.ndim = 0;
    fz_tensor_reg(c, "amax", &a->amax, FZ_OUT, B ? FZ_FORBIDDEN : 0, DT(F32));
    a->dbias = moex_tensor_2d(NULL, F32, qc.G, qc.K);   /* optional, any recipe */
    if (!dbias) a->dbias.ndim = 0;
    fz_tensor_reg(c, "dbias", &a->dbias, FZ_OUT, 0, DT(F32));
    fz_note(c, "G=%lld T=%lld K=%lld S=%lld %s %s %s %s eps %g rowwise=%d columnwise=%d amax=%d dbias=%d",
            (long long)qc.G, (long long)qc.T, (long long)qc.K, (long long)S, moex_dtype_name(dt),
            recipe_name(a->params.recipe), moex_dtype_name(a->params.fp8),
            a->params.rounding == MOEX_SCALE_POW2 ? "POW2" : "EXACT", (double)a->params.amax_epsilon, row, col, amax,
            dbias);
    quant_flow(c, &qz_fns, a, qz_fault, a);
}

void fz_op_dequantize(fz_case *c) {
    moex_group_dequantize_args *a = (moex_group_dequantize_args *)fz_alloc(c, sizeof *a);
    qc.G = fz_dim(c, 1, 6, 40);
    qc.T = quant_dim(c);
    qc.K = quant_dim(c);
    const moex_dtype dt = fz_act_dtype(c);
    a->params = quant_params(c);
    a->orientation = (moex_quant_orientation)(fz_u8(c) & 1);
    const int64_t B = block_of(a->params.recipe);
    const bool row = a->orientation == MOEX_QUANT_ROWWISE;
    int64_t *s;
    const int64_t S = quant_splits(c, &a->splits, a->params.recipe == MOEX_QUANT_GROUP || (B && !row), &s);
    quant_copy(c, &a->src, &a->params, a->orientation, true, FZ_REQUIRED, FZ_IN, S, tiles_written(s, qc.G, B),
               "src.data", "src.scales");
    a->y = moex_tensor_2d(NULL, dt, qc.T, qc.K);
    fz_tail(c, fz_tensor_reg(c, "y", &a->y, FZ_OUT, FZ_REQUIRED, DT(F32) | DT(BF16) | DT(MOEX_DTYPE_F16)), S);
    fz_note(c, "G=%lld T=%lld K=%lld S=%lld %s %s %s %s eps %g %s", (long long)qc.G, (long long)qc.T,
            (long long)qc.K, (long long)S, moex_dtype_name(dt), recipe_name(a->params.recipe),
            moex_dtype_name(a->params.fp8), a->params.rounding == MOEX_SCALE_POW2 ? "POW2" : "EXACT",
            (double)a->params.amax_epsilon, row ? "rowwise" : "columnwise");
    quant_flow(c, &dq_fns, a, dq_fault, NULL);
}
