/*
 * util.c -- error formatting, CRC32C, accounted allocation and the monotonic clock.
 *
 * Every engine allocation goes through wpi_alloc so that the peak can be compared with
 * the memory plan. Large blocks are anonymous mappings: they come zeroed from the kernel
 * without being touched, so a multi-gigabyte expert cache costs no memset at open.
 * CRC32C uses the CPU's instruction when it has one (SSE4.2 on x86, the CRC32
 * extension on AArch64) and a slicing table otherwise; both give identical results
 * (checked by the container tests).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define WPI_HAVE_SSE42_PATH 1
#define WPI_HAVE_CRC_INSN 1
#define WPI_CRC_TARGET __attribute__((target("sse4.2")))
#elif defined(__aarch64__)
#define WPI_HAVE_ARM_CRC_PATH 1
#define WPI_HAVE_CRC_INSN 1
/* clang's <arm_acle.h> declares __crc32c* only when the whole file targets +crc, so
 * clang uses its builtins; GCC's declares them for any function targeting +crc. */
#if defined(__clang__)
#define WPI_CRC_TARGET __attribute__((target("crc")))
#define CRC32CB(c, b) __builtin_arm_crc32cb(c, b)
#define CRC32CD(c, v) __builtin_arm_crc32cd(c, v)
#else
#include <arm_acle.h>
#define WPI_CRC_TARGET __attribute__((target("+crc")))
#define CRC32CB(c, b) __crc32cb(c, b)
#define CRC32CD(c, v) __crc32cd(c, v)
#endif
#endif

/* Whether the CPU has the CRC32C instruction this build can use. */
static int cpu_has_crc_insn(void)
{
#if defined(WPI_HAVE_SSE42_PATH)
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
#elif defined(WPI_HAVE_ARM_CRC_PATH)
    return wpi_cpu_has_crc32();
#else
    return 0;
#endif
}

wp_status wpi_fail(char *err, size_t cap, wp_status status, const char *fmt, ...)
{
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* ---- CRC32C ----------------------------------------------------------------------- */

#define CRC32C_POLY 0x82F63B78u /* Castagnoli, reflected */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_hw;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    crc_hw = cpu_has_crc_insn();
}

/* Slicing-by-8 over the raw (non-inverted) register. */
static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
    return c;
}

#if defined(WPI_HAVE_SSE42_PATH)
WPI_CRC_TARGET
static uint32_t crc_hw_run(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
#if defined(__x86_64__)
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
#endif
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#elif defined(WPI_HAVE_ARM_CRC_PATH)
WPI_CRC_TARGET
static uint32_t crc_hw_run(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = CRC32CB(c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8); /* little-endian, as the byte-wise steps assume */
        c = CRC32CD(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = CRC32CB(c, *p++);
    return c;
}
#endif

/* Internal hook for the tests: force the table path (0) or the automatic choice (1). */
int wpi_crc32c_use_hw(int allow);
int wpi_crc32c_use_hw(int allow)
{
    pthread_once(&crc_once, crc_init);
    crc_hw = allow && cpu_has_crc_insn();
    return crc_hw;
}

uint32_t wpi_crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    uint32_t c = ~crc;
#ifdef WPI_HAVE_CRC_INSN
    if (crc_hw)
        return ~crc_hw_run(c, (const uint8_t *)data, n);
#endif
    return ~crc_sw(c, (const uint8_t *)data, n);
}

/* Bytes b0..b3 of x to b0 0 b1 0 b2 0 b3 0. */
static inline uint64_t spread_bytes(uint64_t x)
{
    x = (x | (x << 16)) & 0x0000FFFF0000FFFFull;
    return (x | (x << 8)) & 0x00FF00FF00FF00FFull;
}

size_t wpi_mxfp4_interleave(const uint8_t *packed, const uint8_t *scales, size_t blocks,
                            uint8_t *out)
{
    size_t nan = 0;
    for (size_t g = 0; g < blocks; g++, packed += 16, out += 17) {
        uint8_t s = scales[g];
        nan += s == 255;
        out[0] = s;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* byte k of a holds elements 2k, 2k+1; of b, 16+2k, 17+2k. Output byte 2m is
         * elements 2m | 16+2m << 4 (the low nibbles), byte 2m+1 the high ones. */
        const uint64_t lo = 0x0F0F0F0F0F0F0F0Full;
        uint64_t a, b, w[2];
        memcpy(&a, packed, 8);
        memcpy(&b, packed + 8, 8);
        uint64_t e = (a & lo) | ((b & lo) << 4), o = ((a >> 4) & lo) | (b & ~lo);
        w[0] = spread_bytes(e & 0xFFFFFFFFu) | (spread_bytes(o & 0xFFFFFFFFu) << 8);
        w[1] = spread_bytes(e >> 32) | (spread_bytes(o >> 32) << 8);
        memcpy(out + 1, w, 16);
#else
        for (int m = 0; m < 8; m++) { /* elements 2m, 2m+1 and 16+2m, 17+2m */
            uint8_t a = packed[m], b = packed[8 + m];
            out[1 + 2 * m] = (uint8_t)((a & 15) | ((b & 15) << 4));
            out[2 + 2 * m] = (uint8_t)((a >> 4) | (b & 0xF0));
        }
#endif
    }
    return nan;
}

/* ---- allocation ------------------------------------------------------------------ */

/* At and above this size memory comes from mmap (zeroed lazily by the kernel). */
#define WPI_MMAP_MIN ((size_t)1 << 21)

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

void *wpi_alloc(wpi_mem *m, size_t align, size_t bytes)
{
    if (align < sizeof(void *))
        align = sizeof(void *);
    if (align & (align - 1))
        return NULL;
    if (bytes == 0)
        bytes = 1;
    void *p = NULL;
    if (bytes >= WPI_MMAP_MIN) {
        size_t pg = page_size();
        size_t extra = align > pg ? align : 0;
        size_t len = (bytes + pg - 1) / pg * pg;
        if (len < bytes || len + extra < len)
            return NULL;
        uint8_t *raw = mmap(NULL, len + extra, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED)
            return NULL;
        uint8_t *q = raw;
        if (extra) {
            /* Over-map, then trim the unaligned head and the tail so that wpi_free can
             * unmap exactly [p, p + len). */
            q = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
            if (q > raw)
                munmap(raw, (size_t)(q - raw));
            size_t tail = (size_t)(raw + len + extra - (q + len));
            if (tail)
                munmap(q + len, tail);
        }
        p = q;
    } else {
        if (posix_memalign(&p, align, bytes) != 0)
            return NULL;
        memset(p, 0, bytes);
    }
    if (m) {
        m->current += bytes;
        if (m->current > m->peak)
            m->peak = m->current;
    }
    return p;
}

void wpi_free(wpi_mem *m, void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes == 0)
        bytes = 1;
    if (bytes >= WPI_MMAP_MIN) {
        size_t pg = page_size();
        munmap(p, (bytes + pg - 1) / pg * pg);
    } else {
        free(p);
    }
    if (m)
        m->current = m->current >= bytes ? m->current - bytes : 0;
}

double wpi_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
