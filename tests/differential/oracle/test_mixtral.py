"""mixtral: engine vs transformers on a tiny random model (no download).

8 experts, top-2.

Checks: oracle_util.decoder_suite's.
"""

from __future__ import annotations

from typing import Any

from oracle_util import COMMON, decoder_suite


def _mixtral() -> Any:
    import transformers as tf

    return tf.MixtralConfig(
        **COMMON, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2)


CONFIGS = {"mixtral": _mixtral}
# The draw: one that Q8_0 rounding leaves stable in transformers itself (checked by
# assert_q8_0_matches); seed 0 flips an expert selection.
SEEDS = {"mixtral": 3}


(models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
 test_q4_0_experts_kl, test_quantized_container_is_exact_on_its_own_weights,
 ) = decoder_suite(CONFIGS, SEEDS, exact=("mixtral", "q4_0", "f32"))
