/*
 * glm5_next.c -- Glm5NextForConditionalGeneration's text model (GLM-5.3-Flash).
 *   The residual is hc_mult streams per token (blocks/hyper.c): the embedding is copied
 *   into every stream, and each block runs on their collapse and is expanded back:
 *     x = pre-mix(streams); y = block(x); streams = post * y + comb^T streams
 *   for the attention block and again for the FFN block; after the last layer the streams'
 *   mean goes through the final norm. Attention per layer (attn_kinds): "kda" layers are
 *   Kimi Delta Attention, the forget gate bounded by kda_lower_bound when given
 *   (blocks/kda.c); "full" layers are MLA without positional encoding (blocks/mla.c,
 *   lora norms at rms_norm_eps) restricted to the key pools chosen by the DSA indexer
 *   (below): its own for an index_kinds "full" layer, the previous layer's for a
 *   "shared" one. FFN (layer_kinds): dense, or
 *   MoE with sigmoid grouped routing, exp_probs_b for selection only, renormalized weights
 *   times routed_scaling_factor (route_noaux.c) and an ungated shared expert; every SwiGLU
 *   clamps gate <= swiglu_limit and |up| <= swiglu_limit when the limit is > 0 (ffn.c).
 * Its image tower (Glm5NextVisionModel, "the tower" below), in paper order:
 *   x = patch_embd(pixels)   patches in the processor's merge-block order
 *   per layer (blocks/vision.c): x += attn(rmsnorm x) with per-head q/k RMSNorm and a 2D
 *   rotary in rotate-half pairs (rows on the first quarter of a head, columns on the
 *   second), x += swiglu(rmsnorm x) clamped at glu_limit, biases as the checkpoint has them
 *   x = post_ln(x) (RMSNorm); each merge block's patches concatenated -> mm_down (the
 *   downsample convolution as a matrix) -> mm_proj -> gelu(layernorm mm_norm) -> the
 *   clamped SwiGLU mm_gate / mm_up / mm_ffn_down. Tensors beyond the encoder layers:
 *   v.patch_embd.{weight [D, C*T*p*p], bias}, v.post_ln.weight [D],
 *   v.mm_down.{weight [O, m*m*D], bias [O]}, v.mm_proj.weight [O, O],
 *   v.mm_norm.{weight,bias} [O], v.mm_gate.weight, v.mm_up.weight [P, O],
 *   v.mm_ffn_down.weight [O, P] (O = out_hidden_size = hidden_size, P =
 *   proj_intermediate_size). Images only (t = 1).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "json.h"

#define MAX_SEL WPI_MLA_MAX_POOLS /* index_topk / index_kpool: pools one token may select */
#define MAX_KPOOL 4096 /* index_kpool: a pool's softmax weights on the stack */

enum { INDEX_NONE = 0, INDEX_FULL = 1, INDEX_SHARED = 2 }; /* per layer (index_kinds) */

/* Its own hparams (hp->arch): the DSA indexer's pools. */
typedef struct glm5_hp {
    uint32_t index_kpool;
    int32_t index_tail;                     /* bool: the incomplete pool is always attended */
    uint8_t layer_index[WPI_MAX_LAYERS];    /* INDEX_* per layer */
} glm5_hp;
WPI_OWN_HPARAMS(glm5_hp)

/* The indexer tensors of an INDEX_FULL layer. */
typedef struct glm5_layer {
    wpi_wmat idx_q;                   /* [index_heads*index_head_dim, q_lora_rank] */
    wpi_wmat idx_w;                   /* [index_heads, hidden] */
    wpi_wmat idx_gate, idx_k;         /* [index_head_dim, hidden] */
    const float *idx_k_norm, *idx_k_norm_b; /* LayerNorm [index_head_dim] */
    const float *idx_ape;             /* [index_kpool, index_head_dim] */
    uint32_t idx_slot;                /* this layer's block of idx_cache(m) */
} glm5_layer;
/* Its model state (m->arch, carved by scratch; shared by a context's sequences, so it
 * holds no pointer into a sequence's state). */
