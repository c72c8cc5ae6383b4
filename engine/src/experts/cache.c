/*
 * cache.c -- the bounded expert cache behind wpi_experts_*.
 *
 * Slots hold whole records (the largest record size each, 4 KiB-aligned, carved from one
 * allocation). A hash map finds the slot of (layer, expert). A demand request pins its
 * ids and queues reads for the misses in router order; acquire waits on a condition
 * variable for a record still in flight. One mutex guards every slot, the map and the
 * counters; it is never held across a read: reader.c does the I/O and reports back
 * through read_done.
 *
 * Eviction: an empty slot first; otherwise LFRU samples 16 slots with a fixed-seed PRNG
 * and evicts the lowest hit count, ties to the oldest use (a full scan when every sample
 * is pinned or in flight), or LRU evicts the oldest use. Pinned and in-flight slots are
 * never evicted. Prefetches (the lookahead) keep at most max(n_slots / 4, top_k) reads in
 * flight. LFRU is the default because LRU collapses on cyclic access: 5.1% vs
 * 29.4% hit at a 3% cache in the reference engine's measurements.
 *
 * Placement only changes timing: the bytes handed out are always the validated record,
 * whatever the cache size, thread count or prefetching. A record that fails to read or
 * validate leaves its slot unusable and is reported by acquire, never skipped.
 *
 * Hotlist file (text, written by wpi_experts_hotlist_save):
 *   warp-hotlist 1
 *   <layer> <expert> <count>        one line per expert used at least once
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts.h"

#define NONE UINT32_MAX
#define LFRU_SAMPLES 16
#define HOTLIST_MAGIC "warp-hotlist 1"
#define HOTLIST_MAX_BYTES ((long)64 << 20)

enum { S_EMPTY = 0, S_LOADING, S_READY, S_FAILED };

typedef struct slot {
    uint8_t *buf;
    char *detail;          /* why the read failed (S_FAILED) */
    uint64_t last_use;     /* tick of the last demand lookup */
    uint32_t hits;         /* demand lookups since the slot was (re)claimed */
    uint32_t layer, expert, bank;
    uint8_t state;
    uint8_t pinned;
    uint8_t spec;          /* filled by a prefetch and not yet looked up */
    uint8_t spec_read;     /* a prefetch read is in flight */
} slot;

struct wpi_experts {
    wpi_container *c;
    wpi_reader *reader;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int policy;
    int direct;
    slot *slots;           /* [n_slots] */
    uint32_t n_slots;
    uint64_t slot_bytes;   /* largest record */
    uint8_t *arena;        /* [n_slots * slot_bytes] */
    uint64_t *map_keys;    /* open addressing, linear probing; UINT64_MAX = empty */
    uint32_t *map_vals;
    uint32_t map_mask;
    uint32_t *free_list;   /* empty slots, popped from the end */
    uint32_t n_free;
    uint32_t *pinned;      /* slots pinned since the last release */
    uint32_t n_pinned, max_pinned;
    uint32_t n_loading;    /* reads queued or in progress */
    uint32_t spec_inflight, spec_max;
    uint64_t tick, rng;
    uint32_t *usage;       /* [n_banks * n_experts] demand lookups, hotlist counts */
    uint64_t n_usage;
    uint64_t lookups, hits, misses, prefetch_issued, prefetch_hits, prefetch_cancelled;
    uint64_t bytes_read;
    double read_seconds;
};

#define EMPTY_KEY UINT64_MAX

typedef struct hot {       /* a hotlist entry while preloading */
    uint32_t count;
    uint64_t idx;          /* bank * n_experts + expert */
} hot;

static uint64_t key_of(uint32_t layer, uint32_t expert)
{
    return (uint64_t)layer << 32 | expert;
}

static uint32_t hash_of(const wpi_experts *x, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & x->map_mask;
}

static uint32_t map_find(const wpi_experts *x, uint64_t key)
{
    for (uint32_t i = hash_of(x, key);; i = (i + 1) & x->map_mask) {
        if (x->map_keys[i] == key)
            return x->map_vals[i];
        if (x->map_keys[i] == EMPTY_KEY)
            return NONE;
    }
}

