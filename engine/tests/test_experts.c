/*
 * test_experts.c -- the expert cache, reader threads, memory plan and usable RAM.
 *
 * Runs on tiny containers built in a temporary directory. Checks: counters (lookups =
 * hits + misses, bytes_read = misses x record without prefetch), LFRU keeping a hot
 * expert that LRU evicts on a cyclic pattern, pins surviving prefetch pressure, a
 * damaged payload (verify on) and a damaged header (magic, tensor offsets, payload size;
 * verify off) reported as WP_E_IO naming layer and expert, identical bytes through O_DIRECT and buffered reads and
 * through 1 or 4 reader threads and any cache size, prefetch accounting, queued prefetches
 * dropped when the routing did not pick them, the hotlist,
 * the plan rules, and the cgroup resolver over a fake /proc + /sys/fs/cgroup tree.
 *
 * Prints one PASS/FAIL line per check and the counts; exits non-zero on any failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arch.h"

#include "tiny_container.h"

/* ---- helpers ------------------------------------------------------------------------ */

typedef struct rig {
    wpi_container *c;
    wpi_experts *x;
    wpi_mem mem;
    wp_cfg cfg;
} rig;

static wp_cfg base_cfg(void)
{
    wp_cfg cfg;
    wp_cfg_init(&cfg);
    cfg.reader_threads = 2;
    return cfg;
}

static wp_status rig_open(rig *r, const tbuilt *b, const wp_cfg *cfg, uint32_t slots, char *err)
{
    memset(r, 0, sizeof(*r));
    r->cfg = *cfg;
    wp_status st = wpi_container_open(b->dir, &r->c, err, WPI_ERR_CAP);
    if (st != WP_OK)
        return st;
    uint32_t most = r->c->n_banks * r->c->hp.n_experts;
    uint64_t meta = wpi_cache_meta_bytes(r->c, most);
    st = wpi_experts_open(r->c, &r->cfg, (uint64_t)slots * r->c->max_record_bytes + meta,
                          &r->mem, &r->x, err, WPI_ERR_CAP);
    if (st != WP_OK) {
        wpi_container_close(r->c, &r->mem);
        r->c = NULL;
    }
    return st;
}

static int rig_close(rig *r)
{
    wpi_experts_close(r->x, &r->mem);
    wpi_container_close(r->c, &r->mem);
    return r->mem.current == 0;
}

static wp_stats stats_of(const rig *r)
{
    wp_stats s;
    memset(&s, 0, sizeof(s));
    wpi_experts_stats(r->x, &s);
    return s;
}

/* 1 when the view holds exactly record `expert` of `layer`. */
static int view_ok(const tbuilt *b, uint32_t layer, uint32_t expert, const wpi_expert_view *v)
{
    static uint8_t rec[1 << 16];
    make_record(b, layer, expert, rec);
    return v->gate && (const uint8_t *)v->up == (const uint8_t *)v->gate + b->mat_bytes[0] &&
           (const uint8_t *)v->down == (const uint8_t *)v->up + b->mat_bytes[1] &&
           !memcmp(v->gate, rec + 64, b->payload) && v->dtype == b->sp.edtype &&
           v->inter == b->sp.moe_inter && v->hidden == b->sp.hidden;
}

/* One request of n ids, acquire each (checking the bytes), release. */
static wp_status step(rig *r, const tbuilt *b, uint32_t layer, const int32_t *ids, uint32_t n,
                      int *bad, uint64_t *digest, char *err)
{
    wp_status st = wpi_experts_request(r->x, layer, ids, n, err, WPI_ERR_CAP);
    for (uint32_t k = 0; st == WP_OK && k < n; k++) {
        wpi_expert_view v;
        st = wpi_experts_acquire(r->x, layer, ids[k], &v, err, WPI_ERR_CAP);
        if (st == WP_OK) {
            if (!view_ok(b, layer, (uint32_t)ids[k], &v))
                (*bad)++;
            if (digest)
                *digest = *digest * 31 + wpi_crc32c(0, v.gate, b->payload);
        }
    }
    wpi_experts_release(r->x);
    return st;
}

/* A deterministic routed workload: skewed ids, distinct per request. */
static wp_status workload(rig *r, const tbuilt *b, int steps, uint64_t seed, int prefetch,
                          int *bad, uint64_t *digest, char *err)
{
    uint64_t s = seed;
    uint32_t ne = b->sp.n_experts, k = b->sp.top_k;
    wp_status st = WP_OK;
    for (int t = 0; t < steps && st == WP_OK; t++) {
        for (uint32_t l = 0; l < b->n_layers && st == WP_OK; l++) {
            if (b->sp.kinds[l] != 'm')
                continue;
            int32_t ids[16];
            uint32_t n = 0;
            while (n < k) {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                /* squared uniform: low ids are hot */
                uint64_t u = s % 1000;
                int32_t id = (int32_t)(u * u * ne / 1000000);
                int dup = 0;
                for (uint32_t j = 0; j < n; j++)
                    dup |= ids[j] == id;
                if (!dup)
                    ids[n++] = id;
            }
            st = step(r, b, l, ids, n, bad, digest, err);
            if (prefetch && l + 1 < b->n_layers) {
                int32_t p[4];
                for (int j = 0; j < 4; j++)
                    p[j] = (int32_t)((s >> (8 * j)) % ne);
                wpi_experts_prefetch(r->x, l + 1, p, 4);
            }
        }
    }
    return st;
}

/* ---- cache semantics --------------------------------------------------------------- */

