"""The Python contract of the engine: `Engine`, `plan_memory` and generation.

Owns: argument validation before anything crosses into C (types, ranges, budgets given as
"6G" strings), opening the context with its sequences (`max_sequences`), the low-level
calls on sequence 0, and `stream()`, which hands a request to the engine's scheduler
(`scheduler.py`: batched steps, prefix reuse across sequences) and yields its
`TokenEvent`s; `generate()` is a fold over it. The token loop of one request lives in
`generation.py`, sampling in `sampling.py`, text<->ids in `tokenizer.py`.
Refuses: unknown options (TypeError), a missing model (ModelNotFoundError), a prompt
that does not fit the context (ContextOverflowError).
Called by: the CLI, the chat session layer and through them every adapter.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from warp_providers.errors import (
    ContextOverflowError,
    MemoryBudgetError,
    ModelFormatError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from warp_providers.generation import GenerationResult, Request, TokenEvent
from warp_providers.sampling import LogitsProcessor, SamplingParams
from warp_providers.scheduler import Scheduler
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
        elif key == "vision":
            if not isinstance(value, bool):
                raise TypeError("vision must be True or False")
            if value:
                opts[key] = 1  # load the container's vision tower (counted in the plan)
        elif key in ("direct_io", "verify", "lookahead"):
            opts[key] = int(bool(value))
        elif key == "max_sequences":
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 256:
                raise ValueError(f"max_sequences must be an int in [1, 256], got {value!r}")
            opts[key] = value
        elif key == "exact":
            if value is not None and value != "auto":
                if not isinstance(value, bool):
                    raise TypeError(f"exact must be True, False, None or 'auto', got {value!r}")
                opts[key] = int(value)
        elif key == "experts_per_token":  # the range (1..the model's top_k) is the engine's
            if value is not None:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValueError(
                        f"experts_per_token must be a non-negative int, got {value!r}")
                opts[key] = value
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
        "recurrent", "indexer", "window", "csa", "hca"; only the kinds present);
        "vision_weight_bytes" and "vision_reserve_bytes" (the image tower's weights and the
        work of one image at its patch limit, 0 without a tower) and "vision_bytes", their
        sum when planned with ``vision=True`` (counted in the floor), else 0.

    Raises:
        MemoryBudgetError: an explicit budget is below the floor (the message names both).
    """
    from warp_providers import _engine

    where = _container(path)
    opts = _options(where, budget, threads, ctx, options)
    n = _sequences(_engine, opts)[0]
    return _engine.plan_memory(where, opts if n is None else {**opts, "max_sequences": n})


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
        prefixes: Sequence[int] = ...,
    ) -> Iterator[TokenEvent]:
        """Yield TokenEvents; see `Engine.stream` (the keywords are the ones it takes; an
        engine with a vision tower also takes `images=`)."""
        ...

    def info(self) -> dict[str, Any]:
        """Model facts; see `Engine.info`."""
        ...


def _precision(x8_max_tokens: int, x8_dtypes: str) -> str:
    """The activation precision an open resolved `exact` to, in words."""
    if x8_max_tokens == 0:
        return "float32"
    if x8_max_tokens >= 0xFFFFFFFF:
        return "8-bit"
    return (f"8-bit for {x8_dtypes.replace(',', ', ')} weights in steps of at most "
            f"{x8_max_tokens} tokens, float32 otherwise")


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


DEFAULT_SEQUENCES = 4
"""Sequences an engine opens when `max_sequences` is not given (fewer if the budget
cannot hold them: 2, then 1)."""
STEP_PREFILL = 64
"""Prompt tokens a request evaluates per step while other requests are decoding (the
`prefill_chunk` option when given), so a long prompt never stalls them."""


def _sequences(binding: Any, opts: dict[str, Any]) -> list[int | None]:
    """The `max_sequences` values to try, in order (None: the binding has no such option).

    Raises:
        ValueError: more than one sequence was asked of a binding that runs one.
    """
    asked = opts.pop("max_sequences", None)
    if not hasattr(binding.Context, "seq_open"):
        if asked not in (None, 1):
            raise ValueError(f"max_sequences={asked}: this build of the engine runs one "
                             "sequence per context")
        return [None]
    return [asked] if asked is not None else [DEFAULT_SEQUENCES, 2, 1]