static void map_put(wpi_experts *x, uint64_t key, uint32_t val)
{
    uint32_t i = hash_of(x, key);
    while (x->map_keys[i] != EMPTY_KEY && x->map_keys[i] != key)
        i = (i + 1) & x->map_mask;
    x->map_keys[i] = key;
    x->map_vals[i] = val;
}

/* Deletion by backward shift keeps every probe chain unbroken without tombstones. */
static void map_del(wpi_experts *x, uint64_t key)
{
    uint32_t i = hash_of(x, key);
    while (x->map_keys[i] != key) {
        if (x->map_keys[i] == EMPTY_KEY)
            return;
        i = (i + 1) & x->map_mask;
    }
    for (uint32_t j = (i + 1) & x->map_mask;; j = (j + 1) & x->map_mask) {
        if (x->map_keys[j] == EMPTY_KEY)
            break;
        uint32_t home = hash_of(x, x->map_keys[j]);
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            x->map_keys[i] = x->map_keys[j];
            x->map_vals[i] = x->map_vals[j];
            i = j;
        }
    }
    x->map_keys[i] = EMPTY_KEY;
}

static uint64_t next_rand(wpi_experts *x)
{
    uint64_t v = x->rng; /* xorshift64: deterministic, so runs repeat */
    v ^= v << 13;
    v ^= v >> 7;
    v ^= v << 17;
    x->rng = v;
    return v;
}

static int evictable(const slot *s)
{
    return s->state == S_READY && !s->pinned;
}

/* 1 when a is a better victim than b. */
static int better_victim(const wpi_experts *x, const slot *a, const slot *b)
{
    if (x->policy == WP_CACHE_LFRU && a->hits != b->hits)
        return a->hits < b->hits;
    return a->last_use < b->last_use;
}

static uint32_t scan_victim(const wpi_experts *x)
{
    uint32_t best = NONE;
    for (uint32_t i = 0; i < x->n_slots; i++)
        if (evictable(&x->slots[i]) &&
            (best == NONE || better_victim(x, &x->slots[i], &x->slots[best])))
            best = i;
    return best;
}

/* An empty slot, else the policy's victim, else NONE (everything pinned or in flight). */
static uint32_t pick_victim(wpi_experts *x)
{
    if (x->n_free)
        return x->free_list[--x->n_free];
    if (x->policy == WP_CACHE_LRU || x->n_slots <= LFRU_SAMPLES)
        return scan_victim(x);
    uint32_t best = NONE;
    for (int k = 0; k < LFRU_SAMPLES; k++) {
        uint32_t i = (uint32_t)(next_rand(x) % x->n_slots);
        if (evictable(&x->slots[i]) &&
            (best == NONE || better_victim(x, &x->slots[i], &x->slots[best])))
            best = i;
    }
    return best != NONE ? best : scan_victim(x);
}

/* Takes slot i (empty or evictable) for (layer, expert) of bank. */
static void claim(wpi_experts *x, uint32_t i, uint32_t bank, uint32_t layer, uint32_t expert)
{
    slot *s = &x->slots[i];
    if (s->state != S_EMPTY)
        map_del(x, key_of(s->layer, s->expert));
    free(s->detail);
    s->detail = NULL;
    s->layer = layer;
    s->expert = expert;
    s->bank = bank;
    s->hits = 0; /* the frequency belongs to the record, not to the slot */
    s->spec = 0;
    s->state = S_EMPTY;
    map_put(x, key_of(layer, expert), i);
}

static void release_slot(wpi_experts *x, uint32_t i)
{
    slot *s = &x->slots[i];
    map_del(x, key_of(s->layer, s->expert));
    free(s->detail);
    s->detail = NULL;
    s->state = S_EMPTY;
    s->spec = 0;
    x->free_list[x->n_free++] = i;
}

static void pin(wpi_experts *x, uint32_t i)
{
    if (!x->slots[i].pinned) {
        x->slots[i].pinned = 1;
        x->pinned[x->n_pinned++] = i;
    }
}

/* Queues the read of slot i; the caller holds the lock. The queues hold n_slots jobs
 * and a slot has at most one read outstanding, so this cannot fail. */
static void start_read(wpi_experts *x, uint32_t i, int demand)
{
    slot *s = &x->slots[i];
    s->state = S_LOADING;
    x->n_loading++;
    x->bytes_read += x->c->banks[s->bank].record_bytes;
    wpi_reader_submit(x->reader, s->bank, s->expert, s->buf, i, demand);
}

