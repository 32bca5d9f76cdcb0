/*
 * cmd_bench.c - `moex bench`: times grouped linear forward, backward data, backward weight
 * and the grouped MLP forward+backward on named configurations, median of N runs, and
 * reports GFLOP/s. On the CPU it also times one OpenBLAS cblas_sgemm of the same total
 * size (M = T, the same K and N: the dense GEMM the grouped forward is split from) and the
 * ratio grouped / dense. CUDA timings use CUDA events on the legacy default stream
 * (cli_mem.c), so this file needs no CUDA header.
 *
 * FLOP counts (S = sum(splits) rows): linear forward, backward data and backward weight
 * 2 S K N each; grouped MLP forward 6 S H F (FC1 2F x H, FC2 H x F), backward twice that,
 * forward+backward 18 S H F.
 *
 * --ops other times the remaining operations (scaled GLU, router, permute, unpermute, the
 * MoE layer; forward and backward each) on the config's T, H, F with E = G and k = 2 or 8,
 * and reports effective GB/s: the bytes an op must read and write at least once (--help
 * gives the formulas) over its time.
 *
 * The configurations are the CPU and CUDA sets of bench_configs.h; those of the CUDA set
 * (marked [cuda] in --help: sized for a GPU) run on the CUDA backend only. Before
 * allocating anything the command sums the memory of its largest configuration
 * (bench_need: the buffers, the workspace from the library's queries, host temporaries)
 * and refuses a run that needs more than is available or than --max-memory allows.
 */
#include "bench_configs.h"
#include "cli_util.h"

#include <math.h>
#include <stdlib.h>

#ifdef MOEX_HAVE_OPENBLAS
#include <cblas.h>
#endif

#define CMD "bench"

typedef enum splits_kind { SPLITS_BALANCED = 0, SPLITS_SKEWED = 1 } splits_kind;
static const char *const splits_words[] = {"balanced", "skewed", NULL};

/* A named problem: the grouped linear (G, T, K, N) and the grouped MLP of the same model
 * (H, F) whose FC1 or FC2 is that linear. */
typedef struct bench_config {
    const char *name;
    int64_t G, T, K, N, H, F;
    splits_kind splits;
    int cuda;           /* 1: sized for a GPU (the CUDA set), not run by "all" on the CPU */
    const char *what;
} bench_config;

/* The CPU and CUDA rows of bench_configs.h, in its order; its STUDY rows are not ours. */
#define BENCH_ROW(name, G, T, K, N, H, F, splits, set, what) BENCH_ROW_##set(name, G, T, K, N, H, F, splits, what)
#define BENCH_ROW_CPU(name, G, T, K, N, H, F, splits, what) {name, G, T, K, N, H, F, SPLITS_##splits, 0, what},
#define BENCH_ROW_CUDA(name, G, T, K, N, H, F, splits, what) {name, G, T, K, N, H, F, SPLITS_##splits, 1, what},
#define BENCH_ROW_STUDY(name, G, T, K, N, H, F, splits, what)
static const bench_config configs[] = {MOEX_BENCH_CONFIGS(BENCH_ROW)};
#undef BENCH_ROW
#undef BENCH_ROW_CPU
#undef BENCH_ROW_CUDA
#undef BENCH_ROW_STUDY
#define NUM_CONFIGS ((int)(sizeof configs / sizeof configs[0]))

static const char *const backend_words[] = {"cpu", "cuda", NULL};
static const char *const dtype_words[] = {"default", "f32", "bf16", NULL};

static const char *const ops_words[] = {"gemm", "other", "all", NULL};
enum { OPS_GEMM = 0, OPS_OTHER = 1, OPS_ALL = 2 };

typedef struct bench_opts {
    int backend, dtype, splits, json, ops;
    int64_t iters, threads, seed, max_memory;
    const char *config;
} bench_opts;

static void usage(FILE *out) {
    fprintf(out,
            "usage: moex bench --backend cpu|cuda [options]\n"
            "\n"
            "Times grouped linear forward, backward data, backward weight and the grouped MLP\n"
            "forward, alone and with its backward (SwiGLU times probs, no biases), median of N\n"
            "runs, in GFLOP/s. On the CPU also times one OpenBLAS cblas_sgemm of the same total\n"
            "size (M=T, K, N) and prints the ratio grouped forward / sgemm.\n"
            "\n"
            "options:\n"
            "  --backend B      cpu | cuda (required)\n"
            "  --config NAME    a configuration below, or 'all' (default: small on the CPU,\n"
            "                   all [cuda] ones on cuda)\n"
            "  --dtype D        f32 | bf16 (default: f32 on the CPU, bf16 on cuda)\n"
            "  --splits S       balanced | skewed: override the configuration's splits\n"
            "  --iters N        timed runs per operation, after one warm-up (default 5 on the\n"
            "                   CPU, 20 on cuda)\n"
            "  --threads N      CPU threads of the library (default: MOEX_NUM_THREADS or all)\n"
            "  --seed S         seed of the data and the skewed splits, 0..2^53 (default 1)\n"
            "  --ops O          gemm | other | all (default gemm): 'other' times, instead of the\n"
            "                   GEMMs, the scaled GLU (SwiGLU x probs, contiguous, T rows), the router\n"
            "                   (softmax, top-k, renormalised; f32 logits [T,E]), permute and unpermute\n"
            "                   (T tokens, T*k rows) and the whole MoE layer, each forward and backward,\n"
            "                   with E = G experts and k = 2 (G <= 8) or 8, in ms and effective GB/s\n"
            "  --max-memory BYTES  the most memory the run may take, host and (cuda) device\n"
            "                   memory each; BYTES is an integer with an optional K, M, G or T\n"
            "                   suffix (KiB...TiB), e.g. 512M or 8G (default: the memory available\n"
            "                   now: MemAvailable of /proc/meminfo, the GPU's free memory). A run\n"
            "                   whose largest configuration needs more is refused before anything\n"
            "                   is allocated\n"
            "  --json           print one JSON object instead of the table\n"
            "  -h, --help       this help\n"
            "\n"
            "Effective GB/s of --ops other = bytes each op must read and write at least once / time,\n"
            "with S = sum(splits), e = bytes per activation element, f32 probs and i32 ids/row maps:\n"
            "  glu_fwd       S (3F e + 4)         h, probs in; z out\n"
            "  glu_bwd       S (5F e + 12)        h, dz, probs in; dh out; dprobs read and written\n"
            "  router_fwd    T (4E + 8k)          logits in; probs, ids out\n"
            "  router_bwd    T (8E + 8k)          logits, ids, dprobs in; dlogits out\n"
            "  permute_fwd   T H e (1+k) + 16Tk + 8E   x, ids, probs in; xp, probs_p, row_map, splits out\n"
            "  permute_bwd   T H e (1+k) + 12Tk   row_map, dxp, dprobs_p in; dx, dprobs out\n"
            "  unpermute_*   T H e (1+k) + 4Tk    row_map and the T*k rows in, the T rows out (or back)\n"
            "  moe_fwd       e (2TH + EH + 3EFH)  x, router_w, w1, w2 in; y out\n"
            "  moe_bwd       e (3TH + 2EH + 6EFH) x, dy and the weights in; dx and the weight grads out\n"
            "and GFLOP/s of the MoE layer: forward 2TEH + 6TkHF, backward twice that.\n"
            "\n"
            "configurations (G groups, T rows, K in, N out; MLP: H hidden, F ffn; [cuda]: sized for\n"
            "a GPU, --backend cuda only):\n");
    for (int i = 0; i < NUM_CONFIGS; i++) {
        const bench_config *c = &configs[i];
        fprintf(out, "  %-14s G=%-3lld T=%-5lld K=%-5lld N=%-5lld H=%-5lld F=%-5lld %s%s\n", c->name,
                (long long)c->G, (long long)c->T, (long long)c->K, (long long)c->N, (long long)c->H,
                (long long)c->F, c->what, c->cuda ? " [cuda]" : "");
    }
}