typedef struct glm5_model {
    glm5_layer *layers;          /* [n_layers] */
    float *hc_x;                 /* [C, hc_mult, hidden] hyper-connection streams */
    float *hc_post, *hc_comb;    /* [C, hc_mult], [C, hc_mult, hc_mult] */
    float *hc_scr;               /* wpi_hc_scratch_floats(C) */
    float *idx_q;                /* [C, index_heads * index_head_dim] indexer queries */
    float *idx_wt;               /* [C, index_heads] indexer head weights */
    int32_t *idx_sel;            /* [C, index_topk / index_kpool] selected pools, ascending */
    int32_t *idx_nsel;           /* [C] */
} glm5_model;
WPI_OWN_MODEL(glm5_model)

/* The indexer rows of m's sequence: [indexer layers][ctx][dsa_row_floats], after kda_state. */
static float *idx_cache(const wpi_model *m)
{
    return m->kda_state + (size_t)wpi_kda_layers(m->hp) * wpi_kda_state_floats(m->hp);
}

/* ---- hparams: the keys only glm5_next reads ----------------------------------------- */

#define W "manifest.json: hparams"

static wp_status index_kinds(const wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    glm5_hp *o = own_hp(hp);
    memset(o->layer_index, INDEX_NONE, sizeof o->layer_index);
    static const char *const kinds[] = {[INDEX_NONE] = "none", [INDEX_FULL] = "full",
                                        [INDEX_SHARED] = "shared"};
    TRY(wpi_hparam_kinds(h, "index_kinds", kinds, 3, hp->n_layers, o->layer_index, err, cap));
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        if (o->layer_index[l] != INDEX_NONE && !hp->index_heads)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_kinds[%u]: an indexer needs index_heads, index_head_dim, "
                              "index_topk and index_kpool", l);
        /* a shared layer reuses the selection of the layer right before it */
        if (o->layer_index[l] == INDEX_SHARED &&
            (l == 0 || o->layer_index[l - 1] != INDEX_FULL))
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_kinds[%u]: \"shared\" must follow a \"full\" layer", l);
    }
    return WP_OK;
}

/* The DSA indexer's pools (index_kpool, index_tail, index_kinds), after the shared
 * blocks' keys (which include the indexer's shape: index_heads, index_head_dim,
 * index_topk). Absent means off. */
static const wpi_hp_bound bounds[] = {
    WPI_HP_U32(glm5_hp, index_kpool, 1, MAX_KPOOL),
};

static wp_status hparams(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    glm5_hp *o = own_hp(hp);
    TRY(wpi_hparams_shared(h, hp, err, cap));
    TRY(wpi_hparams_bounds(h, bounds, sizeof bounds / sizeof bounds[0], o, err, cap));
    if (own_hp(hp)->index_kpool && (!hp->index_heads || !hp->index_head_dim || !hp->index_topk))
        return wpi_fail(err, cap, WP_E_FORMAT,
                        W ": index_kpool needs index_heads, index_head_dim and index_topk");
    if (own_hp(hp)->index_kpool) {
        if (hp->index_topk % own_hp(hp)->index_kpool)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_topk: %u is not a multiple of index_kpool %u",
                            hp->index_topk, own_hp(hp)->index_kpool);
        if (hp->index_topk / own_hp(hp)->index_kpool > MAX_SEL)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_topk: more than %u pools per token", MAX_SEL);
    }
    own_hp(hp)->index_tail = own_hp(hp)->index_kpool > 0;
    const wpi_json *v = wpi_json_get(h, "index_tail");
    if (v && v->type != WPI_JSON_NULL) {
        int b;
        if (!wpi_json_bool(v, &b))
            return wpi_fail(err, cap, WP_E_FORMAT, W ".index_tail: expected true or false");
        own_hp(hp)->index_tail = b;
    }
    return index_kinds(h, hp, err, cap);
}
#undef W

