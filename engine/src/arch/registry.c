/*
 * registry.c -- the only list of supported architectures, by checkpoint model_type.
 *
 * Adding a model: one arch/<model_type>.c defining `const wpi_arch wpi_arch_<model_type>`
 * (its hooks, arch.h; NULL takes the shared default) with everything only it uses kept
 * static there, and one line X(<model_type>) in ARCHS below. Nothing else in the engine
 * names an architecture: forward.c, state.c and core.c reach it through its hooks, and
 * the container reads its optional hparams keys through wpi_arch_hparams.
 */
#include <pthread.h>
#include <string.h>

#include "arch.h"

#define ARCHS(X)     \
    X(llama)         \
    X(mixtral)       \
    X(olmoe)         \
    X(qwen2_moe)     \
    X(qwen3_moe)     \
    X(gpt_oss)       \
    X(kimi_linear)   \
    X(deepseek_v3)   \
    X(glm4_moe)      \
    X(deepseek_v4)   \
    X(glm5_next)     \
    X(kimi_k3)       \
    X(kimi_k25)

#define DECLARE(name) extern const wpi_arch wpi_arch_##name;
#define ENTRY(name) &wpi_arch_##name,
ARCHS(DECLARE)
static const wpi_arch *const archs[] = {ARCHS(ENTRY)};
#undef ENTRY
#undef DECLARE
#define N_ARCHS (sizeof archs / sizeof archs[0])

const wpi_arch *wpi_arch_find(const char *model_type)
{
    if (!model_type) return NULL;
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strcmp(archs[i]->name, model_type) == 0) return archs[i];
    return NULL;
}

wp_status wpi_arch_hparams(const char *model_type, const struct wpi_json *h, wpi_hparams *hp,
                           char *err, size_t cap)
{
    const wpi_arch *a = wpi_arch_find(model_type);
    return a && a->hparams ? a->hparams(h, hp, err, cap) : wpi_hparams_shared(h, hp, err, cap);
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
