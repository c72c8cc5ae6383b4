/*
 * container.c -- reads a warp container's manifest.json and trunk (docs/FORMAT.md).
 *
 * The manifest is untrusted: every dimension is bounded, every size is derived from
 * dtype and shape and compared with the stated one, every offset is checked against the
 * size of the file that holds it (overflow-safe), and every error names the key, tensor
 * or file at fault. This file checks what every architecture shares (core tensors,
 * hparams, expert banks); the tensors an architecture needs beyond those are checked by
 * its arch/ code. Expert records are read by experts/reader.c, not here.
 */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "container.h"
#include "json.h"

#define MANIFEST "manifest.json"
#define MAX_NAME 255                 /* tensor and file names */
#define MAX_TENSORS (1u << 20)
#define MAX_VOCAB (1u << 24)
#define MAX_HIDDEN (1u << 17)
#define MAX_HEADS (1u << 12)
#define MAX_HEAD_DIM (1u << 12)
#define MAX_FFN (1u << 20)
#define MAX_EXPERTS (1u << 16)
#define MAX_POSITIONS (1u << 30)
#define MAX_RECORD ((uint64_t)1 << 40)

typedef struct ectx {
    char *err;
    size_t cap;
} ectx;

/* dtype ids are GGUF's ggml_type numbers, all below this; their names are the kernels'
 * (wpi_dtype_name), the one table of them. */
#define DTYPE_ID_END 64

/* ---- typed lookups: each names "where.key" in its error ------------------------- */

static wp_status need(ectx *e, const wpi_json *obj, const char *where, const char *key,
                      wpi_json_type type, const wpi_json **out)
{
    const wpi_json *v = wpi_json_get(obj, key);
    if (!v)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s.%s: required key is missing",
                        where, key);
    if (v->type != type) {
        wpi_json probe = {.type = type};
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s.%s: expected %s, got %s",
                        where, key, wpi_json_type_name(&probe), wpi_json_type_name(v));
    }
    *out = v;
    return WP_OK;
}

static wp_status int_value(ectx *e, const wpi_json *v, const char *where, const char *key,
                           int64_t lo, int64_t hi, int64_t *out)
{
    int64_t x;
    if (!wpi_json_int(v, &x))
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s%s%s: expected an integer, got %s",
                        where, key[0] ? "." : "", key,
                        v && v->type == WPI_JSON_NUMBER ? "a non-integer number"
                                                        : wpi_json_type_name(v));
    if (x < lo || x > hi)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s%s%s: %lld is out of range [%lld, %lld]", where,
                        key[0] ? "." : "", key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return WP_OK;
}

static wp_status get_int(ectx *e, const wpi_json *obj, const char *where, const char *key,
                         int64_t lo, int64_t hi, int64_t *out)
{
    const wpi_json *v = wpi_json_get(obj, key);
    if (!v)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s.%s: required key is missing",
                        where, key);
    return int_value(e, v, where, key, lo, hi, out);
}

static wp_status get_u32(ectx *e, const wpi_json *obj, const char *where, const char *key,
                         uint32_t lo, uint32_t hi, uint32_t *out)
{
    int64_t x;
    wp_status st = get_int(e, obj, where, key, lo, hi, &x);
    if (st == WP_OK)
        *out = (uint32_t)x;
    return st;
}

static wp_status get_u64(ectx *e, const wpi_json *obj, const char *where, const char *key,
                         uint64_t *out)
{
    int64_t x;
    wp_status st = get_int(e, obj, where, key, 0, INT64_MAX, &x);
    if (st == WP_OK)
        *out = (uint64_t)x;
    return st;
}

static wp_status get_bool(ectx *e, const wpi_json *obj, const char *where, const char *key,
                          int32_t *out)
{
    const wpi_json *v;
    wp_status st = need(e, obj, where, key, WPI_JSON_BOOL, &v);
    if (st == WP_OK)
        *out = v->boolean;
    return st;
}

/* A plain file name inside the container directory. */
static wp_status get_file_name(ectx *e, const wpi_json *obj, const char *where,
                               const char *key, const char **out)
{
    const wpi_json *v;
    wp_status st = need(e, obj, where, key, WPI_JSON_STRING, &v);
    if (st != WP_OK)
        return st;
    const char *s = v->str;
    if (!s[0] || v->len > MAX_NAME || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s.%s: '%.64s' is not a file name inside the container",
                        where, key, s);
    *out = s;
    return WP_OK;
}

static wp_status get_dtype(ectx *e, const wpi_json *obj, const char *where, int32_t *out)
{
    const wpi_json *v;
    wp_status st = need(e, obj, where, "dtype", WPI_JSON_STRING, &v);
    if (st != WP_OK)
        return st;
    for (int id = 0; id < DTYPE_ID_END; id++) {
        if (wpi_dtype_valid(id) && !strcmp(v->str, wpi_dtype_name(id))) {
            *out = id;
            return WP_OK;
        }
    }
    char known[128] = "";
    for (int id = 0; id < DTYPE_ID_END; id++)
        if (wpi_dtype_valid(id) && strlen(known) + 8 < sizeof known)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                     known[0] ? ", " : "", wpi_dtype_name(id));
    return wpi_fail(e->err, e->cap, WP_E_UNSUPPORTED,
                    MANIFEST ": %s.dtype: '%.32s' is not a supported dtype (%s)", where,
                    v->str, known);
}

/* shape [n] or [rows, cols]: rows/length at s[0], cols at s[1] (1 for a vector). */
static wp_status get_shape(ectx *e, const wpi_json *obj, const char *where, uint32_t *n_dims,
                           uint64_t s[2])
{
    const wpi_json *v;
    wp_status st = need(e, obj, where, "shape", WPI_JSON_ARRAY, &v);
    if (st != WP_OK)
        return st;
    if (v->len != 1 && v->len != 2)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s.shape: %zu dimensions, expected 1 or 2", where, v->len);
    for (size_t k = 0; k < v->len; k++) {
        int64_t x;
        st = int_value(e, &v->items[k], where, k ? "shape[1]" : "shape[0]", 1, UINT32_MAX, &x);
        if (st != WP_OK)
            return st;
        s[k] = (uint64_t)x;
    }
    if (v->len == 1)
        s[1] = 1;
    *n_dims = (uint32_t)v->len;
    return WP_OK;
}

