"""arch/kimi_k3.py: detection, the K3 hparams, MXFP4 experts dequantized exactly, and the
damaged inputs it refuses naming the tensor (on warp_providers.synth.kimi_k3 checkpoints)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from warp_providers.convert import ConvertError, convert, registry
from warp_providers.convert.hf import load_hf
from warp_providers.convert.quant import mxfp4_unpack
from warp_providers.convert.writer import shipped_experts
from warp_providers.synth.kimi_k3 import KimiK3Shape, make_kimi_k3_checkpoint, write_safetensors

_DT = {"BF16": np.uint16, "F32": np.float32, "U8": np.uint8}


def _read(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, e in head.items():
        if k == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], _DT[e["dtype"]]).reshape(e["shape"])
        out[k] = (e["dtype"], arr.copy())
    return out


def _edit(src: Path, shard: str, fn) -> None:
    t = _read(src / shard)
    fn(t)
    write_safetensors(src / shard, t)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard}
    index["weight_map"].update({k: shard for k in t})
    (src / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    return make_kimi_k3_checkpoint(tmp_path / "k3", KimiK3Shape(num_hidden_layers=4))


def test_manifest_carries_the_k3_keys_and_latent_experts(ckpt: Path, tmp_path: Path) -> None:
    out = convert(ckpt, tmp_path / "m.warp", experts="f32", trunk="f32")
    m = json.loads((out / "manifest.json").read_text())
    assert m["model_type"] == "kimi_k3"
    hp = m["hparams"]
    assert hp["situ_beta"] == 4.0 and hp["situ_linear_beta"] == 25.0
    assert hp["expert_hidden_size"] == 32 and hp["latent_moe_norm"] is True
    assert hp["attn_res_block_size"] == 2 and hp["mla_output_gate"] is True
    assert hp["kda_full_gate"] is True and hp["kda_lower_bound"] == -5.0
    assert hp["attn_kinds"] == ["kda", "kda", "kda", "full"]
    bank = m["experts"][0]
    assert [t["shape"] for t in bank["tensors"]] == [[32, 32], [32, 32], [32, 32]]


def test_mxfp4_experts_are_dequantized_exactly(ckpt: Path) -> None:
    plan = load_hf(ckpt)
    layer = plan.experts[0]
    t = _read(ckpt / f"model-layer-{layer.layer:03d}.safetensors")
    stem = f"language_model.model.layers.{layer.layer}.block_sparse_moe.experts.3.w2."
    packed, scale = t[stem + "weight_packed"][1], t[stem + "weight_scale"][1]
    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    want = np.zeros((packed.shape[0], packed.shape[1] * 2))
    for r, c in np.ndindex(*want.shape):
        code = int(packed[r, c // 2]) >> (4 * (c % 2)) & 0xF  # low nibble first
        v = table[code & 7] * (-1 if code & 8 else 1)
        want[r, c] = v * 2.0 ** (int(scale[r, c // 32]) - 127)
    down = layer.expert(3)[2]
    assert np.array_equal(down.rows(0, want.shape[0]), want.astype(np.float32))


def test_mxfp4_experts_offer_their_shipped_bytes(ckpt: Path) -> None:
    """The experts offer the container's mxfp4 bytes (kept as shipped by default): their
    codes and scales are the checkpoint's weight_packed and weight_scale."""
    plan = load_hf(ckpt)
    assert shipped_experts(plan) == "mxfp4"
    layer = plan.experts[0]
    t = _read(ckpt / f"model-layer-{layer.layer:03d}.safetensors")
    for e in (0, 3):
        stem = f"language_model.model.layers.{layer.layer}.block_sparse_moe.experts.{e}."
        for src, w in zip(layer.expert(e), ("w1", "w3", "w2")):
            assert src.raw is not None and src.raw_dtype == "mxfp4"
            packed, scales = mxfp4_unpack(src.raw(), *src.matrix)
            assert np.array_equal(packed, t[stem + w + ".weight_packed"][1])
            assert np.array_equal(scales, t[stem + w + ".weight_scale"][1])


