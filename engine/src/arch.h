/*
 * arch.h -- an architecture (arch/): its entry in the registry (arch/registry.c).
 */
#ifndef WPI_ARCH_H
#define WPI_ARCH_H

#include "blocks.h"

/* arch/registry.c: an architecture is found by its model_type. */
struct wpi_arch {
    const char *name;
    /* Checks hparams and the presence and shape of every tensor this arch needs. */
    wp_status (*check)(const wpi_container *c, char *err, size_t cap);
    /* One decoder layer over a chunk of n tokens at positions pos..pos+n, updating
     * mdl->x in place. Errors: WP_E_IO (an expert read), with mdl->err filled. */
    wp_status (*layer_forward)(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
};

const wpi_arch *wpi_arch_find(const char *model_type);
/* Comma-separated names of every supported model_type. */
const char *wpi_arch_names(void);

#endif /* WPI_ARCH_H */
