/*
 * ep_bench.c - expert parallelism on NVIDIA GPUs over NCCL: moex's EP dispatch forward and
 * combine forward (moex.h, "Expert parallelism"), eager and captured in one CUDA graph, and the
 * NCCL baselines they are measured against (the all-to-all and point-to-point bandwidth of the
 * same GPUs). One MPI process per GPU; bench/ep_torch.py is the torch.distributed baseline on
 * the same routing.
 *
 * Build (CUDA backend with NCCL; libmoex.so in build/; NCCL from the nvidia-nccl wheel):
 *   NCCL=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')
 *   mkdir -p build/bench && mpicc -std=c11 -O2 -Wall -Wextra -Iinclude -I/usr/local/cuda/include \
 *       -I$NCCL/include bench/ep_bench.c -o build/bench/ep_bench -Lbuild -lmoex \
 *       -L/usr/local/cuda/lib64 -lcudart $NCCL/lib/libnccl.so.2 \
 *       -Wl,-rpath,$PWD/build:/usr/local/cuda/lib64:$NCCL/lib
 *   or through CMake (configured with the CUDA backend, NCCL and MPI found):
 *   cmake --build build --target moex_ep_bench   (the binary: build/bench/moex_ep_bench)
 * Run (N = 2, 4 or 8; bench/ep_torch.py in the same device call):
 *   mpirun --allow-run-as-root -np 4 --bind-to none --mca pml ob1 --mca btl self,vader \
 *       --mca btl_vader_single_copy_mechanism none -x NCCL_NVLS_ENABLE=0 \
 *       build/bench/ep_bench [--tokens T] [--transfer auto|capacity|peer] [--iters 20] [--warmup 5]
 *       [--a2a-mib 256] [--no-graph]
 *
 * Problem (every rank): E = 256 experts over the N ranks, k = 8, H = 7168, bf16, T = 4096
 * tokens per rank (max_tokens = T), max_recv_rows R = 2 T k (a balanced routing drops
 * nothing; the `dropped` output is printed to show it). Routing: each token picks k distinct
 * experts uniformly at random and k probs uniform in [0, 1), from splitmix64 seeded with
 * SEED_BASE + rank (bench/ep_torch.py draws the same numbers in the same order, so both
 * programs route identically); x is random bf16 in [-0.25, 0.25) (never zeros).
 *
 * Timing: CUDA events around one op on the bench's stream; before each of `warmup` + `iters`
 * repetitions the stream is synchronised and the ranks meet at an MPI_Barrier. Each rank takes
 * the median of its `iters` timings; the reported time is the largest median over the ranks.
 *
 * Bytes, counted as DeepEP counts them: a token's row travels once to each rank holding one of
 * its experts, its own rank included: pairs = the (token, destination rank) pairs of a rank's
 * own routing; bytes = pairs * H * 2. The combine moves the same rows back, the same bytes.
 * GBps = (mean of bytes over the ranks) / (the reported time). link_GBps counts only the pairs
 * whose destination is another rank (what crosses NVLink). The CAPACITY transfer moves
 * N * T wire rows per rank per exchange whatever the routing (padding included); that line is
 * printed from the wire-row layout of src/core/ep.h (H * 2 + 8 k bytes, rounded up to 16).
 *
 * Checks, once per run (PASS / FAIL; the program exits 1 on a FAIL): dropped == 0; splits ==
 * this rank's local experts' slot counts summed over every rank's routing; with yr = xr the
 * combine gives y[t] = k x[t] (each rank sums its rows of t and rounds to bf16, the token's
 * rank sums those: only rounding), max relative error < 5e-2, after the eager calls and again
 * after a graph replay into a y poisoned with NaNs.
 *
 * Output: tables on rank 0, then one line per measurement:
 *   EPBENCH impl=moex-peer|moex-capacity|moex-peer-graph|moex-capacity-graph|nccl op=... N= T= H= k= E= us= GBps= link_GBps=
 */
#include "moex.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { E = 256, K = 8, H = 7168 };
static const uint64_t SEED_BASE = 0x5EED0000u;
static const double TOL = 5e-2;

static int g_rank;
static moex_context *g_ctx;
static ncclComm_t g_nccl;

#define FAIL_AT(what, msg)                                                                        \
    do {                                                                                          \
        fprintf(stderr, "ep_bench rank %d: %s:%d: %s: %s\n", g_rank, __FILE__, __LINE__, what, msg); \
        fflush(stderr);                                                                           \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                             \
    } while (0)
