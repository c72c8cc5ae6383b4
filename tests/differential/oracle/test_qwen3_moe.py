"""qwen3_moe: engine vs transformers on a tiny random model (no download).

8 experts, top-2 with normalized weights, a dense first layer (mlp_only_layers).

Checks: F32 max |dlogit| <= 1e-4 at every position of a 32-token prompt and over 16
incremental decode steps with the KV cache; Q8_0 the same 16-token greedy continuation and
mean KL <= 1e-3; Q4_0 experts mean KL <= 3e-2; the engine's exactness on the
quantize -> dequantize weights.
"""

from __future__ import annotations

from typing import Any

import pytest
from oracle_util import (
    COMMON,
    check_exact_on_quantized,
    check_f32_converted,
    check_q4_0_experts_kl,
    check_q8_0_converted,
    saved_models,
)


def _qwen3_moe() -> Any:
    import transformers as tf

    return tf.Qwen3MoeConfig(
        **COMMON, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0])


CONFIGS = {"qwen3_moe": _qwen3_moe}
ARCHS = list(CONFIGS)
SEEDS: dict[str, int] = {}


@pytest.fixture(scope="module")
def models(oracle_env, tmp_path_factory):
    """name -> (torch model, HF dir); built once per module."""
    return saved_models(CONFIGS, tmp_path_factory, SEEDS)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_matches_transformers(arch, models, tmp_path):
    check_f32_converted(*models[arch], tmp_path, arch)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_same_greedy_and_small_kl(arch, models, tmp_path):
    check_q8_0_converted(*models[arch], tmp_path, arch)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_q4_0_experts_kl(arch, models, tmp_path):
    check_q4_0_experts_kl(*models[arch], tmp_path, arch)


@pytest.mark.oracle
@pytest.mark.parametrize("arch,experts,trunk", [("qwen3_moe", "q8_0", "q8_0")])
def test_quantized_container_is_exact_on_its_own_weights(arch, experts, trunk, models,
                                                        tmp_path):
    check_exact_on_quantized(*models[arch], tmp_path, experts, trunk, arch)