/* ---- the DSA indexer: which key pools each token attends --------------------------------
 *
 * Keys are grouped in pools of P = index_kpool consecutive positions (pool j holds
 * jP..jP+P-1). Per token, from x (the layer's normed input) and q_resid (mla_qa, the
 * rmsnorm'd q_a projection), with D = index_head_dim and NI = index_heads:
 *   k    = LayerNorm(W_k x) (weight, bias, eps 1e-6)          [D]
 *   gate = W_gate x                                           [D]
 *   q_h  = (W_q_b q_resid)_h,  w_h = (W_w x)_h * NI^-1/2       [NI][D], [NI]
 * A pool is a candidate once complete. Its key, per channel c, averages its tokens' k
 * with the weights softmax_i(gate_i[c] + ape[i][c]). Its score for a token:
 *   s_j = sum_h w_h * relu(q_h . key_j * D^-1/2)
 * A token at position p selects the index_topk / P best complete pools ending at or
 * before p (all of them when there are no more; ties to the lower pool), and mla.c adds
 * its own incomplete pool when index_tail. A "shared" layer reuses the selection of the
 * layer before it (idx_sel is left as it is).
 * Cache per indexer layer and position: [k | gate | key of the pool that ends there]
 * (3D floats), so decoding scores the cached pool keys and recomputes nothing. Tokens
 * are independent tasks, so thread count never changes a result.
 */

#define LN_EPS 1e-6f

static uint64_t dsa_row_floats(const wpi_hparams *hp)
{
    return own_hp(hp)->index_kpool ? 3ull * hp->index_head_dim : 0;
}

static uint32_t dsa_layers(const wpi_hparams *hp)
{
    uint32_t n = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        n += own_hp(hp)->layer_index[l] == INDEX_FULL && hp->layer_attn[l] != WPI_ATTN_KDA;
    return n;
}

