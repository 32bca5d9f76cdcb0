/*
 * sm90_ptx.cuh - private: the Hopper (sm_90a) PTX that the sm90 grouped GEMM uses, each
 * instruction wrapped in a named inline function: mbarriers, TMA tensor loads and stores
 * (multicast too), cluster barriers, wgmma (fence / m64n256k16 with K- or MN-major B, or
 * both operands MN-major / commit / wait), shared-memory matrix descriptors, named
 * barriers and setmaxnreg.
 *
 * Everything here exists only in the sm_90a device pass: MOEX_SM90_DEVICE is 1 there and 0
 * in every other pass (host, sm_80, plain sm_90), so the other passes never see wgmma or
 * setmaxnreg. Kernels that use these wrappers put their body under `#if MOEX_SM90_DEVICE`.
 */
#ifndef MOEX_SM90_PTX_CUH
#define MOEX_SM90_PTX_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOEX_SM90_DEVICE 1
#else
#define MOEX_SM90_DEVICE 0
#endif

#if MOEX_SM90_DEVICE

static __device__ __forceinline__ uint32_t sm90_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- mbarriers (CTA scope) --------------------------------------------------------- */

static __device__ __forceinline__ void sm90_mbar_init(uint64_t *bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm90_smem_addr(bar)), "r"(arrivals));
}

/* Makes the initialised barriers visible to the async proxy (TMA) before first use. */
static __device__ __forceinline__ void sm90_mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival that also announces `bytes` of TMA transactions for the current phase. */
static __device__ __forceinline__ void sm90_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sm90_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void sm90_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm90_smem_addr(bar)) : "memory");
}

/* Spins until the phase with the given parity has completed. A fresh barrier counts its
 * phase "parity 1" as completed, so waiting on parity 1 first returns at once. */
static __device__ __forceinline__ void sm90_mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t addr = sm90_smem_addr(bar), done;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (!done);
}

/* ---- TMA tensor loads: global (tensor map) -> shared, completing on an mbarrier ------- */

static __device__ __forceinline__ void sm90_tma_prefetch_map(const void *tmap) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)tmap) : "memory");
}

static __device__ __forceinline__ void sm90_tma_load_2d(void *dst, const void *tmap, uint64_t *bar, int32_t c0,
                                                        int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "r"(c0), "r"(c1)
        : "memory");
}

static __device__ __forceinline__ void sm90_tma_load_3d(void *dst, const void *tmap, uint64_t *bar, int32_t c0,
                                                        int32_t c1, int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

/* ---- TMA tensor stores: shared -> global (tensor map), in bulk groups ----------------- */

/* Orders this thread's ordinary shared-memory writes before later async-proxy (TMA) reads. */
static __device__ __forceinline__ void sm90_fence_proxy_async_smem(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

static __device__ __forceinline__ void sm90_tma_store_2d(const void *tmap, const void *src, int32_t c0, int32_t c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     (uint64_t)tmap),
                 "r"(sm90_smem_addr(src)), "r"(c0), "r"(c1)
                 : "memory");
}

