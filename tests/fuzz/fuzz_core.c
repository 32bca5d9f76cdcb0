/*
 * fuzz_core.c - the core of the moex API fuzzer (the fault list and the oracles are in
 * fuzz.h): decoding the input, the memory of a case (one allocation per tensor, guards,
 * ASan poisoning of guards, tails and, during size queries, of all data), the generic
 * faults G0..G13, workspace and `saved`, and the judge of every call (fz_call_end).
 */
#include "fuzz.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(FZ_ASAN)
#define FZ_ASAN 1
#endif
#ifdef FZ_ASAN
#include <sanitizer/asan_interface.h>
#define FZ_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define FZ_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define FZ_POISON(p, n) ((void)(p), (void)(n))
#define FZ_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define FZ_GUARD 64          /* guard bytes on each side of every buffer */
#define FZ_GUARD_BYTE 0xA5
#define FZ_ALL_STATUS 0x7Fu  /* MOEX_OK .. MOEX_ERR_INTERNAL */

fz_global fz_g;
fz_features fz_last_features;
static fz_case *cur_case;

const char *const fz_op_names[FZ_NUM_OPS] = {
    "splits_to_offsets", "grouped_linear_forward", "grouped_linear_backward_data",
    "grouped_linear_backward_weight", "scaled_glu_forward", "scaled_glu_backward", "grouped_mlp_forward",
    "grouped_mlp_backward", "router_forward", "router_backward", "permute_forward", "permute_backward",
    "unpermute_forward", "unpermute_backward", "moe_layer", "context", "group_quantize", "group_dequantize",
    "grouped_linear_fp8_forward", "grouped_linear_fp8_backward_weight", "zero_tail",
#ifdef MOEX_FUZZ_HAVE_MPI
    "ep_dispatch_forward", "ep_dispatch_backward", "ep_combine_forward", "ep_combine_backward",
#endif
};

static void (*const op_builders[FZ_NUM_OPS])(fz_case *) = {
    fz_op_splits_to_offsets, fz_op_gl_fwd, fz_op_gl_dgrad, fz_op_gl_wgrad, fz_op_glu_fwd, fz_op_glu_bwd,
    fz_op_mlp_fwd, fz_op_mlp_bwd, fz_op_router_fwd, fz_op_router_bwd, fz_op_permute_fwd, fz_op_permute_bwd,
    fz_op_unpermute_fwd, fz_op_unpermute_bwd, fz_op_moe, fz_op_context, fz_op_quantize, fz_op_dequantize,
    fz_op_fp8_fwd, fz_op_fp8_wgrad, fz_op_zero_tail,
#ifdef MOEX_FUZZ_HAVE_MPI
    fz_op_ep_dispatch, fz_op_ep_dispatch_bwd, fz_op_ep_combine, fz_op_ep_combine_bwd,
#endif
};

/* The later ops take op bytes that no input of corpus/ used when they came (so that every
 * seed decodes as before): 253 zero_tail; 240, 241, 246, 247, 248, 249 the EP ops (in MPI
 * builds; byte % 20 otherwise). */
int fz_op_of_byte(uint8_t b) {
    if (b == 253) return FZ_OP_ZERO_TAIL;
#ifdef MOEX_FUZZ_HAVE_MPI
    switch (b) {
    case 240: case 248: return FZ_OP_EP_DISPATCH;
    case 241: case 249: return FZ_OP_EP_DISPATCH_BWD;
    case 246: return FZ_OP_EP_COMBINE;
    case 247: return FZ_OP_EP_COMBINE_BWD;
    default: break;
    }
#endif
    return b % FZ_NUM_BASE_OPS;
}

/* ---- failures ---------------------------------------------------------------------------- */

const char *fz_current_case(void) { return cur_case ? cur_case->desc : ""; }

static void print_faults(FILE *f, const fz_case *c) {
    if (c->nfaults == 0) {
        fprintf(f, "  faults: none (a valid call)\n");
        return;
    }
    static const char *const cls[] = {"STRUCT", "RUNONLY", "SPLITS", "IDS", "OFFSFIT", "CHAOS"};
    for (int i = 0; i < c->nfaults; i++) fprintf(f, "  fault %d [%s]: %s\n", i, cls[c->faults[i].cls], c->faults[i].what);
}

void fz_print_current_case(FILE *f) {
    const fz_case *c = cur_case;
    if (!c) return;
    fprintf(f, "  backend %s, %s mode, call %s, case: %s\n", c->cuda ? "cuda" : "cpu", c->huge ? "huge" : "run",
            c->call ? c->call : "(none yet)", c->desc);
    print_faults(f, c);
}

void fz_fail(fz_case *c, const char *oracle, const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "\nmoex_fuzz: FAILED oracle \"%s\" in %s: ", oracle, c && c->call ? c->call : "(no call)");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    if (c) {
        fprintf(stderr, "  backend %s, %s mode, case: %s\n", c->cuda ? "cuda" : "cpu", c->huge ? "huge" : "run",
                c->desc);
        print_faults(stderr, c);
    }
    fz_g.failures++;
    if (fz_g.on_failure) fz_g.on_failure();
    if (fz_g.keep_going && c && c->jb) longjmp(*c->jb, 1);
    abort();
}

/* ---- decoding ------------------------------------------------------------------------------- */

uint8_t fz_u8(fz_case *c) {
    uint8_t v = c->pos < c->size ? c->data[c->pos] : 0;
    c->pos++;
    return v;
}

uint64_t fz_u64(fz_case *c) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)fz_u8(c) << (8 * i);
    return v;
}

static uint32_t fz_u32(fz_case *c) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(c) << (8 * i);
    return v;
}

int fz_pick(fz_case *c, int n) { return n <= 1 ? (fz_u8(c), 0) : fz_u8(c) % n; }
bool fz_chance(fz_case *c, int in256) { return fz_u8(c) < in256; }

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fz_rand(fz_case *c) { return splitmix(&c->rng); }

int64_t fz_mul_sat(int64_t a, int64_t b) {
    if (a <= 0 || b <= 0) return a < 0 || b < 0 ? -1 : 0;
    return a > INT64_MAX / b ? INT64_MAX : a * b;
}

static int64_t huge_dim(fz_case *c, int64_t lo, uint8_t b) {
    static const int64_t special[16] = {
        INT64_MAX, (int64_t)INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)UINT32_MAX, (int64_t)1 << 31,
        (int64_t)1 << 32, ((int64_t)1 << 32) + 1, (int64_t)1 << 60, ((int64_t)1 << 60) + 1, (int64_t)1 << 62,
        INT64_MAX / 2, INT64_MAX / 3, ((int64_t)1 << 30) + 7, 46341, 3037000500, (int64_t)1 << 40};
    int64_t v;
    switch (b >> 6) {
    case 0: v = b & 31; break;
    case 1: v = (int64_t)1 << ((b & 63) % 63); break;
    case 2: v = ((int64_t)1 << ((b & 63) % 62)) + (int8_t)fz_u8(c); break;
    default: v = special[b & 15]; break;
    }
    return v < lo ? lo : v;
}

int64_t fz_dim(fz_case *c, int64_t lo, int64_t small_hi, int64_t big_hi) {
    uint8_t b = fz_u8(c);
    if (c->huge) return huge_dim(c, lo, b);
    if (b < 232 || big_hi <= small_hi) return lo + b % (small_hi - lo + 1);
    return lo + (int64_t)((b - 232) * 256 + fz_u8(c)) % (big_hi - lo + 1);
}

moex_dtype fz_act_dtype(fz_case *c) {
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    return dts[fz_pick(c, 3)];
}

int32_t fz_bad_enum(fz_case *c, uint64_t p, int count) {
    (void)c;
    static const int32_t v[6] = {-1, INT32_MIN, INT32_MAX, 9, 255, 1 << 20};
    int k = (int)(p % 8);
    if (k < 6) return v[k];
    return count + (int32_t)((p >> 8) % 5);   /* just past the last valid value */
}

void fz_note(fz_case *c, const char *fmt, ...) {
    size_t len = strlen(c->desc);
    if (len + 1 >= sizeof c->desc) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->desc + len, sizeof c->desc - len, fmt, ap);
    va_end(ap);
}

void *fz_alloc(fz_case *c, size_t bytes) {
    if (c->nheap == (int)(sizeof c->heap / sizeof c->heap[0])) fz_fail(c, "harness", "too many host arrays");
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) fz_fail(c, "harness", "out of host memory");
    c->heap[c->nheap++] = p;
    return p;
}

int64_t *fz_i64s(fz_case *c, int64_t n) {
    return n < 0 || n > FZ_MAX_INTS ? NULL : (int64_t *)fz_alloc(c, (size_t)n * sizeof(int64_t));
}

int32_t *fz_i32s(fz_case *c, int64_t n) {
    return n < 0 || n > FZ_MAX_INTS ? NULL : (int32_t *)fz_alloc(c, (size_t)n * sizeof(int32_t));
}

