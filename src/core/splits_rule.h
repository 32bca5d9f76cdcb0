/*
 * splits_rule.h - private: the one rule for split values, shared by every backend and kernel
 * (host C, and CUDA device code: the functions are __host__ __device__ under nvcc).
 *
 * Group g of G owns rows [off[g], off[g+1]) of T, with off[0] = 0 and
 *     off[g+1] = min(off[g] + max(s_g, 0), T),
 * and the splits are bad when a value is negative or their sum passes T. The CPU reads them
 * on the host and refuses bad ones before writing anything (MOEX_ERR_BAD_SPLITS); a device
 * kernel, which cannot refuse, walks the clamped offsets above (nothing outside the T rows is
 * touched) and sets the context's flag (docs/conventions.md 7).
 */
#ifndef MOEX_SPLITS_RULE_H
#define MOEX_SPLITS_RULE_H

#include <stdint.h>

#if defined(__CUDACC__)
#define MOEX_SPLITS_FN static __host__ __device__ __forceinline__
#else
#define MOEX_SPLITS_FN static inline
#endif

/* The rows group g gets at offset off (0 <= off <= T): min(max(s, 0), T - off). */
MOEX_SPLITS_FN int64_t moex_split_rows(int64_t s, int64_t off, int64_t T) {
    return s < 0 ? 0 : (s > T - off ? T - off : s);
}

/* s clipped to [0, T], for parallel scans: a prefix sum of G clipped values cannot wrap, and
 * min(off + prefix, T) gives the offsets above. */
MOEX_SPLITS_FN int64_t moex_split_clip(int64_t s, int64_t T) { return s < 0 ? 0 : (s > T ? T : s); }

/* s as a sum that checks the rule counts it: max(s, 0) capped at T + 1, so that a sum of
 * counted values (moex_split_add) passes T exactly when the true sum does, and cannot wrap;
 * *bad is set for a negative s. */
MOEX_SPLITS_FN int64_t moex_split_count(int64_t s, int64_t T, int *bad) {
    if (s < 0) *bad = 1;
    return s < 0 ? 0 : (s > T ? T + 1 : s);
}

/* min(a + b, T + 1) for a, b in [0, T + 1]: the saturating sum of counted splits. */
MOEX_SPLITS_FN int64_t moex_split_add(int64_t a, int64_t b, int64_t T) { return b > T + 1 - a ? T + 1 : a + b; }

#endif /* MOEX_SPLITS_RULE_H */
