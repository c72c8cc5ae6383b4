# Restates engine/include/wp.h for Cython; the C compiler checks it against the header.
from libc.stdint cimport int32_t, uint32_t, uint64_t

cdef extern from "wp.h" nogil:
    ctypedef enum wp_status:
        WP_OK
        WP_E_IO
        WP_E_FORMAT
        WP_E_BUDGET
        WP_E_OOM
        WP_E_ARG
        WP_E_UNSUPPORTED
        WP_E_CANCELLED
        WP_E_CONTEXT_FULL
        WP_E_STATE

    ctypedef struct wp_cfg:
        uint64_t budget_bytes
        uint32_t ctx_tokens
        uint32_t n_threads
        uint32_t reader_threads
        uint32_t prefill_chunk
        int32_t cache_policy
        int32_t direct_io
        int32_t verify
        int32_t lookahead
        int32_t isa
        int32_t exact
        const char *hotlist_path
        uint64_t usable_ram_bytes
        const char *cgroup_root
        const char *proc_root
        uint32_t max_sequences
        const char *route_trace_path
        uint64_t route_trace_offset
        uint64_t route_trace_stride
        int32_t vision
        uint32_t experts_per_token

    void wp_cfg_init(wp_cfg *cfg)

    ctypedef struct wp_plan:
        uint64_t trunk_bytes
        uint64_t kv_bytes
        uint64_t scratch_bytes
        uint64_t min_cache_bytes
        uint64_t floor_bytes
        uint64_t working_set_bytes
        uint64_t recommended_bytes
        uint64_t experts_total_bytes
        uint64_t record_bytes
        uint64_t usable_ram_bytes
        uint64_t budget_bytes
        uint64_t cache_bytes
        uint32_t ctx_tokens
        uint32_t cache_slots
        int32_t budget_multiple
        uint64_t state_bytes[8]
        uint32_t sequences
        uint64_t sequence_bytes
        uint64_t vision_weight_bytes
        uint64_t vision_reserve_bytes
        uint64_t vision_bytes

    enum:
        WP_STATE_KINDS

    wp_status wp_plan_memory(const char *path, const wp_cfg *cfg, wp_plan *out,
                             char *err, size_t err_cap)

    ctypedef struct wp_ctx:
        pass

    wp_status wp_open(const char *path, const wp_cfg *cfg, wp_ctx **out, char *err,
                      size_t err_cap)
    void wp_close(wp_ctx *ctx)
    const char *wp_strerror(wp_status status)
    const char *wp_error_detail(const wp_ctx *ctx)

    ctypedef struct wp_info:
        char model_type[32]
        char isa[16]
        char x8_isa[16]
        uint32_t x8_max_tokens
        char x8_dtypes[32]
        uint32_t vocab_size, hidden_size, n_layers, n_heads, n_kv_heads, head_dim
        uint32_t n_experts, top_k, n_moe_layers
        uint32_t ctx_tokens, max_position_embeddings, n_threads
        uint64_t total_params, active_params
        wp_plan plan

    wp_status wp_get_info(const wp_ctx *ctx, wp_info *out)
    wp_status wp_eval(wp_ctx *ctx, const int32_t *tokens, uint32_t n, int all_logits,
                      float *logits, size_t logits_cap)
    uint32_t wp_position(const wp_ctx *ctx)
    wp_status wp_state_reset(wp_ctx *ctx)
    wp_status wp_state_truncate(wp_ctx *ctx, uint32_t pos)
    wp_status wp_state_save(wp_ctx *ctx, const char *path)
    wp_status wp_state_load(wp_ctx *ctx, const char *path)

    ctypedef struct wp_seq:
        pass

    wp_status wp_seq_open(wp_ctx *ctx, wp_seq **out)
    void wp_seq_close(wp_seq *seq)
    uint32_t wp_seq_position(const wp_seq *seq)
    wp_status wp_seq_reset(wp_seq *seq)
    wp_status wp_seq_truncate(wp_seq *seq, uint32_t pos)
    wp_status wp_seq_save(wp_seq *seq, const char *path)
    wp_status wp_seq_load(wp_seq *seq, const char *path)
    wp_status wp_seq_copy(wp_seq *dst, const wp_seq *src)
    wp_status wp_encode_image(wp_ctx *ctx, const float *pixels, uint32_t n_patches,
                              uint32_t patch_dim, const uint32_t *grid_thw, float *out,
                              size_t out_cap, uint32_t *n_rows)
    int32_t wp_placeholder_token(const wp_ctx *ctx)
    wp_status wp_push_embeds(wp_ctx *ctx, const float *rows, uint32_t n, uint32_t width)
    wp_status wp_seq_push_embeds(wp_seq *seq, const float *rows, uint32_t n, uint32_t width)
    uint32_t wp_pending_embeds(const wp_ctx *ctx)
    uint32_t wp_seq_pending_embeds(const wp_seq *seq)
    wp_status wp_eval_batch(wp_ctx *ctx, wp_seq *const *seqs, const int32_t *const *tokens,
                            const uint32_t *n_tokens, uint32_t n_seqs, float *logits,
                            size_t logits_cap)

    ctypedef struct wp_stats:
        uint64_t tokens
        uint64_t expert_lookups
        uint64_t expert_hits
        uint64_t expert_misses
        uint64_t prefetch_issued
        uint64_t prefetch_hits
        uint64_t prefetch_cancelled
        uint64_t bytes_read
        uint64_t other_bytes_read
        double read_seconds
        double eval_seconds
        uint64_t peak_bytes
        uint64_t cache_bytes
        uint32_t cache_slots
        int32_t direct_io

    wp_status wp_get_stats(const wp_ctx *ctx, wp_stats *out)
    void wp_stats_reset(wp_ctx *ctx)
    wp_status wp_hotlist_save(wp_ctx *ctx, const char *path)
    const char *wp_version()
    int wp_version_number()
    uint32_t wp_isa_supported()