int64_t fz_make_splits(fz_case *c, int64_t *s, int64_t G, int64_t T) {
    const uint8_t b = fz_u8(c);
    int64_t S;
    switch (b & 3) {
    case 0: S = T; break;
    case 1: S = 0; break;
    default: S = T - (int64_t)(fz_u64(c) % ((uint64_t)T + 1)); break;
    }
    if (!s) return S;
    const int pattern = (b >> 2) & 3;
    for (int64_t g = 0; g < G; g++) s[g] = 0;
    if (pattern == 1) {
        s[fz_rand(c) % (uint64_t)G] = S;
    } else if (pattern == 2) {
        for (int64_t g = 0; g < G; g++) s[g] = S / G + (g < S % G ? 1 : 0);
    } else {
        int64_t left = S;
        const int64_t first = pattern == 3 && G >= 3 ? 1 : 0, last = pattern == 3 && G >= 3 ? G - 2 : G - 1;
        for (int64_t g = first; g < last && left > 0; g++) {
            int64_t v = (int64_t)(fz_rand(c) % ((uint64_t)left + 1));
            if (fz_rand(c) % 4 == 0) v = 0;   /* empty groups */
            s[g] = v;
            left -= v;
        }
        s[last] += left;
    }
    return S;
}

/* ---- tensors ------------------------------------------------------------------------------- */

static bool present(const fz_tensor *T) { return T->t->ndim != 0 || (T->w && T->w->ptrs); }
static bool validated(const fz_tensor *T) { return !(T->flags & FZ_NOFAULT); }
static bool is_out(const fz_tensor *T) { return T->role == FZ_OUT || T->role == FZ_ACC; }
static bool is_float(moex_dtype d) {
    return d == MOEX_DTYPE_F32 || d == MOEX_DTYPE_BF16 || d == MOEX_DTYPE_F16;
}
/* Harness sizing: unknown dtypes count 8 bytes so that a buffer is never too small. */
static size_t esize(moex_dtype d) {
    size_t s = moex_dtype_size(d);
    return s ? s : 8;
}

/* The element count of a descriptor: -1 when a dimension is negative or the ndim is bad,
 * INT64_MAX when the product passes it. */
static int64_t numel_of(const moex_tensor *t) {
    if (t->ndim < 1 || t->ndim > MOEX_MAX_DIMS) return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) return -1;
        if (t->shape[i] == 0) return 0;
    }
    for (int i = 0; i < t->ndim; i++) n = fz_mul_sat(n, t->shape[i]);
    return n;
}

/* Bytes of a tensor's data (false when it cannot be backed by memory here). */
static bool bytes_of(const fz_case *c, const moex_tensor *t, size_t *bytes) {
    int64_t n = numel_of(t);
    if (n < 0 || n == INT64_MAX) return false;
    if ((uint64_t)n > (uint64_t)SIZE_MAX / esize(t->dtype)) return false;
    *bytes = (size_t)n * esize(t->dtype);
    return *bytes <= (c->huge ? (size_t)FZ_HUGE_REAL : FZ_MAX_REAL);
}

int fz_tensor_reg(fz_case *c, const char *name, moex_tensor *t, fz_role role, unsigned flags, unsigned dtypes_ok) {
    if (c->ntens == FZ_MAX_TENSORS) fz_fail(c, "harness", "too many tensors");
    const int ti = c->ntens++;
    fz_tensor *T = &c->tens[ti];
    memset(T, 0, sizeof *T);
    T->name = name;
    T->t = t;
    T->role = role;
    T->flags = flags;
    T->dtypes_ok = dtypes_ok;
    T->tail_row = -1;
    T->tail_col = -1;
    T->buf = T->ptrs_buf = -1;
    T->null_g = T->share_g = -1;
    for (int g = 0; g < FZ_MAX_G; g++) T->mat_buf[g] = -1;
    if (flags & FZ_FORBIDDEN) {   /* registered with the shape it would have: make it absent */
        T->shadow = *t;
        memset(t, 0, sizeof *t);
    }
    T->null_empty = (int)(fz_rand(c) & 1);
    return ti;
}

int fz_weight_reg(fz_case *c, const char *name, moex_weight *w, fz_role role, unsigned flags, unsigned dtypes_ok) {
    const int ti = fz_tensor_reg(c, name, &w->t, role, flags, dtypes_ok);
    fz_tensor *T = &c->tens[ti];
    T->w = w;
    const uint8_t b = fz_u8(c);
    if ((flags & FZ_DISCRETE_OK) && w->t.ndim == 3 && w->t.shape[0] >= 1 && w->t.shape[0] <= FZ_MAX_G && b < 80) {
        T->discrete = 1;
        T->G = w->t.shape[0];
        /* shared matrices: inputs may alias each other */
        if (role == FZ_IN && T->G >= 2 && b < 20) T->share_g = 1 + (int)(b % (T->G - 1));
    }
    return ti;
}

void fz_set_i64(fz_case *c, int ti, int64_t *v, int64_t n) {
    c->tens[ti].i64 = v;
    c->tens[ti].nints = v ? n : 0;
}

void fz_set_i32(fz_case *c, int ti, int32_t *v, int64_t n) {
    c->tens[ti].i32 = v;
    c->tens[ti].nints = v ? n : 0;
}

void fz_tail(fz_case *c, int ti, int64_t S) { c->tens[ti].tail_row = S; }

void fz_tail_cols(fz_case *c, int ti, int64_t S) { c->tens[ti].tail_col = S; }

void fz_role_set(fz_case *c, int ti, fz_role role, unsigned flags_add) {
    c->tens[ti].role = role;
    c->tens[ti].flags |= flags_add;
}

int fz_find(fz_case *c, const char *name) {
    for (int i = 0; i < c->ntens; i++)
        if (strcmp(c->tens[i].name, name) == 0) return i;
    return -1;
}

/* ---- buffers -------------------------------------------------------------------------------- */

static unsigned char *payload(fz_case *c, int b) { return (unsigned char *)c->bufs[b].mem + c->bufs[b].lead; }

static int buf_new(fz_case *c, const char *name, int kind, int owner, size_t bytes, size_t pad) {
    if (c->nbufs == FZ_MAX_BUFS) fz_fail(c, "harness", "too many buffers");
    const int bi = c->nbufs;
    fz_buf *b = &c->bufs[bi];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->kind = kind;
    b->owner = owner;
    b->bytes = bytes;
    b->lead = FZ_GUARD + pad;
    b->total = b->lead + bytes + FZ_GUARD;
    b->mem = fz_mem_alloc(c->cuda, b->total);
    b->snap = (unsigned char *)malloc(b->total);
    b->now = (unsigned char *)malloc(b->total);
    if (!b->mem || !b->snap || !b->now) {
        free(b->snap), free(b->now), fz_mem_free(c->cuda, b->mem);
        fz_fail(c, "harness", "out of memory (%zu bytes)", b->total);
    }
    c->nbufs++;
    memset(b->snap, FZ_GUARD_BYTE, b->total);   /* guards and (until filled) the payload */
    fz_mem_put(c->cuda, b->mem, b->snap, b->total);
    return bi;
}

static void bufs_free(fz_case *c) {
    for (int i = 0; i < c->nbufs; i++) {
        fz_buf *b = &c->bufs[i];
        if (!c->cuda) FZ_UNPOISON(b->mem, b->total);
        fz_mem_free(c->cuda, b->mem);
        free(b->snap);
        free(b->now);
    }
    c->nbufs = 0;
}

/* Writes n host bytes at dst (inside buffer payloads). */
static void put(fz_case *c, void *dst, const void *src, size_t n) {
    if (n) fz_mem_put(c->cuda, dst, src, n);
}

static uint16_t rand_half(fz_case *c, moex_dtype dt) {
    uint64_t r = fz_rand(c);
    const uint16_t sign = (uint16_t)((r >> 40) & 1) << 15;
    if (c->specials && (r & 31) == 0) {
        static const uint16_t bf[6] = {0x7FC0, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001};
        static const uint16_t hf[6] = {0x7E00, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001};
        return (dt == MOEX_DTYPE_BF16 ? bf : hf)[(r >> 8) % 6];
    }
    if (dt == MOEX_DTYPE_BF16)   /* exponent 2^-6 .. 2^1 */
        return (uint16_t)(sign | (uint16_t)((121 + (r >> 16) % 8) << 7) | (uint16_t)((r >> 24) & 0x7F));
    return (uint16_t)(sign | (uint16_t)((9 + (r >> 16) % 8) << 10) | (uint16_t)((r >> 24) & 0x3FF));
}

static float rand_f32(fz_case *c) {
    uint64_t r = fz_rand(c);
    if (c->specials && (r & 31) == 0) {
        static const float sp[7] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 3e38f};
        return sp[(r >> 8) % 7];
    }
    return (float)((double)((r >> 11) & 0xFFFFFF) / 16777216.0 * 4.0 - 2.0);
}

/* Contents of a region: integers as given, float inputs (and += outputs) as values, the rest
 * (outputs, faulted dtypes) as random bytes. */
static void fill_tensor_bytes(fz_case *c, const fz_tensor *T, moex_dtype dt, unsigned char *h, size_t n) {
    if (T->i64 && dt == MOEX_DTYPE_I64) {
        memcpy(h, T->i64, n < (size_t)T->nints * 8 ? n : (size_t)T->nints * 8);
        return;
    }
    if (T->i32 && dt == MOEX_DTYPE_I32) {
        memcpy(h, T->i32, n < (size_t)T->nints * 4 ? n : (size_t)T->nints * 4);
        return;
    }
    const bool values = T->role == FZ_IN || T->role == FZ_ACC || T->role == FZ_KEEP;
    if (values && dt == MOEX_DTYPE_F32) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            float v = rand_f32(c);
            memcpy(h + i, &v, 4);
        }
        return;
    }
    if (values && (dt == MOEX_DTYPE_BF16 || dt == MOEX_DTYPE_F16)) {
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t v = rand_half(c, dt);
            memcpy(h + i, &v, 2);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)fz_rand(c);
}