static void layer_norm(float *x, uint32_t n, const float *w, const float *b)
{
    float mean = 0, var = 0;
    for (uint32_t i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (uint32_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    const float inv = 1.0f / sqrtf(var + LN_EPS);
    for (uint32_t i = 0; i < n; i++) x[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* The key of the pool ending at position p, from its tokens' rows, into row p. */
static void pool_key(const wpi_hparams *hp, const float *ape, float *rows, uint32_t p)
{
    const uint32_t D = hp->index_head_dim, P = own_hp(hp)->index_kpool;
    const size_t RW = 3 * (size_t)D;
    const float *first = rows + (size_t)(p + 1 - P) * RW;
    float *key = rows + (size_t)p * RW + 2 * D;
    float e[MAX_KPOOL];
    for (uint32_t c = 0; c < D; c++) {
        float mx = -INFINITY, sum = 0, acc = 0;
        for (uint32_t i = 0; i < P; i++) {
            e[i] = first[i * RW + D + c] + ape[(size_t)i * D + c];
            if (e[i] > mx) mx = e[i];
        }
        for (uint32_t i = 0; i < P; i++) sum += (e[i] = expf(e[i] - mx));
        for (uint32_t i = 0; i < P; i++) acc += e[i] / sum * first[i * RW + c];
        key[c] = acc;
    }
}

typedef struct sel_ctx {
    wpi_model *m;
    const float *rows; /* this layer's cache, position 0 */
    uint32_t pos;
} sel_ctx;

static void select_task(void *arg, uint32_t t)
{
    const sel_ctx *a = arg;
    wpi_model *m = a->m;
    const wpi_hparams *hp = m->hp;
    const uint32_t D = hp->index_head_dim, NI = hp->index_heads, P = own_hp(hp)->index_kpool;
    const uint32_t per = hp->index_topk / P, p = a->pos + t, nvis = (p + 1) / P;
    const size_t RW = 3 * (size_t)D;
    int32_t *sel = own(m)->idx_sel + (size_t)t * per;
    if (nvis <= per) {
        for (uint32_t j = 0; j < nvis; j++) sel[j] = (int32_t)j;
        own(m)->idx_nsel[t] = (int32_t)nvis;
        return;
    }
    const float *q = own(m)->idx_q + (size_t)t * NI * D, *w = own(m)->idx_wt + (size_t)t * NI;
    const float scale = 1.0f / sqrtf((float)D);
    float best[MAX_SEL];
    int32_t ids[MAX_SEL];
    uint32_t filled = 0;
    for (uint32_t j = 0; j < nvis; j++) {
        const float *key = a->rows + ((size_t)(j + 1) * P - 1) * RW + 2 * D;
        float s = 0;
        for (uint32_t h = 0; h < NI; h++) {
            float d = m->k->dot_f32(q + (size_t)h * D, key, D) * scale;
            if (d > 0) s += w[h] * d;
        }
        wpi_topk_insert(best, ids, per, &filled, s, (int32_t)j);
    }
    for (uint32_t i = 1; i < per; i++) /* ascending pools: mla.c walks keys in order */
        for (uint32_t k = i; k > 0 && ids[k - 1] > ids[k]; k--) {
            int32_t tmp = ids[k];
            ids[k] = ids[k - 1];
            ids[k - 1] = tmp;
        }
    memcpy(sel, ids, per * sizeof(int32_t));
    own(m)->idx_nsel[t] = (int32_t)per;
}

static void dsa_index(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    const glm5_layer *G = &own(m)->layers[l];
    const uint32_t D = hp->index_head_dim, NI = hp->index_heads, P = own_hp(hp)->index_kpool;
    const size_t H = hp->hidden_size, RW = 3 * (size_t)D;
    float *rows = idx_cache(m) + (size_t)G->idx_slot * m->ctx * RW;
    float *r0 = rows + (size_t)pos * RW;

    wpi_mm a[3] = {{&G->idx_k, r0, RW}, {&G->idx_gate, r0 + D, RW}, {&G->idx_w, own(m)->idx_wt, NI}};
    wpi_matmul(m, a, 3, m->xn, H, n);
    wpi_mm b = {&G->idx_q, own(m)->idx_q, (size_t)NI * D};
    wpi_matmul(m, &b, 1, m->mla_qa, hp->q_lora_rank, n);
    const float ws = 1.0f / sqrtf((float)NI);
    for (uint32_t t = 0; t < n; t++) {
        layer_norm(r0 + t * RW, D, G->idx_k_norm, G->idx_k_norm_b);
        for (uint32_t h = 0; h < NI; h++) own(m)->idx_wt[(size_t)t * NI + h] *= ws;
        if ((pos + t + 1) % P == 0) pool_key(hp, G->idx_ape, rows, pos + t);
    }

    sel_ctx c = {m, rows, pos};
    uint64_t work = (uint64_t)n * ((pos + n) / P + 1) * NI * D;
    if (work < (1u << 15) || wpi_pool_threads(m->pool) <= 1) {
        for (uint32_t t = 0; t < n; t++) select_task(&c, t);
    } else {
        wpi_parallel_for(m->pool, n, select_task, &c);
    }
}

/* ---- checks and the layer ----------------------------------------------------------- */

static wp_status check_hparams(const wpi_hparams *hp, char *err, size_t cap)
{
#define HP(cond, ...) \
    if (!(cond)) return wpi_fail(err, cap, WP_E_FORMAT, "glm5_next: " __VA_ARGS__)
    HP(hp->kv_lora_rank, "kv_lora_rank is required (> 0)");
    HP(hp->q_lora_rank > 0, "q_lora_rank is required (the indexer reads the q lora)");
    HP(hp->rope_dim == 0 && hp->qk_nope_head_dim == hp->head_dim && hp->v_head_dim,
       "attention has no positional encoding: rope_dim 0, head_dim = qk_nope_head_dim");
    HP(hp->qk_norm == WPI_QK_NONE && hp->clip_qkv == 0 && !hp->shared_expert_gate,
       "no qk_norm, clip_qkv or shared expert gate");
    HP(hp->hc_mult >= 1 && hp->hc_sinkhorn_iters >= 1, "hc_mult and hc_sinkhorn_iters are needed");
    HP(hp->kda_heads && hp->kda_head_dim && hp->kda_conv,
       "kda_heads, kda_head_dim and kda_conv are needed");
    HP(hp->swiglu_alpha == 0, "no swiglu_alpha (the SwiGLU clamp is swiglu_limit alone)");
    HP(own_hp(hp)->index_kpool && own_hp(hp)->index_tail,
       "the DSA indexer (index_*) with index_tail is needed");
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        HP(hp->layer_attn[l] != WPI_ATTN_SLIDING, "layer %u: sliding attention", l);
        HP(hp->layer_attn[l] == WPI_ATTN_KDA || own_hp(hp)->layer_index[l] != INDEX_NONE,
           "layer %u: an MLA layer needs index_kinds \"full\" or \"shared\"", l);
        HP(hp->layer_attn[l] != WPI_ATTN_KDA || own_hp(hp)->layer_index[l] == INDEX_NONE,
           "layer %u: a KDA layer has no indexer (index_kinds \"none\")", l);
    }
#undef HP
    return WP_OK;
}

static wp_status check_text(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    TRY(check_hparams(hp, err, cap));
    TRY(wpi_check_decoder(c, err, cap));
    const uint64_t H = hp->hidden_size, NH = hp->n_heads, R = hp->kv_lora_rank;
    const uint64_t QL = hp->q_lora_rank, QD = NH * hp->head_dim;
    const uint64_t HC = hp->hc_mult, MIX = (2 + HC) * HC;
    const uint64_t ID = hp->index_head_dim, NI = hp->index_heads;
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        TRY(wpi_need_vector(c, NAME("hc_attn.fn"), MIX * HC * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.base"), MIX, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.scale"), 3, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.fn"), MIX * HC * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.base"), MIX, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.scale"), 3, err, cap));
        if (hp->layer_is_moe[l])
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
        if (hp->layer_attn[l] == WPI_ATTN_KDA) {
            TRY(wpi_kda_check_layer(c, l, err, cap));
            continue;
        }
        TRY(wpi_need_matrix(c, NAME("attn_q_a.weight"), QL, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_q_a_norm.weight"), QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_q_b.weight"), QD, QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_kv_a_mqa.weight"), R, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_kv_a_norm.weight"), R, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_kv_b.weight"),
                            NH * (hp->qk_nope_head_dim + hp->v_head_dim), R, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_output.weight"), H, NH * hp->v_head_dim, err, cap));
        if (own_hp(hp)->layer_index[l] != INDEX_FULL) continue;
        TRY(wpi_need_matrix(c, NAME("attn_idx_q.weight"), NI * ID, QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_idx_k.weight"), ID, H, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_idx_gate.weight"), ID, H, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_idx_w.weight"), NI, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_idx_k_norm.weight"), ID, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_idx_k_norm.bias"), ID, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_idx_ape"), (uint64_t)own_hp(hp)->index_kpool * ID, err, cap));
#undef NAME
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size;
    const wpi_hc_dims d = wpi_hc_dims_of(hp);
    if (l == 0) wpi_hc_expand(&d, m->x, n, own(m)->hc_x); /* the embedding into every stream */

    /* attention: the block reads x and leaves its output in xn */
    wpi_hc_pre(m->k, m->pool, &d, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, own(m)->hc_x,
               n, own(m)->hc_post, own(m)->hc_comb, m->x, H, own(m)->hc_scr);
    if (hp->layer_attn[l] == WPI_ATTN_KDA) {
        wpi_kda_block(m, l, n, pos);
    } else {
        wpi_mla_project(m, l, n);
        if (own_hp(hp)->layer_index[l] == INDEX_FULL) dsa_index(m, l, n, pos);
        const glm5_hp *o = own_hp(hp);
        const wpi_mla_pools ps = {own(m)->idx_sel, own(m)->idx_nsel, o->index_kpool,
                                  hp->index_topk / o->index_kpool, o->index_tail};
        wpi_mla_attend(m, l, n, pos, &ps);
        wpi_mla_output(m, l, n);
    }
    wpi_hc_post(m->pool, &d, own(m)->hc_x, m->xn, H, own(m)->hc_post, own(m)->hc_comb, n);

    /* FFN: the block reads x and leaves its output in moe_out */
    wpi_hc_pre(m->k, m->pool, &d, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, own(m)->hc_x, n,
               own(m)->hc_post, own(m)->hc_comb, m->x, H, own(m)->hc_scr);
    if (L->is_moe) {
        wp_status st = wpi_moe_block(m, l, n);
        if (st != WP_OK) return st;
    } else {
        wpi_ffn_block(m, l, n);
    }
    wpi_hc_post(m->pool, &d, own(m)->hc_x, m->moe_out, H, own(m)->hc_post, own(m)->hc_comb, n);

    if (l + 1 == hp->n_layers) /* the final norm reads x: the streams' mean */
        wpi_hc_head(m->k, m->pool, &d, NULL, NULL, NULL, own(m)->hc_x, n, m->x, H, NULL);
    return WP_OK;
}


