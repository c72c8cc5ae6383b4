/*
 * deepseek_v4.c -- DeepseekV4ForCausalLM (DeepSeek V4 / V4.1 Flash).
 *   The residual is hc_mult hyper-connection streams (blocks/hyper.c): the embedding is
 *   copied into every stream; per layer
 *     a = attention(rmsnorm(collapse_attn(h)))      attention below: sliding window,
 *     h = post_attn * a + comb_attn^T h              plus HCA or CSA compressed keys
 *     f = moe(rmsnorm(collapse_ffn(h)))              MoE below: hash or top-k routing,
 *     h = post_ffn * f + comb_ffn^T h                sqrtsoftplus scores, shared expert
 *   and after the last layer the hyper head collapses the streams into x, which the common
 *   walk (forward.c) normalizes and projects to logits. Tensors: docs/FORMAT.md section 4.
 *   The multi-token-prediction head is not used.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "route_trace.h"
#include "json.h"

enum { CMP_NONE = 0, CMP_CSA = 1, CMP_HCA = 2 }; /* per layer */
#define WPI_V4_MAX_RATE 1024 /* compress_rate_csa / _hca: the softmax rows of a window */
#define MAX_ROPE_DIM 1024    /* a compressed entry's rope on the stack */

/* Its own hparams (hp->arch). */
typedef struct v4_hp {
    uint32_t o_groups, o_lora_rank;         /* grouped output projection */
    uint32_t compress_rate_csa, compress_rate_hca;
    uint8_t layer_compress[WPI_MAX_LAYERS]; /* CMP_* per layer */
    uint8_t layer_hash[WPI_MAX_LAYERS];     /* 1: experts chosen by token id (hash routing) */
} v4_hp;
WPI_OWN_HPARAMS(v4_hp)

/* Its own tensors per layer (q is the shared wq_a, q_a_norm, wq_b; sinks attn_sinks). */
typedef struct v4_layer {
    wpi_wmat wkv, wo_a, wo_b;         /* kv [hd, H], o_a [g*r, nh*hd/g], o_b */
    const float *kv_norm;             /* [head_dim] */
    wpi_wmat cmp_kv, cmp_gate;        /* compressor [w, H], w = hd (HCA), 2hd (CSA) */
    const float *cmp_bias, *cmp_norm; /* [rate, w], [head_dim] */
    wpi_wmat idx_kv, idx_gate;        /* indexer compressor [2ihd, H] */
    wpi_wmat idx_q, idx_w;            /* [ih*ihd, q_lora_rank], [ih, H] */
    const float *idx_bias, *idx_norm; /* [rate, 2ihd], [ihd] */
    const float *hash_ids;            /* [vocab, top_k] expert ids as f32, or NULL */
    size_t cstate;                    /* this layer's state block: floats into m->kcache */
} v4_layer;
/* Its model state (m->arch, carved by scratch; shared by a context's sequences, so it
 * holds no pointer into a sequence's state: cstate is an offset into m->kcache). */
typedef struct v4_model {
    v4_layer *layers;                 /* [n_layers] */
    float *buf;                       /* scratch_floats: the carve below */
    const float *rope_freqs_c;        /* [rope_dim/2] compressed-branch frequencies, or NULL */
    const float *hc_head_fn, *hc_head_base, *hc_head_scale; /* final hyper head */
} v4_model;
WPI_OWN_MODEL(v4_model)

/* ---- hparams: the keys only deepseek_v4 reads ---------------------------------------- */

#define W "manifest.json: hparams"

/* The grouped output projection (o_groups, o_lora_rank), the compression rates
 * (compress_rate_csa, compress_rate_hca), the per-layer attention compression
 * (compress_kinds: "none", "csa" or "hca") and hash-routed MoE layers (hash_layers:
 * booleans), after the shared blocks' keys. Absent means zero (off). */
static const wpi_hp_bound bounds[] = {
    WPI_HP_U32(v4_hp, o_groups, 0, 4096),
    WPI_HP_U32(v4_hp, o_lora_rank, 0, 1u << 16),
    WPI_HP_U32(v4_hp, compress_rate_csa, 0, WPI_V4_MAX_RATE),
    WPI_HP_U32(v4_hp, compress_rate_hca, 0, WPI_V4_MAX_RATE),
};

static wp_status hparams(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    v4_hp *o = own_hp(hp);
    TRY(wpi_hparams_shared(h, hp, err, cap));
    memset(o, 0, sizeof *o);
    TRY(wpi_hparams_bounds(h, bounds, sizeof bounds / sizeof bounds[0], o, err, cap));
    static const char *const kinds[] = {[CMP_NONE] = "none", [CMP_CSA] = "csa",
                                        [CMP_HCA] = "hca"};
    TRY(wpi_hparam_kinds(h, "compress_kinds", kinds, 3, hp->n_layers, o->layer_compress, err,
                         cap));
    for (uint32_t l = 0; l < hp->n_layers; l++)
        if ((o->layer_compress[l] == CMP_CSA && !o->compress_rate_csa) ||
            (o->layer_compress[l] == CMP_HCA && !o->compress_rate_hca))
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".compress_kinds[%u]: \"%s\" needs compress_rate_%s", l,
                            kinds[o->layer_compress[l]], kinds[o->layer_compress[l]]);
    const wpi_json *v = wpi_json_get(h, "hash_layers");
    if (v && v->type != WPI_JSON_NULL) {
        if (v->type != WPI_JSON_ARRAY || v->len != hp->n_layers)
            return wpi_fail(err, cap, WP_E_FORMAT, W ".hash_layers: expected %u booleans",
                            hp->n_layers);
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            int b;
            if (!wpi_json_bool(&v->items[l], &b))
                return wpi_fail(err, cap, WP_E_FORMAT, W ".hash_layers[%u]: expected a boolean", l);
            o->layer_hash[l] = (uint8_t)b;
        }
    }
    return WP_OK;
}

#undef W

