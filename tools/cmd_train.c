/*
 * cmd_train.c - `moex train`: trains a student MoE layer to match a fixed random teacher
 * MoE layer of the same shape, through the library's moex_moe_layer_forward/backward.
 *
 *   teacher, student: y = MoE(x) with a softmax top-k router (probs renormalised), SwiGLU
 *                     experts, no biases: router_w [E,H], w1 [E,2F,H], w2 [E,H,F]
 *   data:             x ~ N(0, 1) [T,H], a fresh batch every step from a seeded RNG
 *   loss:             MSE = mean over T*H of (y_student - y_teacher)^2
 *   optimiser:        Adam on f32 master weights (kept on the host, copied to the backend
 *                     in the activation dtype every step), cosine learning-rate decay
 *   --fp8 RECIPE:     the student's forward and backward (every moex call of the training
 *                     loop and of the evaluation) with moex_moe_layer_args.fp8 set, so its
 *                     expert GEMMs run in FP8 (docs/ops.md 9.11); the teacher, the fixed
 *                     target, always runs in the activation dtype
 *
 * The teacher's router logits have standard deviation 2 and its experts share half of
 * their weight variance (TEACHER_SHARED, see trainer_setup); the student's initial weights
 * come from another seed, with independent experts and near-uniform routing. The reported
 * initial and final losses are measured on a fixed evaluation set (EVAL_BATCHES batches
 * drawn once), so they compare the same inputs; the CSV and SVG hold the loss of every
 * training batch. Writes <out>/train_loss.csv and <out>/train_loss.svg.
 *
 * Before allocating anything it sums the memory of the run (trainer_need) and refuses a
 * run that needs more than is available or than --max-memory allows (cli_budget.c), then
 * checks that a file can be created in <out>.
 */
#include "cli_plot.h"
#include "cli_util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CMD "train"
#define EVAL_BATCHES 4
#define TEACHER_SHARED 0.5   /* fraction of an expert's weight variance common to all experts */

/* ---- options ------------------------------------------------------------------------ */

static const char *const dtype_words[] = {"f32", "bf16", NULL};
static const moex_dtype dtype_values[] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16};
static const char *const backend_words[] = {"auto", "cpu", "cuda", NULL};
/* --fp8: the index is the moex_fp8_mode; --fp8-format: the moex_fp8_dtypes */
static const char *const fp8_words[] = {"off", "block", "current", "mxfp8", NULL};
static const char *const fp8_format_words[] = {"e4m3", "hybrid", NULL};

typedef struct train_opts {
    int64_t experts, topk, hidden, ffn, tokens, steps, seed, threads, max_memory;
    double lr;
    int dtype, backend, fp8, fp8_format, json;
    const char *out;
} train_opts;

/* Defaults: finish in well under a minute on 2 cores with final loss <= initial / 10. */
static const train_opts default_opts = {
    .experts = 8, .topk = 2, .hidden = 32, .ffn = 64, .tokens = 512, .steps = 5000,
    .seed = 1, .threads = 0, .max_memory = 0, .lr = 1e-2, .dtype = 0, .backend = 0, .fp8 = 0, .fp8_format = 0,
    .json = 0, .out = ".",
};

static void usage(FILE *out) {
    fprintf(out,
            "usage: moex train [options]\n"
            "\n"
            "Trains a student MoE layer (softmax top-k router with renormalised probs, SwiGLU\n"
            "experts, no biases) to match a fixed random teacher of the same shape on Gaussian\n"
            "inputs, with an MSE loss and Adam on f32 master weights, through\n"
            "moex_moe_layer_forward/backward. The teacher's experts share half of their weight\n"
            "variance (as experts upcycled from one MLP do); the student starts from another\n"
            "seed. Prints a progress bar on a terminal (plain lines otherwise), then a summary\n"
            "with the loss on a fixed evaluation set before and after, and writes the loss of\n"
            "every training batch to <out>/train_loss.csv and <out>/train_loss.svg.\n"
            "\n"
            "options:\n"
            "  --experts E      experts (default %lld)\n"
            "  --topk K         experts per token, 1..E (default %lld)\n"
            "  --hidden H       hidden size (default %lld)\n"
            "  --ffn F          FFN size of one GLU half (default %lld)\n"
            "  --tokens T       tokens per batch (default %lld)\n"
            "  --steps S        optimiser steps (default %lld)\n"
            "  --lr LR          peak Adam learning rate, cosine decay to LR/20 (default %g)\n"
            "  --dtype D        f32 | bf16: activations and weights the layer sees (default f32)\n"
            "  --fp8 RECIPE     off | block | current | mxfp8: the student's expert GEMMs, forward\n"
            "                   and backward, in FP8 (experimental; docs/ops.md 9.11): block is\n"
            "                   DeepSeek-V3's 1x128 / 128x128 block scaling, current one scale per\n"
            "                   expert's rows and one per expert's weights, mxfp8 1x32 blocks with\n"
            "                   E8M0 scales. The teacher stays in --dtype (default off)\n"
            "  --fp8-format F   e4m3 | hybrid: with --fp8, every operand E4M3, or the gradients\n"
            "                   E5M2 (default e4m3)\n"
            "  --backend B      auto | cpu | cuda (default auto: cuda when a CUDA context can be\n"
            "                   created, else cpu)\n"
            "  --threads N      CPU threads (default: the library's, MOEX_NUM_THREADS or all)\n"
            "  --seed S         seed of the teacher, 0..2^53; the student and the data use derived\n"
            "                   seeds (default %lld)\n"
            "  --out DIR        directory for train_loss.csv and train_loss.svg, created with its\n"
            "                   parents if missing and checked writable before training (default .)\n"
            "  --max-memory BYTES  the most memory the run may take, host and (cuda) device\n"
            "                   memory each; BYTES is an integer with an optional K, M, G or T\n"
            "                   suffix (KiB...TiB), e.g. 512M or 8G (default: the memory available\n"
            "                   now: MemAvailable of /proc/meminfo, the GPU's free memory). A run\n"
            "                   whose buffers need more is refused before anything is allocated\n"
            "  --json           print only one JSON object with the results\n"
            "  -h, --help       this help\n",
            (long long)default_opts.experts, (long long)default_opts.topk,
            (long long)default_opts.hidden, (long long)default_opts.ffn,
            (long long)default_opts.tokens, (long long)default_opts.steps, default_opts.lr,
            (long long)default_opts.seed);
}

