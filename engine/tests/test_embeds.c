/*
 * test_embeds.c -- queued rows for placeholder tokens (wp_push_embeds, wp_seq_push_embeds)
 * through wp_eval and wp_eval_batch on a context built by hand: a one-layer model whose
 * layer records the input rows it sees at each position. Checks that placeholder tokens
 * take the queued rows in order across prefill chunks and across calls, that the other
 * tokens keep their embedding, that a placeholder with an empty queue is refused with
 * nothing changed (position, queue), that reset / truncate / close drop the queue, and
 * the refusals of push (width, no placeholder id).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ctx.h"

#define H 8
#define V 16
#define CTX 64
#define PH 15 /* the placeholder id */

static float seen[2][CTX][H]; /* rows the layer saw, per sequence and position */
static int seen_seq;

static wp_status record_layer(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    for (uint32_t t = 0; t < n; t++) memcpy(seen[seen_seq][pos + t], m->x + t * H, sizeof seen[0][0]);
    return WP_OK;
}

static const wpi_arch rec_arch = {.name = "recorder", .layer_forward = record_layer};

static float embd[V * H], x[CTX * H], xn[CTX * H], onesv[H];
static wpi_layer layer;

static void init_model(wpi_model *m, const wpi_container *c, wpi_pool *pool, uint32_t chunk)
{
    memset(m, 0, sizeof *m);
    m->hp = &c->hp;
    m->k = wpi_kernels_get(WP_ISA_SCALAR);
    m->pool = pool;
    m->ctx = CTX;
    m->chunk = chunk;
    m->x8_max_tok = 0; /* float32 activations */
    m->x8_dtypes = 0;
    m->tok_embd = (wpi_wmat){embd, WPI_F32, V, H};
    m->lm_head = &m->tok_embd;
    m->out_norm = onesv;
    m->layers = &layer;
    m->x = x;
    m->xn = xn;
    m->embed_token = c->placeholder_id;
}

static float row_value(uint32_t r, uint32_t i) { return (float)(100 + 10 * r + i); }

