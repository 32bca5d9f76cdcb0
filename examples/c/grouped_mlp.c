/*
 * grouped_mlp.c - moex's fused grouped MLP from C, forward and backward: G experts, each a
 * SwiGLU MLP over its own rows of x (rows sorted by expert, `splits` rows each), with the
 * GLU's output scaled by the router's per-row probability:
 *
 *     h = x W1_g^T,  z = p * silu(h[:, :F]) * h[:, F:],  y = z W2_g^T + b2_g
 *
 * then the gradients of x, W1, W2, b2 and p for a given dy. Runs on the CPU, then on GPU 0
 * where moex has its CUDA backend, the program was built with the CUDA runtime
 * (MOEX_EXAMPLE_CUDA) and the machine has a GPU; checks every result against a plain loop in
 * double precision; exits non-zero on any failure. README.md beside it says how to build it.
 */
#include <moex.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef MOEX_EXAMPLE_CUDA
#include <cuda_runtime.h>
#endif

#define G 3     /* experts                                                  */
#define T 40    /* buffer rows; the splits cover 33, rows 33..39 are the tail */
#define H 32    /* hidden size: FC1's in-features, FC2's out-features        */
#define F 24    /* FFN size of one GLU half: FC1 has 2F out-features          */

static const int64_t splits_host[G] = {12, 0, 21};   /* expert 1 gets no rows */

/* The buffers of one run, in the backend's memory; inputs first. */
enum { X, W1, W2, B2, PROBS, SPLITS, DY, DPROBS, H_, Y, DX, DW1, DW2, DB2, NBUF };
#define NINPUT H_   /* X..DPROBS are copied in (dprobs is +=: zeros), the rest out */
static const size_t buf_bytes[NBUF] = {
    [X] = sizeof(float) * T * H,       [W1] = sizeof(float) * G * 2 * F * H,
    [W2] = sizeof(float) * G * H * F,  [B2] = sizeof(float) * G * H,
    [PROBS] = sizeof(float) * T,       [SPLITS] = sizeof(int64_t) * G,
    [DY] = sizeof(float) * T * H,      [DPROBS] = sizeof(float) * T,
    [H_] = sizeof(float) * T * 2 * F,  [Y] = sizeof(float) * T * H,
    [DX] = sizeof(float) * T * H,      [DW1] = sizeof(float) * G * 2 * F * H,
    [DW2] = sizeof(float) * G * H * F, [DB2] = sizeof(float) * G * H,
};
static const char *const buf_name[NBUF] = {"x", "w1", "w2", "b2", "probs", "splits", "dy",
                                           "dprobs", "h", "y", "dx", "dw1", "dw2", "db2"};
/* the results checked (f32, like every buffer but splits) */
static const int outputs[] = {Y, DX, DW1, DW2, DB2, DPROBS};
#define NOUTPUT (int)(sizeof outputs / sizeof outputs[0])

/* ---- memory of the backend: host memory, or device memory through the CUDA runtime ------ */

static void *mem_alloc(int gpu, size_t bytes) {
    void *p = NULL;
#ifdef MOEX_EXAMPLE_CUDA
    if (gpu) return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
#endif
    (void)gpu;
    p = malloc(bytes);
    return p;
}

static void mem_free(int gpu, void *p) {
#ifdef MOEX_EXAMPLE_CUDA
    if (gpu) {
        cudaFree(p);
        return;
    }
#endif
    (void)gpu;
    free(p);
}

/* dst and src of `bytes`: to the backend's memory (in = 1) or back from it (in = 0) */
static int mem_copy(int gpu, void *dst, const void *src, size_t bytes, int in) {
#ifdef MOEX_EXAMPLE_CUDA
    if (gpu) return cudaMemcpy(dst, src, bytes, in ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) ==
                    cudaSuccess ? 0 : -1;
#endif
    (void)gpu;
    (void)in;
    memcpy(dst, src, bytes);
    return 0;
}

/* ---- the moex calls ------------------------------------------------------------------ */

