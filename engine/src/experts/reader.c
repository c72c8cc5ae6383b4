/*
 * reader.c -- expert bank files, record validation and the reader threads.
 *
 * Each miss is ONE pread of the whole 4 KiB-aligned record into a 4 KiB-aligned slot
 * buffer. Banks are opened uncached (wpi_open_uncached: O_DIRECT, or F_NOCACHE where
 * that is the system's call) and then probed with a one-block read: some file systems
 * accept O_DIRECT at open and refuse every transfer (tmpfs before Linux 6.1), so a
 * failed probe falls back to a buffered fd with read-ahead off (wpi_advise_random) and
 * the stats report direct_io = 0. The probe compares against WPI_DISK_ALIGN (on-disk
 * alignment), never the buffer alignment: confusing the two once kept a reference
 * engine from ever bypassing the page cache.
 *
 * Every header is validated against the manifest on every read (it costs nothing next
 * to the read); the payload CRC only when cfg->verify. A record that fails is reported
 * with its layer and expert and is never handed to the forward pass.
 *
 * Threads take jobs from two FIFO queues, demand first, under the queue lock only;
 * completion is reported through the done callback with no lock of ours held.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts.h"

#define MAX_READER_THREADS 8
/* Threads when cfg->reader_threads is 0. A reader spends its time blocked in pread, so
 * it costs no compute; what it buys is queue depth. On the benchmark host (virtio disk,
 * benchmarks/streaming.py) O_DIRECT random reads of 4-5 MiB gave about 0.16-0.26 GiB/s
 * at queue depth 1 and 0.40-0.48 at depth 2-4, so one thread left half the disk idle. A
 * layer's misses and the lookahead's prefetches give up to 2 x top_k reads to overlap. */
#define DEFAULT_READER_THREADS 4

typedef struct job {
    uint32_t bank, expert, tag;
    void *buf;
} job;

typedef struct ring {
    job *q;
    uint32_t cap, head, n;
} ring;

struct wpi_reader {
    const wpi_container *c;
    int *fds;            /* [n_banks] */
    int direct;          /* every bank uses O_DIRECT */
    int verify;
    wpi_read_done_fn done;
    void *user;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ring demand, spec;
    int stop;
    pthread_t threads[MAX_READER_THREADS];
    uint32_t n_threads;
};

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* The bank's file name without its directory, for error details. */
static const char *bank_file(const wpi_bank *b)
{
    const char *slash = strrchr(b->path, '/');
    return slash ? slash + 1 : b->path;
}

wp_status wpi_record_check(const wpi_bank *b, uint32_t expert, const void *rec, int verify,
                           char *err, size_t cap)
{
    const uint8_t *h = rec;
    const char *why = NULL;
    if (memcmp(h, "WPXR", 4) != 0)
        why = "bad record magic (not \"WPXR\")";
    else if (wpi_crc32c(0, h, 60) != rd32(h + 60))
        why = "header checksum mismatch";
    else if (rd32(h + 4) != 1)
        why = "unsupported record version";
    else if (rd32(h + 8) != b->layer)
        why = "header names another layer";
    else if (rd32(h + 12) != expert)
        why = "header names another expert";
    else if (rd32(h + 16) != (uint32_t)b->dtype)
        why = "header dtype differs from the manifest";
    else if (rd32(h + 20) != 3)
        why = "header tensor count is not 3";
    else if (rd64(h + 24) != b->payload_bytes)
        why = "header payload size differs from the manifest";
    else if (rd64(h + 32) != b->gate_offset || rd64(h + 40) != b->up_offset ||
             rd64(h + 48) != b->down_offset)
        why = "header tensor offsets differ from the manifest";
    else if (verify && wpi_crc32c(0, h + WPI_RECORD_HEADER_BYTES, (size_t)b->payload_bytes) !=
                           rd32(h + 56))
        why = "payload checksum mismatch";
    if (why)
        return wpi_fail(err, cap, WP_E_IO, "%s: layer %u expert %u: %s", bank_file(b),
                        b->layer, expert, why);
    /* Block contents (mxfp4's NaN scale), a damaged record like the above: gate, up and
     * down each hold whole blocks. */
    static const char *const part[3] = {"gate", "up", "down"};
    const uint64_t off[4] = {b->gate_offset, b->up_offset, b->down_offset,
                             WPI_RECORD_HEADER_BYTES + b->payload_bytes};
    for (int i = 0; i < 3; i++) {
        uint64_t bad;
        if (!wpi_blocks_valid(b->dtype, h + off[i], off[i + 1] - off[i], &bad))
            return wpi_fail(err, cap, WP_E_IO,
                            "%s: layer %u expert %u: %s block %llu has %s scale byte 255 "
                            "(NaN)", bank_file(b), b->layer, expert, part[i],
                            (unsigned long long)bad, wpi_dtype_name(b->dtype));
    }
    return WP_OK;
}