int main(void)
{
    static wpi_container c;
    static wp_ctx ctx;
    static wp_seq seqs[2];
    wpi_pool *pool = NULL;
    CHECK(wpi_pool_open(1, &pool) == WP_OK, "pool");
    c.hp.vocab_size = V;
    c.hp.hidden_size = H;
    c.hp.n_layers = 1;
    c.hp.rms_norm_eps = 1e-6f;
    c.placeholder_id = PH;
    for (int i = 0; i < V * H; i++) embd[i] = (float)(i / H) + 0.01f * (float)(i % H);
    for (int i = 0; i < H; i++) onesv[i] = 1;
    ctx.c = &c;
    ctx.arch = &rec_arch;
    ctx.seqs = seqs;
    ctx.n_seqs = 2;
    ctx.batch_buf = calloc(2, wpi_batch_buf_bytes());
    for (int i = 0; i < 2; i++) {
        seqs[i].ctx = &ctx;
        init_model(&seqs[i].mdl, &c, pool, 3); /* prefill chunks of 3 tokens */
        seqs[i].open = 1;
    }
    ctx.batch = seqs[0].mdl;

    float rows[6 * H];
    for (uint32_t r = 0; r < 6; r++)
        for (uint32_t i = 0; i < H; i++) rows[r * H + i] = row_value(r, i);

    /* Order across chunks and calls: 4 placeholders in a 7-token prompt (chunks of 3),
     * then 2 more in a later call. */
    CHECK(wp_push_embeds(&ctx, rows, 6, H) == WP_OK, "push 6: %s", ctx.err);
    CHECK(wp_pending_embeds(&ctx) == 6, "6 pending");
    const int32_t p1[7] = {1, PH, PH, 2, PH, PH, 3};
    seen_seq = 0;
    CHECK(wp_eval(&ctx, p1, 7, 0, NULL, 0) == WP_OK, "eval: %s", ctx.err);
    CHECK(wp_position(&ctx) == 7 && wp_pending_embeds(&ctx) == 2, "position 7, 2 left (%u)",
          wp_pending_embeds(&ctx));
    const uint32_t ph_pos[4] = {1, 2, 4, 5};
    for (uint32_t k = 0; k < 4; k++)
        for (uint32_t i = 0; i < H; i++)
            CHECK(seen[0][ph_pos[k]][i] == row_value(k, i), "position %u got row %g", ph_pos[k],
                  seen[0][ph_pos[k]][0]);
    CHECK(seen[0][3][0] == embd[2 * H] && seen[0][6][1] == embd[3 * H + 1],
          "text tokens keep their embedding");
    const int32_t p2[2] = {PH, PH};
    CHECK(wp_eval(&ctx, p2, 2, 0, NULL, 0) == WP_OK, "second call: %s", ctx.err);
    CHECK(seen[0][7][0] == row_value(4, 0) && seen[0][8][3] == row_value(5, 3),
          "the second call takes rows 4 and 5");
    CHECK(wp_pending_embeds(&ctx) == 0, "queue empty");

    /* Empty queue: refused, nothing changed. */
    const int32_t p3[2] = {4, PH};
    CHECK(wp_eval(&ctx, p3, 2, 0, NULL, 0) == WP_E_ARG, "placeholder with an empty queue");
    CHECK(strstr(ctx.err, "placeholder") != NULL, "detail names the placeholder: %s", ctx.err);
    CHECK(wp_position(&ctx) == 9, "position unchanged (%u)", wp_position(&ctx));
    /* Too few: 1 row queued for 2 placeholders, refused and the row kept. */
    CHECK(wp_push_embeds(&ctx, rows, 1, H) == WP_OK, "push 1");
    CHECK(wp_eval(&ctx, p2, 2, 0, NULL, 0) == WP_E_ARG, "2 placeholders, 1 row");
    CHECK(wp_pending_embeds(&ctx) == 1 && wp_position(&ctx) == 9, "queue and position kept");

    /* reset and truncate drop the queue. */
    CHECK(wp_state_reset(&ctx) == WP_OK && wp_pending_embeds(&ctx) == 0, "reset clears");
    CHECK(wp_push_embeds(&ctx, rows, 2, H) == WP_OK, "push 2");
    CHECK(wp_eval(&ctx, p1, 1, 0, NULL, 0) == WP_OK, "eval 1 text token");
    CHECK(wp_state_truncate(&ctx, 0) == WP_OK && wp_pending_embeds(&ctx) == 0,
          "truncate clears");

    /* eval_batch: each sequence takes its own queue, in order. */
    wp_seq *s1 = &seqs[1];
    CHECK(wp_push_embeds(&ctx, rows, 1, H) == WP_OK, "push seq 0");
    CHECK(wp_seq_push_embeds(s1, rows + 2 * H, 2, H) == WP_OK, "push seq 1");
    const int32_t b0[2] = {5, PH}, b1[3] = {PH, 6, PH};
    const int32_t *bt[2] = {b0, b1};
    const uint32_t bn[2] = {2, 3};
    wp_seq *bs[2] = {NULL, s1};
    /* a batch with one sequence short of rows changes neither */
    const int32_t b1bad[3] = {PH, PH, PH};
    const int32_t *btbad[2] = {b0, b1bad};
    seen_seq = 0;
    CHECK(wp_eval_batch(&ctx, bs, btbad, bn, 2, NULL, 0) == WP_E_ARG, "short batch refused");
    CHECK(wp_pending_embeds(&ctx) == 1 && wp_seq_pending_embeds(s1) == 2 &&
          wp_position(&ctx) == 0 && wp_seq_position(s1) == 0, "the refused batch moved nothing");
    /* sequences are evaluated one by one here (no mixer/ffn): record each in its slot */
    wp_seq *one[1] = {NULL};
    const int32_t *t0[1] = {b0};
    CHECK(wp_eval_batch(&ctx, one, t0, &bn[0], 1, NULL, 0) == WP_OK, "batch seq 0");
    seen_seq = 1;
    wp_seq *two[1] = {s1};
    const int32_t *t1[1] = {b1};
    CHECK(wp_eval_batch(&ctx, two, t1, &bn[1], 1, NULL, 0) == WP_OK, "batch seq 1");
    CHECK(seen[0][1][0] == row_value(0, 0), "seq 0 row 0");
    CHECK(seen[1][0][0] == row_value(2, 0) && seen[1][2][0] == row_value(3, 0) &&
          seen[1][1][0] == embd[6 * H], "seq 1 rows 2, 3 around its text token");
    CHECK(wp_pending_embeds(&ctx) == 0 && wp_seq_pending_embeds(s1) == 0, "both queues taken");
    (void)bt;
    (void)frand;

    /* close drops the queue; push refusals */
    CHECK(wp_seq_push_embeds(s1, rows, 1, H) == WP_OK, "push before close");
    wp_seq_close(s1);
    CHECK(s1->emb_len == 0 && s1->emb == NULL, "close clears");
    CHECK(wp_push_embeds(&ctx, rows, 1, H - 1) == WP_E_ARG, "wrong width refused");
    c.placeholder_id = -1;
    CHECK(wp_push_embeds(&ctx, rows, 1, H) == WP_E_UNSUPPORTED, "no placeholder id refused");
    CHECK(wp_state_reset(&ctx) == WP_OK, "reset");
    CHECK(ctx.mem.current == 0, "every queue freed (%llu bytes left)",
          (unsigned long long)ctx.mem.current);

    wpi_pool_close(pool);
    free(ctx.batch_buf);
    printf("test_embeds: %s (%d failed)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
