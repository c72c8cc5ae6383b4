/*
 * route_trace.h -- benchmark-only routing replay (route_trace.c): the MoE blocks take
 * each token's experts from a recorded trace of a trained model instead of their own
 * router, so cache hit rates and bytes per token show a trained router's locality.
 *
 * File (little-endian, written by warp_providers.route_trace from the JSONL traces):
 *   "WPRT"  u32 version (1)  u32 n_tokens  u32 n_layers  u32 top_k  u32 n_experts
 *   u16 ids[n_tokens][n_layers][top_k]        each < n_experts; nothing after them
 * Token i of a sequence's evaluation order reads trace token (start + i) % n_tokens,
 * start = its cursor at open (core.c: offset + k * stride for sequence k); in a batched
 * step each row reads its own sequence's cursor (wpi_model.trace_rows, forward.c).
 * MoE layer j (the j-th layer with experts) reads trace layer j % n_layers.
 */
#ifndef WPI_ROUTE_TRACE_H
#define WPI_ROUTE_TRACE_H

#include "model.h"

#define WPI_TRACE_MAGIC "WPRT"
#define WPI_TRACE_HEADER_BYTES 24
#define WPI_TRACE_MAX_TOKENS (1u << 24)

struct wpi_route_trace {
    uint32_t n_tokens, n_layers, top_k, n_experts;
    uint16_t *ids;                          /* [n_tokens][n_layers][top_k] */
    int32_t moe_of_layer[WPI_MAX_LAYERS];   /* model layer -> MoE layer index, -1 dense */
};

/* Reads and validates a trace for container c: WP_E_IO (unreadable), WP_E_FORMAT (damaged:
 * the detail names the field), WP_E_ARG (top_k or expert count differ from the model's,
 * naming both), WP_E_OOM. The ids are counted in mem. */
wp_status wpi_route_trace_load(const char *path, const wpi_container *c, wpi_mem *mem,
                               wpi_route_trace **out, char *err, size_t cap);
void wpi_route_trace_free(wpi_route_trace *t, wpi_mem *mem);

/* Writes the trace's top_k experts of the chunk's token t at model layer l into ids
 * (m->trace must be set; l must be a MoE layer). */
void wpi_route_trace_ids(const wpi_model *m, uint32_t l, uint32_t t, int32_t *ids);

#endif /* WPI_ROUTE_TRACE_H */