/* ---- data --------------------------------------------------------------------------- */

/* splits[G] summing to T. Skewed: Dirichlet(0.5) shares (a Gamma(0.5) draw is N(0,1)^2 / 2)
 * with one random group forced empty, rounded by cumulative sums so the total is exact. */
static int make_splits(splits_kind kind, int64_t G, int64_t T, cli_rng *r, int64_t *splits) {
    if (kind == SPLITS_BALANCED) {
        for (int64_t g = 0; g < G; g++) splits[g] = T / G + (g < T % G ? 1 : 0);
        return 0;
    }
    double *share = malloc((size_t)G * sizeof(double)), total = 0.0;
    if (!share) {
        fprintf(stderr, "moex bench: out of host memory\n");
        return -1;
    }
    int64_t empty = G > 1 ? cli_rng_below(r, G) : -1;
    for (int64_t g = 0; g < G; g++) {
        double n = cli_rng_normal(r);
        share[g] = g == empty ? 0.0 : n * n + 1e-12;
        total += share[g];
    }
    double cum = 0.0;
    int64_t prev = 0;
    for (int64_t g = 0; g < G; g++) {
        cum += share[g];
        int64_t end = g == G - 1 ? T : (int64_t)llround((double)T * cum / total);
        if (end < prev) end = prev;
        if (end > T) end = T;
        splits[g] = end - prev;
        prev = end;
    }
    if (empty >= 0 && splits[empty] != 0) {   /* rounding gave it rows: move them on */
        splits[(empty + 1) % G] += splits[empty];
        splits[empty] = 0;
    }
    free(share);
    return 0;
}

#define FILL_BLOCK ((size_t)1 << 20)

/* n elements of dtype dt in backend memory, uniform in [-scale, scale). A random block of
 * up to FILL_BLOCK elements is tiled over the buffer (fast for GPU-sized weights). */
static int fill_random(moex_backend b, void *dst, moex_dtype dt, size_t n, double scale, cli_rng *r) {
    size_t block = n < FILL_BLOCK ? n : FILL_BLOCK, es = moex_dtype_size(dt);
    float *f = malloc(block * sizeof(float));
    void *h = malloc(block * es);
    if (!f || !h) {
        free(f);
        free(h);
        return -1;
    }
    for (size_t i = 0; i < block; i++) f[i] = (float)(scale * (2.0 * cli_rng_uniform(r) - 1.0));
    cli_from_f32(h, dt, f, block);
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += block) {
        size_t m = n - at < block ? n - at : block;
        rc = cli_mem_upload(b, (char *)dst + at * es, h, m * es);
    }
    free(f);
    free(h);
    return rc;
}

/* ---- timing ------------------------------------------------------------------------- */

typedef moex_status (*bench_fn)(moex_context *ctx, void *arg);
typedef moex_status (*bench_ws_fn)(moex_context *ctx, void *arg, size_t *bytes);

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_op {
    const char *what;
    bench_fn fn;
    void *arg;
    bench_ws_fn ws;   /* the workspace query of fn (NULL: none) */
} bench_op;

/* Times each of ops[0..n) `iters` times after one warm-up each, interleaved (op 0, op 1,
 * ..., then again), so that a change in the load of a shared machine hits all of them
 * alike and their ratios stay fair. med[i] = the median seconds of op i, or -1 when a call
 * of it failed (message printed; the op is skipped from then on). */
static void time_ops(moex_context *ctx, moex_backend backend, int64_t iters, const bench_op *ops, int n,
                     double *med) {
    cli_timer tm;
    double *t = malloc((size_t)(n * iters) * sizeof(double));
    int timer_ok = cli_timer_init(&tm, backend) == 0;
    for (int i = 0; i < n; i++) med[i] = -1.0;
    if (!t || !timer_ok) {
        cli_error(CMD, "cannot set up the timing");
        free(t);
        if (timer_ok) cli_timer_destroy(&tm);
        return;
    }
    int ok[16];
    for (int i = 0; i < n; i++) {
        moex_status st = ops[i].fn(ctx, ops[i].arg);
        ok[i] = st == MOEX_OK && cli_mem_sync(backend) == 0;
        if (st != MOEX_OK)
            cli_error(CMD, "%s failed: %s (%s)", ops[i].what, moex_last_error(ctx), moex_status_string(st));
    }
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < n; i++) {
            if (!ok[i]) continue;
            cli_timer_start(&tm);
            moex_status st = ops[i].fn(ctx, ops[i].arg);
            t[i * iters + it] = cli_timer_stop(&tm);
            if (st != MOEX_OK) {
                ok[i] = 0;
                cli_error(CMD, "%s failed: %s (%s)", ops[i].what, moex_last_error(ctx), moex_status_string(st));
            }
        }
    }
    for (int i = 0; i < n; i++) {
        if (!ok[i]) continue;
        double *ti = t + i * iters;
        qsort(ti, (size_t)iters, sizeof(double), cmp_double);
        med[i] = iters % 2 ? ti[iters / 2] : 0.5 * (ti[iters / 2 - 1] + ti[iters / 2]);
    }
    free(t);
    cli_timer_destroy(&tm);
}

/* The workspace (shared by all ops of a config) and the argument structs. */
typedef struct bench_ws {
    void *ptr;
    size_t bytes;
} bench_ws;

typedef struct gl_bench {
    moex_grouped_linear_args fwd;
    moex_grouped_linear_dgrad_args dgrad;
    moex_grouped_linear_wgrad_args wgrad;
    bench_ws *ws;
} gl_bench;

typedef struct mlp_bench {
    moex_grouped_mlp_args fwd;
    moex_grouped_mlp_grad_args bwd;
    bench_ws *ws;
} mlp_bench;

/* BENCH_CALL(name, type, field, op) defines run_<name>, a bench_fn that calls moex_<op> on
 * the args ((type *)arg)->field with the shared workspace, and ws_<name>, a bench_ws_fn
 * that calls its workspace query moex_<op>_workspace_size. */
#define BENCH_CALL(name, type, field, op)                                                  \
    static moex_status run_##name(moex_context *ctx, void *arg) {                          \
        type *b = arg;                                                                     \
        return moex_##op(ctx, &b->field, b->ws->ptr, b->ws->bytes, NULL);                  \
    }                                                                                      \
    static moex_status ws_##name(moex_context *ctx, void *arg, size_t *bytes) {           \
        return moex_##op##_workspace_size(ctx, &((type *)arg)->field, bytes);              \
    }

/* A bench_op of the functions BENCH_CALL defined for `name`. */
#define BENCH_OP(what, name, arg) {what, run_##name, arg, ws_##name}

BENCH_CALL(fwd, gl_bench, fwd, grouped_linear_forward)
BENCH_CALL(dgrad, gl_bench, dgrad, grouped_linear_backward_data)
BENCH_CALL(wgrad, gl_bench, wgrad, grouped_linear_backward_weight)
BENCH_CALL(mlp_fwd, mlp_bench, fwd, grouped_mlp_forward)
BENCH_CALL(mlp_bwd, mlp_bench, bwd, grouped_mlp_backward)

