"""GLM-5.3-Flash (glm5_next) configs: every knob of transformers' Glm5NextTextConfig.

Layer schedules (KDA linear attention / MLA indexed attention, "full" / "shared" indexers,
dense / sparse MLPs), MLA ranks and head dims, the DSA indexer (heads, head dim, top-k,
pool size), KDA heads, head dim, conv kernel and forget-gate lower bound (or the softplus
gate), hyper-connection streams and Sinkhorn iterations, grouped sigmoid routing (groups,
top-k, normalisation, scaling factor, correction bias), shared experts, the SwiGLU clamp,
norm eps and tied / untied embeddings. `qk_rope_head_dim` is drawn at 0 only and
`index_kpool_always_select_tail` true only: transformers refuses a rope dim and the
converter refuses the other tail mode (oracle/test_glm5_next.py asserts both refusals).

The model is the multimodal checkpoint (a tiny vision tower the converter skips). As in
a trained model its draws are decisive: the output head adds each token's successor
embedding (greedy steps are no near-ties), the embedding is at unit scale next to small
block updates, and the routing bias separates the experts' choice values. The reference
is transformers decoding with its cache, the computation it serves generation with
(oracle/test_glm5_next.py asserts it equals the full forward).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

STD = 0.1
EMBED_STD = 1.0
BIAS_STD = 0.5
VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
              projection_intermediate_size=32, patch_size=14, spatial_merge_size=2,
              temporal_patch_size=2)


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    layer_types = draw(st.lists(st.sampled_from(["indexed_attention", "linear_attention"]),
                                min_size=n, max_size=n))
    indexer_types = []
    for i, t in enumerate(layer_types):
        # "shared" reuses the selection of the indexed layer right before it
        can_share = i > 0 and layer_types[i - 1] == "indexed_attention" and \
            indexer_types[i - 1] == "full"
        shared = t == "indexed_attention" and can_share and draw(st.booleans())
        indexer_types.append("shared" if shared else "full")
    mlp_layer_types = draw(st.lists(st.sampled_from(["dense", "sparse"]), min_size=n,
                                    max_size=n))
    heads = draw(st.integers(1, 4))
    n_group = draw(st.sampled_from([1, 2, 4]))
    per_group = draw(st.integers(2, 4))  # the group score sums a group's top 2
    experts = n_group * per_group
    topk_group = draw(st.integers(1, n_group))
    kpool = draw(st.sampled_from([1, 2, 3, 4, 8]))
    topk = kpool * draw(st.integers(1, 4))
    # A pool's score sums w_h * relu(q_h . key) over the heads, w_h of either sign: a pool
    # whose every head is negative scores exactly 0, between the positive and the
    # negative scores, so a top-k boundary often falls inside a tie of zeros, which
    # transformers' topk breaks arbitrarily (its cached decode then disagrees with its
    # own full forward). A selecting indexer has 12 or 16 heads (a zero pool about once
    # in 4096 or 65536); fewer heads come with a top-k that keeps every pool.
    index_heads = draw(st.sampled_from([1, 2, 3, 4, 8, 12, 16]))
    if index_heads < 12:
        topk = kpool * (64 // kpool + 1)
    lower = draw(st.one_of(st.none(), st.sampled_from([-5.0, -2.0, -0.5])))
    return dict(
        vocab_size=272, hidden_size=draw(st.sampled_from([32, 64, 96])),
        intermediate_size=draw(st.sampled_from([32, 64, 96])),
        moe_intermediate_size=draw(st.sampled_from([16, 32])),
        num_hidden_layers=n, num_attention_heads=heads, num_key_value_heads=heads,
        n_shared_experts=draw(st.integers(1, 2)), n_routed_experts=experts,
        num_experts_per_tok=draw(st.integers(1, min(topk_group * per_group, 6))),
        n_group=n_group, topk_group=topk_group,
        routed_scaling_factor=draw(st.sampled_from([1.0, 1.5, 2.5])),
        norm_topk_prob=draw(st.booleans()),
        kv_lora_rank=draw(st.sampled_from([16, 32, 48])),
        q_lora_rank=draw(st.sampled_from([16, 32, 64])),
        qk_rope_head_dim=0, qk_nope_head_dim=draw(st.sampled_from([8, 16, 32])),
        v_head_dim=draw(st.sampled_from([8, 16, 32])),
        layer_types=layer_types, indexer_types=indexer_types,
        mlp_layer_types=mlp_layer_types,
        index_n_heads=index_heads,
        index_head_dim=draw(st.sampled_from([8, 16, 24, 32, 64, 128])),
        index_kpool=kpool, index_topk=topk,
        index_kpool_always_select_tail=True,
        linear_num_heads=draw(st.integers(1, 3)),
        linear_head_dim=draw(st.sampled_from([8, 16, 32])),
        linear_conv_kernel_dim=draw(st.integers(1, 4)),
        linear_lower_bound=lower,
        hc_mult=draw(st.integers(1, 4)), hc_sinkhorn_iters=draw(st.integers(1, 20)),
        hc_eps=draw(st.sampled_from([1e-6, 1e-3])),
        swiglu_limit=draw(st.sampled_from([0.5, 1.0, 10.0])),
        rms_norm_eps=draw(st.sampled_from([1e-5, 1e-6])),
        tie_word_embeddings=draw(st.booleans()),
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    """Inside the first pool, inside the top-k budget, and past both (where they fit)."""
    pool, topk = config["index_kpool"], min(config["index_topk"], 40)
    return st.one_of(st.integers(1, pool), st.integers(2, topk + pool + 1),
                     st.integers(min(topk + 2 * pool, 48), 48))


def build(config: dict[str, Any], seed: int) -> Any:
    import torch
    import transformers as tf

    text = dict(config)
    tie = text["tie_word_embeddings"]
    cfg = tf.Glm5NextConfig(text_config=text, vision_config=dict(VISION),
                            tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = tf.Glm5NextForConditionalGeneration(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("_hc.scale"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(EMBED_STD * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(STD * torch.randn_like(p))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(BIAS_STD * torch.randn_like(buf))
        if not tie:
            perm = torch.randperm(text["vocab_size"],
                                  generator=torch.Generator().manual_seed(seed))
            emb = model.model.language_model.embed_tokens.weight
            model.lm_head.weight.add_(emb[perm])
    return model.eval()


def _reference(model: Any, prompt: list[int],
               steps: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """transformers with its cache: prompt logits, then `steps` greedy tokens one at a time.

    transformers' cache needs an attention layer: a model of KDA layers only is referenced
    by the full forward of every step instead."""
    import randcfg

    types = model.config.text_config.layer_types
    if "indexed_attention" not in types:
        model.config.text_config.use_cache = False
        try:
            return randcfg.full_forward_reference(model, prompt, steps)
        finally:
            model.config.text_config.use_cache = True

    return randcfg.cached_reference(model, prompt, steps)


def reference(model: Any, prompt: list[int],
              steps: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """_reference on one torch thread (randcfg.on_one_thread)."""
    import randcfg

    return randcfg.on_one_thread(_reference, model, prompt, steps)
