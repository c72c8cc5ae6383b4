/*
 * platform.h -- the engine's only interface to what differs between operating systems.
 *
 * platform.c is the one file of the engine that names an OS or calls an OS-specific
 * facility (O_DIRECT, F_NOCACHE, posix_fadvise, /proc, cgroups, sysctl, getauxval,
 * CPU affinity); everything else is POSIX C11 and calls these functions instead.
 */
#ifndef WP_PLATFORM_H
#define WP_PLATFORM_H

#include <stdint.h>

#include "wp.h"

/* Opens path read-only, bypassing the page cache: O_DIRECT where the system has it
 * (offsets, lengths and buffers must then be WPI_DISK_ALIGN-aligned), else F_NOCACHE
 * with read-ahead off. Returns the fd, or -1 with errno set when the file cannot be
 * opened or the system has no uncached reads. A file system may still refuse the
 * transfers later (reader.c probes with one read). */
int wpi_open_uncached(const char *path);

/* Hints that fd is read at random offsets (no read-ahead). Best effort, never fails. */
void wpi_advise_random(int fd);

/* Hints that [offset, offset + bytes) of fd will not be read again, so its page-cache
 * copy may be dropped. Best effort: a no-op where the system has no such call. */
void wpi_advise_dontneed(int fd, uint64_t offset, uint64_t bytes);

/* Usable RAM in bytes. cfg->usable_ram_bytes when non-zero; else physical RAM, capped by
 * the process's memory limits: on Linux every finite cgroup v2 memory.max/memory.high
 * from this process's cgroup up to the root and cgroup v1 memory.limit_in_bytes (read
 * under cfg->proc_root and cfg->cgroup_root); on macOS RLIMIT_AS and RLIMIT_DATA.
 * UINT64_MAX if nothing can be read. */
uint64_t wpi_usable_ram(const wp_cfg *cfg);

/* Physical cores this process may run on; >= 1. Linux: unique (physical id, core id)
 * pairs of /proc/cpuinfo, capped by the affinity mask; macOS: performance cores. */
uint32_t wpi_physical_cores(void);

/* 1 when the CPU has the AArch64 dot-product instructions (SDOT/UDOT, FEAT_DotProd),
 * read from the OS (AT_HWCAP on Linux, sysctl on macOS); 0 otherwise and off AArch64. */
int wpi_cpu_has_dotprod(void);

/* 1 when the CPU has the AArch64 CRC32 instructions (FEAT_CRC32, CRC32C* included),
 * read from the OS (AT_HWCAP on Linux, sysctl on macOS); 0 otherwise and off AArch64. */
int wpi_cpu_has_crc32(void);

/* 1 when the OS lets this process use the AMX tile registers (Linux: asks for the
 * permission once, arch_prctl ARCH_REQ_XCOMP_PERM; it can be refused, e.g. where a
 * thread's signal stack is too small for the tile state); 0 otherwise and elsewhere.
 * The caller checks the CPU's AMX flags first. */
int wpi_os_allow_amx(void);

#endif /* WP_PLATFORM_H */
