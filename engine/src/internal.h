/*
 * internal.h -- the engine's private interfaces between its modules.
 *
 *   container.c  manifest.json (json.c) -> wpi_container: hparams, trunk index, banks
 *   experts/     plan.c (memory plan, usable RAM), cache.c (slots, policy, pins),
 *                reader.c (aligned pread, O_DIRECT probe, header + CRC32C validation)
 *   core.c       wp_open/wp_eval/...: glue; arch/ + blocks/ compute the forward pass
 *   kernels/     numeric kernels with ISA dispatch (kernels.h)
 *   platform.c   all that differs between operating systems (platform.h)
 *
 * Architecture code reaches experts only through wpi_experts_* and never touches a file.
 * Nothing here is exported: every non-static symbol is prefixed wpi_.
 */
#ifndef WP_INTERNAL_H
#define WP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "wp.h"
#include "kernels/kernels.h"
#include "platform.h"

#define WPI_MAX_LAYERS 1024
#define WPI_MAX_EOS 16
#define WPI_RECORD_HEADER_BYTES 64
#define WPI_DISK_ALIGN 4096      /* O_DIRECT offset and length alignment */
#define WPI_BUF_ALIGN 4096       /* alignment of read buffers */
#define WPI_ERR_CAP 512

/* ---- util.c -------------------------------------------------------------------- */

