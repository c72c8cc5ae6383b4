"""The exactness policy of the 8-bit activation path (exact=False) against the float32
one (exact=True), on each architecture's oracle model at Q8_0 and Q4_0 and on SmolLM2.

The 8-bit path may be part of the engine's default only while both hold: on every oracle
model, mean KL(int8 || exact) over the prompt's positions <= 5e-4, and SmolLM2's 64-token
greedy replies to 10 fixed prompts are the same token for token. The default (exact=None,
"auto") takes it for one-token steps, so the tests measure both bounds on exact=False and
on the default path with the prompt decoded one token at a time, and fail if the default
uses the 8-bit path while either is broken; they also check the two paths really differ
(the option is not ignored) and exact=True is the float32 path.
The test_auto_* tests check which path each kind of step takes under auto.
Measured with the routed experts, dense FFNs and shared experts on the 8-bit path too
(x86-64, AVX-512 VNNI set), activations as two int8 planes (x ~= d (q + r / 256)): mean
KL from 4.3e-10 (glm5_next) to 1.1e-8 (deepseek_v4 q4_0), e.g. deepseek_v3 (q8_0
2.47e-9, q4_0 3.17e-9), glm4_moe (3.89e-9, 3.54e-9), kimi_linear (7.03e-9, 7.43e-9),
mixtral (8.82e-10, 9.10e-10), and 10 of the 10 SmolLM2 replies unchanged: the 8-bit path
passes the policy. A 64-token prefill costs twice the float32 path's on this CPU while a
one-token step costs less with VNNI (docs/ENGINE.md), so auto takes it for one-token
steps only, and not at all where the 8-bit dot product is not a VNNI one. With
the q plane alone KL passed 5e-4 on 7 of 11 architectures (up
to 7.17e-3, kimi_linear q4_0) and 9 of 10 replies changed.
test_int8_routed_experts checks that exact=False reaches the routed experts.
"""

from __future__ import annotations

import importlib.util
import json
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


def _one_at_a_time(container: Path, prompt: list[int], **opts: Any) -> np.ndarray:
    """Logits of every prompt position, each token evaluated as its own (decode) step."""
    from warp_providers import Engine

    with Engine.open(container, threads=2, **opts) as eng:
        return np.stack([eng.eval([t]).copy() for t in prompt])


def _default_decode(container: Path, prompt: list[int]) -> tuple[np.ndarray, bool]:
    """The default path's logits with the prompt decoded one token at a time, and whether
    they are the float32 path's (the default took no 8-bit step)."""
    default = _one_at_a_time(container, prompt, exact=None)
    return default, bool(np.array_equal(default, _one_at_a_time(container, prompt,
                                                                 exact=True)))


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
            default, is_f32 = _default_decode(c, oracle_env.PROMPT)
            out[(arch, dt, "default")] = oracle_env.mean_kl(default, rows[True])
            out["_default_f32"] = out.get("_default_f32", True) and is_f32
    return out


@pytest.mark.oracle
def test_int8_default_only_within_the_kl_bound(kls):
    rows = sorted((k, v) for k, v in kls.items() if k != "_default_f32")
    over = {k: v for k, v in rows if v > KL_BOUND}
    print("mean KL(int8 || exact): " + ", ".join("/".join(k) + f" {v:.2e}" for k, v in rows))
    assert kls["_default_f32"] or not over, (
        f"the default takes the 8-bit path but mean KL exceeds {KL_BOUND:g}: {over}")


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
    default = _smol_replies(container, exact=None)
    same = [a == b for a, b in zip(exact, int8)]
    same_default = [a == b for a, b in zip(exact, default)]
    print(f"SmolLM2 greedy replies unchanged by int8: {sum(same)}/{len(same)}, by the "
          f"default: {sum(same_default)}/{len(same_default)}")
    assert all(len(r) == SMOL_TOKENS for r in exact)
    _, default_f32 = _default_decode(container, [int(t) for t in exact[0][:16]])
    assert default_f32 or (all(same) and all(same_default)), (
        f"the default takes the 8-bit path but {same.count(False)} of {len(same)} SmolLM2 "
        f"replies changed on it ({same_default.count(False)} on the default)")


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


def _tiny_quantized_moe(root: Path, dtype: str = "q8_0") -> Path:
    """Every matmul of it quantized (`dtype` experts and attention, the embedding and LM
    head Q8_0), so each has an 8-bit path."""
    from warp_providers.synth import MoeShape, make_moe_container

    return make_moe_container(root / f"{dtype}.warp", MoeShape(
        hidden_size=256, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64), experts=dtype, trunk=dtype)


# The weight types whose one-token matmuls auto runs 8-bit, per 8-bit dot product
# (wpi_kernels_x8_fast); none for the others. With AMX tiles ("amx") auto runs every step
# 8-bit, prefill included (wpi_kernels_x8_auto_rows).
ALL_X8 = ("q8_0", "q4_0", "q4_1", "mxfp4")
AUTO_X8 = {"avxvnni": ALL_X8, "avx512vnni": ALL_X8, "amx": ALL_X8, "avx2": ("q4_0", "mxfp4")}
EVERY_STEP = 0xFFFFFFFF  # x8_max_tokens of a policy with no cap


def _quantized_types(c: Path) -> set[str]:
    man = json.loads((c / "manifest.json").read_text())
    tensors = man["trunk"]["tensors"] + [t for b in man["experts"] for t in b["tensors"]]
    return {t["dtype"] for t in tensors} & set(ALL_X8)