static void fill_tensor(fz_case *c, const fz_tensor *T, void *dst, size_t n) {
    if (!n) return;
    unsigned char *h = (unsigned char *)malloc(n);
    if (!h) fz_fail(c, "harness", "out of host memory");
    memset(h, 0, n);
    fill_tensor_bytes(c, T, T->t->dtype, h, n);
    put(c, dst, h, n);
    free(h);
}

static void fill_random(fz_case *c, void *dst, size_t n) {
    unsigned char *h = (unsigned char *)malloc(n ? n : 1);
    if (!h) fz_fail(c, "harness", "out of host memory");
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)fz_rand(c);
    put(c, dst, h, n);
    free(h);
}

/* Priority of contents where regions overlap: integers beat float inputs beat outputs. */
static int prio_tensor(const fz_tensor *T) {
    if (T->i64 || T->i32) return 2;
    return T->role == FZ_IN || T->role == FZ_KEEP ? 1 : 0;
}

/* ---- placing tensors in memory --------------------------------------------------------------- */

static void place_discrete(fz_case *c, int ti) {
    fz_tensor *T = &c->tens[ti];
    if (T->ptrs_buf < 0) {
        const moex_tensor *t = T->t;
        size_t mb = 0;
        int64_t rc = fz_mul_sat(t->shape[1], t->shape[2]);
        bool real = rc >= 0 && rc < INT64_MAX && (uint64_t)rc <= (uint64_t)FZ_MAX_REAL / esize(t->dtype);
        if (real) mb = (size_t)rc * esize(t->dtype);
        if (mb > (c->huge ? (size_t)FZ_HUGE_REAL : FZ_MAX_REAL)) real = false;
        T->mat_bytes = real ? mb : 0;
        for (int64_t g = 0; g < T->G; g++) {
            char name[40];
            snprintf(name, sizeof name, "%s.ptrs[%d]", T->name, (int)g);
            T->mat_buf[g] = buf_new(c, name, real ? FZ_B_MATRIX : FZ_B_DUMMY, ti, T->mat_bytes, 0);
            T->mat_ptr[g] = payload(c, T->mat_buf[g]);
            fill_tensor(c, T, T->mat_ptr[g], T->mat_bytes);
            c->bufs[T->mat_buf[g]].written = 1;
        }
        char name[40];
        snprintf(name, sizeof name, "%s.ptrs", T->name);
        T->ptrs_buf = buf_new(c, name, FZ_B_PTRS, ti, (size_t)T->G * sizeof(void *), 0);
    }
    void *p[FZ_MAX_G];
    for (int64_t g = 0; g < T->G; g++) p[g] = T->mat_ptr[g];
    if (T->share_g >= 0) p[T->share_g] = p[0];
    if (T->null_g >= 0) p[T->null_g] = NULL;
    put(c, payload(c, T->ptrs_buf), p, (size_t)T->G * sizeof(void *));
    T->w->ptrs = (void *const *)payload(c, T->ptrs_buf);
    T->t->data = T->both_forms ? T->mat_ptr[0] : NULL;
}

/* Gives tensor ti its data as it is described now (keeps a buffer that still fits). */
static void place_tensor(fz_case *c, int ti) {
    fz_tensor *T = &c->tens[ti];
    if (T->fixed || !present(T)) return;
    if (T->discrete) {
        place_discrete(c, ti);
        return;
    }
    if (T->w) T->w->ptrs = NULL;
    size_t bytes = 0;
    const bool real = bytes_of(c, T->t, &bytes);
    if (real && bytes == 0 && T->null_empty) {   /* an empty tensor may have NULL data */
        T->buf = -1;
        T->t->data = NULL;
        return;
    }
    const size_t want = real ? bytes : 0;
    if (T->buf >= 0 && c->bufs[T->buf].bytes == want && T->at == 0 && !c->bufs[T->buf].shared &&
        c->bufs[T->buf].kind == (real ? FZ_B_DATA : FZ_B_DUMMY)) {
        T->t->data = payload(c, T->buf);
        if (T->refill) fill_tensor(c, T, T->t->data, want);
        T->refill = 0;
        return;
    }
    T->refill = 0;
    if (T->buf >= 0) c->bufs[T->buf].kind = FZ_B_OLD;
    T->buf = buf_new(c, T->name, real ? FZ_B_DATA : FZ_B_DUMMY, ti, want, 0);
    T->at = 0;
    T->t->data = payload(c, T->buf);
    fill_tensor(c, T, T->t->data, want);
    c->bufs[T->buf].written = 1;
}

/* Start and length of an overlap target (false: it has no bytes). */
static bool target_range(fz_case *c, uintptr_t *lo, size_t *len) {
    const fz_alias *al = &c->alias;
    switch (al->tkind) {
    case FZ_REG_DATA: {
        const fz_tensor *T = &c->tens[al->target];
        if (!T->t->data || !bytes_of(c, T->t, len)) return false;
        *lo = (uintptr_t)T->t->data;
        break;
    }
    case FZ_REG_MATRIX: {
        const fz_tensor *T = &c->tens[al->target];
        *lo = (uintptr_t)T->mat_ptr[al->target_g];
        *len = T->mat_bytes;
        break;
    }
    case FZ_REG_PTRS: {
        const fz_tensor *T = &c->tens[al->target];
        *lo = (uintptr_t)payload(c, T->ptrs_buf);
        *len = (size_t)T->G * sizeof(void *);
        break;
    }
    case FZ_REG_WS:
        if (!c->ws || c->ws_need <= 256) return false;
        *lo = ((uintptr_t)c->ws + 255) / 256 * 256;   /* the bytes the backend uses */
        *len = c->ws_need - 256;
        break;
    default:
        if (!c->saved || c->saved_need <= 256) return false;
        *lo = ((uintptr_t)c->saved + 255) / 256 * 256;
        *len = c->saved_need - 256;
        break;
    }
    return *len > 0;
}

/* The buffer holding the target (for the clipped fill of the mover), or -1. */
static int target_buf(fz_case *c) {
    const fz_alias *al = &c->alias;
    switch (al->tkind) {
    case FZ_REG_DATA: return c->tens[al->target].buf;
    case FZ_REG_MATRIX: return c->tens[al->target].mat_buf[al->target_g];
    case FZ_REG_PTRS: return c->tens[al->target].ptrs_buf;
    case FZ_REG_WS: return c->ws_buf;
    default: return c->saved_buf;
    }
}

/* Places the mover of the overlap (G8, or the legal input overlap) over its target. */
static void place_alias(fz_case *c) {
    fz_alias *al = &c->alias;
    fz_tensor *M = &c->tens[al->mover];
    uintptr_t tlo;
    size_t tlen, mlen = 0;
    if (!target_range(c, &tlo, &tlen)) fz_fail(c, "harness", "overlap target without bytes");
    if (al->mover_g >= 0)
        mlen = M->mat_bytes;
    else if (!bytes_of(c, M->t, &mlen))
        fz_fail(c, "harness", "overlap mover without bytes");
    if (mlen == 0) fz_fail(c, "harness", "overlap mover without bytes");
    /* offset (a multiple of 8, so the mover stays aligned) in [-(mlen-1), tlen-1]; inside
     * the target for a legal overlap (the call reads all of the mover) */
    int64_t kmin = -(int64_t)((mlen - 1) / 8), kmax = (int64_t)((tlen - 1) / 8);
    if (al->legal) kmin = 0, kmax = (int64_t)((tlen - mlen) / 8);
    const int64_t off = 8 * (kmin + (int64_t)(al->sel % (uint64_t)(kmax - kmin + 1)));
    const uintptr_t at = tlo + (uintptr_t)off;
    if (fz_g.verbose)
        fprintf(stderr, "  overlap placed: %s%s [%#lx, %#lx) over target [%#lx, %#lx)\n", M->name,
                al->mover_g >= 0 ? " (a matrix)" : "", (unsigned long)at, (unsigned long)(at + mlen),
                (unsigned long)tlo, (unsigned long)(tlo + tlen));
    if (al->mover_g >= 0) {
        if (M->share_g == al->mover_g) M->share_g = -1;   /* the moved matrix keeps its place */
        M->mat_ptr[al->mover_g] = (void *)at;
        M->mat_buf[al->mover_g] = -1;
        place_discrete(c, al->mover);   /* rewrites the pointer array */
    } else {
        M->t->data = (void *)at;
        M->buf = -1;
        M->fixed = 1;
    }
    if (al->tkind == FZ_REG_DATA) c->tens[al->target].fixed = 1;   /* stays where it is */
    /* the mover's contents where they win (outputs under integers keep the integers) */
    const int tb = target_buf(c);
    const int tprio = al->tkind == FZ_REG_PTRS ? 2 : al->tkind == FZ_REG_WS ? 0
                      : al->tkind == FZ_REG_SAVED ? (c->saved_out ? 0 : 2) : prio_tensor(&c->tens[al->target]);
    if (tb >= 0) {
        c->bufs[tb].shared = 1;
        if (prio_tensor(M) > tprio) {
            const uintptr_t blo = (uintptr_t)payload(c, tb), bhi = blo + c->bufs[tb].bytes;
            const uintptr_t lo = at > blo ? at : blo, hi = at + mlen < bhi ? at + mlen : bhi;
            if (lo < hi) fill_tensor(c, M, (void *)lo, (size_t)(hi - lo));
        }
    }
}

