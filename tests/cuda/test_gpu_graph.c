/*
 * test_gpu_graph.c - CUDA graphs with device splits (docs/conventions.md section 9, "CUDA graphs").
 *
 * One graph captures, on one stream, the forward and both backward calls of the grouped
 * linear layer, the grouped MLP forward and backward, and the MoE layer forward and
 * backward. It is instantiated once and replayed for several scenarios, each with new
 * input data AND new split values written into the same device buffers: balanced,
 * skewed, empty groups, all rows in one group, and a sum below T (input tail rows NaN).
 * For the MoE layer the splits come from its own permute on the device, so the scenarios
 * change x and the router weights instead (random, experts kept empty, all tokens sent to
 * two experts). Every output of every replay is compared bitwise with the same calls run
 * eagerly, and with the fp64 reference (element-wise tolerance model for the grouped
 * linear and MLP, norm-wise relative error for the MoE layer). Runs for f32 and bf16, and for
 * bf16 with the layers' FP8 recipe (BLOCK, CURRENT: every call's GEMMs on FP8 operands, the
 * Hopper FP8 kernels where the shapes allow, FC1 and the GLU fused among them), where replays
 * are compared bitwise with the eager calls (the fp64 models above are not FP8's; the FP8
 * values are checked by tests/test_fp8_layers.c).
 *
 * A second graph captures grouped quantization (docs/ops.md section 9): four
 * moex_group_quantize calls (GROUP with amax, BLOCK with POW2 and an epsilon, MXFP8, TENSOR
 * with amax) and four moex_group_dequantize calls reading their outputs, replayed while the
 * device split values change (balanced, an empty group, one group, sum < T with NaN input
 * tails, all groups empty); every replay is compared bitwise with the eager calls and with
 * the reference of tools/ref/ref_quant.h (codes, scales, amax, dequantized values, and the
 * poisoned tails). Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"
#include "ref_quant.h"
#include "ref_routing.h"

#include <math.h>

/* ---- device buffers ------------------------------------------------------------------ */

typedef struct dbuf {
    void *d;
    moex_dtype dt;
    int64_t n;
} dbuf;

static dbuf dnew(moex_dtype dt, int64_t n) {
    dbuf b = {cm_malloc((size_t)n * moex_dtype_size(dt)), dt, n};
    return b;
}
static size_t dbytes(const dbuf *b) { return (size_t)b->n * moex_dtype_size(b->dt); }
/* rows [0, valid) of `cols` from v (rounded to the dtype), the rest poison */
static void dput_rows(dbuf *b, const double *v, int64_t valid, int64_t cols) {
    void *h = tu_buffer_rows(b->dt, v, valid, b->n / (cols ? cols : 1), cols);
    cm_die(cudaMemcpy(b->d, h, dbytes(b), cudaMemcpyHostToDevice), "upload");
    free(h);
}
static void dput(dbuf *b, const double *v) { dput_rows(b, v, b->n, 1); }
static void dpoison(dbuf *b) { cm_die(cudaMemset(b->d, 0xFF, dbytes(b)), "poison"); }
static void *dget(const dbuf *b) {
    void *h = tu_alloc(dbytes(b));
    cm_to_host(h, b->d, dbytes(b));
    return h;
}
static moex_tensor t1(dbuf *b) { return moex_tensor_1d(b->d, b->dt, b->n); }
static moex_tensor t2(dbuf *b, int64_t r) { return moex_tensor_2d(b->d, b->dt, r, b->n / r); }
static moex_weight w3(dbuf *b, int64_t G, int64_t R) {
    return moex_weight_packed(moex_tensor_3d(b->d, b->dt, G, R, b->n / (G * R)));
}

/* Norm-wise relative error of n elements against the reference (NaN never passes). */
static void check_norm(const char *what, moex_dtype dt, const void *got, const double *ref, int64_t n, double tol) {
    double num = 0, den = 0;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        double g = ref_load(dt, got, i);
        finite &= isfinite(g);
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK_MSG(finite && rel <= tol, "%s: relative error %.3g (tolerance %.3g)%s", what, rel, tol,
              finite ? "" : ", non-finite output");
    tu_log("%s: relative error %.3g\n", what, rel);
}

/* ---- the three layers --------------------------------------------------------------- */

enum { GL_G = 6, GL_T = 300, GL_K = 72, GL_N = 88 };
enum { ML_G = 6, ML_T = 300, ML_H = 64, ML_F = 64 };
enum { MO_T = 128, MO_H = 64, MO_E = 8, MO_F = 32, MO_K = 2 };

typedef struct layers {
    moex_dtype dt;
    /* grouped linear */
    dbuf gx, gw, gb, gp, gs, gdy, gy, gdx, gdb, gdp, gdw;
    moex_grouped_linear_args gfa;
    moex_grouped_linear_dgrad_args gda;
    moex_grouped_linear_wgrad_args gwa;
    /* grouped MLP */
    dbuf mx, mw1, mb1, mw2, mb2, mp, ms, mdy, mh, mz, my, mdx, mdw1, mdw2, mdb1, mdb2, mdp;
    moex_grouped_mlp_args mfa;
    moex_grouped_mlp_grad_args mba;
    /* MoE layer */
    dbuf ox, owr, ow1, ob1, ow2, ob2, ody, osaved, oy, odx, odrw, odw1, odw2, odb1, odb2;
    moex_moe_layer_args ofa;
    moex_moe_layer_grad_args oba;
    /* workspaces */
    dbuf ws[7];
} layers;

