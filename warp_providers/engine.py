"""The Python contract of the engine: `Engine`, `plan_memory` and generation.

Owns: argument validation before anything crosses into C (types, ranges, budgets given as
"6G" strings), the prompt cache (a new prompt reuses the longest common prefix of the
context), and the token loop: `stream()` yields `TokenEvent`s and `generate()` is a fold
over it. Sampling lives in `sampling.py`, text<->ids in `tokenizer.py`.
Refuses: unknown options (TypeError), a missing model (ModelNotFoundError), a prompt
that does not fit the context (ContextOverflowError).
Called by: the CLI, the chat session layer and through them every adapter.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from warp_providers.errors import (
    ContextOverflowError,
    ModelFormatError,
    ModelNotFoundError,
    StateMismatchError,
)
from warp_providers.sampling import LogitsProcessor, Sampler, SamplingParams
from warp_providers.tokenizer import Tokenizer

__all__ = [
    "Engine",
    "EngineLike",
    "GenerationResult",
    "TokenEvent",
    "parse_size",
    "plan_memory",
]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_POLICIES = {"lfru": 0, "lru": 1}
_ISAS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3, "neon": 4}
_HOTLIST_NAME = "hotlist"  # the learned hotlist inside a container (hotlist=True)


def parse_size(value: int | str | None) -> int | None:
    """Parses a byte size: an int, or a string like ``"6G"``, ``"512MiB"``, ``"1.5g"``.

    Sizes with a unit are binary (G = 2**30). ``None`` passes through.

    Raises:
        ValueError: the string is not a size, or the size is not positive.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("a size must be an int or a string like '6G'")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        if not m:
            raise ValueError(f"not a size: {value!r} (use bytes or e.g. '6G', '512M')")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise TypeError("a size must be an int or a string like '6G'")
    if n <= 0:
        raise ValueError(f"a size must be positive, got {value!r}")
    return n


