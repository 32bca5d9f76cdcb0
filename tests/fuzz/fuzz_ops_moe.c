/*
 * fuzz_ops_moe.c - argument builders of the moex API fuzzer for the MoE layer (saved size,
 * forward workspace, forward, backward workspace, backward, with `saved` corrupted or
 * swapped in between) and for the context calls (moex_context_check_splits,
 * moex_context_set_num_threads, moex_context_create and the small helpers). The fault list
 * is in fuzz.h.
 */
#include "fuzz.h"

#include <stdio.h>
#include <string.h>

FZ_OPFNS(moef_fns, moe_layer_forward, moex_moe_layer_args);
FZ_OPFNS(moeb_fns, moe_layer_backward, moex_moe_layer_grad_args);

static moex_status saved_q(moex_context *x, const void *a, size_t *b) {
    return moex_moe_layer_saved_size(x, (const moex_moe_layer_args *)a, b);
}

/* The case being built (the fault callbacks need its dims). */
static struct {
    int64_t T, H, E, F, k;
    moex_dtype dt;
    int any_dw;
} moe;

/* a + b and a * b on sizes, saturating at SIZE_MAX. */
static size_t sz_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t sz_mul(int64_t a, int64_t b, size_t e) {
    if (a <= 0 || b <= 0) return 0;
    if ((uint64_t)a > SIZE_MAX / (uint64_t)b) return SIZE_MAX;
    const size_t n = (size_t)a * (size_t)b;
    return n > SIZE_MAX / e ? SIZE_MAX : n * e;
}

/* docs/ops.md 8.1: `saved` holds the f32 logits [T, E], probs, ids, row_map, probs_p [T*k],
 * splits [E] and h [T*k, 2F] (z and xp may be recomputed): its size is at least that. */
static size_t saved_lower_bound(void) {
    const int64_t rows = fz_mul_sat(moe.T, moe.k);
    size_t b = sz_mul(moe.T, moe.E, 4);
    b = sz_add(b, sz_mul(rows, 4, 4));   /* probs, ids, row_map, probs_p */
    b = sz_add(b, sz_mul(moe.E, 1, 8));
    b = sz_add(b, sz_mul(rows, fz_mul_sat(moe.F, 2), moex_dtype_size(moe.dt)));
    return b;
}

/* The layer's own faults, in the forward's arguments (forward or backward call). */
static bool layer_fault(fz_case *c, moex_moe_layer_args *f, unsigned kind, uint64_t p) {
    switch (kind % 5) {
    case 0: {
        const int64_t v[4] = {0, -1, moe.E > INT32_MAX ? INT64_MAX : moe.E + 1 + (int64_t)((p >> 8) % 3), INT32_MIN};
        int64_t t = v[p % 4];
        if (t > INT32_MAX) t = -1;
        const int32_t old = f->topk;
        f->topk = (int32_t)t;
        fz_fault(c, FZ_STRUCT, "topk %d -> %d (E = %lld)", (int)old, (int)f->topk, (long long)moe.E);
        return true;
    }
    case 1:
        f->score = (moex_router_score)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: score = %d", (int)f->score);
        return true;
    case 2:
        f->norm = (moex_router_norm)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: norm = %d", (int)f->norm);
        return true;
    case 3:
        f->b2_mode = (moex_bias_mode)fz_bad_enum(c, p, 3);
        fz_fault(c, FZ_STRUCT, "enum: b2_mode = %d", (int)f->b2_mode);
        return true;
    default: return fz_fault_glu(c, &f->glu, moe.F, kind >> 8, p);
    }
}

/* saved NULL or short (both directions, both backends). */
static bool saved_size_fault(fz_case *c, bool backward, moex_moe_layer_args *f, int which, uint64_t p) {
    if (c->saved_need == 0 || c->saved_fault || (c->alias.active && c->alias.tkind == FZ_REG_SAVED)) return false;
    c->saved_fault = which;
    c->saved_param = p;
    if (backward) {   /* the forward's buffer, passed wrong */
        if (which == 1)
            f->saved = NULL;
        else
            f->saved_bytes = c->saved_need - 1 - (size_t)(p >> 8) % c->saved_need;
    }
    fz_fault(c, FZ_RUNONLY, "saved %s (moex_moe_layer_saved_size asks for %zu)", which == 1 ? "NULL" : "short",
             c->saved_need);
    return true;
}

