/*
 * attention_csa.c -- deepseek_v4 attention: shared-KV multi-query attention with sinks
 * over a sliding window, plus compressed keys: heavily compressed (HCA, every causal
 * entry) or compressed sparse (CSA, the lightning indexer's top-k entries).
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
 * State per layer (floats, wpi_v4_layer_state_floats), fixed at ctx:
 *   ring [W][hd]: kv of position q at row q % W
 *   HCA: c, z [m][hd] (row q % m); entries [ctx / m][hd]
 *   CSA: c, z [2m][2hd] (row q % 2m: the open window and the one before);
 *        entries [ctx / m][hd]; indexer c, z [2m][2ihd], entries [ctx / m][ihd]
 * Everything read is a function of the position, so nothing is reset at position 0.
 * Tasks are (token, head) pairs and tokens; the thread count never changes a result.
 */
#include <math.h>
#include <string.h>

#include "blocks.h"

static uint32_t cmp_rate(const wpi_hparams *hp, uint32_t l)
{
    return hp->layer_compress[l] == WPI_CMP_CSA   ? hp->compress_rate_csa
           : hp->layer_compress[l] == WPI_CMP_HCA ? hp->compress_rate_hca
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
        const int csa = hp->layer_compress[l] == WPI_CMP_CSA;
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

uint64_t wpi_v4_layer_state_floats(const wpi_hparams *hp, uint32_t l, uint32_t ctx)
{
    return hp->v4_state ? state_of(hp, l, ctx).total : 0;
}

uint64_t wpi_v4_state_floats(const wpi_hparams *hp, uint32_t ctx)
{
    uint64_t s = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) s += wpi_v4_layer_state_floats(hp, l, ctx);
    return s;
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
    const wpi_hc_dims d = {hp->hc_mult, hp->hidden_size, hp->hc_sinkhorn_iters, hp->hc_eps,
                           hp->rms_norm_eps};
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
    PART(oa, C * hp->o_groups * hp->o_lora_rank);
#undef PART
    return off;
}

uint64_t wpi_v4_scratch_floats(const wpi_hparams *hp, uint32_t chunk)
{
    if (!hp->v4_state) return 0;
    return carve(hp, chunk, NULL, NULL);
}

/* The arch file's view of the same carve. */
void wpi_v4_hc_buffers(wpi_model *m, float **streams, float **post, float **comb,
                       float **hcs, float **coll, float **y);
void wpi_v4_hc_buffers(wpi_model *m, float **streams, float **post, float **comb,
                       float **hcs, float **coll, float **y)
{
    v4_scr s;
    carve(m->hp, m->chunk, m->v4_buf, &s);
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
#define WPI_V4_MAX_RATE 1024

static void compress_window(const float *ring_c, const float *ring_z, uint32_t slots,
                            uint32_t cw, uint32_t m, uint32_t hd, int overlap, uint32_t w,
                            const float *bias, const float *norm, float eps,
                            const float *freqs, uint32_t rd, float *out)
{
    float cbuf[512], sbuf[512];
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
        if (filled == K && !(sc > w[K - 1])) continue;
        uint32_t i = filled < K ? filled : K - 1;
        while (i > 0 && w[i - 1] < sc) {
            w[i] = w[i - 1];
            ids[i] = ids[i - 1];
            i--;
        }
        w[i] = sc;
        ids[i] = (int32_t)e;
        if (filled < K) filled++;
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

void wpi_v4_attention(wpi_model *m, uint32_t l, const float *x, uint32_t n, uint32_t pos,
                      float *out)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const uint32_t H = hp->hidden_size, nh = hp->n_heads, hd = hp->head_dim;
    const uint32_t QL = hp->q_lora_rank, RD = hp->rope_dim, half = RD / 2, W = hp->sliding_window;
    const uint32_t ih = hp->index_heads, ihd = hp->index_head_dim;
    const v4_state st = state_of(hp, l, m->ctx);
    const int csa = hp->layer_compress[l] == WPI_CMP_CSA;
    v4_scr s;
    carve(hp, m->chunk, m->v4_buf, &s);
    float *S = L->cstate;

    /* rope of this layer at the chunk's positions */
    const float *cosv = m->rope_cos, *sinv = m->rope_sin;
    if (st.m) {
        for (uint32_t t = 0; t < n; t++)
            rope_at(m->rope_freqs_c, half, pos + t, s.cc + (size_t)t * half, s.cs + (size_t)t * half);
        cosv = s.cc;
        sinv = s.cs;
    }

    /* q, kv */
    wpi_mm j1[2] = {{&L->wq_a, m->mla_qa, QL}, {&L->wkv, s.kv, hd}};
    wpi_matmul(m, j1, 2, x, H, n);
    for (uint32_t t = 0; t < n; t++) {
        wpi_rmsnorm(m->mla_qa + (size_t)t * QL, m->mla_qa + (size_t)t * QL, L->q_a_norm, QL,
                    hp->rms_norm_eps);
        wpi_rmsnorm(s.kv + (size_t)t * hd, s.kv + (size_t)t * hd, L->kv_norm, hd, hp->rms_norm_eps);
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
        wpi_mm jc[2] = {{&L->cmp_kv, s.ckv, st.cw}, {&L->cmp_gate, s.cz, st.cw}};
        wpi_matmul(m, jc, 2, x, H, n);
        compressor_feed(hp, S + st.c, S + st.z, S + st.ent, &st, hd, csa, s.ckv, s.cz, n, pos,
                        L->cmp_bias, L->cmp_norm, m->rope_freqs_c);
    }
    if (csa) {
        wpi_mm ji[3] = {{&L->idx_kv, s.ikv, 2 * ihd}, {&L->idx_gate, s.iz, 2 * ihd},
                        {&L->idx_w, s.iw, ih}};
        wpi_matmul(m, ji, 3, x, H, n);
        v4_state is = st;
        is.cw = 2 * ihd;
        compressor_feed(hp, S + st.ic, S + st.iz, S + st.ient, &is, ihd, 1, s.ikv, s.iz, n, pos,
                        L->idx_bias, L->idx_norm, m->rope_freqs_c);
        wpi_mm jq = {&L->idx_q, s.iq, (size_t)ih * ihd};
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
    const uint32_t G = hp->o_groups, R = hp->o_lora_rank, gin = nh * hd / G;
    for (uint32_t g = 0; g < G; g++) {
        wpi_wmat wg = L->wo_a;
        wg.data = (const char *)L->wo_a.data + (size_t)g * R * wpi_row_bytes(wg.dtype, gin);
        wg.rows = R;
        wpi_mm jo = {&wg, s.oa + (size_t)g * R, (size_t)G * R};
        wpi_matmul(m, &jo, 1, m->att + (size_t)g * gin, (size_t)nh * hd, n);
    }
    wpi_mm jb = {&L->wo_b, out, H};
    wpi_matmul(m, &jb, 1, s.oa, (size_t)G * R, n);
}