def _options(
    where: str,
    budget: int | str | None,
    threads: int | None,
    ctx: int | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    opts: dict[str, Any] = {"budget_bytes": parse_size(budget)}
    if threads is not None:
        if not isinstance(threads, int) or threads < 0 or threads > 1024:
            raise ValueError(f"threads must be an int in [0, 1024], got {threads!r}")
        opts["n_threads"] = threads
    if ctx is not None:
        if not isinstance(ctx, int) or ctx < 1 or ctx > (1 << 24):
            raise ValueError(f"ctx must be an int in [1, 16777216], got {ctx!r}")
        opts["ctx_tokens"] = ctx
    for key, value in extra.items():
        if key == "cache_policy":
            if value not in _POLICIES:
                raise ValueError(f"cache_policy must be one of {sorted(_POLICIES)}")
            opts[key] = _POLICIES[value]
        elif key == "isa":
            if value not in _ISAS:
                raise ValueError(f"isa must be one of {sorted(_ISAS)}")
            opts[key] = _ISAS[value]
        elif key in ("direct_io", "verify", "lookahead"):
            opts[key] = int(bool(value))
        elif key in ("reader_threads", "prefill_chunk"):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a non-negative int")
            opts[key] = value
        elif key == "usable_ram":
            opts["usable_ram_bytes"] = parse_size(value)
        elif key in ("hotlist_path", "cgroup_root", "proc_root"):
            opts[key] = None if value is None else os.fspath(value)
        elif key == "hotlist":
            if not isinstance(value, bool):
                raise TypeError("hotlist must be True or False (hotlist_path= names a file)")
        else:
            raise TypeError(f"unknown engine option {key!r}")
    if extra.get("hotlist"):
        if extra.get("hotlist_path") is not None:
            raise ValueError("give hotlist=True or hotlist_path=, not both")
        opts["hotlist_path"] = str(Path(where) / _HOTLIST_NAME)
    return opts


def _container(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    if not p.exists():
        raise ModelNotFoundError(f"model not found: {p}")
    if not p.is_dir() or not (p / "manifest.json").is_file():
        raise ModelFormatError(
            f"{p} is not a warp container (no manifest.json); convert it with `warp convert`"
        )
    return str(p)


def plan_memory(
    path: str | os.PathLike[str],
    *,
    budget: int | str | None = None,
    ctx: int | None = None,
    threads: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Plans the memory of a container without loading it.

    Returns:
        A dict of byte counts: trunk, kv, scratch, min cache, floor, working set,
        recommended, the budget open would use and the expert cache it would get; and
        "state_bytes", the kv bytes by kind of layer state ("kv", "mla_latent",
        "recurrent", "indexer", "window", "csa", "hca"; only the kinds present).

    Raises:
        MemoryBudgetError: an explicit budget is below the floor (the message names both).
    """
    from warp_providers import _engine

    where = _container(path)
    return _engine.plan_memory(where, _options(where, budget, threads, ctx, options))


@dataclass
class TokenEvent:
    """One generated token, as `Engine.stream` yields it.

    Attributes:
        index: 0-based position in the reply.
        token_id: the sampled id.
        text: the text this token completed (may be "" while UTF-8 or a possible stop
            string is held back); the texts of all events concatenate to the reply.
        logprob: log-probability of the token under the sampling distribution.
    """

    index: int
    token_id: int
    text: str
    logprob: float


@dataclass
class GenerationResult:
    """A finished generation.

    Attributes:
        text: the reply text (a matched stop string excluded).
        token_ids: generated ids (an end-of-sequence id excluded).
        finish_reason: "stop" (EOS or a stop string), "length", or "cancelled".
        prompt_tokens: tokens of the prompt; cached_tokens of them were reused.
        stats: engine counters of this generation plus timings and tok/s.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


class EngineLike(Protocol):
    """What the layers above need from an engine; the scripted test engine has it too."""

    tokenizer: Tokenizer

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = ...,
        sampling: SamplingParams | None = ...,
        stop: Sequence[str] = ...,
        stop_ids: Sequence[int] | None = ...,
        processors: Sequence[LogitsProcessor] = ...,
        should_stop: Callable[[], bool] | None = ...,
    ) -> Iterator[TokenEvent]:
        """Yield TokenEvents; see `Engine.stream` (the keywords are the ones it takes)."""
        ...

    def info(self) -> dict[str, Any]:
        """Model facts; see `Engine.info`."""
        ...


def container_chat_metadata(
    path: str | os.PathLike[str], tokenizer: Tokenizer
) -> dict[str, str | None]:
    """A container's chat format name and chat template text (either may be None).

    Reads the manifest and the template file only; the tokenizer's own template is the
    fallback when the container names none.
    """
    import json

    from warp_providers.tokenizer import read_chat_template

    try:  # the engine has read this manifest: it is a JSON object
        manifest = json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"manifest.json: cannot be read again: {exc}") from None
    chat = (manifest.get("chat") or {}) if isinstance(manifest, dict) else None
    fmt = chat.get("format") if isinstance(chat, dict) else None
    file = chat.get("template") if isinstance(chat, dict) else None
    if not isinstance(chat, dict) or not isinstance(fmt, (str, type(None))) or \
            not isinstance(file, (str, type(None))):
        raise ModelFormatError(
            'manifest.json: chat: expected {"template": file or null, "format": name or null}'
        )
    template = None
    if file:
        if "/" in file or file in (".", ".."):
            raise ModelFormatError(f"manifest.json: chat.template: {file!r} is not a file name")
        template = read_chat_template(Path(path) / file, file)
    if template is None:
        template = getattr(tokenizer, "chat_template", None)
    return {"format": fmt, "template": template}


class Engine:
    """An open model. Use as a context manager, or call `close()`.

    Example:
        >>> with Engine.open("smollm2.warp") as eng:           # doctest: +SKIP
        ...     print(eng.generate("The capital of France is", max_tokens=8).text)
    """

    def __init__(self, ctx: Any, path: str, tokenizer: Tokenizer) -> None:
        """Use `Engine.open`."""
        self._ctx = ctx
        self.path = path
        self.tokenizer = tokenizer
        self._ids: list[int] = []  # the tokens held in the engine's context
        self._lock = threading.RLock()
        self._info = ctx.info()
        self._info["name"] = Path(path).name.removesuffix(".warp")
        self.vocab_size: int = self._info["vocab_size"]
        self._tls = threading.local()

    @property
    def last_result(self) -> GenerationResult | None:
        """The result of the last generation this thread ran to its end (per thread, so
        concurrent callers on one shared engine never read each other's results)."""
        return getattr(self._tls, "result", None)

    @last_result.setter
    def last_result(self, value: GenerationResult | None) -> None:
        self._tls.result = value

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        budget: int | str | None = None,
        threads: int | None = None,
        ctx: int | None = None,
        **options: Any,
    ) -> Engine:
        """Opens a container.

        Args:
            path: the container directory (`warp convert` output).
            budget: hard RAM ceiling in bytes or as "6G"; None lets the engine choose.
            threads: compute threads (None = physical cores).
            ctx: context length in tokens (None = min(model maximum, 4096)).
            **options: cache_policy ("lfru"/"lru"), direct_io, verify, lookahead,
                reader_threads, prefill_chunk, isa ("auto"/"scalar"/"avx2"/"avx512"/"neon"),
                hotlist (True: warm the cache from the hotlist `save_hotlist()` wrote
                in the container; no file yet is a first run, not an error),
                hotlist_path (a hotlist file elsewhere), usable_ram, cgroup_root,
                proc_root; benchmarks only: route_trace (a routing trace, JSONL or
                WPRT, whose experts replace the router's: `warp_providers.route_trace`),
                route_trace_offset (the trace token of the first token evaluated),
                route_trace_experts (the trace's expert count; default from its ids).

        Raises:
            ModelNotFoundError, ModelFormatError, UnsupportedModelError,
            MemoryBudgetError, EngineIOError.
        """
        from warp_providers import _engine

        where = _container(path)
        trace = options.pop("route_trace", None)
        offset = options.pop("route_trace_offset", 0)
        n_experts = options.pop("route_trace_experts", None)
        opts = _options(where, budget, threads, ctx, options)
        if trace is None:
            ctx_ = _engine.Context(where, opts)
        else:
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"route_trace_offset must be a non-negative int, got {offset!r}")
            from warp_providers.route_trace import binary_trace

            with binary_trace(trace, n_experts) as bin_path:  # read whole at open
                opts.update(route_trace_path=bin_path, route_trace_offset=offset)
                ctx_ = _engine.Context(where, opts)
        try:  # after the engine: token ids are checked against the model's vocabulary
            tokenizer = Tokenizer.from_dir(where, vocab_size=ctx_.info()["vocab_size"])
        except BaseException:
            ctx_.close()
            raise
        return cls(ctx_, where, tokenizer)

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Frees the model (idempotent); waits for a call or generation in progress."""
        with self._lock:
            self._ctx.close()

    @property
    def closed(self) -> bool:
        """Whether `close` has freed the model."""
        return bool(self._ctx.closed)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level ------------------------------------------------------------------
    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Evaluates ids after the current context and returns logits.

        Returns:
            float32 [vocab] for the last position, or [len(ids), vocab] if all_logits.

        Raises:
            ValueError: an id is out of range. ContextOverflowError: ids do not fit.
        """
        arr = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError("ids must be a non-empty 1-D sequence of token ids")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise ValueError(f"token id out of range [0, {self.vocab_size})")
        n = arr.size
        out = np.empty((n if all_logits else 1) * self.vocab_size, dtype=np.float32)
        with self._lock:
            self._ctx.eval(arr.astype(np.int32), out, all_logits)
            self._ids.extend(int(i) for i in arr)
        return out.reshape(n, self.vocab_size) if all_logits else out

    def prompt_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Empties the context, evaluates ids and returns the logits of every position.

        Row i is the distribution of the token after `ids[i]` (scoring a prompt, as
        `/v1/completions` does with `echo` and `logprobs`). The next `stream` of a prompt
        that starts with `ids` reuses this context.

        Returns:
            float32 [len(ids), vocab].
        """
        with self._lock:
            self.reset()
            return self.eval(ids, all_logits=True)

    @property
    def position(self) -> int:
        """Tokens held in the context."""
        return int(self._ctx.position)

    def reset(self) -> None:
        """Empties the context."""
        with self._lock:
            self._ctx.reset()
            self._ids.clear()

    def truncate(self, n: int) -> None:
        """Keeps the first n tokens of the context."""
        with self._lock:
            self._ctx.truncate(n)
            del self._ids[n:]

    def save_state(self, path: str | os.PathLike[str]) -> None:
        """Saves the context (KV cache and tokens) to a file."""
        with self._lock:
            self._ctx.save_state(os.fspath(path))
            Path(os.fspath(path) + ".ids").write_text(",".join(map(str, self._ids)))

    def load_state(self, path: str | os.PathLike[str]) -> None:
        """Restores a context saved by `save_state` of this same model."""
        with self._lock:
            self._ctx.load_state(os.fspath(path))
            side = Path(os.fspath(path) + ".ids")
            text = side.read_text() if side.exists() else ""
            self._ids = [int(t) for t in text.split(",") if t]
            if len(self._ids) != self.position:
                self._ids = []  # unknown tokens: never reuse them as a prompt prefix

    def info(self) -> dict[str, Any]:
        """Model and engine facts (model type, sizes, kernel set, resolved memory plan)."""
        return dict(self._info)

    def chat_metadata(self) -> dict[str, str | None]:
        """The container's chat format name and chat template text (either may be None)."""
        return container_chat_metadata(self.path, self.tokenizer)

    def stats(self) -> dict[str, Any]:
        """Cumulative engine counters since open (expert hits/misses, bytes read...)."""
        return self._ctx.stats()

    def save_hotlist(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Writes per-expert usage counts, to warm the cache at the next open.

        Args:
            path: the file to write; None writes the file ``hotlist`` in the container
                directory, beside its manifest, where `Engine.open(..., hotlist=True)`
                reads it. A file elsewhere is read back through `hotlist_path=`.

        Returns:
            The file written (replaced whole: written aside, then renamed).
        """
        target = Path(self.path) / _HOTLIST_NAME if path is None else Path(path)
        self._ctx.hotlist_save(os.fspath(target))
        return target

    # -- generation -----------------------------------------------------------------
    def _prefill(self, prompt: list[int]) -> tuple[np.ndarray, int]:
        """Makes the context equal `prompt` and returns the logits of its last token."""
        if not prompt:
            raise ValueError("the prompt is empty")
        ctx_tokens = self._info["ctx_tokens"]
        if len(prompt) >= ctx_tokens:
            raise ContextOverflowError(
                f"prompt of {len(prompt)} tokens does not fit the context of "
                f"{ctx_tokens} tokens (leave room for at least one generated token)"
            )
        common = 0
        for a, b in zip(self._ids, prompt):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1)  # at least one token gives the logits
        if common < len(self._ids):
            try:
                self.truncate(common)
            except StateMismatchError:  # a recurrent (KDA) state cannot rewind: start over
                self.reset()
                common = 0
        return self.eval(prompt[common:]), common

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        stop_ids: Sequence[int] | None = None,
        processors: Sequence[LogitsProcessor] = (),
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[TokenEvent]:
        """Generates tokens, yielding one `TokenEvent` each.

        After the generator is exhausted, `self.last_result` holds the `GenerationResult`.

        Args:
            prompt: text (encoded as content: no control tokens) or token ids.
            max_tokens: upper bound on generated tokens.
            sampling: sampling knobs (default greedy).
            stop: strings that end the reply (matched across token boundaries; excluded
                from the text).
            stop_ids: ids that end the reply (default: the model's EOS ids).
            processors: logit hooks (constrained decoding).
            should_stop: polled before each token; True cancels (finish "cancelled").
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        ids = (
            self.tokenizer.encode_content(prompt) if isinstance(prompt, str) else list(prompt)
        )
        params = sampling or SamplingParams()
        stops = set(self.tokenizer.eos_ids if stop_ids is None else stop_ids)
        with self._lock:
            yield from self._run(ids, max_tokens, params, list(stop), stops, processors,
                                 should_stop)

    def _run(
        self,
        ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        stop: list[str],
        stops: set[int],
        processors: Sequence[LogitsProcessor],
        should_stop: Callable[[], bool] | None,
    ) -> Iterator[TokenEvent]:
        before = self.stats()
        t0 = time.perf_counter()
        logits, cached = self._prefill(ids)
        t_prefill = time.perf_counter() - t0
        sampler = Sampler(params, processors, ids)
        decoder = self.tokenizer.incremental_decoder()
        generated: list[int] = []
        text, emitted = "", 0
        finish = "length"
        cut_by_string = False
        ended = False
        hold = max((len(s) for s in stop), default=0)
        room = self._info["ctx_tokens"] - len(ids)
        t1 = time.perf_counter()
        try:
            for index in range(min(max_tokens, room)):
                if should_stop is not None and should_stop():
                    finish = "cancelled"
                    break
                tok, logprob = sampler.sample(logits, generated)
                if tok in stops:
                    finish = "stop"
                    break
                generated.append(tok)
                text += decoder.feed(tok)
                cut = _find_stop(text, stop, emitted)
                if cut is not None:
                    text = text[:cut]
                    finish = "stop"
                    cut_by_string = True
                    if cut > emitted:
                        yield TokenEvent(index, tok, text[emitted:cut], logprob)
                        emitted = cut
                    break
                safe = len(text) - _held_prefix(text, stop, hold)
                piece = text[emitted:safe] if safe > emitted else ""
                emitted = max(emitted, safe)
                yield TokenEvent(index, tok, piece, logprob)
                if index + 1 < min(max_tokens, room):
                    logits = self.eval([tok])
            if not cut_by_string:
                text += decoder.flush()
                if len(text) > emitted and generated:
                    yield TokenEvent(len(generated) - 1, generated[-1], text[emitted:], 0.0)
            ended = True
        finally:
            # Recorded however the generation ends, a consumer that closed this generator
            # early (a stop string it matched itself, a disconnect) included: whoever reads
            # `last_result` next reads this generation, never the one before it.
            if not ended and finish == "length":
                finish = "cancelled"
            self._record(ids, cached, generated, text, finish, before, t_prefill,
                         time.perf_counter() - t1)

    def _record(self, ids: list[int], cached: int, generated: list[int], text: str,
                finish: str, before: dict[str, Any], t_prefill: float, t_decode: float) -> None:
        after = self.stats()
        stats = {k: after[k] - before[k] for k in _COUNTERS}
        evaluated = len(ids) - cached
        stats.update(
            direct_io=after["direct_io"],
            cache_bytes=after["cache_bytes"],
            peak_bytes=after["peak_bytes"],
            prefill_seconds=t_prefill,
            decode_seconds=t_decode,
            prompt_tokens_evaluated=evaluated,
            cached_tokens=cached,
            prefill_tok_s=evaluated / t_prefill if t_prefill > 0 else 0.0,
            decode_tok_s=(len(generated) / t_decode) if t_decode > 0 and generated else 0.0,
        )
        lookups = stats["expert_lookups"]
        stats["hit_rate"] = stats["expert_hits"] / lookups if lookups else 0.0
        self.last_result = GenerationResult(
            text=text, token_ids=generated, finish_reason=finish, prompt_tokens=len(ids),
            cached_tokens=cached, stats=stats,
        )

    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> GenerationResult:
        """Runs `stream` to the end and returns the `GenerationResult`."""
        for _ in self.stream(prompt, **kwargs):
            pass
        assert self.last_result is not None
        return self.last_result


_COUNTERS = (
    "tokens", "expert_lookups", "expert_hits", "expert_misses", "prefetch_issued",
    "prefetch_hits", "bytes_read", "other_bytes_read", "read_seconds", "eval_seconds",
)


def _find_stop(text: str, stop: list[str], emitted: int) -> int | None:
    """Index where the earliest stop string starts, if one is complete in text."""
    best = None
    for s in stop:
        if not s:
            continue
        i = text.find(s, max(0, emitted - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def _held_prefix(text: str, stop: list[str], hold: int) -> int:
    """Length of the tail of text that could still begin a stop string."""
    for k in range(min(hold, len(text)), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stop):
            return k
    return 0

