/*
 * fuzz_ops_linear.c - argument builders of the moex API fuzzer for splits_to_offsets,
 * zero_tail and the grouped linear layer (forward, backward data, backward weight): a valid argument set
 * from the input bytes, and each operation's own faults (the generic ones are in
 * fuzz_core.c; the fault list is in fuzz.h).
 */
#include "fuzz.h"

#include <float.h>
#include <math.h>
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

/* ---- zero_tail ---------------------------------------------------------------------------- */

FZ_OPFNS(zt_fns, zero_tail, moex_zero_tail_args);

/* A negative split, or a sum past T (x of 0 or more than 4 dimensions: the generic G0 and G6,
 * which FZ_ANY_NDIM restricts to invalid values). */
static bool zt_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    (void)kind;   /* one kind of fault */
    moex_zero_tail_args *a = (moex_zero_tail_args *)args;
    fz_tensor *S = &c->tens[fz_find(c, "splits")];
    if (!S->i64 || S->touched || S->t->ndim != 1 || a->x.ndim < 1 || a->x.ndim > MOEX_MAX_DIMS) return false;
    const int64_t g = (int64_t)(p % (uint64_t)S->nints);
    S->i64[g] = (p >> 8) & 1 ? -1 - (int64_t)((p >> 9) % 5) : a->x.shape[0] + 1 + (int64_t)((p >> 9) % 7);
    fz_fault(c, FZ_SPLITS, "split values: splits[%lld] = %lld", (long long)g, (long long)S->i64[g]);
    S->touched = S->refill = 1;
    return true;
}

void fz_op_zero_tail(fz_case *c) {
    moex_zero_tail_args *a = (moex_zero_tail_args *)fz_alloc(c, sizeof *a);
    static const moex_dtype dts[8] = {F32, BF16, MOEX_DTYPE_F16, I32, I64, MOEX_DTYPE_E4M3, MOEX_DTYPE_E5M2,
                                      MOEX_DTYPE_E8M0};
    /* run mode: at most 1024 rows of 12^3 elements of 8 bytes, under FZ_MAX_REAL */
    const int64_t G = fz_dim(c, 1, 12, 300), T = fz_dim(c, 0, 64, 1024);
    const moex_dtype dt = dts[fz_pick(c, 8)];
    const int ndim = 1 + fz_pick(c, MOEX_MAX_DIMS);
    a->x = moex_tensor_1d(NULL, dt, T);
    a->x.ndim = ndim;
    for (int i = 1; i < ndim; i++) a->x.shape[i] = fz_dim(c, 0, 6, 12);
    /* no dimension is tied to another tensor's: G and every size of x are free (G2 skips them),
     * and x may have any ndim from 1 to 4 (G0 changes it to an invalid one only) */
    int64_t *s = fz_i64s(c, G);
    const int64_t S = fz_make_splits(c, s, G, T);
    a->splits = moex_tensor_1d(NULL, I64, G);
    fz_set_i64(c, fz_tensor_reg(c, "splits", &a->splits, FZ_IN, FZ_REQUIRED | FZ_FREE0, DT(I64)), s, G);
    fz_tensor_reg(c, "x", &a->x, FZ_OUT, FZ_REQUIRED | FZ_FREE_ALL | FZ_ANY_NDIM, ~0u);
    fz_note(c, "G=%lld T=%lld S=%lld %s %d-D", (long long)G, (long long)T, (long long)S, moex_dtype_name(dt), ndim);
    fz_flow(c, &zt_fns, a, zt_fault);
}

/* ---- the layers' FP8 recipe (docs/ops.md 9.11), shared with fuzz_ops_mlp.c, fuzz_ops_moe.c ---- */

static const float fp8_eps_ok[8] = {0.0f, -0.0f, 1e-45f, FLT_MIN, 1e-12f, 1e-6f, 1e-3f, 0.0f};

