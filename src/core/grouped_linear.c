/*
 * grouped_linear.c - moex_splits_to_offsets, moex_zero_tail, a discrete weight's maps
 * (moex_weight_maps_size, moex_weight_maps_write) and the grouped linear layer:
 * validation and composition (the math: docs/ops.md 1, 2; the FP8 recipe 9.11), and the
 * grouped linear's GEMMs in either precision, which the grouped MLP's plan runs too (op.h),
 * with the FP8 weight copies a caller keeps (moex_fp8_weight_params, moex_fp8_weight_layout).
 *
 *   splits_to_offsets:  the backend's splits_to_offsets primitive
 *   zero_tail:          prepare the groups, zero_tail
 *   weight_maps_write:  the backend's weight_maps_write primitive (nothing when it needs none)
 *   forward:            prepare the groups; x's and W's rowwise copies; y = x W^T (+ bias)
 *   backward_data:      prepare the groups; dbias, dprobs (FP8: first, on dy); dy's rowwise and
 *                       W's columnwise copies; dx = dy W (plain: with dbias and dprobs)
 *   backward_weight:    prepare the groups; dy's and x's columnwise copies; dW = dy^T x
 * The precision is args->fp8: plain (MOEX_FP8_OFF), no copies, and each GEMM is the linear
 * primitive (linear_fwd, linear_dgrad, linear_wgrad) on the caller's tensors; FP8, the copy
 * steps quantize the operands into the workspace and each GEMM is the FP8 grouped linear's
 * (fp8_linear.c) on them. Only what the present outputs need is computed.
 * splits_to_offsets' ws and run only call its primitive: one plain definition per op function
 * (op.h), so that op.c's dispatch and grep find each; their shape repeats by design.
 */
#include "op.h"

#include <stdio.h>
#include <string.h>

/* ---- splits_to_offsets --------------------------------------------------------------- */

moex_status moex_op_splits_to_offsets_validate(moex_context *ctx, const char *op,
                                               const moex_splits_to_offsets_args *a, moex_purpose p,
                                               moex_splits_dims *d) {
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    if (a->num_outputs < 1 || a->num_outputs > MOEX_MAX_OFFSETS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: num_outputs = %d, must be 1..%d", op,
                         (int)a->num_outputs, MOEX_MAX_OFFSETS);
    for (int i = 0; i < a->num_outputs; i++) {
        const moex_offsets_output *o = &a->outputs[i];
        char name[32];
        snprintf(name, sizeof name, "outputs[%d].out", i);
        if (o->start != MOEX_OFFSETS_LEADING_ZERO && o->start != MOEX_OFFSETS_INCLUSIVE)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: outputs[%d].start is unknown (%d)", op, i,
                             (int)o->start);
        if (o->stride < 1)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: outputs[%d].stride = %lld, must be >= 1", op, i,
                             (long long)o->stride);
        const int64_t len[1] = {d->G + (o->start == MOEX_OFFSETS_LEADING_ZERO)};
        MOEX_TRY(moex_check_output(ctx, op, name, &o->out, 1, len, MOEX_DT_OFFSETS));
    }
    return MOEX_OK;
}

/* ---- zero_tail ----------------------------------------------------------------------- */

moex_status moex_op_zero_tail_validate(moex_context *ctx, const char *op, const moex_zero_tail_args *a,
                                       moex_purpose p, moex_tail_dims *d) {
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    const moex_tensor *x = &a->x;
    if (x->ndim < 1 || x->ndim > MOEX_MAX_DIMS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: x must have 1 to %d dimensions, has %d", op, MOEX_MAX_DIMS,
                         (int)x->ndim);
    const int64_t any[MOEX_MAX_DIMS] = {-1, -1, -1, -1};
    MOEX_TRY(moex_check_output(ctx, op, "x", x, x->ndim, any, ~0u));
    d->T = x->shape[0];
    d->row_bytes = 0;   /* T = 0: no rows, whatever the other sizes (their product may not fit) */
    if (d->T == 0) return MOEX_OK;
    d->row_bytes = (int64_t)moex_dtype_size(x->dtype);   /* < 2^63: T >= 1 rows, 2^60 elements at most */
    for (int i = 1; i < x->ndim; i++) d->row_bytes *= x->shape[i];
    return MOEX_OK;
}

/* Workspace: the prepared handle, then the primitive's region, carved alike by the size
 * query (ws NULL) and the run. */
static size_t zero_tail_layout(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d, void *ws,
                               void **groups, void **sub) {
    moex_carver cv = {(char *)ws, 0};
    *groups = moex_take(&cv, moex_ops(ctx)->groups_ws(ctx, d->G, d->T, NULL));
    *sub = moex_take(&cv, moex_ops(ctx)->zero_tail_ws(ctx, a, d));
    return cv.used;
}

size_t moex_op_zero_tail_ws(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d) {
    void *groups, *sub;
    return zero_tail_layout(ctx, a, d, NULL, &groups, &sub);
}

