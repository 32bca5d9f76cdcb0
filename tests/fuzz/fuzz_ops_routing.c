/*
 * fuzz_ops_routing.c - argument builders of the moex API fuzzer for the router (forward,
 * backward), permute (forward, backward) and unpermute (forward, backward): valid shapes,
 * routing ids and row maps, and each operation's own faults (the fault list is in fuzz.h).
 */
#include "fuzz.h"

#include <string.h>

/* ---- router ---------------------------------------------------------------------------------- */

FZ_OPFNS(rf_fns, router_forward, moex_router_args);
FZ_OPFNS(rb_fns, router_backward, moex_router_grad_args);

static int64_t rt_E;

/* topk, score or norm out of range. */
static bool router_enum_fault(fz_case *c, int32_t *topk, moex_router_score *score, moex_router_norm *norm,
                              unsigned kind, uint64_t p) {
    switch (kind % 3) {
    case 0: {
        const int64_t v[5] = {0, -1, rt_E > INT32_MAX ? INT64_MAX : rt_E + 1 + (int64_t)((p >> 8) % 3), INT32_MIN,
                             -(int64_t)((p >> 8) % 1000) - 2};
        int64_t t = v[p % 5];
        if (t > INT32_MAX) t = 0;
        const int32_t old = *topk;
        *topk = (int32_t)t;
        fz_fault(c, FZ_STRUCT, "topk %d -> %d (E = %lld)", (int)old, (int)*topk, (long long)rt_E);
        return true;
    }
    case 1:
        *score = (moex_router_score)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: score = %d", (int)*score);
        return true;
    default:
        *norm = (moex_router_norm)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: norm = %d", (int)*norm);
        return true;
    }
}

static bool rf_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_router_args *a = (moex_router_args *)args;
    return router_enum_fault(c, &a->topk, &a->score, &a->norm, kind, p);
}

static bool rb_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_router_grad_args *a = (moex_router_grad_args *)args;
    if (kind % 4 == 3) return fz_fault_ids(c, fz_find(c, "ids"), rt_E, "ids", p);
    return router_enum_fault(c, &a->topk, &a->score, &a->norm, kind, p);
}

/* T, E, k of a router case (huge mode: E past INT32_MAX is a fault). */
static void router_dims(fz_case *c, int64_t *T, int64_t *E, int32_t *k) {
    *T = fz_dim(c, 0, 24, 300);
    *E = fz_dim(c, 1, 12, 300);
    const int64_t kmax = *E < INT32_MAX ? *E : INT32_MAX;
    *k = (int32_t)(1 + (int64_t)(fz_u64(c) % (uint64_t)kmax));
    if (!c->huge) *k = (int32_t)(1 + (int64_t)((uint64_t)*k % (uint64_t)(kmax < 6 ? kmax : 6)));
    if (*E > INT32_MAX) fz_fault(c, FZ_STRUCT, "E = %lld > INT32_MAX", (long long)*E);
    rt_E = *E;
}

void fz_op_router_fwd(fz_case *c) {
    moex_router_args *a = (moex_router_args *)fz_alloc(c, sizeof *a);
    int64_t T, E;
    router_dims(c, &T, &E, &a->topk);
    const moex_dtype dt = fz_chance(c, 128) ? F32 : BF16;
    a->score = (moex_router_score)fz_pick(c, 2);
    a->norm = (moex_router_norm)fz_pick(c, 2);
    a->logits = moex_tensor_2d(NULL, dt, T, E);
    fz_tensor_reg(c, "logits", &a->logits, FZ_IN, FZ_REQUIRED | FZ_FREE1, DT(F32) | DT(BF16));
    a->probs = moex_tensor_2d(NULL, F32, T, a->topk);
    fz_tensor_reg(c, "probs", &a->probs, FZ_OUT, FZ_REQUIRED, DT(F32));
    a->ids = moex_tensor_2d(NULL, I32, T, a->topk);
    fz_tensor_reg(c, "ids", &a->ids, FZ_OUT, FZ_REQUIRED, DT(I32));
    fz_note(c, "T=%lld E=%lld k=%d %s score=%d norm=%d", (long long)T, (long long)E, (int)a->topk, moex_dtype_name(dt),
            (int)a->score, (int)a->norm);
    fz_flow(c, &rf_fns, a, rf_fault);
}

