/*
 * test_ep.c - expert parallelism on the CPU backend over MPI (run with mpirun -np 1, 2, 4):
 *   - dispatch forward: splits, the expert-sorted rows (exact copies, in (source rank, token,
 *     slot) order per local expert), probs_r, dropped, rows past sum(splits) untouched;
 *   - combine forward and dispatch backward against fp64 sums (tolerance: the partial sums
 *     of each rank are rounded to the dtype, then summed), dprobs exactly; combine backward
 *     exactly; all with rows past capacity dropped (and reported by moex_context_check_splits);
 *   - routings: random distinct experts, every token to one expert, every expert on rank 0
 *     (the other ranks receive nothing), k = E, and ranks with different token counts (one
 *     with none);
 *   - the EP MoE layer against the single-process MoE layer on the concatenated batch: y, dx,
 *     the local experts' dw1, dw2, db1, db2, and drouter_w summed over the ranks;
 *   - argument errors (refused on every rank, nothing written); over MPI also one rank's
 *     mistake (its own config, a config unlike the others', a bad id, a handle changed since
 *     its dispatch) refused on every rank, nothing written, no rank left waiting (a failure
 *     here is a hang: CTest's timeout).
 * Every rank builds the same global problem from one seed and checks its own outputs.
 */
#ifndef EP_COMM_KIND   /* (this test, not its GPU mirror: the handle's layout, to change one rank's counts) */
#include "ep.h"
#endif
#include "test_quant.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static moex_context *ctx;
static int W, me;
static MPI_Comm comm;

/* The communicator an EP context is created on, and whether its buffers are host memory (a
 * GPU mirror of this test, tests/cuda/test_gpu_ep.c, defines them for NCCL). */
#ifndef EP_COMM_KIND
#define EP_COMM_KIND MOEX_EP_COMM_MPI
#define EP_COMM (&comm)
#define EP_HOST_MEMORY 1
#define EP_TRANSFERS {MOEX_EP_TRANSFER_AUTO}
#endif

/* The transfer the EP contexts of the dispatch cases use (each of EP_TRANSFERS in turn). */
static moex_ep_transfer ep_transfer = MOEX_EP_TRANSFER_AUTO;

/* ---- the global routing ------------------------------------------------------------ */

typedef enum route_kind { ROUTE_RANDOM, ROUTE_ONE_EXPERT, ROUTE_RANK0, ROUTE_ALL } route_kind;

typedef struct problem {
    int64_t Tm, H, E, k, R, El;
    moex_dtype dt;
    int64_t *T, *t0;         /* [W] tokens of each rank, and its first global token */
    int64_t Tg;              /* all tokens */
    int32_t *ids;            /* [Tg, k] */
    float *probs;            /* [Tg, k] */
    double *x;               /* [Tg, H], exact in dt */
    /* the expected placement: global slot (t, j) -> (rank q, expert row m), m = -1: dropped */
    int32_t *q, *m;
    int64_t *rows;           /* [W] expert rows kept on each rank */
    int64_t *dropped;        /* [W] */
    int64_t *splits;         /* [W, El] */
    int64_t *slot_of;        /* [W, R]: the global slot t k + j at each kept row */
} problem;

static void problem_free(problem *p) {
    free(p->T), free(p->t0), free(p->ids), free(p->probs), free(p->x), free(p->q), free(p->m);
    free(p->rows), free(p->dropped), free(p->splits), free(p->slot_of);
}

static problem problem_make(uint64_t seed, route_kind kind, int64_t Tm, int64_t H, int64_t E, int64_t k, int64_t R,
                            moex_dtype dt) {
    problem p;
    memset(&p, 0, sizeof p);
    p.Tm = Tm, p.H = H, p.E = E, p.k = k, p.R = R, p.dt = dt, p.El = E / W;
    tu_rng r = tu_rng_seed(seed);
    p.T = tu_zalloc(sizeof(int64_t) * W), p.t0 = tu_zalloc(sizeof(int64_t) * W);
    for (int s = 0; s < W; s++) {
        p.T[s] = s == 1 ? 0 : s % 2 ? Tm - 1 : Tm;   /* rank 1 has no tokens, odd ranks one fewer */
        p.t0[s] = p.Tg;
        p.Tg += p.T[s];
    }
    p.ids = tu_alloc(sizeof(int32_t) * (size_t)(p.Tg * k + 1));
    p.probs = tu_alloc(sizeof(float) * (size_t)(p.Tg * k + 1));
    p.x = tu_doubles(p.Tg * H + 1);
    tu_fill_uniform(&r, p.x, p.Tg * H, -1, 1, dt);
    /* Each token's k distinct experts: RANDOM from all E; ONE_EXPERT: slot 0 is expert E-1 and
     * the others from the rest; RANK0: from rank 0's El; ALL: a rotation of all E (k = E). */
    int *perm = tu_alloc(sizeof(int) * (size_t)E);
    for (int64_t t = 0; t < p.Tg; t++) {
        const int64_t first = kind == ROUTE_ONE_EXPERT ? 1 : 0;
        const int64_t span = kind == ROUTE_RANK0 ? p.El : kind == ROUTE_ONE_EXPERT ? E - 1 : E;
        for (int64_t e = 0; e < E; e++) perm[e] = (int)e;
        for (int64_t j = first; j < k; j++) {
            const int64_t pick = (j - first) + tu_randint(&r, span - (j - first));
            const int tmp = perm[j - first];
            perm[j - first] = perm[pick], perm[pick] = tmp;
            p.ids[t * k + j] = kind == ROUTE_ALL ? (int32_t)((j + t) % E) : (int32_t)perm[j - first];
        }
        if (first) p.ids[t * k] = (int32_t)(E - 1);
        for (int64_t j = 0; j < k; j++) p.probs[t * k + j] = (float)tu_uniform(&r);
    }
    free(perm);
    /* The placement: on each rank q, expert e's rows in (source rank, token, slot) order. */
    p.q = tu_alloc(sizeof(int32_t) * (size_t)(p.Tg * k + 1));
    p.m = tu_alloc(sizeof(int32_t) * (size_t)(p.Tg * k + 1));
    p.rows = tu_zalloc(sizeof(int64_t) * W), p.dropped = tu_zalloc(sizeof(int64_t) * W);
    p.splits = tu_zalloc(sizeof(int64_t) * (size_t)(W * p.El));
    p.slot_of = tu_alloc(sizeof(int64_t) * (size_t)(W * R));
    for (int q = 0; q < W; q++) {
        int64_t next = 0;
        for (int64_t e = q * p.El; e < (q + 1) * p.El; e++)
            for (int64_t i = 0; i < p.Tg * k; i++) {
                if (p.ids[i] != e) continue;
                p.q[i] = q;
                if (next < R) {
                    p.m[i] = (int32_t)next;
                    p.slot_of[q * R + next] = i;
                    p.splits[q * p.El + (e - q * p.El)]++;
                    next++;
                } else {
                    p.m[i] = -1;
                    p.dropped[q]++;
                }
            }
        p.rows[q] = next;
    }
    return p;
}

/* A deterministic value of row m, column h of rank q's expert rows (the same on every rank). */
static double row_value(uint64_t salt, int q, int64_t m, int64_t h, moex_dtype dt) {
    tu_rng r = tu_rng_seed(salt * 1000003u + (uint64_t)q * 7919u + (uint64_t)m * 131u + (uint64_t)h);
    double v;
    tu_fill_uniform(&r, &v, 1, -1, 1, dt);
    return v;
}

