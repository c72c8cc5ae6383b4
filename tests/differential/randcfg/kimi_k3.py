"""Kimi K3 configs: every knob of `warp_providers.synth.kimi_k3.KimiK3Shape`.

Covers the per-layer attention order (at least one KDA and one MLA layer, any order),
the Attention Residuals block size (0: plain residuals; dividing the layer count or
not), the latent MoE (routed_expert_hidden_size 0: experts on the hidden state) with
latent_moe_use_norm on and off, the MLA output gate on and off, q_lora_rank (0: a
full-rank q_proj), kv_lora_rank and the nope / rope / v head dims, head counts, KDA heads,
head dim, short conv and full-rank or low-rank output gate, expert counts, top-k, shared
experts, dense first layers, routed_scaling_factor, the SiTU up-projection bound (0:
unbounded) and rms_norm_eps. Prompts land on both sides of the reference's 64-token KDA
chunk.

There is no transformers model of K3: `checkpoint` writes the released layout directly
(MXFP4 experts, bf16 trunk) and the reference is `oracle/kimi_k3_ref.py` on that
checkpoint. Refused by name (`refusal`): a latent width or expert width that is not a
multiple of 32 (MXFP4 rows are 32-blocks), and the MLA output gate with v_head_dim above
the q head dim (qk_nope + qk_rope), which the engine's gate buffer does not hold.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

EXAMPLES = 8  # each draw is a full-forward reference per step: fewer than the others
KDA_CHUNK = 64  # the reference's chunk_kimi_delta_attention chunk size


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(2, 6))
    kinds = draw(st.lists(st.sampled_from("KM"), min_size=layers, max_size=layers))
    if "K" not in kinds or "M" not in kinds:  # at least one of each, at a drawn place
        at = draw(st.integers(0, layers - 1))
        kinds[at] = "M" if "M" not in kinds else "K"
        if "K" not in kinds:
            kinds[(at + 1) % layers] = "K"
    hidden = draw(st.sampled_from([32, 64]))
    experts = draw(st.sampled_from([4, 8, 16]))
    return dict(
        hidden_size=hidden, num_hidden_layers=layers, layer_pattern="".join(kinds),
        first_k_dense_replace=draw(st.integers(0, 2)),
        intermediate_size=draw(st.sampled_from([32, 64, 96])),
        moe_intermediate_size=draw(st.sampled_from([32, 64] * 5 + [48])),
        num_experts=experts, num_experts_per_token=draw(st.integers(1, min(experts, 6))),
        num_shared_experts=draw(st.integers(1, 2)),
        routed_expert_hidden_size=draw(st.sampled_from([0, 32, 32, hidden, hidden, 48])),
        latent_moe_use_norm=draw(st.booleans()),
        routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
        num_attention_heads=draw(st.sampled_from([1, 2, 4])),
        q_lora_rank=draw(st.sampled_from([0, 16, 32])),
        kv_lora_rank=draw(st.sampled_from([8, 16, 32])),
        qk_nope_head_dim=draw(st.sampled_from([8, 16])),
        qk_rope_head_dim=draw(st.sampled_from([4, 8])),
        v_head_dim=draw(st.sampled_from([8, 16, 16, 32])),
        mla_use_output_gate=draw(st.booleans()),
        kda_num_heads=draw(st.sampled_from([1, 2, 3])),
        kda_head_dim=draw(st.sampled_from([16, 32])),
        short_conv_kernel_size=draw(st.sampled_from([2, 3, 4])),
        use_full_rank_gate=draw(st.booleans()),
        attn_res_block_size=draw(st.sampled_from([0, 1, 2, 3, 4, 5, 7])),
        activation_situ_linear_beta=draw(st.sampled_from([0.0, 25.0])),
        rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
        vocab_size=draw(st.sampled_from([0, 0, 640])),  # padded past the tokenizer
    )


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(2, 24), st.integers(KDA_CHUNK - 8, KDA_CHUNK + 8))


def refusal(config: dict[str, Any]) -> str | None:
    latent = config["routed_expert_hidden_size"] or config["hidden_size"]
    if latent % 32 or config["moe_intermediate_size"] % 32:
        return "routed_expert_hidden_size"
    if config["mla_use_output_gate"] and \
            config["v_head_dim"] > config["qk_nope_head_dim"] + config["qk_rope_head_dim"]:
        return "mla_output_gate"
    return None


def _reference_module() -> Any:
    path = Path(__file__).resolve().parent.parent / "oracle" / "kimi_k3_ref.py"
    spec = importlib.util.spec_from_file_location("kimi_k3_ref", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def checkpoint(config: dict[str, Any], seed: int, out: Path) -> tuple[Any, Path, int]:
    """The released-layout checkpoint of the draw at `out`, its reference and vocab size."""
    from warp_providers.synth.kimi_k3 import KimiK3Shape, make_kimi_k3_checkpoint

    names = {f.name for f in dataclasses.fields(KimiK3Shape)}
    src = make_kimi_k3_checkpoint(out, KimiK3Shape(**{k: v for k, v in config.items()
                                                      if k in names}), seed)
    ref = _reference_module().KimiK3Reference(src)
    return ref, src, int(ref.cfg["vocab_size"])


def reference(model: Any, prompt: list[int], steps: int) -> Any:
    """Prompt logits, then `steps` greedy tokens, each step's logits from a full forward."""
    import numpy as np

    prompt_logits = model.logits(list(prompt))
    ids, tokens, rows, last = list(prompt), [], [], prompt_logits[-1]
    for _ in range(steps):
        tok = int(last.argmax())
        tokens.append(tok)
        ids.append(tok)
        last = model.logits(ids)[-1]
        rows.append(last)
    return prompt_logits, tokens, np.stack(rows)