/* Bytes implied by dtype and shape; 0 (with err set) when the shape cannot hold dtype. */
static wp_status shape_bytes(ectx *e, const char *where, int32_t dtype, uint32_t n_dims,
                             const uint64_t s[2], uint64_t *out)
{
    uint64_t cols = n_dims == 2 ? s[1] : s[0];
    uint64_t rows = n_dims == 2 ? s[0] : 1;
    size_t rb = wpi_row_bytes(dtype, (size_t)cols);
    uint64_t b;
    if (rb == 0)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s: %llu columns cannot be stored as %s (blocks of 32)",
                        where, (unsigned long long)cols, wpi_dtype_name(dtype));
    if (__builtin_mul_overflow((uint64_t)rb, rows, &b))
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s: size overflows", where);
    *out = b;
    return WP_OK;
}

/* ---- files -------------------------------------------------------------------------- */

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static wp_status file_size(ectx *e, const char *path, const char *what, uint64_t *out)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return wpi_fail(e->err, e->cap, WP_E_IO, "%s: cannot open '%s': %s", what, path,
                        strerror(errno));
    if (!S_ISREG(st.st_mode))
        return wpi_fail(e->err, e->cap, WP_E_IO, "%s: '%s' is not a regular file", what, path);
    *out = (uint64_t)st.st_size;
    return WP_OK;
}

static wp_status read_manifest(ectx *e, const char *path, char **out, size_t *out_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wpi_fail(e->err, e->cap, WP_E_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return wpi_fail(e->err, e->cap, WP_E_IO, "'%s' is not a readable file", path);
    }
    if ((uint64_t)st.st_size > WPI_JSON_MAX_BYTES) {
        close(fd);
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %lld bytes exceeds the limit of %zu",
                        (long long)st.st_size, WPI_JSON_MAX_BYTES);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return wpi_fail(e->err, e->cap, WP_E_OOM, MANIFEST ": out of memory");
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return wpi_fail(e->err, e->cap, WP_E_IO, "'%s': read failed", path);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return WP_OK;
}

/* ---- hparams ----------------------------------------------------------------------- */

#define W MANIFEST ": hparams"

/* The one table of hparams bounds: every key of wpi_hparams the manifest reader (required
 * keys) or a shared block (optional keys, blocks/hparams.c) reads, integers and numbers.
 * parse_hparams reads the required keys with them, wpi_hparam_u32 / wpi_hparam_f32 each
 * optional one, and wpi_hparams_check re-applies them all, with the relations between
 * keys, to a parsed struct (arch checks call it through wpi_check_decoder); an
 * architecture's own keys are in a table in its file, read by the same code
 * (wpi_hparams_bounds). So no two can disagree and no check repeats a limit. An optional
 * key reads 0 when absent or null. */
