"""llama: engine vs transformers on tiny random models (no download).

Two draws: plain llama (untied head), and llama3 rope scaling with tied embeddings.

Checks: oracle_util.decoder_suite's but Q4_0 experts (llama has none).
"""

from __future__ import annotations

from typing import Any

from oracle_util import COMMON, decoder_suite


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
SEEDS: dict[str, int] = {}


# No experts: the suite's Q4_0-experts test (bound to `_`) is not run.
(models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl, _,
 test_quantized_container_is_exact_on_its_own_weights,
 ) = decoder_suite(CONFIGS, SEEDS, exact=("llama", "f32", "q8_0"))