static bool moef_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_moe_layer_args *f = (moex_moe_layer_args *)args;
    if (kind % 8 == 7) return fz_fault_fp8(c, &f->fp8, p);   /* the fp8 recipe: one kind in eight */
    switch (kind % 7) {
    case 5: return saved_size_fault(c, false, f, 1, p);
    case 6: return saved_size_fault(c, false, f, 2, p);
    default: return layer_fault(c, f, kind, p);
    }
}

static bool moeb_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_moe_layer_grad_args *g = (moex_moe_layer_grad_args *)args;
    moex_moe_layer_args *f = &g->fwd;
    if (kind % 8 == 7) return fz_fault_fp8(c, &f->fp8, p);   /* the fp8 recipe (fwd.fp8): one kind in eight */
    switch (kind % 11) {
    case 5:
        if (!moe.any_dw) return false;   /* dw_mode matters with a weight gradient */
        g->dw_mode = (moex_grad_mode)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: dw_mode = %d", (int)g->dw_mode);
        return true;
    case 6: return saved_size_fault(c, true, f, 1, p);
    case 7: return saved_size_fault(c, true, f, 2, p);
    case 8: {   /* a saved buffer no forward wrote (cpu: the backward checks) */
        if (c->cuda || c->saved_fault || !f->saved || (c->alias.active && c->alias.tkind == FZ_REG_SAVED)) return false;
        c->saved_fault = 3;
        void *fresh = NULL;
        size_t bytes = 0;
        const int old = c->saved_buf;
        c->saved_param = p;
        fz_saved(c, &fresh, &bytes);
        if (old >= 0) c->bufs[old].kind = FZ_B_OLD;
        if (p & 1) {   /* zeros instead of random bytes */
            unsigned char *z = (unsigned char *)fz_alloc(c, bytes ? bytes : 1);
            fz_mem_put(c->cuda, fresh, z, bytes);
        }
        f->saved = fresh;
        f->saved_bytes = bytes;
        fz_fault(c, FZ_RUNONLY, "saved never written by a forward (%s; cpu)", p & 1 ? "zeros" : "random bytes");
        return true;
    }
    case 9: {   /* the forward ran with other options (cpu: the backward checks) */
        if (c->cuda || c->saved_fault) return false;
        if (p & 1) {
            if (f->score != MOEX_ROUTER_SOFTMAX && f->score != MOEX_ROUTER_SIGMOID) return false;
            f->score = f->score == MOEX_ROUTER_SOFTMAX ? MOEX_ROUTER_SIGMOID : MOEX_ROUTER_SOFTMAX;
        } else {
            if (f->norm != MOEX_ROUTER_RENORM && f->norm != MOEX_ROUTER_NO_RENORM) return false;
            f->norm = f->norm == MOEX_ROUTER_RENORM ? MOEX_ROUTER_NO_RENORM : MOEX_ROUTER_RENORM;
        }
        c->saved_fault = 4;
        fz_fault(c, FZ_RUNONLY, "saved holds a forward with another %s (cpu)", p & 1 ? "score" : "norm");
        return true;
    }
    case 10: {   /* bytes of saved flipped between forward and backward: validity unknown */
        if (c->cuda || c->saved_fault || c->saved_buf < 0) return false;
        fz_buf *b = &c->bufs[c->saved_buf];
        if (b->bytes == 0) return false;
        unsigned char *h = (unsigned char *)fz_alloc(c, b->bytes);
        fz_mem_get(c->cuda, h, (unsigned char *)b->mem + b->lead, b->bytes);
        const int n = 1 + (int)((p >> 8) % 4);
        char what[96] = "";
        for (int i = 0; i < n; i++) {
            const size_t at = (size_t)(fz_rand(c) % b->bytes) & ~(size_t)3;
            const uint32_t v = (p >> 10) & 1 ? (uint32_t)fz_rand(c) : (uint32_t)1 << (fz_rand(c) % 32);
            for (int j = 0; j < 4 && at + (size_t)j < b->bytes; j++) h[at + (size_t)j] ^= (unsigned char)(v >> (8 * j));
            size_t len = strlen(what);
            snprintf(what + len, sizeof what - len, "%s%zu", i ? "," : "", at);
        }
        fz_mem_put(c->cuda, (unsigned char *)b->mem + b->lead, h, b->bytes);
        c->saved_fault = 5;
        fz_fault(c, FZ_CHAOS, "saved bytes flipped at offsets %s (cpu)", what);
        return true;
    }
    default: return layer_fault(c, f, kind, p);
    }
}