static void test_counters(const tbuilt *b)
{
    char err[WPI_ERR_CAP];
    rig r;
    wp_cfg cfg = base_cfg();
    wp_status st = rig_open(&r, b, &cfg, 8, err);
    report(st == WP_OK, "experts open (%s)", st == WP_OK ? "ok" : err);
    if (st != WP_OK)
        return;
    wp_stats s0 = stats_of(&r);
    report(s0.cache_slots == 8 && s0.cache_bytes == 8 * b->rec &&
               wpi_experts_max_pinned(r.x) >= b->sp.top_k,
           "cache of 8 slots of %llu bytes, max_pinned %u", (unsigned long long)b->rec,
           wpi_experts_max_pinned(r.x));
    int bad = 0;
    st = workload(&r, b, 200, 1, 0, &bad, NULL, err);
    wp_stats s = stats_of(&r);
    report(st == WP_OK && bad == 0, "workload of 200 tokens: every acquired record is exact");
    report(s.expert_lookups == s.expert_hits + s.expert_misses && s.expert_lookups == 200ull * 2 * b->sp.top_k,
           "lookups %llu = hits %llu + misses %llu", (unsigned long long)s.expert_lookups,
           (unsigned long long)s.expert_hits, (unsigned long long)s.expert_misses);
    report(s.bytes_read == s.expert_misses * b->rec && s.prefetch_issued == 0,
           "bytes_read = misses x record_bytes without prefetch");
    report(s.expert_hits > 0 && s.expert_misses > 0, "skewed workload both hits and misses");
    wpi_experts_stats_reset(r.x);
    s = stats_of(&r);
    report(s.expert_lookups == 0 && s.bytes_read == 0 && s.cache_slots == 8, "stats reset");
    report(rig_close(&r), "close frees every accounted byte");
}

/* H twice, then four cold experts, repeated: LFRU keeps H (2 hits), LRU evicts it. */
static uint64_t hot_hits(const tbuilt *b, int policy, uint64_t *h_misses)
{
    char err[WPI_ERR_CAP];
    rig r;
    wp_cfg cfg = base_cfg();
    cfg.cache_policy = policy;
    if (rig_open(&r, b, &cfg, 4, err) != WP_OK)
        return 0;
    int bad = 0;
    int32_t next = 1;
    *h_misses = 0;
    for (int cyc = 0; cyc < 20; cyc++) {
        int32_t h = 0;
        wp_stats before = stats_of(&r);
        step(&r, b, 0, &h, 1, &bad, NULL, err);
        wp_stats after = stats_of(&r);
        *h_misses += after.expert_misses - before.expert_misses;
        step(&r, b, 0, &h, 1, &bad, NULL, err);
        for (int k = 0; k < 4; k++) {
            int32_t id = next;
            next = next % ((int32_t)b->sp.n_experts - 1) + 1;
            step(&r, b, 0, &id, 1, &bad, NULL, err);
        }
    }
    uint64_t hits = stats_of(&r).expert_hits;
    rig_close(&r);
    return bad ? 0 : hits;
}

static void test_policies(const tbuilt *b)
{
    uint64_t lfru_miss, lru_miss;
    uint64_t lfru = hot_hits(b, WP_CACHE_LFRU, &lfru_miss);
    uint64_t lru = hot_hits(b, WP_CACHE_LRU, &lru_miss);
    report(lfru_miss == 1 && lru_miss == 20 && lfru > lru,
           "cyclic pattern, 4 slots: LFRU keeps the hot expert (%llu hits, %llu misses of it), "
           "LRU evicts it every cycle (%llu hits, %llu misses of it)",
           (unsigned long long)lfru, (unsigned long long)lfru_miss, (unsigned long long)lru,
           (unsigned long long)lru_miss);
    /* Sampled LFRU (more than 16 slots): deterministic across runs. */
    char err[WPI_ERR_CAP];
    wp_stats s[2];
    for (int k = 0; k < 2; k++) {
        rig r;
        wp_cfg cfg = base_cfg();
        rig_open(&r, b, &cfg, 40, err);
        int bad = 0;
        workload(&r, b, 300, 7, 0, &bad, NULL, err);
        s[k] = stats_of(&r);
        rig_close(&r);
    }
    report(s[0].expert_hits == s[1].expert_hits && s[0].cache_slots == 40 &&
               s[0].expert_hits + s[0].expert_misses == s[0].expert_lookups,
           "sampled LFRU over 40 slots is deterministic (%llu hits both runs)",
           (unsigned long long)s[0].expert_hits);
}

