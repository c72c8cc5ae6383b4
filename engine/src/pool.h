/*
 * pool.h -- the persistent compute pool (pool.c).
 */
#ifndef WPI_POOL_H
#define WPI_POOL_H

#include <stdint.h>

#include "wp.h"

/* pool.c: a persistent compute pool. The calling thread runs tasks too, so a pool of
 * n threads starts n - 1 workers. Idle workers spin briefly, then sleep. */
typedef struct wpi_pool wpi_pool;
typedef void (*wpi_task_fn)(void *arg, uint32_t task);

wp_status wpi_pool_open(uint32_t n_threads, wpi_pool **out);
void wpi_pool_close(wpi_pool *p);
uint32_t wpi_pool_threads(const wpi_pool *p);
/* Runs fn(arg, i) for every i < n_tasks across the pool and returns when all are done.
 * Tasks are claimed dynamically, so fn must make each task's result independent of
 * which thread runs it. Not reentrant: one parallel_for at a time per pool. */
void wpi_parallel_for(wpi_pool *p, uint32_t n_tasks, wpi_task_fn fn, void *arg);

#endif /* WPI_POOL_H */