/* Huge mode: a tensor past 2^60 elements must be refused (moex.h, "Sizes never wrap"). */
static void flag_big_tensors(fz_case *c) {
    for (int i = 0; i < c->ntens; i++) {
        fz_tensor *T = &c->tens[i];
        if (T->big_flagged || !present(T) || !validated(T)) continue;
        int64_t n = numel_of(T->t);
        if (n > FZ_MAX_ELEMS) {
            T->big_flagged = 1;
            fz_fault(c, FZ_STRUCT, "%s [%lld, %lld, %lld, %lld] (ndim %d) has more than 2^60 elements", T->name,
                     (long long)T->t->shape[0], (long long)T->t->shape[1], (long long)T->t->shape[2],
                     (long long)T->t->shape[3], (int)T->t->ndim);
        }
    }
}

void fz_materialize(fz_case *c) {
    flag_big_tensors(c);
    for (int i = 0; i < c->ntens; i++) place_tensor(c, i);
    fz_alias *al = &c->alias;
    if (al->active == 1 && (al->tkind == FZ_REG_DATA || al->tkind == FZ_REG_MATRIX || al->tkind == FZ_REG_PTRS ||
                            (al->tkind == FZ_REG_SAVED && c->saved))) {
        place_alias(c);
        al->active = 2;   /* placed */
    }
}

/* ---- faults ------------------------------------------------------------------------------------ */

void fz_fault(fz_case *c, fz_fclass cls, const char *fmt, ...) {
    if (c->nfaults == FZ_MAX_FAULTS) fz_fail(c, "harness", "more than %d faults in a case", FZ_MAX_FAULTS);
    fz_fault_rec *f = &c->faults[c->nfaults++];
    f->cls = cls;
    f->ti = c->fault_ti;
    f->dim = c->fault_dim;
    f->blind = 0;
    c->fault_ti = c->fault_dim = -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->what, sizeof f->what, fmt, ap);
    va_end(ap);
    if (cls == FZ_SPLITS || cls == FZ_IDS || cls == FZ_OFFSFIT) c->split_faults = 1;
    fz_g.stats.faults++;
    uint32_t h = 2166136261u;   /* the fault's tag (its text up to ':') for the generator */
    for (const char *s = f->what; *s && *s != ':' && *s != ' '; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    fz_last_features.fault_tags |= 1ull << (h % 64);
    fz_last_features.faulted_ops |= 1u << c->op;
}

bool fz_has_class(const fz_case *c, fz_fclass cls) {
    for (int i = 0; i < c->nfaults; i++)
        if (c->faults[i].cls == cls) return true;
    return false;
}

bool fz_must_fail(const fz_case *c) { return fz_has_class(c, FZ_STRUCT) || fz_has_class(c, FZ_RUNONLY); }

/* Candidates: tensors the call validates, present (or not), untouched. */
static int candidates(fz_case *c, int *out, bool want_present, unsigned need_flag) {
    int n = 0;
    for (int i = 0; i < c->ntens; i++) {
        const fz_tensor *T = &c->tens[i];
        if (!validated(T) || T->touched || present(T) != want_present) continue;
        if (need_flag && !(T->flags & need_flag)) continue;
        out[n++] = i;
    }
    return n;
}

static const char *shape_str(const moex_tensor *t, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && i < MOEX_MAX_DIMS && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}

static bool g_ndim(fz_case *c, unsigned sel, uint64_t p) {
    int cand[FZ_MAX_TENSORS], n = candidates(c, cand, true, 0);
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    static const int32_t vals[8] = {1, 2, 3, 4, -1, 5, 100, INT32_MIN};
    int32_t v = vals[(T->flags & FZ_ANY_NDIM) ? 4 + p % 4 : p % 8];   /* any ndim: only invalid ones */
    if (v == T->t->ndim) v = T->t->ndim == 1 ? 2 : 1;
    const int32_t old = T->t->ndim;
    T->t->ndim = v;
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G0 ndim: %s.ndim %d -> %d", T->name, (int)old, (int)v);
    return true;
}

static bool g_negative(fz_case *c, unsigned sel, uint64_t p) {
    int cand[FZ_MAX_TENSORS], n = candidates(c, cand, true, 0);
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    if (T->t->ndim < 1 || T->t->ndim > MOEX_MAX_DIMS) return false;
    c->fault_ti = ti_;
    const int d = (int)(p % (uint64_t)T->t->ndim);
    static const int64_t vals[4] = {-1, -((int64_t)1 << 40), INT64_MIN, -2};
    T->t->shape[d] = vals[(p >> 8) % 4];
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G1 negative: %s.shape[%d] = %lld", T->name, d, (long long)T->t->shape[d]);
    return true;
}

static bool g_mismatch(fz_case *c, unsigned sel, uint64_t p) {
    if (c->used_mismatch) return false;
    int cand[FZ_MAX_TENSORS], n = 0, all[FZ_MAX_TENSORS], na = candidates(c, all, true, 0);
    for (int i = 0; i < na; i++) {
        const fz_tensor *T = &c->tens[all[i]];
        if (T->t->ndim < 1 || T->t->ndim > MOEX_MAX_DIMS) continue;
        for (int d = 0; d < T->t->ndim && d < 3; d++)
            if (!(T->flags & (FZ_FREE0 << d))) {
                cand[n++] = all[i];
                break;
            }
    }
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    int dims[4], nd = 0;
    for (int d = 0; d < T->t->ndim; d++)
        if (d >= 3 || !(T->flags & (FZ_FREE0 << d))) dims[nd++] = d;
    const int d = dims[p % (uint64_t)nd];
    static const int64_t deltas[6] = {1, 2, -1, 64, 3, -2};
    const int64_t old = T->t->shape[d];
    int64_t delta = deltas[(p >> 8) % 6];
    if (old > INT64_MAX - 64 || old + delta < 0) delta = old > 0 ? -1 : 1;
    T->t->shape[d] = old + delta;
    T->touched = 1;
    c->used_mismatch = 1;
    c->fault_dim = d;
    fz_fault(c, FZ_STRUCT, "G2 mismatch: %s.shape[%d] %lld -> %lld", T->name, d, (long long)old,
             (long long)T->t->shape[d]);
    return true;
}

static bool g_dtype(fz_case *c, unsigned sel, uint64_t p) {
    if (c->used_dtype) return false;
    int cand[FZ_MAX_TENSORS], n = candidates(c, cand, true, 0);
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    int32_t vals[16];
    int nv = 0;
    for (int d = 0; d <= MOEX_DTYPE_E8M0; d++)
        if (!(T->dtypes_ok & (1u << d))) vals[nv++] = d;
    vals[nv++] = MOEX_DTYPE_E8M0 + 1, vals[nv++] = 99, vals[nv++] = -1, vals[nv++] = INT32_MIN;
    const moex_dtype old = T->t->dtype;
    T->t->dtype = (moex_dtype)vals[p % (uint64_t)nv];
    T->touched = 1;
    c->used_dtype = 1;
    fz_fault(c, FZ_STRUCT, "G3 dtype: %s.dtype %d -> %d", T->name, (int)old, (int)T->t->dtype);
    return true;
}

static bool g_null(fz_case *c, unsigned sel, uint64_t p) {
    (void)p;
    int cand[FZ_MAX_TENSORS], n = 0, all[FZ_MAX_TENSORS], na = candidates(c, all, true, 0);
    for (int i = 0; i < na; i++)
        if (numel_of(c->tens[all[i]].t) > 0) cand[n++] = all[i];
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    T->discrete = 0;
    if (T->w) T->w->ptrs = NULL;
    T->t->data = NULL;
    T->buf = -1;
    T->fixed = 1;
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G4 NULL data: %s.data = NULL with %lld elements", T->name, (long long)numel_of(T->t));
    return true;
}

static bool g_overflow(fz_case *c, unsigned sel, uint64_t p) {
    int cand[FZ_MAX_TENSORS], n = 0, all[FZ_MAX_TENSORS], na = candidates(c, all, true, 0);
    for (int i = 0; i < na; i++) {
        const moex_tensor *t = c->tens[all[i]].t;
        if (t->ndim >= 1 && t->ndim <= MOEX_MAX_DIMS) cand[n++] = all[i];
    }
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    moex_tensor *t = T->t;
    char before[96];
    shape_str(t, before, sizeof before);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] <= 0) t->shape[d] = 1;
    const int d = (int)(p % (uint64_t)t->ndim);
    switch ((p >> 8) % 3) {
    case 0:   /* every dimension 2^32 (a 1-D tensor: 2^61) */
        for (int i = 0; i < t->ndim; i++) t->shape[i] = t->ndim == 1 ? (int64_t)1 << 61 : (int64_t)1 << 32;
        break;
    case 1: t->shape[d] = INT64_MAX; break;
    default: {   /* just past 2^60 elements */
        int64_t other = 1;
        for (int i = 0; i < t->ndim; i++)
            if (i != d) other = fz_mul_sat(other, t->shape[i]);
        t->shape[d] = other > FZ_MAX_ELEMS ? 1 : FZ_MAX_ELEMS / other + 1 + (int64_t)((p >> 16) % 3);
        break;
    }
    }
    T->touched = 1;
    T->big_flagged = 1;
    char after[96];
    fz_fault(c, FZ_STRUCT, "G5 overflow: %s %s -> %s", T->name, before, shape_str(t, after, sizeof after));
    return true;
}