static void read_done(void *user, uint32_t tag, wp_status st, const char *detail)
{
    wpi_experts *x = user;
    pthread_mutex_lock(&x->mu);
    slot *s = &x->slots[tag];
    x->n_loading--;
    if (s->spec_read) {
        s->spec_read = 0;
        x->spec_inflight--;
    }
    if (st == WP_OK) {
        s->state = S_READY;
    } else if (s->pinned) {
        /* Kept (and never handed out) until acquire has reported it. */
        s->state = S_FAILED;
        s->detail = strdup(detail && detail[0] ? detail : "read failed");
    } else {
        release_slot(x, tag);
    }
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* ---- requests ----------------------------------------------------------------------- */

static wp_status check_layer(const wpi_experts *x, uint32_t layer, int32_t *bank,
                             char *err, size_t cap)
{
    if (!x)
        return wpi_fail(err, cap, WP_E_ARG, "experts: NULL cache");
    if (layer >= x->c->hp.n_layers || x->c->bank_of_layer[layer] < 0 || !x->n_slots)
        return wpi_fail(err, cap, WP_E_ARG, "experts: layer %u is not a MoE layer", layer);
    *bank = x->c->bank_of_layer[layer];
    return WP_OK;
}

wp_status wpi_experts_request(wpi_experts *x, uint32_t layer, const int32_t *ids,
                              uint32_t n, char *err, size_t cap)
{
    int32_t bank;
    wp_status st = check_layer(x, layer, &bank, err, cap);
    if (st != WP_OK)
        return st;
    if (n && !ids)
        return wpi_fail(err, cap, WP_E_ARG, "experts: NULL ids");
    if (n > x->max_pinned)
        return wpi_fail(err, cap, WP_E_ARG, "experts: request of %u experts exceeds %u", n,
                        x->max_pinned);
    uint32_t ne = x->c->banks[bank].n_experts;
    for (uint32_t k = 0; k < n; k++) {
        if (ids[k] < 0 || (uint32_t)ids[k] >= ne)
            return wpi_fail(err, cap, WP_E_ARG, "experts: layer %u expert id %d out of range "
                            "[0, %u)", layer, ids[k], ne);
        for (uint32_t j = 0; j < k; j++)
            if (ids[j] == ids[k])
                return wpi_fail(err, cap, WP_E_ARG, "experts: layer %u expert %d requested "
                                "twice", layer, ids[k]);
    }
    pthread_mutex_lock(&x->mu);
    uint32_t new_pins = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = map_find(x, key_of(layer, (uint32_t)ids[k]));
        new_pins += i == NONE || !x->slots[i].pinned;
    }
    if (x->n_pinned + new_pins > x->max_pinned) {
        uint32_t held = x->n_pinned;
        pthread_mutex_unlock(&x->mu);
        return wpi_fail(err, cap, WP_E_ARG, "experts: %u pinned + %u requested exceeds %u; "
                        "release first", held, new_pins, x->max_pinned);
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t e = (uint32_t)ids[k];
        uint64_t key = key_of(layer, e);
        uint64_t u = (uint64_t)bank * ne + e;
        x->tick++;
        x->lookups++;
        if (x->usage[u] != UINT32_MAX)
            x->usage[u]++;
        uint32_t i = map_find(x, key);
        if (i != NONE && x->slots[i].state != S_FAILED) {
            slot *s = &x->slots[i];
            x->hits++;
            if (s->spec) {
                x->prefetch_hits++;
                s->spec = 0;
            }
            s->hits++;
            s->last_use = x->tick;
            pin(x, i);
            continue;
        }
        x->misses++;
        if (i == NONE) {
            /* Pins stay below n_slots, so a slot frees up once in-flight reads land. */
            double t0 = 0;
            while ((i = pick_victim(x)) == NONE) {
                if (t0 == 0)
                    t0 = wpi_now();
                pthread_cond_wait(&x->cv, &x->mu);
            }
            if (t0 != 0)
                x->read_seconds += wpi_now() - t0;
            claim(x, i, (uint32_t)bank, layer, e);
        } else {
            free(x->slots[i].detail); /* a failed record is read again, never reused */
            x->slots[i].detail = NULL;
        }
        slot *s = &x->slots[i];
        s->hits = 1;
        s->last_use = x->tick;
        pin(x, i);
        start_read(x, i, 1);
    }
    pthread_mutex_unlock(&x->mu);
    return WP_OK;
}