/* Forward, then backward, on ctx with the buffers b (the backend's memory). */
static moex_status run_mlp(moex_context *ctx, int gpu, void *const b[NBUF]) {
    const moex_weight w1 = moex_weight_packed(moex_tensor_3d(b[W1], MOEX_DTYPE_F32, G, 2 * F, H));
    const moex_weight w2 = moex_weight_packed(moex_tensor_3d(b[W2], MOEX_DTYPE_F32, G, H, F));
    const moex_tensor b2 = moex_tensor_2d(b[B2], MOEX_DTYPE_F32, G, H);
    const moex_tensor probs = moex_tensor_1d(b[PROBS], MOEX_DTYPE_F32, T);
    const moex_tensor splits = moex_tensor_1d(b[SPLITS], MOEX_DTYPE_I64, G);
    const moex_tensor h = moex_tensor_2d(b[H_], MOEX_DTYPE_F32, T, 2 * F);
    const moex_glu_params glu = moex_glu_params_default(MOEX_GLU_SWIGLU);

    moex_grouped_mlp_args fwd = {
        .x = moex_tensor_2d(b[X], MOEX_DTYPE_F32, T, H), .w1 = w1, .w2 = w2,
        .b2_mode = MOEX_BIAS_ADD, .b2 = b2, .probs = probs, .glu = glu, .splits = splits,
        .h = h,   /* saved for the backward; z is not (absent: the backward recomputes it) */
        .y = moex_tensor_2d(b[Y], MOEX_DTYPE_F32, T, H),
    };
    moex_grouped_mlp_grad_args bwd = {
        .x = fwd.x, .w1 = w1, .w2 = w2, .b2_mode = MOEX_BIAS_ADD, .probs = probs, .glu = glu,
        .splits = splits, .h = h,
        .dy = moex_tensor_2d(b[DY], MOEX_DTYPE_F32, T, H),
        .dx = moex_tensor_2d(b[DX], MOEX_DTYPE_F32, T, H),
        .dw_mode = MOEX_GRAD_WRITE,
        .dw1 = moex_weight_packed(moex_tensor_3d(b[DW1], MOEX_DTYPE_F32, G, 2 * F, H)),
        .dw2 = moex_weight_packed(moex_tensor_3d(b[DW2], MOEX_DTYPE_F32, G, H, F)),
        .db2 = moex_tensor_2d(b[DB2], MOEX_DTYPE_F32, G, H),
        .dprobs = moex_tensor_1d(b[DPROBS], MOEX_DTYPE_F32, T),
    };

    /* one workspace, of the larger of the two sizes */
    size_t fwd_bytes = 0, bwd_bytes = 0;
    moex_status st = moex_grouped_mlp_forward_workspace_size(ctx, &fwd, &fwd_bytes);
    if (st == MOEX_OK) st = moex_grouped_mlp_backward_workspace_size(ctx, &bwd, &bwd_bytes);
    if (st != MOEX_OK) return st;
    const size_t bytes = fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes;
    void *ws = bytes ? mem_alloc(gpu, bytes) : NULL;
    if (bytes && !ws) {
        fprintf(stderr, "grouped_mlp: cannot allocate the workspace (%zu bytes)\n", bytes);
        return MOEX_ERR_OUT_OF_MEMORY;
    }
    /* stream NULL: the CPU runs each call to completion; CUDA enqueues on the default stream */
    st = moex_grouped_mlp_forward(ctx, &fwd, ws, fwd_bytes, NULL);
    if (st == MOEX_OK) st = moex_grouped_mlp_backward(ctx, &bwd, ws, bwd_bytes, NULL);
    /* CUDA: waits for the calls, and reports split values the kernels found bad */
    if (st == MOEX_OK) st = moex_context_check_splits(ctx, NULL);
    if (ws) mem_free(gpu, ws);
    return st;
}

/* ---- the reference: the same math in double precision -------------------------------- */

static double silu(double a) { return a / (1.0 + exp(-a)); }
static double dsilu(double a) {
    const double s = 1.0 / (1.0 + exp(-a));
    return s * (1.0 + a * (1.0 - s));
}

