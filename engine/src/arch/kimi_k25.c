/*
 * kimi_k25.c -- Kimi K2.5 / K2.6 (Kimi_K25ForConditionalGeneration): the DeepSeek-V3 text
 * model (deepseek_v3.c's check and layer: MLA, noaux_tc MoE) and the MoonViT image tower
 * with its projector; and the same tower as Kimi K3 ships it (wpi_kimi_k3_tower, the
 * vision hook of kimi_k3.c). In paper order:
 *   x = patch_embd(pixels) + resize(pos_embd grid -> h x w)   per patch, raster order
 *   per layer (blocks/vision.c): x += attn(ln1 x) with a 2D rotary (column on the even
 *   pairs, row on the odd), x += mlp(ln2 x) (GELU-tanh)
 *   x = post_ln(x); each merge x merge block of patches is one token (slot k = row in
 *   the block * merge + column in the block):
 *   K2.5: out = mm_out(gelu(mm_in(concat_k mm_norm(x_k))))    (exact GELU)
 *   K3:   out = mm_post_norm(mm_out(gelu(mm_in(concat_k x_k))))
 * What differs, per moonvit below: K2.5 resizes the grid bicubically and its norms are
 * LayerNorms with bias, its linear layers all with bias; K3 resizes bilinearly (both with
 * half-pixel centres, F.interpolate's align_corners=False), every norm is an RMSNorm
 * (weight only, the projector's last), its linear layers have no bias (any is read when
 * stored), and its attention may be wider than the tower (attn_hidden_size).
 * Tensors beyond the encoder layers: v.patch_embd.{weight [D, C*p*p], bias [D]},
 * v.pos_embd [pos_grid_h * pos_grid_w, D] (f32, row-major grid), v.post_ln.{weight,bias},
 * v.mm_norm.{weight,bias} [D] (K2.5), v.mm_in.{weight [m*m*D, m*m*D], bias},
 * v.mm_out.{weight [hidden, m*m*D], bias [hidden]}, v.mm_post_norm.weight [hidden] (K3).
 * Images only (t = 1).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "moonvit.h"

/* What the two towers do differently. */
typedef struct moonvit {
    const char *name;
    wpi_vit_opts layer; /* the encoder layer's options (blocks/vision.c) */
    int bilinear;       /* the position grid resized bilinearly, else bicubically */
    int post_norm;      /* K3's projector: no pre-norm, an RMSNorm after mm_out */
} moonvit;

static const moonvit k25 = {.name = "kimi_k25"};
static const moonvit k3 = {
    .name = "kimi_k3",
    .layer = {.rms_norm = 1, .biases_optional = 1},
    .bilinear = 1,
    .post_norm = 1,
};

static wp_status need_bias(const moonvit *t, const wpi_container *c, const char *name,
                           uint64_t n, char *err, size_t cap)
{
    return t->layer.biases_optional ? wpi_opt_vector(c, name, n, err, cap)
                                    : wpi_need_vector(c, name, n, err, cap);
}

