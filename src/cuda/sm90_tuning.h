/*
 * sm90_tuning.h - internal: the experiment knobs of the Hopper grouped GEMMs and the entry
 * points that take them, for tests and benchmarks only (tests/cuda/test_sm90_*.c,
 * bench/sm90_bench_shim.c). The production entry points (sm90_grouped_gemm.h) take no knobs:
 * they run what the heuristic (sm90_heuristics.h) plans from the shapes, which is what every
 * call here runs with tune == NULL or an all-zero tune (except epilogue_tma, where 0 asks for
 * the register epilogue: set it to 1 for the default).
 */
#ifndef MOEX_SM90_TUNING_H
#define MOEX_SM90_TUNING_H

#include "sm90_grouped_gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The knobs (0 = the heuristic's choice, except epilogue_tma):
 *   grid          CTAs at most (0: as many as can be resident);
 *   band          column units per band of the tile order (0: 8; wgrad: N tiles, 0: 16);
 *   epilogue_tma  1: TMA stores for full blocks (the default); 0: masked register stores
 *                 everywhere (the forward and dgrad: the plain 128-row kernels without
 *                 clusters only);
 *   cluster       0: 2-CTA clusters sharing an operand through TMA multicast for the
 *                 128-row forward and dgrad with the TMA epilogue (any epilogue kind), none
 *                 elsewhere; 1: none; 2: clusters wherever the kernel has them (those, the
 *                 wgrad);
 *   grid_used     out: the CTAs launched (0 when nothing was launched);
 *   tile_rows     0: the heuristic (64 when T < 128 G, else 128); 64 or 128;
 *   band_rows     input rows per block of a band of the tile order (0: 2048; forward and
 *                 dgrad);
 *   stream_k      0: the heuristic (the forward's last round cut along k where the shapes
 *                 say it pays, given a workspace); 1: never; 2: whenever a last round is
 *                 left and a workspace given, forward and dgrad, any epilogue (tests);
 *   l2_promotion  of the tensor maps: 0: 256 bytes; 1: none; 64, 128 or 256 bytes. */
typedef struct moex_sm90_tuning {
    int grid;
    int band;
    int epilogue_tma;
    int cluster;
    int grid_used;              /* out */
    int tile_rows;
    int band_rows;
    int stream_k;
    int l2_promotion;
} moex_sm90_tuning;

/* The production entry points of sm90_grouped_gemm.h with the knobs tune (NULL: none). */
moex_status moex_sm90_grouped_gemm_fwd_tuned(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                             const moex_sm90_epilogue *e, moex_sm90_tuning *tune,
                                             moex_stream stream, const char **why);
moex_status moex_sm90_grouped_gemm_dgrad_tuned(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                               moex_sm90_tuning *tune, moex_stream stream, const char **why);
/* The wgrad's knobs: grid (0: one CTA per SM, or per SM pair with clusters), epilogue_tma,
 * cluster (0 or 1: none; 2: CTA pairs on neighbouring N tiles share the x tiles through TMA
 * multicast), band (N tiles per band; 0: 16), l2_promotion, grid_used. */
moex_status moex_sm90_grouped_gemm_wgrad_tuned(const moex_sm90_context *c, const moex_sm90_wgrad_args *a,
                                               moex_sm90_tuning *tune, moex_stream stream, const char **why);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_SM90_TUNING_H */