/* ---- dispatch and combine ------------------------------------------------------------ */

static moex_ep *ep_make(const problem *p) {
    moex_ep_config cfg = {.comm_kind = EP_COMM_KIND, .comm = EP_COMM, .num_experts = (int32_t)p->E,
                          .topk = (int32_t)p->k, .hidden = p->H, .dtype = p->dt, .max_tokens = p->Tm,
                          .max_recv_rows = p->R, .transfer = ep_transfer};
    moex_ep *ep = NULL;
    CHECK_STATUS(ctx, moex_ep_create(&ep, ctx, &cfg), MOEX_OK);
    return ep;
}

/* Expected sum over token t's slots of rows(q, m): each rank's slots summed and rounded to
 * dt, then summed; *bound = the sum of the magnitudes. */
static double token_sum(const problem *p, int64_t t, uint64_t salt, int64_t h, double *bound) {
    double total = 0;
    *bound = 0;
    for (int q = 0; q < W; q++) {
        double part = 0;
        for (int64_t j = 0; j < p->k; j++) {
            const int64_t i = t * p->k + j;
            if (p->q[i] != q || p->m[i] < 0) continue;
            const double v = row_value(salt, q, p->m[i], h, p->dt);
            part += v;
            *bound += fabs(v);
        }
        total += part;
    }
    return total;
}

static void run_dispatch_case(const char *name, route_kind kind, int64_t Tm, int64_t H, int64_t E, int64_t k,
                              int64_t R, moex_dtype dt) {
    problem p = problem_make(0xE9 + (uint64_t)kind * 17 + (uint64_t)E, kind, Tm, H, E, k, R, dt);
    moex_ep *ep = ep_make(&p);
    if (!ep) {
        problem_free(&p);
        return;
    }
    moex_ep_info info;
    CHECK_STATUS(ctx, moex_ep_get_info(ep, &info), MOEX_OK);
    CHECK_EQ_I64(info.world, W);
    CHECK_EQ_I64(info.rank, me);
    CHECK_EQ_I64(info.local_experts, p.El);
    CHECK(ep_transfer == MOEX_EP_TRANSFER_AUTO ? info.transfer != MOEX_EP_TRANSFER_AUTO : info.transfer == ep_transfer);
    const int64_t T = p.T[me], t0 = p.t0[me], El = p.El;
    const size_t es = moex_dtype_size(dt);

    void *x = tu_buffer(dt, p.x + t0 * H, T * H);
    void *handle = tu_alloc(info.handle_bytes + 3);   /* an odd address */
    void *xr = tu_poisoned(dt, R * H);
    float *probs_r = tu_poisoned(MOEX_DTYPE_F32, R);
    int64_t *splits = tu_poisoned(MOEX_DTYPE_I64, El);
    int64_t dropped = -7;
    moex_ep_dispatch_args da = {
        .ep = ep, .x = moex_tensor_2d(x, dt, T, H), .ids = moex_tensor_2d(p.ids + t0 * k, MOEX_DTYPE_I32, T, k),
        .probs = moex_tensor_2d(p.probs + t0 * k, MOEX_DTYPE_F32, T, k), .handle = (char *)handle + 3,
        .handle_bytes = info.handle_bytes, .xr = moex_tensor_2d(xr, dt, R, H),
        .probs_r = moex_tensor_1d(probs_r, MOEX_DTYPE_F32, R), .splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, El),
        .dropped = moex_tensor_1d(&dropped, MOEX_DTYPE_I64, 1)};
    /* A drop is reported once: by moex_context_check_splits (a GPU mirror of the call checks
     * it itself and returns its status). */
    const moex_status st = moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL);
    const moex_status drops = moex_context_check_splits(ctx, NULL);
    const moex_status want = p.dropped[me] > 0 ? MOEX_ERR_BAD_SPLITS : MOEX_OK;
    CHECK_MSG((st == MOEX_OK && drops == want) || (st == want && drops == MOEX_OK),
              "%s: dispatch %s, then check_splits %s; want one %s", name, moex_status_string(st),
              moex_status_string(drops), moex_status_string(want));
    tu_log("%s: rank %d rows %lld dropped %lld\n", name, me, (long long)p.rows[me], (long long)p.dropped[me]);
    for (int64_t e = 0; e < El; e++) CHECK_EQ_I64(splits[e], p.splits[me * El + e]);
    CHECK_EQ_I64(dropped, p.dropped[me]);
    const int64_t rows = p.rows[me];
    double *got = tu_read(dt, xr, rows * H);
    int64_t bad = 0;
    for (int64_t m = 0; m < rows; m++) {
        const int64_t i = p.slot_of[me * R + m], t = i / k;
        bad += memcmp(got + m * H, p.x + t * H, sizeof(double) * (size_t)H) != 0;
        bad += probs_r[m] != p.probs[i];
    }
    CHECK_MSG(bad == 0, "%s: %lld expert rows (or probs) are not their token's", name, (long long)bad);
    CHECK_POISONED("xr past the rows", dt, xr, rows * H, R * H);
    CHECK_POISONED("probs_r past the rows", MOEX_DTYPE_F32, probs_r, rows, R);
    free(got);

    /* combine forward: yr rows are row_value(1, me, m, h); rows past are NaN (never read). */
    double *yrv = tu_doubles(R * H + 1);
    for (int64_t m = 0; m < rows; m++)
        for (int64_t h = 0; h < H; h++) yrv[m * H + h] = row_value(1, me, m, h, dt);
    void *yr = tu_buffer_rows(dt, yrv, rows, R, H);
    void *y = tu_poisoned(dt, T * H);
    moex_ep_combine_args ca = {.ep = ep, .handle = (char *)handle + 3, .handle_bytes = info.handle_bytes,
                               .yr = moex_tensor_2d(yr, dt, R, H), .y = moex_tensor_2d(y, dt, T, H)};
    CHECK_STATUS(ctx, moex_ep_combine_forward(ctx, &ca, NULL, 0, NULL), MOEX_OK);
    double *ref = tu_doubles(T * H + 1), *bound = tu_doubles(T * H + 1);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) ref[t * H + h] = token_sum(&p, t0 + t, 1, h, &bound[t * H + h]);
    const ref_tol_model tol = ref_tol_for(dt, dt, 1, k + 1);
    CHECK_CLOSE("combine y", dt, y, ref, bound, T * H, H, &tol);

    /* dispatch backward: dxr rows row_value(2, ..), dprobs_r[m] = m + 0.5 (exact) */
    for (int64_t m = 0; m < rows; m++)
        for (int64_t h = 0; h < H; h++) yrv[m * H + h] = row_value(2, me, m, h, dt);
    void *dxr = tu_buffer_rows(dt, yrv, rows, R, H);
    float *dprobs_r = tu_poisoned(MOEX_DTYPE_F32, R);
    for (int64_t m = 0; m < rows; m++) dprobs_r[m] = (float)(me * 1000 + m) + 0.5f;
    void *dx = tu_poisoned(dt, T * H);
    float *dprobs = tu_poisoned(MOEX_DTYPE_F32, T * k);
    moex_ep_dispatch_grad_args dg = {.ep = ep, .handle = (char *)handle + 3, .handle_bytes = info.handle_bytes,
                                     .dxr = moex_tensor_2d(dxr, dt, R, H),
                                     .dprobs_r = moex_tensor_1d(dprobs_r, MOEX_DTYPE_F32, R),
                                     .dx = moex_tensor_2d(dx, dt, T, H),
                                     .dprobs = moex_tensor_2d(dprobs, MOEX_DTYPE_F32, T, k)};
    CHECK_STATUS(ctx, moex_ep_dispatch_backward(ctx, &dg, NULL, 0, NULL), MOEX_OK);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) ref[t * H + h] = token_sum(&p, t0 + t, 2, h, &bound[t * H + h]);
    CHECK_CLOSE("dispatch backward dx", dt, dx, ref, bound, T * H, H, &tol);
    bad = 0;
    for (int64_t i = 0; i < T * k; i++) {
        const int64_t gi = t0 * k + i;
        const float want = p.m[gi] < 0 ? 0.0f : (float)(p.q[gi] * 1000 + p.m[gi]) + 0.5f;
        bad += dprobs[i] != want;
    }
    CHECK_MSG(bad == 0, "%s: %lld dprobs are not their rows'", name, (long long)bad);

    /* combine backward: dyr[m] = dy[token of m] exactly; rows past untouched */
    double *dyv = tu_doubles(p.Tg * H + 1);
    for (int64_t t = 0; t < p.Tg; t++)
        for (int64_t h = 0; h < H; h++) dyv[t * H + h] = row_value(3, 0, t, h, dt);
    void *dy = tu_buffer(dt, dyv + t0 * H, T * H);
    void *dyr = tu_poisoned(dt, R * H);
    moex_ep_combine_grad_args cg = {.ep = ep, .handle = (char *)handle + 3, .handle_bytes = info.handle_bytes,
                                    .dy = moex_tensor_2d(dy, dt, T, H), .dyr = moex_tensor_2d(dyr, dt, R, H)};
    CHECK_STATUS(ctx, moex_ep_combine_backward(ctx, &cg, NULL, 0, NULL), MOEX_OK);
    got = tu_read(dt, dyr, rows * H);
    bad = 0;
    for (int64_t m = 0; m < rows; m++)
        bad += memcmp(got + m * H, dyv + (p.slot_of[me * R + m] / k) * H, sizeof(double) * (size_t)H) != 0;
    CHECK_MSG(bad == 0, "%s: %lld dyr rows are not their token's dy", name, (long long)bad);
    CHECK_POISONED("dyr past the rows", dt, dyr, rows * H, R * H);
    (void)es;

    free(got), free(dyv), free(dy), free(dyr), free(dx), free(dprobs), free(dxr), free(dprobs_r);
    free(ref), free(bound), free(yrv), free(yr), free(y);
    free(x), free(handle), free(xr), free(probs_r), free(splits);
    moex_ep_destroy(ep);
    problem_free(&p);
}