moex_status moex_op_zero_tail_run(moex_context *ctx, const moex_call *c, const moex_zero_tail_args *a,
                                  const moex_tail_dims *d, void *ws) {
    void *groups, *sub;
    zero_tail_layout(ctx, a, d, ws, &groups, &sub);
    moex_groups g;
    MOEX_TRY(moex_begin_groups(ctx, c, &a->splits, d->T, NULL, groups, &g));
    return moex_ops(ctx)->zero_tail(ctx, c, &g, a, d, sub);
}

/* ---- weight_maps_write ------------------------------------------------------------------ */

/* d from a discrete weight w of any shape (its maps not checked: the maps' own calls). */
static moex_status weight_maps_dims(moex_context *ctx, const char *op, const moex_weight *w, moex_gl_dims *d) {
    if (!w->ptrs)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: w is not a discrete weight (ptrs is NULL); only "
                         "discrete weights have maps", op);
    moex_weight plain = *w;
    plain.maps = NULL;
    MOEX_TRY(moex_check_weight(ctx, op, "w", &plain, -1, -1, -1, MOEX_DT_FLOAT));
    d->G = w->t.shape[0], d->N = w->t.shape[1], d->K = w->t.shape[2], d->T = 0, d->dt = w->t.dtype;
    return MOEX_OK;
}

moex_status moex_op_weight_maps_write_validate(moex_context *ctx, const char *op,
                                               const moex_weight_maps_write_args *a, moex_purpose p,
                                               moex_gl_dims *d) {
    (void)p;
    MOEX_TRY(weight_maps_dims(ctx, op, &a->w, d));
    const size_t need = moex_ops(ctx)->weight_maps_size(ctx, d);
    if (need == 0) return MOEX_OK;
    if (a->maps_bytes < need)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: maps_bytes = %zu, the maps need %zu (moex_weight_maps_size)",
                         op, a->maps_bytes, need);
    if (!a->maps || (uintptr_t)a->maps % MOEX_WEIGHT_MAPS_ALIGN != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: maps (%p) must be %d-byte aligned device memory", op,
                         a->maps, MOEX_WEIGHT_MAPS_ALIGN);
    return moex_record_span(ctx, op, "maps", a->maps, need, MOEX_SPAN_OUT);
}

size_t moex_op_weight_maps_write_ws(moex_context *ctx, const moex_weight_maps_write_args *a, const moex_gl_dims *d) {
    (void)ctx, (void)a, (void)d;
    return 0;
}

moex_status moex_op_weight_maps_write_run(moex_context *ctx, const moex_call *c, const moex_weight_maps_write_args *a,
                                          const moex_gl_dims *d, void *ws) {
    (void)ws;
    return moex_ops(ctx)->weight_maps_size(ctx, d) > 0 ? moex_ops(ctx)->weight_maps_write(ctx, c, a, d) : MOEX_OK;
}

/* ---- the precision: the FP8 operands ----------------------------------------------------
 * With an FP8 recipe (docs/ops.md 9.11) the operands of the GEMMs are quantized into FP8
 * copies in the workspace: activations (x, z) E4M3, weights E4M3, gradients (dy, dh) E4M3 or
 * E5M2 (HYBRID); mode BLOCK: rows 1x128 (BLOCK), weights 128x128 (BLOCK); CURRENT: rows GROUP,
 * weights GROUP; MXFP8: MXFP8 both. A GEMM reducing over the features reads rowwise copies (the
 * weights' rowwise copy in the forward, their columnwise copy, W^T, in the backward data); a
 * GEMM reducing over the rows (the weight gradients) reads the columnwise copies. The weights
 * are quantized from their master copy on every call (a discrete weight is first copied into a
 * packed one, weight_copy). */

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

