/*
 * state.c -- wp_state_save / wp_state_load (and wp_seq_save / _load, seq.c): a sequence's
 * KV cache and position in a file.
 *
 * Layout (little-endian):
 *   header, 128 bytes:
 *     0   char magic[4] "WPST"         4  u32 version (1)
 *     8   char model_type[32]
 *     40  u32 n_layers, n_heads, n_kv_heads, head_dim, hidden_size, vocab_size,
 *             rope_dim, qk_norm, ctx_tokens          (40..75)
 *     76  f32 rope_theta               80  f32 rope_attn_factor
 *     84  u32 weights fingerprint (CRC32C over trunk tensor names and CRCs)
 *     88  u32 position                 92..123 zero
 *     124 u32 CRC32C of bytes 0..123
 *   payload: per layer its part 0 then its part 1, as the architecture's state_part hook
 *            gives them; by default K rows [0, position) then V rows [0, position), f32
 *            [n_kv_heads * head_dim] each. MLA (blocks/mla.c) saves one latent row
 *            [kv_lora_rank + rope_dim] per position and no V rows, a KDA layer its
 *            recurrent state whatever the position (blocks/kda.c); an architecture
 *            with a state of its own describes it in its arch file.
 *   trailer: u32 CRC32C of the payload
 * A header of another model or shape is WP_E_STATE; anything truncated or garbled is
 * WP_E_FORMAT, found before the context is touched (the payload CRC is checked in a
 * first pass), so a failed load leaves the context as it was.
 */
#include <stdio.h>
#include <string.h>

#include "ctx.h"

#define HDR 128
#define VERSION 1
#define IO_BUF (1u << 20)

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint32_t weights_fingerprint(const wpi_container *c)
{
    uint32_t crc = 0;
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        const wpi_tensor *t = &c->tensors[i];
        unsigned char b[4];
        crc = wpi_crc32c(crc, t->name, strlen(t->name));
        put32(b, t->crc32c);
        crc = wpi_crc32c(crc, b, 4);
    }
    return crc;
}

static void make_header(const wp_ctx *ctx, uint32_t pos, unsigned char *h)
{
    const wpi_hparams *hp = &ctx->c->hp;
    memset(h, 0, HDR);
    memcpy(h, "WPST", 4);
    put32(h + 4, VERSION);
    memcpy(h + 8, hp->model_type, strnlen(hp->model_type, 31));
    const uint32_t f[] = {hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                          hp->hidden_size, hp->vocab_size, hp->rope_dim,
                          (uint32_t)hp->qk_norm, ctx->plan.ctx_tokens,
                          fbits(hp->rope_theta), fbits(hp->rope_attn_factor),
                          weights_fingerprint(ctx->c), pos};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) put32(h + 40 + 4 * i, f[i]);
    put32(h + 124, wpi_crc32c(0, h, 124));
}

/* Saved bytes of layer l's part v at position pos, and where they live: the arch's
 * state_part hook, by default K rows (v = 0) or V rows (v = 1) [0, pos). */
size_t wpi_seq_part(const wp_seq *s, uint32_t l, int v, uint32_t pos, float **at)
{
    const wpi_model *m = &s->mdl;
    if (s->ctx->arch->state_part) return s->ctx->arch->state_part(m, l, v, pos, at);
    const size_t kvd = (size_t)m->hp->n_kv_heads * m->hp->head_dim;
    *at = (v ? m->vcache : m->kcache) + (size_t)m->layers[l].kv_slot * m->ctx * kvd;
    return kvd * sizeof(float) * pos;
}

wp_status wp_state_save(wp_ctx *ctx, const char *path)
{
    if (!ctx) return WP_E_ARG;
    ctx->err[0] = '\0';
    return wpi_seq_save(&ctx->seqs[0], path);
}

wp_status wpi_seq_save(wp_seq *s, const char *path)
{
    wp_ctx *ctx = s->ctx;
    if (!path) return wpi_ctx_fail(ctx, WP_E_ARG, "path is NULL");
    const wpi_hparams *hp = &ctx->c->hp;
    unsigned char h[HDR], b[4];
    make_header(ctx, s->pos, h);
    FILE *f = fopen(path, "wb");
    if (!f) return wpi_ctx_fail(ctx, WP_E_IO, "cannot create state file '%s'", path);
    int ok = fwrite(h, 1, HDR, f) == HDR;
    uint32_t crc = 0;
    for (uint32_t l = 0; ok && l < hp->n_layers; l++)
        for (int v = 0; ok && v < 2; v++) {
            float *p;
            size_t bytes = wpi_seq_part(s, l, v, s->pos, &p);
            if (!bytes) continue;
            crc = wpi_crc32c(crc, p, bytes);
            ok = fwrite(p, 1, bytes, f) == bytes;
        }
    put32(b, crc);
    ok = ok && fwrite(b, 1, 4, f) == 4;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        remove(path);
        return wpi_ctx_fail(ctx, WP_E_IO, "cannot write state file '%s'", path);
    }
    return WP_OK;
}