#define REQ(key, lo, hi) {#key, offsetof(wpi_hparams, key), lo, hi, WPI_HPB_REQUIRED}
#define OPT(key, lo, hi) {#key, offsetof(wpi_hparams, key), lo, hi, 0}
#define REQF(key, lo, hi, open) \
    {#key, offsetof(wpi_hparams, key), lo, hi, WPI_HPB_REQUIRED | WPI_HPB_FLOAT | (open)}
#define OPTF(key, lo, hi, open) {#key, offsetof(wpi_hparams, key), lo, hi, WPI_HPB_FLOAT | (open)}
static const wpi_hp_bound hp_bounds[] = {
    REQ(vocab_size, 1, MAX_VOCAB),
    REQ(hidden_size, 1, MAX_HIDDEN),
    REQ(n_layers, 1, WPI_MAX_LAYERS),
    REQ(n_heads, 1, MAX_HEADS),
    REQ(n_kv_heads, 1, MAX_HEADS),          /* and divides n_heads */
    REQ(head_dim, 1, MAX_HEAD_DIM),
    REQ(intermediate_size, 0, MAX_FFN),
    REQ(moe_intermediate_size, 0, MAX_FFN),
    REQ(n_experts, 0, MAX_EXPERTS),
    REQ(top_k, 0, MAX_EXPERTS),             /* and 1..n_experts when there are experts */
    REQ(shared_expert_intermediate_size, 0, MAX_FFN),
    REQ(rope_dim, 0, MAX_HEAD_DIM),         /* and even, at most head_dim */
    REQ(max_position_embeddings, 1, MAX_POSITIONS),
    REQF(rms_norm_eps, 0, 0.5, WPI_HPB_LO_OPEN),
    REQF(rope_theta, 0, FLT_MAX, WPI_HPB_LO_OPEN),
    REQF(rope_attn_factor, 0, 1e6, WPI_HPB_LO_OPEN),
    REQF(attn_scale, 0, 1e6, WPI_HPB_LO_OPEN),
    OPTF(clip_qkv, 0, FLT_MAX, 0),
    /* optional: MLA and routing (blocks/mla.c, route_noaux.c) */
    OPT(q_lora_rank, 0, 1u << 16),
    OPT(kv_lora_rank, 0, WPI_MAX_LORA_RANK),
    OPT(qk_nope_head_dim, 0, MAX_HEAD_DIM),
    OPT(v_head_dim, 0, MAX_HEAD_DIM),
    OPT(n_group, 0, 4096),
    OPT(topk_group, 0, 4096),
    OPTF(routed_scaling_factor, 0, 1e6, WPI_HPB_LO_OPEN), /* 1 when absent */
    OPTF(lora_norm_eps, 0, 1, 0),
    /* hyper-connections (hyper.c) and the indexers' shape */
    OPT(hc_mult, 0, WPI_HC_MAX),
    OPT(hc_sinkhorn_iters, 0, 10000),
    OPTF(hc_eps, 0, 1, WPI_HPB_HI_OPEN),
    OPT(index_heads, 0, 4096),
    OPT(index_head_dim, 0, MAX_HEAD_DIM),
    OPT(index_topk, 0, 1u << 20),
    /* sliding window, KDA (kda.c), the clamped SwiGLU (ffn.c) */
    OPT(sliding_window, 1, 1u << 30),
    OPT(kda_heads, 1, MAX_HEADS),
    OPT(kda_head_dim, 1, WPI_KDA_MAX_HEAD_DIM),
    OPT(kda_conv, 1, 64),
    OPTF(kda_lower_bound, -1e6, 0, 0),
    OPTF(swiglu_alpha, 0, 1e6, 0),
    OPTF(swiglu_limit, 0, FLT_MAX, 0),
    /* the experts' width (a latent MoE's) and SiTU-GLU (ffn.c) */
    OPT(expert_hidden_size, 1, MAX_HIDDEN),
    OPTF(situ_beta, 0, 1e6, 0),
    OPTF(situ_linear_beta, 0, 1e6, 0),
};
#undef OPTF
#undef REQF
#undef OPT
#undef REQ
#define N_BOUNDS (sizeof hp_bounds / sizeof hp_bounds[0])

static int in_bounds(const wpi_hp_bound *b, double v)
{
    return (b->flags & WPI_HPB_LO_OPEN ? v > b->lo : v >= b->lo) &&
           (b->flags & WPI_HPB_HI_OPEN ? v < b->hi : v <= b->hi);
}

/* "[lo, hi]" with the bound's open ends, into buf. */
static const char *interval(const wpi_hp_bound *b, char *buf, size_t cap)
{
    if (b->flags & WPI_HPB_FLOAT)
        snprintf(buf, cap, "%c%g, %g%c", b->flags & WPI_HPB_LO_OPEN ? '(' : '[', b->lo, b->hi,
                 b->flags & WPI_HPB_HI_OPEN ? ')' : ']');
    else
        snprintf(buf, cap, "[%u, %u]", (uint32_t)b->lo, (uint32_t)b->hi);
    return buf;
}

/* Reads key b from h into its field of base: absent or null is 0 (*present 0). */
static wp_status read_key(const wpi_json *h, const wpi_hp_bound *b, void *base, int *present,
                          char *err, size_t cap)
{
    const wpi_json *v = wpi_json_get(h, b->key);
    const int given = v && v->type != WPI_JSON_NULL;
    char iv[64];
    if (present) *present = given;
    if (b->flags & WPI_HPB_FLOAT) {
        double d = 0;
        if (given && (!wpi_json_num(v, &d) || !in_bounds(b, d) || !in_bounds(b, (float)d)))
            return wpi_fail(err, cap, WP_E_FORMAT, W ".%s: expected a number in %s", b->key,
                            interval(b, iv, sizeof iv));
        const float f = (float)d;
        memcpy((char *)base + b->off, &f, sizeof f);
    } else {
        int64_t x = 0;
        if (given && (!wpi_json_int(v, &x) || !in_bounds(b, (double)x)))
            return wpi_fail(err, cap, WP_E_FORMAT, W ".%s: expected an integer in %s", b->key,
                            interval(b, iv, sizeof iv));
        const uint32_t u = (uint32_t)x;
        memcpy((char *)base + b->off, &u, sizeof u);
    }
    return WP_OK;
}

wp_status wpi_hparams_bounds(const struct wpi_json *h, const wpi_hp_bound *table, size_t n,
                             void *base, char *err, size_t cap)
{
    for (size_t i = 0; i < n; i++) TRY(read_key(h, &table[i], base, NULL, err, cap));
    return WP_OK;
}

/* An optional key of the one table, of the given kind. */
static wp_status read_optional(const struct wpi_json *h, const char *key, int is_float,
                               wpi_hparams *hp, int *present, char *err, size_t cap)
{
    for (size_t i = 0; i < N_BOUNDS; i++) {
        const wpi_hp_bound *b = &hp_bounds[i];
        if (!(b->flags & WPI_HPB_REQUIRED) && !(b->flags & WPI_HPB_FLOAT) == !is_float &&
            !strcmp(b->key, key))
            return read_key(h, b, hp, present, err, cap);
    }
    return wpi_fail(err, cap, WP_E_ARG, W ".%s: not an optional %s key", key,
                    is_float ? "number" : "integer");
}

wp_status wpi_hparam_kinds(const struct wpi_json *h, const char *key, const char *const *names,
                           uint32_t n_names, uint32_t n_layers, uint8_t *out, char *err,
                           size_t cap)
{
    const wpi_json *v = wpi_json_get(h, key);
    if (!v || v->type == WPI_JSON_NULL) return WP_OK;
    if (v->type != WPI_JSON_ARRAY || v->len != n_layers)
        return wpi_fail(err, cap, WP_E_FORMAT, W ".%s: expected %u strings", key, n_layers);
    for (uint32_t l = 0; l < n_layers; l++) {
        const char *k = wpi_json_str(&v->items[l]);
        uint32_t i = 0;
        while (i < n_names && !(k && !strcmp(k, names[i]))) i++;
        if (i < n_names) {
            out[l] = (uint8_t)i;
            continue;
        }
        char list[256];
        size_t off = 0;
        for (uint32_t j = 0; j < n_names && off < sizeof list; j++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s\"%s\"", j ? ", " : "",
                                    names[j]);
        return wpi_fail(err, cap, WP_E_FORMAT, W ".%s[%u]: expected one of %s", key, l, list);
    }
    return WP_OK;
}

wp_status wpi_hparam_u32(const struct wpi_json *h, const char *key, wpi_hparams *hp, char *err,
                         size_t cap)
{
    return read_optional(h, key, 0, hp, NULL, err, cap);
}

wp_status wpi_hparam_f32(const struct wpi_json *h, const char *key, wpi_hparams *hp,
                         int *present, char *err, size_t cap)
{
    return read_optional(h, key, 1, hp, present, err, cap);
}
#undef W

/* The field of bound b in hp, as a double. */
static double hp_field(const wpi_hparams *hp, const wpi_hp_bound *b)
{
    if (b->flags & WPI_HPB_FLOAT) {
        float f;
        memcpy(&f, (const char *)hp + b->off, sizeof f);
        return f;
    }
    uint32_t v;
    memcpy(&v, (const char *)hp + b->off, sizeof v);
    return v;
}

wp_status wpi_hparams_check(const wpi_hparams *hp, char *err, size_t cap)
{
#define HP(cond, key, ...) \
    if (!(cond)) return wpi_fail(err, cap, WP_E_FORMAT, MANIFEST ": hparams." key ": " __VA_ARGS__)
    for (size_t i = 0; i < N_BOUNDS; i++) {
        const wpi_hp_bound *b = &hp_bounds[i];
        const double v = hp_field(hp, b);
        char iv[64];
        if (!(b->flags & WPI_HPB_REQUIRED) && v == 0) continue; /* absent */
        if (!isfinite(v) || !in_bounds(b, v))
            return wpi_fail(err, cap, WP_E_FORMAT, MANIFEST ": hparams.%s: %g is out of range %s",
                            b->key, v, interval(b, iv, sizeof iv));
    }
    HP(hp->n_kv_heads <= hp->n_heads && hp->n_heads % hp->n_kv_heads == 0, "n_kv_heads",
       "n_heads %u is not a multiple of n_kv_heads %u", hp->n_heads, hp->n_kv_heads);
    HP(hp->rope_dim % 2 == 0 && hp->rope_dim <= hp->head_dim, "rope_dim",
       "%u must be even and at most head_dim %u", hp->rope_dim, hp->head_dim);
    HP(hp->top_k <= hp->n_experts && (hp->n_experts == 0 || hp->top_k >= 1), "top_k",
       "%u is out of range [1, n_experts %u]", hp->top_k, hp->n_experts);
    HP(hp->qk_norm >= WPI_QK_NONE && hp->qk_norm <= WPI_QK_FULL, "qk_norm", "kind %d",
       hp->qk_norm);
    HP(!hp->shared_expert_gate || hp->shared_expert_intermediate_size, "shared_expert_gate",
       "a gate without a shared expert (shared_expert_intermediate_size is 0)");
    uint32_t n_moe = 0, n_dense = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        n_moe += hp->layer_is_moe[l] != 0;
        n_dense += hp->layer_is_moe[l] == 0;
    }
    HP(!n_moe || hp->n_experts, "n_experts", "0, but layer_kinds has %u moe layers", n_moe);
    HP(!n_moe || hp->moe_intermediate_size, "moe_intermediate_size",
       "0, but layer_kinds has %u moe layers", n_moe);
    HP(!n_dense || hp->intermediate_size, "intermediate_size",
       "0, but layer_kinds has %u dense layers", n_dense);
    HP(hp->bos_token_id >= -1 && hp->bos_token_id < (int64_t)hp->vocab_size, "bos_token_id",
       "%d is not a token id below vocab_size %u", hp->bos_token_id, hp->vocab_size);
    HP(hp->n_eos <= WPI_MAX_EOS, "eos_token_ids", "%u entries, at most %d", hp->n_eos,
       WPI_MAX_EOS);
    for (uint32_t k = 0; k < hp->n_eos; k++)
        HP(hp->eos_token_ids[k] >= 0 && hp->eos_token_ids[k] < (int64_t)hp->vocab_size,
           "eos_token_ids", "[%u] %d is not a token id below vocab_size %u", k,
           hp->eos_token_ids[k], hp->vocab_size);
#undef HP
    return WP_OK;
}

