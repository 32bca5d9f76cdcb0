/*
 * fuzz_ops_mlp.c - argument builders of the moex API fuzzer for the scaled GLU (forward,
 * backward) and the grouped MLP (forward, backward), plus the GLU parameters and their
 * faults that the MoE layer shares (the fault list is in fuzz.h).
 */
#include "fuzz.h"

#include <math.h>
#include <string.h>

/* ---- GLU parameters ---------------------------------------------------------------------- */

moex_glu_params fz_glu_params(fz_case *c, int64_t *F) {
    const uint8_t b = fz_u8(c), k = fz_u8(c);
    moex_glu_params g = moex_glu_params_default((b & 1) ? MOEX_GLU_CLAMPED_SWIGLU : MOEX_GLU_SWIGLU);
    if (b & 2) {   /* interleaved halves need F % 32 == 0 */
        g.layout = MOEX_GLU_INTERLEAVED_32;
        if (c->huge)
            *F = *F < 32 ? 32 : *F / 32 * 32;
        else
            *F = 32 * (1 + ((b >> 2) & 1));
    }
    if (g.kind == MOEX_GLU_CLAMPED_SWIGLU) {   /* finite constants, limit > 0 */
        if (k >= 128) {
            static const float lim[6] = {0.5f, 1.0f, 7.0f, 1e-30f, 3e38f, 100.0f};
            static const float alp[5] = {1.702f, 0.0f, -3.0f, 1e30f, 1.0f};
            static const float off[5] = {1.0f, 0.0f, -1e30f, -2.5f, 1e-45f};
            g.limit = lim[k % 6];
            g.alpha = alp[(k >> 3) % 5];
            g.offset = off[(k >> 5) % 5];
        }
    } else if (k & 1) {   /* SWIGLU reads no constant: anything goes */
        g.limit = (k & 2) ? NAN : -1.0f;
        g.alpha = (k & 4) ? INFINITY : 0.0f;
        g.offset = (k & 8) ? -INFINITY : NAN;
    }
    return g;
}

bool fz_fault_glu(fz_case *c, moex_glu_params *glu, int64_t F, unsigned kind, uint64_t p) {
    switch (kind % 4) {
    case 0:
        glu->kind = (moex_glu_kind)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: glu.kind = %d", (int)glu->kind);
        return true;
    case 1:
        glu->layout = (moex_glu_layout)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: glu.layout = %d", (int)glu->layout);
        return true;
    case 2: {
        static const char *const what[8] = {"limit NaN", "limit 0", "limit -1", "limit Inf",
                                            "alpha NaN", "alpha -Inf", "offset NaN", "offset Inf"};
        const int v = (int)(p % 8);
        glu->kind = MOEX_GLU_CLAMPED_SWIGLU;
        switch (v) {
        case 0: glu->limit = NAN; break;
        case 1: glu->limit = 0.0f; break;
        case 2: glu->limit = -1.0f; break;
        case 3: glu->limit = INFINITY; break;
        case 4: glu->alpha = NAN; break;
        case 5: glu->alpha = -INFINITY; break;
        case 6: glu->offset = NAN; break;
        default: glu->offset = INFINITY; break;
        }
        fz_fault(c, FZ_STRUCT, "glu: CLAMPED_SWIGLU with %s", what[v]);
        return true;
    }
    default:
        if (F % 32 == 0) return false;
        glu->layout = MOEX_GLU_INTERLEAVED_32;
        fz_fault(c, FZ_STRUCT, "glu: INTERLEAVED_32 with F = %lld", (long long)F);
        return true;
    }
}

/* ---- scaled GLU -------------------------------------------------------------------------- */

FZ_OPFNS(gluf_fns, scaled_glu_forward, moex_scaled_glu_args);
FZ_OPFNS(glub_fns, scaled_glu_backward, moex_scaled_glu_grad_args);

static int64_t glu_T, glu_F;

static bool gluf_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_scaled_glu_args *a = (moex_scaled_glu_args *)args;
    if (kind % 5 == 4) {
        const int ts = fz_find(c, "splits");
        return a->splits.ndim != 0 && fz_fault_split_values(c, ts, glu_T, p);
    }
    return fz_fault_glu(c, &a->glu, glu_F, kind, p);
}

static bool glub_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_scaled_glu_grad_args *a = (moex_scaled_glu_grad_args *)args;
    if (kind % 5 == 4) {
        const int ts = fz_find(c, "splits");
        return a->splits.ndim != 0 && fz_fault_split_values(c, ts, glu_T, p);
    }
    return fz_fault_glu(c, &a->glu, glu_F, kind, p);
}

