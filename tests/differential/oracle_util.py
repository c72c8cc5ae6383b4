"""What the oracle tests share: tiny random transformers models, conversion, comparisons.

Used by `oracle/test_<model_type>.py` (one module per architecture, each holding its tiny
configs), by the randomized-config oracle (`randcfg/`) and by the synthetic-model tests.
Models are built from config objects with a fixed seed (no download): `randomize` redraws
every weight, norm weights perturbed around 1, so routing and norm mistakes show in the
logits; `save` writes `save_pretrained` plus the byte-level test tokenizer, ready for
`warp convert`. The `check_*` functions are the test bodies that several architectures
run unchanged. Importing this module needs numpy only: torch, transformers and the
converter are imported where used, so a missing reference is the `oracle_env` fixture's
reported skip (conftest.py), never an import error at collection.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from fake_engine import CHATML_TEMPLATE, tokenizer_json
from support import has_module, requires

VOCAB = 272  # >= the 265 ids of the test tokenizer
STD = 0.1  # weight std: within 0.1-0.2 so routing errors show
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
    tie_word_embeddings=False, initializer_range=STD, bos_token_id=1, eos_token_id=2,
    pad_token_id=0,
)
PROMPT = [(17 * i + 5) % 250 + 3 for i in range(32)]
DECODE_STEPS = 16
# Router weights the quantized containers keep in f32, by parameter-name suffix.
ROUTERS = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight")


# --------------------------------------------------------------------------- models


def randomize(model: Any, *, std: float = STD, bias_std: float = 0.1,
              routing_bias_std: float = 0.1) -> Any:
    """Redraws every weight (the torch seed is set by the caller); returns model in eval.

    Norm weights are perturbed around 1, biases and sinks drawn with ``bias_std``, matrices
    with ``std``; ``e_score_correction_bias`` buffers (selection-only routing bias) with
    ``routing_bias_std``.
    """
    import torch

    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "layernorm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(bias_std * torch.randn_like(p))
            else:
                p.copy_(std * torch.randn_like(p))
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(routing_bias_std * torch.randn_like(b))
    return model.eval()


def build(config: Any, seed: int = 0, **randomize_kw: Any) -> Any:
    """The float32 causal LM of a transformers config, seeded, redrawn by `randomize`."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return randomize(model, **randomize_kw)


def save(model: Any, out: Path) -> Path:
    """save_pretrained plus the test tokenizer; returns out."""
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(tokenizer_json())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>",
    }))
    return out


def logits(model: Any, ids: list[int]) -> Any:
    """All-position float32 logits [len(ids), vocab], as a torch tensor."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def greedy_ref(model: Any, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """transformers' greedy continuation of prompt (n tokens, each from a full forward)
    and the last-position logits of every step."""
    ids = list(prompt)
    steps = []
    for _ in range(n):
        last = logits(model, ids)[-1].numpy()
        steps.append(last)
        ids.append(int(last.argmax()))
    return ids[len(prompt):], np.stack(steps)


def saved_models(configs: dict[str, Callable[[], Any]], tmp_path_factory: Any,
                 seeds: dict[str, int] | None = None, **randomize_kw: Any,
                 ) -> dict[str, tuple[Any, Path]]:
    """name -> (torch model, HF dir): `build` of each config (seed from seeds, else 0)."""
    built = {}
    for name, config in configs.items():
        m = build(config(), (seeds or {}).get(name, 0), **randomize_kw)
        built[name] = (m, save(m, tmp_path_factory.mktemp(f"hf-{name}")))
    return built


def referenced_models(configs: dict[str, Callable[[], Any]], tmp_path_factory: Any,
                      seeds: dict[str, int] | None = None, **randomize_kw: Any,
                      ) -> dict[str, tuple[Any, Path, np.ndarray, list[int], np.ndarray]]:
    """name -> (torch model, HF dir, reference prompt logits, greedy tokens, step logits)."""
    built = {}
    for name, (m, d) in saved_models(configs, tmp_path_factory, seeds, **randomize_kw).items():
        toks, steps = greedy_ref(m, PROMPT, DECODE_STEPS)
        built[name] = (m, d, logits(m, PROMPT).numpy(), toks, steps)
    return built


def quant_dequant(model: Any, dtype_name: str, experts_only: bool,
                  routers: Iterable[str] = ROUTERS) -> Any:
    """A copy of model whose matrices went through GGUF quantize -> dequantize (norms,
    routers and rows not a multiple of 32 kept; with experts_only, the experts alone)."""
    import torch
    from gguf import GGMLQuantizationType, quants

    routers = tuple(routers)
    qt = GGMLQuantizationType[dtype_name.upper()]
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() < 2 or p.shape[-1] % 32 or "norm" in name:
                continue
            is_router = name.endswith(routers)
            is_expert = ".experts." in name
            if is_router or (experts_only and not is_expert):
                continue
            a = p.detach().numpy().reshape(-1, p.shape[-1])
            q = quants.dequantize(quants.quantize(a, qt), qt)
            p.copy_(torch.from_numpy(q.reshape(p.shape)))
    return m


def quant_dequant_q8_stored_rows(model: Any) -> Any:
    """A copy of model whose matrices went through Q8_0 quantize -> dequantize along the
    rows the container stores (gpt_oss experts are held transposed by transformers)."""
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


def to_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocks, scales, dequantized) of w [..., cols]: per 32 a power-of-two scale that
    keeps |w| / scale <= 6, values rounded to the nearest FP4 e2m1 level."""
    from warp_providers.convert.base import FP4_E2M1 as FP4_VALUES

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


