/*
 * fp8_layers.c - the layers' FP8 recipe (moex_fp8_recipe, experimental; docs/ops.md 9.11): the
 * grouped linear's three calls and the grouped MLP's forward and backward with their GEMMs on
 * FP8 operands, composed once from the quantize primitives (quantize, weight_quantize), the FP8
 * grouped linear's ops (fp8_linear.c: its backend kernels where it has them, else the
 * dequantizing composition) and the plain primitives for what is not a GEMM (bias gradients,
 * dprobs, the scaled GLU). grouped_linear.c and grouped_mlp.c call these when fp8.mode is not
 * MOEX_FP8_OFF; with OFF nothing here runs.
 *
 * Operands: activations (x, z) E4M3, weights E4M3, gradients (dy, dh) E4M3 or E5M2 (HYBRID);
 * mode BLOCK: rows 1x128 (BLOCK), weights 128x128 (BLOCK); CURRENT: rows GROUP, weights GROUP;
 * MXFP8: MXFP8 both. A GEMM reducing over the features reads rowwise copies (and the weights'
 * rowwise copy in the forward, their columnwise copy, W^T, in the backward data); a GEMM
 * reducing over the rows (the weight gradients) reads the columnwise copies.
 *
 *   linear forward          xq = Q_act(x) rowwise, wq = Q_w(w) rowwise; y = xq wq^T (+ bias)
 *   linear backward data    dbias, dprobs: the plain primitive on dy (dx absent);
 *                           dyq = Q_grad(dy) rowwise, wq = Q_w(w) columnwise; dx = dyq wq
 *   linear backward weight  dyq, xq = the columnwise copies; dW = dyq^T xq (f32: into dW;
 *                           WRITE into bf16/f16: into an f32 scratch, then weight_copy)
 *   MLP forward             xq, w1q rowwise; h = xq w1q^T (+ b1); z = p glu(h) with zq = Q_act(z)
 *                           rowwise from the scaled GLU (or, where the backend fuses FC1 and the
 *                           GLU, fc1_glu_fp8: h and z from one kernel, then zq = Q_act(z));
 *                           w2q rowwise; y = zq w2q^T (+ b2 | + p b2)
 *   MLP backward            db2, dprobs (scaled-b2 term): the plain primitive on dy;
 *                           dyq = Q_grad(dy) rowwise and columnwise (one pass);
 *                           dW2 = dyq^T zq, zq = Q_act(z) columnwise (z saved, or recomputed
 *                           from h by the scaled GLU straight into its FP8 copy);
 *                           dz = dyq w2q (w2 columnwise) [T, F] in dt;
 *                           dh, dprobs (GLU term) = the GLU backward [T, 2F] in dt;
 *                           db1: the plain primitive on dh; dhq = Q_grad(dh) rowwise and
 *                           columnwise (one pass); dx = dhq w1q (w1 columnwise);
 *                           dW1 = dhq^T xq, xq = Q_act(x) columnwise
 * Only what the present outputs need is computed. The weights are quantized from their master
 * copy on every call (discrete weights are first copied into a packed one, weight_copy). Every step runs on the groups of one prepared handle, except the FP8 GEMMs and the
 * scaled GLU ops, which prepare their own (they are ops of their own, run without validation).
 *
 * Workspace: the handle, the FP8 copies the call needs, the activation-dtype intermediates (dz,
 * dh) and the f32 dW scratch, then one region shared by the steps (they run one after the
 * other). Sizes depend on shapes, dtypes, the recipe and which tensors are present, never on
 * split values or pointers.
 */
#include "op.h"

#include <string.h>

static const moex_tensor absent_tensor;

/* ---- operands ------------------------------------------------------------------------------ */

/* The quantization of one role: activations and weights E4M3, gradients E4M3 or E5M2. */
static moex_quant_params params_of(const moex_fp8_recipe *r, bool grad) {
    moex_quant_params p;
    memset(&p, 0, sizeof p);
    p.recipe = r->mode == MOEX_FP8_BLOCK ? MOEX_QUANT_BLOCK : r->mode == MOEX_FP8_MXFP8 ? MOEX_QUANT_MXFP8
                                                                                          : MOEX_QUANT_GROUP;
    p.fp8 = grad && r->dtypes == MOEX_FP8_HYBRID ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
    p.amax_epsilon = r->mode == MOEX_FP8_MXFP8 ? 0.0f : r->amax_epsilon;
    p.rounding = r->pow2_scales ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
    p.scale_layout = MOEX_SCALES_PLAIN;
    return p;
}