static void make_layers(moex_context *ctx, layers *L, moex_dtype dt, moex_fp8_recipe fp8) {
    const moex_dtype F32 = MOEX_DTYPE_F32;
    memset(L, 0, sizeof *L);
    L->dt = dt;
    L->gx = dnew(dt, GL_T * GL_K), L->gw = dnew(dt, GL_G * GL_N * GL_K), L->gb = dnew(F32, GL_G * GL_N);
    L->gp = dnew(F32, GL_T), L->gs = dnew(MOEX_DTYPE_I64, GL_G), L->gdy = dnew(dt, GL_T * GL_N);
    L->gy = dnew(dt, GL_T * GL_N), L->gdx = dnew(dt, GL_T * GL_K), L->gdb = dnew(F32, GL_G * GL_N);
    L->gdp = dnew(F32, GL_T), L->gdw = dnew(F32, GL_G * GL_N * GL_K);
    moex_grouped_linear_args *fa = &L->gfa;
    fa->x = t2(&L->gx, GL_T), fa->w = w3(&L->gw, GL_G, GL_N), fa->bias_mode = MOEX_BIAS_SCALED;
    fa->bias = t2(&L->gb, GL_G), fa->probs = t1(&L->gp), fa->splits = t1(&L->gs), fa->y = t2(&L->gy, GL_T);
    moex_grouped_linear_dgrad_args *da = &L->gda;
    da->dy = t2(&L->gdy, GL_T), da->w = fa->w, da->bias_mode = MOEX_BIAS_SCALED, da->bias = fa->bias;
    da->probs = fa->probs, da->splits = fa->splits, da->dx = t2(&L->gdx, GL_T), da->dbias = t2(&L->gdb, GL_G);
    da->dprobs = t1(&L->gdp);
    moex_grouped_linear_wgrad_args *wa = &L->gwa;
    wa->x = fa->x, wa->dy = da->dy, wa->splits = fa->splits, wa->dw_mode = MOEX_GRAD_WRITE;
    wa->dw = w3(&L->gdw, GL_G, GL_N);
    fa->fp8 = da->fp8 = wa->fp8 = fp8;

    L->mx = dnew(dt, ML_T * ML_H), L->mw1 = dnew(dt, ML_G * 2 * ML_F * ML_H), L->mb1 = dnew(F32, ML_G * 2 * ML_F);
    L->mw2 = dnew(dt, ML_G * ML_H * ML_F), L->mb2 = dnew(F32, ML_G * ML_H), L->mp = dnew(F32, ML_T);
    L->ms = dnew(MOEX_DTYPE_I64, ML_G), L->mdy = dnew(dt, ML_T * ML_H), L->mh = dnew(dt, ML_T * 2 * ML_F);
    L->mz = dnew(dt, ML_T * ML_F), L->my = dnew(dt, ML_T * ML_H), L->mdx = dnew(dt, ML_T * ML_H);
    L->mdw1 = dnew(F32, ML_G * 2 * ML_F * ML_H), L->mdw2 = dnew(F32, ML_G * ML_H * ML_F);
    L->mdb1 = dnew(F32, ML_G * 2 * ML_F), L->mdb2 = dnew(F32, ML_G * ML_H), L->mdp = dnew(F32, ML_T);
    moex_glu_params glu = moex_glu_params_default(dt == F32 ? MOEX_GLU_SWIGLU : MOEX_GLU_CLAMPED_SWIGLU);
    glu.layout = dt == F32 ? MOEX_GLU_CONTIGUOUS : MOEX_GLU_INTERLEAVED_32;
    moex_grouped_mlp_args *mf = &L->mfa;
    mf->x = t2(&L->mx, ML_T), mf->w1 = w3(&L->mw1, ML_G, 2 * ML_F), mf->b1 = t2(&L->mb1, ML_G);
    mf->w2 = w3(&L->mw2, ML_G, ML_H), mf->b2_mode = MOEX_BIAS_SCALED, mf->b2 = t2(&L->mb2, ML_G);
    mf->probs = t1(&L->mp), mf->glu = glu, mf->splits = t1(&L->ms), mf->h = t2(&L->mh, ML_T);
    mf->z = t2(&L->mz, ML_T), mf->y = t2(&L->my, ML_T);
    moex_grouped_mlp_grad_args *mb = &L->mba;
    mb->x = mf->x, mb->w1 = mf->w1, mb->w2 = mf->w2, mb->b2_mode = mf->b2_mode, mb->b2 = mf->b2;
    mb->probs = mf->probs, mb->glu = glu, mb->splits = mf->splits, mb->h = mf->h, mb->z = mf->z;
    mb->dy = t2(&L->mdy, ML_T), mb->dx = t2(&L->mdx, ML_T), mb->dw_mode = MOEX_GRAD_WRITE;
    mb->dw1 = w3(&L->mdw1, ML_G, 2 * ML_F), mb->dw2 = w3(&L->mdw2, ML_G, ML_H), mb->db1 = t2(&L->mdb1, ML_G);
    mb->db2 = t2(&L->mdb2, ML_G), mb->dprobs = t1(&L->mdp);
    mf->fp8 = mb->fp8 = fp8;

    L->ox = dnew(dt, MO_T * MO_H), L->owr = dnew(dt, MO_E * MO_H), L->ow1 = dnew(dt, MO_E * 2 * MO_F * MO_H);
    L->ob1 = dnew(dt, MO_E * 2 * MO_F), L->ow2 = dnew(dt, MO_E * MO_H * MO_F), L->ob2 = dnew(dt, MO_E * MO_H);
    L->ody = dnew(dt, MO_T * MO_H), L->oy = dnew(dt, MO_T * MO_H), L->odx = dnew(dt, MO_T * MO_H);
    L->odrw = dnew(F32, MO_E * MO_H), L->odw1 = dnew(F32, MO_E * 2 * MO_F * MO_H);
    L->odw2 = dnew(F32, MO_E * MO_H * MO_F), L->odb1 = dnew(F32, MO_E * 2 * MO_F), L->odb2 = dnew(F32, MO_E * MO_H);
    moex_moe_layer_args *of = &L->ofa;
    of->x = t2(&L->ox, MO_T), of->router_w = t2(&L->owr, MO_E), of->topk = MO_K;
    of->score = MOEX_ROUTER_SOFTMAX, of->norm = MOEX_ROUTER_RENORM, of->w1 = w3(&L->ow1, MO_E, 2 * MO_F);
    of->b1 = t2(&L->ob1, MO_E), of->w2 = w3(&L->ow2, MO_E, MO_H), of->b2_mode = MOEX_BIAS_ADD;
    of->b2 = t2(&L->ob2, MO_E), of->glu = moex_glu_params_default(MOEX_GLU_SWIGLU), of->y = t2(&L->oy, MO_T);
    of->fp8 = fp8;
    size_t sb = 0;
    CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, of, &sb), MOEX_OK);
    L->osaved = dnew(MOEX_DTYPE_I32, (int64_t)(sb + 3) / 4);
    of->saved = L->osaved.d, of->saved_bytes = sb;
    moex_moe_layer_grad_args *ob = &L->oba;
    ob->fwd = *of, ob->dy = t2(&L->ody, MO_T), ob->dx = t2(&L->odx, MO_T), ob->dw_mode = MOEX_GRAD_WRITE;
    ob->drouter_w = t2(&L->odrw, MO_E), ob->dw1 = w3(&L->odw1, MO_E, 2 * MO_F), ob->dw2 = w3(&L->odw2, MO_E, MO_H);
    ob->db1 = t2(&L->odb1, MO_E), ob->db2 = t2(&L->odb2, MO_E);

    size_t bytes[7] = {0};
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, fa, &bytes[0]), MOEX_OK);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data_workspace_size(ctx, da, &bytes[1]), MOEX_OK);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight_workspace_size(ctx, wa, &bytes[2]), MOEX_OK);
    CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, mf, &bytes[3]), MOEX_OK);
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, mb, &bytes[4]), MOEX_OK);
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, of, &bytes[5]), MOEX_OK);
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, ob, &bytes[6]), MOEX_OK);
    for (int i = 0; i < 7; i++) L->ws[i] = dnew(MOEX_DTYPE_I32, (int64_t)(bytes[i] + 3) / 4 + 1);
}

