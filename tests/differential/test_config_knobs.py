"""Config knobs the randomized oracle found handled wrong: the converter follows
transformers' own derivation of them, or refuses them by name.

* Qwen2-MoE's sliding layers: the converter's ``attn_kinds`` are the layers transformers'
  Qwen2MoeConfig marks ``sliding_attention`` (from use_sliding_window/max_window_layers,
  or an explicit layer_types), Mixtral's and Qwen3-MoE's are all or none.
* Out of scope, refused naming the key: ``hidden_act`` other than silu, and Qwen2-MoE
  sliding layers with the window switched off (transformers itself cannot run that).
"""

from __future__ import annotations

import json

import pytest

SMALL = dict(vocab_size=272, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=16, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
             pad_token_id=0)


def _cfg_json(cfg) -> dict:
    return json.loads(cfg.to_json_string(use_diff=False))


@pytest.mark.parametrize("layers,use,mwl", [(4, True, 28), (5, True, 3), (4, True, 0),
                                            (3, False, 28), (1, True, 1)])
def test_qwen2_moe_sliding_layers_are_transformers_layer_types(oracle_env, layers, use, mwl):
    import transformers as tf

    from warp_providers.convert import registry

    cfg = tf.Qwen2MoeConfig(**SMALL, num_hidden_layers=layers, use_sliding_window=use,
                            sliding_window=7, max_window_layers=mwl, num_experts=2,
                            num_experts_per_tok=1, moe_intermediate_size=8)
    want = ["sliding" if t == "sliding_attention" else "full" for t in cfg.layer_types]
    written = _cfg_json(cfg)
    derived = {k: v for k, v in written.items() if k != "layer_types"}
    for source in (written, derived):  # layer_types as saved, and derived when absent
        got = registry.module("qwen2_moe").ARCH.sliding(source, layers)
        assert got.get("attn_kinds", ["full"] * layers) == want
        assert ("sliding_window" in got) == ("sliding" in want)
        if "sliding" in want:
            assert got["sliding_window"] == 7


@pytest.mark.parametrize("arch,cls,kw,sliding", [
    ("mixtral", "MixtralConfig", dict(sliding_window=5), True),
    ("mixtral", "MixtralConfig", dict(sliding_window=None), False),
    ("qwen3_moe", "Qwen3MoeConfig", dict(use_sliding_window=True, sliding_window=5), True),
    # a window in config.json that use_sliding_window leaves off
    ("qwen3_moe", "Qwen3MoeConfig", dict(use_sliding_window=False, sliding_window=5), False),
])
def test_mixtral_and_qwen3_moe_window_on_every_layer_or_none(oracle_env, arch, cls, kw, sliding):
    import transformers as tf

    from warp_providers.convert import registry

    written = _cfg_json(getattr(tf, cls)(**SMALL, num_hidden_layers=3, **kw))
    written["sliding_window"] = kw["sliding_window"]  # as an original checkpoint keeps it
    got = registry.module(arch).ARCH.sliding(written, 3)
    assert got == ({"sliding_window": 5, "attn_kinds": ["sliding"] * 3} if sliding else {})


@pytest.mark.parametrize("cls,key,kw", [
    ("LlamaConfig", "hidden_act", dict(hidden_act="gelu", num_hidden_layers=1)),
    ("OlmoeConfig", "hidden_act", dict(hidden_act="relu", num_hidden_layers=1, num_experts=2,
                                       num_experts_per_tok=1)),
    ("Qwen2MoeConfig", "sliding_window", dict(
        num_hidden_layers=2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
        use_sliding_window=False, layer_types=["sliding_attention", "full_attention"])),
])
def test_out_of_scope_knobs_are_refused_by_name(oracle_env, tmp_path, cls, key, kw):
    import torch
    import transformers as tf

    from warp_providers.convert import ConvertError, convert

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(getattr(tf, cls)(**SMALL, **kw))
    hf_dir = oracle_env.save(model, tmp_path / "hf")
    with pytest.raises(ConvertError, match=key):
        convert(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
