/*
 * cuda_ep.cu - the CUDA backend's local kernels of expert parallelism (moex_ep_kernels; the
 * contract is src/core/ep.h, the reference src/cpu/cpu_ep.c). Everything stays on the device:
 * counts, maps and ids are read only by kernels, and no kernel allocates or synchronises, so
 * every step can be captured in a CUDA graph. Results are bitwise reproducible: positions come
 * from stable prefix counts, sums run in f32 in slot order, and the only atomics are integer
 * counters whose totals do not depend on their order.
 *
 * Wire rows (ep.h): the payload (H elements of g->dt, or FP8 data and scales) at the row
 * start, then k 4-byte meta words from byte g->meta (16-aligned; every buffer and outgoing
 * region starts 16-aligned too).
 *
 *   route        one 1024-thread block per destination rank r: a block scan over the tokens
 *                (ROUTE_TPT per thread and step) of "t has a valid slot on r" gives t's row
 *                r Tm + pos; block 0 also writes -1 for ids outside [0, E) and flags them.
 *   pack         a block per token (grid-stride): its first slots' rows (shared), then one
 *                row copy per distinct destination and, with ids and probs, its meta.
 *   expand_plan  a stable counting sort of the received entries (region, row, slot), in
 *                chunks of max(PLAN_CHUNK, El) entries, the last chunk taking the rest:
 *                (1) count:  per-chunk expert counts (a block per chunk, shared counters);
 *                (2) scan:   one block turns them into each chunk's first expert row, in
 *                            expert-major order, and writes each expert's end row, the drops
 *                            and their flag;
 *                (3) assign: a warp per chunk ranks its entries in order (match + popc) and
 *                            writes recv_map; chunk 0's warp writes the final splits.
 *                There is no workspace: the counts of chunk c >= 1 live in the first El
 *                entries of its own range of recv_map (read back by the warp that then
 *                overwrites them), those of chunk 0 and the end rows in splits.
 *   expand_rows  a block per received row (grid-stride): a copy per valid map entry.
 *   gather_local a block per received row: the f32 sum of its map entries' rows, rounded.
 *   reduce       a block per token: the f32 sum of its first slots' rows, rounded.
 * Copies move the largest unit (16 down to 1 bytes) that the row size, the strides and the
 * base addresses allow; the sums read 16 bytes of elements at a time when they are 16-aligned.
 * Values out of range (counts, maps, slot rows, local ids) are skipped; bad ids are flagged
 * (MOEX_CUDA_BAD_IDS), and a dispatch that drops expert rows past R flags
 * MOEX_CUDA_EP_DROPPED (moex_context_check_splits reports both).
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"
#include "ep.h"

#define ROUTE_THREADS 1024      /* block_scan_i64's block */
#define ROUTE_TPT 4             /* tokens per thread and step of the route scan */
#define PLAN_CHUNK 2048         /* entries per chunk of the plan (or El, if more) */
#define PLAN_COUNT_THREADS 256
#define PLAN_SCAN_VT 4          /* values per thread and step of the plan scan */
#define PLAN_BATCH 8            /* steps of 32 entries whose ids a warp loads together */
#define ROW_THREADS 256         /* the row kernels' block */
#define ROW_BLOCKS_PER_SM 8     /* the row kernels' grid (they stride over the rest) */

/* ---- wire rows ------------------------------------------------------------------------ */

/* Where a wire row's meta words start: its H elements' bytes rounded up to 16 (ep.h, g->meta). */
static __host__ __device__ __forceinline__ int64_t meta_offset(int64_t data_bytes) { return (data_bytes + 15) & ~(int64_t)15; }

/* Meta word j of a wire row whose meta words start `data` bytes in (4-aligned: g->meta is a
 * multiple of 16, and every buffer and region starts 16-aligned). */
static __device__ __forceinline__ uint32_t meta_load(const char *row, int64_t data, int64_t j) {
    return *(const uint32_t *)(row + data + 4 * j);
}

static __device__ __forceinline__ void meta_store(char *row, int64_t data, int64_t j, uint32_t v) {
    *(uint32_t *)(row + data + 4 * j) = v;
}

/* The wire row of a token's slot j (slots: its k slot_row values) when j is its rank's first
 * slot and the row is one of the buffers' `rows`; else -1. */
static __device__ __forceinline__ int32_t first_row(const int32_t *slots, int64_t j, int64_t rows) {
    const int32_t s = slots[j];
    if (s < 0 || s >= rows) return -1;
    for (int64_t i = 0; i < j; i++)
        if (slots[i] == s) return -1;
    return s;
}