#define CHECK_CUDA(x)                                                                             \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) FAIL_AT(#x, cudaGetErrorString(e_));                               \
    } while (0)
#define CHECK_NCCL(x)                                                                             \
    do {                                                                                          \
        ncclResult_t r_ = (x);                                                                    \
        if (r_ != ncclSuccess) {                                                                  \
            fprintf(stderr, "ep_bench rank %d: NCCL last error: %s\n", g_rank,                    \
                    ncclGetLastError(g_nccl));                                                    \
            FAIL_AT(#x, ncclGetErrorString(r_));                                                  \
        }                                                                                         \
    } while (0)
#define CHECK_MPI(x)                                                                              \
    do {                                                                                          \
        int m_ = (x);                                                                             \
        if (m_ != MPI_SUCCESS) {                                                                  \
            char s_[MPI_MAX_ERROR_STRING];                                                        \
            int n_ = 0;                                                                           \
            MPI_Error_string(m_, s_, &n_);                                                        \
            FAIL_AT(#x, s_);                                                                      \
        }                                                                                         \
    } while (0)
#define CHECK_MOEX(x)                                                                             \
    do {                                                                                          \
        moex_status s_ = (x);                                                                     \
        if (s_ != MOEX_OK) {                                                                      \
            fprintf(stderr, "ep_bench rank %d: %s\n", g_rank, moex_status_string(s_));            \
            FAIL_AT(#x, moex_last_error(g_ctx));                                                  \
        }                                                                                         \
    } while (0)

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) FAIL_AT("malloc", "out of host memory");
    return p;
}

static void *dev_alloc(size_t bytes) {
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes));
    return d;
}

/* The routing generator, shared with bench/ep_torch.py: splitmix64. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ids [T, k] and probs [T, k] of one rank: per token, k distinct experts ((z >> 32) % E,
 * redrawn on a repeat), then k probs ((z >> 40) / 2^24). */
static void make_routing(int rank, int64_t T, int32_t *ids, float *probs) {
    uint64_t s = SEED_BASE + (uint64_t)rank;
    for (int64_t t = 0; t < T; t++) {
        int32_t *row = ids + t * K;
        for (int j = 0; j < K;) {
            const int32_t e = (int32_t)((splitmix64(&s) >> 32) % (uint64_t)E);
            int seen = 0;
            for (int i = 0; i < j; i++) seen |= row[i] == e;
            if (!seen) row[j++] = e;
        }
        for (int j = 0; j < K; j++) probs[t * K + j] = (float)(splitmix64(&s) >> 40) * (1.0f / 16777216.0f);
    }
}

static uint16_t f32_to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* ---- timing --------------------------------------------------------------------------- */

typedef void (*op_fn)(void *state, cudaStream_t s);

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The largest over the ranks of each rank's median time (us) of `op` (collective). */
static double time_op(op_fn op, void *state, cudaStream_t s, int warmup, int iters) {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    float *ms = xmalloc(sizeof(float) * (size_t)iters);
    for (int i = 0; i < warmup + iters; i++) {
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        CHECK_CUDA(cudaEventRecord(a, s));
        op(state, s);
        CHECK_CUDA(cudaEventRecord(b, s));
        CHECK_CUDA(cudaEventSynchronize(b));
        if (i >= warmup) CHECK_CUDA(cudaEventElapsedTime(&ms[i - warmup], a, b));
    }
    CHECK_CUDA(cudaGetLastError());
    qsort(ms, (size_t)iters, sizeof(float), cmp_float);
    const double med = iters % 2 ? ms[iters / 2] : 0.5 * ((double)ms[iters / 2 - 1] + ms[iters / 2]);
    double us = med * 1e3, worst = 0;
    CHECK_MPI(MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    free(ms);
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    return worst;
}

/* ---- the NCCL baselines ----------------------------------------------------------------- */

typedef struct nccl_state {
    char *snd, *rcv;
    size_t chunk;          /* bytes to each peer (all-to-all) or to the partner (p2p) */
    int world, partner;
} nccl_state;

/* ncclAllToAll's equivalent: `chunk` bytes to every rank, self included. */
static void op_alltoall(void *st, cudaStream_t s) {
    nccl_state *n = st;
    CHECK_NCCL(ncclGroupStart());
    for (int p = 0; p < n->world; p++) {
        CHECK_NCCL(ncclSend(n->snd + (size_t)p * n->chunk, n->chunk, ncclInt8, p, g_nccl, s));
        CHECK_NCCL(ncclRecv(n->rcv + (size_t)p * n->chunk, n->chunk, ncclInt8, p, g_nccl, s));
    }
    CHECK_NCCL(ncclGroupEnd());
}

/* `chunk` bytes each way between this rank and its partner (rank ^ 1). */
static void op_p2p(void *st, cudaStream_t s) {
    nccl_state *n = st;
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(n->snd, n->chunk, ncclInt8, n->partner, g_nccl, s));
    CHECK_NCCL(ncclRecv(n->rcv, n->chunk, ncclInt8, n->partner, g_nccl, s));
    CHECK_NCCL(ncclGroupEnd());
}

