"""Valid transformers configs the engine cannot run are refused at conversion, by key.

hidden_act: deepseek_v3, glm4_moe and kimi_linear checkpoints may name any transformers
activation; the engine's MLPs (and kimi_linear's KDA short conv) are SwiGLU / silu only,
so any other activation is refused with a ConvertError naming hidden_act, while the same
checkpoint with silu (or its alias swish) converts.
"""

from __future__ import annotations

import json

import pytest
import randcfg

# One regression draw per architecture: a tiny config its strategy module builds.
CASES = {"deepseek_v3": "deepseek_v3-8bc5b5acc4a8", "kimi_linear": "kimi_linear-b5b633a3096a"}
GLM4 = dict(vocab_size=272, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, intermediate_size=32, moe_intermediate_size=16,
            n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
            rms_norm_eps=1e-6, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)


def _config(arch: str) -> dict:
    if arch == "glm4_moe":
        return dict(GLM4)
    return json.loads((randcfg.REGRESSIONS / f"{CASES[arch]}.json").read_text())["config"]


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ["deepseek_v3", "glm4_moe", "kimi_linear"])
def test_non_silu_hidden_act_is_refused_by_name(arch, oracle_env, tmp_path):
    from oracle_util import convert_to

    from warp_providers.convert import ConvertError

    mod = randcfg.module(arch)
    for act, ok in (("silu", True), ("swish", True), ("gelu", False), ("relu", False)):
        hf = oracle_env.save(mod.build(dict(_config(arch), hidden_act=act), 0),
                             tmp_path / f"hf-{act}")
        out = tmp_path / f"{act}.warp"
        if ok:
            assert convert_to(hf, out, experts="f32", trunk="f32").exists()
        else:
            with pytest.raises(ConvertError, match="hidden_act"):
                convert_to(hf, out, experts="f32", trunk="f32")