/* ---- hooks: state, scratch, binding ----------------------------------------------------- */

/* An MLA layer with its own indexer (index_kinds "full"). */
static int is_indexer(const wpi_hparams *hp, uint32_t l)
{
    return own_hp(hp)->layer_index[l] == INDEX_FULL && hp->layer_attn[l] != WPI_ATTN_KDA;
}

/* MLA latent rows and KDA states (mla.c), then a row per position of every indexer layer. */
static void state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS])
{
    wpi_mla_state_bytes(hp, ctx, out);
    out[WP_STATE_INDEXER] = (uint64_t)dsa_layers(hp) * ctx * dsa_row_floats(hp) * sizeof(float);
}

/* The hyper-connection streams and weights, the indexer's chunk buffers. */
static void scratch(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, wpi_carve *cv)
{
    const uint64_t C = chunk, H = hp->hidden_size, HC = hp->hc_mult;
    const wpi_hc_dims hd = wpi_hc_dims_of(hp);
    const uint64_t NI = own_hp(hp)->index_kpool ? hp->index_heads : 0;
    const uint64_t SEL = own_hp(hp)->index_kpool ? hp->index_topk / own_hp(hp)->index_kpool : 0;
    glm5_model *a = wpi_carve_own(cv, m, sizeof *a);
    WPI_CARVE(cv, a, layers, glm5_layer, hp->n_layers);
    WPI_CARVE(cv, a, hc_x, float, C * HC * H);
    WPI_CARVE(cv, a, hc_post, float, C * HC);
    WPI_CARVE(cv, a, hc_comb, float, C * HC * HC);
    WPI_CARVE(cv, a, hc_scr, float, HC ? wpi_hc_scratch_floats(&hd, chunk) : 0);
    WPI_CARVE(cv, a, idx_q, float, C * NI * hp->index_head_dim);
    WPI_CARVE(cv, a, idx_wt, float, C * NI);
    WPI_CARVE(cv, a, idx_sel, int32_t, C * SEL);
    WPI_CARVE(cv, a, idx_nsel, int32_t, SEL ? C : 0);
}

