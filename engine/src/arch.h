/*
 * arch.h -- an architecture (arch/<model_type>.c): its hooks, found by model_type in the
 * registry (arch/registry.c); and what calls them: the sizes and the walk of forward.c.
 * Included by arch/, forward.c and ctx.h (core.c, state.c); experts/plan.c gets the sizes
 * through wpi_model_sizes, passed by core.c.
 */
#ifndef WPI_ARCH_H
#define WPI_ARCH_H

#include "blocks.h"

/* arch/registry.c: an architecture is found by its model_type. Everything that varies
 * between architectures goes through these hooks; NULL takes the shared default, so a
 * plain decoder needs only check and layer_forward. forward.c, state.c and core.c
 * call the hooks and know no architecture by name or by its fields. */
struct wpi_arch {
    const char *name;
    /* The optional hparams keys after the required ones (container.c reads those), with
     * the relations between them: WP_E_FORMAT naming the key. NULL: wpi_hparams_shared,
     * the keys of the shared blocks; a hook reads those too (it calls wpi_hparams_shared). */
    wp_status (*hparams)(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap);
    /* Checks hparams and the presence and shape of every tensor this arch needs. */
    wp_status (*check)(const wpi_container *c, char *err, size_t cap);
    /* Its state bytes at ctx tokens by WP_STATE_* kind (out is zeroed before). NULL: K and
     * V rows of every layer (WP_STATE_KV). */
    void (*state_bytes)(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS]);
    /* Carves the scratch buffers it needs beyond the shared ones (wpi_carve); m is NULL
     * while only measuring. NULL: none. */
    void (*scratch)(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, wpi_carve *cv);
    /* After the shared binding (every shared block's tensors by name, K and V rows carved
     * from kv): its own tensors and its layout of kv (wpi_state_bytes). NULL: nothing. */
    void (*bind)(wpi_model *m, const wpi_container *c, void *kv);
    /* The state file's part v (0 or 1) of layer l at position pos: its bytes, and where
     * they live in *at. NULL: K rows then V rows [0, pos). */
    size_t (*state_part)(const wpi_model *m, uint32_t l, int v, uint32_t pos, float **at);
    /* What forbids truncating a state to a shorter prefix ("a recurrent (KDA) state"), or
     * NULL when it can be truncated. NULL hook: always possible. */
    const char *(*no_truncate)(const wpi_hparams *hp);
    /* One decoder layer over a chunk of n tokens at positions pos..pos+n, updating
     * mdl->x in place. Errors: WP_E_IO (an expert read), with mdl->err filled. */
    wp_status (*layer_forward)(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
    /* Optional, both or neither: a layer_forward that is mixer then ffn. mixer: the part
     * reading and writing one sequence's state (attention, MLA, KDA) on its n rows of
     * mdl->x at pos; ffn: the stateless rest (dense FFN or MoE) on n rows of any
     * sequences. With them wp_eval_batch runs one ffn over every sequence's rows; without
     * (hyper-connections mix several streams) it evaluates the sequences one by one. */
    void (*mixer)(wpi_model *mdl, uint32_t layer, uint32_t n, uint32_t pos);
    /* Optional with mixer: mixer on every sequence of a batched step at once (ms[i] on its
     * n[i] rows at pos[i]), each sequence's results those of mixer on it alone, in fewer
     * parallel sections (one per layer, not one per sequence). NULL: mixer per sequence. */
    void (*mixer_seqs)(wpi_model *const *ms, uint32_t layer, const uint32_t *n,
                       const uint32_t *pos, uint32_t n_seqs);
    wp_status (*ffn)(wpi_model *mdl, uint32_t layer, uint32_t n);
    /* Optional with mixer, both or neither: the stateless parts of the mixer, on n rows of
     * any sequences, so a batched step projects every sequence's rows in one matmul.
     * mix_in before it (the norm and input projections of every row, each at its own
     * position's RoPE; mixer then reads its rows of them), mix_out after it (the output
     * projection into the residual stream). With them, mixer is only the part that reads
     * or writes a sequence's state; layer_forward is mix_in, mixer, mix_out, ffn. */
    void (*mix_in)(wpi_model *mdl, uint32_t layer, uint32_t n);
    void (*mix_out)(wpi_model *mdl, uint32_t layer, uint32_t n);
    /* Its image tower, or NULL (a container with a vision object is then refused when
     * opened with the vision option). */
    const struct wpi_vision *vision;
};

/* An image tower (docs/ENGINE.md "Images"): the container's "v.*" tensors and its
 * vision hparams (c->vhp). */
