/*
 * util.h -- the bottom layer every engine module shares (util.c): limits, status
 * formatting, CRC32C, accounted allocation and the clock.
 *
 * Engine layers, each header including only the one below it:
 *   util.h -> container.h -> experts.h -> model.h (pool.h) -> blocks.h -> arch.h -> ctx.h
 * Nothing here is exported: every non-static symbol is prefixed wpi_.
 */
#ifndef WPI_UTIL_H
#define WPI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "wp.h"
#include "platform.h"

#define WPI_MAX_LAYERS 1024
#define WPI_MAX_EOS 16
#define WPI_RECORD_HEADER_BYTES 64
#define WPI_DISK_ALIGN 4096      /* O_DIRECT offset and length alignment */
#define WPI_BUF_ALIGN 4096       /* alignment of read buffers */
#define WPI_ERR_CAP 512

/* ---- util.c -------------------------------------------------------------------- */

/* Formats an error message into err (may be NULL) and returns status. */
wp_status wpi_fail(char *err, size_t cap, wp_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Returns from the enclosing function with expr's status unless it is WP_OK. */
#define TRY(expr)                          \
    do {                                   \
        wp_status st_ = (expr);            \
        if (st_ != WP_OK) return st_;      \
    } while (0)

/* CRC32C (Castagnoli); the SSE4.2 or AArch64 CRC32 instruction when present, table
 * otherwise. */
uint32_t wpi_crc32c(uint32_t crc, const void *data, size_t n);

/* Container mxfp4 blocks (FORMAT.md: E8M0 scale byte, then element j in the low nibble
 * of byte j and element 16 + j in its high nibble) of `blocks` blocks shipped as MXFP4
 * (`packed`: 16 bytes a block, element 2k low and 2k + 1 high in byte k; `scales`: one
 * byte a block), into `out` (17 bytes a block). Returns how many scales are 255 (NaN). */
size_t wpi_mxfp4_interleave(const uint8_t *packed, const uint8_t *scales, size_t blocks,
                            uint8_t *out);

/* Memory accounting of one context: every engine allocation goes through it. */
typedef struct wpi_mem {
    uint64_t current;
    uint64_t peak;
} wpi_mem;

void *wpi_alloc(wpi_mem *m, size_t align, size_t bytes); /* zeroed; NULL on failure */
void wpi_free(wpi_mem *m, void *p, size_t bytes);

double wpi_now(void); /* monotonic seconds */

/* Tests only: 0 forces the portable CRC32C table, 1 restores the automatic choice.
 * Returns 1 when a CRC32C instruction (SSE4.2, AArch64 CRC32) is in use afterwards. */
int wpi_crc32c_use_hw(int allow);

#endif /* WPI_UTIL_H */
