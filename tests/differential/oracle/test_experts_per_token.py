"""experts_per_token: a top-K container opened with N routed experts per token computes
what the model's own top-N variant computes.

For each router kind the engine has (softmax then top-k with and without
norm_topk_prob, softmax over the top-k logits, gpt-oss's softmax over the selected, the
grouped sigmoid noaux router with renormalization and a scaling factor, Kimi K3's sigmoid
router on the latent MoE), the reference is the same weights in a model configured with
num_experts_per_tok=N: its prompt logits must match the engine opened on the top-K
container with experts_per_token=N within 1e-4, and differ from the shipped top-K (so
the option is not a no-op). Then: the plan's working set shrinks to N/K, the range
1..top_k is enforced by name, a dense model refuses it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oracle_util import COMMON, PROMPT, build, convert_to, logits, save

TOP_K = 4


def _qwen3_moe(k: int) -> Any:
    import transformers as tf

    return tf.Qwen3MoeConfig(
        **COMMON, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=k, norm_topk_prob=True, mlp_only_layers=[0])


def _qwen2_moe(k: int) -> Any:
    import transformers as tf

    return tf.Qwen2MoeConfig(
        **COMMON, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=k,
        norm_topk_prob=False)


def _mixtral(k: int) -> Any:
    import transformers as tf

    return tf.MixtralConfig(**COMMON, intermediate_size=64, num_local_experts=8,
                            num_experts_per_tok=k)


def _gpt_oss(k: int) -> Any:
    import transformers as tf

    return tf.GptOssConfig(**{**COMMON, **dict(
        head_dim=16, intermediate_size=64, num_local_experts=8, num_experts_per_tok=k,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"])})


def _deepseek_v3(k: int) -> Any:
    import transformers as tf

    return tf.DeepseekV3Config(**{**COMMON, **dict(
        num_hidden_layers=3, num_key_value_heads=4, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=16, n_group=4, topk_group=2,
        num_experts_per_tok=k, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        routed_scaling_factor=2.5, norm_topk_prob=True)})


CONFIGS = {"qwen3_moe": _qwen3_moe, "qwen2_moe": _qwen2_moe, "mixtral": _mixtral,
           "gpt_oss": _gpt_oss, "deepseek_v3": _deepseek_v3}


def _reduced_logits(config: Any, shipped: Any, n: int) -> np.ndarray:
    """The same weights in the model configured with num_experts_per_tok=n."""
    import torch
    import transformers as tf

    small = tf.AutoModelForCausalLM.from_config(config(n), dtype=torch.float32)
    small.load_state_dict(shipped.state_dict())
    return logits(small.eval(), PROMPT).numpy()


@pytest.mark.oracle
@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 2])
def test_engine_equals_the_top_n_model(oracle_env, arch, n, tmp_path) -> None:
    from warp_providers import Engine

    model = build(CONFIGS[arch](TOP_K), 0)
    out = convert_to(save(model, tmp_path / "hf"), tmp_path / "m.warp", experts="f32",
                     trunk="f32")
    want = _reduced_logits(CONFIGS[arch], model, n)
    shipped = logits(model, PROMPT).numpy()
    assert np.abs(want - shipped).max() > 1e-3, f"{arch}: top-{n} equals top-{TOP_K}"
    with Engine.open(out, threads=2, experts_per_token=n) as eng:
        assert eng.info()["top_k"] == n
        d = np.abs(eng.eval(PROMPT, all_logits=True) - want).max()
    assert d <= 1e-4, f"{arch} experts_per_token={n}: max |d| = {d:.3g}"
    with Engine.open(out, threads=2, experts_per_token=TOP_K) as eng:  # as shipped
        d = np.abs(eng.eval(PROMPT, all_logits=True) - shipped).max()
    assert d <= 1e-4, f"{arch} experts_per_token={TOP_K}: max |d| = {d:.3g}"


@pytest.mark.oracle
def test_kimi_k3_latent_moe_equals_its_top_n_reference(oracle_env, tmp_path) -> None:
    import kimi_k3_ref

    from warp_providers import Engine
    from warp_providers.convert import convert
    from warp_providers.synth.kimi_k3 import KimiK3Shape, make_kimi_k3_checkpoint

    shape = KimiK3Shape(num_hidden_layers=4, layer_pattern="KM", attn_res_block_size=2)
    src = make_kimi_k3_checkpoint(tmp_path / "hf", shape, 3)
    out = convert(src, tmp_path / "m.warp", experts="f32", trunk="f32")
    ref = kimi_k3_ref.KimiK3Reference(src)
    k = ref.cfg["num_experts_per_token"]
    shipped = ref.logits(PROMPT)
    ref.cfg["num_experts_per_token"] = n = k // 2
    want = ref.logits(PROMPT)
    assert np.abs(want - shipped).max() > 1e-3
    with Engine.open(out, threads=2, experts_per_token=n) as eng:
        d = np.abs(eng.eval(PROMPT, all_logits=True) - want).max()
    assert d <= 1e-4, f"kimi_k3 experts_per_token={n}: max |d| = {d:.3g}"


@pytest.fixture(scope="module")
def qwen3_container(oracle_env, tmp_path_factory):
    d = tmp_path_factory.mktemp("ept")
    return convert_to(save(build(_qwen3_moe(TOP_K), 0), d / "hf"), d / "m.warp",
                      experts="f32", trunk="f32")


def test_plan_working_set_shrinks_with_it(qwen3_container) -> None:
    from warp_providers import plan_memory

    full = plan_memory(qwen3_container)
    half = plan_memory(qwen3_container, experts_per_token=TOP_K // 2)
    assert half["working_set_bytes"] * 2 == full["working_set_bytes"]
    assert half["min_cache_bytes"] < full["min_cache_bytes"]


@pytest.mark.parametrize("bad", [TOP_K + 1, 1000])
def test_out_of_range_is_refused_by_name(qwen3_container, bad) -> None:
    from warp_providers import Engine, plan_memory

    with pytest.raises(ValueError, match=rf"experts_per_token {bad} is out of range "
                                         rf"\[1, the model's top_k {TOP_K}\]"):
        Engine.open(qwen3_container, experts_per_token=bad)
    with pytest.raises(ValueError, match="experts_per_token"):
        plan_memory(qwen3_container, experts_per_token=bad)


@pytest.mark.parametrize("bad", [-1, True, 2.0, "2"])
def test_non_int_or_negative_is_refused_by_name(qwen3_container, bad) -> None:
    from warp_providers import Engine

    with pytest.raises(ValueError, match="experts_per_token must be a non-negative int"):
        Engine.open(qwen3_container, experts_per_token=bad)


def test_zero_and_none_mean_as_shipped(qwen3_container) -> None:
    from warp_providers import Engine

    for v in (0, None):
        with Engine.open(qwen3_container, threads=1, experts_per_token=v) as eng:
            assert eng.info()["top_k"] == TOP_K


def test_a_dense_model_refuses_it(oracle_env, tmp_path) -> None:
    import transformers as tf

    from warp_providers import Engine

    dense = build(tf.LlamaConfig(**COMMON, intermediate_size=64), 0)
    out = convert_to(save(dense, tmp_path / "hf"), tmp_path / "m.warp", experts="f32",
                     trunk="f32")
    with pytest.raises(ValueError, match="experts_per_token 1: the model has no routed experts"):
        Engine.open(out, experts_per_token=1)