/* kv as MLA's (mla.c), then the indexer rows; the indexer tensors of its layers. */
static void bind(wpi_model *m, const wpi_container *c, void *kv)
{
    const wpi_hparams *hp = m->hp;
    uint32_t n_idx = 0;
    wpi_mla_bind(m, c, kv);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        glm5_layer *G = &own(m)->layers[l];
        if (!is_indexer(hp, l)) continue;
        G->idx_slot = n_idx++;
        G->idx_q = wpi_bind_mat(c, "blk.%u.attn_idx_q.weight", l);
        G->idx_k = wpi_bind_mat(c, "blk.%u.attn_idx_k.weight", l);
        G->idx_gate = wpi_bind_mat(c, "blk.%u.attn_idx_gate.weight", l);
        G->idx_w = wpi_bind_mat(c, "blk.%u.attn_idx_w.weight", l);
        G->idx_k_norm = wpi_bind_vec(c, "blk.%u.attn_idx_k_norm.weight", l);
        G->idx_k_norm_b = wpi_bind_vec(c, "blk.%u.attn_idx_k_norm.bias", l);
        G->idx_ape = wpi_bind_vec(c, "blk.%u.attn_idx_ape", l);
    }
}

/* An indexer layer saves its indexer rows [0, pos) as part 1; the rest as MLA does. */
static size_t state_part(const wpi_model *m, uint32_t l, int v, uint32_t pos, float **at)
{
    const wpi_hparams *hp = m->hp;
    if (v && is_indexer(hp, l)) {
        *at = idx_cache(m) + (size_t)own(m)->layers[l].idx_slot * m->ctx * dsa_row_floats(hp);
        return dsa_row_floats(hp) * sizeof(float) * pos;
    }
    return wpi_mla_state_part(m, l, v, pos, at);
}

/* ---- the image tower --------------------------------------------------------------- */