moex_quant_params moex_fp8_weight_params(const moex_fp8_recipe *recipe) {
    if (recipe) return params_of(recipe, false);
    moex_quant_params p;
    memset(&p, 0, sizeof p);
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

/* What the two take functions below open with: *q zeroed, then its quantization (by its role)
 * and the dims of its quantize (qdims); false with r->mode OFF (q stays all zero, nothing is
 * carved). */
static bool operand_of(const moex_fp8_recipe *r, bool grad, int64_t G, int64_t T, int64_t K, moex_dtype dt,
                       bool weight, moex_fp8_operand *q) {
    memset(q, 0, sizeof *q);
    if (r->mode == MOEX_FP8_OFF) return false;
    q->p = params_of(r, grad);
    q->d = qdims(G, T, K, dt, &q->p, weight);
    return true;
}

/* Grouped rows (docs/ops.md 9.4): rowwise data [T, K], columnwise [K, T]; GROUP scales [G],
 * block scales [T, ceil(K/B)] and [K, ceil(T/B) + G]. */
void moex_fp8_take_rows(moex_carver *c, const moex_fp8_recipe *r, bool grad, int64_t G, int64_t T, int64_t K,
                        moex_dtype dt, bool row, bool col, moex_fp8_operand *q) {
    if (!operand_of(r, grad, G, T, K, dt, false, q)) return;
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

/* Weights (docs/ops.md 9.7): rowwise data [G, N, K], columnwise [G, K, N]; GROUP scales [G];
 * BLOCK [G, ceil(rows/128), ceil(cols/128)]; MXFP8 [G, rows, ceil(cols/32)] (rows, cols: those
 * of the copy). */
void moex_fp8_take_weight(moex_carver *c, const moex_fp8_recipe *r, int which, int64_t G, int64_t N, int64_t K,
                          moex_dtype dt, bool row, bool col, moex_fp8_operand *q) {
    if (!operand_of(r, false, G, N, K, dt, true, q)) return;
    const moex_fp8_weight *kept = r->weights ? &r->weights[which] : NULL;
    const int64_t B = q->d.block;
    for (int k = 0; k < 2; k++) {
        if (!(k == 0 ? row : col)) continue;
        const moex_quant_tensor *kept_copy = kept ? (k == 0 ? &kept->rowwise : &kept->columnwise) : NULL;
        const bool given = kept_copy && kept_copy->data.ndim != 0;
        moex_quant_tensor t;
        if (given) {
            t = *kept_copy;
        } else {
            const int64_t rows = k == 0 ? N : K, cols = k == 0 ? K : N;
            const int64_t ds[3] = {G, rows, cols};
            const int64_t ss[3] = {G, B == 128 ? moex_i64_cdiv(rows, 128) : rows, B ? moex_i64_cdiv(cols, B) : 1};
            t = take_copy(c, &q->p, 3, ds, B ? 3 : 1, ss);
        }
        if (k == 0) q->row = t, q->row_given = given;
        else q->col = t, q->col_given = given;
    }
}

moex_status moex_fp8_check_weight_copies(moex_context *ctx, const char *op, const moex_fp8_recipe *r, int which,
                                         const char *name, int64_t G, int64_t N, int64_t K) {
    if (r->mode == MOEX_FP8_OFF || r->weights == NULL) return MOEX_OK;
    const moex_fp8_weight *kept = &r->weights[which];
    const moex_quant_params p = params_of(r, false);
    for (int k = 0; k < 2; k++) {
        const moex_quant_tensor *copy = k == 0 ? &kept->rowwise : &kept->columnwise;
        if (copy->data.ndim == 0) continue;
        char dn[64], sn[64];
        snprintf(dn, sizeof dn, "fp8.weights[%d].%s.data (%s)", which, k == 0 ? "rowwise" : "columnwise", name);
        snprintf(sn, sizeof sn, "fp8.weights[%d].%s.scales (%s)", which, k == 0 ? "rowwise" : "columnwise", name);
        /* a columnwise copy of W [G, N, K] is laid out as a rowwise copy of W^T [G, K, N] */
        moex_quant_dims d = {G, k == 0 ? N : K, k == 0 ? K : N, MOEX_DTYPE_F32, 0, 0, 0};
        MOEX_TRY(moex_quant_check_weight_input(ctx, op, dn, sn, &p, copy, &d));
    }
    return MOEX_OK;
}

static bool has_copies(const moex_fp8_operand *q) { return q->row.data.ndim != 0 || q->col.data.ndim != 0; }

/* A weight operand's copies to write: those the caller does not keep. */
static bool has_weight_copies(const moex_fp8_operand *q) {
    return (q->row.data.ndim != 0 && !q->row_given) || (q->col.data.ndim != 0 && !q->col_given);
}

static moex_group_quantize_args rows_quantize_args(const moex_tensor *x, const moex_tensor *splits,
                                                   const moex_fp8_operand *q) {
    moex_group_quantize_args a;
    memset(&a, 0, sizeof a);
    a.x = *x, a.splits = *splits, a.params = q->p, a.rowwise = q->row, a.columnwise = q->col;
    return a;
}

size_t moex_fp8_rows_ws(moex_context *ctx, const moex_tensor *x, const moex_tensor *splits,
                        const moex_fp8_operand *q) {
    if (!has_copies(q)) return 0;
    const moex_group_quantize_args a = rows_quantize_args(x, splits, q);
    return moex_ops(ctx)->quantize_ws(ctx, &a, &q->d);
}

moex_status moex_fp8_rows_quantize(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_tensor *x,
                                   const moex_tensor *splits, const moex_fp8_operand *q, void *sub) {
    if (!has_copies(q)) return MOEX_OK;
    const moex_group_quantize_args a = rows_quantize_args(x, splits, q);
    return moex_ops(ctx)->quantize(ctx, c, g, &a, &q->d, sub);
}

/* A discrete weight is first copied into a packed one at the start of the step's region
 * (weight_copy: its pointer array is read where it lives), then quantized as a packed one. */
static size_t packed_bytes(const moex_weight *w) {
    return w->ptrs ? moex_sz_mul(moex_sz_bytes(w->t.shape[0], w->t.shape[1], moex_dtype_size(w->t.dtype)),
                                 (size_t)w->t.shape[2])
                   : 0;
}

static moex_weight_quantize_args weight_quantize_args(const moex_weight *packed, const moex_fp8_operand *q) {
    moex_weight_quantize_args a;
    memset(&a, 0, sizeof a);
    a.params = q->p, a.w = packed->t;
    if (!q->row_given) a.rowwise = q->row;
    if (!q->col_given) a.columnwise = q->col;
    return a;
}

size_t moex_fp8_weight_ws(moex_context *ctx, const moex_weight *w, const moex_fp8_operand *q) {
    if (!has_weight_copies(q)) return 0;
    const moex_weight_quantize_args a = weight_quantize_args(w, q);
    return moex_sz_add(moex_sz_align(packed_bytes(w), MOEX_WS_ALIGN), moex_ops(ctx)->weight_quantize_ws(ctx, &a, &q->d));
}

moex_status moex_fp8_weight_quantize(moex_context *ctx, const moex_call *c, const moex_weight *w,
                                     const moex_fp8_operand *q, void *sub) {
    if (!has_weight_copies(q)) return MOEX_OK;
    const moex_backend_ops *ops = moex_ops(ctx);
    moex_weight packed = *w;
    if (w->ptrs) {
        packed = moex_weight_packed(moex_tensor_3d(sub, w->t.dtype, w->t.shape[0], w->t.shape[1], w->t.shape[2]));
        const moex_weight_copy_args cp = {*w, packed};
        const moex_gl_dims d = {w->t.shape[0], w->t.shape[1], w->t.shape[2], 0, w->t.dtype};
        MOEX_TRY(ops->weight_copy(ctx, c, &cp, &d, NULL));
        sub = (char *)sub + moex_sz_align(packed_bytes(w), MOEX_WS_ALIGN);
    }
    const moex_weight_quantize_args a = weight_quantize_args(&packed, q);
    return ops->weight_quantize(ctx, c, &a, &q->d, sub);
}

/* ---- the GEMMs in either precision ---------------------------------------------------- */

static const moex_tensor absent_tensor;

/* The FP8 grouped linear's forward y = x W^T (+ bias) on x's rowwise copy [T, K] and W's
 * rowwise copy (W [G, N, K]) or, w_col, its columnwise copy (W^T [G, K, N]: the product dy W). */
static void fp8_fwd_of(const moex_fp8_operand *x, const moex_fp8_operand *w, bool w_col, const moex_tensor *splits,
                       moex_bias_mode mode, const moex_tensor *bias, const moex_tensor *probs, const moex_tensor *y,
                       moex_grouped_linear_fp8_args *f, moex_fp8_dims *fd) {
    memset(f, 0, sizeof *f);
    const int64_t G = x->d.G, T = x->d.T, K = x->d.K, N = w_col ? w->d.K : w->d.T;
    f->x_params = x->p, f->x = x->row;
    f->w_params = w->p, f->w = w_col ? w->col : w->row;
    f->splits = *splits;
    f->bias_mode = mode;
    if (mode != MOEX_BIAS_NONE) f->bias = *bias;
    if (mode == MOEX_BIAS_SCALED) f->probs = *probs;
    f->y = *y;
    const moex_gl_dims gl = {G, T, K, N, y->dtype};
    fd->gl = gl;
    fd->a = qdims(G, T, K, MOEX_DTYPE_F32, &x->p, false);
    fd->b = qdims(G, N, K, MOEX_DTYPE_F32, &w->p, true);
}

moex_gl_fwd moex_gl_fwd_of(const moex_grouped_linear_args *a, const moex_gl_dims *d, const moex_fp8_operand *x,
                           const moex_fp8_operand *w) {
    moex_gl_fwd s;
    memset(&s, 0, sizeof s);
    s.a = *a, s.d = *d;
    s.fp8 = x != NULL;
    if (s.fp8) fp8_fwd_of(x, w, false, &a->splits, a->bias_mode, &a->bias, &a->probs, &a->y, &s.f, &s.fd);
    return s;
}

size_t moex_gl_fwd_ws(moex_context *ctx, const moex_gl_fwd *s) {
    if (s->fp8) return moex_op_grouped_linear_fp8_forward_ws(ctx, &s->f, &s->fd);
    return moex_ops(ctx)->linear_fwd_ws(ctx, &s->a, &s->d);
}

moex_status moex_gl_fwd_run(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_gl_fwd *s,
                            void *sub) {
    if (s->fp8) return moex_op_grouped_linear_fp8_forward_run(ctx, c, &s->f, &s->fd, sub);
    return moex_ops(ctx)->linear_fwd(ctx, c, g, &s->a, &s->d, sub);
}

moex_gl_dgrad moex_gl_dgrad_of(const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d,
                               const moex_fp8_operand *dy, const moex_fp8_operand *w) {
    moex_gl_dgrad s;
    memset(&s, 0, sizeof s);
    s.a = *a, s.d = *d;
    s.fp8 = dy != NULL;
    if (!s.fp8) return s;
    s.bias = moex_present(&a->dbias) || moex_present(&a->dprobs);
    s.dx = moex_present(&a->dx);
    s.a.dx = absent_tensor;
    fp8_fwd_of(dy, w, true, &a->splits, MOEX_BIAS_NONE, NULL, NULL, &a->dx, &s.f, &s.fd);
    return s;
}

size_t moex_gl_dgrad_ws(moex_context *ctx, const moex_gl_dgrad *s) {
    const moex_backend_ops *ops = moex_ops(ctx);
    if (!s->fp8) return ops->linear_dgrad_ws(ctx, &s->a, &s->d);
    size_t ws = s->bias ? ops->linear_dgrad_ws(ctx, &s->a, &s->d) : 0;
    if (s->dx) ws = moex_sz_max(ws, moex_op_grouped_linear_fp8_forward_ws(ctx, &s->f, &s->fd));
    return ws;
}

moex_status moex_gl_dgrad_bias_run(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                   const moex_gl_dgrad *s, void *sub) {
    if (!s->fp8 || !s->bias) return MOEX_OK;
    return moex_ops(ctx)->linear_dgrad(ctx, c, g, &s->a, &s->d, sub);
}

moex_status moex_gl_dgrad_run(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_gl_dgrad *s,
                              void *sub) {
    if (!s->fp8) return moex_ops(ctx)->linear_dgrad(ctx, c, g, &s->a, &s->d, sub);
    return s->dx ? moex_op_grouped_linear_fp8_forward_run(ctx, c, &s->f, &s->fd, sub) : MOEX_OK;
}

moex_gl_wgrad moex_gl_wgrad_of(const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d,
                               const moex_fp8_operand *dy, const moex_fp8_operand *x) {
    moex_gl_wgrad s;
    memset(&s, 0, sizeof s);
    s.a = *a, s.d = *d;
    s.fp8 = dy != NULL;
    if (!s.fp8) return s;
    s.f.dy_params = dy->p, s.f.dy = dy->col;
    s.f.x_params = x->p, s.f.x = x->col;
    s.f.splits = a->splits;
    s.f.dw_mode = a->dw_mode;
    s.f.dw = a->dw;
    const moex_gl_dims gl = {d->G, d->T, d->K, d->N, MOEX_DTYPE_F32};
    s.fd.gl = gl;
    s.fd.a = qdims(d->G, d->T, d->N, MOEX_DTYPE_F32, &dy->p, false);
    s.fd.b = qdims(d->G, d->T, d->K, MOEX_DTYPE_F32, &x->p, false);
    return s;
}

size_t moex_gl_wgrad_ws(moex_context *ctx, const moex_gl_wgrad *s) {
    if (!s->fp8) return moex_ops(ctx)->linear_wgrad_ws(ctx, &s->a, &s->d);
    return moex_op_grouped_linear_fp8_backward_weight_ws(ctx, &s->f, &s->fd);
}

moex_status moex_gl_wgrad_run(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_gl_wgrad *s,
                              void *sub) {
    if (!s->fp8) return moex_ops(ctx)->linear_wgrad(ctx, c, g, &s->a, &s->d, sub);
    return moex_op_grouped_linear_fp8_backward_weight_run(ctx, c, &s->f, &s->fd, sub);
}

/* ---- validation shared with the grouped MLP and the MoE layer --------------------------- */

moex_status moex_fp8_check_out(moex_context *ctx, const char *op, const moex_fp8_recipe *r, moex_purpose p,
                               const char *name, const void *data) {
    if (r->mode == MOEX_FP8_OFF || p != MOEX_FOR_RUN || moex_ops(ctx)->host_memory || ((uintptr_t)data & 15u) == 0)
        return MOEX_OK;
    return moex_fail(ctx, MOEX_ERR_UNSUPPORTED,
                     "%s: with an FP8 recipe on a device backend %s must be 16-byte aligned: the FP8 GEMM kernels "
                     "write it (docs/ops.md 9.11)",
                     op, name);
}

/* ---- the three ops' plans ----------------------------------------------------------------
 * Workspace: the prepared handle (the forward's, in plain precision, carrying its GEMM's own
 * scratch where the backend wants one: groups_ws), the FP8 copies the precision needs, then
 * one region shared by the steps (they run one after the other; the FP8 backward weight's own
 * f32 copy of a dW its kernels cannot write is in that region: fp8_linear.c).
 * A run: the backend's limits, the groups, the copy steps, then the GEMM. The three ops differ
 * only in their two operands and their GEMM: each names them in a gl_op (fwd_op, dgrad_op,
 * wgrad_op), and one plan (plan_of) and one run (plan_run) serve all three. Each op's ws and
 * run only call those: plain definitions (op.h), alike in shape by design. */

static bool is_fp8(const moex_fp8_recipe *r) { return r->mode != MOEX_FP8_OFF; }

typedef enum gl_step { GL_FORWARD, GL_BACKWARD_DATA, GL_BACKWARD_WEIGHT } gl_step;

/* One operand of the GEMM as the FP8 precision copies it: grouped rows `rows` [T, cols] (grad:
 * a gradient's quantization) or, rows NULL, the weight w [G, N, K] (recipe.weights[0]); row,
 * col: the copies the GEMM reads. */
typedef struct gl_source {
    const moex_tensor *rows;
    const moex_weight *w;
    bool grad;
    int64_t cols;
    bool row, col;
} gl_source;

/* One op: its step, its args (the member the step names) and what its plan reads of them. */
typedef struct gl_op {
    gl_step step;
    union {
        const moex_grouped_linear_args *fwd;
        const moex_grouped_linear_dgrad_args *dgrad;
        const moex_grouped_linear_wgrad_args *wgrad;
    } a;
    const moex_fp8_recipe *fp8;
    const moex_tensor *splits;
    const moex_grouped_linear_args *groups_arg;   /* groups_ws' and moex_begin_groups' (the
                                                     forward's args in plain precision) */
    gl_source src[2];                             /* the GEMM's operands, in carving and copy order */
} gl_op;

typedef struct gl_plan {
    void *groups, *sub;
    moex_fp8_operand q[2];                        /* src[i]'s copies (all zero in plain precision) */
    union {
        moex_gl_fwd fwd;
        moex_gl_dgrad dgrad;
        moex_gl_wgrad wgrad;
    } gemm;                                       /* the member o.step names */
    size_t total;
} gl_plan;

static size_t source_ws(moex_context *ctx, const gl_op *o, int i, const moex_fp8_operand *q) {
    const gl_source *s = &o->src[i];
    return s->rows ? moex_fp8_rows_ws(ctx, s->rows, o->splits, q) : moex_fp8_weight_ws(ctx, s->w, q);
}

static moex_status source_quantize(moex_context *ctx, const moex_call *c, const moex_groups *g, const gl_op *o, int i,
                                   const moex_fp8_operand *q, void *sub) {
    const gl_source *s = &o->src[i];
    return s->rows ? moex_fp8_rows_quantize(ctx, c, g, s->rows, o->splits, q, sub)
                   : moex_fp8_weight_quantize(ctx, c, s->w, q, sub);
}

/* The plan: the workspace above (ws NULL: its size only, total) and the GEMM on the copies. */
static gl_plan plan_of(moex_context *ctx, gl_op o, const moex_gl_dims *d, void *ws) {
    moex_carver c = {(char *)ws, 0};
    gl_plan l;
    l.groups = moex_take(&c, moex_ops(ctx)->groups_ws(ctx, d->G, d->T, o.groups_arg));
    for (int i = 0; i < 2; i++) {
        const gl_source *s = &o.src[i];
        if (s->rows) moex_fp8_take_rows(&c, o.fp8, s->grad, d->G, d->T, s->cols, d->dt, s->row, s->col, &l.q[i]);
        else moex_fp8_take_weight(&c, o.fp8, 0, d->G, d->N, d->K, d->dt, s->row, s->col, &l.q[i]);
    }
    const moex_fp8_operand *q0 = is_fp8(o.fp8) ? &l.q[0] : NULL, *q1 = is_fp8(o.fp8) ? &l.q[1] : NULL;
    size_t sub = 0;
    switch (o.step) {
    case GL_FORWARD:
        l.gemm.fwd = moex_gl_fwd_of(o.a.fwd, d, q0, q1);
        sub = moex_gl_fwd_ws(ctx, &l.gemm.fwd);
        break;
    case GL_BACKWARD_DATA:
        l.gemm.dgrad = moex_gl_dgrad_of(o.a.dgrad, d, q0, q1);
        sub = moex_gl_dgrad_ws(ctx, &l.gemm.dgrad);
        break;
    case GL_BACKWARD_WEIGHT:
        l.gemm.wgrad = moex_gl_wgrad_of(o.a.wgrad, d, q0, q1);
        sub = moex_gl_wgrad_ws(ctx, &l.gemm.wgrad);
        break;
    }
    for (int i = 0; i < 2; i++) sub = moex_sz_max(sub, source_ws(ctx, &o, i, &l.q[i]));
    l.sub = moex_take(&c, sub);
    l.total = c.used;
    return l;
}

static moex_status plan_run(moex_context *ctx, const moex_call *c, gl_op o, const moex_gl_dims *d, void *ws) {
    const gl_plan l = plan_of(ctx, o, d, ws);
    moex_groups g;
    MOEX_TRY(moex_begin_groups(ctx, c, o.splits, d->T, o.groups_arg, l.groups, &g));
    /* the backward data's bias terms first (FP8: on dy, before its copy; plain: nothing here) */
    if (o.step == GL_BACKWARD_DATA) MOEX_TRY(moex_gl_dgrad_bias_run(ctx, c, &g, &l.gemm.dgrad, l.sub));
    for (int i = 0; i < 2; i++) MOEX_TRY(source_quantize(ctx, c, &g, &o, i, &l.q[i], l.sub));
    if (o.step == GL_FORWARD) return moex_gl_fwd_run(ctx, c, &g, &l.gemm.fwd, l.sub);
    if (o.step == GL_BACKWARD_DATA) return moex_gl_dgrad_run(ctx, c, &g, &l.gemm.dgrad, l.sub);
    return moex_gl_wgrad_run(ctx, c, &g, &l.gemm.wgrad, l.sub);
}

/* ---- forward: x's and W's rowwise copies, y = x W^T (+ bias) -------------------------- */

static gl_op fwd_op(const moex_grouped_linear_args *a, const moex_gl_dims *d) {
    return (gl_op){.step = GL_FORWARD, .a.fwd = a, .fp8 = &a->fp8, .splits = &a->splits,
                   .groups_arg = is_fp8(&a->fp8) ? NULL : a,
                   .src = {{.rows = &a->x, .cols = d->K, .row = true}, {.w = &a->w, .row = true}}};
}

moex_status moex_op_grouped_linear_forward_validate(moex_context *ctx, const char *op,
                                                    const moex_grouped_linear_args *a, moex_purpose p,
                                                    moex_gl_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, &a->splits, "x", &a->x, &d->G, &d->T, &d->K, &d->dt));
    d->N = a->w.t.ndim == 3 ? a->w.t.shape[1] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w", &a->w, d->G, -1, d->K, MOEX_DT(d->dt)));
    const int64_t yshape[2] = {d->T, d->N};
    MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, yshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_features(ctx, op, d->K, d->N));
    MOEX_TRY(moex_check_probs_scaled(ctx, op, a->bias_mode, &a->probs));
    MOEX_TRY(moex_check_bias(ctx, op, a->bias_mode, &a->bias, "bias", &a->probs, d->G, d->T, d->N, d->dt, true));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    MOEX_TRY(moex_fp8_check_weight_copies(ctx, op, &a->fp8, 0, "w", d->G, d->N, d->K));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "y", a->y.data);
}