/* An FP8 dispatch: E4M3 rows (any finite bytes) and their 1x128 scales arrive as exact copies,
 * in the order of the bf16 dispatch; rows past sum(splits) untouched. */
static void run_fp8_dispatch_case(const char *name, route_kind kind, int64_t Tm, int64_t H, int64_t E, int64_t k,
                                  int64_t R) {
    problem p = problem_make(0xF8 + (uint64_t)kind, kind, Tm, H, E, k, R, MOEX_DTYPE_BF16);
    moex_ep *ep = ep_make(&p);
    if (!ep) {
        problem_free(&p);
        return;
    }
    moex_ep_info info;
    CHECK_STATUS(ctx, moex_ep_get_info(ep, &info), MOEX_OK);
    const int64_t T = p.T[me], t0 = p.t0[me], El = p.El, nb = (H + 127) / 128;
    /* every rank's data, from the global token index: byte (t, h) and scale (t, b) */
    uint8_t *xq = tu_alloc((size_t)(p.Tg * H + 1));
    float *xs = tu_alloc(sizeof(float) * (size_t)(p.Tg * nb + 1));
    for (int64_t i = 0; i < p.Tg * H; i++) xq[i] = (uint8_t)((i * 37 + 11) % 0x7e);   /* finite E4M3 */
    for (int64_t i = 0; i < p.Tg * nb; i++) xs[i] = 0.5f + (float)i;
    uint8_t *xr = tu_poisoned(MOEX_DTYPE_E4M3, R * H);
    float *xrs = tu_poisoned(MOEX_DTYPE_F32, R * nb);
    int64_t *splits = tu_poisoned(MOEX_DTYPE_I64, El);
    void *handle = tu_alloc(info.handle_bytes);
    moex_ep_dispatch_args da = {
        .ep = ep, .x = moex_tensor_2d(xq + t0 * H, MOEX_DTYPE_E4M3, T, H),
        .ids = moex_tensor_2d(p.ids + t0 * k, MOEX_DTYPE_I32, T, k),
        .probs = moex_tensor_2d(p.probs + t0 * k, MOEX_DTYPE_F32, T, k), .handle = handle,
        .handle_bytes = info.handle_bytes, .xr = moex_tensor_2d(xr, MOEX_DTYPE_E4M3, R, H),
        .splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, El),
        .x_scales = moex_tensor_2d(xs + t0 * nb, MOEX_DTYPE_F32, T, nb),
        .xr_scales = moex_tensor_2d(xrs, MOEX_DTYPE_F32, R, nb)};
    const moex_status st = moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL);
    const moex_status drops = moex_context_check_splits(ctx, NULL);
    const moex_status want = p.dropped[me] > 0 ? MOEX_ERR_BAD_SPLITS : MOEX_OK;
    CHECK_MSG((st == MOEX_OK && drops == want) || (st == want && drops == MOEX_OK), "%s: dispatch %s, check %s",
              name, moex_status_string(st), moex_status_string(drops));
    for (int64_t e = 0; e < El; e++) CHECK_EQ_I64(splits[e], p.splits[me * El + e]);
    int64_t bad = 0;
    const int64_t rows = p.rows[me];
    for (int64_t m = 0; m < rows; m++) {
        const int64_t t = p.slot_of[me * R + m] / k;
        bad += memcmp(xr + m * H, xq + t * H, (size_t)H) != 0;
        bad += memcmp(xrs + m * nb, xs + t * nb, sizeof(float) * (size_t)nb) != 0;
    }
    CHECK_MSG(bad == 0, "%s: %lld FP8 rows or scales are not their token's", name, (long long)bad);
    CHECK_POISONED("FP8 xr past the rows", MOEX_DTYPE_E4M3, xr, rows * H, R * H);
    CHECK_POISONED("xr_scales past the rows", MOEX_DTYPE_F32, xrs, rows * nb, R * nb);
    /* refused: FP8 x without its scales */
    da.x_scales = (moex_tensor){0};
    CHECK_REFUSED(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), "x", NULL);
    free(xq), free(xs), free(xr), free(xrs), free(splits), free(handle);
    moex_ep_destroy(ep);
    problem_free(&p);
}

/* ---- the EP MoE layer against the MoE layer on the concatenated batch ---------------- */

static void *weights(tu_rng *r, moex_dtype dt, int64_t n, double scale, double **v) {
    *v = tu_doubles(n);
    tu_fill_uniform(r, *v, n, -scale, scale, dt);
    return tu_buffer(dt, *v, n);
}

/* got (f32 or dt) against the single-process layer's want, within rtol of want's largest; returns
 * the largest difference relative to it. */