static bool g_absent(fz_case *c, unsigned sel, uint64_t p) {
    (void)p;
    int cand[FZ_MAX_TENSORS], n = candidates(c, cand, true, FZ_REQUIRED);
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    T->t->ndim = 0;
    T->t->data = NULL;
    if (T->w) T->w->ptrs = NULL;
    T->discrete = 0;
    T->buf = -1;
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G6 absent: required %s absent (ndim 0)", T->name);
    return true;
}

static bool g_present(fz_case *c, unsigned sel, uint64_t p) {
    (void)p;
    int cand[FZ_MAX_TENSORS], n = candidates(c, cand, false, FZ_FORBIDDEN);
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    *T->t = T->shadow;
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G7 present: %s given though the options forbid it", T->name);
    return true;
}

/* G8: an overlap between two regions, one of them written by the call. */
typedef struct region_ref {
    int kind, ti, g, out;
} region_ref;

static int overlap_regions(fz_case *c, region_ref *r, int max) {
    int n = 0;
    for (int i = 0; i < c->ntens && n < max - 2; i++) {
        const fz_tensor *T = &c->tens[i];
        if (!validated(T) || T->touched || !present(T) || T->fixed) continue;
        if (T->discrete) {
            if (!c->cuda && T->mat_bytes > 0 && T->mat_bytes <= FZ_MAX_REAL)
                for (int64_t g = 0; g < T->G && n < max - 2; g++)
                    r[n++] = (region_ref){.kind = FZ_REG_MATRIX, .ti = i, .g = (int)g, .out = is_out(T)};
            if (n < max - 2) r[n++] = (region_ref){.kind = FZ_REG_PTRS, .ti = i, .g = -1};
        } else {
            size_t b = 0;
            if (bytes_of(c, T->t, &b) && b > 0)
                r[n++] = (region_ref){.kind = FZ_REG_DATA, .ti = i, .g = -1, .out = is_out(T)};
        }
    }
    if (!c->huge && c->ws_need > 256 && c->ws_fault == 0)
        r[n++] = (region_ref){.kind = FZ_REG_WS, .ti = -1, .g = -1, .out = 1};
    if (c->has_saved && c->saved_need > 256 && c->saved_fault == 0)
        r[n++] = (region_ref){.kind = FZ_REG_SAVED, .ti = -1, .g = -1, .out = c->saved_out};
    return n;
}

static bool movable(const region_ref *r) { return r->kind == FZ_REG_DATA || r->kind == FZ_REG_MATRIX; }

static bool g_overlap(fz_case *c, unsigned sel, uint64_t p) {
    if (c->alias.active || c->huge) return false;
    region_ref r[FZ_MAX_TENSORS * 2 + FZ_MAX_G];
    const int n = overlap_regions(c, r, (int)(sizeof r / sizeof r[0]));
    if (n < 2) return false;
    for (int attempt = 0; attempt < 8; attempt++) {
        const region_ref *a = &r[(sel + (unsigned)attempt * 7u) % (unsigned)n];
        const region_ref *b = &r[(p + (uint64_t)attempt * 13u) % (uint64_t)n];
        if (a == b || !(a->out || b->out)) continue;
        if (!movable(a)) {
            const region_ref *t = a;
            a = b, b = t;
        }
        if (!movable(a)) continue;
        /* two regions of one tensor: only two matrices of an output weight */
        if (a->ti == b->ti && !(a->kind == FZ_REG_MATRIX && b->kind == FZ_REG_MATRIX)) continue;
        c->alias = (fz_alias){.active = 1, .mover = a->ti, .mover_g = a->kind == FZ_REG_MATRIX ? a->g : -1,
                              .tkind = b->kind, .target = b->ti, .target_g = b->g, .sel = p >> 16};
        c->tens[a->ti].touched = 1;
        c->tens[a->ti].share_g = -1;   /* every matrix where its buffer is */
        if (b->ti >= 0) c->tens[b->ti].touched = 1, c->tens[b->ti].share_g = -1;
        char an[48], bn[48];
        if (a->kind == FZ_REG_MATRIX) snprintf(an, sizeof an, "%s.ptrs[%d]", c->tens[a->ti].name, a->g);
        else snprintf(an, sizeof an, "%s", c->tens[a->ti].name);
        switch (b->kind) {
        case FZ_REG_WS: snprintf(bn, sizeof bn, "the workspace"); break;
        case FZ_REG_SAVED: snprintf(bn, sizeof bn, "saved"); break;
        case FZ_REG_PTRS: snprintf(bn, sizeof bn, "%s.ptrs (the array)", c->tens[b->ti].name); break;
        case FZ_REG_MATRIX: snprintf(bn, sizeof bn, "%s.ptrs[%d]", c->tens[b->ti].name, b->g); break;
        default: snprintf(bn, sizeof bn, "%s", c->tens[b->ti].name);
        }
        fz_fault(c, FZ_RUNONLY, "G8 overlap: %s (%s) overlaps %s (%s)", an, a->out ? "output" : "input", bn,
                 b->out ? "output" : "input");
        return true;
    }
    return false;
}

static bool g_null_matrix(fz_case *c, unsigned sel, uint64_t p) {
    if (c->cuda) return false;   /* CUDA cannot read the pointer array */
    int cand[FZ_MAX_TENSORS], n = 0, all[FZ_MAX_TENSORS], na = candidates(c, all, true, 0);
    for (int i = 0; i < na; i++)
        if (c->tens[all[i]].discrete && c->tens[all[i]].mat_bytes > 0) cand[n++] = all[i];
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    T->null_g = (int)(p % (uint64_t)T->G);
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G9 NULL matrix: %s.ptrs[%d] = NULL (cpu)", T->name, T->null_g);
    return true;
}

static bool g_both_forms(fz_case *c, unsigned sel, uint64_t p) {
    (void)p;
    int cand[FZ_MAX_TENSORS], n = 0, all[FZ_MAX_TENSORS], na = candidates(c, all, true, 0);
    for (int i = 0; i < na; i++)
        if (c->tens[all[i]].discrete) cand[n++] = all[i];
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    T->both_forms = 1;
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G10 both forms: %s has t.data and ptrs", T->name);
    return true;
}

static bool g_workspace(fz_case *c, int kind, uint64_t p) {
    if (c->ws_need == 0 || c->ws_fault || c->huge || (c->alias.active && c->alias.tkind == FZ_REG_WS)) return false;
    c->ws_fault = kind;
    c->ws_param = p;
    fz_fault(c, FZ_RUNONLY, kind == 1 ? "G11 workspace NULL (the query asks for %zu bytes)"
                                      : "G12 workspace short (the query asks for %zu bytes)", c->ws_need);
    return true;
}

static bool g_wrap(fz_case *c, unsigned sel, uint64_t p) {
    (void)p;
    int cand[FZ_MAX_TENSORS], n = 0, all[FZ_MAX_TENSORS], na = candidates(c, all, true, 0);
    for (int i = 0; i < na; i++) {
        size_t b;
        if (!c->tens[all[i]].discrete && bytes_of(c, c->tens[all[i]].t, &b) && b >= 32) cand[n++] = all[i];
    }
    if (!n) return false;
    const int ti_ = cand[sel % n];
    fz_tensor *T = &c->tens[ti_];
    c->fault_ti = ti_;
    size_t b = 0;
    bytes_of(c, T->t, &b);
    T->t->data = (void *)((UINTPTR_MAX - b / 2) & ~(uintptr_t)15);
    T->buf = -1;
    T->fixed = 1;
    T->touched = 1;
    fz_fault(c, FZ_STRUCT, "G13 wrap: %s.data = %p with %zu bytes wraps the address space", T->name, T->t->data, b);
    return true;
}

static bool generic_fault(fz_case *c, unsigned kind, unsigned sel, uint64_t p) {
    switch (kind % 14) {
    case 0: return g_ndim(c, sel, p);
    case 1: return g_negative(c, sel, p);
    case 2: return g_mismatch(c, sel, p);
    case 3: return g_dtype(c, sel, p);
    case 4: return g_null(c, sel, p);
    case 5: return g_overflow(c, sel, p);
    case 6: return g_absent(c, sel, p);
    case 7: return g_present(c, sel, p);
    case 8: return g_overlap(c, sel, p);
    case 9: return g_null_matrix(c, sel, p);
    case 10: return g_both_forms(c, sel, p);
    case 11: return g_workspace(c, 1, p);
    case 12: return g_workspace(c, 2, p);
    default: return g_wrap(c, sel, p);
    }
}

void fz_faults(fz_case *c, fz_fault_fn fn, void *args) {
    const uint8_t b = fz_u8(c);
    const int count = b < 112 ? 0 : b < 200 ? 1 : b < 240 ? 2 : 3;
    for (int i = 0; i < count; i++) {
        const uint8_t kind = fz_u8(c), sel = fz_u8(c);
        const uint64_t p = fz_u32(c) | ((uint64_t)fz_u8(c) << 32);
        c->fault_ti = c->fault_dim = -1;
        if (kind & 1 && fn)
            fn(c, args, (unsigned)(kind >> 1) + 256u * sel, p);
        else
            generic_fault(c, (unsigned)(kind >> 1), sel, p);
    }
    fz_materialize(c);
}

