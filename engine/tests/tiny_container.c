/* tiny_container.c -- see tiny_container.h. Shared by test_container.c and test_experts.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiny_container.h"

int n_pass, n_fail;

void report(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

uint64_t rng_state = 0x243F6A8885A308D3ull;

uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* ==== tiny container builder (the same in test_experts.c) ============================ */




const char *dt_name(int d)
{
    switch (d) {
    case WPI_F32: return "f32";
    case WPI_F16: return "f16";
    case WPI_BF16: return "bf16";
    case WPI_Q8_0: return "q8_0";
    case WPI_Q4_0: return "q4_0";
    case WPI_Q4_1: return "q4_1";
    }
    return "?";
}

void put32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

uint8_t payload_byte(uint32_t layer, uint32_t expert, uint64_t k)
{
    uint64_t h = (layer * 1000003ull + expert) * 0x9E3779B97F4A7C15ull + k * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return (uint8_t)(h * 0x94D049BB133111EBull >> 56);
}

/* Record `expert` of `layer` exactly as a converter writes it. */
void make_record(const tbuilt *b, uint32_t layer, uint32_t expert, uint8_t *r)
{
    memset(r, 0, b->rec);
    for (uint64_t k = 0; k < b->payload; k++)
        r[64 + k] = payload_byte(layer, expert, k);
    memcpy(r, "WPXR", 4);
    put32(r + 4, 1);
    put32(r + 8, layer);
    put32(r + 12, expert);
    put32(r + 16, (uint32_t)b->sp.edtype);
    put32(r + 20, 3);
    put64(r + 24, b->payload);
    put64(r + 32, 64);
    put64(r + 40, 64 + b->mat_bytes[0]);
    put64(r + 48, 64 + b->mat_bytes[0] + b->mat_bytes[1]);
    put32(r + 56, wpi_crc32c(0, r + 64, b->payload));
    put32(r + 60, wpi_crc32c(0, r, 60));
}

char *path_in(const tbuilt *b, const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof(p[k]), "%s/%s", b->dir, name);
    return p[k];
}

char *bank_name(uint32_t layer)
{
    static char n[4][64];
    static int k;
    k = (k + 1) % 4;
    snprintf(n[k], sizeof(n[k]), "experts-L%u.bin", layer);
    return n[k];
}

/* Overwrites in place and trims, instead of truncating to zero first: ext4 flushes a
 * file rewritten after truncation to zero at close, which made the mutation loop wait
 * on the disk thousands of times. */
int write_file(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd < 0)
        return -1;
    int ok = pwrite(fd, data, n, 0) == (ssize_t)n && ftruncate(fd, (off_t)n) == 0;
    return close(fd) == 0 && ok ? 0 : -1;
}

uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)len + 1);
    if (d && fread(d, 1, (size_t)len, f) != (size_t)len) {
        free(d);
        d = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return d;
}

/* -- a JSON writer that can delete or replace the value at one key path -- */




void jput(jw *w, const char *fmt, ...)
{
    if (w->d && w->st[w->d - 1].skip)
        return;
    va_list ap;
    va_start(ap, fmt);
    char tmp[1024];
    int l = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (w->n + (size_t)l + 1 > w->cap) {
        w->cap = (w->n + (size_t)l + 1) * 2;
        w->s = realloc(w->s, w->cap);
    }
    memcpy(w->s + w->n, tmp, (size_t)l + 1);
    w->n += (size_t)l;
}

/* Starts a member: returns 0 to emit the value, 1 when it is deleted or replaced. */
int jmember(jw *w, const char *key)
{
    jframe *f = &w->st[w->d - 1];
    char path[160];
    if (f->is_arr)
        snprintf(path, sizeof(path), "%s[%d]", f->path, f->idx++);
    else
        snprintf(path, sizeof(path), "%s%s%s", f->path, f->path[0] ? "." : "", key);
    if (f->skip)
        return 1;
    if (w->rec)
        snprintf(w->rec[w->n_rec++], 160, "%s", path);
    int m = w->target && !strcmp(path, w->target) ? w->mode : MUT_NONE;
    if (m == MUT_DELETE) {
        w->applied = 1;
        return 1;
    }
    if (!f->first)
        jput(w, ",");
    f->first = 0;
    if (!f->is_arr)
        jput(w, "\"%s\":", key);
    if (m == MUT_REPLACE) {
        jput(w, "%s", w->repl);
        w->applied = 1;
        return 1;
    }
    return 0;
}

void jleaf(jw *w, const char *key, const char *fmt, ...)
{
    if (jmember(w, key))
        return;
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    jput(w, "%s", tmp);
}

void jbegin(jw *w, const char *key, int is_arr)
{
    int skip = 0;
    char path[160] = "";
    if (w->d) {
        jframe *f = &w->st[w->d - 1];
        if (f->is_arr)
            snprintf(path, sizeof(path), "%s[%d]", f->path, f->idx);
        else
            snprintf(path, sizeof(path), "%s%s%s", f->path, f->path[0] ? "." : "", key);
        skip = jmember(w, key);
    }
    if (!skip)
        jput(w, is_arr ? "[" : "{");
    jframe *n = &w->st[w->d++];
    snprintf(n->path, sizeof(n->path), "%s", path);
    n->is_arr = is_arr;
    n->idx = 0;
    n->first = 1;
    n->skip = skip || (w->d > 1 && w->st[w->d - 2].skip);
}

