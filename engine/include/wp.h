/*
 * wp.h -- the whole public C API of the warp engine.
 *
 * The engine runs mixture-of-experts language models from a warp container (a directory,
 * see docs/FORMAT.md). The dense trunk is resident; routed experts are reached only
 * through a bounded expert cache filled by aligned reads from the expert banks.
 *
 * Contract for every function:
 *   - Errors are returned as wp_status, never printed. Nothing calls exit() or abort()
 *     on any input. wp_strerror(status) names the code; wp_error_detail(ctx) names the
 *     exact tensor, record or position and stays valid until the next call on that ctx.
 *   - A wp_ctx is not thread-safe: one thread at a time per context. Several contexts
 *     (models) may be open at once. The engine keeps no global mutable state except the
 *     kernel dispatch table, which is chosen once from the CPU's flags.
 *   - Caller-owned buffers come with their capacity; a short buffer returns WP_E_ARG.
 *   - Sizes are in bytes, counts in elements, times in seconds.
 */
#ifndef WP_H
#define WP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WP_VERSION_MAJOR 0
#define WP_VERSION_MINOR 1
#define WP_VERSION_PATCH 0
#define WP_FORMAT_VERSION 1

typedef enum wp_status {
    WP_OK = 0,
    WP_E_IO = -1,           /* missing file, short read, checksum mismatch */
    WP_E_FORMAT = -2,       /* malformed container or state file, wrong version */
    WP_E_BUDGET = -3,       /* RAM budget below the floor */
    WP_E_OOM = -4,          /* an allocation failed */
    WP_E_ARG = -5,          /* bad argument (NULL, out of range, short buffer) */
    WP_E_UNSUPPORTED = -6,  /* unknown model_type, dtype or feature */
    WP_E_CANCELLED = -7,    /* reserved for callbacks that ask to stop */
    WP_E_CONTEXT_FULL = -8, /* the tokens do not fit in the context */
    WP_E_STATE = -9         /* a state file from another model or shape */
} wp_status;

typedef enum wp_cache_policy {
    WP_CACHE_LFRU = 0, /* frequency-aware: evict the least-hit of sampled slots */
    WP_CACHE_LRU = 1   /* least recently used */
} wp_cache_policy;

typedef enum wp_isa {
    WP_ISA_AUTO = 0,   /* best the CPU supports */
    WP_ISA_SCALAR = 1, /* the portable reference kernels */
    WP_ISA_AVX2 = 2,   /* AVX2 + FMA */
    WP_ISA_AVX512 = 3, /* AVX-512 F/BW/VL (+VNNI where present) */
    WP_ISA_NEON = 4    /* AArch64 Advanced SIMD (every AArch64 CPU) */
} wp_isa;

/* Activation precision of the matmuls (wp_cfg.exact; docs/ENGINE.md). */
typedef enum wp_exact {
    WP_EXACT_AUTO = -1, /* 8-bit for evaluation steps of one token (decode) on the weight
                         * types whose 8-bit kernels are faster at one token on this CPU
                         * (all with VNNI, Q4_0 and MXFP4 with AVX2 alone); float32 for
                         * the rest and for longer steps (prefill) */
    WP_EXACT_X8 = 0,    /* 8-bit activations in every matmul against quantized weights */
    WP_EXACT_F32 = 1    /* float32 activations in every matmul */
} wp_exact;