static double check_near(const char *what, moex_dtype dt, const void *got, const void *want, int64_t n, double rtol) {
    double *g = tu_read(dt, got, n), *w = tu_read(dt, want, n), scale = 1e-30, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(w[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, isfinite(g[i]) ? fabs(g[i] - w[i]) / scale : INFINITY);
    CHECK_MSG(worst <= rtol, "%s: max |ep - single| / max|single| = %.3g > %.3g", what, worst, rtol);
    tu_log("%s: max |ep - single| / max|single| = %.3g\n", what, worst);
    free(g), free(w);
    return worst;
}

/* fp8: the layers' recipe (mode OFF: none). With BLOCK the EP layer dispatches x's rowwise FP8
 * copy, which FC1 reads as it comes (the single-process layer quantizes the same rows alike: the
 * same forward), and keeps the dequantized rows for the backward, whose dW1 then reads their
 * columnwise copy where the single layer's reads x's: rtol_dw1 bounds that difference, and a
 * difference of at least 1e-3 shows the dispatched rows were the FP8 copy (a dispatch in the
 * activation dtype gives the single layer's dW1). (The single layer cannot run on the
 * dequantized rows instead: its router reads x.) */
static void run_layer_case(int64_t Tm, int64_t H, int64_t F, int64_t E, int64_t k, moex_dtype dt, double rtol,
                           moex_fp8_mode fp8, double rtol_dw1) {
    problem p = problem_make(77, ROUTE_RANDOM, Tm, H, E, k, 1, dt);   /* T per rank and x only */
    const int64_t T = p.T[me], t0 = p.t0[me], Tg = p.Tg, El = E / W;
    tu_rng r = tu_rng_seed(4242);
    double *vrw, *vw1, *vb1, *vw2, *vb2, *vdy;
    void *rw = weights(&r, dt, E * H, 0.5, &vrw), *w1 = weights(&r, dt, E * 2 * F * H, 0.5, &vw1);
    void *b1 = weights(&r, dt, E * 2 * F, 0.1, &vb1), *w2 = weights(&r, dt, E * H * F, 0.5, &vw2);
    void *b2 = weights(&r, dt, E * H, 0.1, &vb2), *dyg = weights(&r, dt, Tg * H, 1, &vdy);
    void *xg = tu_buffer(dt, p.x, Tg * H);
    const size_t es = moex_dtype_size(dt);

    /* the single-process layer over all Tg tokens and all E experts */
    moex_moe_layer_args a = {.x = moex_tensor_2d(xg, dt, Tg, H), .router_w = moex_tensor_2d(rw, dt, E, H),
                             .topk = (int32_t)k, .score = MOEX_ROUTER_SOFTMAX, .norm = MOEX_ROUTER_RENORM,
                             .w1 = moex_weight_packed(moex_tensor_3d(w1, dt, E, 2 * F, H)),
                             .b1 = moex_tensor_2d(b1, dt, E, 2 * F),
                             .w2 = moex_weight_packed(moex_tensor_3d(w2, dt, E, H, F)), .b2_mode = MOEX_BIAS_SCALED,
                             .b2 = moex_tensor_2d(b2, dt, E, H), .glu = moex_glu_params_default(MOEX_GLU_SWIGLU),
                             .fp8 = {.mode = fp8}};
    void *yg = tu_poisoned(dt, Tg * H);
    a.y = moex_tensor_2d(yg, dt, Tg, H);
    size_t sb = 0, wb = 0;
    CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, &a, &sb), MOEX_OK);
    a.saved = tu_alloc(sb), a.saved_bytes = sb;
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &wb), MOEX_OK);
    void *ws = tu_workspace(wb);
    CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, wb, NULL), MOEX_OK);
    free(ws);
    float *dxg = tu_poisoned(dt, Tg * H), *drwg = tu_poisoned(MOEX_DTYPE_F32, E * H);
    float *dw1g = tu_poisoned(MOEX_DTYPE_F32, E * 2 * F * H), *dw2g = tu_poisoned(MOEX_DTYPE_F32, E * H * F);
    float *db1g = tu_poisoned(MOEX_DTYPE_F32, E * 2 * F), *db2g = tu_poisoned(MOEX_DTYPE_F32, E * H);
    moex_moe_layer_grad_args g = {.fwd = a, .dy = moex_tensor_2d(dyg, dt, Tg, H), .dx = moex_tensor_2d(dxg, dt, Tg, H),
                                  .dw_mode = MOEX_GRAD_WRITE,
                                  .drouter_w = moex_tensor_2d(drwg, MOEX_DTYPE_F32, E, H),
                                  .dw1 = moex_weight_packed(moex_tensor_3d(dw1g, MOEX_DTYPE_F32, E, 2 * F, H)),
                                  .dw2 = moex_weight_packed(moex_tensor_3d(dw2g, MOEX_DTYPE_F32, E, H, F)),
                                  .db1 = moex_tensor_2d(db1g, MOEX_DTYPE_F32, E, 2 * F),
                                  .db2 = moex_tensor_2d(db2g, MOEX_DTYPE_F32, E, H)};
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &g, &wb), MOEX_OK);
    ws = tu_workspace(wb);
    CHECK_STATUS(ctx, moex_moe_layer_backward(ctx, &g, ws, wb, NULL), MOEX_OK);
    free(ws);

    /* the EP layer: this rank's tokens, its local experts */
    p.R = Tg * k;   /* no drops */
    moex_ep *ep = ep_make(&p);
    const int64_t e0 = me * El;
    moex_ep_moe_layer_args ea = {.ep = ep, .layer = a};
    moex_moe_layer_args *l = &ea.layer;
    void *x = (char *)xg + (size_t)(t0 * H) * es, *y = tu_poisoned(dt, T * H);
    l->x = moex_tensor_2d(x, dt, T, H);
    l->w1 = moex_weight_packed(moex_tensor_3d((char *)w1 + (size_t)(e0 * 2 * F * H) * es, dt, El, 2 * F, H));
    l->b1 = moex_tensor_2d((char *)b1 + (size_t)(e0 * 2 * F) * es, dt, El, 2 * F);
    l->w2 = moex_weight_packed(moex_tensor_3d((char *)w2 + (size_t)(e0 * H * F) * es, dt, El, H, F));
    l->b2 = moex_tensor_2d((char *)b2 + (size_t)(e0 * H) * es, dt, El, H);
    l->y = moex_tensor_2d(y, dt, T, H);
    int64_t dropped = -7;
    ea.dropped = moex_tensor_1d(&dropped, MOEX_DTYPE_I64, 1);
    CHECK_STATUS(ctx, moex_ep_moe_layer_saved_size(ctx, &ea, &sb), MOEX_OK);
    l->saved = tu_alloc(sb), l->saved_bytes = sb;
    CHECK_STATUS(ctx, moex_ep_moe_layer_forward_workspace_size(ctx, &ea, &wb), MOEX_OK);
    ws = tu_workspace(wb);
    CHECK_STATUS(ctx, moex_ep_moe_layer_forward(ctx, &ea, ws, wb, NULL), MOEX_OK);
    free(ws);
    check_near("ep layer y", dt, y, (char *)yg + (size_t)(t0 * H) * es, T * H, rtol);
    CHECK_EQ_I64(dropped, 0);

    void *dx = tu_poisoned(dt, T * H);
    float *drw = tu_poisoned(MOEX_DTYPE_F32, E * H), *dw1 = tu_poisoned(MOEX_DTYPE_F32, El * 2 * F * H);
    float *dw2 = tu_poisoned(MOEX_DTYPE_F32, El * H * F), *db1 = tu_poisoned(MOEX_DTYPE_F32, El * 2 * F);
    float *db2 = tu_poisoned(MOEX_DTYPE_F32, El * H);
    moex_ep_moe_layer_grad_args eg = {
        .ep = ep,
        .layer = {.fwd = *l, .dy = moex_tensor_2d((char *)dyg + (size_t)(t0 * H) * es, dt, T, H),
                  .dx = moex_tensor_2d(dx, dt, T, H), .dw_mode = MOEX_GRAD_WRITE,
                  .drouter_w = moex_tensor_2d(drw, MOEX_DTYPE_F32, E, H),
                  .dw1 = moex_weight_packed(moex_tensor_3d(dw1, MOEX_DTYPE_F32, El, 2 * F, H)),
                  .dw2 = moex_weight_packed(moex_tensor_3d(dw2, MOEX_DTYPE_F32, El, H, F)),
                  .db1 = moex_tensor_2d(db1, MOEX_DTYPE_F32, El, 2 * F),
                  .db2 = moex_tensor_2d(db2, MOEX_DTYPE_F32, El, H)}};
    CHECK_STATUS(ctx, moex_ep_moe_layer_backward_workspace_size(ctx, &eg, &wb), MOEX_OK);
    ws = tu_workspace(wb);
    CHECK_STATUS(ctx, moex_ep_moe_layer_backward(ctx, &eg, ws, wb, NULL), MOEX_OK);
    free(ws);
    if (fp8 != MOEX_FP8_OFF) {   /* the local experts' kept FP8 copies: bitwise the same step */
        void *bufs[2];
        const moex_fp8_weight kw[2] = {tq_kept_copies(ctx, &l->fp8, &l->w1, bufs),
                                       tq_kept_copies(ctx, &l->fp8, &l->w2, bufs + 1)};
        moex_ep_moe_layer_args ka = ea;
        ka.layer.fp8.weights = kw;
        void *y2 = tu_poisoned(dt, T * H), *dx2 = tu_poisoned(dt, T * H);
        ka.layer.y = moex_tensor_2d(y2, dt, T, H);
        ka.layer.saved = tu_alloc(l->saved_bytes);
        CHECK_STATUS(ctx, moex_ep_moe_layer_forward_workspace_size(ctx, &ka, &wb), MOEX_OK);
        ws = tu_workspace(wb);
        CHECK_STATUS(ctx, moex_ep_moe_layer_forward(ctx, &ka, ws, wb, NULL), MOEX_OK);
        free(ws);
        moex_ep_moe_layer_grad_args kg = eg;
        kg.layer.fwd = ka.layer, kg.layer.dx = moex_tensor_2d(dx2, dt, T, H);
        float *o2[5];
        const int64_t on[5] = {E * H, El * 2 * F * H, El * H * F, El * 2 * F, El * H};
        moex_tensor *ot[5] = {&kg.layer.drouter_w, &kg.layer.dw1.t, &kg.layer.dw2.t, &kg.layer.db1, &kg.layer.db2};
        const float *o1[5] = {drw, dw1, dw2, db1, db2};
        for (int i = 0; i < 5; i++) o2[i] = tu_poisoned(MOEX_DTYPE_F32, on[i]), ot[i]->data = o2[i];
        CHECK_STATUS(ctx, moex_ep_moe_layer_backward_workspace_size(ctx, &kg, &wb), MOEX_OK);
        ws = tu_workspace(wb);
        CHECK_STATUS(ctx, moex_ep_moe_layer_backward(ctx, &kg, ws, wb, NULL), MOEX_OK);
        free(ws);
        int same = memcmp(y2, y, (size_t)(T * H) * es) == 0 && memcmp(dx2, dx, (size_t)(T * H) * es) == 0;
        for (int i = 0; i < 5; i++) same = same && memcmp(o2[i], o1[i], (size_t)on[i] * 4) == 0, free(o2[i]);
        CHECK_MSG(same, "ep layer with the experts' kept FP8 copies: y, dx or a gradient is not bitwise the step "
                  "that quantizes them");
        free(y2), free(dx2), free(ka.layer.saved);
        free(bufs[0]), free(bufs[1]);
    }
    check_near("ep layer dx", dt, dx, (char *)dxg + (size_t)(t0 * H) * es, T * H, rtol);
    double dw1_diff =
        check_near("ep layer dw1", MOEX_DTYPE_F32, dw1, dw1g + e0 * 2 * F * H, El * 2 * F * H, rtol_dw1);
    MPI_Allreduce(MPI_IN_PLACE, &dw1_diff, 1, MPI_DOUBLE, MPI_MAX, comm);   /* (a rank's experts may get no rows) */
    if (fp8 == MOEX_FP8_BLOCK)
        CHECK_MSG(dw1_diff > 1e-3, "ep layer dw1 equals the single layer's (%.3g on every rank): the rows were not "
                  "dispatched in FP8", dw1_diff);
    check_near("ep layer dw2", MOEX_DTYPE_F32, dw2, dw2g + e0 * H * F, El * H * F, rtol);
    check_near("ep layer db1", MOEX_DTYPE_F32, db1, db1g + e0 * 2 * F, El * 2 * F, rtol);
    check_near("ep layer db2", MOEX_DTYPE_F32, db2, db2g + e0 * H, El * H, rtol);
    MPI_Allreduce(MPI_IN_PLACE, drw, (int)(E * H), MPI_FLOAT, MPI_SUM, comm);
    check_near("ep layer drouter_w (summed over ranks)", MOEX_DTYPE_F32, drw, drwg, E * H, rtol);

    free(dx), free(drw), free(dw1), free(dw2), free(db1), free(db2), free(y), free(l->saved);
    moex_ep_destroy(ep);
    free(dxg), free(drwg), free(dw1g), free(dw2g), free(db1g), free(db2g), free(yg), free(a.saved);
    free(rw), free(w1), free(b1), free(w2), free(b2), free(dyg), free(xg);
    free(vrw), free(vw1), free(vb1), free(vw2), free(vb2), free(vdy);
    problem_free(&p);
}