/* The dims of a quantize (dt: the source's dtype) or of an FP8 GEMM operand (dt f32): grouped
 * rows [T, K] in G groups, or weights [G, N, K] (T = N; no block columns). */
static moex_quant_dims qdims(int64_t G, int64_t T, int64_t K, moex_dtype dt, const moex_quant_params *p, bool weight) {
    const int64_t block = p->recipe == MOEX_QUANT_BLOCK ? 128 : p->recipe == MOEX_QUANT_MXFP8 ? 32 : 0;
    moex_quant_dims q = {G, T, K, dt, block, 0, 0};
    if (!weight && block) q.row_blocks = moex_i64_cdiv(K, block), q.col_tiles = moex_i64_cdiv(T, block) + G;
    return q;
}

/* One FP8 operand in the workspace: its params, the dims of its quantize, and the copies the
 * call needs (absent: ndim 0). */
typedef struct qop {
    moex_quant_params p;
    moex_quant_dims d;
    moex_quant_tensor row, col;
} qop;

static moex_tensor take_tensor(moex_carver *c, moex_dtype dt, int nd, const int64_t *shape) {
    moex_tensor t;
    memset(&t, 0, sizeof t);
    size_t bytes = moex_dtype_size(dt);
    for (int i = 0; i < nd; i++) bytes = moex_sz_mul(bytes, (size_t)shape[i]), t.shape[i] = shape[i];
    t.data = moex_take(c, bytes);
    t.dtype = dt, t.ndim = nd;
    return t;
}

/* A copy: data of dshape, scales of sshape (f32, or E8M0 for MXFP8). */
static moex_quant_tensor take_copy(moex_carver *c, const moex_quant_params *p, int dnd, const int64_t *dshape,
                                   int snd, const int64_t *sshape) {
    moex_quant_tensor q;
    q.data = take_tensor(c, p->fp8, dnd, dshape);
    q.scales = take_tensor(c, p->recipe == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32, snd, sshape);
    return q;
}

/* Grouped rows [T, K] of dtype dt in G groups (docs/ops.md 9.4): rowwise data [T, K], columnwise
 * [K, T]; GROUP scales [G], block scales [T, ceil(K/B)] and [K, ceil(T/B) + G]. */
static void take_rows(moex_carver *c, const moex_fp8_recipe *r, bool grad, int64_t G, int64_t T, int64_t K,
                      moex_dtype dt, bool row, bool col, qop *q) {
    memset(q, 0, sizeof *q);
    q->p = params_of(r, grad);
    q->d = qdims(G, T, K, dt, &q->p, false);
    const bool blocks = q->d.block != 0;
    if (row) {
        const int64_t ds[2] = {T, K}, ss[2] = {blocks ? T : G, q->d.row_blocks};
        q->row = take_copy(c, &q->p, 2, ds, blocks ? 2 : 1, ss);
    }
    if (col) {
        const int64_t ds[2] = {K, T}, ss[2] = {blocks ? K : G, q->d.col_tiles};
        q->col = take_copy(c, &q->p, 2, ds, blocks ? 2 : 1, ss);
    }
}

/* Weights [G, N, K] of dtype dt (docs/ops.md 9.7): rowwise data [G, N, K], columnwise [G, K, N];
 * GROUP scales [G]; BLOCK [G, ceil(rows/128), ceil(cols/128)]; MXFP8 [G, rows, ceil(cols/32)]
 * (rows, cols: those of the copy). */
static void take_weight(moex_carver *c, const moex_fp8_recipe *r, int64_t G, int64_t N, int64_t K, moex_dtype dt,
                        bool row, bool col, qop *q) {
    memset(q, 0, sizeof *q);
    q->p = params_of(r, false);
    q->d = qdims(G, N, K, dt, &q->p, true);
    const int64_t B = q->d.block;
    for (int k = 0; k < 2; k++) {
        if (!(k == 0 ? row : col)) continue;
        const int64_t rows = k == 0 ? N : K, cols = k == 0 ? K : N;
        const int64_t ds[3] = {G, rows, cols};
        const int64_t ss[3] = {G, B == 128 ? moex_i64_cdiv(rows, 128) : rows, B ? moex_i64_cdiv(cols, B) : 1};
        const moex_quant_tensor t = take_copy(c, &q->p, 3, ds, B ? 3 : 1, ss);
        if (k == 0) q->row = t;
        else q->col = t;
    }
}