/* ---- attention ----------------------------------------------------------------------
 *
 * Shared-KV multi-query attention with sinks over a sliding window, plus compressed keys:
 * heavily compressed (HCA, every causal entry) or compressed sparse (CSA, the lightning
 * indexer's top-k entries).
 *
 * Per token at position p, with x the block input (normed), hd = head_dim, RD = rope_dim
 * (the trailing RD dims of a head rotate, GPT-J pairs), rope "main" on sliding-only layers
 * and "compress" (rope_freqs_c) on CSA/HCA layers:
 *   qr = rmsnorm(Wq_a x; q_a_norm)                         [q_lora_rank]
 *   q  = rope(rmsnorm_h(Wq_b qr))  per head, unweighted    [n_heads, hd]
 *   kv = rope(rmsnorm(Wkv x; kv_norm))                     [hd]  (key = value)
 *   keys: kv of positions p-W+1..p (W = sliding_window), then compressed entries
 *   o_h = sum_k softmax([q_h.k * scale, sink_h])_k k       (the sink takes weight, no value)
 *   o_h = rope^-1(o_h) at p; out = Wo_b [Wo_a,g o_g for each of o_groups groups]
 * Compressor of rate m (HCA: width hd; CSA: 2hd, two series Ca = [:hd], Cb = [hd:]):
 *   c = Wc x, z = Wz x per token; window w (tokens wm..wm+m-1) closes at p = wm+m-1:
 *   HCA: e_w = sum_j softmax_j(z_j + B_j) c_j (per dim) over the window's m tokens
 *   CSA: the same over 2m slots: Ca of window w-1 (weight 0 for w = 0) then Cb of window w
 *   e_w = rope_c(rmsnorm(e_w; cmp_norm)) at position wm. A query at p sees entries
 *   w < (p+1)/m (windows already closed).
 * Indexer (CSA): its own compressor at index_head_dim (entries k_w); per query
 *   qi = rope_c(Wiq qr) [ih, ihd]; wt = Wiw x / sqrt(ih);
 *   score_w = sum_h relu(qi_h.k_w) / sqrt(ihd) * wt_h; the index_topk best causal entries
 *   (ties to the lower index) are the CSA keys.
 *
 * State per layer (floats, layer_state_floats), fixed at ctx:
 *   ring [W][hd]: kv of position q at row q % W
 *   HCA: c, z [m][hd] (row q % m); entries [ctx / m][hd]
 *   CSA: c, z [2m][2hd] (row q % 2m: the open window and the one before);
 *        entries [ctx / m][hd]; indexer c, z [2m][2ihd], entries [ctx / m][ihd]
 * Everything read is a function of the position, so nothing is reset at position 0.
 * Tasks are (token, head) pairs and tokens; the thread count never changes a result.
 */

static uint32_t cmp_rate(const wpi_hparams *hp, uint32_t l)
{
    return own_hp(hp)->layer_compress[l] == CMP_CSA   ? own_hp(hp)->compress_rate_csa
           : own_hp(hp)->layer_compress[l] == CMP_HCA ? own_hp(hp)->compress_rate_hca
                                                  : 0;
}

/* Offsets (floats) of the parts of a layer's state. */
typedef struct v4_state {
    size_t ring, c, z, ent, ic, iz, ient, total;
    uint32_t m, slots, cw, n_ent; /* rate, ring rows of c/z, width of c/z, entry capacity */
} v4_state;

static v4_state state_of(const wpi_hparams *hp, uint32_t l, uint32_t ctx)
{
    v4_state s;
    memset(&s, 0, sizeof s);
    const size_t hd = hp->head_dim, ihd = hp->index_head_dim;
    size_t off = (size_t)hp->sliding_window * hd;
    s.m = cmp_rate(hp, l);
    if (s.m) {
        const int csa = own_hp(hp)->layer_compress[l] == CMP_CSA;
        s.slots = csa ? 2 * s.m : s.m;
        s.cw = (uint32_t)(csa ? 2 * hd : hd);
        s.n_ent = ctx / s.m;
        s.c = off;
        off += (size_t)s.slots * s.cw;
        s.z = off;
        off += (size_t)s.slots * s.cw;
        s.ent = off;
        off += (size_t)s.n_ent * hd;
        if (csa) {
            s.ic = off;
            off += (size_t)s.slots * 2 * ihd;
            s.iz = off;
            off += (size_t)s.slots * 2 * ihd;
            s.ient = off;
            off += (size_t)s.n_ent * ihd;
        }
    }
    s.total = off;
    return s;
}

static uint64_t layer_state_floats(const wpi_hparams *hp, uint32_t l, uint32_t ctx)
{
    return state_of(hp, l, ctx).total;
}


/* Scratch carve, in floats: the hyper-connection buffers first (used by the arch file),
 * then the attention's. */
typedef struct v4_scr {
    float *streams, *post, *comb, *hcs, *coll, *y;        /* arch/deepseek_v4.c */
    float *kv, *cc, *cs, *ckv, *cz, *ikv, *iz, *iq, *iw, *selw, *oa;
    int32_t *sel;
} v4_scr;

static uint64_t carve(const wpi_hparams *hp, uint32_t C, float *b, v4_scr *o)
{
    const uint64_t H = hp->hidden_size, hc = hp->hc_mult, hd = hp->head_dim;
    const uint64_t ihd = hp->index_head_dim, ih = hp->index_heads, KI = hp->index_topk;
    const wpi_hc_dims d = wpi_hc_dims_of(hp);
    uint64_t off = 0;
#define PART(field, count)                                          \
    do {                                                            \
        if (b) o->field = (void *)(b + off);                        \
        off += ((uint64_t)(count) + 15) / 16 * 16;                  \
    } while (0)
    PART(streams, C * hc * H);
    PART(post, C * hc);
    PART(comb, C * hc * hc);
    PART(hcs, wpi_hc_scratch_floats(&d, C));
    PART(coll, C * H);
    PART(y, C * H);
    PART(kv, C * hd);
    PART(cc, C * (hp->rope_dim / 2));
    PART(cs, C * (hp->rope_dim / 2));
    PART(ckv, C * 2 * hd);
    PART(cz, C * 2 * hd);
    PART(ikv, C * 2 * ihd);
    PART(iz, C * 2 * ihd);
    PART(iq, C * ih * ihd);
    PART(iw, C * ih);
    PART(sel, C * KI);
    PART(selw, C * KI);
    PART(oa, C * own_hp(hp)->o_groups * own_hp(hp)->o_lora_rank);
#undef PART
    return off;
}