@pytest.mark.parametrize("outer", ["kimi_k3", "kimi_linear", "kimi_k3_vl"])
def test_detected_by_the_outer_architecture_whatever_the_model_type(
        tmp_path: Path, outer: str) -> None:
    src = make_kimi_k3_checkpoint(tmp_path / "k3", KimiK3Shape(num_hidden_layers=4),
                                  outer_model_type=outer)
    assert registry.detect(json.loads((src / "config.json").read_text())) == "kimi_k3"
    assert load_hf(src).model_type == "kimi_k3"


def test_k3_architecture_without_k3_keys_is_refused(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    tc = cfg["text_config"]
    for k in ("routed_expert_hidden_size", "latent_moe_use_norm", "attn_res_block_size",
              "activation_situ_beta", "activation_situ_linear_beta", "mla_use_output_gate"):
        tc[k] = None if k != "latent_moe_use_norm" else False
    tc["linear_attn_config"].pop("use_full_rank_gate")
    tc["linear_attn_config"].pop("gate_lower_bound")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="none of the K3 keys"):
        load_hf(ckpt)


def test_k3_keys_in_a_kimi_linear_config_are_refused(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(cfg["text_config"]))  # inner config alone
    with pytest.raises(ConvertError, match="Kimi K3 keys routed_expert_hidden_size"):
        load_hf(ckpt)


def test_missing_attn_res_tensor_is_refused_naming_it(ckpt: Path) -> None:
    name = "language_model.model.layers.2.mlp_res_proj.weight"
    _edit(ckpt, "model-layer-002.safetensors", lambda t: t.pop(name))
    with pytest.raises(ConvertError, match=name.replace(".", r"\.")):
        load_hf(ckpt)


def test_bad_mxfp4_scale_shape_is_refused_naming_it(ckpt: Path) -> None:
    name = "language_model.model.layers.1.block_sparse_moe.experts.5.w3.weight_scale"

    def cut(t):
        dt, a = t[name]
        t[name] = (dt, a[:, :0].copy() if a.shape[1] == 1 else a[:, :1].copy())

    _edit(ckpt, "model-layer-001.safetensors", cut)
    with pytest.raises(ConvertError, match=name.replace(".", r"\.")):
        load_hf(ckpt)


@pytest.mark.parametrize("experts", ["f32", None])
def test_nan_mxfp4_scale_is_refused_naming_it(ckpt: Path, tmp_path: Path, experts) -> None:
    name = "language_model.model.layers.3.block_sparse_moe.experts.0.w1.weight_scale"
    _edit(ckpt, "model-layer-003.safetensors", lambda t: t[name][1].__setitem__((0, 0), 255))
    with pytest.raises(ConvertError, match=name.replace(".", r"\.") + ".*NaN"):
        convert(ckpt, tmp_path / "m.warp", experts=experts, trunk="f32")


def test_padded_a_log_shorter_than_the_heads_is_refused(ckpt: Path) -> None:
    name = "language_model.model.layers.0.self_attn.A_log"
    _edit(ckpt, "model-layer-000.safetensors",
          lambda t: t.__setitem__(name, ("F32", t[name][1].reshape(-1)[:1].copy())))
    with pytest.raises(ConvertError, match=name.replace(".", r"\.") + ".*at least 2"):
        load_hf(ckpt)


def test_a_kimi_linear_config_is_still_read_as_kimi_linear() -> None:
    cfg = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear"}
    assert registry.detect(cfg) == "kimi_linear"
    assert registry.detect({"model_type": 7}) == "7"  # refused later, named as given


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    shape = KimiK3Shape(num_hidden_layers=4)
    a = make_kimi_k3_checkpoint(tmp_path / "a", shape, seed=3)
    b = make_kimi_k3_checkpoint(tmp_path / "b", shape, seed=3)
    c = make_kimi_k3_checkpoint(tmp_path / "c", shape, seed=4)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "model-layer-001.safetensors").read_bytes() != \
        (c / "model-layer-001.safetensors").read_bytes()