/* The seven calls, in order, on `s` (captured or eager). */
static moex_status run_all(moex_context *ctx, layers *L, cudaStream_t s) {
    moex_stream st = (moex_stream)s;
#define WS(i) L->ws[i].d, dbytes(&L->ws[i])
    moex_status r;
    if ((r = moex_grouped_linear_forward(ctx, &L->gfa, WS(0), st)) != MOEX_OK) return r;
    if ((r = moex_grouped_linear_backward_data(ctx, &L->gda, WS(1), st)) != MOEX_OK) return r;
    if ((r = moex_grouped_linear_backward_weight(ctx, &L->gwa, WS(2), st)) != MOEX_OK) return r;
    if ((r = moex_grouped_mlp_forward(ctx, &L->mfa, WS(3), st)) != MOEX_OK) return r;
    if ((r = moex_grouped_mlp_backward(ctx, &L->mba, WS(4), st)) != MOEX_OK) return r;
    if ((r = moex_moe_layer_forward(ctx, &L->ofa, WS(5), st)) != MOEX_OK) return r;
    return moex_moe_layer_backward(ctx, &L->oba, WS(6), st);
#undef WS
}

/* ---- one scenario's data ---------------------------------------------------------------- */

typedef struct scen {
    int64_t gsplits[GL_G], msplits[ML_G], grows, mrows;
    double *gx, *gw, *gb, *gp, *gdy, *gdp0;
    double *mx, *mw1, *mb1, *mw2, *mb2, *mp, *mdy, *mdp0;
    double *ox, *owr, *ow1, *ob1, *ow2, *ob2, *ody;
} scen;

/* Redraws MoE token rows until the k-th and (k+1)-th fp64 logits are >= 0.1 apart, so f32
 * rounding cannot change the routing; x[t, 0] = 1 carries the router's forced biases. */
static void condition_moe(tu_rng *r, scen *s, moex_dtype dt) {
    double l[MO_E];
    for (int64_t t = 0; t < MO_T; t++) {
        for (int tries = 0;; tries++) {
            tu_fill_uniform(r, s->ox + t * MO_H, MO_H, -1, 1, dt);
            s->ox[t * MO_H] = 1.0;
            for (int e = 0; e < MO_E; e++) {
                l[e] = 0;
                for (int h = 0; h < MO_H; h++) l[e] += s->ox[t * MO_H + h] * s->owr[e * MO_H + h];
            }
            for (int i = 0; i < MO_E; i++)
                for (int j = i + 1; j < MO_E; j++)
                    if (l[j] > l[i]) {
                        double u = l[i];
                        l[i] = l[j];
                        l[j] = u;
                    }
            if (l[MO_K - 1] - l[MO_K] >= 0.1) break;
            if (tries > 100000) {
                fprintf(stderr, "test: cannot condition the routing\n");
                exit(1);
            }
        }
    }
}

static void make_scen(tu_rng *r, scen *s, moex_dtype dt, int i) {
    static const tu_splits_kind kinds[5] = {TU_SPLITS_BALANCED, TU_SPLITS_SKEWED, TU_SPLITS_EMPTY_MIDDLE,
                                            TU_SPLITS_ONE_GROUP, TU_SPLITS_RANDOM};
    const moex_dtype F32 = MOEX_DTYPE_F32;
    s->grows = i == 4 ? GL_T - 37 : GL_T;
    s->mrows = i == 4 ? ML_T - 53 : ML_T;
    tu_make_splits(r, kinds[i], GL_G, s->grows, s->gsplits);
    tu_make_splits(r, kinds[i], ML_G, s->mrows, s->msplits);
    s->gx = tu_doubles(GL_T * GL_K), s->gw = tu_doubles(GL_G * GL_N * GL_K), s->gb = tu_doubles(GL_G * GL_N);
    s->gp = tu_doubles(GL_T), s->gdy = tu_doubles(GL_T * GL_N), s->gdp0 = tu_doubles(GL_T);
    tu_fill_uniform(r, s->gx, s->grows * GL_K, -1, 1, dt);
    tu_fill_uniform(r, s->gw, GL_G * GL_N * GL_K, -1, 1, dt);
    tu_fill_uniform(r, s->gb, GL_G * GL_N, -1, 1, F32);
    tu_fill_uniform(r, s->gp, s->grows, 0.05, 1, F32);
    tu_fill_uniform(r, s->gdy, s->grows * GL_N, -1, 1, dt);
    tu_fill_uniform(r, s->gdp0, s->grows, -1, 1, F32);
    s->mx = tu_doubles(ML_T * ML_H), s->mw1 = tu_doubles(ML_G * 2 * ML_F * ML_H), s->mb1 = tu_doubles(ML_G * 2 * ML_F);
    s->mw2 = tu_doubles(ML_G * ML_H * ML_F), s->mb2 = tu_doubles(ML_G * ML_H), s->mp = tu_doubles(ML_T);
    s->mdy = tu_doubles(ML_T * ML_H), s->mdp0 = tu_doubles(ML_T);
    tu_fill_uniform(r, s->mx, s->mrows * ML_H, -1, 1, dt);
    tu_fill_uniform(r, s->mw1, ML_G * 2 * ML_F * ML_H, -0.3, 0.3, dt);
    tu_fill_uniform(r, s->mb1, ML_G * 2 * ML_F, -0.5, 0.5, F32);
    tu_fill_uniform(r, s->mw2, ML_G * ML_H * ML_F, -0.3, 0.3, dt);
    tu_fill_uniform(r, s->mb2, ML_G * ML_H, -0.5, 0.5, F32);
    tu_fill_uniform(r, s->mp, s->mrows, 0.05, 1, F32);
    tu_fill_uniform(r, s->mdy, s->mrows * ML_H, -1, 1, dt);
    tu_fill_uniform(r, s->mdp0, s->mrows, -1, 1, F32);
    s->ox = tu_doubles(MO_T * MO_H), s->owr = tu_doubles(MO_E * MO_H), s->ow1 = tu_doubles(MO_E * 2 * MO_F * MO_H);
    s->ob1 = tu_doubles(MO_E * 2 * MO_F), s->ow2 = tu_doubles(MO_E * MO_H * MO_F), s->ob2 = tu_doubles(MO_E * MO_H);
    s->ody = tu_doubles(MO_T * MO_H);
    tu_fill_uniform(r, s->owr, MO_E * MO_H, -0.5, 0.5, dt);
    if (i == 1)   /* experts 0..2 receive nothing */
        for (int e = 0; e < 3; e++) s->owr[e * MO_H] = -20;
    if (i == 2 || i == 3)   /* every token to experts 0 and 1 (i == 3: to 5 and 6) */
        for (int e = 0; e < 2; e++) s->owr[(e + (i == 3 ? 5 : 0)) * MO_H] = 20;
    condition_moe(r, s, dt);
    tu_fill_uniform(r, s->ow1, MO_E * 2 * MO_F * MO_H, -0.5, 0.5, dt);
    tu_fill_uniform(r, s->ob1, MO_E * 2 * MO_F, -0.2, 0.2, dt);
    tu_fill_uniform(r, s->ow2, MO_E * MO_H * MO_F, -0.5, 0.5, dt);
    tu_fill_uniform(r, s->ob2, MO_E * MO_H, -0.2, 0.2, dt);
    tu_fill_uniform(r, s->ody, MO_T * MO_H, -1, 1, dt);
}

