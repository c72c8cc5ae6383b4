/*
 * dispatch.c -- picks a kernel set from the CPU's flags.
 *
 * The flags are read once (the only process-wide state of the kernels, and it is
 * idempotent: two threads racing to fill it compute the same value). The AVX tables
 * exist only in x86-64 builds and the NEON table only in AArch64 builds (where ASIMD is
 * part of the base architecture, so it is always offered, with SDOT 8-bit-activation
 * kernels where the OS reports FEAT_DotProd); elsewhere only the reference set is. On
 * x86-64 the AVX-512 set comes with AMX-INT8 tiles for 8-bit activations where the CPU
 * has them and the OS lets the process use them (asked once, at the first lookup).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "wp.h"
#include "kernels/kernels.h"
#include "platform.h"

#if defined(__x86_64__)
#define WPI_HAVE_X86 1
#else
#define WPI_HAVE_X86 0
#endif

#if defined(__aarch64__)
#define WPI_HAVE_NEON 1
#else
#define WPI_HAVE_NEON 0
#endif

#define WPI_ISA_LAST WP_ISA_NEON

#if WPI_HAVE_X86
/* F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports
 * knows the name (clang 14 refuses it). OS support of the YMM state, which F16C also
 * needs, is part of the avx2 test. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* VNNI byte dot products for the 8-bit-activation kernels: AVX-VNNI (CPUID leaf 7
 * subleaf 1, EAX bit 4) for the AVX2 set, AVX512-VNNI for the AVX-512 set. Read once,
 * as the ISA mask. */
static int cpu_has_avxvnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}

/* AMX-TILE and AMX-INT8 (CPUID leaf 7 EDX bits 24, 25), the tile state enabled by the
 * OS in XCR0 (bits 17, 18), and the process's permission to use it (platform.c). */
static int amx_detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & (3u << 24)) != (3u << 24))
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & (3u << 17)) == (3u << 17) && wpi_os_allow_amx();
}

static uint32_t vnni_detect(void)
{
    __builtin_cpu_init();
    return 0x80000000u | (cpu_has_avxvnni() ? 1u : 0u) |
           (__builtin_cpu_supports("avx512vnni") ? 2u : 0u) |
           (__builtin_cpu_supports("avx512vnni") && amx_detect() ? 4u : 0u);
}

/* Bit 0: AVX-VNNI, bit 1: AVX512-VNNI, bit 2: AMX-INT8 usable. */
static uint32_t vnni(void)
{
    static _Atomic uint32_t cached; /* 0 = not yet read; bit 31 set once read */
    uint32_t m = atomic_load_explicit(&cached, memory_order_relaxed);
    if (m == 0) {
        m = vnni_detect();
        atomic_store_explicit(&cached, m, memory_order_relaxed);
    }
    return m;
}
#endif

#if WPI_HAVE_NEON
/* The dot-product instructions (SDOT, FEAT_DotProd) for the NEON set's 8-bit-activation
 * kernels, as the OS reports them (platform.c). Read once, as the ISA mask: bit 0 the
 * feature, bit 31 set once read. */
static uint32_t dotprod(void)
{
    static _Atomic uint32_t cached; /* 0 = not yet read */
    uint32_t m = atomic_load_explicit(&cached, memory_order_relaxed);
    if (m == 0) {
        m = 0x80000000u | (wpi_cpu_has_dotprod() ? 1u : 0u);
        atomic_store_explicit(&cached, m, memory_order_relaxed);
    }
    return m & 1u;
}
#endif

/* Bit mask of (1 << wp_isa) for the sets this CPU can run. */
static uint32_t detect(void)
{
    uint32_t mask = 1u << WP_ISA_SCALAR;
#if WPI_HAVE_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               cpu_has_f16c();
    if (avx2)
        mask |= 1u << WP_ISA_AVX2;
    /* The AVX-512 file also uses AVX2/FMA/F16C instructions (masks, f16 loads). */
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        mask |= 1u << WP_ISA_AVX512;
#endif
#if WPI_HAVE_NEON
    mask |= 1u << WP_ISA_NEON;
#endif
    return mask;
}

uint32_t wp_isa_supported(void)
{
    static _Atomic uint32_t cached; /* 0 = not yet read; never 0 once read */
    uint32_t m = atomic_load_explicit(&cached, memory_order_relaxed);
    if (m == 0) {
        m = detect();
        atomic_store_explicit(&cached, m, memory_order_relaxed);
    }
    return m;
}

static const wpi_kernels *table(int isa)
{
    switch (isa) {
    case WP_ISA_SCALAR:
        return &wpi_kernels_ref;
#if WPI_HAVE_X86
    case WP_ISA_AVX2:
        return vnni() & 1u ? &wpi_kernels_avxvnni : &wpi_kernels_avx2;
    case WP_ISA_AVX512:
        return vnni() & 4u   ? &wpi_kernels_avx512amx
               : vnni() & 2u ? &wpi_kernels_avx512vnni
                             : &wpi_kernels_avx512;
#endif
#if WPI_HAVE_NEON
    case WP_ISA_NEON:
        return dotprod() ? &wpi_kernels_neondot : &wpi_kernels_neon;
#endif
    default:
        return NULL;
    }
}

const wpi_kernels *wpi_kernels_get(int isa)
{
    uint32_t mask = wp_isa_supported();
    if (isa == WP_ISA_AUTO) {
        for (int i = WPI_ISA_LAST; i > WP_ISA_AUTO; i--)
            if (mask & (1u << i))
                return table(i);
        return &wpi_kernels_ref;
    }
    if (isa < WP_ISA_SCALAR || isa > WPI_ISA_LAST || !(mask & (1u << isa)))
        return NULL;
    return table(isa);
}

wpi_matmul_fn wpi_kernels_matmul(const wpi_kernels *k, int dtype)
{
    if (!k)
        return NULL;
    switch (dtype) {
    case WPI_F32: return k->matmul_f32;
    case WPI_F16: return k->matmul_f16;
    case WPI_BF16: return k->matmul_bf16;
    case WPI_Q8_0: return k->matmul_q8_0;
    case WPI_Q4_0: return k->matmul_q4_0;
    case WPI_Q4_1: return k->matmul_q4_1;
    case WPI_MXFP4: return k->matmul_mxfp4;
    default: return NULL;
    }
}

wpi_matmul_x8_fn wpi_kernels_matmul_x8(const wpi_kernels *k, int dtype)
{
    if (!k)
        return NULL;
    switch (dtype) {
    case WPI_Q8_0: return k->matmul_x8_q8_0;
    case WPI_Q4_0: return k->matmul_x8_q4_0;
    case WPI_Q4_1: return k->matmul_x8_q4_1;
    case WPI_MXFP4: return k->matmul_x8_mxfp4;
    default: return NULL;
    }
}

uint64_t wpi_kernels_x8_fast(const wpi_kernels *k)
{
    if (!k || !k->x8_name)
        return 0;
    if (strcmp(k->x8_name, "avxvnni") == 0 || strcmp(k->x8_name, "avx512vnni") == 0 ||
        strcmp(k->x8_name, "amx") == 0)
        return WPI_X8_DTYPES;
    if (strcmp(k->x8_name, "avx2") == 0)
        return 1ull << WPI_Q4_0 | 1ull << WPI_MXFP4;
    return 0;
}

uint32_t wpi_kernels_x8_auto_rows(const wpi_kernels *k)
{
    return k && k->x8_name && strcmp(k->x8_name, "amx") == 0 ? UINT32_MAX : 1;
}