static moex_group_quantize_args rows_qargs(const moex_tensor *x, const moex_tensor *splits, const qop *q) {
    moex_group_quantize_args a;
    memset(&a, 0, sizeof a);
    a.x = *x, a.splits = *splits, a.params = q->p, a.rowwise = q->row, a.columnwise = q->col;
    return a;
}

/* The weight quantize of a packed weight's copies (a discrete one is packed first). */
static moex_weight_quantize_args weight_qargs(const moex_weight *w, const qop *q) {
    moex_weight_quantize_args a;
    memset(&a, 0, sizeof a);
    a.params = q->p, a.w = w->t, a.rowwise = q->row, a.columnwise = q->col;
    return a;
}

/* A discrete weight is first copied into a packed one at the start of the step's region
 * (weight_copy: its pointer array is read where it lives), then quantized as a packed one. */
static size_t packed_bytes(const moex_weight *w) {
    return w->ptrs ? moex_sz_mul(moex_sz_bytes(w->t.shape[0], w->t.shape[1], moex_dtype_size(w->t.dtype)),
                                 (size_t)w->t.shape[2])
                   : 0;
}

static size_t quantize_weight_ws(moex_context *ctx, const moex_weight *w, const qop *q) {
    const moex_weight_quantize_args all = weight_qargs(w, q);
    return moex_sz_add(moex_sz_align(packed_bytes(w), MOEX_WS_ALIGN), moex_ops(ctx)->weight_quantize_ws(ctx, &all, &q->d));
}

/* The weight's copies, in one call. */
static moex_status quantize_weight(moex_context *ctx, const moex_call *c, const moex_weight *w, const qop *q,
                                   void *sub) {
    const moex_backend_ops *ops = moex_ops(ctx);
    moex_weight packed = *w;
    if (w->ptrs) {
        packed = moex_weight_packed(moex_tensor_3d(sub, w->t.dtype, w->t.shape[0], w->t.shape[1], w->t.shape[2]));
        const moex_weight_copy_args cp = {*w, packed};
        const moex_gl_dims d = {w->t.shape[0], w->t.shape[1], w->t.shape[2], 0, w->t.dtype};
        MOEX_TRY(ops->weight_copy(ctx, c, &cp, &d, NULL));
        sub = (char *)sub + moex_sz_align(packed_bytes(w), MOEX_WS_ALIGN);
    }
    const moex_weight_quantize_args a = weight_qargs(&packed, q);
    return ops->weight_quantize(ctx, c, &a, &q->d, sub);
}

/* ---- the FP8 GEMMs --------------------------------------------------------------------------- */

/* y = x W^T (+ bias) by the FP8 grouped linear's forward: x's rowwise copy [T, K], and w's
 * rowwise copy (W [G, N, K]) or, for a backward data, its columnwise copy (W^T [G, K, N]: the
 * product dy W). */
typedef struct fp8_fwd {
    moex_grouped_linear_fp8_args a;
    moex_fp8_dims d;
} fp8_fwd;

static fp8_fwd fwd_of(const qop *x, const qop *w, bool w_col, const moex_tensor *splits, moex_bias_mode mode,
                      const moex_tensor *bias, const moex_tensor *probs, const moex_tensor *y) {
    fp8_fwd f;
    memset(&f, 0, sizeof f);
    const int64_t G = x->d.G, T = x->d.T, K = x->d.K, N = w_col ? w->d.K : w->d.T;
    f.a.x_params = x->p, f.a.x = x->row;
    f.a.w_params = w->p, f.a.w = w_col ? w->col : w->row;
    f.a.splits = *splits;
    f.a.bias_mode = mode;
    if (mode != MOEX_BIAS_NONE) f.a.bias = *bias;
    if (mode == MOEX_BIAS_SCALED) f.a.probs = *probs;
    f.a.y = *y;
    const moex_gl_dims gl = {G, T, K, N, y->dtype};
    f.d.gl = gl;
    f.d.a = qdims(G, T, K, MOEX_DTYPE_F32, &x->p, false);
    f.d.b = qdims(G, N, K, MOEX_DTYPE_F32, &w->p, true);
    return f;
}

static size_t fwd_ws(moex_context *ctx, const fp8_fwd *f) {
    return moex_op_grouped_linear_fp8_forward_ws(ctx, &f->a, &f->d);
}

static moex_status fwd_run(moex_context *ctx, const moex_call *c, const fp8_fwd *f, void *sub) {
    return moex_op_grouped_linear_fp8_forward_run(ctx, c, &f->a, &f->d, sub);
}