/* A required number within bound b, into its field of hp. */
static wp_status get_float(ectx *e, const wpi_json *h, const char *where, const wpi_hp_bound *b,
                           wpi_hparams *hp)
{
    const wpi_json *v;
    char iv[64];
    TRY(need(e, h, where, b->key, WPI_JSON_NUMBER, &v));
    const double d = v->number;
    const float f = (float)d;
    if (!in_bounds(b, d) || !in_bounds(b, f))
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s.%s: %g is out of range %s",
                        where, b->key, d, interval(b, iv, sizeof iv));
    memcpy((char *)hp + b->off, &f, sizeof f);
    return WP_OK;
}

const char *const wpi_qk_norm_names[3] = {[WPI_QK_NONE] = "none", [WPI_QK_HEAD] = "head",
                                          [WPI_QK_FULL] = "full"};

static wp_status parse_hparams(ectx *e, const wpi_json *h, wpi_hparams *hp)
{
    const char *w = "hparams";
    wp_status st;
    for (size_t i = 0; i < N_BOUNDS; i++) {
        const wpi_hp_bound *b = &hp_bounds[i];
        if (!(b->flags & WPI_HPB_REQUIRED) || (b->flags & WPI_HPB_FLOAT)) continue;
        uint32_t v;
        if ((st = get_u32(e, h, w, b->key, (uint32_t)b->lo, (uint32_t)b->hi, &v)) != WP_OK)
            return st;
        memcpy((char *)hp + b->off, &v, sizeof v);
    }
    if ((st = get_bool(e, h, w, "shared_expert_gate", &hp->shared_expert_gate)) != WP_OK ||
        (st = get_bool(e, h, w, "norm_topk_prob", &hp->norm_topk_prob)) != WP_OK ||
        (st = get_bool(e, h, w, "tie_word_embeddings", &hp->tie_word_embeddings)) != WP_OK)
        return st;
    for (size_t i = 0; i < N_BOUNDS; i++) {
        const wpi_hp_bound *b = &hp_bounds[i];
        if ((b->flags & WPI_HPB_REQUIRED) && (b->flags & WPI_HPB_FLOAT) &&
            (st = get_float(e, h, w, b, hp)) != WP_OK)
            return st;
    }
    if ((st = wpi_hparam_f32(h, "clip_qkv", hp, NULL, e->err, e->cap)) != WP_OK)
        return st;

    const wpi_json *v;
    if ((st = need(e, h, w, "qk_norm", WPI_JSON_STRING, &v)) != WP_OK)
        return st;
    hp->qk_norm = -1;
    for (int k = WPI_QK_NONE; k <= WPI_QK_FULL; k++)
        if (!strcmp(v->str, wpi_qk_norm_names[k])) hp->qk_norm = k;
    if (hp->qk_norm < 0)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": hparams.qk_norm: '%.32s' is not none, head or full", v->str);

    if ((st = need(e, h, w, "layer_kinds", WPI_JSON_ARRAY, &v)) != WP_OK)
        return st;
    if (v->len != hp->n_layers)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": hparams.layer_kinds: %zu entries, n_layers is %u", v->len,
                        hp->n_layers);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const char *k = wpi_json_str(&v->items[l]);
        if (k && !strcmp(k, "moe")) {
            hp->layer_is_moe[l] = 1;
        } else if (k && !strcmp(k, "dense")) {
            hp->layer_is_moe[l] = 0;
        } else {
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": hparams.layer_kinds[%u]: expected \"dense\" or \"moe\"", l);
        }
    }
    v = wpi_json_get(h, "bos_token_id");
    if (!v)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": hparams.bos_token_id: required key is missing");
    if (v->type == WPI_JSON_NULL) {
        hp->bos_token_id = -1;
    } else {
        int64_t x;
        if ((st = int_value(e, v, w, "bos_token_id", 0, (int64_t)hp->vocab_size - 1, &x)) != WP_OK)
            return st;
        hp->bos_token_id = (int32_t)x;
    }
    if ((st = need(e, h, w, "eos_token_ids", WPI_JSON_ARRAY, &v)) != WP_OK)
        return st;
    if (v->len > WPI_MAX_EOS)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": hparams.eos_token_ids: %zu entries, at most %d", v->len,
                        WPI_MAX_EOS);
    hp->n_eos = (uint32_t)v->len;
    for (size_t k = 0; k < v->len; k++) {
        int64_t x;
        if ((st = int_value(e, &v->items[k], w, "eos_token_ids[]", 0,
                            (int64_t)hp->vocab_size - 1, &x)) != WP_OK)
            return st;
        hp->eos_token_ids[k] = (int32_t)x;
    }
    if ((st = wpi_hparams_check(hp, e->err, e->cap)) != WP_OK)
        return st;
    hp->top_k_shipped = hp->top_k;
    return wpi_arch_hparams(hp->model_type, h, hp, e->err, e->cap);
}

/* ---- trunk --------------------------------------------------------------------------- */

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const wpi_tensor *)a)->name, ((const wpi_tensor *)b)->name);
}

