"""gpt_oss: engine vs transformers on a tiny random model (no download).

The tiny model keeps gpt_oss's distinctive features: sinks, a sliding window (8) shorter
than the prompt (32) on alternate layers, q/k/v/o biases, router bias, top-k softmax,
biased experts with the clamped SwiGLU (limit lowered so the clamp fires), YaRN; its MXFP4
source form is checked too. F32 max |dlogit| <= 1e-4 over the prompt and 16 decode steps;
Q8_0 the same greedy continuation and mean KL <= 1e-3; expert streaming at the floor
bit-identical to all-resident; state save/load round-trips and continues identically;
plan_memory's kv_bytes equals a hand computation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oracle_util import (
    COMMON,
    PROMPT,
    STD,
    assert_matches_reference,
    build,
    convert_to,
    converted_suite,
    greedy_ref,
    logits,
    mean_kl,
    save,
    to_mxfp4,
)


def _gpt_oss_config(**over: Any) -> Any:
    import transformers as tf

    kw = dict(COMMON)
    kw.update(
        head_dim=16, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        swiglu_limit=1.0, max_position_embeddings=512,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 128},
    )
    kw.update(over)
    return tf.GptOssConfig(**kw)


CONFIGS = {"gpt_oss": _gpt_oss_config}
ROUTING_BIAS_STD = 0.1


def _build(seed: int = 0) -> Any:
    return build(_gpt_oss_config(), seed, std=STD, routing_bias_std=ROUTING_BIAS_STD)


def _hand_kv_bytes(hp: dict[str, Any], ctx: int) -> dict[str, int]:
    """K and V rows of every position, every layer."""
    return {"kv": 2 * hp["n_layers"] * ctx * hp["n_kv_heads"] * hp["head_dim"] * 4}


(models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
 test_q8_0_container_is_exact_on_its_own_weights, test_streaming_at_floor_bit_identical,
 test_state_roundtrip_continues_identically, test_plan_state_bytes,
 ) = converted_suite(CONFIGS, ROUTING_BIAS_STD, _hand_kv_bytes)


def _mxfp4_checkpoint(tmp_path: Any) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """(model holding the dequantized weights, its MXFP4 checkpoint directory, the shipped
    ``*_blocks``/``*_scales`` arrays by tensor name), the dequantizer checked against
    transformers' own."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from warp_providers.convert.arch.gpt_oss import mxfp4_to_f32

    model = _build(seed=1)
    hf_dir = save(model, tmp_path / "hf")
    sd = load_file(str(hf_dir / "model.safetensors"))
    shipped: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            pre = f"model.layers.{i}.mlp.experts."
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(ex, name)  # [E, in, out]; the checkpoint is [E, out, in]
                w = p.detach().numpy().transpose(0, 2, 1)
                blocks, scales, deq = to_mxfp4(w)
                ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                 dtype=torch.float32)
                np.testing.assert_array_equal(ref.numpy(), deq.transpose(0, 2, 1))
                np.testing.assert_array_equal(mxfp4_to_f32(blocks, scales), deq)
                p.copy_(torch.from_numpy(deq.transpose(0, 2, 1).copy()))
                del sd[pre + name]
                sd[pre + name + "_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
                sd[pre + name + "_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
                shipped[pre + name + "_blocks"], shipped[pre + name + "_scales"] = blocks, scales
    save_file(sd, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    return model, hf_dir, shipped


@pytest.mark.oracle
def test_gpt_oss_mxfp4_source(oracle_env, tmp_path):
    """An MXFP4 checkpoint (the original *_blocks/*_scales layout) re-quantized on request
    converts exactly: the engine on f32 experts matches transformers holding the
    dequantized weights; q4_0 experts stay close."""
    from warp_providers import Engine

    model, hf_dir, _ = _mxfp4_checkpoint(tmp_path)
    out = convert_to(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    ref_all = logits(model, PROMPT).numpy()
    ref_tokens, ref_steps = greedy_ref(model, PROMPT, 16)
    with Engine.open(out, threads=2) as eng:
        assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps, "gpt_oss mxfp4")
    q4 = convert_to(hf_dir, tmp_path / "q4.warp", experts="q4_0", trunk="q8_0")
    with Engine.open(q4, threads=2) as eng:
        assert mean_kl(ref_all, eng.eval(PROMPT, all_logits=True)) <= 3e-2


@pytest.mark.oracle
def test_gpt_oss_mxfp4_experts_stored_as_shipped(oracle_env, tmp_path):
    """By default MXFP4 experts are stored as shipped: every record's codes and scales,
    decoded from the container's blocks, equal the checkpoint's (gate = even rows of
    gate_up, up = odd), and the engine on them matches transformers holding the exactly
    dequantized weights (max |dlogit| <= 1e-4, prompt and 16 decode steps)."""
    from oracle_util import manifest, record_tensors

    from warp_providers import Engine
    from warp_providers.convert.quant import mxfp4_unpack

    model, hf_dir, shipped = _mxfp4_checkpoint(tmp_path)
    out = convert_to(hf_dir, tmp_path / "m.warp", trunk="f32")
    m = manifest(out)
    assert m["quantization"]["experts"] == "mxfp4"
    for bank in m["experts"]:
        pre = f"model.layers.{bank['layer']}.mlp.experts."
        shapes = {t["name"]: t["shape"] for t in bank["tensors"]}
        assert {t["dtype"] for t in bank["tensors"]} == {"mxfp4"}
        for e in range(bank["n_experts"]):
            rec = record_tensors(out, bank, e)
            for name, src, rows in (("gate", "gate_up_proj", slice(0, None, 2)),
                                    ("up", "gate_up_proj", slice(1, None, 2)),
                                    ("down", "down_proj", slice(None))):
                r, c = shapes[name]
                packed, scales = mxfp4_unpack(np.frombuffer(rec[name], np.uint8), r, c)
                blocks = shipped[pre + src + "_blocks"][e][rows]
                np.testing.assert_array_equal(packed, blocks.reshape(r, c // 2))
                np.testing.assert_array_equal(scales, shipped[pre + src + "_scales"][e][rows])
    ref_all = logits(model, PROMPT).numpy()
    ref_tokens, ref_steps = greedy_ref(model, PROMPT, 16)
    with Engine.open(out, threads=2) as eng:
        assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps,
                                 "gpt_oss mxfp4 as shipped")


@pytest.mark.oracle
@pytest.mark.parametrize("experts", [None, "q4_0"])
def test_gpt_oss_mxfp4_nan_scale_refused_by_name(oracle_env, tmp_path, experts):
    """A scale byte 255 (NaN in E8M0) is refused at convert, naming the tensor, whether
    the experts are kept as shipped or re-quantized."""
    from safetensors.numpy import load_file, save_file

    from warp_providers.convert import ConvertError

    _, hf_dir, _ = _mxfp4_checkpoint(tmp_path)
    st = hf_dir / "model.safetensors"
    sd = load_file(str(st))
    bad = "model.layers.1.mlp.experts.down_proj_scales"
    sd[bad] = sd[bad].copy()
    sd[bad][0, 3, 1] = 255
    save_file(sd, str(st), metadata={"format": "pt"})
    kw = {"experts": experts} if experts else {}
    with pytest.raises(ConvertError, match=f"{bad}.*scale byte 255"):
        convert_to(hf_dir, tmp_path / "bad.warp", trunk="f32", **kw)
    assert not (tmp_path / "bad.warp").exists()
