/*
 * fuzz_ops_linear.c - argument builders of the moex API fuzzer for splits_to_offsets and
 * the grouped linear layer (forward, backward data, backward weight): a valid argument set
 * from the input bytes, and each operation's own faults (the generic ones are in
 * fuzz_core.c; the fault list is in fuzz.h).
 */
#include "fuzz.h"

#include <string.h>

/* Splits [G] over T rows: the tensor, registered, with valid values; returns S. */
static int64_t splits_reg(fz_case *c, moex_tensor *t, int64_t G, int64_t T, int *ti) {
    int64_t *s = fz_i64s(c, G);
    const int64_t S = fz_make_splits(c, s, G, T);
    *t = moex_tensor_1d(NULL, I64, G);
    *ti = fz_tensor_reg(c, "splits", t, FZ_IN, FZ_REQUIRED, DT(I64));
    fz_set_i64(c, *ti, s, G);
    return S;
}

/* ---- splits_to_offsets ------------------------------------------------------------------ */

FZ_OPFNS(so_fns, splits_to_offsets, moex_splits_to_offsets_args);

static bool so_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_splits_to_offsets_args *a = (moex_splits_to_offsets_args *)args;
    const int ts = fz_find(c, "splits");
    fz_tensor *S = &c->tens[ts];
    const int n = a->num_outputs >= 1 && a->num_outputs <= MOEX_MAX_OFFSETS ? a->num_outputs : 1;
    const int i = (int)((kind >> 8) % (unsigned)n);
    switch (kind % 6) {
    case 0: {
        static const int32_t v[6] = {0, -1, MOEX_MAX_OFFSETS + 1, INT32_MIN, INT32_MAX, 100};
        const int32_t old = a->num_outputs;
        a->num_outputs = v[p % 6];
        fz_fault(c, FZ_STRUCT, "num_outputs %d -> %d", (int)old, (int)a->num_outputs);
        return true;
    }
    case 1:
        a->outputs[i].start = (moex_offsets_start)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: outputs[%d].start = %d", i, (int)a->outputs[i].start);
        return true;
    case 2: {
        static const int64_t v[3] = {0, -1, INT64_MIN};
        a->outputs[i].stride = v[p % 3];
        fz_fault(c, FZ_STRUCT, "stride: outputs[%d].stride = %lld", i, (long long)a->outputs[i].stride);
        return true;
    }
    case 3:
    case 4: {   /* a negative split, or a sum past INT64_MAX */
        if (!S->i64 || S->touched || S->t->ndim != 1) return false;
        int64_t *s = S->i64;
        const int64_t G = S->nints, g = (int64_t)(p % (uint64_t)G);
        if (kind % 6 == 3 || G < 2) {
            s[g] = (p >> 8) & 1 ? INT64_MIN : -1 - (int64_t)((p >> 9) % 5);
            fz_fault(c, FZ_SPLITS, "split values: splits[%lld] = %lld (negative)", (long long)g, (long long)s[g]);
        } else {
            const int64_t h = (g + 1 + (int64_t)((p >> 8) % (uint64_t)(G - 1))) % G;
            s[g] = INT64_MAX;
            if (s[h] < 1) s[h] = 1 + (int64_t)((p >> 16) % 7);
            fz_fault(c, FZ_SPLITS, "split values: splits[%lld] = INT64_MAX, splits[%lld] = %lld (sum past INT64_MAX)",
                     (long long)g, (long long)h, (long long)s[h]);
        }
        S->touched = S->refill = 1;
        return true;
    }
    default: {   /* stride * sum past the output dtype */
        if (!S->i64 || S->touched) return false;
        int64_t sum = 0;
        for (int64_t g = 0; g < S->nints; g++) sum += S->i64[g];   /* valid: fits */
        moex_offsets_output *o = &a->outputs[i];
        if (sum < 1 || o->stride < 1 || (o->out.dtype != I32 && o->out.dtype != I64)) return false;
        const int64_t limit = o->out.dtype == I32 ? INT32_MAX : INT64_MAX;
        if (limit / sum > INT64_MAX - 4) return false;   /* sum 1 into i64: every stride fits */
        o->stride = limit / sum + 1 + (int64_t)((p >> 8) % 3);
        fz_fault(c, FZ_OFFSFIT, "offsets fit: outputs[%d] %s, stride %lld * sum %lld does not fit", i,
                 moex_dtype_name(o->out.dtype), (long long)o->stride, (long long)sum);
        return true;
    }
    }
}

