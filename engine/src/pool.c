/*
 * pool.c -- the persistent compute thread pool behind every parallel matmul.
 *
 * A decode token dispatches a few hundred parallel sections, so dispatch cost matters
 * more than throughput here. The caller publishes a job by bumping a generation counter;
 * workers spin on it for a short while (WPI_SPIN_SECONDS) before sleeping on a condition
 * variable, and the caller runs tasks too. Tasks are claimed with a compare-and-swap on
 * one 64-bit word holding (generation << 32 | next task), so a straggler from an old job
 * can never claim a task of the next one, and the task count is read from the slot of
 * the claim's own generation (two slots alternate).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pool.h"
#include "util.h"

/* Long enough to cover the single-threaded gaps between the matmuls of one token (norms,
 * rope, router, expert waits are short), short enough not to burn a core between calls. */
#define WPI_SPIN_SECONDS 200e-6
#define WPI_MAX_THREADS 512

struct wpi_pool {
    uint32_t n_threads;                 /* including the caller */
    pthread_t *threads;                 /* [n_threads - 1] */
    _Atomic uint32_t gen;               /* job generation, bumped per parallel_for */
    _Atomic uint64_t claim;             /* gen << 32 | next task index */
    _Atomic uint32_t done;              /* tasks finished in this generation */
    _Atomic uint32_t sleepers;
    _Atomic int stop;
    /* The job of generation g is jobs[g & 1]: while generation g + 1 is being published,
     * a straggler of g still reads g's task count, so it can never claim past its end. */
    struct {
        _Atomic uint32_t n_tasks;
        wpi_task_fn fn;
        void *arg;
    } jobs[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Claims and runs tasks of generation g until none is left. */
static void run_tasks(wpi_pool *p, uint32_t g)
{
    for (;;) {
        uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
        if ((uint32_t)(c >> 32) != g) return;
        uint32_t i = (uint32_t)c;
        if (i >= atomic_load_explicit(&p->jobs[g & 1].n_tasks, memory_order_relaxed)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        /* Generation g cannot end, nor its slot be reused, before this task is done. */
        p->jobs[g & 1].fn(p->jobs[g & 1].arg, i);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker(void *arg)
{
    wpi_pool *p = arg;
    uint32_t seen = 0; /* the generation at pool creation: a late start still joins job 1 */
    for (;;) {
        uint32_t g;
        double t0 = 0;
        uint32_t spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            cpu_relax();
            if ((++spins & 255) == 0) {
                double t = wpi_now();
                if (t0 == 0) t0 = t;
                else if (t - t0 > WPI_SPIN_SECONDS) {
                    pthread_mutex_lock(&p->mu);
                    atomic_fetch_add(&p->sleepers, 1);
                    while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                        pthread_cond_wait(&p->cv, &p->mu);
                    atomic_fetch_sub(&p->sleepers, 1);
                    pthread_mutex_unlock(&p->mu);
                    t0 = 0;
                }
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        run_tasks(p, g);
    }
}

wp_status wpi_pool_open(uint32_t n_threads, wpi_pool **out)
{
    *out = NULL;
    if (n_threads == 0) n_threads = wpi_physical_cores();
    if (n_threads > WPI_MAX_THREADS) n_threads = WPI_MAX_THREADS;
    wpi_pool *p = calloc(1, sizeof *p);
    if (!p) return WP_E_OOM;
    p->n_threads = n_threads;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return WP_E_OOM;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return WP_E_OOM;
    }
    if (n_threads > 1) {
        p->threads = calloc(n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            wpi_pool_close(p);
            return WP_E_OOM;
        }
    }
    for (uint32_t i = 0; i + 1 < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
            p->n_threads = i + 1; /* join the ones started */
            wpi_pool_close(p);
            return WP_E_OOM;
        }
    }
    *out = p;
    return WP_OK;
}

void wpi_pool_close(wpi_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->threads)
        for (uint32_t i = 0; i + 1 < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

uint32_t wpi_pool_threads(const wpi_pool *p)
{
    return p ? p->n_threads : 1;
}

void wpi_parallel_for(wpi_pool *p, uint32_t n_tasks, wpi_task_fn fn, void *arg)
{
    if (n_tasks == 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (uint32_t i = 0; i < n_tasks; i++) fn(arg, i);
        return;
    }
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    p->jobs[g & 1].fn = fn;
    p->jobs[g & 1].arg = arg;
    atomic_store_explicit(&p->jobs[g & 1].n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)g << 32, memory_order_release);
    atomic_store(&p->gen, g); /* seq_cst: pairs with the sleepers check below */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p, g);
    /* A worker still runs a task. Yield now and then: on an oversubscribed machine it
     * may be waiting for this very core. */
    for (uint32_t spins = 1; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks;
         spins++) {
        cpu_relax();
        if ((spins & 4095) == 0) sched_yield();
    }
}