static wpi_vit_opts tower_opts(const wpi_vision_hp *v)
{
    return (wpi_vit_opts){.rms_norm = 1, .qk_norm = 1, .rope_half = 1, .glu = 1,
                          .biases_optional = 1, .glu_limit = v->glu_limit};
}

static wp_status vision_check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_vision_hp *v = &c->vhp;
    const uint64_t D = v->hidden_size, O = v->out_hidden_size, P = v->proj_intermediate_size;
    const uint64_t M = (uint64_t)v->merge_size * v->merge_size * D;
    if (D % v->n_heads || (D / v->n_heads) % 4 || v->attn_hidden_size != D)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "glm5_next: vision head width %llu / %u must be a multiple of 4 "
                        "(attention as wide as the tower)",
                        (unsigned long long)D, v->n_heads);
    if (!P || v->act != WPI_ACT_SILU || v->proj_act != WPI_ACT_GELU)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "glm5_next: vision proj_intermediate_size > 0, act silu, proj_act gelu");
    const wpi_vit_opts o = tower_opts(v);
    const uint64_t pd = (uint64_t)v->channels * v->temporal_patch_size * v->patch_size *
                        v->patch_size;
    TRY(wpi_need_matrix(c, "v.patch_embd.weight", D, pd, err, cap));
    TRY(wpi_opt_vector(c, "v.patch_embd.bias", D, err, cap));
    for (uint32_t l = 0; l < v->n_layers; l++) TRY(wpi_vit_check_layer(c, &o, l, err, cap));
    TRY(wpi_need_vector(c, "v.post_ln.weight", D, err, cap));
    TRY(wpi_need_matrix(c, "v.mm_down.weight", O, M, err, cap));
    TRY(wpi_opt_vector(c, "v.mm_down.bias", O, err, cap));
    TRY(wpi_need_matrix(c, "v.mm_proj.weight", O, O, err, cap));
    TRY(wpi_need_vector(c, "v.mm_norm.weight", O, err, cap));
    TRY(wpi_need_vector(c, "v.mm_norm.bias", O, err, cap));
    TRY(wpi_need_matrix(c, "v.mm_gate.weight", P, O, err, cap));
    TRY(wpi_need_matrix(c, "v.mm_up.weight", P, O, err, cap));
    TRY(wpi_need_matrix(c, "v.mm_ffn_down.weight", O, P, err, cap));
    return WP_OK;
}

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    TRY(check_text(c, err, cap));
    return c->has_vision ? vision_check(c, err, cap) : WP_OK;
}

/* Floats for n patches: x, xn, att [n, D]; qkv [n, 3D]; ff [2n, F]; cos, sin; rows, cols;
 * the merged tokens' [n, 2 O + 2 P] (n >= their count). */
static uint64_t tower_work_bytes(const wpi_vision_hp *v, uint32_t n)
{
    const uint64_t D = v->hidden_size, F = v->intermediate_size, hd = D / v->n_heads;
    const uint64_t O = v->out_hidden_size, P = v->proj_intermediate_size;
    return (uint64_t)n * (6 * D + 2 * F + hd + 2 + 2 * O + 2 * P) * sizeof(float) + 16 * 64;
}

static uint32_t tower_rows(const wpi_vision_hp *v, const uint32_t thw[3], char *err, size_t cap)
{
    return wpi_vit_merged_rows(v, thw, "glm5_next", err, cap);
}