def manifest(path: Path) -> dict[str, Any]:
    """A container's manifest.json."""
    return json.loads((Path(path) / "manifest.json").read_text())


def record_tensors(container: Path, bank: dict[str, Any], e: int) -> dict[str, bytes]:
    """The gate, up and down bytes of expert e's record in a bank of the manifest."""
    raw = (Path(container) / bank["file"]).read_bytes()
    rec = raw[e * bank["record_bytes"]:(e + 1) * bank["record_bytes"]]
    return {t["name"]: rec[t["offset"]:t["offset"] + t["bytes"]] for t in bank["tensors"]}


# --------------------------------------------------------------------------- comparisons


def mean_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean over positions of KL(softmax(p) || softmax(q)), in float64."""

    def logsm(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    lp, lq = logsm(p_logits), logsm(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def convert_to(src: Path, out: Path, **kw: str) -> Path:
    """`warp convert` of an HF directory (imported late: the converter is under test)."""
    from warp_providers.convert import convert

    return convert(src, out, **kw)


def assert_q8_0_matches(eng, prompt: list[int], ref_all: np.ndarray, ref_tokens: list[int],
                        qdq_all: np.ndarray, qdq_tokens: list[int], tag: str) -> None:
    """A Q8_0 container keeps the F32 reference's greedy continuation and mean KL <= 1e-3.

    On a random-weight model a Q8_0 rounding can flip a near-tied expert selection or a
    near-tied next token by itself, whatever the engine does. So the draw is checked
    first, in transformers alone: its own quantize -> dequantize weights must keep the F32
    continuation and a mean KL <= 8e-4 (the engine, exact on those weights, then lands
    within the 1e-3 bound); a draw that does not is reported as such (change its seed),
    never counted against the engine.
    """
    ref_kl = mean_kl(ref_all, qdq_all)
    assert ref_kl <= 8e-4 and qdq_tokens == ref_tokens, (
        f"{tag}: this random draw is not Q8_0-stable in transformers itself (mean KL "
        f"{ref_kl:.3g}, same continuation {qdq_tokens == ref_tokens}); draw another seed")
    kl = mean_kl(ref_all, eng.eval(list(prompt), all_logits=True))
    assert kl <= 1e-3, f"{tag}: q8_0 mean KL {kl:.3g}"
    eng.reset()
    res = eng.generate(list(prompt), max_tokens=len(ref_tokens), stop_ids=[])
    assert res.token_ids == ref_tokens, f"{tag}: q8_0 greedy continuation differs"


def greedy_trace(path: Path, prompt: list[int], steps: int, **opts) -> np.ndarray:
    """All prompt logits, then `steps` greedy decode steps' logits, stacked."""
    from warp_providers import Engine

    opts.setdefault("threads", 2)
    with Engine.open(path, **opts) as eng:
        rows = list(eng.eval(list(prompt), all_logits=True))
        tok = int(rows[-1].argmax())
        for _ in range(steps):
            last = eng.eval([tok])
            rows.append(last)
            tok = int(last.argmax())
        return np.stack(rows)


