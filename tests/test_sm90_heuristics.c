/*
 * test_sm90_heuristics.c - the Hopper grouped GEMMs' launch plan (src/cuda/sm90_heuristics.h),
 * a pure function of the shapes, checked without a GPU (and without nvcc: it builds in
 * CPU-only configurations, compiled with src/cuda/sm90_heuristics.c directly).
 *
 * On the device facts of an H200 (132 SMs, 66 resident 2-CTA clusters) it checks the
 * documented rules (docs/hopper.md, "Variants and the heuristic") on every CUDA and STUDY
 * configuration of tools/bench_configs.h, for the forward (plain, bias, GLU), the dgrad and
 * the wgrad: tile rows (64 exactly when T < 128 G), clusters (every 128-row forward and
 * dgrad), the grid (the resident CTAs, at most one unit each, whole clusters), the tile
 * order's bands, and stream-K (only the plain or bias forward, with a workspace, where groups
 * of T / G rows leave a last round saving >= 40 k steps per cluster); its workspace is
 * nonzero exactly where stream-K runs. A table pins the expected plan of the benchmark
 * shapes by name (among the six, stream-K only on dsv3-fc1's forward); then edge cases:
 * tiny shapes, T just under and at 128 G, the knobs (tile rows, cluster, grid down to one
 * cluster, bands, stream-K forced and off, the register epilogue, L2 promotion) and the
 * workspace sizes.
 */
#include <stdio.h>
#include <string.h>

#include "../src/cuda/sm90_heuristics.h"
#include "../tools/bench_configs.h"
#include "test_util.h"

static const moex_sm90_device H200 = {.sms = 132, .rows_cluster_slots = 66, .wgrad_cluster_slots = 66,
                                      .fp8_cluster_slots = 66};