/* The outputs of the inputs `in` (host arrays), into `out` (zeroed arrays of doubles, indexed
 * as the buffers; the tail rows of y and dx stay 0: moex does not write them). */
static void reference(void *const in[NBUF], double *const out[NBUF]) {
    const float *x = in[X], *w1 = in[W1], *w2 = in[W2], *b2 = in[B2], *p = in[PROBS], *dy = in[DY];
    int64_t row = 0;
    for (int g = 0; g < G; g++) {
        const float *W1g = w1 + (size_t)g * 2 * F * H, *W2g = w2 + (size_t)g * H * F;
        for (int64_t i = row; i < row + splits_host[g]; i++) {
            const float *xi = x + i * H, *dyi = dy + i * H;
            double hv[2 * F], z[F], dz[F], dh[2 * F];
            for (int r = 0; r < 2 * F; r++) {
                hv[r] = 0.0;
                for (int k = 0; k < H; k++) hv[r] += (double)W1g[r * H + k] * xi[k];
            }
            for (int j = 0; j < F; j++) z[j] = p[i] * silu(hv[j]) * hv[F + j];
            for (int n = 0; n < H; n++) {
                double acc = b2[g * H + n];
                for (int j = 0; j < F; j++) acc += (double)W2g[n * F + j] * z[j];
                out[Y][i * H + n] = acc;
                out[DB2][g * H + n] += dyi[n];
                for (int j = 0; j < F; j++) out[DW2][((size_t)g * H + n) * F + j] += dyi[n] * z[j];
            }
            for (int j = 0; j < F; j++) {
                dz[j] = 0.0;
                for (int n = 0; n < H; n++) dz[j] += (double)W2g[n * F + j] * dyi[n];
                dh[j] = dz[j] * p[i] * dsilu(hv[j]) * hv[F + j];
                dh[F + j] = dz[j] * p[i] * silu(hv[j]);
                out[DPROBS][i] += dz[j] * silu(hv[j]) * hv[F + j];
            }
            for (int k = 0; k < H; k++) {
                double acc = 0.0;
                for (int r = 0; r < 2 * F; r++) {
                    acc += (double)W1g[r * H + k] * dh[r];
                    out[DW1][((size_t)g * 2 * F + r) * H + k] += dh[r] * xi[k];
                }
                out[DX][i * H + k] = acc;
            }
        }
        row += splits_host[g];
    }
}

/* max |got - want| / max |want| over each output: at most 1e-5 (f32 against double) */
static int check(const char *backend, void *const got[NBUF], double *const want[NBUF]) {
    int bad = 0;
    double worst = 0.0;
    for (int o = 0; o < NOUTPUT; o++) {
        const int b = outputs[o];
        const float *g = got[b];
        const size_t n = buf_bytes[b] / sizeof(float);
        const size_t checked = b == Y || b == DX ? (size_t)(12 + 21) * H : n;   /* not the tail */
        double err = 0.0, scale = 0.0;
        for (size_t i = 0; i < checked; i++) {
            const double e = fabs((double)g[i] - want[b][i]);
            if (!(e <= err)) err = e;   /* NaN included */
            if (fabs(want[b][i]) > scale) scale = fabs(want[b][i]);
        }
        const double rel = err / (scale > 0.0 ? scale : 1.0);
        if (!(rel <= 1e-5)) {
            fprintf(stderr, "grouped_mlp: %s: %s is off by %.3g of its largest value\n", backend,
                    buf_name[b], rel);
            bad = 1;
        }
        if (rel > worst) worst = rel;
    }
    if (!bad)
        printf("%s: grouped MLP forward + backward: OK (largest error %.2g of an output's largest "
               "value)\n", backend, worst);
    return bad;
}

/* ---- one backend: buffers, the run, the check ---------------------------------------- */

