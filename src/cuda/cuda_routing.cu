/*
 * cuda_routing.cu - routing on the GPU: the top-k router (forward, backward), permute
 * (tokens to expert-sorted rows, producing the splits on the device) and unpermute, each
 * with its backward. Semantics are those of src/cpu/cpu_router.c and cpu_permute.c.
 *
 * Router: one warp per token; scores in f32 (softmax with a fixed-order warp max and sum,
 * or sigmoid); the k picks are taken in (score desc, index asc) order, each pick the
 * warp's best candidate strictly after the previous pick, so no per-token scratch is needed.
 * SIGMOID + RENORM, forward and backward, with the formulas of src/core/router_math.h (finite
 * where every chosen sigmoid underflows), as the CPU router.
 *
 * Permute: a deterministic counting sort in three launches over chunks of PERM_CHUNK
 * entries of the flattened [T*k] ids (one warp per chunk): (1) per-chunk expert counts,
 * (2) one block turns them into each chunk's first row per expert and writes splits,
 * (3) each chunk assigns rows in (t, j) order (warp match + popc ranks), then a copy kernel
 * moves rows (in 16-byte pieces where the rows allow). Ids outside [0, E) (or row_map values
 * outside [0, T*k)) are skipped and recorded in the context's flag (moex_context_check_splits
 * reports them).
 */
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_ops.h"
#include "router_math.h"

#define ROUTER_WARPS 4
#define PERM_CHUNK 2048
#define COPY_THREADS 256

/* ---- router ------------------------------------------------------------------------- */

template <typename T>
static __device__ __forceinline__ void score_stats(const T *l, int64_t E, moex_router_score score, float *m,
                                                   float *sum) {
    int lane = threadIdx.x & 31;
    *m = 0.0f;
    *sum = 1.0f;
    if (score == MOEX_ROUTER_SIGMOID) return;
    float mx = -INFINITY;
    for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, to_f32(l[e]));
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float s = 0.0f;
    for (int64_t e = lane; e < E; e += 32) s += expf(to_f32(l[e]) - mx);
    *m = mx;
    *sum = warp_sum(s);
}

static __device__ __forceinline__ float score_of(float logit, moex_router_score score, float m, float sum) {
    if (score == MOEX_ROUTER_SIGMOID) return 1.0f / (1.0f + expf(-logit));
    return expf(logit - m) / sum;
}

/* True when (s1, e1) comes before (s2, e2): larger score first, lower index on ties. */
static __device__ __forceinline__ bool before(float s1, int64_t e1, float s2, int64_t e2) {
    return s1 > s2 || (s1 == s2 && e1 < e2);
}

/* SIGMOID + RENORM (router_math.h): *mx = max_j ls_j and *z = sum_j exp(ls_j - mx) over the
 * chosen experts id[0..k) in [0, E) (others skipped), the same on every lane. */
template <typename T>
static __device__ __forceinline__ void sigmoid_renorm_stats(const T *l, int64_t E, const int32_t *id, int64_t k,
                                                            float *mx, float *z) {
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        if (id[j] < 0 || id[j] >= E) continue;
        float ls = moex_router_log_sigmoid(to_f32(l[id[j]]));
        if (ls > m) m = ls;
    }
    for (int64_t j = 0; j < k; j++)
        if (id[j] >= 0 && id[j] < E) s += expf(moex_router_log_sigmoid(to_f32(l[id[j]])) - m);
    *mx = m;
    *z = s;
}

/* P_j of SIGMOID + RENORM from sigmoid_renorm_stats. */
static __device__ __forceinline__ float sigmoid_renorm_prob(float logit, float mx, float z) {
    return expf(moex_router_log_sigmoid(logit) - mx) / z;
}