/* ---- the moex calls ------------------------------------------------------------------- */

typedef struct ep_state {
    moex_ep_dispatch_args d;
    moex_ep_combine_args c;
    void *ws;
    size_t ws_bytes;
    cudaGraphExec_t graph;
} ep_state;

static void op_dispatch(void *st, cudaStream_t s) {
    ep_state *e = st;
    CHECK_MOEX(moex_ep_dispatch_forward(g_ctx, &e->d, e->ws, e->ws_bytes, s));
}
static void op_combine(void *st, cudaStream_t s) {
    ep_state *e = st;
    CHECK_MOEX(moex_ep_combine_forward(g_ctx, &e->c, e->ws, e->ws_bytes, s));
}
static void op_both(void *st, cudaStream_t s) {
    op_dispatch(st, s);
    op_combine(st, s);
}
static void op_graph(void *st, cudaStream_t s) {
    CHECK_CUDA(cudaGraphLaunch(((ep_state *)st)->graph, s));
}

/* ---- checks --------------------------------------------------------------------------- */

/* Over all ranks: 1 when y == k x within TOL (relative, per element); *maxerr the largest
 * relative error (inf for a NaN). */
static int check_y(const uint16_t *hx, const void *dy, uint16_t *hy, int64_t T, double *maxerr) {
    CHECK_CUDA(cudaMemcpy(hy, dy, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int64_t i = 0; i < T * H; i++) {
        const double ref = (double)K * bf16_to_f32(hx[i]), got = bf16_to_f32(hy[i]);
        double err = ref != 0 ? fabs(got - ref) / fabs(ref) : fabs(got);
        if (isnan(err)) err = INFINITY;
        if (err > worst) worst = err;
    }
    CHECK_MPI(MPI_Allreduce(&worst, maxerr, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return *maxerr < TOL;
}

static const char *pass(int ok) { return ok ? "PASS" : "FAIL"; }

static void report(int N, int64_t T, const char *impl, const char *op, double us, double bytes,
                   double link_bytes) {
    if (g_rank != 0) return;
    printf("EPBENCH impl=%s op=%s N=%d T=%lld H=%d k=%d E=%d us=%.1f GBps=%.1f link_GBps=%.1f\n", impl, op, N,
           (long long)T, H, K, E, us, bytes / (us * 1e3), link_bytes / (us * 1e3));
    fflush(stdout);
}

static void usage(void) {
    fprintf(stderr, "usage: ep_bench [--tokens T] [--transfer auto|capacity|peer] [--iters N] [--warmup N] "
                    "[--a2a-mib M] [--no-graph]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv) {
    CHECK_MPI(MPI_Init(&argc, &argv));
    int N = 0;
    CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &N));

    int64_t T = 4096;
    int iters = 20, warmup = 5, graph = 1;
    long a2a_mib = 256;
    moex_ep_transfer transfer = MOEX_EP_TRANSFER_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--no-graph")) {
            graph = 0;
        } else if (!v) {
            usage();
        } else if (!strcmp(argv[i], "--tokens")) {
            T = strtoll(v, NULL, 10), i++;
        } else if (!strcmp(argv[i], "--iters")) {
            iters = atoi(v), i++;
        } else if (!strcmp(argv[i], "--warmup")) {
            warmup = atoi(v), i++;
        } else if (!strcmp(argv[i], "--a2a-mib")) {
            a2a_mib = strtol(v, NULL, 10), i++;
        } else if (!strcmp(argv[i], "--transfer")) {
            if (!strcmp(v, "auto")) transfer = MOEX_EP_TRANSFER_AUTO;
            else if (!strcmp(v, "capacity")) transfer = MOEX_EP_TRANSFER_CAPACITY;
            else if (!strcmp(v, "peer")) transfer = MOEX_EP_TRANSFER_PEER;
            else usage();
            i++;
        } else {
            usage();
        }
    }
    if (T < 1 || iters < 1 || warmup < 0 || a2a_mib < 1 || E % N != 0) usage();

    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    const int dev = g_rank % ndev;
    CHECK_CUDA(cudaSetDevice(dev));
    ncclUniqueId id;
    if (g_rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    CHECK_NCCL(ncclCommInitRank(&g_nccl, N, id, g_rank));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (g_rank == 0) {
        struct cudaDeviceProp prop;
        CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
        int nv = 0;
        CHECK_NCCL(ncclGetVersion(&nv));
        printf("ep_bench: N=%d ranks on %d visible GPUs (%s), NCCL %d, moex %s; T=%lld H=%d k=%d E=%d bf16, "
               "median of %d after %d warm-ups, max over ranks\n",
               N, ndev, prop.name, nv, moex_version_string(), (long long)T, H, K, E, iters, warmup);
        fflush(stdout);
    }

    /* ---- NCCL baselines ---- */
    {
        nccl_state n = {0};
        const size_t total = (size_t)a2a_mib << 20;
        n.world = N, n.partner = g_rank ^ 1;
        n.snd = dev_alloc(total), n.rcv = dev_alloc(total);
        CHECK_CUDA(cudaMemset(n.snd, 0x5a, total));
        CHECK_CUDA(cudaMemset(n.rcv, 0, total));
        n.chunk = total / (size_t)N;
        const double a2a_us = time_op(op_alltoall, &n, s, warmup, iters);
        const double a2a_bytes = (double)n.chunk * (N - 1);
        double p2p_us = 0;
        n.chunk = total;
        const int paired = n.partner < N;
        int all_paired = 0;
        CHECK_MPI(MPI_Allreduce(&paired, &all_paired, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
        if (all_paired) p2p_us = time_op(op_p2p, &n, s, warmup, iters);
        if (g_rank == 0) {
            printf("\nNCCL baselines (bytes to other ranks / time, per rank):\n");
            printf("  achievable all-to-all bandwidth: %ld MiB per rank in %d equal chunks: %.1f us, %.1f GB/s\n",
                   a2a_mib, N, a2a_us, a2a_bytes / (a2a_us * 1e3));
            if (all_paired)
                printf("  p2p bandwidth (rank r <-> r^1, both ways at once): %ld MiB each way: %.1f us, %.1f GB/s\n",
                       a2a_mib, p2p_us, (double)total / (p2p_us * 1e3));
        }
        report(N, T, "nccl", "alltoall", a2a_us, a2a_bytes, a2a_bytes);
        if (all_paired) report(N, T, "nccl", "p2p", p2p_us, (double)total, (double)total);
        CHECK_CUDA(cudaFree(n.snd));
        CHECK_CUDA(cudaFree(n.rcv));
    }

    /* ---- the EP context ---- */
    CHECK_MOEX(moex_context_create(&g_ctx, MOEX_BACKEND_CUDA, dev));
    const int64_t R = 2 * T * K;
    const moex_ep_config cfg = {.comm_kind = MOEX_EP_COMM_NCCL, .comm = &g_nccl, .num_experts = E, .topk = K,
                                .hidden = H, .dtype = MOEX_DTYPE_BF16, .max_tokens = T, .max_recv_rows = R,
                                .transfer = transfer};
    moex_ep *ep = NULL;
    CHECK_MOEX(moex_ep_create(&ep, g_ctx, &cfg));
    moex_ep_info info;
    CHECK_MOEX(moex_ep_get_info(ep, &info));
    if (info.rank != g_rank || info.world != N) FAIL_AT("moex_ep_get_info", "rank or world differ from MPI's");
    const int El = info.local_experts;

    /* ---- inputs ---- */
    int32_t *hids = xmalloc(sizeof(int32_t) * (size_t)(T * K));
    float *hprobs = xmalloc(sizeof(float) * (size_t)(T * K));
    make_routing(g_rank, T, hids, hprobs);
    uint16_t *hx = xmalloc((size_t)T * H * 2), *hy = xmalloc((size_t)T * H * 2);
    {
        uint32_t seed = 1u + 7919u * (uint32_t)g_rank;
        for (int64_t i = 0; i < T * H; i++) {
            seed = seed * 1664525u + 1013904223u;
            hx[i] = f32_to_bf16(((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.5f);
        }
    }
    /* bytes (DeepEP's count) from this rank's routing, and the expected splits of every rank */
    int64_t pairs = 0, remote_pairs = 0;
    int64_t *slots_per_expert = calloc(E, sizeof(int64_t)), *want_splits = xmalloc(sizeof(int64_t) * (size_t)El);
    if (!slots_per_expert) FAIL_AT("calloc", "out of host memory");
    for (int64_t t = 0; t < T; t++) {
        unsigned char hit[E] = {0};
        for (int j = 0; j < K; j++) {
            const int32_t e = hids[t * K + j];
            slots_per_expert[e]++;
            hit[e / El] = 1;
        }
        for (int r = 0; r < N; r++) pairs += hit[r], remote_pairs += hit[r] && r != g_rank;
    }
    CHECK_MPI(MPI_Reduce_scatter_block(slots_per_expert, want_splits, El, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    int64_t sums[2] = {pairs, remote_pairs}, totals[2] = {0, 0};
    CHECK_MPI(MPI_Allreduce(sums, totals, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    const double row_bytes = (double)H * 2;
    const double bytes = row_bytes * (double)totals[0] / N, link_bytes = row_bytes * (double)totals[1] / N;

    void *dx = dev_alloc((size_t)T * H * 2), *dy = dev_alloc((size_t)T * H * 2);
    int32_t *dids = dev_alloc(sizeof(int32_t) * (size_t)(T * K));
    float *dprobs = dev_alloc(sizeof(float) * (size_t)(T * K));
    void *dxr = dev_alloc((size_t)R * H * 2);
    float *dprobs_r = dev_alloc(sizeof(float) * (size_t)R);
    int64_t *dsplits = dev_alloc(sizeof(int64_t) * (size_t)El), *ddropped = dev_alloc(sizeof(int64_t));
    void *handle = dev_alloc(info.handle_bytes);
    CHECK_CUDA(cudaMemcpy(dx, hx, (size_t)T * H * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dids, hids, sizeof(int32_t) * (size_t)(T * K), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dprobs, hprobs, sizeof(float) * (size_t)(T * K), cudaMemcpyHostToDevice));

    ep_state st = {0};
    st.d = (moex_ep_dispatch_args){.ep = ep, .x = moex_tensor_2d(dx, MOEX_DTYPE_BF16, T, H),
                                   .ids = moex_tensor_2d(dids, MOEX_DTYPE_I32, T, K),
                                   .probs = moex_tensor_2d(dprobs, MOEX_DTYPE_F32, T, K), .handle = handle,
                                   .handle_bytes = info.handle_bytes,
                                   .xr = moex_tensor_2d(dxr, MOEX_DTYPE_BF16, R, H),
                                   .probs_r = moex_tensor_1d(dprobs_r, MOEX_DTYPE_F32, R),
                                   .splits = moex_tensor_1d(dsplits, MOEX_DTYPE_I64, El),
                                   .dropped = moex_tensor_1d(ddropped, MOEX_DTYPE_I64, 1)};
    /* yr = xr: the combine returns each token's k dispatched rows summed */
    st.c = (moex_ep_combine_args){.ep = ep, .handle = handle, .handle_bytes = info.handle_bytes,
                                  .yr = moex_tensor_2d(dxr, MOEX_DTYPE_BF16, R, H),
                                  .y = moex_tensor_2d(dy, MOEX_DTYPE_BF16, T, H)};
    size_t wd = 0, wc = 0;
    CHECK_MOEX(moex_ep_dispatch_forward_workspace_size(g_ctx, &st.d, &wd));
    CHECK_MOEX(moex_ep_combine_forward_workspace_size(g_ctx, &st.c, &wc));
    st.ws_bytes = wd > wc ? wd : wc;
    st.ws = st.ws_bytes ? dev_alloc(st.ws_bytes) : NULL;

    /* ---- the FP8 dispatch: E4M3 rows (constant 0x3a bytes: 1.25) with 1x128 scales; its own
     * handle and outputs, timed before the bf16 calls reuse theirs ---- */
    const int64_t nb = (H + 127) / 128;
    void *x8 = dev_alloc((size_t)T * H), *xr8 = dev_alloc((size_t)R * H), *handle8 = dev_alloc(info.handle_bytes);
    float *xs8 = dev_alloc(sizeof(float) * (size_t)(T * nb)), *xrs8 = dev_alloc(sizeof(float) * (size_t)(R * nb));
    CHECK_CUDA(cudaMemset(x8, 0x3a, (size_t)T * H));
    CHECK_CUDA(cudaMemset(xs8, 0x3f, sizeof(float) * (size_t)(T * nb)));
    ep_state st8 = st;
    st8.d.x = moex_tensor_2d(x8, MOEX_DTYPE_E4M3, T, H);
    st8.d.x_scales = moex_tensor_2d(xs8, MOEX_DTYPE_F32, T, nb);
    st8.d.xr = moex_tensor_2d(xr8, MOEX_DTYPE_E4M3, R, H);
    st8.d.xr_scales = moex_tensor_2d(xrs8, MOEX_DTYPE_F32, R, nb);
    st8.d.handle = handle8;
    const double fp8_us = time_op(op_dispatch, &st8, s, warmup, iters);
    const double fp8_row = (double)H + 4.0 * (double)nb;

    /* ---- eager: dispatch, then combine on the last dispatch's handle, then both ---- */
    const double disp_us = time_op(op_dispatch, &st, s, warmup, iters);
    const double comb_us = time_op(op_combine, &st, s, warmup, iters);
    const double both_us = time_op(op_both, &st, s, warmup, iters);

    /* ---- checks on the last eager dispatch + combine ---- */
    CHECK_CUDA(cudaStreamSynchronize(s));
    int64_t dropped = -1, *hsplits = xmalloc(sizeof(int64_t) * (size_t)El);
    CHECK_CUDA(cudaMemcpy(&dropped, ddropped, sizeof dropped, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hsplits, dsplits, sizeof(int64_t) * (size_t)El, cudaMemcpyDeviceToHost));
    const moex_status flags = moex_context_check_splits(g_ctx, s);
    int64_t recv_rows = 0;
    int ok_splits = flags == MOEX_OK;
    for (int e = 0; e < El; e++) ok_splits &= hsplits[e] == want_splits[e], recv_rows += hsplits[e];
    int64_t drop_total = 0, recv_max = 0;
    CHECK_MPI(MPI_Reduce(&dropped, &drop_total, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD));
    CHECK_MPI(MPI_Reduce(&recv_rows, &recv_max, 1, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD));
    int all_splits = 0;
    CHECK_MPI(MPI_Allreduce(&ok_splits, &all_splits, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
    if (flags != MOEX_OK)
        fprintf(stderr, "ep_bench rank %d: moex_context_check_splits: %s\n", g_rank, moex_last_error(g_ctx));
    double err_eager = 0;
    const int ok_eager = check_y(hx, dy, hy, T, &err_eager);

    /* ---- one CUDA graph: dispatch + combine, captured on the (non-default) stream. Thread-local
     * capture: an unsafe CUDA call of this thread (moex's or NCCL's enqueue path) fails the
     * capture; NCCL's own proxy thread is left alone. ---- */
    double graph_us = 0, err_graph = 0;
    int ok_graph = 1;
    if (graph) {
        cudaGraph_t g;
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        op_both(&st, s);
        CHECK_CUDA(cudaStreamEndCapture(s, &g));
        CHECK_CUDA(cudaGraphInstantiate(&st.graph, g, 0));
        CHECK_CUDA(cudaGraphDestroy(g));
        graph_us = time_op(op_graph, &st, s, warmup, iters);
        /* the replay must write y itself: poison it (0xffff is a bf16 NaN) and replay once more */
        CHECK_CUDA(cudaMemsetAsync(dy, 0xff, (size_t)T * H * 2, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        CHECK_CUDA(cudaGraphLaunch(st.graph, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        ok_graph = check_y(hx, dy, hy, T, &err_graph);
        CHECK_CUDA(cudaGraphExecDestroy(st.graph));
    }

    const int ok = drop_total == 0 && all_splits && ok_eager && ok_graph;
    if (g_rank == 0) {
        const double wire = (double)(((size_t)H * 2 + 8 * K + 15) / 16 * 16);
        printf("\nmoex EP (transfer %s (%d), %d local experts, R = %lld rows, handle %zu B, workspace %zu B):\n",
               info.transfer == MOEX_EP_TRANSFER_CAPACITY ? "CAPACITY" : "not CAPACITY", (int)info.transfer, El,
               (long long)R,
               info.handle_bytes, st.ws_bytes);
        printf("  routing: %.0f (token, rank) pairs per rank on average (%.0f to other ranks), "
               "%.1f MB per rank DeepEP-style (%.1f MB over links); T k = %lld rows\n",
               (double)totals[0] / N, (double)totals[1] / N, bytes / 1e6, link_bytes / 1e6,
               (long long)(T * K));
        printf("  %-18s %12s %10s %12s\n", "op", "median us", "GB/s", "link GB/s");
        printf("  %-18s %12.1f %10.1f %12.1f\n", "dispatch", disp_us, bytes / (disp_us * 1e3),
               link_bytes / (disp_us * 1e3));
        printf("  %-18s %12.1f %10.1f %12.1f\n", "combine", comb_us, bytes / (comb_us * 1e3),
               link_bytes / (comb_us * 1e3));
        printf("  %-18s %12.1f %10.1f %12.1f\n", "dispatch+combine", both_us, 2 * bytes / (both_us * 1e3),
               2 * link_bytes / (both_us * 1e3));
        if (graph)
            printf("  %-18s %12.1f %10.1f %12.1f\n", "graph d+c", graph_us, 2 * bytes / (graph_us * 1e3),
                   2 * link_bytes / (graph_us * 1e3));
        printf("  CAPACITY path moves N T = %lld wire rows of %.0f B per rank per exchange (padding included): "
               "%.1f MB, %.1f MB to other ranks (%.2fx the DeepEP bytes)%s\n",
               (long long)(N * T), wire, N * T * wire / 1e6, (N - 1) * T * wire / 1e6,
               N * T * wire / bytes, info.transfer == MOEX_EP_TRANSFER_CAPACITY ? " [in use]" : "");
        printf("  checks: dropped = %lld (all ranks) %s; splits vs routing %s (most rows received by a rank: "
               "%lld of R = %lld); combine(dispatch(x)) = k x: eager max rel err %.3g %s",
               (long long)drop_total, pass(drop_total == 0), pass(all_splits), (long long)recv_max, (long long)R,
               err_eager, pass(ok_eager));
        if (graph) printf(", graph replay max rel err %.3g %s", err_graph, pass(ok_graph));
        printf("\n  overall: %s\n\n", pass(ok));
        fflush(stdout);
    }
    const int peer = info.transfer == MOEX_EP_TRANSFER_PEER;
    report(N, T, peer ? "moex-peer" : "moex-capacity", "dispatch", disp_us, bytes, link_bytes);
    report(N, T, peer ? "moex-peer" : "moex-capacity", "combine", comb_us, bytes, link_bytes);
    report(N, T, peer ? "moex-peer" : "moex-capacity", "dispatch+combine", both_us, 2 * bytes, 2 * link_bytes);
    if (graph)
        report(N, T, peer ? "moex-peer-graph" : "moex-capacity-graph", "dispatch+combine", graph_us, 2 * bytes,
               2 * link_bytes);
    /* the FP8 dispatch: its own bytes (H + 4 ceil(H/128) a row) */
    report(N, T, peer ? "moex-peer-fp8" : "moex-capacity-fp8", "dispatch", fp8_us, bytes * fp8_row / row_bytes,
           link_bytes * fp8_row / row_bytes);
    void *frees8[] = {x8, xr8, handle8, xs8, xrs8};
    for (size_t i = 0; i < sizeof frees8 / sizeof frees8[0]; i++) CHECK_CUDA(cudaFree(frees8[i]));

    if (st.ws) CHECK_CUDA(cudaFree(st.ws));
    void *frees[] = {dx, dy, dids, dprobs, dxr, dprobs_r, dsplits, ddropped, handle};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) CHECK_CUDA(cudaFree(frees[i]));
    moex_ep_destroy(ep);
    moex_context_destroy(g_ctx);
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_NCCL(ncclCommDestroy(g_nccl));
    free(hids), free(hprobs), free(hx), free(hy), free(slots_per_expert), free(want_splits), free(hsplits);
    CHECK_MPI(MPI_Finalize());
    return ok ? 0 : 1;
}