size_t moex_op_grouped_linear_forward_ws(moex_context *ctx, const moex_grouped_linear_args *a, const moex_gl_dims *d) {
    return plan_of(ctx, fwd_op(a, d), d, NULL).total;
}

moex_status moex_op_grouped_linear_forward_run(moex_context *ctx, const moex_call *c, const moex_grouped_linear_args *a,
                                               const moex_gl_dims *d, void *ws) {
    return plan_run(ctx, c, fwd_op(a, d), d, ws);
}

/* ---- backward data: the bias terms, dy's rowwise and W's columnwise copies, dx = dy W ---- */

static gl_op dgrad_op(const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d) {
    const bool dx = moex_present(&a->dx);
    return (gl_op){.step = GL_BACKWARD_DATA, .a.dgrad = a, .fp8 = &a->fp8, .splits = &a->splits,
                   .src = {{.rows = &a->dy, .grad = true, .cols = d->N, .row = dx}, {.w = &a->w, .col = dx}}};
}

moex_status moex_op_grouped_linear_backward_data_validate(moex_context *ctx, const char *op,
                                                          const moex_grouped_linear_dgrad_args *a, moex_purpose p,
                                                          moex_gl_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, &a->splits, "dy", &a->dy, &d->G, &d->T, &d->N, &d->dt));
    d->K = a->w.t.ndim == 3 ? a->w.t.shape[2] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w", &a->w, d->G, d->N, -1, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_features(ctx, op, d->K, d->N));
    const int64_t dxshape[2] = {d->T, d->K}, dbshape[2] = {d->G, d->N}, dpshape[1] = {d->T};
    MOEX_TRY(moex_check_optional_output(ctx, op, "dx", &a->dx, 2, dxshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dbias", &a->dbias, 2, dbshape, MOEX_DT_BIAS(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 1, dpshape, MOEX_DT_F32));
    if (a->bias_mode == MOEX_BIAS_NONE && moex_present(&a->dbias))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dbias is requested but the bias mode is MOEX_BIAS_NONE", op);
    if (a->bias_mode != MOEX_BIAS_SCALED && moex_present(&a->dprobs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: dprobs is requested but the bias mode is not MOEX_BIAS_SCALED", op);
    MOEX_TRY(moex_check_probs_scaled(ctx, op, a->bias_mode, &a->probs));
    /* The bias values are needed only for dprobs. */
    bool bias_needed = a->bias_mode == MOEX_BIAS_SCALED && moex_present(&a->dprobs);
    MOEX_TRY(moex_check_bias(ctx, op, a->bias_mode, &a->bias, "bias", &a->probs, d->G, d->T, d->N, d->dt,
                             bias_needed));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    MOEX_TRY(moex_fp8_check_weight_copies(ctx, op, &a->fp8, 0, "w", d->G, d->N, d->K));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "dx", a->dx.data);
}

size_t moex_op_grouped_linear_backward_data_ws(moex_context *ctx, const moex_grouped_linear_dgrad_args *a,
                                               const moex_gl_dims *d) {
    return plan_of(ctx, dgrad_op(a, d), d, NULL).total;
}

moex_status moex_op_grouped_linear_backward_data_run(moex_context *ctx, const moex_call *c,
                                                     const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d,
                                                     void *ws) {
    return plan_run(ctx, c, dgrad_op(a, d), d, ws);
}

/* ---- backward weight: dy's and x's columnwise copies, dW = dy^T x ----------------------- */

static gl_op wgrad_op(const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d) {
    return (gl_op){.step = GL_BACKWARD_WEIGHT, .a.wgrad = a, .fp8 = &a->fp8, .splits = &a->splits,
                   .src = {{.rows = &a->dy, .grad = true, .cols = d->N, .col = true},
                           {.rows = &a->x, .cols = d->K, .col = true}}};
}

moex_status moex_op_grouped_linear_backward_weight_validate(moex_context *ctx, const char *op,
                                                            const moex_grouped_linear_wgrad_args *a, moex_purpose p,
                                                            moex_gl_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, &a->splits, "x", &a->x, &d->G, &d->T, &d->K, &d->dt));
    const int64_t dyshape[2] = {d->T, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, dyshape, MOEX_DT(d->dt)));
    d->N = a->dy.shape[1];
    MOEX_TRY(moex_check_features(ctx, op, d->K, d->N));
    MOEX_TRY(moex_check_dw(ctx, op, "dw", a->dw_mode, &a->dw, d->G, d->N, d->K, d->dt));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "dw", a->dw.t.data);
}

