/*
 * blocks.h -- the blocks of a layer that two or more architectures compose (blocks/);
 * a block only one architecture uses is static in its arch file instead. Which
 * architectures use which block: docs/ENGINE.md ("Inside"); this header names none.
 *   attention.c     GQA with RoPE, q/k norm, clip, biases (the plain decoders)
 *   attention_sw.c  attention with sinks over a sliding window
 *   ffn.c           SwiGLU, dense layers, the clamped variant, SiTU-GLU
 *   moe.c           routing, the expert driver, the plain MoE decoder layer
 *   route_noaux.c   grouped, biased expert selection
 *   mla.c           multi-head latent attention and its state
 *   kda.c           Kimi Delta Attention (linear attention with a recurrent state)
 *   hyper.c         hyper-connections (mHC streams, Sinkhorn mixing, final head)
 *   hparams.c       the optional hparams keys of these blocks
 *   vision.c        the shared pieces of the ViT image towers
 */
#ifndef WPI_BLOCKS_H
#define WPI_BLOCKS_H

#include <math.h>

#include "model.h"

/* hparams.c: the optional hparams keys of the shared blocks (MLA and routing, hyper-
 * connections, the indexers' shape, KDA, sliding window and attn_kinds, clamped SwiGLU):
 * the default hparams hook of wpi_arch, and the first call of every other. */
wp_status wpi_hparams_shared(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap);
/* An optional boolean key of the hparams object: absent or null is false; anything but
 * true/false is WP_E_FORMAT naming the key. */
wp_status wpi_hparam_bool(const struct wpi_json *h, const char *key, int32_t *out, char *err,
                          size_t cap);

/* blocks/: one block of a layer over a chunk of n tokens at positions pos..pos+n. Each
 * reads x, writes the residual sum back into x. */
/* attention.c: the online softmax of one query over cached keys [lo, end) (rows kvd
 * apart), in fixed blocks so thread count never changes a result: out = the
 * unnormalized sum of exp(score - *mx) v; returns the sum of those weights. */
float wpi_attend_keys(const wpi_model *m, const float *q, const float *kc, const float *vc,
                      size_t kvd, uint32_t lo, uint32_t end, float *out, float *mx);
/* The parts every attention variant shares. Stateless, on n rows of any sequences (the
 * arch's mix_in / mix_out): attn_norm, q/k/v projections into q and kv_rows (biases, q/k
 * norm, clip, rope at each row's position) -- and the output projection (+ bias) of att
 * added to the residual stream. Per sequence: its n rows of kv_rows into its cache at pos
 * (store), then (attend) the causal attention of its q rows into att.
 * wpi_attention_block: the three in order on one sequence. */
