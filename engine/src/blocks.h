/*
 * blocks.h -- the blocks of a layer that architectures compose (blocks/).
 */
#ifndef WPI_BLOCKS_H
#define WPI_BLOCKS_H

#include "model.h"

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

#endif /* WPI_BLOCKS_H */
