"""The generated DeepSeek-V3 checkpoint (benchmarks' model) is what transformers reads.

A tiny shape of `make_deepseek_v3_checkpoint` loads in transformers as DeepseekV3 with
sigmoid, bias-corrected grouped routing, and the engine's F32 conversion of it gives the
same logits (the weights are float16 values, exact in F32). Kimi-K2's config spells the
same architecture ``kimi_k2``: it converts to the very same container.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from oracle_util import convert_to
from support import has_module, requires

from warp_providers.synth import DeepseekV3Shape

PROMPT = [(13 * i + 7) % 200 + 3 for i in range(24)]
SHAPE = DeepseekV3Shape(
    hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=96,
    n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
    moe_intermediate_size=32, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


@pytest.mark.oracle
def test_generated_deepseek_v3_matches_transformers(tmp_path):
    requires(has_module("torch") and has_module("transformers"),
             "torch==2.13.0 and transformers (the oracle)")
    import torch
    import transformers as tf

    from warp_providers import Engine
    from warp_providers.synth import make_deepseek_v3_checkpoint

    hf_dir = make_deepseek_v3_checkpoint(tmp_path / "hf", SHAPE, seed=1)
    model = tf.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert model.config.scoring_func == "sigmoid" and model.config.n_group == 4
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    assert float(bias.abs().max()) > 0  # the selection-only bias was loaded, not zeros
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT])).logits[0].float().numpy()
    out = convert_to(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    with Engine.open(out, threads=2) as eng:
        assert eng.info()["model_type"] == "deepseek_v3"
        got = eng.eval(PROMPT, all_logits=True)
    assert np.abs(got - ref).max() <= 1e-4


def test_kimi_k2_converts_as_deepseek_v3(tmp_path):
    from warp_providers import Engine
    from warp_providers.synth import make_deepseek_v3_checkpoint

    dsv3 = make_deepseek_v3_checkpoint(tmp_path / "dsv3", SHAPE, seed=2)
    kimi = tmp_path / "kimi"
    shutil.copytree(dsv3, kimi)
    cfg = json.loads((kimi / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v3"
    cfg["model_type"] = "kimi_k2"  # what Kimi-K2's config.json says
    (kimi / "config.json").write_text(json.dumps(cfg))
    a = convert_to(dsv3, tmp_path / "a.warp")
    b = convert_to(kimi, tmp_path / "b.warp")
    ma = json.loads((a / "manifest.json").read_text())
    mb = json.loads((b / "manifest.json").read_text())
    assert mb["model_type"] == "deepseek_v3"  # a type the engine runs
    assert mb["source_config"]["model_type"] == "kimi_k2"  # the source config verbatim
    del ma["source_config"], mb["source_config"]
    assert ma == mb
    for f in sorted(p.name for p in a.iterdir() if p.name != "manifest.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    with Engine.open(b, threads=1) as eng:
        assert eng.info()["model_type"] == "deepseek_v3"
        assert np.isfinite(eng.eval(PROMPT)).all()
