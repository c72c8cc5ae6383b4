"""Randomized-config oracle: draws valid configs of an architecture and checks each one.

One module per architecture, `randcfg/<model_type>.py`, defines:

- `configs()`: a hypothesis strategy of config kwargs (a JSON-able dict) that covers the
  knobs its transformers config class exposes;
- `build(config, seed)`: the tiny random transformers model of that config, in eval mode
  (default: `transformers.<CONFIG_CLASS>(**config)` redrawn by `oracle_util.randomize`);
- optionally `prompt_lens(config)`: a strategy of prompt lengths (default 2..48), so a
  module can place prompts on both sides of every window it draws;
- optionally `postsave(hf_dir, config)`: edits the saved checkpoint (for example a
  config.json spelling such as Kimi-K2's `model_type` that transformers does not write);
- optionally `reference(model, prompt, steps)`: the reference trace (default: transformers'
  full forward recomputed for every step, no cache, the plainest reference there is);
- optionally `checkpoint(config, seed, hf_dir)`, for a model transformers does not have:
  writes the checkpoint itself and returns (reference model, hf_dir, vocab size), the
  reference model being what the module's `reference` runs (instead of `build`);
- optionally `EXAMPLES`: draws per CI run when fewer than the default fit its cost;
- optionally `refusal(config)`: for a valid config the engine cannot run, the config key
  the refusal must name (else None). `check` then asserts that converting or opening the
  checkpoint raises ConvertError or a WarpError whose message names that key. Kept for
  what is out of scope, never to hide a bug.

`check(draw, workdir)` builds the draw's model, converts it at F32 and compares the
engine with the reference: every prompt position and `STEPS` incremental decode steps
within `TOL`. A `Draw` is JSON: a failing one is saved with `save()` into `REGRESSIONS`
and replayed by CI from then on (`test_random_configs.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

ARCHES = [
    "llama", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "kimi_k2",
    "glm4_moe", "gpt_oss", "kimi_linear", "glm5_next", "deepseek_v4", "kimi_k3",
]
STEPS = 16
TOL = 1e-4
# A greedy step whose reference top-2 margin is below this is a near-tie: the engine may
# pick the other token within TOL, so only its logits are compared there.
TIE = 5e-4
REGRESSIONS = Path(__file__).resolve().parent.parent / "regressions"


@dataclasses.dataclass(frozen=True)
class Draw:
    """One randomized case: an architecture's config kwargs plus how the engine runs it."""

    arch: str
    config: dict[str, Any]
    seed: int
    prompt_len: int
    prefill_chunk: int
    threads: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Draw:
        return cls(**json.loads(text))

    def key(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]


def module(arch: str) -> Any:
    """The strategy module of an architecture."""
    return importlib.import_module(f"randcfg.{arch}")


def draws(arch: str) -> st.SearchStrategy[Draw]:
    """Draws of one architecture: a config, a seed, a prompt length and engine settings."""
    mod = module(arch)

    @st.composite
    def _draw(draw: Any) -> Draw:
        config = draw(mod.configs())
        lens = mod.prompt_lens(config) if hasattr(mod, "prompt_lens") else st.integers(2, 48)
        return Draw(
            arch=arch, config=config, seed=draw(st.integers(0, 2**16)),
            prompt_len=draw(lens), prefill_chunk=draw(st.sampled_from([1, 5, 16, 64])),
            threads=draw(st.sampled_from([1, 2])),
        )

    return _draw()


def default_build(config_class: str, config: dict[str, Any], seed: int, **randomize: Any) -> Any:
    """transformers.<config_class>(**config), weights redrawn with oracle_util.randomize."""
    import oracle_util
    import torch
    import transformers as tf

    cfg = getattr(tf, config_class)(**config)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return oracle_util.randomize(model, **randomize)


