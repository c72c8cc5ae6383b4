"""olmoe: engine vs transformers on a tiny random model (no download).

8 experts, top-2 without renormalization.

Checks: oracle_util.decoder_suite's.
"""

from __future__ import annotations

from typing import Any

from oracle_util import COMMON, decoder_suite


def _olmoe() -> Any:
    import transformers as tf

    return tf.OlmoeConfig(
        **COMMON, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False)


CONFIGS = {"olmoe": _olmoe}
SEEDS: dict[str, int] = {}


(models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
 test_q4_0_experts_kl, test_quantized_container_is_exact_on_its_own_weights,
 ) = decoder_suite(CONFIGS, SEEDS, exact=("olmoe", "q8_0", "q8_0"))
