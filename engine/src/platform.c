/*
 * platform.c -- everything that differs between operating systems, and nothing else.
 *
 * The rest of the engine names no OS. Branches here are chosen by feature tests where
 * the facility has one name everywhere it exists (O_DIRECT, F_NOCACHE, F_RDAHEAD,
 * POSIX_FADV_*, CPU_COUNT, HWCAP_*), and by __APPLE__ only for sysctl names:
 *
 *                      Linux                                  macOS
 *   uncached reads     open(O_DIRECT)                         fcntl F_NOCACHE 1, F_RDAHEAD 0
 *   random reads hint  posix_fadvise POSIX_FADV_RANDOM        fcntl F_RDAHEAD 0
 *   drop cached range  posix_fadvise POSIX_FADV_DONTNEED      (none)
 *   physical RAM       sysconf _SC_PHYS_PAGES x _SC_PAGESIZE  sysctl hw.memsize
 *   memory limit       cgroup v1/v2 limits up to the root     getrlimit RLIMIT_AS, RLIMIT_DATA
 *   physical cores     /proc/cpuinfo, capped by affinity      sysctl hw.perflevel0.physicalcpu
 *                                                             (else hw.physicalcpu)
 *   SDOT/UDOT          getauxval(AT_HWCAP) & HWCAP_ASIMDDP     sysctl hw.optional.arm.FEAT_DotProd
 *   CRC32C insns       getauxval(AT_HWCAP) & HWCAP_CRC32       sysctl hw.optional.armv8_crc32
 *   AMX tile data      arch_prctl ARCH_REQ_XCOMP_PERM          (none: no AMX)
 *
 * Thread placement is left to the OS everywhere (no affinity is set).
 * The macOS column cannot be compiled by this project's CI (no SDK): it is kept to the
 * calls documented in Apple's fcntl(2), sysctlbyname(3) and getrlimit(2) pages.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__APPLE__)
#include <sys/types.h>
#include <sys/resource.h>
#include <sys/sysctl.h>
#endif

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#endif

#if defined(__aarch64__) && defined(__has_include)
#if __has_include(<sys/auxv.h>)
#include <sys/auxv.h>
#endif
#endif

#include "platform.h"

/* ---- file reads ------------------------------------------------------------------ */

int wpi_open_uncached(const char *path)
{
#if defined(O_DIRECT)
    return open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
#elif defined(F_NOCACHE)
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fcntl(fd, F_NOCACHE, 1) == -1) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
#if defined(F_RDAHEAD)
    (void)fcntl(fd, F_RDAHEAD, 0);
#endif
    return fd;
#else
    (void)path;
    errno = ENOTSUP;
    return -1;
#endif
}

void wpi_advise_random(int fd)
{
#if defined(POSIX_FADV_RANDOM)
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
#elif defined(F_RDAHEAD)
    (void)fcntl(fd, F_RDAHEAD, 0);
#else
    (void)fd;
#endif
}

void wpi_advise_dontneed(int fd, uint64_t offset, uint64_t bytes)
{
#if defined(POSIX_FADV_DONTNEED)
    (void)posix_fadvise(fd, (off_t)offset, (off_t)bytes, POSIX_FADV_DONTNEED);
#else
    (void)fd;
    (void)offset;
    (void)bytes;
#endif
}

/* ---- usable RAM ------------------------------------------------------------------- */

static uint64_t physical_ram(void)
{
#if defined(__APPLE__)
    uint64_t mem = 0;
    size_t len = sizeof mem;
    if (sysctlbyname("hw.memsize", &mem, &len, NULL, 0) == 0 && len == sizeof mem && mem)
        return mem;
    return UINT64_MAX;
#else
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
#endif
}

#if defined(__APPLE__)