/* ---- one MoE layer's parameters ------------------------------------------------------ */

/* One trainable tensor: f32 master weights and Adam moments on the host; the copy the
 * layer reads (activation dtype) and its f32 gradient in backend memory. */
typedef struct param {
    size_t n;
    float *w, *m, *v, *g;   /* host, n each (m, v, g: student only) */
    void *dev_w;            /* backend, n elements of the activation dtype */
    float *dev_g;           /* backend, n f32 (student only) */
} param;

typedef struct moe_net {
    param router, w1, w2;   /* [E,H], [E,2F,H], [E,H,F] */
    void *saved;            /* backend, the forward's saved state */
} moe_net;

typedef struct trainer {
    train_opts o;
    moex_backend backend;
    moex_dtype dt;
    moex_fp8_recipe fp8;         /* the student's (--fp8); the teacher runs without */
    moex_context *ctx;
    int64_t E, k, H, F, T;
    moe_net teacher, student;
    size_t saved_bytes, ws_bytes;
    void *ws;                    /* backend workspace shared by all calls (one stream) */
    void *dev_x, *dev_y, *dev_dy;/* backend [T,H] activation dtype */
    float *xf, *yt, *ys, *dyf;   /* host [T,H] f32 */
    void *stage;                 /* host [T,H] activation dtype: staging for copies */
    void *eval_x[EVAL_BATCHES];  /* host [T,H] activation dtype */
    float *eval_y[EVAL_BATCHES]; /* host [T,H] f32: the teacher's outputs */
} trainer;

static int param_init(trainer *t, param *p, size_t n, int trainable) {
    size_t es = moex_dtype_size(t->dt);
    p->n = n;
    p->w = calloc(n, sizeof(float));
    p->dev_w = cli_mem_alloc(t->backend, n * es);
    if (!p->w || !p->dev_w) return -1;
    if (trainable) {
        p->m = calloc(n, sizeof(float));
        p->v = calloc(n, sizeof(float));
        p->g = calloc(n, sizeof(float));
        p->dev_g = cli_mem_alloc(t->backend, n * sizeof(float));
        if (!p->m || !p->v || !p->g || !p->dev_g) return -1;
    }
    return 0;
}

static void param_free(trainer *t, param *p) {
    free(p->w);
    free(p->m);
    free(p->v);
    free(p->g);
    cli_mem_free(t->backend, p->dev_w);
    cli_mem_free(t->backend, p->dev_g);
}

/* w[i] = scale * N(0, 1) */
static void fill_normal(cli_rng *r, float *w, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) w[i] = (float)(scale * cli_rng_normal(r));
}

/* Copies the master weights to the backend in the activation dtype. */
static int param_upload(trainer *t, param *p) {
    size_t es = moex_dtype_size(t->dt);
    void *tmp = malloc(p->n * es);
    if (!tmp) return -1;
    cli_from_f32(tmp, t->dt, p->w, p->n);
    int rc = cli_mem_upload(t->backend, p->dev_w, tmp, p->n * es);
    free(tmp);
    return rc;
}

/* w[i] = sqrt(1 - shared) * own_i + sqrt(shared) * common[i % per], own and common ~ N(0, 1)
 * times `scale`: each of the n / per expert matrices has the same variance, and a fraction
 * `shared` of it is one draw common to all experts. */