def full_forward_reference(model: Any, prompt: list[int],
                           steps: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Prompt logits, then `steps` greedy tokens, each step's logits from a full forward."""
    import torch

    with torch.no_grad():
        ids = list(prompt)
        out = model(torch.tensor([ids])).logits[0].float().numpy()
        prompt_logits, last = out, out[-1]
        tokens, rows = [], []
        for _ in range(steps):
            tok = int(last.argmax())
            tokens.append(tok)
            ids.append(tok)
            last = model(torch.tensor([ids])).logits[0, -1].float().numpy()
            rows.append(last)
    return prompt_logits, tokens, np.stack(rows)


def cached_reference(model: Any, prompt: list[int],
                     steps: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Prompt logits, then `steps` greedy tokens decoded one at a time with transformers'
    own cache (for models whose cache path is the reference)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        prompt_logits = out.logits[0].float().numpy()
        tokens, rows = [], []
        last = prompt_logits[-1]
        for _ in range(steps):
            tok = int(last.argmax())
            tokens.append(tok)
            o = model(torch.tensor([[tok]]), cache=cache, use_cache=True)
            last = o.logits[0, -1].float().numpy()
            rows.append(last)
    return prompt_logits, tokens, np.stack(rows)


def on_one_thread(fn: Any, *args: Any) -> Any:
    """fn(*args) with torch on one thread: tiny models are many small matmuls, which a
    second thread only slows down (by 50x on a loaded machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def prompt_ids(draw: Draw, vocab: int) -> list[int]:
    rng = np.random.default_rng(draw.seed)
    return [int(t) for t in rng.integers(3, min(vocab, 260), size=draw.prompt_len)]


def _margin(row: np.ndarray) -> float:
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def check(draw: Draw, workdir: Path) -> float:
    """Builds, converts (F32) and compares one draw; returns the worst |dlogit|.

    Raises AssertionError naming the draw (its JSON) on any difference above TOL.
    """
    from oracle_util import convert_to, save

    from warp_providers import Engine

    mod = module(draw.arch)
    if hasattr(mod, "checkpoint"):
        model, hf, vocab = mod.checkpoint(dict(draw.config), draw.seed, workdir / "hf")
    else:
        model = mod.build(dict(draw.config), draw.seed)
        hf = save(model, workdir / "hf")
        vocab = int(model.config.get_text_config().vocab_size)
    if hasattr(mod, "postsave"):
        mod.postsave(hf, dict(draw.config))
    refused = mod.refusal(dict(draw.config)) if hasattr(mod, "refusal") else None
    if refused is not None:
        _check_refusal(draw, hf, workdir, refused)
        return 0.0
    out = convert_to(hf, workdir / "m.warp", experts="f32", trunk="f32")
    prompt = prompt_ids(draw, vocab)
    reference = getattr(mod, "reference", full_forward_reference)
    ref_all, ref_tokens, ref_steps = reference(model, prompt, STEPS)
    tag = f"{draw.arch} draw {draw.to_json()}"
    with Engine.open(out, threads=draw.threads, prefill_chunk=draw.prefill_chunk) as eng:
        got_all = eng.eval(list(prompt), all_logits=True)
        worst = float(np.abs(got_all - ref_all).max())
        assert worst <= TOL, f"{tag}: prompt logits max |d| = {worst:.3g}"
        ref_prev, got_prev = ref_all[-1], got_all[-1]
        for step, tok in enumerate(ref_tokens):
            if _margin(ref_prev) > TIE:
                assert int(np.argmax(got_prev)) == tok, f"{tag}: greedy token {step} differs"
            got_prev = eng.eval([tok])
            d = float(np.abs(got_prev - ref_steps[step]).max())
            worst = max(worst, d)
            assert d <= TOL, f"{tag}: decode step {step} max |d| = {d:.3g}"
            ref_prev = ref_steps[step]
    return worst


def _check_refusal(draw: Draw, hf: Path, workdir: Path, key: str) -> None:
    """Converting or opening the draw's checkpoint fails with an error naming `key`."""
    from oracle_util import convert_to

    from warp_providers import Engine, WarpError
    from warp_providers.convert import ConvertError

    tag = f"{draw.arch} draw {draw.to_json()}"
    try:
        out = convert_to(hf, workdir / "m.warp", experts="f32", trunk="f32")
        with Engine.open(out, threads=draw.threads, prefill_chunk=draw.prefill_chunk):
            pass
    except (ConvertError, WarpError) as e:
        assert key in str(e), f"{tag}: refused, but without naming {key!r}: {e}"
        return
    raise AssertionError(f"{tag}: expected a refusal naming {key!r}, but it opened")


def save(draw: Draw, folder: Path = REGRESSIONS) -> Path:
    """Writes a failing draw as a regression case CI replays; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{draw.arch}-{draw.key()}.json"
    path.write_text(draw.to_json() + "\n")
    return path


def regressions(folder: Path = REGRESSIONS) -> list[Path]:
    return sorted(folder.glob("*.json")) if folder.is_dir() else []