/* Formats an error message into err (may be NULL) and returns status. */
wp_status wpi_fail(char *err, size_t cap, wp_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Returns from the enclosing function with expr's status unless it is WP_OK. */
#define TRY(expr)                          \
    do {                                   \
        wp_status st_ = (expr);            \
        if (st_ != WP_OK) return st_;      \
    } while (0)

/* CRC32C (Castagnoli); the SSE4.2 or AArch64 CRC32 instruction when present, table
 * otherwise. */
uint32_t wpi_crc32c(uint32_t crc, const void *data, size_t n);

/* Memory accounting of one context: every engine allocation goes through it. */
typedef struct wpi_mem {
    uint64_t current;
    uint64_t peak;
} wpi_mem;

void *wpi_alloc(wpi_mem *m, size_t align, size_t bytes); /* zeroed; NULL on failure */
void wpi_free(wpi_mem *m, void *p, size_t bytes);

double wpi_now(void); /* monotonic seconds */

/* Tests only: 0 forces the portable CRC32C table, 1 restores the automatic choice.
 * Returns 1 when a CRC32C instruction (SSE4.2, AArch64 CRC32) is in use afterwards. */
int wpi_crc32c_use_hw(int allow);

/* ---- container.c --------------------------------------------------------------- */

enum { WPI_QK_NONE = 0, WPI_QK_HEAD = 1, WPI_QK_FULL = 2 };

/* Normalized hyperparameters (docs/FORMAT.md section 3). */
typedef struct wpi_hparams {
    char model_type[32];
    uint32_t vocab_size, hidden_size, n_layers;
    uint32_t n_heads, n_kv_heads, head_dim;
    uint32_t intermediate_size, moe_intermediate_size;
    uint32_t n_experts, top_k;
    uint32_t shared_expert_intermediate_size;
    int32_t shared_expert_gate;             /* bool */
    int32_t norm_topk_prob;                 /* bool */
    uint8_t layer_is_moe[WPI_MAX_LAYERS];   /* [n_layers] */
    float rms_norm_eps;
    uint32_t rope_dim;
    float rope_theta, rope_attn_factor;
    int32_t qk_norm;                        /* WPI_QK_* */
    float attn_scale;
    uint32_t max_position_embeddings;
    int32_t tie_word_embeddings;            /* bool */
    int32_t bos_token_id;                   /* -1 if none */
    uint32_t n_eos;
    int32_t eos_token_ids[WPI_MAX_EOS];
    float clip_qkv;                         /* clamp q, k, v to +-clip_qkv; 0 = none */
    /* Optional keys (hparams_ext.c), zero when absent. attn_kinds gives layer_attn. */
    uint32_t sliding_window;                /* keys a WPI_ATTN_SLIDING layer sees, incl. its own */
    uint8_t layer_attn[WPI_MAX_LAYERS];     /* WPI_ATTN_* per layer */
    float swiglu_alpha, swiglu_limit;       /* gpt_oss clamped SwiGLU of the experts */
    uint32_t kda_heads, kda_head_dim, kda_conv; /* kimi_linear KDA layers */
    /* Multi-head latent attention (hparams_mla.c, blocks/mla.c) when kv_lora_rank > 0:
     * head_dim is the q/k head width qk_nope_head_dim + rope_dim; the KV cache holds per
     * token and layer the latent (kv_lora_rank normed + rope_dim rotated key floats). */
    uint32_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, v_head_dim;
    int32_t rope_interleave;                /* bool: rope pairs (2i, 2i+1) (GPT-J) */
    /* Routing (blocks/route_noaux.c): scores, group-limited selection on scores plus the
     * layer's exp_probs_b bias, weights from the unbiased scores. */
    int32_t scoring;                        /* WPI_SCORE_*; softmax when absent */
    uint32_t n_group, topk_group;           /* 0 or 1 group: no group limit */
    float routed_scaling_factor;            /* multiplies the routed weights; 1 when absent */
    /* hyper-connections (blocks/hyper.c; deepseek_v4 and glm5_next), 0 when absent:
     * hc_mult > 0 makes the residual hc_mult streams */
    uint32_t hc_mult, hc_sinkhorn_iters;
    float hc_eps;
    uint32_t index_heads, index_head_dim, index_topk; /* indexer: CSA (v4) or DSA (glm5) */
    /* deepseek_v4 (hparams_dsv4.c, blocks/attention_csa.c, blocks/moe_v4.c); 0 when absent */
    uint32_t o_groups, o_lora_rank;         /* grouped output projection */
    uint32_t compress_rate_csa, compress_rate_hca;
    uint8_t layer_compress[WPI_MAX_LAYERS]; /* WPI_CMP_* per layer */
    uint8_t layer_hash[WPI_MAX_LAYERS];     /* 1: experts chosen by token id (hash routing) */
    uint8_t v4_state;                       /* 1: deepseek_v4's per-layer state blocks */
    /* glm5_next (hparams_glm5.c), zero when absent: the KDA forget gate with a lower bound,
     * the eps of the MLA lora norms, and the DSA indexer (blocks/dsa.c) of the MLA layers,
     * per layer WPI_INDEX_*. */
    int32_t kda_safe_gate;                  /* bool: g = kda_lower_bound * sigmoid(...) */
    float kda_lower_bound;
    float lora_norm_eps;                    /* 0: 1e-6 */
    uint32_t index_kpool;
    int32_t index_tail;                     /* bool: the incomplete pool is always attended */
    uint8_t layer_index[WPI_MAX_LAYERS];    /* WPI_INDEX_* per layer */
} wpi_hparams;

enum { WPI_SCORE_SOFTMAX = 0, WPI_SCORE_SIGMOID = 1, WPI_SCORE_SQRTSOFTPLUS = 2 };
enum { WPI_CMP_NONE = 0, WPI_CMP_CSA = 1, WPI_CMP_HCA = 2 };
enum { WPI_INDEX_NONE = 0, WPI_INDEX_FULL = 1, WPI_INDEX_SHARED = 2 };

enum { WPI_ATTN_FULL = 0, WPI_ATTN_SLIDING = 1, WPI_ATTN_KDA = 2 };

/* A trunk tensor. shape[0] = rows (or length of a vector), shape[1] = cols (1 for a vector). */
typedef struct wpi_tensor {
    char *name;
    int32_t dtype;
    uint32_t n_dims;        /* 1 or 2 */
    uint64_t shape[2];
    uint64_t offset;        /* in trunk.bin */
    uint64_t bytes;
    uint32_t crc32c;
    void *data;             /* resident copy after wpi_container_load_trunk, else NULL */
} wpi_tensor;

/* One MoE layer's expert bank (experts-L{layer}.bin). */
typedef struct wpi_bank {
    uint32_t layer;
    char *path;
    uint32_t n_experts;
    uint64_t record_bytes;  /* multiple of WPI_DISK_ALIGN */
    int32_t dtype;          /* of gate, up and down */
    uint32_t inter;         /* gate/up rows, down cols */
    uint32_t hidden;        /* gate/up cols, down rows */
    uint64_t gate_offset, up_offset, down_offset; /* from the record start */
    uint64_t payload_bytes; /* end of down - WPI_RECORD_HEADER_BYTES */
} wpi_bank;

typedef struct wpi_container {
    char *dir;
    wpi_hparams hp;
    wpi_tensor *tensors;
    uint32_t n_tensors;
    char *trunk_path;
    uint64_t trunk_bytes;         /* sum of tensor bytes */
    uint64_t bytes_read;          /* trunk bytes read from disk so far (not expert records) */
    wpi_bank *banks;
    uint32_t n_banks;
    int32_t bank_of_layer[WPI_MAX_LAYERS]; /* index into banks, -1 for a dense layer */
    uint64_t experts_total_bytes;
    uint64_t max_record_bytes;
} wpi_container;

/* Parses and validates manifest.json and the sizes of every file it names. Loads no
 * tensor data. Errors: WP_E_IO (missing/unreadable file), WP_E_FORMAT (anything
 * malformed; err names the key, tensor or file). */
wp_status wpi_container_open(const char *dir, wpi_container **out, char *err, size_t cap);

/* Reads every trunk tensor into memory accounted to m, tensor by tensor with pread,
 * checking each CRC32C, and adds the bytes read to c->bytes_read. Errors: WP_E_IO, WP_E_FORMAT (CRC mismatch names the tensor), OOM. */
wp_status wpi_container_load_trunk(wpi_container *c, wpi_mem *m, char *err, size_t cap);

struct wpi_json;

/* container.c: the bounds every architecture's hparams share (one table, also applied
 * while the manifest is read) and the relations between them: heads vs kv heads, rope_dim
 * vs head_dim, top_k vs n_experts, layer kinds vs FFN sizes, token ids vs vocab_size.
 * WP_E_FORMAT with a detail naming the key. */
wp_status wpi_hparams_check(const wpi_hparams *hp, char *err, size_t cap);
/* hparams_ext.c: an optional key of the hparams object (absent or null: 0, OK): an
 * integer in [lo, hi], or a number in [lo, hi] (*present, when not NULL, says whether it
 * was given). Anything else is WP_E_FORMAT naming the key. */
wp_status wpi_hparam_u32(const struct wpi_json *h, const char *key, uint32_t lo, uint32_t hi,
                         uint32_t *out, char *err, size_t cap);
wp_status wpi_hparam_num(const struct wpi_json *h, const char *key, double lo, double hi,
                         float *out, int *present, char *err, size_t cap);
/* hparams_ext.c: the optional hparams keys (sliding_window, attn_kinds, swiglu_*, kda_*)
 * of the object h into hp, after the required ones. WP_E_FORMAT naming the key. */
wp_status wpi_hparams_ext(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap);
/* hparams_mla.c: the optional MLA and routing keys (q_lora_rank, kv_lora_rank,
 * qk_nope_head_dim, v_head_dim, rope_interleave, scoring_func, n_group, topk_group,
 * routed_scaling_factor); called by wpi_hparams_ext. */
wp_status wpi_hparams_mla(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap);
/* hparams_dsv4.c: the optional deepseek_v4 keys (hc_*, o_groups, o_lora_rank, index_*,
 * compress_rate_csa/hca, compress_kinds, hash_layers); called by wpi_hparams_ext. */
wp_status wpi_hparams_dsv4(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap);
/* hparams_glm5.c: the optional glm5_next keys (hc_mult, hc_sinkhorn_iters, hc_eps,
 * kda_lower_bound, lora_norm_eps, index_*, index_kinds); called by wpi_hparams_ext. */
wp_status wpi_hparams_glm5(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap);

/* The tensor of that name, or NULL. */
const wpi_tensor *wpi_container_tensor(const wpi_container *c, const char *name);

void wpi_container_close(wpi_container *c, wpi_mem *m);

/* ---- experts/ -------------------------------------------------------------------- */

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

/* Unpins everything pinned by requests since the last release. */
void wpi_experts_release(wpi_experts *x);

/* Speculative reads (lookahead); never pinned, never counted as lookups. */
void wpi_experts_prefetch(wpi_experts *x, uint32_t layer, const int32_t *ids, uint32_t n);

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

/* plan.c: the memory plan (see wp_plan), also used by wp_open to resolve the budget. */
wp_status wpi_plan(const wpi_container *c, const wp_cfg *cfg, wp_plan *out,
                   char *err, size_t cap);

/* Usable RAM: wpi_usable_ram (platform.h). */

/* ---- forward (core.c, forward.c, pool.c, blocks/, arch/) --------------------- */

/* Bytes of the KV cache at ctx tokens, and of the scratch buffers for chunks of
 * `chunk` tokens at ctx tokens. plan.c uses exactly what the forward allocates
 * (chunk = cfg->prefill_chunk, 0 meaning 64). */
uint64_t wpi_kv_bytes(const wpi_hparams *hp, uint32_t ctx);
/* The same bytes by WP_STATE_* kind (they sum to wpi_kv_bytes). */
void wpi_state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS]);
uint64_t wpi_scratch_bytes(const wpi_hparams *hp, uint32_t chunk, uint32_t ctx);