/* The grouped MLP forward, then its backward. */
static moex_status run_mlp(moex_context *ctx, void *a) {
    moex_status st = run_mlp_fwd(ctx, a);
    return st != MOEX_OK ? st : run_mlp_bwd(ctx, a);
}

#ifdef MOEX_HAVE_OPENBLAS
typedef struct sgemm_bench {
    int64_t M, N, K;
    const float *a, *b;
    float *c;
} sgemm_bench;

static moex_status run_sgemm(moex_context *ctx, void *arg) {
    (void)ctx;
    sgemm_bench *s = arg;   /* C[M,N] = A[M,K] B[N,K]^T, as y = x W^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)s->M, (blasint)s->N, (blasint)s->K, 1.0f,
                s->a, (blasint)s->K, s->b, (blasint)s->K, 0.0f, s->c, (blasint)s->N);
    return MOEX_OK;
}
#endif

/* ---- one configuration ---------------------------------------------------------------- */

typedef struct bench_row {
    const char *op;
    double flops, seconds;   /* seconds < 0: failed or unavailable */
} bench_row;

#define MAX_ROWS 6

/* The largest workspace the queries of ops[0..n) ask for. A failed query counts 0: its op
 * reports the error when it runs. */
static size_t ops_workspace(moex_context *ctx, const bench_op *ops, int n) {
    size_t ws = 0;
    for (int i = 0; i < n; i++) {
        size_t b = 0;
        if (ops[i].ws && ops[i].ws(ctx, ops[i].arg, &b) == MOEX_OK && b > ws) ws = b;
    }
    return ws;
}

/* Adds to *plan what a run of config c takes besides its buffers: the workspace of ws_bytes
 * and host memory for the splits (the caller's array and make_splits' shares), fill_random's
 * block at most and time_ops' samples of nops. */
static void plan_run(cli_budget *plan, size_t ws_bytes, const bench_config *c, moex_dtype dt, const bench_opts *o,
                     int nops) {
    size_t b = cli_array_bytes(2 * sizeof(int64_t), c->G, 1, 1);
    b = cli_size_add(b, cli_array_bytes(sizeof(float) + moex_dtype_size(dt), (int64_t)FILL_BLOCK, 1, 1));
    cli_budget_backend(plan, ws_bytes);
    cli_budget_host(plan, cli_size_add(b, cli_array_bytes(sizeof(double), nops, o->iters, 1)));
}

/* The splits of a run: make_splits into splits_out, their sum in *S. Nothing with `plan`
 * (sizes only: *S = 0). Returns -1 when make_splits fails. */
static int run_splits(splits_kind sk, int64_t G, int64_t T, cli_rng *r, int64_t *splits_out, const cli_budget *plan,
                      int64_t *S) {
    *S = 0;
    if (plan) return 0;
    if (make_splits(sk, G, T, r, splits_out) != 0) return -1;
    for (int64_t g = 0; g < G; g++) *S += splits_out[g];
    return 0;
}

/* The shared workspace of ws->bytes in backend memory (none for 0 bytes). Returns -1 with a
 * message when the allocation fails. */
static int alloc_ws(moex_backend be, const bench_config *c, bench_ws *ws) {
    if (!ws->bytes) return 0;
    ws->ptr = cli_mem_alloc(be, ws->bytes);
    if (ws->ptr) return 0;
    cli_error(CMD, "%s: cannot allocate a workspace of %zu bytes", c->name, ws->bytes);
    return -1;
}

/* Frees the workspace and buf[0..n) (not allocated with `plan`). */
static void free_run(moex_backend be, bench_ws *ws, void **buf, int n, const cli_budget *plan) {
    cli_mem_free(be, ws->ptr);
    for (int i = 0; i < n && !plan; i++) cli_mem_free(be, buf[i]);
}

/* Points buf[i] at bytes[i] of backend memory for each i in [0, n) but `skip` (-1: none);
 * with `plan`, at cli_no_data() instead, adding the bytes to *plan. Returns -1 (message
 * printed) when an allocation fails; the caller frees what was allocated. */
static int alloc_bufs(moex_backend be, const bench_config *c, const size_t *bytes, void **buf, int n, int skip,
                      cli_budget *plan) {
    for (int i = 0; i < n; i++) {
        if (i == skip) continue;
        if (plan) {
            buf[i] = cli_no_data();
            cli_budget_backend(plan, bytes[i]);
            continue;
        }
        buf[i] = cli_mem_alloc(be, bytes[i]);
        if (!buf[i]) {
            cli_error(CMD, "%s: cannot allocate %zu bytes of %s memory", c->name, bytes[i], cli_backend_name(be));
            return -1;
        }
    }
    return 0;
}

/* Runs every op of config c; fills rows (returns their count) or returns -1.
 * With `plan`: runs and allocates nothing (rows and splits_out unused, may be NULL), but
 * adds to *plan the memory a run takes: its buffers, the workspace the library's queries
 * ask for (on placeholder buffers) and its host temporaries; returns 0 or -1. */
static int bench_one(moex_context *ctx, moex_backend be, moex_dtype dt, const bench_config *c,
                     splits_kind sk, const bench_opts *o, bench_row *rows, int64_t *splits_out, cli_budget *plan) {
    const int64_t G = c->G, T = c->T, K = c->K, N = c->N, H = c->H, F = c->F;
    const size_t es = moex_dtype_size(dt);
    cli_rng r = cli_rng_make((uint64_t)o->seed);
    int64_t S;
    if (run_splits(sk, G, T, &r, splits_out, plan, &S) != 0) return -1;

    /* buffers: linear x [T,K], w [G,N,K], y/dy [T,N], dx [T,K], dw [G,N,K];
     * MLP x [T,H], w1 [G,2F,H], w2 [G,H,F], probs [T], h [T,2F], z [T,F], y/dy/dx [T,H],
     * dw1, dw2 */
    enum { X, W, Y, DX, DW, MX, W1, W2, PR, MH, MZ, MY, MDX, DW1, DW2, SPL, NBUF };
    size_t bytes[NBUF] = {
        [X] = (size_t)(T * K) * es, [W] = (size_t)(G * N * K) * es, [Y] = (size_t)(T * N) * es,
        [DX] = (size_t)(T * K) * es, [DW] = (size_t)(G * N * K) * es, [MX] = (size_t)(T * H) * es,
        [W1] = (size_t)(G * 2 * F * H) * es, [W2] = (size_t)(G * H * F) * es, [PR] = (size_t)T * 4,
        [MH] = (size_t)(T * 2 * F) * es, [MZ] = (size_t)(T * F) * es, [MY] = (size_t)(T * H) * es,
        [MDX] = (size_t)(T * H) * es, [DW1] = (size_t)(G * 2 * F * H) * es, [DW2] = (size_t)(G * H * F) * es,
        [SPL] = (size_t)G * 8,
    };
    void *buf[NBUF] = {0};
    int rc = -1, n = 0;
    bench_ws ws = {NULL, 0};
    if (alloc_bufs(be, c, bytes, buf, NBUF, -1, plan) != 0) goto done;

    moex_tensor splits = moex_tensor_1d(buf[SPL], MOEX_DTYPE_I64, G);
    gl_bench gl;
    memset(&gl, 0, sizeof gl);
    gl.ws = &ws;
    gl.fwd.x = moex_tensor_2d(buf[X], dt, T, K);
    gl.fwd.w = moex_weight_packed(moex_tensor_3d(buf[W], dt, G, N, K));
    gl.fwd.bias_mode = MOEX_BIAS_NONE;
    gl.fwd.splits = splits;
    gl.fwd.y = moex_tensor_2d(buf[Y], dt, T, N);
    gl.dgrad.dy = moex_tensor_2d(buf[Y], dt, T, N);
    gl.dgrad.w = gl.fwd.w;
    gl.dgrad.bias_mode = MOEX_BIAS_NONE;
    gl.dgrad.splits = splits;
    gl.dgrad.dx = moex_tensor_2d(buf[DX], dt, T, K);
    gl.wgrad.x = gl.fwd.x;
    gl.wgrad.dy = gl.dgrad.dy;
    gl.wgrad.splits = splits;
    gl.wgrad.dw_mode = MOEX_GRAD_WRITE;
    gl.wgrad.dw = moex_weight_packed(moex_tensor_3d(buf[DW], dt, G, N, K));

    /* The MLP's dy is the [T,H] buffer MDX (random, filled below); its dx goes to MY (the
     * forward's y is not needed by the backward, so y and dx share MY). */
    mlp_bench mlp;
    memset(&mlp, 0, sizeof mlp);
    mlp.ws = &ws;
    mlp.fwd.x = moex_tensor_2d(buf[MX], dt, T, H);
    mlp.fwd.w1 = moex_weight_packed(moex_tensor_3d(buf[W1], dt, G, 2 * F, H));
    mlp.fwd.w2 = moex_weight_packed(moex_tensor_3d(buf[W2], dt, G, H, F));
    mlp.fwd.b2_mode = MOEX_BIAS_NONE;
    mlp.fwd.probs = moex_tensor_1d(buf[PR], MOEX_DTYPE_F32, T);
    mlp.fwd.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    mlp.fwd.splits = splits;
    mlp.fwd.h = moex_tensor_2d(buf[MH], dt, T, 2 * F);
    mlp.fwd.z = moex_tensor_2d(buf[MZ], dt, T, F);
    mlp.fwd.y = moex_tensor_2d(buf[MY], dt, T, H);
    mlp.bwd.x = mlp.fwd.x;
    mlp.bwd.w1 = mlp.fwd.w1;
    mlp.bwd.w2 = mlp.fwd.w2;
    mlp.bwd.b2_mode = MOEX_BIAS_NONE;
    mlp.bwd.probs = mlp.fwd.probs;
    mlp.bwd.glu = mlp.fwd.glu;
    mlp.bwd.splits = splits;
    mlp.bwd.h = mlp.fwd.h;
    mlp.bwd.z = mlp.fwd.z;
    mlp.bwd.dy = moex_tensor_2d(buf[MDX], dt, T, H);
    mlp.bwd.dx = moex_tensor_2d(buf[MY], dt, T, H);
    mlp.bwd.dw_mode = MOEX_GRAD_WRITE;
    mlp.bwd.dw1 = moex_weight_packed(moex_tensor_3d(buf[DW1], dt, G, 2 * F, H));
    mlp.bwd.dw2 = moex_weight_packed(moex_tensor_3d(buf[DW2], dt, G, H, F));

    /* the MLP forward+backward runs both: its query is the backward's, the forward's is op 3 */
    bench_op ops[MAX_ROWS] = {
        BENCH_OP("forward", fwd, &gl), BENCH_OP("backward_data", dgrad, &gl),
        BENCH_OP("backward_weight", wgrad, &gl), BENCH_OP("grouped MLP forward", mlp_fwd, &mlp),
        {"grouped MLP forward+backward", run_mlp, &mlp, ws_mlp_bwd},
    };
    int nops = 5;
    ws.bytes = ops_workspace(ctx, ops, nops);
    if (plan) {
        plan_run(plan, ws.bytes, c, dt, o, MAX_ROWS);
#ifdef MOEX_HAVE_OPENBLAS
        if (be == MOEX_BACKEND_CPU)   /* the cblas_sgemm baseline's a, w, c */
            cli_budget_host(plan, cli_size_add(cli_array_bytes(sizeof(float), T, K, 1),
                                               cli_array_bytes(sizeof(float), N, K + T, 1)));
#endif
        return 0;
    }
    if (fill_random(be, buf[X], dt, (size_t)(T * K), 1.0, &r) ||
        fill_random(be, buf[W], dt, (size_t)(G * N * K), 1.0 / sqrt((double)K), &r) ||
        fill_random(be, buf[Y], dt, (size_t)(T * N), 1.0, &r) ||
        fill_random(be, buf[MX], dt, (size_t)(T * H), 1.0, &r) ||
        fill_random(be, buf[W1], dt, (size_t)(G * 2 * F * H), 1.0 / sqrt((double)H), &r) ||
        fill_random(be, buf[W2], dt, (size_t)(G * H * F), 1.0 / sqrt((double)F), &r) ||
        fill_random(be, buf[MDX], dt, (size_t)(T * H), 1.0, &r) ||   /* dy of the MLP, see above */
        fill_random(be, buf[PR], MOEX_DTYPE_F32, (size_t)T, 1.0, &r) ||
        cli_mem_upload(be, buf[SPL], splits_out, bytes[SPL]) || alloc_ws(be, c, &ws))
        goto done;

    const double lin = 2.0 * (double)S * (double)K * (double)N;
    rows[0] = (bench_row){"forward", lin, -1.0};
    rows[1] = (bench_row){"backward_data", lin, -1.0};
    rows[2] = (bench_row){"backward_weight", lin, -1.0};
    rows[3] = (bench_row){"mlp_fwd", 6.0 * (double)S * (double)H * (double)F, -1.0};
    rows[4] = (bench_row){"mlp_fwd_bwd", 18.0 * (double)S * (double)H * (double)F, -1.0};
    rows[5] = (bench_row){"sgemm", 2.0 * (double)T * (double)K * (double)N, -1.0};
    double med[MAX_ROWS];
#ifdef MOEX_HAVE_OPENBLAS
    /* the dense baseline: one cblas_sgemm of M = T rows, timed between the grouped ops */
    float *sa = NULL, *sw = NULL, *sc = NULL;
    sgemm_bench sb;
    if (be == MOEX_BACKEND_CPU) {
        sa = malloc((size_t)(T * K) * sizeof(float));
        sw = malloc((size_t)(N * K) * sizeof(float));
        sc = malloc((size_t)(T * N) * sizeof(float));
        if (sa && sw && sc) {
            for (int64_t i = 0; i < T * K; i++) sa[i] = (float)(2.0 * cli_rng_uniform(&r) - 1.0);
            for (int64_t i = 0; i < N * K; i++) sw[i] = (float)((2.0 * cli_rng_uniform(&r) - 1.0) / sqrt((double)K));
            sb = (sgemm_bench){T, N, K, sa, sw, sc};
            ops[nops++] = (bench_op){"cblas_sgemm", run_sgemm, &sb, NULL};
        }
    }
#endif
    time_ops(ctx, be, o->iters, ops, nops, med);
    for (int i = 0; i < nops; i++) rows[i].seconds = med[i];
#ifdef MOEX_HAVE_OPENBLAS
    free(sa);
    free(sw);
    free(sc);
#endif
    n = MAX_ROWS;
    rc = n;
done:
    free_run(be, &ws, buf, NBUF, plan);
    return rc;
}

/* ---- the other operations (--ops other) ----------------------------------------------- */

/* The GLU, the routing ops and the whole MoE layer of config c: E = G experts, T tokens,
 * k = 2 experts per token when G <= 8, else 8. Permute and unpermute move T*k rows. */
typedef struct other_bench {
    moex_scaled_glu_args glu;
    moex_scaled_glu_grad_args glu_bwd;
    moex_router_args router;
    moex_router_grad_args router_bwd;
    moex_permute_args perm;
    moex_permute_grad_args perm_bwd;
    moex_unpermute_args unperm;
    moex_unpermute_grad_args unperm_bwd;
    moex_moe_layer_args moe;
    moex_moe_layer_grad_args moe_bwd;
    bench_ws *ws;
} other_bench;

BENCH_CALL(glu_fwd, other_bench, glu, scaled_glu_forward)
BENCH_CALL(glu_bwd, other_bench, glu_bwd, scaled_glu_backward)
BENCH_CALL(router_fwd, other_bench, router, router_forward)
BENCH_CALL(router_bwd, other_bench, router_bwd, router_backward)
BENCH_CALL(perm_fwd, other_bench, perm, permute_forward)
BENCH_CALL(perm_bwd, other_bench, perm_bwd, permute_backward)
BENCH_CALL(unperm_fwd, other_bench, unperm, unpermute_forward)
BENCH_CALL(unperm_bwd, other_bench, unperm_bwd, unpermute_backward)
BENCH_CALL(moe_fwd, other_bench, moe, moe_layer_forward)
BENCH_CALL(moe_bwd, other_bench, moe_bwd, moe_layer_backward)

typedef struct other_row {
    const char *op;
    double bytes, flops, seconds;   /* flops 0: not a GEMM op; seconds < 0: failed */
} other_row;

#define OTHER_ROWS 10

static int64_t other_topk(const bench_config *c) { return c->G <= 8 ? 2 : 8; }

/* Runs the other ops of config c; fills rows (returns OTHER_ROWS) or returns -1. The
 * dependent ops (permute after router, unpermute after permute, backward after forward)
 * read what the previous op wrote; each op is run once in that order before the timing,
 * and every rerun writes the same values, so their inputs stay valid while timed.
 * With `plan`: as bench_one's (sizes only, adds to *plan; returns 0 or -1). */
static int bench_other(moex_context *ctx, moex_backend be, moex_dtype dt, const bench_config *c,
                       splits_kind sk, const bench_opts *o, other_row *rows, int64_t *splits_out, cli_budget *plan) {
    const int64_t E = c->G, T = c->T, H = c->H, F = c->F, k = other_topk(c), Tk = T * k;
    const size_t es = moex_dtype_size(dt);
    cli_rng r = cli_rng_make((uint64_t)o->seed);
    int64_t S;
    if (run_splits(sk, E, T, &r, splits_out, plan, &S) != 0) return -1;

    /* GLU: h [T,2F], probs [T], z [T,F], dz [T,F], dh [T,2F], dprobs [T], splits [E].
     * router: logits [T,E] f32, probs [T,k], ids [T,k], dprobs [T,k], dlogits [T,E].
     * permute: x [T,H] -> xp [Tk,H], probs_p [Tk], splits [E], row_map [Tk];
     *          dxp [Tk,H], dprobs_p [Tk] -> dx [T,H], dprobs [T,k].
     * unpermute: yp = dxp (random) -> y [T,H]; dy [T,H] -> dyp [Tk,H].
     * MoE layer: x, router_w [E,H], w1 [E,2F,H], w2 [E,H,F] -> y [T,H] (saved: sized by the
     *            library); dy -> dx [T,H], drouter_w [E,H], dw1, dw2. */
    enum { GH, GP, GZ, GDZ, GDH, GDP, SPL, RL, RP, RI, RDP, RDL, PX, PXP, PPP, PSPL, PRM, PDXP, PDPP, PDX,
           PDP, UY, UDY, UDYP, MRW, MW1, MW2, MY, MDX, MDRW, MDW1, MDW2, MSAVED, NBUF };
    size_t bytes[NBUF] = {
        [GH] = (size_t)(T * 2 * F) * es, [GP] = (size_t)T * 4, [GZ] = (size_t)(T * F) * es,
        [GDZ] = (size_t)(T * F) * es, [GDH] = (size_t)(T * 2 * F) * es, [GDP] = (size_t)T * 4,
        [SPL] = (size_t)E * 8, [RL] = (size_t)(T * E) * 4, [RP] = (size_t)Tk * 4, [RI] = (size_t)Tk * 4,
        [RDP] = (size_t)Tk * 4, [RDL] = (size_t)(T * E) * 4, [PX] = (size_t)(T * H) * es,
        [PXP] = (size_t)(Tk * H) * es, [PPP] = (size_t)Tk * 4, [PSPL] = (size_t)E * 8, [PRM] = (size_t)Tk * 4,
        [PDXP] = (size_t)(Tk * H) * es, [PDPP] = (size_t)Tk * 4, [PDX] = (size_t)(T * H) * es,
        [PDP] = (size_t)Tk * 4, [UY] = (size_t)(T * H) * es, [UDY] = (size_t)(T * H) * es,
        [UDYP] = (size_t)(Tk * H) * es, [MRW] = (size_t)(E * H) * es, [MW1] = (size_t)(E * 2 * F * H) * es,
        [MW2] = (size_t)(E * H * F) * es, [MY] = (size_t)(T * H) * es, [MDX] = (size_t)(T * H) * es,
        [MDRW] = (size_t)(E * H) * es, [MDW1] = (size_t)(E * 2 * F * H) * es,
        [MDW2] = (size_t)(E * H * F) * es, [MSAVED] = 0,   /* MSAVED: after the size query */
    };
    void *buf[NBUF] = {0};
    int rc = -1;
    bench_ws ws = {NULL, 0};
    other_bench ob;
    memset(&ob, 0, sizeof ob);
    ob.ws = &ws;

    /* the argument structs first: the saved size query needs the MoE layer's */
    moex_glu_params swiglu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    ob.glu.glu = swiglu;
    ob.glu_bwd.glu = swiglu;
    ob.router.topk = (int32_t)k;
    ob.router.score = MOEX_ROUTER_SOFTMAX;
    ob.router.norm = MOEX_ROUTER_RENORM;
    ob.router_bwd.topk = (int32_t)k;
    ob.router_bwd.score = MOEX_ROUTER_SOFTMAX;
    ob.router_bwd.norm = MOEX_ROUTER_RENORM;
    ob.perm.num_experts = (int32_t)E;
    ob.moe.topk = (int32_t)k;
    ob.moe.score = MOEX_ROUTER_SOFTMAX;
    ob.moe.norm = MOEX_ROUTER_RENORM;
    ob.moe.b2_mode = MOEX_BIAS_NONE;
    ob.moe.glu = swiglu;

    if (alloc_bufs(be, c, bytes, buf, NBUF, MSAVED, plan) != 0) goto done;
    ob.glu.h = moex_tensor_2d(buf[GH], dt, T, 2 * F);
    ob.glu.probs = moex_tensor_1d(buf[GP], MOEX_DTYPE_F32, T);
    ob.glu.splits = moex_tensor_1d(buf[SPL], MOEX_DTYPE_I64, E);
    ob.glu.z = moex_tensor_2d(buf[GZ], dt, T, F);
    ob.glu_bwd.h = ob.glu.h;
    ob.glu_bwd.probs = ob.glu.probs;
    ob.glu_bwd.splits = ob.glu.splits;
    ob.glu_bwd.dz = moex_tensor_2d(buf[GDZ], dt, T, F);
    ob.glu_bwd.dh = moex_tensor_2d(buf[GDH], dt, T, 2 * F);
    ob.glu_bwd.dprobs = moex_tensor_1d(buf[GDP], MOEX_DTYPE_F32, T);

    ob.router.logits = moex_tensor_2d(buf[RL], MOEX_DTYPE_F32, T, E);
    ob.router.probs = moex_tensor_2d(buf[RP], MOEX_DTYPE_F32, T, k);
    ob.router.ids = moex_tensor_2d(buf[RI], MOEX_DTYPE_I32, T, k);
    ob.router_bwd.logits = ob.router.logits;
    ob.router_bwd.ids = ob.router.ids;
    ob.router_bwd.dprobs = moex_tensor_2d(buf[RDP], MOEX_DTYPE_F32, T, k);
    ob.router_bwd.dlogits = moex_tensor_2d(buf[RDL], MOEX_DTYPE_F32, T, E);

    ob.perm.x = moex_tensor_2d(buf[PX], dt, T, H);
    ob.perm.ids = ob.router.ids;
    ob.perm.probs = ob.router.probs;
    ob.perm.xp = moex_tensor_2d(buf[PXP], dt, Tk, H);
    ob.perm.probs_p = moex_tensor_1d(buf[PPP], MOEX_DTYPE_F32, Tk);
    ob.perm.splits = moex_tensor_1d(buf[PSPL], MOEX_DTYPE_I64, E);
    ob.perm.row_map = moex_tensor_1d(buf[PRM], MOEX_DTYPE_I32, Tk);
    ob.perm_bwd.row_map = ob.perm.row_map;
    ob.perm_bwd.dxp = moex_tensor_2d(buf[PDXP], dt, Tk, H);
    ob.perm_bwd.dprobs_p = moex_tensor_1d(buf[PDPP], MOEX_DTYPE_F32, Tk);
    ob.perm_bwd.dx = moex_tensor_2d(buf[PDX], dt, T, H);
    ob.perm_bwd.dprobs = moex_tensor_2d(buf[PDP], MOEX_DTYPE_F32, T, k);

    ob.unperm.row_map = ob.perm.row_map;
    ob.unperm.yp = ob.perm_bwd.dxp;
    ob.unperm.y = moex_tensor_2d(buf[UY], dt, T, H);
    ob.unperm_bwd.row_map = ob.perm.row_map;
    ob.unperm_bwd.dy = moex_tensor_2d(buf[UDY], dt, T, H);
    ob.unperm_bwd.dyp = moex_tensor_2d(buf[UDYP], dt, Tk, H);

    ob.moe.x = ob.perm.x;
    ob.moe.router_w = moex_tensor_2d(buf[MRW], dt, E, H);
    ob.moe.w1 = moex_weight_packed(moex_tensor_3d(buf[MW1], dt, E, 2 * F, H));
    ob.moe.w2 = moex_weight_packed(moex_tensor_3d(buf[MW2], dt, E, H, F));
    ob.moe.y = moex_tensor_2d(buf[MY], dt, T, H);
    moex_status st = moex_moe_layer_saved_size(ctx, &ob.moe, &bytes[MSAVED]);
    if (st != MOEX_OK) {
        cli_error(CMD, "%s: moe_layer_saved_size failed: %s", c->name, moex_last_error(ctx));
        goto done;
    }
    if (plan) {
        buf[MSAVED] = cli_no_data();
        cli_budget_backend(plan, bytes[MSAVED]);
    } else {
        buf[MSAVED] = cli_mem_alloc(be, bytes[MSAVED]);
        if (bytes[MSAVED] && !buf[MSAVED]) {
            cli_error(CMD, "%s: cannot allocate %zu saved bytes", c->name, bytes[MSAVED]);
            goto done;
        }
    }
    ob.moe.saved = buf[MSAVED];
    ob.moe.saved_bytes = bytes[MSAVED];
    ob.moe_bwd.fwd = ob.moe;
    ob.moe_bwd.dy = ob.unperm_bwd.dy;
    ob.moe_bwd.dx = moex_tensor_2d(buf[MDX], dt, T, H);
    ob.moe_bwd.dw_mode = MOEX_GRAD_WRITE;
    ob.moe_bwd.drouter_w = moex_tensor_2d(buf[MDRW], dt, E, H);
    ob.moe_bwd.dw1 = moex_weight_packed(moex_tensor_3d(buf[MDW1], dt, E, 2 * F, H));
    ob.moe_bwd.dw2 = moex_weight_packed(moex_tensor_3d(buf[MDW2], dt, E, H, F));

    bench_op ops[OTHER_ROWS] = {
        BENCH_OP("glu_fwd", glu_fwd, &ob),         BENCH_OP("glu_bwd", glu_bwd, &ob),
        BENCH_OP("router_fwd", router_fwd, &ob),   BENCH_OP("router_bwd", router_bwd, &ob),
        BENCH_OP("permute_fwd", perm_fwd, &ob),    BENCH_OP("permute_bwd", perm_bwd, &ob),
        BENCH_OP("unpermute_fwd", unperm_fwd, &ob), BENCH_OP("unpermute_bwd", unperm_bwd, &ob),
        BENCH_OP("moe_fwd", moe_fwd, &ob),         BENCH_OP("moe_bwd", moe_bwd, &ob),
    };
    ws.bytes = ops_workspace(ctx, ops, OTHER_ROWS);
    if (plan) {
        plan_run(plan, ws.bytes, c, dt, o, OTHER_ROWS);
        return 0;
    }
    /* random inputs; the ids, probs and row maps come from the router and permute runs */
    if (fill_random(be, buf[GH], dt, (size_t)(T * 2 * F), 2.0, &r) ||
        fill_random(be, buf[GP], MOEX_DTYPE_F32, (size_t)T, 1.0, &r) ||
        fill_random(be, buf[GDZ], dt, (size_t)(T * F), 1.0, &r) ||
        fill_random(be, buf[GDP], MOEX_DTYPE_F32, (size_t)T, 1.0, &r) ||
        cli_mem_upload(be, buf[SPL], splits_out, bytes[SPL]) ||
        fill_random(be, buf[RL], MOEX_DTYPE_F32, (size_t)(T * E), 3.0, &r) ||
        fill_random(be, buf[RDP], MOEX_DTYPE_F32, (size_t)Tk, 1.0, &r) ||
        fill_random(be, buf[PX], dt, (size_t)(T * H), 1.0, &r) ||
        fill_random(be, buf[PDXP], dt, (size_t)(Tk * H), 1.0, &r) ||
        fill_random(be, buf[PDPP], MOEX_DTYPE_F32, (size_t)Tk, 1.0, &r) ||
        fill_random(be, buf[UDY], dt, (size_t)(T * H), 1.0, &r) ||
        fill_random(be, buf[MRW], dt, (size_t)(E * H), 1.0 / sqrt((double)H), &r) ||
        fill_random(be, buf[MW1], dt, (size_t)(E * 2 * F * H), 1.0 / sqrt((double)H), &r) ||
        fill_random(be, buf[MW2], dt, (size_t)(E * H * F), 1.0 / sqrt((double)F), &r) || alloc_ws(be, c, &ws))
        goto done;

    /* Effective bytes: what each op must read and write at least once (see --help). */
    const double t = (double)T, tk = (double)Tk, e = (double)E, h = (double)H, f = (double)F, s = (double)S,
                 w = (double)es, th = t * h * w;
    const double moe_flops = 2.0 * t * e * h + 6.0 * tk * h * f;
    const other_row spec[OTHER_ROWS] = {
        {"glu_fwd", s * (3.0 * f * w + 4.0), 0.0, -1.0},
        {"glu_bwd", s * (5.0 * f * w + 12.0), 0.0, -1.0},
        {"router_fwd", t * (4.0 * e + 8.0 * (double)k), 0.0, -1.0},
        {"router_bwd", t * (8.0 * e + 8.0 * (double)k), 0.0, -1.0},
        {"permute_fwd", th * (1.0 + (double)k) + 16.0 * tk + 8.0 * e, 0.0, -1.0},
        {"permute_bwd", th * (1.0 + (double)k) + 12.0 * tk, 0.0, -1.0},
        {"unpermute_fwd", th * (1.0 + (double)k) + 4.0 * tk, 0.0, -1.0},
        {"unpermute_bwd", th * (1.0 + (double)k) + 4.0 * tk, 0.0, -1.0},
        {"moe_fwd", w * (2.0 * t * h + e * h + 3.0 * e * f * h), moe_flops, -1.0},
        {"moe_bwd", w * (3.0 * t * h + 2.0 * e * h + 6.0 * e * f * h), 2.0 * moe_flops, -1.0},
    };
    /* the producers once, in order, so every consumer's first (warm-up) run reads real data */
    const int producers[] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        const bench_op *p = &ops[producers[i]];
        st = p->fn(ctx, p->arg);
        if (st != MOEX_OK || cli_mem_sync(be) != 0) {
            cli_error(CMD, "%s: %s failed: %s (%s)", c->name, p->what, moex_last_error(ctx), moex_status_string(st));
            goto done;
        }
    }
    double med[OTHER_ROWS];
    time_ops(ctx, be, o->iters, ops, OTHER_ROWS, med);
    for (int i = 0; i < OTHER_ROWS; i++) {
        rows[i] = spec[i];
        rows[i].seconds = med[i];
    }
    rc = OTHER_ROWS;
done:
    free_run(be, &ws, buf, NBUF, plan);
    return rc;
}