static wp_status parse_trunk(ectx *e, const wpi_json *root, wpi_container *c)
{
    const wpi_json *trunk, *list;
    const char *file;
    wp_status st;
    if ((st = need(e, root, "manifest", "trunk", WPI_JSON_OBJECT, &trunk)) != WP_OK ||
        (st = get_file_name(e, trunk, "trunk", "file", &file)) != WP_OK ||
        (st = need(e, trunk, "trunk", "tensors", WPI_JSON_ARRAY, &list)) != WP_OK)
        return st;
    uint64_t stated, size;
    if ((st = get_u64(e, trunk, "trunk", "bytes", &stated)) != WP_OK)
        return st;
    c->trunk_path = join(c->dir, file);
    if (!c->trunk_path)
        return wpi_fail(e->err, e->cap, WP_E_OOM, MANIFEST ": out of memory");
    if ((st = file_size(e, c->trunk_path, MANIFEST ": trunk.file", &size)) != WP_OK)
        return st;
    if (stated != size)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": trunk.bytes %llu does not match the size %llu of %s",
                        (unsigned long long)stated, (unsigned long long)size, file);
    if (list->len == 0 || list->len > MAX_TENSORS)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": trunk.tensors: %zu entries, expected 1 to %u", list->len,
                        MAX_TENSORS);
    c->tensors = calloc(list->len, sizeof(*c->tensors));
    if (!c->tensors)
        return wpi_fail(e->err, e->cap, WP_E_OOM, MANIFEST ": out of memory");
    char where[MAX_NAME + 64];
    for (size_t i = 0; i < list->len; i++) {
        const wpi_json *t = &list->items[i];
        wpi_tensor *x = &c->tensors[i];
        const wpi_json *nm;
        snprintf(where, sizeof(where), "trunk.tensors[%zu]", i);
        if (t->type != WPI_JSON_OBJECT)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s: expected object, got %s",
                            where, wpi_json_type_name(t));
        if ((st = need(e, t, where, "name", WPI_JSON_STRING, &nm)) != WP_OK)
            return st;
        if (!nm->len || nm->len > MAX_NAME)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s.name: length %zu, expected 1 to %d", where, nm->len,
                            MAX_NAME);
        x->name = strdup(nm->str);
        if (!x->name)
            return wpi_fail(e->err, e->cap, WP_E_OOM, MANIFEST ": out of memory");
        c->n_tensors = (uint32_t)i + 1;
        snprintf(where, sizeof(where), "trunk tensor '%s'", x->name);
        int64_t crc;
        if ((st = get_dtype(e, t, where, &x->dtype)) != WP_OK ||
            (st = get_shape(e, t, where, &x->n_dims, x->shape)) != WP_OK ||
            (st = get_u64(e, t, where, "offset", &x->offset)) != WP_OK ||
            (st = get_u64(e, t, where, "bytes", &x->bytes)) != WP_OK ||
            (st = get_int(e, t, where, "crc32c", 0, UINT32_MAX, &crc)) != WP_OK)
            return st;
        x->crc32c = (uint32_t)crc;
        uint64_t want;
        if ((st = shape_bytes(e, where, x->dtype, x->n_dims, x->shape, &want)) != WP_OK)
            return st;
        if (x->bytes != want)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s: bytes %llu, but %s of this shape is %llu bytes",
                            where, (unsigned long long)x->bytes, wpi_dtype_name(x->dtype),
                            (unsigned long long)want);
        if (x->offset % 64)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s: offset %llu is not 64-byte aligned", where,
                            (unsigned long long)x->offset);
        if (x->bytes > size || x->offset > size - x->bytes)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s: offset+bytes exceeds %s size %llu", where, file,
                            (unsigned long long)size);
        if (wpi_is_vision_tensor(x->name))
            c->vision_bytes += x->bytes;
        else
            c->trunk_bytes += x->bytes; /* <= n * size: cannot overflow */
    }
    qsort(c->tensors, c->n_tensors, sizeof(*c->tensors), cmp_tensor_name);
    for (uint32_t i = 1; i < c->n_tensors; i++)
        if (!strcmp(c->tensors[i - 1].name, c->tensors[i].name))
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": trunk tensor '%s' appears twice", c->tensors[i].name);
    return WP_OK;
}

static wp_status need_core(ectx *e, const wpi_container *c, const char *name,
                           uint32_t n_dims, uint64_t d0, uint64_t d1)
{
    const wpi_tensor *t = wpi_container_tensor(c, name);
    if (!t)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": trunk tensor '%s' is missing",
                        name);
    if (t->n_dims != n_dims || t->shape[0] != d0 || (n_dims == 2 && t->shape[1] != d1)) {
        if (n_dims == 2)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": trunk tensor '%s': shape does not match hparams "
                            "(expected [%llu, %llu])", name, (unsigned long long)d0,
                            (unsigned long long)d1);
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": trunk tensor '%s': shape does not match hparams "
                        "(expected [%llu])", name, (unsigned long long)d0);
    }
    return WP_OK;
}

static wp_status check_core(ectx *e, const wpi_container *c)
{
    const wpi_hparams *hp = &c->hp;
    wp_status st;
    if ((st = need_core(e, c, "token_embd.weight", 2, hp->vocab_size, hp->hidden_size)) != WP_OK ||
        (st = need_core(e, c, "output_norm.weight", 1, hp->hidden_size, 1)) != WP_OK)
        return st;
    if (!hp->tie_word_embeddings &&
        (st = need_core(e, c, "output.weight", 2, hp->vocab_size, hp->hidden_size)) != WP_OK)
        return st;
    if (hp->rope_dim) {
        if ((st = need_core(e, c, "rope_freqs", 1, hp->rope_dim / 2, 1)) != WP_OK)
            return st;
        if (wpi_container_tensor(c, "rope_freqs")->dtype != WPI_F32)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": trunk tensor 'rope_freqs': dtype must be f32");
    }
    return WP_OK;
}

/* ---- expert banks ----------------------------------------------------------------- */

