"""qwen2_moe: engine vs transformers on a tiny random model (no download).

8 experts, top-2 without renormalization, a gated shared expert.

Checks: oracle_util.decoder_suite's.
"""

from __future__ import annotations

from typing import Any

from oracle_util import COMMON, decoder_suite


def _qwen2_moe() -> Any:
    import transformers as tf

    return tf.Qwen2MoeConfig(
        **COMMON, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False)


CONFIGS = {"qwen2_moe": _qwen2_moe}
SEEDS: dict[str, int] = {}


(models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
 test_q4_0_experts_kl, test_quantized_container_is_exact_on_its_own_weights,
 ) = decoder_suite(CONFIGS, SEEDS, exact=("qwen2_moe", "q4_0", "f32"))
