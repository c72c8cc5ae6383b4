"""The exactness policy of the 8-bit activation path (exact=False) against the float32
one (exact=True), on each architecture's oracle model at Q8_0 and Q4_0 and on SmolLM2.

The 8-bit path may be the engine's default only while both hold: on every oracle model,
mean KL(int8 || exact) over the prompt's positions <= 5e-4, and SmolLM2's 64-token greedy
replies to 10 fixed prompts are the same token for token. The tests measure both and
fail if the default is the 8-bit path while either bound is broken; they also check the
two paths really differ (the option is not ignored) and exact=True is the float32 path.
Measured with the routed experts, dense FFNs and shared experts on the 8-bit path too
(x86-64, AVX-512 VNNI set), activations as two int8 planes (x ~= d (q + r / 256)): mean
KL from 4.3e-10 (glm5_next) to 1.1e-8 (deepseek_v4 q4_0), e.g. deepseek_v3 (q8_0
2.47e-9, q4_0 3.17e-9), glm4_moe (3.89e-9, 3.54e-9), kimi_linear (7.03e-9, 7.43e-9),
mixtral (8.82e-10, 9.10e-10), and 10 of the 10 SmolLM2 replies unchanged: the 8-bit path
passes the policy. It is still not the default, for speed: on this CPU a 64-token prefill
costs twice the float32 path's and decode is level (docs/ENGINE.md), and AArch64 has no
SIMD 8-bit kernels yet. With the q plane alone KL passed 5e-4 on 7 of 11 architectures (up
to 7.17e-3, kimi_linear q4_0) and 9 of 10 replies changed.
test_int8_routed_experts checks that exact=False reaches the routed experts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

KL_BOUND = 5e-4
ORACLE_DIR = Path(__file__).parent / "oracle"
# Architecture -> (oracle module, config name or None for the module's _build()).
ARCHS = {
    "llama": ("test_llama", "llama"), "mixtral": ("test_mixtral", "mixtral"),
    "olmoe": ("test_olmoe", "olmoe"), "qwen2_moe": ("test_qwen2_moe", "qwen2_moe"),
    "qwen3_moe": ("test_qwen3_moe", "qwen3_moe"), "glm4_moe": ("test_glm4_moe", "glm4_moe"),
    "deepseek_v3": ("test_deepseek_v3", "deepseek_v3"), "gpt_oss": ("test_gpt_oss", None),
    "kimi_linear": ("test_kimi_linear", "kimi_linear"), "deepseek_v4": ("test_deepseek_v4", None),
    "glm5_next": ("test_glm5_next", None),
}
SMOL_PROMPTS = [
    "Describe the city of Paris in a short paragraph.", "What is a prime number?",
    "Write a haiku about the sea.", "Explain how a bicycle works.",
    "Give three tips for learning to cook.", "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.", "What does a compiler do?",
    "List some uses of copper.", "How do plants make food from sunlight?",
]
SMOL_TOKENS = 64


def _oracle_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_int8_policy_{name}", ORACLE_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hf_dir(oracle_env: Any, arch: str, tmp: Path) -> Path:
    mod = _oracle_module(ARCHS[arch][0])
    cfg = ARCHS[arch][1]
    if cfg is None:
        model = mod._build()
    else:
        model = oracle_env.build(mod.CONFIGS[cfg](), getattr(mod, "SEEDS", {}).get(cfg, 0))
    return oracle_env.save(model, tmp / "hf")


def _default_is_exact(container: Path, prompt: list[int]) -> bool:
    from warp_providers import Engine

    with Engine.open(container, threads=2, exact=None) as eng:
        default = eng.eval(list(prompt), all_logits=True)
    with Engine.open(container, threads=2, exact=True) as eng:
        exact = eng.eval(list(prompt), all_logits=True)
    return bool(np.array_equal(default, exact))


@pytest.fixture(scope="module")
def kls(oracle_env, tmp_path_factory) -> dict[tuple[str, str], float]:
    """(architecture, dtype) -> mean KL(int8 || exact) on the oracle prompt."""
    from warp_providers import Engine

    out = {}
    for arch in ARCHS:
        hf = _hf_dir(oracle_env, arch, tmp_path_factory.mktemp(f"i8-{arch}"))
        for dt in ("q8_0", "q4_0"):
            c = oracle_env.convert_to(hf, hf.parent / f"{dt}.warp", experts=dt, trunk=dt)
            rows = {}
            for exact in (True, False):
                with Engine.open(c, threads=2, exact=exact) as eng:
                    rows[exact] = eng.eval(list(oracle_env.PROMPT), all_logits=True)
            assert not np.array_equal(rows[True], rows[False]), (
                f"{arch} {dt}: exact=False gave the float32 path's logits")
            out[(arch, dt)] = oracle_env.mean_kl(rows[False], rows[True])
    out["_default_exact"] = _default_is_exact(c, oracle_env.PROMPT)
    return out


@pytest.mark.oracle
def test_int8_default_only_within_the_kl_bound(kls):
    over = {k: v for k, v in kls.items() if k != "_default_exact" and v > KL_BOUND}
    report = ", ".join(f"{a}/{d} {v:.2e}" for (a, d), v in sorted(
        (k, v) for k, v in kls.items() if k != "_default_exact"))
    print(f"mean KL(int8 || exact): {report}")
    assert kls["_default_exact"] or not over, (
        f"the 8-bit path is the default but mean KL exceeds {KL_BOUND:g}: {over}")


@pytest.mark.oracle
def test_exact_true_is_the_float32_path(oracle_env, tmp_path):
    """exact=True matches transformers on the container's own dequantized weights."""
    from warp_providers import Engine

    mod = _oracle_module("test_llama")
    model = oracle_env.build(mod.CONFIGS["llama"]())
    hf = oracle_env.save(model, tmp_path / "hf")
    c = oracle_env.convert_to(hf, tmp_path / "q8.warp", trunk="q8_0")
    ref = oracle_env.logits(oracle_env.quant_dequant(model, "q8_0", experts_only=False),
                            oracle_env.PROMPT).numpy()
    with Engine.open(c, threads=2, exact=True) as eng:
        d = np.abs(eng.eval(oracle_env.PROMPT, all_logits=True) - ref).max()
    assert d <= 1e-4, f"exact=True max |d| {d:.3g} against transformers"


