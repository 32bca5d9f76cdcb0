/*
 * sm80_grouped_gemm.cu - the portable grouped GEMM (sm_80 and newer).
 *
 * One kernel, two schedules (moex_cuda_gemm_kind in cuda_ops.h):
 *   ROWS:  grid (N tiles, row tiles); a CTA finds its group by a binary search of its row
 *          tile in the device schedule (tiles[]), so the host never sees a split value.
 *   WGRAD: grid (N tiles, M tiles, G); a CTA reduces over its group's rows.
 * Split-K (the router's dense GEMMs, whose few output tiles would leave most SMs idle): grid z
 * is the split; each CTA writes its raw f32 sums into its own slice, and split_k_finish_kernel
 * adds the slices in a fixed order and applies the epilogue, so results stay deterministic.
 * Tiles are 128 x 128 x 32 with 256 threads. bf16/f16 operands (of the compute type) go
 * global -> shared memory by cp.async in a 4-stage ring, kept in their global layout
 * (reduction- or output-contiguous) and read with ldmatrix (.trans for the latter);
 * mma.sync m16n8k16 with f32 accumulators, 8 warps (2 x 4) of 64 x 32. Other operands
 * (f32, or f32 converted to 16 bits for the router GEMMs) are staged through registers
 * into one or two shared buffers; f32 computes with plain FFMA (8 x 8 outputs per thread),
 * never TF32. Every output element is owned by exactly one thread and summed in a fixed order,
 * so results are deterministic. Loads outside the valid rows/columns read zeros, stores are
 * guarded, so odd sizes and clamped bad splits never touch memory outside the tensors.
 */
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_ops.h"

#define GBM MOEX_CUDA_GEMM_TILE
#define GBN MOEX_CUDA_GEMM_TILE
#define GBK 32
#define GTHREADS 256

typedef struct gemm_params {
    int kind;
    const int64_t *off;
    const int32_t *tiles;
    int G;
    int64_t m_dim, n_dim, k_dim;
    const void *a;
    int64_t lda;
    const void *b;
    void *const *b_ptrs;
    int64_t b_gstride, ldb;
    int b_kc;
    void *c;
    void *const *c_ptrs;
    int64_t c_gstride, ldc;
    int accumulate;
    const void *bias;
    int bias_f32, bias_bf16;
    int64_t bias_gstride;
    int bias_scaled;
    const float *probs;
    const float *residual;
    int64_t ldr;
    int ksplit;             /* > 1: blockIdx.z is the split, acc goes raw into part */
    float *part;
    int64_t part_rows;
} gemm_params;

/* Shared memory of one operand tile (128 output rows x 32 reduction steps), per stage:
 *   [row][k] with row stride SK (f32: 33, conflict-free SIMT reads; 16-bit: 40 = 80 bytes,
 *            16-byte aligned rows, conflict-free ldmatrix), or
 *   [k][row] with row stride SR = 136 (16-bit operands whose global layout has the output
 *            dimension contiguous: copied as 16-byte vectors, read with ldmatrix.trans).  */
template <typename TC> struct smem_cfg {
    static constexpr int SK = GBK + 8, SR = GBM + 8, STAGES = 2;
    static constexpr int ELEMS = GBM * SK > GBK * SR ? GBM * SK : GBK * SR;
};
template <> struct smem_cfg<float> {
    static constexpr int SK = GBK + 1, SR = 0, STAGES = 1, ELEMS = GBM * (GBK + 1);
};

/* Element e of a 16-byte vector holding TS values, as f32. */
template <typename TS> __device__ __forceinline__ float vec_elem(const uint4 &r, int e);
static __device__ __forceinline__ uint32_t vec_word(const uint4 &r, int w) {
    return w == 0 ? r.x : w == 1 ? r.y : w == 2 ? r.z : r.w;
}
template <> __device__ __forceinline__ float vec_elem<float>(const uint4 &r, int e) {
    return __uint_as_float(vec_word(r, e));
}
template <> __device__ __forceinline__ float vec_elem<bf16>(const uint4 &r, int e) {
    uint32_t w = vec_word(r, e >> 1);
    return __uint_as_float(((e & 1) ? (w >> 16) : (w & 0xffffu)) << 16);
}
template <> __device__ __forceinline__ float vec_elem<f16>(const uint4 &r, int e) {
    uint32_t w = vec_word(r, e >> 1);
    return __half2float(__ushort_as_half((unsigned short)((e & 1) ? (w >> 16) : (w & 0xffffu))));
}