/* Configuration. Always start from wp_cfg_init(): fields added later get sane defaults. */
typedef struct wp_cfg {
    uint64_t budget_bytes;      /* hard ceiling on engine memory; 0 = resolve automatically */
    uint32_t ctx_tokens;        /* context length; 0 = min(max_position_embeddings, 4096) */
    uint32_t n_threads;         /* compute threads; 0 = physical cores */
    uint32_t reader_threads;    /* expert reader threads; 0 = 4 */
    uint32_t prefill_chunk;     /* tokens per prefill chunk; 0 = 64 */
    int32_t cache_policy;       /* wp_cache_policy; default WP_CACHE_LFRU */
    int32_t direct_io;          /* 1 = O_DIRECT when the file system accepts it (default) */
    int32_t verify;             /* 1 = check each record's payload CRC32C on read (default 0) */
    int32_t lookahead;          /* 1 = prefetch layer L+1's likely experts (default 1) */
    int32_t isa;                /* wp_isa; default WP_ISA_AUTO */
    int32_t exact;              /* wp_exact: 1 = float32 activations in every matmul; 0 =
                                 * 8-bit activations (two int8 planes, about 16 bits)
                                 * against quantized weights; -1 = each step by its token
                                 * count (default WP_EXACT_AUTO; other values WP_E_ARG) */
    const char *hotlist_path;   /* usage counts to warm the cache at open; NULL = none */
    uint64_t usable_ram_bytes;  /* 0 = detect (physical RAM and cgroup limits) */
    const char *cgroup_root;    /* where cgroup files are read; NULL = "/sys/fs/cgroup" */
    const char *proc_root;      /* where /proc/self/cgroup is read; NULL = "/proc" */
    uint32_t max_sequences;     /* states allocated at open, at most 4096; 0 = 1 (wp_seq) */
    /* Benchmarks only: replay the experts of a recorded routing trace instead of the
     * router's choice (file format in docs/ENGINE.md); NULL = the model's own router.
     * The trace's top_k and expert count must be the model's (else WP_E_ARG). Sequence k
     * starts at trace token (route_trace_offset + k * stride) mod the trace's length and
     * advances by the tokens it evaluates; stride 0 = trace length / max_sequences. */
    const char *route_trace_path;
    uint64_t route_trace_offset; /* trace token read by sequence 0's first token */
    uint64_t route_trace_stride; /* trace tokens between consecutive sequences' starts */
    int32_t vision;             /* 1 = load the image tower (wp_encode_image; default 0) */
    /* Routed experts per token, 1..the model's top_k (else WP_E_ARG, naming the field);
     * 0 = as shipped. The router keeps the N highest-scoring experts and weights them as
     * the model's own routing weights its top_k (renormalized over the N exactly when it
     * renormalizes over the top_k), so the model runs as its top-N variant; the plan's
     * working set and the expert cache's minimum shrink with it. A route trace replayed
     * with it must have top_k N. deepseek_v4's hash-routed layers refuse it
     * (WP_E_UNSUPPORTED): their experts are a table per token id, not a ranking. */
    uint32_t experts_per_token;
} wp_cfg;

/* Fills every field with its default. Never fails. */
void wp_cfg_init(wp_cfg *cfg);

/* Memory plan of a container at a configuration, in bytes. */
/* The kinds of context state a plan itemizes (wp_plan.state_bytes). */
enum {
    WP_STATE_KV = 0,         /* K and V rows per position (full and sliding attention) */
    WP_STATE_MLA_LATENT = 1, /* MLA: one latent row (kv_lora_rank + rope_dim) per position */
    WP_STATE_RECURRENT = 2,  /* linear attention (KDA): recurrent state + conv window, fixed */
    WP_STATE_INDEXER = 3,    /* DSA indexer rows per position (glm5_next) */
    WP_STATE_WINDOW = 4,     /* deepseek_v4: every layer's sliding-window key ring */
    WP_STATE_CSA = 5,        /* deepseek_v4 CSA layers: compressor/indexer windows, entries */
    WP_STATE_HCA = 6,        /* deepseek_v4 HCA layers: compressor window, entries */
    WP_STATE_KINDS = 8       /* array length (room for one more kind) */
};