static void free_scen(scen *s) {
    double *p[] = {s->gx, s->gw, s->gb, s->gp, s->gdy, s->gdp0, s->mx, s->mw1, s->mb1, s->mw2, s->mb2, s->mp,
                   s->mdy, s->mdp0, s->ox, s->owr, s->ow1, s->ob1, s->ow2, s->ob2, s->ody};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* Uploads the inputs (tails NaN), poisons the outputs, resets the += dprobs. */
static void upload(layers *L, const scen *s) {
    dput_rows(&L->gx, s->gx, s->grows, GL_K), dput(&L->gw, s->gw), dput(&L->gb, s->gb);
    dput_rows(&L->gp, s->gp, s->grows, 1), dput_rows(&L->gdy, s->gdy, s->grows, GL_N);
    dput_rows(&L->gdp, s->gdp0, s->grows, 1);
    cm_die(cudaMemcpy(L->gs.d, s->gsplits, sizeof s->gsplits, cudaMemcpyHostToDevice), "splits");
    dput_rows(&L->mx, s->mx, s->mrows, ML_H), dput(&L->mw1, s->mw1), dput(&L->mb1, s->mb1);
    dput(&L->mw2, s->mw2), dput(&L->mb2, s->mb2), dput_rows(&L->mp, s->mp, s->mrows, 1);
    dput_rows(&L->mdy, s->mdy, s->mrows, ML_H), dput_rows(&L->mdp, s->mdp0, s->mrows, 1);
    cm_die(cudaMemcpy(L->ms.d, s->msplits, sizeof s->msplits, cudaMemcpyHostToDevice), "splits");
    dput(&L->ox, s->ox), dput(&L->owr, s->owr), dput(&L->ow1, s->ow1), dput(&L->ob1, s->ob1);
    dput(&L->ow2, s->ow2), dput(&L->ob2, s->ob2), dput(&L->ody, s->ody);
    dbuf *outs[] = {&L->gy, &L->gdx, &L->gdb, &L->gdw, &L->mh, &L->mz, &L->my, &L->mdx, &L->mdw1, &L->mdw2,
                    &L->mdb1, &L->mdb2, &L->oy, &L->odx, &L->odrw, &L->odw1, &L->odw2, &L->odb1, &L->odb2,
                    &L->osaved};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) dpoison(outs[i]);
    /* The copies and memsets above run on the legacy stream, which the test's non-blocking
     * stream does not wait for: finish them before the next launch. */
    cm_die(cudaDeviceSynchronize(), "upload sync");
}

#define NOUT 21
static dbuf *outputs(layers *L, int i) {
    dbuf *o[NOUT] = {&L->gy, &L->gdx, &L->gdb, &L->gdp, &L->gdw, &L->mh, &L->mz, &L->my, &L->mdx, &L->mdw1,
                     &L->mdw2, &L->mdb1, &L->mdb2, &L->mdp, &L->oy, &L->odx, &L->odrw, &L->odw1, &L->odw2,
                     &L->odb1, &L->odb2};
    return o[i];
}
static const char *out_names[NOUT] = {"linear y", "linear dx", "linear dbias", "linear dprobs", "linear dw",
                                      "mlp h", "mlp z", "mlp y", "mlp dx", "mlp dw1", "mlp dw2", "mlp db1",
                                      "mlp db2", "mlp dprobs", "moe y", "moe dx", "moe drouter_w", "moe dw1",
                                      "moe dw2", "moe db1", "moe db2"};

/* ---- comparison with the fp64 reference -------------------------------------------- */

