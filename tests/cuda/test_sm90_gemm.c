/*
 * test_sm90_gemm.c - the Hopper grouped GEMMs (src/cuda/sm90_grouped_gemm.h, with the knobs
 * of src/cuda/sm90_tuning.h), forward
 * y = x W_g^T and dgrad dx = dy W_g, against an fp64 host reference, on awkward shapes: group sizes 0, 1, 63, 64, 65, 129;
 * K and N multiples of 8 but not of the 64 / 256 tiles; G = 1 and G = 256; everything in
 * one group; bad splits (negative, sum past T: clamped, flag set); bf16 and f16.
 * Every case poisons the output (all T rows plus guard rows past T) and the x rows past
 * the last group, checks every written element against the reference with a tolerance
 * from the dtype and K, checks that every row past the groups' end is untouched bitwise,
 * and runs twice for bitwise determinism. One case captures the launch in a CUDA graph and
 * replays it after the split values changed. Every forward and dgrad call gets a workspace
 * full of garbage: with a small grid and stream_k = 2 (argv) the last round runs stream-K,
 * and the f32 partials and flags must come out right whatever the workspace held. The weight gradient dW_g = dy_g^T x_g has its
 * own section (run_wgrad_cases: f32 =, input-dtype =, f32 +=; NaN rows past the groups in
 * dy and x; graph replay; determinism). Exits 77 (skipped) where the sm90 kernel
 * cannot run (no GPU, not compute capability 9.0).
 *   test_sm90_gemm [epilogue_tma (1)] [cluster (0)] [tile_rows (0)] [band_rows (0)] [band (0)]
 *                  [grid (0)] [stream_k (0)]
 *   (the forward and dgrad variant: moex_sm90_tuning; 0 = default)
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/core/moex_half.h"
#include "../../src/cuda/sm90_tuning.h"
#include "moex.h"

#define GUARD_ROWS 136
#define POISON_Y 0xFFFFu

static int g_failures;
static moex_sm90_context *g_ctx; /* the device state every launch reads */
static moex_sm90_tuning g_tune;   /* the forward and dgrad variant under test (argv) */
static void *g_ws;                /* the forward's and dgrad's workspace */
static size_t g_ws_bytes;
static int g_grid_used;           /* of the last call */
static long g_sk_pieces;          /* stream-K partials handed over, over all cases */

#define CK(call)                                                                             \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float rng_uniform(void) { return (float)((rng_next() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static uint16_t to_half(moex_dtype dt, float v) { return dt == MOEX_DTYPE_BF16 ? moex_f32_to_bf16(v) : moex_f32_to_f16(v); }
static double from_half(moex_dtype dt, uint16_t h) {
    return dt == MOEX_DTYPE_BF16 ? (double)moex_bf16_to_f32(h) : (double)moex_f16_to_f32(h);
}

typedef struct tcase {
    const char *name;
    moex_dtype dt;
    int64_t G, T, K, N;
    int64_t *splits;            /* [G], host */
    int dgrad;                  /* 0: y = x W_g^T (x [T,K], y [T,N]); 1: y = x W_g (x [T,N], y [T,K]) */
} tcase;

static int64_t in_w(const tcase *c) { return c->dgrad ? c->N : c->K; }   /* row length of x */
static int64_t out_w(const tcase *c) { return c->dgrad ? c->K : c->N; }  /* row length of y */

/* Clamped offsets exactly as the contract defines them; returns whether the splits are bad. */
static int offsets(const tcase *c, int64_t *off) {
    int bad = 0;
    int64_t sum = 0;
    off[0] = 0;
    for (int64_t g = 0; g < c->G; g++) {
        int64_t s = c->splits[g];
        bad |= s < 0;
        sum += s < 0 ? 0 : s;
        int64_t e = off[g] + (s < 0 ? 0 : s);
        off[g + 1] = e < c->T ? e : c->T;
    }
    return bad || sum > c->T;
}

typedef struct dev_bufs {
    void *x, *w, *y;
    int64_t *splits;
    int *flag;
} dev_bufs;

/* Checks y (host copy, T + GUARD_ROWS rows) against the fp64 reference; prints one line. */
static void check_output(const tcase *c, const char *what, const uint16_t *hx, const uint16_t *hw,
                         const uint16_t *hy, const int64_t *off) {
    const double rel = c->dt == MOEX_DTYPE_BF16 ? 1.0 / 256.0 : 1.0 / 1024.0;
    double err2 = 0, ref2 = 0, worst = 0;
    int64_t bad_elems = 0, touched = 0;
    for (int64_t g = 0; g < c->G; g++) {
        const uint16_t *wg = hw + g * c->N * c->K;
        const int64_t iw = in_w(c), ow = out_w(c);
        for (int64_t r = off[g]; r < off[g + 1]; r++) {
            for (int64_t n = 0; n < ow; n++) {
                double acc = 0, mag = 0;
                for (int64_t k = 0; k < iw; k++) {
                    /* forward: W_g[n][k]; dgrad: output column n is W's column, k its row */
                    uint16_t wv = c->dgrad ? wg[k * c->K + n] : wg[n * c->K + k];
                    double p = from_half(c->dt, hx[r * iw + k]) * from_half(c->dt, wv);
                    acc += p;
                    mag += fabs(p);
                }
                double out = from_half(c->dt, hy[r * ow + n]);
                double tol = rel * fabs(acc) + 1e-5 * mag + 1e-30;
                double e = fabs(out - acc);
                if (!(e <= tol)) bad_elems++;   /* NaN (unwritten poison) fails too */
                if (e / tol > worst || e != e) worst = e != e ? INFINITY : e / tol;
                err2 += e * e;
                ref2 += acc * acc;
            }
        }
    }
    for (int64_t r = off[c->G]; r < c->T + GUARD_ROWS; r++)
        for (int64_t n = 0; n < out_w(c); n++) touched += hy[r * out_w(c) + n] != POISON_Y;
    double relerr = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    int ok = bad_elems == 0 && touched == 0;
    if (!ok) g_failures++;
    printf("%-4s %-5s %-28s %-4s G=%-4lld T=%-5lld K=%-5lld N=%-5lld rows=%-5lld relerr=%.2e worst/tol=%.3f "
           "bad=%lld touched_past_end=%lld\n",
           ok ? "ok" : "FAIL", c->dgrad ? "dgrad" : "fwd", c->name, what, (long long)c->G, (long long)c->T, (long long)c->K,
           (long long)c->N, (long long)off[c->G], relerr, worst, (long long)bad_elems, (long long)touched);
}