typedef struct wp_plan {
    uint64_t trunk_bytes;        /* resident tensors */
    uint64_t kv_bytes;           /* KV cache / recurrent state at ctx_tokens */
    uint64_t scratch_bytes;      /* activations, logits, chunk buffers */
    uint64_t min_cache_bytes;    /* smallest legal expert cache */
    uint64_t floor_bytes;        /* trunk + kv + scratch + min cache
                                    + (sequences - 1) * sequence_bytes */
    uint64_t working_set_bytes;  /* one token's expert traffic: top_k * record * moe layers */
    uint64_t recommended_bytes;  /* floor + 3 working sets, capped at all experts */
    uint64_t experts_total_bytes;/* every expert record of the container */
    uint64_t record_bytes;       /* largest expert record */
    uint64_t usable_ram_bytes;   /* min(physical RAM, cgroup limits) */
    uint64_t budget_bytes;       /* the budget that open would use */
    uint64_t cache_bytes;        /* expert cache that open would allocate */
    uint32_t ctx_tokens;         /* resolved context length */
    uint32_t cache_slots;        /* expert records the cache holds */
    int32_t budget_multiple;     /* k in floor + k*ws chosen by the resolver; -1 explicit */
    uint64_t state_bytes[WP_STATE_KINDS]; /* kv_bytes by WP_STATE_* kind; they sum to it */
    uint32_t sequences;          /* resolved max_sequences (>= 1) */
    uint64_t sequence_bytes;     /* one sequence: its state (kv_bytes) + its own scratch; the
                                    scratch (scratch_bytes) is shared by all sequences */
    uint64_t vision_weight_bytes;  /* the image tower's weights (0: no tower) */
    uint64_t vision_reserve_bytes; /* its work buffer for one image at the patch limit */
    uint64_t vision_bytes;       /* weights + reserve when cfg.vision, else 0 (in the floor) */
} wp_plan;

/* Plans memory without loading weights. err (may be NULL) receives a detail message.
 * Returns WP_OK, WP_E_IO, WP_E_FORMAT, WP_E_UNSUPPORTED, WP_E_BUDGET (an explicit budget
 * below the floor; the plan is still filled), WP_E_ARG. */
wp_status wp_plan_memory(const char *path, const wp_cfg *cfg, wp_plan *out,
                         char *err, size_t err_cap);

typedef struct wp_ctx wp_ctx;

/* Opens a container. On failure *out is NULL and err receives the detail.
 * Returns WP_OK, WP_E_IO, WP_E_FORMAT, WP_E_UNSUPPORTED, WP_E_BUDGET, WP_E_OOM, WP_E_ARG. */
wp_status wp_open(const char *path, const wp_cfg *cfg, wp_ctx **out, char *err, size_t err_cap);

/* Closes and frees everything. NULL is allowed. */
void wp_close(wp_ctx *ctx);

/* Static name of a status. */
const char *wp_strerror(wp_status status);

/* Detail of the last error on ctx ("" if none). Valid until the next call on ctx. */
const char *wp_error_detail(const wp_ctx *ctx);

typedef struct wp_info {
    char model_type[32];
    char isa[16];                /* kernel set in use: "scalar", "avx2", "avx512", "neon" */
    char x8_isa[16];             /* its 8-bit dot product: "scalar", "avx2", "avxvnni",
                                  * "avx512bw", "avx512vnni", "neon" */
    uint32_t x8_max_tokens;      /* wp_cfg.exact resolved: evaluation steps of at most this
                                  * many tokens (all sequences of a batch step together)
                                  * take the 8-bit path; 0 = none, UINT32_MAX = every one */
    char x8_dtypes[32];          /* for weights of these types, comma-separated ("q8_0",
                                  * "q4_0", "q4_1", "mxfp4"); "" where none */
    uint32_t vocab_size, hidden_size, n_layers, n_heads, n_kv_heads, head_dim;
    uint32_t n_experts, top_k, n_moe_layers;
    uint32_t ctx_tokens, max_position_embeddings, n_threads;
    uint64_t total_params, active_params;
    wp_plan plan;                /* the plan resolved at open */
} wp_info;

wp_status wp_get_info(const wp_ctx *ctx, wp_info *out);