bool fz_fault_split_values(fz_case *c, int ts, int64_t T, uint64_t p) {
    fz_tensor *S = &c->tens[ts];
    if (!S->i64 || S->nints < 1 || !present(S) || S->touched) return false;
    int64_t *s = S->i64, sum = 0;
    const int64_t g = (int64_t)(p % (uint64_t)S->nints);
    for (int64_t i = 0; i < S->nints; i++) sum = s[i] > INT64_MAX - sum ? INT64_MAX : sum + s[i];
    int v = (int)((p >> 8) % 5);
    if (v == 2 && (T > INT64_MAX - 8 || sum > T)) v = 3;
    if (v == 4 && T == INT64_MAX) v = 1;
    const int64_t old = s[g];
    switch (v) {
    case 0: s[g] = -1 - (int64_t)((p >> 16) % 3); break;
    case 1: s[g] = INT64_MIN; break;
    case 2: s[g] += T - sum + 1 + (int64_t)((p >> 16) % 3); break;
    case 3: s[g] = INT64_MAX; break;
    default: s[g] = T + 1; break;
    }
    S->touched = 1;
    S->refill = 1;
    fz_fault(c, FZ_SPLITS, "split values: %s[%lld] %lld -> %lld (T = %lld, %s)", S->name, (long long)g,
             (long long)old, (long long)s[g], (long long)T, v < 2 ? "negative" : "sum past T");
    return true;
}

bool fz_fault_ids(fz_case *c, int ti, int64_t bound, const char *what, uint64_t p) {
    fz_tensor *I = &c->tens[ti];
    if (!I->i32 || I->nints < 1 || !present(I) || I->touched) return false;
    const int64_t i = (int64_t)(p % (uint64_t)I->nints);
    int64_t v;
    switch ((p >> 16) % 6) {
    case 0: v = bound; break;
    case 1: v = bound > INT32_MAX ? INT64_MAX : bound + 1 + (int64_t)((p >> 24) % 5); break;
    case 2: v = -1; break;
    case 3: v = -1 - (int64_t)((p >> 24) % 100); break;
    case 4: v = INT32_MIN; break;
    default: v = INT32_MAX; break;
    }
    if (v > INT32_MAX || (v >= 0 && v < bound)) v = -1;
    const int32_t old = I->i32[i];
    I->i32[i] = (int32_t)v;
    I->touched = 1;
    I->refill = 1;
    fz_fault(c, FZ_IDS, "%s: %s[%lld] %d -> %d, outside [0, %lld)", what, I->name, (long long)i, (int)old, (int)v,
             (long long)bound);
    return true;
}

/* ---- workspace and saved -------------------------------------------------------------------------- */

/* A caller buffer of `need` bytes (or as its fault says) at a random misalignment. */
static int caller_buffer(fz_case *c, const char *name, int kind, size_t need, int fault, uint64_t param,
                         void **ptr, size_t *bytes, size_t *at) {
    *ptr = NULL;
    *bytes = need;
    *at = 0;
    if (c->huge && (need == 0 || need > FZ_MAX_REAL)) need = *bytes = 4096;   /* runs that must fail */
    if (fault == 1) {   /* NULL */
        if (param & 1) *bytes = need + (size_t)(param >> 8) % 4096;
        return -1;
    }
    size_t give = need;
    if (fault == 2)
        give = need - 1 - (size_t)(param >> 8) % need;
    else if (need == 0 && (fz_rand(c) & 1))
        return -1;   /* NULL with 0 bytes */
    else if (fz_rand(c) % 4 == 0)
        give = need + (size_t)(fz_rand(c) % 300);
    const size_t pad = (size_t)(fz_rand(c) % 256);
    const int b = buf_new(c, name, kind, -1, give, pad);
    fill_random(c, payload(c, b), give);
    c->bufs[b].written = 1;
    *ptr = payload(c, b);
    *bytes = give;
    return b;
}

void fz_workspace(fz_case *c) {
    if (c->ws_buf >= 0) c->bufs[c->ws_buf].kind = FZ_B_OLD;
    c->ws_buf = caller_buffer(c, "workspace", FZ_B_WS, c->ws_need, c->ws_fault, c->ws_param, &c->ws, &c->ws_bytes,
                              &c->ws_at);
    if (c->alias.active == 1 && c->alias.tkind == FZ_REG_WS) {
        place_alias(c);
        c->alias.active = 2;
    }
}

void fz_saved(fz_case *c, void **saved, size_t *bytes) {
    c->saved_buf = caller_buffer(c, "saved", FZ_B_SAVED, c->saved_need, c->saved_fault, c->saved_param, &c->saved,
                                 &c->saved_bytes, &c->saved_at);
    *saved = c->saved;
    *bytes = c->saved_bytes;
    if (c->alias.active == 1 && c->alias.tkind == FZ_REG_SAVED) {
        place_alias(c);
        c->alias.active = 2;
    }
}

/* ---- the judge ------------------------------------------------------------------------------------ */

typedef struct fz_region {
    int buf;
    size_t at, len, wlen;   /* bytes [at, at + wlen) may be written by a successful call */
    size_t row_bytes;
    int ti, g;              /* tensor (-1: workspace / saved), matrix (-1: none)          */
    int ws;                 /* the current workspace: written even by a failed call      */
    int tail;               /* [at + wlen, at + len) is the tail of an output           */
    int ctail;              /* columns >= tail_col of each row are a tail (2-D outputs)  */
} fz_region;

#define FZ_MAX_REGIONS (FZ_MAX_TENSORS + 4 * FZ_MAX_G)

static int build_regions(fz_case *c, fz_region *r, bool run) {
    int n = 0;
    for (int i = 0; i < c->ntens && n < FZ_MAX_REGIONS - 2; i++) {
        const fz_tensor *T = &c->tens[i];
        if (!present(T)) continue;
        const bool w = run && is_out(T);
        if (T->discrete) {
            for (int64_t g = 0; g < T->G && n < FZ_MAX_REGIONS - 2; g++)
                if (T->mat_buf[g] >= 0)
                    r[n++] = (fz_region){.buf = T->mat_buf[g], .len = T->mat_bytes, .wlen = w ? T->mat_bytes : 0,
                                         .ti = i, .g = (int)g};
            if (T->ptrs_buf >= 0) r[n++] = (fz_region){.buf = T->ptrs_buf, .len = (size_t)T->G * sizeof(void *),
                                                       .ti = i, .g = -1};
            continue;
        }
        size_t len = 0;
        if (T->buf < 0 || c->bufs[T->buf].kind != FZ_B_DATA || !bytes_of(c, T->t, &len)) continue;
        fz_region x = {.buf = T->buf, .at = T->at, .len = len, .wlen = w ? len : 0, .ti = i, .g = -1};
        if (T->t->ndim >= 1 && T->t->shape[0] > 0) x.row_bytes = len / (size_t)T->t->shape[0];
        if (w && T->tail_row >= 0 && !c->split_faults && T->tail_row < T->t->shape[0]) {
            x.wlen = (size_t)T->tail_row * x.row_bytes;
            x.tail = 1;
        }
        if (w && T->tail_col >= 0 && !c->split_faults && T->t->ndim == 2 && T->tail_col < T->t->shape[1] &&
            x.row_bytes)
            x.ctail = 1;
        r[n++] = x;
    }
    if (c->ws_buf >= 0 && c->bufs[c->ws_buf].kind == FZ_B_WS)
        r[n++] = (fz_region){.buf = c->ws_buf, .len = c->bufs[c->ws_buf].bytes,
                             .wlen = run ? c->bufs[c->ws_buf].bytes : 0, .ti = -1, .g = -1, .ws = 1};
    if (c->has_saved && c->saved_buf >= 0)
        r[n++] = (fz_region){.buf = c->saved_buf, .len = c->bufs[c->saved_buf].bytes,
                             .wlen = run && c->saved_out ? c->bufs[c->saved_buf].bytes : 0, .ti = -1, .g = -1};
    return n;
}

static void region_name(fz_case *c, const fz_region *x, char *buf, size_t n) {
    if (x->ti < 0)
        snprintf(buf, n, "%s", x->ws ? "the workspace" : "saved");
    else if (x->g >= 0)
        snprintf(buf, n, "%s %s.ptrs[%d]", is_out(&c->tens[x->ti]) ? "output" : "input", c->tens[x->ti].name, x->g);
    else
        snprintf(buf, n, "%s %s%s", c->tens[x->ti].role == FZ_KEEP ? "ignored" : is_out(&c->tens[x->ti]) ? "output"
                                                                                                       : "input",
                 c->tens[x->ti].name, c->tens[x->ti].discrete ? ".ptrs (the array)" : "");
}

/* Compares every buffer with its snapshot: on success only output rows below the tail, the
 * workspace and a forward's `saved` may change; on failure only the workspace. */
