"""Tiny Hugging Face checkpoints written by hand, for the per-architecture converter tests.

A test names each tensor as transformers (or the original release) stores it, paired
with the container name the converter must give it; `write` stores random f32 data
under the HF names, and `check_map` asserts that the module's plan holds every expected
container tensor with that tensor's data, and nothing unexpected. No torch.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from support import write_wordlevel_tokenizer

from warp_providers.convert import registry
from warp_providers.convert.plan import Plan

VOCAB = 32
H = 32  # hidden size


def write(
    d: Path,
    cfg: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    seed: int = 0,
    dtypes: Mapping[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """config.json, one model.safetensors (random f32) and a tokenizer; returns the data."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    header: dict[str, Any] = {}
    blobs, off = [], 0
    for name, a in data.items():
        dt = (dtypes or {}).get(name, "F32")
        raw = a.astype("<i8").tobytes() if dt == "I64" else a.astype("<f4").tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    (d / "config.json").write_text(json.dumps(cfg))
    write_wordlevel_tokenizer(d, VOCAB)
    return data


def load(d: Path) -> Plan:
    """The plan the registry's module for the checkpoint's model_type makes of it."""
    cfg = json.loads((d / "config.json").read_text())
    plan: Plan = registry.module(cfg["model_type"]).load(d, cfg, {})
    return plan


def check_map(
    plan: Plan,
    data: Mapping[str, np.ndarray],
    pairs: Iterable[tuple[str, str]],
    computed: Iterable[str] = (),
) -> None:
    """Every (HF name, container name) pair holds the HF tensor's values; the trunk has
    exactly those names plus `computed` ones (rope tables and other derived tensors)."""
    trunk = {t.name: t for t in plan.trunk}
    want = dict(pairs)
    for hf, cname in want.items():
        assert cname in trunk, f"{hf} -> {cname} missing from the plan"
        t = trunk[cname]
        got = t.rows(0, t.matrix[0])
        np.testing.assert_array_equal(got.reshape(data[hf].shape), data[hf], err_msg=cname)
    assert set(trunk) == set(want.values()) | set(computed), sorted(set(trunk) ^ set(want.values()))


def check_pairs(
    plan: Plan,
    data: Mapping[str, np.ndarray],
    pairs: Iterable[tuple[str, str]],
    layer: int | None = None,
    computed: Iterable[str] = (),
) -> None:
    """Each (stored name, container name) pair holds the stored values (as f32); with
    `layer`, that layer's container tensors are exactly these plus `computed`."""
    trunk = {t.name: t for t in plan.trunk}
    want = dict(pairs)
    for hf, cname in want.items():
        assert cname in trunk, f"{hf} -> {cname} missing from the plan"
        t = trunk[cname]
        got = t.rows(0, t.matrix[0]).reshape(data[hf].shape)
        np.testing.assert_array_equal(got, np.asarray(data[hf], dtype=np.float32), err_msg=cname)
    if layer is not None:
        have = {n for n in trunk if n.startswith(f"blk.{layer}.")}
        assert have == set(want.values()) | set(computed), sorted(have ^ set(want.values()))


def check_experts(
    plan: Plan,
    data: Mapping[str, np.ndarray],
    layer: int,
    per_expert: Mapping[int, tuple[str, str, str]],
) -> None:
    """Expert e of `layer` is gate/up/down = the named HF tensors."""
    (bank,) = [x for x in plan.experts if x.layer == layer]
    assert bank.n_experts == len(per_expert)
    for e, names in per_expert.items():
        for t, hf in zip(bank.expert(e), names):
            np.testing.assert_array_equal(t.rows(0, t.shape[0]), data[hf], err_msg=t.name)


def attention(pre: str, nh: int, nkv: int, hd: int, bias: bool = False) -> dict[str, tuple]:
    """q/k/v/o projections (and biases) of one layer in transformers' spelling."""
    out: dict[str, tuple] = {
        pre + "self_attn.q_proj.weight": (nh * hd, H),
        pre + "self_attn.k_proj.weight": (nkv * hd, H),
        pre + "self_attn.v_proj.weight": (nkv * hd, H),
        pre + "self_attn.o_proj.weight": (H, nh * hd),
    }
    if bias:
        out |= {
            pre + "self_attn.q_proj.bias": (nh * hd,),
            pre + "self_attn.k_proj.bias": (nkv * hd,),
            pre + "self_attn.v_proj.bias": (nkv * hd,),
        }
    return out


def mlp(pre: str, inter: int) -> dict[str, tuple]:
    """A SwiGLU MLP under `pre` (e.g. "model.layers.0.mlp.")."""
    return {
        pre + "gate_proj.weight": (inter, H),
        pre + "up_proj.weight": (inter, H),
        pre + "down_proj.weight": (H, inter),
    }


STANDARD = {  # HF suffix -> container suffix, as FORMAT.md names them
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def standard_pairs(shapes: Mapping[str, tuple]) -> list[tuple[str, str]]:
    """(HF name, container name) of every non-expert tensor named as STANDARD says."""
    out = []
    for name in shapes:
        if name in STANDARD:
            out.append((name, STANDARD[name]))
            continue
        if name.startswith("model.layers.") and ".experts." not in name:
            i, rest = name[len("model.layers.") :].split(".", 1)
            out.append((name, f"blk.{i}.{STANDARD[rest]}"))
    return out


def top(tied: bool = False) -> dict[str, tuple]:
    """Embedding, final norm and (untied) LM head."""
    out: dict[str, tuple] = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,)}
    if not tied:
        out["lm_head.weight"] = (VOCAB, H)
    return out


def base_config(model_type: str, **kw: Any) -> dict[str, Any]:
    """The keys every family shares, tiny."""
    return {
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": H,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **kw,
    }


def norms(pre: str) -> dict[str, tuple]:
    """The two layer norms."""
    return {pre + "input_layernorm.weight": (H,), pre + "post_attention_layernorm.weight": (H,)}


def prod(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