def assert_streaming_bit_identical(path: Path, prompt: list[int], steps: int) -> None:
    """The expert cache at the floor budget (with and without router lookahead) gives
    bit-identical logits to a cache holding every expert."""
    from warp_providers import plan_memory

    plan = plan_memory(path)
    everything = plan["floor_bytes"] + plan["experts_total_bytes"]
    full = greedy_trace(path, prompt, steps, budget=everything)
    floor = greedy_trace(path, prompt, steps, budget=plan["floor_bytes"])
    assert np.array_equal(full, floor), f"max |d| = {np.abs(full - floor).max():.3g}"
    lean = greedy_trace(path, prompt, steps, budget=plan["floor_bytes"], lookahead=False)
    assert np.array_equal(lean, full)


def assert_matches_reference(eng, prompt: list[int], ref_all: np.ndarray, ref_tokens: list[int],
                             ref_steps: np.ndarray, tag: str) -> None:
    """Every prompt position's logits within 1e-4 of the reference, then the greedy decode
    through the cache: the prompt minus its last token, then one token per step, each
    step's logits within 1e-4 of `ref_steps[i]` (the reference after prompt + the first i
    greedy tokens) and picking `ref_tokens[i]`."""
    got_all = eng.eval(list(prompt), all_logits=True)
    diff = np.abs(got_all - ref_all).max()
    assert diff <= 1e-4, f"{tag}: prompt logits max |d| = {diff:.3g}"
    eng.reset()
    eng.eval(list(prompt[:-1]))
    last = prompt[-1]
    for step in range(len(ref_tokens)):
        got = eng.eval([last])
        d = np.abs(got - ref_steps[step]).max()
        assert d <= 1e-4, f"{tag}: decode step {step} max |d| = {d:.3g}"
        assert int(got.argmax()) == ref_tokens[step]
        last = ref_tokens[step]


def assert_image_prompt_matches(ctx: Any, rows: list[np.ndarray], ids: list[int],
                                ref: np.ndarray, vocab: int, tag: str = "") -> None:
    """A prompt whose placeholders take the image rows `rows` (encode_image's, in order),
    against the reference's logits `ref` [len(ids), vocab]: one chunked prefill on ctx with
    every position's logits, then token by token on another sequence through eval_batch,
    both within 1e-4 and every pushed row used. `tag` starts the failure messages."""
    for r in rows:
        ctx.push_embeds(r)
    assert ctx.pending_embeds == sum(len(r) for r in rows)
    got = np.zeros(len(ids) * vocab, np.float32)
    ctx.eval(np.array(ids, np.int32), got, True)
    err = float(np.abs(got.reshape(len(ids), vocab) - ref).max())
    assert err <= 1e-4, f"{tag}chunked prefill max |dlogit| {err:.3g}"
    assert ctx.pending_embeds == 0
    seq = ctx.seq_open()
    seq.push_embeds(np.concatenate(rows))
    out = np.zeros((1, vocab), np.float32)
    worst = 0.0
    for t, tok in enumerate(ids):
        ctx.eval_batch([seq], [np.array([tok], np.int32)], out)
        worst = max(worst, float(np.abs(out[0] - ref[t]).max()))
    assert worst <= 1e-4, f"{tag}single-step max |dlogit| {worst:.3g}"
    assert seq.pending_embeds == 0


# --------------------------------------------------------------------------- test bodies
# Each is the body of a test that several `oracle/test_<model_type>.py` modules run on
# their own models, so every architecture is held to one written-once check.


