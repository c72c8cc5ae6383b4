/*
 * test_container.c -- CRC32C, allocation, the JSON reader and container validation.
 *
 * Builds tiny containers in a temporary directory (manifest written by a small JSON
 * writer that can delete or replace the value at any key path), checks that the valid
 * one opens and loads, then runs a structure-aware mutation loop: each validated key of
 * the manifest is deleted, retyped or set to an out-of-range or inconsistent value, and
 * record headers, payloads and bank files are damaged. Every case must end in a non-OK
 * status with a non-empty detail somewhere along open -> load trunk -> read every
 * expert record; a case that passes all three is a FAIL (a damaged container went
 * unnoticed). A byte-level fuzz of the manifest then checks that nothing crashes.
 *
 * Prints one PASS/FAIL line per check (mutation cases are summarised) and the counts;
 * exits non-zero on any failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arch.h"
#include "json.h"

#include "tiny_container.h"

/* The mutation loop reads through the page cache: thousands of O_DIRECT reads would
 * measure the disk, not the checks. The valid containers are read both ways. */
static int g_direct = 1;

static wp_cfg test_cfg(int verify, int threads)
{
    wp_cfg cfg;
    wp_cfg_init(&cfg);
    cfg.direct_io = g_direct;
    cfg.verify = verify;
    cfg.reader_threads = (uint32_t)threads;
    return cfg;
}

/* open -> load trunk -> read and validate every expert record. Returns the first
 * failing status (err filled) or WP_OK. Also checks that everything is freed. */
static wp_status pipeline(const char *dir, int verify, char *err, size_t cap, int *leak)
{
    wpi_container *c = NULL;
    wpi_mem mem = {0, 0};
    err[0] = '\0';
    *leak = 0;
    wp_status st = wpi_container_open(dir, &c, err, cap);
    if (st != WP_OK)
        return st;
    if ((st = wpi_container_load_trunk(c, &mem, err, cap)) == WP_OK) {
        wp_cfg cfg = test_cfg(verify, 2);
        wpi_experts *x = NULL;
        st = wpi_experts_open(c, &cfg, 0, &mem, &x, err, cap);
        for (uint32_t b = 0; st == WP_OK && b < c->n_banks; b++) {
            uint32_t mp = wpi_experts_max_pinned(x), ne = c->banks[b].n_experts;
            for (uint32_t e0 = 0; st == WP_OK && e0 < ne; e0 += mp) {
                int32_t ids[64];
                uint32_t n = ne - e0 < mp ? ne - e0 : mp;
                for (uint32_t k = 0; k < n; k++)
                    ids[k] = (int32_t)(e0 + k);
                st = wpi_experts_request(x, c->banks[b].layer, ids, n, err, cap);
                for (uint32_t k = 0; st == WP_OK && k < n; k++) {
                    wpi_expert_view v;
                    st = wpi_experts_acquire(x, c->banks[b].layer, ids[k], &v, err, cap);
                }
                wpi_experts_release(x);
            }
        }
        wpi_experts_close(x, &mem);
    }
    wpi_container_close(c, &mem);
    *leak = mem.current != 0;
    return st;
}

/* ---- unit checks ------------------------------------------------------------------- */

static void test_crc(void)
{
    const char *v = "123456789";
    int hw = wpi_crc32c_use_hw(1);
    uint32_t a = wpi_crc32c(0, v, 9);
    wpi_crc32c_use_hw(0);
    uint32_t b = wpi_crc32c(0, v, 9);
#if defined(__aarch64__)
    const char *insn = "AArch64 CRC32";
#else
    const char *insn = "SSE4.2";
#endif
    report(a == 0xE3069283u && b == 0xE3069283u, "crc32c check value 0xE3069283 (%s path %s)",
           insn, hw ? "in use" : "absent: table only");
    uint8_t *buf = malloc(70000);
    for (int i = 0; i < 70000; i++)
        buf[i] = (uint8_t)rng();
    int same = 1, chain = 1;
    for (int t = 0; t < 300; t++) {
        size_t off = rng() % 64, n = rng() % 69000;
        wpi_crc32c_use_hw(0);
        uint32_t s = wpi_crc32c(0, buf + off, n);
        size_t cut = n ? rng() % n : 0;
        uint32_t s2 = wpi_crc32c(wpi_crc32c(0, buf + off, cut), buf + off + cut, n - cut);
        wpi_crc32c_use_hw(1);
        uint32_t h = wpi_crc32c(0, buf + off, n);
        same &= s == h;
        chain &= s == s2;
    }
    wpi_crc32c_use_hw(1);
    free(buf);
    if (hw)
        report(same, "crc32c %s and table paths agree on 300 random spans", insn);
    else
        printf("SKIP crc32c instruction against the table: this CPU has no %s\n", insn);
    report(chain, "crc32c chains: crc(a||b) == crc(crc(a), b)");
}

/* Container mxfp4 blocks from shipped MXFP4: every element where FORMAT.md puts it (byte j:
 * element j low, element 16 + j high), the scale first, NaN scales counted. */
static void test_mxfp4_interleave(void)
{
    enum { BLOCKS = 300 };
    uint8_t packed[BLOCKS * 16], scales[BLOCKS], out[BLOCKS * 17];
    for (int i = 0; i < BLOCKS * 16; i++)
        packed[i] = (uint8_t)rng();
    for (int g = 0; g < BLOCKS; g++)
        scales[g] = (uint8_t)(g == 7 || g == 250 ? 255 : rng() % 255);
    size_t nan = wpi_mxfp4_interleave(packed, scales, BLOCKS, out);
    int ok = 1;
    for (int g = 0; g < BLOCKS; g++) {
        const uint8_t *p = packed + 16 * g, *o = out + 17 * g;
        ok &= o[0] == scales[g];
        for (int k = 0; k < 32; k++) {
            int code = (p[k / 2] >> (4 * (k % 2))) & 15;
            int got = (o[1 + k % 16] >> (4 * (k / 16))) & 15;
            ok &= code == got;
        }
    }
    report(ok && nan == 2, "mxfp4 interleave: %d blocks element for element, %zu NaN scales",
           BLOCKS, nan);
}

