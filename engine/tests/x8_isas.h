/* x8_isas.h -- which of the 8-bit-activation tables this CPU runs, for the x8 kernel tests
 * (each skips, with the [not provided by CI] reason, a table it cannot run). x86-64, the
 * five x86 tables, in the order avx2, avxvnni, avx512bw, avx512vnni, amx (AMX-INT8, where
 * the OS also grants the tile state, asked here as dispatch.c asks); AArch64, the two
 * NEON ones, neon (base ASIMD) and neon-dotprod (FEAT_DotProd), where
 * WP_TEST_EXPECT_DOTPROD=0 or 1 (set by .ci/aarch64, which runs the tests under QEMU CPU
 * models without and with the feature) makes the detection a checked result. */
#ifndef WP_TESTS_X8_ISAS_H
#define WP_TESTS_X8_ISAS_H

#if defined(__x86_64__)
#include <cpuid.h>

#include "wp.h"
#include "kernels/kernels.h"
#include "platform.h"

#define X8_ISAS 5
static const char *const x8_isa_needs[X8_ISAS] = {"AVX2", "AVX-VNNI", "AVX-512 F/BW/VL",
                                                   "AVX512-VNNI",
                                                   "AMX-TILE/AMX-INT8 granted by the OS"};

typedef struct x8_isas {
    const wpi_kernels *k2, *k5; /* the AVX2 and AVX-512 sets, NULL where not runnable */
    int avxvnni;                /* AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4) */
    int amx;                    /* AMX-TILE + AMX-INT8 (leaf 7 EDX bits 24, 25), XCR0's
                                   tile bits, and the OS's permission */
    int runs[X8_ISAS];
} x8_isas;

static x8_isas x8_isas_detect(void)
{
    unsigned a, b, c, d, lo = 0, hi;
    x8_isas s;
    __builtin_cpu_init();
    s.avxvnni = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
    s.amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (3u << 24)) == (3u << 24);
    if (s.amx && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE))
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    s.amx = s.amx && (lo & (3u << 17)) == (3u << 17) && wpi_os_allow_amx();
    s.k2 = wpi_kernels_get(WP_ISA_AVX2);
    s.k5 = wpi_kernels_get(WP_ISA_AVX512);
    s.runs[0] = s.k2 != NULL;
    s.runs[1] = s.k2 && s.avxvnni;
    s.runs[2] = s.k5 != NULL;
    s.runs[3] = s.k5 && __builtin_cpu_supports("avx512vnni");
    s.runs[4] = s.runs[3] && s.amx;
    return s;
}

#elif defined(__aarch64__)
#include <stdlib.h>

#include "wp.h"
#include "kernels/kernels.h"
#include "platform.h"

#define X8_ISAS 2
static const char *const x8_isa_needs[X8_ISAS] = {"AArch64 ASIMD", "FEAT_DotProd"};

typedef struct x8_isas {
    const wpi_kernels *kn; /* the NEON set dispatch.c gives */
    int dotprod;           /* FEAT_DotProd as the OS reports it */
    int expect;            /* WP_TEST_EXPECT_DOTPROD: 0 or 1; -1 where unset */
    int runs[X8_ISAS];
} x8_isas;

static x8_isas x8_isas_detect(void)
{
    const char *want = getenv("WP_TEST_EXPECT_DOTPROD");
    x8_isas s;
    s.kn = wpi_kernels_get(WP_ISA_NEON);
    s.dotprod = wpi_cpu_has_dotprod();
    s.expect = want && (want[0] == '0' || want[0] == '1') && !want[1] ? want[0] - '0' : -1;
    s.runs[0] = 1;
    s.runs[1] = s.dotprod;
    return s;
}
#endif

#endif
