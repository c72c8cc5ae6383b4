"""gpt_oss and kimi_linear: engine vs transformers on tiny random models (no download).

gpt_oss keeps its distinctive features: sinks, a sliding window (8) shorter than the
prompt (32) on alternate layers, q/k/v/o biases, router bias, top-k softmax, biased experts
with the clamped SwiGLU (limit lowered so the clamp fires), YaRN; its MXFP4 source form
is checked too. kimi_linear has both KDA and MLA layers, a dense first layer and a shared
expert. Per model: F32 max |dlogit| <= 1e-4 over the prompt and 16 decode steps; Q8_0 the
same greedy continuation and mean KL <= 1e-3; expert streaming at the floor bit-identical
to all-resident; state save/load round-trips and continues identically; plan_memory's
kv_bytes equals a hand computation.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from oracle_util import (
    assert_matches_reference,
    assert_q8_0_matches,
    assert_streaming_bit_identical,
)
from oracle_util import convert_to as _convert
from oracle_util import mean_kl as _kl

PROMPT = [(17 * i + 5) % 250 + 3 for i in range(32)]
STD = 0.1


def _gpt_oss_config(**over: Any) -> Any:
    import transformers as tf
    from oracle_models import COMMON

    kw = dict(COMMON)
    kw.update(
        head_dim=16, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        swiglu_limit=1.0, max_position_embeddings=512,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 128},
    )
    kw.update(over)
    return tf.GptOssConfig(**kw)


def _kimi_linear_config(**over: Any) -> Any:
    import transformers as tf
    from oracle_models import COMMON

    kw = dict(COMMON)
    kw.update(
        num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
        num_experts_per_token=2, n_shared_experts=1, num_expert_group=4, topk_group=2,
        routed_scaling_factor=2.5, moe_renormalize=True, kv_lora_rank=32, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_key_value_heads=4,
        linear_attn_config={"head_dim": 32, "num_heads": 2, "short_conv_kernel_size": 4,
                            "kda_layers": [1, 3], "full_attn_layers": [2, 4]},
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    )
    kw.update(over)
    return tf.KimiLinearConfig(**kw)


CONFIGS = {"gpt_oss": _gpt_oss_config, "kimi_linear": _kimi_linear_config}
# kimi_linear's selection-only routing bias is drawn as large as a trained one (which
# settles most selections): with a bias as small as the other weights, near-tied grouped
# selections flip under Q8_0 rounding in transformers itself (mean KL 1.5e-2)
ROUTING_BIAS_STD = {"kimi_linear": 2.0}


def _build(name: str, seed: int = 0) -> Any:
    import torch
    import transformers as tf
    from oracle_models import randomize

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32)
    return randomize(model, std=STD, routing_bias_std=ROUTING_BIAS_STD.get(name, 0.1))


def _greedy_ref(oracle_env, model, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    ids = list(prompt)
    steps = []
    for _ in range(n):
        last = oracle_env.logits(model, ids)[-1].numpy()
        steps.append(last)
        ids.append(int(last.argmax()))
    return ids[len(prompt):], np.stack(steps)



ARCHS = ["gpt_oss", "kimi_linear"]


@pytest.fixture(scope="module")
def models(oracle_env, tmp_path_factory):
    built = {}
    for name in ARCHS:
        m = _build(name)
        d = oracle_env.save(m, tmp_path_factory.mktemp(f"hf-{name}"))
        ref_all = oracle_env.logits(m, PROMPT).numpy()
        ref_tokens, ref_steps = _greedy_ref(oracle_env, m, PROMPT, 16)
        built[name] = (m, d, ref_all, ref_tokens, ref_steps)
    return built


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_matches_transformers(arch, models, tmp_path):
    from warp_providers import Engine

    _, hf_dir, ref_all, ref_tokens, ref_steps = models[arch]
    out = _convert(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    for chunk in (64, 5):
        with Engine.open(out, threads=2, prefill_chunk=chunk) as eng:
            assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps,
                                     f"{arch} chunk {chunk}")


Q8_CASES = ARCHS


@pytest.mark.oracle
@pytest.mark.parametrize("arch", Q8_CASES)
def test_q8_0_same_greedy_and_small_kl(arch, models, oracle_env, tmp_path):
    from warp_providers import Engine

    _, hf_dir, ref_all, ref_tokens, _ = models[arch]
    out = _convert(hf_dir, tmp_path / "q8.warp", experts="q8_0", trunk="q8_0")
    qdq = _quant_dequant_q8(models[arch][0])
    qdq_all = oracle_env.logits(qdq, PROMPT).numpy()
    qdq_tokens, _ = _greedy_ref(oracle_env, qdq, PROMPT, 16)
    with Engine.open(out, threads=2) as eng:
        assert_q8_0_matches(eng, PROMPT, ref_all, ref_tokens, qdq_all, qdq_tokens, arch)


def _quant_dequant_q8(model: Any) -> Any:
    """A copy of model whose matrices went through Q8_0 quantize -> dequantize along the
    rows the container stores (gpt_oss experts are held transposed by transformers)."""
    import copy

    import torch
    from gguf import GGMLQuantizationType, quants

    qt = GGMLQuantizationType.Q8_0
    m = copy.deepcopy(model)
    gpt_oss = type(model).__name__.startswith("GptOss")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() < 2 or "norm" in name or name.endswith(
                    ("router.weight", "mlp.gate.weight", "_bias")):  # f32 in the container
                continue
            a = p.detach().numpy()
            transposed = gpt_oss and name.endswith(("experts.gate_up_proj", "experts.down_proj"))
            if transposed:
                a = a.transpose(0, 2, 1)
            if a.shape[-1] % 32:
                continue
            rows = a.reshape(-1, a.shape[-1])
            q = quants.dequantize(quants.quantize(np.ascontiguousarray(rows), qt), qt)
            q = q.reshape(a.shape)
            if transposed:
                q = q.transpose(0, 2, 1)
            p.copy_(torch.from_numpy(np.ascontiguousarray(q)))
    return m


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_container_is_exact_on_its_own_weights(arch, models, oracle_env, tmp_path):
    """The engine computes exactly on Q8_0 blocks: the same logits as transformers running
    the quantize->dequantize of the same weights, and the same greedy continuation."""
    from warp_providers import Engine

    model, hf_dir, *_ = models[arch]
    out = _convert(hf_dir, tmp_path / "q.warp", experts="q8_0", trunk="q8_0")
    qdq = _quant_dequant_q8(model)
    ref = oracle_env.logits(qdq, PROMPT).numpy()
    ref_tokens, _ = _greedy_ref(oracle_env, qdq, PROMPT, 16)
    with Engine.open(out, threads=2) as eng:
        d = np.abs(eng.eval(PROMPT, all_logits=True) - ref).max()
        assert d <= 1e-4, f"{arch} q8_0: max |d| = {d:.3g}"
        eng.reset()
        assert eng.generate(PROMPT, max_tokens=16, stop_ids=[]).token_ids == ref_tokens


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_streaming_at_floor_bit_identical(arch, models, tmp_path):
    _, hf_dir, *_ = models[arch]
    out = _convert(hf_dir, tmp_path / "s.warp", experts="q8_0", trunk="q8_0")
    assert_streaming_bit_identical(out, PROMPT, 16)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_state_roundtrip_continues_identically(arch, models, tmp_path):
    from warp_providers import Engine

    _, hf_dir, *_ = models[arch]
    out = _convert(hf_dir, tmp_path / "st.warp", experts="f32", trunk="f32")
    with Engine.open(out, threads=2) as eng:
        eng.eval(PROMPT)
        eng.save_state(tmp_path / "s.state")
        want = [eng.eval([t]) for t in (7, 8, 9, 10)]
    with Engine.open(out, threads=2) as eng:
        eng.eval(PROMPT[:5])  # some other state, replaced by the load
        eng.load_state(tmp_path / "s.state")
        got = [eng.eval([t]) for t in (7, 8, 9, 10)]
    for a, b in zip(want, got):
        assert np.array_equal(a, b)


def _hand_kv_bytes(arch: str, hp: dict[str, Any], ctx: int) -> dict[str, int]:
    if arch == "gpt_oss":  # K and V rows of every position, every layer
        return {"kv": 2 * hp["n_layers"] * ctx * hp["n_kv_heads"] * hp["head_dim"] * 4}
    # kimi_linear: MLA layers keep one latent row (kv_lora_rank + rope dims) per position;
    # KDA layers a recurrent state S [heads, d, d] plus the conv window [kernel-1, 3*heads*d]
    n_kda = hp["attn_kinds"].count("kda")
    n_mla = hp["n_layers"] - n_kda
    assert n_kda == 2 and n_mla == 2
    h, d, k = hp["kda_heads"], hp["kda_head_dim"], hp["kda_conv"]
    kda = h * d * d + (k - 1) * 3 * h * d
    return {"mla_latent": 4 * n_mla * ctx * (hp["kv_lora_rank"] + hp["rope_dim"]),
            "recurrent": 4 * n_kda * kda}


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_state_bytes(arch, models, tmp_path):
    from warp_providers import plan_memory

    _, hf_dir, *_ = models[arch]
    out = _convert(hf_dir, tmp_path / "p.warp", experts="q8_0", trunk="q8_0")
    hp = json.loads((out / "manifest.json").read_text())["hparams"]
    for ctx in (64, 300):
        plan = plan_memory(out, ctx=ctx)
        assert plan["state_bytes"] == _hand_kv_bytes(arch, hp, ctx)
        assert plan["kv_bytes"] == sum(_hand_kv_bytes(arch, hp, ctx).values())


# --------------------------------------------------------------------------- gpt_oss MXFP4


def _to_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocks, scales, dequantized) of w [..., cols]: per 32 a power-of-two scale that
    keeps |w| / scale <= 6, values rounded to the nearest FP4 e2m1 level."""
    from warp_providers.convert.hf_ext import FP4_VALUES

    *lead, cols = w.shape
    g = w.reshape(*lead, cols // 32, 32).astype(np.float64)
    amax = np.abs(g).max(-1)
    e = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int64)
    e = np.clip(e, -127, 127)
    x = g / np.ldexp(1.0, e)[..., None]
    levels = FP4_VALUES[:8].astype(np.float64)
    idx = np.abs(np.abs(x)[..., None] - levels).argmin(-1)
    code = (idx + np.where(x < 0, 8, 0)).astype(np.uint8)
    code = np.where(idx == 0, 0, code).astype(np.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    scales = (e + 127).astype(np.uint8)
    deq = (FP4_VALUES[code].astype(np.float64) * np.ldexp(1.0, e)[..., None]).reshape(w.shape)
    return blocks, scales, deq.astype(np.float32)


@pytest.mark.oracle
def test_gpt_oss_mxfp4_source(oracle_env, tmp_path):
    """An MXFP4 checkpoint (the original *_blocks/*_scales layout) converts exactly: the
    engine matches transformers holding the dequantized weights, and the dequantizer
    agrees with transformers' own."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from warp_providers import Engine
    from warp_providers.convert.hf_ext import mxfp4_to_f32

    model = _build("gpt_oss", seed=1)
    hf_dir = oracle_env.save(model, tmp_path / "hf")
    sd = load_file(str(hf_dir / "model.safetensors"))
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            pre = f"model.layers.{i}.mlp.experts."
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(ex, name)  # [E, in, out]; the checkpoint is [E, out, in]
                w = p.detach().numpy().transpose(0, 2, 1)
                blocks, scales, deq = _to_mxfp4(w)
                ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                 dtype=torch.float32)
                np.testing.assert_array_equal(ref.numpy(), deq.transpose(0, 2, 1))
                np.testing.assert_array_equal(mxfp4_to_f32(blocks, scales), deq)
                p.copy_(torch.from_numpy(deq.transpose(0, 2, 1).copy()))
                del sd[pre + name]
                sd[pre + name + "_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
                sd[pre + name + "_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
    save_file(sd, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    out = _convert(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    ref_all = oracle_env.logits(model, PROMPT).numpy()
    ref_tokens, ref_steps = _greedy_ref(oracle_env, model, PROMPT, 16)
    with Engine.open(out, threads=2) as eng:
        assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps, "gpt_oss mxfp4")
    q4 = _convert(hf_dir, tmp_path / "q4.warp", experts="q4_0", trunk="q8_0")
    with Engine.open(q4, threads=2) as eng:
        assert _kl(ref_all, eng.eval(PROMPT, all_logits=True)) <= 3e-2