void fz_op_router_bwd(fz_case *c) {
    moex_router_grad_args *a = (moex_router_grad_args *)fz_alloc(c, sizeof *a);
    int64_t T, E;
    router_dims(c, &T, &E, &a->topk);
    const moex_dtype dt = fz_chance(c, 128) ? F32 : BF16;
    a->score = (moex_router_score)fz_pick(c, 2);
    a->norm = (moex_router_norm)fz_pick(c, 2);
    const int64_t n = fz_mul_sat(T, a->topk);
    int32_t *ids = fz_i32s(c, n);
    if (ids) {
        for (int64_t t = 0; t < T; t++)   /* distinct per token, like the forward's, or any */
            for (int64_t j = 0; j < a->topk; j++)
                ids[t * a->topk + j] = (fz_rand(c) & 1) && a->topk <= E
                                           ? (int32_t)((t + j * (1 + (int64_t)(fz_rand(c) % 2))) % E)
                                           : (int32_t)(fz_rand(c) % (uint64_t)E);
    }
    a->logits = moex_tensor_2d(NULL, dt, T, E);
    fz_tensor_reg(c, "logits", &a->logits, FZ_IN, FZ_REQUIRED, DT(dt));
    a->ids = moex_tensor_2d(NULL, I32, T, a->topk);
    fz_set_i32(c, fz_tensor_reg(c, "ids", &a->ids, FZ_IN, FZ_REQUIRED, DT(I32)), ids, n);
    a->dprobs = moex_tensor_2d(NULL, F32, T, a->topk);
    fz_tensor_reg(c, "dprobs", &a->dprobs, FZ_IN, FZ_REQUIRED, DT(F32));
    a->dlogits = moex_tensor_2d(NULL, dt, T, E);
    fz_tensor_reg(c, "dlogits", &a->dlogits, FZ_OUT, FZ_REQUIRED, DT(dt));
    fz_note(c, "T=%lld E=%lld k=%d %s score=%d norm=%d", (long long)T, (long long)E, (int)a->topk, moex_dtype_name(dt),
            (int)a->score, (int)a->norm);
    fz_flow(c, &rb_fns, a, rb_fault);
}

/* ---- permute and unpermute ------------------------------------------------------------------ */

FZ_OPFNS(pf_fns, permute_forward, moex_permute_args);
FZ_OPFNS(pb_fns, permute_backward, moex_permute_grad_args);
FZ_OPFNS(uf_fns, unpermute_forward, moex_unpermute_args);
FZ_OPFNS(ub_fns, unpermute_backward, moex_unpermute_grad_args);

static int64_t pm_rows;

/* T, H, k; rows = T*k (saturated). */
static void perm_dims(fz_case *c, int64_t *T, int64_t *H, int64_t *k) {
    *T = fz_dim(c, 0, 24, 300);
    *H = fz_dim(c, 1, 24, 96);
    *k = fz_dim(c, 1, 4, 16);
    pm_rows = fz_mul_sat(*T, *k);
}

/* A row map of rows entries: a permutation of [0, rows) (or, when `any`, values in range). */
static int32_t *row_map_values(fz_case *c, int64_t rows, bool any) {
    int32_t *rm = rows <= INT32_MAX ? fz_i32s(c, rows) : NULL;
    if (!rm) return NULL;
    for (int64_t i = 0; i < rows; i++) rm[i] = (int32_t)i;
    if (any && (fz_rand(c) & 3) == 0) {
        for (int64_t i = 0; i < rows; i++) rm[i] = (int32_t)(fz_rand(c) % (uint64_t)rows);
        return rm;
    }
    for (int64_t i = rows - 1; i > 0; i--) {
        const int64_t j = (int64_t)(fz_rand(c) % (uint64_t)(i + 1));
        const int32_t t = rm[i];
        rm[i] = rm[j], rm[j] = t;
    }
    return rm;
}

static bool pf_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_permute_args *a = (moex_permute_args *)args;
    switch (kind % 3) {
    case 0: {
        static const int32_t v[3] = {0, -1, INT32_MIN};
        a->num_experts = v[p % 3];
        fz_fault(c, FZ_STRUCT, "num_experts = %d", (int)a->num_experts);
        return true;
    }
    case 1: {   /* num_experts != len(splits) */
        if (c->used_mismatch || a->num_experts < 1) return false;
        const int32_t old = a->num_experts;
        a->num_experts = old > 1 && (p & 1) ? old - 1 : old == INT32_MAX ? old - 1 : old + 1;
        c->used_mismatch = 1;
        fz_fault(c, FZ_STRUCT, "num_experts %d -> %d, splits has %d", (int)old, (int)a->num_experts, (int)old);
        return true;
    }
    default: return fz_fault_ids(c, fz_find(c, "ids"), a->num_experts, "ids", p);
    }
}

