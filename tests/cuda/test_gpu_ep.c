/*
 * test_gpu_ep.c - expert parallelism on the CUDA backend over NCCL: the cases of the CPU test
 * tests/test_ep.c (dispatch, combine and their backwards against the fp64 sums, with capacity
 * drops and every routing; the EP MoE layer against the single-process MoE layer; argument
 * errors) run on the GPU through cuda_mirror.h, and a CUDA-graph test of the four EP calls.
 * Run as one process (an MPI singleton, world size 1) or as `mpirun -np N test_gpu_ep` with
 * one process per GPU (rank r on device r % device count). Exits 77 (skipped) without a GPU.
 *
 * The mirror: each EP call's host arguments are copied to device memory, run on the NCCL EP
 * context, and the outputs copied back (cuda_mirror.h). The dispatch handle and the EP layer's
 * `saved` outlive one call: each host address gets one device buffer (at the same address
 * modulo 16, so the test's odd handle stays odd), uploaded before every call that uses it and
 * copied back after the calls that write it (the dispatch forward, the layer forward).
 * test_ep.c's checks that read a device handle or device ids on the host (EP_HOST_MEMORY) are
 * not run.
 *
 * The graph test: one EP context (E = 4 W, k = 2, H = 64, bf16, T = 32 tokens per rank,
 * R = T k W: no drops), device buffers for every input and output, and on one stream the
 * sequence dispatch forward -> combine forward (yr = xr) -> combine backward -> dispatch
 * backward (dxr = dyr, dprobs_r = probs_r), run eagerly, then captured once in a CUDA graph.
 * For three new routings (random experts; every token to expert E-1; every expert on rank 0),
 * written into the same input buffers outside the graph, the eager calls and a replay of the
 * graph (outputs and handle poisoned before each) must agree bitwise: y, dx, dprobs, splits,
 * dropped, and the rows of xr, probs_r and dyr below sum(splits). Each run is also checked on
 * the host: splits from the global routing, no drops, y = k x and dx = k dy (each token's k
 * rows are copies of its own row) within 2%, dprobs = probs exactly.
 */
/* cuda_mirror.h's runners of the other operations are unused here */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include "cuda_mirror.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>

static ncclComm_t nccl_comm;

/* ---- the CUDA context ---------------------------------------------------------------- */

/* A CUDA context on device (MPI rank % device count), or exit 77 (skipped) without a GPU. */
static moex_context *gpu_ep_context(void) {
    int n = 0, rank = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: skipped\n");
        exit(77);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    moex_context *c = NULL;
    const moex_status st = moex_context_create(&c, MOEX_BACKEND_CUDA, rank % n);
    if (st != MOEX_OK) {
        printf("moex_context_create(CUDA, device %d) failed: %s: %s: skipped\n", rank % n, moex_status_string(st),
               moex_last_error(NULL));
        exit(77);
    }
    return c;
}

/* ---- device twins of the handles and saved buffers ------------------------------------ */

typedef struct ep_twin {
    const void *host;
    void *base;
    size_t bytes;
} ep_twin;
static ep_twin ep_twins[64];
static int ep_ntwins;

/* The device buffer of a host handle (or saved buffer) of `bytes`, with the host's contents:
 * one per host address, at the host address's offset modulo 16, reallocated when a later
 * call needs more bytes. */
static void *ep_twin_upload(const void *host, size_t bytes) {
    ep_twin *t = NULL;
    for (int i = 0; i < ep_ntwins && !t; i++)
        if (ep_twins[i].host == host) t = &ep_twins[i];
    if (!t) {
        if (ep_ntwins == (int)(sizeof ep_twins / sizeof ep_twins[0])) {
            fprintf(stderr, "test: too many dispatch handles\n");
            exit(1);
        }
        t = &ep_twins[ep_ntwins++];
        t->host = host, t->base = NULL, t->bytes = 0;
    }
    if (t->base && t->bytes < bytes) {
        cudaFree(t->base);
        t->base = NULL;
    }
    if (!t->base) {
        t->base = cm_malloc(bytes + 16);
        t->bytes = bytes;
    }
    void *dev = (char *)t->base + (uintptr_t)host % 16;
    if (bytes) cm_die(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "handle H2D");
    return dev;
}