static void test_alloc(void)
{
    wpi_mem m = {0, 0};
    uint8_t *a = wpi_alloc(&m, 64, 1000);
    uint8_t *b = wpi_alloc(&m, 4096, (size_t)3 << 20);
    uint8_t *c = wpi_alloc(&m, 1 << 16, (size_t)5 << 20);
    int ok = a && b && c && !((uintptr_t)a % 64) && !((uintptr_t)b % 4096) &&
             !((uintptr_t)c % 65536);
    for (size_t i = 0; ok && i < 1000; i++)
        ok = a[i] == 0;
    for (size_t i = 0; ok && i < ((size_t)3 << 20); i += 4093)
        ok = b[i] == 0;
    if (ok) {
        memset(c, 1, (size_t)5 << 20);
        memset(b, 1, (size_t)3 << 20);
    }
    report(ok, "wpi_alloc: aligned (64, 4096, 65536) and zeroed, small and mmap paths");
    uint64_t peak = m.peak;
    wpi_free(&m, a, 1000);
    wpi_free(&m, b, (size_t)3 << 20);
    wpi_free(&m, c, (size_t)5 << 20);
    report(peak == 1000 + ((uint64_t)8 << 20) && m.current == 0 && m.peak == peak,
           "wpi_alloc accounting: peak %llu, current back to 0", (unsigned long long)peak);
    report(wpi_alloc(&m, 24, 10) == NULL, "wpi_alloc refuses a non-power-of-two alignment");
    double t0 = wpi_now(), t1 = wpi_now();
    report(t1 >= t0 && t0 > 0, "wpi_now is monotonic");
}

static int json_ok(const char *s)
{
    wpi_json *j = NULL;
    char err[256];
    wp_status st = wpi_json_parse(s, strlen(s), &j, err, sizeof(err));
    wpi_json_free(j);
    return st == WP_OK;
}

static void test_json(void)
{
    const char *doc = "{\"a\":\"\\u00e9\\ud83d\\ude00\\n\\\"\\/\",\"b\":[1,-0,1.5e3,"
                      "9223372036854775807,-9223372036854775808,9223372036854775808],"
                      "\"c\":true,\"d\":null, \"e\":{}, \"f\":[] }";
    wpi_json *j = NULL;
    char err[256];
    wp_status st = wpi_json_parse(doc, strlen(doc), &j, err, sizeof(err));
    int ok = st == WP_OK;
    if (ok) {
        const char *a = wpi_json_str(wpi_json_get(j, "a"));
        ok &= a && !strcmp(a, "\xc3\xa9\xf0\x9f\x98\x80\n\"/");
        const wpi_json *b = wpi_json_get(j, "b");
        int64_t i;
        double d;
        ok &= wpi_json_int(wpi_json_at(b, 0), &i) && i == 1;
        ok &= wpi_json_int(wpi_json_at(b, 1), &i) && i == 0;
        ok &= !wpi_json_int(wpi_json_at(b, 2), &i) && wpi_json_num(wpi_json_at(b, 2), &d) &&
              d == 1500.0;
        ok &= wpi_json_int(wpi_json_at(b, 3), &i) && i == INT64_MAX;
        ok &= wpi_json_int(wpi_json_at(b, 4), &i) && i == INT64_MIN;
        ok &= !wpi_json_int(wpi_json_at(b, 5), &i) && wpi_json_num(wpi_json_at(b, 5), &d);
        int bo;
        ok &= wpi_json_bool(wpi_json_get(j, "c"), &bo) && bo == 1;
        ok &= wpi_json_get(j, "d") && wpi_json_get(j, "d")->type == WPI_JSON_NULL;
        ok &= wpi_json_get(j, "zz") == NULL && wpi_json_at(b, 6) == NULL;
        ok &= wpi_json_get(j, "e")->len == 0 && wpi_json_get(j, "f")->len == 0;
    }
    wpi_json_free(j);
    report(ok, "json: escapes, surrogate pairs, int64 limits, literals");

    static const char *bad[] = {
        "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "01", "1.", ".5", "-",
        "+1", "1e", "1e+", "NaN", "Infinity", "1e400", "-1e400", "\"\\x\"", "\"\x01\"",
        "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\u12\"", "\"\\u0000\"",
        "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xff\"", "\"abc",
        "{} x", "[1] [2]", "tru", "nul", "{\"a\":1,\"a\":2}", "\xef\xbb\xbf{}", "[1 2]",
        "{\"a\"}", "[\"a\":1]", "'a'", "\"\t\"",
    };
    int all = 1;
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        if (json_ok(bad[k])) {
            all = 0;
            printf("  accepted invalid JSON #%zu\n", k);
        }
    }
    report(all, "json: %zu invalid documents refused", sizeof(bad) / sizeof(bad[0]));

    char deep[300];
    memset(deep, '[', 150);
    memset(deep + 150, ']', 150);
    wpi_json *dj = NULL;
    err[0] = '\0';
    st = wpi_json_parse(deep, 300, &dj, err, sizeof(err));
    report(st == WP_E_FORMAT && strstr(err, "deep"), "json: nesting beyond 64 refused (%s)", err);
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    report(wpi_json_parse(deep, 128, &dj, err, sizeof(err)) == WP_OK, "json: nesting of 64 accepted");
    wpi_json_free(dj);
    size_t big = (size_t)1 << 21;
    char *huge = malloc(big);
    memset(huge, '[', big);
    report(wpi_json_parse(huge, big, &dj, err, sizeof(err)) == WP_E_FORMAT,
           "json: 2 MiB of '[' refused without deep recursion");
    free(huge);
    report(wpi_json_parse("{}", WPI_JSON_MAX_BYTES + 1, &dj, err, sizeof(err)) == WP_E_FORMAT,
           "json: input above the size limit refused");

    /* A host that set LC_NUMERIC must not change how "1.5" parses. */
    const char *locs[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "C.UTF-8"};
    const char *used = NULL;
    for (size_t k = 0; k < 4 && !used; k++)
        if (setlocale(LC_NUMERIC, locs[k]) && strcmp(locs[k], "C.UTF-8"))
            used = locs[k];
    if (used) {
        wpi_json *lj = NULL;
        double d = 0;
        wpi_json_parse("1.5", 3, &lj, err, sizeof(err));
        wpi_json_num(lj, &d);
        wpi_json_free(lj);
        report(d == 1.5, "json: numbers parse as 1.5 under LC_NUMERIC=%s", used);
    } else {
        printf("SKIP json under a comma-decimal locale: no de_DE/fr_FR locale installed\n");
    }
    setlocale(LC_NUMERIC, "C");
}

/* ---- valid container ------------------------------------------------------------- */