/* h, probs, splits of either direction; returns S (the rows done). */
static int64_t glu_common(fz_case *c, moex_tensor *h, moex_tensor *probs, moex_tensor *splits, moex_glu_params *glu,
                          int64_t *T, int64_t *F, moex_dtype *dt, bool *with_probs, int *th, int *tp) {
    *T = fz_dim(c, 0, 24, 300);
    *F = fz_dim(c, 1, 16, 300);
    *glu = fz_glu_params(c, F);
    *dt = fz_act_dtype(c);
    const uint8_t opt = fz_u8(c);
    *with_probs = opt & 1;
    const bool with_splits = (opt & 2) != 0;
    int64_t S = *T;
    if (with_splits) {
        const int64_t G = fz_dim(c, 1, 6, 40);
        int64_t *s = fz_i64s(c, G);
        S = fz_make_splits(c, s, G, *T);
        *splits = moex_tensor_1d(NULL, I64, G);
        const int ts = fz_tensor_reg(c, "splits", splits, FZ_IN, FZ_FREE0, DT(I64));   /* any G >= 1 */
        fz_set_i64(c, ts, s, G);
    } else {
        fz_tensor_reg(c, "splits", splits, FZ_IN, 0, DT(I64));   /* optional, absent */
    }
    *h = moex_tensor_2d(NULL, *dt, *T, fz_mul_sat(*F, 2));
    *th = fz_tensor_reg(c, "h", h, FZ_IN, FZ_REQUIRED, DT(*dt));
    *probs = moex_tensor_1d(NULL, F32, *T);
    if (!*with_probs) probs->ndim = 0;
    *tp = fz_tensor_reg(c, "probs", probs, FZ_IN, 0, DT(F32));
    if (with_splits) fz_tail(c, *th, S), fz_tail(c, *tp, S);
    glu_T = *T, glu_F = *F;
    fz_note(c, "T=%lld F=%lld %s glu kind %d layout %d (%g %g %g) probs=%d splits=%s S=%lld", (long long)*T,
            (long long)*F, moex_dtype_name(*dt), (int)glu->kind, (int)glu->layout, (double)glu->limit, (double)glu->alpha,
            (double)glu->offset, *with_probs, with_splits ? "yes" : "no", (long long)S);
    return with_splits ? S : -1;
}

void fz_op_glu_fwd(fz_case *c) {
    moex_scaled_glu_args *a = (moex_scaled_glu_args *)fz_alloc(c, sizeof *a);
    int64_t T, F;
    moex_dtype dt;
    bool wp;
    int th, tp;
    const int64_t S = glu_common(c, &a->h, &a->probs, &a->splits, &a->glu, &T, &F, &dt, &wp, &th, &tp);
    a->z = moex_tensor_2d(NULL, dt, T, F);
    const int tz = fz_tensor_reg(c, "z", &a->z, FZ_OUT, FZ_REQUIRED, DT(dt));
    if (S >= 0) fz_tail(c, tz, S);
    fz_flow(c, &gluf_fns, a, gluf_fault);
}

void fz_op_glu_bwd(fz_case *c) {
    moex_scaled_glu_grad_args *a = (moex_scaled_glu_grad_args *)fz_alloc(c, sizeof *a);
    int64_t T, F;
    moex_dtype dt;
    bool wp;
    int th, tp;
    const int64_t S = glu_common(c, &a->h, &a->probs, &a->splits, &a->glu, &T, &F, &dt, &wp, &th, &tp);
    const bool dprobs = wp && fz_chance(c, 160);
    a->dz = moex_tensor_2d(NULL, dt, T, F);
    const int tdz = fz_tensor_reg(c, "dz", &a->dz, FZ_IN, FZ_REQUIRED, DT(dt));
    a->dh = moex_tensor_2d(NULL, dt, T, fz_mul_sat(F, 2));
    const int tdh = fz_tensor_reg(c, "dh", &a->dh, FZ_OUT, FZ_REQUIRED, DT(dt));
    a->dprobs = moex_tensor_1d(NULL, F32, T);
    if (wp && !dprobs) a->dprobs.ndim = 0;
    const int tdp = fz_tensor_reg(c, "dprobs", &a->dprobs, FZ_ACC, wp ? 0 : FZ_FORBIDDEN, DT(F32));
    if (dprobs) fz_role_set(c, tp, FZ_IN, FZ_REQUIRED);   /* dprobs needs probs */
    if (S >= 0) fz_tail(c, tdz, S), fz_tail(c, tdh, S), fz_tail(c, tdp, S);
    fz_note(c, " dprobs=%d", dprobs);
    fz_flow(c, &glub_fns, a, glub_fault);
}