static void ep_twins_free(void) {
    for (int i = 0; i < ep_ntwins; i++) cudaFree(ep_twins[i].base);
    ep_ntwins = 0;
}

/* ---- the mirrors: host args in, host outputs (and handle) updated ---------------------- */

CM_THUNKS(moex_ep_dispatch_forward, moex_ep_dispatch_args)
CM_THUNKS(moex_ep_dispatch_backward, moex_ep_dispatch_grad_args)
CM_THUNKS(moex_ep_combine_forward, moex_ep_combine_args)
CM_THUNKS(moex_ep_combine_backward, moex_ep_combine_grad_args)
CM_THUNKS(moex_ep_moe_layer_forward, moex_ep_moe_layer_args)
CM_THUNKS(moex_ep_moe_layer_backward, moex_ep_moe_layer_grad_args)

static moex_status gpu_ep_dispatch_forward(moex_context *c, const moex_ep_dispatch_args *h) {
    if (!h || !h->handle) return moex_ep_dispatch_forward(c, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_ep_dispatch_args a = *h;
    cm_tensor(&m, &a.x, 0), cm_tensor(&m, &a.ids, 0), cm_tensor(&m, &a.probs, 0), cm_tensor(&m, &a.xr, 1);
    cm_tensor(&m, &a.probs_r, 1), cm_tensor(&m, &a.splits, 1), cm_tensor(&m, &a.dropped, 1);
    cm_tensor(&m, &a.x_scales, 0), cm_tensor(&m, &a.xr_scales, 1);
    a.handle = ep_twin_upload(h->handle, h->handle_bytes);
    moex_status st;
    CM_CALL(c, &m, moex_ep_dispatch_forward, &a, st);
    st = cm_finish(&m, c, st);
    cm_to_host(h->handle, a.handle, h->handle_bytes);
    return st;
}

static moex_status gpu_ep_dispatch_backward(moex_context *c, const moex_ep_dispatch_grad_args *h) {
    if (!h || !h->handle) return moex_ep_dispatch_backward(c, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_ep_dispatch_grad_args a = *h;
    cm_tensor(&m, &a.dxr, 0), cm_tensor(&m, &a.dprobs_r, 0), cm_tensor(&m, &a.dx, 1), cm_tensor(&m, &a.dprobs, 1);
    a.handle = ep_twin_upload(h->handle, h->handle_bytes);
    CM_RUN(c, &m, moex_ep_dispatch_backward, &a);
}

static moex_status gpu_ep_combine_forward(moex_context *c, const moex_ep_combine_args *h) {
    if (!h || !h->handle) return moex_ep_combine_forward(c, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_ep_combine_args a = *h;
    cm_tensor(&m, &a.yr, 0), cm_tensor(&m, &a.y, 1);
    a.handle = ep_twin_upload(h->handle, h->handle_bytes);
    CM_RUN(c, &m, moex_ep_combine_forward, &a);
}

static moex_status gpu_ep_combine_backward(moex_context *c, const moex_ep_combine_grad_args *h) {
    if (!h || !h->handle) return moex_ep_combine_backward(c, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_ep_combine_grad_args a = *h;
    cm_tensor(&m, &a.dy, 0), cm_tensor(&m, &a.dyr, 1);
    a.handle = ep_twin_upload(h->handle, h->handle_bytes);
    CM_RUN(c, &m, moex_ep_combine_backward, &a);
}

/* The layer's tensors as the MoE layer's mirror takes them; `saved` a device twin. */
static void ep_layer_mirror(cm_mirror *m, moex_moe_layer_args *l, int fwd) {
    void *saved = l->saved;
    l->saved = NULL;
    cm_moe_args(m, l, fwd);
    l->saved = ep_twin_upload(saved, l->saved_bytes);
}

static moex_status gpu_ep_layer_forward(moex_context *c, const moex_ep_moe_layer_args *h) {
    if (!h || !h->layer.saved) return moex_ep_moe_layer_forward(c, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_ep_moe_layer_args a = *h;
    ep_layer_mirror(&m, &a.layer, 1);
    cm_tensor(&m, &a.dropped, 1);
    moex_status st;
    CM_CALL(c, &m, moex_ep_moe_layer_forward, &a, st);
    st = cm_finish(&m, c, st);
    cm_to_host(h->layer.saved, a.layer.saved, h->layer.saved_bytes);
    return st;
}

static moex_status gpu_ep_layer_backward(moex_context *c, const moex_ep_moe_layer_grad_args *h) {
    if (!h || !h->layer.fwd.saved) return moex_ep_moe_layer_backward(c, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_ep_moe_layer_grad_args a = *h;
    moex_moe_layer_grad_args *g = &a.layer;
    ep_layer_mirror(&m, &g->fwd, 0);
    cm_tensor(&m, &g->dy, 0), cm_tensor(&m, &g->dx, 1), cm_tensor(&m, &g->drouter_w, 1), cm_weight(&m, &g->dw1, 1);
    cm_weight(&m, &g->dw2, 1), cm_tensor(&m, &g->db1, 1), cm_tensor(&m, &g->db2, 1);
    CM_RUN(c, &m, moex_ep_moe_layer_backward, &a);
}

/* ---- the CPU test, on the GPU --------------------------------------------------------- */

#define EP_COMM_KIND MOEX_EP_COMM_NCCL
#define EP_COMM (&nccl_comm)
#define EP_HOST_MEMORY 0
#define EP_TRANSFERS {MOEX_EP_TRANSFER_CAPACITY, MOEX_EP_TRANSFER_PEER}
#define tu_cpu_context() gpu_ep_context()
#define moex_ep_dispatch_forward(c, a, w, b, s) gpu_ep_dispatch_forward((c), (a))
#define moex_ep_dispatch_backward(c, a, w, b, s) gpu_ep_dispatch_backward((c), (a))
#define moex_ep_combine_forward(c, a, w, b, s) gpu_ep_combine_forward((c), (a))
#define moex_ep_combine_backward(c, a, w, b, s) gpu_ep_combine_backward((c), (a))
#define moex_ep_moe_layer_forward(c, a, w, b, s) gpu_ep_layer_forward((c), (a))
#define moex_ep_moe_layer_backward(c, a, w, b, s) gpu_ep_layer_backward((c), (a))
#define moex_moe_layer_forward(c, a, w, b, s) gpu_moe_forward((c), (a))
#define moex_moe_layer_backward(c, a, w, b, s) gpu_moe_backward((c), (a))
#define main cpu_suite_main
#include "../test_ep.c"
#undef main
#undef tu_cpu_context
#undef moex_ep_dispatch_forward
#undef moex_ep_dispatch_backward
#undef moex_ep_combine_forward
#undef moex_ep_combine_backward
#undef moex_ep_moe_layer_forward
#undef moex_ep_moe_layer_backward
#undef moex_moe_layer_forward
#undef moex_moe_layer_backward

/* ---- checked CUDA and NCCL calls -------------------------------------------------------- */

#define CU(call) cu_ok((call), #call, __FILE__, __LINE__)
static int cu_ok(cudaError_t e, const char *expr, const char *file, int line) {
    return tu_record(e == cudaSuccess, file, line, "%s: %s", expr, cudaGetErrorString(e));
}
#define NC(call) nc_ok((call), #call, __FILE__, __LINE__)
static int nc_ok(ncclResult_t e, const char *expr, const char *file, int line) {
    return tu_record(e == ncclSuccess, file, line, "%s: %s", expr, ncclGetErrorString(e));
}

/* ---- the graph test --------------------------------------------------------------------- */

enum { G_T = 32, G_H = 64, G_K = 2 };
#define G_DT MOEX_DTYPE_BF16

enum { GI_X, GI_IDS, GI_PROBS, GI_DY, GI_N };   /* inputs */
enum { GO_XR, GO_PROBS_R, GO_SPLITS, GO_DROPPED, GO_Y, GO_DYR, GO_DX, GO_DPROBS, GO_N };   /* outputs */
static const char *const go_name[GO_N] = {"xr", "probs_r", "splits", "dropped", "y", "dyr", "dx", "dprobs"};

typedef struct gbuf {
    void *d;
    size_t bytes;
    size_t row_bytes;   /* > 0: [R] expert rows, compared below sum(splits) only */
} gbuf;

typedef struct graph_test {
    moex_ep *ep;
    int64_t E, El, R;
    gbuf in[GI_N], out[GO_N];
    void *handle;
    size_t handle_bytes;
    void *ws[4];
    size_t wsb[4];
    moex_ep_dispatch_args da;
    moex_ep_combine_args ca;
    moex_ep_combine_grad_args cg;
    moex_ep_dispatch_grad_args dg;
} graph_test;

/* One routing of every rank's tokens (the same on every rank: one seed), with values. */
typedef struct gscen {
    const char *name;
    int32_t *ids;       /* [W T, k] */
    float *probs;       /* [W T, k] */
    double *x, *dy;     /* [W T, H], exact in bf16 */
    void *xb, *dyb;     /* this rank's [T, H] in bf16 */
    int64_t *splits;    /* [El]: this rank's expected */
} gscen;

static gscen gscen_make(const char *name, route_kind kind, uint64_t seed, int64_t E, int64_t El) {
    gscen sc;
    const int64_t Tg = (int64_t)W * G_T, k = G_K;
    tu_rng r = tu_rng_seed(seed);
    sc.name = name;
    sc.ids = tu_alloc(sizeof(int32_t) * (size_t)(Tg * k));
    sc.probs = tu_alloc(sizeof(float) * (size_t)(Tg * k));
    sc.x = tu_doubles(Tg * G_H), sc.dy = tu_doubles(Tg * G_H);
    tu_fill_uniform(&r, sc.x, Tg * G_H, -1, 1, G_DT);
    tu_fill_uniform(&r, sc.dy, Tg * G_H, -1, 1, G_DT);
    /* k distinct experts per token: RANDOM from all E; ONE_EXPERT: slot 0 is E-1, the others
     * from [0, E-1); RANK0: from rank 0's [0, El) */
    int32_t *pool = tu_alloc(sizeof(int32_t) * (size_t)E);
    for (int64_t t = 0; t < Tg; t++) {
        const int64_t first = kind == ROUTE_ONE_EXPERT ? 1 : 0;
        const int64_t span = kind == ROUTE_RANK0 ? El : kind == ROUTE_ONE_EXPERT ? E - 1 : E;
        for (int64_t e = 0; e < span; e++) pool[e] = (int32_t)e;
        if (first) sc.ids[t * k] = (int32_t)(E - 1);
        for (int64_t j = first; j < k; j++) {
            const int64_t i = j - first, pick = i + tu_randint(&r, span - i);
            const int32_t tmp = pool[i];
            pool[i] = pool[pick], pool[pick] = tmp;
            sc.ids[t * k + j] = pool[i];
        }
        for (int64_t j = 0; j < k; j++) sc.probs[t * k + j] = (float)tu_uniform(&r);
    }
    free(pool);
    sc.splits = tu_zalloc(sizeof(int64_t) * (size_t)El);
    for (int64_t i = 0; i < Tg * k; i++)
        if (sc.ids[i] / El == me) sc.splits[sc.ids[i] - me * El]++;
    sc.xb = tu_buffer(G_DT, sc.x + (int64_t)me * G_T * G_H, G_T * G_H);
    sc.dyb = tu_buffer(G_DT, sc.dy + (int64_t)me * G_T * G_H, G_T * G_H);
    return sc;
}

static void gscen_free(gscen *sc) {
    free(sc->ids), free(sc->probs), free(sc->x), free(sc->dy), free(sc->xb), free(sc->dyb), free(sc->splits);
}

/* The four calls, in order, on s (eager or captured); the first failure is returned. */
static moex_status graph_calls(graph_test *G, cudaStream_t s) {
    const moex_stream st = (moex_stream)s;
    moex_status r;
    if ((r = moex_ep_dispatch_forward(ctx, &G->da, G->ws[0], G->wsb[0], st)) != MOEX_OK) return r;
    if ((r = moex_ep_combine_forward(ctx, &G->ca, G->ws[1], G->wsb[1], st)) != MOEX_OK) return r;
    if ((r = moex_ep_combine_backward(ctx, &G->cg, G->ws[2], G->wsb[2], st)) != MOEX_OK) return r;
    return moex_ep_dispatch_backward(ctx, &G->dg, G->ws[3], G->wsb[3], st);
}

/* Writes a routing's inputs into the device buffers (on s, outside any graph). */
static void graph_upload(graph_test *G, const gscen *sc, cudaStream_t s) {
    const int64_t k = G_K, t0 = (int64_t)me * G_T;
    CU(cudaMemcpyAsync(G->in[GI_X].d, sc->xb, G->in[GI_X].bytes, cudaMemcpyHostToDevice, s));
    CU(cudaMemcpyAsync(G->in[GI_IDS].d, sc->ids + t0 * k, G->in[GI_IDS].bytes, cudaMemcpyHostToDevice, s));
    CU(cudaMemcpyAsync(G->in[GI_PROBS].d, sc->probs + t0 * k, G->in[GI_PROBS].bytes, cudaMemcpyHostToDevice, s));
    CU(cudaMemcpyAsync(G->in[GI_DY].d, sc->dyb, G->in[GI_DY].bytes, cudaMemcpyHostToDevice, s));
    CU(cudaStreamSynchronize(s));
}

/* Every output and the handle poisoned (0xFF bytes), on s. */
static void graph_poison(graph_test *G, cudaStream_t s) {
    for (int i = 0; i < GO_N; i++) CU(cudaMemsetAsync(G->out[i].d, 0xFF, G->out[i].bytes, s));
    CU(cudaMemsetAsync(G->handle, 0xFF, G->handle_bytes, s));
}

/* The outputs, on the host (out[i] of G->out[i].bytes each). */
static void graph_download(graph_test *G, cudaStream_t s, void *out[GO_N]) {
    for (int i = 0; i < GO_N; i++) {
        out[i] = tu_alloc(G->out[i].bytes);
        CU(cudaMemcpyAsync(out[i], G->out[i].d, G->out[i].bytes, cudaMemcpyDeviceToHost, s));
    }
    CU(cudaStreamSynchronize(s));
}

static void graph_free_outputs(void *out[GO_N]) {
    for (int i = 0; i < GO_N; i++) free(out[i]), out[i] = NULL;
}

/* One run's outputs against the host: splits, no drops, y = k x and dx = k dy within 2%
 * (every row of a token is a copy of its row), dprobs = probs exactly. */
static void graph_check_host(const graph_test *G, const gscen *sc, const char *run, void *out[GO_N]) {
    const int64_t k = G_K, t0 = (int64_t)me * G_T, n = G_T * G_H;
    const int64_t *splits = out[GO_SPLITS], dropped = *(const int64_t *)out[GO_DROPPED];
    int64_t bad = 0;
    for (int64_t e = 0; e < G->El; e++) bad += splits[e] != sc->splits[e];
    CHECK_MSG(bad == 0, "graph %s, %s: %lld of %lld splits are not the routing's", sc->name, run, (long long)bad,
              (long long)G->El);
    CHECK_MSG(dropped == 0, "graph %s, %s: dropped %lld rows (R holds every row)", sc->name, run, (long long)dropped);
    const double *src[2] = {sc->x + t0 * G_H, sc->dy + t0 * G_H};
    const void *got[2] = {out[GO_Y], out[GO_DX]};
    const char *what[2] = {"y (= k x)", "dx (= k dy)"};
    for (int w = 0; w < 2; w++) {
        double *v = tu_read(G_DT, got[w], n), worst = 0;
        int64_t nbad = 0, at = 0;
        for (int64_t i = 0; i < n; i++) {
            const double want = (double)k * src[w][i], err = fabs(v[i] - want);
            if (!(err <= 0.02 * fabs(want))) {
                if (nbad++ == 0 || err > worst) worst = isfinite(err) ? err : INFINITY, at = i;
            }
        }
        CHECK_MSG(nbad == 0, "graph %s, %s: %s: %lld of %lld elements off by more than 2%% (worst [%lld, %lld]: %g, "
                  "want %g)", sc->name, run, what[w], (long long)nbad, (long long)n, (long long)(at / G_H),
                  (long long)(at % G_H), v[at], (double)k * src[w][at]);
        free(v);
    }
    const float *dprobs = out[GO_DPROBS];
    bad = 0;
    for (int64_t i = 0; i < G_T * k; i++) bad += memcmp(&dprobs[i], &sc->probs[t0 * k + i], sizeof(float)) != 0;
    CHECK_MSG(bad == 0, "graph %s, %s: %lld dprobs are not their slot's prob", sc->name, run, (long long)bad);
}

/* The replay's outputs bitwise the eager calls' (expert rows below sum(splits) only). */
static void graph_compare(const graph_test *G, const gscen *sc, void *eager[GO_N], void *replay[GO_N]) {
    int64_t rows = 0;
    for (int64_t e = 0; e < G->El; e++) rows += ((const int64_t *)eager[GO_SPLITS])[e];
    rows = rows < 0 ? 0 : rows > G->R ? G->R : rows;
    for (int i = 0; i < GO_N; i++) {
        const size_t bytes = G->out[i].row_bytes ? (size_t)rows * G->out[i].row_bytes : G->out[i].bytes;
        const unsigned char *a = eager[i], *b = replay[i];
        size_t first = bytes;
        for (size_t j = 0; j < bytes && first == bytes; j++)
            if (a[j] != b[j]) first = j;
        CHECK_MSG(first == bytes, "graph %s: %s of the replay differs from the eager calls' (first at byte %zu of %zu)",
                  sc->name, go_name[i], first, bytes);
    }
}

/* Eager, then a replay (each with outputs and handle poisoned first), checked. */
static void graph_scenario(graph_test *G, const gscen *sc, cudaGraphExec_t exec, cudaStream_t s) {
    void *eager[GO_N] = {0}, *replay[GO_N] = {0};
    graph_upload(G, sc, s);
    graph_poison(G, s);
    CHECK_STATUS(ctx, graph_calls(G, s), MOEX_OK);
    CU(cudaStreamSynchronize(s));
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, (moex_stream)s), MOEX_OK);
    graph_download(G, s, eager);
    graph_check_host(G, sc, "eager", eager);
    if (exec) {
        graph_poison(G, s);
        CU(cudaGraphLaunch(exec, s));
        CU(cudaStreamSynchronize(s));
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, (moex_stream)s), MOEX_OK);
        graph_download(G, s, replay);
        graph_check_host(G, sc, "replay", replay);
        graph_compare(G, sc, eager, replay);
        graph_free_outputs(replay);
    }
    graph_free_outputs(eager);
    tu_log("graph %s: rank %d checked\n", sc->name, me);
}

static void *graph_malloc(size_t bytes, int *ok) {
    void *p = NULL;
    if (!CU(cudaMalloc(&p, bytes ? bytes : 1))) *ok = 0, p = NULL;
    return p;
}

/* Returns whether every rank set `ok`. */
static int all_ranks(int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
    return all;
}

static void run_graph_test(moex_ep_transfer transfer) {
    graph_test G;
    memset(&G, 0, sizeof G);
    const int64_t T = G_T, H = G_H, k = G_K;
    G.E = 4 * (int64_t)W, G.El = G.E / W, G.R = T * k * W;
    const size_t es = moex_dtype_size(G_DT);
    moex_ep_config cfg = {.comm_kind = MOEX_EP_COMM_NCCL, .comm = &nccl_comm, .num_experts = (int32_t)G.E,
                          .topk = (int32_t)k, .hidden = H, .dtype = G_DT, .max_tokens = T, .max_recv_rows = G.R,
                          .transfer = transfer};
    int ok = CHECK_STATUS(ctx, moex_ep_create(&G.ep, ctx, &cfg), MOEX_OK) && G.ep;
    moex_ep_info info;
    memset(&info, 0, sizeof info);
    if (ok) ok = CHECK_STATUS(ctx, moex_ep_get_info(G.ep, &info), MOEX_OK);
    if (ok) {
        CHECK_EQ_I64(info.world, W);
        CHECK_EQ_I64(info.rank, me);
        CHECK_EQ_I64(info.local_experts, G.El);
        CHECK(info.transfer == transfer);
        G.handle_bytes = info.handle_bytes;
    }
    const size_t in_bytes[GI_N] = {(size_t)(T * H) * es, sizeof(int32_t) * (size_t)(T * k),
                                   sizeof(float) * (size_t)(T * k), (size_t)(T * H) * es};
    const size_t out_bytes[GO_N] = {(size_t)(G.R * H) * es, sizeof(float) * (size_t)G.R,
                                    sizeof(int64_t) * (size_t)G.El, sizeof(int64_t), (size_t)(T * H) * es,
                                    (size_t)(G.R * H) * es, (size_t)(T * H) * es, sizeof(float) * (size_t)(T * k)};
    const size_t out_rows[GO_N] = {(size_t)H * es, sizeof(float), 0, 0, 0, (size_t)H * es, 0, 0};
    for (int i = 0; i < GI_N && ok; i++) G.in[i].bytes = in_bytes[i], G.in[i].d = graph_malloc(in_bytes[i], &ok);
    for (int i = 0; i < GO_N && ok; i++) {
        G.out[i].bytes = out_bytes[i], G.out[i].row_bytes = out_rows[i];
        G.out[i].d = graph_malloc(out_bytes[i], &ok);
    }
    if (ok) G.handle = graph_malloc(G.handle_bytes, &ok);

    G.da = (moex_ep_dispatch_args){.ep = G.ep, .x = moex_tensor_2d(G.in[GI_X].d, G_DT, T, H),
                                   .ids = moex_tensor_2d(G.in[GI_IDS].d, MOEX_DTYPE_I32, T, k),
                                   .probs = moex_tensor_2d(G.in[GI_PROBS].d, MOEX_DTYPE_F32, T, k),
                                   .handle = G.handle, .handle_bytes = G.handle_bytes,
                                   .xr = moex_tensor_2d(G.out[GO_XR].d, G_DT, G.R, H),
                                   .probs_r = moex_tensor_1d(G.out[GO_PROBS_R].d, MOEX_DTYPE_F32, G.R),
                                   .splits = moex_tensor_1d(G.out[GO_SPLITS].d, MOEX_DTYPE_I64, G.El),
                                   .dropped = moex_tensor_1d(G.out[GO_DROPPED].d, MOEX_DTYPE_I64, 1)};
    G.ca = (moex_ep_combine_args){.ep = G.ep, .handle = G.handle, .handle_bytes = G.handle_bytes,
                                  .yr = G.da.xr, .y = moex_tensor_2d(G.out[GO_Y].d, G_DT, T, H)};
    G.cg = (moex_ep_combine_grad_args){.ep = G.ep, .handle = G.handle, .handle_bytes = G.handle_bytes,
                                       .dy = moex_tensor_2d(G.in[GI_DY].d, G_DT, T, H),
                                       .dyr = moex_tensor_2d(G.out[GO_DYR].d, G_DT, G.R, H)};
    G.dg = (moex_ep_dispatch_grad_args){.ep = G.ep, .handle = G.handle, .handle_bytes = G.handle_bytes,
                                        .dxr = G.cg.dyr, .dprobs_r = G.da.probs_r,
                                        .dx = moex_tensor_2d(G.out[GO_DX].d, G_DT, T, H),
                                        .dprobs = moex_tensor_2d(G.out[GO_DPROBS].d, MOEX_DTYPE_F32, T, k)};
    if (ok) ok = CHECK_STATUS(ctx, moex_ep_dispatch_forward_workspace_size(ctx, &G.da, &G.wsb[0]), MOEX_OK);
    if (ok) ok = CHECK_STATUS(ctx, moex_ep_combine_forward_workspace_size(ctx, &G.ca, &G.wsb[1]), MOEX_OK);
    if (ok) ok = CHECK_STATUS(ctx, moex_ep_combine_backward_workspace_size(ctx, &G.cg, &G.wsb[2]), MOEX_OK);
    if (ok) ok = CHECK_STATUS(ctx, moex_ep_dispatch_backward_workspace_size(ctx, &G.dg, &G.wsb[3]), MOEX_OK);
    for (int i = 0; i < 4 && ok; i++)
        if (G.wsb[i]) G.ws[i] = graph_malloc(G.wsb[i], &ok);
    cudaStream_t s = NULL;
    if (ok) ok = CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* every rank makes the same collective calls, or none */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (all_ranks(ok)) {
        /* eager, before any capture (the first calls may set up NCCL's connections) */
        gscen warm = gscen_make("warm-up (random)", ROUTE_RANDOM, 0x6EA, G.E, G.El);
        graph_scenario(&G, &warm, NULL, s);
        gscen_free(&warm);

        /* one capture of the four calls */
        int captured = CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        if (captured) {
            const moex_status st = graph_calls(&G, s);
            if (!CU(cudaStreamEndCapture(s, &graph))) graph = NULL, captured = 0;
            if (!CHECK_STATUS(ctx, st, MOEX_OK)) captured = 0;
        }
        if (captured && !CU(cudaGraphInstantiate(&exec, graph, 0))) exec = NULL, captured = 0;
        (void)cudaGetLastError();   /* a failed capture leaves no sticky error to later checks */

        if (all_ranks(captured)) {
            gscen sc[3] = {gscen_make("random experts", ROUTE_RANDOM, 0x6EB, G.E, G.El),
                           gscen_make("every token to expert E-1", ROUTE_ONE_EXPERT, 0x6EC, G.E, G.El),
                           gscen_make("every expert on rank 0", ROUTE_RANK0, 0x6ED, G.E, G.El)};
            for (int i = 0; i < 3; i++) {
                graph_scenario(&G, &sc[i], exec, s);
                gscen_free(&sc[i]);
            }
        } else {
            CHECK_MSG(0, "graph: the capture failed on some rank: no replays");
        }
    } else {
        CHECK_MSG(0, "graph: setup failed on some rank: no graph test");
    }

    if (exec) CU(cudaGraphExecDestroy(exec));
    if (graph) CU(cudaGraphDestroy(graph));
    if (s) CU(cudaStreamDestroy(s));
    for (int i = 0; i < GI_N; i++) cudaFree(G.in[i].d);
    for (int i = 0; i < GO_N; i++) cudaFree(G.out[i].d);
    for (int i = 0; i < 4; i++) cudaFree(G.ws[i]);
    cudaFree(G.handle);
    moex_ep_destroy(G.ep);
}

/* ---- main ------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    comm = MPI_COMM_WORLD;
    MPI_Comm_size(comm, &W);
    MPI_Comm_rank(comm, &me);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: skipped\n");
        MPI_Finalize();
        return 77;
    }
    int ok = CU(cudaSetDevice(me % ndev));
    /* rank 0's NCCL id (and whether it has one) to every rank */
    struct {
        ncclUniqueId id;
        int ok;
    } uid;
    memset(&uid, 0, sizeof uid);
    if (me == 0) uid.ok = NC(ncclGetUniqueId(&uid.id));
    MPI_Bcast(&uid, (int)sizeof uid, MPI_BYTE, 0, comm);
    ok = all_ranks(ok && uid.ok);
    if (ok) ok = all_ranks(NC(ncclCommInitRank(&nccl_comm, W, uid.id, me)));
    if (!ok) {
        CHECK_MSG(0, "NCCL communicator: not created on every rank");
        const int rc = tu_finish();
        MPI_Finalize();
        return rc;
    }
    ctx = gpu_ep_context();
    run_graph_test(MOEX_EP_TRANSFER_CAPACITY);   /* first: run_suite's tu_finish counts its checks */
    run_graph_test(MOEX_EP_TRANSFER_PEER);
    int rc = run_suite();
    moex_context_destroy(ctx);
    ep_twins_free();
    const ncclResult_t nr = ncclCommDestroy(nccl_comm);   /* after tu_finish: reported here */
    if (nr != ncclSuccess) {
        fprintf(stderr, "test: ncclCommDestroy: %s\n", ncclGetErrorString(nr));
        rc = rc ? rc : 1;
    }
    MPI_Finalize();
    return rc;
}