static __device__ __forceinline__ void sm90_bulk_commit(void) {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Waits until at most N bulk groups of this thread still read their shared-memory source. */
template <int N> static __device__ __forceinline__ void sm90_bulk_wait_read(void) {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/* Waits until at most N bulk groups of this thread are still incomplete (writes done). */
template <int N> static __device__ __forceinline__ void sm90_bulk_wait(void) {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Barrier `id` (1..15) over `threads` threads (a multiple of 32), e.g. one warpgroup. */
static __device__ __forceinline__ void sm90_named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- small asynchronous copies global -> shared (the epilogue's bias row) ------------- */

/* Copies BYTES (4 or 8) from global `src` to shared `dst` without holding registers; complete
 * after sm90_cp_async_wait_all of the same thread (then a barrier for the other threads). */
template <int BYTES> static __device__ __forceinline__ void sm90_cp_async(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(sm90_smem_addr(dst)), "l"(src), "n"(BYTES)
                 : "memory");
}
static __device__ __forceinline__ void sm90_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
static __device__ __forceinline__ void sm90_cp_async_wait_all(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* ---- clusters (2 CTAs sharing weight tiles through TMA multicast) ---------------------- */

static __device__ __forceinline__ uint32_t sm90_cluster_rank(void) {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

/* Every thread of every CTA in the cluster arrives, then waits (release / acquire). */
static __device__ __forceinline__ void sm90_cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

/* Arrives on the barrier at the same shared-memory offset in CTA `cta` of the cluster. The
 * default (.release at CTA scope) semantics: the callers arrive only after their wgmma reads
 * of the stage completed (wgmma wait), which is all the peer's producer needs before it
 * overwrites the stage. `.release.cluster` would make every arrival a cluster-scope memory
 * fence (a MEMBAR that stalls the warpgroup's next wgmma): measured 25-30% slower. */
static __device__ __forceinline__ void sm90_mbar_arrive_cluster(uint64_t *bar, uint32_t cta) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(sm90_smem_addr(bar)), "r"(cta));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

/* A 3-D tensor load written to the same offset in every CTA of `cta_mask`, completing on the
 * barrier at the same offset in each of them. */
static __device__ __forceinline__ void sm90_tma_load_3d_multicast(void *dst, const void *tmap, uint64_t *bar,
                                                                  int32_t c0, int32_t c1, int32_t c2,
                                                                  uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5, %6}], [%2], %3;\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

/* ---- register budget per warpgroup ------------------------------------------------- */

template <int R> static __device__ __forceinline__ void sm90_setmaxnreg_dec(void) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> static __device__ __forceinline__ void sm90_setmaxnreg_inc(void) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

/* ---- wgmma ------------------------------------------------------------------------- */

/* Shared-memory matrix descriptor for a K-major tile stored as TMA writes it with 128-byte
 * swizzle: rows of 64 two-byte elements (128 B), 8-row core groups 1024 B apart. The tile
 * must start on a 1024-byte boundary; a k offset inside the 128-byte row is added to the
 * start address (16 elements = 32 B per wgmma k step). */
static __device__ __forceinline__ uint64_t sm90_desc_sw128(const void *smem) {
    uint64_t addr = sm90_smem_addr(smem);
    uint64_t d = (addr & 0x3FFFFull) >> 4;  /* start address, 16-byte units   */
    d |= (uint64_t)1 << 16;                 /* leading byte offset (unused)   */
    d |= (uint64_t)(1024 >> 4) << 32;       /* stride byte offset: 8 rows     */
    d |= (uint64_t)1 << 62;                 /* layout: 128-byte swizzle       */
    return d;
}

/* Descriptor d moved `bytes` (a multiple of 16) further into shared memory: the consumers
 * build one descriptor per operand before their loop and reach every stage and k step by
 * this add. Only the low word changes; the start address stays below 256 KB (the 14-bit
 * field), so the add never carries into the offsets above it. */
static __device__ __forceinline__ uint64_t sm90_desc_add(uint64_t d, uint32_t bytes) {
    return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

/* Hides how d was computed from the compiler's front end, so that it holds d in registers
 * across the k loop rather than rebuilding it from the shared-memory base every k step. */
static __device__ __forceinline__ void sm90_desc_hold(uint64_t &d) { asm volatile("" : "+l"(d)); }

/* Orders earlier register writes of the accumulators before the next wgmma reads them. */
static __device__ __forceinline__ void sm90_wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void sm90_wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* Waits until at most N committed wgmma groups of this warpgroup are still in flight. */
template <int N> static __device__ __forceinline__ void sm90_wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Keeps the accumulators live in registers across code the compiler cannot see into. */
static __device__ __forceinline__ void sm90_fence_regs(float &r) { asm volatile("" : "+f"(r)::"memory"); }

/* The f32 accumulator registers of a wgmma, as asm text and operands: an m64n128 step has
 * 64 per thread (d[0..63], operands %0..%63), an m64n256 step 128 (d[0..127]). */
#define SM90_ACC64_TEXT \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SM90_ACC_TEXT \
    SM90_ACC64_TEXT ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define SM90_ACC64_OPERANDS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define SM90_ACC_OPERANDS(d) \
    SM90_ACC64_OPERANDS(d), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/* Defines `name(d, desc_a, desc_b, scale_d)`: one wgmma step of `shape` (m64nNk16),
 *     d[0..nacc) = (scale_d ? d : 0) + A(64x16) * B(Nx16)   (f32 accumulate)
 * with A and B in shared memory given by descriptors, `ab` the input type (bf16 or f16),
 * and tA / tB the transpose immediates: 0 for a K-major operand, 1 for an MN-major one.
 * desc / scale: the operand numbers of desc_a, desc_b and scale_d after the accumulators. */
#define SM90_DEFINE_WGMMA(name, shape, nacc, text, operands, desc, scale, ab, tA, tB)                \
    static __device__ __forceinline__ void name(float (&d)[nacc], uint64_t desc_a, uint64_t desc_b, \
                                                uint32_t scale_d) {                              \
        asm volatile("{\n.reg .pred p;\n"                                                      \
                     "setp.ne.b32 p, " scale ", 0;\n"                                           \
                     "wgmma.mma_async.sync.aligned." shape ".f32." #ab "." #ab " "              \
                     "{" text "}, " desc ", p, 1, 1, " #tA ", " #tB ";\n"                       \
                     "}\n"                                                                     \
                     : operands(d)                                                             \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                \
    }
#define SM90_DEFINE_WGMMA_M64N256K16(name, ab, tA, tB) \
    SM90_DEFINE_WGMMA(name, "m64n256k16", 128, SM90_ACC_TEXT, SM90_ACC_OPERANDS, "%128, %129", "%130", ab, tA, tB)
#define SM90_DEFINE_WGMMA_M64N128K16(name, ab, tA, tB) \
    SM90_DEFINE_WGMMA(name, "m64n128k16", 64, SM90_ACC64_TEXT, SM90_ACC64_OPERANDS, "%64, %65", "%66", ab, tA, tB)

/* Forward (A and B K-major). */
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_bf16, bf16, 0, 0)
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_f16, f16, 0, 0)

/* The 64-row tiles (each consumer warpgroup computes a 64 x 128 block). */
SM90_DEFINE_WGMMA_M64N128K16(wgmma_m64n128k16_bf16, bf16, 0, 0)
SM90_DEFINE_WGMMA_M64N128K16(wgmma_m64n128k16_f16, f16, 0, 0)
SM90_DEFINE_WGMMA_M64N128K16(wgmma_m64n128k16_bf16_tb, bf16, 0, 1)
SM90_DEFINE_WGMMA_M64N128K16(wgmma_m64n128k16_f16_tb, f16, 0, 1)

/* Shared-memory matrix descriptor for an MN-major B tile with 128-byte swizzle (dgrad: the
 * weight rows are the reduction dimension): TMA boxes of [reduction rows][64 columns], one
 * 128-byte row each. lbo: bytes between 64-column blocks (one box); sbo: bytes between
 * 8-row groups along the reduction (1024). Verified on the H200 with lbo = box size. */
static __device__ __forceinline__ uint64_t sm90_desc_mn_sw128(const void *smem, uint32_t lbo, uint32_t sbo) {
    uint64_t addr = sm90_smem_addr(smem);
    uint64_t d = (addr & 0x3FFFFull) >> 4;
    d |= (uint64_t)((lbo & 0x3FFFFu) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFFu) >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

/* Dgrad (B MN-major, see sm90_desc_mn_sw128). */
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_bf16_tb, bf16, 0, 1)
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_f16_tb, f16, 0, 1)

/* Both operands MN-major (wgrad: A = dy^T, B = x, the reduction runs over the rows of
 * both): the same descriptors as sm90_desc_mn_sw128 for A and B, both transpose bits set. */
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_bf16_tatb, bf16, 1, 1)
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_f16_tatb, f16, 1, 1)

