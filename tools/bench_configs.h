/*
 * bench_configs.h - the benchmark configurations, in one list: `moex bench` (cmd_bench.c)
 * expands it, and the Python benchmarks read it through bench/configs.py, which parses
 * this file. Keep one X(...) row per line, in the form below (configs.py refuses a row it
 * cannot read; `python3 bench/configs.py --check build/moex` compares the two readers).
 *
 * Columns: the name; G groups, T rows, K in and N out of the grouped linear; H hidden and
 * F ffn of the grouped MLP of the same model (whose FC1 or FC2 is that linear); the splits
 * (BALANCED: as equal as possible; SKEWED: Dirichlet(0.5) shares with one group empty);
 * the set; what the config is.
 *
 * The set:
 *   CPU    sized for the CPU: `moex bench --backend cpu --config all` runs these.
 *   CUDA   sized for a GPU (the expert layers of MoE models at a training step's T):
 *          `moex bench --backend cuda` runs these by default, and so do
 *          bench/gemm_bench.py, bench/torch_baseline.py and bench/torch_grouped_mm.py.
 *   STUDY  extra shapes for kernel studies, read by bench/torch_grouped_mm.py only (not
 *          by `moex bench`): small groups, 64 and 32 rows a group (T < 128 G picks the Hopper
 *          GEMMs' 64-row tiles, docs/hopper.md).
 */
#ifndef MOEX_BENCH_CONFIGS_H
#define MOEX_BENCH_CONFIGS_H

/* X(name, G, T, K, N, H, F, splits, set, what) */
#define MOEX_BENCH_CONFIGS(X)                                                                                        \
    X("tiny",            4,   512,  256,   256,  256,   128, BALANCED, CPU,   "a quick smoke test")                  \
    X("small",           8,  4096, 1024,  1024, 1024,   512, BALANCED, CPU,   "8 balanced groups (CPU default)")     \
    X("skewed",          8,  4096, 1024,  1024, 1024,   512, SKEWED,   CPU,   "8 Dirichlet(0.5) groups, one empty")  \
    X("many",          128,  4096, 1024,  1024, 1024,   512, BALANCED, CPU,   "128 small groups")                    \
    X("dsv3-fc1",        8, 32768, 7168,  4096, 7168,  2048, BALANCED, CUDA,  "DeepSeek-V3 FC1")                     \
    X("dsv3-fc2",        8, 32768, 2048,  7168, 7168,  2048, BALANCED, CUDA,  "DeepSeek-V3 FC2")                     \
    X("qwen3-30b-fc1", 128, 32768, 2048,  1536, 2048,   768, BALANCED, CUDA,  "Qwen3-30B-A3B FC1")                   \
    X("qwen3-30b-fc2", 128, 32768,  768,  2048, 2048,   768, BALANCED, CUDA,  "Qwen3-30B-A3B FC2")                   \
    X("mixtral-fc1",     8, 16384, 4096, 28672, 4096, 14336, BALANCED, CUDA,  "Mixtral 8x7B FC1")                    \
    X("gptoss-fc1",     32, 16384, 2880,  5760, 2880,  2880, BALANCED, CUDA,  "GPT-OSS-120B FC1")                    \
    X("qwen3-fc1-t8k", 128,  8192, 2048,  1536, 2048,   768, BALANCED, STUDY, "Qwen3-30B FC1 at T=8192")             \
    X("g256-fc1-t8k",  256,  8192, 2048,  1536, 2048,   768, BALANCED, STUDY, "as qwen3-fc1-t8k with G=256")

#endif /* MOEX_BENCH_CONFIGS_H */