/* ---- grouped MLP --------------------------------------------------------------------------- */

FZ_OPFNS(mlpf_fns, grouped_mlp_forward, moex_grouped_mlp_args);
FZ_OPFNS(mlpb_fns, grouped_mlp_backward, moex_grouped_mlp_grad_args);

static int64_t mlp_T, mlp_F;
static bool mlp_any_dw;

static bool mlpf_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_grouped_mlp_args *a = (moex_grouped_mlp_args *)args;
    if (kind % 5 == 4) return fz_fault_fp8(c, &a->fp8, p);   /* the fp8 recipe: one kind in five */
    switch (kind % 6) {
    case 0:
        a->b2_mode = (moex_bias_mode)fz_bad_enum(c, p, 3);
        fz_fault(c, FZ_STRUCT, "enum: b2_mode = %d", (int)a->b2_mode);
        return true;
    case 1: return fz_fault_split_values(c, fz_find(c, "splits"), mlp_T, p);
    default: return fz_fault_glu(c, &a->glu, mlp_F, kind - 2, p);
    }
}

static bool mlpb_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    moex_grouped_mlp_grad_args *a = (moex_grouped_mlp_grad_args *)args;
    if (kind % 5 == 4) return fz_fault_fp8(c, &a->fp8, p);   /* the fp8 recipe: one kind in five */
    switch (kind % 7) {
    case 0:
        a->b2_mode = (moex_bias_mode)fz_bad_enum(c, p, 3);
        fz_fault(c, FZ_STRUCT, "enum: b2_mode = %d", (int)a->b2_mode);
        return true;
    case 1: return fz_fault_split_values(c, fz_find(c, "splits"), mlp_T, p);
    case 2:
        if (!mlp_any_dw) return false;   /* dw_mode is checked with a weight gradient */
        a->dw_mode = (moex_grad_mode)fz_bad_enum(c, p, 2);
        fz_fault(c, FZ_STRUCT, "enum: dw_mode = %d", (int)a->dw_mode);
        return true;
    default: return fz_fault_glu(c, &a->glu, mlp_F, kind - 3, p);
    }
}

/* What both directions share. */
typedef struct mlp_cfg {
    int64_t G, T, H, F, S;
    moex_dtype dt, b1dt, b2dt;
    moex_bias_mode b2_mode;
    moex_glu_params glu;
    moex_fp8_recipe fp8;
    int64_t *splits;
} mlp_cfg;

static void mlp_cfg_read(fz_case *c, mlp_cfg *m) {
    m->G = fz_dim(c, 1, 6, 40);
    m->T = fz_dim(c, 0, 24, 200);
    m->H = fz_dim(c, 1, 24, 96);
    m->F = fz_dim(c, 1, 16, 96);
    m->glu = fz_glu_params(c, &m->F);
    m->fp8 = fz_fp8_recipe(c);
    {   /* FP8 on the CPU (run mode): T H F and G 2F H at most 2^17; F keeps its GLU layout */
        int64_t *const thf[2] = {&m->T, &m->H}, *const gh[2] = {&m->G, &m->H};
        static const int64_t lo_th[2] = {0, 1}, lo_gh[2] = {1, 1};
        fz_fp8_cap(c, &m->fp8, thf, lo_th, 2, m->F);
        fz_fp8_cap(c, &m->fp8, gh, lo_gh, 2, fz_mul_sat(m->F, 2));
    }
    m->dt = fz_act_dtype(c);
    m->b1dt = fz_chance(c, 128) ? F32 : m->dt;
    m->b2dt = fz_chance(c, 128) ? F32 : m->dt;
    m->b2_mode = (moex_bias_mode)fz_pick(c, 3);
    m->splits = fz_i64s(c, m->G);
    m->S = fz_make_splits(c, m->splits, m->G, m->T);
    mlp_T = m->T, mlp_F = m->F;
    fz_note(c, "G=%lld T=%lld H=%lld F=%lld S=%lld %s b1 %s b2 %s b2_mode=%d glu kind %d layout %d (%g %g %g)",
            (long long)m->G, (long long)m->T, (long long)m->H, (long long)m->F, (long long)m->S, moex_dtype_name(m->dt),
            moex_dtype_name(m->b1dt), moex_dtype_name(m->b2dt), (int)m->b2_mode, (int)m->glu.kind, (int)m->glu.layout, (double)m->glu.limit,
            (double)m->glu.alpha, (double)m->glu.offset);
}