static uint64_t scratch_floats(const wpi_hparams *hp, uint32_t chunk)
{
    return carve(hp, chunk, NULL, NULL);
}

/* The layer's view of the same carve. */
static void hc_buffers(wpi_model *m, float **streams, float **post, float **comb,
                       float **hcs, float **coll, float **y)
{
    v4_scr s;
    carve(m->hp, m->chunk, own(m)->buf, &s);
    *streams = s.streams;
    *post = s.post;
    *comb = s.comb;
    *hcs = s.hcs;
    *coll = s.coll;
    *y = s.y;
}

/* ---- rope --------------------------------------------------------------------------- */

static void rope_at(const float *freqs, uint32_t half, uint32_t p, float *c, float *s)
{
    for (uint32_t i = 0; i < half; i++) {
        float a = (float)p * freqs[i];
        c[i] = (float)cos((double)a);
        s[i] = (float)sin((double)a);
    }
}

/* Rotates the trailing rd dims of n vectors of width w (stride w), GPT-J pairs; sign -1
 * rotates backwards. */
static void rope_tail(float *v, uint32_t n, uint32_t w, uint32_t rd, const float *c,
                      const float *s, float sign)
{
    for (uint32_t h = 0; h < n; h++) {
        float *x = v + (size_t)h * w + (w - rd);
        for (uint32_t i = 0; i < rd / 2; i++) {
            float a = x[2 * i], b = x[2 * i + 1], sn = sign * s[i];
            x[2 * i] = a * c[i] - b * sn;
            x[2 * i + 1] = b * c[i] + a * sn;
        }
    }
}

/* ---- compressor ----------------------------------------------------------------------- */

/* Entry of window w from the c/z ring (rows q % slots, cw floats each): per dim, a
 * softmax over the window's slots of z + bias weighting c; with overlap (CSA) the slots
 * are Ca of window w-1 (none for w = 0) then Cb of window w. */
static void compress_window(const float *ring_c, const float *ring_z, uint32_t slots,
                            uint32_t cw, uint32_t m, uint32_t hd, int overlap, uint32_t w,
                            const float *bias, const float *norm, float eps,
                            const float *freqs, uint32_t rd, float *out)
{
    float cbuf[MAX_ROPE_DIM / 2], sbuf[MAX_ROPE_DIM / 2];
    float g[2 * WPI_V4_MAX_RATE], v[2 * WPI_V4_MAX_RATE];
    for (uint32_t d = 0; d < hd; d++) {
        uint32_t ns = 0;
        if (overlap && w > 0)
            for (uint32_t j = 0; j < m; j++) {
                size_t row = ((size_t)(w - 1) * m + j) % slots * cw;
                g[ns] = ring_z[row + d] + bias[(size_t)j * cw + d];
                v[ns++] = ring_c[row + d];
            }
        const uint32_t off = overlap ? hd : 0;
        for (uint32_t j = 0; j < m; j++) {
            size_t row = ((size_t)w * m + j) % slots * cw;
            g[ns] = ring_z[row + off + d] + bias[(size_t)j * cw + off + d];
            v[ns++] = ring_c[row + off + d];
        }
        float mx = -INFINITY, sum = 0, acc = 0;
        for (uint32_t i = 0; i < ns; i++)
            if (g[i] > mx) mx = g[i];
        for (uint32_t i = 0; i < ns; i++) sum += (g[i] = expf(g[i] - mx));
        for (uint32_t i = 0; i < ns; i++) acc += v[i] * (g[i] / sum);
        out[d] = acc;
    }
    wpi_rmsnorm(out, out, norm, hd, eps);
    rope_at(freqs, rd / 2, w * m, cbuf, sbuf);
    rope_tail(out, 1, hd, rd, cbuf, sbuf, 1.0f);
}

/* Feeds the chunk's projected rows (c, z: [n][cw]) through the ring, closing windows. */
static void compressor_feed(const wpi_hparams *hp, float *ring_c, float *ring_z,
                            float *entries, const v4_state *s, uint32_t hd, int overlap,
                            const float *c, const float *z, uint32_t n, uint32_t pos,
                            const float *bias, const float *norm, const float *freqs)
{
    for (uint32_t t = 0; t < n; t++) {
        uint32_t p = pos + t;
        memcpy(ring_c + (size_t)(p % s->slots) * s->cw, c + (size_t)t * s->cw,
               sizeof(float) * s->cw);
        memcpy(ring_z + (size_t)(p % s->slots) * s->cw, z + (size_t)t * s->cw,
               sizeof(float) * s->cw);
        if ((p + 1) % s->m == 0) {
            uint32_t w = (p + 1) / s->m - 1;
            if (w < s->n_ent)
                compress_window(ring_c, ring_z, s->slots, s->cw, s->m, hd, overlap, w, bias,
                                norm, hp->rms_norm_eps, freqs, hp->rope_dim,
                                entries + (size_t)w * hd);
        }
    }
}

/* ---- indexer selection ------------------------------------------------------------------ */

typedef struct idx_ctx {
    const wpi_model *m;
    const float *iq, *iw, *ient;
    int32_t *sel;
    float *selw;
    uint32_t pos, rate;
} idx_ctx;