static moex_sm90_plan plan(moex_sm90_product product, int epi, int64_t G, int64_t T, int64_t K, int64_t N,
                           bool workspace, const moex_sm90_tuning *tune) {
    const moex_sm90_shape s = {.product = product, .epi = epi, .G = G, .T = T, .K = K, .N = N,
                               .workspace = workspace};
    moex_sm90_plan p;
    memset(&p, 0x5A, sizeof p);   /* every field must be written */
    moex_sm90_plan_make(&H200, &s, tune, &p);
    return p;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The rules of sm90_heuristics.h, written out again for the forward and the dgrad. */
static void check_rows_rules(const char *name, moex_sm90_product product, int epi, int64_t G, int64_t T, int64_t K,
                             int64_t N) {
    for (int ws = 0; ws < 2; ws++) {
        const moex_sm90_plan p = plan(product, epi, G, T, K, N, ws, NULL);
        const bool dgrad = product == MOEX_SM90_DGRAD, glu = epi >= MOEX_SM90_EPI_GLU_CONTIG;
        const int bm = T < 128 * G ? 64 : 128, cm = bm == 128 ? 2 : 1;
        const int64_t red = dgrad ? N : K, out_w = dgrad ? K : N;
        const int64_t nt = glu ? cdiv(N / 2, 128) : cdiv(out_w, 256);
        const int64_t max_units = (cdiv(cdiv(T, bm), cm) + G) * nt;
        const int64_t slots = cm == 2 ? H200.rows_cluster_slots : H200.sms;
        const int64_t grid = (max_units < slots ? max_units : slots) * cm;
        const int64_t mt = cdiv(T / G, bm);
        const int64_t U = G * (cm == 1 ? mt * nt : (mt / 2) * nt + (mt % 2) * ((nt + 1) / 2));
        const int64_t P = grid / cm, r = U % P, nk = cdiv(red, 64);
        const bool sk = ws && !dgrad && !glu && r != 0 && U > P && (P - r) * nk >= 40 * P;
        CHECK_MSG(p.tile_rows == bm && p.cluster == cm && p.epilogue_tma == 1, "%s: tile rows %d cluster %d", name,
                  p.tile_rows, p.cluster);
        CHECK_MSG(p.grid == grid && p.grid % p.cluster == 0, "%s: grid %d, want %lld", name, p.grid, (long long)grid);
        CHECK_MSG(p.band == MOEX_SM90_BAND && p.band_rows == MOEX_SM90_BAND_ROWS / (bm * cm), "%s: band %d x %d", name,
                  p.band, p.band_rows);
        CHECK_MSG(p.stream_k == sk && p.sk_min == MOEX_SM90_SK_MIN_STEPS, "%s (workspace %d): stream-K %d, want %d",
                  name, ws, (int)p.stream_k, (int)sk);
        CHECK_MSG(p.l2_promotion == 256, "%s: L2 promotion %d", name, p.l2_promotion);
        const size_t bytes = moex_sm90_plan_workspace_bytes(&H200, &p);
        CHECK_MSG(sk ? bytes > 0 && bytes <= moex_sm90_workspace_bytes_max(&H200) : bytes == 0,
                  "%s: workspace %zu bytes with stream-K %d", name, bytes, (int)sk);
    }
}

static void check_wgrad_rules(const char *name, int64_t G, int64_t T, int64_t K, int64_t N) {
    const moex_sm90_plan p = plan(MOEX_SM90_WGRAD, MOEX_SM90_EPI_PLAIN, G, T, K, N, false, NULL);
    const int64_t units = G * cdiv(N, 128) * cdiv(K, 256);
    CHECK_MSG(p.cluster == 1 && p.epilogue_tma == 1 && !p.stream_k, "%s wgrad: cluster %d", name, p.cluster);
    CHECK_MSG(p.grid == (units < H200.sms ? units : H200.sms), "%s wgrad: grid %d", name, p.grid);
    CHECK_MSG(p.band == MOEX_SM90_WGRAD_BAND, "%s wgrad: band %d", name, p.band);
}

/* The plans of the benchmark shapes, by name: tile rows, the plain forward's grid and
 * whether its last round runs stream-K (with a workspace; also with a bias), the wgrad's
 * grid. */
typedef struct expect {
    const char *name;
    int tile_rows, fwd_grid, fwd_stream_k, wgrad_grid;
} expect;
static const expect EXPECTED[] = {
    {.name = "dsv3-fc1", .tile_rows = 128, .fwd_grid = 132, .fwd_stream_k = 1, .wgrad_grid = 132},
    {.name = "dsv3-fc2", .tile_rows = 128, .fwd_grid = 132, .fwd_stream_k = 0, .wgrad_grid = 132},
    {.name = "qwen3-30b-fc1", .tile_rows = 128, .fwd_grid = 132, .fwd_stream_k = 0, .wgrad_grid = 132},
    {.name = "qwen3-30b-fc2", .tile_rows = 128, .fwd_grid = 132, .fwd_stream_k = 0, .wgrad_grid = 132},
    {.name = "mixtral-fc1", .tile_rows = 128, .fwd_grid = 132, .fwd_stream_k = 0, .wgrad_grid = 132},
    {.name = "gptoss-fc1", .tile_rows = 128, .fwd_grid = 132, .fwd_stream_k = 0, .wgrad_grid = 132},
    {.name = "qwen3-fc1-t8k", .tile_rows = 64, .fwd_grid = 132, .fwd_stream_k = 0, .wgrad_grid = 132},
    {.name = "g256-fc1-t8k", .tile_rows = 64, .fwd_grid = 132, .fwd_stream_k = 0, .wgrad_grid = 132},
};
#define N_EXPECTED (sizeof EXPECTED / sizeof EXPECTED[0])

typedef struct config {
    const char *name;
    int64_t G, T, K, N;
    int gpu;   /* CUDA or STUDY */
} config;
#define CPU 0
#define CUDA 1
#define STUDY 1
#define AS_CONFIG(name_, G_, T_, K_, N_, H, F, splits, set, what) \
    {.name = name_, .G = G_, .T = T_, .K = K_, .N = N_, .gpu = set},
static const config CONFIGS[] = {MOEX_BENCH_CONFIGS(AS_CONFIG)};
#undef CPU
#undef CUDA
#undef STUDY

static void benchmark_shapes(void) {
    int found = 0, sk_fwd = 0;
    for (size_t i = 0; i < sizeof CONFIGS / sizeof CONFIGS[0]; i++) {
        const config *c = &CONFIGS[i];
        if (!c->gpu) continue;
        char what[96];
        static const struct {
            moex_sm90_product product;
            int epi;
            const char *name;
        } kinds[] = {{MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, "fwd"},
                     {MOEX_SM90_FORWARD, MOEX_SM90_EPI_BIAS, "fwd+bias"},
                     {MOEX_SM90_FORWARD, MOEX_SM90_EPI_GLU_CONTIG, "fc1+glu"},
                     {MOEX_SM90_FORWARD, MOEX_SM90_EPI_GLU_INTERLEAVED, "fc1+glu32"},
                     {MOEX_SM90_DGRAD, MOEX_SM90_EPI_PLAIN, "dgrad"}};
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            snprintf(what, sizeof what, "%s %s", c->name, kinds[k].name);
            check_rows_rules(what, kinds[k].product, kinds[k].epi, c->G, c->T, c->K, c->N);
        }
        check_wgrad_rules(c->name, c->G, c->T, c->K, c->N);
        const moex_sm90_plan f = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, c->G, c->T, c->K, c->N, true, NULL);
        const moex_sm90_plan b = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_BIAS, c->G, c->T, c->K, c->N, true, NULL);
        const moex_sm90_plan d = plan(MOEX_SM90_DGRAD, MOEX_SM90_EPI_PLAIN, c->G, c->T, c->K, c->N, true, NULL);
        const moex_sm90_plan w = plan(MOEX_SM90_WGRAD, MOEX_SM90_EPI_PLAIN, c->G, c->T, c->K, c->N, false, NULL);
        sk_fwd += f.stream_k;
        CHECK_MSG(!d.stream_k, "%s: the dgrad never runs stream-K by default", c->name);
        for (size_t e = 0; e < N_EXPECTED; e++) {
            if (strcmp(EXPECTED[e].name, c->name) != 0) continue;
            const expect *x = &EXPECTED[e];
            found++;
            CHECK_MSG(f.tile_rows == x->tile_rows && f.grid == x->fwd_grid && f.stream_k == (bool)x->fwd_stream_k &&
                          b.stream_k == (bool)x->fwd_stream_k && w.grid == x->wgrad_grid,
                      "%s: tile rows %d grid %d stream-K %d (bias %d) wgrad grid %d", c->name, f.tile_rows, f.grid,
                      (int)f.stream_k, (int)b.stream_k, w.grid);
            printf("%-14s G=%-4lld T=%-6lld K=%-5lld N=%-6lld tile rows %3d, cluster %d, grid %3d, stream-K %s, "
                   "workspace %zu bytes\n",
                   c->name, (long long)c->G, (long long)c->T, (long long)c->K, (long long)c->N, f.tile_rows,
                   f.cluster, f.grid, f.stream_k ? "yes" : "no ", moex_sm90_plan_workspace_bytes(&H200, &f));
        }
    }
    CHECK_MSG(found == (int)N_EXPECTED, "%d of the %d named benchmark shapes are in tools/bench_configs.h", found,
              (int)N_EXPECTED);
    CHECK_MSG(sk_fwd == 1, "stream-K on %d benchmark forwards, want 1 (dsv3-fc1)", sk_fwd);
}

