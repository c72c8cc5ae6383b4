/*
 * container.h -- a warp container (container.c): manifest.json (json.c) -> hparams, the
 * trunk tensor index and the expert banks (docs/FORMAT.md). Knows no architecture.
 */
#ifndef WPI_CONTAINER_H
#define WPI_CONTAINER_H

#include "util.h"
#include "kernels/kernels.h"

enum { WPI_QK_NONE = 0, WPI_QK_HEAD = 1, WPI_QK_FULL = 2 };
/* hparams.qk_norm's names by WPI_QK_* kind (container.c), the one table of them. */
extern const char *const wpi_qk_norm_names[3];

#define WPI_HC_MAX 16            /* hc_mult: hyper-connection streams (blocks/hyper.c) */
#define WPI_MAX_LORA_RANK 4096   /* kv_lora_rank (a row buffer of blocks/mla.c) */
#define WPI_KDA_MAX_HEAD_DIM 1024 /* kda_head_dim (row buffers of blocks/kda.c) */
#define WPI_HP_ARCH_BYTES (4 * WPI_MAX_LAYERS) /* wpi_hparams.arch */

/* Normalized hyperparameters (docs/FORMAT.md section 3). */
typedef struct wpi_hparams {
    char model_type[32];
    uint32_t vocab_size, hidden_size, n_layers;
    uint32_t n_heads, n_kv_heads, head_dim;
    uint32_t intermediate_size, moe_intermediate_size;
    uint32_t n_experts, top_k;             /* top_k: the routing of this open (experts_per_token) */
    uint32_t top_k_shipped;                 /* top_k as the container states it */
    uint32_t shared_expert_intermediate_size;
    int32_t shared_expert_gate;             /* bool */
    int32_t norm_topk_prob;                 /* bool */
    uint8_t layer_is_moe[WPI_MAX_LAYERS];   /* [n_layers] */
    float rms_norm_eps;
    uint32_t rope_dim;
    float rope_theta, rope_attn_factor;
    int32_t qk_norm;                        /* WPI_QK_* */
    float attn_scale;
    uint32_t max_position_embeddings;
    int32_t tie_word_embeddings;            /* bool */
    int32_t bos_token_id;                   /* -1 if none */
    uint32_t n_eos;
    int32_t eos_token_ids[WPI_MAX_EOS];
    float clip_qkv;                         /* clamp q, k, v to +-clip_qkv; 0 = none */
    /* Optional keys (blocks/hparams.c), zero when absent. attn_kinds gives layer_attn. */
    uint32_t sliding_window;                /* keys a WPI_ATTN_SLIDING layer sees, incl. its own */
    uint8_t layer_attn[WPI_MAX_LAYERS];     /* WPI_ATTN_* per layer */
    float swiglu_alpha, swiglu_limit;       /* the clamped SwiGLU (ffn.c, an arch's experts) */
    uint32_t kda_heads, kda_head_dim, kda_conv; /* KDA layers (kda.c) */
    /* Multi-head latent attention (blocks/hparams.c, blocks/mla.c) when kv_lora_rank > 0:
     * head_dim is the q/k head width qk_nope_head_dim + rope_dim; the KV cache holds per
     * token and layer the latent (kv_lora_rank normed + rope_dim rotated key floats). */
    uint32_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, v_head_dim;
    int32_t rope_interleave;                /* bool: rope pairs (2i, 2i+1) (GPT-J) */
    /* Routing (blocks/route_noaux.c): scores, group-limited selection on scores plus the
     * layer's exp_probs_b bias, weights from the unbiased scores. */
    int32_t scoring;                        /* WPI_SCORE_*; softmax when absent */
    uint32_t n_group, topk_group;           /* 0 or 1 group: no group limit */
    float routed_scaling_factor;            /* multiplies the routed weights; 1 when absent */
    /* hyper-connections (blocks/hyper.c), 0 when absent:
     * hc_mult > 0 makes the residual hc_mult streams */
    uint32_t hc_mult, hc_sinkhorn_iters;
    float hc_eps;
    uint32_t index_heads, index_head_dim, index_topk; /* an indexer's shape (two archs) */
    /* zero when absent: the KDA forget gate with a lower bound (kda.c) and the eps of the
     * MLA lora norms (mla.c). */
    int32_t kda_safe_gate;                  /* bool: g = kda_lower_bound * sigmoid(...) */
    float kda_lower_bound;
    float lora_norm_eps;                    /* 0: 1e-6 */
    /* zero when absent (blocks/hparams.c): the width routed experts run at (a latent MoE
     * projects hidden_size down to it; the banks' expert shape), the SiTU-GLU of ffn.c
     * (situ_beta > 0 replaces silu(g) by b1 tanh(g / b1) sigmoid(g), situ_linear_beta > 0
     * bounds up to b2 tanh(u / b2)) and the full-rank KDA output gate (kda.c). */
    uint32_t expert_hidden_size;            /* 0: hidden_size */
    float situ_beta, situ_linear_beta;
    int32_t kda_full_gate;                  /* bool: kda_g [D, hidden], no g_a / g_b */
    /* An architecture's own keys, parsed by its hparams hook into its private struct
     * here (arch.h: WPI_OWN_HPARAMS); zero before the hook runs. */
    _Alignas(16) unsigned char arch[WPI_HP_ARCH_BYTES];
} wpi_hparams;