static void mlp_weights(fz_case *c, const mlp_cfg *m, moex_tensor *x, moex_weight *w1, moex_weight *w2,
                        moex_tensor *splits) {
    const int64_t twoF = fz_mul_sat(m->F, 2);
    *splits = moex_tensor_1d(NULL, I64, m->G);
    fz_set_i64(c, fz_tensor_reg(c, "splits", splits, FZ_IN, FZ_REQUIRED, DT(I64)), m->splits, m->G);
    *x = moex_tensor_2d(NULL, m->dt, m->T, m->H);
    fz_tail(c, fz_tensor_reg(c, "x", x, FZ_IN, FZ_REQUIRED, DT(m->dt)), m->S);
    *w1 = moex_weight_packed(moex_tensor_3d(NULL, m->dt, m->G, twoF, m->H));
    fz_weight_reg(c, "w1", w1, FZ_IN, FZ_REQUIRED | FZ_DISCRETE_OK, DT(m->dt));
    *w2 = moex_weight_packed(moex_tensor_3d(NULL, m->dt, m->G, m->H, m->F));
    fz_weight_reg(c, "w2", w2, FZ_IN, FZ_REQUIRED | FZ_DISCRETE_OK, DT(m->dt));
    c->fp8_w[0] = w1, c->fp8_w[1] = w2;
}

void fz_op_mlp_fwd(fz_case *c) {
    moex_grouped_mlp_args *a = (moex_grouped_mlp_args *)fz_alloc(c, sizeof *a);
    mlp_cfg m;
    mlp_cfg_read(c, &m);
    const uint8_t opt = fz_u8(c);
    const bool b1 = opt & 1, probs = m.b2_mode == MOEX_BIAS_SCALED || (opt & 2), z = (opt & 4) != 0;
    a->b2_mode = m.b2_mode;
    a->glu = m.glu;
    a->fp8 = m.fp8;
    mlp_weights(c, &m, &a->x, &a->w1, &a->w2, &a->splits);
    const int64_t twoF = fz_mul_sat(m.F, 2);
    a->b1 = moex_tensor_2d(NULL, m.b1dt, m.G, twoF);
    if (!b1) a->b1.ndim = 0;
    fz_tensor_reg(c, "b1", &a->b1, FZ_IN, 0, DT(m.dt) | DT(F32));
    a->b2 = moex_tensor_2d(NULL, m.b2dt, m.G, m.H);
    fz_tensor_reg(c, "b2", &a->b2, FZ_IN, m.b2_mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : FZ_REQUIRED, DT(m.dt) | DT(F32));
    a->probs = moex_tensor_1d(NULL, F32, m.T);
    if (!probs) a->probs.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "probs", &a->probs, FZ_IN, m.b2_mode == MOEX_BIAS_SCALED ? FZ_REQUIRED : 0, DT(F32)),
            m.S);
    a->h = moex_tensor_2d(NULL, m.dt, m.T, twoF);
    fz_tail(c, fz_tensor_reg(c, "h", &a->h, FZ_OUT, FZ_REQUIRED, DT(m.dt)), m.S);
    a->z = moex_tensor_2d(NULL, m.dt, m.T, m.F);
    if (!z) a->z.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "z", &a->z, FZ_OUT, 0, DT(m.dt)), m.S);
    a->y = moex_tensor_2d(NULL, m.dt, m.T, m.H);
    fz_tail(c, fz_tensor_reg(c, "y", &a->y, FZ_OUT, FZ_REQUIRED, DT(m.dt)), m.S);
    fz_note(c, " b1=%d probs=%d z=%d", b1, probs, z);
    fz_layer_flow(c, &mlpf_fns, a, mlpf_fault, &a->fp8);
}