static void test_pins(const tbuilt *b)
{
    char err[WPI_ERR_CAP];
    rig r;
    wp_cfg cfg = base_cfg();
    cfg.reader_threads = 4;
    if (rig_open(&r, b, &cfg, 8, err) != WP_OK) {
        report(0, "pins: open: %s", err);
        return;
    }
    uint32_t mp = wpi_experts_max_pinned(r.x);
    int32_t ids[4] = {3, 9, 17, 30};
    wp_status st = wpi_experts_request(r.x, 0, ids, mp < 4 ? mp : 4, err, sizeof(err));
    wpi_expert_view v0[4];
    int ok = st == WP_OK;
    for (int k = 0; ok && k < 4; k++)
        ok = wpi_experts_acquire(r.x, 0, ids[k], &v0[k], err, sizeof(err)) == WP_OK;
    /* Prefetch pressure on both layers while the four are pinned. */
    for (int round = 0; round < 20; round++) {
        int32_t p[8];
        for (int k = 0; k < 8; k++)
            p[k] = (int32_t)(rng() % b->sp.n_experts);
        wpi_experts_prefetch(r.x, (uint32_t)(round % 2), p, 8);
    }
    for (int k = 0; ok && k < 4; k++) {
        wpi_expert_view v;
        ok = wpi_experts_acquire(r.x, 0, ids[k], &v, err, sizeof(err)) == WP_OK &&
             v.gate == v0[k].gate && view_ok(b, 0, (uint32_t)ids[k], &v);
    }
    report(ok, "pinned records survive prefetch pressure (same buffer, same bytes)");
    int32_t more = 5;
    report(wpi_experts_request(r.x, 0, &more, 1, err, sizeof(err)) == WP_E_ARG,
           "pinning past max_pinned is refused: %s", err);
    wpi_experts_release(r.x);
    int32_t dup[2] = {4, 4}, oor = (int32_t)b->sp.n_experts, neg = -1;
    report(wpi_experts_request(r.x, 0, dup, 2, err, sizeof(err)) == WP_E_ARG,
           "duplicate ids refused: %s", err);
    report(wpi_experts_request(r.x, 0, &oor, 1, err, sizeof(err)) == WP_E_ARG &&
               wpi_experts_request(r.x, 0, &neg, 1, err, sizeof(err)) == WP_E_ARG,
           "out-of-range ids refused: %s", err);
    report(wpi_experts_request(r.x, 7, &more, 1, err, sizeof(err)) == WP_E_ARG,
           "a layer without a bank refused: %s", err);
    wpi_expert_view v;
    report(wpi_experts_acquire(r.x, 0, 11, &v, err, sizeof(err)) == WP_E_ARG,
           "acquire without request refused: %s", err);
    report(wpi_experts_request(r.x, 0, ids, mp + 1, err, sizeof(err)) == WP_E_ARG,
           "a request larger than max_pinned refused");

    /* Stress: random requests with interleaved prefetches, four reader threads. */
    int bad = 0;
    st = WP_OK;
    for (int t = 0; t < 3000 && st == WP_OK; t++) {
        uint32_t layer = (uint32_t)(rng() % 2), n = 1 + (uint32_t)(rng() % mp);
        int32_t q[16];
        uint32_t got = 0;
        while (got < n) {
            int32_t id = (int32_t)(rng() % b->sp.n_experts);
            int dup2 = 0;
            for (uint32_t j = 0; j < got; j++)
                dup2 |= q[j] == id;
            if (!dup2)
                q[got++] = id;
        }
        wpi_experts_cancel_prefetch(r.x, layer, q, n); /* as the forward does */
        st = wpi_experts_request(r.x, layer, q, n, err, sizeof(err));
        int32_t p[6];
        for (int k = 0; k < 6; k++)
            p[k] = (int32_t)(rng() % b->sp.n_experts);
        wpi_experts_prefetch(r.x, 1 - layer, p, 6);
        wpi_experts_prefetch(r.x, layer, p, 6);
        for (uint32_t k = 0; st == WP_OK && k < n; k++) {
            st = wpi_experts_acquire(r.x, layer, q[k], &v, err, sizeof(err));
            if (st == WP_OK && !view_ok(b, layer, (uint32_t)q[k], &v))
                bad++;
        }
        wpi_experts_release(r.x);
    }
    wp_stats s = stats_of(&r);
    report(st == WP_OK && bad == 0 && s.expert_lookups == s.expert_hits + s.expert_misses &&
               s.bytes_read ==
                   (s.expert_misses + s.prefetch_issued - s.prefetch_cancelled) * b->rec &&
               s.prefetch_hits <= s.expert_hits && s.prefetch_cancelled <= s.prefetch_issued,
           "3000 random requests under prefetch and cancels, 4 readers: all bytes exact, "
           "counters consistent (%llu prefetches, %llu prefetch hits, %llu cancelled)",
           (unsigned long long)s.prefetch_issued, (unsigned long long)s.prefetch_hits,
           (unsigned long long)s.prefetch_cancelled);
    report(rig_close(&r), "close after stress frees everything");
}

/* Adds delta to the little-endian u64 at byte `field` of record `expert`'s header and,
 * when fix_crc, rewrites the header CRC so that only the field check can catch it. */
static void patch_header_u64(int fd, const tbuilt *b, uint32_t expert, uint32_t field,
                             int64_t delta, int fix_crc)
{
    uint8_t h[WPI_RECORD_HEADER_BYTES];
    off_t at = (off_t)(expert * b->rec);
    if (pread(fd, h, sizeof(h), at) != (ssize_t)sizeof(h))
        perror("pread");
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | h[field + k];
    put64(h + field, v + (uint64_t)delta);
    if (fix_crc)
        put32(h + 60, wpi_crc32c(0, h, 60));
    if (pwrite(fd, h, sizeof(h), at) != (ssize_t)sizeof(h))
        perror("pwrite");
}

/* Record `expert` of layer 1 fails on demand with verify off, the detail saying why. */
static void expect_header_error(const tbuilt *b, uint32_t expert, const char *why,
                                const char *label)
{
    char err[WPI_ERR_CAP], want[160];
    rig r;
    wp_cfg cfg = base_cfg();
    cfg.verify = 0;
    rig_open(&r, b, &cfg, 8, err);
    int32_t id = (int32_t)expert;
    wpi_expert_view v;
    err[0] = '\0';
    wp_status st = wpi_experts_request(r.x, 1, &id, 1, err, sizeof(err));
    if (st == WP_OK)
        st = wpi_experts_acquire(r.x, 1, id, &v, err, sizeof(err));
    snprintf(want, sizeof(want), "layer 1 expert %u: %s", expert, why);
    report(st == WP_E_IO && strstr(err, want), "verify off: %s is WP_E_IO: %s", label, err);
    wpi_experts_release(r.x);
    rig_close(&r);
}

