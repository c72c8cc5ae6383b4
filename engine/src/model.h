/*
 * model.h -- what the forward pass reads and writes: bound trunk tensors (wpi_layer), the
 * buffers of one context (wpi_model), the scratch carve, binding by name and the
 * row-parallel matmul (forward.c), and the tensor checks arch check functions use
 * (checks.c).
 */
#ifndef WPI_MODEL_H
#define WPI_MODEL_H

#include "experts.h"
#include "pool.h"

/* ---- forward (core.c, forward.c, pool.c, blocks/, arch/) --------------------- */

typedef struct wpi_arch wpi_arch;
typedef struct wpi_route_trace wpi_route_trace;

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
    const float *sinks;                           /* attn_sinks [n_heads] or NULL */
    /* MLA (blocks/mla.c): q = q_b(rmsnorm(q_a x)) or wq x; latent = kv_a x; kv_b up. */
    wpi_wmat wq_a, wq_b, wkv_a, wkv_b;
    const float *q_a_norm, *kv_a_norm;            /* [q_lora_rank], [kv_lora_rank] */
    const float *bq_a, *bkv_a;                    /* biases or NULL */
    const float *exp_bias;                        /* exp_probs_b [n_experts] or NULL */
    /* KDA layers (blocks/kda.c); q/k/v/o are wq, wk, wv, wo [D, hidden] */
    wpi_wmat kda_f_a, kda_f_b, kda_b, kda_g_a, kda_g_b;
    const float *kda_conv;                        /* [3D, kda_conv] depthwise, f32 */
    const float *kda_dt_bias, *kda_a_log, *kda_o_norm; /* [D], [kda_heads], [kda_head_dim] */
    wpi_wmat kda_g;                               /* full-rank output gate [D, hidden] or none
                                                   * (kda_full_gate; bound by its arch) */
    wpi_wmat attn_gate;                           /* MLA output gate [n_heads*v_head_dim,
                                                   * hidden] or none (bound by its arch) */
    /* hyper-connections (blocks/hyper.c) around attention and FFN, f32:
     * fn [(2+hc)*hc, hc*hidden], base [(2+hc)*hc], scale [3] */
    const float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    const float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    uint32_t kv_slot;             /* this layer's block of the KV cache (or of kda_state) */
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
    uint32_t la_rows;            /* a batched decode step's rows (one per sequence), which
                                    the lookahead predicts for as for one token; else 0 */
    uint32_t x8_max_tok;         /* steps of at most this many rows take the 8-bit path:
                                    wp_cfg.exact resolved at open (0 = none, UINT32_MAX =
                                    all) */
    uint64_t x8_dtypes;          /* for weights of these dtypes (mask of 1 << dtype) */
    uint64_t x8;                 /* the dtypes this step takes it for: x8_dtypes or 0 (the
                                    forward sets it from its rows; weights whose width is a
                                    multiple of 32) */
    const wpi_wmat *lm_head;     /* output.weight or token_embd.weight */
    wpi_wmat tok_embd, output;
    const float *out_norm;       /* [hidden] */
    const float *rope_freqs;     /* [rope_dim/2] inverse frequencies */
    wpi_layer *layers;           /* [n_layers] */
    float *kcache, *vcache;      /* [n_layers][ctx][n_kv_heads*head_dim] */
    /* scratch, per chunk of C tokens */
    float *x;                    /* [C, hidden] residual stream */
    float *xn;                   /* [C, hidden] normed input of a block */
    wpi_xq *xq;                  /* [xq_blocks] a matmul's input as 8-bit blocks */
    uint64_t xq_blocks;          /* C * (widest matmul input / 32) */
    float *q;                    /* [C, n_heads*head_dim] */
    float *att;                  /* [C, n_heads*head_dim] attention output */
    float *kv_rows;              /* [C, 2*n_kv_heads*head_dim] projected k|v of each row
                                    (MLA: [C, kv_lora_rank+rope_dim] latent rows) before a
                                    sequence copies them into its cache */
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
    int32_t embed_token;         /* placeholder id whose rows come from embed_next, or -1 */
    const float *embed_next;     /* the next queued row for a placeholder token */
    /* The architecture's own tensors and buffers, per-layer arrays inside (carved first
     * by its scratch hook, wpi_carve_own; arch.h: WPI_OWN_MODEL), or NULL. */
    void *arch;
    char *err;                   /* detail of the last error */
    size_t err_cap;
    /* benchmark routing replay (route_trace.h), NULL = the router decides */
    const struct wpi_route_trace *trace;
    uint64_t trace_cursor;       /* trace token of the chunk's first token; advances per
                                    token this sequence evaluates */
    uint64_t *trace_rows;        /* a batch's model: each row's trace token (its
                                    sequence's cursor + its row in it); else NULL */
} wpi_model;

/* forward.c: one allocation carved into buffers, each rounded up to 64 bytes; with base
 * NULL the walk only measures (off is the total). */