typedef struct wpi_arch wpi_arch;

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

/* A weight matrix [rows, cols] in dtype layout (a trunk tensor or an expert matrix). */
typedef struct wpi_wmat {
    const void *data;
    int32_t dtype;
    uint32_t rows, cols;
} wpi_wmat;

/* Trunk tensors of one layer, bound by name; NULL when absent. */
typedef struct wpi_layer {
    const float *attn_norm, *ffn_norm;            /* [hidden] */
    wpi_wmat wq, wk, wv, wo;                      /* see docs/FORMAT.md section 4 */
    const float *bq, *bk, *bv, *bo;               /* biases or NULL */
    const float *q_norm, *k_norm;                 /* [head_dim] or full width, or NULL */
    wpi_wmat ffn_gate, ffn_up, ffn_down;          /* dense layers */
    const float *ffn_gate_b, *ffn_up_b, *ffn_down_b; /* their biases (mlp_bias) or NULL */
    const float *router;                          /* [n_experts, hidden], MoE layers */
    wpi_wmat sh_gate, sh_up, sh_down;             /* shared expert (data NULL if none) */
    const float *sh_gate_inp;                     /* [hidden] or NULL */
    uint8_t is_moe;
    /* gpt_oss (NULL otherwise) */
    const float *sinks;                           /* attn_sinks [n_heads] */
    const float *router_b;                        /* ffn_gate_inp.bias [n_experts] */
    const float *exp_gate_b, *exp_up_b, *exp_down_b; /* ffn_*_exps.bias [n_experts, I|H] */
    /* MLA (blocks/mla.c): q = q_b(rmsnorm(q_a x)) or wq x; latent = kv_a x; kv_b up. */
    wpi_wmat wq_a, wq_b, wkv_a, wkv_b;
    const float *q_a_norm, *kv_a_norm;            /* [q_lora_rank], [kv_lora_rank] */
    const float *bq_a, *bkv_a;                    /* biases or NULL */
    const float *exp_bias;                        /* exp_probs_b [n_experts] or NULL */
    /* kimi_linear KDA layers (blocks/kda.c); q/k/v/o are wq, wk, wv, wo [D, hidden] */
    wpi_wmat kda_f_a, kda_f_b, kda_b, kda_g_a, kda_g_b;
    const float *kda_conv;                        /* [3D, kda_conv] depthwise, f32 */
    const float *kda_dt_bias, *kda_a_log, *kda_o_norm; /* [D], [kda_heads], [kda_head_dim] */
    /* hyper-connections (blocks/hyper.c; deepseek_v4, glm5_next) around attention and FFN,
     * f32: fn [(2+hc)*hc, hc*hidden], base [(2+hc)*hc], scale [3] */
    const float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    const float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    /* the indexer: glm5_next's DSA (blocks/dsa.c) of a WPI_INDEX_FULL layer, deepseek_v4's
     * CSA lightning indexer (blocks/attention_csa.c) */
    wpi_wmat idx_q;                               /* [index_heads*index_head_dim, q_lora_rank] */
    wpi_wmat idx_w;                               /* [index_heads, hidden] */
    wpi_wmat idx_gate;                            /* glm5 [ihd, H]; v4 [2ihd, H] */
    wpi_wmat idx_k;                               /* glm5: [index_head_dim, hidden] */
    const float *idx_k_norm, *idx_k_norm_b;       /* glm5: LayerNorm [index_head_dim] */
    const float *idx_ape;                         /* glm5: [index_kpool, index_head_dim] */
    uint32_t kv_slot;             /* this layer's block of the KV cache (or of kda_state) */
    /* deepseek_v4 (blocks/attention_csa.c, blocks/moe_v4.c); q is wq_a, q_a_norm, wq_b */
    wpi_wmat wkv, wo_a, wo_b;                     /* kv [hd, H], o_a [g*r, nh*hd/g], o_b */
    const float *kv_norm;                         /* [head_dim] */
    wpi_wmat cmp_kv, cmp_gate;                    /* compressor [w, H], w = hd (HCA), 2hd (CSA) */
    const float *cmp_bias, *cmp_norm;             /* [rate, w], [head_dim] */
    wpi_wmat idx_kv;                              /* indexer compressor kv [2ihd, H] */
    const float *idx_bias, *idx_norm;             /* [rate, 2ihd], [ihd] */
    const float *hash_ids;                        /* [vocab, top_k] expert ids as f32, or NULL */
    float *cstate;                                /* this layer's state block (attention_csa.c) */
    uint32_t idx_slot;            /* this layer's block of idx_cache (WPI_INDEX_FULL) */
} wpi_layer;