void fz_op_moe(fz_case *c) {
    moex_moe_layer_grad_args *g = (moex_moe_layer_grad_args *)fz_alloc(c, sizeof *g);
    moex_moe_layer_args *f = &g->fwd;
    const int64_t T = fz_dim(c, 0, 12, 64), H = fz_dim(c, 1, 16, 64), E = fz_dim(c, 1, 6, 16);
    int64_t F = fz_dim(c, 1, 8, 32);
    const int64_t kmax = E < INT32_MAX ? E : INT32_MAX;
    int64_t k = 1 + (int64_t)(fz_u64(c) % (uint64_t)kmax);
    if (!c->huge) k = 1 + (k - 1) % (kmax < 4 ? kmax : 4);
    f->glu = fz_glu_params(c, &F);
    const moex_dtype dt = fz_act_dtype(c), b1dt = fz_chance(c, 128) ? F32 : dt, b2dt = fz_chance(c, 128) ? F32 : dt;
    const uint8_t opt = fz_u8(c);
    f->topk = (int32_t)k;
    f->score = (moex_router_score)(opt & 1);
    f->norm = (moex_router_norm)((opt >> 1) & 1);
    f->b2_mode = (moex_bias_mode)((opt >> 2) % 3);
    const bool b1 = (opt & 32) != 0;
    moe.T = T, moe.H = H, moe.E = E, moe.F = F, moe.k = k, moe.dt = dt, moe.any_dw = 0;
    const int64_t twoF = fz_mul_sat(F, 2), rows = fz_mul_sat(T, k);
    fz_note(c, "T=%lld H=%lld E=%lld F=%lld k=%lld %s score=%d norm=%d b1=%d b2_mode=%d glu kind %d layout %d",
            (long long)T, (long long)H, (long long)E, (long long)F, (long long)k, moex_dtype_name(dt), (int)f->score,
            (int)f->norm, b1, (int)f->b2_mode, (int)f->glu.kind, (int)f->glu.layout);
    /* moex.h: E <= INT32_MAX, T*k <= INT32_MAX, and no intermediate past 2^60 elements */
    if (E > INT32_MAX) fz_fault(c, FZ_STRUCT, "E = %lld > INT32_MAX", (long long)E);
    if (rows > INT32_MAX) fz_fault(c, FZ_STRUCT, "T*k = %lld > INT32_MAX", (long long)rows);
    if (fz_mul_sat(T, E) > FZ_MAX_ELEMS) fz_fault(c, FZ_STRUCT, "logits [T, E] past 2^60 elements");
    if (rows <= INT32_MAX && fz_mul_sat(rows, H) > FZ_MAX_ELEMS)
        fz_fault(c, FZ_STRUCT, "xp [T*k, H] = [%lld, %lld] past 2^60 elements", (long long)rows, (long long)H);
    if (rows <= INT32_MAX && fz_mul_sat(rows, twoF) > FZ_MAX_ELEMS)
        fz_fault(c, FZ_STRUCT, "h [T*k, 2F] = [%lld, %lld] past 2^60 elements", (long long)rows, (long long)twoF);

    f->x = moex_tensor_2d(NULL, dt, T, H);
    const int tx = fz_tensor_reg(c, "x", &f->x, FZ_IN, FZ_REQUIRED, DT(dt));
    f->router_w = moex_tensor_2d(NULL, dt, E, H);
    fz_tensor_reg(c, "router_w", &f->router_w, FZ_IN, FZ_REQUIRED, DT(dt));
    f->w1 = moex_weight_packed(moex_tensor_3d(NULL, dt, E, twoF, H));
    fz_weight_reg(c, "w1", &f->w1, FZ_IN, FZ_REQUIRED | FZ_DISCRETE_OK, DT(dt));
    f->b1 = moex_tensor_2d(NULL, b1dt, E, twoF);
    if (!b1) f->b1.ndim = 0;
    fz_tensor_reg(c, "b1", &f->b1, FZ_IN, 0, DT(dt) | DT(F32));
    f->w2 = moex_weight_packed(moex_tensor_3d(NULL, dt, E, H, F));
    fz_weight_reg(c, "w2", &f->w2, FZ_IN, FZ_REQUIRED | FZ_DISCRETE_OK, DT(dt));
    c->fp8_w[0] = &f->w1, c->fp8_w[1] = &f->w2;
    f->b2 = moex_tensor_2d(NULL, b2dt, E, H);
    fz_tensor_reg(c, "b2", &f->b2, FZ_IN, f->b2_mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : FZ_REQUIRED, DT(dt) | DT(F32));
    f->y = moex_tensor_2d(NULL, dt, T, H);
    const int ty = fz_tensor_reg(c, "y", &f->y, FZ_OUT, FZ_REQUIRED, DT(dt));
    /* read last: the shapes are small without a cap, and inputs that end here (issue 13's
     * seeds) keep their meaning with the recipe OFF */
    f->fp8 = fz_fp8_recipe(c);

    fz_materialize(c);
    if (c->legal_alias && !c->huge) fz_legal_alias(c);
    c->has_saved = 1;
    c->saved_out = 1;
    size_t sv = 0, fw = 0;
    moex_status st = fz_query(c, moef_fns.qname, moef_fns.query, f, &fw);
    if (st != MOEX_OK && !c->huge) return;
    c->ws_need = st == MOEX_OK ? fw : 0;
    st = fz_query(c, "moex_moe_layer_saved_size", saved_q, f, &sv);
    if (st == MOEX_OK && sv < saved_lower_bound())
        fz_fail(c, "query", "moex_moe_layer_saved_size gives %zu bytes, less than the %zu that saved holds "
                "(docs/ops.md 8.1: logits, probs, ids, splits, row_map, probs_p, h)", sv, saved_lower_bound());
    if (st != MOEX_OK && !c->huge) return;
    c->saved_need = st == MOEX_OK ? sv : 0;

    const bool fwd_faults = c->huge || (fz_u8(c) & 1);
    if (fwd_faults) {
        fz_faults(c, moef_fault, f);
        if (c->nfaults) {
            size_t b = 0;
            /* the saved size does not read y: faults of y, and x's T against y's, are unseen */
            for (int i = 0; i < c->nfaults; i++)
                c->faults[i].blind = c->faults[i].ti == ty || (c->faults[i].ti == tx && c->faults[i].dim == 0);
            fz_query(c, "moex_moe_layer_saved_size", saved_q, f, &b);
            for (int i = 0; i < c->nfaults; i++) c->faults[i].blind = 0;
            fz_query(c, moef_fns.qname, moef_fns.query, f, &b);
        }
        if (c->huge && !fz_must_fail(c)) return;
        fz_saved(c, &f->saved, &f->saved_bytes);
        fz_workspace(c);
        fz_run(c, moef_fns.rname, moef_fns.run, f);
        return;
    }
    fz_saved(c, &f->saved, &f->saved_bytes);
    fz_workspace(c);
    st = fz_run(c, moef_fns.rname, moef_fns.run, f);
    fz_fp8_after_run(c, &moef_fns, f, &f->fp8, st);
    if (st != MOEX_OK) return;

    /* the backward, from the forward's saved */
    c->saved_out = 0;
    fz_role_set(c, ty, FZ_KEEP, FZ_NOFAULT);   /* fwd.y is not read by the backward */
    const uint8_t o2 = fz_u8(c);
    g->dw_mode = (moex_grad_mode)(o2 & 1);
    const unsigned dwts = g->dw_mode == MOEX_GRAD_ACCUMULATE ? DT(F32) : DT(F32) | DT(dt);
    const fz_role dwrole = g->dw_mode == MOEX_GRAD_ACCUMULATE ? FZ_ACC : FZ_OUT;
    const moex_dtype wdt = g->dw_mode == MOEX_GRAD_WRITE && (o2 & 2) ? dt : F32;
    const bool dx = o2 & 4, drw = o2 & 8, dw1 = o2 & 16, dw2 = o2 & 32, db1 = o2 & 64,
               db2 = f->b2_mode != MOEX_BIAS_NONE && (o2 & 128);
    moe.any_dw = drw || dw1 || dw2;
    g->dy = moex_tensor_2d(NULL, dt, T, H);
    fz_tensor_reg(c, "dy", &g->dy, FZ_IN, FZ_REQUIRED, DT(dt));
    g->dx = moex_tensor_2d(NULL, dt, T, H);
    if (!dx) g->dx.ndim = 0;
    fz_tensor_reg(c, "dx", &g->dx, FZ_OUT, 0, DT(dt));
    g->drouter_w = moex_tensor_2d(NULL, wdt, E, H);
    if (!drw) g->drouter_w.ndim = 0;
    fz_tensor_reg(c, "drouter_w", &g->drouter_w, dwrole, 0, dwts);
    g->dw1 = moex_weight_packed(moex_tensor_3d(NULL, wdt, E, twoF, H));
    if (!dw1) g->dw1.t.ndim = 0;
    fz_weight_reg(c, "dw1", &g->dw1, dwrole, FZ_DISCRETE_OK, dwts);
    g->dw2 = moex_weight_packed(moex_tensor_3d(NULL, wdt, E, H, F));
    if (!dw2) g->dw2.t.ndim = 0;
    fz_weight_reg(c, "dw2", &g->dw2, dwrole, FZ_DISCRETE_OK, dwts);
    g->db1 = moex_tensor_2d(NULL, F32, E, twoF);
    if (!db1) g->db1.ndim = 0;
    fz_tensor_reg(c, "db1", &g->db1, FZ_OUT, 0, DT(dt) | DT(F32));
    g->db2 = moex_tensor_2d(NULL, F32, E, H);
    if (!db2 && f->b2_mode != MOEX_BIAS_NONE) g->db2.ndim = 0;
    fz_tensor_reg(c, "db2", &g->db2, FZ_OUT, f->b2_mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : 0, DT(dt) | DT(F32));
    fz_note(c, " | backward dw_mode=%d dW %s dx=%d drouter_w=%d dw1=%d dw2=%d db1=%d db2=%d", (int)g->dw_mode,
            moex_dtype_name(wdt), dx, drw, dw1, dw2, db1, db2);
    fz_materialize(c);
    size_t bw = 0;
    if (fz_query(c, moeb_fns.qname, moeb_fns.query, g, &bw) != MOEX_OK) return;
    c->ws_need = bw;
    fz_faults(c, moeb_fault, g);
    if (c->nfaults) {
        size_t b = 0;
        fz_query(c, moeb_fns.qname, moeb_fns.query, g, &b);
    }
    fz_workspace(c);
    fz_fp8_after_run(c, &moeb_fns, g, &f->fp8, fz_run(c, moeb_fns.rname, moeb_fns.run, g));
}