/* The smaller finite soft limit of the address space and the data segment. */
static uint64_t process_limit(const wp_cfg *cfg)
{
    static const int which[] = {RLIMIT_AS, RLIMIT_DATA};
    uint64_t best = UINT64_MAX;
    (void)cfg;
    for (size_t i = 0; i < sizeof which / sizeof which[0]; i++) {
        struct rlimit rl;
        if (getrlimit(which[i], &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
            (uint64_t)rl.rlim_cur < best)
            best = (uint64_t)rl.rlim_cur;
    }
    return best;
}

#else

#define UNLIMITED_V1 ((uint64_t)1 << 60) /* cgroup v1 writes "no limit" as ~2^63 */

/* The number in a cgroup limit file; UINT64_MAX for "max", a missing file or junk. */
static uint64_t read_limit(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return UINT64_MAX;
    char buf[64];
    uint64_t v = UINT64_MAX;
    if (fgets(buf, sizeof(buf), f)) {
        char *end;
        if (isdigit((unsigned char)buf[0])) {
            unsigned long long x = strtoull(buf, &end, 10);
            if (*end == '\n' || *end == '\0')
                v = x;
        }
    }
    fclose(f);
    return v;
}

/* min over <root><path>/<file> for path and each ancestor up to and including root. */
static uint64_t walk_limits(const char *root, const char *cg_path, const char *const *files,
                            int n_files, uint64_t unlimited_at)
{
    char path[8448];
    uint64_t best = UINT64_MAX;
    size_t rl = strlen(root);
    if (rl + strlen(cg_path) + 2 >= sizeof(path))
        return best;
    char rel[4096];
    snprintf(rel, sizeof(rel), "%s", cg_path);
    /* A path with ".." could climb out of the hierarchy; such a path is not trusted. */
    if (strstr(rel, "/../") || !strncmp(rel, "../", 3) ||
        (strlen(rel) >= 3 && !strcmp(rel + strlen(rel) - 3, "/..")) || !strcmp(rel, ".."))
        rel[0] = '\0';
    size_t n = strlen(rel);
    while (n > 0 && rel[n - 1] == '/')
        rel[--n] = '\0';
    for (;;) {
        for (int k = 0; k < n_files; k++) {
            snprintf(path, sizeof(path), "%s%s%s/%s", root, rel[0] == '/' || !rel[0] ? "" : "/",
                     rel, files[k]);
            uint64_t v = read_limit(path);
            if (v < unlimited_at && v < best)
                best = v;
        }
        if (!rel[0])
            break;
        char *slash = strrchr(rel, '/');
        if (!slash)
            rel[0] = '\0';
        else
            *slash = '\0';
    }
    return best;
}

/* The smallest cgroup memory limit of this process, from <proc>/self/cgroup. */
static uint64_t process_limit(const wp_cfg *cfg)
{
    uint64_t best = UINT64_MAX;
    const char *cg_root = cfg && cfg->cgroup_root ? cfg->cgroup_root : "/sys/fs/cgroup";
    const char *proc = cfg && cfg->proc_root ? cfg->proc_root : "/proc";
    char path[4096];
    snprintf(path, sizeof(path), "%s/self/cgroup", proc);
    FILE *f = fopen(path, "r");
    if (!f)
        return best;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        size_t l = strlen(line);
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r'))
            line[--l] = '\0';
        /* "hierarchy-id:controllers:path" */
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = '\0';
        *c2 = '\0';
        const char *ctrl = c1 + 1, *cg = c2 + 1;
        uint64_t v = UINT64_MAX;
        if (!strcmp(line, "0") && !ctrl[0]) {
            static const char *const v2[] = {"memory.max", "memory.high"};
            v = walk_limits(cg_root, cg, v2, 2, UINT64_MAX);
        } else {
            /* v1: the memory controller, alone or in a comma-separated list. */
            int has_mem = 0;
            char tmp[256];
            snprintf(tmp, sizeof(tmp), "%s", ctrl);
            for (char *s = strtok(tmp, ","); s; s = strtok(NULL, ","))
                has_mem |= !strcmp(s, "memory");
            if (has_mem) {
                static const char *const v1[] = {"memory.limit_in_bytes"};
                char root1[4096];
                snprintf(root1, sizeof(root1), "%s/memory", cg_root);
                v = walk_limits(root1, cg, v1, 1, UNLIMITED_V1);
            }
        }
        if (v < best)
            best = v;
    }
    fclose(f);
    return best;
}