static void test_damage(const tbuilt *b)
{
    char err[WPI_ERR_CAP];
    const char *bank = path_in(b, bank_name(1));
    /* Payload damage in record 5 of layer 1. */
    int fd = open(bank, O_RDWR);
    uint8_t byte;
    off_t at = (off_t)(5 * b->rec + 64 + 100);
    if (pread(fd, &byte, 1, at) != 1)
        perror("pread");
    byte ^= 0x20;
    if (pwrite(fd, &byte, 1, at) != 1)
        perror("pwrite");
    rig r;
    wp_cfg cfg = base_cfg();
    cfg.verify = 1;
    rig_open(&r, b, &cfg, 8, err);
    int32_t ids[2] = {4, 5};
    wpi_expert_view v;
    wp_status st = wpi_experts_request(r.x, 1, ids, 2, err, sizeof(err));
    wp_status a = wpi_experts_acquire(r.x, 1, 4, &v, err, sizeof(err));
    err[0] = '\0';
    wp_status s5 = wpi_experts_acquire(r.x, 1, 5, &v, err, sizeof(err));
    report(st == WP_OK && a == WP_OK && s5 == WP_E_IO &&
               strstr(err, "layer 1 expert 5: payload checksum mismatch"),
           "verify on: damaged payload is WP_E_IO: %s", err);
    wpi_experts_release(r.x);
    wp_stats before = stats_of(&r);
    st = wpi_experts_request(r.x, 1, ids + 1, 1, err, sizeof(err));
    s5 = wpi_experts_acquire(r.x, 1, 5, &v, err, sizeof(err));
    wp_stats after = stats_of(&r);
    report(s5 == WP_E_IO && after.expert_misses == before.expert_misses + 1,
           "the failed slot is never reused: a second request misses and fails again");
    wpi_experts_release(r.x);
    /* Prefetch of the damaged record, then demand: still an error, never the bytes. */
    wpi_experts_prefetch(r.x, 1, ids + 1, 1);
    st = wpi_experts_request(r.x, 1, ids + 1, 1, err, sizeof(err));
    s5 = wpi_experts_acquire(r.x, 1, 5, &v, err, sizeof(err));
    report(s5 == WP_E_IO, "a prefetched damaged record still fails on demand: %s", err);
    wpi_experts_release(r.x);
    rig_close(&r);

    cfg.verify = 0;
    rig_open(&r, b, &cfg, 8, err);
    st = wpi_experts_request(r.x, 1, ids + 1, 1, err, sizeof(err));
    s5 = wpi_experts_acquire(r.x, 1, 5, &v, err, sizeof(err));
    report(s5 == WP_OK, "verify off: payload damage is not checked (the documented cost "
                        "trade-off; the header still is)");
    wpi_experts_release(r.x);
    rig_close(&r);
    byte ^= 0x20;
    if (pwrite(fd, &byte, 1, at) != 1)
        perror("pwrite");

    /* Header damage (one bit of the magic) in record 6, verification off. */
    at = (off_t)(6 * b->rec);
    if (pread(fd, &byte, 1, at) != 1)
        perror("pread");
    byte ^= 0x01;
    if (pwrite(fd, &byte, 1, at) != 1)
        perror("pwrite");
    rig_open(&r, b, &cfg, 8, err);
    int32_t six = 6;
    st = wpi_experts_request(r.x, 1, &six, 1, err, sizeof(err));
    s5 = wpi_experts_acquire(r.x, 1, 6, &v, err, sizeof(err));
    report(s5 == WP_E_IO && strstr(err, "layer 1 expert 6: bad record magic"),
           "verify off: a damaged header is still WP_E_IO: %s", err);
    wpi_experts_release(r.x);
    rig_close(&r);
    byte ^= 0x01;
    if (pwrite(fd, &byte, 1, at) != 1)
        perror("pwrite");

    /* Offset and size fields, their header CRC made to match: the manifest check alone
     * must catch them. Then an offset with a stale CRC: the header checksum catches it. */
    patch_header_u64(fd, b, 7, 40, 32, 1);
    expect_header_error(b, 7, "header tensor offsets differ from the manifest",
                        "an up offset moved by 32 bytes (header CRC rewritten)");
    patch_header_u64(fd, b, 7, 40, -32, 1);
    patch_header_u64(fd, b, 8, 24, 4096, 1);
    expect_header_error(b, 8, "header payload size differs from the manifest",
                        "a payload size grown by 4096 (header CRC rewritten)");
    patch_header_u64(fd, b, 8, 24, -4096, 1);
    patch_header_u64(fd, b, 9, 48, 1, 0);
    expect_header_error(b, 9, "header checksum mismatch", "a down offset with a stale CRC");
    patch_header_u64(fd, b, 9, 48, -1, 0);
    close(fd);
}

static uint64_t full_read_digest(const tbuilt *b, int direct, int threads, uint32_t slots,
                                 int *direct_used, int *bad, wp_stats *out)
{
    char err[WPI_ERR_CAP];
    rig r;
    wp_cfg cfg = base_cfg();
    cfg.direct_io = direct;
    cfg.reader_threads = (uint32_t)threads;
    cfg.verify = 1;
    if (rig_open(&r, b, &cfg, slots, err) != WP_OK) {
        (*bad)++;
        return 0;
    }
    uint64_t d = 0;
    wp_status st = workload(&r, b, 150, 3, 0, bad, &d, err);
    if (st != WP_OK)
        (*bad)++;
    wp_stats s = stats_of(&r);
    *direct_used = s.direct_io;
    if (out)
        *out = s;
    rig_close(&r);
    return d;
}

static void test_identity(const tbuilt *b, const tbuilt *shm)
{
    int bad = 0, du1 = 0, du0 = 0, du;
    uint64_t d1 = full_read_digest(b, 1, 2, 8, &du1, &bad, NULL);
    uint64_t d0 = full_read_digest(b, 0, 2, 8, &du0, &bad, NULL);
    report(bad == 0 && d1 == d0 && du0 == 0,
           "O_DIRECT (direct_io reported %d) and buffered (reported %d) give identical bytes",
           du1, du0);
    if (!du1)
        printf("NOTE the file system under the test directory refused O_DIRECT; the probe fell "
               "back to buffered reads\n");
    if (shm) {
        int dus = -1;
        uint64_t ds = full_read_digest(shm, 1, 2, 8, &dus, &bad, NULL);
        uint64_t ds0 = full_read_digest(shm, 0, 2, 8, &du, &bad, NULL);
        report(bad == 0 && ds == ds0 && ds == d1,
               "tmpfs container: probe chose direct_io=%d, same bytes as buffered", dus);
    }
    wp_stats s1, s4;
    uint64_t t1 = full_read_digest(b, 1, 1, 8, &du, &bad, &s1);
    uint64_t t4 = full_read_digest(b, 1, 4, 8, &du, &bad, &s4);
    report(bad == 0 && t1 == t4 && t1 == d1 && s1.expert_hits == s4.expert_hits &&
               s1.expert_misses == s4.expert_misses && s1.bytes_read == s4.bytes_read,
           "1 vs 4 reader threads: identical bytes and identical counters");
    uint64_t c4 = full_read_digest(b, 1, 2, 4, &du, &bad, &s1);
    uint64_t c64 = full_read_digest(b, 1, 2, 64, &du, &bad, &s4);
    report(bad == 0 && c4 == d1 && c64 == d1 && s1.expert_hits < s4.expert_hits,
           "cache of 4 vs 64 slots: identical bytes (hits %llu vs %llu)",
           (unsigned long long)s1.expert_hits, (unsigned long long)s4.expert_hits);
    /* Prefetching changes timing only. */
    char err[WPI_ERR_CAP];
    rig r;
    wp_cfg cfg = base_cfg();
    rig_open(&r, b, &cfg, 8, err);
    uint64_t dp = 0;
    workload(&r, b, 150, 3, 1, &bad, &dp, err);
    wp_stats sp = stats_of(&r);
    rig_close(&r);
    report(bad == 0 && dp == d1 && sp.prefetch_issued > 0 &&
               sp.bytes_read == (sp.expert_misses + sp.prefetch_issued) * b->rec,
           "with prefetch: identical bytes; bytes_read = (misses + prefetches) x record");
}