void jend(jw *w)
{
    jframe f = w->st[--w->d];
    if (!f.skip)
        jput(w, f.is_arr ? "]" : "}");
}

void jshape(jw *w, const char *key, int nd, const uint64_t *s)
{
    jbegin(w, key, 1);
    for (int k = 0; k < nd; k++)
        jleaf(w, NULL, "%llu", (unsigned long long)s[k]);
    jend(w);
}

/* Writes manifest.json (mutated when target is set); returns 1 when the mutation hit. */
int write_manifest(const tbuilt *b, const char *target, int mode, const char *repl,
                          char (*rec)[160], int *n_rec)
{
    const tspec *sp = &b->sp;
    jw w = {.target = target, .mode = mode, .repl = repl, .rec = rec};
    jbegin(&w, NULL, 0);
    jleaf(&w, "format", "\"warp\"");
    jleaf(&w, "format_version", "1");
    jleaf(&w, "model_type", "\"%s\"", sp->model_type);
    jbegin(&w, "source_config", 0);
    jleaf(&w, "architectures", "[\"Tiny\"]");
    jend(&w);
    jbegin(&w, "hparams", 0);
    jleaf(&w, "vocab_size", "%u", sp->vocab);
    jleaf(&w, "hidden_size", "%u", sp->hidden);
    jleaf(&w, "n_layers", "%u", b->n_layers);
    jleaf(&w, "n_heads", "4");
    jleaf(&w, "n_kv_heads", "2");
    jleaf(&w, "head_dim", "16");
    jleaf(&w, "intermediate_size", "%u", sp->inter);
    jleaf(&w, "moe_intermediate_size", "%u", sp->moe_inter);
    jleaf(&w, "n_experts", "%u", sp->n_experts);
    jleaf(&w, "top_k", "%u", sp->top_k);
    jleaf(&w, "norm_topk_prob", "true");
    jleaf(&w, "shared_expert_intermediate_size", "0");
    jleaf(&w, "shared_expert_gate", "false");
    jbegin(&w, "layer_kinds", 1);
    for (uint32_t l = 0; l < b->n_layers; l++)
        jleaf(&w, NULL, sp->kinds[l] == 'm' ? "\"moe\"" : "\"dense\"");
    jend(&w);
    jleaf(&w, "rms_norm_eps", "1e-06");
    jleaf(&w, "rope_dim", "16");
    jleaf(&w, "rope_theta", "1000000.0");
    jleaf(&w, "rope_attn_factor", "1.0");
    jleaf(&w, "qk_norm", "\"head\"");
    jleaf(&w, "attn_scale", "0.25");
    jleaf(&w, "max_position_embeddings", "2048");
    jleaf(&w, "tie_word_embeddings", sp->tie ? "true" : "false");
    jleaf(&w, "bos_token_id", "1");
    jbegin(&w, "eos_token_ids", 1);
    jleaf(&w, NULL, "2");
    jleaf(&w, NULL, "3");
    jend(&w);
    jend(&w);
    jbegin(&w, "quantization", 0);
    jleaf(&w, "experts", "\"%s\"", dt_name(sp->edtype));
    jend(&w);
    jbegin(&w, "trunk", 0);
    jleaf(&w, "file", "\"trunk.bin\"");
    jleaf(&w, "bytes", "%llu", (unsigned long long)b->trunk_size);
    jbegin(&w, "tensors", 1);
    for (int i = 0; i < b->nt; i++) {
        const ttensor *t = &b->t[i];
        jbegin(&w, NULL, 0);
        jleaf(&w, "name", "\"%s\"", t->name);
        jleaf(&w, "dtype", "\"%s\"", dt_name(t->dtype));
        jshape(&w, "shape", t->nd, t->s);
        jleaf(&w, "offset", "%llu", (unsigned long long)t->off);
        jleaf(&w, "bytes", "%llu", (unsigned long long)t->bytes);
        jleaf(&w, "crc32c", "%u", t->crc);
        jend(&w);
    }
    jend(&w);
    jend(&w);
    jbegin(&w, "experts", 1);
    for (uint32_t l = 0; l < b->n_layers; l++) {
        if (sp->kinds[l] != 'm')
            continue;
        jbegin(&w, NULL, 0);
        jleaf(&w, "layer", "%u", l);
        jleaf(&w, "file", "\"%s\"", bank_name(l));
        jleaf(&w, "n_experts", "%u", sp->n_experts);
        jleaf(&w, "record_bytes", "%llu", (unsigned long long)b->rec);
        jbegin(&w, "tensors", 1);
        static const char *const nm[3] = {"gate", "up", "down"};
        uint64_t off = 64;
        for (int k = 0; k < 3; k++) {
            uint64_t s[2] = {k == 2 ? sp->hidden : sp->moe_inter, k == 2 ? sp->moe_inter : sp->hidden};
            jbegin(&w, NULL, 0);
            jleaf(&w, "name", "\"%s\"", nm[k]);
            jleaf(&w, "dtype", "\"%s\"", dt_name(sp->edtype));
            jshape(&w, "shape", 2, s);
            jleaf(&w, "offset", "%llu", (unsigned long long)off);
            jleaf(&w, "bytes", "%llu", (unsigned long long)b->mat_bytes[k]);
            jend(&w);
            off += b->mat_bytes[k];
        }
        jend(&w);
        jend(&w);
    }
    jend(&w);
    jbegin(&w, "tokenizer", 0);
    jleaf(&w, "kind", "\"hf\"");
    jleaf(&w, "file", "\"tokenizer.json\"");
    jend(&w);
    jbegin(&w, "converter", 0);
    jleaf(&w, "name", "\"test\"");
    jend(&w);
    jend(&w);
    if (n_rec)
        *n_rec = w.n_rec;
    write_file(path_in(b, "manifest.json"), w.s, w.n);
    free(w.s);
    return w.applied;
}