/* Evaluates n tokens at the current position and advances it by n.
 * logits receives vocab_size floats for the last token, or n * vocab_size when
 * all_logits != 0 (row t for token t). logits may be NULL when logits_cap is 0 (prefill
 * only). Returns WP_OK, WP_E_ARG (token id out of range, short buffer),
 * WP_E_CONTEXT_FULL (position + n > ctx_tokens; nothing is evaluated), WP_E_IO (an
 * expert record failed to read or validate; the detail names layer and expert; the
 * position is left unchanged and the state must be reset or truncated), WP_E_OOM. */
wp_status wp_eval(wp_ctx *ctx, const int32_t *tokens, uint32_t n, int all_logits,
                  float *logits, size_t logits_cap);

/* Tokens evaluated so far. */
uint32_t wp_position(const wp_ctx *ctx);

/* Forgets the context (position 0). */
wp_status wp_state_reset(wp_ctx *ctx);

/* Keeps the first pos tokens of the context and drops the rest (pos <= position). */
wp_status wp_state_truncate(wp_ctx *ctx, uint32_t pos);

/* Saves the KV cache and position; the file records the model's shape. */
wp_status wp_state_save(wp_ctx *ctx, const char *path);

/* Loads a saved state. A state of another model or shape returns WP_E_STATE. */
wp_status wp_state_load(wp_ctx *ctx, const char *path);

/* ---- many sequences on one context --------------------------------------------------
 * A context holds cfg.max_sequences states, all allocated at open inside the budget.
 * Sequence 0 is the context's own (wp_eval, wp_state_*, wp_position); the others are
 * taken with wp_seq_open and given back with wp_seq_close. All of them share the trunk,
 * the expert cache, the scratch and the compute threads; like the context, a wp_seq is
 * used by one thread at a time, together with its context. */
typedef struct wp_seq wp_seq;

/* Takes a free sequence at position 0. WP_E_BUDGET ("all N sequences are in use") when
 * none is free; WP_E_ARG when ctx or out is NULL. */
wp_status wp_seq_open(wp_ctx *ctx, wp_seq **out);
/* Gives the sequence back (its state is forgotten). NULL is allowed. */
void wp_seq_close(wp_seq *seq);
uint32_t wp_seq_position(const wp_seq *seq);
/* As wp_state_reset / _truncate / _save / _load, on this sequence; the detail is its
 * context's (wp_error_detail). */
wp_status wp_seq_reset(wp_seq *seq);
wp_status wp_seq_truncate(wp_seq *seq, uint32_t pos);
wp_status wp_seq_save(wp_seq *seq, const char *path);
wp_status wp_seq_load(wp_seq *seq, const char *path);
/* dst's state and position become src's (both of one context; dst == src is a no-op). */
wp_status wp_seq_copy(wp_seq *dst, const wp_seq *src);

/* Evaluates several sequences together: sequence i (seqs[i], NULL meaning sequence 0)
 * evaluates its n_tokens[i] >= 1 tokens tokens[i] at its position and advances by them;
 * logits row i (vocab_size floats, n_seqs rows; logits may be NULL when logits_cap is 0)
 * receives the logits of sequence i's last token. Everything is validated before
 * anything is evaluated, so a bad input changes no sequence: WP_E_ARG (a NULL array,
 * n_seqs 0, a sequence of another context or not open, one given twice, n_tokens 0, a
 * token id out of range, a short buffer), WP_E_CONTEXT_FULL (a sequence's tokens do not
 * fit; the detail names it). Rows of all sequences go through each layer's FFN / MoE
 * together (the union of their experts is requested once, each expert multiplies all of
 * its rows in one pass); more rows than prefill_chunk are split into steps of at most
 * that many rows internally. WP_E_IO / WP_E_OOM as wp_eval: no position moves and the
 * states of the batch's sequences must be reset or truncated. */