def check_f32_converted(model: Any, hf_dir: Path, tmp_path: Path, tag: str) -> None:
    """F32 container: every prompt position and 16 cached decode steps within 1e-4."""
    from warp_providers import Engine

    out = convert_to(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    ref_all = logits(model, PROMPT).numpy()
    ref_tokens, ref_steps = greedy_ref(model, PROMPT, DECODE_STEPS)
    with Engine.open(out, threads=2) as eng:
        assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps, tag)


def check_q8_0_converted(model: Any, hf_dir: Path, tmp_path: Path, tag: str) -> None:
    """Q8_0 container (experts and trunk): `assert_q8_0_matches` against the F32 model."""
    from warp_providers import Engine

    out = convert_to(hf_dir, tmp_path / "q8.warp", experts="q8_0", trunk="q8_0")
    ref_all = logits(model, PROMPT).numpy()
    ref_tokens, _ = greedy_ref(model, PROMPT, DECODE_STEPS)
    qdq = quant_dequant(model, "q8_0", experts_only=False)
    qdq_all = logits(qdq, PROMPT).numpy()
    qdq_tokens, _ = greedy_ref(qdq, PROMPT, DECODE_STEPS)
    with Engine.open(out, threads=2) as eng:
        assert_q8_0_matches(eng, PROMPT, ref_all, ref_tokens, qdq_all, qdq_tokens, tag)


def check_q4_0_experts_kl(model: Any, hf_dir: Path, tmp_path: Path, tag: str) -> None:
    """Q4_0 experts, Q8_0 trunk: mean KL <= 3e-2 against the F32 model."""
    from warp_providers import Engine

    out = convert_to(hf_dir, tmp_path / "q4.warp", experts="q4_0", trunk="q8_0")
    ref_all = logits(model, PROMPT).numpy()
    with Engine.open(out, threads=2) as eng:
        kl = mean_kl(ref_all, eng.eval(PROMPT, all_logits=True))
    assert kl <= 3e-2, f"{tag}: q4_0 experts mean KL {kl:.3g}"


def check_exact_on_quantized(model: Any, hf_dir: Path, tmp_path: Path, experts: str,
                             trunk: str, tag: str) -> None:
    """The engine computes exactly on quantized blocks: same logits as transformers running
    the quantize->dequantize of the same weights (kernels never change results)."""
    from warp_providers import Engine

    out = convert_to(hf_dir, tmp_path / "q.warp", experts=experts, trunk=trunk)
    qdq = quant_dequant(model, experts if experts != "f32" else trunk,
                        experts_only=trunk == "f32")
    ref = logits(qdq, PROMPT).numpy()
    ref_tokens, _ = greedy_ref(qdq, PROMPT, DECODE_STEPS)
    with Engine.open(out, threads=2) as eng:
        d = np.abs(eng.eval(PROMPT, all_logits=True) - ref).max()
        assert d <= 1e-4, f"{tag} {experts}/{trunk}: max |d| = {d:.3g}"
        eng.reset()
        assert eng.generate(PROMPT, max_tokens=16, stop_ids=[]).token_ids == ref_tokens


def check_f32_container(container: Path, reference: tuple, tag: str,
                        chunks: Iterable[int | None] = (None,)) -> None:
    """An F32 container against the precomputed reference of `referenced_models`, once per
    prefill chunk (None: the engine's default)."""
    from warp_providers import Engine

    _, _, ref_all, ref_tokens, ref_steps = reference
    for chunk in chunks:
        opts = {} if chunk is None else {"prefill_chunk": chunk}
        label = tag if chunk is None else f"{tag} chunk {chunk}"
        with Engine.open(container, threads=2, **opts) as eng:
            assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps, label)


