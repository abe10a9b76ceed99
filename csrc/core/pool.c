/* A small persistent pthread pool behind vt_parallel_for.
 *
 * One job runs at a time (a mutex serialises callers). Worker w runs task
 * index w of the job; indices without a worker (thread creation failed)
 * run on the calling thread, so every index runs exactly once. */
#include <pthread.h>
#include <unistd.h>

#include "vt_internal.h"

typedef struct pool_state {
    pthread_mutex_t run_lock;   /* held by the caller for a whole job */
    pthread_mutex_t lock;       /* guards the fields below */
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    int nworkers;
    unsigned long generation;
    vt_task_fn fn;
    void *ctx;
    int nth;
    int pending;
    pid_t owner_pid;
} pool_state;

static pool_state pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                          PTHREAD_COND_INITIALIZER, 0, 0, NULL, NULL, 0, 0, 0};
static _Thread_local int in_task;
/* Generation each worker was created at, so a worker created for a job
 * runs that job. */
static unsigned long start_gen[VT_MAX_THREADS + 1];

static void *worker_main(void *arg) {
    int w = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    unsigned long seen = start_gen[w];
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.work_cv, &pool.lock);
        seen = pool.generation;
        if (w < pool.nth) {
            vt_task_fn fn = pool.fn;
            void *ctx = pool.ctx;
            int nth = pool.nth;
            pthread_mutex_unlock(&pool.lock);
            in_task = 1;
            fn(ctx, w, nth);
            in_task = 0;
            pthread_mutex_lock(&pool.lock);
            if (--pool.pending == 0) pthread_cond_signal(&pool.done_cv);
        }
    }
    return NULL;
}

/* After fork() the child has no workers; start again from nothing. */
static void reset_after_fork(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    pool.run_lock = m;
    pool.lock = m;
    pool.work_cv = c;
    pool.done_cv = c;
    pool.nworkers = 0;
    pool.pending = 0;
    pool.owner_pid = getpid();
}

static void grow(int want) {
    if (pool.owner_pid != getpid()) reset_after_fork();
    while (pool.nworkers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        start_gen[pool.nworkers + 1] = pool.generation;
        int rc = pthread_create(&t, &attr, worker_main, (void *)(intptr_t)(pool.nworkers + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.nworkers++;
    }
}

void vt_parallel_for(vt_task_fn fn, void *ctx, int nth) {
    if (nth > VT_MAX_THREADS) nth = VT_MAX_THREADS;
    if (nth <= 1 || in_task) {
        for (int i = 0; i < (nth < 1 ? 1 : nth); i++) fn(ctx, i, nth < 1 ? 1 : nth);
        return;
    }
    if (pool.owner_pid != 0 && pool.owner_pid != getpid()) reset_after_fork();
    pthread_mutex_lock(&pool.run_lock);
    pthread_mutex_lock(&pool.lock);
    if (pool.owner_pid == 0) pool.owner_pid = getpid();
    grow(nth - 1);
    int have = pool.nworkers + 1 < nth ? pool.nworkers + 1 : nth;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.nth = nth;
    pool.pending = have - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.work_cv);
    pthread_mutex_unlock(&pool.lock);

    in_task = 1;
    fn(ctx, 0, nth);
    for (int i = have; i < nth; i++) fn(ctx, i, nth); /* indices without a worker */
    in_task = 0;

    pthread_mutex_lock(&pool.lock);
    while (pool.pending > 0) pthread_cond_wait(&pool.done_cv, &pool.lock);
    pool.fn = NULL;
    pool.ctx = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.run_lock);
}

void vt_split_range(size_t n, size_t align, int ith, int nth, size_t *begin, size_t *end) {
    if (align == 0) align = 1;
    if (nth < 1) nth = 1;
    size_t units = (n + align - 1) / align;
    size_t per = units / (size_t)nth, rem = units % (size_t)nth;
    size_t i = (size_t)ith;
    size_t ub = i * per + (i < rem ? i : rem);
    size_t ue = ub + per + (i < rem ? 1 : 0);
    size_t b = ub * align, e = ue * align;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}