template <typename T>
static __global__ void router_fwd_kernel(const T *logits, int64_t T_rows, int64_t E, int64_t k,
                                         moex_router_score score, moex_router_norm norm, float *probs,
                                         int32_t *ids) {
    int64_t t = (int64_t)blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (t >= T_rows) return;
    const T *l = logits + t * E;
    float m, sum;
    score_stats(l, E, score, &m, &sum);
    float prev_s = INFINITY, total = 0.0f;
    int64_t prev_e = -1;
    for (int64_t j = 0; j < k; j++) {
        float bs = -INFINITY, bkey = -INFINITY;
        int64_t be = -1;
        for (int64_t e = lane; e < E; e += 32) {
            float s = score_of(to_f32(l[e]), score, m, sum);
            float key = isnan(s) ? -INFINITY : s;          /* NaN scores sort last */
            if (j > 0 && !before(prev_s, prev_e, key, e)) continue;
            if (be < 0 || before(key, e, bkey, be)) {
                bkey = key;
                be = e;
                bs = s;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ok = __shfl_xor_sync(0xffffffffu, bkey, o);
            float os = __shfl_xor_sync(0xffffffffu, bs, o);
            int64_t oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || before(ok, oe, bkey, be))) {
                bkey = ok;
                be = oe;
                bs = os;
            }
        }
        if (lane == 0) {
            probs[t * k + j] = bs;
            ids[t * k + j] = (int32_t)be;
        }
        total += bs;
        prev_s = bkey;
        prev_e = be;
    }
    if (norm == MOEX_ROUTER_RENORM && score == MOEX_ROUTER_SIGMOID) {
        __syncwarp();   /* lane 0's ids, read by every lane */
        float mx, z;
        sigmoid_renorm_stats(l, E, ids + t * k, k, &mx, &z);
        for (int64_t j = lane; j < k; j += 32) probs[t * k + j] = sigmoid_renorm_prob(to_f32(l[ids[t * k + j]]), mx, z);
    } else if (norm == MOEX_ROUTER_RENORM) {
        __syncwarp();
        for (int64_t j = lane; j < k; j += 32) probs[t * k + j] = probs[t * k + j] / total;
    }
}