static void test_valid(const tspec *sp, const char *base, const char *label)
{
    tbuilt b;
    build(&b, sp, base);
    char err[WPI_ERR_CAP];
    wpi_container *c = NULL;
    wp_status st = wpi_container_open(b.dir, &c, err, sizeof(err));
    report(st == WP_OK, "%s: valid container opens (%s)", label, st == WP_OK ? "ok" : err);
    if (st != WP_OK) {
        destroy(&b);
        return;
    }
    int ok = c->hp.vocab_size == sp->vocab && c->hp.hidden_size == sp->hidden &&
             c->hp.n_layers == b.n_layers && c->n_banks == b.n_moe &&
             c->max_record_bytes == b.rec && c->hp.top_k == sp->top_k &&
             c->hp.tie_word_embeddings == sp->tie && c->hp.qk_norm == WPI_QK_HEAD &&
             c->hp.n_eos == 2 && c->hp.eos_token_ids[1] == 3 && c->hp.bos_token_id == 1 &&
             c->experts_total_bytes == (uint64_t)b.n_moe * sp->n_experts * b.rec &&
             c->hp.rms_norm_eps == 1e-6f && c->hp.rope_theta == 1e6f && c->n_tensors == (uint32_t)b.nt;
    uint64_t sum = 0;
    for (int i = 0; i < b.nt; i++) {
        const wpi_tensor *t = wpi_container_tensor(c, b.t[i].name);
        ok &= t && t->bytes == b.t[i].bytes && t->offset == b.t[i].off && t->dtype == b.t[i].dtype;
        sum += b.t[i].bytes;
    }
    ok &= c->trunk_bytes == sum && wpi_container_tensor(c, "nope") == NULL;
    for (uint32_t l = 0; l < b.n_layers; l++)
        ok &= (c->bank_of_layer[l] >= 0) == (sp->kinds[l] == 'm') &&
              c->hp.layer_is_moe[l] == (sp->kinds[l] == 'm');
    if (c->n_banks) {
        const wpi_bank *bk = &c->banks[0];
        ok &= bk->gate_offset == 64 && bk->up_offset == 64 + b.mat_bytes[0] &&
              bk->down_offset == 64 + b.mat_bytes[0] + b.mat_bytes[1] &&
              bk->payload_bytes == b.payload && bk->inter == sp->moe_inter &&
              bk->hidden == sp->hidden && bk->dtype == sp->edtype;
    }
    report(ok, "%s: hparams, tensors and banks read back as written", label);
    wpi_mem mem = {0, 0};
    st = wpi_container_load_trunk(c, &mem, err, sizeof(err));
    int data_ok = st == WP_OK && mem.current == sum;
    for (int i = 0; data_ok && i < b.nt; i++) {
        const wpi_tensor *t = wpi_container_tensor(c, b.t[i].name);
        data_ok = t->data && wpi_crc32c(0, t->data, t->bytes) == b.t[i].crc &&
                  !((uintptr_t)t->data % 64);
    }
    report(data_ok, "%s: trunk loads tensor by tensor, CRC-checked, %llu bytes accounted",
           label, (unsigned long long)mem.current);
    report(st == WP_OK && c->bytes_read == c->trunk_bytes && c->bytes_read == sum,
           "%s: the trunk's %llu bytes are counted as read (wp_stats.other_bytes_read)", label,
           (unsigned long long)c->bytes_read);
    wpi_container_close(c, &mem);
    report(mem.current == 0, "%s: close frees the trunk", label);
    int leak;
    st = pipeline(b.dir, 1, err, sizeof(err), &leak);
    report(st == WP_OK && !leak, "%s: every expert record reads and verifies (%s)", label,
           st == WP_OK ? "ok" : err);
    destroy(&b);
}

/* ---- mutation loop ------------------------------------------------------------------ */

typedef struct mstats {
    int cases, caught, missed, empty_detail, leaks;
    int stage[3]; /* caught at open, at load, at read */
} mstats;

static void expect_fail(mstats *ms, const tbuilt *b, int verify, const char *what)
{
    char err[WPI_ERR_CAP];
    int leak;
    wp_status st = pipeline(b->dir, verify, err, sizeof(err), &leak);
    ms->cases++;
    ms->leaks += leak;
    if (st == WP_OK) {
        ms->missed++;
        if (ms->missed <= 20)
            printf("  undetected: %s\n", what);
        return;
    }
    ms->caught++;
    if (!err[0]) {
        ms->empty_detail++;
        printf("  empty detail: %s\n", what);
    }
    if (strstr(err, "manifest.json") || strstr(err, "cannot open"))
        ms->stage[0]++;
    else if (strstr(err, "trunk tensor"))
        ms->stage[1]++;
    else
        ms->stage[2]++;
}

typedef struct mut {
    int mode;
    char repl[160];
} mut;

static int add(mut *m, int n, int mode, const char *fmt, ...)
{
    m[n].mode = mode;
    m[n].repl[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m[n].repl, sizeof(m[n].repl), fmt, ap);
        va_end(ap);
    }
    return n + 1;
}

static const char *last_seg(const char *path)
{
    const char *d = strrchr(path, '.');
    return d ? d + 1 : path;
}

static int starts(const char *s, const char *p)
{
    return !strncmp(s, p, strlen(p));
}

