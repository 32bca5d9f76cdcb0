/*
 * cpu_common.c - helpers shared by every CPU operation:
 *   moex_cpu_parallel_for   a range split over a persistent pool of worker threads
 *   moex_cpu_state_create / moex_cpu_state_destroy   the pool, kept in ctx->backend_state
 *   moex_cpu_store_f32_rows  f32 rows rounded into an output, in parallel over the rows
 *                            (and the cast_rows primitive on it)
 *   moex_cpu_group_colsum    the column sums of each group's rows (bias gradients)
 *
 * The pool: workers are started lazily, the first time a call wants them, up to
 * ctx->num_threads - 1 (the caller's thread is the last one), so that
 * moex_context_set_num_threads takes effect at the next call. Workers sleep on a
 * condition variable between calls. A call splits [0, n) into contiguous chunks that
 * the caller and the workers claim one at a time, and returns when every chunk is done.
 * If a worker cannot be started, the threads that exist do the work (the caller alone
 * if need be): parallel_for never fails. A parallel_for called from inside a chunk
 * (nesting) runs inline on the calling thread.
 */
#include "cpu_ops.h"

#include "cpu_convert.h"

#include <pthread.h>
#include <stdlib.h>

/* ---- the pool ------------------------------------------------------------------------ */

#define POOL_MAX_WORKERS 255   /* moex_cpu_backend_init caps num_threads at 256 */
#define CHUNKS_PER_THREAD 4    /* more chunks than threads evens out uneven work */

typedef struct cpu_pool {
    pthread_mutex_t mu;
    pthread_cond_t wake;       /* a job was posted, or stop */
    pthread_cond_t done;       /* the last chunk of the job finished */
    pthread_t workers[POOL_MAX_WORKERS];
    int num_workers;           /* started so far */
    int stop;
    int busy;                  /* a job is running (guards against misuse from two threads) */
    /* the current job, all guarded by mu */
    uint64_t job;              /* incremented per job */
    moex_cpu_range_fn fn;
    void *arg;
    int64_t n, num_chunks;
    int64_t next_chunk;        /* the next chunk to claim */
    int64_t chunks_done;
    int helpers_wanted;        /* workers that may join this job */
} cpu_pool;

/* Set on a thread while it runs chunks, so that nested calls run inline. */
static _Thread_local int in_parallel_region;

static void chunk_bounds(int64_t n, int64_t chunks, int64_t c, int64_t *begin, int64_t *end) {
    const int64_t q = n / chunks, r = n % chunks;
    *begin = c * q + (c < r ? c : r);
    *end = *begin + q + (c < r ? 1 : 0);
}

/* Claims and runs chunks of the current job until none is left. Called with mu held;
 * returns with mu held. */
static void run_chunks(cpu_pool *p) {
    while (p->next_chunk < p->num_chunks) {
        const int64_t c = p->next_chunk++;
        const moex_cpu_range_fn fn = p->fn;
        void *arg = p->arg;
        int64_t begin, end;
        chunk_bounds(p->n, p->num_chunks, c, &begin, &end);
        pthread_mutex_unlock(&p->mu);
        fn(arg, begin, end);
        pthread_mutex_lock(&p->mu);
        if (++p->chunks_done == p->num_chunks) pthread_cond_signal(&p->done);
    }
}

static void *worker_main(void *varg) {
    cpu_pool *p = (cpu_pool *)varg;
    in_parallel_region = 1;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && (p->job == seen || p->helpers_wanted == 0)) {
            seen = p->job;  /* a job that wants no more helpers counts as seen */
            pthread_cond_wait(&p->wake, &p->mu);
        }
        if (p->stop) break;
        seen = p->job;
        p->helpers_wanted--;
        run_chunks(p);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

