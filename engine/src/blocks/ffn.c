/*
 * ffn.c -- the SwiGLU feed-forward, down(silu(gate x) * up x), for dense layers, routed
 * experts and shared experts alike; a dense layer with biases (llama mlp_bias) computes
 * down(silu(gate x + bg) * (up x + bu)) + bd. With swiglu_limit and no swiglu_alpha (glm5_next)
 * gate is clamped to at most the limit and up to [-limit, limit] first. With situ_beta b1
 * (kimi_k3) the activation is SiTU-GLU: b1 tanh(g / b1) sigmoid(g) * u, u bounded to
 * b2 tanh(u / b2) when situ_linear_beta b2 is set (wpi_glu, also moe.c's decode groups).
 *
 * gate and up run in one parallel section over blocks of their rows, each task also
 * applying silu(g) * u to its rows, so a SwiGLU costs two dispatches: gate/up and down.
 * On an 8-bit step (wpi_model.x8), quantized gate/up weights take the 8-bit path as
 * wpi_matmul's do: the input is quantized once, before the section, for both of them.
 * Where down is 8-bit too, each task works its rows a 32-row block and up to SUB_TOK
 * tokens at a time in a tile on its stack (gate, up, silu(g) * u) and quantizes the
 * tile's blocks for down, which then reads them (wpi_matmul_xq): no serial quantization
 * between the sections, and no f32 g and u rows shared between the cores (a row block
 * another core wrote in the last layer costs a transfer per cache line). The blocks are
 * the ones wpi_matmul would quantize from g, so results do not change.
 */
#include <math.h>

#include "blocks.h"

#define ROW_BLOCK 16
#define SUB_TOK 64 /* tokens per stack tile of wpi_gu_fused: 16 KiB for gate and up */

typedef struct gu_ctx {
    const wpi_model *m;
    wpi_matmul_fn fg, fu;
    wpi_matmul_x8_fn fg8, fu8; /* both set (8-bit path) or both NULL */
    const wpi_xq *xq;          /* x quantized, token t at xq + t * ldq */
    size_t ldq;
    const wpi_wmat *gate, *up;
    const float *x;
    size_t ldx;
    uint32_t n_tok, blk;
    float lim;              /* wpi_swiglu_clamp */
    const float *bg, *bu;   /* gate and up biases [rows] or NULL */
    wpi_xq *gq;             /* the fused 8-bit path: silu(g) * u quantized, or NULL */
} gu_ctx;

void wpi_glu_rows(const wpi_hparams *hp, float lim, const float *bg, const float *bu,
                  size_t r0, size_t nr, uint32_t n, float *g, const float *u, size_t ld)
{
    for (uint32_t t = 0; t < n; t++)
        for (size_t i = 0; i < nr; i++) {
            float a = g[t * ld + i], b = u[t * ld + i];
            if (bg) a += bg[r0 + i];
            if (bu) b += bu[r0 + i];
            if (lim > 0) {
                a = a < lim ? a : lim;
                b = b < -lim ? -lim : b > lim ? lim : b;
            }
            g[t * ld + i] = wpi_glu(hp, a, b);
        }
}

void wpi_gu_fused(const wpi_gu8 *f, size_t r0, size_t r1)
{
    _Alignas(64) float g[SUB_TOK * WPI_QK], u[SUB_TOK * WPI_QK];
    const size_t H = f->gate->cols, ldg = f->gate->rows / WPI_QK;
    const size_t rbg = wpi_row_bytes(f->gate->dtype, H), rbu = wpi_row_bytes(f->up->dtype, H);
    for (size_t r = r0; r < r1; r += WPI_QK)
        for (uint32_t t0 = 0; t0 < f->n_tok; t0 += SUB_TOK) {
            const uint32_t n = f->n_tok - t0 < SUB_TOK ? f->n_tok - t0 : SUB_TOK;
            const wpi_xq *xq = f->xq + t0 * f->ldq;
            f->fg8((const uint8_t *)f->gate->data + r * rbg, H, 0, WPI_QK, xq, f->ldq, n, g,
                   WPI_QK);
            f->fu8((const uint8_t *)f->up->data + r * rbu, H, 0, WPI_QK, xq, f->ldq, n, u,
                   WPI_QK);
            wpi_glu_rows(f->hp, f->lim, f->bg, f->bu, r, WPI_QK, n, g, u, WPI_QK);
            for (uint32_t t = 0; t < n; t++)
                wpi_quant_x8(g + t * WPI_QK, WPI_QK, f->gq + (t0 + t) * ldg + r / WPI_QK);
        }
}

static void gu_task(void *arg, uint32_t task)
{
    const gu_ctx *c = arg;
    const size_t I = c->gate->rows;
    size_t r0 = (size_t)task * c->blk, r1 = r0 + c->blk < I ? r0 + c->blk : I;
    float *g = c->m->ff_g, *u = c->m->ff_u;
    if (c->gq) {
        const wpi_gu8 f = {c->m->hp, c->fg8, c->fu8, c->gate, c->up, c->bg, c->bu, c->lim,
                           c->xq, c->ldq, c->n_tok, c->gq};
        wpi_gu_fused(&f, r0, r1);
        return;
    }
    if (c->fg8) {
        c->fg8(c->gate->data, c->gate->cols, r0, r1, c->xq, c->ldq, c->n_tok, g, I);
        c->fu8(c->up->data, c->up->cols, r0, r1, c->xq, c->ldq, c->n_tok, u, I);
    } else {
        c->fg(c->gate->data, c->gate->cols, r0, r1, c->x, c->ldx, c->n_tok, g, I);
        c->fu(c->up->data, c->up->cols, r0, r1, c->x, c->ldx, c->n_tok, u, I);
    }
    wpi_glu_rows(c->m->hp, c->lim, c->bg, c->bu, r0, r1 - r0, c->n_tok, g + r0, u + r0, I);
}

