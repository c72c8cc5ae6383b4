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
 * wpi_matmul's do: the input is quantized once, before the section, for both of them
 * (and down's input once by wpi_matmul).
 */
#include <math.h>

#include "blocks.h"

#define ROW_BLOCK 16

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
} gu_ctx;

static void gu_task(void *arg, uint32_t task)
{
    const gu_ctx *c = arg;
    const size_t I = c->gate->rows;
    size_t r0 = (size_t)task * c->blk, r1 = r0 + c->blk < I ? r0 + c->blk : I;
    float *g = c->m->ff_g, *u = c->m->ff_u;
    if (c->fg8) {
        c->fg8(c->gate->data, c->gate->cols, r0, r1, c->xq, c->ldq, c->n_tok, g, I);
        c->fu8(c->up->data, c->up->cols, r0, r1, c->xq, c->ldq, c->n_tok, u, I);
    } else {
        c->fg(c->gate->data, c->gate->cols, r0, r1, c->x, c->ldx, c->n_tok, g, I);
        c->fu(c->up->data, c->up->cols, r0, r1, c->x, c->ldx, c->n_tok, u, I);
    }
    const float lim = c->lim;
    for (uint32_t t = 0; t < c->n_tok; t++)
        for (size_t r = r0; r < r1; r++) {
            float a = g[t * I + r], b = u[t * I + r];
            if (c->bg) a += c->bg[r];
            if (c->bu) b += c->bu[r];
            if (lim > 0) {
                a = a < lim ? a : lim;
                b = b < -lim ? -lim : b > lim ? lim : b;
            }
            g[t * I + r] = wpi_glu(c->m->hp, a, b);
        }
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
                gate, up, x, ldx, n_tok, 0, m->hp ? wpi_swiglu_clamp(m->hp) : 0, bg, bu};
    const uint32_t I = gate->rows;
    const size_t nb = gate->cols / WPI_QK;
    if (wpi_x8_has(m->x8, gate->dtype) && wpi_x8_has(m->x8, up->dtype) &&
        gate->cols % WPI_QK == 0 && up->cols == gate->cols &&
        (uint64_t)nb * n_tok <= m->xq_blocks) {
        c.fg8 = wpi_kernels_matmul_x8(m->k, gate->dtype);
        c.fu8 = wpi_kernels_matmul_x8(m->k, up->dtype);
        if (c.fg8 && c.fu8) {
            for (uint32_t t = 0; t < n_tok; t++)
                wpi_quant_x8(x + t * ldx, gate->cols, m->xq + t * nb);
            c.xq = m->xq;
            c.ldq = nb;
        } else {
            c.fg8 = c.fu8 = NULL;
        }
    }
    const uint32_t nt = wpi_pool_threads(m->pool);
    uint64_t work = 2ull * I * gate->cols * n_tok;
    if (nt <= 1 || work < (1u << 16)) {
        c.blk = I;
        gu_task(&c, 0);
    } else {
        uint32_t target = nt * wpi_tasks_per_thread(n_tok);
        uint32_t blk = (I + target - 1) / target;
        c.blk = (blk + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
        wpi_parallel_for(m->pool, (I + c.blk - 1) / c.blk, gu_task, &c);
    }
    wpi_mm d = {down, out, ldo};
    wpi_matmul(m, &d, 1, m->ff_g, I, n_tok);
}

void wpi_swiglu(wpi_model *m, const wpi_wmat *gate, const wpi_wmat *up,
                const wpi_wmat *down, const float *x, size_t ldx, uint32_t n_tok,
                float *out, size_t ldo)
{
    swiglu(m, gate, up, down, NULL, NULL, x, ldx, n_tok, out, ldo);
}

void wpi_ffn_block(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_layer *L = &m->layers[l];
    const size_t H = m->hp->hidden_size;
    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, L->ffn_norm, H, m->hp->rms_norm_eps);
    swiglu(m, &L->ffn_gate, &L->ffn_up, &L->ffn_down, L->ffn_gate_b, L->ffn_up_b, m->xn, H,
           n, m->moe_out, H);
    const float *bd = L->ffn_down_b;
    for (uint32_t t = 0; t < n; t++) {
        float *x = m->x + t * H;
        const float *y = m->moe_out + t * H;
        for (size_t i = 0; i < H; i++) x[i] += bd ? y[i] + bd[i] : y[i];
    }
}