static void test_prefetch(const tbuilt *b)
{
    char err[WPI_ERR_CAP];
    rig r;
    wp_cfg cfg = base_cfg();
    rig_open(&r, b, &cfg, 16, err);
    int32_t p[4] = {0, 1, 2, 3};
    wpi_experts_prefetch(r.x, 0, p, 4);
    wp_stats s = stats_of(&r);
    report(s.prefetch_issued == 4 && s.expert_lookups == 0 && s.bytes_read == 4 * b->rec,
           "prefetch: 4 issued, no lookups counted");
    wpi_experts_prefetch(r.x, 0, p, 4);
    report(stats_of(&r).prefetch_issued == 4, "prefetch of cached records issues nothing");
    int bad = 0;
    step(&r, b, 0, p, 2, &bad, NULL, err);
    step(&r, b, 0, p + 2, 1, &bad, NULL, err);
    step(&r, b, 0, p, 1, &bad, NULL, err);
    s = stats_of(&r);
    report(bad == 0 && s.expert_hits == 4 && s.expert_misses == 0 && s.prefetch_hits == 3,
           "demand on prefetched records: hits %llu, misses 0, prefetch_hits %llu (first use "
           "only)", (unsigned long long)s.expert_hits, (unsigned long long)s.prefetch_hits);
    wpi_experts_prefetch(r.x, 5, p, 4);
    int32_t junk[3] = {-1, 999, 7};
    wpi_experts_prefetch(r.x, 1, junk, 3);
    report(stats_of(&r).prefetch_issued == 5, "prefetch hints with bad layers or ids are ignored");
    rig_close(&r);

    /* All slots pinned: a hint is dropped, never evicts a pinned record. */
    rig_open(&r, b, &cfg, 4, err);
    uint32_t mp = wpi_experts_max_pinned(r.x);
    int32_t ids[4] = {10, 11, 12, 13};
    wpi_experts_request(r.x, 0, ids, mp, err, sizeof(err));
    wpi_experts_prefetch(r.x, 1, p, 4);
    s = stats_of(&r);
    int ok = 1;
    for (uint32_t k = 0; k < mp; k++) {
        wpi_expert_view v;
        ok &= wpi_experts_acquire(r.x, 0, ids[k], &v, err, sizeof(err)) == WP_OK &&
              view_ok(b, 0, (uint32_t)ids[k], &v);
    }
    wpi_experts_release(r.x);
    report(mp == 4 && s.prefetch_issued == 0 && ok,
           "every slot pinned: the prefetch is dropped, the pinned records stay valid");
    rig_close(&r);
}

static void test_hotlist(const tbuilt *b, const char *base)
{
    char err[WPI_ERR_CAP], path[600];
    snprintf(path, sizeof(path), "%s/hot.txt", b->dir);
    rig r;
    wp_cfg cfg = base_cfg();
    rig_open(&r, b, &cfg, 8, err);
    int bad = 0;
    int32_t hot[2] = {3, 7};
    for (int k = 0; k < 5; k++)
        step(&r, b, 0, hot, 2, &bad, NULL, err);
    int32_t warm = 20;
    step(&r, b, 1, &warm, 1, &bad, NULL, err);
    wp_status st = wpi_experts_hotlist_save(r.x, path, err, sizeof(err));
    rig_close(&r);
    size_t n = 0;
    uint8_t *txt = read_file(path, &n);
    report(st == WP_OK && txt && strstr((char *)txt, "warp-hotlist 1\n") &&
               strstr((char *)txt, "\n0 3 5\n") && strstr((char *)txt, "\n1 20 1\n"),
           "hotlist saved as text");
    free(txt);
    cfg.hotlist_path = path;
    st = rig_open(&r, b, &cfg, 8, err);
    wp_stats s0 = stats_of(&r);
    step(&r, b, 0, hot, 2, &bad, NULL, err);
    wp_stats s = stats_of(&r);
    report(st == WP_OK && bad == 0 && s.expert_hits == 2 && s.expert_misses == 0 &&
               s0.bytes_read == 0,
           "hotlist preloads the hot records at open (first lookups hit, not counted as reads)");
    /* Saving again accumulates the loaded counts. */
    wpi_experts_hotlist_save(r.x, path, err, sizeof(err));
    rig_close(&r);
    txt = read_file(path, &n);
    report(txt && strstr((char *)txt, "\n0 3 6\n"), "a reloaded hotlist accumulates counts");
    free(txt);

    /* Entries of other models are skipped; more entries than half the cache are capped. */
    const char *alien = "warp-hotlist 1\n99 1 1000\n0 1000 1000\n1 1 50\n1 2 40\n1 3 30\n"
                        "1 4 20\n1 5 10\n0 0 99999999999\n";
    write_file(path, alien, strlen(alien));
    st = rig_open(&r, b, &cfg, 8, err);
    int32_t top[4] = {1, 2, 3, 4};
    step(&r, b, 1, top, 1, &bad, NULL, err);
    int32_t z = 0;
    step(&r, b, 0, &z, 1, &bad, NULL, err);
    int32_t five = 5;
    step(&r, b, 1, &five, 1, &bad, NULL, err);
    s = stats_of(&r);
    report(st == WP_OK && s.expert_hits == 2 && s.expert_misses == 1,
           "unknown layers/experts skipped; only the hottest half of the cache preloaded "
           "(hits %llu, misses %llu)", (unsigned long long)s.expert_hits,
           (unsigned long long)s.expert_misses);
    rig_close(&r);
    write_file(path, "not a hotlist\n", 14);
    st = rig_open(&r, b, &cfg, 8, err);
    report(st == WP_E_FORMAT && strstr(err, "hot.txt"), "a file that is not a hotlist: %s", err);
    if (st == WP_OK)
        rig_close(&r);
    write_file(path, "warp-hotlist 1\n1 2\n", 19);
    st = rig_open(&r, b, &cfg, 8, err);
    report(st == WP_E_FORMAT && strstr(err, "line 2"), "a malformed hotlist line: %s", err);
    if (st == WP_OK)
        rig_close(&r);
    remove(path);
    st = rig_open(&r, b, &cfg, 8, err);
    report(st == WP_OK, "a missing hotlist is fine (first run)");
    if (st == WP_OK)
        rig_close(&r);
    (void)base;
}