moex_fp8_recipe fz_fp8_recipe(fz_case *c) {
    moex_fp8_recipe r;
    memset(&r, 0, sizeof r);
    const uint8_t b = fz_u8(c);
    if (b < 160) {
        if (b >= 144) {   /* OFF with the other fields set: validated, then ignored */
            static const int32_t pow2[4] = {0, 1, -1, INT32_MIN};
            r.dtypes = (b & 1) ? MOEX_FP8_HYBRID : MOEX_FP8_E4M3_ALL;
            r.pow2_scales = pow2[(b >> 1) & 3];
            r.amax_epsilon = fp8_eps_ok[1 + ((b >> 3) & 1) * 4 + (b & 2)];
        }
    } else {
        const uint8_t b2 = fz_u8(c);
        r.mode = (moex_fp8_mode)(1 + b % 3);
        r.dtypes = (b2 & 1) ? MOEX_FP8_HYBRID : MOEX_FP8_E4M3_ALL;
        if (r.mode != MOEX_FP8_MXFP8 && (b2 & 2)) r.pow2_scales = (b2 & 4) ? 1 : INT32_MAX;
        r.amax_epsilon = fp8_eps_ok[(b2 >> 3) % 8];
    }
    if (b >= 144)
        fz_note(c, "[fp8 mode=%d dtypes=%d pow2=%d eps=%a] ", (int)r.mode, (int)r.dtypes, (int)r.pow2_scales,
                (double)r.amax_epsilon);
    return r;
}

bool fz_fp8_on(const moex_fp8_recipe *r) { return r->mode != MOEX_FP8_OFF; }

void fz_fp8_cap(fz_case *c, const moex_fp8_recipe *r, int64_t *const dims[], const int64_t lo[], int n, int64_t mul) {
    if (c->huge || !fz_fp8_on(r)) return;
    const int64_t cap = (int64_t)1 << 17;
    for (;;) {
        int64_t prod = mul < 1 ? 1 : mul;
        int big = 0;
        for (int i = 0; i < n; i++) {
            prod = fz_mul_sat(prod, *dims[i]);
            if (*dims[i] > *dims[big]) big = i;
        }
        if (prod <= cap || *dims[big] <= 32) return;
        *dims[big] = lo[big] + *dims[big] % 32;
    }
}

bool fz_fault_fp8(fz_case *c, moex_fp8_recipe *r, uint64_t p) {
    switch (p % 4) {
    case 0:
        r->mode = (moex_fp8_mode)fz_bad_enum(c, p >> 2, 4);
        fz_fault(c, FZ_STRUCT, "fp8.mode: unknown %d", (int)r->mode);
        return true;
    case 1:
        r->dtypes = (moex_fp8_dtypes)fz_bad_enum(c, p >> 2, 2);
        fz_fault(c, FZ_STRUCT, "fp8.dtypes: unknown %d", (int)r->dtypes);
        return true;
    case 2: {   /* refused whatever the mode, MOEX_FP8_OFF included */
        static const float v[8] = {-1.0f, -1e-30f, -1e-45f, -FLT_MAX, -FLT_MIN, NAN, INFINITY, -INFINITY};
        r->amax_epsilon = v[(p >> 2) % 8];
        fz_fault(c, FZ_STRUCT, "fp8.amax_epsilon: %a (mode %d)", (double)r->amax_epsilon, (int)r->mode);
        return true;
    }
    default: {
        static const int32_t v[4] = {1, -1, INT32_MIN, INT32_MAX};
        r->mode = MOEX_FP8_MXFP8;
        r->pow2_scales = v[(p >> 2) % 4];
        fz_fault(c, FZ_STRUCT, "fp8.pow2_scales: %d with MXFP8", (int)r->pow2_scales);
        return true;
    }
    }
}

/* The outputs ("=") of the call as it left them: every data or matrix buffer of an FZ_OUT
 * tensor, copied into one case-owned block (off[i]: where buffer i is, SIZE_MAX: not kept). */
typedef struct outputs_copy {
    int n;
    size_t *off;
    unsigned char *mem;
} outputs_copy;

static bool kept(const fz_case *c, const fz_buf *b) {
    return (b->kind == FZ_B_DATA || b->kind == FZ_B_MATRIX) && b->owner >= 0 && c->tens[b->owner].role == FZ_OUT;
}

static outputs_copy outputs_keep(fz_case *c) {
    outputs_copy k = {c->nbufs, NULL, NULL};
    k.off = (size_t *)fz_alloc(c, sizeof *k.off * (size_t)(k.n ? k.n : 1));
    size_t total = 0;
    for (int i = 0; i < k.n; i++) {
        k.off[i] = kept(c, &c->bufs[i]) ? total : SIZE_MAX;
        if (k.off[i] != SIZE_MAX) total += c->bufs[i].total;
    }
    k.mem = (unsigned char *)fz_alloc(c, total);
    for (int i = 0; i < k.n; i++)
        if (k.off[i] != SIZE_MAX) memcpy(k.mem + k.off[i], c->bufs[i].now, c->bufs[i].total);
    return k;
}