/* Everything the forward pass reads and writes. Buffers are carved from one scratch
 * allocation of wpi_scratch_bytes and one KV allocation of wpi_kv_bytes. */
typedef struct wpi_model {
    const wpi_hparams *hp;
    const wpi_kernels *k;
    wpi_pool *pool;
    wpi_experts *experts;
    uint32_t ctx, chunk;         /* context length, tokens per chunk */
    int lookahead;               /* decode-time prefetch of the next layer's experts */
    const wpi_wmat *lm_head;     /* output.weight or token_embd.weight */
    wpi_wmat tok_embd, output;
    const float *out_norm;       /* [hidden] */
    const float *rope_freqs;     /* [rope_dim/2] inverse frequencies */
    wpi_layer *layers;           /* [n_layers] */
    float *kcache, *vcache;      /* [n_layers][ctx][n_kv_heads*head_dim] */
    /* scratch, per chunk of C tokens */
    float *x;                    /* [C, hidden] residual stream */
    float *xn;                   /* [C, hidden] normed input of a block */
    float *q;                    /* [C, n_heads*head_dim] */
    float *att;                  /* [C, n_heads*head_dim] attention output */
    float *rope_cos, *rope_sin;  /* [C, rope_dim/2] at the chunk's positions */
    float *ff_g, *ff_u;          /* [C, max ffn width] gate and up / hidden */
    float *moe_out;              /* [C, hidden] routed + shared expert sum */
    float *probs;                /* [C, n_experts] router softmax */
    int32_t *topk_id;            /* [C, top_k] router order */
    float *topk_w;               /* [C, top_k] */
    float *eo;                   /* [C, top_k, hidden] one expert output per choice */
    float *xg, *yg;              /* [C, hidden] tokens gathered for one expert */
    int32_t *ex_ids;             /* [n_experts] distinct experts of a chunk */
    int32_t *ex_start;           /* [n_experts + 1] */
    int32_t *ex_pick;            /* [C * top_k] (token * top_k + slot) grouped by expert */
    int32_t *ex_slot;            /* [n_experts] expert -> index in ex_ids, -1 */
    float *sh_w;                 /* [C] shared expert gate */
    float *la_probs;             /* [n_experts] lookahead router */
    int32_t *la_ids;             /* [top_k] */
    float *la_w;                 /* [top_k] */
    float *route_tmp;            /* [2 * n_experts] grouped selection (route_noaux.c) */
    float *mla_qa;               /* [C, q_lora_rank] */
    float *mla_q;                /* [C, n_heads, kv_lora_rank + rope_dim] absorbed query */
    float *mla_o;                /* [C, n_heads, kv_lora_rank] latent attention output */
    float *kda_buf;              /* wpi_kda_scratch_floats (kda.c) */
    float *kda_state;            /* [kda layers][wpi_kda_state_floats], after the KV rows */
    const int32_t *tokens;       /* token ids of the chunk being evaluated (hash routing) */
    float *v4_buf;               /* wpi_v4_scratch_floats (deepseek_v4) */
    const float *rope_freqs_c;   /* [rope_dim/2] compressed-branch frequencies, or NULL */
    const float *hc_head_fn, *hc_head_base, *hc_head_scale; /* final hyper head */
    float *hc_x;                 /* [C, hc_mult, hidden] hyper-connection streams */
    float *hc_post, *hc_comb;    /* [C, hc_mult], [C, hc_mult, hc_mult] */
    float *hc_scr;               /* wpi_hc_scratch_floats(C) */
    float *idx_q;                /* [C, index_heads * index_head_dim] indexer queries */
    float *idx_wt;               /* [C, index_heads] indexer head weights */
    int32_t *idx_sel;            /* [C, index_topk / index_kpool] selected pools, ascending */
    int32_t *idx_nsel;           /* [C] */
    float *idx_cache;            /* [indexer layers][ctx][wpi_dsa_row_floats], after kda_state */
    char *err;                   /* detail of the last error */
    size_t err_cap;
} wpi_model;