def check_q8_0_against(reference: tuple, tmp_path: Path, qdq: Any, tag: str) -> None:
    """Q8_0 container of the reference's HF dir: `assert_q8_0_matches`, with `qdq` the
    model on its quantize -> dequantize weights."""
    from warp_providers import Engine

    _, hf_dir, ref_all, ref_tokens, _ = reference
    out = convert_to(hf_dir, tmp_path / "q8.warp", experts="q8_0", trunk="q8_0")
    qdq_tokens, _ = greedy_ref(qdq, PROMPT, DECODE_STEPS)
    with Engine.open(out, threads=2) as eng:
        assert_q8_0_matches(eng, PROMPT, ref_all, ref_tokens, logits(qdq, PROMPT).numpy(),
                            qdq_tokens, tag)


def check_q8_0_exact(hf_dir: Path, tmp_path: Path, qdq: Any, name: str, tag: str) -> None:
    """The Q8_0 container (written as `name`) computes exactly what transformers computes
    on the quantize -> dequantize weights `qdq`, and continues with the same tokens."""
    from warp_providers import Engine

    out = convert_to(hf_dir, tmp_path / name, experts="q8_0", trunk="q8_0")
    ref = logits(qdq, PROMPT).numpy()
    ref_tokens, _ = greedy_ref(qdq, PROMPT, DECODE_STEPS)
    with Engine.open(out, threads=2) as eng:
        d = np.abs(eng.eval(PROMPT, all_logits=True) - ref).max()
        assert d <= 1e-4, f"{tag} q8_0: max |d| = {d:.3g}"
        eng.reset()
        assert eng.generate(PROMPT, max_tokens=16, stop_ids=[]).token_ids == ref_tokens


def check_streaming_and_threads(container: Path) -> None:
    """Streaming at the floor is bit-identical, and one thread gives the same trace as two."""
    from warp_providers import plan_memory

    plan = plan_memory(container)
    assert plan["floor_bytes"] < plan["floor_bytes"] + plan["experts_total_bytes"]
    assert_streaming_bit_identical(container, PROMPT, 16)
    full = greedy_trace(container, PROMPT, 16)
    assert np.array_equal(greedy_trace(container, PROMPT, 16, threads=1), full)


def check_state_resumes_decode(container: Path, tmp_path: Path) -> None:
    """State saved after the prompt less its last token, loaded by a fresh engine,
    continues with bit-identical decode logits."""
    from warp_providers import Engine

    state = tmp_path / "s.state"

    def decode(eng: Any) -> np.ndarray:
        rows = [eng.eval([PROMPT[-1]])]
        for _ in range(11):
            rows.append(eng.eval([int(rows[-1].argmax())]))
        return np.stack(rows)

    with Engine.open(container, threads=2) as eng:
        eng.eval(PROMPT[:-1])
        eng.save_state(state)
        uninterrupted = decode(eng)
    with Engine.open(container, threads=2) as eng:
        eng.load_state(state)
        assert eng.position == len(PROMPT) - 1
        assert np.array_equal(decode(eng), uninterrupted)


def check_state_replaces_other_state(hf_dir: Path, tmp_path: Path,
                                     prompt: list[int] = PROMPT,
                                     cont: tuple[int, ...] = (7, 8, 9, 10), other: int = 5,
                                     generate: int = 0) -> None:
    """State saved after `prompt`, loaded over the state of prompt[:other], gives the same
    logits on `cont`; with `generate`, loaded again, the same greedy continuation of that
    many tokens."""
    from warp_providers import Engine

    out = convert_to(hf_dir, tmp_path / "st.warp", experts="f32", trunk="f32")
    with Engine.open(out, threads=2) as eng:
        eng.eval(prompt)
        eng.save_state(tmp_path / "s.state")
        want = [eng.eval([t]) for t in cont]
        if generate:
            want_gen = eng.generate(prompt, max_tokens=generate, stop_ids=[]).token_ids
    with Engine.open(out, threads=2) as eng:
        eng.eval(prompt[:other])  # some other state, replaced by the load
        eng.load_state(tmp_path / "s.state")
        got = [eng.eval([t]) for t in cont]
        if generate:
            eng.load_state(tmp_path / "s.state")
            got_gen = eng.generate(prompt, max_tokens=generate, stop_ids=[]).token_ids
    for a, b in zip(want, got):
        assert np.array_equal(a, b)
    if generate:
        assert got_gen == want_gen