typedef struct wpi_vision {
    /* Checks c->vhp's relations and every tower tensor (name and shape). */
    wp_status (*check)(const wpi_container *c, char *err, size_t cap);
    /* Bytes of the work buffer encode needs for an image of n patches. */
    uint64_t (*work_bytes)(const wpi_vision_hp *v, uint32_t n_patches);
    /* Rows one image of grid t x h x w patches becomes; 0 when the grid is refused (why in
     * err). */
    uint32_t (*out_rows)(const wpi_vision_hp *v, const uint32_t thw[3], char *err, size_t cap);
    /* The image's rows [out_rows, out_hidden_size] into out from pixels [t*h*w,
     * channels * temporal_patch_size * patch_size^2] (the image processor's layout), with
     * m's kernels and pool; work holds work_bytes(t*h*w). */
    void (*encode)(wpi_model *m, const wpi_container *c, const float *pixels,
                   const uint32_t thw[3], float *out, void *work);
} wpi_vision;

/* An architecture's own hparams and model state, beside the central structs: in its
 * file, WPI_OWN_HPARAMS(type) defines own_hp(hp), its hparams struct in hp->arch (its
 * hparams hook fills it, its own keys' bounds in a wpi_hp_bound table read by
 * wpi_hparams_bounds); WPI_OWN_MODEL(type) defines own(m), its struct in m->arch (its
 * scratch hook carves it with wpi_carve_own, then its per-layer arrays). */
#define WPI_OWN_HPARAMS(type)                                                         \
    _Static_assert(sizeof(type) <= WPI_HP_ARCH_BYTES, #type " must fit hparams.arch"); \
    static inline type *own_hp(const wpi_hparams *hp) { return (type *)(void *)hp->arch; }
#define WPI_OWN_MODEL(type) \
    static inline type *own(const wpi_model *m) { return (type *)m->arch; }

/* In a wpi_arch initializer: every hook but no_truncate, each the file's static function
 * of the hook's name (hparams, check, state_bytes, scratch, bind, state_part,
 * layer_forward). */
#define WPI_ARCH_OWN_HOOKS                                                            \
    .hparams = hparams, .check = check, .state_bytes = state_bytes, .scratch = scratch, \
    .bind = bind, .state_part = state_part, .layer_forward = layer_forward

const wpi_arch *wpi_arch_find(const char *model_type);
/* Comma-separated names of every supported model_type. */
const char *wpi_arch_names(void);

/* forward.c: bytes of the KV cache (all the state) at ctx tokens, the same by WP_STATE_*
 * kind (they sum to wpi_kv_bytes), and of the scratch buffers for chunks of `chunk`
 * tokens at ctx tokens, each through the hooks of hp->model_type's architecture (the
 * defaults for an unknown one). The plan uses exactly what the forward allocates (chunk =
 * cfg->prefill_chunk, 0 meaning 64). */
uint64_t wpi_kv_bytes(const wpi_hparams *hp, uint32_t ctx);
void wpi_state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS]);
uint64_t wpi_scratch_bytes(const wpi_hparams *hp, uint32_t chunk, uint32_t ctx);
/* Those and wpi_seq_bytes, as the wpi_sizes_fn the memory plan (experts/plan.c) takes. */
void wpi_model_sizes(const wpi_hparams *hp, uint32_t ctx, uint32_t chunk,
                     uint64_t state_bytes[WP_STATE_KINDS], uint64_t *scratch_bytes,
                     uint64_t *sequence_bytes);
/* Bytes of one more sequence: its state at ctx tokens, then its layer table (sequence 0's
 * lives in the scratch). wpi_seq_layers: where the table starts in that allocation. */
uint64_t wpi_seq_bytes(const wpi_hparams *hp, uint32_t ctx);
wpi_layer *wpi_seq_layers(const wpi_hparams *hp, uint32_t ctx, void *own);

/* forward.c: binds tensors and carves buffers (kv and scratch as sized above); layers,
 * when not NULL, is the layer table to fill instead of the scratch's own. */
wp_status wpi_model_init(wpi_model *mdl, const wpi_arch *arch, const wpi_container *c,
                         void *kv, void *scratch, wpi_layer *layers, uint32_t ctx,
                         uint32_t chunk);
/* Evaluates tokens[0..n) (n <= chunk) at positions pos..pos+n. logits (may be NULL)
 * receives vocab floats per token for all n tokens when all_logits, else for the last. */
wp_status wpi_model_forward(wpi_model *mdl, const wpi_arch *arch,
                            const int32_t *tokens, uint32_t n, uint32_t pos,
                            float *logits, int all_logits);
/* One step of several sequences (arch->mixer and ffn set): ms[i] is sequence i's model,
 * bound to its state and to base's scratch (base: a model of none of them); its n[i]
 * tokens tok[i] at pos[i], rows laid one after another in base->x (sum of n <=
 * base->chunk). logits (may be NULL) receives the last row's logits of each sequence i
 * with want[i], one after another (vocab floats apart). */
wp_status wpi_model_forward_batch(wpi_model *base, const wpi_arch *arch, wpi_model *const *ms,
                                  const int32_t *const *tok, const uint32_t *n,
                                  const uint32_t *pos, uint32_t n_seqs, float *logits,
                                  const uint8_t *want);

#endif /* WPI_ARCH_H */