static void outputs_same(fz_case *c, const outputs_copy *k, const char *oracle, const char *what) {
    for (int i = 0; i < k->n && i < c->nbufs; i++) {
        const fz_buf *b = &c->bufs[i];
        if (k->off[i] == SIZE_MAX || !kept(c, b)) continue;
        const unsigned char *was = k->mem + k->off[i];
        if (memcmp(was, b->now, b->total) == 0) continue;
        size_t at = 0;
        while (was[at] == b->now[at]) at++;
        fz_fail(c, oracle, "%s wrote other values into %s (buffer %s, byte %lld of its payload: %#x, then %#x)", what,
                c->tens[b->owner].name, b->name, (long long)at - (long long)b->lead, was[at], b->now[at]);
    }
}

/* The FP8 copies (both orientations) of a packed weight w [G, N, K] under params p, written
 * by moex_weight_quantize into case-owned memory; false when that call did not return OK. */
static bool quantize_kept(fz_case *c, const moex_weight *w, const moex_quant_params *p, moex_fp8_weight *kw) {
    const int64_t G = w->t.shape[0], N = w->t.shape[1], K = w->t.shape[2];
    const int64_t B = p->recipe == MOEX_QUANT_BLOCK ? 128 : p->recipe == MOEX_QUANT_MXFP8 ? 32 : 0;
    const moex_dtype sdt = p->recipe == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : F32;
    int64_t sr[2], sc[2];
    size_t at[5] = {0};   /* the offsets of row data, row scales, column data, column scales; the end */
    for (int o = 0; o < 2; o++) {
        const int64_t rows = o ? K : N, cols = o ? N : K;
        sr[o] = B == 128 ? (rows + 127) / 128 : rows, sc[o] = B ? (cols + B - 1) / B : 1;
        const size_t sbytes = (size_t)(B ? G * sr[o] * sc[o] : G) * moex_dtype_size(sdt);
        at[2 * o + 1] = at[2 * o] + ((size_t)(G * rows * cols) + 15) / 16 * 16;
        at[2 * o + 2] = at[2 * o + 1] + (sbytes + 15) / 16 * 16;
    }
    unsigned char *mem = (unsigned char *)fz_alloc(c, at[4]);   /* one block for both copies */
    for (int o = 0; o < 2; o++) {
        moex_quant_tensor q;
        q.data = moex_tensor_3d(mem + at[2 * o], p->fp8, G, o ? K : N, o ? N : K);
        q.scales = B ? moex_tensor_3d(mem + at[2 * o + 1], sdt, G, sr[o], sc[o])
                     : moex_tensor_1d(mem + at[2 * o + 1], F32, G);
        if (o) kw->columnwise = q;
        else kw->rowwise = q;
    }
    moex_weight_quantize_args a = {.w = w->t, .params = *p, .rowwise = kw->rowwise, .columnwise = kw->columnwise};
    size_t bytes = 0;
    if (moex_weight_quantize_workspace_size(fz_g.ctx, &a, &bytes) != MOEX_OK) return false;
    void *ws = bytes ? fz_alloc(c, bytes) : NULL;
    return moex_weight_quantize(fz_g.ctx, &a, ws, bytes, NULL) == MOEX_OK;
}

/* "kept copies" (see fuzz.h): on the CPU, packed weights only. */
static void kept_copies_check(fz_case *c, const fz_opfns *f, void *args, moex_fp8_recipe *r,
                              const outputs_copy *keep) {
    if (c->cuda || !c->fp8_w[0]) return;
    moex_fp8_weight *kw = (moex_fp8_weight *)fz_alloc(c, 2 * sizeof *kw);
    const moex_quant_params p = moex_fp8_weight_params(r);
    for (int i = 0; i < 2 && c->fp8_w[i]; i++) {
        const moex_weight *w = c->fp8_w[i];
        if (w->ptrs || w->t.ndim != 3) return;
        if (!quantize_kept(c, w, &p, &kw[i])) {
            fz_fail(c, "kept copies", "moex_weight_quantize refused weight %d of a valid %s: %s", i, f->rname,
                    moex_last_error(fz_g.ctx));
            return;
        }
    }
    r->weights = kw;
    size_t need = 0;
    if (fz_query(c, f->qname, f->query, args, &need) == MOEX_OK) {
        c->ws_need = need;
        fz_workspace(c);
        if (fz_run(c, f->rname, f->run, args) == MOEX_OK)
            outputs_same(c, keep, "kept copies", "the call with its weights' FP8 copies kept (fp8.weights: "
                         "docs/ops.md 9.11)");
    }
    r->weights = NULL;
}