/* ---- context calls ------------------------------------------------------------------------- */

void fz_op_context(fz_case *c) {
    const uint8_t b = fz_u8(c), b2 = fz_u8(c);
    const unsigned OK = FZ_BIT(MOEX_OK), BAD = FZ_BIT(MOEX_ERR_INVALID_ARG);
    switch (b % 6) {
    case 0:
        fz_note(c, "moex_context_check_splits(ctx)");
        fz_call_begin(c, "moex_context_check_splits", FZ_K_CTX, FZ_V_NORMAL);
        fz_call_end(c, moex_context_check_splits(fz_g.ctx, NULL), NULL, OK);
        break;
    case 1:
        fz_note(c, "moex_context_check_splits(NULL)");
        fz_call_begin(c, "moex_context_check_splits", FZ_K_CTX, FZ_V_NULL_CTX);
        fz_call_end(c, moex_context_check_splits(NULL, NULL), NULL, BAD);
        break;
    case 2: {
        const int n = b2 < 200 ? 1 + b2 % 4 : (int)(int8_t)b2 <= 0 ? (int)(int8_t)b2 : 0;
        fz_note(c, "moex_context_set_num_threads(ctx, %d)", n);
        fz_call_begin(c, "moex_context_set_num_threads", FZ_K_CTX, FZ_V_NORMAL);
        fz_call_end(c, moex_context_set_num_threads(fz_g.ctx, n), NULL, n >= 1 ? OK : BAD);
        break;
    }
    case 3:
        fz_note(c, "moex_context_set_num_threads(NULL, %d)", 1 + b2 % 4);
        fz_call_begin(c, "moex_context_set_num_threads", FZ_K_CTX, FZ_V_NULL_CTX);
        fz_call_end(c, moex_context_set_num_threads(NULL, 1 + b2 % 4), NULL, BAD);
        break;
    case 4: {   /* moex_context_create refusals: the message is moex_last_error(NULL) */
        moex_context *x = (moex_context *)c;   /* must come back NULL */
        const int v = b2 % 4;
        static const int backends[3] = {2, -1, 0x7FFFFFFF};
        fz_note(c, "moex_context_create refusal %d", v);
        fz_call_begin(c, "moex_context_create", FZ_K_CTX, FZ_V_NULL_CTX);
        moex_status st = v == 0   ? moex_context_create(NULL, MOEX_BACKEND_CPU, 0)
                         : v == 1 ? moex_context_create(&x, (moex_backend)backends[(b2 >> 2) % 3], 0)
                         : v == 2 ? moex_context_create(&x, MOEX_BACKEND_CPU, 1 + (b2 >> 2))
                                  : moex_context_create(&x, MOEX_BACKEND_CUDA, -1 - (b2 >> 2));
        fz_call_end(c, st, NULL, BAD);
        if (v != 0 && x != NULL) fz_fail(c, "context", "a refused moex_context_create left *out = %p", (void *)x);
        break;
    }
    default: {   /* a fresh CPU context, the helpers */
        moex_context *x = NULL;
        fz_note(c, "moex_context_create(CPU) and the helpers");
        fz_call_begin(c, "moex_context_create", FZ_K_CTX, FZ_V_NULL_CTX);
        fz_call_end(c, moex_context_create(&x, MOEX_BACKEND_CPU, 0), NULL, OK);
        if (!x || moex_context_backend(x) != MOEX_BACKEND_CPU)
            fz_fail(c, "context", "a CPU context reports backend %d", x ? (int)moex_context_backend(x) : -1);
        if (moex_last_error(x) == NULL || moex_last_error(x)[0] != '\0')
            fz_fail(c, "context", "a new context has an error message");
        moex_context_destroy(x);
        moex_context_destroy(NULL);
        const int32_t sv = (int32_t)(b2 % 12) - 2;
        if (!moex_status_string((moex_status)sv) || !moex_status_string((moex_status)sv)[0])
            fz_fail(c, "context", "moex_status_string(%d) is NULL or empty", (int)sv);
        const size_t ds = moex_dtype_size((moex_dtype)sv);
        if ((sv >= 0 && sv <= MOEX_DTYPE_E8M0) != (ds != 0))
            fz_fail(c, "context", "moex_dtype_size(%d) = %zu", (int)sv, ds);
        if (moex_version() != MOEX_VERSION_NUMBER || !moex_version_string())
            fz_fail(c, "context", "moex_version %u, header %d", moex_version(), MOEX_VERSION_NUMBER);
        (void)moex_glu_params_default((moex_glu_kind)sv);
        fz_g.stats.calls += 6;
        break;
    }
    }
}