moex_status moex_cpu_state_create(moex_context *ctx) {
    cpu_pool *p = (cpu_pool *)calloc(1, sizeof *p);
    if (!p) return moex_fail(ctx, MOEX_ERR_OUT_OF_MEMORY, "moex_context_create: out of host memory (CPU pool)");
    if (pthread_mutex_init(&p->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&p->wake, NULL) != 0) goto fail_wake;
    if (pthread_cond_init(&p->done, NULL) != 0) goto fail_done;
    ctx->backend_state = p;
    return MOEX_OK;
fail_done:
    pthread_cond_destroy(&p->wake);
fail_wake:
    pthread_mutex_destroy(&p->mu);
fail_mu:
    free(p);
    return moex_fail(ctx, MOEX_ERR_OUT_OF_MEMORY, "moex_context_create: cannot create the CPU thread pool's locks");
}

void moex_cpu_state_destroy(moex_context *ctx) {
    cpu_pool *p = (cpu_pool *)ctx->backend_state;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->num_workers; i++) pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p);
    ctx->backend_state = NULL;
}

/* Starts workers until there are `want` (or one fails to start); called with mu held. */
static void grow_pool(cpu_pool *p, int want) {
    if (want > POOL_MAX_WORKERS) want = POOL_MAX_WORKERS;
    while (p->num_workers < want) {
        if (pthread_create(&p->workers[p->num_workers], NULL, worker_main, p) != 0) break;
        p->num_workers++;
    }
}

void moex_cpu_parallel_for(moex_context *ctx, int64_t n, int64_t grain, moex_cpu_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    cpu_pool *p = (cpu_pool *)ctx->backend_state;
    const int64_t max_chunks = (n + grain - 1) / grain;
    int64_t threads = ctx->num_threads < max_chunks ? ctx->num_threads : max_chunks;
    if (!p || threads <= 1 || in_parallel_region) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (p->busy) { /* another thread is using this context: a misuse, but stay correct */
        pthread_mutex_unlock(&p->mu);
        fn(arg, 0, n);
        return;
    }
    grow_pool(p, (int)threads - 1);
    if (threads > p->num_workers + 1) threads = p->num_workers + 1;
    if (threads <= 1) {
        pthread_mutex_unlock(&p->mu);
        fn(arg, 0, n);
        return;
    }
    p->busy = 1;
    p->job++;
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->num_chunks = threads * CHUNKS_PER_THREAD < max_chunks ? threads * CHUNKS_PER_THREAD : max_chunks;
    p->next_chunk = 0;
    p->chunks_done = 0;
    p->helpers_wanted = (int)threads - 1;
    pthread_cond_broadcast(&p->wake);

    in_parallel_region = 1;
    run_chunks(p);
    in_parallel_region = 0;
    while (p->chunks_done < p->num_chunks) pthread_cond_wait(&p->done, &p->mu);
    p->helpers_wanted = 0;
    p->busy = 0;
    pthread_mutex_unlock(&p->mu);
}

/* ---- rounding f32 rows into an output ------------------------------------------------- */

#define STORE_GRAIN_ELEMS 16384   /* elements of a chunk worth a thread */

typedef struct store_job {
    const float *src;
    void *dst;
    moex_dtype dt;
    int64_t cols;
} store_job;

static void store_rows(void *arg, int64_t begin, int64_t end) {
    const store_job *j = (const store_job *)arg;
    moex_cpu_store_f32(moex_cpu_at(j->dst, j->dt, begin * j->cols), j->dt, j->src + begin * j->cols,
                       (end - begin) * j->cols);
}

void moex_cpu_store_f32_rows(moex_context *ctx, void *dst, moex_dtype dt, const float *src, int64_t rows,
                             int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    store_job j = {src, dst, dt, cols};
    moex_cpu_parallel_for(ctx, rows, 1 + STORE_GRAIN_ELEMS / cols, store_rows, &j);
}

/* The CPU GEMMs read a discrete weight through its pointers: no maps. */
size_t moex_cpu_weight_maps_size(moex_context *ctx, const moex_gl_dims *d) { return 0; }

moex_status moex_cpu_weight_maps_write(moex_context *ctx, const moex_call *c, const moex_weight_maps_write_args *a,
                                       const moex_gl_dims *d) {
    return MOEX_OK;
}

size_t moex_cpu_weight_copy_ws(moex_context *ctx, const moex_weight_copy_args *a, const moex_gl_dims *d) { return 0; }