/* ---- plan ------------------------------------------------------------------------------ */

static void test_plan(const tbuilt *b, const tbuilt *dense)
{
    char err[WPI_ERR_CAP];
    wpi_container *c = NULL;
    wpi_container_open(b->dir, &c, err, sizeof(err));
    wp_cfg cfg = base_cfg();
    cfg.usable_ram_bytes = (uint64_t)1 << 50;
    wp_plan p;
    wp_status st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    const wpi_hparams *hp = &c->hp;
    uint64_t rec = b->rec, k = hp->top_k, nm = b->n_moe;
    uint32_t ctx = hp->max_position_embeddings < 4096 ? hp->max_position_embeddings : 4096;
    uint64_t kv = wpi_kv_bytes(hp, ctx), sc = wpi_scratch_bytes(hp, 64, ctx);
    uint64_t meta = wpi_cache_meta_bytes(c, (uint32_t)(nm * b->sp.n_experts));
    uint64_t minc = k * rec * 2 + meta, floor = c->trunk_bytes + kv + sc + minc, ws = k * rec * nm;
    uint64_t all = c->experts_total_bytes + meta;
    uint64_t recm = floor + 3 * ws < floor - minc + all ? floor + 3 * ws : floor - minc + all;
    report(st == WP_OK && p.ctx_tokens == ctx && p.trunk_bytes == c->trunk_bytes &&
               p.kv_bytes == kv && p.scratch_bytes == sc && p.min_cache_bytes == minc &&
               p.floor_bytes == floor && p.working_set_bytes == ws &&
               p.recommended_bytes == recm && p.record_bytes == rec &&
               p.experts_total_bytes == c->experts_total_bytes &&
               p.usable_ram_bytes == cfg.usable_ram_bytes,
           "plan parts: floor %llu = trunk + kv + scratch + min cache, ws %llu, recommended %llu",
           (unsigned long long)p.floor_bytes, (unsigned long long)p.working_set_bytes,
           (unsigned long long)p.recommended_bytes);
    report(p.budget_multiple == 3 && p.budget_bytes == floor + 3 * ws &&
               p.cache_bytes == 3 * ws + minc && p.cache_slots == wpi_cache_slots(c, p.cache_bytes),
           "default budget with ample RAM: floor + 3 ws, cache = 3 ws + min cache (%u slots)",
           p.cache_slots);
    /* Usable RAM such that 3/4 of it holds floor + 2 ws but not floor + 3 ws. */
    cfg.usable_ram_bytes = (floor + 2 * ws + 1000) / 3 * 4 + 4;
    st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    report(st == WP_OK && p.budget_multiple == 2 && p.budget_bytes == floor + 2 * ws &&
               p.cache_bytes == 2 * ws + minc,
           "default budget under a 3/4 cap: k = 2");
    cfg.usable_ram_bytes = floor; /* 3/4 of it is below the floor */
    st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    report(st == WP_OK && p.budget_multiple == 0 && p.budget_bytes == floor &&
               p.cache_bytes == minc && p.cache_slots == 2 * k,
           "default budget when nothing fits: the floor, minimum cache");
    cfg.budget_bytes = floor + 5 * rec + 100;
    st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    report(st == WP_OK && p.budget_multiple == -1 && p.budget_bytes == cfg.budget_bytes &&
               p.cache_bytes == minc + 5 * rec + 100 && p.cache_slots == 2 * k + 5,
           "explicit budget used exactly: cache = budget - floor + min cache (%u slots)",
           p.cache_slots);
    cfg.budget_bytes = (uint64_t)1 << 50;
    st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    report(st == WP_OK && p.cache_bytes == all && p.cache_slots == 2 * b->sp.n_experts,
           "explicit huge budget: cache capped at every expert record + bookkeeping");
    cfg.budget_bytes = floor - 1;
    err[0] = '\0';
    st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    char fl[32];
    snprintf(fl, sizeof(fl), "%llu", (unsigned long long)floor);
    report(st == WP_E_BUDGET && strstr(err, fl) && strstr(err, "GiB") && p.floor_bytes == floor &&
               p.budget_bytes == floor - 1,
           "budget below the floor: WP_E_BUDGET, plan still filled: %s", err);
    cfg.budget_bytes = 0;
    cfg.ctx_tokens = 100;
    cfg.prefill_chunk = 16;
    cfg.usable_ram_bytes = (uint64_t)1 << 50;
    st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    report(st == WP_OK && p.ctx_tokens == 100 && p.kv_bytes == wpi_kv_bytes(hp, 100) &&
               p.scratch_bytes == wpi_scratch_bytes(hp, 16, 100),
           "ctx_tokens and prefill_chunk are passed to the kv and scratch sizes");
    /* The plan's slot count is what open allocates. */
    wpi_mem mem = {0, 0};
    wpi_experts *x = NULL;
    cfg.ctx_tokens = 0;
    wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    st = wpi_experts_open(c, &cfg, p.cache_bytes, &mem, &x, err, sizeof(err));
    wp_stats s;
    memset(&s, 0, sizeof(s));
    wpi_experts_stats(x, &s);
    report(st == WP_OK && s.cache_slots == p.cache_slots &&
               s.cache_bytes == (uint64_t)p.cache_slots * rec,
           "wpi_experts_open allocates the planned %u slots", p.cache_slots);
    wpi_experts_close(x, &mem);
    /* Records and bookkeeping never exceed the planned cache, from the minimum up, with
     * a hotlist preload (its temporary list) included. */
    char hp_path[600];
    snprintf(hp_path, sizeof(hp_path), "%s/plan-hot.txt", b->dir);
    FILE *hf = fopen(hp_path, "w");
    fprintf(hf, "warp-hotlist 1\n");
    for (uint32_t l = 0; l < b->n_layers; l++)
        for (uint32_t e = 0; b->sp.kinds[l] == 'm' && e < b->sp.n_experts; e++)
            fprintf(hf, "%u %u %u\n", l, e, e + 1);
    fclose(hf);
    int within = 1;
    for (uint64_t extra = 0; extra <= all; extra += rec / 3 + 1) {
        uint64_t cache = minc + extra > all ? all : minc + extra;
        for (int h = 0; h < 2; h++) {
            wpi_mem mm = {0, 0};
            wp_cfg hc = cfg;
            hc.hotlist_path = h ? hp_path : NULL;
            x = NULL;
            st = wpi_experts_open(c, &hc, cache, &mm, &x, err, sizeof(err));
            within &= st == WP_OK && mm.peak <= cache;
            if (!(st == WP_OK && mm.peak <= cache))
                printf("  cache %llu: peak %llu (%s)\n", (unsigned long long)cache,
                       (unsigned long long)mm.peak, st == WP_OK ? "ok" : err);
            wpi_experts_close(x, &mm);
            within &= mm.current == 0;
        }
    }
    report(within, "accounted cache memory (records + bookkeeping + preload list) never exceeds "
                   "the planned cache bytes, minimum to all experts");
    wpi_container_close(c, &mem);

    c = NULL;
    wpi_container_open(dense->dir, &c, err, sizeof(err));
    st = wpi_plan(c, &cfg, wpi_model_sizes, &p, err, sizeof(err));
    report(st == WP_OK && p.working_set_bytes == 0 && p.min_cache_bytes == 0 &&
               p.cache_bytes == 0 && p.cache_slots == 0 && p.record_bytes == 0 &&
               p.floor_bytes == c->trunk_bytes + p.kv_bytes + p.scratch_bytes &&
               p.budget_bytes == p.floor_bytes,
           "dense model: ws 0, no cache, budget = floor");
    x = NULL;
    st = wpi_experts_open(c, &cfg, 0, &mem, &x, err, sizeof(err));
    int32_t id = 0;
    report(st == WP_OK && wpi_experts_request(x, 0, &id, 1, err, sizeof(err)) == WP_E_ARG &&
               wpi_experts_max_pinned(x) == 0,
           "dense model: an empty cache that refuses requests");
    wpi_experts_close(x, &mem);
    wpi_container_close(c, &mem);
    report(mem.current == 0, "plan/dense: everything freed");
}