/* ---- the command -------------------------------------------------------------------- */

/* --ops other: runs bench_other on each picked config and prints its rows (a table, or
 * JSON objects continuing the results array, *emitted counting them). Returns 1 when a
 * config or an op failed. */
static int print_other(moex_context *ctx, moex_backend be, moex_dtype dt, const bench_opts *o, const int *pick,
                       int npick, int *emitted) {
    int failed = 0;
    if (!o->json)
        printf("%s%-14s %4s %6s %6s %6s %3s %-8s  %-16s %10s %10s %10s\n", o->ops == OPS_ALL ? "\n" : "", "config",
               "E", "T", "H", "F", "k", "splits", "op", "ms", "GB/s", "GFLOP/s");
    for (int p = 0; p < npick; p++) {
        const bench_config *c = &configs[pick[p]];
        splits_kind sk = o->splits >= 0 ? (splits_kind)o->splits : c->splits;
        other_row rows[OTHER_ROWS];
        const int64_t k = other_topk(c);
        int64_t *splits = malloc((size_t)c->G * sizeof(int64_t));
        int n = splits ? bench_other(ctx, be, dt, c, sk, o, rows, splits, NULL) : -1;
        free(splits);
        if (n < 0) {
            failed = 1;
            continue;
        }
        for (int i = 0; i < n; i++) {
            const other_row *r = &rows[i];
            double gbs = r->seconds > 0 ? r->bytes / r->seconds * 1e-9 : 0.0;
            double gfs = r->seconds > 0 && r->flops > 0 ? r->flops / r->seconds * 1e-9 : 0.0;
            if (r->seconds < 0) failed = 1;
            if (o->json) {
                printf("%s\n  {\"config\": \"%s\", \"E\": %lld, \"T\": %lld, \"H\": %lld, \"F\": %lld, \"k\": %lld, "
                       "\"splits\": \"%s\", \"op\": \"%s\", ",
                       (*emitted)++ ? "," : "", c->name, (long long)c->G, (long long)c->T, (long long)c->H,
                       (long long)c->F, (long long)k, splits_words[sk], r->op);
                if (r->seconds > 0)
                    printf("\"ms\": %.4f, \"gbps\": %.2f", r->seconds * 1e3, gbs);
                else
                    printf("\"ms\": null, \"gbps\": null");
                if (gfs > 0) printf(", \"gflops\": %.2f", gfs);
                printf("}");
            } else {
                printf("%-14s %4lld %6lld %6lld %6lld %3lld %-8s  %-16s ", i == 0 ? c->name : "", (long long)c->G,
                       (long long)c->T, (long long)c->H, (long long)c->F, (long long)k, splits_words[sk], r->op);
                if (r->seconds > 0)
                    printf("%10.3f %10.2f", r->seconds * 1e3, gbs);
                else
                    printf("%10s %10s", "FAILED", "");
                if (gfs > 0) printf(" %10.2f", gfs);
                printf("\n");
            }
        }
    }
    return failed;
}