static void tower_encode(wpi_model *m, const wpi_container *c, const float *pixels,
                         const uint32_t thw[3], float *out, void *work)
{
    const wpi_vision_hp *v = &c->vhp;
    const uint32_t h = thw[1], w = thw[2], n = h * w, mg = v->merge_size, kk = mg * mg;
    const uint32_t D = v->hidden_size, F = v->intermediate_size, hd = D / v->n_heads;
    const uint32_t O = v->out_hidden_size, P = v->proj_intermediate_size, ntok = n / kk;
    const uint32_t pd = v->channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    const wpi_vit_opts o = tower_opts(v);
    wpi_carve cv = {work, 0};
    wpi_vit_buf b;
#define TAKE(count) wpi_carve_take(&cv, (uint64_t)(count), sizeof(float))
    b.x = TAKE((uint64_t)n * D);
    b.xn = TAKE((uint64_t)n * D);
    b.att = TAKE((uint64_t)n * D);
    b.qkv = TAKE((uint64_t)n * 3 * D);
    b.ff = TAKE((uint64_t)2 * n * F);
    b.cos = TAKE((uint64_t)n * (hd / 2));
    b.sin = TAKE((uint64_t)n * (hd / 2));
    uint32_t *row = TAKE(n), *col = TAKE(n);
    float *t1 = TAKE((uint64_t)ntok * O), *t2 = TAKE((uint64_t)ntok * O);
    float *g = TAKE((uint64_t)ntok * P), *u = TAKE((uint64_t)ntok * P);
#undef TAKE
    wpi_wmat pw = wpi_bind_mat(c, "v.patch_embd.weight", 0);
    wpi_vit_linear(m, &pw, wpi_bind_vec(c, "v.patch_embd.bias", 0), pixels, pd, n, b.x, D);
    /* patch t of the merge-block order (block row, block col, row in it, col in it) */
    for (uint32_t t = 0; t < n; t++) {
        const uint32_t blk = t / kk, in = t % kk, bw = w / mg;
        row[t] = blk / bw * mg + in / mg;
        col[t] = blk % bw * mg + in % mg;
    }
    wpi_vit_rope_table(row, col, n, hd, v->rope_theta, WPI_VIT_ROPE_ROWS_COLS, b.cos, b.sin);
    for (uint32_t l = 0; l < v->n_layers; l++) wpi_vit_layer(m, c, &o, l, &b, n);
    const float *pl = wpi_bind_vec(c, "v.post_ln.weight", 0);
    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(b.xn + (size_t)t * D, b.x + (size_t)t * D, pl, D, v->norm_eps);
    /* xn is [ntok, kk * D]: a merge block's patches are consecutive */
    wpi_wmat wd = wpi_bind_mat(c, "v.mm_down.weight", 0);
    wpi_vit_linear(m, &wd, wpi_bind_vec(c, "v.mm_down.bias", 0), b.xn, (size_t)kk * D, ntok,
                   t1, O);
    wpi_wmat wp = wpi_bind_mat(c, "v.mm_proj.weight", 0);
    wpi_vit_linear(m, &wp, NULL, t1, O, ntok, t2, O);
    const float *nw = wpi_bind_vec(c, "v.mm_norm.weight", 0), *nb = wpi_bind_vec(c, "v.mm_norm.bias", 0);
    for (uint32_t t = 0; t < ntok; t++) {
        wpi_layernorm(t1 + (size_t)t * O, t2 + (size_t)t * O, nw, nb, O, v->proj_norm_eps);
        for (uint32_t i = 0; i < O; i++)
            t1[(size_t)t * O + i] = wpi_gelu(t1[(size_t)t * O + i], v->proj_act);
    }
    wpi_wmat wg = wpi_bind_mat(c, "v.mm_gate.weight", 0), wu = wpi_bind_mat(c, "v.mm_up.weight", 0);
    wpi_vit_linear(m, &wg, NULL, t1, O, ntok, g, P);
    wpi_vit_linear(m, &wu, NULL, t1, O, ntok, u, P);
    const float lim = v->glu_limit;
    for (size_t i = 0; i < (size_t)ntok * P; i++) {
        float gi = g[i], ui = u[i];
        if (lim > 0) {
            gi = gi > lim ? lim : gi;
            ui = ui > lim ? lim : ui < -lim ? -lim : ui;
        }
        g[i] = gi / (1.0f + expf(-gi)) * ui;
    }
    wpi_wmat wf = wpi_bind_mat(c, "v.mm_ffn_down.weight", 0);
    wpi_vit_linear(m, &wf, NULL, g, P, ntok, out, c->hp.hidden_size);
}

static const wpi_vision tower = {
    .check = vision_check,
    .work_bytes = tower_work_bytes,
    .out_rows = tower_rows,
    .encode = tower_encode,
};

const wpi_arch wpi_arch_glm5_next = {
    .name = "glm5_next",
    WPI_ARCH_OWN_HOOKS,
    .no_truncate = wpi_kda_no_truncate,
    .vision = &tower,
};