static wp_status read_record(wpi_reader *r, uint32_t bank, uint32_t expert, void *buf,
                             char *err, size_t cap)
{
    const wpi_bank *b = &r->c->banks[bank];
    uint64_t off = (uint64_t)expert * b->record_bytes, got = 0;
    while (got < b->record_bytes) {
        ssize_t n = pread(r->fds[bank], (uint8_t *)buf + got, (size_t)(b->record_bytes - got),
                          (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return wpi_fail(err, cap, WP_E_IO, "%s: layer %u expert %u: read failed: %s",
                            bank_file(b), b->layer, expert,
                            n < 0 ? strerror(errno) : "unexpected end of file");
        got += (uint64_t)n;
    }
    return wpi_record_check(b, expert, buf, r->verify, err, cap);
}

wp_status wpi_reader_read(wpi_reader *r, uint32_t bank, uint32_t expert, void *buf,
                          char *err, size_t cap)
{
    if (!r || bank >= r->c->n_banks || expert >= r->c->banks[bank].n_experts || !buf)
        return wpi_fail(err, cap, WP_E_ARG, "reader: bad argument");
    return read_record(r, bank, expert, buf, err, cap);
}

static void *worker(void *arg)
{
    wpi_reader *r = arg;
    char detail[WPI_ERR_CAP];
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && !r->demand.n && !r->spec.n)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        ring *q = r->demand.n ? &r->demand : &r->spec;
        job j = q->q[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
        pthread_mutex_unlock(&r->mu);
        detail[0] = '\0';
        wp_status st = read_record(r, j.bank, j.expert, j.buf, detail, sizeof(detail));
        r->done(r->user, j.tag, st, detail);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Opens one bank: uncached (O_DIRECT or F_NOCACHE, platform.c) if asked and a one-block
 * read succeeds, else buffered. */
static wp_status open_bank(const wpi_bank *b, int want_direct, void *probe, int *fd_out,
                           int *direct_out, char *err, size_t cap)
{
    if (want_direct) {
        int fd = wpi_open_uncached(b->path);
        if (fd >= 0) {
            ssize_t n = pread(fd, probe, WPI_DISK_ALIGN, 0);
            if (n == WPI_DISK_ALIGN) {
                *fd_out = fd;
                *direct_out = 1;
                return WP_OK;
            }
            close(fd);
        }
    }
    int fd = open(b->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wpi_fail(err, cap, WP_E_IO, "layer %u: cannot open expert bank '%s': %s",
                        b->layer, b->path, strerror(errno));
    wpi_advise_random(fd);
    *fd_out = fd;
    *direct_out = 0;
    return WP_OK;
}

wp_status wpi_reader_open(const wpi_container *c, const wp_cfg *cfg, uint32_t queue_cap,
                          wpi_read_done_fn done, void *user, wpi_reader **out,
                          char *err, size_t cap)
{
    if (!c || !cfg || !done || !out || queue_cap == 0)
        return wpi_fail(err, cap, WP_E_ARG, "reader: bad argument");
    *out = NULL;
    uint32_t nt = cfg->reader_threads ? cfg->reader_threads : DEFAULT_READER_THREADS;
    if (nt > MAX_READER_THREADS)
        return wpi_fail(err, cap, WP_E_ARG, "reader_threads %u exceeds the maximum of %d",
                        cfg->reader_threads, MAX_READER_THREADS);
    wpi_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return wpi_fail(err, cap, WP_E_OOM, "reader: out of memory");
    r->c = c;
    r->verify = cfg->verify != 0;
    r->done = done;
    r->user = user;
    r->direct = c->n_banks > 0;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->fds = malloc((c->n_banks ? c->n_banks : 1) * sizeof(int));
    if (r->fds)
        for (uint32_t i = 0; i < c->n_banks; i++)
            r->fds[i] = -1;
    r->demand.q = malloc((size_t)queue_cap * sizeof(job));
    r->spec.q = malloc((size_t)queue_cap * sizeof(job));
    void *probe = NULL;
    if (!r->fds || !r->demand.q || !r->spec.q ||
        posix_memalign(&probe, WPI_BUF_ALIGN, WPI_DISK_ALIGN) != 0) {
        probe = NULL;
        wpi_reader_close(r);
        return wpi_fail(err, cap, WP_E_OOM, "reader: out of memory");
    }
    r->demand.cap = r->spec.cap = queue_cap;
    for (uint32_t i = 0; i < c->n_banks; i++) {
        int direct = 0;
        wp_status st = open_bank(&c->banks[i], cfg->direct_io != 0, probe, &r->fds[i],
                                 &direct, err, cap);
        if (st != WP_OK) {
            free(probe);
            wpi_reader_close(r);
            return st;
        }
        r->direct &= direct;
    }
    free(probe);
    for (uint32_t t = 0; t < nt; t++) {
        if (pthread_create(&r->threads[t], NULL, worker, r) != 0) {
            wpi_reader_close(r);
            return wpi_fail(err, cap, WP_E_OOM, "reader: cannot start thread %u", t);
        }
        r->n_threads = t + 1;
    }
    *out = r;
    return WP_OK;
}

wp_status wpi_reader_submit(wpi_reader *r, uint32_t bank, uint32_t expert, void *buf,
                            uint32_t tag, int demand)
{
    if (!r || bank >= r->c->n_banks || expert >= r->c->banks[bank].n_experts || !buf)
        return WP_E_ARG;
    pthread_mutex_lock(&r->mu);
    ring *q = demand ? &r->demand : &r->spec;
    if (q->n == q->cap) {
        pthread_mutex_unlock(&r->mu);
        return WP_E_ARG;
    }
    q->q[(q->head + q->n) % q->cap] = (job){bank, expert, tag, buf};
    q->n++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return WP_OK;
}

int wpi_reader_cancel(wpi_reader *r, uint32_t tag)
{
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    ring *q = &r->spec;
    int found = 0;
    for (uint32_t k = 0; k < q->n; k++) {
        if (q->q[(q->head + k) % q->cap].tag != tag)
            continue;
        /* The jobs behind it move up one place, so the queue stays in FIFO order. */
        for (uint32_t j = k; j + 1 < q->n; j++)
            q->q[(q->head + j) % q->cap] = q->q[(q->head + j + 1) % q->cap];
        q->n--;
        found = 1;
        break;
    }
    pthread_mutex_unlock(&r->mu);
    return found;
}

int wpi_reader_direct_io(const wpi_reader *r)
{
    return r ? r->direct : 0;
}

void wpi_reader_close(wpi_reader *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    for (uint32_t t = 0; t < r->n_threads; t++)
        pthread_join(r->threads[t], NULL);
    if (r->fds)
        for (uint32_t i = 0; i < r->c->n_banks; i++)
            if (r->fds[i] >= 0)
                close(r->fds[i]);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->fds);
    free(r->demand.q);
    free(r->spec.q);
    free(r);
}