/* Mutations of one key path that every correct reader must refuse. */
static int mutations_for(const tbuilt *b, const char *path, mut *m)
{
    int n = 0;
    const tspec *sp = &b->sp;
    if (starts(path, "source_config") || starts(path, "quantization") ||
        starts(path, "tokenizer") || starts(path, "converter"))
        return 0; /* not read by the engine */
    const char *seg = last_seg(path);
    int is_elem = path[strlen(path) - 1] == ']';
    /* Universal: deleted, wrong JSON type, or not JSON at all. */
    int deletable = 1;
    if (starts(path, "hparams.eos_token_ids["))
        deletable = 0; /* fewer eos ids is still a valid manifest */
    if (starts(path, "trunk.tensors[") && is_elem) {
        int idx = atoi(path + strlen("trunk.tensors["));
        deletable = strcmp(b->t[idx].name, "blk.0.attn_norm.weight") != 0;
    }
    if (deletable)
        n = add(m, n, MUT_DELETE, NULL);
    n = add(m, n, MUT_REPLACE, "{}");
    n = add(m, n, MUT_REPLACE, "[[]]");
    n = add(m, n, MUT_REPLACE, "\"\\ud800\"");
    n = add(m, n, MUT_REPLACE, "-0.5");
    n = add(m, n, MUT_REPLACE, "1e999");
    n = add(m, n, MUT_REPLACE, "[1,]");
    n = add(m, n, MUT_REPLACE, "nul");

    uint32_t nl = b->n_layers;
    if (!strcmp(path, "format")) {
        n = add(m, n, MUT_REPLACE, "\"warq\"");
        n = add(m, n, MUT_REPLACE, "\"WARP\"");
        n = add(m, n, MUT_REPLACE, "1");
    } else if (!strcmp(path, "format_version")) {
        n = add(m, n, MUT_REPLACE, "2");
        n = add(m, n, MUT_REPLACE, "0");
        n = add(m, n, MUT_REPLACE, "1.0");
        n = add(m, n, MUT_REPLACE, "\"1\"");
        n = add(m, n, MUT_REPLACE, "true");
    } else if (!strcmp(path, "model_type")) {
        n = add(m, n, MUT_REPLACE, "\"\"");
        n = add(m, n, MUT_REPLACE, "\"Bad-Type\"");
        n = add(m, n, MUT_REPLACE, "\"%s\"", "abcdefghijabcdefghijabcdefghijabcdefghij");
        n = add(m, n, MUT_REPLACE, "7");
    } else if (starts(path, "hparams.")) {
        struct { const char *k; const char *v[8]; } tab[] = {
            {"vocab_size", {"0", "16777217", "1.5", "\"64\"", "1e10", "true", "null"}},
            {"hidden_size", {"0", "131073", "null", "false"}},
            {"n_layers", {"0", "1025", "null"}},
            {"n_heads", {"0", "4097", "5", "null"}},
            {"n_kv_heads", {"0", "5", "3", "null"}},
            {"head_dim", {"0", "4097", "14", "null"}},
            {"intermediate_size", {"-1", "1048577", "null"}},
            {"moe_intermediate_size", {"1048577", "null", "-1"}},
            {"n_experts", {"65537", "null", "-1"}},
            {"top_k", {"0", "null", "-1"}},
            {"shared_expert_intermediate_size", {"-1", "1048577", "null"}},
            {"rope_dim", {"15", "18", "14", "null"}},
            {"max_position_embeddings", {"0", "1073741825", "null"}},
            {"norm_topk_prob", {"1", "0", "null", "\"true\""}},
            {"shared_expert_gate", {"1", "0", "null", "\"false\""}},
            {"tie_word_embeddings", {"1", "0", "null", "\"true\""}},
            {"rms_norm_eps", {"0", "-1", "0.6", "\"1e-6\"", "null", "true", "1e-50"}},
            {"rope_theta", {"0", "-1", "1e39", "null", "\"1\""}},
            {"rope_attn_factor", {"0", "-1", "2e6", "null"}},
            {"attn_scale", {"0", "-1", "2e6", "null"}},
            {"qk_norm", {"\"bogus\"", "\"NONE\"", "0", "null"}},
            {"layer_kinds", {"[]", "\"moe\"", "5", "null"}},
            {"bos_token_id", {"-1", "\"1\"", "1.5", "true"}},
            {"eos_token_ids", {"5", "null", "[-1]", "[99999999]", "[\"a\"]",
                               "[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]"}},
        };
        for (size_t t = 0; t < sizeof(tab) / sizeof(tab[0]); t++)
            if (!strcmp(seg, tab[t].k))
                for (int k = 0; k < 8 && tab[t].v[k]; k++)
                    n = add(m, n, MUT_REPLACE, "%s", tab[t].v[k]);
        if (!strcmp(seg, "vocab_size"))
            n = add(m, n, MUT_REPLACE, "%u", sp->vocab + 1);
        if (!strcmp(seg, "hidden_size"))
            n = add(m, n, MUT_REPLACE, "%u", sp->hidden + 32);
        if (!strcmp(seg, "n_layers"))
            n = add(m, n, MUT_REPLACE, "%u", nl + 1);
        if (!strcmp(seg, "intermediate_size") && strchr(sp->kinds, 'd'))
            n = add(m, n, MUT_REPLACE, "0");
        if (!strcmp(seg, "moe_intermediate_size")) {
            n = add(m, n, MUT_REPLACE, "0");
            n = add(m, n, MUT_REPLACE, "%u", sp->moe_inter + 32);
        }
        if (!strcmp(seg, "n_experts")) {
            n = add(m, n, MUT_REPLACE, "0");
            n = add(m, n, MUT_REPLACE, "%u", sp->n_experts + 1);
            n = add(m, n, MUT_REPLACE, "%u", sp->top_k - 1 ? sp->top_k - 1 : 65536);
        }
        if (!strcmp(seg, "top_k"))
            n = add(m, n, MUT_REPLACE, "%u", sp->n_experts + 1);
        if (!strcmp(seg, "bos_token_id"))
            n = add(m, n, MUT_REPLACE, "%u", sp->vocab);
        if (starts(path, "hparams.layer_kinds[")) {
            int l = atoi(path + strlen("hparams.layer_kinds["));
            n = add(m, n, MUT_REPLACE, "\"mixed\"");
            n = add(m, n, MUT_REPLACE, "1");
            n = add(m, n, MUT_REPLACE, "null");
            n = add(m, n, MUT_REPLACE, sp->kinds[l] == 'm' ? "\"dense\"" : "\"moe\"");
        }
        if (starts(path, "hparams.eos_token_ids[")) {
            n = add(m, n, MUT_REPLACE, "-1");
            n = add(m, n, MUT_REPLACE, "%u", sp->vocab);
            n = add(m, n, MUT_REPLACE, "\"1\"");
            n = add(m, n, MUT_REPLACE, "null");
        }
    } else if (!strcmp(path, "trunk")) {
        n = add(m, n, MUT_REPLACE, "[]");
        n = add(m, n, MUT_REPLACE, "null");
    } else if (!strcmp(path, "trunk.file")) {
        n = add(m, n, MUT_REPLACE, "\"missing.bin\"");
        n = add(m, n, MUT_REPLACE, "\"../trunk.bin\"");
        n = add(m, n, MUT_REPLACE, "\"\"");
        n = add(m, n, MUT_REPLACE, "\".\"");
        n = add(m, n, MUT_REPLACE, "\"manifest.json\"");
        n = add(m, n, MUT_REPLACE, "5");
    } else if (!strcmp(path, "trunk.bytes")) {
        n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)b->trunk_size + 1);
        n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)b->trunk_size - 1);
        n = add(m, n, MUT_REPLACE, "0");
        n = add(m, n, MUT_REPLACE, "\"x\"");
    } else if (!strcmp(path, "trunk.tensors")) {
        n = add(m, n, MUT_REPLACE, "[]");
        n = add(m, n, MUT_REPLACE, "5");
    } else if (starts(path, "trunk.tensors[")) {
        int idx = atoi(path + strlen("trunk.tensors["));
        const ttensor *t = &b->t[idx];
        int required = strcmp(t->name, "blk.0.attn_norm.weight") != 0;
        if (is_elem) {
            n = add(m, n, MUT_REPLACE, "5");
            n = add(m, n, MUT_REPLACE, "null");
            n = add(m, n, MUT_REPLACE, "[]");
        } else if (!strcmp(seg, "name")) {
            n = add(m, n, MUT_REPLACE, "\"\"");
            n = add(m, n, MUT_REPLACE, "5");
            n = add(m, n, MUT_REPLACE, "null");
            n = add(m, n, MUT_REPLACE, "\"%s\"", idx ? b->t[0].name : b->t[1].name);
            if (required)
                n = add(m, n, MUT_REPLACE, "\"zzz\"");
        } else if (!strcmp(seg, "dtype")) {
            n = add(m, n, MUT_REPLACE, "\"q5_9\"");
            n = add(m, n, MUT_REPLACE, "\"F32\"");
            n = add(m, n, MUT_REPLACE, "8");
            n = add(m, n, MUT_REPLACE, "null");
            n = add(m, n, MUT_REPLACE, t->dtype == WPI_F32 ? "\"q8_0\"" : "\"f16\"");
        } else if (!strcmp(seg, "shape")) {
            n = add(m, n, MUT_REPLACE, "[]");
            n = add(m, n, MUT_REPLACE, "[0,32]");
            n = add(m, n, MUT_REPLACE, "[64,32,1]");
            n = add(m, n, MUT_REPLACE, "[4294967296,32]");
            n = add(m, n, MUT_REPLACE, "[-1,32]");
            n = add(m, n, MUT_REPLACE, "[\"64\",32]");
            n = add(m, n, MUT_REPLACE, "[1.5,32]");
            n = add(m, n, MUT_REPLACE, "5");
            if (t->nd == 2)
                n = add(m, n, MUT_REPLACE, "[%llu,%llu]", (unsigned long long)t->s[1],
                        (unsigned long long)t->s[0]);
            else
                n = add(m, n, MUT_REPLACE, "[%llu]", (unsigned long long)t->s[0] + 1);
        } else if (starts(seg, "shape[")) {
            int k = seg[6] - '0';
            n = add(m, n, MUT_REPLACE, "0");
            n = add(m, n, MUT_REPLACE, "-1");
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)t->s[k] + 1);
            n = add(m, n, MUT_REPLACE, "4294967296");
            n = add(m, n, MUT_REPLACE, "\"1\"");
            n = add(m, n, MUT_REPLACE, "null");
        } else if (!strcmp(seg, "offset")) {
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)t->off + 1);
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)t->off + 32);
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)t->off + 64); /* CRC */
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)b->trunk_size);
            n = add(m, n, MUT_REPLACE, "18446744073709551552");
            n = add(m, n, MUT_REPLACE, "9223372036854775744");
            n = add(m, n, MUT_REPLACE, "-64");
            n = add(m, n, MUT_REPLACE, "\"0\"");
            n = add(m, n, MUT_REPLACE, "null");
        } else if (!strcmp(seg, "bytes")) {
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)t->bytes + 1);
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)t->bytes - 1);
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)t->bytes * 2);
            n = add(m, n, MUT_REPLACE, "0");
            n = add(m, n, MUT_REPLACE, "null");
        } else if (!strcmp(seg, "crc32c")) {
            n = add(m, n, MUT_REPLACE, "%u", t->crc ^ 1u); /* caught at load */
            n = add(m, n, MUT_REPLACE, "4294967296");
            n = add(m, n, MUT_REPLACE, "-1");
            n = add(m, n, MUT_REPLACE, "\"0\"");
            n = add(m, n, MUT_REPLACE, "null");
        }
    } else if (!strcmp(path, "experts")) {
        n = add(m, n, MUT_REPLACE, "[]");
        n = add(m, n, MUT_REPLACE, "5");
        n = add(m, n, MUT_REPLACE, "null");
    } else if (starts(path, "experts[")) {
        int bi = atoi(path + strlen("experts["));
        uint32_t layer = 0;
        for (uint32_t l = 0, k = 0; l < nl; l++)
            if (sp->kinds[l] == 'm' && (int)k++ == bi)
                layer = l;
        if (is_elem) {
            n = add(m, n, MUT_REPLACE, "5");
            n = add(m, n, MUT_REPLACE, "null");
            n = add(m, n, MUT_REPLACE, "[]");
        } else if (strstr(path, ".tensors[")) {
            const char *tp = strstr(path, ".tensors[") + strlen(".tensors[");
            int k = atoi(tp);
            uint64_t r = k == 2 ? sp->hidden : sp->moe_inter, cl = k == 2 ? sp->moe_inter : sp->hidden;
            uint64_t off = 64;
            for (int j = 0; j < k; j++)
                off += b->mat_bytes[j];
            if (path[strlen(path) - 1] == ']' && !strstr(tp, ".")) {
                n = add(m, n, MUT_REPLACE, "5");
                n = add(m, n, MUT_REPLACE, "null");
            } else if (!strcmp(seg, "name")) {
                n = add(m, n, MUT_REPLACE, k == 0 ? "\"up\"" : "\"gate\"");
                n = add(m, n, MUT_REPLACE, "\"GATE\"");
                n = add(m, n, MUT_REPLACE, "5");
                n = add(m, n, MUT_REPLACE, "null");
            } else if (!strcmp(seg, "dtype")) {
                n = add(m, n, MUT_REPLACE, sp->edtype == WPI_Q8_0 ? "\"q4_0\"" : "\"q8_0\"");
                n = add(m, n, MUT_REPLACE, "\"q5_9\"");
                n = add(m, n, MUT_REPLACE, "2");
                n = add(m, n, MUT_REPLACE, "null");
            } else if (!strcmp(seg, "shape")) {
                n = add(m, n, MUT_REPLACE, "[%llu,%llu]", (unsigned long long)cl,
                        (unsigned long long)r);
                n = add(m, n, MUT_REPLACE, "[%llu]", (unsigned long long)r);
                n = add(m, n, MUT_REPLACE, "[%llu,%llu,1]", (unsigned long long)r,
                        (unsigned long long)cl);
                n = add(m, n, MUT_REPLACE, "[0,%llu]", (unsigned long long)cl);
                n = add(m, n, MUT_REPLACE, "[]");
            } else if (starts(seg, "shape[")) {
                int d = seg[6] - '0';
                uint64_t v = d ? cl : r;
                n = add(m, n, MUT_REPLACE, "0");
                n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)v + 32);
                n = add(m, n, MUT_REPLACE, "-1");
                n = add(m, n, MUT_REPLACE, "null");
            } else if (!strcmp(seg, "offset")) {
                n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)off + 64);
                n = add(m, n, MUT_REPLACE, "0");
                n = add(m, n, MUT_REPLACE, "63");
                n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)off + 1);
                n = add(m, n, MUT_REPLACE, "-64");
                n = add(m, n, MUT_REPLACE, "null");
            } else if (!strcmp(seg, "bytes")) {
                n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)b->mat_bytes[k] + 1);
                n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)b->mat_bytes[k] - 1);
                n = add(m, n, MUT_REPLACE, "0");
                n = add(m, n, MUT_REPLACE, "null");
            }
        } else if (!strcmp(seg, "layer")) {
            n = add(m, n, MUT_REPLACE, "-1");
            n = add(m, n, MUT_REPLACE, "%u", nl);
            n = add(m, n, MUT_REPLACE, "\"0\"");
            n = add(m, n, MUT_REPLACE, "1.5");
            n = add(m, n, MUT_REPLACE, "null");
            for (uint32_t l = 0; l < nl; l++)
                if (l != layer) /* another bank's layer (duplicate) or a dense layer */
                    n = add(m, n, MUT_REPLACE, "%u", l);
        } else if (!strcmp(seg, "file")) {
            n = add(m, n, MUT_REPLACE, "\"nope.bin\"");
            n = add(m, n, MUT_REPLACE, "\"../%s\"", bank_name(layer));
            n = add(m, n, MUT_REPLACE, "\"\"");
            n = add(m, n, MUT_REPLACE, "\"trunk.bin\"");
            n = add(m, n, MUT_REPLACE, "5");
            for (uint32_t l = 0; l < nl; l++) /* another layer's bank: caught at read */
                if (l != layer && sp->kinds[l] == 'm')
                    n = add(m, n, MUT_REPLACE, "\"%s\"", bank_name(l));
        } else if (!strcmp(seg, "n_experts")) {
            n = add(m, n, MUT_REPLACE, "0");
            n = add(m, n, MUT_REPLACE, "%u", sp->n_experts + 1);
            n = add(m, n, MUT_REPLACE, "%u", sp->n_experts - 1);
            n = add(m, n, MUT_REPLACE, "65537");
            n = add(m, n, MUT_REPLACE, "\"8\"");
            n = add(m, n, MUT_REPLACE, "null");
        } else if (!strcmp(seg, "record_bytes")) {
            n = add(m, n, MUT_REPLACE, "0");
            n = add(m, n, MUT_REPLACE, "4095");
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)b->rec + 4096);
            n = add(m, n, MUT_REPLACE, "%llu", (unsigned long long)b->rec / 2);
            n = add(m, n, MUT_REPLACE, "1099511631872");
            n = add(m, n, MUT_REPLACE, "-4096");
            n = add(m, n, MUT_REPLACE, "null");
        } else if (!strcmp(seg, "tensors")) {
            n = add(m, n, MUT_REPLACE, "[]");
            n = add(m, n, MUT_REPLACE, "5");
        }
    }
    return n;
}

