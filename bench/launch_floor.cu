/*
 * launch_floor.cu - the host cost of the CUDA calls a moex call is made of, each alone: a
 * plain kernel launch, a launch with a cluster attribute and a kilobyte of parameters (the
 * Hopper GEMMs' launch: tensor maps by value), an async memset, a tensor-map encode and
 * cudaGetDevice. With bench/host_time.c, this tells what of a call's host time is the
 * runtime's floor and what is moex's own.
 *
 * Timing as in host_time.c: CALLS calls in a row over CALLS, the GPU kept busy beforehand
 * by a spinning kernel so that no call waits for it; REPS repetitions, rows interleaved;
 * prints microseconds per call, the minimum and the median.
 *
 * Usage: launch_floor   (a CUDA GPU of compute capability 9.0; built as bench/moex_launch_floor)
 */
#include <cuda.h>
#include <cudaTypedefs.h>   /* PFN_cuTensorMapEncodeTiled */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { REPS = 21, CALLS = 20 };

#define CHECK_CUDA(x)                                                                             \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "launch_floor: %s: %s\n", #x, cudaGetErrorString(e_));                \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* A kilobyte of kernel parameters, as the Hopper GEMMs pass six tensor maps and two structs. */
struct big_params {
    CUtensorMap maps[6];
    long long rest[32];
};

static __global__ void empty_kernel(int *p) {
    if (p != NULL && threadIdx.x == 1024) *p = 0;   /* never true: keeps the parameter */
}

static __global__ void big_kernel(const __grid_constant__ big_params p, int *q) {
    if (q != NULL && threadIdx.x == 1024) *q = (int)p.rest[0];
}

/* Spins for about `ns` nanoseconds of the GPU's global timer. */
static __global__ void spin_kernel(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int *dev_int;
static PFN_cuTensorMapEncodeTiled_v12000 encode;
static void *map_base;
static big_params params;

static void call_launch(void) {
    empty_kernel<<<1, 128>>>(dev_int);
    CHECK_CUDA(cudaGetLastError());
}

static void call_launch_ex(void) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3(2, 1, 1);
    cfg.blockDim = dim3(384, 1, 1);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    CHECK_CUDA(cudaLaunchKernelEx(&cfg, big_kernel, params, dev_int));
}

static void call_memset(void) { CHECK_CUDA(cudaMemsetAsync(dev_int, 0, sizeof(int), 0)); }

static void call_encode(void) {
    const cuuint64_t dims[2] = {4096, 4096}, strides[1] = {4096 * 2};
    const cuuint32_t box[2] = {64, 128}, elem[2] = {1, 1};
    if (encode(&params.maps[0], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, map_base, dims, strides, box, elem,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        fprintf(stderr, "launch_floor: cuTensorMapEncodeTiled failed\n");
        exit(1);
    }
}

static void call_get_device(void) {
    int d;
    CHECK_CUDA(cudaGetDevice(&d));
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    CHECK_CUDA(cudaMalloc(&dev_int, sizeof(int)));
    CHECK_CUDA(cudaMalloc(&map_base, (size_t)4096 * 4096 * 2));
    cudaDriverEntryPointQueryResult q;
    CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault,
                                                &q));
    if (q != cudaDriverEntryPointSuccess) {
        fprintf(stderr, "launch_floor: no cuTensorMapEncodeTiled\n");
        return 1;
    }
    call_encode();
    for (int i = 1; i < 6; i++) params.maps[i] = params.maps[0];

    struct {
        const char *name;
        void (*fn)(void);
        double us[REPS];
    } rows[] = {{"kernel <<<>>> launch", call_launch, {0}},
                {"cudaLaunchKernelEx, cluster 2, 1 KB params", call_launch_ex, {0}},
                {"cudaMemsetAsync (4 bytes)", call_memset, {0}},
                {"cuTensorMapEncodeTiled", call_encode, {0}},
                {"cudaGetDevice", call_get_device, {0}}};
    const int nrows = (int)(sizeof rows / sizeof rows[0]);
    for (int i = 0; i < nrows; i++) rows[i].fn();   /* warm-up */
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int r = 0; r < REPS; r++) {
        for (int i = 0; i < nrows; i++) {
            spin_kernel<<<1, 1>>>(1000000ull);
            CHECK_CUDA(cudaGetLastError());
            const double t0 = now_us();
            for (int c = 0; c < CALLS; c++) rows[i].fn();
            rows[i].us[r] = (now_us() - t0) / CALLS;
            CHECK_CUDA(cudaDeviceSynchronize());
        }
    }
    printf("host time per CUDA call, us\n");
    for (int i = 0; i < nrows; i++) {
        qsort(rows[i].us, REPS, sizeof(double), cmp_double);
        printf("  %-44s min %7.2f  median %7.2f\n", rows[i].name, rows[i].us[0], rows[i].us[REPS / 2]);
    }
    CHECK_CUDA(cudaFree(map_base));
    CHECK_CUDA(cudaFree(dev_int));
    return 0;
}