static void idx_task(void *arg, uint32_t t)
{
    const idx_ctx *c = arg;
    const wpi_hparams *hp = c->m->hp;
    const uint32_t ih = hp->index_heads, ihd = hp->index_head_dim, K = hp->index_topk;
    const uint32_t thr = (c->pos + t + 1) / c->rate;
    const float scale = 1.0f / sqrtf((float)ihd);
    int32_t *ids = c->sel + (size_t)t * K;
    float *w = c->selw + (size_t)t * K;
    uint32_t filled = 0;
    for (uint32_t e = 0; e < thr; e++) {
        const float *k = c->ient + (size_t)e * ihd;
        float sc = 0;
        for (uint32_t h = 0; h < ih; h++) {
            const float *q = c->iq + ((size_t)t * ih + h) * ihd;
            float dot = 0;
            for (uint32_t i = 0; i < ihd; i++) dot += q[i] * k[i];
            float r = (dot > 0 ? dot : 0) * scale;
            sc += r * c->iw[(size_t)t * ih + h];
        }
        wpi_topk_insert(w, ids, K, &filled, sc, (int32_t)e);
    }
    for (uint32_t i = filled; i < K; i++) ids[i] = -1;
}

/* ---- attention core --------------------------------------------------------------------- */

typedef struct att_ctx {
    const wpi_model *m;
    const wpi_layer *L;
    const float *kv, *ring, *ent;
    const int32_t *sel;
    uint32_t n, pos, rate, csa;
} att_ctx;

static inline void online(float l, const float *v, uint32_t hd, float *mx, float *sum,
                          float *acc)
{
    if (l > *mx) {
        float r = expf(*mx - l);
        *sum *= r;
        for (uint32_t i = 0; i < hd; i++) acc[i] *= r;
        *mx = l;
    }
    float e = expf(l - *mx);
    *sum += e;
    for (uint32_t i = 0; i < hd; i++) acc[i] += e * v[i];
}

static void att_task(void *arg, uint32_t task)
{
    const att_ctx *c = arg;
    const wpi_hparams *hp = c->m->hp;
    const uint32_t nh = hp->n_heads, hd = hp->head_dim, W = hp->sliding_window;
    const uint32_t t = task / nh, h = task % nh, p = c->pos + t;
    const float *q = c->m->q + ((size_t)t * nh + h) * hd;
    float *acc = c->m->att + ((size_t)t * nh + h) * hd;
    const float scale = hp->attn_scale;
    const wpi_kernels *k = c->m->k;
    float mx = -INFINITY, sum = 0;
    memset(acc, 0, sizeof(float) * hd);
    uint32_t k0 = p + 1 > W ? p + 1 - W : 0;
    for (uint32_t kp = k0; kp <= p; kp++) {
        const float *row = kp >= c->pos ? c->kv + (size_t)(kp - c->pos) * hd
                                         : c->ring + (size_t)(kp % W) * hd;
        online(k->dot_f32(q, row, hd) * scale, row, hd, &mx, &sum, acc);
    }
    if (c->rate) {
        const uint32_t thr = (p + 1) / c->rate;
        if (c->csa) {
            const int32_t *ids = c->sel + (size_t)t * hp->index_topk;
            for (uint32_t i = 0; i < hp->index_topk; i++) {
                if (ids[i] < 0 || (uint32_t)ids[i] >= thr) continue;
                const float *row = c->ent + (size_t)ids[i] * hd;
                online(k->dot_f32(q, row, hd) * scale, row, hd, &mx, &sum, acc);
            }
        } else {
            for (uint32_t e = 0; e < thr; e++) {
                const float *row = c->ent + (size_t)e * hd;
                online(k->dot_f32(q, row, hd) * scale, row, hd, &mx, &sum, acc);
            }
        }
    }
    /* the sink: a logit without a value */
    float s = c->L->sinks ? c->L->sinks[h] : -INFINITY;
    if (s > mx) {
        float r = expf(mx - s);
        sum *= r;
        for (uint32_t i = 0; i < hd; i++) acc[i] *= r;
        mx = s;
    }
    sum += expf(s - mx);
    for (uint32_t i = 0; i < hd; i++) acc[i] /= sum;
}