static void mutate_manifest(const tspec *sp, const char *base, const char *label, mstats *ms)
{
    tbuilt b;
    build(&b, sp, base);
    static char paths[512][160];
    int np = 0;
    write_manifest(&b, NULL, MUT_NONE, NULL, paths, &np);
    int before = ms->cases, missed = ms->missed, unapplied = 0;
    static mut m[64];
    for (int p = 0; p < np; p++) {
        int nm = mutations_for(&b, paths[p], m);
        for (int k = 0; k < nm; k++) {
            if (!write_manifest(&b, paths[p], m[k].mode, m[k].repl, NULL, NULL)) {
                unapplied++;
                continue;
            }
            char what[400];
            snprintf(what, sizeof(what), "%s: %s %s", paths[p],
                     m[k].mode == MUT_DELETE ? "delete" : "replace with", m[k].repl);
            expect_fail(ms, &b, 0, what);
        }
    }
    write_manifest(&b, NULL, MUT_NONE, NULL, NULL, NULL);
    report(ms->missed == missed && unapplied == 0,
           "%s: %d manifest mutations over %d key paths all refused", label,
           ms->cases - before, np);
    destroy(&b);
}

static void flip_file_bit(const char *path, uint64_t bit)
{
    int fd = open(path, O_RDWR);
    uint8_t v;
    if (pread(fd, &v, 1, (off_t)(bit / 8)) == 1) {
        v ^= (uint8_t)(1u << (bit % 8));
        if (pwrite(fd, &v, 1, (off_t)(bit / 8)) != 1)
            perror("pwrite");
    }
    close(fd);
}

