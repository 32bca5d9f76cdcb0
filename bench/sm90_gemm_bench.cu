/*
 * sm90_gemm_bench.cu - times the sm90 grouped GEMM forward (src/cuda/sm90_grouped_gemm.h)
 * on the split values that bench/torch_grouped_mm.py wrote, so both sides run on the same
 * shapes and splits in the same session.
 *
 *   sm90_gemm_bench SPLITS_FILE [iters] [variant-prefix]
 * SPLITS_FILE lines: "cfg kind G T K N s_0 ... s_{G-1}". Per line: bf16 random data
 * (x in [-1, 1], w in [-0.02, 0.02]); per kernel variant (moex_sm90_tuning, list below):
 * 5 warm-up launches, then `iters` (20) launches each timed with CUDA events; prints
 * "cfg kind variant tflops median_ms relerr worst/tol", where the error columns compare
 * 2048 sampled outputs with an fp64 host dot product (worst/tol <= 1 passes; tol =
 * 2^-8 |ref| + 1e-5 sum |x w|); y is poisoned before each variant.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/moex_half.h"
#include "../src/cuda/sm90_grouped_gemm.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* v[i] = scale * uniform[-1, 1) from a hash of (seed, i), rounded to bf16 */
__global__ void fill_bf16(__nv_bfloat16 *v, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        float u = (float)(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        v[i] = __float2bfloat16_rn(u * scale);
    }
}

typedef struct variant {
    const char *name;
    moex_sm90_tuning t;
} variant;
static const variant VARIANTS[] = {
    {"epi_regs", {0, 0, 0, 1}},
    {"epi_tma", {0, 0, 1, 1}},
    {"epi_tma_g128", {128, 0, 1, 1}},
    {"epi_tma_band4", {0, 4, 1, 1}},
    {"epi_tma_band16", {0, 16, 1, 1}},
    {"clu2_epi_tma", {0, 0, 1, 2}},
    {"clu2_epi_regs", {0, 0, 0, 2}},
};

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SPLITS_FILE [iters]\n", argv[0]);
        return 2;
    }
    const int iters = argc > 2 ? atoi(argv[2]) : 20;
    const char *only = argc > 3 ? argv[3] : "";   /* run the variants whose name starts so */
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    char cfg[64], kind[32];
    long long G, T, K, N;
    int status = 0;
    printf("# cfg kind variant tflops median_ms relerr worst/tol\n");
    while (fscanf(f, "%63s %31s %lld %lld %lld %lld", cfg, kind, &G, &T, &K, &N) == 6) {
        int64_t *hs = (int64_t *)malloc((size_t)G * 8), *off = (int64_t *)malloc((size_t)(G + 1) * 8);
        off[0] = 0;
        for (long long g = 0; g < G; g++) {
            long long v;
            if (fscanf(f, "%lld", &v) != 1) return 2;
            hs[g] = v;
            off[g + 1] = off[g] + v;
        }
        const size_t xe = (size_t)T * K, we = (size_t)G * N * K, ye = (size_t)T * N;
        void *x, *w, *y;
        int64_t *ds;
        CK(cudaMalloc(&x, xe * 2));
        CK(cudaMalloc(&w, we * 2));
        CK(cudaMalloc(&y, ye * 2));
        CK(cudaMalloc((void **)&ds, (size_t)G * 8));
        CK(cudaMemcpy(ds, hs, (size_t)G * 8, cudaMemcpyHostToDevice));
        fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)x, xe, 0x1234 + G * 7 + K, 1.0f);
        fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)w, we, 0x5678 + N * 3 + K, 0.02f);
        CK(cudaDeviceSynchronize());

        moex_sm90_gemm_args a;
        memset(&a, 0, sizeof a);
        a.dtype = MOEX_DTYPE_BF16;
        a.G = G;
        a.T = T;
        a.K = K;
        a.N = N;
        a.x = x;
        a.w = w;
        a.y = y;
        a.splits = ds;
        for (size_t v = 0; v < sizeof VARIANTS / sizeof VARIANTS[0]; v++) {
        const variant *var = &VARIANTS[v];
        moex_sm90_tuning tune = var->t;
        if (strncmp(var->name, only, strlen(only)) != 0) continue;
        CK(cudaMemset(y, 0xFF, ye * 2));
        const char *why = NULL;
        float *ts = (float *)malloc((size_t)iters * sizeof(float));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        moex_status st = MOEX_OK;
        for (int i = 0; i < 5 && st == MOEX_OK; i++) st = moex_sm90_grouped_gemm_fwd_tuned(&a, &tune, NULL, &why);
        CK(cudaDeviceSynchronize());
        for (int i = 0; i < iters && st == MOEX_OK; i++) {
            CK(cudaEventRecord(e0, 0));
            st = moex_sm90_grouped_gemm_fwd_tuned(&a, &tune, NULL, &why);
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ts[i], e0, e1));
        }
        if (st != MOEX_OK) {
            printf("%s %s %s FAILED status %d (%s)\n", cfg, kind, var->name, (int)st, why ? why : "");
            status = 1;
        } else {
            qsort(ts, (size_t)iters, sizeof(float), cmp_float);
            const double ms = ts[iters / 2];
            /* sampled check against fp64 */
            uint16_t *xr = (uint16_t *)malloc((size_t)K * 2), *wr = (uint16_t *)malloc((size_t)K * 2);
            double err2 = 0, ref2 = 0, worst = 0;
            uint64_t rs = 0x2545F4914F6CDD1Dull;
            for (int sidx = 0; sidx < 2048; sidx++) {
                rs ^= rs << 13;
                rs ^= rs >> 7;
                rs ^= rs << 17;
                int64_t r = (int64_t)(rs % (uint64_t)off[G]), n = (int64_t)((rs >> 32) % (uint64_t)N);
                int64_t g = 0;
                while (off[g + 1] <= r) g++;
                uint16_t out;
                CK(cudaMemcpy(xr, (uint16_t *)x + r * K, (size_t)K * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(wr, (uint16_t *)w + (g * N + n) * K, (size_t)K * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(&out, (uint16_t *)y + r * N + n, 2, cudaMemcpyDeviceToHost));
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double p = (double)moex_bf16_to_f32(xr[k]) * (double)moex_bf16_to_f32(wr[k]);
                    ref += p;
                    mag += fabs(p);
                }
                double e = fabs((double)moex_bf16_to_f32(out) - ref), tol = fabs(ref) / 256.0 + 1e-5 * mag + 1e-30;
                err2 += e * e;
                ref2 += ref * ref;
                if (!(e <= worst * tol)) worst = e != e ? INFINITY : e / tol;
            }
            free(xr);
            free(wr);
            const double relerr = sqrt(err2 / (ref2 > 0 ? ref2 : 1));
            printf("%s %s %s %.1f %.4f %.2e %.3f\n", cfg, kind, var->name, 2.0 * off[G] * K * N / (ms * 1e9), ms,
                   relerr, worst);
            if (!(worst <= 1.0)) status = 1;
        }
        fflush(stdout);
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        free(ts);
        }
        CK(cudaFree(x));
        CK(cudaFree(w));
        CK(cudaFree(y));
        CK(cudaFree(ds));
        free(hs);
        free(off);
    }
    fclose(f);
    return status;
}