static void v4_attention(wpi_model *m, uint32_t l, const float *x, uint32_t n, uint32_t pos,
                      float *out)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const v4_layer *V = &own(m)->layers[l];
    const uint32_t H = hp->hidden_size, nh = hp->n_heads, hd = hp->head_dim;
    const uint32_t QL = hp->q_lora_rank, RD = hp->rope_dim, half = RD / 2, W = hp->sliding_window;
    const uint32_t ih = hp->index_heads, ihd = hp->index_head_dim;
    const v4_state st = state_of(hp, l, m->ctx);
    const int csa = own_hp(hp)->layer_compress[l] == CMP_CSA;
    v4_scr s;
    carve(hp, m->chunk, own(m)->buf, &s);
    float *S = m->kcache + V->cstate;

    /* rope of this layer at the chunk's positions */
    const float *cosv = m->rope_cos, *sinv = m->rope_sin;
    if (st.m) {
        for (uint32_t t = 0; t < n; t++)
            rope_at(own(m)->rope_freqs_c, half, pos + t, s.cc + (size_t)t * half, s.cs + (size_t)t * half);
        cosv = s.cc;
        sinv = s.cs;
    }

    /* q, kv */
    wpi_mm j1[2] = {{&L->wq_a, m->mla_qa, QL}, {&V->wkv, s.kv, hd}};
    wpi_matmul(m, j1, 2, x, H, n);
    for (uint32_t t = 0; t < n; t++) {
        wpi_rmsnorm(m->mla_qa + (size_t)t * QL, m->mla_qa + (size_t)t * QL, L->q_a_norm, QL,
                    hp->rms_norm_eps);
        wpi_rmsnorm(s.kv + (size_t)t * hd, s.kv + (size_t)t * hd, V->kv_norm, hd, hp->rms_norm_eps);
        rope_tail(s.kv + (size_t)t * hd, 1, hd, RD, cosv + (size_t)t * half, sinv + (size_t)t * half, 1.0f);
    }
    wpi_mm j2 = {&L->wq_b, m->q, (size_t)nh * hd};
    wpi_matmul(m, &j2, 1, m->mla_qa, QL, n);
    for (uint32_t t = 0; t < n; t++) {
        float *q = m->q + (size_t)t * nh * hd;
        for (uint32_t h = 0; h < nh; h++) wpi_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, NULL, hd, hp->rms_norm_eps);
        rope_tail(q, nh, hd, RD, cosv + (size_t)t * half, sinv + (size_t)t * half, 1.0f);
    }

    /* compressor (and indexer) */
    if (st.m) {
        wpi_mm jc[2] = {{&V->cmp_kv, s.ckv, st.cw}, {&V->cmp_gate, s.cz, st.cw}};
        wpi_matmul(m, jc, 2, x, H, n);
        compressor_feed(hp, S + st.c, S + st.z, S + st.ent, &st, hd, csa, s.ckv, s.cz, n, pos,
                        V->cmp_bias, V->cmp_norm, own(m)->rope_freqs_c);
    }
    if (csa) {
        wpi_mm ji[3] = {{&V->idx_kv, s.ikv, 2 * ihd}, {&V->idx_gate, s.iz, 2 * ihd},
                        {&V->idx_w, s.iw, ih}};
        wpi_matmul(m, ji, 3, x, H, n);
        v4_state is = st;
        is.cw = 2 * ihd;
        compressor_feed(hp, S + st.ic, S + st.iz, S + st.ient, &is, ihd, 1, s.ikv, s.iz, n, pos,
                        V->idx_bias, V->idx_norm, own(m)->rope_freqs_c);
        wpi_mm jq = {&V->idx_q, s.iq, (size_t)ih * ihd};
        wpi_matmul(m, &jq, 1, m->mla_qa, QL, n);
        const float ws = 1.0f / sqrtf((float)ih);
        for (uint32_t t = 0; t < n; t++) {
            rope_tail(s.iq + (size_t)t * ih * ihd, ih, ihd, RD, cosv + (size_t)t * half,
                      sinv + (size_t)t * half, 1.0f);
            for (uint32_t h = 0; h < ih; h++) s.iw[(size_t)t * ih + h] *= ws;
        }
        idx_ctx ic = {m, s.iq, s.iw, S + st.ient, s.sel, s.selw, pos, st.m};
        wpi_parallel_for(m->pool, n, idx_task, &ic);
    }

    /* attention */
    att_ctx ac = {m, L, s.kv, S, st.m ? S + st.ent : NULL, s.sel, n, pos, st.m, (uint32_t)csa};
    wpi_parallel_for(m->pool, n * nh, att_task, &ac);
    /* the chunk's keys into the ring */
    for (uint32_t t = (n > W ? n - W : 0); t < n; t++)
        memcpy(S + (size_t)((pos + t) % W) * hd, s.kv + (size_t)t * hd, sizeof(float) * hd);

    /* undo the values' rotation, grouped output projection */
    for (uint32_t t = 0; t < n; t++)
        rope_tail(m->att + (size_t)t * nh * hd, nh, hd, RD, cosv + (size_t)t * half,
                  sinv + (size_t)t * half, -1.0f);
    const uint32_t G = own_hp(hp)->o_groups, R = own_hp(hp)->o_lora_rank, gin = nh * hd / G;
    for (uint32_t g = 0; g < G; g++) {
        wpi_wmat wg = V->wo_a;
        wg.data = (const char *)V->wo_a.data + (size_t)g * R * wpi_row_bytes(wg.dtype, gin);
        wg.rows = R;
        wpi_mm jo = {&wg, s.oa + (size_t)g * R, (size_t)G * R};
        wpi_matmul(m, &jo, 1, m->att + (size_t)g * gin, (size_t)nh * hd, n);
    }
    wpi_mm jb = {&V->wo_b, out, H};
    wpi_matmul(m, &jb, 1, s.oa, (size_t)G * R, n);
}

/* ---- mixture of experts ---------------------------------------------------------------
 *
 * On a block input x (normed):
 *   scores = sqrt(softplus(router x))                      [n_experts] (softplus(y) = y > 20)
 *   ids    = hash layer: the table hash_ids[token] (the token id picks its experts)
 *            else the top_k of scores + exp_probs_b (ties to the lower id)
 *   w      = scores[ids] / (sum + 1e-20) * routed_scaling_factor
 *   out    = sum_j w_j expert_ids[j](x) + shared(x)
 * Experts and the shared expert use the clamped SwiGLU
 *   down(silu(min(gate x, limit)) * clamp(up x, -limit, limit))   (limit = swiglu_limit).
 * Experts stream through wpi_experts_* as in moe.c (the chunk's distinct experts, each
 * read once; outputs summed per token in router order), so results never depend on the
 * cache state or the thread count. Decoding one token, the next layer's experts are
 * prefetched (timing only): a hash layer's exactly from the token id, a top-k layer's
 * as its router picks them on an approximation of its input (v4_lookahead).
 */

/* out = down(silu(min(g, lim)) * clamp(u, -lim, lim)) for cnt tokens (rows H apart). */
static void clamped_swiglu(wpi_model *m, const wpi_wmat *gate, const wpi_wmat *up,
                           const wpi_wmat *down, const float *xs, uint32_t cnt, float *out)
{
    const size_t H = m->hp->hidden_size, I = gate->rows;
    const float lim = m->hp->swiglu_limit;
    wpi_mm gu[2] = {{gate, m->ff_g, I}, {up, m->ff_u, I}};
    wpi_matmul(m, gu, 2, xs, H, cnt);
    for (uint32_t t = 0; t < cnt; t++) {
        float *g = m->ff_g + t * I;
        const float *u = m->ff_u + t * I;
        for (size_t r = 0; r < I; r++) {
            float a = g[r], b = u[r];
            if (lim > 0) {
                a = a > lim ? lim : a;
                b = b > lim ? lim : (b < -lim ? -lim : b);
            }
            g[r] = a / (1.0f + expf(-a)) * b;
        }
    }
    wpi_mm d = {down, out, H};
    wpi_matmul(m, &d, 1, m->ff_g, I, cnt);
}

