/*
 * The MoonViT tower shared by two architecture files: arch/kimi_k25.c defines it (its own
 * tower and this variant differ by options of one code path), arch/kimi_k3.c attaches it
 * through its vision hook. Only files under arch/ include this header.
 */
#ifndef WP_ARCH_MOONVIT_H
#define WP_ARCH_MOONVIT_H

#include "arch.h"

/* The tower as Kimi K3 ships it: RMSNorms, a bilinear position-grid resize, no biases,
 * an RMSNorm after the projector. */
extern const wpi_vision wpi_kimi_k3_tower;

#endif /* WP_ARCH_MOONVIT_H */