void wpi_attention_project(wpi_model *mdl, uint32_t layer, uint32_t n);
void wpi_attention_store(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
void wpi_attention_attend(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
/* Store then attend for n_seqs sequences at once (ms[i]: n[i] rows at pos[i]), in one
 * parallel section per 64 sequences; window 0: every key, else the last `window` of each
 * position; sinks: the layer's attn_sinks (attention_sw.c). Each sequence's results are
 * those of it alone. wpi_attention_mixer_seqs: plain attention (arch.h mixer_seqs). */
void wpi_attention_attend_seqs(wpi_model *const *ms, uint32_t layer, const uint32_t *n,
                               const uint32_t *pos, uint32_t n_seqs, uint32_t window,
                               int sinks);
void wpi_attention_mixer_seqs(wpi_model *const *ms, uint32_t layer, const uint32_t *n,
                              const uint32_t *pos, uint32_t n_seqs);
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
/* The routing of the step is final: drops the queued lookahead reads of the layer it did
 * not pick (wpi_experts_cancel_prefetch) and requests the first group of its distinct
 * experts, so their misses are read while the caller computes what needs no expert. */
wp_status wpi_moe_request_first(wpi_model *mdl, uint32_t layer, uint32_t nd);
/* wpi_moe_for_each_expert after wpi_moe_request_first when first_requested. Within a
 * group (up to 64 experts) the experts already present run first, the ones still being
 * read after them; the outputs are the same in any order. */
wp_status wpi_moe_for_each_expert_requested(wpi_model *mdl, uint32_t layer, const float *xs,
                                            uint32_t nd, wpi_expert_apply_fn fn, void *arg,
                                            int first_requested);
/* A layer of the plain MoE decoders: wpi_attention_block, then wpi_moe_block on MoE
 * layers and wpi_ffn_block on dense ones; the arch's hparams decide routing, shared
 * expert and qk norm. */
wp_status wpi_moe_decoder_layer(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
/* Its parts for wp_eval_batch (arch.h mix_in / mixer / mix_out / ffn): the attention of
 * the layer's kind (wpi_attention_project, the attend of its kind, wpi_attention_output);
 * the dense FFN or the MoE block (also the ffn of the MLA and KDA decoders). */
void wpi_moe_decoder_mixer(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
void wpi_moe_decoder_mixer_seqs(wpi_model *const *ms, uint32_t layer, const uint32_t *n,
                                const uint32_t *pos, uint32_t n_seqs);
wp_status wpi_moe_decoder_ffn(wpi_model *mdl, uint32_t layer, uint32_t n);
/* The hooks of a layer that is wpi_moe_decoder_mixer's parts then _ffn. */
#define WPI_MOE_DECODER_HOOKS                                                         \
    .layer_forward = wpi_moe_decoder_layer, .mix_in = wpi_attention_project,           \
    .mixer = wpi_moe_decoder_mixer, .mixer_seqs = wpi_moe_decoder_mixer_seqs,           \
    .mix_out = wpi_attention_output,                                                   \
    .ffn = wpi_moe_decoder_ffn
/* attention_sw.c: attention with per-head sinks (layer's attn_sinks, if any) over keys
 * p-window+1..p of each position p (window 0: all); biases, RoPE, no qk norm. */
void wpi_attention_sw_block(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos,
                            uint32_t window);
/* Its per-sequence part (between wpi_attention_project and _output): store, then attend
 * with the window and the sinks. */
void wpi_attention_sw_attend(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos,
                             uint32_t window);
/* out[t] = down(silu(gate x_t) * up x_t) for m tokens (ffn.c). */
void wpi_swiglu(wpi_model *mdl, const wpi_wmat *gate, const wpi_wmat *up,
                const wpi_wmat *down, const float *x, size_t ldx, uint32_t m,
                float *out, size_t ldo);
/* The GLU activation of gate g and up u: silu(g) * u, or SiTU-GLU with hp's situ_beta
 * (and situ_linear_beta); hp may be NULL (silu). Inline: the gate/up tasks call it per
 * element, where a call costs about what the activation does. */
static inline float wpi_glu(const wpi_hparams *hp, float g, float u)
{
    if (!hp || !(hp->situ_beta > 0)) return g / (1.0f + expf(-g)) * u;
    const float b1 = hp->situ_beta, b2 = hp->situ_linear_beta;
    const float a = b1 * tanhf(g / b1) / (1.0f + expf(-g));
    return a * (b2 > 0 ? b2 * tanhf(u / b2) : u);
}
/* g = glu(g + bg, u + bu) (biases optional, clamped by lim > 0 as wpi_swiglu_clamp says)
 * in place for rows r0 + i, i < nr, of n tokens (token t's at g + t * ld, u + t * ld). */
void wpi_glu_rows(const wpi_hparams *hp, float lim, const float *bg, const float *bu,
                  size_t r0, size_t nr, uint32_t n, float *g, const float *u, size_t ld);
/* The 8-bit gate/up of a SwiGLU whose down is 8-bit too: for n_tok tokens (x's blocks at
 * xq, ldq apart) the rows [r0, r1) (whole 32-row blocks) of gate and up, a block and up
 * to 64 tokens at a time in a tile on the caller's stack, their GLU there, quantized into
 * gq (token t's row of gate->rows / 32 blocks at gq + t * gate->rows / 32): the blocks
 * wpi_quant_x8 would make of the f32 rows. Nothing f32 leaves the thread, so no cache
 * line of g or u moves between cores (ffn.c). */
typedef struct wpi_gu8 {
    const wpi_hparams *hp;
    wpi_matmul_x8_fn fg8, fu8;
    const wpi_wmat *gate, *up;
    const float *bg, *bu; /* or NULL */
    float lim;
    const wpi_xq *xq;
    size_t ldq;
    uint32_t n_tok;
    wpi_xq *gq;
} wpi_gu8;
void wpi_gu_fused(const wpi_gu8 *f, size_t r0, size_t r1);
/* The clamp of wpi_swiglu's gate (at most) and up (both signs), 0 for none (ffn.c). */
float wpi_swiglu_clamp(const wpi_hparams *hp);
/* Rope cos/sin of the chunk's positions into mdl->rope_cos/sin (attention.c). */
void wpi_rope_prepare(wpi_model *mdl, uint32_t n, uint32_t pos);
/* Rotates the first rope_dim dims of n_heads heads of head_dim (HF rotate_half). */
void wpi_rope_apply(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                    const float *cos, const float *sin);
/* Inserts (s, id) into the descending list w[0..*filled), ids alike, of at most k >= 1
 * entries: after every score >= s (ties to the earlier), the last dropped when full; a
 * score not above a full list's last (or NaN) is not taken (moe.c). */
void wpi_topk_insert(float *w, int32_t *ids, uint32_t k, uint32_t *filled, float s, int32_t id);
/* Router top-k of probs[n] (ties to the lower id), in descending order (moe.c). */
void wpi_topk(const float *probs, uint32_t n, uint32_t k, int32_t *ids, float *w);
/* kda.c: Kimi Delta Attention block (recurrent state zeroed at pos 0); its state floats
 * per KDA layer; the number of KDA layers; its scratch floats for chunks of `chunk`. */
void wpi_kda_block(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
/* Its three parts: project and output stateless on n rows of any sequences (the arch's
 * mix_in / mix_out), attend (conv window and recurrence) per sequence at pos. Each row's
 * values are one slice of kda_buf, so a sequence's rows are a slice from its first row. */
void wpi_kda_project(wpi_model *mdl, uint32_t layer, uint32_t n);
void wpi_kda_attend(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
void wpi_kda_output(wpi_model *mdl, uint32_t layer, uint32_t n);
uint64_t wpi_kda_state_floats(const wpi_hparams *hp);
uint32_t wpi_kda_layers(const wpi_hparams *hp);
uint64_t wpi_kda_scratch_floats(const wpi_hparams *hp, uint32_t chunk);
/* Its refusal to truncate a state ("a recurrent (KDA) state") when hp has KDA layers,
 * else NULL: an arch's no_truncate hook. */
const char *wpi_kda_no_truncate(const wpi_hparams *hp);
/* Checks a KDA layer's tensors (q/k/v/o, gates, conv, dt_bias, a_log, o_norm) and shapes;
 * with kda_full_gate, kda_g [D, hidden] (L->kda_g, which the arch binds) for g_a and g_b. */
wp_status wpi_kda_check_layer(const wpi_container *c, uint32_t l, char *err, size_t cap);
/* The MLA hooks: mla_qa, mla_q, mla_o in the scratch (carved for every architecture,
 * empty without q_lora_rank / kv_lora_rank); the state (a latent row [kv_lora_rank +
 * rope_dim] per position of every non-KDA layer, then every KDA layer's recurrent state,
 * kda.c) by kind, its carve of kv and the state file's parts of layer l. */
void wpi_mla_scratch(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, wpi_carve *cv);
void wpi_mla_state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS]);
void wpi_mla_bind(wpi_model *m, const wpi_container *c, void *kv);
size_t wpi_mla_state_part(const wpi_model *m, uint32_t l, int v, uint32_t pos, float **at);
/* Those hooks in a wpi_arch initializer, for an architecture whose state is MLA's (with
 * KDA layers, if any, which forbid truncation). */
#define WPI_MLA_HOOKS                                                                 \
    .state_bytes = wpi_mla_state_bytes, .bind = wpi_mla_bind,                         \
    .state_part = wpi_mla_state_part, .no_truncate = wpi_kda_no_truncate
/* Multi-head latent attention over the latent KV cache, absorbed up-projections (mla.c). */
/* Checks an MLA layer's tensors: q (q_a, q_a_norm, q_b with q_lora_rank, else q), kv_a,
 * kv_a_norm, kv_b, output and their optional biases. */
wp_status wpi_mla_check_layer(const wpi_container *c, uint32_t l, char *err, size_t cap);
void wpi_mla_block(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
/* The parts of a layer that is MLA or KDA by hparams.layer_attn (each the part of its
 * kind), and those as the mixer hooks of a wpi_arch initializer. */
void wpi_mla_kda_project(wpi_model *mdl, uint32_t layer, uint32_t n);
void wpi_mla_kda_attend(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
void wpi_mla_kda_output(wpi_model *mdl, uint32_t layer, uint32_t n);
#define WPI_MLA_KDA_MIXER_HOOKS                                                        \
    .mix_in = wpi_mla_kda_project, .mixer = wpi_mla_kda_attend,                       \
    .mix_out = wpi_mla_kda_output
/* Its three parts. Stateless, on n rows of any sequences (the arch's mix_in / mix_out):
 * project: attn_norm, q (q_a rmsnorm'd into mla_qa, then q), the latent rows into kv_rows
 * (rope at each row's position), the absorbed query into mla_q -- and output: W_uv of
 * mla_o into att, the gate, the output projection into xn, added to x. Per sequence,
 * attend: its latent rows into its cache at pos, then the attention of its rows into
 * mla_o. pools (NULL: every key): each token attends only to its selected key pools (an
 * indexer's choice) and, with tail, its incomplete pool. */
void wpi_mla_project(wpi_model *mdl, uint32_t layer, uint32_t n);
typedef struct wpi_mla_pools {
    const int32_t *sel;      /* [n][per] selected pools of each token, ascending */
    const int32_t *nsel;     /* [n] how many of them */
    uint32_t pool, per;      /* positions per pool, selections per token (<= WPI_MLA_MAX_POOLS) */
    int tail;                /* the incomplete pool is always attended */
} wpi_mla_pools;
#define WPI_MLA_MAX_POOLS 1024
void wpi_mla_attend(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos,
                    const wpi_mla_pools *pools);
void wpi_mla_output(wpi_model *mdl, uint32_t layer, uint32_t n);
/* (With the layer's attn_gate, wpi_mla_output gates the heads' output by sigmoid of
 * attn_gate times the normed input, computed into mdl->q: n_heads * v_head_dim must not
 * exceed n_heads * head_dim, which the arch checks.) */
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

/* hyper.c: manifold-constrained hyper-connections (as transformers' HyperConnection and
 * HyperHead modules of the models that have them). A token's residual is hc streams of dim
 * floats, x[hc][dim], contiguous; n tokens are hc * dim floats apart. Generic: weights by
 * pointer (f32), dimensions in wpi_hc_dims; the pool may be NULL (inline). */
typedef struct wpi_hc_dims {
    uint32_t hc;             /* streams (hc_mult), 1..WPI_HC_MAX */
    uint32_t dim;            /* floats per stream (hidden_size) */
    uint32_t sinkhorn_iters; /* hc_sinkhorn_iters (>= 1) */
    float hc_eps;            /* hc_eps */
    float norm_eps;          /* eps of the unweighted RMSNorm over hc * dim (rms_norm_eps) */
} wpi_hc_dims;
/* The dimensions of hp's hyper-connections: hc_mult streams of hidden_size floats, its
 * Sinkhorn iterations and hc_eps, rms_norm_eps for the norm. */
wpi_hc_dims wpi_hc_dims_of(const wpi_hparams *hp);
/* The residual's streams from the embedding: row x[t] (dim floats) into each of the hc
 * streams of token t, for n tokens. */
void wpi_hc_expand(const wpi_hc_dims *d, const float *x, uint32_t n, float *streams);
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


/* vision.c: the ViT pieces of the image towers (docs/ENGINE.md "Images"). */
void wpi_layernorm(float *out, const float *x, const float *w, const float *b, size_t n,
                   float eps);
/* GELU of kind act (WPI_ACT_GELU exact, WPI_ACT_GELU_TANH the tanh approximation). */
float wpi_gelu(float x, int act);
/* y[t] = W x[t] + bias (bias may be NULL) for n rows. */
void wpi_vit_linear(wpi_model *m, const wpi_wmat *w, const float *bias, const float *x,
                    size_t ldx, uint32_t n, float *y, size_t ldy);
/* The 2D rotary table of n patches at (row[t], col[t]): [n, head_dim/2] cos and sin of the
 * angle of pair j of a head, pos * theta^(-2i / (head_dim/2)): WPI_VIT_ROPE_COL_ROW /
 * _ROW_COL: i = floor(j/2), pos the column (row) for even j, the row (column) for odd j;
 * WPI_VIT_ROPE_ROWS_COLS: the first head_dim/4 pairs the row (i = j), the rest the column
 * (i = j - head_dim/4). */
enum { WPI_VIT_ROPE_COL_ROW = 0, WPI_VIT_ROPE_ROW_COL = 1, WPI_VIT_ROPE_ROWS_COLS = 2 };
void wpi_vit_rope_table(const uint32_t *row, const uint32_t *col, uint32_t n, uint32_t head_dim,
                        float theta, int layout, float *cos_out, float *sin_out);
/* The buffers of one image of n patches: x, xn [n, D]; att [n, A]; qkv [n, 3A] (A the
 * attention width, attn_hidden_size); ff [n, F] (with glu [2n, F]: up, then gate); cos,
 * sin [n, head_dim/2]. */
typedef struct wpi_vit_buf {
    float *x, *xn, *qkv, *att, *ff, *cos, *sin;
} wpi_vit_buf;
/* What differs between the towers' encoder layers (top of vision.c). */
typedef struct wpi_vit_opts {
    int rms_norm;        /* RMSNorm (weight only), else LayerNorm with bias */
    int qk_norm;         /* per-head RMSNorm of q and k before the rotary */
    int rope_half;       /* rotate pairs (j, j + hd/2), else (2j, 2j+1) */
    int glu;             /* down(silu(min(gate, lim)) * clamp(up, +-lim)), else down(gelu(up)) */
    int biases_optional; /* a linear layer's bias may be absent */
    float glu_limit;     /* 0: no clamp */
} wpi_vit_opts;
/* An image's grid thw (t, h, w) as merge_size x merge_size blocks merged into one row
 * each: t = 1 and h, w positive multiples of merge_size; the row count, else 0 with the
 * reason in err (named after `arch`, the tower's architecture). */
uint32_t wpi_vit_merged_rows(const wpi_vision_hp *v, const uint32_t thw[3], const char *arch,
                             char *err, size_t cap);
/* Checks encoder layer l's tensors against c->vhp. */
wp_status wpi_vit_check_layer(const wpi_container *c, const wpi_vit_opts *o, uint32_t l,
                              char *err, size_t cap);
/* Encoder layer l over b->x (n patches): x += attn(ln1 x) (2D rotary from b->cos/sin,
 * every patch sees every other); x += mlp(ln2 x). */
void wpi_vit_layer(wpi_model *m, const wpi_container *c, const wpi_vit_opts *o, uint32_t l,
                   const wpi_vit_buf *b, uint32_t n);

#endif /* WPI_BLOCKS_H */