float wpi_swiglu_clamp(const wpi_hparams *hp)
{
    return hp->swiglu_alpha == 0 ? hp->swiglu_limit : 0; /* gpt_oss clamps in its own MoE */
}

static void swiglu(wpi_model *m, const wpi_wmat *gate, const wpi_wmat *up,
                   const wpi_wmat *down, const float *bg, const float *bu, const float *x,
                   size_t ldx, uint32_t n_tok, float *out, size_t ldo)
{
    gu_ctx c = {m, wpi_kernels_matmul(m->k, gate->dtype), wpi_kernels_matmul(m->k, up->dtype),
                NULL, NULL, NULL, 0,
                gate, up, x, ldx, n_tok, 0, m->hp ? wpi_swiglu_clamp(m->hp) : 0, bg, bu,
                NULL};
    const uint32_t I = gate->rows;
    const size_t nb = gate->cols / WPI_QK;
    if (wpi_x8_has(m->x8, gate->dtype) && wpi_x8_has(m->x8, up->dtype) &&
        gate->cols % WPI_QK == 0 && up->cols == gate->cols &&
        (uint64_t)nb * n_tok <= m->xq_blocks) {
        c.fg8 = wpi_kernels_matmul_x8(m->k, gate->dtype);
        c.fu8 = wpi_kernels_matmul_x8(m->k, up->dtype);
        if (c.fg8 && c.fu8) {
            wpi_quant_rows(m, x, ldx, n_tok, gate->cols, m->xq, nb);
            c.xq = m->xq;
            c.ldq = nb;
            /* down 8-bit too, and room for its input after x's blocks: the fused tasks */
            if (wpi_x8_has(m->x8, down->dtype) && I % WPI_QK == 0 && down->cols == I &&
                wpi_kernels_matmul_x8(m->k, down->dtype) &&
                (uint64_t)(nb + I / WPI_QK) * n_tok <= m->xq_blocks)
                c.gq = m->xq + (size_t)n_tok * nb;
        } else {
            c.fg8 = c.fu8 = NULL;
        }
    }
    const uint32_t nt = wpi_pool_threads(m->pool);
    /* tasks in whole 32-row blocks on the fused path */
    const uint32_t rb = c.gq ? WPI_QK : ROW_BLOCK;
    uint64_t work = 2ull * I * gate->cols * n_tok;
    if (nt <= 1 || work < (1u << 16)) {
        c.blk = I;
        gu_task(&c, 0);
    } else {
        uint32_t target = nt * wpi_tasks_per_thread(n_tok);
        uint32_t blk = (I + target - 1) / target;
        c.blk = (blk + rb - 1) / rb * rb;
        wpi_parallel_for(m->pool, (I + c.blk - 1) / c.blk, gu_task, &c);
    }
    wpi_mm d = {down, out, ldo};
    if (c.gq)
        wpi_matmul_xq(m, &d, 1, c.gq, I / WPI_QK, n_tok);
    else
        wpi_matmul(m, &d, 1, m->ff_g, I, n_tok);
}

void wpi_swiglu(wpi_model *m, const wpi_wmat *gate, const wpi_wmat *up,
                const wpi_wmat *down, const float *x, size_t ldx, uint32_t n_tok,
                float *out, size_t ldo)
{
    swiglu(m, gate, up, down, NULL, NULL, x, ldx, n_tok, out, ldo);
}

typedef struct residual_ctx {
    const wpi_model *m;
    const float *bd; /* the layer's ffn_down bias, or NULL */
} residual_ctx;

/* x += moe_out (+ bd) for rows r0 .. r1 - 1. */
static void residual_rows(void *arg, uint32_t r0, uint32_t r1)
{
    const residual_ctx *c = arg;
    const wpi_model *m = c->m;
    const size_t H = m->hp->hidden_size;
    const float *bd = c->bd;
    for (uint32_t t = r0; t < r1; t++) {
        float *x = m->x + t * H;
        const float *y = m->moe_out + t * H;
        for (size_t i = 0; i < H; i++) x[i] += bd ? y[i] + bd[i] : y[i];
    }
}

void wpi_ffn_block(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_layer *L = &m->layers[l];
    const size_t H = m->hp->hidden_size;
    wpi_rmsnorm_rows(m, m->xn, m->x, L->ffn_norm, H, n, m->hp->rms_norm_eps);
    swiglu(m, &L->ffn_gate, &L->ffn_up, &L->ffn_down, L->ffn_gate_b, L->ffn_up_b, m->xn, H,
           n, m->moe_out, H);
    residual_ctx c = {m, L->ffn_down_b};
    wpi_parallel_rows(m, n, H, residual_rows, &c);
}