/* Compares the saved header with this context's; the first differing field is named. */
static wp_status match_header(wp_ctx *ctx, const unsigned char *h, uint32_t pos)
{
    static const char *const names[] = {"n_layers", "n_heads", "n_kv_heads", "head_dim",
                                        "hidden_size", "vocab_size", "rope_dim", "qk_norm",
                                        "ctx_tokens", "rope_theta", "rope_attn_factor",
                                        "weights"};
    unsigned char mine[HDR];
    make_header(ctx, pos, mine);
    if (memcmp(h + 8, mine + 8, 32) != 0)
        return wpi_ctx_fail(ctx, WP_E_STATE, "state is of model_type '%.31s', this model is '%s'",
                    (const char *)h + 8, ctx->c->hp.model_type);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        uint32_t a = get32(h + 40 + 4 * i), b = get32(mine + 40 + 4 * i);
        if (a != b)
            return wpi_ctx_fail(ctx, WP_E_STATE, "state %s differs: file %u, this model %u", names[i],
                        a, b);
    }
    return WP_OK;
}

wp_status wp_state_load(wp_ctx *ctx, const char *path)
{
    if (!ctx) return WP_E_ARG;
    ctx->err[0] = '\0';
    return wpi_seq_load(&ctx->seqs[0], path);
}

wp_status wpi_seq_load(wp_seq *s, const char *path)
{
    wp_ctx *ctx = s->ctx;
    if (!path) return wpi_ctx_fail(ctx, WP_E_ARG, "path is NULL");
    const wpi_hparams *hp = &ctx->c->hp;
    unsigned char h[HDR], b[4];
    FILE *f = fopen(path, "rb");
    if (!f) return wpi_ctx_fail(ctx, WP_E_IO, "cannot open state file '%s'", path);
    wp_status st = WP_OK;
    unsigned char *buf = NULL;
    if (fread(h, 1, HDR, f) != HDR) {
        st = wpi_ctx_fail(ctx, WP_E_FORMAT, "state file '%s' is truncated (header)", path);
        goto out;
    }
    if (memcmp(h, "WPST", 4) != 0) {
        st = wpi_ctx_fail(ctx, WP_E_FORMAT, "'%s' is not a state file", path);
        goto out;
    }
    if (get32(h + 4) != VERSION) {
        st = wpi_ctx_fail(ctx, WP_E_FORMAT, "state file version %u, expected %u", get32(h + 4), VERSION);
        goto out;
    }
    if (get32(h + 124) != wpi_crc32c(0, h, 124)) {
        st = wpi_ctx_fail(ctx, WP_E_FORMAT, "state file header checksum mismatch");
        goto out;
    }
    uint32_t pos = get32(h + 88);
    if ((st = match_header(ctx, h, pos)) != WP_OK) goto out;
    if (pos > ctx->plan.ctx_tokens) {
        st = wpi_ctx_fail(ctx, WP_E_FORMAT, "state position %u exceeds the context %u", pos,
                  ctx->plan.ctx_tokens);
        goto out;
    }
    uint64_t payload = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (int v = 0; v < 2; v++) {
            float *p;
            payload += wpi_seq_part(s, l, v, pos, &p);
        }
    if (fseeko(f, 0, SEEK_END) != 0 || (uint64_t)ftello(f) != HDR + payload + 4) {
        st = wpi_ctx_fail(ctx, WP_E_FORMAT, "state file is %lld bytes, expected %llu",
                  (long long)ftello(f), (unsigned long long)(HDR + payload + 4));
        goto out;
    }
    /* Pass 1: the payload CRC, without touching the cache. */
    buf = wpi_alloc(&ctx->mem, 64, IO_BUF);
    if (!buf) {
        st = wpi_ctx_fail(ctx, WP_E_OOM, "state read buffer");
        goto out;
    }
    uint32_t crc = 0;
    fseeko(f, HDR, SEEK_SET);
    for (uint64_t left = payload; left > 0;) {
        size_t n = left < IO_BUF ? (size_t)left : IO_BUF;
        if (fread(buf, 1, n, f) != n) {
            st = wpi_ctx_fail(ctx, WP_E_IO, "short read from state file '%s'", path);
            goto out;
        }
        crc = wpi_crc32c(crc, buf, n);
        left -= n;
    }
    if (fread(b, 1, 4, f) != 4 || get32(b) != crc) {
        st = wpi_ctx_fail(ctx, WP_E_FORMAT, "state file payload checksum mismatch");
        goto out;
    }
    /* Pass 2: into the cache. A failure here leaves an unusable cache: reset. */
    fseeko(f, HDR, SEEK_SET);
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (int v = 0; v < 2; v++) {
            float *p;
            size_t bytes = wpi_seq_part(s, l, v, pos, &p);
            if (bytes && fread(p, 1, bytes, f) != bytes) {
                s->pos = 0;
                st = wpi_ctx_fail(ctx, WP_E_IO, "short read from state file '%s'; context reset", path);
                goto out;
            }
        }
    s->pos = pos;
    wpi_embeds_clear(s);
out:
    if (buf) wpi_free(&ctx->mem, buf, IO_BUF);
    fclose(f);
    return st;
}