static int fill_experts(cli_rng *r, float *w, size_t n, size_t per, double scale, double shared) {
    fill_normal(r, w, n, scale * sqrt(1.0 - shared));
    if (shared <= 0.0) return 0;
    float *common = malloc(per * sizeof(float));
    if (!common) return -1;
    fill_normal(r, common, per, scale * sqrt(shared));
    for (size_t i = 0; i < n; i++) w[i] += common[i % per];
    free(common);
    return 0;
}

/* Random weights with unit-variance pre-activations: w1 ~ N(0, 1/H), w2 ~ N(0, 1/F), a
 * fraction `shared` of each expert's variance common to all experts (as in experts
 * upcycled from one dense MLP); router ~ N(0, router_scale^2 / H), so the logits have
 * standard deviation router_scale. */
static int net_randomize(trainer *t, moe_net *net, uint64_t seed, double router_scale, double shared) {
    cli_rng r = cli_rng_make(seed);
    fill_normal(&r, net->router.w, net->router.n, router_scale / sqrt((double)t->H));
    if (fill_experts(&r, net->w1.w, net->w1.n, (size_t)(2 * t->F * t->H), 1.0 / sqrt((double)t->H), shared) ||
        fill_experts(&r, net->w2.w, net->w2.n, (size_t)(t->H * t->F), 1.0 / sqrt((double)t->F), shared))
        return -1;
    return 0;
}

/* The shapes of a net's tensors, in the order router, w1, w2: [E,H], [E,2F,H], [E,H,F]. */
#define NET_PARAMS 3
static void net_shapes(const trainer *t, int64_t shape[NET_PARAMS][3]) {
    const int64_t s[NET_PARAMS][3] = {{t->E, t->H, 1}, {t->E, 2 * t->F, t->H}, {t->E, t->H, t->F}};
    memcpy(shape, s, sizeof s);
}

static int net_init(trainer *t, moe_net *net, int trainable) {
    param *ps[NET_PARAMS] = {&net->router, &net->w1, &net->w2};
    int64_t shape[NET_PARAMS][3];
    net_shapes(t, shape);
    for (int i = 0; i < NET_PARAMS; i++) {
        if (param_init(t, ps[i], (size_t)(shape[i][0] * shape[i][1] * shape[i][2]), trainable)) return -1;
    }
    return 0;
}

static int net_upload(trainer *t, moe_net *net) {
    if (param_upload(t, &net->router) || param_upload(t, &net->w1) || param_upload(t, &net->w2)) return -1;
    return 0;
}

static void net_free(trainer *t, moe_net *net) {
    param_free(t, &net->router);
    param_free(t, &net->w1);
    param_free(t, &net->w2);
    cli_mem_free(t->backend, net->saved);
}

/* The forward arguments of `net` on the trainer's x and y buffers. */
static moex_moe_layer_args layer_args(const trainer *t, const moe_net *net) {
    moex_moe_layer_args a;
    memset(&a, 0, sizeof a);
    a.x = moex_tensor_2d(t->dev_x, t->dt, t->T, t->H);
    a.router_w = moex_tensor_2d(net->router.dev_w, t->dt, t->E, t->H);
    a.topk = (int32_t)t->k;
    a.score = MOEX_ROUTER_SOFTMAX;
    a.norm = MOEX_ROUTER_RENORM;
    a.w1 = moex_weight_packed(moex_tensor_3d(net->w1.dev_w, t->dt, t->E, 2 * t->F, t->H));
    a.w2 = moex_weight_packed(moex_tensor_3d(net->w2.dev_w, t->dt, t->E, t->H, t->F));
    a.b2_mode = MOEX_BIAS_NONE;
    a.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    a.saved = net->saved;
    a.saved_bytes = t->saved_bytes;
    a.y = moex_tensor_2d(t->dev_y, t->dt, t->T, t->H);
    if (net == &t->student) a.fp8 = t->fp8;   /* the backward gets it through g.fwd */
    return a;
}

static moex_moe_layer_grad_args grad_args(const trainer *t) {
    moex_moe_layer_grad_args g;
    memset(&g, 0, sizeof g);
    g.fwd = layer_args(t, &t->student);
    g.dy = moex_tensor_2d(t->dev_dy, t->dt, t->T, t->H);
    g.dw_mode = MOEX_GRAD_WRITE;
    g.drouter_w = moex_tensor_2d(t->student.router.dev_g, MOEX_DTYPE_F32, t->E, t->H);
    g.dw1 = moex_weight_packed(moex_tensor_3d(t->student.w1.dev_g, MOEX_DTYPE_F32, t->E, 2 * t->F, t->H));
    g.dw2 = moex_weight_packed(moex_tensor_3d(t->student.w2.dev_g, MOEX_DTYPE_F32, t->E, t->H, t->F));
    return g;
}

static int lib_ok(trainer *t, moex_status st, const char *what) {
    if (st == MOEX_OK) return 0;
    cli_error(CMD, "%s failed: %s (%s)", what, moex_last_error(t->ctx), moex_status_string(st));
    return -1;
}