void fz_op_permute_fwd(fz_case *c) {
    moex_permute_args *a = (moex_permute_args *)fz_alloc(c, sizeof *a);
    int64_t T, H, k;
    perm_dims(c, &T, &H, &k);
    int64_t E = fz_dim(c, 1, 8, 64);
    if (E > INT32_MAX) E = INT32_MAX;
    a->num_experts = (int32_t)E;
    const moex_dtype dt = fz_act_dtype(c);
    const bool probs = fz_chance(c, 128);
    if (pm_rows > INT32_MAX) fz_fault(c, FZ_STRUCT, "T*k = %lld*%lld > INT32_MAX", (long long)T, (long long)k);
    int32_t *ids = fz_i32s(c, pm_rows);
    if (ids)
        for (int64_t i = 0; i < pm_rows; i++) ids[i] = (int32_t)(fz_rand(c) % (uint64_t)E);
    a->x = moex_tensor_2d(NULL, dt, T, H);
    fz_tensor_reg(c, "x", &a->x, FZ_IN, FZ_REQUIRED, DT(dt));
    a->ids = moex_tensor_2d(NULL, I32, T, k);
    /* with T = 0, k is only what ids (and probs) say: free unless probs says it too */
    fz_set_i32(c, fz_tensor_reg(c, "ids", &a->ids, FZ_IN, FZ_REQUIRED | (T == 0 && !probs ? FZ_FREE1 : 0), DT(I32)),
               ids, pm_rows);
    a->probs = moex_tensor_2d(NULL, F32, T, k);
    if (!probs) a->probs.ndim = 0;
    fz_tensor_reg(c, "probs", &a->probs, FZ_IN, 0, DT(F32));
    a->xp = moex_tensor_2d(NULL, dt, pm_rows, H);
    fz_tensor_reg(c, "xp", &a->xp, FZ_OUT, FZ_REQUIRED, DT(dt));
    a->probs_p = moex_tensor_1d(NULL, F32, pm_rows);
    fz_tensor_reg(c, "probs_p", &a->probs_p, FZ_OUT, probs ? FZ_REQUIRED : FZ_FORBIDDEN, DT(F32));
    a->splits = moex_tensor_1d(NULL, I64, E);
    fz_tensor_reg(c, "splits", &a->splits, FZ_OUT, FZ_REQUIRED, DT(I64));
    a->row_map = moex_tensor_1d(NULL, I32, pm_rows);
    fz_tensor_reg(c, "row_map", &a->row_map, FZ_OUT, FZ_REQUIRED, DT(I32));
    fz_note(c, "T=%lld H=%lld k=%lld E=%lld %s probs=%d", (long long)T, (long long)H, (long long)k, (long long)E,
            moex_dtype_name(dt), probs);
    fz_flow(c, &pf_fns, a, pf_fault);
}

static bool rowmap_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    (void)args, (void)kind;
    return fz_fault_ids(c, fz_find(c, "row_map"), pm_rows, "row_map", p);
}

void fz_op_permute_bwd(fz_case *c) {
    moex_permute_grad_args *a = (moex_permute_grad_args *)fz_alloc(c, sizeof *a);
    int64_t T, H, k;
    perm_dims(c, &T, &H, &k);
    const moex_dtype dt = fz_act_dtype(c);
    const bool dprobs = fz_chance(c, 128);
    a->row_map = moex_tensor_1d(NULL, I32, pm_rows);
    fz_set_i32(c, fz_tensor_reg(c, "row_map", &a->row_map, FZ_IN, FZ_REQUIRED, DT(I32)),
               row_map_values(c, pm_rows, true), pm_rows);
    a->dxp = moex_tensor_2d(NULL, dt, pm_rows, H);
    fz_tensor_reg(c, "dxp", &a->dxp, FZ_IN, FZ_REQUIRED, DT(dt));
    a->dprobs_p = moex_tensor_1d(NULL, F32, pm_rows);
    if (!dprobs) a->dprobs_p.ndim = 0;
    fz_tensor_reg(c, "dprobs_p", &a->dprobs_p, FZ_IN, 0, DT(F32));
    a->dx = moex_tensor_2d(NULL, dt, T, H);   /* k = len(row_map) / T: another T can be valid */
    fz_tensor_reg(c, "dx", &a->dx, FZ_OUT, FZ_REQUIRED | (dprobs ? 0 : FZ_FREE0), DT(dt));
    a->dprobs = moex_tensor_2d(NULL, F32, T, k);
    /* with T = 0, dprobs [0, k] names k, which nothing else checks */
    fz_tensor_reg(c, "dprobs", &a->dprobs, FZ_OUT, (dprobs ? FZ_REQUIRED : FZ_FORBIDDEN) | (T == 0 ? FZ_FREE1 : 0),
                  DT(F32));
    fz_note(c, "T=%lld H=%lld k=%lld %s dprobs=%d", (long long)T, (long long)H, (long long)k, moex_dtype_name(dt), dprobs);
    fz_flow(c, &pb_fns, a, rowmap_fault);
}