size_t moex_op_grouped_linear_backward_weight_ws(moex_context *ctx, const moex_grouped_linear_wgrad_args *a,
                                                 const moex_gl_dims *d) {
    return plan_of(ctx, wgrad_op(a, d), d, NULL).total;
}

moex_status moex_op_grouped_linear_backward_weight_run(moex_context *ctx, const moex_call *c,
                                                       const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d,
                                                       void *ws) {
    return plan_run(ctx, c, wgrad_op(a, d), d, ws);
}

/* ---- the public calls that are not ops: moex_fp8_weight_layout (moex_fp8.h; its sibling
 * moex_fp8_weight_params is beside params_of above) and moex_weight_maps_size (moex.h) ---- */

moex_status moex_fp8_weight_layout(moex_context *ctx, const moex_fp8_recipe *recipe, const moex_weight *w,
                                   void *base, moex_fp8_weight *copies, size_t *bytes) {
    const char *op = "moex_fp8_weight_layout";
    MOEX_TRY(moex_enter(ctx, op, recipe));
    if (!w || !bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s is NULL", op, w ? "bytes" : "w");
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "recipe", recipe));
    if (recipe->mode == MOEX_FP8_OFF) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: recipe.mode is OFF", op);
    const moex_tensor *t = &w->t;   /* a description only */
    if (t->ndim != 3 || t->shape[0] < 1 || t->shape[1] < 1 || t->shape[2] < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: w.t must describe a [G, N, K] weight with G, N, K >= 1, got "
                         "ndim %d", op, (int)t->ndim);
    MOEX_TRY(moex_check_internal(ctx, op, "w", t->shape[0], t->shape[1]));
    MOEX_TRY(moex_check_internal(ctx, op, "w", t->shape[0] * t->shape[1], t->shape[2]));
    if ((uintptr_t)base % MOEX_WS_ALIGN != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: base must be aligned to %d bytes", op, MOEX_WS_ALIGN);
    moex_fp8_recipe r = *recipe;
    r.weights = NULL;   /* the layout of new copies */
    moex_carver c = {(char *)base, 0};
    moex_fp8_operand q;
    moex_fp8_take_weight(&c, &r, 0, t->shape[0], t->shape[1], t->shape[2], t->dtype, true, true, &q);
    if (c.used > (size_t)PTRDIFF_MAX)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: the copies would need more than PTRDIFF_MAX bytes", op);
    *bytes = c.used;
    if (base && copies) copies->rowwise = q.row, copies->columnwise = q.col;
    return MOEX_OK;
}