wp_status wpi_experts_acquire(wpi_experts *x, uint32_t layer, int32_t id,
                              wpi_expert_view *out, char *err, size_t cap)
{
    int32_t bank;
    wp_status st = check_layer(x, layer, &bank, err, cap);
    if (st != WP_OK)
        return st;
    if (!out || id < 0 || (uint32_t)id >= x->c->banks[bank].n_experts)
        return wpi_fail(err, cap, WP_E_ARG, "experts: layer %u expert id %d out of range",
                        layer, id);
    pthread_mutex_lock(&x->mu);
    uint32_t i = map_find(x, key_of(layer, (uint32_t)id));
    if (i == NONE || !x->slots[i].pinned) {
        pthread_mutex_unlock(&x->mu);
        return wpi_fail(err, cap, WP_E_ARG, "experts: layer %u expert %d was not requested",
                        layer, id);
    }
    slot *s = &x->slots[i];
    if (s->state == S_LOADING) {
        double t0 = wpi_now();
        while (s->state == S_LOADING)
            pthread_cond_wait(&x->cv, &x->mu);
        x->read_seconds += wpi_now() - t0;
    }
    if (s->state != S_READY) {
        st = wpi_fail(err, cap, WP_E_IO, "%s",
                      s->detail ? s->detail : "expert record failed to read");
        pthread_mutex_unlock(&x->mu);
        return st;
    }
    const wpi_bank *b = &x->c->banks[bank];
    out->gate = s->buf + b->gate_offset;
    out->up = s->buf + b->up_offset;
    out->down = s->buf + b->down_offset;
    out->dtype = b->dtype;
    out->inter = b->inter;
    out->hidden = b->hidden;
    pthread_mutex_unlock(&x->mu);
    return WP_OK;
}

int wpi_experts_ready(wpi_experts *x, uint32_t layer, int32_t id)
{
    if (!x || id < 0)
        return 1; /* acquire reports the bad argument */
    pthread_mutex_lock(&x->mu);
    uint32_t i = map_find(x, key_of(layer, (uint32_t)id));
    int ready = i == NONE || x->slots[i].state != S_LOADING;
    pthread_mutex_unlock(&x->mu);
    return ready;
}

void wpi_experts_release(wpi_experts *x)
{
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    for (uint32_t k = 0; k < x->n_pinned; k++) {
        uint32_t i = x->pinned[k];
        x->slots[i].pinned = 0;
        if (x->slots[i].state == S_FAILED)
            release_slot(x, i);
    }
    x->n_pinned = 0;
    pthread_mutex_unlock(&x->mu);
}

void wpi_experts_prefetch(wpi_experts *x, uint32_t layer, const int32_t *ids, uint32_t n)
{
    int32_t bank;
    if (!ids || check_layer(x, layer, &bank, NULL, 0) != WP_OK)
        return;
    uint32_t ne = x->c->banks[bank].n_experts;
    pthread_mutex_lock(&x->mu);
    for (uint32_t k = 0; k < n; k++) {
        if (ids[k] < 0 || (uint32_t)ids[k] >= ne)
            continue;
        uint32_t e = (uint32_t)ids[k];
        if (map_find(x, key_of(layer, e)) != NONE)
            continue;
        /* Read depth is capped so that speculation never starves demand of slots. */
        if (x->spec_inflight >= x->spec_max)
            break;
        uint32_t i = pick_victim(x);
        if (i == NONE)
            break;
        claim(x, i, (uint32_t)bank, layer, e);
        slot *s = &x->slots[i];
        s->spec = 1;
        s->spec_read = 1;
        s->last_use = x->tick;
        x->spec_inflight++;
        x->prefetch_issued++;
        start_read(x, i, 0);
    }
    pthread_mutex_unlock(&x->mu);
}