/* dW = dy^T x [G, N, K] by the FP8 grouped linear's backward weight, from the columnwise copies
 * of dy [T, N] and x [T, K]. The FP8 product writes f32: an f32 dW gets it directly (= or +=);
 * a bf16/f16 dW (WRITE) gets it through the f32 scratch dwf [G, N, K], rounded into it by
 * weight_copy (packed or discrete). */
typedef struct fp8_dw {
    moex_grouped_linear_fp8_wgrad_args a;
    moex_fp8_dims d;
    const moex_weight *dw;      /* the caller's */
    bool cast;                  /* through dwf */
} fp8_dw;

static fp8_dw dw_of(const qop *dy, const qop *x, const moex_tensor *splits, moex_grad_mode mode,
                    const moex_weight *dw, float *dwf) {
    fp8_dw f;
    memset(&f, 0, sizeof f);
    const int64_t G = x->d.G, T = x->d.T, K = x->d.K, N = dy->d.K;
    f.dw = dw;
    f.cast = dw->t.dtype != MOEX_DTYPE_F32;   /* validated: WRITE */
    f.a.dy_params = dy->p, f.a.dy = dy->col;
    f.a.x_params = x->p, f.a.x = x->col;
    f.a.splits = *splits;
    f.a.dw_mode = f.cast ? MOEX_GRAD_WRITE : mode;
    f.a.dw = f.cast ? moex_weight_packed(moex_tensor_3d(dwf, MOEX_DTYPE_F32, G, N, K)) : *dw;
    const moex_gl_dims gl = {G, T, K, N, MOEX_DTYPE_F32};
    f.d.gl = gl;
    f.d.a = qdims(G, T, N, MOEX_DTYPE_F32, &dy->p, false);
    f.d.b = qdims(G, T, K, MOEX_DTYPE_F32, &x->p, false);
    return f;
}

/* The copy of dwf into dW: its args and dims (G, T = N, K). */
static moex_weight_copy_args dw_copy_of(const fp8_dw *f, moex_gl_dims *d) {
    const moex_gl_dims wd = {f->d.gl.G, f->d.gl.N, f->d.gl.K, 0, f->dw->t.dtype};
    *d = wd;
    const moex_weight_copy_args cp = {f->a.dw, *f->dw};
    return cp;
}

static size_t dw_ws(moex_context *ctx, const fp8_dw *f) {
    size_t ws = moex_op_grouped_linear_fp8_backward_weight_ws(ctx, &f->a, &f->d);
    if (f->cast) {
        moex_gl_dims d;
        const moex_weight_copy_args cp = dw_copy_of(f, &d);
        ws = moex_sz_max(ws, moex_ops(ctx)->weight_copy_ws(ctx, &cp, &d));
    }
    return ws;
}

/* The bytes of the f32 scratch a dW step needs (0 when none). */
static size_t dw_scratch_bytes(const fp8_dw *f) {
    return f->cast ? moex_sz_mul(moex_sz_bytes(f->d.gl.G, f->d.gl.N, sizeof(float)), (size_t)f->d.gl.K) : 0;
}

static moex_status dw_run(moex_context *ctx, const moex_call *c, const fp8_dw *f, void *sub) {
    MOEX_TRY(moex_op_grouped_linear_fp8_backward_weight_run(ctx, c, &f->a, &f->d, sub));
    if (!f->cast) return MOEX_OK;
    moex_gl_dims d;
    const moex_weight_copy_args cp = dw_copy_of(f, &d);
    return moex_ops(ctx)->weight_copy(ctx, c, &cp, &d, sub);
}

/* Checks the backend's limits and prepares the groups (one handle for the call's own steps). */
static moex_status begin(moex_context *ctx, const moex_call *c, const moex_tensor *splits, int64_t T, int64_t G,
                         void *storage, moex_groups *g) {
    MOEX_TRY(moex_check_limits(ctx, c, T, G, 0));
    return moex_prepare_groups(ctx, c, splits, T, NULL, storage, g);
}

/* ---- grouped MLP: forward ------------------------------------------------------------------------ */

static moex_tensor act_2d(void *data, const moex_mlp_dims *d, int64_t cols) {
    return moex_tensor_2d(data, d->dt, d->T, cols);
}

/* The scaled GLU over the groups, z = p glu(h) (into z when present) and z's FP8 copies zq
 * (the scaled GLU op's quantized output, docs/ops.md 9.9). */