static moex_status sm90_call(const tcase *c, const moex_sm90_gemm_args *a, moex_stream s, const char **why) {
    moex_sm90_tuning t = g_tune;
    moex_status st = c->dgrad ? moex_sm90_grouped_gemm_dgrad_tuned(g_ctx, a, &t, s, why)
                              : moex_sm90_grouped_gemm_fwd_tuned(g_ctx, a, NULL, &t, s, why);
    g_grid_used = t.grid_used;
    return st;
}

/* 256 small groups of 0..20 rows (every 7th empty) and, for a graph replay, other values
 * (0..8 rows, every 5th empty); returns the sum of the first. */
static int64_t small_groups(int64_t *many, int64_t *many_graph) {
    int64_t total = 0;
    for (int g = 0; g < 256; g++) {
        many[g] = (g % 7 == 3) ? 0 : (int64_t)(rng_next() % 21);
        many_graph[g] = (g % 5 == 1) ? 0 : (int64_t)(rng_next() % 9);
        total += many[g];
    }
    return total;
}

static void poison_y(const tcase *c, dev_bufs *d) {
    CK(cudaMemset(d->y, 0xFF, (size_t)(c->T + GUARD_ROWS) * out_w(c) * 2));
}

static moex_sm90_gemm_args make_args(const tcase *c, dev_bufs *d) {
    moex_sm90_gemm_args a;
    memset(&a, 0, sizeof a);
    a.dtype = c->dt;
    a.G = c->G;
    a.T = c->T;
    a.K = c->K;
    a.N = c->N;
    a.x = d->x;
    a.w = d->w;
    a.y = d->y;
    a.splits = d->splits;
    a.bad_flag = d->flag;
    a.bad_value = 0x35;
    a.workspace = g_ws;
    return a;
}

static void run_discrete(const tcase *c, dev_bufs *d, const uint16_t *hw, const uint16_t *hy_packed,
                         const int64_t *off, int bad_splits, int kept);

/* Runs one case: eager twice (determinism), the same with discrete weights, and, when
 * `graph_splits` is given, a graph captured with c->splits and replayed with graph_splits. */
