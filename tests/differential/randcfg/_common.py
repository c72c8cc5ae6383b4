"""Draws shared by the strategy modules of the Llama-shaped families.

`heads` draws an attention shape (MHA, GQA and MQA ratios, with or without an explicit
head_dim), `rope` a `rope_parameters` of every rope type the converter supports,
`window_prompt_lens` prompt lengths on both sides of a sliding window. All sizes stay
tiny: vocabulary 272 (the test tokenizer has 265 ids), hidden <= 128, <= 16 heads.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

VOCAB = 272
IDS: dict[str, Any] = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
HIDDEN = (16, 32, 48, 64, 96, 128)
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def heads(draw: Any, *, explicit_head_dim: bool) -> dict[str, Any]:
    """num_attention_heads, num_key_value_heads, hidden_size and maybe head_dim.

    The hidden size is always a multiple of the head count (LlamaConfig insists even
    when head_dim is given); head_dim is drawn apart from hidden / heads when allowed.
    """
    kv = draw(st.sampled_from([1, 2, 4]))
    n = kv * draw(st.sampled_from([1, 2, 4]))  # 1: MHA, kv == 1 < n: MQA, else GQA
    hidden = draw(st.sampled_from([h for h in HIDDEN if h % n == 0 and h // n >= 4]
                                  or [4 * n]))
    out: dict[str, Any] = dict(num_attention_heads=n, num_key_value_heads=kv,
                               hidden_size=hidden)
    if explicit_head_dim and draw(st.booleans()):
        out["head_dim"] = draw(st.sampled_from([4, 8, 16, 32]))
    return out


def rope(draw: Any, types: tuple[str, ...] = ROPE_TYPES) -> dict[str, Any]:
    """A rope_parameters dict of one of `types`, with that type's parameters drawn."""
    kind = draw(st.sampled_from(types))
    p: dict[str, Any] = {"rope_type": kind,
                         "rope_theta": draw(st.sampled_from([100.0, 10000.0, 5e5, 1e6]))}
    if kind in ("linear", "dynamic"):
        p["factor"] = draw(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
    elif kind == "llama3":
        low = draw(st.sampled_from([1.0, 2.0]))
        p.update(factor=draw(st.sampled_from([2.0, 8.0, 32.0])), low_freq_factor=low,
                 high_freq_factor=low * draw(st.sampled_from([2.0, 4.0])),
                 original_max_position_embeddings=draw(st.sampled_from([16, 64, 256])))
    elif kind == "yarn":
        p.update(factor=draw(st.sampled_from([1.0, 2.0, 4.0, 32.0])),
                 original_max_position_embeddings=draw(st.sampled_from([16, 64, 128])),
                 beta_fast=draw(st.sampled_from([8.0, 32.0])),
                 beta_slow=draw(st.sampled_from([1.0, 2.0])),
                 truncate=draw(st.booleans()))
        extra = draw(st.sampled_from(["none", "attention_factor", "mscale"]))
        if extra == "attention_factor":
            p["attention_factor"] = draw(st.sampled_from([0.5, 1.0, 1.3]))
        elif extra == "mscale":
            p.update(mscale=draw(st.sampled_from([0.707, 1.0])),
                     mscale_all_dim=draw(st.sampled_from([0.5, 1.0])))
    return p


def common(draw: Any, *, act: bool = True) -> dict[str, Any]:
    """Norm eps, tied embeddings, context length, token ids and (when `act`) hidden_act:
    now and then one other than silu, which the converter refuses (`refusal`)."""
    out = {"hidden_act": draw(st.sampled_from(["silu"] * 7 + ["gelu"]))} if act else {}
    return dict(
        out, **IDS, rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5, 1e-2])),
        tie_word_embeddings=draw(st.booleans()),
        # >= 48 prompt + 16 decode positions: the engine's context is this long
        max_position_embeddings=draw(st.sampled_from([64, 96, 512])),
    )


def refusal(config: dict[str, Any]) -> str | None:
    """The key the engine's refusal names: hidden_act other than silu (the SwiGLU of
    every family here), out of scope."""
    return "hidden_act" if config.get("hidden_act", "silu") != "silu" else None


def window_prompt_lens(window: int | None) -> st.SearchStrategy[int]:
    """Prompt lengths within, at and past a sliding window (2..48 without one)."""
    if not window:
        return st.integers(2, 48)
    at = max(2, min(window, 48))
    return st.one_of(st.integers(2, at), st.integers(min(window + 1, 48), 48),
                     st.sampled_from([at]))