static void check_ref(layers *L, const scen *s, void **got, const char *label) {
    const moex_dtype dt = L->dt, F32 = MOEX_DTYPE_F32;
    char what[256];
    /* grouped linear */
    {
        const int64_t G = GL_G, T = GL_T, K = GL_K, N = GL_N, rows = s->grows;
        double *y = tu_doubles(T * N), *yb = tu_doubles(T * N), *dx = tu_doubles(T * K), *dxb = tu_doubles(T * K);
        double *db = tu_doubles(G * N), *dbb = tu_doubles(G * N), *dp = tu_doubles(T), *dpb = tu_doubles(T);
        double *dw = tu_doubles(G * N * K), *dwb = tu_doubles(G * N * K);
        ref_grouped_linear_forward(G, T, K, N, s->gsplits, s->gx, s->gw, MOEX_BIAS_SCALED, s->gb, s->gp, y, yb);
        ref_grouped_linear_backward_data(G, T, K, N, s->gsplits, s->gdy, s->gw, MOEX_BIAS_SCALED, s->gb, s->gp, dx, dxb,
                                         db, dbb, dp, dpb);
        ref_grouped_linear_backward_weight(G, T, K, N, s->gsplits, s->gx, s->gdy, dw, dwb);
        for (int64_t i = 0; i < rows; i++) dp[i] += s->gdp0[i], dpb[i] += fabs(s->gdp0[i]);
        ref_tol_model m = ref_tol_for(dt, dt, 0, K);
        snprintf(what, sizeof what, "%s: linear y", label);
        CHECK_CLOSE(what, dt, got[0], y, yb, rows * N, N, &m);
        CHECK_POISONED("linear y tail", dt, got[0], rows * N, T * N);
        m = ref_tol_for(dt, dt, 0, N);
        snprintf(what, sizeof what, "%s: linear dx", label);
        CHECK_CLOSE(what, dt, got[1], dx, dxb, rows * K, K, &m);
        CHECK_POISONED("linear dx tail", dt, got[1], rows * K, T * K);
        m = ref_tol_for(F32, dt, 0, rows);
        snprintf(what, sizeof what, "%s: linear dbias", label);
        CHECK_CLOSE(what, F32, got[2], db, dbb, G * N, N, &m);
        m = ref_tol_for(F32, dt, 0, N + 1);
        snprintf(what, sizeof what, "%s: linear dprobs", label);
        CHECK_CLOSE(what, F32, got[3], dp, dpb, rows, 1, &m);
        m = ref_tol_for(F32, dt, 0, rows);
        snprintf(what, sizeof what, "%s: linear dw", label);
        CHECK_CLOSE(what, F32, got[4], dw, dwb, G * N * K, K, &m);
        free(y); free(yb); free(dx); free(dxb); free(db); free(dbb); free(dp); free(dpb); free(dw); free(dwb);
    }
    /* grouped MLP */
    {
        const int64_t G = ML_G, T = ML_T, H = ML_H, F = ML_F, rows = s->mrows;
        ref_mlp p = {.G = G, .T = T, .H = H, .F = F, .splits = s->msplits, .x = s->mx, .w1 = s->mw1, .b1 = s->mb1,
                     .w2 = s->mw2, .b2 = s->mb2, .probs = s->mp, .b2_mode = MOEX_BIAS_SCALED, .glu = L->mfa.glu};
        double *h = tu_doubles(T * 2 * F), *hb = tu_doubles(T * 2 * F), *z = tu_doubles(T * F), *zb = tu_doubles(T * F);
        double *y = tu_doubles(T * H), *yb = tu_doubles(T * H);
        ref_grouped_mlp_forward(&p, h, hb, z, zb, y, yb);
        ref_mlp_grads g = {0};
        g.dx = tu_doubles(T * H), g.dxb = tu_doubles(T * H);
        g.dw1 = tu_doubles(G * 2 * F * H), g.dw1b = tu_doubles(G * 2 * F * H);
        g.dw2 = tu_doubles(G * H * F), g.dw2b = tu_doubles(G * H * F);
        g.db1 = tu_doubles(G * 2 * F), g.db1b = tu_doubles(G * 2 * F);
        g.db2 = tu_doubles(G * H), g.db2b = tu_doubles(G * H);
        g.dprobs = tu_doubles(T), g.dprobsb = tu_doubles(T);
        ref_grouped_mlp_backward(&p, s->mdy, &g);
        for (int64_t i = 0; i < rows; i++) g.dprobs[i] += s->mdp0[i], g.dprobsb[i] += fabs(s->mdp0[i]);
        const int64_t kb = rows + H + 2 * F + 8;
        ref_tol_model m = ref_tol_for(dt, dt, 0, H);
        snprintf(what, sizeof what, "%s: mlp h", label);
        CHECK_CLOSE(what, dt, got[5], h, hb, rows * 2 * F, 2 * F, &m);
        m = ref_tol_for(dt, dt, 1, H + 8);
        snprintf(what, sizeof what, "%s: mlp z", label);
        CHECK_CLOSE(what, dt, got[6], z, zb, rows * F, F, &m);
        m = ref_tol_for(dt, dt, 1, H + F + 8);
        snprintf(what, sizeof what, "%s: mlp y", label);
        CHECK_CLOSE(what, dt, got[7], y, yb, rows * H, H, &m);
        CHECK_POISONED("mlp y tail", dt, got[7], rows * H, T * H);
        m = ref_tol_for(dt, dt, 1, kb);
        snprintf(what, sizeof what, "%s: mlp dx", label);
        CHECK_CLOSE(what, dt, got[8], g.dx, g.dxb, rows * H, H, &m);
        CHECK_POISONED("mlp dx tail", dt, got[8], rows * H, T * H);
        m = ref_tol_for(F32, dt, 1, kb);
        snprintf(what, sizeof what, "%s: mlp dw1", label);
        CHECK_CLOSE(what, F32, got[9], g.dw1, g.dw1b, G * 2 * F * H, H, &m);
        snprintf(what, sizeof what, "%s: mlp dw2", label);
        CHECK_CLOSE(what, F32, got[10], g.dw2, g.dw2b, G * H * F, F, &m);
        snprintf(what, sizeof what, "%s: mlp db1", label);
        CHECK_CLOSE(what, F32, got[11], g.db1, g.db1b, G * 2 * F, 2 * F, &m);
        snprintf(what, sizeof what, "%s: mlp db2", label);
        CHECK_CLOSE(what, F32, got[12], g.db2, g.db2b, G * H, H, &m);
        snprintf(what, sizeof what, "%s: mlp dprobs", label);
        CHECK_CLOSE(what, F32, got[13], g.dprobs, g.dprobsb, rows, 1, &m);
        free(h); free(hb); free(z); free(zb); free(y); free(yb);
        free(g.dx); free(g.dxb); free(g.dw1); free(g.dw1b); free(g.dw2); free(g.dw2b);
        free(g.db1); free(g.db1b); free(g.db2); free(g.db2b); free(g.dprobs); free(g.dprobsb);
    }
    /* MoE layer: norm-wise */
    {
        const int64_t T = MO_T, H = MO_H, E = MO_E, F = MO_F;
        ref_moe p;
        memset(&p, 0, sizeof p);
        p.T = T, p.H = H, p.E = E, p.F = F, p.k = MO_K, p.x = s->ox, p.router_w = s->owr, p.w1 = s->ow1;
        p.b1 = s->ob1, p.w2 = s->ow2, p.b2 = s->ob2, p.score = L->ofa.score, p.norm = L->ofa.norm;
        p.b2_mode = L->ofa.b2_mode, p.glu = L->ofa.glu;
        double *y = tu_doubles(T * H);
        ref_moe_layer_forward(&p, y, NULL, NULL, NULL, NULL);
        ref_moe_grads g;
        memset(&g, 0, sizeof g);
        g.dx = tu_doubles(T * H), g.drouter_w = tu_doubles(E * H), g.dw1 = tu_doubles(E * 2 * F * H);
        g.dw2 = tu_doubles(E * H * F), g.db1 = tu_doubles(E * 2 * F), g.db2 = tu_doubles(E * H);
        ref_moe_layer_backward(&p, s->ody, &g);
        const double tol = dt == F32 ? 1e-4 : 2e-2;
        const double *refs[7] = {y, g.dx, g.drouter_w, g.dw1, g.dw2, g.db1, g.db2};
        const int64_t ns[7] = {T * H, T * H, E * H, E * 2 * F * H, E * H * F, E * 2 * F, E * H};
        for (int i = 0; i < 7; i++) {
            snprintf(what, sizeof what, "%s: %s", label, out_names[14 + i]);
            check_norm(what, outputs(L, 14 + i)->dt, got[14 + i], refs[i], ns[i], tol);
        }
        free(y); free(g.dx); free(g.drouter_w); free(g.dw1); free(g.dw2); free(g.db1); free(g.db2);
    }
}