/* Wire row `row` is below its region's count (regions of Tm rows; counts clamped to [0, Tm]). */
static __device__ __forceinline__ bool row_counted(const int64_t *counts, int64_t Tm, int64_t row) {
    const int64_t s = row / Tm;
    return row - s * Tm < counts[s];
}

/* n units of U from src to dst, strided over the block. */
template <typename U>
static __device__ __forceinline__ void copy_units(char *dst, const char *src, int64_t n) {
    U *d = (U *)dst;
    const U *s = (const U *)src;
    for (int64_t u = threadIdx.x; u < n; u += blockDim.x) d[u] = s[u];
}

/* The elements a sum reads at once: 16 bytes' worth when VEC (16-aligned), else one. */
template <typename T, bool VEC> struct row_vec {
    static constexpr int V = VEC ? (int)(16 / sizeof(T)) : 1;
};

/* acc[v] += p[v] for the V elements at p. */
template <typename T, bool VEC>
static __device__ __forceinline__ void add_elems(const T *p, float *acc) {
    if constexpr (VEC) {
        const uint4 u = *(const uint4 *)p;
        const T *e = (const T *)&u;
#pragma unroll
        for (int v = 0; v < row_vec<T, VEC>::V; v++) acc[v] += to_f32(e[v]);
    } else {
        acc[0] += to_f32(p[0]);
    }
}

/* p[v] = acc[v] rounded to TD, for V elements (V * sizeof(TD) >= 16: 16-aligned). */
template <typename TD, int V>
static __device__ __forceinline__ void store_elems(TD *p, const float *acc) {
    if constexpr (V * sizeof(TD) >= 16) {
        constexpr int NU = (int)(V * sizeof(TD) / 16);
        uint4 u[NU];
        TD *e = (TD *)u;
#pragma unroll
        for (int v = 0; v < V; v++) e[v] = from_f32<TD>(acc[v]);
#pragma unroll
        for (int i = 0; i < NU; i++) ((uint4 *)p)[i] = u[i];
    } else {
#pragma unroll
        for (int v = 0; v < V; v++) p[v] = from_f32<TD>(acc[v]);
    }
}

/* ---- route ------------------------------------------------------------------------------ */

/* Block r: slot_row[t, j] = r Tm + pos for t's slots on rank r, pos the number of tokens
 * before t with a slot on r (a stable prefix count over the tokens); send_counts[r] = the
 * tokens with a slot on r. Block 0: slot_row = -1 for ids outside [0, E), flagged. */
static __global__ void __launch_bounds__(ROUTE_THREADS)
    ep_route_kernel(const int32_t *ids, int64_t T, int64_t k, int64_t E, int64_t El, int64_t Tm,
                    int32_t *slot_row, int64_t *send_counts, int *flag, int op_id) {
    __shared__ int64_t wsum[32];
    const int64_t r = blockIdx.x;
    int64_t carry = 0;
    bool bad = false;
    for (int64_t t0 = 0; t0 < T; t0 += (int64_t)ROUTE_THREADS * ROUTE_TPT) {
        const int64_t tb = t0 + (int64_t)threadIdx.x * ROUTE_TPT;
        unsigned has = 0;   /* bit v: token tb + v has a slot on r */
        for (int v = 0; v < ROUTE_TPT && tb + v < T; v++)
            for (int64_t j = 0; j < k; j++) {
                const int32_t e = ids[(tb + v) * k + j];
                if (e >= 0 && e < E && e / El == r) {
                    has |= 1u << v;
                    break;
                }
            }
        const int64_t mine = __popc(has);
        int64_t total;
        const int64_t incl = block_scan_i64(mine, wsum, &total);
        int64_t pos = carry + incl - mine;
        for (int v = 0; v < ROUTE_TPT && tb + v < T; v++) {
            const int64_t t = tb + v;
            const bool on_r = (has >> v) & 1u;
            for (int64_t j = 0; j < k; j++) {
                const int32_t e = ids[t * k + j];
                const bool valid = e >= 0 && e < E;
                if (valid && on_r && e / El == r) {
                    slot_row[t * k + j] = (int32_t)(r * Tm + pos);
                } else if (!valid && r == 0) {
                    slot_row[t * k + j] = -1;
                    bad = true;
                }
            }
            pos += on_r;
        }
        carry += total;
    }
    if (threadIdx.x == 0) send_counts[r] = carry;
    if (bad) flag_bad(flag, op_id, MOEX_CUDA_BAD_IDS);
}

/* ---- pack ------------------------------------------------------------------------------- */