void fz_op_splits_to_offsets(fz_case *c) {
    moex_splits_to_offsets_args *a = (moex_splits_to_offsets_args *)fz_alloc(c, sizeof *a);
    const int64_t G = fz_dim(c, 1, 12, 300);
    int64_t *s = fz_i64s(c, G);
    const bool big = fz_chance(c, 48);
    int64_t S = 0;
    if (s) {
        for (int64_t g = 0; g < G; g++) {
            s[g] = big ? (int64_t)(fz_rand(c) % (uint64_t)(INT64_MAX / G)) : (int64_t)(fz_rand(c) % 21);
            if (fz_rand(c) % 4 == 0) s[g] = 0;
            S += s[g];
        }
    } else {
        S = (int64_t)(fz_u64(c) & INT64_MAX);   /* huge mode: no contents; only for the strides */
    }
    a->num_outputs = 1 + fz_pick(c, MOEX_MAX_OFFSETS);
    a->splits = moex_tensor_1d(NULL, I64, G);
    const int ts = fz_tensor_reg(c, "splits", &a->splits, FZ_IN, FZ_REQUIRED, DT(I64));
    fz_set_i64(c, ts, s, G);
    fz_note(c, "G=%lld S=%lld num_outputs=%d", (long long)G, (long long)S, (int)a->num_outputs);
    static const char *const names[MOEX_MAX_OFFSETS] = {"outputs[0].out", "outputs[1].out", "outputs[2].out",
                                                        "outputs[3].out", "outputs[4].out", "outputs[5].out",
                                                        "outputs[6].out", "outputs[7].out"};
    for (int i = 0; i < MOEX_MAX_OFFSETS; i++) {
        moex_offsets_output *o = &a->outputs[i];
        const uint8_t b = fz_u8(c), b2 = fz_u8(c);
        if (i >= a->num_outputs) {   /* ignored by the call: must stay untouched */
            if (b < 128) continue;
            o->out = moex_tensor_1d(NULL, (b & 1) ? I64 : I32, 1 + b2 % 16);
            o->out.ndim = (b & 2) ? 1 + (int32_t)(b2 % 3) : 1;
            o->stride = (int64_t)(b2 % 4) - 1;
            o->start = (moex_offsets_start)(b % 5);
            fz_tensor_reg(c, names[i], &o->out, FZ_KEEP, FZ_NOFAULT, 0);
            continue;
        }
        moex_dtype dt = (b & 1) && S <= INT32_MAX ? I32 : I64;
        const int64_t limit = dt == I32 ? INT32_MAX : INT64_MAX, maxstride = S > 0 ? limit / S : INT64_MAX;
        if (b2 < 160)
            o->stride = 1 + b2 % 8;
        else if (b2 < 224)
            o->stride = maxstride;   /* the largest value that still fits */
        else
            o->stride = 1 + (int64_t)(fz_rand(c) % (uint64_t)maxstride);
        if (o->stride > maxstride) o->stride = maxstride;
        o->start = (b >> 1) & 1 ? MOEX_OFFSETS_INCLUSIVE : MOEX_OFFSETS_LEADING_ZERO;
        const int64_t len = o->start == MOEX_OFFSETS_LEADING_ZERO ? (G == INT64_MAX ? G : G + 1) : G;
        o->out = moex_tensor_1d(NULL, dt, len);
        fz_tensor_reg(c, names[i], &o->out, FZ_OUT, FZ_REQUIRED, DT(I32) | DT(I64));
        fz_note(c, " [%d %s stride %lld %s]", i, moex_dtype_name(dt), (long long)o->stride,
                o->start == MOEX_OFFSETS_LEADING_ZERO ? "lz" : "incl");
    }
    fz_flow(c, &so_fns, a, so_fault);
}

/* ---- grouped linear ---------------------------------------------------------------------- */

FZ_OPFNS(glf_fns, grouped_linear_forward, moex_grouped_linear_args);
FZ_OPFNS(gld_fns, grouped_linear_backward_data, moex_grouped_linear_dgrad_args);
FZ_OPFNS(glw_fns, grouped_linear_backward_weight, moex_grouped_linear_wgrad_args);

/* bias_mode unknown, or bad split values. */
static bool bias_or_splits_fault(fz_case *c, moex_bias_mode *mode, int64_t T, unsigned kind, uint64_t p) {
    if (kind % 3 == 0) {
        *mode = (moex_bias_mode)fz_bad_enum(c, p, 3);
        fz_fault(c, FZ_STRUCT, "enum: bias_mode = %d", (int)*mode);
        return true;
    }
    return fz_fault_split_values(c, fz_find(c, "splits"), T, p);
}