/* The EP layer past its capacity reports its drops: a zero router sends every token to
 * experts 0 and 1 (ties go to the lower index), both rank 0's, which keeps R = 3 of the 2 W T
 * rows and drops the rest; the other ranks receive none. The layer's `dropped` is each rank's
 * count, and the drop is reported once more, as a dispatch's is (the call's status, or
 * moex_context_check_splits after it). */
static void run_layer_drops(void) {
    const int64_t T = 3, H = 8, F = 4, E = 2 * W, k = 2, El = 2, R = 3;
    const moex_dtype dt = MOEX_DTYPE_F32;
    tu_rng r = tu_rng_seed(99);
    double *vx, *vrw, *vw1, *vw2;
    void *x = weights(&r, dt, T * H, 1, &vx), *rw = weights(&r, dt, E * H, 0, &vrw);
    void *w1 = weights(&r, dt, El * 2 * F * H, 0.5, &vw1), *w2 = weights(&r, dt, El * H * F, 0.5, &vw2);
    void *y = tu_poisoned(dt, T * H);
    const moex_ep_config cfg = {.comm_kind = EP_COMM_KIND, .comm = EP_COMM, .num_experts = (int32_t)E,
                                .topk = (int32_t)k, .hidden = H, .dtype = dt, .max_tokens = T, .max_recv_rows = R,
                                .transfer = ep_transfer};
    moex_ep *ep = NULL;
    CHECK_STATUS(ctx, moex_ep_create(&ep, ctx, &cfg), MOEX_OK);
    int64_t dropped = -7;
    moex_ep_moe_layer_args ea = {
        .ep = ep,
        .layer = {.x = moex_tensor_2d(x, dt, T, H), .router_w = moex_tensor_2d(rw, dt, E, H), .topk = (int32_t)k,
                  .w1 = moex_weight_packed(moex_tensor_3d(w1, dt, El, 2 * F, H)),
                  .w2 = moex_weight_packed(moex_tensor_3d(w2, dt, El, H, F)),
                  .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .y = moex_tensor_2d(y, dt, T, H)},
        .dropped = moex_tensor_1d(&dropped, MOEX_DTYPE_I64, 1)};
    size_t sb = 0, wb = 0;
    CHECK_STATUS(ctx, moex_ep_moe_layer_saved_size(ctx, &ea, &sb), MOEX_OK);
    ea.layer.saved = tu_alloc(sb), ea.layer.saved_bytes = sb;
    CHECK_STATUS(ctx, moex_ep_moe_layer_forward_workspace_size(ctx, &ea, &wb), MOEX_OK);
    void *ws = tu_workspace(wb);
    const moex_status st = moex_ep_moe_layer_forward(ctx, &ea, ws, wb, NULL);
    const moex_status drops = moex_context_check_splits(ctx, NULL);
    const int64_t want = me == 0 ? W * T * k - R : 0;
    const moex_status want_st = want > 0 ? MOEX_ERR_BAD_SPLITS : MOEX_OK;
    CHECK_MSG((st == MOEX_OK && drops == want_st) || (st == want_st && drops == MOEX_OK),
              "ep layer past capacity: forward %s, then check_splits %s; want one %s", moex_status_string(st),
              moex_status_string(drops), moex_status_string(want_st));
    CHECK_EQ_I64(dropped, want);
    free(ws), free(ea.layer.saved), free(y), free(x), free(rw), free(w1), free(w2);
    free(vx), free(vrw), free(vw1), free(vw2);
    moex_ep_destroy(ep);
}