enum { WPI_SCORE_SOFTMAX = 0, WPI_SCORE_SIGMOID = 1, WPI_SCORE_SQRTSOFTPLUS = 2 };

enum { WPI_ATTN_FULL = 0, WPI_ATTN_SLIDING = 1, WPI_ATTN_KDA = 2 };

/* A trunk tensor. shape[0] = rows (or length of a vector), shape[1] = cols (1 for a vector). */
typedef struct wpi_tensor {
    char *name;
    int32_t dtype;
    uint32_t n_dims;        /* 1 or 2 */
    uint64_t shape[2];
    uint64_t offset;        /* in trunk.bin */
    uint64_t bytes;
    uint32_t crc32c;
    void *data;             /* resident copy after wpi_container_load_trunk, else NULL */
} wpi_tensor;

/* One MoE layer's expert bank (experts-L{layer}.bin). */
typedef struct wpi_bank {
    uint32_t layer;
    char *path;
    uint32_t n_experts;
    uint64_t record_bytes;  /* multiple of WPI_DISK_ALIGN */
    int32_t dtype;          /* of gate, up and down */
    uint32_t inter;         /* gate/up rows, down cols */
    uint32_t hidden;        /* gate/up cols, down rows */
    uint64_t gate_offset, up_offset, down_offset; /* from the record start */
    uint64_t payload_bytes; /* end of down - WPI_RECORD_HEADER_BYTES */
} wpi_bank;

/* The vision tower of a multimodal container (manifest "vision", docs/FORMAT.md section
 * 7): its tensors are the trunk tensors named "v.*", loaded only on request
 * (wpi_container_load_vision); the tower's hyperparameters ("vision.hparams"). */
enum { WPI_ACT_GELU = 0, WPI_ACT_GELU_TANH = 1, WPI_ACT_SILU = 2 };
typedef struct wpi_vision_hp {
    uint32_t hidden_size, n_layers, n_heads, intermediate_size;
    uint32_t patch_size, merge_size, temporal_patch_size, channels;
    uint32_t pos_grid_h, pos_grid_w;        /* the learned position grid */
    uint32_t max_patches;                   /* patches of one image at most (the reserve) */
    uint32_t out_hidden_size;               /* rows handed to the text model: hidden_size */
    float rope_theta, norm_eps, proj_norm_eps;
    int32_t act, proj_act;                  /* WPI_ACT_* of the encoder MLP and projector */
    /* optional, 0 when absent: a projector's own FFN width, the SwiGLU clamp */
    uint32_t proj_intermediate_size;
    /* optional: the attention's width (n_heads * head_dim, q, k and v each), hidden_size
     * when absent */
    uint32_t attn_hidden_size;
    float glu_limit;
} wpi_vision_hp;

typedef struct wpi_container {
    char *dir;
    wpi_hparams hp;
    int32_t has_vision;           /* the manifest has a "vision" object */
    wpi_vision_hp vhp;
    int32_t placeholder_id;       /* vision.placeholder_token_id, -1 when none */
    uint64_t vision_bytes;        /* bytes of the "v.*" tensors (not in trunk_bytes) */
    uint64_t vision_reserve_bytes;/* the tower's work for one image of max_patches, set by
                                     the context (its architecture's tower) before the plan */
    wpi_tensor *tensors;
    uint32_t n_tensors;
    char *trunk_path;
    uint64_t trunk_bytes;         /* sum of tensor bytes */
    uint64_t bytes_read;          /* trunk bytes read from disk so far (not expert records) */
    wpi_bank *banks;
    uint32_t n_banks;
    int32_t bank_of_layer[WPI_MAX_LAYERS]; /* index into banks, -1 for a dense layer */
    uint64_t experts_total_bytes;
    uint64_t max_record_bytes;
} wpi_container;