/* wpi_expert_apply_fn over a streamed expert's record. */
static void routed_expert(void *arg, wpi_model *m, const wpi_expert_view *v, int32_t expert,
                          const float *rows, uint32_t cnt, float *out)
{
    wpi_wmat gate = {v->gate, v->dtype, v->inter, v->hidden};
    wpi_wmat up = {v->up, v->dtype, v->inter, v->hidden};
    wpi_wmat down = {v->down, v->dtype, v->hidden, v->inter};
    clamped_swiglu(m, &gate, &up, &down, rows, cnt, out);
}

static float sqrt_softplus(float y)
{
    float sp = y > 20.0f ? y : log1pf(expf(y));
    return sqrtf(sp);
}

static wp_status v4_moe(wpi_model *m, uint32_t l, const float *x, uint32_t n, float *out)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const v4_layer *V = &own(m)->layers[l];
    const size_t H = hp->hidden_size, K = hp->top_k, E = hp->n_experts;

    wpi_wmat r = {L->router, WPI_F32, hp->n_experts, hp->hidden_size};
    wpi_mm job = {&r, m->probs, E};
    wpi_matmul(m, &job, 1, x, H, n);
    for (uint32_t t = 0; t < n; t++) {
        float *sc = m->probs + t * E;
        for (size_t e = 0; e < E; e++) sc[e] = sqrt_softplus(sc[e]);
        int32_t *ids = m->topk_id + t * K;
        float *w = m->topk_w + t * K;
        if (V->hash_ids) {
            const float *row = V->hash_ids + (size_t)m->tokens[t] * K;
            for (size_t j = 0; j < K; j++) ids[j] = (int32_t)row[j];
        } else {
            float *ch = m->route_tmp;
            for (size_t e = 0; e < E; e++) ch[e] = sc[e] + (L->exp_bias ? L->exp_bias[e] : 0.0f);
            wpi_topk(ch, (uint32_t)E, (uint32_t)K, ids, w);
        }
        if (m->trace) wpi_route_trace_ids(m, l, t, ids); /* routing replay */
        float s = 0;
        for (size_t j = 0; j < K; j++) s += (w[j] = sc[ids[j]]);
        s += 1e-20f;
        for (size_t j = 0; j < K; j++) w[j] = w[j] / s * hp->routed_scaling_factor;
    }

    const uint32_t nd = wpi_moe_distinct_experts(m, n);
    wp_status st = wpi_moe_for_each_expert(m, l, x, nd, routed_expert, NULL);
    if (st != WP_OK) return st;

    const int shared = L->sh_gate.data != NULL;
    if (shared) clamped_swiglu(m, &L->sh_gate, &L->sh_up, &L->sh_down, x, n, m->yg);
    for (uint32_t t = 0; t < n; t++) {
        float *acc = out + t * H;
        memset(acc, 0, H * sizeof(float));
        for (size_t j = 0; j < K; j++)
            m->k->axpy_f32(m->topk_w[t * K + j], m->eo + (t * K + j) * H, acc, H);
        if (shared) m->k->axpy_f32(1.0f, m->yg + t * H, acc, H);
    }
    return WP_OK;
}

static void v4_lookahead(wpi_model *m, uint32_t l, const float *approx)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *N = &m->layers[l + 1];
    const v4_layer *NV = &own(m)->layers[l + 1];
    const size_t H = hp->hidden_size, E = hp->n_experts, K = hp->top_k;
    if (NV->hash_ids) { /* the same token picks the next layer's experts: exact */
        const float *row = NV->hash_ids + (size_t)m->tokens[0] * K;
        for (size_t j = 0; j < K; j++) m->la_ids[j] = (int32_t)row[j];
    } else {
        wpi_rmsnorm(m->xg, approx, N->ffn_norm, H, hp->rms_norm_eps);
        wpi_wmat r = {N->router, WPI_F32, hp->n_experts, hp->hidden_size};
        wpi_mm job = {&r, m->la_probs, E};
        wpi_matmul(m, &job, 1, m->xg, H, 1);
        for (size_t e = 0; e < E; e++)
            m->la_probs[e] = sqrt_softplus(m->la_probs[e]) + (N->exp_bias ? N->exp_bias[e] : 0.0f);
        wpi_topk(m->la_probs, (uint32_t)E, (uint32_t)K, m->la_ids, m->la_w);
    }
    wpi_experts_prefetch(m->experts, l + 1, m->la_ids, (uint32_t)K);
}

/* ---- checks and the layer ----------------------------------------------------------- */