/* forward.c: binds tensors and carves buffers (kv and scratch as sized above). */
wp_status wpi_model_init(wpi_model *mdl, const wpi_container *c, void *kv, void *scratch,
                         uint32_t ctx, uint32_t chunk);
/* Evaluates tokens[0..n) (n <= chunk) at positions pos..pos+n. logits (may be NULL)
 * receives vocab floats per token for all n tokens when all_logits, else for the last. */
wp_status wpi_model_forward(wpi_model *mdl, const wpi_arch *arch,
                            const int32_t *tokens, uint32_t n, uint32_t pos,
                            float *logits, int all_logits);

/* y[t*ldy + r] = W x_t for rows r0..r1 of several matrices sharing one input, split by
 * row blocks across the pool (inline when small). */
typedef struct wpi_mm {
    const wpi_wmat *w;
    float *y;
    size_t ldy;
} wpi_mm;
void wpi_matmul(wpi_model *mdl, const wpi_mm *jobs, uint32_t n_jobs,
                const float *x, size_t ldx, uint32_t n_tok);

/* Tensor checks for arch check functions: err names the tensor. A matrix must have a
 * dtype with a matmul kernel; a vector must be f32. */
wp_status wpi_need_matrix(const wpi_container *c, const char *name, uint64_t rows,
                          uint64_t cols, char *err, size_t cap);