/* ---- added for the weight gradient (sm90_grouped_wgrad.cu): 3-D TMA stores and
 * reduce-adds, 2-D multicast loads ------------------------------------------------------ */

/* A 3-D tensor store shared -> global of one box (a bulk group member, as sm90_tma_store_2d). */
static __device__ __forceinline__ void sm90_tma_store_3d(const void *tmap, const void *src, int32_t c0, int32_t c1,
                                                         int32_t c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                     (uint64_t)tmap),
                 "r"(sm90_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

/* global[box] += shared[box], element by element in the tensor map's type (one add per
 * element, done near L2: the old values never travel to the SM). A bulk group member. */
static __device__ __forceinline__ void sm90_tma_reduce_add_3d(const void *tmap, const void *src, int32_t c0,
                                                              int32_t c1, int32_t c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::
                     "l"((uint64_t)tmap),
                 "r"(sm90_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

/* A 2-D tensor load written to the same offset in every CTA of `cta_mask`, completing on the
 * barrier at the same offset in each of them. */
static __device__ __forceinline__ void sm90_tma_load_2d_multicast(void *dst, const void *tmap, uint64_t *bar,
                                                                  int32_t c0, int32_t c1, uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5}], [%2], %3;\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1)
        : "memory");
}

/* A flag between CTAs of one grid (stream-K): the release store orders the writes the
 * storing thread has seen (its CTA's, after a barrier) before it; the acquire load orders
 * the reads after it (its CTA's, after a barrier). */
static __device__ __forceinline__ void sm90_flag_release(int *flag, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}
static __device__ __forceinline__ int sm90_flag_acquire(const int *flag) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    return v;
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PTX_CUH */