static int64_t gl_T;   /* rows of the case being built (the fault callbacks need it) */

static bool glf_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    return bias_or_splits_fault(c, &((moex_grouped_linear_args *)args)->bias_mode, gl_T, kind, p);
}

static bool gld_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    return bias_or_splits_fault(c, &((moex_grouped_linear_dgrad_args *)args)->bias_mode, gl_T, kind, p);
}

static bool glw_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_grouped_linear_wgrad_args *a = (moex_grouped_linear_wgrad_args *)args;
    if (kind % 3 == 0) {
        a->dw_mode = (moex_grad_mode)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: dw_mode = %d", (int)a->dw_mode);
        return true;
    }
    return fz_fault_split_values(c, fz_find(c, "splits"), gl_T, p);
}

void fz_op_gl_fwd(fz_case *c) {
    moex_grouped_linear_args *a = (moex_grouped_linear_args *)fz_alloc(c, sizeof *a);
    const int64_t G = fz_dim(c, 1, 6, 40), T = fz_dim(c, 0, 24, 300), K = fz_dim(c, 1, 24, 300),
                  N = fz_dim(c, 1, 24, 96);
    const moex_dtype dt = fz_act_dtype(c), bdt = fz_chance(c, 128) ? F32 : dt;
    a->bias_mode = (moex_bias_mode)fz_pick(c, 3);
    int ts;
    const int64_t S = splits_reg(c, &a->splits, G, T, &ts);
    gl_T = T;
    a->x = moex_tensor_2d(NULL, dt, T, K);
    fz_tail(c, fz_tensor_reg(c, "x", &a->x, FZ_IN, FZ_REQUIRED, DT(dt)), S);
    a->w = moex_weight_packed(moex_tensor_3d(NULL, dt, G, N, K));
    fz_weight_reg(c, "w", &a->w, FZ_IN, FZ_REQUIRED | FZ_DISCRETE_OK, DT(dt));
    a->y = moex_tensor_2d(NULL, dt, T, N);
    fz_tail(c, fz_tensor_reg(c, "y", &a->y, FZ_OUT, FZ_REQUIRED, DT(dt)), S);
    a->bias = moex_tensor_2d(NULL, bdt, G, N);
    fz_tensor_reg(c, "bias", &a->bias, FZ_IN, a->bias_mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : FZ_REQUIRED,
                  DT(dt) | DT(F32));
    a->probs = moex_tensor_1d(NULL, F32, T);
    fz_tail(c, fz_tensor_reg(c, "probs", &a->probs, FZ_IN,
                             a->bias_mode == MOEX_BIAS_SCALED ? FZ_REQUIRED : FZ_FORBIDDEN, DT(F32)), S);
    fz_note(c, "G=%lld T=%lld K=%lld N=%lld S=%lld %s bias_mode=%d bias %s", (long long)G, (long long)T, (long long)K,
            (long long)N, (long long)S, moex_dtype_name(dt), (int)a->bias_mode, moex_dtype_name(bdt));
    fz_flow(c, &glf_fns, a, glf_fault);
}