static void test_plan_memory(const char *base)
{
    tspec sp = {.kinds = "m", .vocab = 64, .hidden = 32, .n_experts = 4, .top_k = 2,
                .moe_inter = 32, .edtype = WPI_Q8_0, .model_type = "no_such_arch"};
    tbuilt b;
    build(&b, &sp, base);
    char err[WPI_ERR_CAP];
    wp_plan p;
    wp_status st = wp_plan_memory(b.dir, NULL, &p, err, sizeof(err));
    report(st == WP_E_UNSUPPORTED && strstr(err, "no_such_arch") && strstr(err, wpi_arch_names()),
           "wp_plan_memory: unknown model_type lists the supported ones: %s", err);
    st = wp_plan_memory("/nonexistent", NULL, &p, err, sizeof(err));
    report(st == WP_E_IO, "wp_plan_memory: missing container is WP_E_IO");
    report(wp_plan_memory(NULL, NULL, &p, err, sizeof(err)) == WP_E_ARG,
           "wp_plan_memory: NULL path is WP_E_ARG");
    destroy(&b);
}

/* ---- usable RAM ------------------------------------------------------------------------ */

static void mkdirs(const char *root, const char *rel)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    for (char *s = p + strlen(root) + 1; *s; s++) {
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    }
    mkdir(p, 0755);
}

static void put_text(const char *root, const char *rel, const char *text)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    write_file(p, text, strlen(text));
}