/* Matrix by matrix, row by row through an f32 row (the rounding of moex_cpu_store_f32). */
static void weight_copy_rows(void *arg, int64_t begin, int64_t end) {
    const moex_weight_copy_args *a = ((const void **)arg)[0];
    const moex_gl_dims *d = ((const void **)arg)[1];
    float row[256];
    for (int64_t r = begin; r < end; r++) {
        const int64_t g = r / d->T, i = r % d->T;
        const void *src = moex_cpu_cat(moex_weight_ptr(&a->src, g), a->src.t.dtype, i * d->K);
        void *dst = moex_cpu_at((void *)moex_weight_ptr(&a->dst, g), a->dst.t.dtype, i * d->K);
        for (int64_t c0 = 0; c0 < d->K; c0 += 256) {
            const int64_t n = d->K - c0 < 256 ? d->K - c0 : 256;
            moex_cpu_load_f32(row, moex_cpu_cat(src, a->src.t.dtype, c0), a->src.t.dtype, n);
            moex_cpu_store_f32(moex_cpu_at(dst, a->dst.t.dtype, c0), a->dst.t.dtype, row, n);
        }
    }
}

moex_status moex_cpu_weight_copy(moex_context *ctx, const moex_call *c, const moex_weight_copy_args *a,
                                 const moex_gl_dims *d, void *ws) {
    const void *arg[2] = {a, d};
    moex_cpu_parallel_for(ctx, d->G * d->T, 16, weight_copy_rows, (void *)arg);
    return MOEX_OK;
}

size_t moex_cpu_cast_rows_ws(moex_context *ctx, const moex_cast_rows_args *a, const moex_gl_dims *d) { return 0; }

moex_status moex_cpu_cast_rows(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_cast_rows_args *a,
                               const moex_gl_dims *d, void *ws) {
    moex_cpu_store_f32_rows(ctx, a->dst.data, a->dst.dtype, a->src, g->off[g->G], d->N);
    return MOEX_OK;
}

/* ---- column sums over group rows ------------------------------------------------------- */

#define COLSUM_COLS 128          /* columns of one task */

/* Task t: group t / blocks, the COLSUM_COLS columns of block t % blocks. */
typedef struct colsum_job {
    const void *src;
    moex_dtype dt;
    int64_t N, blocks;
    const int64_t *off;
    const float *probs;
    void *dst;
    moex_dtype dst_dt;
} colsum_job;

static void colsum_tasks(void *arg, int64_t t0, int64_t t1) {
    const colsum_job *j = (const colsum_job *)arg;
    float acc[COLSUM_COLS], v[COLSUM_COLS];
    for (int64_t t = t0; t < t1; t++) {
        const int64_t g = t / j->blocks, c0 = (t % j->blocks) * COLSUM_COLS;
        const int64_t n = j->N - c0 < COLSUM_COLS ? j->N - c0 : COLSUM_COLS;
        for (int64_t c = 0; c < n; c++) acc[c] = 0.0f;
        for (int64_t i = j->off[g]; i < j->off[g + 1]; i++) {
            moex_cpu_load_f32(v, moex_cpu_cat(j->src, j->dt, i * j->N + c0), j->dt, n);
            const float p = j->probs ? j->probs[i] : 1.0f;
            if (j->probs) {
                for (int64_t c = 0; c < n; c++) acc[c] += p * v[c];
            } else {
                for (int64_t c = 0; c < n; c++) acc[c] += v[c];
            }
        }
        moex_cpu_store_f32(moex_cpu_at(j->dst, j->dst_dt, g * j->N + c0), j->dst_dt, acc, n);
    }
}

void moex_cpu_group_colsum(moex_context *ctx, const int64_t *off, int64_t G, const void *src, moex_dtype dt,
                           int64_t N, const float *probs, void *dst, moex_dtype dst_dt) {
    if (G <= 0 || N <= 0) return;
    colsum_job j = {src, dt, N, moex_i64_cdiv(N, COLSUM_COLS), off, probs, dst, dst_dt};
    moex_cpu_parallel_for(ctx, G * j.blocks, 1, colsum_tasks, &j);
}