static void compare(fz_case *c, moex_status st) {
    const bool run = c->call_kind == FZ_K_RUN;
    fz_region r[FZ_MAX_REGIONS];
    const int nr = build_regions(c, r, run);
    for (int bi = 0; bi < c->nbufs; bi++) {
        fz_buf *b = &c->bufs[bi];
        if (memcmp(b->snap, b->now, b->total) == 0) continue;
        for (size_t i = 0; i < b->total; i++) {
            if (b->snap[i] == b->now[i]) continue;
            const int64_t o = (int64_t)i - (int64_t)b->lead;
            const fz_region *in = NULL, *ctail = NULL;
            bool ok = false;
            for (int k = 0; k < nr; k++) {
                if (r[k].buf != bi || o < (int64_t)r[k].at || o >= (int64_t)(r[k].at + r[k].len)) continue;
                in = &r[k];
                if (o < (int64_t)(r[k].at + r[k].wlen) && (st == MOEX_OK || r[k].ws)) {
                    if (r[k].ctail && (int64_t)((size_t)(o - (int64_t)r[k].at) % r[k].row_bytes /
                                                esize(c->tens[r[k].ti].t->dtype)) >= c->tens[r[k].ti].tail_col)
                        ctail = &r[k];
                    else
                        ok = true;
                }
            }
            if (ok) continue;
            char what[96];
            if (ctail) {
                region_name(c, ctail, what, sizeof what);
                const fz_tensor *T = &c->tens[ctail->ti];
                const size_t rel = (size_t)(o - (int64_t)ctail->at);
                fz_fail(c, "tail", "an OK call wrote row %zu column %zu of %s, past its %lld columns (byte %zu)",
                        rel / ctail->row_bytes, rel % ctail->row_bytes / esize(T->t->dtype), what,
                        (long long)T->tail_col, rel);
            }
            if (!in) {
                fz_fail(c, run ? "guard" : "query", "changed byte %lld of buffer \"%s\" (%zu bytes), outside every "
                        "tensor it holds: a write out of bounds (%s)", (long long)o, b->name, b->bytes,
                        moex_status_string(st));
            }
            region_name(c, in, what, sizeof what);
            const long long rel = (long long)(o - (int64_t)in->at);
            const long long row = in->row_bytes ? rel / (long long)in->row_bytes : -1;
            if (!run)
                fz_fail(c, "query", "a size query changed %s (byte %lld)", what, rel);
            if (st != MOEX_OK)
                fz_fail(c, "no write on failure", "the call failed (%s) but changed %s (byte %lld, row %lld)",
                        moex_status_string(st), what, rel, row);
            if (in->tail)
                fz_fail(c, "tail", "an OK call wrote row %lld of %s, past sum(splits) = %lld (byte %lld)", row, what,
                        (long long)c->tens[in->ti].tail_row, rel);
            fz_fail(c, "inputs", "an OK call changed %s (byte %lld, row %lld)", what, rel, row);
        }
    }
}

static void poison_all(fz_case *c, bool on) {
    if (c->cuda) return;
    for (int i = 0; i < c->nbufs; i++) {
        fz_buf *b = &c->bufs[i];
        if (on) {
            FZ_POISON(b->mem, b->lead);
            FZ_POISON((unsigned char *)b->mem + b->lead + b->bytes, FZ_GUARD);
        } else {
            FZ_UNPOISON(b->mem, b->total);
        }
    }
}

bool fz_null_variants(fz_case *c) { return c->null_variants; }

void fz_call_begin(fz_case *c, const char *fn, int kind, int variant) {
    c->call = fn;
    c->call_kind = kind;
    c->call_variant = variant;
    poison_all(c, false);
    for (int i = 0; i < c->nbufs; i++) fz_mem_get(c->cuda, c->bufs[i].snap, c->bufs[i].mem, c->bufs[i].total);
    if (c->cuda) return;
    poison_all(c, true);
    fz_region r[FZ_MAX_REGIONS];
    const int nr = build_regions(c, r, kind == FZ_K_RUN);
    for (int k = 0; k < nr; k++) {
        fz_buf *b = &c->bufs[r[k].buf];
        if (kind == FZ_K_QUERY) {   /* a size query reads no data (CPU: but the pointer arrays) */
            if (b->kind != FZ_B_PTRS) FZ_POISON(payload(c, r[k].buf) + r[k].at, r[k].len);
        } else if (kind == FZ_K_RUN && r[k].tail && !b->shared && c->tens[r[k].ti].tail_row >= 0) {
            FZ_POISON(payload(c, r[k].buf) + r[k].at + r[k].wlen, r[k].len - r[k].wlen);
        }
    }
    /* column tails (outputs and inputs): columns past the tail of every row */
    if (kind == FZ_K_RUN && !c->split_faults)
        for (int i = 0; i < c->ntens; i++) {
            const fz_tensor *T = &c->tens[i];
            size_t len;
            if (T->tail_col < 0 || T->buf < 0 || c->bufs[T->buf].shared || !present(T) ||
                c->bufs[T->buf].kind != FZ_B_DATA || T->t->ndim != 2 || !bytes_of(c, T->t, &len) || len == 0 ||
                T->t->shape[1] <= T->tail_col)
                continue;
            const size_t rb = len / (size_t)T->t->shape[0], from = (size_t)T->tail_col * esize(T->t->dtype);
            for (int64_t row = 0; row < T->t->shape[0]; row++)
                FZ_POISON(payload(c, T->buf) + T->at + (size_t)row * rb + from, rb - from);
        }
    /* input tails too: rows past sum(splits) are never read */
    if (kind == FZ_K_RUN && !c->split_faults)
        for (int i = 0; i < c->ntens; i++) {
            const fz_tensor *T = &c->tens[i];
            size_t len;
            if (is_out(T) || T->tail_row < 0 || T->buf < 0 || c->bufs[T->buf].shared || !present(T) ||
                c->bufs[T->buf].kind != FZ_B_DATA || !bytes_of(c, T->t, &len) || T->t->shape[0] <= T->tail_row)
                continue;
            const size_t rb = len / (size_t)T->t->shape[0];
            FZ_POISON(payload(c, T->buf) + T->at + (size_t)T->tail_row * rb, len - (size_t)T->tail_row * rb);
        }
}

static unsigned expected(const fz_case *c, unsigned *deferred) {
    *deferred = FZ_BIT(MOEX_OK);
    if (c->call_variant != FZ_V_NORMAL) return FZ_BIT(MOEX_ERR_INVALID_ARG);
    bool st = false;
    for (int i = 0; i < c->nfaults; i++)
        if (c->faults[i].cls == FZ_STRUCT && !(c->call_kind == FZ_K_QUERY && c->faults[i].blind)) st = true;
    const bool ro = fz_has_class(c, FZ_RUNONLY), chaos = fz_has_class(c, FZ_CHAOS);
    unsigned vcpu = 0, vcuda = 0;
    if (fz_has_class(c, FZ_SPLITS)) vcpu |= FZ_BIT(MOEX_ERR_BAD_SPLITS), vcuda |= FZ_BIT(MOEX_ERR_BAD_SPLITS);
    if (fz_has_class(c, FZ_IDS)) vcpu |= FZ_BIT(MOEX_ERR_INVALID_ARG), vcuda |= FZ_BIT(MOEX_ERR_INVALID_ARG);
    if (fz_has_class(c, FZ_OFFSFIT)) vcpu |= FZ_BIT(MOEX_ERR_INVALID_ARG), vcuda |= FZ_BIT(MOEX_ERR_BAD_SPLITS);
    const unsigned valid = FZ_BIT(MOEX_OK) | FZ_BIT(MOEX_ERR_UNSUPPORTED) |
                           (c->huge ? FZ_BIT(MOEX_ERR_INVALID_ARG) : 0u);
    if (c->call_kind == FZ_K_QUERY) {
        if (st) return FZ_BIT(MOEX_ERR_INVALID_ARG);
        if (ro || chaos) return FZ_ALL_STATUS;
        return valid;
    }
    if (st || ro) return FZ_BIT(MOEX_ERR_INVALID_ARG);
    if (vcpu) {
        if (!c->cuda) return vcpu;
        *deferred = vcuda;
        return FZ_BIT(MOEX_OK) | FZ_BIT(MOEX_ERR_UNSUPPORTED);
    }
    if (chaos) return FZ_ALL_STATUS;
    return valid;
}

static void status_names(unsigned set, char *buf, size_t n) {
    buf[0] = '\0';
    for (int s = 0; s <= MOEX_ERR_INTERNAL; s++)
        if (set & FZ_BIT(s)) {
            size_t len = strlen(buf);
            snprintf(buf + len, n - len, "%s%s", len ? " or " : "", moex_status_string((moex_status)s));
        }
}

static void check_size(fz_case *c, size_t bytes) {
    if (bytes > (size_t)PTRDIFF_MAX)
        fz_fail(c, "query", "returned %zu bytes, past PTRDIFF_MAX (moex.h: sizes past it are refused)", bytes);
    if (!c->huge && bytes > ((size_t)1 << 30))
        fz_fail(c, "query", "returned %zu bytes for shapes of a few dozen elements", bytes);
}