uint32_t wpi_experts_cancel_prefetch(wpi_experts *x, uint32_t layer, const int32_t *ids,
                                     uint32_t n)
{
    if (!x || !x->n_slots || (n && !ids))
        return 0;
    uint32_t dropped = 0;
    pthread_mutex_lock(&x->mu);
    /* Only speculative reads are candidates, and only while one is queued: a scan of the
     * slots costs nothing next to the reads it saves, and none when nothing is queued. */
    for (uint32_t i = 0; x->spec_inflight && i < x->n_slots; i++) {
        slot *s = &x->slots[i];
        if (!s->spec_read || s->state != S_LOADING || s->pinned || s->layer != layer)
            continue;
        int chosen = 0;
        for (uint32_t k = 0; k < n && !chosen; k++)
            chosen = ids[k] >= 0 && (uint32_t)ids[k] == s->expert;
        if (chosen || !wpi_reader_cancel(x->reader, i))
            continue;
        /* No thread took the job, so nothing wrote the buffer: the slot is empty again. */
        s->spec_read = 0;
        x->spec_inflight--;
        x->n_loading--;
        x->bytes_read -= x->c->banks[s->bank].record_bytes;
        x->prefetch_cancelled++;
        release_slot(x, i);
        dropped++;
    }
    if (dropped)
        pthread_cond_broadcast(&x->cv); /* a demand miss may be waiting for a slot */
    pthread_mutex_unlock(&x->mu);
    return dropped;
}

uint32_t wpi_experts_max_pinned(const wpi_experts *x)
{
    return x ? x->max_pinned : 0;
}

/* ---- stats and hotlist ---------------------------------------------------------- */

void wpi_experts_stats(const wpi_experts *cx, wp_stats *s)
{
    if (!cx || !s)
        return;
    wpi_experts *x = (wpi_experts *)cx; /* the lock is not part of the logical state */
    pthread_mutex_lock(&x->mu);
    s->expert_lookups += x->lookups;
    s->expert_hits += x->hits;
    s->expert_misses += x->misses;
    s->prefetch_issued += x->prefetch_issued;
    s->prefetch_hits += x->prefetch_hits;
    s->prefetch_cancelled += x->prefetch_cancelled;
    s->bytes_read += x->bytes_read;
    s->read_seconds += x->read_seconds;
    s->cache_bytes = (uint64_t)x->n_slots * x->slot_bytes;
    s->cache_slots = x->n_slots;
    s->direct_io = x->direct;
    pthread_mutex_unlock(&x->mu);
}

void wpi_experts_stats_reset(wpi_experts *x)
{
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    x->lookups = x->hits = x->misses = 0;
    x->prefetch_issued = x->prefetch_hits = x->prefetch_cancelled = x->bytes_read = 0;
    x->read_seconds = 0;
    pthread_mutex_unlock(&x->mu);
}

wp_status wpi_experts_hotlist_save(const wpi_experts *cx, const char *path, char *err,
                                   size_t cap)
{
    if (!cx || !path)
        return wpi_fail(err, cap, WP_E_ARG, "hotlist: NULL argument");
    wpi_experts *x = (wpi_experts *)cx;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        return wpi_fail(err, cap, WP_E_OOM, "hotlist: out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    /* Written aside and renamed, so a crash never leaves a half-written hotlist. */
    FILE *f = fopen(tmp, "w");
    if (!f) {
        wp_status st = wpi_fail(err, cap, WP_E_IO, "hotlist: cannot write '%s': %s", tmp,
                                strerror(errno));
        free(tmp);
        return st;
    }
    int ok = fprintf(f, "%s\n", HOTLIST_MAGIC) > 0;
    pthread_mutex_lock(&x->mu);
    uint32_t ne = x->c->hp.n_experts;
    for (uint32_t b = 0; b < x->c->n_banks && ok; b++)
        for (uint32_t e = 0; e < ne && ok; e++) {
            uint32_t cnt = x->usage ? x->usage[(uint64_t)b * ne + e] : 0;
            if (cnt)
                ok = fprintf(f, "%u %u %u\n", x->c->banks[b].layer, e, cnt) > 0;
        }
    pthread_mutex_unlock(&x->mu);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        wp_status st = wpi_fail(err, cap, WP_E_IO, "hotlist: cannot write '%s': %s", path,
                                strerror(errno));
        remove(tmp);
        free(tmp);
        return st;
    }
    free(tmp);
    return WP_OK;
}