static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
#define HP(cond, ...) \
    if (!(cond)) return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v4: " __VA_ARGS__)
    TRY(wpi_hparams_check(hp, err, cap));
    HP(hp->hc_mult >= 1 && hp->hc_sinkhorn_iters >= 1,
       "hc_mult %u and hc_sinkhorn_iters must be >= 1", hp->hc_mult);
    HP(hp->n_kv_heads == 1, "n_heads %u share one key/value head (n_kv_heads %u)", hp->n_heads,
       hp->n_kv_heads);
    HP(hp->head_dim >= 2, "head_dim %u", hp->head_dim);
    HP(hp->rope_dim <= MAX_ROPE_DIM, "rope_dim %u must be <= %d", hp->rope_dim, MAX_ROPE_DIM);
    HP(hp->q_lora_rank > 0, "q_lora_rank must be > 0");
    HP(hp->sliding_window >= 1, "sliding_window must be >= 1");
    HP(own_hp(hp)->o_groups >= 1 && (hp->n_heads * hp->head_dim) % own_hp(hp)->o_groups == 0 &&
           own_hp(hp)->o_lora_rank >= 1,
       "o_groups %u must divide n_heads * head_dim and o_lora_rank be >= 1", own_hp(hp)->o_groups);
    HP(hp->qk_norm == WPI_QK_NONE && hp->clip_qkv == 0 && !hp->shared_expert_gate,
       "no qk_norm, clip_qkv or shared expert gate");
    HP(hp->scoring == WPI_SCORE_SQRTSOFTPLUS, "scoring_func must be \"sqrtsoftplus\"");
    HP(hp->n_experts > 0 && hp->top_k > 0 &&
           hp->top_k <= hp->n_experts && hp->moe_intermediate_size > 0,
       "n_experts %u, top_k %u, moe_intermediate_size %u", hp->n_experts, hp->top_k,
       hp->moe_intermediate_size);
    int any_csa = 0, any_cmp = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        any_csa |= own_hp(hp)->layer_compress[l] == CMP_CSA;
        any_cmp |= own_hp(hp)->layer_compress[l] != CMP_NONE;
        HP(hp->layer_is_moe[l], "layer %u: every layer is MoE", l);
    }
    if (any_csa)
        HP(hp->index_heads >= 1 && hp->index_head_dim >= hp->rope_dim &&
               hp->index_topk >= 1,
           "CSA layers need index_heads, index_head_dim >= rope_dim and index_topk");
    const uint64_t H = hp->hidden_size, NH = hp->n_heads, hd = hp->head_dim;
    const uint64_t QL = hp->q_lora_rank, hc = hp->hc_mult, R = (2 + hc) * hc;
    const uint64_t ihd = hp->index_head_dim, ih = hp->index_heads;
    const uint64_t G = own_hp(hp)->o_groups, OR = own_hp(hp)->o_lora_rank, S = hp->shared_expert_intermediate_size;
    TRY(wpi_need_matrix(c, "token_embd.weight", hp->vocab_size, H, err, cap));
    TRY(wpi_need_vector(c, "output_norm.weight", H, err, cap));
    if (!hp->tie_word_embeddings)
        TRY(wpi_need_matrix(c, "output.weight", hp->vocab_size, H, err, cap));
    TRY(wpi_need_vector(c, "rope_freqs", hp->rope_dim / 2, err, cap));
    if (any_cmp) TRY(wpi_need_vector(c, "rope_freqs_compress", hp->rope_dim / 2, err, cap));
    TRY(wpi_need_f32_matrix(c, "hc_head.fn", hc, hc * H, err, cap));
    TRY(wpi_need_vector(c, "hc_head.base", hc, err, cap));
    TRY(wpi_need_vector(c, "hc_head.scale", 1, err, cap));
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        TRY(wpi_need_vector(c, NAME("attn_norm.weight"), H, err, cap));
        TRY(wpi_need_vector(c, NAME("ffn_norm.weight"), H, err, cap));
        TRY(wpi_need_f32_matrix(c, NAME("hc_attn.fn"), R, hc * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.base"), R, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.scale"), 3, err, cap));
        TRY(wpi_need_f32_matrix(c, NAME("hc_ffn.fn"), R, hc * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.base"), R, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.scale"), 3, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_q_a.weight"), QL, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_q_a_norm.weight"), QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_q_b.weight"), NH * hd, QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_kv.weight"), hd, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_kv_norm.weight"), hd, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_output_a.weight"), G * OR, NH * hd / G, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_output_b.weight"), H, G * OR, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_sinks"), NH, err, cap));
        const int k = own_hp(hp)->layer_compress[l];
        if (k != CMP_NONE) {
            const uint64_t m = k == CMP_CSA ? own_hp(hp)->compress_rate_csa : own_hp(hp)->compress_rate_hca;
            const uint64_t w = k == CMP_CSA ? 2 * hd : hd;
            TRY(wpi_need_matrix(c, NAME("attn_cmp_kv.weight"), w, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_cmp_gate.weight"), w, H, err, cap));
            TRY(wpi_need_vector(c, NAME("attn_cmp_bias"), m * w, err, cap));
            TRY(wpi_need_vector(c, NAME("attn_cmp_norm.weight"), hd, err, cap));
            if (k == CMP_CSA) {
                TRY(wpi_need_matrix(c, NAME("attn_idx_kv.weight"), 2 * ihd, H, err, cap));
                TRY(wpi_need_matrix(c, NAME("attn_idx_gate.weight"), 2 * ihd, H, err, cap));
                TRY(wpi_need_vector(c, NAME("attn_idx_bias"), m * 2 * ihd, err, cap));
                TRY(wpi_need_vector(c, NAME("attn_idx_norm.weight"), ihd, err, cap));
                TRY(wpi_need_matrix(c, NAME("attn_idx_q.weight"), ih * ihd, QL, err, cap));
                TRY(wpi_need_matrix(c, NAME("attn_idx_w.weight"), ih, H, err, cap));
            }
        }
        TRY(wpi_need_f32_matrix(c, NAME("ffn_gate_inp.weight"), hp->n_experts, H, err, cap));
        if (own_hp(hp)->layer_hash[l]) {
            if (hp->top_k != hp->top_k_shipped)
                return wpi_fail(err, cap, WP_E_UNSUPPORTED,
                                "experts_per_token %u: layer %u routes by a table of token ids "
                                "(hash_layers), not by a ranking of experts", hp->top_k, l);
            TRY(wpi_need_f32_matrix(c, NAME("ffn_hash_ids"), hp->vocab_size, hp->top_k, err, cap));
            const float *t = wpi_container_tensor(c, NAME("ffn_hash_ids"))->data;
            if (t) /* resident once loaded: every id names an expert */
                for (uint64_t i = 0; i < (uint64_t)hp->vocab_size * hp->top_k; i++)
                    if (!(t[i] >= 0 && t[i] < (float)hp->n_experts && t[i] == (float)(int32_t)t[i]))
                        return wpi_fail(err, cap, WP_E_FORMAT,
                                        "tensor '%s': entry %llu is not an expert id", n,
                                        (unsigned long long)i);
        } else {
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
        }
        if (S) {
            TRY(wpi_need_matrix(c, NAME("ffn_gate_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_up_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_down_shexp.weight"), H, S, err, cap));
        }
        TRY(wpi_check_expert_bank(c, l, err, cap));
#undef NAME
    }
#undef HP
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, hc = hp->hc_mult;
    const wpi_hc_dims d = wpi_hc_dims_of(hp);
    float *streams, *post, *comb, *hcs, *coll, *y;
    hc_buffers(m, &streams, &post, &comb, &hcs, &coll, &y);
    if (l == 0) wpi_hc_expand(&d, m->x, n, streams);

    wpi_hc_pre(m->k, m->pool, &d, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, streams,
               n, post, comb, coll, H, hcs);
    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, coll + t * H, L->attn_norm, H, hp->rms_norm_eps);
    v4_attention(m, l, m->xn, n, pos, y);
    wpi_hc_post(m->pool, &d, streams, y, H, post, comb, n);

    wpi_hc_pre(m->k, m->pool, &d, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, streams, n,
               post, comb, coll, H, hcs);
    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, coll + t * H, L->ffn_norm, H, hp->rms_norm_eps);
    wp_status st = v4_moe(m, l, m->xn, n, y);
    if (st != WP_OK) return st;
    wpi_hc_post(m->pool, &d, streams, y, H, post, comb, n);
    if (m->lookahead && n == 1 && l + 1 < hp->n_layers && m->layers[l + 1].is_moe) {
        /* the next layer's FFN input, approximated by the streams' mean (its attention
         * and mixes skipped): enough for its router to name most of its experts */
        memset(y, 0, H * sizeof(float));
        for (size_t k = 0; k < hc; k++) m->k->axpy_f32(1.0f / (float)hc, streams + k * H, y, H);
        v4_lookahead(m, l, y);
    }

    if (l + 1 == hp->n_layers) {
        wpi_hc_head(m->k, m->pool, &d, own(m)->hc_head_fn, own(m)->hc_head_base, own(m)->hc_head_scale,
                    streams, n, m->x, H, hcs);
    }
    return WP_OK;
}