static wp_status parse_bank(ectx *e, const wpi_json *b, size_t idx, wpi_container *c,
                            wpi_bank *bk)
{
    const wpi_hparams *hp = &c->hp;
    char where[96];
    snprintf(where, sizeof(where), "experts[%zu]", idx);
    if (b->type != WPI_JSON_OBJECT)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s: expected object, got %s",
                        where, wpi_json_type_name(b));
    wp_status st;
    const char *file;
    const wpi_json *list;
    if ((st = get_u32(e, b, where, "layer", 0, hp->n_layers - 1, &bk->layer)) != WP_OK)
        return st;
    if (!hp->layer_is_moe[bk->layer])
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s.layer: layer %u is dense in hparams.layer_kinds", where,
                        bk->layer);
    if (c->bank_of_layer[bk->layer] >= 0)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s.layer: layer %u has two expert banks", where, bk->layer);
    if ((st = get_file_name(e, b, where, "file", &file)) != WP_OK ||
        (st = get_u32(e, b, where, "n_experts", hp->n_experts, hp->n_experts,
                      &bk->n_experts)) != WP_OK ||
        (st = get_u64(e, b, where, "record_bytes", &bk->record_bytes)) != WP_OK ||
        (st = need(e, b, where, "tensors", WPI_JSON_ARRAY, &list)) != WP_OK)
        return st;
    if (bk->record_bytes == 0 || bk->record_bytes % WPI_DISK_ALIGN ||
        bk->record_bytes > MAX_RECORD)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s.record_bytes: %llu is not a positive multiple of %d "
                        "(at most 2^40)", where, (unsigned long long)bk->record_bytes,
                        WPI_DISK_ALIGN);
    if (list->len != 3)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s.tensors: %zu entries, expected gate, up, down", where,
                        list->len);
    static const char *const names[3] = {"gate", "up", "down"};
    uint64_t *offs[3] = {&bk->gate_offset, &bk->up_offset, &bk->down_offset};
    uint64_t next = WPI_RECORD_HEADER_BYTES;
    const uint64_t eh = hp->expert_hidden_size ? hp->expert_hidden_size : hp->hidden_size;
    bk->inter = hp->moe_intermediate_size;
    bk->hidden = (uint32_t)eh;
    for (int k = 0; k < 3; k++) {
        const wpi_json *t = &list->items[k], *nm;
        char tw[160];
        snprintf(tw, sizeof(tw), "%s.tensors[%d]", where, k);
        if (t->type != WPI_JSON_OBJECT)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": %s: expected object, got %s",
                            tw, wpi_json_type_name(t));
        if ((st = need(e, t, tw, "name", WPI_JSON_STRING, &nm)) != WP_OK)
            return st;
        if (strcmp(nm->str, names[k]))
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s.name: expected '%s' (gate, up, down in order)", tw,
                            names[k]);
        snprintf(tw, sizeof(tw), "%s (layer %u) tensor '%s'", where, bk->layer, names[k]);
        int32_t dtype;
        uint32_t nd;
        uint64_t s[2], off, bytes, want;
        if ((st = get_dtype(e, t, tw, &dtype)) != WP_OK ||
            (st = get_shape(e, t, tw, &nd, s)) != WP_OK ||
            (st = get_u64(e, t, tw, "offset", &off)) != WP_OK ||
            (st = get_u64(e, t, tw, "bytes", &bytes)) != WP_OK)
            return st;
        if (k == 0)
            bk->dtype = dtype;
        else if (dtype != bk->dtype)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s: dtype %s differs from gate's %s", tw,
                            wpi_dtype_name(dtype), wpi_dtype_name(bk->dtype));
        uint64_t r = k == 2 ? eh : hp->moe_intermediate_size;
        uint64_t cl = k == 2 ? hp->moe_intermediate_size : eh;
        if (nd != 2 || s[0] != r || s[1] != cl)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s: shape does not match hparams (expected [%llu, %llu])",
                            tw, (unsigned long long)r, (unsigned long long)cl);
        if ((st = shape_bytes(e, tw, dtype, nd, s, &want)) != WP_OK)
            return st;
        if (bytes != want)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s: bytes %llu, but %s of this shape is %llu bytes", tw,
                            (unsigned long long)bytes, wpi_dtype_name(dtype),
                            (unsigned long long)want);
        if (off != next)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": %s: offset %llu, expected %llu (gate at 64, then "
                            "adjacent)", tw, (unsigned long long)off, (unsigned long long)next);
        *offs[k] = off;
        next = off + bytes; /* both bounded well below 2^63 */
    }
    if (next > bk->record_bytes)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s: gate, up and down end at %llu, past record_bytes %llu",
                        where, (unsigned long long)next, (unsigned long long)bk->record_bytes);
    bk->payload_bytes = next - WPI_RECORD_HEADER_BYTES;
    bk->path = join(c->dir, file);
    if (!bk->path)
        return wpi_fail(e->err, e->cap, WP_E_OOM, MANIFEST ": out of memory");
    char what[160];
    snprintf(what, sizeof(what), MANIFEST ": %s.file", where);
    uint64_t size, want;
    if ((st = file_size(e, bk->path, what, &size)) != WP_OK)
        return st;
    if (__builtin_mul_overflow((uint64_t)bk->n_experts, bk->record_bytes, &want) || size != want)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": %s: %s is %llu bytes, expected n_experts %u x record_bytes "
                        "%llu", where, file, (unsigned long long)size, bk->n_experts,
                        (unsigned long long)bk->record_bytes);
    return WP_OK;
}

static wp_status parse_banks(ectx *e, const wpi_json *root, wpi_container *c)
{
    const wpi_json *list;
    wp_status st = need(e, root, "manifest", "experts", WPI_JSON_ARRAY, &list);
    if (st != WP_OK)
        return st;
    uint32_t n_moe = 0;
    for (uint32_t l = 0; l < c->hp.n_layers; l++)
        n_moe += c->hp.layer_is_moe[l];
    if (list->len != n_moe)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": experts: %zu banks, hparams.layer_kinds has %u moe layers",
                        list->len, n_moe);
    if (n_moe) {
        c->banks = calloc(n_moe, sizeof(*c->banks));
        if (!c->banks)
            return wpi_fail(e->err, e->cap, WP_E_OOM, MANIFEST ": out of memory");
    }
    for (uint32_t i = 0; i < n_moe; i++) {
        wpi_bank *bk = &c->banks[i];
        c->n_banks = i + 1; /* so that close frees a partly parsed bank */
        if ((st = parse_bank(e, &list->items[i], i, c, bk)) != WP_OK)
            return st;
        c->bank_of_layer[bk->layer] = (int32_t)i;
        c->experts_total_bytes += (uint64_t)bk->n_experts * bk->record_bytes;
        if (bk->record_bytes > c->max_record_bytes)
            c->max_record_bytes = bk->record_bytes;
    }
    return WP_OK;
}

/* ---- public -------------------------------------------------------------------------- */

/* ---- the vision tower ------------------------------------------------------------- */