/* Rewrites record e of layer l after edit() changed it, keeping the header CRC valid
 * so that only the edited field is wrong. */
static void edit_record(const tbuilt *b, uint32_t l, uint32_t e, void (*edit)(uint8_t *r),
                        int fix_crc)
{
    uint8_t *r = aligned_alloc(4096, b->rec);
    make_record(b, l, e, r);
    edit(r);
    if (fix_crc)
        put32(r + 60, wpi_crc32c(0, r, 60));
    int fd = open(path_in(b, bank_name(l)), O_RDWR);
    if (pwrite(fd, r, b->rec, (off_t)(e * b->rec)) != (ssize_t)b->rec)
        perror("pwrite");
    close(fd);
    free(r);
}

static void restore_banks(const tbuilt *b)
{
    write_banks(b);
}

static void e_magic(uint8_t *r) { r[3] = 'Q'; }
static void e_version(uint8_t *r) { put32(r + 4, 2); }
static void e_layer(uint8_t *r) { put32(r + 8, 99); }
static void e_expert(uint8_t *r) { put32(r + 12, 1000); }
static void e_dtype(uint8_t *r) { put32(r + 16, WPI_F32); }
static void e_ntensors(uint8_t *r) { put32(r + 20, 4); }
static void e_payload(uint8_t *r) { put64(r + 24, 8); }
static void e_gate(uint8_t *r) { put64(r + 32, 128); }
static void e_up(uint8_t *r) { put64(r + 40, 65); }
static void e_down(uint8_t *r) { put64(r + 48, 0); }
static void e_pcrc(uint8_t *r) { r[56] ^= 0x10; }