/* For each token t and each of its first slots j: bytes [at, at + data) of the outgoing row
 * slot_row[t, j] (row w % Tm of region out[w / Tm]) = row t of src (data bytes a row); with ids (and probs): its dispatch meta at
 * byte `meta`, local ids relative to the row's rank (-1: not on it). */
template <typename U>
static __global__ void ep_pack_kernel(const char *src, const int32_t *slot_row, const int32_t *ids, const float *probs,
                                      int64_t T, int64_t k, int64_t E, int64_t El, int64_t Tm, int64_t rows,
                                      int64_t data, int64_t at, int64_t meta, size_t wire,
                                      char *const *out) {
    extern __shared__ int32_t first[];   /* [k]: the token's first slots' rows, else -1 */
    const int64_t units = data / (int64_t)sizeof(U);
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        __syncthreads();   /* the previous token is done with first[] */
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) first[j] = first_row(slot_row + t * k, j, rows);
        __syncthreads();
        for (int64_t j = 0; j < k; j++) {
            const int32_t w = first[j];
            if (w < 0) continue;
            char *row = out[w / Tm] + (size_t)(w % Tm) * wire;
            copy_units<U>(row + at, src + t * data, units);
            if (!ids) continue;
            const int64_t rank = w / Tm;
            for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
                const int32_t e = ids[t * k + i];
                const int32_t local = e >= 0 && e < E && e / El == rank ? (int32_t)(e - rank * El) : -1;
                meta_store(row, meta, i, (uint32_t)local);
                meta_store(row, meta, k + i, __float_as_uint(probs[t * k + i]));
            }
        }
    }
}

/* ---- expand_plan ------------------------------------------------------------------------ */

/* The plan's view of the received entries: entry q is slot q % k of wire row q / k. */
typedef struct plan_args {
    const char *rcv;
    const int64_t *recv_counts;
    int64_t Tm, k, El, R;
    int64_t n;                  /* entries: W Tm k */
    int64_t chunk, nc;          /* chunk c: [c chunk, c == nc - 1 ? n : (c + 1) chunk) */
    int64_t data;
    size_t wire;
} plan_args;

static __device__ __forceinline__ int64_t chunk_end(const plan_args &p, int64_t c) {
    return c == p.nc - 1 ? p.n : (c + 1) * p.chunk;
}

/* The local expert of entry q: -1 when its row is past its region's count or its id is not
 * in [0, El) (*bad: an id other than -1, the sender's "not yours"). */
static __device__ __forceinline__ int32_t entry_expert(const plan_args &p, int64_t q, bool *bad) {
    const int64_t row = q / p.k;
    if (!row_counted(p.recv_counts, p.Tm, row)) return -1;
    const int32_t id = (int32_t)meta_load(p.rcv + (size_t)row * p.wire, p.data, q - row * p.k);
    if (id < 0 || id >= p.El) {
        if (id != -1) *bad = true;
        return -1;
    }
    return id;
}

/* (1) Chunk c's entries per expert: into splits (c = 0, as i64) or the first El entries of
 * its own range of recv_map (c >= 1; each such chunk has at least chunk >= El entries). */