typedef struct glu_zq {
    moex_scaled_glu_args a;
    moex_glu_dims d;
} glu_zq;

static glu_zq glu_zq_of(const moex_glu_params *glu, const moex_tensor *h, const moex_tensor *probs,
                        const moex_tensor *splits, const moex_tensor *z, const qop *zq, const moex_mlp_dims *d) {
    glu_zq g;
    memset(&g, 0, sizeof g);
    g.a.glu = *glu, g.a.h = *h, g.a.probs = *probs, g.a.splits = *splits, g.a.z = *z;
    g.a.zq_params = zq->p, g.a.zq_rowwise = zq->row, g.a.zq_columnwise = zq->col;
    g.d.T = d->T, g.d.F = d->F, g.d.G = d->G, g.d.dt = d->dt;
    g.d.zq = true;
    g.d.q = zq->d;
    return g;
}

static moex_glu_dims glu_dims(const moex_mlp_dims *d) {
    moex_glu_dims g;
    memset(&g, 0, sizeof g);
    g.T = d->T, g.F = d->F, g.G = d->G, g.dt = d->dt;
    return g;
}

/* fused: FC1 and the scaled GLU in one kernel of the backend (fc1_glu_fp8, writing h and z,
 * into a workspace z when z is not kept), then z quantized (qz); else FC1, then the scaled GLU
 * writing z and zq. */
typedef struct mlp_fwd {
    void *groups, *sub;
    qop x, w1, zq, w2;
    fp8_fwd fc1, fc2;
    glu_zq glu;
    bool fused;
    moex_fc1_glu_fp8_args fc1_glu;
    moex_group_quantize_args qz;
    size_t total;
} mlp_fwd;

static mlp_fwd mlp_fwd_layout(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_fp8_recipe *r = &a->fp8;
    const int64_t G = d->G, T = d->T, H = d->H, F = d->F;
    moex_carver c = {(char *)ws, 0};
    mlp_fwd l;
    l.groups = moex_take(&c, ops->groups_ws(ctx, G, T, NULL));
    take_rows(&c, r, false, G, T, H, d->dt, true, false, &l.x);
    take_weight(&c, r, G, 2 * F, H, d->dt, true, false, &l.w1);
    take_rows(&c, r, false, G, T, F, d->dt, true, false, &l.zq);
    take_weight(&c, r, G, H, F, d->dt, true, false, &l.w2);
    l.fc1 = fwd_of(&l.x, &l.w1, false, &a->splits, moex_present(&a->b1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE, &a->b1,
                   NULL, &a->h);
    l.glu = glu_zq_of(&a->glu, &a->h, &a->probs, &a->splits, &a->z, &l.zq, d);
    l.fc2 = fwd_of(&l.zq, &l.w2, false, &a->splits, a->b2_mode, &a->b2, &a->probs, &a->y);
    memset(&l.fc1_glu, 0, sizeof l.fc1_glu);
    l.fc1_glu.fc1 = l.fc1.a, l.fc1_glu.glu = a->glu, l.fc1_glu.probs = a->probs;
    l.fc1_glu.z = moex_present(&a->z) ? a->z : moex_tensor_2d(NULL, d->dt, T, F);
    const size_t fused = ops->fc1_glu_fp8_ws ? ops->fc1_glu_fp8_ws(ctx, &l.fc1_glu, &l.fc1.d) : SIZE_MAX;
    l.fused = fused != SIZE_MAX;
    if (l.fused && !moex_present(&a->z)) l.fc1_glu.z.data = moex_take(&c, moex_sz_bytes(T, F, moex_dtype_size(d->dt)));
    l.qz = rows_qargs(&l.fc1_glu.z, &a->splits, &l.zq);
    const moex_group_quantize_args qx = rows_qargs(&a->x, &a->splits, &l.x);
    size_t sub = ops->quantize_ws(ctx, &qx, &l.x.d);
    sub = moex_sz_max(sub, quantize_weight_ws(ctx, &a->w1, &l.w1));
    if (l.fused) {
        sub = moex_sz_max(sub, fused);
        sub = moex_sz_max(sub, ops->quantize_ws(ctx, &l.qz, &l.zq.d));
    } else {
        sub = moex_sz_max(sub, fwd_ws(ctx, &l.fc1));
        sub = moex_sz_max(sub, moex_op_scaled_glu_forward_ws(ctx, &l.glu.a, &l.glu.d));
    }
    sub = moex_sz_max(sub, quantize_weight_ws(ctx, &a->w2, &l.w2));
    sub = moex_sz_max(sub, fwd_ws(ctx, &l.fc2));
    l.sub = moex_take(&c, sub);
    l.total = c.used;
    return l;
}

size_t moex_fp8_mlp_forward_ws(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d) {
    return mlp_fwd_layout(ctx, a, d, NULL).total;
}

moex_status moex_fp8_mlp_forward_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_args *a,
                                     const moex_mlp_dims *d, void *ws) {
    const mlp_fwd l = mlp_fwd_layout(ctx, a, d, ws);
    moex_groups g;
    MOEX_TRY(begin(ctx, c, &a->splits, d->T, d->G, l.groups, &g));
    const moex_group_quantize_args qx = rows_qargs(&a->x, &a->splits, &l.x);
    MOEX_TRY(moex_ops(ctx)->quantize(ctx, c, &g, &qx, &l.x.d, l.sub));
    MOEX_TRY(quantize_weight(ctx, c, &a->w1, &l.w1, l.sub));
    if (l.fused) {
        MOEX_TRY(moex_ops(ctx)->fc1_glu_fp8(ctx, c, &g, &l.fc1_glu, &l.fc1.d, l.sub));   /* h, z */
        MOEX_TRY(moex_ops(ctx)->quantize(ctx, c, &g, &l.qz, &l.zq.d, l.sub));            /* zq */
    } else {
        MOEX_TRY(fwd_run(ctx, c, &l.fc1, l.sub));                                      /* h */
        MOEX_TRY(moex_op_scaled_glu_forward_run(ctx, c, &l.glu.a, &l.glu.d, l.sub));   /* z, zq */
    }
    MOEX_TRY(quantize_weight(ctx, c, &a->w2, &l.w2, l.sub));
    return fwd_run(ctx, c, &l.fc2, l.sub);                                         /* y */
}

