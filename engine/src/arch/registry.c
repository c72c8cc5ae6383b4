/*
 * registry.c -- the only list of supported architectures, by checkpoint model_type.
 * Adding a model: one arch/<model_type>.c exporting a wpi_arch, and one line here.
 */
#include <pthread.h>
#include <string.h>

#include "arch.h"

extern const wpi_arch wpi_arch_llama, wpi_arch_mixtral, wpi_arch_olmoe, wpi_arch_qwen2_moe,
    wpi_arch_qwen3_moe;
extern const wpi_arch wpi_arch_gpt_oss, wpi_arch_kimi_linear;
extern const wpi_arch wpi_arch_deepseek_v3, wpi_arch_glm4_moe;
extern const wpi_arch wpi_arch_deepseek_v4;
extern const wpi_arch wpi_arch_glm5_next;

static const wpi_arch *const archs[] = {
    &wpi_arch_llama,
    &wpi_arch_mixtral,
    &wpi_arch_olmoe,
    &wpi_arch_qwen2_moe,
    &wpi_arch_qwen3_moe,
    &wpi_arch_gpt_oss,
    &wpi_arch_kimi_linear,
    &wpi_arch_deepseek_v3,
    &wpi_arch_glm4_moe,
    &wpi_arch_deepseek_v4,
    &wpi_arch_glm5_next,
};
#define N_ARCHS (sizeof archs / sizeof archs[0])

const wpi_arch *wpi_arch_find(const char *model_type)
{
    if (!model_type) return NULL;
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strcmp(archs[i]->name, model_type) == 0) return archs[i];
    return NULL;
}

static char names[256];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void build_names(void)
{
    size_t off = 0;
    for (size_t i = 0; i < N_ARCHS; i++) {
        size_t len = strlen(archs[i]->name);
        if (off + len + 3 > sizeof names) break;
        if (i) {
            memcpy(names + off, ", ", 2);
            off += 2;
        }
        memcpy(names + off, archs[i]->name, len);
        off += len;
    }
    names[off] = '\0';
}

const char *wpi_arch_names(void)
{
    pthread_once(&names_once, build_names);
    return names;
}