static __global__ void ep_plan_count_kernel(plan_args p, int64_t *splits, int32_t *recv_map, int *flag, int op_id) {
    extern __shared__ int32_t cnt[];   /* [El] */
    const int64_t c = blockIdx.x, begin = c * p.chunk, end = chunk_end(p, c);
    for (int64_t e = threadIdx.x; e < p.El; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    bool bad = false;
#pragma unroll 4
    for (int64_t q = begin + threadIdx.x; q < end; q += blockDim.x) {
        const int32_t e = entry_expert(p, q, &bad);
        if (e >= 0) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < p.El; e += blockDim.x) {
        if (c == 0) splits[e] = cnt[e];
        else recv_map[begin + e] = cnt[e];
    }
    if (bad) flag_bad(flag, op_id, MOEX_CUDA_BAD_IDS);
}

/* (2) One block: an exclusive scan of the counts in expert-major order (expert e, then chunk
 * c) gives chunk c's first row of expert e, off[e] + (e's entries in chunks before c); chunk
 * c >= 1's heads become those, and splits[e] becomes e's end row off[e] + cnt[e] (unclamped).
 * A thread reads its values before the scan's barriers and writes after them, and (e, 0)
 * comes before (e, nc - 1), so splits[e] is read as a count before it is overwritten.
 * Rows from R on are dropped: *dropped = max(total - R, 0), flagged when positive. */
static __global__ void __launch_bounds__(1024)
    ep_plan_scan_kernel(plan_args p, int64_t *splits, int32_t *recv_map, int64_t *dropped, int *flag, int op_id) {
    __shared__ int64_t wsum[32];
    const int64_t nv = p.El * p.nc;   /* the values scanned */
    int64_t carry = 0;
    for (int64_t f0 = 0; f0 < nv; f0 += 1024 * PLAN_SCAN_VT) {
        const int64_t fb = f0 + (int64_t)threadIdx.x * PLAN_SCAN_VT, e0 = fb / p.nc, c0 = fb - e0 * p.nc;
        int32_t v[PLAN_SCAN_VT];   /* counts, at most n (an int32) */
        int64_t mine = 0;
#pragma unroll
        for (int64_t u = 0, e = e0, c = c0; u < PLAN_SCAN_VT; u++) {
            v[u] = fb + u >= nv ? 0 : c == 0 ? (int32_t)splits[e] : recv_map[c * p.chunk + e];
            mine += v[u];
            if (++c == p.nc) c = 0, e++;
        }
        int64_t total;
        int64_t pos = carry + block_scan_i64(mine, wsum, &total) - mine;
#pragma unroll
        for (int64_t u = 0, e = e0, c = c0; u < PLAN_SCAN_VT && fb + u < nv; u++) {
            if (c > 0) recv_map[c * p.chunk + e] = (int32_t)pos;
            pos += v[u];
            if (c == p.nc - 1) splits[e] = pos;
            if (++c == p.nc) c = 0, e++;
        }
        carry += total;
    }
    if (threadIdx.x == 0) {
        const int64_t drop = carry > p.R ? carry - p.R : 0;
        if (dropped) *dropped = drop;
        if (drop > 0) flag_bad(flag, op_id, MOEX_CUDA_EP_DROPPED);
    }
}

/* (3) One warp per chunk: next[e] = the chunk's first row of expert e (chunk 0: off[e], from
 * the end rows in splits, whose final values chunk 0's warp then writes); the entries in
 * order, 32 at a time, each valid one taking next[e] + its rank among the step's lanes of
 * the same expert. recv_map = that row if below R, else -1 (dropped, or no local slot). */
static __global__ void __launch_bounds__(32) ep_plan_assign_kernel(plan_args p, int64_t *splits, int32_t *recv_map) {
    extern __shared__ int32_t next[];   /* [El] */
    const int64_t c = blockIdx.x, begin = c * p.chunk, end = chunk_end(p, c);
    const int lane = threadIdx.x;
    if (c == 0) {
        for (int64_t e = lane; e < p.El; e += 32) next[e] = e == 0 ? 0 : (int32_t)splits[e - 1];
        __syncwarp();
        for (int64_t e = lane; e < p.El; e += 32) {
            const int64_t lo = next[e], hi = e == p.El - 1 ? splits[e] : (int64_t)next[e + 1];
            splits[e] = min(hi, p.R) - min(lo, p.R);
        }
    } else {
        for (int64_t e = lane; e < p.El; e += 32) next[e] = recv_map[begin + e];
    }
    __syncwarp();
    bool bad = false;   /* flagged by the count */
    for (int64_t base = begin; base < end; base += 32 * PLAN_BATCH) {
        int32_t id[PLAN_BATCH];
#pragma unroll
        for (int b = 0; b < PLAN_BATCH; b++) {
            const int64_t q = base + b * 32 + lane;
            id[b] = q < end ? entry_expert(p, q, &bad) : -1;
        }
#pragma unroll
        for (int b = 0; b < PLAN_BATCH; b++) {
            const int64_t q = base + b * 32 + lane;
            const unsigned same = __match_any_sync(0xffffffffu, id[b]);
            const int before = __popc(same & ((1u << lane) - 1u));
            const int64_t row = id[b] >= 0 ? (int64_t)next[id[b]] + before : -1;
            __syncwarp();
            if (id[b] >= 0 && before == 0) next[id[b]] += __popc(same);
            __syncwarp();
            if (q < end) recv_map[q] = row >= 0 && row < p.R ? (int32_t)row : -1;
        }
    }
}

/* ---- expand_rows ------------------------------------------------------------------------ */

/* For each received row below its region's count and each slot j with m = recv_map in
 * [0, R): row m of dst (data bytes a row) = the row's bytes [at, at + data); probs_r[m] = its
 * prob j from the meta at byte `meta` (probs_r != NULL). */
template <typename U>
static __global__ void ep_expand_rows_kernel(const char *rcv, const int64_t *recv_counts, const int32_t *recv_map,
                                             int64_t rows, int64_t Tm, int64_t k, int64_t R, int64_t data,
                                             int64_t at, int64_t meta, size_t wire, char *dst,
                                             float *probs_r) {
    const int64_t units = data / (int64_t)sizeof(U);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        if (!row_counted(recv_counts, Tm, row)) continue;
        const char *w = rcv + (size_t)row * wire;
        for (int64_t j = 0; j < k; j++) {
            const int32_t m = recv_map[row * k + j];
            if (m < 0 || m >= R) continue;
            copy_units<U>(dst + (size_t)m * data, w + at, units);
            if (probs_r && threadIdx.x == 0) probs_r[m] = __uint_as_float(meta_load(w, meta, k + j));
        }
    }
}

