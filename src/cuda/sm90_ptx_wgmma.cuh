/*
 * sm90_ptx_wgmma.cuh - private: the warpgroup matrix-multiply PTX of the Hopper GEMMs (sm_90a
 * device pass only, see sm90_ptx.cuh): shared-memory matrix descriptors for 128-byte-swizzled
 * tiles (K-major and MN-major) and their advance by adds; the wgmma steps m64n256k16 and
 * m64n128k16 in bf16 and f16 with f32 accumulators, each operand K- or MN-major; and the
 * fence / commit / wait that order them against the accumulator registers.
 * One function per instruction form (shape, input type, operand majors): PTX takes the form
 * only as text, and an accumulator list only spelled out, so the forms and their operand
 * lists look alike by construction.
 */
#ifndef MOEX_SM90_PTX_WGMMA_CUH
#define MOEX_SM90_PTX_WGMMA_CUH

#include "sm90_ptx.cuh"

#if MOEX_SM90_DEVICE

/* ---- shared-memory matrix descriptors ---------------------------------------------- */

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

/* Shared-memory matrix descriptor for an MN-major tile with 128-byte swizzle (the dgrad's
 * weight tile, whose rows are the reduction dimension; both wgrad operands): TMA boxes of [reduction rows][64 columns], one
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

/* ---- ordering and the mma steps --------------------------------------------------- */

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

/* The f32 accumulator registers of a wgmma, as asm text and operands: an m64n128 step has
 * 64 per thread (d[0..63], operands %0..%63), an m64n256 step 128 (d[0..127]; its lists
 * extend the first ones). Spelled out one by one, and so alike line after line: inline asm
 * has no way to generate an operand list. */
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

/* Dgrad (B MN-major, see sm90_desc_mn_sw128). */
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_bf16_tb, bf16, 0, 1)
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_f16_tb, f16, 0, 1)

/* Both operands MN-major (wgrad: A = dy^T, B = x, the reduction runs over the rows of
 * both): the same descriptors as sm90_desc_mn_sw128 for A and B, both transpose bits set. */
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_bf16_tatb, bf16, 1, 1)
SM90_DEFINE_WGMMA_M64N256K16(wgmma_m64n256k16_f16_tatb, f16, 1, 1)

/* FP8 (sm90_fp8_gemm.cu): `name(d, desc_a, desc_b, scale_d)`, one m64n128k32 step with A and B
 * K-major in `a` and `b` (e4m3 or e5m2; FP8 wgmma has no transpose), f32 accumulators. */
#define SM90_DEFINE_WGMMA_FP8(name, a, b)                                                          \
    static __device__ __forceinline__ void name(float (&d)[64], uint64_t desc_a, uint64_t desc_b, \
                                                uint32_t scale_d) {                               \
        asm volatile("{\n.reg .pred p;\n"                                                       \
                     "setp.ne.b32 p, %66, 0;\n"                                                  \
                     "wgmma.mma_async.sync.aligned.m64n128k32.f32." #a "." #b " "               \
                     "{" SM90_ACC64_TEXT "}, %64, %65, p, 1, 1;\n"                               \
                     "}\n"                                                                     \
                     : SM90_ACC64_OPERANDS(d)                                                   \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                 \
    }
SM90_DEFINE_WGMMA_FP8(wgmma_m64n128k32_e4m3_e4m3, e4m3, e4m3)
SM90_DEFINE_WGMMA_FP8(wgmma_m64n128k32_e4m3_e5m2, e4m3, e5m2)
SM90_DEFINE_WGMMA_FP8(wgmma_m64n128k32_e5m2_e4m3, e5m2, e4m3)
SM90_DEFINE_WGMMA_FP8(wgmma_m64n128k32_e5m2_e5m2, e5m2, e5m2)

/* The FP8 step for the formats (1: E5M2, 0: E4M3) of A and B. */
template <int A5, int B5>
static __device__ __forceinline__ void sm90_wgmma_fp8(float (&d)[64], uint64_t da, uint64_t db, uint32_t keep) {
    if (A5) {
        if (B5) wgmma_m64n128k32_e5m2_e5m2(d, da, db, keep); else wgmma_m64n128k32_e5m2_e4m3(d, da, db, keep);
    } else {
        if (B5) wgmma_m64n128k32_e4m3_e5m2(d, da, db, keep); else wgmma_m64n128k32_e4m3_e4m3(d, da, db, keep);
    }
}

/* One stage's FP8 product, complete on return: part = the sum of the KB / 32 steps of
 * sm90_wgmma_fp8<A5, B5> (the first overwrites part), step kk reading A at da moved a_off +
 * 32 kk bytes and B at db moved b_off + 32 kk (K-major, KB bytes a row). Fenced before the
 * first step, committed and waited for (none left in flight) after the last. */
template <int A5, int B5, int KB>
static __device__ __forceinline__ void sm90_wgmma_fp8_stage(float (&part)[64], uint64_t da, uint32_t a_off, uint64_t db,
                                                            uint32_t b_off) {
    sm90_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 32; kk++)
        sm90_wgmma_fp8<A5, B5>(part, sm90_desc_add(da, a_off + kk * 32), sm90_desc_add(db, b_off + kk * 32), kk != 0);
    sm90_wgmma_commit();
    sm90_wgmma_wait<0>();
}

/* One wgmma step of the shape the accumulators say (128 per thread: m64n256k16; 64:
 * m64n128k16) in the input dtype (IS_F16: f16, else bf16), B MN-major when TB, and A too
 * when TA (m64n256k16 with TB only). */
template <int IS_F16, int TA, int TB>
static __device__ __forceinline__ void sm90_wgmma(float (&d)[128], uint64_t da, uint64_t db, uint32_t keep) {
    if (TA) {
        if (IS_F16) wgmma_m64n256k16_f16_tatb(d, da, db, keep); else wgmma_m64n256k16_bf16_tatb(d, da, db, keep);
    } else if (TB) {
        if (IS_F16) wgmma_m64n256k16_f16_tb(d, da, db, keep); else wgmma_m64n256k16_bf16_tb(d, da, db, keep);
    } else {
        if (IS_F16) wgmma_m64n256k16_f16(d, da, db, keep); else wgmma_m64n256k16_bf16(d, da, db, keep);
    }
}
template <int IS_F16, int TA, int TB>
static __device__ __forceinline__ void sm90_wgmma(float (&d)[64], uint64_t da, uint64_t db, uint32_t keep) {
    static_assert(!TA, "m64n128k16 with A MN-major is not used");
    if (TB) {
        if (IS_F16) wgmma_m64n128k16_f16_tb(d, da, db, keep); else wgmma_m64n128k16_bf16_tb(d, da, db, keep);
    } else {
        if (IS_F16) wgmma_m64n128k16_f16(d, da, db, keep); else wgmma_m64n128k16_bf16(d, da, db, keep);
    }
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PTX_WGMMA_CUH */