/* 0: checked and right; 1: failed; -1: skipped (message printed) */
static int run_backend(moex_backend backend, void *const host_in[NBUF], double *const want[NBUF]) {
    const int gpu = backend == MOEX_BACKEND_CUDA;
    const char *name = gpu ? "cuda" : "cpu";
    moex_context *ctx = NULL;
    moex_status st = moex_context_create(&ctx, backend, 0);
    if (st != MOEX_OK) {
        fprintf(gpu ? stdout : stderr, "%s: %s: %s\n", name, gpu ? "skipped" : "failed",
                moex_last_error(NULL));
        return gpu ? -1 : 1;
    }
    void *b[NBUF] = {NULL}, *got[NBUF] = {NULL};
    int rc = 1;
    for (int i = 0; i < NBUF; i++) {
        b[i] = mem_alloc(gpu, buf_bytes[i]);
        got[i] = malloc(buf_bytes[i]);
        if (!b[i] || !got[i]) {
            fprintf(stderr, "grouped_mlp: %s: cannot allocate %s\n", name, buf_name[i]);
            goto done;
        }
        if (i < NINPUT && mem_copy(gpu, b[i], host_in[i], buf_bytes[i], 1) != 0) {
            fprintf(stderr, "grouped_mlp: %s: cannot copy %s to the device\n", name, buf_name[i]);
            goto done;
        }
    }
    st = run_mlp(ctx, gpu, b);
    if (st != MOEX_OK) {
        fprintf(stderr, "grouped_mlp: %s: %s: %s\n", name, moex_status_string(st), moex_last_error(ctx));
        goto done;
    }
    for (int i = 0; i < NBUF; i++)
        if (mem_copy(gpu, got[i], b[i], buf_bytes[i], 0) != 0) {
            fprintf(stderr, "grouped_mlp: %s: cannot copy %s from the device\n", name, buf_name[i]);
            goto done;
        }
    rc = check(name, got, want);
done:
    for (int i = 0; i < NBUF; i++) {
        if (b[i]) mem_free(gpu, b[i]);
        free(got[i]);
    }
    moex_context_destroy(ctx);
    return rc;
}

/* The inputs on the host (values in [-0.5, 0.5) from a fixed LCG, probs in (0, 1], dprobs
 * zeros since it is +=) and the reference's outputs. 0, or -1 when out of memory. */
static int make_problem(void *in[NBUF], double *want[NBUF]) {
    uint32_t seed = 12345u;
    for (int i = 0; i < NINPUT; i++) {
        if (!(in[i] = calloc(1, buf_bytes[i]))) return -1;
        if (i == SPLITS || i == DPROBS) continue;
        float *v = in[i];
        for (size_t j = 0; j < buf_bytes[i] / sizeof(float); j++) {
            seed = seed * 1664525u + 1013904223u;
            v[j] = (float)(seed >> 8) / 16777216.0f - 0.5f;
            if (i == PROBS) v[j] += 0.5f + 1.0f / 16777216.0f;
        }
    }
    memcpy(in[SPLITS], splits_host, sizeof splits_host);
    for (int o = 0; o < NOUTPUT; o++)
        if (!(want[outputs[o]] = calloc(buf_bytes[outputs[o]] / sizeof(float), sizeof(double)))) return -1;
    reference(in, want);
    return 0;
}

int main(void) {
    printf("moex %s\n", moex_version_string());
    void *in[NBUF] = {NULL};
    double *want[NBUF] = {NULL};
    int rc = 1;
    if (make_problem(in, want) != 0) {
        fprintf(stderr, "grouped_mlp: out of host memory\n");
    } else {
        rc = run_backend(MOEX_BACKEND_CPU, in, want);
#ifdef MOEX_EXAMPLE_CUDA
        int devices = 0;
        const cudaError_t ce = cudaGetDeviceCount(&devices);
        if (ce != cudaSuccess || devices == 0)
            printf("cuda: skipped (no GPU: %s)\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "no device");
        else if (run_backend(MOEX_BACKEND_CUDA, in, want) == 1)
            rc = 1;
#else
        printf("cuda: skipped (built without the CUDA runtime: see README.md)\n");
#endif
    }
    for (int i = 0; i < NBUF; i++) {
        free(in[i]);
        free(want[i]);
    }
    return rc;
}