/* ---- gather_local ----------------------------------------------------------------------- */

/* For each received row below its region's count: the outgoing row of the same index (row
 * row % Tm of region out[row / Tm]) = sum over j (in order) of
 * src[recv_map[row, j]] for maps in [0, R) (f32, rounded to T; zero when none); with dsrc:
 * meta word j = dsrc[recv_map[row, j]] (0 when out of range). */
template <typename T, bool VEC>
static __global__ void ep_gather_local_kernel(const T *src, const float *dsrc, const int64_t *recv_counts,
                                              const int32_t *recv_map, int64_t rows, int64_t Tm, int64_t k,
                                              int64_t R, int64_t H, size_t wire, char *const *out) {
    extern __shared__ int32_t map[];   /* [k]: the row's expert rows in [0, R), else -1 */
    constexpr int V = row_vec<T, VEC>::V;
    const int64_t data = meta_offset(H * (int64_t)sizeof(T));   /* the meta words */
    const int64_t W = rows / Tm;
    /* the rows in (row, region) order: the blocks in flight write to every rank at once */
    for (int64_t q = blockIdx.x; q < rows; q += gridDim.x) {
        const int64_t row = (q % W) * Tm + q / W;
        if (!row_counted(recv_counts, Tm, row)) continue;   /* the same for the whole block */
        __syncthreads();   /* the previous row is done with map[] */
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
            const int32_t m = recv_map[row * k + j];
            map[j] = m >= 0 && m < R ? m : -1;
        }
        __syncthreads();
        char *w = out[row / Tm] + (size_t)(row % Tm) * wire;
        for (int64_t h = (int64_t)threadIdx.x * V; h < H; h += (int64_t)blockDim.x * V) {
            float acc[V];
#pragma unroll
            for (int v = 0; v < V; v++) acc[v] = 0.0f;
            for (int64_t j = 0; j < k; j++)
                if (map[j] >= 0) add_elems<T, VEC>(src + (int64_t)map[j] * H + h, acc);
            store_elems<T, V>((T *)w + h, acc);
        }
        if (dsrc)
            for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
                meta_store(w, data, j, __float_as_uint(map[j] >= 0 ? dsrc[map[j]] : 0.0f));
    }
}

/* ---- reduce ----------------------------------------------------------------------------- */

/* For each token t: dst[t] = sum over its first slots j (in order) of rcv row slot_row[t, j]
 * (f32, rounded to TD; zero when none); with dprobs: dprobs[t, j] = meta word j of that row
 * (0 when slot_row is outside [0, rows)). */
template <typename T, typename TD, bool VEC>
static __global__ void ep_reduce_kernel(const char *rcv, const int32_t *slot_row, int64_t T_rows, int64_t k,
                                        int64_t rows, int64_t H, size_t wire, TD *dst, float *dprobs) {
    extern __shared__ int32_t first[];   /* [k]: the token's first slots' rows, else -1 */
    constexpr int V = row_vec<T, VEC>::V;
    const int64_t data = meta_offset(H * (int64_t)sizeof(T));   /* the meta words */
    for (int64_t t = blockIdx.x; t < T_rows; t += gridDim.x) {
        const int32_t *slots = slot_row + t * k;
        __syncthreads();   /* the previous token is done with first[] */
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
            first[j] = first_row(slots, j, rows);
            if (dprobs) {
                const int32_t s = slots[j];
                dprobs[t * k + j] =
                    s >= 0 && s < rows ? __uint_as_float(meta_load(rcv + (size_t)s * wire, data, j)) : 0.0f;
            }
        }
        __syncthreads();
        for (int64_t h = (int64_t)threadIdx.x * V; h < H; h += (int64_t)blockDim.x * V) {
            float acc[V];
#pragma unroll
            for (int v = 0; v < V; v++) acc[v] = 0.0f;
            for (int64_t j = 0; j < k; j++)
                if (first[j] >= 0) add_elems<T, VEC>((const T *)(rcv + (size_t)first[j] * wire) + h, acc);
            store_elems<TD, V>(dst + t * H + h, acc);
        }
    }
}