static void run_case(tcase *c, int64_t *graph_splits) {
    const size_t xe = (size_t)c->T * in_w(c), we = (size_t)c->G * c->N * c->K,
                 ye = (size_t)(c->T + GUARD_ROWS) * out_w(c);
    uint16_t *hx = malloc(xe * 2), *hw = malloc(we * 2), *hy = malloc(ye * 2), *hy2 = malloc(ye * 2);
    int64_t *off = malloc((size_t)(c->G + 1) * 8);
    int bad = offsets(c, off);
    const uint16_t nan = c->dt == MOEX_DTYPE_BF16 ? 0x7FC0u : 0x7E00u;
    for (size_t i = 0; i < xe; i++) hx[i] = (int64_t)(i / (size_t)in_w(c)) < off[c->G] ? to_half(c->dt, rng_uniform()) : nan;
    for (size_t i = 0; i < we; i++) hw[i] = to_half(c->dt, rng_uniform());

    dev_bufs d;
    CK(cudaMalloc(&d.x, xe * 2 + 16));
    CK(cudaMalloc(&d.w, we * 2));
    CK(cudaMalloc(&d.y, ye * 2));
    CK(cudaMalloc((void **)&d.splits, (size_t)c->G * 8));
    CK(cudaMalloc((void **)&d.flag, sizeof(int)));
    CK(cudaMemcpy(d.x, hx, xe * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.w, hw, we * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.splits, c->splits, (size_t)c->G * 8, cudaMemcpyHostToDevice));
    CK(cudaMemset(d.flag, 0, sizeof(int)));
    CK(cudaMemset(g_ws, 0x5A, g_ws_bytes));   /* garbage: flags nonzero, partials huge */
    poison_y(c, &d);

    moex_sm90_gemm_args a = make_args(c, &d);
    const char *why = NULL;
    moex_status st = sm90_call(c, &a, NULL, &why);
    CK(cudaDeviceSynchronize());
    if (st != MOEX_OK) {
        printf("FAIL %s%s: status %d (%s)\n", c->name, c->dgrad ? " (dgrad)" : "", (int)st, why ? why : "");
        g_failures++;
        goto done;
    }
    CK(cudaMemcpy(hy, d.y, ye * 2, cudaMemcpyDeviceToHost));
    check_output(c, "run1", hx, hw, hy, off);
    if (g_tune.stream_k == 2) {
        /* forced: the flags (the workspace's first 2 ints per CTA) were cleared before the
         * launch and are 1 where a partial was handed over */
        int flags[2 * 1024];
        const int n = 2 * g_grid_used < 2 * 1024 ? 2 * g_grid_used : 2 * 1024;
        CK(cudaMemcpy(flags, g_ws, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost));
        int pieces = 0, odd = 0;
        for (int i = 0; i < n; i++) {
            pieces += flags[i] == 1;
            odd += flags[i] != 0 && flags[i] != 1;
        }
        g_sk_pieces += pieces;
        if (odd) {
            printf("FAIL %s: %d stream-K flags neither 0 nor 1 after the run\n", c->name, odd);
            g_failures++;
        }
        if (pieces) printf("     stream-K: %d partials over %d CTAs\n", pieces, g_grid_used);
    }

    int flag = 0;
    CK(cudaMemcpy(&flag, d.flag, sizeof(int), cudaMemcpyDeviceToHost));
    if (flag != (bad ? 0x35 : 0)) {
        printf("FAIL %s: bad-splits flag %d, expected %d\n", c->name, flag, bad ? 0x35 : 0);
        g_failures++;
    }
    run_discrete(c, &d, hw, hy, off, bad, 0);
    run_discrete(c, &d, hw, hy, off, bad, 1);

    poison_y(c, &d);
    st = sm90_call(c, &a, NULL, &why);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy2, d.y, ye * 2, cudaMemcpyDeviceToHost));
    if (st != MOEX_OK || memcmp(hy, hy2, ye * 2) != 0) {
        printf("FAIL %s: second run differs bitwise (status %d)\n", c->name, (int)st);
        g_failures++;
    }

    if (graph_splits != NULL) {
        cudaStream_t s;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        st = sm90_call(c, &a, (moex_stream)s, &why);
        CK(cudaStreamEndCapture(s, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        if (st != MOEX_OK) {
            printf("FAIL %s: capture status %d (%s)\n", c->name, (int)st, why ? why : "");
            g_failures++;
        } else {
            /* new split values (and rows for them) after the capture */
            memcpy(c->splits, graph_splits, (size_t)c->G * 8);
            offsets(c, off);
            for (size_t i = 0; i < xe; i++)
                hx[i] = (int64_t)(i / (size_t)in_w(c)) < off[c->G] ? to_half(c->dt, rng_uniform()) : nan;
            CK(cudaMemcpy(d.x, hx, xe * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d.splits, c->splits, (size_t)c->G * 8, cudaMemcpyHostToDevice));
            poison_y(c, &d);
            /* The memset and copies above run on the legacy stream, which a non-blocking
             * stream does not wait for: finish them before the replay. */
            CK(cudaDeviceSynchronize());
            CK(cudaGraphLaunch(exec, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(hy, d.y, ye * 2, cudaMemcpyDeviceToHost));
            check_output(c, "grph", hx, hw, hy, off);
        }
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        CK(cudaStreamDestroy(s));
    }
done:
    CK(cudaFree(d.x));
    CK(cudaFree(d.w));
    CK(cudaFree(d.y));
    CK(cudaFree(d.splits));
    CK(cudaFree(d.flag));
    free(hx);
    free(hw);
    free(hy);
    free(hy2);
    free(off);
}

/* ---- discrete weights --------------------------------------------------------------------
 * The same case with the weights as G separate allocations behind a device pointer array
 * (w_ptrs, w_maps): the same kernel and plan, so y must equal the packed run's hy bitwise.
 * Then the pointers are switched to a second set holding -W (same maps scratch: a stale
 * tensor map cached by the TMA unit would read W again): y must be -hy. A graph captured
 * with the -W pointers and replayed after they were switched back must give hy again. Last,
 * one matrix 2 bytes off 16-byte alignment: the launch must not fault, and must set the flag
 * to bad_align_value. kept: the same with the caller's kept maps (w_maps_kept), written by
 * moex_sm90_kept_maps_write after each change of the pointers (the graph captures the write
 * with the GEMM). */
static void run_discrete(const tcase *c, dev_bufs *d, const uint16_t *hw, const uint16_t *hy_packed,
                         const int64_t *off, int bad_splits, int kept) {
    const int64_t G = c->G, per = c->N * c->K;
    const size_t ye = (size_t)(c->T + GUARD_ROWS) * out_w(c);
    const size_t kept_bytes = moex_sm90_kept_maps_bytes(g_ctx, c->dt, G, c->N, c->K);
    if (kept && kept_bytes == 0) {
        printf("FAIL %s: no kept maps for this weight\n", c->name);
        g_failures++;
        return;
    }
    uint16_t *hneg = malloc((size_t)per * 2), *hy = malloc(ye * 2);
    void **pos = malloc((size_t)G * sizeof(void *)), **neg = malloc((size_t)G * sizeof(void *));
    for (int64_t g = 0; g < G; g++) {
        for (int64_t i = 0; i < per; i++) hneg[i] = hw[g * per + i] ^ 0x8000u;
        CK(cudaMalloc(&pos[g], (size_t)per * 2));
        CK(cudaMalloc(&neg[g], (size_t)per * 2));
        CK(cudaMemcpy(pos[g], hw + g * per, (size_t)per * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(neg[g], hneg, (size_t)per * 2, cudaMemcpyHostToDevice));
    }
    void **dptrs, *maps, *skew;
    CK(cudaMalloc((void **)&dptrs, (size_t)G * sizeof(void *)));
    CK(cudaMalloc(&maps, kept ? kept_bytes : moex_sm90_weight_maps_bytes(G)));
    CK(cudaMalloc(&skew, (size_t)per * 2 + 16));
    moex_sm90_gemm_args a = make_args(c, d);
    a.w = NULL;
    a.w_ptrs = (void *const *)dptrs;
    a.w_maps = kept ? NULL : maps;
    a.w_maps_kept = kept ? maps : NULL;
    a.bad_align_value = 0x47;
    const int want_flag = bad_splits ? 0x35 : 0;
    void *const last = pos[G - 1];   /* the misaligned step below swaps it out */
    int fails = 0, flag = 0;
    const char *why = NULL;
    const char *step = "";
    /* the kept maps from dptrs on stream s (kept only) */
#define KEPT_WRITE(s)                                                                            \
    (kept ? moex_sm90_kept_maps_write(g_ctx, c->dt, G, c->N, c->K, (void *const *)dptrs, maps, d->flag, 0x47, \
                                      (s), &why)                                                 \
          : MOEX_OK)
    /* y from the pointers in p (host array copied to dptrs); 0 when it ran */
#define DISCRETE_RUN(p, what)                                                                    \
    do {                                                                                         \
        step = what;                                                                             \
        CK(cudaMemcpy(dptrs, (p), (size_t)G * sizeof(void *), cudaMemcpyHostToDevice));         \
        poison_y(c, d);                                                                          \
        CK(cudaMemset(d->flag, 0, sizeof(int)));                                                 \
        if (KEPT_WRITE(NULL) != MOEX_OK || sm90_call(c, &a, NULL, &why) != MOEX_OK) goto fail;   \
        CK(cudaDeviceSynchronize());                                                             \
        CK(cudaMemcpy(hy, d->y, ye * 2, cudaMemcpyDeviceToHost));                                \
        CK(cudaMemcpy(&flag, d->flag, sizeof(int), cudaMemcpyDeviceToHost));                     \
    } while (0)
    DISCRETE_RUN(pos, "W");
    if (memcmp(hy, hy_packed, ye * 2) != 0 || flag != want_flag) goto fail;
    DISCRETE_RUN(neg, "-W");
    for (int64_t r = 0; r < c->T + GUARD_ROWS; r++)
        for (int64_t n = 0; n < out_w(c); n++) {
            const size_t i = (size_t)r * out_w(c) + n;
            if (r < off[c->G] ? from_half(c->dt, hy[i]) != -from_half(c->dt, hy_packed[i]) : hy[i] != POISON_Y)
                goto fail;
        }
    {   /* captured with -W's pointers in dptrs, replayed after W's were copied there */
        step = "graph";
        cudaStream_t s;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        moex_status st = KEPT_WRITE((moex_stream)s);
        if (st == MOEX_OK) st = sm90_call(c, &a, (moex_stream)s, &why);
        CK(cudaStreamEndCapture(s, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaMemcpy(dptrs, pos, (size_t)G * sizeof(void *), cudaMemcpyHostToDevice));
        poison_y(c, d);
        CK(cudaDeviceSynchronize());
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(hy, d->y, ye * 2, cudaMemcpyDeviceToHost));
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        CK(cudaStreamDestroy(s));
        if (st != MOEX_OK || memcmp(hy, hy_packed, ye * 2) != 0) goto fail;
    }
    {   /* the last matrix 2 bytes off alignment: no fault, the flag set */
        pos[G - 1] = (char *)skew + 2;
        DISCRETE_RUN(pos, "misaligned");
        pos[G - 1] = last;
        if (flag != 0x47) goto fail;   /* the maps are written before the GEMM checks the splits */
    }
    goto done;
fail:
    fails = 1;
done:
#undef DISCRETE_RUN
#undef KEPT_WRITE
    printf("%-4s %-5s %-28s %s G=%-4lld (bitwise as packed, -W, graph, misaligned)%s%s flag=%d %s\n",
           fails ? "FAIL" : "ok", c->dgrad ? "dgrad" : "fwd", c->name, kept ? "kept" : "disc", (long long)G,
           fails ? " at " : "",
           fails ? step : "", flag, why && fails ? why : "");
    g_failures += fails;
    CK(cudaDeviceSynchronize());
    pos[G - 1] = last;   /* (a failed misaligned step left the skewed pointer there) */
    for (int64_t g = 0; g < G; g++) {
        CK(cudaFree(pos[g]));
        CK(cudaFree(neg[g]));
    }
    CK(cudaFree(dptrs));
    CK(cudaFree(maps));
    CK(cudaFree(skew));
    free(pos);
    free(neg);
    free(hneg);
    free(hy);
}

static int g_dgrad;   /* run() makes forward cases when 0, dgrad cases when 1 */

static void run(const char *name, moex_dtype dt, int64_t G, int64_t T, int64_t K, int64_t N, const int64_t *splits,
                const int64_t *graph_splits) {
    tcase c = {.name = name, .dt = dt, .G = G, .T = T, .K = K, .N = N, .splits = malloc((size_t)G * 8),
               .dgrad = g_dgrad};
    memcpy(c.splits, splits, (size_t)G * 8);
    int64_t *gs = NULL;
    if (graph_splits) {
        gs = malloc((size_t)G * 8);
        memcpy(gs, graph_splits, (size_t)G * 8);
    }
    run_case(&c, gs);
    free(c.splits);
    free(gs);
}

/* ---- the weight gradient dW_g = dy_g^T x_g ---------------------------------------------
 * Output modes: f32 "=", input-dtype "=" (both poisoned with NaN bytes first, so every
 * element must be written; empty groups must come out exactly 0) and f32 "+=" into a random
 * main grad (empty groups must stay bitwise unchanged). dy and x rows past the groups' end
 * are NaN: a row that leaked into any sum would make it NaN. A guard past dW must stay
 * untouched. Tolerance: the output rounding (2^-24 f32, 2^-8 bf16, 2^-10 f16) times |ref|
 * (plus 2^-24 for f16 subnormals), plus (1e-5 + rows_g 2^-23) times sum |products| (f32
 * sums of rows_g exact products), plus 2^-24 |main grad| for "+=".
 * Every case runs every kernel variant (w_variants: the untuned default, the register
 * epilogue, the TMA epilogue, 2-CTA clusters, small grids so that each CTA walks many tiles
 * and reuses its output staging, narrow bands of the tile order); the variants accumulate
 * in the same order, so their outputs must also agree bitwise with the first variant's.
 * This section ignores argv. */

#define WGUARD_BYTES 4096

enum { WMODE_F32 = 0, WMODE_HALF = 1, WMODE_F32_ACC = 2 };
static const char *wmode_name[3] = {"f32=", "half=", "f32+="};

typedef struct wvariant {
    const char *name;
    int tuned;                  /* 0: moex_sm90_grouped_gemm_wgrad (the defaults) */
    moex_sm90_tuning t;
} wvariant;
static const wvariant w_variants[] = {
    {.name = "default", .t = {.grid = 0}},
    {.name = "regs", .tuned = 1, .t = {.epilogue_tma = 0, .cluster = 1}},
    {.name = "tma-grid2", .tuned = 1, .t = {.grid = 2, .epilogue_tma = 1, .cluster = 1}},
    {.name = "tma-band3", .tuned = 1, .t = {.band = 3, .epilogue_tma = 1, .cluster = 1}},
    {.name = "tma-clu2-band5", .tuned = 1, .t = {.band = 5, .epilogue_tma = 1, .cluster = 2}},
    {.name = "tma-clu2", .tuned = 1, .t = {.epilogue_tma = 1, .cluster = 2}},
    {.name = "tma-clu2-grid4", .tuned = 1, .t = {.grid = 4, .epilogue_tma = 1, .cluster = 2}},
    {.name = "regs-clu2-grid2", .tuned = 1, .t = {.grid = 2, .epilogue_tma = 0, .cluster = 2}},
};
#define W_NVARIANTS ((int)(sizeof w_variants / sizeof w_variants[0]))

static int w_checks;            /* checks made (one per case, mode, variant, eager or graph) */
static int w_nfail;             /* wgrad failures; the first few are repeated at the end */
static char w_fail_msg[4][240];

static void w_fail(const char *msg) {
    printf("FAIL wgrad %s\n", msg);
    if (w_nfail < 4) snprintf(w_fail_msg[w_nfail], sizeof w_fail_msg[0], "%s", msg);
    w_nfail++;
    g_failures++;
}
#define W_FAIL(...)                                  \
    do {                                             \
        char m_[240];                                \
        snprintf(m_, sizeof m_, __VA_ARGS__);        \
        w_fail(m_);                                  \
    } while (0)

typedef struct wbufs {
    void *dy, *x, *dw;
    int64_t *splits;
} wbufs;

static void w_offsets(int64_t G, int64_t T, const int64_t *splits, int64_t *off) {
    off[0] = 0;
    for (int64_t g = 0; g < G; g++) {
        int64_t s = splits[g] < 0 ? 0 : splits[g];
        off[g + 1] = s > T - off[g] ? T : off[g] + s;
    }
}

/* Random rows below off[G], NaN rows from there to T (dy [T, N] and x [T, K]). */
static void w_fill(moex_dtype dt, int64_t T, int64_t K, int64_t N, int64_t end, uint16_t *hdy, uint16_t *hx) {
    const uint16_t nan = dt == MOEX_DTYPE_BF16 ? 0x7FC0u : 0x7E00u;
    for (int64_t r = 0; r < T; r++) {
        for (int64_t n = 0; n < N; n++) hdy[r * N + n] = r < end ? to_half(dt, rng_uniform()) : nan;
        for (int64_t k = 0; k < K; k++) hx[r * K + k] = r < end ? to_half(dt, rng_uniform()) : nan;
    }
}

/* fp64 reference sums ref[g][n][k] and sum of |products| mag[g][n][k]. */
static void w_reference(moex_dtype dt, int64_t G, int64_t K, int64_t N, const int64_t *off, const uint16_t *hdy,
                        const uint16_t *hx, double *ref, double *mag) {
    memset(ref, 0, (size_t)(G * N * K) * sizeof(double));
    memset(mag, 0, (size_t)(G * N * K) * sizeof(double));
    double *xr = malloc((size_t)(K > 0 ? K : 1) * sizeof(double));
    for (int64_t g = 0; g < G; g++)
        for (int64_t r = off[g]; r < off[g + 1]; r++) {
            for (int64_t k = 0; k < K; k++) xr[k] = from_half(dt, hx[r * K + k]);
            for (int64_t n = 0; n < N; n++) {
                const double d = from_half(dt, hdy[r * N + n]);
                double *rg = ref + (g * N + n) * K, *mg = mag + (g * N + n) * K;
                for (int64_t k = 0; k < K; k++) {
                    rg[k] += d * xr[k];
                    mg[k] += fabs(d * xr[k]);
                }
            }
        }
    free(xr);
}

static double w_out(moex_dtype dt, int mode, const void *h, int64_t i) {
    return mode == WMODE_HALF ? from_half(dt, ((const uint16_t *)h)[i]) : (double)((const float *)h)[i];
}

/* One case's shape, data and reference. */
typedef struct wcase {
    const char *name;
    moex_dtype dt;
    int mode;
    int64_t G, T, K, N;
    const int64_t *off;         /* [G + 1] */
    const void *hinit;          /* dW before the call (NaN bytes for "=", a main grad for "+=") */
    const double *ref, *mag;
} wcase;

/* Checks a host copy of dW (plus guard) against init (+= mode) and the reference; returns
 * worst err/tol (INFINITY for NaN), reports a failure naming the variant. */
static double w_check(const wcase *c, const char *variant, const char *what, const void *hout) {
    const int64_t G = c->G, N = c->N, K = c->K;
    const size_t es = c->mode == WMODE_HALF ? 2 : 4, we = (size_t)(G * N * K);
    const double out_rel = c->mode == WMODE_HALF ? (c->dt == MOEX_DTYPE_BF16 ? 1.0 / 256.0 : 1.0 / 1024.0) : 0x1p-24;
    const double out_abs = c->mode == WMODE_HALF && c->dt == MOEX_DTYPE_F16 ? 0x1p-24 : 0.0;   /* f16 subnormals */
    double worst = 0;
    int64_t bad = 0, empty_changed = 0, guard_touched = 0;
    for (int64_t g = 0; g < G; g++) {
        const int64_t rows = c->off[g + 1] - c->off[g];
        for (int64_t e = g * N * K; e < (g + 1) * N * K; e++) {
            if (c->mode == WMODE_F32_ACC && rows == 0) {
                empty_changed += memcmp((const char *)hout + e * 4, (const char *)c->hinit + e * 4, 4) != 0;
                continue;
            }
            const double init = c->mode == WMODE_F32_ACC ? (double)((const float *)c->hinit)[e] : 0.0;
            const double want = init + c->ref[e];
            const double tol = out_rel * fabs(want) + out_abs + (1e-5 + (double)rows * 0x1p-23) * c->mag[e] +
                               0x1p-24 * fabs(init) + 1e-30;
            const double got = w_out(c->dt, c->mode, hout, e), err = fabs(got - want);
            if (!(err <= tol)) bad++;   /* NaN (poison or a leaked row) fails too */
            if (err != err || err / tol > worst) worst = err != err ? INFINITY : err / tol;
        }
    }
    for (size_t i = we * es; i < we * es + WGUARD_BYTES; i++) guard_touched += ((const uint8_t *)hout)[i] != 0xFFu;
    w_checks++;
    if (bad != 0 || empty_changed != 0 || guard_touched != 0)
        W_FAIL("%s %s %s [%s] %s G=%lld K=%lld N=%lld: bad=%lld empty_changed=%lld guard_touched=%lld worst/tol=%.3g",
               c->dt == MOEX_DTYPE_BF16 ? "bf16" : "f16", wmode_name[c->mode], c->name, variant, what,
               (long long)G, (long long)K, (long long)N, (long long)bad, (long long)empty_changed,
               (long long)guard_touched, worst);
    return worst;
}

static moex_sm90_wgrad_args w_args(moex_dtype dt, int mode, int64_t G, int64_t T, int64_t K, int64_t N,
                                   const wbufs *d) {
    moex_sm90_wgrad_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dt;
    a.G = G;
    a.T = T;
    a.K = K;
    a.N = N;
    a.dy = d->dy;
    a.x = d->x;
    a.dw = d->dw;
    a.dw_dtype = mode == WMODE_HALF ? dt : MOEX_DTYPE_F32;
    a.accumulate = mode == WMODE_F32_ACC;
    a.splits = d->splits;
    return a;
}

/* Launches variant v; for a tuned variant also checks grid_used (0 when T == 0, else at
 * least one cluster, a whole number of clusters, at most the grid asked for). */
static moex_status w_call(const wcase *c, const wvariant *v, const moex_sm90_wgrad_args *a, moex_stream s,
                          const char **why) {
    if (!v->tuned) return moex_sm90_grouped_gemm_wgrad(g_ctx, a, s, why);
    moex_sm90_tuning t = v->t;
    t.grid_used = -1;
    const moex_status st = moex_sm90_grouped_gemm_wgrad_tuned(g_ctx, a, &t, s, why);
    const int cm = t.cluster == 2 ? 2 : 1;
    const int ok = a->T == 0 ? t.grid_used == 0
                             : t.grid_used >= cm && t.grid_used % cm == 0 && (t.grid <= 0 || t.grid_used <= t.grid);
    if (st == MOEX_OK && !ok)
        W_FAIL("%s %s [%s]: grid_used %d (grid %d, cluster %d)", wmode_name[c->mode], c->name, v->name, t.grid_used,
               t.grid, t.cluster);
    return st;
}

/* One shape in every output mode and every variant: eager twice (bitwise determinism), the
 * same bits as variant 0, then, when graph_splits is given, a graph captured with `splits`
 * and replayed with graph_splits (new dy, x). One summary line per mode. */
static void run_wcase(const char *name, moex_dtype dt, int64_t G, int64_t T, int64_t K, int64_t N,
                      const int64_t *splits, const int64_t *graph_splits) {
    const size_t we = (size_t)(G * N * K), ob = we * 4 + WGUARD_BYTES;
    uint16_t *hdy = malloc((size_t)(T * N) * 2 + 16), *hx = malloc((size_t)(T * K) * 2 + 16);
    uint8_t *hinit = malloc(ob), *hout = malloc(ob), *hout2 = malloc(ob), *hbase = malloc(ob), *gbase = malloc(ob);
    double *ref = malloc(we * sizeof(double) + 8), *mag = malloc(we * sizeof(double) + 8);
    double *gref = malloc(we * sizeof(double) + 8), *gmag = malloc(we * sizeof(double) + 8);
    int64_t *off = malloc((size_t)(G + 1) * 8), *goff = malloc((size_t)(G + 1) * 8);
    uint16_t *gdy = malloc((size_t)(T * N) * 2 + 16), *gx = malloc((size_t)(T * K) * 2 + 16);

    w_offsets(G, T, splits, off);
    w_fill(dt, T, K, N, off[G], hdy, hx);
    w_reference(dt, G, K, N, off, hdy, hx, ref, mag);
    if (graph_splits != NULL) {
        w_offsets(G, T, graph_splits, goff);
        w_fill(dt, T, K, N, goff[G], gdy, gx);
        w_reference(dt, G, K, N, goff, gdy, gx, gref, gmag);
    }

    wbufs d;
    CK(cudaMalloc(&d.dy, (size_t)(T * N) * 2 + 16));
    CK(cudaMalloc(&d.x, (size_t)(T * K) * 2 + 16));
    CK(cudaMalloc(&d.dw, ob));
    CK(cudaMalloc((void **)&d.splits, (size_t)G * 8));

    for (int mode = 0; mode < 3; mode++) {
        const size_t es = mode == WMODE_HALF ? 2 : 4, bytes = we * es + WGUARD_BYTES;
        memset(hinit, 0xFF, bytes);
        if (mode == WMODE_F32_ACC)
            for (size_t i = 0; i < we; i++) ((float *)hinit)[i] = rng_uniform();
        const wcase c = {.name = name, .dt = dt, .mode = mode, .G = G, .T = T, .K = K, .N = N, .off = off,
                         .hinit = hinit, .ref = ref, .mag = mag};
        const wcase gc = {.name = name, .dt = dt, .mode = mode, .G = G, .T = T, .K = K, .N = N, .off = goff,
                          .hinit = hinit, .ref = gref, .mag = gmag};
        const moex_sm90_wgrad_args a = w_args(dt, mode, G, T, K, N, &d);
        const int fails0 = w_nfail;
        double worst = 0, gworst = 0;

        for (int v = 0; v < W_NVARIANTS; v++) {
            const wvariant *var = &w_variants[v];
            CK(cudaMemcpy(d.dy, hdy, (size_t)(T * N) * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d.x, hx, (size_t)(T * K) * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d.splits, splits, (size_t)G * 8, cudaMemcpyHostToDevice));
            const char *why = NULL;
            moex_status st = MOEX_OK;
            for (int run = 0; run < 2 && st == MOEX_OK; run++) {
                CK(cudaMemcpy(d.dw, hinit, bytes, cudaMemcpyHostToDevice));
                st = w_call(&c, var, &a, NULL, &why);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(run == 0 ? hout : hout2, d.dw, bytes, cudaMemcpyDeviceToHost));
            }
            if (st != MOEX_OK) {
                W_FAIL("%s %s [%s]: status %d (%s)", wmode_name[mode], name, var->name, (int)st, why ? why : "");
                continue;
            }
            const double w = w_check(&c, var->name, "eager", hout);
            worst = w > worst ? w : worst;
            if (memcmp(hout, hout2, bytes) != 0)
                W_FAIL("%s %s [%s]: second run differs bitwise", wmode_name[mode], name, var->name);
            if (v == 0)
                memcpy(hbase, hout, bytes);
            else if (memcmp(hout, hbase, bytes) != 0)
                W_FAIL("%s %s [%s]: differs bitwise from [%s]", wmode_name[mode], name, var->name, w_variants[0].name);

            if (graph_splits != NULL) {
                cudaStream_t s;
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
                st = w_call(&c, var, &a, (moex_stream)s, &why);
                CK(cudaStreamEndCapture(s, &graph));
                CK(cudaGraphInstantiate(&exec, graph, 0));
                if (st != MOEX_OK) {
                    W_FAIL("%s %s [%s]: capture status %d (%s)", wmode_name[mode], name, var->name, (int)st,
                           why ? why : "");
                } else {
                    /* new split values and rows after the capture; the copies run on the legacy
                     * stream, which the non-blocking stream does not wait for: finish them first */
                    CK(cudaMemcpy(d.dy, gdy, (size_t)(T * N) * 2, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(d.x, gx, (size_t)(T * K) * 2, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(d.splits, graph_splits, (size_t)G * 8, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(d.dw, hinit, bytes, cudaMemcpyHostToDevice));
                    CK(cudaDeviceSynchronize());
                    CK(cudaGraphLaunch(exec, s));
                    CK(cudaStreamSynchronize(s));
                    CK(cudaMemcpy(hout, d.dw, bytes, cudaMemcpyDeviceToHost));
                    const double gw = w_check(&gc, var->name, "graph", hout);
                    gworst = gw > gworst ? gw : gworst;
                    if (v == 0)
                        memcpy(gbase, hout, bytes);
                    else if (memcmp(hout, gbase, bytes) != 0)
                        W_FAIL("%s %s [%s]: graph replay differs bitwise from [%s]", wmode_name[mode], name,
                               var->name, w_variants[0].name);
                }
                CK(cudaGraphExecDestroy(exec));
                CK(cudaGraphDestroy(graph));
                CK(cudaStreamDestroy(s));
            }
        }
        printf("%-4s wgrad %-4s %-5s %-24s G=%-4lld T=%-5lld K=%-5lld N=%-5lld rows=%-5lld %d variants worst/tol=%.3f",
               w_nfail == fails0 ? "ok" : "FAIL", dt == MOEX_DTYPE_BF16 ? "bf16" : "f16", wmode_name[mode], name,
               (long long)G, (long long)T, (long long)K, (long long)N, (long long)off[G], W_NVARIANTS, worst);
        if (graph_splits != NULL) printf(" graph worst/tol=%.3f", gworst);
        printf("\n");
    }
    CK(cudaFree(d.dy));
    CK(cudaFree(d.x));
    CK(cudaFree(d.dw));
    CK(cudaFree(d.splits));
    free(hdy);
    free(hx);
    free(hinit);
    free(hout);
    free(hout2);
    free(hbase);
    free(gbase);
    free(ref);
    free(mag);
    free(gref);
    free(gmag);
    free(off);
    free(goff);
    free(gdy);
    free(gx);
}

static void run_wgrad_cases(void) {
    const int64_t awk[6] = {0, 1, 63, 64, 65, 129};
    const int64_t awk_graph[6] = {129, 0, 0, 200, 1, 63};
    run_wcase("awkward groups", MOEX_DTYPE_BF16, 6, 400, 136, 264, awk, awk_graph);
    run_wcase("awkward groups", MOEX_DTYPE_F16, 6, 400, 136, 264, awk, NULL);

    /* N, K multiples of 8 but not of the tile, with several full (TMA) blocks and edges */
    run_wcase("interior + edge tiles", MOEX_DTYPE_BF16, 6, 400, 520, 392, awk, awk_graph);
    run_wcase("interior + edge tiles", MOEX_DTYPE_F16, 6, 400, 520, 392, awk, NULL);
    /* every tile inside [N, K] */
    const int64_t inner[4] = {130, 0, 64, 1}, inner_graph[4] = {0, 195, 0, 5};
    run_wcase("all tiles interior", MOEX_DTYPE_BF16, 4, 200, 512, 256, inner, inner_graph);
    /* N = 320: the last N tile has one full consumer block and one past N; K = 264 */
    const int64_t mixed[3] = {70, 129, 0};
    run_wcase("half-inside N tile", MOEX_DTYPE_F16, 3, 230, 264, 320, mixed, NULL);

    /* ten N tiles: bands of 3 N tiles (or 2 pairs) end with a narrower one */
    const int64_t wide[3] = {100, 0, 170};
    run_wcase("ten N tiles", MOEX_DTYPE_BF16, 3, 300, 520, 1160, wide, NULL);

    const int64_t one[1] = {300};
    run_wcase("G=1 tail at T", MOEX_DTYPE_BF16, 1, 300, 64, 256, one, NULL);
    const int64_t short1[1] = {40};
    run_wcase("G=1 under one k-step", MOEX_DTYPE_BF16, 1, 100, 200, 136, short1, NULL);

    int64_t many[256], many_graph[256];
    const int64_t total = small_groups(many, many_graph);
    run_wcase("G=256 small groups", MOEX_DTYPE_BF16, 256, total + 50, 72, 24, many, many_graph);
    run_wcase("G=256 small groups", MOEX_DTYPE_F16, 256, total + 50, 72, 24, many, NULL);
    int64_t total64 = 0;
    for (int g = 0; g < 64; g++) total64 += many[g];
    run_wcase("G=64 full tiles", MOEX_DTYPE_BF16, 64, total64 + 50, 256, 128, many, NULL);

    const int64_t lump[8] = {0, 0, 0, 0, 0, 777, 0, 0};
    run_wcase("all rows in one group", MOEX_DTYPE_BF16, 8, 800, 200, 392, lump, NULL);

    const int64_t deep[3] = {1000, 0, 517};
    run_wcase("many row stages", MOEX_DTYPE_BF16, 3, 1600, 520, 264, deep, NULL);
    run_wcase("many row stages", MOEX_DTYPE_F16, 3, 1600, 520, 264, deep, NULL);

    const int64_t tiny[2] = {5, 3};
    run_wcase("K=N=8", MOEX_DTYPE_BF16, 2, 8, 8, 8, tiny, NULL);

    const int64_t neg[3] = {100, -5, 300};
    run_wcase("bad splits (neg, sum>T)", MOEX_DTYPE_BF16, 3, 350, 96, 136, neg, NULL);

    const int64_t none[3] = {0, 0, 0};
    run_wcase("no rows (T=0)", MOEX_DTYPE_BF16, 3, 0, 16, 24, none, NULL);

    printf("wgrad: %d checks over %d variants, %d failure(s)\n", w_checks, W_NVARIANTS, w_nfail);
    for (int i = 0; i < w_nfail && i < 4; i++) printf("  wgrad failure %d: %s\n", i + 1, w_fail_msg[i]);
}

int main(int argc, char **argv) {
    int dev = 0, n = 0;
    g_tune.epilogue_tma = argc > 1 ? atoi(argv[1]) : 1;
    g_tune.cluster = argc > 2 ? atoi(argv[2]) : 0;
    g_tune.tile_rows = argc > 3 ? atoi(argv[3]) : 0;
    g_tune.band_rows = argc > 4 ? atoi(argv[4]) : 0;
    g_tune.band = argc > 5 ? atoi(argv[5]) : 0;
    g_tune.grid = argc > 6 ? atoi(argv[6]) : 0;
    g_tune.stream_k = argc > 7 ? atoi(argv[7]) : 0;
    printf("variant: epilogue_tma=%d cluster=%d tile_rows=%d band_rows=%d band=%d grid=%d stream_k=%d\n",
           g_tune.epilogue_tma, g_tune.cluster, g_tune.tile_rows, g_tune.band_rows, g_tune.band, g_tune.grid,
           g_tune.stream_k);
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    CK(cudaSetDevice(dev));
    const char *why = "";
    const moex_status cst = moex_sm90_context_create(dev, &g_ctx, &why);
    if (cst == MOEX_ERR_UNSUPPORTED) {
        printf("device is not sm_90 or the sm_90a kernel is not in this build (%s): skipped\n", why);
        return 77;
    }
    if (cst != MOEX_OK) {
        printf("FAIL: moex_sm90_context_create: status %d (%s)\n", (int)cst, why);
        return 1;
    }
    {
        /* aligned fake pointers: the forward, the dgrad and the wgrad accept the shapes */
        int64_t *ds;
        CK(cudaMalloc((void **)&ds, 64));
        moex_sm90_gemm_args p;
        memset(&p, 0, sizeof p);
        p.dtype = MOEX_DTYPE_BF16;
        p.G = 1;
        p.T = 8;
        p.K = 8;
        p.N = 8;
        p.x = p.w = p.y = ds;
        p.splits = ds;
        moex_sm90_wgrad_args wp;
        memset(&wp, 0, sizeof wp);
        wp.dtype = MOEX_DTYPE_BF16;
        wp.G = 1;
        wp.T = 8;
        wp.K = 8;
        wp.N = 8;
        wp.dy = wp.x = wp.dw = ds;
        wp.dw_dtype = MOEX_DTYPE_F32;
        wp.splits = ds;
        if (!moex_sm90_supported(g_ctx, &p) || !moex_sm90_wgrad_supported(g_ctx, &wp)) {
            printf("FAIL: the forward or the wgrad refuses a plain shape\n");
            g_failures++;
        }
        CK(cudaFree(ds));
    }
    /* the most any launch uses: stream-K is forced (argv) on shapes the heuristic leaves whole */
    g_ws_bytes = moex_sm90_gemm_workspace_bytes(g_ctx, NULL, NULL);
    if (g_ws_bytes == 0) {
        printf("FAIL: moex_sm90_gemm_workspace_bytes is 0\n");
        return 1;
    }
    CK(cudaMalloc(&g_ws, g_ws_bytes));

    for (g_dgrad = 0; g_dgrad < 2; g_dgrad++) {
        const int64_t awk[6] = {0, 1, 63, 64, 65, 129};
        const int64_t awk_graph[6] = {129, 0, 0, 200, 1, 63};
        run("awkward groups", MOEX_DTYPE_BF16, 6, 400, 136, 264, awk, awk_graph);
        run("awkward groups", MOEX_DTYPE_F16, 6, 400, 136, 264, awk, NULL);

        const int64_t one[1] = {300};
        run("G=1 tails", MOEX_DTYPE_BF16, 1, 300, 64, 256, one, NULL);
        const int64_t one_exact[1] = {256};
        run("G=1 exact tiles", MOEX_DTYPE_BF16, 1, 256, 128, 512, one_exact, NULL);

        int64_t many[256], many_graph[256];
        const int64_t total = small_groups(many, many_graph);
        run("G=256 small groups", MOEX_DTYPE_BF16, 256, total + 50, 72, 24, many, many_graph);
        /* one k step per tile: with discrete weights, the most group changes per load */
        run("G=256 small groups, one k step", MOEX_DTYPE_BF16, 256, total + 50, 40, 24, many, NULL);

        const int64_t lump[8] = {0, 0, 0, 0, 0, 777, 0, 0};
        run("all rows in one group", MOEX_DTYPE_BF16, 8, 800, 200, 392, lump, NULL);

        const int64_t deep[3] = {513, 0, 300};
        run("deep K", MOEX_DTYPE_BF16, 3, 900, 2056, 520, deep, NULL);
        run("deep K", MOEX_DTYPE_F16, 3, 900, 2056, 520, deep, NULL);

        const int64_t wide[2] = {130, 70};
        run("many column tiles", MOEX_DTYPE_BF16, 2, 200, 64, 2056, wide, NULL);
        /* 9 row tiles by 6 column tiles: with small bands and blocks (argv), narrower last
         * bands, lower last blocks and, with clusters, a column pair */
        const int64_t big[2] = {1100, 300};
        run("row blocks", MOEX_DTYPE_BF16, 2, 1400, 64, 1288, big, NULL);

        /* enough tiles and k steps that a small grid (argv) cuts the last round along k, with
         * tails in rows, columns and k; replayed from a graph with other split values */
        const int64_t cut[5] = {300, 0, 129, 64, 450}, cut_graph[5] = {0, 700, 1, 65, 200};
        run("k-split last round", MOEX_DTYPE_BF16, 5, 1000, 520, 776, cut, cut_graph);

        const int64_t tiny[2] = {5, 3};
        run("K=N=8", MOEX_DTYPE_BF16, 2, 8, 8, 8, tiny, NULL);

        const int64_t neg[3] = {100, -5, 300};
        run("bad splits (neg, sum>T)", MOEX_DTYPE_BF16, 3, 350, 96, 136, neg, NULL);
    }

    /* a small grid leaves a last round on most cases above: forced, stream-K must have run */
    if (g_tune.grid > 0 && g_tune.stream_k == 2 && g_sk_pieces == 0) {
        printf("FAIL: stream_k = 2, a grid of %d and a workspace, but stream-K never ran\n", g_tune.grid);
        g_failures++;
    }
    printf("stream-K partials over all forward and dgrad cases: %ld\n", g_sk_pieces);

    run_wgrad_cases();

    moex_sm90_context_destroy(g_ctx);
    printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
    return g_failures ? 1 : 0;
}