static void edge_cases(void) {
    /* tile rows: 64 exactly when T < 128 G */
    CHECK(moex_sm90_tile_rows(128 * 7 - 1, 7, 64, 64) == 64 && moex_sm90_tile_rows(128 * 7, 7, 64, 64) == 128);
    check_rows_rules("T = 128 G - 1", MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, 7, 128 * 7 - 1, 512, 512);
    check_rows_rules("T = 128 G", MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, 7, 128 * 7, 512, 512);
    /* tiny: fewer units than SMs (one partial row tile and one group: 2 units) */
    moex_sm90_plan p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, 1, 1, 8, 8, true, NULL);
    CHECK_MSG(p.tile_rows == 64 && p.cluster == 1 && p.grid == 2 && !p.stream_k, "T = 1: rows %d cluster %d grid %d",
              p.tile_rows, p.cluster, p.grid);
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, 1, 256, 8, 8, true, NULL);
    CHECK_MSG(p.cluster == 2 && p.grid == 4, "T = 256, G = 1: cluster %d grid %d", p.cluster, p.grid);
    p = plan(MOEX_SM90_WGRAD, MOEX_SM90_EPI_PLAIN, 1, 5, 8, 8, false, NULL);
    CHECK_MSG(p.grid == 1, "wgrad of one tile: grid %d", p.grid);
    /* G up to 2^31 - 1 and T near 2^31: no overflow in the unit counts */
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, 2147483647, 2147483000, 1073741824, 1073741824, true, NULL);
    CHECK_MSG(p.grid == 132 && p.tile_rows == 64, "huge: grid %d", p.grid);
    p = plan(MOEX_SM90_WGRAD, MOEX_SM90_EPI_PLAIN, 2147483647, 2147483000, 1073741824, 1073741824, false, NULL);
    CHECK_MSG(p.grid == 132, "huge wgrad: grid %d", p.grid);

    /* the knobs: dsv3-fc1's forward */
    const int64_t G = 8, T = 32768, K = 7168, N = 4096;
    moex_sm90_tuning t;
    memset(&t, 0, sizeof t);
    t.epilogue_tma = 1;
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    const moex_sm90_plan d = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, NULL);
    CHECK_MSG(memcmp(&p, &d, sizeof p) == 0, "an all-default tune plans as no tune");
    t.tile_rows = 64;
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(p.tile_rows == 64 && p.cluster == 1 && p.band_rows == 32, "tile_rows 64: cluster %d band rows %d",
              p.cluster, p.band_rows);
    t.tile_rows = 0;
    t.cluster = 1;
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(p.cluster == 1 && p.grid == 132 && p.band_rows == 16, "cluster 1: grid %d", p.grid);
    t.cluster = 0;
    t.epilogue_tma = 0;
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(p.cluster == 1 && p.epilogue_tma == 0, "register epilogue: cluster %d", p.cluster);
    t.epilogue_tma = 1;
    t.grid = 5;   /* 2 clusters */
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(p.grid == 4, "grid 5 with clusters: %d", p.grid);
    t.grid = 1;   /* at least one cluster */
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(p.grid == 2, "grid 1 with clusters: %d", p.grid);
    t.grid = 0;
    t.band = 3;
    t.band_rows = 100;
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(p.band == 3 && p.band_rows == 1, "band 3, band_rows 100: %d x %d", p.band, p.band_rows);
    t.band = t.band_rows = 0;
    t.stream_k = 1;
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(!p.stream_k && moex_sm90_plan_workspace_bytes(&H200, &p) == 0, "stream_k 1 turns it off");
    t.stream_k = 2;   /* forced: the dgrad, the GLU and a shape without a long last round */
    p = plan(MOEX_SM90_DGRAD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t);
    CHECK_MSG(p.stream_k && p.sk_min == 0, "stream_k 2: dgrad %d", (int)p.stream_k);
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_GLU_CONTIG, G, T, K, N, true, &t);
    CHECK_MSG(p.stream_k, "stream_k 2: GLU");
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, 8, 32768, 2048, 7168, false, &t);
    CHECK_MSG(!p.stream_k, "stream_k 2 without a workspace");
    t.stream_k = 0;
    t.l2_promotion = 1;
    CHECK(plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t).l2_promotion == 0);
    t.l2_promotion = 128;
    CHECK(plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, &t).l2_promotion == 128);
    t.l2_promotion = 0;
    /* the wgrad's knobs: clusters (units of two N tiles), bands in N units */
    t.cluster = 2;
    t.band = 16;
    p = plan(MOEX_SM90_WGRAD, MOEX_SM90_EPI_PLAIN, G, T, K, N, false, &t);
    CHECK_MSG(p.cluster == 2 && p.grid == 132 && p.band == 8, "wgrad cluster 2: grid %d band %d", p.grid, p.band);
    t.grid = 3;
    p = plan(MOEX_SM90_WGRAD, MOEX_SM90_EPI_PLAIN, G, T, K, N, false, &t);
    CHECK_MSG(p.grid == 2, "wgrad grid 3 with clusters: %d", p.grid);

    /* the workspace: flags rounded to 256 bytes, then 2 slots of 64 KB per CTA */
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, true, NULL);
    CHECK_MSG(p.stream_k && moex_sm90_plan_workspace_bytes(&H200, &p) == 1280 + (size_t)2 * 132 * 65536 &&
                  moex_sm90_workspace_bytes_max(&H200) == 1280 + (size_t)2 * 132 * 65536,
              "dsv3-fc1 workspace %zu", moex_sm90_plan_workspace_bytes(&H200, &p));
    p = plan(MOEX_SM90_FORWARD, MOEX_SM90_EPI_PLAIN, G, T, K, N, false, NULL);
    CHECK_MSG(!p.stream_k, "no workspace, no stream-K");
    const moex_sm90_device none = {0};
    CHECK(moex_sm90_workspace_bytes_max(&none) == 0);
    /* the last-round test itself */
    CHECK(!moex_sm90_sk_worth(66, 66, 100, 40) && !moex_sm90_sk_worth(132, 66, 100, 40));
    CHECK(!moex_sm90_sk_worth(10, 66, 100, 0) && moex_sm90_sk_worth(67, 66, 100, 40));
    CHECK(moex_sm90_sk_worth(2048, 66, 112, 40) && !moex_sm90_sk_worth(3584, 66, 32, 40));
}

int main(void) {
    benchmark_shapes();
    edge_cases();
    return tu_finish();
}