#define VHP_U32(key, lo, hi) {#key, offsetof(wpi_vision_hp, key), lo, hi, WPI_HPB_REQUIRED}
#define VHP_F32(key, lo, hi)                                                           \
    {#key, offsetof(wpi_vision_hp, key), lo, hi, WPI_HPB_REQUIRED | WPI_HPB_FLOAT | WPI_HPB_LO_OPEN}
/* The one table of the tower's hparams keys (manifest vision.hparams), all required. */
static const wpi_hp_bound vhp_bounds[] = {
    VHP_U32(hidden_size, 1, 1u << 16),
    VHP_U32(n_layers, 1, 256),
    VHP_U32(n_heads, 1, 1024),
    VHP_U32(intermediate_size, 1, 1u << 18),
    VHP_U32(patch_size, 1, 64),
    VHP_U32(merge_size, 1, 8),
    VHP_U32(temporal_patch_size, 1, 8),
    VHP_U32(channels, 1, 4),
    VHP_U32(pos_grid_h, 1, 1024),
    VHP_U32(pos_grid_w, 1, 1024),
    VHP_U32(max_patches, 1, 1u << 20),
    VHP_U32(out_hidden_size, 1, 1u << 17),
    VHP_F32(rope_theta, 0, 1e12),
    VHP_F32(norm_eps, 0, 1),
    VHP_F32(proj_norm_eps, 0, 1),
    {"proj_intermediate_size", offsetof(wpi_vision_hp, proj_intermediate_size), 0, 1u << 18, 0},
    {"glu_limit", offsetof(wpi_vision_hp, glu_limit), 0, 1e6, WPI_HPB_FLOAT},
    {"attn_hidden_size", offsetof(wpi_vision_hp, attn_hidden_size), 1, 1u << 16, 0},
};

static wp_status vision_act(ectx *e, const wpi_json *h, const char *key, int32_t *out)
{
    const wpi_json *v;
    wp_status st = need(e, h, "vision.hparams", key, WPI_JSON_STRING, &v);
    if (st != WP_OK)
        return st;
    if (!strcmp(v->str, "gelu"))
        *out = WPI_ACT_GELU;
    else if (!strcmp(v->str, "gelu_tanh"))
        *out = WPI_ACT_GELU_TANH;
    else if (!strcmp(v->str, "silu"))
        *out = WPI_ACT_SILU;
    else
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": vision.hparams.%s: '%.32s' is not gelu, gelu_tanh or silu",
                        key, v->str);
    return WP_OK;
}

static wp_status parse_vision(ectx *e, const wpi_json *root, wpi_container *c)
{
    c->placeholder_id = -1;
    const wpi_json *v = wpi_json_get(root, "vision"), *h;
    if (!v || v->type == WPI_JSON_NULL) {
        if (c->vision_bytes)
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": vision tensors (v.*) without a vision object");
        return WP_OK;
    }
    if (v->type != WPI_JSON_OBJECT)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT, MANIFEST ": vision: expected object, got %s",
                        wpi_json_type_name(v));
    wp_status st;
    if ((st = need(e, v, "vision", "hparams", WPI_JSON_OBJECT, &h)) != WP_OK ||
        (st = wpi_hparams_bounds(h, vhp_bounds, sizeof vhp_bounds / sizeof vhp_bounds[0],
                                 &c->vhp, e->err, e->cap)) != WP_OK ||
        (st = vision_act(e, h, "act", &c->vhp.act)) != WP_OK ||
        (st = vision_act(e, h, "proj_act", &c->vhp.proj_act)) != WP_OK)
        return st;
    for (size_t i = 0; i < sizeof vhp_bounds / sizeof vhp_bounds[0]; i++)
        if ((vhp_bounds[i].flags & WPI_HPB_REQUIRED) && !wpi_json_get(h, vhp_bounds[i].key))
            return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                            MANIFEST ": vision.hparams.%s: required key is missing",
                            vhp_bounds[i].key);
    if (!c->vhp.attn_hidden_size)
        c->vhp.attn_hidden_size = c->vhp.hidden_size;
    if (c->vhp.out_hidden_size != c->hp.hidden_size)
        return wpi_fail(e->err, e->cap, WP_E_FORMAT,
                        MANIFEST ": vision.hparams.out_hidden_size %u is not hidden_size %u",
                        c->vhp.out_hidden_size, c->hp.hidden_size);
    int64_t id;
    if ((st = need(e, v, "vision", "placeholder_token_id", WPI_JSON_NUMBER, &h)) != WP_OK ||
        (st = int_value(e, h, "vision", "placeholder_token_id", 0,
                        (int64_t)c->hp.vocab_size - 1, &id)) != WP_OK)
        return st;
    c->placeholder_id = (int32_t)id;
    c->has_vision = 1;
    return WP_OK;
}