void add_tensor(tbuilt *b, const char *name, int dtype, int nd, uint64_t s0, uint64_t s1)
{
    ttensor *t = &b->t[b->nt++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->dtype = dtype;
    t->nd = nd;
    t->s[0] = s0;
    t->s[1] = s1;
    t->bytes = wpi_row_bytes(dtype, nd == 2 ? s1 : s0) * (nd == 2 ? s0 : 1);
}

void write_banks(const tbuilt *b)
{
    uint8_t *r = aligned_alloc(4096, b->rec);
    for (uint32_t l = 0; l < b->n_layers; l++) {
        if (b->sp.kinds[l] != 'm')
            continue;
        int fd = open(path_in(b, bank_name(l)), O_WRONLY | O_CREAT, 0644);
        for (uint32_t e = 0; e < b->sp.n_experts; e++) {
            make_record(b, l, e, r);
            if (pwrite(fd, r, b->rec, (off_t)(e * b->rec)) != (ssize_t)b->rec)
                perror("pwrite");
        }
        if (ftruncate(fd, (off_t)(b->sp.n_experts * b->rec)) != 0)
            perror("ftruncate");
        close(fd);
    }
    free(r);
}

/* Builds a complete valid container in a fresh directory under base. */
void build(tbuilt *b, const tspec *sp, const char *base)
{
    memset(b, 0, sizeof(*b));
    b->sp = *sp;
    b->n_layers = (uint32_t)strlen(sp->kinds);
    for (uint32_t l = 0; l < b->n_layers; l++)
        b->n_moe += sp->kinds[l] == 'm';
    snprintf(b->dir, sizeof(b->dir), "%s/wpt_XXXXXX", base);
    if (!mkdtemp(b->dir)) {
        perror("mkdtemp");
        exit(2);
    }
    add_tensor(b, "token_embd.weight", WPI_Q8_0, 2, sp->vocab, sp->hidden);
    add_tensor(b, "output_norm.weight", WPI_F32, 1, sp->hidden, 1);
    if (!sp->tie)
        add_tensor(b, "output.weight", WPI_Q8_0, 2, sp->vocab, sp->hidden);
    add_tensor(b, "rope_freqs", WPI_F32, 1, 8, 1);
    add_tensor(b, "blk.0.attn_norm.weight", WPI_F32, 1, sp->hidden, 1);
    uint64_t off = 0;
    for (int i = 0; i < b->nt; i++) {
        b->t[i].off = off;
        off = (off + b->t[i].bytes + 127) / 64 * 64; /* aligned, with a gap */
    }
    b->trunk_size = off + 64;
    uint8_t *trunk = calloc(1, b->trunk_size);
    for (int i = 0; i < b->nt; i++) {
        for (uint64_t k = 0; k < b->t[i].bytes; k++)
            trunk[b->t[i].off + k] = (uint8_t)rng();
        b->t[i].crc = wpi_crc32c(0, trunk + b->t[i].off, b->t[i].bytes);
    }
    write_file(path_in(b, "trunk.bin"), trunk, b->trunk_size);
    free(trunk);
    b->mat_bytes[0] = b->mat_bytes[1] = wpi_row_bytes(sp->edtype, sp->hidden) * sp->moe_inter;
    b->mat_bytes[2] = wpi_row_bytes(sp->edtype, sp->moe_inter) * sp->hidden;
    b->payload = b->mat_bytes[0] + b->mat_bytes[1] + b->mat_bytes[2];
    b->rec = sp->record_bytes ? sp->record_bytes : (64 + b->payload + 4095) / 4096 * 4096;
    write_banks(b);
    write_manifest(b, NULL, MUT_NONE, NULL, NULL, NULL);
}

void destroy(tbuilt *b)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", b->dir);
}

/* ==== end of the builder ============================================================== */