static void run_dtype(moex_context *ctx, tu_rng *r, moex_dtype dt, moex_fp8_recipe fp8) {
    layers L;
    make_layers(ctx, &L, dt, fp8);
    cudaStream_t s;
    cm_die(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");

    /* capture once, with whatever the buffers hold */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cm_die(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    moex_status st = run_all(ctx, &L, s);
    cm_die(cudaStreamEndCapture(s, &graph), "end capture");
    CHECK_STATUS(ctx, st, MOEX_OK);
    cm_die(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

    static const char *names[5] = {"balanced", "skewed / experts 0-2 empty", "empty middle / experts 0,1",
                                   "one group / experts 5,6", "sum below T"};
    for (int i = 0; i < 5; i++) {
        char label[128];
        snprintf(label, sizeof label, "%s%s %s", dt == MOEX_DTYPE_F32 ? "f32" : "bf16",
                 fp8.mode == MOEX_FP8_BLOCK ? " fp8 block" : fp8.mode == MOEX_FP8_CURRENT ? " fp8 current" : "",
                 names[i]);
        scen sc;
        make_scen(r, &sc, dt, i);
        void *gr[NOUT], *eg[NOUT];
        /* replay */
        upload(&L, &sc);
        cm_die(cudaGraphLaunch(exec, s), "graph launch");
        cm_die(cudaStreamSynchronize(s), "graph sync");
        for (int o = 0; o < NOUT; o++) gr[o] = dget(outputs(&L, o));
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, (moex_stream)s), MOEX_OK);
        /* eager */
        upload(&L, &sc);
        CHECK_STATUS(ctx, run_all(ctx, &L, s), MOEX_OK);
        cm_die(cudaStreamSynchronize(s), "eager sync");
        for (int o = 0; o < NOUT; o++) eg[o] = dget(outputs(&L, o));
        for (int o = 0; o < NOUT; o++)
            CHECK_MSG(memcmp(gr[o], eg[o], dbytes(outputs(&L, o))) == 0, "%s: %s: graph replay and eager differ",
                      label, out_names[o]);
        if (fp8.mode == MOEX_FP8_OFF) check_ref(&L, &sc, gr, label);
        for (int o = 0; o < NOUT; o++) free(gr[o]), free(eg[o]);
        free_scen(&sc);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    /* the buffers are freed with the process */
}

/* ---- grouped quantization ---------------------------------------------------------- */

enum { QG_G = 5, QG_T = 300, QG_K = 150, QG_NQ = 4, QG_ND = 4 };

typedef struct qgraph {
    moex_dtype dt;
    dbuf x, splits;
    moex_quant_params p[QG_NQ];
    moex_dtype sdt[QG_NQ];
    int64_t rs_shape[QG_NQ][2], cs_shape[QG_NQ][2];
    int rs_ndim[QG_NQ], cs_ndim[QG_NQ], has_col[QG_NQ], n_amax[QG_NQ];
    dbuf rd[QG_NQ], rs[QG_NQ], cd[QG_NQ], cs[QG_NQ], am[QG_NQ];
    moex_group_quantize_args qa[QG_NQ];
    int dq_of[QG_ND];                       /* the quantize whose copy a dequantize reads */
    moex_quant_orientation dq_o[QG_ND];
    dbuf y[QG_ND];
    moex_group_dequantize_args da[QG_ND];
    dbuf ws[QG_NQ + QG_ND];
    dbuf *outs[5 * QG_NQ + QG_ND];          /* every output, for poisoning and comparing */
    const char *out_names[5 * QG_NQ + QG_ND];
    int nout;
} qgraph;

static moex_tensor qscales(dbuf *b, int ndim, const int64_t *shape) {
    return ndim == 1 ? moex_tensor_1d(b->d, b->dt, shape[0]) : moex_tensor_2d(b->d, b->dt, shape[0], shape[1]);
}

static void qg_out(qgraph *Q, dbuf *b, const char *name) {
    Q->outs[Q->nout] = b;
    Q->out_names[Q->nout++] = name;
}

static void make_qgraph(moex_context *ctx, qgraph *Q, moex_dtype dt) {
    const int64_t G = QG_G, T = QG_T, K = QG_K;
    const moex_dtype E4 = MOEX_DTYPE_E4M3, E5 = MOEX_DTYPE_E5M2;
    memset(Q, 0, sizeof *Q);
    Q->dt = dt;
    Q->x = dnew(dt, T * K), Q->splits = dnew(MOEX_DTYPE_I64, G);
    const moex_quant_params ps[QG_NQ] = {
        {.recipe = MOEX_QUANT_GROUP, .fp8 = E4, .amax_epsilon = 0.0f, .rounding = MOEX_SCALE_EXACT,
         .scale_layout = MOEX_SCALES_PLAIN},
        {.recipe = MOEX_QUANT_BLOCK, .fp8 = E4, .amax_epsilon = 1e-3f, .rounding = MOEX_SCALE_POW2,
         .scale_layout = MOEX_SCALES_PLAIN},
        {.recipe = MOEX_QUANT_MXFP8, .fp8 = E5, .amax_epsilon = 0.0f, .rounding = MOEX_SCALE_EXACT,
         .scale_layout = MOEX_SCALES_PLAIN},
        {.recipe = MOEX_QUANT_TENSOR, .fp8 = E5, .amax_epsilon = 0.0f, .rounding = MOEX_SCALE_EXACT,
         .scale_layout = MOEX_SCALES_PLAIN},
    };
    static const char *names[QG_NQ][5] = {
        {"GROUP rowwise.data", "GROUP rowwise.scales", "GROUP columnwise.data", "GROUP columnwise.scales", "GROUP amax"},
        {"BLOCK rowwise.data", "BLOCK rowwise.scales", "BLOCK columnwise.data", "BLOCK columnwise.scales", ""},
        {"MXFP8 rowwise.data", "MXFP8 rowwise.scales", "MXFP8 columnwise.data", "MXFP8 columnwise.scales", ""},
        {"TENSOR rowwise.data", "TENSOR rowwise.scales", "", "", "TENSOR amax"}};
    for (int q = 0; q < QG_NQ; q++) {
        const moex_quant_params p = Q->p[q] = ps[q];
        Q->sdt[q] = p.recipe == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32;
        Q->rs_ndim[q] = ref_quant_scales_shape(p.recipe, 0, G, T, K, Q->rs_shape[q]);
        Q->cs_ndim[q] = ref_quant_scales_shape(p.recipe, 1, G, T, K, Q->cs_shape[q]);
        Q->has_col[q] = p.recipe != MOEX_QUANT_TENSOR;
        Q->n_amax[q] = p.recipe == MOEX_QUANT_GROUP ? G : p.recipe == MOEX_QUANT_TENSOR ? 1 : 0;
        moex_group_quantize_args *a = &Q->qa[q];
        a->x = t2(&Q->x, T), a->splits = t1(&Q->splits), a->params = p;
        Q->rd[q] = dnew(p.fp8, T * K);
        Q->rs[q] = dnew(Q->sdt[q], Q->rs_shape[q][0] * (Q->rs_ndim[q] == 2 ? Q->rs_shape[q][1] : 1));
        a->rowwise.data = t2(&Q->rd[q], T), a->rowwise.scales = qscales(&Q->rs[q], Q->rs_ndim[q], Q->rs_shape[q]);
        qg_out(Q, &Q->rd[q], names[q][0]), qg_out(Q, &Q->rs[q], names[q][1]);
        if (Q->has_col[q]) {
            Q->cd[q] = dnew(p.fp8, K * T);
            Q->cs[q] = dnew(Q->sdt[q], Q->cs_shape[q][0] * (Q->cs_ndim[q] == 2 ? Q->cs_shape[q][1] : 1));
            a->columnwise.data = t2(&Q->cd[q], K);
            a->columnwise.scales = qscales(&Q->cs[q], Q->cs_ndim[q], Q->cs_shape[q]);
            qg_out(Q, &Q->cd[q], names[q][2]), qg_out(Q, &Q->cs[q], names[q][3]);
        }
        if (Q->n_amax[q]) {
            Q->am[q] = dnew(MOEX_DTYPE_F32, Q->n_amax[q]);
            a->amax = t1(&Q->am[q]);
            qg_out(Q, &Q->am[q], names[q][4]);
        }
    }
    /* dequantize: BLOCK rowwise -> dt, BLOCK columnwise -> f32, MXFP8 columnwise -> dt,
     * GROUP columnwise -> f16 */
    static const int of[QG_ND] = {1, 1, 2, 0};
    static const moex_quant_orientation os[QG_ND] = {MOEX_QUANT_ROWWISE, MOEX_QUANT_COLUMNWISE, MOEX_QUANT_COLUMNWISE,
                                                     MOEX_QUANT_COLUMNWISE};
    static const char *ynames[QG_ND] = {"y (BLOCK rowwise)", "y (BLOCK columnwise)", "y (MXFP8 columnwise)",
                                        "y (GROUP columnwise)"};
    const moex_dtype ydts[QG_ND] = {dt, MOEX_DTYPE_F32, dt, MOEX_DTYPE_F16};
    for (int i = 0; i < QG_ND; i++) {
        const int q = of[i];
        Q->dq_of[i] = q, Q->dq_o[i] = os[i];
        Q->y[i] = dnew(ydts[i], T * K);
        moex_group_dequantize_args *d = &Q->da[i];
        d->params = Q->p[q], d->orientation = os[i];
        d->src = os[i] == MOEX_QUANT_ROWWISE ? Q->qa[q].rowwise : Q->qa[q].columnwise;
        d->splits = t1(&Q->splits), d->y = t2(&Q->y[i], T);
        qg_out(Q, &Q->y[i], ynames[i]);
    }
    for (int i = 0; i < QG_NQ + QG_ND; i++) {
        size_t bytes = 0;
        if (i < QG_NQ)
            CHECK_STATUS(ctx, moex_group_quantize_workspace_size(ctx, &Q->qa[i], &bytes), MOEX_OK);
        else
            CHECK_STATUS(ctx, moex_group_dequantize_workspace_size(ctx, &Q->da[i - QG_NQ], &bytes), MOEX_OK);
        Q->ws[i] = dnew(MOEX_DTYPE_I32, (int64_t)(bytes + 3) / 4 + 1);
    }
}

/* The quantizes, then the dequantizes that read them, on `s` (captured or eager). */
static moex_status run_quant(moex_context *ctx, qgraph *Q, cudaStream_t s) {
    moex_status r;
    for (int i = 0; i < QG_NQ; i++)
        if ((r = moex_group_quantize(ctx, &Q->qa[i], Q->ws[i].d, dbytes(&Q->ws[i]), (moex_stream)s)) != MOEX_OK)
            return r;
    for (int i = 0; i < QG_ND; i++)
        if ((r = moex_group_dequantize(ctx, &Q->da[i], Q->ws[QG_NQ + i].d, dbytes(&Q->ws[QG_NQ + i]),
                                       (moex_stream)s)) != MOEX_OK)
            return r;
    return MOEX_OK;
}

static void quant_upload(qgraph *Q, const double *x, int64_t rows, const int64_t *splits) {
    dput_rows(&Q->x, x, rows, QG_K);
    cm_die(cudaMemcpy(Q->splits.d, splits, QG_G * sizeof(int64_t), cudaMemcpyHostToDevice), "splits");
    for (int o = 0; o < Q->nout; o++) dpoison(Q->outs[o]);
    cm_die(cudaDeviceSynchronize(), "upload sync");
}

/* n elements of dtype dt equal bit for bit, except that any NaN equals any NaN (the NaN an
 * amax or a dequantized NaN code holds has no prescribed payload). */
static int same_bits_or_nan(moex_dtype dt, const void *a, const void *b, int64_t n) {
    const size_t es = moex_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        const double va = ref_load(dt, a, i), vb = ref_load(dt, b, i);
        if (va != va && vb != vb) continue;
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0) return 0;
    }
    return 1;
}

