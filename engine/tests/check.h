/* check.h -- the CHECK macro, its failure count and a seeded frand(), for C tests that
 * count failures instead of printing a PASS line per check. Include from one .c file. */
#ifndef WP_TESTS_CHECK_H
#define WP_TESTS_CHECK_H

#include <stdint.h>
#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                    \
    do {                                                    \
        if (!(cond)) {                                      \
            failures++;                                     \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);     \
            printf(__VA_ARGS__);                            \
            printf("\n");                                   \
        }                                                   \
    } while (0)

/* Uniform in [-1, 1) from a fixed-seed LCG: the same draws on every run. */
static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

#endif