/* One operand tile: 128 rows (an output dimension) x 32 reduction steps, element (row, k)
 * at base[row * ld + k] when kc (reduction contiguous) else base[k * ld + row]; rows >=
 * `rows` or k >= `kvalid` read as zero. The next tile is staged in registers while the
 * current one is multiplied. RAW (16-bit operand of the compute type): 16-byte vectors
 * copied unchanged, into [row][k] (kc) or [k][row] (trans); otherwise values converted
 * through f32 into [row][k]. */
template <typename TS, typename TC> struct tile_loader {
    static constexpr int VEC = 16 / sizeof(TS);
    static constexpr int NV = GBM * GBK / VEC / GTHREADS;
    static constexpr bool RAW = sizeof(TC) == 2 && std::is_same<TS, TC>::value;
    static constexpr int SK = smem_cfg<TC>::SK, SR = smem_cfg<TC>::SR;
    uint4 raw[RAW ? NV : 1];
    float v[RAW ? 1 : NV][VEC];
    const TS *base;
    int64_t ld, rows;
    int kc, vec_ok, trans;

    __device__ void init(const TS *b, int64_t ld_, int64_t rows_, int kc_) {
        base = b;
        ld = ld_;
        rows = rows_;
        kc = kc_;
        vec_ok = ((uintptr_t)b % 16 == 0) && (ld_ % VEC == 0);
        trans = RAW && !kc_;
    }

    __device__ __forceinline__ void coords(int i, int &row, int &kk) const {
        int idx = threadIdx.x + i * GTHREADS;
        if (kc) {
            row = idx / (GBK / VEC);
            kk = (idx % (GBK / VEC)) * VEC;
        } else {
            kk = idx / (GBM / VEC);
            row = (idx % (GBM / VEC)) * VEC;
        }
    }

    /* Vector i of the tile at k0: sets its place (row, kk) in the tile, returns its k. */
    __device__ __forceinline__ int64_t locate(int i, int64_t k0, int &row, int &kk) const {
        coords(i, row, kk);
        return k0 + kk;
    }

    /* Whether all VEC elements of the vector at (row, k) lie inside `rows` and `kvalid`. */
    __device__ __forceinline__ bool whole(int row, int64_t k, int64_t kvalid) const {
        return kc ? (row < rows && k + VEC <= kvalid) : (k < kvalid && row + VEC <= rows);
    }

    /* The source address of the vector at (row, k). */
    __device__ __forceinline__ const TS *src_at(int row, int64_t k) const {
        return kc ? base + row * ld + k : base + k * ld + row;
    }

    /* RAW only: the VEC 16-bit elements of one vector at (row, k) gathered one by one,
     * zero where they fall past `rows` or `kvalid` (a tile edge, or an unaligned source). */
    __device__ __forceinline__ uint4 gather16(int row, int64_t k, int64_t kvalid) const {
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < VEC; e += 2) {
            uint32_t h[2];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int64_t rr = kc ? row : row + e + u, ke = kc ? k + e + u : k;
                h[u] = (rr < rows && ke < kvalid)
                           ? (uint32_t)((const unsigned short *)base)[kc ? rr * ld + ke : ke * ld + rr]
                           : 0u;
            }
            w[e / 2] = h[0] | (h[1] << 16);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }

    __device__ void load(int64_t k0, int64_t kvalid) {
#pragma unroll
        for (int i = 0; i < NV; i++) {
            int row, kk;
            int64_t k = locate(i, k0, row, kk);
            bool full = whole(row, k, kvalid);
            if (full && vec_ok) {
                uint4 r = __ldg((const uint4 *)src_at(row, k));
                if constexpr (RAW) {
                    raw[i] = r;
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++) v[i][e] = vec_elem<TS>(r, e);
                }
            } else if constexpr (RAW) {
                raw[i] = gather16(row, k, kvalid);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    int64_t rr = kc ? row : row + e, ke = kc ? k + e : k;
                    v[i][e] = (rr < rows && ke < kvalid) ? to_f32(base[kc ? rr * ld + ke : ke * ld + rr]) : 0.0f;
                }
            }
        }
    }

    /* RAW only: copies the tile at k0 straight into shared memory `sm`: cp.async for
     * whole aligned vectors (completed by cp.async.wait_group), plain stores for the rest. */
    __device__ void issue(TC *sm, int64_t k0, int64_t kvalid) {
#pragma unroll
        for (int i = 0; i < NV; i++) {
            int row, kk;
            int64_t k = locate(i, k0, row, kk);
            bool full = whole(row, k, kvalid);
            TC *dst = kc ? &sm[row * SK + kk] : &sm[kk * SR + row];
            if (full && vec_ok) {
                const TS *src = src_at(row, k);
                uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
            } else {
                *(uint4 *)dst = gather16(row, k, kvalid);
            }
        }
    }

    __device__ void store(TC *sm) const {
#pragma unroll
        for (int i = 0; i < NV; i++) {
            int row, kk;
            coords(i, row, kk);
            if constexpr (RAW) {
                if (kc) *(uint4 *)&sm[row * SK + kk] = raw[i];
                else *(uint4 *)&sm[kk * SR + row] = raw[i];
            } else if (kc) {
#pragma unroll
                for (int e = 0; e < VEC; e++) sm[row * SK + kk + e] = from_f32<TC>(v[i][e]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) sm[(row + e) * SK + kk] = from_f32<TC>(v[i][e]);
            }
        }
    }
};