/* ---- setup -------------------------------------------------------------------------- */

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/* t->saved_bytes and t->ws_bytes (the largest of the forwards' and the backward's workspace:
 * the student's with its FP8 recipe, the teacher's without), from the library's queries on
 * placeholder buffers: known before anything is allocated. */
static int trainer_query_sizes(trainer *t) {
    trainer p = *t;
    void *nd = cli_no_data();
    param *ps[2 * NET_PARAMS] = {&p.student.router, &p.student.w1, &p.student.w2,
                                 &p.teacher.router, &p.teacher.w1, &p.teacher.w2};
    p.dev_x = p.dev_y = p.dev_dy = p.student.saved = p.teacher.saved = nd;
    for (int i = 0; i < 2 * NET_PARAMS; i++) ps[i]->dev_w = ps[i]->dev_g = nd;
    moex_moe_layer_args fa = layer_args(&p, &p.student);
    if (lib_ok(t, moex_moe_layer_saved_size(t->ctx, &fa, &t->saved_bytes), "moex_moe_layer_saved_size")) return -1;
    p.saved_bytes = t->saved_bytes;
    fa = layer_args(&p, &p.student);
    p.teacher.saved = p.student.saved;
    moex_moe_layer_args ta = layer_args(&p, &p.teacher);
    moex_moe_layer_grad_args ga = grad_args(&p);
    size_t ws_f = 0, ws_t = 0, ws_b = 0;
    if (lib_ok(t, moex_moe_layer_forward_workspace_size(t->ctx, &fa, &ws_f), "moex_moe_layer_forward_workspace_size") ||
        lib_ok(t, moex_moe_layer_forward_workspace_size(t->ctx, &ta, &ws_t), "moex_moe_layer_forward_workspace_size") ||
        lib_ok(t, moex_moe_layer_backward_workspace_size(t->ctx, &ga, &ws_b), "moex_moe_layer_backward_workspace_size"))
        return -1;
    t->ws_bytes = max_size(max_size(ws_f, ws_t), ws_b);
    return 0;
}

/* The memory of a run: every buffer trainer_setup allocates (after trainer_query_sizes),
 * the largest temporary of param_upload and fill_experts, and the loss curve. */
static cli_budget trainer_need(const trainer *t) {
    const size_t es = moex_dtype_size(t->dt), f4 = sizeof(float);
    cli_budget b = cli_budget_make(t->backend);
    int64_t shape[NET_PARAMS][3];
    net_shapes(t, shape);
    size_t temp = 0;
    for (int i = 0; i < NET_PARAMS; i++) {
        const int64_t *d = shape[i];
        const size_t f32 = cli_array_bytes(f4, d[0], d[1], d[2]), act = cli_array_bytes(es, d[0], d[1], d[2]);
        cli_budget_host(&b, cli_size_mul(f32, 5));      /* w of both nets; m, v, g of the student */
        cli_budget_backend(&b, cli_size_mul(act, 2));   /* dev_w of both nets */
        cli_budget_backend(&b, f32);                    /* dev_g of the student */
        temp = max_size(temp, max_size(act, cli_array_bytes(f4, d[1], d[2], 1)));   /* upload, common */
    }
    cli_budget_host(&b, temp);
    const size_t x_act = cli_array_bytes(es, t->T, t->H, 1), x_f32 = cli_array_bytes(f4, t->T, t->H, 1);
    cli_budget_backend(&b, cli_size_mul(x_act, 3));                     /* dev_x, dev_y, dev_dy */
    cli_budget_host(&b, cli_size_add(cli_size_mul(x_f32, 4), x_act));  /* xf, yt, ys, dyf; stage */
    cli_budget_host(&b, cli_size_mul(cli_size_add(x_act, x_f32), EVAL_BATCHES));   /* eval_x, eval_y */
    cli_budget_backend(&b, cli_size_mul(t->saved_bytes, 2));            /* saved of both nets */
    cli_budget_backend(&b, t->ws_bytes);
    cli_budget_host(&b, cli_array_bytes(sizeof(double), t->o.steps, 1, 1));   /* the loss curve */
    return b;
}