/* ---- argument errors ------------------------------------------------------------------ */

static void run_errors(void) {
    moex_ep *ep = NULL;
    moex_ep_config cfg = {.comm_kind = EP_COMM_KIND, .comm = EP_COMM, .num_experts = (int32_t)(2 * W + 1), .topk = 1,
                          .hidden = 8, .dtype = MOEX_DTYPE_F32, .max_tokens = 4, .max_recv_rows = 16,
                          .transfer = MOEX_EP_TRANSFER_AUTO};
    if (W > 1) {
        CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "num_experts", "multiple");
        CHECK(ep == NULL);
    }
    cfg.num_experts = 2 * W;
    cfg.comm_kind = EP_COMM_KIND == MOEX_EP_COMM_MPI ? MOEX_EP_COMM_NCCL : MOEX_EP_COMM_MPI;
    CHECK_STATUS(ctx, moex_ep_create(&ep, ctx, &cfg), MOEX_ERR_UNSUPPORTED);
    cfg.comm_kind = EP_COMM_KIND;
#if EP_HOST_MEMORY
    cfg.transfer = MOEX_EP_TRANSFER_PEER;   /* NCCL's only */
    CHECK_STATUS(ctx, moex_ep_create(&ep, ctx, &cfg), MOEX_ERR_UNSUPPORTED);
    cfg.transfer = MOEX_EP_TRANSFER_AUTO;
#endif
    cfg.topk = 0;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "topk", NULL);
    cfg.topk = 1;
    cfg.comm = NULL;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "comm", NULL);
    cfg.comm = EP_COMM;
    CHECK_STATUS(ctx, moex_ep_create(&ep, ctx, &cfg), MOEX_OK);
    if (!ep) return;
    moex_ep_info info;
    CHECK_STATUS(ctx, moex_ep_get_info(ep, &info), MOEX_OK);
    float x[5 * 8] = {0}, probs[5] = {0}, xr[16 * 8];
    int32_t ids[5] = {0};
    int64_t splits[2] = {-3, -3};
    char *handle = tu_alloc(info.handle_bytes);
    memset(xr, 0x7f, sizeof xr);
    const unsigned char xr0 = ((unsigned char *)xr)[0];
    moex_ep_dispatch_args da = {.ep = ep, .x = moex_tensor_2d(x, MOEX_DTYPE_F32, 5, 8),
                                .ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, 5, 1),
                                .probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, 5, 1), .handle = handle,
                                .handle_bytes = info.handle_bytes, .xr = moex_tensor_2d(xr, MOEX_DTYPE_F32, 16, 8),
                                .splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, 2)};
    CHECK_REFUSED(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), "max_tokens", NULL);   /* T 5 > 4 */
    da.x.shape[0] = da.ids.shape[0] = da.probs.shape[0] = 4;
    da.handle_bytes = info.handle_bytes - 1;
    CHECK_REFUSED(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), "handle", NULL);
    da.handle_bytes = info.handle_bytes;
    float y[4 * 8];
    memset(y, 0x7f, sizeof y);
    moex_ep_combine_args ca = {.ep = ep, .handle = handle, .handle_bytes = info.handle_bytes,
                               .yr = moex_tensor_2d(xr, MOEX_DTYPE_F32, 16, 8),
                               .y = moex_tensor_2d(y, MOEX_DTYPE_F32, 4, 8)};
#if EP_HOST_MEMORY   /* ids and handles in device memory are not read by the host */
    ids[2] = (int32_t)(2 * W);   /* an id past E: refused on every rank before any exchange */
    CHECK_REFUSED(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), "ids", NULL);
    ids[2] = 0;
    /* a combine on a handle that holds no dispatch */
    memset(handle, 0, info.handle_bytes);
    CHECK_REFUSED(ctx, moex_ep_combine_forward(ctx, &ca, NULL, 0, NULL), "handle", "dispatch");
    CHECK(((unsigned char *)y)[0] == 0x7f);
#endif
    CHECK(splits[0] == -3 && splits[1] == -3);   /* nothing written by the refused calls */
    CHECK(xr0 == 0x7f && ((unsigned char *)xr)[sizeof xr - 1] == 0x7f);
    /* another context's EP */
    moex_context *other = tu_cpu_context();
    CHECK_REFUSED(other, moex_ep_combine_forward(other, &ca, NULL, 0, NULL), "another moex_context", NULL);
    moex_context_destroy(other);
    free(handle);
    moex_ep_destroy(ep);
}

/* The refusals run_errors does not reach: every configuration check of moex_ep_create, the info
 * query, the dispatch's and its backward's pairings, the FP8 dispatch's H, the EP layer against
 * its context, and (host memory) a combine whose T is not its dispatch's. Each is refused on every
 * rank alike, before any exchange. */