template <typename TC> __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, const uint32_t *b);
template <> __device__ __forceinline__ void mma16816<bf16>(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma16816<f16>(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Four 8x8 16-bit matrices from shared memory; lane l gives the row address of matrix l/8. */
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
static __device__ __forceinline__ void ldsm_x4_trans(uint32_t *r, const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* The cp.async pipeline of 16-bit operands of the compute type: ASYNC_STAGES tiles in
 * flight, each stage A then B, ASYNC_STAGE_ELEMS elements of each (dynamic shared memory,
 * 80 KB: two CTAs fit on an SM). */
#define ASYNC_STAGES 4
#define ASYNC_STAGE_ELEMS (2 * smem_cfg<bf16>::ELEMS)
#define ASYNC_SMEM_BYTES (ASYNC_STAGES * ASYNC_STAGE_ELEMS * 2)

template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/* acc += the 128 x 128 x 32 product of one stage: A and B tiles in [row][k] (stride SK) or,
 * when a_trans / b_trans, [k][row] (stride SR); warp (wm, wn) owns a 64 x 32 block. */
template <typename TC>
static __device__ __forceinline__ void mma_stage(const TC *as, const TC *bs, int a_trans, int b_trans, int wm,
                                                 int wn, float *acc) {
    constexpr int SK = smem_cfg<TC>::SK, SR = smem_cfg<TC>::SR;
    const int lane = threadIdx.x & 31, l8 = lane & 7, q1 = (lane >> 3) & 1, q2 = lane >> 4;
#pragma unroll
    for (int ks = 0; ks < GBK; ks += 16) {
        uint32_t af[4][4], bfr[4][2];
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
            int m0 = wm + mt * 16;
            if (!a_trans) ldsm_x4(af[mt], &as[(m0 + l8 + q1 * 8) * SK + ks + q2 * 8]);
            else ldsm_x4_trans(af[mt], &as[(ks + l8 + q2 * 8) * SR + m0 + q1 * 8]);
        }
#pragma unroll
        for (int np = 0; np < 2; np++) {
            int n0 = wn + np * 16;
            uint32_t r[4];
            if (!b_trans) ldsm_x4(r, &bs[(n0 + l8 + q2 * 8) * SK + ks + q1 * 8]);
            else ldsm_x4_trans(r, &bs[(ks + l8 + q1 * 8) * SR + n0 + q2 * 8]);
            bfr[2 * np][0] = r[0];
            bfr[2 * np][1] = r[1];
            bfr[2 * np + 1][0] = r[2];
            bfr[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++) mma16816<TC>(&acc[(mt * 4 + nt) * 4], af[mt], bfr[nt]);
    }
}

/* Where a CTA's outputs go. */
typedef struct tile_out {
    int g;
    int64_t row0;       /* ROWS: first global row; WGRAD: first row of C_g   */
    int64_t rows;       /* valid rows in this tile                           */
    int64_t n0;
    void *cg;           /* WGRAD: C_g */
} tile_out;

template <typename TO>
__device__ __forceinline__ void store_out(const gemm_params &p, const tile_out &t, int m, int n, float acc) {
    int64_t col = t.n0 + n;
    if (m >= t.rows || col >= p.n_dim) return;
    int64_t r = t.row0 + m;
    if (p.ksplit > 1) {   /* the split's raw sum; split_k_finish applies the epilogue */
        p.part[((int64_t)blockIdx.z * p.part_rows + r) * p.n_dim + col] = acc;
        return;
    }
    TO *dst;
    if (p.kind == MOEX_CUDA_GEMM_ROWS) {
        if (p.bias) {
            int64_t bi = (int64_t)t.g * p.bias_gstride + col;
            float b = load_any(p.bias, p.bias_f32, p.bias_bf16, bi);
            acc += p.bias_scaled ? p.probs[r] * b : b;
        }
        if (p.residual) acc += p.residual[r * p.ldr + col];
        dst = (TO *)p.c + r * p.ldc + col;
    } else {
        dst = (TO *)t.cg + r * p.ldc + col;
    }
    if (p.accumulate) *(float *)dst += acc;
    else *dst = from_f32<TO>(acc);
}

/* The reduction range of this CTA's split (blockIdx.z of p.ksplit, or all of it): its start
 * in [0, len), and *kvalid its length; the splits take equal runs of whole k tiles, and a
 * split past the end has none (its slice of part gets zeros). */
__device__ __forceinline__ int64_t split_start(const gemm_params &p, int64_t len, int64_t *kvalid) {
    if (p.ksplit <= 1) {
        *kvalid = len;
        return 0;
    }
    const int64_t per = (len + (int64_t)p.ksplit * GBK - 1) / ((int64_t)p.ksplit * GBK) * GBK;
    const int64_t k0 = min(len, (int64_t)blockIdx.z * per);
    *kvalid = min(per, len - k0);
    return k0;
}

template <typename TC, typename TA, typename TB, typename TO>
__global__ void __launch_bounds__(GTHREADS) grouped_gemm_kernel(gemm_params p) {
    constexpr int SK = smem_cfg<TC>::SK, ST = smem_cfg<TC>::STAGES;
    constexpr int EL = smem_cfg<TC>::ELEMS;
    /* 16-bit operands of the compute type take the cp.async pipeline */
    constexpr bool ASYNC = tile_loader<TA, TC>::RAW && tile_loader<TB, TC>::RAW;

    tile_loader<TA, TC> la;
    tile_loader<TB, TC> lb;
    tile_out t;
    int64_t kvalid;
    t.n0 = (int64_t)blockIdx.x * GBN;
    if (p.kind == MOEX_CUDA_GEMM_ROWS) {
        int64_t tile = blockIdx.y;
        if (tile >= p.tiles[p.G]) return;
        t.g = find_group_i32(p.tiles, p.G, tile);
        t.row0 = p.off[t.g] + (tile - p.tiles[t.g]) * GBM;
        t.rows = min((int64_t)GBM, p.off[t.g + 1] - t.row0);
        t.cg = NULL;
        const TB *bg = p.b_ptrs ? (const TB *)p.b_ptrs[t.g] : (const TB *)p.b + t.g * p.b_gstride;
        const int64_t k0 = split_start(p, p.k_dim, &kvalid);
        la.init((const TA *)p.a + t.row0 * p.lda + k0, p.lda, t.rows, 1);
        lb.init(p.b_kc ? bg + t.n0 * p.ldb + k0 : bg + k0 * p.ldb + t.n0, p.ldb, p.n_dim - t.n0, p.b_kc);
    } else {
        t.g = p.ksplit > 1 ? 0 : blockIdx.z;
        int64_t r0 = p.off[t.g];
        const int64_t n = p.off[t.g + 1] - r0;
        if (n <= 0 && p.accumulate && p.ksplit <= 1) return;   /* += of an empty group: unchanged */
        r0 += split_start(p, n, &kvalid);
        t.row0 = (int64_t)blockIdx.y * GBM;
        t.rows = min((int64_t)GBM, p.m_dim - t.row0);
        t.cg = p.c_ptrs ? p.c_ptrs[t.g] : (void *)((TO *)p.c + t.g * p.c_gstride);
        la.init((const TA *)p.a + r0 * p.lda + t.row0, p.lda, t.rows, 0);
        lb.init((const TB *)p.b + r0 * p.ldb + t.n0, p.ldb, p.n_dim - t.n0, 0);
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gq = lane >> 2, tq = lane & 3;            /* mma fragment coordinates  */
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4; /* SIMT coordinates */
    constexpr bool simt = sizeof(TC) == 4;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    const int64_t nk = (kvalid + GBK - 1) / GBK;

    if constexpr (ASYNC) {
        /* stage s holds A at sm + s * ASYNC_STAGE_ELEMS and B EL elements further */
        extern __shared__ uint4 dyn_smem[];
        TC *sm = (TC *)dyn_smem;
#pragma unroll
        for (int st = 0; st < ASYNC_STAGES - 1; st++) {
            if (st < nk) {
                la.issue(sm + st * ASYNC_STAGE_ELEMS, st * GBK, kvalid);
                lb.issue(sm + st * ASYNC_STAGE_ELEMS + EL, st * GBK, kvalid);
            }
            cp_async_commit();
        }
        for (int64_t kt = 0; kt < nk; kt++) {
            cp_async_wait<ASYNC_STAGES - 2>();   /* tile kt has landed (this thread's part) */
            __syncthreads();                      /* ... everyone's; tile kt-1 is consumed  */
            int64_t nt = kt + ASYNC_STAGES - 1;
            if (nt < nk) {
                TC *dst = sm + (nt % ASYNC_STAGES) * ASYNC_STAGE_ELEMS;
                la.issue(dst, nt * GBK, kvalid);
                lb.issue(dst + EL, nt * GBK, kvalid);
            }
            cp_async_commit();
            const TC *src = sm + (kt % ASYNC_STAGES) * ASYNC_STAGE_ELEMS;
            mma_stage<TC>(src, src + EL, la.trans, lb.trans, wm, wn, acc);
        }
        cp_async_wait<0>();
    } else {
        __shared__ __align__(16) TC As[ST][EL];
        __shared__ __align__(16) TC Bs[ST][EL];
        if (nk > 0) {
            la.load(0, kvalid);
            lb.load(0, kvalid);
            la.store(As[0]);
            lb.store(Bs[0]);
        }
        __syncthreads();
        for (int64_t kt = 0; kt < nk; kt++) {
            const bool more = kt + 1 < nk;
            if (more) {
                la.load((kt + 1) * GBK, kvalid);
                lb.load((kt + 1) * GBK, kvalid);
            }
            const TC *as = As[kt % ST], *bs = Bs[kt % ST];
            if constexpr (simt) {
#pragma unroll 4
                for (int k = 0; k < GBK; k++) {
                    float av[8], bv[8];
#pragma unroll
                    for (int i = 0; i < 8; i++) av[i] = to_f32(as[(ty + 16 * i) * SK + k]);
#pragma unroll
                    for (int j = 0; j < 8; j++) bv[j] = to_f32(bs[(tx + 16 * j) * SK + k]);
#pragma unroll
                    for (int i = 0; i < 8; i++)
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[i * 8 + j] = fmaf(av[i], bv[j], acc[i * 8 + j]);
                }
            } else {
                mma_stage<TC>(as, bs, la.trans, lb.trans, wm, wn, acc);
            }
            if (more) {
                if (ST == 1) __syncthreads();   /* one buffer: everyone is done reading it */
                la.store(As[(kt + 1) % ST]);
                lb.store(Bs[(kt + 1) % ST]);
            }
            __syncthreads();
        }
    }

    if constexpr (simt) {
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) store_out<TO>(p, t, ty + 16 * i, tx + 16 * j, acc[i * 8 + j]);
    } else {
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const float *d = &acc[(mt * 4 + nt) * 4];
                int r = wm + mt * 16 + gq, n = wn + nt * 8 + 2 * tq;
                store_out<TO>(p, t, r, n, d[0]);
                store_out<TO>(p, t, r, n + 1, d[1]);
                store_out<TO>(p, t, r + 8, n, d[2]);
                store_out<TO>(p, t, r + 8, n + 1, d[3]);
            }
    }
}

template <typename TC, typename TA, typename TB, typename TO>
static void launch(const gemm_params &p, dim3 grid, cudaStream_t stream) {
    constexpr bool async = tile_loader<TA, TC>::RAW && tile_loader<TB, TC>::RAW;
    grouped_gemm_kernel<TC, TA, TB, TO><<<grid, GTHREADS, async ? ASYNC_SMEM_BYTES : 0, stream>>>(p);
}

/* C[r, n] = (sum over the splits s, in order, of part[s, r, n]) with the ROWS epilogue's
 * residual, or C += it (accumulate, f32), for r < part_rows, n < n_dim. The dense GEMMs only
 * (no bias; C packed, ld ldc). */
template <typename TO> static __global__ void split_k_finish_kernel(gemm_params p) {
    const int64_t n = p.part_rows * p.n_dim;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / p.n_dim, col = i % p.n_dim;
        float acc = 0.0f;
        for (int s = 0; s < p.ksplit; s++) acc += p.part[s * n + i];
        if (p.residual) acc += p.residual[r * p.ldr + col];
        TO *dst = (TO *)p.c + r * p.ldc + col;
        if (p.accumulate) *(float *)dst += acc;
        else *dst = from_f32<TO>(acc);
    }
}

size_t moex_cuda_gemm_part_bytes(int ksplit, int64_t rows, int64_t n_dim) {
    return ksplit > 1 ? moex_sz_mul(moex_sz_bytes(rows, n_dim, sizeof(float)), (size_t)ksplit) : 0;
}

/* Raises the dynamic shared-memory limit of the cp.async instantiations (once per device,
 * from context creation, so that no operation calls it). */
moex_status moex_cuda_gemm_prepare(moex_context *ctx) {
    const char *op = "moex_context_create";
    CUDA_TRY(ctx, op, cudaFuncSetAttribute(grouped_gemm_kernel<bf16, bf16, bf16, bf16>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, ASYNC_SMEM_BYTES));
    CUDA_TRY(ctx, op, cudaFuncSetAttribute(grouped_gemm_kernel<bf16, bf16, bf16, float>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, ASYNC_SMEM_BYTES));
    CUDA_TRY(ctx, op, cudaFuncSetAttribute(grouped_gemm_kernel<f16, f16, f16, f16>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, ASYNC_SMEM_BYTES));
    CUDA_TRY(ctx, op, cudaFuncSetAttribute(grouped_gemm_kernel<f16, f16, f16, float>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, ASYNC_SMEM_BYTES));
    return MOEX_OK;
}

template <typename TC, typename TA>
static int launch_to(moex_dtype to, const gemm_params &p, dim3 grid, cudaStream_t stream) {
    if (to == MOEX_DTYPE_F32) launch<TC, TA, TC, float>(p, grid, stream);
    else launch<TC, TA, TC, TC>(p, grid, stream);
    return 1;
}

static void launch_finish(moex_dtype to, const gemm_params &p, cudaStream_t stream) {
    const int64_t n = p.part_rows * p.n_dim, blocks = (n + 255) / 256;
    const unsigned nb = (unsigned)(blocks < 4096 ? blocks : 4096);
    by_dtype(to, [&](auto e) { split_k_finish_kernel<typename decltype(e)::type><<<nb, 256, 0, stream>>>(p); });
}

moex_status moex_cuda_gemm_run(moex_context *ctx, const char *op, const moex_cuda_gemm *g,
                               cudaStream_t stream) {
    MOEX_TRY(moex_cuda_sched_ready(ctx, op, g->sched));
    gemm_params p;
    p.kind = g->kind;
    p.off = g->sched->off;
    p.tiles = g->sched->tiles;
    p.G = (int)g->sched->G;
    p.m_dim = g->m_dim;
    p.n_dim = g->n_dim;
    p.k_dim = g->k_dim;
    p.a = g->a;
    p.lda = g->lda;
    p.b = g->b;
    p.b_ptrs = g->b_ptrs;
    p.b_gstride = g->b_gstride;
    p.ldb = g->ldb;
    p.b_kc = g->b_kc;
    p.c = g->c;
    p.c_ptrs = g->c_ptrs;
    p.c_gstride = g->c_gstride;
    p.ldc = g->ldc;
    p.accumulate = g->accumulate;
    p.bias = g->bias;
    p.bias_f32 = g->bias_dt == MOEX_DTYPE_F32;
    p.bias_bf16 = g->bias_dt == MOEX_DTYPE_BF16;
    p.bias_gstride = g->bias_gstride;
    p.bias_scaled = g->bias_scaled;
    p.probs = g->probs;
    p.residual = g->residual;
    p.ldr = g->ldr;
    p.ksplit = g->ksplit > 1 ? g->ksplit : 1;
    p.part = g->part;
    p.part_rows = g->kind == MOEX_CUDA_GEMM_ROWS ? g->sched->T : g->m_dim;
    if (p.ksplit > 1 && (g->bias || (g->kind == MOEX_CUDA_GEMM_WGRAD && g->sched->G != 1) || !g->part ||
                         g->c_ptrs || p.ksplit > 64))
        return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: split-K takes a dense GEMM (no bias, one group, part)", op);

    dim3 grid;
    int64_t nt = (g->n_dim + GBN - 1) / GBN;
    if (g->kind == MOEX_CUDA_GEMM_ROWS) {
        int64_t mt = moex_cuda_max_tiles(g->sched->T, g->sched->G);
        if (nt == 0 || g->sched->T == 0) return MOEX_OK;
        if (mt > 65535 || nt > 2147483647)
            return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: %lld row tiles exceed the grid limit (T too large)",
                             op, (long long)mt);
        grid = dim3((unsigned)nt, (unsigned)mt, (unsigned)p.ksplit);
    } else {
        int64_t mt = (g->m_dim + GBM - 1) / GBM;
        if (nt == 0 || mt == 0) return MOEX_OK;
        if (mt > 65535 || g->sched->G > 65535)
            return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: weight-gradient grid too large (%lld x %lld groups)",
                             op, (long long)mt, (long long)g->sched->G);
        grid = dim3((unsigned)nt, (unsigned)mt, p.ksplit > 1 ? (unsigned)p.ksplit : (unsigned)g->sched->G);
    }
    if (g->accumulate && g->to != MOEX_DTYPE_F32)
        return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: accumulating GEMM needs an f32 output", op);

    int ok = 0;
    if (g->tc == MOEX_DTYPE_F32) {
        if (g->ta == MOEX_DTYPE_F32 && g->tb == MOEX_DTYPE_F32 && g->to == MOEX_DTYPE_F32) {
            launch<float, float, float, float>(p, grid, stream);
            ok = 1;
        }
    } else if (g->tc == MOEX_DTYPE_BF16 && g->tb == MOEX_DTYPE_BF16 &&
               (g->to == MOEX_DTYPE_F32 || g->to == MOEX_DTYPE_BF16)) {
        if (g->ta == MOEX_DTYPE_BF16) ok = launch_to<bf16, bf16>(g->to, p, grid, stream);
        else if (g->ta == MOEX_DTYPE_F32) ok = launch_to<bf16, float>(g->to, p, grid, stream);
    } else if (g->tc == MOEX_DTYPE_F16 && g->tb == MOEX_DTYPE_F16 &&
               (g->to == MOEX_DTYPE_F32 || g->to == MOEX_DTYPE_F16)) {
        if (g->ta == MOEX_DTYPE_F16) ok = launch_to<f16, f16>(g->to, p, grid, stream);
        else if (g->ta == MOEX_DTYPE_F32) ok = launch_to<f16, float>(g->to, p, grid, stream);
    }
    if (!ok)
        return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: no GEMM kernel for operand dtypes %d/%d, compute %d, out %d",
                         op, (int)g->ta, (int)g->tb, (int)g->tc, (int)g->to);
    CUDA_TRY_LAUNCH(ctx, op);
    if (p.ksplit > 1) {
        launch_finish(g->to, p, stream);
        CUDA_TRY_LAUNCH(ctx, op);
    }
    return MOEX_OK;
}