static wp_status tower_check(const moonvit *t, const wpi_container *c, char *err, size_t cap)
{
    const wpi_vision_hp *v = &c->vhp;
    const uint64_t D = v->hidden_size, M = (uint64_t)v->merge_size * v->merge_size * D;
    const uint64_t A = v->attn_hidden_size, H = c->hp.hidden_size;
    if (A % v->n_heads || (A / v->n_heads) % 4)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "%s: vision head width %llu / %u must be a multiple of 4", t->name,
                        (unsigned long long)A, v->n_heads);
    if (v->pos_grid_h != v->pos_grid_w)
        return wpi_fail(err, cap, WP_E_FORMAT, "%s: the position grid must be square",
                        t->name);
    if (v->temporal_patch_size != 1 || v->act != WPI_ACT_GELU_TANH || v->proj_act != WPI_ACT_GELU)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "%s: vision temporal_patch_size 1, act gelu_tanh, proj_act gelu",
                        t->name);
    const uint64_t P = (uint64_t)v->channels * v->patch_size * v->patch_size;
    TRY(wpi_need_matrix(c, "v.patch_embd.weight", D, P, err, cap));
    TRY(need_bias(t, c, "v.patch_embd.bias", D, err, cap));
    TRY(wpi_need_f32_matrix(c, "v.pos_embd", (uint64_t)v->pos_grid_h * v->pos_grid_w, D, err,
                            cap));
    for (uint32_t l = 0; l < v->n_layers; l++)
        TRY(wpi_vit_check_layer(c, &t->layer, l, err, cap));
    TRY(wpi_need_vector(c, "v.post_ln.weight", D, err, cap));
    if (!t->layer.rms_norm) TRY(wpi_need_vector(c, "v.post_ln.bias", D, err, cap));
    if (t->post_norm) {
        TRY(wpi_need_vector(c, "v.mm_post_norm.weight", H, err, cap));
    } else {
        TRY(wpi_need_vector(c, "v.mm_norm.weight", D, err, cap));
        TRY(wpi_need_vector(c, "v.mm_norm.bias", D, err, cap));
    }
    TRY(wpi_need_matrix(c, "v.mm_in.weight", M, M, err, cap));
    TRY(need_bias(t, c, "v.mm_in.bias", M, err, cap));
    TRY(wpi_need_matrix(c, "v.mm_out.weight", H, M, err, cap));
    TRY(need_bias(t, c, "v.mm_out.bias", H, err, cap));
    return WP_OK;
}

/* Floats of each work buffer for n patches: x, xn, pooled [n, D]; att [n, A];
 * qkv [n, max(3A, D)] (the projector's hidden rows too); ff [n, max(F, D)];
 * cos, sin [n, hd/2]; rows, cols. */
static uint64_t work_bytes(const wpi_vision_hp *v, uint32_t n)
{
    const uint64_t D = v->hidden_size, F = v->intermediate_size > D ? v->intermediate_size : D;
    const uint64_t A = v->attn_hidden_size ? v->attn_hidden_size : D, hd = A / v->n_heads;
    const uint64_t Q = 3 * A > D ? 3 * A : D;
    return (uint64_t)n * (3 * D + A + Q + F + hd + 2) * sizeof(float) + 16 * 64;
}

static uint32_t k25_rows(const wpi_vision_hp *v, const uint32_t thw[3], char *err, size_t cap)
{
    return wpi_vit_merged_rows(v, thw, k25.name, err, cap);
}

static uint32_t k3_rows(const wpi_vision_hp *v, const uint32_t thw[3], char *err, size_t cap)
{
    return wpi_vit_merged_rows(v, thw, k3.name, err, cap);
}

/* Keys cubic convolution (a = -0.75) at distance d. */
static double cubic(double d)
{
    const double a = -0.75;
    d = fabs(d);
    if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
}

/* The taps and weights of output index i of an axis of `size` from `side` grid cells, as
 * F.interpolate(align_corners=False) computes them (half-pixel centres): bicubic, 4 taps
 * clamped to the border; bilinear, 2 taps, the source clamped at 0 and the upper tap at
 * the border. Returns the tap count. */
static int axis_taps(int bilinear, uint32_t i, uint32_t size, uint32_t side, uint32_t tap[4],
                     float w[4])
{
    const float scale = (float)side / (float)size;
    float src = ((float)i + 0.5f) * scale - 0.5f;
    if (bilinear) {
        if (src < 0) src = 0;
        const uint32_t i0 = (uint32_t)src, i1 = i0 + 1 < side ? i0 + 1 : side - 1;
        const float l1 = src - (float)i0;
        tap[0] = i0, tap[1] = i1, w[0] = 1.0f - l1, w[1] = l1;
        return 2;
    }
    const float fl = floorf(src);
    for (int o = 0; o < 4; o++) {
        const long t = (long)fl + o - 1;
        tap[o] = t < 0 ? 0 : t > (long)side - 1 ? side - 1 : (uint32_t)t;
        w[o] = (float)cubic((double)(src - (fl + (float)(o - 1))));
    }
    return 4;
}