def check_plan_state_bytes(hf_dir: Path, tmp_path: Path,
                           hand: Callable[[dict[str, Any], int], dict[str, int]]) -> None:
    """plan_memory's state_bytes (and their sum, kv_bytes) equal `hand(hparams, ctx)`."""
    from warp_providers import plan_memory

    out = convert_to(hf_dir, tmp_path / "p.warp", experts="q8_0", trunk="q8_0")
    hp = manifest(out)["hparams"]
    for ctx in (64, 300):
        plan = plan_memory(out, ctx=ctx)
        assert plan["state_bytes"] == hand(hp, ctx)
        assert plan["kv_bytes"] == sum(hand(hp, ctx).values())


def router_inputs(model: Any, ids: list[int]) -> dict[int, np.ndarray]:
    """Inputs of every biased MoE router over a forward pass of ids, by layer."""
    import torch

    got: dict[int, np.ndarray] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "e_score_correction_bias"):
            continue
        hooks.append(gate.register_forward_hook(
            lambda mod, inp, out, i=i: got.__setitem__(i, inp[0].reshape(-1, inp[0].shape[-1])
                                                        .detach().numpy().copy())))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return got


def check_draw_changes_selections(model: Any, name: str, need_groups: bool) -> None:
    """The draw's routing bias changes some top-k selections over PROMPT, and with
    need_groups its group limit does too (else a mistake in either could not show)."""
    cfg = model.config
    k, e, g = cfg.num_experts_per_tok, cfg.n_routed_experts, cfg.n_group
    by_bias = by_group = 0
    for i, x in router_inputs(model, PROMPT).items():
        gate = model.model.layers[i].mlp.gate
        w = gate.weight.detach().numpy()
        bias = gate.e_score_correction_bias.detach().numpy()
        s = 1 / (1 + np.exp(-(x @ w.T)))
        choice = s + bias
        for row_s, row_c in zip(s, choice):
            plain = set(np.argsort(-row_c)[:k])
            by_bias += plain != set(np.argsort(-row_s)[:k])
            gs = np.sort(row_c.reshape(g, e // g), axis=1)[:, -2:].sum(1)
            keep = np.argsort(-gs)[:cfg.topk_group]
            masked = np.full(e, -np.inf)
            per = e // g
            for gi in keep:
                masked[gi * per:(gi + 1) * per] = row_c[gi * per:(gi + 1) * per]
            by_group += set(np.argsort(-masked)[:k]) != plain
    assert by_bias > 0, f"{name}: the bias never changes a selection"
    if need_groups:
        assert by_group > 0, f"{name}: the group limit never changes a selection"


def require_gguf() -> None:
    """The quantization reference (gguf's quantize/dequantize) must be importable."""
    requires(has_module("gguf"), "gguf (quantization reference)")


# --------------------------------------------------------------------------- shared suites
# The fixtures and tests that several `oracle/test_<model_type>.py` modules run unchanged,
# written once. Each factory returns them in a tuple the module binds to module-level
# names (the names pytest collects, so the test ids are the module's own); tests a module
# alone runs stay in that module.

HandStateBytes = Callable[..., dict[str, int]]


def decoder_suite(configs: dict[str, Callable[[], Any]], seeds: dict[str, int],
                  exact: tuple[str, str, str]) -> tuple[Callable[..., Any], ...]:
    """The `saved_models` decoders: (models fixture, test_f32_matches_transformers,
    test_q8_0_same_greedy_and_small_kl, test_q4_0_experts_kl,
    test_quantized_container_is_exact_on_its_own_weights).

    F32 max |dlogit| <= 1e-4 at every position of a 32-token prompt and over 16
    incremental decode steps with the KV cache; Q8_0 the same 16-token greedy continuation
    and mean KL <= 1e-3; Q4_0 experts mean KL <= 3e-2; the engine's exactness on the
    quantize -> dequantize weights, for the (arch, experts, trunk) of `exact`.
    """
    import pytest

    archs = list(configs)

    @pytest.fixture(scope="module")
    def models(oracle_env, tmp_path_factory):
        """name -> (torch model, HF dir); built once per module."""
        return saved_models(configs, tmp_path_factory, seeds)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_f32_matches_transformers(arch, models, tmp_path):
        check_f32_converted(*models[arch], tmp_path, arch)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_q8_0_same_greedy_and_small_kl(arch, models, tmp_path):
        check_q8_0_converted(*models[arch], tmp_path, arch)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_q4_0_experts_kl(arch, models, tmp_path):
        check_q4_0_experts_kl(*models[arch], tmp_path, arch)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch,experts,trunk", [exact])
    def test_quantized_container_is_exact_on_its_own_weights(arch, experts, trunk, models,
                                                            tmp_path):
        check_exact_on_quantized(*models[arch], tmp_path, experts, trunk, arch)

    return (models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
            test_q4_0_experts_kl, test_quantized_container_is_exact_on_its_own_weights)


def quant_dequant_q8_keeping_gate(model: Any) -> Any:
    """A copy whose matrices went through Q8_0 quantize -> dequantize (routers kept f32)."""
    return quant_dequant(model, "q8_0", experts_only=False, routers=("mlp.gate.weight",))


def _q8_0_tests(archs: list[str], qdq: Callable[[Any], Any]) -> tuple[Callable[..., Any], ...]:
    """(test_q8_0_same_greedy_and_small_kl, test_q8_0_container_is_exact_on_its_own_weights)
    over the `referenced_models` fixture, `qdq(model)` giving the model on the Q8_0
    quantize -> dequantize of the weights its container stores."""
    import pytest

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_q8_0_same_greedy_and_small_kl(arch, models, tmp_path):
        check_q8_0_against(models[arch], tmp_path, qdq(models[arch][0]), arch)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_q8_0_container_is_exact_on_its_own_weights(arch, models, tmp_path):
        """The engine computes exactly on Q8_0 blocks: the same logits as transformers
        running the quantize -> dequantize of the same weights (an absorbed MLA reads kv_b
        in its Q8_0 blocks), and the same greedy continuation."""
        require_gguf()
        model, hf_dir = models[arch][:2]
        check_q8_0_exact(hf_dir, tmp_path, qdq(model), "q8.warp", arch)

    return test_q8_0_same_greedy_and_small_kl, test_q8_0_container_is_exact_on_its_own_weights


def routed_suite(configs: dict[str, Callable[[], Any]], seeds: dict[str, int],
                 routing_bias_std: float, hand_state_bytes: HandStateBytes,
                 ) -> tuple[Callable[..., Any], ...]:
    """The sigmoid-routed decoders with a selection bias, checked on one F32 container per
    draw: (models fixture, f32_containers fixture, test_f32_matches_transformers,
    test_q8_0_same_greedy_and_small_kl, test_q8_0_container_is_exact_on_its_own_weights,
    test_streaming_at_floor_bit_identical, test_state_roundtrip_continues_identically,
    test_plan_kv_bytes_by_hand). `hand_state_bytes(config, ctx)` is the plan's
    state_bytes worked out by hand; kv_bytes must be their sum."""
    import pytest

    archs = list(configs)

    @pytest.fixture(scope="module")
    def models(oracle_env, tmp_path_factory):
        """name -> (torch model, HF dir, reference prompt logits, greedy tokens, step logits)."""
        return referenced_models(configs, tmp_path_factory, seeds, std=STD,
                                 routing_bias_std=routing_bias_std)

    @pytest.fixture(scope="module")
    def f32_containers(models, tmp_path_factory):
        return {name: convert_to(models[name][1],
                                 tmp_path_factory.mktemp(f"w-{name}") / "m.warp",
                                 experts="f32", trunk="f32") for name in archs}

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_f32_matches_transformers(arch, models, f32_containers):
        check_f32_container(f32_containers[arch], models[arch], arch)

    test_q8_0_same_greedy_and_small_kl, test_q8_0_container_is_exact_on_its_own_weights = (
        _q8_0_tests(archs, quant_dequant_q8_keeping_gate))

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_streaming_at_floor_bit_identical(arch, f32_containers):
        check_streaming_and_threads(f32_containers[arch])

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_state_roundtrip_continues_identically(arch, f32_containers, tmp_path):
        check_state_resumes_decode(f32_containers[arch], tmp_path)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_plan_kv_bytes_by_hand(arch, models, f32_containers):
        from warp_providers import plan_memory

        cfg = models[arch][0].config
        out = f32_containers[arch]
        for ctx in (64, 1000):
            plan = plan_memory(out, ctx=ctx)
            want = hand_state_bytes(cfg, ctx)
            assert plan["kv_bytes"] == sum(want.values()), (arch, ctx, plan["kv_bytes"], want)
            assert plan["state_bytes"] == want

    return (models, f32_containers, test_f32_matches_transformers,
            test_q8_0_same_greedy_and_small_kl, test_q8_0_container_is_exact_on_its_own_weights,
            test_streaming_at_floor_bit_identical, test_state_roundtrip_continues_identically,
            test_plan_kv_bytes_by_hand)


def check_streaming_converted(hf_dir: Path, tmp_path: Path, steps: int) -> None:
    """`assert_streaming_bit_identical` on the Q8_0 container of hf_dir."""
    out = convert_to(hf_dir, tmp_path / "s.warp", experts="q8_0", trunk="q8_0")
    assert_streaming_bit_identical(out, PROMPT, steps)


def converted_suite(configs: dict[str, Callable[[], Any]], routing_bias_std: float,
                    hand_state_bytes: HandStateBytes) -> tuple[Callable[..., Any], ...]:
    """The decoders checked on a container converted per test, F32 prefill in chunks of 64
    and 5: (models fixture, test_f32_matches_transformers,
    test_q8_0_same_greedy_and_small_kl, test_q8_0_container_is_exact_on_its_own_weights,
    test_streaming_at_floor_bit_identical, test_state_roundtrip_continues_identically,
    test_plan_state_bytes), the last against `hand_state_bytes(hparams, ctx)`."""
    import pytest

    archs = list(configs)

    @pytest.fixture(scope="module")
    def models(oracle_env, tmp_path_factory):
        return referenced_models(configs, tmp_path_factory, std=STD,
                                 routing_bias_std=routing_bias_std)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_f32_matches_transformers(arch, models, tmp_path):
        out = convert_to(models[arch][1], tmp_path / "m.warp", experts="f32", trunk="f32")
        check_f32_container(out, models[arch], arch, chunks=(64, 5))

    test_q8_0_same_greedy_and_small_kl, test_q8_0_container_is_exact_on_its_own_weights = (
        _q8_0_tests(archs, quant_dequant_q8_stored_rows))

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_streaming_at_floor_bit_identical(arch, models, tmp_path):
        check_streaming_converted(models[arch][1], tmp_path, 16)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_state_roundtrip_continues_identically(arch, models, tmp_path):
        check_state_replaces_other_state(models[arch][1], tmp_path)

    @pytest.mark.oracle
    @pytest.mark.parametrize("arch", archs)
    def test_plan_state_bytes(arch, models, tmp_path):
        check_plan_state_bytes(models[arch][1], tmp_path, hand_state_bytes)

    return (models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
            test_q8_0_container_is_exact_on_its_own_weights,
            test_streaming_at_floor_bit_identical, test_state_roundtrip_continues_identically,
            test_plan_state_bytes)


def damaged_copy(path: Path, bad: Path, target: str, case: str) -> Path:
    """A copy of container `path` at `bad` whose manifest lacks trunk tensor `target`
    (case "missing") or gives it its transposed shape (case "shape", same bytes)."""
    import shutil

    shutil.copytree(path, bad)
    man = json.loads((bad / "manifest.json").read_text())
    ts = man["trunk"]["tensors"]
    if case == "missing":
        man["trunk"]["tensors"] = [t for t in ts if t["name"] != target]
    else:
        t = next(t for t in ts if t["name"] == target)
        t["shape"] = [t["shape"][1], t["shape"][0]]
    (bad / "manifest.json").write_text(json.dumps(man))
    return bad