static void run_more_errors(void) {
    moex_ep *ep = NULL;
    const moex_ep_config good = {.comm_kind = EP_COMM_KIND, .comm = EP_COMM, .num_experts = (int32_t)(2 * W),
                                 .topk = 1, .hidden = 8, .dtype = MOEX_DTYPE_F32, .max_tokens = 4,
                                 .max_recv_rows = 16, .transfer = MOEX_EP_TRANSFER_AUTO};
    moex_ep_config cfg = good;
    cfg.comm_kind = (moex_ep_comm_kind)7;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "comm_kind", NULL);
    cfg = good, cfg.hidden = 0;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "hidden", NULL);
    cfg = good, cfg.max_tokens = 0;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "max_tokens", NULL);
    cfg = good, cfg.max_recv_rows = 0;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "max_recv_rows", NULL);
    cfg = good, cfg.dtype = MOEX_DTYPE_I32;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "dtype", NULL);
    cfg = good, cfg.transfer = (moex_ep_transfer)9;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "transfer", NULL);
    cfg = good, cfg.max_tokens = (int64_t)1 << 40;   /* W Tm k past INT32_MAX */
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), "int32", NULL);
    CHECK_REFUSED(ctx, moex_ep_create(NULL, ctx, &good), "out", NULL);
    CHECK_REFUSED(NULL, moex_ep_create(&ep, NULL, &good), "ctx", NULL);
    CHECK(ep == NULL);
    CHECK_REFUSED(NULL, moex_ep_get_info(NULL, NULL), "ep", NULL);

    CHECK_STATUS(ctx, moex_ep_create(&ep, ctx, &good), MOEX_OK);
    if (!ep) return;
    moex_ep_info info;
    CHECK_REFUSED(ctx, moex_ep_get_info(ep, NULL), "info", NULL);
    CHECK_STATUS(ctx, moex_ep_get_info(ep, &info), MOEX_OK);
    const int64_t El = 2;
    float x[4 * 8] = {0}, probs[4] = {0}, xr[16 * 8], xrs[16], dx[4 * 8], y[4 * 8], sentinel = 0;
    int32_t ids[4] = {0};
    int64_t splits[2] = {-3, -3};
    memset(xr, 0x7f, sizeof xr), memset(dx, 0x7f, sizeof dx), memset(y, 0x7f, sizeof y);
    memcpy(&sentinel, xr, sizeof sentinel);
    char *handle = tu_alloc(info.handle_bytes);
    moex_ep_dispatch_args da = {.ep = ep, .x = moex_tensor_2d(x, MOEX_DTYPE_F32, 4, 8),
                                .ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, 4, 1),
                                .probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, 4, 1), .handle = handle,
                                .handle_bytes = info.handle_bytes, .xr = moex_tensor_2d(xr, MOEX_DTYPE_F32, 16, 8),
                                .splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, El),
                                .xr_scales = moex_tensor_2d(xrs, MOEX_DTYPE_F32, 16, 1)};
    CHECK_REFUSED(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), "xr_scales", "x_scales");
    /* an FP8 dispatch needs H a multiple of 16 (this context's H is 8) */
    uint8_t xq[4 * 8] = {0};
    float xs[4] = {1, 1, 1, 1};
    moex_ep_dispatch_args fp8 = da;
    fp8.x = moex_tensor_2d(xq, MOEX_DTYPE_E4M3, 4, 8);
    fp8.x_scales = moex_tensor_2d(xs, MOEX_DTYPE_F32, 4, 1);
    fp8.xr = moex_tensor_2d(xr, MOEX_DTYPE_E4M3, 16, 8);
    CHECK_REFUSED(ctx, moex_ep_dispatch_forward(ctx, &fp8, NULL, 0, NULL), "multiple of 16", NULL);
    CHECK(splits[0] == -3 && splits[1] == -3 && memcmp(xr, &sentinel, sizeof sentinel) == 0);
    /* dprobs_r and dprobs come together */
    float dprobs_r[16] = {0};
    moex_ep_dispatch_grad_args dg = {.ep = ep, .handle = handle, .handle_bytes = info.handle_bytes,
                                     .dxr = moex_tensor_2d(xr, MOEX_DTYPE_F32, 16, 8),
                                     .dprobs_r = moex_tensor_1d(dprobs_r, MOEX_DTYPE_F32, 16),
                                     .dx = moex_tensor_2d(dx, MOEX_DTYPE_F32, 4, 8)};
    CHECK_REFUSED(ctx, moex_ep_dispatch_backward(ctx, &dg, NULL, 0, NULL), "dprobs_r", "dprobs");
    CHECK(((unsigned char *)dx)[0] == 0x7f);
    /* the EP layer against its context: topk 2 where the context's is 1 */
    float rw[64 * 8] = {0}, w1[2 * 4 * 8] = {0}, w2[2 * 8 * 2] = {0};
    moex_ep_moe_layer_args la = {
        .ep = ep,
        .layer = {.x = moex_tensor_2d(x, MOEX_DTYPE_F32, 4, 8),
                  .router_w = moex_tensor_2d(rw, MOEX_DTYPE_F32, 2 * W, 8), .topk = 2,
                  .w1 = moex_weight_packed(moex_tensor_3d(w1, MOEX_DTYPE_F32, El, 4, 8)),
                  .w2 = moex_weight_packed(moex_tensor_3d(w2, MOEX_DTYPE_F32, El, 8, 2)),
                  .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .y = moex_tensor_2d(y, MOEX_DTYPE_F32, 4, 8)}};
    size_t bytes = 0;
    CHECK_REFUSED(ctx, moex_ep_moe_layer_forward_workspace_size(ctx, &la, &bytes), "does not match", NULL);
    la.layer.topk = 1;
    CHECK_STATUS(ctx, moex_ep_moe_layer_forward_workspace_size(ctx, &la, &bytes), MOEX_OK);
#if EP_HOST_MEMORY
    /* a combine of 3 tokens on the handle of a 4-token dispatch (the rows all go to rank 0, which
     * may drop some: that report is cleared) */
    da.xr_scales = (moex_tensor){0};
    CHECK_STATUS(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), MOEX_OK);
    (void)moex_context_check_splits(ctx, NULL);
    moex_ep_combine_args ca = {.ep = ep, .handle = handle, .handle_bytes = info.handle_bytes,
                               .yr = moex_tensor_2d(xr, MOEX_DTYPE_F32, 16, 8),
                               .y = moex_tensor_2d(y, MOEX_DTYPE_F32, 3, 8)};
    CHECK_REFUSED(ctx, moex_ep_combine_forward(ctx, &ca, NULL, 0, NULL), "handle", "4 tokens");
    CHECK(((unsigned char *)y)[0] == 0x7f);
#endif
    free(handle);
    moex_ep_destroy(ep);
}

/* One rank's mistake, over MPI (where the ranks agree before moex_ep_create returns and before
 * each exchange): refused on every rank, the others naming the rank; nothing written; and the
 * calls after it run. (Over NCCL each rank checks only its own arguments.) */