/* ---- grouped MLP: backward ----------------------------------------------------------------------- */

/* Which steps the present outputs need (as the plain composition's plan). */
typedef struct mlp_plan {
    bool dx, dw1, dw2, db1;
    bool dprobs_bias;           /* dprobs gets the scaled-b2 term */
    bool fc2_bias;              /* db2 or the scaled-b2 dprobs term: the plain primitive on dy */
    bool need_dh;               /* dx, dw1 or db1 */
    bool need_dz;               /* dh or the GLU's dprobs term */
} mlp_plan;

static mlp_plan mlp_plan_of(const moex_grouped_mlp_grad_args *a) {
    mlp_plan p;
    const bool dprobs = moex_present(&a->dprobs);
    p.dx = moex_present(&a->dx);
    p.dw1 = moex_weight_present(&a->dw1);
    p.dw2 = moex_weight_present(&a->dw2);
    p.db1 = moex_present(&a->db1);
    p.dprobs_bias = dprobs && a->b2_mode == MOEX_BIAS_SCALED;
    p.fc2_bias = (moex_present(&a->db2) && a->b2_mode != MOEX_BIAS_NONE) || p.dprobs_bias;
    p.need_dh = p.dx || p.dw1 || p.db1;
    p.need_dz = p.need_dh || dprobs;
    return p;
}

typedef struct mlp_bwd {
    mlp_plan p;
    void *groups, *sub;
    qop dy, zq, w2, dh_q, w1, x;
    moex_tensor dz, dh;         /* [T, F], [T, 2F] in dt, in the workspace */
    moex_grouped_linear_dgrad_args fc2_bias, fc1_bias;   /* plain, dx absent */
    moex_group_quantize_args q_dy, q_z, q_dh, q_x;
    glu_zq glu_fwd;             /* z recomputed into its FP8 copy (z not saved) */
    moex_scaled_glu_grad_args glu_bwd;
    fp8_fwd dz_gemm, dx_gemm;
    fp8_dw dw2, dw1;
    size_t total;
} mlp_bwd;

static moex_gl_dims gl_dims(const moex_mlp_dims *d, int64_t K, int64_t N) {
    const moex_gl_dims g = {d->G, d->T, K, N, d->dt};
    return g;
}