def _open_context(binding: Any, where: str, opts: dict[str, Any]) -> Any:
    """Opens the binding's Context with as many sequences as asked (or as fit by default)."""
    tries = _sequences(binding, opts)
    for n in tries:
        try:
            return binding.Context(where, opts if n is None else {**opts, "max_sequences": n})
        except MemoryBudgetError as exc:
            if len(tries) == 1 and n is not None and n > 1:
                raise MemoryBudgetError(
                    f"the budget does not hold {n} concurrent sequences (max_sequences={n}): "
                    f"{exc.detail}; lower max_sequences or raise the budget", exc.status,
                ) from None
            if n == tries[-1]:
                raise
    raise AssertionError("unreachable")


class Engine:
    """An open model. Use as a context manager, or call `close()`.

    Concurrent `stream` calls (any threads) run together: a scheduler steps every active
    request in one batched evaluation, up to `max_sequences` at once (more wait their
    turn, first come first served). The low-level calls (`eval`, `prompt_logits`,
    `reset`, `truncate`, `save_state`, `load_state`) act on sequence 0, the context's own
    state, between steps.

    Example:
        >>> with Engine.open("smollm2.warp") as eng:           # doctest: +SKIP
        ...     print(eng.generate("The capital of France is", max_tokens=8).text)
    """

    def __init__(self, ctx: Any, path: str, tokenizer: Tokenizer,
                 prefill_chunk: int | None = None) -> None:
        """Use `Engine.open` (a test passes its own Context double here)."""
        self._ctx = ctx
        self.path = path
        self.tokenizer = tokenizer
        self._info = ctx.info()
        self._info["name"] = Path(path).name.removesuffix(".warp")
        if "x8_max_tokens" in self._info:
            self._info["precision"] = _precision(self._info["x8_max_tokens"],
                                                 self._info.get("x8_dtypes", ""))
        self.vocab_size: int = self._info["vocab_size"]
        self._sched = Scheduler(ctx, self.vocab_size, prefill_chunk or STEP_PREFILL)
        self._info["max_sequences"] = self._sched.max_sequences
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
                reader_threads, prefill_chunk (also the prompt tokens a request evaluates
                per step while others decode), isa ("auto"/"scalar"/"avx2"/"avx512"/"neon"),
                exact (True: float32 activations in every matmul; False: 8-bit
                activations, two int8 planes of about 16 bits in all, against quantized
                weights; None or "auto", the default: 8-bit for one-token steps (decode)
                on the weight types whose 8-bit kernels are faster on this CPU (every
                quantized type with VNNI; Q4_0 and MXFP4 with AVX2 alone), float32
                otherwise, so prefill stays float32, but with AMX-INT8 tiles every step,
                prefill included, is 8-bit; `info()["precision"]` says which is in
                force),
                experts_per_token (routed experts per token, 1..the model's top_k: the
                router keeps the N highest-scoring experts and weights them as the model's
                routing weights its top_k, so the model runs as its top-N variant; fewer
                expert reads per token, at a measured loss (docs/BENCHMARKS.md); None or 0:
                as shipped; out of range raises ValueError naming it),
                hotlist (True: warm the cache from the hotlist `save_hotlist()` wrote
                in the container; no file yet is a first run, not an error),
                hotlist_path (a hotlist file elsewhere), usable_ram, cgroup_root,
                proc_root, max_sequences (requests generated at once, each with its own
                KV / recurrent state inside the budget; default `DEFAULT_SEQUENCES`, fewer
                when the budget cannot hold them; an explicit value the budget cannot
                hold raises MemoryBudgetError; a build of the engine without sequences
                runs 1); benchmarks only: route_trace (a routing trace, JSONL or WPRT,
                whose experts replace the router's: `warp_providers.route_trace`),
                route_trace_offset (the trace token of sequence 0's first token),
                route_trace_stride (trace tokens between sequence k's start and k+1's;
                default the trace's length / max_sequences, so concurrent requests
                replay different parts), route_trace_experts (the trace's expert count;
                default from its ids).

        Raises:
            ModelNotFoundError, ModelFormatError, UnsupportedModelError,
            MemoryBudgetError, EngineIOError.
        """
        from warp_providers import _engine

        where = _container(path)
        trace = options.pop("route_trace", None)
        offset = options.pop("route_trace_offset", 0)
        stride = options.pop("route_trace_stride", 0)
        n_experts = options.pop("route_trace_experts", None)
        opts = _options(where, budget, threads, ctx, options)
        if trace is None:
            ctx_ = _open_context(_engine, where, opts)
        else:
            for name, value in (("route_trace_offset", offset), ("route_trace_stride", stride)):
                if not isinstance(value, int) or value < 0:
                    raise ValueError(f"{name} must be a non-negative int, got {value!r}")
            from warp_providers.route_trace import binary_trace

            with binary_trace(trace, n_experts) as bin_path:  # read whole at open
                opts.update(
                    route_trace_path=bin_path, route_trace_offset=offset,
                    route_trace_stride=stride,
                )
                ctx_ = _open_context(_engine, where, opts)
        try:  # after the engine: token ids are checked against the model's vocabulary
            tokenizer = Tokenizer.from_dir(where, vocab_size=ctx_.info()["vocab_size"])
            return cls(ctx_, where, tokenizer, prefill_chunk=opts.get("prefill_chunk"))
        except BaseException:
            ctx_.close()
            raise

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Frees the model (idempotent): generations in progress end "cancelled" at the
        next step; a low-level call in progress finishes first."""
        if self._ctx.closed:
            return
        self._sched.close()
        with self._sched.ctx_lock:
            self._ctx.close()

    @property
    def closed(self) -> bool:
        """Whether `close` has freed the model."""
        return bool(self._ctx.closed)

    def idle(self, timeout: float | None = None) -> bool:
        """Waits until no generation is running or waiting; False if `timeout` passed."""
        return self._sched.idle(timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level (sequence 0) -----------------------------------------------------
    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Evaluates ids after the current context and returns logits.

        Returns:
            float32 [vocab] for the last position, or [len(ids), vocab] if all_logits.

        Raises:
            ValueError: an id is out of range. ContextOverflowError: ids do not fit.
        """
        arr = self._checked(ids)
        n = arr.size
        out = np.empty((n if all_logits else 1) * self.vocab_size, dtype=np.float32)
        with self._sched.seq0() as slot, self._sched.ctx_lock:
            self._ctx.eval(arr.astype(np.int32), out, all_logits)
            if slot.ids is not None:
                slot.ids.extend(int(i) for i in arr)
        return out.reshape(n, self.vocab_size) if all_logits else out

    def _checked(self, ids: Sequence[int]) -> np.ndarray:
        arr = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError("ids must be a non-empty 1-D sequence of token ids")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise ValueError(f"token id out of range [0, {self.vocab_size})")
        return arr

    def prompt_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Empties the context, evaluates ids and returns the logits of every position.

        Row i is the distribution of the token after `ids[i]` (scoring a prompt, as
        `/v1/completions` does with `echo` and `logprobs`). The next `stream` of a prompt
        that starts with `ids` reuses this context.

        Returns:
            float32 [len(ids), vocab].
        """
        with self._sched.seq0():
            self.reset()
            return self.eval(ids, all_logits=True)

    @property
    def position(self) -> int:
        """Tokens held in sequence 0, the state `eval`, `prompt_logits`, `truncate`,
        `reset` and the state files act on (generations run on the other sequences while
        one is free, and on sequence 0 only when none is)."""
        return int(self._ctx.position)

    def reset(self) -> None:
        """Empties sequence 0 and forgets the prompts the idle sequences hold, so that no
        later request reuses a prefix from before (a running generation keeps its own)."""
        with self._sched.seq0() as slot, self._sched.ctx_lock:
            self._ctx.reset()
            slot.ids = []
        self._sched.forget()

    def truncate(self, n: int) -> None:
        """Keeps the first n tokens of the context."""
        with self._sched.seq0() as slot, self._sched.ctx_lock:
            self._ctx.truncate(n)
            if slot.ids is not None:
                del slot.ids[n:]

    def save_state(self, path: str | os.PathLike[str]) -> None:
        """Saves the context (KV cache and tokens) to a file."""
        with self._sched.seq0() as slot, self._sched.ctx_lock:
            self._ctx.save_state(os.fspath(path))
            Path(os.fspath(path) + ".ids").write_text(",".join(map(str, slot.ids or [])))

    def load_state(self, path: str | os.PathLike[str]) -> None:
        """Restores a context saved by `save_state` of this same model."""
        with self._sched.seq0() as slot, self._sched.ctx_lock:
            slot.ids = None  # unknown until the load succeeds
            self._ctx.load_state(os.fspath(path))
            side = Path(os.fspath(path) + ".ids")
            text = side.read_text() if side.exists() else ""
            slot.ids = [int(t) for t in text.split(",") if t]
            if len(slot.ids) != self.position:
                slot.ids = []  # unknown tokens: never reuse them as a prompt prefix

    def info(self) -> dict[str, Any]:
        """Model and engine facts (model type, sizes, kernel set, activation precision,
        resolved memory plan, max_sequences)."""
        return dict(self._info)

    def vision_info(self) -> dict[str, Any] | None:
        """The container's vision tower facts (`arch`, `preprocessor`, `placeholder_token_id`,
        `hidden_size`...), or None when it has no tower or the engine was opened without
        it (`options={"vision": True}`)."""
        fn = getattr(self._ctx, "vision_info", None)
        info = fn() if fn is not None else None
        return dict(info) if info else None

    def image_processor(self) -> Any:
        """The preprocessing of this model's tower (`vision.ImageProcessor`), or None."""
        info = self.vision_info()
        if info is None:
            return None
        cached = getattr(self, "_image_processor", None)
        if cached is None:
            from warp_providers import vision

            cached = self._image_processor = vision.for_vision(info)
        return cached

    def encode_image(self, image: Any) -> np.ndarray:
        """Runs the tower on a `vision.PreparedImage`: rows (n_tokens, hidden_size) float32.

        Raises:
            UnsupportedModelError: No vision tower is loaded.

        """
        if self.vision_info() is None:
            raise UnsupportedModelError(
                "this model was loaded without a vision tower, so it cannot read images"
            )
        with self._sched.ctx_lock:
            rows = self._ctx.encode_image(image.rows, tuple(image.grid_thw))
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.shape[0] != image.n_tokens:
            raise ValueError(
                f"the tower returned {rows.shape[0]} rows for an image of "
                f"{image.n_tokens} positions"
            )
        return rows

    def chat_metadata(self) -> dict[str, str | None]:
        """The container's chat format name and chat template text (either may be None)."""
        return container_chat_metadata(self.path, self.tokenizer)

    def batching(self) -> dict[str, int]:
        """How generations were batched since open: "steps" (batched evaluations),
        "sequences" (the sequences they evaluated, summed: sequences / steps is the mean
        batch) and "widest" (the most sequences in one step)."""
        return self._sched.batching()

    def stats(self) -> dict[str, Any]:
        """Cumulative engine counters since open (expert hits/misses, bytes read...)."""
        with self._sched.ctx_lock:
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
        with self._sched.ctx_lock:
            self._ctx.hotlist_save(os.fspath(target))
        return target

    # -- generation -----------------------------------------------------------------
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
        images: Sequence[Any] = (),
        prefixes: Sequence[int] = (),
    ) -> Iterator[TokenEvent]:
        """Generates tokens, yielding one `TokenEvent` each.

        After the generator is exhausted (or closed), `self.last_result` holds the
        `GenerationResult` in this thread. Its stats are this request's own: timings
        (`queue_seconds` waiting for a sequence, `prefill_seconds`, `decode_seconds`),
        tokens, and its share of the engine counters of the steps it took part in (each
        step's bytes read, lookups, hits... divided among that step's requests by the
        tokens each evaluated); `cache_bytes`, `peak_bytes` and `direct_io` are the
        engine's, at the end.

        Args:
            prompt: text (encoded as content: no control tokens) or token ids.
            max_tokens: upper bound on generated tokens.
            sampling: sampling knobs (default greedy).
            stop: strings that end the reply (matched across token boundaries; excluded
                from the text).
            stop_ids: ids that end the reply (default: the model's EOS ids).
            processors: logit hooks (constrained decoding); called on the scheduler's
                thread, one request at a time.
            should_stop: polled before each token (on the scheduler's thread); True
                cancels (finish "cancelled").
            images: `vision.PreparedImage`s, one per placeholder run of the prompt ids, in
                order (`vision.expand_placeholders` makes the runs); the tower runs on
                each before the prompt is queued.
            prefixes: lengths of prompt prefixes later requests may share (the end of a
                system prompt and tool list, of the turns so far): the prefill stops at
                each (when a sequence is free to hold it: otherwise it goes past it),
                and its state is kept as a snapshot in a free sequence, so a later
                prompt starting with it prefills only what follows (on recurrent states
                too). Snapshots use only free sequences, inside the budget; the least
                recently used is replaced first. Lengths outside the prompt are ignored.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        ids = (
            self.tokenizer.encode_content(prompt) if isinstance(prompt, str) else list(prompt)
        )
        if not ids:
            raise ValueError("the prompt is empty")
        ctx_tokens = self._info["ctx_tokens"]
        if len(ids) >= ctx_tokens:
            raise ContextOverflowError(
                f"prompt of {len(ids)} tokens does not fit the context of "
                f"{ctx_tokens} tokens (leave room for at least one generated token)"
            )
        ids = [int(i) for i in self._checked(ids)]
        stops = set(self.tokenizer.eos_ids if stop_ids is None else stop_ids)
        info = self.vision_info()
        if info is not None:
            # a placeholder the model writes has no image row: it ends the reply instead
            stops.add(int(info["placeholder_token_id"]))
        req = Request(ids, min(max_tokens, ctx_tokens - len(ids)), sampling or SamplingParams(),
                      list(stop), stops, processors, should_stop, self.tokenizer,
                      prefixes)
        if images:
            self._attach_images(req, list(images))
        elif info is not None and info["placeholder_token_id"] in ids:
            raise ValueError("the prompt holds image placeholders and no images were given")
        events = self._sched.submit(req)
        try:
            yield from events
        finally:
            events.close()  # type: ignore[attr-defined]
            try:
                after = self.stats()
            except ValueError:  # closed meanwhile: the engine facts are gone with it
                after = {}
            if req.result is not None:
                req.result.stats.update({k: after[k] for k in _ENGINE_FACTS if k in after})
            self.last_result = req.result

    def _attach_images(self, req: Request, images: list[Any]) -> None:
        """Runs the tower on each image and gives the request its rows and prefix key."""
        from warp_providers import vision

        info = self.vision_info()
        if info is None:
            raise UnsupportedModelError(
                "this model was loaded without a vision tower, so it cannot read images"
            )
        ph = int(info["placeholder_token_id"])
        starts = vision.image_spans(req.ids, ph, [im.n_tokens for im in images])
        key: list[Any] = list(req.ids)
        for at, im in zip(starts, images):
            req.embeds.append((at, self.encode_image(im)))
            key[at:at + im.n_tokens] = [("image", im.digest, j) for j in range(im.n_tokens)]
        req.key = key

    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> GenerationResult:
        """Runs `stream` to the end and returns the `GenerationResult`."""
        for _ in self.stream(prompt, **kwargs):
            pass
        assert self.last_result is not None
        return self.last_result


_ENGINE_FACTS = ("direct_io", "cache_bytes", "peak_bytes")
"""Engine-wide facts a result reports as they are at its end."""