/* ---- launchers ---------------------------------------------------------------------------- */

static inline cudaStream_t stream_of(const moex_call *c) { return (cudaStream_t)c->stream; }
static inline int64_t data_bytes(const moex_ep_geom *g) { return g->H * (int64_t)moex_dtype_size(g->dt); }
static inline int64_t wire_rows(const moex_ep_geom *g) { return (int64_t)g->world * g->Tm; }

/* The largest unit (16, 8, 4, 2 or 1 bytes) that divides every size, stride and address in
 * `bits` (their bitwise or). */
static int unit_of(uintptr_t bits) {
    int u = 16;
    while (u > 1 && bits % (uintptr_t)u != 0) u >>= 1;
    return u;
}

/* Blocks of the row kernels for n rows or tokens (the kernels stride over the rest). */
static unsigned row_blocks(moex_context *ctx, int64_t n) {
    const int sms = moex_cuda_st(ctx)->num_sms;
    const int64_t cap = (int64_t)(sms > 0 ? sms : 132) * ROW_BLOCKS_PER_SM;
    return (unsigned)(n < cap ? n : cap);
}

/* Shared memory for a token's or row's k slots: k int32, rounded up to 16 bytes (the
 * compiler may read the slots with vector loads). */
static size_t slots_smem(const moex_ep_geom *g) { return ((size_t)g->k * sizeof(int32_t) + 15) & ~(size_t)15; }

/* The kernels that keep a token's or row's k slots in shared memory take k int32 of it. */
static moex_status check_k(moex_context *ctx, const moex_call *c, const moex_ep_geom *g) {
    if (g->k > MOEX_CUDA_MAX_EXPERTS)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: topk = %lld exceeds the CUDA EP kernels' limit (%d)", c->op,
                         (long long)g->k, MOEX_CUDA_MAX_EXPERTS);
    return MOEX_OK;
}