static void mutate_records(const tspec *sp, const char *base, const char *label, mstats *ms)
{
    tbuilt b;
    build(&b, sp, base);
    int before = ms->cases, missed = ms->missed;
    uint32_t l0 = (uint32_t)(strchr(sp->kinds, 'm') - sp->kinds);
    const char *bank = path_in(&b, bank_name(l0));
    char what[200];
    /* Every bit of one record header, verification off: the header is always checked. */
    uint32_t e = sp->n_experts - 1;
    for (uint64_t bit = 0; bit < 64 * 8; bit++) {
        flip_file_bit(bank, e * b.rec * 8 + bit);
        snprintf(what, sizeof(what), "header bit %llu of layer %u expert %u",
                 (unsigned long long)bit, l0, e);
        expect_fail(ms, &b, 0, what);
        flip_file_bit(bank, e * b.rec * 8 + bit);
    }
    /* Payload bits: caught by the payload CRC when verify is on. */
    for (int k = 0; k < 150; k++) {
        uint64_t bit = (64 + rng() % b.payload) * 8 + rng() % 8;
        uint32_t ee = (uint32_t)(rng() % sp->n_experts);
        flip_file_bit(bank, ee * b.rec * 8 + bit);
        snprintf(what, sizeof(what), "payload bit %llu of expert %u", (unsigned long long)bit, ee);
        expect_fail(ms, &b, 1, what);
        flip_file_bit(bank, ee * b.rec * 8 + bit);
    }
    /* Consistent headers that state the wrong thing (header CRC recomputed). */
    struct { void (*f)(uint8_t *); const char *n; int verify; } ed[] = {
        {e_magic, "wrong magic", 0}, {e_version, "version 2", 0}, {e_layer, "wrong layer", 0},
        {e_expert, "wrong expert id", 0}, {e_dtype, "wrong dtype", 0},
        {e_ntensors, "4 tensors", 0}, {e_payload, "payload size", 0},
        {e_gate, "gate offset", 0}, {e_up, "up offset", 0}, {e_down, "down offset", 0},
        {e_pcrc, "payload crc field", 1},
    };
    for (size_t k = 0; k < sizeof(ed) / sizeof(ed[0]); k++) {
        for (uint32_t x = 0; x < sp->n_experts; x += sp->n_experts - 1) {
            edit_record(&b, l0, x, ed[k].f, 1);
            snprintf(what, sizeof(what), "%s (expert %u)", ed[k].n, x);
            expect_fail(ms, &b, ed[k].verify, what);
            restore_banks(&b);
        }
    }
    /* Records swapped within a bank; a bank copied over another layer's. */
    {
        size_t n;
        uint8_t *d = read_file(bank, &n);
        uint8_t *sw = malloc(n);
        memcpy(sw, d + b.rec, b.rec);
        memcpy(sw + b.rec, d, b.rec);
        memcpy(sw + 2 * b.rec, d + 2 * b.rec, n - 2 * b.rec);
        write_file(bank, sw, n);
        expect_fail(ms, &b, 0, "experts 0 and 1 swapped");
        if (b.n_moe > 1) {
            write_file(bank, d, n);
            uint32_t l1 = (uint32_t)(strrchr(sp->kinds, 'm') - sp->kinds);
            write_file(path_in(&b, bank_name(l1)), d, n);
            expect_fail(ms, &b, 0, "bank of another layer");
        }
        /* Truncated and extended banks. */
        write_file(bank, d, n - 1);
        expect_fail(ms, &b, 0, "bank truncated by 1 byte");
        write_file(bank, d, n - b.rec);
        expect_fail(ms, &b, 0, "bank truncated by one record");
        write_file(bank, d, 0);
        expect_fail(ms, &b, 0, "bank empty");
        uint8_t *ext = calloc(1, n + 4096);
        memcpy(ext, d, n);
        write_file(bank, ext, n + 4096);
        expect_fail(ms, &b, 0, "bank extended by 4096");
        remove(bank);
        expect_fail(ms, &b, 0, "bank missing");
        /* Every record of the bank damaged (one damaged record is usually never read). */
        memcpy(ext, d, n);
        for (uint32_t x = 0; x < sp->n_experts; x++)
            ext[x * b.rec + 64 + (x * 7) % b.payload] ^= 0x5A;
        write_file(bank, ext, n);
        expect_fail(ms, &b, 1, "every record's payload damaged");
        free(ext);
        free(sw);
        free(d);
        restore_banks(&b);
    }
    /* trunk.bin: truncated, a flipped data bit, missing. */
    {
        size_t n;
        const char *tp = path_in(&b, "trunk.bin");
        uint8_t *d = read_file(tp, &n);
        write_file(tp, d, n - 64 - 1);
        expect_fail(ms, &b, 0, "trunk.bin truncated");
        for (int i = 0; i < b.nt; i++) {
            d[b.t[i].off + b.t[i].bytes / 2] ^= 0x08;
            write_file(tp, d, n);
            snprintf(what, sizeof(what), "trunk tensor %s damaged", b.t[i].name);
            expect_fail(ms, &b, 0, what);
            d[b.t[i].off + b.t[i].bytes / 2] ^= 0x08;
        }
        remove(tp);
        expect_fail(ms, &b, 0, "trunk.bin missing");
        write_file(tp, d, n);
        free(d);
    }
    /* manifest.json: missing, a directory instead of a file, empty. */
    remove(path_in(&b, "manifest.json"));
    expect_fail(ms, &b, 0, "manifest missing");
    write_file(path_in(&b, "manifest.json"), "", 0);
    expect_fail(ms, &b, 0, "manifest empty");
    report(ms->missed == missed, "%s: %d record, bank and file mutations all refused", label,
           ms->cases - before);
    destroy(&b);
}

/* Byte-level fuzz: any outcome is fine except a crash or a failure without a detail. */
static void fuzz_bytes(const tspec *sp, const char *base, int rounds)
{
    tbuilt b;
    build(&b, sp, base);
    size_t n;
    char *mp = path_in(&b, "manifest.json");
    uint8_t *orig = read_file(mp, &n);
    uint8_t *buf = malloc(n + 64);
    int empty = 0, ok_count = 0, leaks = 0;
    for (int r = 0; r < rounds; r++) {
        size_t len = n;
        memcpy(buf, orig, n);
        int kind = (int)(rng() % 4), reps = 1 + (int)(rng() % 3);
        for (int k = 0; k < reps; k++) {
            if (!len)
                break;
            size_t at = rng() % len;
            if (kind == 0)
                len = at; /* truncate */
            else if (kind == 1)
                buf[at] = (uint8_t)rng(); /* random byte */
            else if (kind == 2)
                buf[at] = "{}[],:\"\\-0123456789.eEtfn \x80\xff"[rng() % 27];
            else if (len + 1 < n + 64) { /* insert */
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = "{}[],:\"0"[rng() % 8];
                len++;
            }
        }
        write_file(mp, buf, len);
        char err[WPI_ERR_CAP];
        int leak;
        wp_status st = pipeline(b.dir, 0, err, sizeof(err), &leak);
        leaks += leak;
        if (st == WP_OK)
            ok_count++;
        else if (!err[0])
            empty++;
    }
    report(empty == 0 && leaks == 0,
           "byte-level fuzz: %d mutated manifests, no crash, every failure has a detail "
           "(%d still valid)", rounds, ok_count);
    free(buf);
    free(orig);
    destroy(&b);
}

