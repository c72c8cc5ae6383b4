"""The generated glm5_next checkpoint (GLM-5.3-Flash benchmarks' model) is what transformers reads.

A tiny shape of `make_glm5_next_checkpoint` loads in transformers (the multimodal
Glm5NextForConditionalGeneration: transformers has no causal-LM class for the text model)
with every text tensor from the file, in the release's spelling, and has every layer kind:
KDA linear attention, MLA with its own DSA indexer and one sharing that selection, a dense
first MLP, grouped sigmoid-routed MoE with a selection bias and a shared expert, and
hyper-connection streams. The engine's F32 conversion of it gives the same logits over a
32-token prompt (the weights are float16 values, exact in F32).
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle_util import convert_to
from support import has_module, requires, tiny_glm5_next_shape

PROMPT = [(13 * i + 7) % 200 + 3 for i in range(32)]


@pytest.mark.oracle
def test_generated_glm5_next_matches_transformers(tmp_path):
    requires(has_module("torch") and has_module("transformers"),
             "torch==2.13.0 and transformers (the oracle)")
    import torch
    import transformers as tf

    from warp_providers import Engine
    from warp_providers.synth import make_glm5_next_checkpoint

    shape = tiny_glm5_next_shape()
    hf_dir = make_glm5_next_checkpoint(tmp_path / "hf", shape, seed=1)
    model, info = tf.AutoModelForImageTextToText.from_pretrained(
        hf_dir, dtype=torch.float32, output_loading_info=True)
    model.eval()
    # every text-model tensor came from the file (only the tiny vision tower is initialised)
    assert not [k for k in info["missing_keys"] if not k.startswith("model.visual.")]
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    tc = model.config.text_config
    assert tc.layer_types == ["linear_attention", "indexed_attention", "indexed_attention",
                              "linear_attention", "indexed_attention"]
    assert tc.indexer_types[1:3] == ["full", "shared"] and tc.indexer_types[4] == "full"
    assert tc.mlp_layer_types == ["dense", "sparse", "sparse", "sparse", "sparse"]
    assert tc.hc_mult == 4 and tc.n_group == 2 and tc.qk_rope_head_dim == 0
    layers = model.model.language_model.layers
    assert type(layers[0].self_attn).__name__ == "Glm5NextTextLinearAttention"
    assert layers[1].self_attn.indexer is not None and layers[2].self_attn.indexer is None
    assert type(layers[0].mlp).__name__ == "Glm5NextTextMLP"
    assert type(layers[1].mlp).__name__ == "Glm5NextTextMoE"
    with torch.no_grad():
        assert float(layers[1].mlp.gate.e_score_correction_bias.abs().max()) > 0  # loaded
        assert float(layers[0].self_attn.conv1d.weight.abs().min()) > 0  # 3 convs fused
        assert float(layers[3].attn_hc.fn.abs().max()) > 0
    # the indexer really drops keys on this prompt (2 pools of 4 keys plus the tail)
    seen: list = []
    hook = layers[1].self_attn.indexer.register_forward_hook(lambda m, a, o: seen.append(o))
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT])).logits[0].float().numpy()
    hook.remove()
    picked = (seen[0][0] >= 0).sum(-1).numpy()
    assert (picked < np.arange(1, len(PROMPT) + 1)).sum() >= len(PROMPT) // 2
    out = convert_to(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    with Engine.open(out, threads=2) as eng:
        assert eng.info()["model_type"] == "glm5_next"
        got = eng.eval(PROMPT, all_logits=True)
    worst = float(np.abs(got - ref).max())
    assert worst <= 1e-4, f"max |dlogit| = {worst:.3g}"