static void test_cgroup(const char *base)
{
    char root[512], cg[600], proc[600];
    snprintf(root, sizeof(root), "%s/wpcg_XXXXXX", base);
    if (!mkdtemp(root)) {
        report(0, "cgroup: mkdtemp");
        return;
    }
    snprintf(cg, sizeof(cg), "%s/cg", root);
    snprintf(proc, sizeof(proc), "%s/proc", root);
    mkdirs(root, "proc/self");
    mkdirs(root, "cg/a/b/c");
    wp_cfg cfg = base_cfg();
    cfg.cgroup_root = cg;
    cfg.proc_root = proc;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t phys = (uint64_t)pages * (uint64_t)psz;

    report(wpi_usable_ram(&cfg) == phys, "no /proc/self/cgroup: physical RAM %llu",
           (unsigned long long)phys);
    put_text(root, "proc/self/cgroup", "0::/a/b/c\n");
    put_text(cg, "a/b/c/memory.max", "max\n");
    put_text(cg, "a/b/c/memory.high", "max\n");
    put_text(cg, "a/b/memory.max", "max\n");
    put_text(cg, "a/memory.max", "123456789\n");
    report(wpi_usable_ram(&cfg) == 123456789,
           "v2: a finite parent limit wins over a leaf 'max' (%llu)",
           (unsigned long long)wpi_usable_ram(&cfg));
    put_text(cg, "a/b/memory.high", "50000000\n");
    report(wpi_usable_ram(&cfg) == 50000000, "v2: memory.high counts too");
    put_text(cg, "memory.max", "40000000\n");
    report(wpi_usable_ram(&cfg) == 40000000, "v2: the root of the mount is read");
    put_text(root, "proc/self/cgroup", "0::/\n");
    report(wpi_usable_ram(&cfg) == 40000000, "v2: private namespace '0::/' reads the root");
    put_text(cg, "memory.max", "max\n");
    report(wpi_usable_ram(&cfg) == phys, "v2: all 'max' gives physical RAM");
    put_text(root, "proc/self/cgroup", "0::/a/../../../etc\n");
    report(wpi_usable_ram(&cfg) == phys, "v2: a path with '..' is not followed out of the tree");

    mkdirs(root, "cg/memory/docker/x");
    put_text(root, "proc/self/cgroup", "12:cpu,cpuacct:/docker/x\n11:memory:/docker/x\n");
    put_text(cg, "memory/docker/x/memory.limit_in_bytes", "9223372036854771712\n");
    report(wpi_usable_ram(&cfg) == phys, "v1: 2^63-ish means unlimited");
    put_text(cg, "memory/docker/memory.limit_in_bytes", "200000000\n");
    report(wpi_usable_ram(&cfg) == 200000000, "v1: a finite ancestor limit");
    put_text(root, "proc/self/cgroup", "11:memory:/docker/x\n0::/a/b/c\n");
    report(wpi_usable_ram(&cfg) == 50000000, "hybrid v1 + v2: the smallest limit");
    cfg.usable_ram_bytes = 777;
    report(wpi_usable_ram(&cfg) == 777, "cfg.usable_ram_bytes overrides detection");
    cfg.usable_ram_bytes = 0;
    wp_cfg real = base_cfg();
    uint64_t here = wpi_usable_ram(&real);
    report(here > 0 && here <= phys, "this process: usable %llu of physical %llu",
           (unsigned long long)here, (unsigned long long)phys);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", root);
}

/* Queued lookahead reads the routing did not pick are dropped: their slots come back
 * empty (a later demand reads the record whole), they leave bytes_read, and a picked
 * record, another layer's or one already read is never dropped. One reader thread, so
 * most of a batch of hints is still queued when the cancel comes. */
static void test_cancel(const tbuilt *b)
{
    char err[WPI_ERR_CAP];
    rig r;
    wp_cfg cfg = base_cfg();
    cfg.reader_threads = 1;
    rig_open(&r, b, &cfg, 16, err); /* 16 slots for a cycle of 32 records: always misses */
    uint64_t dropped = 0, kept_dropped = 0, other_dropped = 0;
    int bad = 0;
    wp_status st = WP_OK;
    for (int t = 0; t < 200 && st == WP_OK; t++) {
        uint32_t layer = (uint32_t)(t % 2);
        int32_t p[8];
        for (int k = 0; k < 8; k++)
            p[k] = (int32_t)((t * 8 + k) % (int)b->sp.n_experts);
        wpi_experts_prefetch(r.x, layer, p, 8);
        other_dropped += wpi_experts_cancel_prefetch(r.x, 1 - layer, NULL, 0);
        if (t % 3 == 0) /* every hint picked: nothing to drop */
            kept_dropped += wpi_experts_cancel_prefetch(r.x, layer, p, 8);
        dropped += wpi_experts_cancel_prefetch(r.x, layer, p, 2); /* the first two kept */
        /* the whole hint on demand: dropped records are read again, whole */
        st = step(&r, b, layer, p, 8, &bad, NULL, err);
    }
    wp_stats s = stats_of(&r);
    report(st == WP_OK && bad == 0 && dropped > 0 && kept_dropped == 0 && other_dropped == 0 &&
               s.prefetch_cancelled == dropped &&
               s.bytes_read ==
                   (s.expert_misses + s.prefetch_issued - s.prefetch_cancelled) * b->rec &&
               s.expert_lookups == s.expert_hits + s.expert_misses,
           "cancel: %llu of %llu queued hints dropped, none picked or of another layer; "
           "demand after it reads whole records; bytes_read = (misses + prefetches - "
           "cancelled) x record", (unsigned long long)dropped,
           (unsigned long long)s.prefetch_issued);
    report(wpi_experts_cancel_prefetch(NULL, 0, NULL, 0) == 0, "cancel on no cache: 0");
    report(rig_close(&r), "close after cancels frees everything");
}

int main(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    tspec sp = {.kinds = "mmd", .vocab = 64, .hidden = 32, .n_experts = 32, .top_k = 2,
                .moe_inter = 64, .inter = 64, .edtype = WPI_Q4_0, .model_type = "qwen3_moe"};
    tbuilt b;
    build(&b, &sp, base);
    tbuilt shm, *shm_p = NULL;
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && access("/dev/shm", W_OK) == 0) {
        build(&shm, &sp, "/dev/shm");
        shm_p = &shm;
    } else {
        printf("SKIP tmpfs O_DIRECT probe: /dev/shm is not writable\n");
    }
    tspec dsp = {.kinds = "dd", .vocab = 64, .hidden = 32, .inter = 64, .edtype = WPI_Q4_0,
                 .model_type = "llama"};
    tbuilt dense;
    build(&dense, &dsp, base);

    test_counters(&b);
    test_policies(&b);
    test_pins(&b);
    test_prefetch(&b);
    test_cancel(&b);
    test_identity(&b, shm_p);
    test_damage(&b);
    test_hotlist(&b, base);
    test_plan(&b, &dense);
    test_plan_memory(base);
    test_cgroup(base);

    destroy(&b);
    destroy(&dense);
    if (shm_p)
        destroy(shm_p);
    printf("test_experts: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