#endif /* __APPLE__ */

uint64_t wpi_usable_ram(const wp_cfg *cfg)
{
    if (cfg && cfg->usable_ram_bytes)
        return cfg->usable_ram_bytes;
    uint64_t best = physical_ram(), lim = process_limit(cfg);
    return lim < best ? lim : best;
}

/* ---- CPU -------------------------------------------------------------------------- */

#if !defined(__APPLE__)
/* Unique (physical id, core id) pairs of /proc/cpuinfo; 0 if it cannot be read. */
static uint32_t cpuinfo_cores(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    uint32_t n = 0;
    if (!f)
        return 0;
    /* Small fixed table, linear search. */
    enum { MAXP = 4096 };
    const int none = -1;
    int pairs[MAXP][2];
    int phys = none, core = none;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        int v;
        if (sscanf(line, "physical id : %d", &v) == 1) phys = v;
        else if (sscanf(line, "core id : %d", &v) == 1) core = v;
        else if (line[0] == '\n' || line[0] == '\r') {
            if (phys != none && core != none) {
                uint32_t i;
                for (i = 0; i < n; i++)
                    if (pairs[i][0] == phys && pairs[i][1] == core) break;
                if (i == n && n < MAXP) {
                    pairs[n][0] = phys;
                    pairs[n][1] = core;
                    n++;
                }
            }
            phys = core = none;
        }
    }
    if (phys != none && core != none) {
        uint32_t i;
        for (i = 0; i < n; i++)
            if (pairs[i][0] == phys && pairs[i][1] == core) break;
        if (i == n && n < MAXP) n++;
    }
    fclose(f);
    return n;
}
#endif

uint32_t wpi_physical_cores(void)
{
    uint32_t n = 0;
#if defined(__APPLE__)
    /* Performance cores only: rows are split evenly, so the slowest core sets the pace. */
    static const char *const names[] = {"hw.perflevel0.physicalcpu", "hw.physicalcpu"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && n == 0; i++) {
        int v = 0;
        size_t len = sizeof v;
        if (sysctlbyname(names[i], &v, &len, NULL, 0) == 0 && v > 0)
            n = (uint32_t)v;
    }
#else
    n = cpuinfo_cores();
#endif
    if (n == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (uint32_t)c : 1;
    }
#if defined(CPU_COUNT)
    /* Never more than the CPUs this process may run on (cpusets, taskset). */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int allowed = CPU_COUNT(&set);
        if (allowed > 0 && (uint32_t)allowed < n) n = (uint32_t)allowed;
    }
#endif
    return n;
}

int wpi_cpu_has_dotprod(void)
{
#if defined(__aarch64__) && defined(__APPLE__)
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0 && v != 0;
#elif defined(__aarch64__) && defined(AT_HWCAP) && defined(HWCAP_ASIMDDP)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return 0;
#endif
}

int wpi_cpu_has_crc32(void)
{
#if defined(__aarch64__) && defined(__APPLE__)
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname("hw.optional.armv8_crc32", &v, &len, NULL, 0) == 0 && v != 0;
#elif defined(__aarch64__) && defined(AT_HWCAP) && defined(HWCAP_CRC32)
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#else
    return 0;
#endif
}

/* Linux's arch_prctl codes for the AMX tile data (asm/prctl.h; the XSAVE feature number
 * of XTILEDATA is 18). The permission is per process and, once granted, stays. */
#define WPI_ARCH_REQ_XCOMP_PERM 0x1023
#define WPI_XFEATURE_XTILEDATA 18

int wpi_os_allow_amx(void)
{
#if defined(__x86_64__) && defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, WPI_ARCH_REQ_XCOMP_PERM, WPI_XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}