moex_status fz_call_end(fz_case *c, moex_status st, const size_t *bytes, unsigned want) {
    fz_g.stats.calls++;
    poison_all(c, false);
    for (int i = 0; i < c->nbufs; i++) fz_mem_get(c->cuda, c->bufs[i].now, c->bufs[i].mem, c->bufs[i].total);
    if ((unsigned)st > (unsigned)MOEX_ERR_INTERNAL) fz_fail(c, "status", "returned %d, not a moex_status", (int)st);
    if (st != MOEX_OK) fz_g.stats.failed_calls++;
    const char *msg = moex_last_error(c->call_variant == FZ_V_NULL_CTX ? NULL : fz_g.ctx);
    if (!msg) fz_fail(c, "message", "moex_last_error returned NULL");
    if (st != MOEX_OK && msg[0] == '\0')
        fz_fail(c, "message", "returned %s with an empty moex_last_error%s", moex_status_string(st),
                c->call_variant == FZ_V_NULL_CTX ? "(NULL)" : "");
    if (st == MOEX_OK && msg[0] != '\0')
        fz_fail(c, "message", "returned MOEX_OK but moex_last_error is \"%s\" (cleared when a call starts)", msg);
    unsigned deferred;
    const unsigned exp = want ? want : expected(c, &deferred);
    if (want) deferred = FZ_BIT(MOEX_OK);
    if (c->want_deferred && c->call_kind == FZ_K_RUN && c->call_variant == FZ_V_NORMAL && !c->nfaults)
        deferred = c->want_deferred;   /* a valid EP dispatch that drops rows */
    if (!(exp & FZ_BIT(st))) {
        char ws[128];
        status_names(exp, ws, sizeof ws);
        const char *oracle = st == MOEX_OK ? "OK for invalid input" : c->nfaults ? "wrong status" : "valid call refused";
        if (c->call_variant != FZ_V_NORMAL) oracle = st == MOEX_OK ? "OK for invalid input" : "wrong status";
        fz_fail(c, oracle, "returned %s, want %s%s (message \"%s\")", moex_status_string(st), ws,
                c->call_variant == FZ_V_NULL_CTX ? " for ctx NULL" : c->call_variant == FZ_V_NULL_ARGS ? " for args NULL"
                : c->call_variant == FZ_V_NULL_BYTES ? " for bytes NULL" : "", msg);
    }
    compare(c, st);
    if (c->call_kind == FZ_K_QUERY && c->call_variant == FZ_V_NORMAL && st == MOEX_OK && bytes) check_size(c, *bytes);
    if (c->call_kind == FZ_K_RUN && c->call_variant == FZ_V_NORMAL) {
        fz_last_features.statuses |= FZ_BIT(st);
        const char *call = c->call;
        if (st != MOEX_OK) deferred = FZ_BIT(MOEX_OK);
        c->call = "moex_context_check_splits (after the run)";
        moex_status s2 = moex_context_check_splits(fz_g.ctx, NULL);
        fz_g.stats.calls++;
        if (!(deferred & FZ_BIT(s2))) {
            char ws[128];
            status_names(deferred, ws, sizeof ws);
            fz_fail(c, "check_splits", "after %s (%s): returned %s, want %s (message \"%s\")", call,
                    moex_status_string(st), moex_status_string(s2), ws, moex_last_error(fz_g.ctx));
        }
        if (s2 != MOEX_OK && moex_last_error(fz_g.ctx)[0] == '\0')
            fz_fail(c, "message", "check_splits returned %s with an empty message", moex_status_string(s2));
        const char *err = fz_mem_error(c->cuda);
        if (err) fz_fail(c, "cuda", "after %s: the CUDA runtime reports %s", call, err);
        c->call = call;
    }
    return st;
}

moex_status fz_query(fz_case *c, const char *name, fz_query_fn q, const void *args, size_t *bytes) {
    if (c->null_variants) {
        size_t b = 0;
        fz_call_begin(c, name, FZ_K_QUERY, FZ_V_NULL_CTX);
        fz_call_end(c, q(NULL, args, &b), NULL, 0);
        fz_call_begin(c, name, FZ_K_QUERY, FZ_V_NULL_ARGS);
        fz_call_end(c, q(fz_g.ctx, NULL, &b), NULL, 0);
        fz_call_begin(c, name, FZ_K_QUERY, FZ_V_NULL_BYTES);
        fz_call_end(c, q(fz_g.ctx, args, NULL), NULL, 0);
    }
    *bytes = 0;
    fz_call_begin(c, name, FZ_K_QUERY, FZ_V_NORMAL);
    return fz_call_end(c, q(fz_g.ctx, args, bytes), bytes, 0);
}

moex_status fz_run(fz_case *c, const char *name, fz_run_fn r, const void *args) {
    if (c->null_variants) {
        fz_call_begin(c, name, FZ_K_RUN, FZ_V_NULL_CTX);
        fz_call_end(c, r(NULL, args, c->ws, c->ws_bytes, NULL), NULL, 0);
        fz_call_begin(c, name, FZ_K_RUN, FZ_V_NULL_ARGS);
        fz_call_end(c, r(fz_g.ctx, NULL, c->ws, c->ws_bytes, NULL), NULL, 0);
    }
    fz_call_begin(c, name, FZ_K_RUN, FZ_V_NORMAL);
    return fz_call_end(c, r(fz_g.ctx, args, c->ws, c->ws_bytes, NULL), NULL, 0);
}

/* The legal overlap of two float inputs (one inside the other), decided before faults. */
void fz_legal_alias(fz_case *c) {
    int cand[FZ_MAX_TENSORS], n = 0;
    size_t len[FZ_MAX_TENSORS];
    for (int i = 0; i < c->ntens; i++) {
        const fz_tensor *T = &c->tens[i];
        size_t b;
        if (T->role != FZ_IN || !validated(T) || !present(T) || T->discrete || T->i64 || T->i32 ||
            !is_float(T->t->dtype) || !bytes_of(c, T->t, &b) || b == 0 || T->buf < 0)
            continue;
        len[n] = b;
        cand[n++] = i;
    }
    if (n < 2) return;
    const int a = (int)(fz_rand(c) % (uint64_t)n), b = (int)(fz_rand(c) % (uint64_t)n);
    if (a == b) return;
    const int mover = len[a] <= len[b] ? cand[a] : cand[b], target = len[a] <= len[b] ? cand[b] : cand[a];
    c->alias = (fz_alias){.active = 1, .mover = mover, .mover_g = -1, .tkind = FZ_REG_DATA, .target = target,
                          .target_g = -1, .sel = fz_rand(c), .legal = 1};
    c->tens[mover].touched = c->tens[target].touched = 1;
    place_alias(c);
    c->alias.active = 2;
    fz_note(c, " [legal overlap: input %s inside input %s]", c->tens[mover].name, c->tens[target].name);
}

void fz_flow(fz_case *c, const fz_opfns *f, void *args, fz_fault_fn faults) {
    fz_materialize(c);
    if (c->legal_alias && !c->huge) fz_legal_alias(c);
    size_t need = 0;
    moex_status st = fz_query(c, f->qname, f->query, args, &need);
    if (st != MOEX_OK && !c->huge) return;   /* UNSUPPORTED (anything else failed above) */
    c->ws_need = st == MOEX_OK ? need : 0;
    fz_faults(c, faults, args);
    if (c->nfaults) {
        size_t n2 = 0;
        fz_query(c, f->qname, f->query, args, &n2);
    }
    if (c->huge && !fz_must_fail(c)) return;   /* huge shapes cannot be backed by memory */
    fz_workspace(c);
    fz_run(c, f->rname, f->run, args);
}

/* ---- inputs ------------------------------------------------------------------------------------------ */

int fz_init(moex_backend backend) {
    memset(&fz_g.stats, 0, sizeof fz_g.stats);
    fz_g.backend = backend;
    fz_g.cuda = backend == MOEX_BACKEND_CUDA;
    if (fz_g.cuda && !fz_mem_have_cuda()) {
        fprintf(stderr, "moex_fuzz: this driver was built without CUDA support\n");
        return 77;
    }
    moex_status st = moex_context_create(&fz_g.ctx, backend, 0);
    if (st != MOEX_OK) {
        fprintf(stderr, "moex_fuzz: no %s context: %s: %s\n", fz_g.cuda ? "CUDA" : "CPU", moex_status_string(st),
                moex_last_error(NULL));
        return fz_g.cuda && (st == MOEX_ERR_CUDA || st == MOEX_ERR_UNSUPPORTED) ? 77 : 1;
    }
    return 0;
}

void fz_shutdown(void) {
    moex_context_destroy(fz_g.ctx);
    fz_g.ctx = NULL;
}

static void case_free(fz_case *c) {
    bufs_free(c);
    for (int i = 0; i < c->nheap; i++) free(c->heap[i]);
    c->nheap = 0;
}

void fz_run_input(const uint8_t *data, size_t size) {
    fz_g.stats.inputs++;
    memset(&fz_last_features, 0, sizeof fz_last_features);
    size_t pos = 0;
    for (int k = 0; k < FZ_MAX_CASES; k++) {
        if (k > 0 && pos + 8 > size) break;
        fz_case *c = (fz_case *)calloc(1, sizeof *c);
        if (!c) {
            fprintf(stderr, "moex_fuzz: out of host memory\n");
            abort();
        }
        c->data = data;
        c->size = size;
        c->pos = pos;
        c->cuda = fz_g.cuda;
        c->ws_buf = c->saved_buf = -1;
        c->fault_ti = c->fault_dim = -1;
        c->op = fz_op_of_byte(fz_u8(c));
        const uint8_t mode = fz_u8(c);
        c->huge = (mode & 7) == 7 && c->op != FZ_OP_CONTEXT;
        c->null_variants = (mode >> 3) % 8 == 0;
        c->specials = ((mode >> 6) & 1) != 0;
        c->legal_alias = ((mode >> 7) & 1) != 0;
        c->rng = 0x6D6F6578ull ^ ((uint64_t)fz_u32(c) << 8) ^ (uint64_t)k;
        snprintf(c->desc, sizeof c->desc, "%s: ", fz_op_names[c->op]);
        fz_g.stats.cases++;
        fz_last_features.ops |= 1u << c->op;
        if (c->huge) fz_last_features.huge_ops |= 1u << c->op;
        cur_case = c;
        jmp_buf jb;
        c->jb = &jb;
        if (setjmp(jb) == 0) op_builders[c->op](c);
        if (fz_g.verbose) {
            fprintf(stderr, "case %d (%s mode): %s\n", k, c->huge ? "huge" : "run", c->desc);
            print_faults(stderr, c);
        }
        cur_case = NULL;
        pos = c->pos;
        case_free(c);
        free(c);
    }
}
