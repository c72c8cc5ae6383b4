/*
 * experts.h -- expert records under a memory budget (experts/): plan.c (the memory plan),
 * cache.c (slots, policy, pins), reader.c (aligned pread, O_DIRECT probe, header + CRC32C
 * validation). Architecture code reaches experts only through wpi_experts_* and never
 * touches a file.
 */
#ifndef WPI_EXPERTS_H
#define WPI_EXPERTS_H

#include "container.h"

typedef struct wpi_expert_view {
    const void *gate, *up, *down; /* matrices in dtype layout */
    int32_t dtype;
    uint32_t inter, hidden;
} wpi_expert_view;

typedef struct wpi_experts wpi_experts;

/* Creates the expert cache of cache_bytes (rounded down to whole slots of the largest
 * record) and its reader threads; probes O_DIRECT per bank. */
wp_status wpi_experts_open(wpi_container *c, const wp_cfg *cfg, uint64_t cache_bytes,
                           wpi_mem *m, wpi_experts **out, char *err, size_t cap);

/* How many experts one request may pin at once (>= top_k). */
uint32_t wpi_experts_max_pinned(const wpi_experts *x);

/* Demand request: pins experts ids[0..n) of layer (n <= max_pinned, ids distinct) and
 * starts reads for the misses, in the given order. Counts lookups, hits and misses. */
wp_status wpi_experts_request(wpi_experts *x, uint32_t layer, const int32_t *ids,
                              uint32_t n, char *err, size_t cap);

/* Waits until a requested expert is present and valid; fills out. WP_E_IO with the
 * layer and expert named in err when the record failed to read or validate. */
wp_status wpi_experts_acquire(wpi_experts *x, uint32_t layer, int32_t id,
                              wpi_expert_view *out, char *err, size_t cap);

/* 1 when acquire of a requested expert would not wait: its record is present (or its
 * read failed, which acquire reports). 0 while its read is queued or in progress. */
int wpi_experts_ready(wpi_experts *x, uint32_t layer, int32_t id);

/* Unpins everything pinned by requests since the last release. */
void wpi_experts_release(wpi_experts *x);

/* Speculative reads (lookahead); never pinned, never counted as lookups. */
void wpi_experts_prefetch(wpi_experts *x, uint32_t layer, const int32_t *ids, uint32_t n);

/* The router of `layer` chose ids[0..n) (every expert of the layer's step): drops the
 * queued speculative reads of that layer for other experts that no reader thread has
 * started, and frees their slots, so the disk serves the misses the routing made rather
 * than predictions it did not keep. Reads already in progress finish (a slot is never
 * left half-filled). Returns how many were dropped (counted in prefetch_cancelled and
 * taken out of bytes_read). */
uint32_t wpi_experts_cancel_prefetch(wpi_experts *x, uint32_t layer, const int32_t *ids,
                                     uint32_t n);

/* Adds the expert counters to *s (lookups, hits, misses, prefetch, bytes, read time,
 * direct_io, cache size). */
void wpi_experts_stats(const wpi_experts *x, wp_stats *s);
void wpi_experts_stats_reset(wpi_experts *x);

wp_status wpi_experts_hotlist_save(const wpi_experts *x, const char *path, char *err, size_t cap);

void wpi_experts_close(wpi_experts *x, wpi_mem *m);

/* reader.c: the bank files (O_DIRECT after a probe read, else buffered + FADV_RANDOM),
 * record validation and the reader threads. cache.c is its only user. */
typedef struct wpi_reader wpi_reader;

/* Called on a reader thread when a queued read ends: st is WP_OK or WP_E_IO with a
 * detail such as "layer 3 expert 17: payload checksum mismatch". */
typedef void (*wpi_read_done_fn)(void *user, uint32_t tag, wp_status st, const char *detail);

/* Opens every bank of c and starts cfg->reader_threads threads (0 = 4, at most 8).
 * queue_cap bounds the jobs waiting in each of the two queues. Errors: WP_E_IO, WP_E_ARG,
 * WP_E_OOM. */
wp_status wpi_reader_open(const wpi_container *c, const wp_cfg *cfg, uint32_t queue_cap,
                          wpi_read_done_fn done, void *user, wpi_reader **out,
                          char *err, size_t cap);
/* Queues one aligned read of record `expert` of c->banks[bank] into buf (WPI_BUF_ALIGN-
 * aligned, at least record_bytes long); done(user, tag, ...) is called when it ends.
 * Demand reads are served before speculative ones, each queue in FIFO order.
 * Returns WP_E_ARG when that queue is full (never blocks). */
wp_status wpi_reader_submit(wpi_reader *r, uint32_t bank, uint32_t expert, void *buf,
                            uint32_t tag, int demand);
/* Reads and validates one record on the calling thread. */
wp_status wpi_reader_read(wpi_reader *r, uint32_t bank, uint32_t expert, void *buf,
                          char *err, size_t cap);
/* Takes the speculative job of tag off its queue if no thread has started it: 1 when it
 * was removed (its done callback will never run), 0 when it is in progress, done or
 * unknown. Demand jobs are never cancelled. */
int wpi_reader_cancel(wpi_reader *r, uint32_t tag);
/* 1 when every bank bypasses the page cache. */
int wpi_reader_direct_io(const wpi_reader *r);
/* Stops the threads after the reads in progress; queued reads are dropped. */
void wpi_reader_close(wpi_reader *r);

/* Validates record `expert` of bank b held in rec[0..record_bytes): the header always
 * (magic, version, layer, expert, dtype, n_tensors, payload size, offsets, header CRC),
 * the payload CRC when verify. WP_E_IO naming layer and expert on any mismatch. */
wp_status wpi_record_check(const wpi_bank *b, uint32_t expert, const void *rec, int verify,
                           char *err, size_t cap);

/* cache.c: sizing shared with plan.c, so the plan states what open allocates.
 * Bookkeeping bytes (slot table, map, pin list, usage counts, hotlist preload list) of a
 * cache of `slots` slots; 0 when slots is 0. */
uint64_t wpi_cache_meta_bytes(const wpi_container *c, uint32_t slots);
/* Slots a cache of cache_bytes holds: (cache_bytes - bookkeeping of the largest possible
 * cache) / max_record_bytes, at most one per record, at least 2 * top_k (0 without
 * banks). Records and bookkeeping together stay within cache_bytes whenever cache_bytes
 * is at least the plan's min_cache_bytes. */
uint32_t wpi_cache_slots(const wpi_container *c, uint64_t cache_bytes);

/* plan.c: the memory plan (see wp_plan), also used by wp_open to resolve the budget.
 * The state and scratch the forward allocates depend on the architecture, which this
 * layer does not know: the layer above passes them as sizes (forward.c's
 * wpi_model_sizes), the state bytes by WP_STATE_* kind at ctx tokens (out zeroed
 * before), the scratch bytes for chunks of chunk tokens and the bytes of each sequence
 * beyond the first (wp_plan.sequence_bytes). */
typedef void (*wpi_sizes_fn)(const wpi_hparams *hp, uint32_t ctx, uint32_t chunk,
                             uint64_t state_bytes[WP_STATE_KINDS], uint64_t *scratch_bytes,
                             uint64_t *sequence_bytes);
wp_status wpi_plan(const wpi_container *c, const wp_cfg *cfg, wpi_sizes_fn sizes,
                   wp_plan *out, char *err, size_t cap);

/* Usable RAM: wpi_usable_ram (platform.h). */

#endif /* WPI_EXPERTS_H */