typedef struct wpi_carve {
    char *base;
    uint64_t off;
} wpi_carve;
/* count elements of size bytes each; NULL while measuring. */
void *wpi_carve_take(wpi_carve *cv, uint64_t count, size_t size);
/* m->field = count elements of type (m may be NULL while measuring). */
#define WPI_CARVE(cv, m, field, type, count)                                  \
    do {                                                                      \
        void *p_ = wpi_carve_take((cv), (uint64_t)(count), sizeof(type));     \
        if (p_) (m)->field = (type *)p_;                                      \
    } while (0)
/* The architecture's own struct of size bytes, into m->arch (m may be NULL while
 * measuring); returns it, NULL while measuring. */
void *wpi_carve_own(wpi_carve *cv, wpi_model *m, size_t size);
/* A layer tensor by the name fmt % l ("blk.%u.attn_q.weight"), as a matrix (zeroed when
 * absent) or an f32 vector (NULL when absent). */
wpi_wmat wpi_bind_mat(const wpi_container *c, const char *fmt, uint32_t l);
const float *wpi_bind_vec(const wpi_container *c, const char *fmt, uint32_t l);

/* y[t*ldy + r] = W x_t for rows r0..r1 of several matrices sharing one input, split by
 * row blocks across the pool (inline when small). */
typedef struct wpi_mm {
    const wpi_wmat *w;
    float *y;
    size_t ldy;
} wpi_mm;
/* Row-block tasks per pool thread of a parallel matmul of n_tok tokens, so that the
 * dynamic claim balances uneven progress (a thread another process preempts, a short
 * last block): four for one token, whose sections are short enough that a claim's cost
 * shows; sixteen for several tokens, where with four a section's end could leave one
 * thread idle for most of a block (row counts seldom divide evenly: 576 rows in 80-row
 * blocks are 7.2 of them). */
#define WPI_TASKS_ONE 4
#define WPI_TASKS_MANY 16
uint32_t wpi_tasks_per_thread(uint32_t n_tok);
void wpi_matmul(wpi_model *mdl, const wpi_mm *jobs, uint32_t n_jobs,
                const float *x, size_t ldx, uint32_t n_tok);
/* As wpi_matmul on an input already quantized (token t's blocks at xq + t * ldq), for
 * jobs that all have an 8-bit kernel on this step (wpi_x8_has). */
void wpi_matmul_xq(wpi_model *mdl, const wpi_mm *jobs, uint32_t n_jobs, const wpi_xq *xq,
                   size_t ldq, uint32_t n_tok);

/* fn(arg, r0, r1) over ranges of rows 0 .. n - 1 across the pool, inline for one row or
 * little work (n * width elements); fn must treat each row alike whatever its range. */
typedef void (*wpi_rows_fn)(void *arg, uint32_t r0, uint32_t r1);
void wpi_parallel_rows(wpi_model *mdl, uint32_t n, size_t width, wpi_rows_fn fn, void *arg);
/* wpi_quant_x8 of n rows of cols (x + t * ldx into xq + t * ldq), and wpi_rmsnorm of rows
 * rows of n (y and x rows n apart), through wpi_parallel_rows. */
void wpi_quant_rows(wpi_model *mdl, const float *x, size_t ldx, uint32_t n, size_t cols,
                    wpi_xq *xq, size_t ldq);
void wpi_rmsnorm_rows(wpi_model *mdl, float *y, const float *x, const float *w, size_t n,
                      uint32_t rows, float eps);

/* checks.c: tensor checks for arch check functions: err names the tensor. A matrix must have a
 * dtype with a matmul kernel; a vector must be f32. */
wp_status wpi_need_matrix(const wpi_container *c, const char *name, uint64_t rows,
                          uint64_t cols, char *err, size_t cap);
wp_status wpi_need_vector(const wpi_container *c, const char *name, uint64_t n,
                          char *err, size_t cap);
/* A matrix that must be f32 (read by the block itself, not by a matmul kernel). */
wp_status wpi_need_f32_matrix(const wpi_container *c, const char *name, uint64_t rows,
                              uint64_t cols, char *err, size_t cap);
/* A vector the same way when present; absent is fine. */
wp_status wpi_opt_vector(const wpi_container *c, const char *name, uint64_t n,
                         char *err, size_t cap);
/* Checks what every decoder shares: embeddings, norms, rope, q/k/v/o (+ biases present),
 * qk norms per hparams, dense FFN or router + expert bank per layer, shared expert. */
wp_status wpi_check_decoder(const wpi_container *c, char *err, size_t cap);
/* A plain decoder's check, err naming arch: qk_norm of kind qk_norm (WPI_QK_*), no shared
 * expert unless shared, then wpi_check_decoder. */
wp_status wpi_check_plain(const wpi_container *c, const char *arch, int qk_norm, int shared,
                          char *err, size_t cap);
/* Checks layer l's expert bank: present, n_experts x [moe_intermediate_size, hidden_size],
 * a dtype the kernels read. */
wp_status wpi_check_expert_bank(const wpi_container *c, uint32_t l, char *err, size_t cap);

#endif /* WPI_MODEL_H */