/* ---- hooks: state, scratch, binding ----------------------------------------------------- */

/* Per layer a window ring (WP_STATE_WINDOW), then its compressor state (CSA or HCA). */
static void state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS])
{
    const uint64_t F = sizeof(float), win = (uint64_t)hp->sliding_window * hp->head_dim;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const uint64_t rest = layer_state_floats(hp, l, ctx) - win;
        out[WP_STATE_WINDOW] += win * F;
        out[own_hp(hp)->layer_compress[l] == CMP_CSA   ? WP_STATE_CSA
            : own_hp(hp)->layer_compress[l] == CMP_HCA ? WP_STATE_HCA
                                                   : WP_STATE_WINDOW] += rest * F;
    }
}

static void scratch(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, wpi_carve *cv)
{
    v4_model *a = wpi_carve_own(cv, m, sizeof *a);
    WPI_CARVE(cv, a, layers, v4_layer, hp->n_layers);
    WPI_CARVE(cv, a, buf, float, scratch_floats(hp, chunk));
}

/* Its tensors, and kv as one state block per layer. */
static void bind(wpi_model *m, const wpi_container *c, void *kv)
{
    const wpi_hparams *hp = m->hp;
    size_t off = 0;
    own(m)->rope_freqs_c = wpi_bind_vec(c, "rope_freqs_compress", 0);
    own(m)->hc_head_fn = wpi_bind_vec(c, "hc_head.fn", 0);
    own(m)->hc_head_base = wpi_bind_vec(c, "hc_head.base", 0);
    own(m)->hc_head_scale = wpi_bind_vec(c, "hc_head.scale", 0);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        v4_layer *V = &own(m)->layers[l];
        V->wkv = wpi_bind_mat(c, "blk.%u.attn_kv.weight", l);
        V->kv_norm = wpi_bind_vec(c, "blk.%u.attn_kv_norm.weight", l);
        V->wo_a = wpi_bind_mat(c, "blk.%u.attn_output_a.weight", l);
        V->wo_b = wpi_bind_mat(c, "blk.%u.attn_output_b.weight", l);
        V->cmp_kv = wpi_bind_mat(c, "blk.%u.attn_cmp_kv.weight", l);
        V->cmp_gate = wpi_bind_mat(c, "blk.%u.attn_cmp_gate.weight", l);
        V->cmp_bias = wpi_bind_vec(c, "blk.%u.attn_cmp_bias", l);
        V->cmp_norm = wpi_bind_vec(c, "blk.%u.attn_cmp_norm.weight", l);
        V->idx_kv = wpi_bind_mat(c, "blk.%u.attn_idx_kv.weight", l);
        V->idx_gate = wpi_bind_mat(c, "blk.%u.attn_idx_gate.weight", l);
        V->idx_q = wpi_bind_mat(c, "blk.%u.attn_idx_q.weight", l);
        V->idx_w = wpi_bind_mat(c, "blk.%u.attn_idx_w.weight", l);
        V->idx_bias = wpi_bind_vec(c, "blk.%u.attn_idx_bias", l);
        V->idx_norm = wpi_bind_vec(c, "blk.%u.attn_idx_norm.weight", l);
        V->hash_ids = own_hp(hp)->layer_hash[l] ? wpi_bind_vec(c, "blk.%u.ffn_hash_ids", l) : NULL;
        V->cstate = off;
        off += layer_state_floats(hp, l, m->ctx);
    }
}

/* A layer's whole state block is its part 0, whatever the position. */
static size_t state_part(const wpi_model *m, uint32_t l, int v, uint32_t pos, float **at)
{
    *at = m->kcache + own(m)->layers[l].cstate;
    return v ? 0 : layer_state_floats(m->hp, l, m->ctx) * sizeof(float);
}

static const char *no_truncate(const wpi_hparams *hp)
{
    return "a sliding-window and compressed state";
}

const wpi_arch wpi_arch_deepseek_v4 = {
    .name = "deepseek_v4",
    WPI_ARCH_OWN_HOOKS,
    .no_truncate = no_truncate,
};