/* Allocates and initialises everything (after trainer_query_sizes). */
static int trainer_setup(trainer *t) {
    size_t nx = (size_t)(t->T * t->H), es = moex_dtype_size(t->dt);
    if (net_init(t, &t->teacher, 0) || net_init(t, &t->student, 1)) goto oom;
    t->dev_x = cli_mem_alloc(t->backend, nx * es);
    t->dev_y = cli_mem_alloc(t->backend, nx * es);
    t->dev_dy = cli_mem_alloc(t->backend, nx * es);
    t->xf = malloc(nx * sizeof(float));
    t->yt = malloc(nx * sizeof(float));
    t->ys = malloc(nx * sizeof(float));
    t->dyf = malloc(nx * sizeof(float));
    t->stage = malloc(nx * es);
    if (!t->dev_x || !t->dev_y || !t->dev_dy || !t->xf || !t->yt || !t->ys || !t->dyf || !t->stage) goto oom;
    for (int b = 0; b < EVAL_BATCHES; b++) {
        t->eval_x[b] = malloc(nx * es);
        t->eval_y[b] = malloc(nx * sizeof(float));
        if (!t->eval_x[b] || !t->eval_y[b]) goto oom;
    }

    /* The teacher: router logits with standard deviation 2 (most tokens have a clear
     * favourite expert), experts sharing half their weight variance (TEACHER_SHARED), which
     * keeps the cost of a student that routes a token to a neighbouring expert moderate:
     * with fully independent experts about one seed in sixteen stalls near 10x (with it, the
     * worst of seeds 1..40 reaches 32x at the default 5000 steps). The student
     * starts from independent experts and small router logits (near-uniform routing). */
    uint64_t seed = (uint64_t)t->o.seed;
    if (net_randomize(t, &t->teacher, seed * 4 + 0, 2.0, TEACHER_SHARED) ||
        net_randomize(t, &t->student, seed * 4 + 1, 0.1, 0.0))
        goto oom;
    if (net_upload(t, &t->teacher) || net_upload(t, &t->student)) return -1;

    t->teacher.saved = cli_mem_alloc(t->backend, t->saved_bytes);
    t->student.saved = cli_mem_alloc(t->backend, t->saved_bytes);
    if (t->saved_bytes && (!t->teacher.saved || !t->student.saved)) goto oom;
    t->ws = cli_mem_alloc(t->backend, t->ws_bytes);
    if (t->ws_bytes && !t->ws) goto oom;
    return 0;
oom:
    cli_error(CMD, "out of memory");
    return -1;
}

static void trainer_free(trainer *t) {
    net_free(t, &t->teacher);
    net_free(t, &t->student);
    cli_mem_free(t->backend, t->ws);
    cli_mem_free(t->backend, t->dev_x);
    cli_mem_free(t->backend, t->dev_y);
    cli_mem_free(t->backend, t->dev_dy);
    free(t->xf);
    free(t->yt);
    free(t->ys);
    free(t->dyf);
    free(t->stage);
    for (int b = 0; b < EVAL_BATCHES; b++) {
        free(t->eval_x[b]);
        free(t->eval_y[b]);
    }
    moex_context_destroy(t->ctx);
}

/* ---- forward, loss, backward --------------------------------------------------------- */

/* Draws a batch x ~ N(0,1) into t->stage (activation dtype). */
static void draw_batch(trainer *t, cli_rng *r) {
    size_t nx = (size_t)(t->T * t->H);
    for (size_t i = 0; i < nx; i++) t->xf[i] = (float)cli_rng_normal(r);
    cli_from_f32(t->stage, t->dt, t->xf, nx);
}

/* Runs `net` forward on the batch in dev_x and reads y into `y` (host f32). */
static int forward(trainer *t, moe_net *net, float *y) {
    size_t nx = (size_t)(t->T * t->H), es = moex_dtype_size(t->dt);
    moex_moe_layer_args a = layer_args(t, net);
    if (lib_ok(t, moex_moe_layer_forward(t->ctx, &a, t->ws, t->ws_bytes, NULL), "moex_moe_layer_forward")) return -1;
    if (cli_mem_download(t->backend, t->stage, t->dev_y, nx * es)) return -1;
    cli_to_f32(y, t->stage, t->dt, nx);
    return 0;
}

static int upload_x(trainer *t, const void *x) {
    return cli_mem_upload(t->backend, t->dev_x, x, (size_t)(t->T * t->H) * moex_dtype_size(t->dt));
}

static double mse(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        s += d * d;
    }
    return s / (double)n;
}

/* The student's MSE over the fixed evaluation set, in *loss. */
static int evaluate(trainer *t, double *loss) {
    size_t nx = (size_t)(t->T * t->H);
    double s = 0.0;
    for (int b = 0; b < EVAL_BATCHES; b++) {
        if (upload_x(t, t->eval_x[b]) || forward(t, &t->student, t->ys)) return -1;
        s += mse(t->ys, t->eval_y[b], nx);
    }
    *loss = s / EVAL_BATCHES;
    return 0;
}

/* Adam (beta1 0.9, beta2 0.999, eps 1e-8, bias-corrected) on one tensor. */
static void adam(param *p, double lr, int64_t step) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double c1 = 1.0 - pow(b1, (double)step), c2 = 1.0 - pow(b2, (double)step);
    for (size_t i = 0; i < p->n; i++) {
        double g = p->g[i];
        p->m[i] = (float)(b1 * p->m[i] + (1.0 - b1) * g);
        p->v[i] = (float)(b2 * p->v[i] + (1.0 - b2) * g * g);
        double mh = p->m[i] / c1, vh = p->v[i] / c2;
        p->w[i] = (float)(p->w[i] - lr * mh / (sqrt(vh) + eps));
    }
}