moex_status moex_cuda_router_fwd_run(moex_context *ctx, const char *op, const void *logits, moex_dtype dt,
                                     int64_t T, int64_t E, int64_t k, moex_router_score score,
                                     moex_router_norm norm, float *probs, int32_t *ids, cudaStream_t stream) {
    if (T == 0 || k == 0) return MOEX_OK;
    unsigned nb = (unsigned)((T + ROUTER_WARPS - 1) / ROUTER_WARPS);
    if (dt == MOEX_DTYPE_BF16)
        router_fwd_kernel<bf16><<<nb, ROUTER_WARPS * 32, 0, stream>>>((const bf16 *)logits, T, E, k, score, norm,
                                                                      probs, ids);
    else
        router_fwd_kernel<float><<<nb, ROUTER_WARPS * 32, 0, stream>>>((const float *)logits, T, E, k, score, norm,
                                                                       probs, ids);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

/* dlogits as in cpu_router.c; ids outside [0, E) count as not chosen and are flagged. */
template <typename T>
static __global__ void router_bwd_kernel(const T *logits, int64_t T_rows, int64_t E, int64_t k,
                                         moex_router_score score, moex_router_norm norm, const int32_t *ids,
                                         const float *dq, T *dlogits, int *flag) {
    int64_t t = (int64_t)blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (t >= T_rows) return;
    const T *l = logits + t * E;
    const int32_t *id = ids + t * k;
    const float *dqt = dq + t * k;
    if (score == MOEX_ROUTER_SIGMOID && norm == MOEX_ROUTER_RENORM) {   /* router_math.h */
        float mx, z, c1 = 0.0f;
        int bad = 0;
        sigmoid_renorm_stats(l, E, id, k, &mx, &z);
        for (int64_t j = 0; j < k; j++) {
            if (id[j] < 0 || id[j] >= E) {
                bad = 1;
                continue;
            }
            c1 += dqt[j] * sigmoid_renorm_prob(to_f32(l[id[j]]), mx, z);
        }
        if (bad && lane == 0) flag_bad(flag, MOEX_OP_ROUTER_BACKWARD, MOEX_CUDA_BAD_IDS);
        for (int64_t e = lane; e < E; e += 32) {
            float le = to_f32(l[e]), ds = 0.0f;
            for (int64_t j = 0; j < k; j++)
                if (id[j] == e) ds += (dqt[j] - c1) * sigmoid_renorm_prob(le, mx, z);
            dlogits[t * E + e] = from_f32<T>(ds * moex_router_one_minus_sigmoid(le));
        }
        return;
    }
    float m, sum;
    score_stats(l, E, score, &m, &sum);
    /* Per-token scalars, computed by every lane in the same order (j ascending). */
    float ssum = 0.0f, dq_q = 0.0f, dp_p = 0.0f;
    int bad = 0;
    for (int64_t j = 0; j < k; j++) {
        int32_t e = id[j];
        if (e < 0 || e >= E) {
            bad = 1;
            continue;
        }
        ssum += score_of(to_f32(l[e]), score, m, sum);
    }
    if (norm == MOEX_ROUTER_RENORM)
        for (int64_t j = 0; j < k; j++) {
            int32_t e = id[j];
            if (e < 0 || e >= E) continue;
            dq_q += dqt[j] * (score_of(to_f32(l[e]), score, m, sum) / ssum);
        }
    for (int64_t j = 0; j < k; j++) {
        int32_t e = id[j];
        if (e < 0 || e >= E) continue;
        float dp = norm == MOEX_ROUTER_RENORM ? (dqt[j] - dq_q) / ssum : dqt[j];
        dp_p += dp * score_of(to_f32(l[e]), score, m, sum);
    }
    if (bad && lane == 0) flag_bad(flag, MOEX_OP_ROUTER_BACKWARD, MOEX_CUDA_BAD_IDS);
    for (int64_t e = lane; e < E; e += 32) {
        float ds = 0.0f;
        for (int64_t j = 0; j < k; j++)
            if (id[j] == e) ds += norm == MOEX_ROUTER_RENORM ? (dqt[j] - dq_q) / ssum : dqt[j];
        float le = to_f32(l[e]);
        float s = score_of(le, score, m, sum);
        /* sigmoid: s (1 - s) as sigmoid(l) sigmoid(-l), which does not cancel when s -> 1 */
        float dl = score == MOEX_ROUTER_SIGMOID ? ds * s * (1.0f / (1.0f + expf(le))) : s * (ds - dp_p);
        dlogits[t * E + e] = from_f32<T>(dl);
    }
}

moex_status moex_cuda_router_bwd_run(moex_context *ctx, const char *op, const void *logits, moex_dtype dt,
                                     int64_t T, int64_t E, int64_t k, moex_router_score score,
                                     moex_router_norm norm, const int32_t *ids, const float *dprobs,
                                     void *dlogits, cudaStream_t stream) {
    if (T == 0) return MOEX_OK;
    unsigned nb = (unsigned)((T + ROUTER_WARPS - 1) / ROUTER_WARPS);
    int *flag = moex_cuda_st(ctx)->flag;
    if (dt == MOEX_DTYPE_BF16)
        router_bwd_kernel<bf16><<<nb, ROUTER_WARPS * 32, 0, stream>>>((const bf16 *)logits, T, E, k, score, norm,
                                                                      ids, dprobs, (bf16 *)dlogits, flag);
    else
        router_bwd_kernel<float><<<nb, ROUTER_WARPS * 32, 0, stream>>>((const float *)logits, T, E, k, score, norm,
                                                                       ids, dprobs, (float *)dlogits, flag);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

/* ---- permute -------------------------------------------------------------------------- */

static int64_t perm_chunks(int64_t n) { return (n + PERM_CHUNK - 1) / PERM_CHUNK; }

size_t moex_cuda_permute_ws(int64_t T, int64_t k, int64_t E) {
    return moex_sz_bytes(perm_chunks(T * k), E, sizeof(int32_t));
}

/* counts[c, e] = entries of chunk c with id e (one warp per chunk, smem cnt[E]). */
static __global__ void perm_count_kernel(const int32_t *ids, int64_t n, int64_t E, int32_t *counts, int *flag,
                                         int op_id) {
    extern __shared__ int32_t cnt[];
    int64_t c = blockIdx.x;
    int lane = threadIdx.x;
    for (int64_t e = lane; e < E; e += 32) cnt[e] = 0;
    __syncwarp();
    int bad = 0;
    int64_t end = min(n, (c + 1) * PERM_CHUNK);
    for (int64_t base = c * PERM_CHUNK; base < end; base += 32) {
        int64_t i = base + lane;
        int32_t id = i < end ? ids[i] : -1;
        bool valid = i < end && id >= 0 && id < E;
        if (i < end && !valid) bad = 1;
        unsigned mask = __match_any_sync(0xffffffffu, valid ? id : -1);
        int leader = __ffs(mask) - 1;
        if (valid && lane == leader) cnt[id] += __popc(mask);
        __syncwarp();
    }
    for (int64_t e = lane; e < E; e += 32) counts[c * E + e] = cnt[e];
    if (bad) flag_bad(flag, op_id, MOEX_CUDA_BAD_IDS);
}

/* counts[c, e] becomes the first row of chunk c's expert-e entries; splits[e] = total. */
static __global__ void __launch_bounds__(1024) perm_scan_kernel(int32_t *counts, int64_t nc, int64_t E,
                                                                int64_t *splits) {
    __shared__ int64_t wsum[32];
    int64_t carry = 0;
    for (int64_t e0 = 0; e0 < E; e0 += 1024) {
        int64_t e = e0 + threadIdx.x;
        int64_t tot = 0;
        if (e < E)
            for (int64_t c = 0; c < nc; c++) {
                int32_t v = counts[c * E + e];
                counts[c * E + e] = (int32_t)tot;
                tot += v;
            }
        /* exclusive scan of tot over the experts of this chunk */
        int64_t total;
        int64_t incl = block_scan_i64(tot, wsum, &total);
        int64_t first = carry + incl - tot;
        if (e < E) {
            splits[e] = tot;
            for (int64_t c = 0; c < nc; c++) counts[c * E + e] += (int32_t)first;
        }
        carry += total;
        __syncthreads();
    }
}

/* row_map[i] = the row of entry i: its chunk's first row for its expert plus its rank. */
static __global__ void perm_assign_kernel(const int32_t *ids, int64_t n, int64_t E, const int32_t *counts,
                                          int32_t *row_map) {
    extern __shared__ int32_t next[];
    int64_t c = blockIdx.x;
    int lane = threadIdx.x;
    for (int64_t e = lane; e < E; e += 32) next[e] = counts[c * E + e];
    __syncwarp();
    int64_t end = min(n, (c + 1) * PERM_CHUNK);
    for (int64_t base = c * PERM_CHUNK; base < end; base += 32) {
        int64_t i = base + lane;
        int32_t id = i < end ? ids[i] : -1;
        bool valid = i < end && id >= 0 && id < E;
        unsigned mask = __match_any_sync(0xffffffffu, valid ? id : -1);
        int leader = __ffs(mask) - 1;
        int rank = __popc(mask & ((1u << lane) - 1u));
        int32_t row = valid ? next[id] + rank : -1;
        __syncwarp();
        if (valid && lane == leader) next[id] += __popc(mask);
        __syncwarp();
        if (i < end) row_map[i] = row;
    }
}

/* ---- rows in pieces ---------------------------------------------------------------------
 * The copies and gathers below move each row in pieces of N elements: N * sizeof(T) = 16 bytes
 * (vector loads and stores) where by_pieces allows it, one element otherwise. */

/* v = p[0, N): one 16-byte load when N elements are 16 bytes (p 16-byte aligned). */
template <typename T, int N> static __device__ __forceinline__ void piece_load(const T *p, T (&v)[N]) {
    if constexpr (N * sizeof(T) == 16) {
        const uint4 u = *(const uint4 *)p;
        memcpy(v, &u, 16);
    } else {
        for (int i = 0; i < N; i++) v[i] = p[i];
    }
}

/* p[0, N) = v: 16-byte stores when N elements are a multiple of 16 bytes (p 16-byte aligned). */
template <typename T, int N> static __device__ __forceinline__ void piece_store(T *p, const T (&v)[N]) {
    if constexpr (N * sizeof(T) % 16 == 0) {
        for (int q = 0; q < (int)(N * sizeof(T) / 16); q++) {
            uint4 u;
            memcpy(&u, (const char *)v + 16 * q, 16);
            ((uint4 *)p)[q] = u;
        }
    } else {
        for (int i = 0; i < N; i++) p[i] = v[i];
    }
}

/* launch(N) with the piece size N as a constant (std::integral_constant): 16 bytes of T when
 * rows of H elements at a and b move in 16-byte pieces, else 1. */
template <typename T, typename Launch> static void by_pieces(int64_t H, const void *a, const void *b, Launch launch) {
    if ((H * (int64_t)sizeof(T)) % 16 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0)
        launch(std::integral_constant<int, (int)(16 / sizeof(T))>());
    else
        launch(std::integral_constant<int, 1>());
}

/* dst[row_map[t*k + j]] = src[t] and, with probs, probs_p[row_map[t*k + j]] = probs[t*k + j],
 * for the rows in [0, rows_p); others are skipped, and flagged where flag is given (a caller's
 * row_map; the permute's own marks dropped ids -1, which its count already flagged). Block per
 * token; each piece of src[t] is read once and stored k times. */
template <typename T, int N>
static __global__ void spread_rows_kernel(const T *src, const float *probs, const int32_t *row_map, int64_t T_rows,
                                          int64_t H, int64_t k, int64_t rows_p, T *dst, float *probs_p, int *flag,
                                          int op_id) {
    for (int64_t t = blockIdx.x; t < T_rows; t += gridDim.x) {
        for (int64_t q = threadIdx.x; q < H / N; q += COPY_THREADS) {
            T v[N];
            piece_load<T, N>(src + t * H + q * N, v);
            for (int64_t j = 0; j < k; j++) {
                const int32_t r = row_map[t * k + j];
                if (r >= 0 && r < rows_p) piece_store<T, N>(dst + (int64_t)r * H + q * N, v);
            }
        }
        for (int64_t j = threadIdx.x; j < k; j += COPY_THREADS) {
            const int32_t r = row_map[t * k + j];
            if (r < 0 || r >= rows_p) {
                if (flag) flag_bad(flag, op_id, MOEX_CUDA_BAD_IDS);
            } else if (probs) {
                probs_p[r] = probs[t * k + j];
            }
        }
    }
}

static unsigned copy_blocks(int64_t T) { return (unsigned)(T < (1 << 20) ? T : (1 << 20)); }

template <typename T>
static void launch_spread(const void *src, const float *probs, const int32_t *row_map, int64_t T_rows, int64_t H,
                          int64_t k, int64_t rows_p, void *dst, float *probs_p, int *flag, int op_id,
                          cudaStream_t stream) {
    by_pieces<T>(H, src, dst, [&](auto n) {
        spread_rows_kernel<T, decltype(n)::value><<<copy_blocks(T_rows), COPY_THREADS, 0, stream>>>(
            (const T *)src, probs, row_map, T_rows, H, k, rows_p, (T *)dst, probs_p, flag, op_id);
    });
}

/* launch_spread for the dtype dt. */
static void spread(moex_dtype dt, const void *src, const float *probs, const int32_t *row_map, int64_t T_rows,
                   int64_t H, int64_t k, int64_t rows_p, void *dst, float *probs_p, int *flag, int op_id,
                   cudaStream_t stream) {
    by_dtype(dt, [&](auto e) {
        launch_spread<typename decltype(e)::type>(src, probs, row_map, T_rows, H, k, rows_p, dst, probs_p, flag,
                                                  op_id, stream);
    });
}

moex_status moex_cuda_permute_run(moex_context *ctx, const char *op, int op_id, const void *x, moex_dtype dt,
                                  const int32_t *ids, const float *probs, int64_t T, int64_t H, int64_t k,
                                  int64_t E, void *xp, float *probs_p, int64_t *splits, int32_t *row_map,
                                  void *ws, cudaStream_t stream) {
    int64_t n = T * k, nc = perm_chunks(n);
    size_t smem = (size_t)E * sizeof(int32_t);
    if (E > MOEX_CUDA_MAX_EXPERTS)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: E = %lld experts exceed the permute kernel's limit (%d)",
                         op, (long long)E, MOEX_CUDA_MAX_EXPERTS);
    int32_t *counts = (int32_t *)ws;
    if (nc > 0) {
        perm_count_kernel<<<(unsigned)nc, 32, smem, stream>>>(ids, n, E, counts, moex_cuda_st(ctx)->flag, op_id);
        CUDA_TRY_LAUNCH(ctx, op);
    }
    perm_scan_kernel<<<1, 1024, 0, stream>>>(counts, nc, E, splits);
    CUDA_TRY_LAUNCH(ctx, op);
    if (nc == 0) return MOEX_OK;
    perm_assign_kernel<<<(unsigned)nc, 32, smem, stream>>>(ids, n, E, counts, row_map);
    CUDA_TRY_LAUNCH(ctx, op);
    spread(dt, x, probs, row_map, T, H, k, n, xp, probs_p, NULL, op_id, stream);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

/* ---- gathers and scatters by row_map ----------------------------------------------------- */

/* dst[t] = sum_j src[row_map[t*k + j]] (f32, j ascending, rounded once; rows outside
 * [0, rows_p) skipped and flagged); vdst[t*k + j] = vsrc[row_map[t*k + j]] (0 when skipped).
 * Each thread sums pieces of N columns, loading GATHER_BATCH rows' pieces before it adds them. */
#define GATHER_BATCH 4
template <typename TS, typename TD, int N>
static __global__ void gather_sum_kernel(const int32_t *row_map, const TS *src, int64_t T_rows, int64_t H,
                                         int64_t k, int64_t rows_p, TD *dst, const float *vsrc, float *vdst,
                                         int *flag, int op_id) {
    for (int64_t t = blockIdx.x; t < T_rows; t += gridDim.x) {
        if (dst)
            for (int64_t q = threadIdx.x; q < H / N; q += COPY_THREADS) {
                float s[N];
                for (int i = 0; i < N; i++) s[i] = 0.0f;
                for (int64_t j0 = 0; j0 < k; j0 += GATHER_BATCH) {
                    TS v[GATHER_BATCH][N];
                    bool ok[GATHER_BATCH];
                    for (int b = 0; b < GATHER_BATCH; b++) {
                        const int32_t r = j0 + b < k ? row_map[t * k + j0 + b] : -1;
                        ok[b] = r >= 0 && r < rows_p;
                        if (ok[b]) piece_load<TS, N>(src + (int64_t)r * H + q * N, v[b]);
                    }
                    for (int b = 0; b < GATHER_BATCH; b++)
                        if (ok[b])
                            for (int i = 0; i < N; i++) s[i] += to_f32(v[b][i]);
                }
                TD o[N];
                for (int i = 0; i < N; i++) o[i] = from_f32<TD>(s[i]);
                piece_store<TD, N>(dst + t * H + q * N, o);
            }
        for (int64_t j = threadIdx.x; j < k; j += COPY_THREADS) {
            int32_t r = row_map[t * k + j];
            bool ok = r >= 0 && r < rows_p;
            if (!ok) flag_bad(flag, op_id, MOEX_CUDA_BAD_IDS);
            if (vdst) vdst[t * k + j] = ok ? vsrc[r] : 0.0f;
        }
    }
}

template <typename TS, typename TD>
static void launch_gather_to(unsigned nb, const int32_t *row_map, const void *src, int64_t T, int64_t H, int64_t k,
                             void *dst, const float *vsrc, float *vdst, int *flag, int op_id, cudaStream_t stream) {
    by_pieces<TS>(H, src, dst ? dst : src, [&](auto n) {
        gather_sum_kernel<TS, TD, decltype(n)::value><<<nb, COPY_THREADS, 0, stream>>>(
            row_map, (const TS *)src, T, H, k, T * k, (TD *)dst, vsrc, vdst, flag, op_id);
    });
}

template <typename TS>
static void launch_gather(const int32_t *row_map, const void *src, int64_t T, int64_t H, int64_t k, void *dst,
                          moex_dtype dst_dt, const float *vsrc, float *vdst, int *flag, int op_id,
                          cudaStream_t stream) {
    unsigned nb = copy_blocks(T);
    if (dst_dt == MOEX_DTYPE_F32 || !dst)
        launch_gather_to<TS, float>(nb, row_map, src, T, H, k, dst, vsrc, vdst, flag, op_id, stream);
    else
        launch_gather_to<TS, TS>(nb, row_map, src, T, H, k, dst, vsrc, vdst, flag, op_id, stream);
}

static void gather(const int32_t *row_map, const void *src, moex_dtype dt, int64_t T, int64_t H, int64_t k,
                   void *dst, moex_dtype dst_dt, const float *vsrc, float *vdst, int *flag, int op_id,
                   cudaStream_t stream) {
    by_dtype(dt, [&](auto e) {
        launch_gather<typename decltype(e)::type>(row_map, src, T, H, k, dst, dst_dt, vsrc, vdst, flag, op_id, stream);
    });
}

moex_status moex_cuda_permute_bwd_run(moex_context *ctx, const char *op, const int32_t *row_map, const void *dxp,
                                      moex_dtype dt, const float *dprobs_p, int64_t T, int64_t H, int64_t k,
                                      void *dx, moex_dtype dx_dt, float *dprobs, cudaStream_t stream) {
    if (T == 0 || (!dx && !dprobs)) return MOEX_OK;
    gather(row_map, dxp, dt, T, H, k, dx, dx_dt, dprobs_p, dprobs_p ? dprobs : NULL, moex_cuda_st(ctx)->flag,
           MOEX_OP_PERMUTE_BACKWARD, stream);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

moex_status moex_cuda_unpermute_run(moex_context *ctx, const char *op, const int32_t *row_map, const void *yp,
                                    moex_dtype dt, int64_t T, int64_t H, int64_t k, void *y, cudaStream_t stream) {
    if (T == 0) return MOEX_OK;
    gather(row_map, yp, dt, T, H, k, y, dt, NULL, NULL, moex_cuda_st(ctx)->flag, MOEX_OP_UNPERMUTE_FORWARD,
           stream);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

moex_status moex_cuda_unpermute_bwd_run(moex_context *ctx, const char *op, const int32_t *row_map, const void *dy,
                                        moex_dtype dt, int64_t T, int64_t H, int64_t k, void *dyp, int64_t rows_p,
                                        cudaStream_t stream) {
    if (T == 0) return MOEX_OK;
    spread(dt, dy, NULL, row_map, T, H, k, rows_p, dyp, NULL, moex_cuda_st(ctx)->flag, MOEX_OP_UNPERMUTE_BACKWARD,
           stream);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

/* ---- the primitives ------------------------------------------------------------------- */

size_t moex_cuda_router_fwd_ws(moex_context *ctx, const moex_router_args *a, const moex_router_dims *d) { return 0; }

moex_status moex_cuda_router_fwd(moex_context *ctx, const moex_call *c, const moex_router_args *a,
                                 const moex_router_dims *d, void *ws) {
    return moex_cuda_router_fwd_run(ctx, c->op, a->logits.data, d->dt, d->T, d->E, d->k, a->score, a->norm,
                                    (float *)a->probs.data, (int32_t *)a->ids.data, (cudaStream_t)c->stream);
}

size_t moex_cuda_router_bwd_ws(moex_context *ctx, const moex_router_grad_args *a, const moex_router_dims *d) {
    return 0;
}

moex_status moex_cuda_router_bwd(moex_context *ctx, const moex_call *c, const moex_router_grad_args *a,
                                 const moex_router_dims *d, void *ws) {
    return moex_cuda_router_bwd_run(ctx, c->op, a->logits.data, d->dt, d->T, d->E, d->k, a->score, a->norm,
                                    (const int32_t *)a->ids.data, (const float *)a->dprobs.data, a->dlogits.data,
                                    (cudaStream_t)c->stream);
}

size_t moex_cuda_permute_fwd_ws(moex_context *ctx, const moex_permute_args *a, const moex_perm_dims *d) {
    return moex_cuda_permute_ws(d->T, d->k, d->E);
}

moex_status moex_cuda_permute_fwd(moex_context *ctx, const moex_call *c, const moex_permute_args *a,
                                  const moex_perm_dims *d, void *ws) {
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    float *probs_p = moex_present(&a->probs_p) ? (float *)a->probs_p.data : NULL;
    return moex_cuda_permute_run(ctx, c->op, c->id, a->x.data, d->dt, (const int32_t *)a->ids.data,
                                 probs_p ? probs : NULL, d->T, d->H, d->k, d->E, a->xp.data, probs_p,
                                 (int64_t *)a->splits.data, (int32_t *)a->row_map.data, ws, (cudaStream_t)c->stream);
}

size_t moex_cuda_permute_bwd_ws(moex_context *ctx, const moex_permute_grad_args *a, const moex_perm_dims *d) {
    return 0;
}

moex_status moex_cuda_permute_bwd(moex_context *ctx, const moex_call *c, const moex_permute_grad_args *a,
                                  const moex_perm_dims *d, void *ws) {
    const float *dprobs_p = moex_present(&a->dprobs_p) ? (const float *)a->dprobs_p.data : NULL;
    float *dprobs = moex_present(&a->dprobs) ? (float *)a->dprobs.data : NULL;
    void *dx = moex_present(&a->dx) ? a->dx.data : NULL;
    const moex_dtype dx_dt = moex_present(&a->dx) ? a->dx.dtype : d->dt;
    return moex_cuda_permute_bwd_run(ctx, c->op, (const int32_t *)a->row_map.data, a->dxp.data, d->dt, dprobs_p, d->T,
                                     d->H, d->k, dx, dx_dt, dprobs_p ? dprobs : NULL, (cudaStream_t)c->stream);
}

size_t moex_cuda_unpermute_fwd_ws(moex_context *ctx, const moex_unpermute_args *a, const moex_perm_dims *d) {
    return 0;
}

moex_status moex_cuda_unpermute_fwd(moex_context *ctx, const moex_call *c, const moex_unpermute_args *a,
                                    const moex_perm_dims *d, void *ws) {
    return moex_cuda_unpermute_run(ctx, c->op, (const int32_t *)a->row_map.data, a->yp.data, d->dt, d->T, d->H, d->k,
                                   a->y.data, (cudaStream_t)c->stream);
}

size_t moex_cuda_unpermute_bwd_ws(moex_context *ctx, const moex_unpermute_grad_args *a, const moex_perm_dims *d) {
    return 0;
}

moex_status moex_cuda_unpermute_bwd(moex_context *ctx, const moex_call *c, const moex_unpermute_grad_args *a,
                                    const moex_perm_dims *d, void *ws) {
    return moex_cuda_unpermute_bwd_run(ctx, c->op, (const int32_t *)a->row_map.data, a->dy.data, d->dt, d->T, d->H,
                                       d->k, a->dyp.data, d->T * d->k, (cudaStream_t)c->stream);
}
