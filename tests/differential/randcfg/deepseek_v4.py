"""DeepSeek V4 / V4.1 Flash (deepseek_v4) configs: every knob of DeepseekV4Config.

Attention schedules (sliding-window only, compressed sparse, heavily compressed) with
their compression rates and window, head count and dim with a partial rotary factor
(rope dims 0 included), q LoRA rank, the grouped output projection (o_groups,
o_lora_rank), the lightning indexer (heads, head dim, top-k), hyper-connection streams,
Sinkhorn iterations and eps, MoE schedules (hash-routed and top-k layers in any order),
expert count and top-k, shared experts, routed_scaling_factor, the SwiGLU clamp, both
rope thetas and tied / untied embeddings. Hash tables (`tid2eid`) are drawn with and
without an expert repeated within a token's row (by the seed's parity; transformers then adds that expert's
output once per occurrence). `num_key_value_heads` is 1 (the one shared key/value head
that the compressors broadcast).

Draws are decisive as in a trained model: a large selection bias on the top-k routers,
an output head that adds each token's successor embedding, and an indexer that selects
with 12 or 16 heads (its score sums w_h * relu(q_h . k) with w_h of either sign: with few
heads an entry often scores exactly 0 and a top-k boundary falls inside a tie of zeros,
which transformers' topk breaks arbitrarily); fewer heads come with a top-k that keeps
every entry. The reference is transformers decoding with its cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

CONFIG_CLASS = "DeepseekV4Config"
STD = 0.1
BIAS_STD = 2.0
KINDS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    heads = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([16, 32]))
    # a rope dim of 0 (partial_rotary_factor 0) is refused by the converter by name
    rope = draw(st.sampled_from([4, 8, 16]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4) if (heads * head_dim) % g == 0]))
    experts = draw(st.integers(2, 12))
    csa = draw(st.sampled_from([2, 4]))
    hca = draw(st.sampled_from([4, 8]))
    index_heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16]))
    topk = draw(st.integers(1, 6)) if index_heads >= 12 else 64
    return dict(
        vocab_size=272, hidden_size=draw(st.sampled_from([32, 64])),
        num_hidden_layers=n, num_attention_heads=heads, num_key_value_heads=1,
        head_dim=head_dim, partial_rotary_factor=rope / head_dim,
        q_lora_rank=draw(st.sampled_from([16, 32])),
        o_groups=groups, o_lora_rank=draw(st.sampled_from([8, 16])),
        moe_intermediate_size=draw(st.sampled_from([16, 32])),
        n_routed_experts=experts,
        num_experts_per_tok=draw(st.integers(1, min(experts, 4))),
        n_shared_experts=draw(st.integers(0, 2)),  # transformers' shared MLP ignores it
        routed_scaling_factor=draw(st.sampled_from([1.0, 1.5, 2.5])),
        scoring_func="sqrtsoftplus",
        layer_types=draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n)),
        mlp_layer_types=draw(st.lists(st.sampled_from(["hash_moe", "moe"]), min_size=n,
                                      max_size=n)),
        compress_rates={"compressed_sparse_attention": csa,
                        "heavily_compressed_attention": hca},
        # window 1: transformers' cached decode disagrees with its own full forward (and
        # its compressed layers fail to run), so the window is drawn from 2
        sliding_window=draw(st.integers(2, 16)),
        index_n_heads=index_heads,
        index_head_dim=draw(st.sampled_from([d for d in (8, 16, 32) if d >= rope])),
        index_topk=topk,
        hc_mult=draw(st.integers(1, 4)), hc_sinkhorn_iters=draw(st.integers(1, 20)),
        hc_eps=draw(st.sampled_from([1e-6, 1e-3])),
        swiglu_limit=draw(st.sampled_from([0.5, 1.0, 10.0])),
        rope_theta=draw(st.sampled_from([10000.0, 50000.0])),
        compress_rope_theta=draw(st.sampled_from([160000.0, 40000.0])),
        rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
        tie_word_embeddings=draw(st.booleans()),
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    """Shorter than the window and the first compression block, and past all of them."""
    rates = config["compress_rates"]
    edge = max(config["sliding_window"], *rates.values())
    return st.one_of(st.integers(1, edge), st.integers(edge, 48))


def build(config: dict[str, Any], seed: int) -> Any:
    import torch
    import transformers as tf

    cfg = getattr(tf, CONFIG_CLASS)(**config)
    repeats = seed % 2 == 0  # hash rows: any experts (repeats likely), or distinct ones
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:  # sinks, hyper-connection bases and scales
                p.copy_(0.1 * torch.randn_like(p))
            else:  # incl. position biases and hyper-connection projections
                p.copy_(STD * torch.randn_like(p))
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):
                if repeats:
                    buf.copy_(torch.randint(0, E, buf.shape, generator=gen))
                else:
                    rows = [torch.randperm(E, generator=gen)[:K] for _ in range(buf.shape[0])]
                    buf.copy_(torch.stack(rows))
            elif name.endswith("e_score_correction_bias"):
                buf.copy_(BIAS_STD * torch.randn_like(buf))
        if not cfg.tie_word_embeddings:
            perm = torch.randperm(cfg.vocab_size, generator=gen)
            model.lm_head.weight.add_(model.model.embed_tokens.weight[perm])
    return model.eval()


def _reference(model: Any, prompt: list[int],
               steps: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """transformers with its cache: prompt logits, then `steps` greedy tokens one at a time."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        prompt_logits = out.logits[0].float().numpy()
        tokens, rows = [], []
        last = prompt_logits[-1]
        for _ in range(steps):
            tok = int(last.argmax())
            tokens.append(tok)
            o = model(torch.tensor([[tok]]), cache=cache, use_cache=True)
            last = o.logits[0, -1].float().numpy()
            rows.append(last)
    return prompt_logits, tokens, np.stack(rows)


def reference(model: Any, prompt: list[int],
              steps: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """_reference on one torch thread: these models are many tiny matmuls, which a second
    thread only slows down (by 50x on a loaded machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference(model, prompt, steps)
    finally:
        torch.set_num_threads(threads)
