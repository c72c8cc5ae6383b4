"""llama: engine vs transformers on tiny random models (no download).

Two draws: plain llama (untied head), and llama3 rope scaling with tied embeddings.

Checks: F32 max |dlogit| <= 1e-4 at every position of a 32-token prompt and over 16
incremental decode steps with the KV cache; Q8_0 the same 16-token greedy continuation and
mean KL <= 1e-3; the engine's exactness on the quantize -> dequantize weights.
"""

from __future__ import annotations

from typing import Any

import pytest
from oracle_util import (
    COMMON,
    check_exact_on_quantized,
    check_f32_converted,
    check_q8_0_converted,
    saved_models,
)


def _llama() -> Any:
    import transformers as tf

    return tf.LlamaConfig(**COMMON, intermediate_size=128, head_dim=16)


def _llama_rope3() -> Any:
    import transformers as tf

    return tf.LlamaConfig(
        **{**COMMON, "tie_word_embeddings": True}, intermediate_size=128, head_dim=16,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64})


CONFIGS = {"llama": _llama, "llama_rope3": _llama_rope3}
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
@pytest.mark.parametrize("arch,experts,trunk", [("llama", "f32", "q8_0")])
def test_quantized_container_is_exact_on_its_own_weights(arch, experts, trunk, models,
                                                        tmp_path):
    check_exact_on_quantized(*models[arch], tmp_path, experts, trunk, arch)