wp_status wpi_need_vector(const wpi_container *c, const char *name, uint64_t n,
                          char *err, size_t cap);
/* The same when present; absent is fine. */
wp_status wpi_opt_vector(const wpi_container *c, const char *name, uint64_t n,
                         char *err, size_t cap);
/* Checks what every decoder shares: embeddings, norms, rope, q/k/v/o (+ biases present),
 * qk norms per hparams, dense FFN or router + expert bank per layer, shared expert. */
wp_status wpi_check_decoder(const wpi_container *c, char *err, size_t cap);
/* Checks layer l's expert bank: present, n_experts x [moe_intermediate_size, hidden_size],
 * a dtype the kernels read. */
wp_status wpi_check_expert_bank(const wpi_container *c, uint32_t l, char *err, size_t cap);

/* blocks/: one block of a layer over a chunk of n tokens at positions pos..pos+n. Each
 * reads x, writes the residual sum back into x. */
/* attention.c: the online softmax of one query over cached keys [lo, end) (rows kvd
 * apart), in fixed blocks so thread count never changes a result: out = the
 * unnormalized sum of exp(score - *mx) v; returns the sum of those weights. */
float wpi_attend_keys(const wpi_model *m, const float *q, const float *kc, const float *vc,
                      size_t kvd, uint32_t lo, uint32_t end, float *out, float *mx);
/* The two halves every attention variant shares: attn_norm, q/k/v projections into the
 * KV cache at pos (biases, q/k norm, clip, rope) -- and the output projection (+ bias)
 * added to the residual stream. */