void fz_fp8_after_run(fz_case *c, const fz_opfns *f, void *args, moex_fp8_recipe *r, moex_status st) {
    if (c->nfaults || c->huge) return;
    if (fz_fp8_on(r) && !c->cuda && st != MOEX_OK)
        fz_fail(c, "fp8", "%s returned %s for a valid FP8 recipe (mode %d) on the CPU (docs/ops.md 9.11)", f->rname,
                moex_status_string(st), (int)r->mode);
    if (st != MOEX_OK) return;
    if (fz_fp8_on(r)) fz_last_features.fp8_ops |= 1u << c->op;
    const bool extra = r->dtypes != MOEX_FP8_E4M3_ALL || r->pow2_scales != 0 || r->amax_epsilon != 0.0f ||
                       signbit(r->amax_epsilon);
    if (!fz_fp8_on(r) && !extra) return;
    const outputs_copy keep = outputs_keep(c);
    if (fz_fp8_on(r)) {   /* "workspace": a fresh workspace (other bytes, other misalignment) */
        fz_workspace(c);
        if (fz_run(c, f->rname, f->run, args) != MOEX_OK) return;   /* judged there */
        outputs_same(c, &keep, "workspace", "a second run with another workspace (results depend on its contents)");
        kept_copies_check(c, f, args, r, &keep);
        return;
    }
    /* "fp8 off": OFF ignores the other fields: the zeroed recipe writes bitwise the same */
    const moex_fp8_recipe old = *r;
    memset(r, 0, sizeof *r);
    size_t need = 0;
    if (fz_query(c, f->qname, f->query, args, &need) == MOEX_OK) {
        c->ws_need = need;
        fz_workspace(c);
        if (fz_run(c, f->rname, f->run, args) == MOEX_OK)
            outputs_same(c, &keep, "fp8 off", "the call with a zero fp8 recipe (MOEX_FP8_OFF ignores the other "
                         "fields: docs/ops.md 9.11, the plain path bitwise)");
    }
    *r = old;
}

void fz_layer_flow(fz_case *c, const fz_opfns *f, void *args, fz_fault_fn faults, moex_fp8_recipe *r) {
    fz_materialize(c);
    if (c->legal_alias && !c->huge) fz_legal_alias(c);
    size_t need = 0;
    moex_status st = fz_query(c, f->qname, f->query, args, &need);
    if (st != MOEX_OK && !c->huge) {   /* UNSUPPORTED (anything else failed above) */
        if (fz_fp8_on(r) && !c->cuda)
            fz_fail(c, "fp8", "%s returned %s for a valid FP8 recipe (mode %d) on the CPU", f->qname,
                    moex_status_string(st), (int)r->mode);
        return;
    }
    c->ws_need = st == MOEX_OK ? need : 0;
    fz_faults(c, faults, args);
    if (c->nfaults) {
        size_t n2 = 0;
        fz_query(c, f->qname, f->query, args, &n2);
    }
    if (c->huge && !fz_must_fail(c)) return;   /* huge shapes cannot be backed by memory */
    fz_workspace(c);
    st = fz_run(c, f->rname, f->run, args);
    fz_fp8_after_run(c, f, args, r, st);
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

/* A weight's kept maps where they are refused (include/moex.h, weight_maps_write): on a packed
 * weight or an output (the call names "maps"), or not 128-byte aligned ("w.maps"); never read. */
static bool maps_fault(fz_case *c, moex_weight *w, const char *name, bool output, uint64_t p) {
    static unsigned char anchor[256];
    const uintptr_t aligned = ((uintptr_t)anchor + 127u) / 128u * 128u;
    const bool misaligned = (p & 1) || (w->ptrs && !output);
    w->maps = (const void *)(aligned + (misaligned ? 16u * (1u + (unsigned)(p >> 1) % 7u) : 0u));
    fz_fault(c, FZ_STRUCT, "%s.maps: %s on a%s %s weight", name, misaligned ? "misaligned" : "128-byte aligned",
             output ? "n output" : "", w->ptrs ? "discrete" : "packed");
    return true;
}

static int64_t gl_T;   /* rows of the case being built (the fault callbacks need it) */

/* One fault kind in four is the fp8 recipe's (fz_fault_fp8), one in eight of the others the
 * weight's maps (maps_fault). */
static bool glf_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_grouped_linear_args *a = (moex_grouped_linear_args *)args;
    if (kind % 4 == 3) return fz_fault_fp8(c, &a->fp8, p);
    if (kind % 32 == 6) return maps_fault(c, &a->w, "w", false, p);
    return bias_or_splits_fault(c, &a->bias_mode, gl_T, kind, p);
}