#if EP_HOST_MEMORY
static void run_one_rank_errors(void) {
    if (W < 2) return;
    const int last = W - 1;
    moex_ep *ep = NULL;
    const moex_ep_config good = {.comm_kind = EP_COMM_KIND, .comm = EP_COMM, .num_experts = (int32_t)(2 * W),
                                 .topk = 1, .hidden = 8, .dtype = MOEX_DTYPE_F32, .max_tokens = 4,
                                 .max_recv_rows = 16, .transfer = MOEX_EP_TRANSFER_AUTO};
    /* the last rank's config differs in one field */
    static const char *const field[] = {"num_experts", "topk", "hidden", "dtype", "max_tokens", "max_recv_rows",
                                        "transfer"};
    for (int f = 0; f < (int)(sizeof field / sizeof field[0]); f++) {
        moex_ep_config cfg = good;
        if (me == last) {
            switch (f) {
            case 0: cfg.num_experts = (int32_t)(4 * W); break;
            case 1: cfg.topk = 2; break;
            case 2: cfg.hidden = 16; break;
            case 3: cfg.dtype = MOEX_DTYPE_BF16; break;
            case 4: cfg.max_tokens = 5; break;
            case 5: cfg.max_recv_rows = 17; break;
            default: cfg.transfer = MOEX_EP_TRANSFER_CAPACITY; break;
            }
        }
        CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &cfg), field[f], "different configurations");
        CHECK(ep == NULL);
    }
    /* the last rank refuses its own config: it names the field, the others the rank */
    moex_ep_config bad = good;
    if (me == last) bad.topk = 0;
    CHECK_REFUSED(ctx, moex_ep_create(&ep, ctx, &bad), me == last ? "topk" : "refused its configuration", NULL);
    CHECK(ep == NULL);

    CHECK_STATUS(ctx, moex_ep_create(&ep, ctx, &good), MOEX_OK);
    if (!ep) return;
    moex_ep_info info;
    CHECK_STATUS(ctx, moex_ep_get_info(ep, &info), MOEX_OK);
    const int64_t El = 2;
    float x[4 * 8], probs[4] = {1, 1, 1, 1}, xr[16 * 8], y[4 * 8];
    int32_t ids[4];
    int64_t splits[2];
    for (int i = 0; i < 4 * 8; i++) x[i] = (float)(i % 7);
    for (int t = 0; t < 4; t++) ids[t] = (int32_t)((t + me) % (2 * W));
    char *handle = tu_alloc(info.handle_bytes);
    moex_ep_dispatch_args da = {.ep = ep, .x = moex_tensor_2d(x, MOEX_DTYPE_F32, 4, 8),
                                .ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, 4, 1),
                                .probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, 4, 1), .handle = handle,
                                .handle_bytes = info.handle_bytes, .xr = moex_tensor_2d(xr, MOEX_DTYPE_F32, 16, 8),
                                .splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, El)};
    /* an id past E on the last rank only */
    memset(splits, 0xab, sizeof splits);
    if (me == last) ids[1] = (int32_t)(2 * W);
    CHECK_REFUSED(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), me == last ? "ids" : "rank", NULL);
    CHECK(((unsigned char *)splits)[0] == 0xab);
    ids[1] = (int32_t)((1 + me) % (2 * W));
    CHECK_STATUS(ctx, moex_ep_dispatch_forward(ctx, &da, NULL, 0, NULL), MOEX_OK);
    moex_ep_combine_args ca = {.ep = ep, .handle = handle, .handle_bytes = info.handle_bytes,
                               .yr = moex_tensor_2d(xr, MOEX_DTYPE_F32, 16, 8),
                               .y = moex_tensor_2d(y, MOEX_DTYPE_F32, 4, 8)};
    /* the last rank's handle changed since its dispatch: a count past max_tokens, a count that
     * does not pair with the peer's, no dispatch at all */
    char *hdl = (char *)(((uintptr_t)handle + MOEX_WS_ALIGN - 1) / MOEX_WS_ALIGN * MOEX_WS_ALIGN);   /* its start */
    moex_ep_routing r;
    moex_ep_geom g = ep->geom;
    g.T = 4;
    moex_ep_routing_layout(&g, hdl, &r);
    const int64_t sent = r.send_counts[0];
    char *saved = tu_alloc(info.handle_bytes);
    memcpy(saved, handle, info.handle_bytes);
    for (int v = 0; v < 3; v++) {
        if (me == last) {
            if (v == 0) r.send_counts[0] = g.Tm + 5;
            if (v == 1) r.send_counts[0] = sent > 0 ? sent - 1 : sent + 1;
            if (v == 2) memset(hdl, 0, 8);   /* the header's magic */
        }
        memset(y, 0x7f, sizeof y);
        const char *want = v == 0 ? "outside [0, max_tokens" : v == 1 ? "do not pair" : NULL;
        CHECK_REFUSED(ctx, moex_ep_combine_forward(ctx, &ca, NULL, 0, NULL),
                      want ? want : me == last ? "dispatch" : "refused the call", NULL);
        CHECK(((unsigned char *)y)[0] == 0x7f);
        memcpy(handle, saved, info.handle_bytes);
    }
    /* and the same combine with the handles as dispatched runs on every rank */
    CHECK_STATUS(ctx, moex_ep_combine_forward(ctx, &ca, NULL, 0, NULL), MOEX_OK);
    free(saved);
    free(handle);
    moex_ep_destroy(ep);
}
#else
static void run_one_rank_errors(void) {}
#endif

/* Every case, on ctx (created by the caller after MPI_Init). Returns the exit status. */
static int run_suite(void) {
    const int64_t E = 4 * W;
    const moex_ep_transfer transfers[] = EP_TRANSFERS;
    for (size_t i = 0; i < sizeof transfers / sizeof transfers[0]; i++) {
        ep_transfer = transfers[i];
        run_dispatch_case("random f32", ROUTE_RANDOM, 9, 12, E, 3, 1000, MOEX_DTYPE_F32);
        run_dispatch_case("random bf16", ROUTE_RANDOM, 9, 16, E, 2, 1000, MOEX_DTYPE_BF16);
        run_dispatch_case("random f16 capacity overflow", ROUTE_RANDOM, 9, 8, E, 3, 5, MOEX_DTYPE_F16);
        run_dispatch_case("one expert", ROUTE_ONE_EXPERT, 7, 8, E, 2, 1000, MOEX_DTYPE_F32);
        run_dispatch_case("one expert, overflow", ROUTE_ONE_EXPERT, 7, 8, E, 1, 3, MOEX_DTYPE_BF16);
        run_dispatch_case("all on rank 0", ROUTE_RANK0, 6, 8, E, 2, 1000, MOEX_DTYPE_F32);
        run_dispatch_case("k = E", ROUTE_ALL, 5, 8, E, E, 1000, MOEX_DTYPE_F32);
        run_dispatch_case("odd H f16 (fuzz finding ep-1)", ROUTE_RANDOM, 10, 17, E, 2, 31, MOEX_DTYPE_F16);
        run_fp8_dispatch_case("fp8 random", ROUTE_RANDOM, 9, 144, E, 3, 1000);
        run_fp8_dispatch_case("fp8 overflow", ROUTE_RANDOM, 9, 16, E, 2, 4);
    }
    ep_transfer = MOEX_EP_TRANSFER_AUTO;
    run_layer_case(6, 16, 8, 2 * W, 2, MOEX_DTYPE_F32, 1e-5, MOEX_FP8_OFF, 1e-5);
    run_layer_case(5, 32, 16, 4 * W, 3, MOEX_DTYPE_BF16, 3e-2, MOEX_FP8_OFF, 3e-2);
    run_layer_case(7, 160, 32, 2 * W, 2, MOEX_DTYPE_BF16, 3e-2, MOEX_FP8_BLOCK, 0.2);
    run_layer_drops();
    run_errors();
    run_more_errors();
    run_one_rank_errors();
    /* every rank's verdict: a failure on any rank fails all */
    int failed = tu_failures() > 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm);
    const int rc = tu_finish();
    return rc ? rc : any;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    comm = MPI_COMM_WORLD;
    MPI_Comm_size(comm, &W);
    MPI_Comm_rank(comm, &me);
    ctx = tu_cpu_context();
    const int rc = run_suite();
    moex_context_destroy(ctx);
    MPI_Finalize();
    return rc;
}