def _auto_runs(c: Path, prompt: list[int], threads: int) -> dict:
    """exact None/True/False -> (24-token prefill logits, 8 one-token steps, info())."""
    from warp_providers import Engine

    runs = {}
    for exact in (None, True, False):
        with Engine.open(c, threads=threads, exact=exact) as eng:
            pre = eng.eval(prompt, all_logits=True).copy()
            eng.reset()
            dec = np.stack([eng.eval([t]).copy() for t in prompt[:8]])
            runs[exact] = (pre, dec, eng.info())
    assert runs[True][2]["x8_max_tokens"] == 0 and runs[True][2]["precision"] == "float32"
    assert runs[False][2]["precision"] == "8-bit"
    assert not np.array_equal(runs[False][1], runs[True][1]), "exact=False left decode float32"
    return runs


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_auto_prefill_float32_decode_8bit_where_faster(tmp_path, threads, dtype):
    """The default (auto) evaluates a 24-token prefill as exact=True does, bit for bit, and
    one-token steps in 8 bits for exactly the weight types the CPU's 8-bit dot product
    runs faster (AUTO_X8): as exact=False where that is every quantized type of the
    model, as exact=True where it is none, and as neither where it is some (a Q4_0 model's
    Q8_0 LM head stays float32 with AVX2 alone). With AMX tiles, every step, the prefill
    too, as exact=False."""
    c = _tiny_quantized_moe(tmp_path, dtype)
    prompt = [(17 * i + 5) % 250 + 3 for i in range(24)]
    runs = _auto_runs(c, prompt, threads)
    info = runs[None][2]
    if info["x8_isa"] == "amx":
        assert info["x8_max_tokens"] == EVERY_STEP and info["precision"] == "8-bit", info
        assert info["x8_dtypes"] == ",".join(ALL_X8), info
        assert np.array_equal(runs[None][0], runs[False][0]), "auto: prefill not 8-bit (AMX)"
        assert not np.array_equal(runs[None][0], runs[True][0])
        assert np.array_equal(runs[None][1], runs[False][1]), "auto: decode not 8-bit (AMX)"
        return
    assert np.array_equal(runs[None][0], runs[True][0]), "auto: a 24-token prefill not float32"
    fast = AUTO_X8.get(info["x8_isa"], ())
    assert info["x8_dtypes"] == ",".join(fast), info
    assert (info["x8_max_tokens"] > 0) == bool(fast), info
    if fast:
        n = info["x8_max_tokens"]
        assert 1 <= n < len(prompt), info
        assert info["precision"] == (f"8-bit for {', '.join(fast)} weights in steps of at "
                                     f"most {n} tokens, float32 otherwise"), info
    else:
        assert info["precision"] == "float32", info
    used = _quantized_types(c) & set(fast)
    auto, f32, x8 = runs[None][1], runs[True][1], runs[False][1]
    if not used:
        assert np.array_equal(auto, f32), f"auto: 8-bit steps for {dtype} with {fast}"
    elif used == _quantized_types(c):
        assert np.array_equal(auto, x8), "auto: one-token steps not 8-bit"
    else:
        assert not np.array_equal(auto, f32), f"auto: no 8-bit matmul for {used}"
        assert not np.array_equal(auto, x8), "auto: 8-bit for a type it is not faster on"


@pytest.mark.parametrize("threads", [1, 2])
def test_auto_batched_step_above_the_cap_is_float32(tmp_path, threads):
    """A batched decode step of info()["x8_max_tokens"] + 1 sequences runs float32 under
    auto, as exact=True does, bit for bit (exact=False differs). With AMX tiles there is
    no cap: a step of 5 sequences (on the tiles) runs as exact=False does."""
    from warp_providers import _engine

    c = _tiny_quantized_moe(tmp_path, "q4_0")
    prompt = [(17 * i + 5) % 250 + 3 for i in range(24)]
    probe = _engine.Context(str(c), {"n_threads": 1})
    n = probe.info()["x8_max_tokens"]
    probe.close()
    cap = n != EVERY_STEP
    n = n if cap else 4
    if n == 0:
        pytest.skip("auto is float32 at every step on this CPU (no 8-bit dot product "
                    "faster than float32) [not provided by CI]")

    def batch_decode(exact: int) -> np.ndarray:
        ctx = _engine.Context(str(c), {"n_threads": threads, "max_sequences": n + 1,
                                       "exact": exact})
        seqs = [None] + [ctx.seq_open() for _ in range(n)]
        logits = np.zeros((n + 1, ctx.vocab_size), np.float32)
        ctx.eval_batch(seqs, [np.array([t], np.int32) for t in prompt[:n + 1]], logits)
        ctx.close()
        return logits

    auto, f32, x8 = batch_decode(-1), batch_decode(1), batch_decode(0)
    assert not np.array_equal(f32, x8)
    if not cap:
        assert np.array_equal(auto, x8), f"auto: a decode step of {n + 1} sequences not 8-bit"
        return
    assert np.array_equal(auto, f32), f"auto: a decode step of {n + 1} sequences not float32"


def test_bad_exact_values_are_refused_by_name(tmp_path):
    from warp_providers import Engine, _engine

    c = _tiny_quantized_moe(tmp_path)
    for bad in (2, 0, "yes", 1.0):
        with pytest.raises(TypeError, match="exact"):
            Engine.open(c, exact=bad)
    for bad in (2, -2, 1 << 30):  # the engine's own check, past the Python one
        with pytest.raises(ValueError, match=f"exact {bad} is not"):
            _engine.Context(str(c), {"exact": bad})
    with Engine.open(c, exact=None) as eng:
        default = eng.info()
    with Engine.open(c, exact="auto") as eng:
        assert eng.info()["precision"] == default["precision"]
        if default["x8_isa"] != "amx":  # with AMX tiles, auto is 8-bit at every step
            assert eng.info()["precision"] != "8-bit"