wp_status wpi_container_open(const char *dir, wpi_container **out, char *err, size_t cap)
{
    ectx e = {err, cap};
    if (!dir || !out)
        return wpi_fail(err, cap, WP_E_ARG, "container: NULL argument");
    *out = NULL;
    struct stat sd;
    if (stat(dir, &sd) != 0)
        return wpi_fail(err, cap, WP_E_IO, "cannot open container '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sd.st_mode))
        return wpi_fail(err, cap, WP_E_IO, "'%s' is not a container directory", dir);
    wpi_container *c = calloc(1, sizeof(*c));
    if (!c)
        return wpi_fail(err, cap, WP_E_OOM, "container: out of memory");
    for (int l = 0; l < WPI_MAX_LAYERS; l++)
        c->bank_of_layer[l] = -1;
    c->dir = strdup(dir);
    char *mpath = c->dir ? join(dir, MANIFEST) : NULL;
    char *text = NULL;
    size_t len = 0;
    wpi_json *root = NULL;
    wp_status st;
    if (!mpath) {
        st = wpi_fail(err, cap, WP_E_OOM, "container: out of memory");
        goto out;
    }
    if ((st = read_manifest(&e, mpath, &text, &len)) != WP_OK)
        goto out;
    char jerr[256];
    st = wpi_json_parse(text, len, &root, jerr, sizeof(jerr));
    if (st != WP_OK) {
        wpi_fail(err, cap, st, MANIFEST ": invalid JSON: %s", jerr);
        goto out;
    }
    if (root->type != WPI_JSON_OBJECT) {
        st = wpi_fail(err, cap, WP_E_FORMAT, MANIFEST ": the document is not an object");
        goto out;
    }
    const wpi_json *v;
    if ((st = need(&e, root, "manifest", "format", WPI_JSON_STRING, &v)) != WP_OK)
        goto out;
    if (strcmp(v->str, "warp")) {
        st = wpi_fail(err, cap, WP_E_FORMAT, MANIFEST ": format is '%.32s', expected 'warp'",
                      v->str);
        goto out;
    }
    if ((st = need(&e, root, "manifest", "format_version", WPI_JSON_NUMBER, &v)) != WP_OK)
        goto out;
    if (!v->is_int || v->integer != WP_FORMAT_VERSION) {
        st = wpi_fail(err, cap, WP_E_FORMAT,
                      MANIFEST ": format_version %g is not supported (this engine reads %d)",
                      v->number, WP_FORMAT_VERSION);
        goto out;
    }
    if ((st = need(&e, root, "manifest", "model_type", WPI_JSON_STRING, &v)) != WP_OK)
        goto out;
    if (!v->len || v->len >= sizeof(c->hp.model_type) ||
        strspn(v->str, "abcdefghijklmnopqrstuvwxyz0123456789_") != v->len) {
        st = wpi_fail(err, cap, WP_E_FORMAT,
                      MANIFEST ": model_type '%.40s' is not a lower-case identifier of 1 to %zu "
                      "characters", v->str, sizeof(c->hp.model_type) - 1);
        goto out;
    }
    memcpy(c->hp.model_type, v->str, v->len + 1);
    if ((st = need(&e, root, "manifest", "hparams", WPI_JSON_OBJECT, &v)) != WP_OK ||
        (st = parse_hparams(&e, v, &c->hp)) != WP_OK ||
        (st = parse_trunk(&e, root, c)) != WP_OK ||
        (st = check_core(&e, c)) != WP_OK ||
        (st = parse_banks(&e, root, c)) != WP_OK ||
        (st = parse_vision(&e, root, c)) != WP_OK)
        goto out;
out:
    wpi_json_free(root);
    free(text);
    free(mpath);
    if (st != WP_OK) {
        wpi_container_close(c, NULL);
        return st;
    }
    *out = c;
    return WP_OK;
}

static int cmp_offset(const void *a, const void *b)
{
    const wpi_tensor *x = *(const wpi_tensor *const *)a, *y = *(const wpi_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static void unload(wpi_container *c, wpi_mem *m)
{
    for (uint32_t i = 0; i < c->n_tensors; i++) {
        if (c->tensors[i].data)
            wpi_free(m, c->tensors[i].data, (size_t)c->tensors[i].bytes);
        c->tensors[i].data = NULL;
    }
}

int wpi_is_vision_tensor(const char *name)
{
    return name && name[0] == 'v' && name[1] == '.';
}

static wp_status load_tensors(wpi_container *c, wpi_mem *m, int vision, char *err, size_t cap)
{
    if (!c)
        return wpi_fail(err, cap, WP_E_ARG, "container: NULL argument");
    int fd = open(c->trunk_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wpi_fail(err, cap, WP_E_IO, "cannot open '%s': %s", c->trunk_path,
                        strerror(errno));
    /* Read in file order: one forward pass over the file, one tensor resident at a time
     * beyond what is already loaded, never the whole file. */
    wpi_tensor **order = malloc((size_t)c->n_tensors * sizeof(*order));
    if (!order) {
        close(fd);
        return wpi_fail(err, cap, WP_E_OOM, "trunk: out of memory");
    }
    for (uint32_t i = 0; i < c->n_tensors; i++)
        order[i] = &c->tensors[i];
    qsort(order, c->n_tensors, sizeof(*order), cmp_offset);
    wp_status st = WP_OK;
    for (uint32_t i = 0; i < c->n_tensors && st == WP_OK; i++) {
        wpi_tensor *t = order[i];
        if (t->data || wpi_is_vision_tensor(t->name) != vision)
            continue;
        if (t->bytes > SIZE_MAX) {
            st = wpi_fail(err, cap, WP_E_OOM, "trunk tensor '%s': too large", t->name);
            break;
        }
        uint8_t *d = wpi_alloc(m, 64, (size_t)t->bytes);
        if (!d) {
            st = wpi_fail(err, cap, WP_E_OOM, "trunk tensor '%s': cannot allocate %llu bytes",
                          t->name, (unsigned long long)t->bytes);
            break;
        }
        uint64_t got = 0;
        while (got < t->bytes) {
            size_t want = t->bytes - got > ((size_t)1 << 30) ? (size_t)1 << 30
                                                             : (size_t)(t->bytes - got);
            ssize_t r = pread(fd, d + got, want, (off_t)(t->offset + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                st = wpi_fail(err, cap, WP_E_IO, "trunk tensor '%s': %s at offset %llu", t->name,
                              r < 0 ? strerror(errno) : "unexpected end of file",
                              (unsigned long long)(t->offset + got));
                break;
            }
            got += (uint64_t)r;
            c->bytes_read += (uint64_t)r;
        }
        if (st == WP_OK) {
            uint32_t crc = wpi_crc32c(0, d, (size_t)t->bytes);
            uint64_t bad;
            if (crc != t->crc32c)
                st = wpi_fail(err, cap, WP_E_FORMAT,
                              "trunk tensor '%s': checksum mismatch (manifest 0x%08x, data "
                              "0x%08x)", t->name, t->crc32c, crc);
            else if (!wpi_blocks_valid(t->dtype, d, t->bytes, &bad))
                st = wpi_fail(err, cap, WP_E_FORMAT,
                              "trunk tensor '%s': %s block %llu has scale byte 255 (NaN)",
                              t->name, wpi_dtype_name(t->dtype), (unsigned long long)bad);
        }
        if (st != WP_OK) {
            wpi_free(m, d, (size_t)t->bytes);
            break;
        }
        t->data = d;
        /* The copy is resident now; the page-cache copy would only double the RAM the
         * trunk occupies outside the budget. */
        wpi_advise_dontneed(fd, t->offset, t->bytes);
    }
    free(order);
    close(fd);
    if (st != WP_OK)
        unload(c, m);
    return st;
}

wp_status wpi_container_load_trunk(wpi_container *c, wpi_mem *m, char *err, size_t cap)
{
    return load_tensors(c, m, 0, err, cap);
}

wp_status wpi_container_load_vision(wpi_container *c, wpi_mem *m, char *err, size_t cap)
{
    return load_tensors(c, m, 1, err, cap);
}

const wpi_tensor *wpi_container_tensor(const wpi_container *c, const char *name)
{
    if (!c || !name || !c->tensors)
        return NULL;
    /* wpi_container_open sorts tensors by name; the scan covers containers built by
     * hand in tests, whose order is whatever they chose. */
    wpi_tensor key = {.name = (char *)name};
    const wpi_tensor *t = bsearch(&key, c->tensors, c->n_tensors, sizeof(*t), cmp_tensor_name);
    if (t)
        return t;
    for (uint32_t i = 0; i < c->n_tensors; i++)
        if (c->tensors[i].name && !strcmp(c->tensors[i].name, name))
            return &c->tensors[i];
    return NULL;
}

void wpi_container_close(wpi_container *c, wpi_mem *m)
{
    if (!c)
        return;
    if (c->tensors) {
        unload(c, m);
        for (uint32_t i = 0; i < c->n_tensors; i++)
            free(c->tensors[i].name);
        free(c->tensors);
    }
    for (uint32_t i = 0; i < c->n_banks; i++)
        free(c->banks[i].path);
    free(c->banks);
    free(c->trunk_path);
    free(c->dir);
    free(c);
}