void fz_op_mlp_bwd(fz_case *c) {
    moex_grouped_mlp_grad_args *a = (moex_grouped_mlp_grad_args *)fz_alloc(c, sizeof *a);
    mlp_cfg m;
    mlp_cfg_read(c, &m);
    const uint8_t opt = fz_u8(c), opt2 = fz_u8(c);
    const bool dprobs_req = (opt2 & 1) != 0;
    const bool probs = m.b2_mode == MOEX_BIAS_SCALED || dprobs_req || (opt & 1);
    const bool dprobs = probs && dprobs_req;
    const bool b2 = m.b2_mode != MOEX_BIAS_NONE && ((m.b2_mode == MOEX_BIAS_SCALED && dprobs) || (opt & 2));
    const bool z = opt & 4, dx = opt & 8, dw1 = opt & 16, dw2 = opt & 32, db1 = opt & 64,
               db2 = m.b2_mode != MOEX_BIAS_NONE && (opt & 128);
    a->dw_mode = (moex_grad_mode)((opt2 >> 1) & 1);
    const unsigned dwts = a->dw_mode == MOEX_GRAD_ACCUMULATE ? DT(F32) : DT(F32) | DT(m.dt);
    const moex_dtype wdt1 = a->dw_mode == MOEX_GRAD_WRITE && (opt2 & 4) ? m.dt : F32,
                     wdt2 = a->dw_mode == MOEX_GRAD_WRITE && (opt2 & 8) ? m.dt : F32;
    const fz_role dwrole = a->dw_mode == MOEX_GRAD_ACCUMULATE ? FZ_ACC : FZ_OUT;
    mlp_any_dw = dw1 || dw2;
    a->b2_mode = m.b2_mode;
    a->glu = m.glu;
    a->fp8 = m.fp8;
    mlp_weights(c, &m, &a->x, &a->w1, &a->w2, &a->splits);
    const int64_t twoF = fz_mul_sat(m.F, 2);
    a->b2 = moex_tensor_2d(NULL, m.b2dt, m.G, m.H);
    unsigned b2f = m.b2_mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : (m.b2_mode == MOEX_BIAS_SCALED && dprobs) ? FZ_REQUIRED : 0;
    if (!b2 && !(b2f & FZ_FORBIDDEN)) a->b2.ndim = 0;
    fz_tensor_reg(c, "b2", &a->b2, FZ_IN, b2f, DT(m.dt) | DT(F32));
    a->probs = moex_tensor_1d(NULL, F32, m.T);
    if (!probs) a->probs.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "probs", &a->probs, FZ_IN,
                             m.b2_mode == MOEX_BIAS_SCALED || dprobs ? FZ_REQUIRED : 0, DT(F32)), m.S);
    a->h = moex_tensor_2d(NULL, m.dt, m.T, twoF);
    fz_tail(c, fz_tensor_reg(c, "h", &a->h, FZ_IN, FZ_REQUIRED, DT(m.dt)), m.S);
    a->z = moex_tensor_2d(NULL, m.dt, m.T, m.F);
    if (!z) a->z.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "z", &a->z, FZ_IN, 0, DT(m.dt)), m.S);
    a->dy = moex_tensor_2d(NULL, m.dt, m.T, m.H);
    fz_tail(c, fz_tensor_reg(c, "dy", &a->dy, FZ_IN, FZ_REQUIRED, DT(m.dt)), m.S);
    a->dx = moex_tensor_2d(NULL, m.dt, m.T, m.H);
    if (!dx) a->dx.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "dx", &a->dx, FZ_OUT, 0, DT(m.dt)), m.S);
    a->dw1 = moex_weight_packed(moex_tensor_3d(NULL, wdt1, m.G, twoF, m.H));
    if (!dw1) a->dw1.t.ndim = 0;
    fz_weight_reg(c, "dw1", &a->dw1, dwrole, FZ_DISCRETE_OK, dwts);
    a->dw2 = moex_weight_packed(moex_tensor_3d(NULL, wdt2, m.G, m.H, m.F));
    if (!dw2) a->dw2.t.ndim = 0;
    fz_weight_reg(c, "dw2", &a->dw2, dwrole, FZ_DISCRETE_OK, dwts);
    a->db1 = moex_tensor_2d(NULL, F32, m.G, twoF);
    if (!db1) a->db1.ndim = 0;
    fz_tensor_reg(c, "db1", &a->db1, FZ_OUT, 0, DT(m.dt) | DT(F32));
    a->db2 = moex_tensor_2d(NULL, F32, m.G, m.H);
    if (!db2 && m.b2_mode != MOEX_BIAS_NONE) a->db2.ndim = 0;
    fz_tensor_reg(c, "db2", &a->db2, FZ_OUT, m.b2_mode == MOEX_BIAS_NONE ? FZ_FORBIDDEN : 0, DT(m.dt) | DT(F32));
    a->dprobs = moex_tensor_1d(NULL, F32, m.T);
    if (!dprobs && probs) a->dprobs.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "dprobs", &a->dprobs, FZ_ACC, probs ? 0 : FZ_FORBIDDEN, DT(F32)), m.S);
    fz_note(c, " probs=%d b2=%d z=%d dx=%d dw1=%d dw2=%d db1=%d db2=%d dprobs=%d dw_mode=%d dw %s/%s", probs, b2, z, dx,
            dw1, dw2, db1, db2, dprobs, (int)a->dw_mode, moex_dtype_name(wdt1), moex_dtype_name(wdt2));
    fz_layer_flow(c, &mlpb_fns, a, mlpb_fault, &a->fp8);
}