static void vit_norm(const moonvit *t, float *out, const float *x, const float *w,
                     const float *b, size_t n, float eps)
{
    if (t->layer.rms_norm)
        wpi_rmsnorm(out, x, w, n, eps);
    else
        wpi_layernorm(out, x, w, b, n, eps);
}

static void tower_encode(const moonvit *t, wpi_model *m, const wpi_container *c,
                         const float *pixels, const uint32_t thw[3], float *out, void *work)
{
    const wpi_vision_hp *v = &c->vhp;
    const uint32_t h = thw[1], w = thw[2], n = h * w, mg = v->merge_size;
    const uint32_t D = v->hidden_size, A = v->attn_hidden_size, hd = A / v->n_heads;
    const uint32_t G = v->pos_grid_w, H = c->hp.hidden_size;
    const uint32_t F = v->intermediate_size > D ? v->intermediate_size : D;
    const uint32_t Q = 3 * A > D ? 3 * A : D;
    const uint32_t P = v->channels * v->patch_size * v->patch_size;
    wpi_carve cv = {work, 0};
    wpi_vit_buf b;
    b.x = wpi_carve_take(&cv, (uint64_t)n * D, sizeof(float));
    b.xn = wpi_carve_take(&cv, (uint64_t)n * D, sizeof(float));
    b.att = wpi_carve_take(&cv, (uint64_t)n * A, sizeof(float));
    float *pooled = wpi_carve_take(&cv, (uint64_t)n * D, sizeof(float));
    b.qkv = wpi_carve_take(&cv, (uint64_t)n * Q, sizeof(float));
    b.ff = wpi_carve_take(&cv, (uint64_t)n * F, sizeof(float));
    b.cos = wpi_carve_take(&cv, (uint64_t)n * (hd / 2), sizeof(float));
    b.sin = wpi_carve_take(&cv, (uint64_t)n * (hd / 2), sizeof(float));
    uint32_t *row = wpi_carve_take(&cv, n, sizeof(uint32_t));
    uint32_t *col = wpi_carve_take(&cv, n, sizeof(uint32_t));

    wpi_wmat pw = wpi_bind_mat(c, "v.patch_embd.weight", 0);
    wpi_vit_linear(m, &pw, wpi_bind_vec(c, "v.patch_embd.bias", 0), pixels, P, n, b.x, D);
    const float *pos = wpi_bind_vec(c, "v.pos_embd", 0);
    for (uint32_t r = 0; r < h; r++) {
        uint32_t rt[4];
        float rw[4];
        const int nr = axis_taps(t->bilinear, r, h, v->pos_grid_h, rt, rw);
        for (uint32_t q = 0; q < w; q++) {
            uint32_t ct[4];
            float cw[4];
            const int nc = axis_taps(t->bilinear, q, w, G, ct, cw);
            float *x = b.x + ((size_t)r * w + q) * D;
            for (int i = 0; i < nr; i++)
                for (int j = 0; j < nc; j++)
                    m->k->axpy_f32(rw[i] * cw[j], pos + ((size_t)rt[i] * G + ct[j]) * D, x, D);
            row[(size_t)r * w + q] = r;
            col[(size_t)r * w + q] = q;
        }
    }
    wpi_vit_rope_table(row, col, n, hd, v->rope_theta, WPI_VIT_ROPE_COL_ROW, b.cos, b.sin);
    for (uint32_t l = 0; l < v->n_layers; l++) wpi_vit_layer(m, c, &t->layer, l, &b, n);

    /* post_ln, then (K2.5) mm_norm, of each patch into its merged token's slot k. */
    const float *pl_w = wpi_bind_vec(c, "v.post_ln.weight", 0);
    const float *pl_b = wpi_bind_vec(c, "v.post_ln.bias", 0);
    const float *mn_w = wpi_bind_vec(c, "v.mm_norm.weight", 0);
    const float *mn_b = wpi_bind_vec(c, "v.mm_norm.bias", 0);
    const uint32_t mw = w / mg, kk = mg * mg;
    for (uint32_t r = 0; r < h; r++)
        for (uint32_t q = 0; q < w; q++) {
            const size_t i = (size_t)r * w + q;
            const size_t tok = (size_t)(r / mg) * mw + q / mg, k = (r % mg) * mg + q % mg;
            float *slot = pooled + (tok * kk + k) * D;
            if (t->post_norm) {
                vit_norm(t, slot, b.x + i * D, pl_w, pl_b, D, v->norm_eps);
            } else {
                vit_norm(t, b.xn + i * D, b.x + i * D, pl_w, pl_b, D, v->norm_eps);
                wpi_layernorm(slot, b.xn + i * D, mn_w, mn_b, D, v->proj_norm_eps);
            }
        }
    const uint32_t ntok = n / kk, M = kk * D;
    wpi_wmat wi = wpi_bind_mat(c, "v.mm_in.weight", 0);
    wpi_wmat wo = wpi_bind_mat(c, "v.mm_out.weight", 0);
    float *hid = b.qkv; /* [ntok, M] = n * D floats, inside qkv */
    wpi_vit_linear(m, &wi, wpi_bind_vec(c, "v.mm_in.bias", 0), pooled, M, ntok, hid, M);
    for (size_t i = 0; i < (size_t)ntok * M; i++) hid[i] = wpi_gelu(hid[i], v->proj_act);
    wpi_vit_linear(m, &wo, wpi_bind_vec(c, "v.mm_out.bias", 0), hid, M, ntok, out, H);
    if (t->post_norm) {
        const float *pn = wpi_bind_vec(c, "v.mm_post_norm.weight", 0);
        for (uint32_t i = 0; i < ntok; i++)
            wpi_rmsnorm(out + (size_t)i * H, out + (size_t)i * H, pn, H, v->proj_norm_eps);
    }
}