static mlp_bwd mlp_bwd_layout(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d,
                              void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_fp8_recipe *r = &a->fp8;
    const int64_t G = d->G, T = d->T, H = d->H, F = d->F;
    moex_carver c = {(char *)ws, 0};
    mlp_bwd l;
    memset(&l, 0, sizeof l);
    const mlp_plan p = l.p = mlp_plan_of(a);
    l.groups = moex_take(&c, ops->groups_ws(ctx, G, T, NULL));
    take_rows(&c, r, true, G, T, H, d->dt, p.need_dz, p.dw2, &l.dy);
    take_rows(&c, r, false, G, T, F, d->dt, false, p.dw2, &l.zq);
    take_weight(&c, r, G, H, F, d->dt, false, p.need_dz, &l.w2);
    if (p.need_dz) l.dz = act_2d(moex_take(&c, moex_sz_bytes(T, F, moex_dtype_size(d->dt))), d, F);
    if (p.need_dh) l.dh = act_2d(moex_take(&c, moex_sz_bytes(T, 2 * F, moex_dtype_size(d->dt))), d, 2 * F);
    take_rows(&c, r, true, G, T, 2 * F, d->dt, p.dx, p.dw1, &l.dh_q);
    take_weight(&c, r, G, 2 * F, H, d->dt, false, p.dx, &l.w1);
    take_rows(&c, r, false, G, T, H, d->dt, false, p.dw1, &l.x);

    /* the dW steps share one f32 scratch and one cast handle (they run one after the other) */
    const moex_tensor *splits = &a->splits;
    l.dw2 = dw_of(&l.dy, &l.zq, splits, a->dw_mode, &a->dw2, NULL);
    l.dw1 = dw_of(&l.dh_q, &l.x, splits, a->dw_mode, &a->dw1, NULL);
    float *dwf = (float *)moex_take(&c, moex_sz_max(p.dw2 ? dw_scratch_bytes(&l.dw2) : 0,
                                                     p.dw1 ? dw_scratch_bytes(&l.dw1) : 0));
    if (p.dw2) l.dw2 = dw_of(&l.dy, &l.zq, splits, a->dw_mode, &a->dw2, dwf);
    if (p.dw1) l.dw1 = dw_of(&l.dh_q, &l.x, splits, a->dw_mode, &a->dw1, dwf);

    const bool scaled = a->b2_mode == MOEX_BIAS_SCALED;
    l.fc2_bias = (moex_grouped_linear_dgrad_args){
        .dy = a->dy, .w = a->w2, .bias_mode = a->b2_mode, .bias = p.dprobs_bias ? a->b2 : absent_tensor,
        .probs = scaled ? a->probs : absent_tensor, .splits = *splits,
        .dbias = a->b2_mode != MOEX_BIAS_NONE ? a->db2 : absent_tensor,
        .dprobs = p.dprobs_bias ? a->dprobs : absent_tensor};
    l.fc1_bias = (moex_grouped_linear_dgrad_args){.dy = l.dh, .w = a->w1, .bias_mode = MOEX_BIAS_ADD,
                                                  .splits = *splits, .dbias = a->db1};
    l.q_dy = rows_qargs(&a->dy, splits, &l.dy);
    l.q_z = rows_qargs(&a->z, splits, &l.zq);
    l.q_dh = rows_qargs(&l.dh, splits, &l.dh_q);
    l.q_x = rows_qargs(&a->x, splits, &l.x);
    l.glu_fwd = glu_zq_of(&a->glu, &a->h, &a->probs, splits, &absent_tensor, &l.zq, d);
    l.glu_bwd = (moex_scaled_glu_grad_args){.glu = a->glu, .h = a->h, .probs = a->probs, .splits = *splits,
                                            .dz = l.dz, .dh = p.need_dh ? l.dh : absent_tensor,
                                            .dprobs = a->dprobs};
    l.dz_gemm = fwd_of(&l.dy, &l.w2, true, splits, MOEX_BIAS_NONE, NULL, NULL, &l.dz);
    l.dx_gemm = fwd_of(&l.dh_q, &l.w1, true, splits, MOEX_BIAS_NONE, NULL, NULL, &a->dx);

    const moex_gl_dims d1 = gl_dims(d, H, 2 * F), d2 = gl_dims(d, F, H);
    const moex_glu_dims dg = glu_dims(d);
    size_t sub = 0;
    if (p.fc2_bias) sub = moex_sz_max(sub, ops->linear_dgrad_ws(ctx, &l.fc2_bias, &d2));
    if (p.need_dz || p.dw2) sub = moex_sz_max(sub, ops->quantize_ws(ctx, &l.q_dy, &l.dy.d));
    if (p.dw2 && moex_present(&a->z)) sub = moex_sz_max(sub, ops->quantize_ws(ctx, &l.q_z, &l.zq.d));
    if (p.dw2 && !moex_present(&a->z))
        sub = moex_sz_max(sub, moex_op_scaled_glu_forward_ws(ctx, &l.glu_fwd.a, &l.glu_fwd.d));
    if (p.dw2) sub = moex_sz_max(sub, dw_ws(ctx, &l.dw2));
    if (p.need_dz) {
        sub = moex_sz_max(sub, quantize_weight_ws(ctx, &a->w2, &l.w2));
        sub = moex_sz_max(sub, fwd_ws(ctx, &l.dz_gemm));
        sub = moex_sz_max(sub, ops->glu_bwd_ws(ctx, &l.glu_bwd, &dg));
    }
    if (p.db1) sub = moex_sz_max(sub, ops->linear_dgrad_ws(ctx, &l.fc1_bias, &d1));
    if (p.dx || p.dw1) sub = moex_sz_max(sub, ops->quantize_ws(ctx, &l.q_dh, &l.dh_q.d));
    if (p.dx) {
        sub = moex_sz_max(sub, quantize_weight_ws(ctx, &a->w1, &l.w1));
        sub = moex_sz_max(sub, fwd_ws(ctx, &l.dx_gemm));
    }
    if (p.dw1) {
        sub = moex_sz_max(sub, ops->quantize_ws(ctx, &l.q_x, &l.x.d));
        sub = moex_sz_max(sub, dw_ws(ctx, &l.dw1));
    }
    l.sub = moex_take(&c, sub);
    l.total = c.used;
    return l;
}