static void test_messages(const tspec *sp, const char *base)
{
    tbuilt b;
    build(&b, sp, base);
    char err[WPI_ERR_CAP];
    wpi_container *c = NULL;
    write_manifest(&b, "trunk.tensors[0].offset", MUT_REPLACE, "4096", NULL, NULL);
    wp_status st = wpi_container_open(b.dir, &c, err, sizeof(err));
    report(st == WP_E_FORMAT && strstr(err, "manifest.json: trunk tensor 'token_embd.weight': "
                                            "offset+bytes exceeds trunk.bin size"),
           "error names the tensor: %s", err);
    write_manifest(&b, "hparams.vocab_size", MUT_DELETE, NULL, NULL, NULL);
    st = wpi_container_open(b.dir, &c, err, sizeof(err));
    report(st == WP_E_FORMAT && strstr(err, "hparams.vocab_size"), "error names the key: %s", err);
    write_manifest(&b, "format_version", MUT_REPLACE, "2", NULL, NULL);
    st = wpi_container_open(b.dir, &c, err, sizeof(err));
    report(st == WP_E_FORMAT && strstr(err, "format_version"), "format_version 2 refused: %s", err);
    write_manifest(&b, "trunk.tensors[1].dtype", MUT_REPLACE, "\"q5_9\"", NULL, NULL);
    st = wpi_container_open(b.dir, &c, err, sizeof(err));
    report(st == WP_E_UNSUPPORTED && strstr(err, "q5_9"), "unknown dtype is UNSUPPORTED: %s", err);
    write_manifest(&b, "trunk.tensors[0].crc32c", MUT_REPLACE, "7", NULL, NULL);
    st = wpi_container_open(b.dir, &c, err, sizeof(err));
    wpi_mem mem = {0, 0};
    if (st == WP_OK)
        st = wpi_container_load_trunk(c, &mem, err, sizeof(err));
    report(st == WP_E_FORMAT && strstr(err, "'token_embd.weight'") && strstr(err, "checksum") &&
               mem.current == 0,
           "trunk CRC mismatch names the tensor and frees what was loaded: %s", err);
    wpi_container_close(c, &mem);
    write_manifest(&b, NULL, MUT_NONE, NULL, NULL, NULL);
    uint32_t l0 = (uint32_t)(strchr(sp->kinds, 'm') - sp->kinds);
    flip_file_bit(path_in(&b, bank_name(l0)), (3 * b.rec + 100) * 8);
    int leak;
    st = pipeline(b.dir, 1, err, sizeof(err), &leak);
    char want[64];
    snprintf(want, sizeof(want), "layer %u expert 3: payload checksum mismatch", l0);
    report(st == WP_E_IO && strstr(err, want), "damaged record names layer and expert: %s", err);
    report(wpi_container_open("/nonexistent/dir", &c, err, sizeof(err)) == WP_E_IO,
           "missing container is WP_E_IO: %s", err);
    destroy(&b);
}

/* wpi_hparams_check (the bounds table the manifest reader also uses, and the relations
 * between keys) refuses a parsed struct with one field out of range, naming the key. */
static void test_hparams_check(const tspec *sp, const char *base)
{
    tbuilt b;
    build(&b, sp, base);
    char err[WPI_ERR_CAP];
    wpi_container *c = NULL;
    wp_status st = wpi_container_open(b.dir, &c, err, sizeof(err));
    report(st == WP_OK && wpi_hparams_check(&c->hp, err, sizeof(err)) == WP_OK,
           "hparams check: the valid container's hparams pass");
    if (st != WP_OK) {
        destroy(&b);
        return;
    }
    const wpi_hparams ok = c->hp;
    struct { const char *key; uint32_t *field; uint32_t bad; } u[] = {
        {"vocab_size", &c->hp.vocab_size, 0},
        {"vocab_size", &c->hp.vocab_size, (1u << 24) + 1},
        {"hidden_size", &c->hp.hidden_size, (1u << 17) + 1},
        {"n_layers", &c->hp.n_layers, WPI_MAX_LAYERS + 1},
        {"n_heads", &c->hp.n_heads, 4097},
        {"n_kv_heads", &c->hp.n_kv_heads, 0},
        {"n_kv_heads", &c->hp.n_kv_heads, ok.n_heads + 1},
        {"head_dim", &c->hp.head_dim, 4097},
        {"intermediate_size", &c->hp.intermediate_size, (1u << 20) + 1},
        {"moe_intermediate_size", &c->hp.moe_intermediate_size, 0},
        {"n_experts", &c->hp.n_experts, (1u << 16) + 1},
        {"top_k", &c->hp.top_k, ok.n_experts + 1},
        {"top_k", &c->hp.top_k, 0},
        {"rope_dim", &c->hp.rope_dim, ok.head_dim + 2},
        {"rope_dim", &c->hp.rope_dim, 3},
        {"max_position_embeddings", &c->hp.max_position_embeddings, 0},
        {"n_eos", &c->hp.n_eos, WPI_MAX_EOS + 1},
    };
    int refused = 0, n = (int)(sizeof u / sizeof u[0]);
    for (int i = 0; i < n; i++) {
        c->hp = ok;
        *u[i].field = u[i].bad;
        char want[64];
        snprintf(want, sizeof want, "hparams.%s", !strcmp(u[i].key, "n_eos") ? "eos_token_ids"
                                                                              : u[i].key);
        st = wpi_hparams_check(&c->hp, err, sizeof(err));
        if (st == WP_E_FORMAT && strstr(err, want))
            refused++;
        else
            printf("  not refused by name: %s = %u (%s)\n", u[i].key, u[i].bad, err);
    }
    c->hp = ok;
    c->hp.eos_token_ids[0] = (int32_t)ok.vocab_size;
    refused += wpi_hparams_check(&c->hp, err, sizeof(err)) == WP_E_FORMAT &&
               strstr(err, "hparams.eos_token_ids") != NULL;
    c->hp = ok;
    c->hp.rms_norm_eps = NAN;
    refused += wpi_hparams_check(&c->hp, err, sizeof(err)) == WP_E_FORMAT &&
               strstr(err, "hparams.rms_norm_eps") != NULL;
    report(refused == n + 2, "hparams check: %d of %d out-of-range fields refused naming the key",
           refused, n + 2);
    c->hp = ok;
    wpi_container_close(c, NULL);
    destroy(&b);
}

int main(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    test_crc();
    test_mxfp4_interleave();
    test_alloc();
    test_json();
    tspec a = {.kinds = "dmm", .vocab = 64, .hidden = 32, .n_experts = 8, .top_k = 2,
               .moe_inter = 64, .inter = 64, .tie = 0, .edtype = WPI_Q4_0,
               .model_type = "qwen3_moe"};
    tspec bsp = {.kinds = "mm", .vocab = 96, .hidden = 64, .n_experts = 6, .top_k = 3,
                 .moe_inter = 32, .inter = 0, .tie = 1, .edtype = WPI_Q8_0,
                 .record_bytes = 12288, .model_type = "olmoe"};
    test_valid(&a, base, "A (dense+moe, q4_0, untied)");
    test_valid(&bsp, base, "B (moe only, q8_0, tied, padded records)");
    test_messages(&a, base);
    test_hparams_check(&a, base);
    g_direct = 0;
    mstats ms = {0};
    mutate_manifest(&a, base, "A", &ms);
    mutate_manifest(&bsp, base, "B", &ms);
    mutate_records(&a, base, "A", &ms);
    mutate_records(&bsp, base, "B", &ms);
    report(ms.cases >= 2000 && ms.missed == 0 && ms.empty_detail == 0 && ms.leaks == 0,
           "mutation loop: %d cases, %d refused (%d at open, %d at trunk load, %d at record "
           "read), %d undetected, %d without detail, %d leaking",
           ms.cases, ms.caught, ms.stage[0], ms.stage[1], ms.stage[2], ms.missed,
           ms.empty_detail, ms.leaks);
    fuzz_bytes(&a, base, 1500);
    printf("test_container: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