wp_status wp_eval_batch(wp_ctx *ctx, wp_seq *const *seqs, const int32_t *const *tokens,
                        const uint32_t *n_tokens, uint32_t n_seqs, float *logits,
                        size_t logits_cap);

/* ---- images ------------------------------------------------------------------------
 * A container with an image tower (its manifest's "vision" object) opened with
 * cfg.vision = 1 encodes images: pixels are the model's image processor's pixel_values of
 * one image, [n_patches, patch_dim] floats (n_patches = t * h * w of grid_thw), and the
 * rows out [n_rows, hidden_size] are what the text model reads at the image's placeholder
 * tokens. *n_rows (may be NULL) receives the row count. WP_E_UNSUPPORTED: no tower in the
 * container or not opened with vision; WP_E_ARG: a grid the tower refuses, more patches
 * than its limit, patch_dim or a buffer of the wrong size; WP_E_OOM. */
wp_status wp_encode_image(wp_ctx *ctx, const float *pixels, uint32_t n_patches,
                          uint32_t patch_dim, const uint32_t grid_thw[3], float *out,
                          size_t out_cap, uint32_t *n_rows);
/* The placeholder token id of images (-1: the container has none). */
int32_t wp_placeholder_token(const wp_ctx *ctx);
/* Queues n rows of hidden_size floats on a sequence (wp_push_embeds: sequence 0). The next
 * placeholder tokens that sequence evaluates (wp_eval, wp_eval_batch, chunk by chunk) take
 * them in order, one row per placeholder, instead of their embedding. Evaluating more
 * placeholder tokens than are queued is WP_E_ARG with nothing evaluated; reset, truncate,
 * load and close of the sequence drop its queue. WP_E_UNSUPPORTED: no placeholder id. */
wp_status wp_push_embeds(wp_ctx *ctx, const float *rows, uint32_t n, uint32_t width);
wp_status wp_seq_push_embeds(wp_seq *seq, const float *rows, uint32_t n, uint32_t width);
/* Rows queued and not yet taken. */
uint32_t wp_pending_embeds(const wp_ctx *ctx);
uint32_t wp_seq_pending_embeds(const wp_seq *seq);

typedef struct wp_stats {
    uint64_t tokens;             /* tokens evaluated */
    uint64_t expert_lookups;     /* demand lookups = hits + misses */
    uint64_t expert_hits;
    uint64_t expert_misses;
    uint64_t prefetch_issued;    /* speculative reads started by the lookahead */
    uint64_t prefetch_hits;      /* demand lookups served by a speculative read */
    uint64_t prefetch_cancelled; /* speculative reads dropped before they started, because
                                    the router did not pick them (in prefetch_issued,
                                    not in bytes_read) */
    uint64_t bytes_read;         /* expert record bytes read (demand + speculative) */
    uint64_t other_bytes_read;   /* bytes read from the trunk file (every trunk tensor, at
                                    open); never expert records, which bytes_read counts */
    double read_seconds;         /* time waited on expert reads */
    double eval_seconds;         /* wall time inside wp_eval */
    uint64_t peak_bytes;         /* peak engine allocation */
    uint64_t cache_bytes;        /* expert cache size */
    uint32_t cache_slots;
    int32_t direct_io;           /* 1 when expert reads bypass the page cache */
} wp_stats;

/* Cumulative since open or the last wp_stats_reset. */
wp_status wp_get_stats(const wp_ctx *ctx, wp_stats *out);
void wp_stats_reset(wp_ctx *ctx);

/* Writes per-(layer, expert) usage counts, read back at open via cfg.hotlist_path. */
wp_status wp_hotlist_save(wp_ctx *ctx, const char *path);

const char *wp_version(void);
int wp_version_number(void); /* major * 10000 + minor * 100 + patch */

/* Kernel sets this CPU can run, as a bit mask of (1 << wp_isa). */
uint32_t wp_isa_supported(void);

#ifdef __cplusplus
}
#endif
#endif /* WP_H */