static int cmp_hot(const void *a, const void *b)
{
    const hot *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Reads the hotlist into x->usage. Missing file: nothing to do. Entries naming layers
 * or experts this container lacks are skipped: the file is a hint from another run,
 * perhaps of another model. A file that is not a hotlist at all is an error. */
static wp_status hotlist_load(wpi_experts *x, const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? WP_OK
                               : wpi_fail(err, cap, WP_E_IO, "hotlist: cannot open '%s': %s",
                                          path, strerror(errno));
    char line[256];
    wp_status st = WP_OK;
    long total = 0;
    uint32_t ln = 0;
    while (fgets(line, sizeof(line), f)) {
        size_t l = strlen(line);
        ln++;
        total += (long)l;
        if (total > HOTLIST_MAX_BYTES) {
            st = wpi_fail(err, cap, WP_E_FORMAT, "hotlist '%s': larger than %ld bytes", path,
                          HOTLIST_MAX_BYTES);
            break;
        }
        if (l && line[l - 1] == '\n')
            line[--l] = '\0';
        else if (!feof(f)) {
            st = wpi_fail(err, cap, WP_E_FORMAT, "hotlist '%s': line %u too long", path, ln);
            break;
        }
        if (ln == 1) {
            if (strcmp(line, HOTLIST_MAGIC)) {
                st = wpi_fail(err, cap, WP_E_FORMAT, "hotlist '%s': not a warp hotlist", path);
                break;
            }
            continue;
        }
        unsigned long long v[3];
        char *p = line;
        int ok = 1;
        for (int k = 0; k < 3 && ok; k++) {
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p < '0' || *p > '9') {
                ok = 0;
                break;
            }
            char *end;
            errno = 0;
            v[k] = strtoull(p, &end, 10);
            if (errno)
                v[k] = UINT64_MAX; /* saturates; skipped or clamped below */
            p = end;
        }
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!ok || *p) {
            st = wpi_fail(err, cap, WP_E_FORMAT,
                          "hotlist '%s': line %u: expected '<layer> <expert> <count>'", path, ln);
            break;
        }
        if (v[0] >= x->c->hp.n_layers || x->c->bank_of_layer[v[0]] < 0 ||
            v[1] >= x->c->hp.n_experts)
            continue;
        uint64_t u = (uint64_t)x->c->bank_of_layer[v[0]] * x->c->hp.n_experts + v[1];
        uint64_t sum = (uint64_t)x->usage[u] + (v[2] > UINT32_MAX ? UINT32_MAX : v[2]);
        x->usage[u] = sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
    }
    if (st == WP_OK && ferror(f))
        st = wpi_fail(err, cap, WP_E_IO, "hotlist '%s': read failed", path);
    fclose(f);
    return st;
}

/* Preloads the hottest records, up to half the cache, and waits for them. A record that
 * fails here is left out; a later demand read reports it. Open-time reads are not
 * counted in bytes_read, which is the expert traffic of evaluation: bytes_read =
 * (misses + prefetches) x record holds from open on. */
static wp_status hotlist_preload(wpi_experts *x, wpi_mem *m, char *err, size_t cap)
{
    uint64_t n = 0;
    for (uint64_t u = 0; u < x->n_usage; u++)
        n += x->usage[u] != 0;
    if (!n)
        return WP_OK;
    hot *list = wpi_alloc(m, 8, (size_t)n * sizeof(*list));
    if (!list)
        return wpi_fail(err, cap, WP_E_OOM, "hotlist: out of memory");
    n = 0;
    for (uint64_t u = 0; u < x->n_usage; u++)
        if (x->usage[u])
            list[n++] = (hot){x->usage[u], u};
    qsort(list, (size_t)n, sizeof(*list), cmp_hot);
    uint32_t ne = x->c->hp.n_experts;
    uint64_t take = n < x->n_slots / 2 ? n : x->n_slots / 2;
    pthread_mutex_lock(&x->mu);
    for (uint64_t k = 0; k < take && x->n_free; k++) {
        uint32_t bank = (uint32_t)(list[k].idx / ne), e = (uint32_t)(list[k].idx % ne);
        uint32_t i = x->free_list[--x->n_free];
        claim(x, i, bank, x->c->banks[bank].layer, e);
        x->slots[i].hits = 1;
        start_read(x, i, 1);
    }
    while (x->n_loading)
        pthread_cond_wait(&x->cv, &x->mu);
    x->bytes_read = 0;
    pthread_mutex_unlock(&x->mu);
    wpi_free(m, list, (size_t)n * sizeof(*list));
    return WP_OK;
}