size_t moex_fp8_mlp_backward_ws(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d) {
    return mlp_bwd_layout(ctx, a, d, NULL).total;
}

moex_status moex_fp8_mlp_backward_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_grad_args *a,
                                      const moex_mlp_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const mlp_bwd l = mlp_bwd_layout(ctx, a, d, ws);
    const mlp_plan p = l.p;
    moex_groups g;
    MOEX_TRY(begin(ctx, c, &a->splits, d->T, d->G, l.groups, &g));
    const moex_gl_dims d1 = gl_dims(d, d->H, 2 * d->F), d2 = gl_dims(d, d->F, d->H);
    const moex_glu_dims dg = glu_dims(d);

    /* FC2: db2 and the scaled-b2 dprobs term (first, as the plain composition adds it), dy's
     * copies, dW2 from z's columnwise copy, dz = dy W2 */
    if (p.fc2_bias) MOEX_TRY(ops->linear_dgrad(ctx, c, &g, &l.fc2_bias, &d2, l.sub));
    if (p.need_dz || p.dw2) MOEX_TRY(ops->quantize(ctx, c, &g, &l.q_dy, &l.dy.d, l.sub));
    if (p.dw2) {
        if (moex_present(&a->z)) MOEX_TRY(ops->quantize(ctx, c, &g, &l.q_z, &l.zq.d, l.sub));
        else MOEX_TRY(moex_op_scaled_glu_forward_run(ctx, c, &l.glu_fwd.a, &l.glu_fwd.d, l.sub));
        MOEX_TRY(dw_run(ctx, c, &l.dw2, l.sub));
    }
    if (!p.need_dz) return MOEX_OK;
    MOEX_TRY(quantize_weight(ctx, c, &a->w2, &l.w2, l.sub));
    MOEX_TRY(fwd_run(ctx, c, &l.dz_gemm, l.sub));
    /* GLU: dh (when needed) and the GLU's dprobs term */
    MOEX_TRY(ops->glu_bwd(ctx, c, &g, &l.glu_bwd, &dg, l.sub));
    if (!p.need_dh) return MOEX_OK;
    /* FC1: db1, dh's copies, dx = dh W1, dW1 from x's columnwise copy */
    if (p.db1) MOEX_TRY(ops->linear_dgrad(ctx, c, &g, &l.fc1_bias, &d1, l.sub));
    if (p.dx || p.dw1) MOEX_TRY(ops->quantize(ctx, c, &g, &l.q_dh, &l.dh_q.d, l.sub));
    if (p.dx) {
        MOEX_TRY(quantize_weight(ctx, c, &a->w1, &l.w1, l.sub));
        MOEX_TRY(fwd_run(ctx, c, &l.dx_gemm, l.sub));
    }
    if (p.dw1) {
        MOEX_TRY(ops->quantize(ctx, c, &g, &l.q_x, &l.x.d, l.sub));
        MOEX_TRY(dw_run(ctx, c, &l.dw1, l.sub));
    }
    return MOEX_OK;
}