static moex_status cuda_ep_route(moex_context *ctx, const moex_call *c, const moex_ep_geom *g, const int32_t *ids,
                                 const moex_ep_routing *r) {
    ep_route_kernel<<<(unsigned)g->world, ROUTE_THREADS, 0, stream_of(c)>>>(
        ids, g->T, g->k, g->E, g->El, g->Tm, r->slot_row, r->send_counts, moex_cuda_st(ctx)->flag, (int)c->id);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

template <typename U>
static void launch_pack(unsigned nb, size_t smem, cudaStream_t s, const moex_ep_geom *g, const moex_ep_routing *r,
                        const void *src, int64_t data, int64_t at, const int32_t *ids, const float *probs,
                        void *const *out) {
    ep_pack_kernel<U><<<nb, ROW_THREADS, smem, s>>>((const char *)src, r->slot_row, ids, probs, g->T, g->k, g->E,
                                                    g->El, g->Tm, wire_rows(g), data, at, (int64_t)g->meta, g->wire,
                                                    (char *const *)out);
}

/* One payload segment of the pack: src's rows (data bytes each) at byte `at` of the wire rows. */
static void pack_segment(unsigned nb, size_t smem, cudaStream_t s, const moex_ep_geom *g, const moex_ep_routing *r,
                         const void *src, int64_t data, int64_t at, const int32_t *ids, const float *probs,
                         void *const *out) {
    switch (unit_of((uintptr_t)data | (uintptr_t)at | (uintptr_t)g->wire | (uintptr_t)src)) {
    case 16: launch_pack<uint4>(nb, smem, s, g, r, src, data, at, ids, probs, out); break;
    case 8: launch_pack<uint2>(nb, smem, s, g, r, src, data, at, ids, probs, out); break;
    case 4: launch_pack<uint32_t>(nb, smem, s, g, r, src, data, at, ids, probs, out); break;
    case 2: launch_pack<uint16_t>(nb, smem, s, g, r, src, data, at, ids, probs, out); break;
    default: launch_pack<uint8_t>(nb, smem, s, g, r, src, data, at, ids, probs, out); break;
    }
}

static moex_status cuda_ep_pack(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                const moex_ep_routing *r, const moex_ep_rows *src, const int32_t *ids,
                                const float *probs, void *const *out) {
    MOEX_TRY(check_k(ctx, c, g));
    if (g->T == 0) return MOEX_OK;
    if (!ids || !probs) ids = NULL, probs = NULL;
    const unsigned nb = row_blocks(ctx, g->T);
    const size_t smem = slots_smem(g);
    const cudaStream_t s = stream_of(c);
    pack_segment(nb, smem, s, g, r, src->a, (int64_t)src->a_bytes, 0, ids, probs, out);
    CUDA_TRY_LAUNCH(ctx, c->op);
    if (!src->b) return MOEX_OK;
    pack_segment(nb, smem, s, g, r, src->b, (int64_t)src->b_bytes, (int64_t)src->a_bytes, NULL, NULL, out);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

static moex_status cuda_ep_expand_plan(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                       const moex_ep_routing *r, const void *rcv, int64_t *splits, int64_t *dropped) {
    if (g->El > MOEX_CUDA_MAX_EXPERTS)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED,
                         "%s: %lld local experts exceed the CUDA EP kernels' limit (%d)", c->op, (long long)g->El,
                         MOEX_CUDA_MAX_EXPERTS);
    plan_args p;
    p.rcv = (const char *)rcv;
    p.recv_counts = r->recv_counts;
    p.Tm = g->Tm, p.k = g->k, p.El = g->El, p.R = g->R;
    p.n = wire_rows(g) * g->k;   /* >= 1, and fits an int32 (ep.c's geometry) */
    p.chunk = g->El > PLAN_CHUNK ? g->El : PLAN_CHUNK;
    p.nc = p.n / p.chunk > 1 ? p.n / p.chunk : 1;   /* the last chunk takes the rest */
    p.data = (int64_t)g->meta;   /* where the local ids are */
    p.wire = g->wire;
    int *flag = moex_cuda_st(ctx)->flag;
    const int op_id = (int)c->id;
    const size_t smem = (size_t)g->El * sizeof(int32_t);
    const cudaStream_t s = stream_of(c);
    ep_plan_count_kernel<<<(unsigned)p.nc, PLAN_COUNT_THREADS, smem, s>>>(p, splits, r->recv_map, flag, op_id);
    CUDA_TRY_LAUNCH(ctx, c->op);
    ep_plan_scan_kernel<<<1, 1024, 0, s>>>(p, splits, r->recv_map, dropped, flag, op_id);
    CUDA_TRY_LAUNCH(ctx, c->op);
    ep_plan_assign_kernel<<<(unsigned)p.nc, 32, smem, s>>>(p, splits, r->recv_map);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

template <typename U>
static void launch_expand_rows(unsigned nb, cudaStream_t s, const moex_ep_geom *g, const moex_ep_routing *r,
                               const void *rcv, void *dst, int64_t data, int64_t at, float *probs_r) {
    ep_expand_rows_kernel<U><<<nb, ROW_THREADS, 0, s>>>((const char *)rcv, r->recv_counts, r->recv_map, wire_rows(g),
                                                        g->Tm, g->k, g->R, data, at, (int64_t)g->meta, g->wire,
                                                        (char *)dst, probs_r);
}

/* One payload segment of the expansion: bytes [at, at + data) of the wire rows into dst's rows. */
static void expand_segment(unsigned nb, cudaStream_t s, const moex_ep_geom *g, const moex_ep_routing *r,
                           const void *rcv, void *dst, int64_t data, int64_t at, float *probs_r) {
    switch (unit_of((uintptr_t)data | (uintptr_t)at | (uintptr_t)g->wire | (uintptr_t)rcv | (uintptr_t)dst)) {
    case 16: launch_expand_rows<uint4>(nb, s, g, r, rcv, dst, data, at, probs_r); break;
    case 8: launch_expand_rows<uint2>(nb, s, g, r, rcv, dst, data, at, probs_r); break;
    case 4: launch_expand_rows<uint32_t>(nb, s, g, r, rcv, dst, data, at, probs_r); break;
    case 2: launch_expand_rows<uint16_t>(nb, s, g, r, rcv, dst, data, at, probs_r); break;
    default: launch_expand_rows<uint8_t>(nb, s, g, r, rcv, dst, data, at, probs_r); break;
    }
}

static moex_status cuda_ep_expand_rows(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                       const moex_ep_routing *r, const void *rcv, const moex_ep_rows *dst,
                                       float *probs_r) {
    const unsigned nb = row_blocks(ctx, wire_rows(g));
    const cudaStream_t s = stream_of(c);
    expand_segment(nb, s, g, r, rcv, dst->a, (int64_t)dst->a_bytes, 0, probs_r);
    CUDA_TRY_LAUNCH(ctx, c->op);
    if (!dst->b) return MOEX_OK;
    expand_segment(nb, s, g, r, rcv, dst->b, (int64_t)dst->b_bytes, (int64_t)dst->a_bytes, NULL);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

template <typename T>
static void launch_gather_local(unsigned nb, size_t smem, cudaStream_t s, const moex_ep_geom *g,
                                const moex_ep_routing *r, const void *src, const float *dsrc, void *const *out) {
    const bool vec = unit_of((uintptr_t)data_bytes(g) | (uintptr_t)g->wire | (uintptr_t)src) == 16;
    if (vec)
        ep_gather_local_kernel<T, true><<<nb, ROW_THREADS, smem, s>>>((const T *)src, dsrc, r->recv_counts,
                                                                      r->recv_map, wire_rows(g), g->Tm, g->k, g->R,
                                                                      g->H, g->wire, (char *const *)out);
    else
        ep_gather_local_kernel<T, false><<<nb, ROW_THREADS, smem, s>>>((const T *)src, dsrc, r->recv_counts,
                                                                       r->recv_map, wire_rows(g), g->Tm, g->k, g->R,
                                                                       g->H, g->wire, (char *const *)out);
}

static moex_status cuda_ep_gather_local(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                        const moex_ep_routing *r, const void *src, const float *dsrc,
                                        void *const *out) {
    MOEX_TRY(check_k(ctx, c, g));
    const unsigned nb = row_blocks(ctx, wire_rows(g));
    const size_t smem = slots_smem(g);
    const cudaStream_t s = stream_of(c);
    if (g->dt == MOEX_DTYPE_F32) launch_gather_local<float>(nb, smem, s, g, r, src, dsrc, out);
    else if (g->dt == MOEX_DTYPE_BF16) launch_gather_local<bf16>(nb, smem, s, g, r, src, dsrc, out);
    else launch_gather_local<f16>(nb, smem, s, g, r, src, dsrc, out);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

template <typename T, typename TD>
static void launch_reduce(unsigned nb, size_t smem, cudaStream_t s, const moex_ep_geom *g, const moex_ep_routing *r,
                          const void *rcv, void *dst, float *dprobs) {
    const uintptr_t bits = (uintptr_t)data_bytes(g) | (uintptr_t)g->wire | (uintptr_t)rcv | (uintptr_t)dst |
                           (uintptr_t)(g->H * (int64_t)sizeof(TD));
    if (unit_of(bits) == 16)
        ep_reduce_kernel<T, TD, true><<<nb, ROW_THREADS, smem, s>>>((const char *)rcv, r->slot_row, g->T, g->k,
                                                                    wire_rows(g), g->H, g->wire, (TD *)dst,
                                                                    dprobs);
    else
        ep_reduce_kernel<T, TD, false><<<nb, ROW_THREADS, smem, s>>>((const char *)rcv, r->slot_row, g->T, g->k,
                                                                     wire_rows(g), g->H, g->wire, (TD *)dst,
                                                                     dprobs);
}

template <typename T>
static void launch_reduce_to(unsigned nb, size_t smem, cudaStream_t s, const moex_ep_geom *g,
                             const moex_ep_routing *r, const void *rcv, void *dst, moex_dtype dst_dt, float *dprobs) {
    if (dst_dt == MOEX_DTYPE_F32) launch_reduce<T, float>(nb, smem, s, g, r, rcv, dst, dprobs);
    else launch_reduce<T, T>(nb, smem, s, g, r, rcv, dst, dprobs);
}

static moex_status cuda_ep_reduce(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                  const moex_ep_routing *r, const void *rcv, void *dst, moex_dtype dst_dt,
                                  float *dprobs) {
    MOEX_TRY(check_k(ctx, c, g));
    if (dst_dt != MOEX_DTYPE_F32 && dst_dt != g->dt)
        return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: the EP reduce writes f32 or %s, not %s", c->op,
                         moex_dtype_name(g->dt), moex_dtype_name(dst_dt));
    if (g->T == 0) return MOEX_OK;
    const unsigned nb = row_blocks(ctx, g->T);
    const size_t smem = slots_smem(g);
    const cudaStream_t s = stream_of(c);
    if (g->dt == MOEX_DTYPE_F32) launch_reduce_to<float>(nb, smem, s, g, r, rcv, dst, dst_dt, dprobs);
    else if (g->dt == MOEX_DTYPE_BF16) launch_reduce_to<bf16>(nb, smem, s, g, r, rcv, dst, dst_dt, dprobs);
    else launch_reduce_to<f16>(nb, smem, s, g, r, rcv, dst, dst_dt, dprobs);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

extern "C" const moex_ep_kernels moex_cuda_ep_kernels = {
    .route = cuda_ep_route,
    .pack = cuda_ep_pack,
    .expand_plan = cuda_ep_expand_plan,
    .expand_rows = cuda_ep_expand_rows,
    .gather_local = cuda_ep_gather_local,
    .reduce = cuda_ep_reduce,
};