/* The memory of the run in *need: the largest of its configurations' (each allocates and
 * frees its buffers in turn), for the GEMM ops, the other ops or both, as --ops picks. */
static int bench_need(moex_context *ctx, moex_backend be, moex_dtype dt, const bench_opts *o, const int *pick,
                      int npick, cli_budget *need) {
    *need = cli_budget_make(be);
    for (int p = 0; p < npick; p++) {
        const bench_config *c = &configs[pick[p]];
        cli_budget gemm = cli_budget_make(be), other = cli_budget_make(be);
        if ((o->ops != OPS_OTHER && bench_one(ctx, be, dt, c, c->splits, o, NULL, NULL, &gemm) != 0) ||
            (o->ops != OPS_GEMM && bench_other(ctx, be, dt, c, c->splits, o, NULL, NULL, &other) != 0))
            return -1;
        cli_budget_max(need, &gemm);
        cli_budget_max(need, &other);
    }
    return 0;
}

static double gflops(const bench_row *r) { return r->seconds > 0 ? r->flops / r->seconds * 1e-9 : 0.0; }

int cli_cmd_bench(int argc, char **argv) {
    bench_opts o = {.backend = -1, .dtype = 0, .splits = -1, .json = 0, .iters = 0, .threads = 0, .seed = 1,
                    .max_memory = 0, .config = NULL, .ops = OPS_GEMM};
    const cli_option opts[] = {
        {"backend", CLI_OPT_CHOICE, &o.backend, .choices = backend_words},
        {"config", CLI_OPT_STRING, .value = &o.config},
        {"dtype", CLI_OPT_CHOICE, &o.dtype, .choices = dtype_words},
        {"splits", CLI_OPT_CHOICE, &o.splits, .choices = splits_words},
        {"iters", CLI_OPT_INT, &o.iters, .imin = 1, .imax = 100000},
        {"threads", CLI_OPT_INT, &o.threads, .imin = 1, .imax = 1024},
        {"seed", CLI_OPT_INT, &o.seed, .imin = 0, .imax = INT64_C(1) << 53},
        {"max-memory", CLI_OPT_BYTES, &o.max_memory, .imin = 1, .imax = INT64_MAX},
        {"json", CLI_OPT_FLAG, .value = &o.json},
        {"ops", CLI_OPT_CHOICE, &o.ops, .choices = ops_words},
    };
    int pr = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), usage);
    if (pr == CLI_PARSE_HELP) return CLI_EXIT_OK;
    if (pr != CLI_PARSE_OK) return CLI_EXIT_USAGE;
    if (o.backend < 0) {
        cli_error(CMD, "--backend cpu|cuda is required (see 'moex bench --help')");
        return CLI_EXIT_USAGE;
    }
    moex_backend be = o.backend == 1 ? MOEX_BACKEND_CUDA : MOEX_BACKEND_CPU;
    int cuda = be == MOEX_BACKEND_CUDA;

    /* which configurations */
    int pick[NUM_CONFIGS], npick = 0;
    const char *want = o.config ? o.config : cuda ? "all" : "small";
    for (int i = 0; i < NUM_CONFIGS; i++) {
        if (strcmp(want, "all") == 0 ? configs[i].cuda == cuda : strcmp(want, configs[i].name) == 0)
            pick[npick++] = i;
    }
    if (npick == 0) {
        cli_error(CMD, "unknown --config '%s' (see 'moex bench --help' for the names)", want);
        return CLI_EXIT_USAGE;
    }
    if (!cuda && configs[pick[0]].cuda) {   /* a named config ("all" picks only CPU ones here) */
        cli_error(CMD, "--config %s is sized for a GPU: it runs with --backend cuda only (see 'moex bench "
                  "--help' for the CPU configurations)", want);
        return CLI_EXIT_FAIL;
    }
    moex_dtype dt = o.dtype == 1 ? MOEX_DTYPE_F32 : o.dtype == 2 ? MOEX_DTYPE_BF16
                  : cuda ? MOEX_DTYPE_BF16 : MOEX_DTYPE_F32;
    if (o.iters == 0) o.iters = cuda ? 20 : 5;

    moex_context *ctx = cli_context(CMD, be);
    if (!ctx) return CLI_EXIT_FAIL;
    if (o.threads > 0 && !cuda) {
        moex_status st = moex_context_set_num_threads(ctx, (int)o.threads);
        if (st != MOEX_OK) {
            cli_error(CMD, "%s", moex_last_error(ctx));
            moex_context_destroy(ctx);
            return CLI_EXIT_FAIL;
        }
    }
    cli_budget need;
    if (bench_need(ctx, be, dt, &o, pick, npick, &need) != 0 || cli_budget_check(CMD, &need, o.max_memory) != 0) {
        moex_context_destroy(ctx);
        return CLI_EXIT_FAIL;
    }

    int failed = 0, emitted = 0;   /* emitted: JSON rows printed so far */
    if (o.json)
        printf("{\"backend\": \"%s\", \"dtype\": \"%s\", \"iters\": %lld, \"results\": [", cli_backend_name(be),
               moex_dtype_name(dt), (long long)o.iters);
    else {
        printf("moex bench: backend %s, dtype %s, median of %lld runs after a warm-up\n", cli_backend_name(be),
               moex_dtype_name(dt), (long long)o.iters);
#ifndef MOEX_HAVE_OPENBLAS
        if (!cuda && o.ops != OPS_OTHER) printf("(baseline unavailable: this moex was built without OpenBLAS, no cblas_sgemm to compare)\n");
#else
        if (!cuda && dt != MOEX_DTYPE_F32 && o.ops != OPS_OTHER) printf("(the cblas_sgemm baseline is f32)\n");
#endif
        if (o.ops != OPS_OTHER)
            printf("%-14s %4s %6s %6s %6s %-8s  %-16s %10s %10s %9s\n", "config", "G", "T", "K", "N", "splits",
                   "op", "ms", "GFLOP/s", "vs sgemm");
    }
    for (int p = 0; p < npick && o.ops != OPS_OTHER; p++) {
        const bench_config *c = &configs[pick[p]];
        splits_kind sk = o.splits >= 0 ? (splits_kind)o.splits : c->splits;
        bench_row rows[MAX_ROWS];
        int64_t *splits = malloc((size_t)c->G * sizeof(int64_t));
        int n = splits ? bench_one(ctx, be, dt, c, sk, &o, rows, splits, NULL) : -1;
        if (n < 0) {
            failed = 1;
            free(splits);
            continue;
        }
        double base = rows[n - 1].seconds > 0 ? gflops(&rows[n - 1]) : 0.0;
        for (int i = 0; i < n; i++) {
            const bench_row *r = &rows[i];
            int is_base = strcmp(r->op, "sgemm") == 0;
            if (is_base && cuda) continue;
            if (r->seconds < 0 && !is_base) failed = 1;
            double ratio = base > 0 && r->seconds > 0 && !is_base ? gflops(r) / base : 0.0;
            if (o.json) {
                printf("%s\n  {\"config\": \"%s\", \"G\": %lld, \"T\": %lld, \"K\": %lld, \"N\": %lld, \"H\": %lld, "
                       "\"F\": %lld, \"splits\": \"%s\", \"op\": \"%s\", ",
                       emitted++ ? "," : "", c->name, (long long)c->G, (long long)c->T, (long long)c->K,
                       (long long)c->N, (long long)c->H, (long long)c->F, splits_words[sk], r->op);
                if (r->seconds > 0)
                    printf("\"ms\": %.4f, \"gflops\": %.2f", r->seconds * 1e3, gflops(r));
                else
                    printf("\"ms\": null, \"gflops\": null");
                if (ratio > 0) printf(", \"vs_sgemm\": %.4f", ratio);
                printf("}");
            } else {
                const char *label = strcmp(r->op, "mlp_fwd_bwd") == 0 ? "mlp fwd+bwd"
                                  : strcmp(r->op, "mlp_fwd") == 0 ? "mlp fwd"
                                  : is_base ? "sgemm (M=T)" : r->op;
                printf("%-14s %4lld %6lld %6lld %6lld %-8s  %-16s ", i == 0 ? c->name : "", (long long)c->G,
                       (long long)c->T, (long long)c->K, (long long)c->N, splits_words[sk], label);
                if (r->seconds > 0)
                    printf("%10.3f %10.2f", r->seconds * 1e3, gflops(r));
                else
                    printf("%10s %10s", is_base ? "n/a" : "FAILED", "");
                if (ratio > 0) printf(" %8.1f%%", 100.0 * ratio);
                printf("\n");
            }
        }
        if (!o.json) {
            printf("%-14s splits:", "");
            for (int64_t g = 0; g < c->G && g < 16; g++) printf(" %lld", (long long)splits[g]);
            if (c->G > 16) printf(" ... (%lld groups)", (long long)c->G);
            printf("   MLP: H=%lld F=%lld, 6*S*H*F flops forward, 18*S*H*F with the backward\n", (long long)c->H,
                   (long long)c->F);
        }
        free(splits);
    }
    if (o.ops != OPS_GEMM) failed |= print_other(ctx, be, dt, &o, pick, npick, &emitted);
    if (o.json) printf("\n], \"baseline\": \"%s\"}\n",
#ifdef MOEX_HAVE_OPENBLAS
                       cuda ? "none" : "openblas cblas_sgemm"
#else
                       "none"
#endif
        );
    moex_context_destroy(ctx);
    return failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