void wpi_attention_project(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
void wpi_attention_output(wpi_model *mdl, uint32_t layer, uint32_t n);
void wpi_attention_block(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
void wpi_ffn_block(wpi_model *mdl, uint32_t layer, uint32_t n);
/* The distinct experts of a chunk's top-k picks, in order of first use (token-major,
 * router order), into m->ex_ids; for each, the picks (token * top_k + slot) that chose
 * it in m->ex_pick[m->ex_start[s] .. m->ex_start[s + 1]). Returns how many. */
uint32_t wpi_moe_distinct_experts(wpi_model *mdl, uint32_t n);
wp_status wpi_moe_block(wpi_model *mdl, uint32_t layer, uint32_t n);
/* Runs every distinct expert of the chunk (wpi_moe_distinct_experts) through
 * fn(arg, mdl, view, expert, rows, cnt, out) in groups the cache can pin: the rows of xs
 * that picked it are gathered into cnt rows (at most mdl->chunk per call: a hash row may
 * pick one expert twice), and fn's out rows are scattered to m->eo at each pick. The
 * shared driver of the MoE blocks with their own expert FFN. */
typedef void (*wpi_expert_apply_fn)(void *arg, wpi_model *mdl, const wpi_expert_view *v,
                                    int32_t expert, const float *rows, uint32_t cnt,
                                    float *out);
wp_status wpi_moe_for_each_expert(wpi_model *mdl, uint32_t layer, const float *xs,
                                  uint32_t nd, wpi_expert_apply_fn fn, void *arg);
/* A layer of the llama-shaped MoE families (qwen2_moe, qwen3_moe, mixtral, olmoe,
 * glm4_moe): wpi_attention_block, then wpi_moe_block on MoE layers and wpi_ffn_block on
 * dense ones; the arch's hparams decide routing, shared expert and qk norm. */
wp_status wpi_moe_decoder_layer(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
/* attention_sw.c: attention with per-head sinks (layer's attn_sinks, if any) over keys
 * p-window+1..p of each position p (window 0: all); biases, RoPE, no qk norm. */
void wpi_attention_sw_block(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos,
                            uint32_t window);
/* moe_oss.c: gpt_oss MoE (router bias, top-k softmax, biased clamped-SwiGLU experts). */
wp_status wpi_moe_oss_block(wpi_model *mdl, uint32_t layer, uint32_t n);
/* out[t] = down(silu(gate x_t) * up x_t) for m tokens (ffn.c). */
void wpi_swiglu(wpi_model *mdl, const wpi_wmat *gate, const wpi_wmat *up,
                const wpi_wmat *down, const float *x, size_t ldx, uint32_t m,
                float *out, size_t ldo);
/* The clamp of wpi_swiglu's gate (at most) and up (both signs), 0 for none (ffn.c). */
float wpi_swiglu_clamp(const wpi_hparams *hp);
/* Rope cos/sin of the chunk's positions into mdl->rope_cos/sin (attention.c). */
void wpi_rope_prepare(wpi_model *mdl, uint32_t n, uint32_t pos);
/* Rotates the first rope_dim dims of n_heads heads of head_dim (HF rotate_half). */
void wpi_rope_apply(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                    const float *cos, const float *sin);
/* Router top-k of probs[n] (ties to the lower id), in descending order (moe.c). */
void wpi_topk(const float *probs, uint32_t n, uint32_t k, int32_t *ids, float *w);
/* kda.c: Kimi Delta Attention block (recurrent state zeroed at pos 0); its state floats
 * per KDA layer; the number of KDA layers; its scratch floats for chunks of `chunk`. */
void wpi_kda_block(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
uint64_t wpi_kda_state_floats(const wpi_hparams *hp);
uint32_t wpi_kda_layers(const wpi_hparams *hp);
uint64_t wpi_kda_scratch_floats(const wpi_hparams *hp, uint32_t chunk);
/* Checks a KDA layer's tensors (q/k/v/o, gates, conv, dt_bias, a_log, o_norm) and shapes. */
wp_status wpi_kda_check_layer(const wpi_container *c, uint32_t l, char *err, size_t cap);
/* Multi-head latent attention over the latent KV cache, absorbed up-projections (mla.c). */
void wpi_mla_block(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
/* Its two halves: attn_norm, q (q_a rmsnorm'd into mla_qa, then q), the latent row into the
 * cache -- and the attention plus output projection, into xn and added to x. sparse: each
 * token attends only to the pools in idx_sel / idx_nsel and its incomplete pool (dsa.c). */
void wpi_mla_project(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
void wpi_mla_attend(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos, int sparse);
/* dsa.c: the DSA indexer of a WPI_INDEX_FULL layer, after wpi_mla_project (reads xn and
 * mla_qa): caches the chunk's indexer rows, completes pool keys, selects each token's
 * pools into idx_sel / idx_nsel. Rows per indexer layer and token; indexer layers. */
void wpi_dsa_index(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
uint64_t wpi_dsa_row_floats(const wpi_hparams *hp);
uint32_t wpi_dsa_layers(const wpi_hparams *hp);
/* Rotates rope_dim dims of n_heads heads, head_dim apart, in GPT-J pairs (2i, 2i+1). */
void wpi_rope_apply_interleaved(float *v, uint32_t n_heads, uint32_t head_dim,
                                uint32_t rope_dim, const float *cos, const float *sin);
/* route_noaux.c: 1 when hparams or the layer need wpi_route_noaux instead of plain top-k. */
int wpi_route_noaux_used(const wpi_hparams *hp, const wpi_layer *L);
/* Selection of top_k experts from scores[n_experts] (sigmoid or softmax, unbiased):
 * choice = scores + bias (bias may be NULL); with n_group > 1 only the experts of the
 * topk_group groups with the largest sums of their two best choices compete; top_k by
 * choice (ties to the lower id); weights = the unbiased scores, renormalized when
 * norm_topk_prob (sum + 1e-20), times routed_scaling_factor. tmp: 2 * n_experts floats. */
void wpi_route_noaux(const wpi_hparams *hp, const float *scores, const float *bias,
                     float *tmp, int32_t *ids, float *w);

/* hyper.c: manifold-constrained hyper-connections (transformers' DeepseekV4HyperConnection
 * and DeepseekV4HyperHead; glm5_next reuses them). A token's residual is hc streams of dim
 * floats, x[hc][dim], contiguous; n tokens are hc * dim floats apart. Generic: weights by
 * pointer (f32), dimensions in wpi_hc_dims; the pool may be NULL (inline). */
#define WPI_HC_MAX 16
typedef struct wpi_hc_dims {
    uint32_t hc;             /* streams (hc_mult), 1..WPI_HC_MAX */
    uint32_t dim;            /* floats per stream (hidden_size) */
    uint32_t sinkhorn_iters; /* hc_sinkhorn_iters (>= 1) */
    float hc_eps;            /* hc_eps */
    float norm_eps;          /* eps of the unweighted RMSNorm over hc * dim (rms_norm_eps) */
} wpi_hc_dims;
/* Rows of fn: (2 + hc) * hc (pre, post, comb). */
uint32_t wpi_hc_mix_count(const wpi_hc_dims *d);
/* Scratch floats wpi_hc_pre / wpi_hc_head need for n tokens. */
uint64_t wpi_hc_scratch_floats(const wpi_hc_dims *d, uint32_t n);
/* Before a block, for n tokens of x: post [n][hc], comb [n][hc][hc] (comb[j][k]: weight of
 * input stream j in output stream k, doubly stochastic after Sinkhorn) and, when collapsed
 * is not NULL, the block input collapsed[t * ldc + i] = sum_k pre[k] x[k][i].
 * fn [(2 + hc) * hc][hc * dim], base [(2 + hc) * hc], scale [3]. */
void wpi_hc_pre(const wpi_kernels *k, wpi_pool *pool, const wpi_hc_dims *d,
                const float *fn, const float *base, const float *scale,
                const float *x, uint32_t n, float *post, float *comb,
                float *collapsed, size_t ldc, float *scratch);
/* After a block with output out[t * ldo + i]: in place,
 * x[k] = post[k] * out + sum_j comb[j][k] x[j] per token. */
void wpi_hc_post(wpi_pool *pool, const wpi_hc_dims *d, float *x, const float *out,
                 size_t ldo, const float *post, const float *comb, uint32_t n);
/* Final collapse y[t * ldy + i] = sum_k w[k] x[k][i] with
 * w = sigmoid((fn . x / rms(x)) * scale[0] + base) + hc_eps, fn [hc][hc * dim], base [hc],
 * scale [1]; fn NULL: the mean of the streams (base, scale, scratch unused). */
void wpi_hc_head(const wpi_kernels *k, wpi_pool *pool, const wpi_hc_dims *d,
                 const float *fn, const float *base, const float *scale,
                 const float *x, uint32_t n, float *y, size_t ldy, float *scratch);

/* deepseek_v4 (blocks/attention_csa.c): state floats of layer l at ctx tokens (sliding-
 * window keys, compressor and indexer windows and entries), of all layers, and the
 * scratch floats of the forward for chunks of `chunk` tokens. */
uint64_t wpi_v4_layer_state_floats(const wpi_hparams *hp, uint32_t l, uint32_t ctx);
uint64_t wpi_v4_state_floats(const wpi_hparams *hp, uint32_t ctx);
uint64_t wpi_v4_scratch_floats(const wpi_hparams *hp, uint32_t chunk);
/* Attention of layer l on the block input xin [n, H] (normed), output into out [n, H]:
 * shared-KV MQA with sinks over the sliding window plus compressed entries (all causal
 * ones for HCA, the indexer's top-k for CSA), grouped output projection. */
void wpi_v4_attention(wpi_model *mdl, uint32_t layer, const float *xin, uint32_t n,
                      uint32_t pos, float *out);
/* moe_v4.c: routed experts (sqrtsoftplus scores; hash or biased top-k selection) plus the
 * shared expert, clamped SwiGLU, on xin [n, H]; sum into out [n, H]. */
wp_status wpi_v4_moe(wpi_model *mdl, uint32_t layer, const float *xin, uint32_t n, float *out);
/* Prefetches layer+1's experts while decoding one token (timing only): a hash layer's
 * from the token id, a top-k layer's by its router on `approx` [H] (its input, guessed). */
void wpi_v4_lookahead(wpi_model *mdl, uint32_t layer, const float *approx);

/* arch/registry.c: an architecture is found by its model_type. */
struct wpi_arch {
    const char *name;
    /* Checks hparams and the presence and shape of every tensor this arch needs. */
    wp_status (*check)(const wpi_container *c, char *err, size_t cap);
    /* One decoder layer over a chunk of n tokens at positions pos..pos+n, updating
     * mdl->x in place. Errors: WP_E_IO (an expert read), with mdl->err filled. */
    wp_status (*layer_forward)(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
};

const wpi_arch *wpi_arch_find(const char *model_type);
/* Comma-separated names of every supported model_type. */
const char *wpi_arch_names(void);

/* core.c: the context, shared with state.c. */
struct wp_ctx {
    wpi_mem mem;
    wpi_container *c;
    const wpi_arch *arch;
    wp_plan plan;
    wpi_experts *experts;
    wpi_pool *pool;
    wpi_model mdl;
    void *kv;
    uint64_t kv_bytes;
    void *scratch;
    uint64_t scratch_bytes;
    uint32_t pos;                /* tokens evaluated */
    uint64_t tokens;             /* stats since the last reset */
    double eval_seconds;
    uint64_t other_bytes_base;   /* c->bytes_read at the last stats reset */
    char err[WPI_ERR_CAP];
};

#endif /* WP_INTERNAL_H */