/* Every output of one replay against the reference: whole buffers, so the tails must be
 * the poison the reference leaves alone. */
static void quant_check_ref(qgraph *Q, const double *x, const int64_t *splits, void **got, const char *label) {
    const int64_t G = QG_G, T = QG_T, K = QG_K;
    int64_t off[QG_G + 1];
    const int64_t S = ref_offsets(splits, G, off);
    int o = 0;
    void *want[5 * QG_NQ];
    for (int q = 0; q < QG_NQ; q++) {
        ref_quant_out ro;
        memset(&ro, 0, sizeof ro);
        const int first = o;
        ro.row_data = (uint8_t *)tu_poisoned(Q->rd[q].dt, Q->rd[q].n), want[o++] = ro.row_data;
        ro.row_scales = tu_poisoned(Q->rs[q].dt, Q->rs[q].n), want[o++] = ro.row_scales;
        if (Q->has_col[q]) {
            ro.col_data = (uint8_t *)tu_poisoned(Q->cd[q].dt, Q->cd[q].n), want[o++] = ro.col_data;
            ro.col_scales = tu_poisoned(Q->cs[q].dt, Q->cs[q].n), want[o++] = ro.col_scales;
        }
        double amax[QG_G];
        if (Q->n_amax[q]) ro.amax = amax;
        ref_group_quantize(&Q->p[q], G, T, K, splits, x, &ro);
        if (Q->n_amax[q]) {
            float *fa = (float *)tu_poisoned(MOEX_DTYPE_F32, Q->n_amax[q]);
            for (int g = 0; g < Q->n_amax[q]; g++) fa[g] = (float)amax[g];
            want[o++] = fa;
        }
        for (int i = first; i < o; i++) {
            const int same = Q->outs[i] == &Q->am[q]
                                 ? same_bits_or_nan(MOEX_DTYPE_F32, got[i], want[i], Q->n_amax[q])
                                 : memcmp(got[i], want[i], dbytes(Q->outs[i])) == 0;
            CHECK_MSG(same, "%s: %s differs from the reference", label, Q->out_names[i]);
        }
    }
    for (int i = 0; i < QG_ND; i++, o++) {
        /* from the replay's own copy (equal to the reference's when the checks above pass) */
        const int q = Q->dq_of[i], col = Q->dq_o[i] == MOEX_QUANT_COLUMNWISE;
        int src = 0;
        while (Q->outs[src] != (col ? &Q->cd[q] : &Q->rd[q])) src++;
        double *y = tu_doubles(T * K);
        ref_group_dequantize(&Q->p[q], Q->dq_o[i], G, T, K, splits, (const uint8_t *)got[src], got[src + 1],
                             Q->y[i].dt, y);
        void *wy = tu_poisoned(Q->y[i].dt, T * K);
        for (int64_t e = 0; e < S * K; e++) ref_store(Q->y[i].dt, wy, e, y[e]);
        CHECK_MSG(same_bits_or_nan(Q->y[i].dt, got[o], wy, S * K), "%s: %s differs from the reference", label,
                  Q->out_names[o]);
        CHECK_POISONED("quantize graph: y rows >= S", Q->y[i].dt, got[o], S * K, T * K);
        free(y), free(wy);
    }
    for (int i = 0; i < 5 * QG_NQ && i < Q->nout - QG_ND; i++) free(want[i]);
}

