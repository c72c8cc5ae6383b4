/*
 * plan.c -- the memory plan (floor, working set, budget, cache size). The state and
 * scratch sizes come from the layer above (wpi_sizes_fn): no architecture is known here.
 *
 *   floor       = trunk + kv + scratch + minimum cache (top_k x record x 2, so one
 *                 layer's experts can be in use while the next layer's are read, plus
 *                 the cache's bookkeeping: wpi_cache_meta_bytes)
 *                 + (sequences - 1) x sequence (its state and its layer table; the
 *                 scratch is shared, sequence 0's state is kv)
 *   ws          = top_k x record x MoE layers: one token's expert traffic
 *   recommended = floor + 3 ws, capped where every expert record fits
 *   budget      = explicit: exactly as given (below the floor: WP_E_BUDGET)
 *                 default: the largest k in {3, 2, 1} with floor + k ws <= 3/4 of usable
 *                 RAM, else the floor
 *   cache       = budget - floor + minimum cache, capped at every expert record (+ its
 *                 bookkeeping); peak engine memory then never exceeds the budget
 *
 * Whole multiples of ws because below one ws a demand cache keeps nothing between
 * tokens (hit rate exactly 0), and 3/4 rather than 7/8 because 7/8 of 64 GB landed in
 * the measured 46-52 GB paging cliff of the reference engine (0.08 vs 0.88 tok/s).
 * Usable RAM (platform.c) honours every cgroup limit up to the root: sysconf reports the
 * host, and a 32 GiB cgroup on a 256 GiB host that planned from sysconf was killed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define DEFAULT_CTX 4096
#define DEFAULT_CHUNK 64
#define WPI_MAX_SEQUENCES 4096 /* states a context may hold */

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a + b < a ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

wp_status wpi_plan(const wpi_container *c, const wp_cfg *cfg, wpi_sizes_fn sizes,
                   wp_plan *out, char *err, size_t cap)
{
    if (!c || !cfg || !sizes || !out)
        return wpi_fail(err, cap, WP_E_ARG, "plan: NULL argument");
    memset(out, 0, sizeof(*out));
    const wpi_hparams *hp = &c->hp;
    uint32_t ctx = cfg->ctx_tokens;
    if (!ctx)
        ctx = hp->max_position_embeddings < DEFAULT_CTX ? hp->max_position_embeddings
                                                        : DEFAULT_CTX;
    uint32_t chunk = cfg->prefill_chunk ? cfg->prefill_chunk : DEFAULT_CHUNK;
    uint64_t rec = c->n_banks ? c->max_record_bytes : 0;
    uint64_t topk = c->n_banks ? hp->top_k : 0;

    if (cfg->max_sequences > WPI_MAX_SEQUENCES)
        return wpi_fail(err, cap, WP_E_ARG, "max_sequences %u is above the limit %u",
                        cfg->max_sequences, WPI_MAX_SEQUENCES);
    out->ctx_tokens = ctx;
    out->sequences = cfg->max_sequences ? cfg->max_sequences : 1;
    out->trunk_bytes = c->trunk_bytes;
    sizes(hp, ctx, chunk, out->state_bytes, &out->scratch_bytes, &out->sequence_bytes);
    for (int k = 0; k < WP_STATE_KINDS; k++) out->kv_bytes += out->state_bytes[k];
    out->record_bytes = rec;
    out->experts_total_bytes = c->experts_total_bytes;
    /* The cache's bookkeeping (slot table, map, usage counts) is part of the minimum:
     * sized for the largest cache this container can have, so no cache outgrows it. */
    uint64_t records = (uint64_t)c->n_banks * hp->n_experts;
    uint64_t most = records > 2 * topk ? records : 2 * topk;
    uint64_t meta = wpi_cache_meta_bytes(c, most > UINT32_MAX ? UINT32_MAX : (uint32_t)most);
    out->min_cache_bytes = sat_add(sat_mul(sat_mul(topk, rec), 2), meta);
    const uint64_t more = sat_mul(out->sequences - 1, out->sequence_bytes);
    out->vision_weight_bytes = c->vision_bytes;
    out->vision_reserve_bytes = c->vision_reserve_bytes;
    out->vision_bytes = cfg->vision && c->has_vision
                            ? sat_add(c->vision_bytes, c->vision_reserve_bytes) : 0;
    out->floor_bytes = sat_add(sat_add(sat_add(sat_add(sat_add(out->trunk_bytes, out->kv_bytes),
                                                       out->scratch_bytes),
                                               out->min_cache_bytes),
                                       more),
                               out->vision_bytes);
    out->working_set_bytes = sat_mul(sat_mul(topk, rec), c->n_banks);
    /* The most cache that can be useful: every record (never below the minimum). */
    uint64_t all = c->n_banks ? sat_add(c->experts_total_bytes, meta) : 0;
    uint64_t cache_cap = all > out->min_cache_bytes ? all : out->min_cache_bytes;
    uint64_t all_fit = sat_add(out->floor_bytes - out->min_cache_bytes, cache_cap);
    uint64_t rec3 = sat_add(out->floor_bytes, sat_mul(3, out->working_set_bytes));
    out->recommended_bytes = rec3 < all_fit ? rec3 : all_fit;
    out->usable_ram_bytes = wpi_usable_ram(cfg);

    wp_status st = WP_OK;
    if (cfg->budget_bytes) {
        out->budget_bytes = cfg->budget_bytes;
        out->budget_multiple = -1;
        if (cfg->budget_bytes < out->floor_bytes) {
            st = wpi_fail(err, cap, WP_E_BUDGET,
                          "budget %llu bytes (%.2f GiB) is below the floor %llu bytes "
                          "(%.2f GiB) for %u sequence%s: trunk %llu + kv %llu + scratch %llu "
                          "+ minimum expert cache %llu + %u more sequences x %llu",
                          (unsigned long long)cfg->budget_bytes, cfg->budget_bytes / GIB,
                          (unsigned long long)out->floor_bytes, out->floor_bytes / GIB,
                          out->sequences, out->sequences == 1 ? "" : "s",
                          (unsigned long long)out->trunk_bytes,
                          (unsigned long long)out->kv_bytes,
                          (unsigned long long)out->scratch_bytes,
                          (unsigned long long)out->min_cache_bytes, out->sequences - 1,
                          (unsigned long long)out->sequence_bytes);
        }
    } else {
        uint64_t cap_bytes = out->usable_ram_bytes / 4 * 3;
        out->budget_bytes = out->floor_bytes;
        out->budget_multiple = 0; /* runs at the floor: nothing more fits under 3/4 */
        for (int k = 3; k >= 1; k--) {
            uint64_t b = sat_add(out->floor_bytes, sat_mul((uint64_t)k, out->working_set_bytes));
            if (b > out->recommended_bytes)
                b = out->recommended_bytes;
            if (b <= cap_bytes) {
                out->budget_bytes = b;
                out->budget_multiple = k;
                break;
            }
        }
    }
    if (st == WP_OK) {
        uint64_t cache = sat_add(out->budget_bytes - out->floor_bytes, out->min_cache_bytes);
        out->cache_bytes = cache < cache_cap ? cache : cache_cap;
        if (!c->n_banks)
            out->cache_bytes = 0;
        out->cache_slots = wpi_cache_slots(c, out->cache_bytes);
    }
    return st;
}