/* Peak lr for the first 2% of the steps (linear warm-up), then cosine down to lr/20. */
static double lr_at(const train_opts *o, int64_t step) {
    int64_t warm = o->steps / 50 > 0 ? o->steps / 50 : 1;
    if (step < warm) return o->lr * (double)(step + 1) / (double)warm;
    double frac = (double)(step - warm) / (double)(o->steps - warm > 1 ? o->steps - warm : 1);
    double lo = o->lr / 20.0;
    return lo + 0.5 * (o->lr - lo) * (1.0 + cos(3.141592653589793 * frac));
}

/* One training step on a fresh batch; *loss is the batch's MSE before the update. */
static int train_step(trainer *t, cli_rng *data, int64_t step, double *loss) {
    size_t nx = (size_t)(t->T * t->H), es = moex_dtype_size(t->dt);
    draw_batch(t, data);
    if (upload_x(t, t->stage) || forward(t, &t->teacher, t->yt) || forward(t, &t->student, t->ys)) return -1;
    *loss = mse(t->ys, t->yt, nx);
    double scale = 2.0 / (double)nx;   /* d mean((ys - yt)^2) / d ys */
    for (size_t i = 0; i < nx; i++) t->dyf[i] = (float)(scale * ((double)t->ys[i] - (double)t->yt[i]));
    cli_from_f32(t->stage, t->dt, t->dyf, nx);
    if (cli_mem_upload(t->backend, t->dev_dy, t->stage, nx * es)) return -1;

    moex_moe_layer_grad_args g = grad_args(t);
    if (lib_ok(t, moex_moe_layer_backward(t->ctx, &g, t->ws, t->ws_bytes, NULL), "moex_moe_layer_backward"))
        return -1;
    param *ps[3] = {&t->student.router, &t->student.w1, &t->student.w2};
    double lr = lr_at(&t->o, step);
    for (int i = 0; i < 3; i++) {
        if (cli_mem_download(t->backend, ps[i]->g, ps[i]->dev_g, ps[i]->n * sizeof(float))) return -1;
        adam(ps[i], lr, step + 1);
        if (param_upload(t, ps[i])) return -1;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------------------- */

static void progress(int tty, int64_t step, int64_t steps, double loss, double tok_s) {
    if (tty) {
        const int width = 30;
        int fill = (int)((double)width * (double)step / (double)steps);
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        printf("\r[%s] step %lld/%lld  loss %.4e  %.0f tokens/s\033[K", bar, (long long)step,
               (long long)steps, loss, tok_s);
    } else {
        printf("step %lld/%lld  loss %.4e  %.0f tokens/s\n", (long long)step, (long long)steps, loss, tok_s);
    }
    fflush(stdout);
}

/* `s` as a JSON string literal (quotes, backslashes and control characters escaped). */
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int write_csv(const char *path, const double *loss, int64_t n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "step,loss\n");
    for (int64_t i = 0; i < n; i++) fprintf(f, "%lld,%.9g\n", (long long)i, loss[i]);
    return fclose(f) == 0 ? 0 : -1;
}

static int make_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return 0;
        errno = ENOTDIR;
        return -1;
    }
    if (mkdir(dir, 0777) == 0) return 0;
    /* made meanwhile by someone else: fine when it is a directory */
    return errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* `mkdir -p dir`: makes each missing directory of the path, parents first. 0 when `dir` is a
 * directory afterwards, else -1 with errno (ENOTDIR when a part of the path is a file). */
static int make_dirs(const char *dir) {
    char path[4096];
    const size_t n = strlen(dir);
    if (n >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, dir, n + 1);
    /* each prefix that ends before a '/' (not the root's), then the whole path */
    for (size_t i = 1; i < n; i++) {
        if (path[i] != '/' || path[i - 1] == '/') continue;
        path[i] = '\0';
        const int rc = make_dir(path);
        path[i] = '/';
        if (rc != 0) return -1;
    }
    return make_dir(path);
}

/* Creates `dir` and its missing parents and checks that a file can be created in it (a
 * temporary one, removed at once), so that an unusable --out is refused before training.
 * Prints a message and returns -1 when not. */