/* Parses and validates manifest.json and the sizes of every file it names. Loads no
 * tensor data. Errors: WP_E_IO (missing/unreadable file), WP_E_FORMAT (anything
 * malformed; err names the key, tensor or file). */
wp_status wpi_container_open(const char *dir, wpi_container **out, char *err, size_t cap);

/* Reads every trunk tensor into memory accounted to m, tensor by tensor with pread,
 * checking each CRC32C, and adds the bytes read to c->bytes_read. Errors: WP_E_IO, WP_E_FORMAT (CRC mismatch names the tensor), OOM. */
wp_status wpi_container_load_trunk(wpi_container *c, wpi_mem *m, char *err, size_t cap);

/* Reads the tower's tensors ("v.*", skipped by wpi_container_load_trunk) the same way. */
wp_status wpi_container_load_vision(wpi_container *c, wpi_mem *m, char *err, size_t cap);
/* Whether a trunk tensor belongs to the vision tower (its name starts with "v."). */
int wpi_is_vision_tensor(const char *name);

struct wpi_json;

/* container.c: the bounds every architecture's hparams share (one table, also applied
 * while the manifest is read) and the relations between them: heads vs kv heads, rope_dim
 * vs head_dim, top_k vs n_experts, layer kinds vs FFN sizes, token ids vs vocab_size.
 * WP_E_FORMAT with a detail naming the key. */
wp_status wpi_hparams_check(const wpi_hparams *hp, char *err, size_t cap);
/* container.c: an optional array of n_layers strings, each one of names[0..n_names),
 * into out[l] = its index (absent or null: out untouched). Anything else is WP_E_FORMAT
 * naming key[l] and the names. */
wp_status wpi_hparam_kinds(const struct wpi_json *h, const char *key, const char *const *names,
                           uint32_t n_names, uint32_t n_layers, uint8_t *out, char *err,
                           size_t cap);
/* A bound on an hparams key read into a field at off of some struct (wpi_hparams, or an
 * architecture's own hparams, arch.h: WPI_OWN_HPARAMS): an integer into a uint32_t field
 * or (WPI_HPB_FLOAT) a number into a float field, within lo..hi (ends open by flag). The
 * one table of wpi_hparams' keys is in container.c; an architecture's own keys' table is
 * in its file; no other code repeats a limit. */
enum { WPI_HPB_FLOAT = 1, WPI_HPB_REQUIRED = 2, WPI_HPB_LO_OPEN = 4, WPI_HPB_HI_OPEN = 8 };
typedef struct wpi_hp_bound {
    const char *key;
    size_t off;
    double lo, hi;
    int flags;                              /* WPI_HPB_* */
} wpi_hp_bound;
#define WPI_HP_U32(type, key, lo, hi) {#key, offsetof(type, key), lo, hi, 0}
#define WPI_HP_F32(type, key, lo, hi) {#key, offsetof(type, key), lo, hi, WPI_HPB_FLOAT}
/* container.c: reads every key of table[0..n) from the hparams object h into its field of
 * base (absent or null: 0). Anything else is WP_E_FORMAT naming the key and its bounds. */
wp_status wpi_hparams_bounds(const struct wpi_json *h, const wpi_hp_bound *table, size_t n,
                             void *base, char *err, size_t cap);
/* container.c: an optional key of the one table, the same way, into its field of hp
 * (*present, when not NULL, says whether it was given). */
wp_status wpi_hparam_u32(const struct wpi_json *h, const char *key, wpi_hparams *hp, char *err,
                         size_t cap);
wp_status wpi_hparam_f32(const struct wpi_json *h, const char *key, wpi_hparams *hp,
                         int *present, char *err, size_t cap);
/* The optional hparams keys of model_type's architecture, read from the object h into hp
 * after the required ones: its hparams hook, else wpi_hparams_shared (blocks.h). Defined
 * by arch/registry.c, the one place that knows the architectures; wpi_container_open
 * calls it, so the container knows none. WP_E_FORMAT naming the key. */
wp_status wpi_arch_hparams(const char *model_type, const struct wpi_json *h, wpi_hparams *hp,
                           char *err, size_t cap);

/* The tensor of that name, or NULL. */
const wpi_tensor *wpi_container_tensor(const wpi_container *c, const char *name);

void wpi_container_close(wpi_container *c, wpi_mem *m);

#endif /* WPI_CONTAINER_H */