def _smol_replies(container: Path, **opts: Any) -> list[list[int]]:
    from warp_providers import Engine
    from warp_providers.session import ChatSession

    out = []
    with Engine.open(container, threads=2, **opts) as eng:
        session = ChatSession(eng)
        for q in SMOL_PROMPTS:
            eng.reset()
            ids = session.prompt_ids([{"role": "user", "content": q}])
            out.append(eng.generate(ids, max_tokens=SMOL_TOKENS, stop_ids=[]).token_ids)
    return out


@pytest.mark.oracle
def test_int8_default_only_if_smollm2_replies_unchanged(tmp_path_factory):
    from real_models import smollm2

    container = smollm2(tmp_path_factory.mktemp("smol"))
    exact = _smol_replies(container, exact=True)
    int8 = _smol_replies(container, exact=False)
    same = [a == b for a, b in zip(exact, int8)]
    print(f"SmolLM2 greedy replies unchanged by int8: {sum(same)}/{len(same)}")
    assert all(len(r) == SMOL_TOKENS for r in exact)
    assert _default_is_exact(container, [int(t) for t in exact[0][:16]]) or all(same), (
        f"the 8-bit path is the default but {same.count(False)} of {len(same)} SmolLM2 "
        "replies changed")


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_int8_routed_experts(tmp_path, dtype):
    """exact=False sends the routed experts through the 8-bit kernels; exact=True does not.

    The trunk is float32 (float weights always run float32), so every difference between
    the two paths comes from the experts. At 1 thread each expert runs alone; at 2
    threads a decoded token's experts run as one group and a prefill chunk's as batches
    of experts in two parallel sections each. They compute the same rows from the same
    (quantized) inputs, so 1 and 2 threads give bit-identical logits on either path.
    """
    from warp_providers import Engine
    from warp_providers.synth import MoeShape, make_moe_container

    c = make_moe_container(tmp_path / "m.warp", MoeShape(
        hidden_size=256, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64), experts=dtype, trunk="f32")
    prompt = [(17 * i + 5) % 250 + 3 for i in range(24)]
    rows = {}
    for exact in (True, False):
        for threads in (1, 2):
            with Engine.open(c, threads=threads, exact=exact) as eng:
                pre = eng.eval(prompt, all_logits=True).copy()
                dec = np.stack([eng.eval([t]).copy() for t in (7, 11, 13)])
            rows[exact, threads] = (pre, dec)
    for exact in (True, False):
        for a, b in zip(rows[exact, 1], rows[exact, 2]):
            assert np.array_equal(a, b), f"exact={exact}: 1 and 2 threads differ"
    (pe, de), (pi, di) = rows[True, 1], rows[False, 1]
    assert not np.array_equal(pe, pi), "exact=False left the routed experts float32"
    assert not np.array_equal(de, di)
    kl = mean_kl(np.concatenate([pi, di]), np.concatenate([pe, de]))
    print(f"{dtype} experts, float32 trunk: mean KL(int8 || exact) {kl:.2e}")
    assert kl <= KL_BOUND, f"{dtype}: the 8-bit experts' mean KL {kl:.2e} > {KL_BOUND:g}"


def mean_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    def logsm(z: np.ndarray) -> np.ndarray:
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lp, lq = logsm(p_logits.astype(np.float64)), logsm(q_logits.astype(np.float64))
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())
