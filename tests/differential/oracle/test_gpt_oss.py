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


@pytest.mark.oracle
def test_gpt_oss_mxfp4_source(oracle_env, tmp_path):
    """An MXFP4 checkpoint (the original *_blocks/*_scales layout) converts exactly: the
    engine matches transformers holding the dequantized weights, and the dequantizer
    agrees with transformers' own."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from warp_providers import Engine
    from warp_providers.convert.arch.gpt_oss import mxfp4_to_f32

    model = _build(seed=1)
    hf_dir = save(model, tmp_path / "hf")
    sd = load_file(str(hf_dir / "model.safetensors"))
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
    save_file(sd, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    out = convert_to(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    ref_all = logits(model, PROMPT).numpy()
    ref_tokens, ref_steps = greedy_ref(model, PROMPT, 16)
    with Engine.open(out, threads=2) as eng:
        assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps, "gpt_oss mxfp4")
    q4 = convert_to(hf_dir, tmp_path / "q4.warp", experts="q4_0", trunk="q8_0")
    with Engine.open(q4, threads=2) as eng:
        assert mean_kl(ref_all, eng.eval(PROMPT, all_logits=True)) <= 3e-2