/* ---- sizing ----------------------------------------------------------------------- */

static uint32_t map_cap_for(uint32_t slots)
{
    uint32_t cap = 16;
    while (cap < 2ull * slots)
        cap *= 2;
    return cap;
}

static uint32_t max_pinned_for(const wpi_container *c, uint32_t slots)
{
    uint64_t two_k = 2ull * c->hp.top_k;
    /* Half the slots may be pinned: a chunked prefill requests many experts per layer,
     * and the other half keeps room for prefetches and the next layer. */
    uint64_t mp = slots / 2 > two_k ? slots / 2 : two_k;
    return (uint32_t)(mp < slots ? mp : slots);
}

uint64_t wpi_cache_meta_bytes(const wpi_container *c, uint32_t slots)
{
    if (!c || !slots)
        return 0;
    uint64_t usage = (uint64_t)c->n_banks * c->hp.n_experts;
    return (uint64_t)slots * (sizeof(slot) + sizeof(uint32_t)) +
           (uint64_t)map_cap_for(slots) * (sizeof(uint64_t) + sizeof(uint32_t)) +
           (uint64_t)max_pinned_for(c, slots) * sizeof(uint32_t) +
           usage * (sizeof(uint32_t) + sizeof(hot)); /* counts + the preload list */
}

uint32_t wpi_cache_slots(const wpi_container *c, uint64_t cache_bytes)
{
    if (!c || !c->n_banks || !c->max_record_bytes)
        return 0;
    uint64_t records = (uint64_t)c->n_banks * c->hp.n_experts;
    uint64_t lo = 2ull * c->hp.top_k;
    uint64_t most = records > lo ? records : lo;
    /* The metadata of the largest possible cache is set aside first, so the slots and
     * their bookkeeping together never exceed cache_bytes (at or above the minimum). */
    uint64_t meta = wpi_cache_meta_bytes(c, most > UINT32_MAX ? UINT32_MAX : (uint32_t)most);
    uint64_t s = cache_bytes > meta ? (cache_bytes - meta) / c->max_record_bytes : 0;
    if (s > records)
        s = records;
    if (s < lo)
        s = lo;
    return s > UINT32_MAX ? UINT32_MAX : (uint32_t)s;
}

/* ---- open / close ---------------------------------------------------------------- */

static void free_all(wpi_experts *x, wpi_mem *m)
{
    if (x->slots) {
        for (uint32_t i = 0; i < x->n_slots; i++)
            free(x->slots[i].detail);
        wpi_free(m, x->slots, (size_t)x->n_slots * sizeof(slot));
    }
    wpi_free(m, x->arena, (size_t)(x->n_slots * x->slot_bytes));
    wpi_free(m, x->map_keys, (size_t)(x->map_mask + 1) * sizeof(uint64_t));
    wpi_free(m, x->map_vals, (size_t)(x->map_mask + 1) * sizeof(uint32_t));
    wpi_free(m, x->free_list, (size_t)x->n_slots * sizeof(uint32_t));
    wpi_free(m, x->pinned, (size_t)x->max_pinned * sizeof(uint32_t));
    wpi_free(m, x->usage, (size_t)x->n_usage * sizeof(uint32_t));
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
}