moex_status moex_weight_maps_size(moex_context *ctx, const moex_weight *w, size_t *bytes) {
    const char *op = "moex_weight_maps_size";
    MOEX_TRY(moex_enter(ctx, op, w));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    const moex_tensor *t = &w->t;   /* a description only: nothing behind ptrs is read */
    if (t->ndim != 3 || (unsigned)t->dtype > (unsigned)MOEX_DTYPE_E8M0 || !(MOEX_DT_FLOAT & MOEX_DT(t->dtype)) ||
        t->shape[0] < 1 || t->shape[1] < 0 || t->shape[2] < 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: w.t must describe a [G, R, C] f32, bf16 or f16 weight with "
                         "G >= 1, got ndim %d, dtype %s, [%lld, %lld, %lld]", op, (int)t->ndim, moex_dtype_name(t->dtype),
                         (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2]);
    MOEX_TRY(moex_check_internal(ctx, op, "w", t->shape[0], t->shape[1]));
    MOEX_TRY(moex_check_internal(ctx, op, "w", t->shape[0] * t->shape[1], t->shape[2]));
    const moex_gl_dims d = {t->shape[0], 0, t->shape[2], t->shape[1], t->dtype};
    *bytes = moex_ops(ctx)->weight_maps_size(ctx, &d);
    return MOEX_OK;
}