void fz_op_unpermute_fwd(fz_case *c) {
    moex_unpermute_args *a = (moex_unpermute_args *)fz_alloc(c, sizeof *a);
    int64_t T, H, k;
    perm_dims(c, &T, &H, &k);
    const moex_dtype dt = fz_act_dtype(c);
    a->row_map = moex_tensor_1d(NULL, I32, pm_rows);
    fz_set_i32(c, fz_tensor_reg(c, "row_map", &a->row_map, FZ_IN, FZ_REQUIRED, DT(I32)),
               row_map_values(c, pm_rows, true), pm_rows);
    a->yp = moex_tensor_2d(NULL, dt, pm_rows, H);
    fz_tensor_reg(c, "yp", &a->yp, FZ_IN, FZ_REQUIRED, DT(dt));
    a->y = moex_tensor_2d(NULL, dt, T, H);
    fz_tensor_reg(c, "y", &a->y, FZ_OUT, FZ_REQUIRED | FZ_FREE0, DT(dt));
    fz_note(c, "T=%lld H=%lld k=%lld %s", (long long)T, (long long)H, (long long)k, moex_dtype_name(dt));
    fz_flow(c, &uf_fns, a, rowmap_fault);
}

static bool ub_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    (void)args;
    const int tr = fz_find(c, "row_map");
    fz_tensor *R = &c->tens[tr];
    if (kind % 3 == 2) {   /* a repeated row: the CPU refuses it (CUDA does not check) */
        if (c->cuda || !R->i32 || R->nints < 2 || R->touched) return false;
        const int64_t i = (int64_t)(p % (uint64_t)R->nints), j = (i + 1 + (int64_t)((p >> 20) % (uint64_t)(R->nints - 1))) % R->nints;
        R->i32[i] = R->i32[j];
        R->touched = R->refill = 1;
        fz_fault(c, FZ_IDS, "row_map dup: row_map[%lld] = row_map[%lld] = %d (cpu)", (long long)i, (long long)j,
                 (int)R->i32[j]);
        return true;
    }
    return fz_fault_ids(c, tr, pm_rows, "row_map", p);
}

void fz_op_unpermute_bwd(fz_case *c) {
    moex_unpermute_grad_args *a = (moex_unpermute_grad_args *)fz_alloc(c, sizeof *a);
    int64_t T, H, k;
    perm_dims(c, &T, &H, &k);
    const moex_dtype dt = fz_act_dtype(c);
    a->row_map = moex_tensor_1d(NULL, I32, pm_rows);
    fz_set_i32(c, fz_tensor_reg(c, "row_map", &a->row_map, FZ_IN, FZ_REQUIRED, DT(I32)),
               row_map_values(c, pm_rows, false), pm_rows);
    a->dy = moex_tensor_2d(NULL, dt, T, H);
    fz_tensor_reg(c, "dy", &a->dy, FZ_IN, FZ_REQUIRED | FZ_FREE0, DT(dt));
    a->dyp = moex_tensor_2d(NULL, dt, pm_rows, H);
    fz_tensor_reg(c, "dyp", &a->dyp, FZ_OUT, FZ_REQUIRED, DT(dt));
    fz_note(c, "T=%lld H=%lld k=%lld %s", (long long)T, (long long)H, (long long)k, moex_dtype_name(dt));
    fz_flow(c, &ub_fns, a, ub_fault);
}