static bool gld_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_grouped_linear_dgrad_args *a = (moex_grouped_linear_dgrad_args *)args;
    if (kind % 4 == 3) return fz_fault_fp8(c, &a->fp8, p);
    if (kind % 32 == 6) return maps_fault(c, &a->w, "w", false, p);
    return bias_or_splits_fault(c, &a->bias_mode, gl_T, kind, p);
}

static bool glw_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_grouped_linear_wgrad_args *a = (moex_grouped_linear_wgrad_args *)args;
    if (kind % 4 == 3) return fz_fault_fp8(c, &a->fp8, p);
    if (kind % 32 == 6) return maps_fault(c, &a->dw, "dw", true, p);
    if (kind % 3 == 0) {
        a->dw_mode = (moex_grad_mode)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: dw_mode = %d", (int)a->dw_mode);
        return true;
    }
    return fz_fault_split_values(c, fz_find(c, "splits"), gl_T, p);
}

/* FP8 on the CPU (run mode): T K N and G N K at most 2^17 (fz_fp8_cap). */
static void gl_cap(fz_case *c, const moex_fp8_recipe *r, int64_t *G, int64_t *T, int64_t *K, int64_t *N) {
    int64_t *const tkn[3] = {T, K, N}, *const gnk[3] = {G, N, K};
    static const int64_t lo_tkn[3] = {0, 1, 1}, lo_gnk[3] = {1, 1, 1};
    fz_fp8_cap(c, r, tkn, lo_tkn, 3, 1);
    fz_fp8_cap(c, r, gnk, lo_gnk, 3, 1);
}

void fz_op_gl_fwd(fz_case *c) {
    moex_grouped_linear_args *a = (moex_grouped_linear_args *)fz_alloc(c, sizeof *a);
    int64_t G = fz_dim(c, 1, 6, 40), T = fz_dim(c, 0, 24, 300), K = fz_dim(c, 1, 24, 300), N = fz_dim(c, 1, 24, 96);
    a->fp8 = fz_fp8_recipe(c);
    gl_cap(c, &a->fp8, &G, &T, &K, &N);
    const moex_dtype dt = fz_act_dtype(c), bdt = fz_chance(c, 128) ? F32 : dt;
    a->bias_mode = (moex_bias_mode)fz_pick(c, 3);
    int ts;
    const int64_t S = splits_reg(c, &a->splits, G, T, &ts);
    gl_T = T;
    a->x = moex_tensor_2d(NULL, dt, T, K);
    fz_tail(c, fz_tensor_reg(c, "x", &a->x, FZ_IN, FZ_REQUIRED, DT(dt)), S);
    a->w = moex_weight_packed(moex_tensor_3d(NULL, dt, G, N, K));
    fz_weight_reg(c, "w", &a->w, FZ_IN, FZ_REQUIRED | FZ_DISCRETE_OK, DT(dt));
    c->fp8_w[0] = &a->w;
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
    fz_layer_flow(c, &glf_fns, a, glf_fault, &a->fp8);
}

void fz_op_gl_dgrad(fz_case *c) {
    moex_grouped_linear_dgrad_args *a = (moex_grouped_linear_dgrad_args *)fz_alloc(c, sizeof *a);
    int64_t G = fz_dim(c, 1, 6, 40), T = fz_dim(c, 0, 24, 300), K = fz_dim(c, 1, 24, 300), N = fz_dim(c, 1, 24, 96);
    a->fp8 = fz_fp8_recipe(c);
    gl_cap(c, &a->fp8, &G, &T, &K, &N);
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
    c->fp8_w[0] = &a->w;
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
    fz_layer_flow(c, &gld_fns, a, gld_fault, &a->fp8);
}

void fz_op_gl_wgrad(fz_case *c) {
    moex_grouped_linear_wgrad_args *a = (moex_grouped_linear_wgrad_args *)fz_alloc(c, sizeof *a);
    int64_t G = fz_dim(c, 1, 6, 40), T = fz_dim(c, 0, 24, 300), K = fz_dim(c, 1, 24, 300), N = fz_dim(c, 1, 24, 96);
    a->fp8 = fz_fp8_recipe(c);
    gl_cap(c, &a->fp8, &G, &T, &K, &N);
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
    fz_layer_flow(c, &glw_fns, a, glw_fault, &a->fp8);
}