wp_status wpi_experts_open(wpi_container *c, const wp_cfg *cfg, uint64_t cache_bytes,
                           wpi_mem *m, wpi_experts **out, char *err, size_t cap)
{
    if (!c || !cfg || !out)
        return wpi_fail(err, cap, WP_E_ARG, "experts: NULL argument");
    *out = NULL;
    if (cfg->cache_policy != WP_CACHE_LFRU && cfg->cache_policy != WP_CACHE_LRU)
        return wpi_fail(err, cap, WP_E_ARG, "cache_policy %d is neither LFRU (0) nor LRU (1)",
                        cfg->cache_policy);
    if (cfg->reader_threads > 8)
        return wpi_fail(err, cap, WP_E_ARG, "reader_threads %u exceeds the maximum of 8",
                        cfg->reader_threads);
    /* The fixed-size control block is outside wpi_mem, like the reader's; everything
     * that grows with the model or the cache is accounted. */
    wpi_experts *x = calloc(1, sizeof(*x));
    if (!x)
        return wpi_fail(err, cap, WP_E_OOM, "experts: out of memory");
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->c = c;
    x->policy = cfg->cache_policy;
    x->rng = 0x9E3779B97F4A7C15ull;
    x->n_slots = wpi_cache_slots(c, cache_bytes);
    x->slot_bytes = c->max_record_bytes;
    if (!x->n_slots) {
        *out = x; /* a dense model: no banks, nothing to cache */
        return WP_OK;
    }
    x->max_pinned = max_pinned_for(c, x->n_slots);
    /* Prefetch depth: a quarter of the cache, but never fewer than one layer's top_k.
     * The smallest cache is 2 x top_k slots precisely so that one layer's experts can be
     * read while the previous layer's are in use; a quarter of it (top_k / 2) left half
     * of every lookahead undone at the floor: 46.9% hit and 0.49 tok/s against 83.5% and
     * 0.77 with a full layer (benchmarks/streaming.py, run (c)). Safe: the lookahead runs
     * after the layer's pins are released, and a demand miss that finds every slot pinned
     * or in flight waits for a read to land. */
    x->spec_max = x->n_slots / 4 > x->c->hp.top_k ? x->n_slots / 4 : x->c->hp.top_k;
    if (x->spec_max > x->n_slots / 2)
        x->spec_max = x->n_slots / 2 ? x->n_slots / 2 : 1;
    x->n_usage = (uint64_t)c->n_banks * c->hp.n_experts;
    uint32_t map_cap = map_cap_for(x->n_slots);
    x->map_mask = map_cap - 1;
    uint64_t arena;
    wp_status st;
    if (__builtin_mul_overflow((uint64_t)x->n_slots, x->slot_bytes, &arena) || arena > SIZE_MAX) {
        x->n_slots = 0;
        free_all(x, m);
        return wpi_fail(err, cap, WP_E_OOM, "experts: cache of %llu bytes is too large",
                        (unsigned long long)cache_bytes);
    }
    x->slots = wpi_alloc(m, 64, (size_t)x->n_slots * sizeof(slot));
    x->arena = wpi_alloc(m, WPI_BUF_ALIGN, (size_t)arena);
    x->map_keys = wpi_alloc(m, 64, (size_t)map_cap * sizeof(uint64_t));
    x->map_vals = wpi_alloc(m, 64, (size_t)map_cap * sizeof(uint32_t));
    x->free_list = wpi_alloc(m, 64, (size_t)x->n_slots * sizeof(uint32_t));
    x->pinned = wpi_alloc(m, 64, (size_t)x->max_pinned * sizeof(uint32_t));
    x->usage = wpi_alloc(m, 64, (size_t)x->n_usage * sizeof(uint32_t));
    if (!x->slots || !x->arena || !x->map_keys || !x->map_vals || !x->free_list ||
        !x->pinned || !x->usage) {
        free_all(x, m);
        return wpi_fail(err, cap, WP_E_OOM, "experts: cannot allocate a cache of %u slots "
                        "of %llu bytes", wpi_cache_slots(c, cache_bytes),
                        (unsigned long long)c->max_record_bytes);
    }
    memset(x->map_keys, 0xFF, (size_t)map_cap * sizeof(uint64_t));
    for (uint32_t i = 0; i < x->n_slots; i++) {
        x->slots[i].buf = x->arena + (uint64_t)i * x->slot_bytes;
        x->free_list[i] = x->n_slots - 1 - i; /* slot 0 is taken first */
    }
    x->n_free = x->n_slots;
    st = wpi_reader_open(c, cfg, x->n_slots, read_done, x, &x->reader, err, cap);
    if (st != WP_OK) {
        free_all(x, m);
        return st;
    }
    x->direct = wpi_reader_direct_io(x->reader);
    if (cfg->hotlist_path && cfg->hotlist_path[0]) {
        if ((st = hotlist_load(x, cfg->hotlist_path, err, cap)) != WP_OK ||
            (st = hotlist_preload(x, m, err, cap)) != WP_OK) {
            wpi_experts_close(x, m);
            return st;
        }
    }
    *out = x;
    return WP_OK;
}

void wpi_experts_close(wpi_experts *x, wpi_mem *m)
{
    if (!x)
        return;
    wpi_reader_close(x->reader); /* joins the threads; their callbacks need x alive */
    free_all(x, m);
}