static wp_status k25_check(const wpi_container *c, char *err, size_t cap)
{
    return tower_check(&k25, c, err, cap);
}

static void k25_encode(wpi_model *m, const wpi_container *c, const float *pixels,
                       const uint32_t thw[3], float *out, void *work)
{
    tower_encode(&k25, m, c, pixels, thw, out, work);
}

static wp_status k3_check(const wpi_container *c, char *err, size_t cap)
{
    return tower_check(&k3, c, err, cap);
}

static void k3_encode(wpi_model *m, const wpi_container *c, const float *pixels,
                      const uint32_t thw[3], float *out, void *work)
{
    tower_encode(&k3, m, c, pixels, thw, out, work);
}

const wpi_vision wpi_kimi_k3_tower = {
    .check = k3_check,
    .work_bytes = work_bytes,
    .out_rows = k3_rows,
    .encode = k3_encode,
};

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    TRY(wpi_arch_find("deepseek_v3")->check(c, err, cap));
    return c->has_vision ? k25_check(c, err, cap) : WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_mla_block(m, l, n, pos);
    return wpi_moe_decoder_ffn(m, l, n);
}

static const wpi_vision tower = {
    .check = k25_check,
    .work_bytes = work_bytes,
    .out_rows = k25_rows,
    .encode = k25_encode,
};

const wpi_arch wpi_arch_kimi_k25 = {
    .name = "kimi_k25",
    .check = check,
    WPI_MLA_HOOKS,
    .layer_forward = layer_forward,
    .mixer = wpi_mla_block,
    .ffn = wpi_moe_decoder_ffn,
    .vision = &tower,
};