static int check_out_dir(const char *dir) {
    if (make_dirs(dir) != 0) {
        cli_error(CMD, "cannot create the output directory '%s': %s", dir, strerror(errno));
        return -1;
    }
    char probe[4096];
    if (snprintf(probe, sizeof probe, "%s/.moex-train-XXXXXX", dir) >= (int)sizeof probe) {
        cli_error(CMD, "--out path is too long");
        return -1;
    }
    int fd = mkstemp(probe);
    if (fd < 0) {
        cli_error(CMD, "cannot write in the output directory '%s': %s", dir, strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

/* ---- the command -------------------------------------------------------------------- */

int cli_cmd_train(int argc, char **argv) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.o = default_opts;
    const cli_option opts[] = {
        {"experts", CLI_OPT_INT, &t.o.experts, .imin = 1, .imax = 4096},
        {"topk", CLI_OPT_INT, &t.o.topk, .imin = 1, .imax = 4096},
        {"hidden", CLI_OPT_INT, &t.o.hidden, .imin = 1, .imax = 65536},
        {"ffn", CLI_OPT_INT, &t.o.ffn, .imin = 1, .imax = 65536},
        {"tokens", CLI_OPT_INT, &t.o.tokens, .imin = 1, .imax = INT64_C(1) << 24},
        {"steps", CLI_OPT_INT, &t.o.steps, .imin = 1, .imax = 1000000000},
        {"lr", CLI_OPT_DOUBLE, &t.o.lr, .min = 1e-12, .max = 10.0},
        {"dtype", CLI_OPT_CHOICE, &t.o.dtype, .choices = dtype_words},
        {"backend", CLI_OPT_CHOICE, &t.o.backend, .choices = backend_words},
        {"fp8", CLI_OPT_CHOICE, &t.o.fp8, .choices = fp8_words},
        {"fp8-format", CLI_OPT_CHOICE, &t.o.fp8_format, .choices = fp8_format_words},
        {"threads", CLI_OPT_INT, &t.o.threads, .imin = 1, .imax = 1024},
        {"seed", CLI_OPT_INT, &t.o.seed, .imin = 0, .imax = INT64_C(1) << 53},
        {"max-memory", CLI_OPT_BYTES, &t.o.max_memory, .imin = 1, .imax = INT64_MAX},
        {"out", CLI_OPT_STRING, .value = &t.o.out},
        {"json", CLI_OPT_FLAG, .value = &t.o.json},
    };
    int pr = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), usage);
    if (pr == CLI_PARSE_HELP) return CLI_EXIT_OK;
    if (pr != CLI_PARSE_OK) return CLI_EXIT_USAGE;
    if (t.o.topk > t.o.experts) {
        cli_error(CMD, "--topk %lld is larger than --experts %lld", (long long)t.o.topk, (long long)t.o.experts);
        return CLI_EXIT_USAGE;
    }
    if ((double)t.o.tokens * (double)t.o.hidden > 1e9 || (double)t.o.experts * 3.0 * (double)t.o.ffn * (double)t.o.hidden > 1e9) {
        cli_error(CMD, "the layer is too large for this demo (tokens*hidden and experts*3*ffn*hidden must be <= 1e9)");
        return CLI_EXIT_USAGE;
    }

    t.dt = dtype_values[t.o.dtype];
    t.fp8.mode = (moex_fp8_mode)t.o.fp8;
    t.fp8.dtypes = (moex_fp8_dtypes)t.o.fp8_format;
    if (t.o.backend == 0)
        t.backend = cli_cuda_available() ? MOEX_BACKEND_CUDA : MOEX_BACKEND_CPU;
    else
        t.backend = t.o.backend == 2 ? MOEX_BACKEND_CUDA : MOEX_BACKEND_CPU;
    t.E = t.o.experts;
    t.k = t.o.topk;
    t.H = t.o.hidden;
    t.F = t.o.ffn;
    t.T = t.o.tokens;

    char csv_path[4096], svg_path[4096];
    if (snprintf(csv_path, sizeof csv_path, "%s/train_loss.csv", t.o.out) >= (int)sizeof csv_path ||
        snprintf(svg_path, sizeof svg_path, "%s/train_loss.svg", t.o.out) >= (int)sizeof svg_path) {
        cli_error(CMD, "--out path is too long");
        return CLI_EXIT_USAGE;
    }

    /* Before anything large is allocated: the memory the run needs, then --out. */
    t.ctx = cli_context(CMD, t.backend);
    if (!t.ctx) return CLI_EXIT_FAIL;
    if ((t.o.threads > 0 && t.backend == MOEX_BACKEND_CPU &&
         lib_ok(&t, moex_context_set_num_threads(t.ctx, (int)t.o.threads), "moex_context_set_num_threads")) ||
        trainer_query_sizes(&t) != 0) {
        trainer_free(&t);
        return CLI_EXIT_FAIL;
    }
    cli_budget need = trainer_need(&t);
    if (cli_budget_check(CMD, &need, t.o.max_memory) != 0 || check_out_dir(t.o.out) != 0) {
        trainer_free(&t);
        return CLI_EXIT_FAIL;
    }

    int rc = CLI_EXIT_FAIL;
    double *curve = malloc((size_t)t.o.steps * sizeof(double));
    if (!curve) {
        cli_error(CMD, "out of memory");
        goto done;
    }
    if (trainer_setup(&t) != 0) goto done;

    /* the fixed evaluation set and the teacher's answers */
    size_t nx = (size_t)(t.T * t.H), es = moex_dtype_size(t.dt);
    cli_rng eval_rng = cli_rng_make((uint64_t)t.o.seed * 4 + 2);
    for (int b = 0; b < EVAL_BATCHES; b++) {
        draw_batch(&t, &eval_rng);
        memcpy(t.eval_x[b], t.stage, nx * es);
        if (upload_x(&t, t.eval_x[b]) || forward(&t, &t.teacher, t.eval_y[b])) goto done;
    }
    double initial = 0.0, final = 0.0;
    if (evaluate(&t, &initial)) goto done;

    int tty = !t.o.json && isatty(STDOUT_FILENO);
    if (!t.o.json) {
        printf("moex train: backend %s, dtype %s, fp8 %s%s%s, experts %lld, topk %lld, hidden %lld, ffn %lld, "
               "tokens %lld, steps %lld, lr %g, seed %lld\n",
               cli_backend_name(t.backend), moex_dtype_name(t.dt), fp8_words[t.o.fp8], t.o.fp8 ? "/" : "",
               t.o.fp8 ? fp8_format_words[t.o.fp8_format] : "", (long long)t.E, (long long)t.k,
               (long long)t.H, (long long)t.F, (long long)t.T, (long long)t.o.steps, t.o.lr,
               (long long)t.o.seed);
        fflush(stdout);
    }

    cli_rng data = cli_rng_make((uint64_t)t.o.seed * 4 + 3);
    int64_t every = t.o.steps >= 10 ? t.o.steps / 10 : 1;   /* plain lines: about 10 */
    double t0 = cli_now(), last_draw = 0.0;
    for (int64_t s = 0; s < t.o.steps; s++) {
        if (train_step(&t, &data, s, &curve[s])) {
            if (tty) printf("\n");
            goto done;
        }
        if (!isfinite(curve[s])) {
            if (tty) printf("\n");
            cli_error(CMD, "the loss is not finite at step %lld (try a smaller --lr)", (long long)s);
            goto done;
        }
        double now = cli_now() - t0;
        double tok_s = (double)(s + 1) * (double)t.T / (now > 0 ? now : 1e-9);
        if (tty && (now - last_draw >= 0.1 || s + 1 == t.o.steps)) {
            progress(1, s + 1, t.o.steps, curve[s], tok_s);
            last_draw = now;
        } else if (!t.o.json && !tty && ((s + 1) % every == 0 || s == 0)) {
            progress(0, s + 1, t.o.steps, curve[s], tok_s);
        }
    }
    cli_mem_sync(t.backend);
    double seconds = cli_now() - t0;
    if (tty) printf("\n");
    if (evaluate(&t, &final)) goto done;
    double tokens_per_s = (double)t.o.steps * (double)t.T / (seconds > 0 ? seconds : 1e-9);
    double ratio = final > 0.0 ? initial / final : INFINITY;

    int files_ok = write_csv(csv_path, curve, t.o.steps) == 0 &&
                   cli_plot_svg(svg_path, "moex train: student vs teacher MoE layer", "step",
                                "MSE loss (training batch)", curve, t.o.steps) == 0;
    if (!files_ok) {
        cli_error(CMD, "cannot write the loss curve to '%s': %s", t.o.out, strerror(errno));
        goto done;
    }

    if (t.o.json) {
        printf("{\"initial_loss\": %.9g, \"final_loss\": %.9g, \"loss_ratio\": %.6g, \"steps\": %lld, "
               "\"tokens_per_step\": %lld, \"time_s\": %.4f, \"tokens_per_s\": %.1f, \"backend\": \"%s\", "
               "\"dtype\": \"%s\", \"fp8\": \"%s\", \"fp8_format\": \"%s\", \"experts\": %lld, "
               "\"topk\": %lld, \"hidden\": %lld, \"ffn\": %lld, \"lr\": %g, \"seed\": %lld, \"csv\": ",
               initial, final, ratio, (long long)t.o.steps, (long long)t.T, seconds, tokens_per_s,
               cli_backend_name(t.backend), moex_dtype_name(t.dt), fp8_words[t.o.fp8],
               fp8_format_words[t.o.fp8_format], (long long)t.E, (long long)t.k,
               (long long)t.H, (long long)t.F, t.o.lr, (long long)t.o.seed);
        json_string(stdout, csv_path);
        printf(", \"svg\": ");
        json_string(stdout, svg_path);
        printf("}\n");
    } else {
        printf("initial loss %.4e  final loss %.4e  (%.1fx lower, evaluation set of %d x %lld tokens)\n",
               initial, final, ratio, EVAL_BATCHES, (long long)t.T);
        printf("time %.2f s  %.0f tokens/s  (%lld steps x %lld tokens; each step: teacher forward, student\n"
               "forward and backward, Adam)\n",
               seconds, tokens_per_s, (long long)t.o.steps, (long long)t.T);
        printf("loss curve: %s, %s\n", csv_path, svg_path);
    }
    rc = CLI_EXIT_OK;
done:
    free(curve);
    trainer_free(&t);
    return rc;
}