void fz_op_gl_dgrad(fz_case *c) {
    moex_grouped_linear_dgrad_args *a = (moex_grouped_linear_dgrad_args *)fz_alloc(c, sizeof *a);
    const int64_t G = fz_dim(c, 1, 6, 40), T = fz_dim(c, 0, 24, 300), K = fz_dim(c, 1, 24, 300),
                  N = fz_dim(c, 1, 24, 96);
    const moex_dtype dt = fz_act_dtype(c), bdt = fz_chance(c, 128) ? F32 : dt;
    const uint8_t opt = fz_u8(c);
    const moex_bias_mode mode = (moex_bias_mode)fz_pick(c, 3);
    a->bias_mode = mode;
    const bool dx = opt & 1, dbias = mode != MOEX_BIAS_NONE && (opt & 2),
               dprobs = mode == MOEX_BIAS_SCALED && (opt & 4),
               bias = mode != MOEX_BIAS_NONE && (dprobs && mode == MOEX_BIAS_SCALED ? true : (opt & 8) != 0);
    int ts;
    const int64_t S = splits_reg(c, &a->splits, G, T, &ts);
    gl_T = T;
    /* T is tied only through dx, probs, dprobs; K only through dx */
    const bool t_tied = dx || mode == MOEX_BIAS_SCALED;
    a->dy = moex_tensor_2d(NULL, dt, T, N);
    fz_tail(c, fz_tensor_reg(c, "dy", &a->dy, FZ_IN, FZ_REQUIRED | (t_tied ? 0 : FZ_FREE0), DT(dt)), S);
    a->w = moex_weight_packed(moex_tensor_3d(NULL, dt, G, N, K));
    fz_weight_reg(c, "w", &a->w, FZ_IN, FZ_REQUIRED | FZ_DISCRETE_OK | (dx ? 0 : FZ_FREE2), DT(dt));
    a->bias = moex_tensor_2d(NULL, bdt, G, N);
    unsigned bflags = mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : dprobs ? FZ_REQUIRED : 0;
    if (!bias && !(bflags & FZ_FORBIDDEN)) bflags = 0, a->bias.ndim = 0;
    fz_tensor_reg(c, "bias", &a->bias, FZ_IN, bflags, DT(dt) | DT(F32));
    a->probs = moex_tensor_1d(NULL, F32, T);
    fz_tail(c, fz_tensor_reg(c, "probs", &a->probs, FZ_IN, mode == MOEX_BIAS_SCALED ? FZ_REQUIRED : FZ_FORBIDDEN,
                             DT(F32)), S);
    a->dx = moex_tensor_2d(NULL, dt, dx ? T : 0, K);
    if (!dx) a->dx.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "dx", &a->dx, FZ_OUT, 0, DT(dt)), S);
    a->dbias = moex_tensor_2d(NULL, F32, G, N);
    if (!dbias && mode != MOEX_BIAS_NONE) a->dbias.ndim = 0;
    fz_tensor_reg(c, "dbias", &a->dbias, FZ_OUT, mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : 0, DT(dt) | DT(F32));
    a->dprobs = moex_tensor_1d(NULL, F32, T);
    if (!dprobs && mode == MOEX_BIAS_SCALED) a->dprobs.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "dprobs", &a->dprobs, FZ_ACC, mode != MOEX_BIAS_SCALED ? FZ_FORBIDDEN : 0, DT(F32)),
            S);
    fz_note(c, "G=%lld T=%lld K=%lld N=%lld S=%lld %s bias_mode=%d bias %s%s dx=%d dbias=%d dprobs=%d", (long long)G,
            (long long)T, (long long)K, (long long)N, (long long)S, moex_dtype_name(dt), (int)mode, bias ? "" : "absent ",
            moex_dtype_name(bdt), dx, dbias, dprobs);
    fz_flow(c, &gld_fns, a, gld_fault);
}

void fz_op_gl_wgrad(fz_case *c) {
    moex_grouped_linear_wgrad_args *a = (moex_grouped_linear_wgrad_args *)fz_alloc(c, sizeof *a);
    const int64_t G = fz_dim(c, 1, 6, 40), T = fz_dim(c, 0, 24, 300), K = fz_dim(c, 1, 24, 300),
                  N = fz_dim(c, 1, 24, 96);
    const moex_dtype dt = fz_act_dtype(c);
    a->dw_mode = (moex_grad_mode)fz_pick(c, 2);
    const moex_dtype wdt = a->dw_mode == MOEX_GRAD_WRITE && fz_chance(c, 128) ? dt : F32;
    int ts;
    const int64_t S = splits_reg(c, &a->splits, G, T, &ts);
    gl_T = T;
    a->x = moex_tensor_2d(NULL, dt, T, K);
    fz_tail(c, fz_tensor_reg(c, "x", &a->x, FZ_IN, FZ_REQUIRED, DT(dt)), S);
    a->dy = moex_tensor_2d(NULL, dt, T, N);
    fz_tail(c, fz_tensor_reg(c, "dy", &a->dy, FZ_IN, FZ_REQUIRED, DT(dt)), S);
    a->dw = moex_weight_packed(moex_tensor_3d(NULL, wdt, G, N, K));
    fz_weight_reg(c, "dw", &a->dw, a->dw_mode == MOEX_GRAD_ACCUMULATE ? FZ_ACC : FZ_OUT,
                  FZ_REQUIRED | FZ_DISCRETE_OK, a->dw_mode == MOEX_GRAD_ACCUMULATE ? DT(F32) : DT(F32) | DT(dt));
    fz_note(c, "G=%lld T=%lld K=%lld N=%lld S=%lld %s dw_mode=%d dw %s", (long long)G, (long long)T, (long long)K,
            (long long)N, (long long)S, moex_dtype_name(dt), (int)a->dw_mode, moex_dtype_name(wdt));
    fz_flow(c, &glw_fns, a, glw_fault);
}