static void run_quant_graph(moex_context *ctx, tu_rng *r, moex_dtype dt) {
    const int64_t G = QG_G, T = QG_T, K = QG_K;
    qgraph *Q = (qgraph *)tu_alloc(sizeof *Q);
    make_qgraph(ctx, Q, dt);
    cudaStream_t s;
    cm_die(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cm_die(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    moex_status st = run_quant(ctx, Q, s);
    cm_die(cudaStreamEndCapture(s, &graph), "end capture");
    CHECK_STATUS(ctx, st, MOEX_OK);
    cm_die(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

    static const char *names[5] = {"balanced", "empty middle", "one group, sum < T", "skewed, sum < T", "all empty"};
    static const tu_splits_kind kinds[5] = {TU_SPLITS_BALANCED, TU_SPLITS_EMPTY_MIDDLE, TU_SPLITS_ONE_GROUP,
                                            TU_SPLITS_SKEWED, TU_SPLITS_BALANCED};
    static const int64_t rows[5] = {QG_T, QG_T, QG_T - 37, QG_T - 129, 0};
    for (int i = 0; i < 5; i++) {
        char label[128];
        snprintf(label, sizeof label, "quantize graph %s %s", moex_dtype_name(dt), names[i]);
        int64_t splits[QG_G];
        tu_make_splits(r, kinds[i], G, rows[i], splits);
        /* rows of varied magnitude, a zero row, an Inf and a NaN */
        double *x = tu_doubles(T * K);
        for (int64_t t = 0; t < rows[i]; t++) {
            const double m = ldexp(1.0, (int)tu_randint(r, 13) - 6);
            for (int64_t k = 0; k < K; k++) x[t * K + k] = ref_round(dt, m * tu_uniform_range(r, -1, 1));
        }
        if (rows[i] > 10) {
            for (int64_t k = 0; k < K; k++) x[3 * K + k] = 0.0;
            x[5 * K + 7] = INFINITY;
            x[7 * K + 40] = NAN;
        }
        void *gr[5 * QG_NQ + QG_ND], *eg[5 * QG_NQ + QG_ND];
        quant_upload(Q, x, rows[i], splits);
        cm_die(cudaGraphLaunch(exec, s), "graph launch");
        cm_die(cudaStreamSynchronize(s), "graph sync");
        for (int o = 0; o < Q->nout; o++) gr[o] = dget(Q->outs[o]);
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, (moex_stream)s), MOEX_OK);
        quant_upload(Q, x, rows[i], splits);
        CHECK_STATUS(ctx, run_quant(ctx, Q, s), MOEX_OK);
        cm_die(cudaStreamSynchronize(s), "eager sync");
        for (int o = 0; o < Q->nout; o++) eg[o] = dget(Q->outs[o]);
        for (int o = 0; o < Q->nout; o++)
            CHECK_MSG(memcmp(gr[o], eg[o], dbytes(Q->outs[o])) == 0, "%s: %s: graph replay and eager differ", label,
                      Q->out_names[o]);
        quant_check_ref(Q, x, splits, gr, label);
        for (int o = 0; o < Q->nout; o++) free(gr[o]), free(eg[o]);
        free(x);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    free(Q);   /* the device buffers are freed with the process */
}

int main(void) {
    moex_context *ctx = cm_context();
    tu_rng r = tu_rng_seed(99);
    moex_fp8_recipe fp8;
    memset(&fp8, 0, sizeof fp8);
    run_dtype(ctx, &r, MOEX_DTYPE_F32, fp8);
    run_dtype(ctx, &r, MOEX_DTYPE_BF16, fp8);
    fp8.mode = MOEX_FP8_BLOCK;
    run_dtype(ctx, &r, MOEX_DTYPE_BF16, fp8);
    fp8.mode = MOEX_FP8_CURRENT;
    run_dtype(ctx, &r, MOEX_DTYPE_BF16, fp8);
    run_quant_graph(ctx, &r, MOEX_DTYPE_F32);
    run_quant_graph(ctx, &r, MOEX_DTYPE_BF16);
    moex_context_destroy(ctx);
    return tu_finish();
}
