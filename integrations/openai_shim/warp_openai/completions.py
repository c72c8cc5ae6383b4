"""POST /v1/completions: raw continuation, blocking or streamed, with echo and logprobs.

Owns: the prompt forms (a string, or token ids, alone or as a one-element list), plain
encoding (no template, marker spellings stay text), `echo` (the prompt's text first, and
with `logprobs` the prompt tokens' log-probabilities, the first one null, as lm-eval's
`local-completions` loglikelihood reads them), legacy `logprobs` (tokens, token_logprobs,
top_logprobs, text_offset), `logit_bias`, stop strings, SSE chunks of `text_completion`
objects with a usage chunk under `stream_options.include_usage`, usage details, and the
`warp` stats object on the blocking reply and on the stream's final chunks.
Refuses: more than one prompt, `logprobs` above 5, `echo` with `logprobs` on an engine
that cannot score a prompt; validation errors are 400s naming the field.
Called by `api.WarpAPI.completions`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from warp_openai import api as _api
from warp_openai.api import APIError, ChunkStream, usage_body
from warp_openai.bias import logit_bias
from warp_providers import Usage

__all__ = ["MAX_LOGPROBS", "completions"]

MAX_LOGPROBS = 5
"""The most alternatives the legacy `logprobs` field may ask for (OpenAI's limit)."""


class _Capture:
    """A last logits processor that keeps the distribution of the position being sampled.

    It sees the logits after the request's biases and before temperature, so with greedy
    decoding its log-probability of the sampled token is the engine's own. Only the latest
    position is kept: the engine yields each token before it evaluates the next one.
    """

    def __init__(self) -> None:
        self.count = 0
        self.last: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, generated: Any, logits: np.ndarray) -> None:
        self.count += 1
        self.last = _log_softmax(logits)


def _log_softmax(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = logits.astype(np.float64)
    finite = np.isfinite(x)
    m = x[finite].max()
    lse = m + np.log(np.exp(x[finite] - m).sum())
    return x, np.asarray(lse)


def _lp(row: tuple[np.ndarray, np.ndarray], tok: int) -> float:
    x, lse = row
    return float(x[tok] - lse)


def _top(row: tuple[np.ndarray, np.ndarray], n: int, piece: Callable[[int], str]
         ) -> dict[str, float]:
    x, lse = row
    if n <= 0:
        return {}
    idx = np.argpartition(-x, min(n, x.size - 1))[:n]
    idx = idx[np.argsort(-x[idx], kind="stable")]
    out: dict[str, float] = {}
    for i in idx:
        out.setdefault(piece(int(i)), float(x[i] - lse))
    return out


def _held(text: str, stop: list[str]) -> int:
    """Length of the longest end of `text` that could begin a stop string."""
    for k in range(min(len(text), max((len(s) for s in stop), default=1) - 1), 0, -1):
        if any(s.startswith(text[-k:]) for s in stop):
            return k
    return 0


def _prompt_ids(req: Mapping[str, Any], tokenizer: Any, vocab: int) -> tuple[list[int], str]:
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        if any(not 0 <= t < vocab for t in prompt):
            raise APIError(400, f"'prompt' token ids must be between 0 and {vocab - 1}",
                           param="prompt")
        return list(prompt), tokenizer.decode(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise APIError(400, "'prompt' must be one string or one list of token ids: this "
                       "engine answers one prompt per request", param="prompt")
    if not isinstance(prompt, str):
        raise APIError(400, "'prompt' must be a string", param="prompt")
    if not prompt:
        raise APIError(400, "'prompt' must be a non-empty string", param="prompt")
    ids = tokenizer.encode_content(prompt)
    if not ids:
        raise APIError(400, "'prompt' encoded to no tokens", param="prompt")
    return ids, prompt


def _flag(req: Mapping[str, Any], key: str) -> bool:
    value = req.get(key)
    if value is not None and not isinstance(value, bool):
        raise APIError(400, f"'{key}' must be a boolean", param=key)
    return bool(value)


def _legacy_logprobs(req: Mapping[str, Any]) -> int | None:
    value = req.get("logprobs")
    if value is None or value is False:
        return None
    if value is True:
        return 0
    if not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise APIError(400, f"'logprobs' must be an integer between 0 and {MAX_LOGPROBS}",
                       param="logprobs")
    return value


class _Entries:
    """The legacy logprobs object, filled token by token."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []
        self.offset = 0

    def add(self, text: str, logprob: float | None, top: dict[str, float] | None) -> None:
        self.tokens.append(text)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def since(self, start: int) -> dict[str, Any]:
        return {"tokens": self.tokens[start:], "token_logprobs": self.token_logprobs[start:],
                "top_logprobs": self.top_logprobs[start:],
                "text_offset": self.text_offset[start:]}


def completions(
    surface: Any, req: dict[str, Any], *, should_stop: Callable[[], bool] | None = None
) -> tuple[int, dict[str, Any] | ChunkStream]:
    """Answers one /v1/completions request on `surface` (a `WarpAPI`)."""
    engine = surface.engine
    tokenizer = engine.tokenizer
    vocab = int(engine.info().get("vocab_size") or tokenizer.vocab_size)
    ids, prompt_text = _prompt_ids(req, tokenizer, vocab)
    stream = _flag(req, "stream")
    echo = _flag(req, "echo")
    n_top = _legacy_logprobs(req)
    ctx = int(engine.info().get("ctx_tokens", 0) or 0)
    if ctx and len(ids) >= ctx:
        raise APIError(400, f"prompt is {len(ids)} tokens, and this model's context is {ctx}",
                       param="prompt", code="context_length_exceeded")
    if echo and req.get("max_tokens") == 0 and "max_completion_tokens" not in req:
        limit = 0  # score the prompt only
    else:
        limit = _api._max_tokens(req, surface.default_max_tokens)
        if ctx:
            limit = min(limit, max(1, ctx - len(ids)))
    sampling = _api._sampling(req)
    stop = _api._stop(req)
    bias = logit_bias(req, vocab)
    include_usage = _api._stream_options(req) if stream else False
    scorer = getattr(engine, "prompt_logits", None)
    if echo and n_top is not None and scorer is None:
        raise APIError(400, "'echo' with 'logprobs' needs an engine that can score a prompt",
                       param="echo")
    ident, created = _api._new_id("cmpl-"), int(time.time())
    run = _Run(engine, ids, prompt_text, limit, sampling, stop, bias, n_top, echo, scorer)
    base = {"id": ident, "object": "text_completion", "created": created,
            "model": surface.model_id}
    if not stream:
        text = "".join(piece for piece, _ in run.pieces(should_stop))
        return 200, {**base, "choices": [{
            "index": 0, "text": text,
            "logprobs": run.entries.since(0) if run.entries is not None else None,
            "finish_reason": run.finish}], "usage": run.usage(), "warp": run.warp()}

    outer = should_stop

    def make(cancelled: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        def stop_now() -> bool:
            return cancelled() or bool(outer is not None and outer())

        def chunks() -> Iterator[dict[str, Any]]:
            for piece, lp in run.pieces(stop_now):
                yield {**base, "choices": [{"index": 0, "text": piece, "logprobs": lp,
                                            "finish_reason": None}]}
            if cancelled():
                return
            warp = run.warp()
            yield {**base, "choices": [{"index": 0, "text": "", "logprobs": None,
                                        "finish_reason": run.finish}], "warp": warp}
            if include_usage:
                yield {**base, "choices": [], "usage": run.usage(), "warp": warp}

        return chunks()

    return 200, ChunkStream(make)


class _Run:
    """One generation: yields (text piece, logprobs of that piece or None)."""

    def __init__(self, engine: Any, ids: list[int], prompt_text: str, limit: int,
                 sampling: Any, stop: list[str], bias: Any, n_top: int | None, echo: bool,
                 scorer: Any) -> None:
        self.engine, self.ids, self.prompt_text = engine, ids, prompt_text
        self.limit, self.sampling, self.stop, self.bias = limit, sampling, stop, bias
        self.n_top, self.echo, self.scorer = n_top, echo, scorer
        self.entries = _Entries() if n_top is not None else None
        self.finish = "stop"
        self.n_generated = 0
        self.cached = 0
        self.stats: dict[str, Any] = {}
        self.seconds = 0.0

    def _piece(self, tok: int) -> str:
        return str(self.engine.tokenizer.decode([tok]))

    def _echo(self) -> Iterator[tuple[str, dict[str, Any] | None]]:
        if self.entries is None:
            yield self.prompt_text, None
            return
        logits = self.scorer(self.ids)
        dec = self.engine.tokenizer.incremental_decoder()
        pieces = [dec.feed(t) for t in self.ids]
        pieces[-1] += dec.flush()
        for i, (tok, piece) in enumerate(zip(self.ids, pieces)):
            if i == 0:
                self.entries.add(piece, None, None)
                continue
            row = _log_softmax(logits[i - 1])
            self.entries.add(piece, _lp(row, tok), self._top(row, tok))
        yield "".join(pieces), self.entries.since(0)

    def _top(self, row: Any, tok: int) -> dict[str, float]:
        top = _top(row, int(self.n_top or 0), self._piece)
        if self.n_top:  # the chosen token is always listed, as OpenAI does
            top.setdefault(self._piece(tok), _lp(row, tok))
        return top

    def pieces(self, should_stop: Callable[[], bool] | None
               ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        if self.echo:
            yield from self._echo()
        if self.limit == 0:
            self.finish = "length"
            return
        t0 = time.perf_counter()
        capture = _Capture() if self.entries is not None else None
        procs = [p for p in (self.bias, capture) if p is not None]
        events = self.engine.stream(self.ids, max_tokens=self.limit, sampling=self.sampling,
                                    stop=self.stop, processors=procs, should_stop=should_stop)
        text, emitted = "", 0
        hit_stop = False
        last_index = -1
        try:
            for ev in events:
                text += ev.text
                cut = [text.find(s) for s in self.stop if s in text]
                if cut:
                    text = text[: min(cut)]
                    hit_stop = True
                if ev.index != last_index:
                    self.n_generated += 1
                lp = self._entry(ev, ev.text, capture, repeat=ev.index == last_index)
                last_index = ev.index
                safe = len(text) if hit_stop else len(text) - _held(text, self.stop)
                piece, emitted = text[emitted:safe], max(emitted, safe)
                if piece or lp is not None:
                    yield piece, lp
                if hit_stop:
                    break
            if not hit_stop and emitted < len(text):
                yield text[emitted:], None
        finally:
            # Closing records this generation's result however it ended (a stop string
            # matched here included), so `last_result` below is this request's own.
            getattr(events, "close", lambda: None)()
        self.seconds = time.perf_counter() - t0
        gen = getattr(self.engine, "last_result", None)
        if gen is None:
            return
        self.stats = dict(gen.stats)
        self.cached = int(getattr(gen, "cached_tokens", 0) or 0)
        if not hit_stop:
            self.n_generated = len(gen.token_ids)
            self.finish = "length" if gen.finish_reason == "length" else "stop"

    def _entry(self, ev: Any, piece: str, capture: _Capture | None, repeat: bool
               ) -> dict[str, Any] | None:
        entries = self.entries
        if entries is None:
            return None
        if repeat and entries.tokens:  # the decoder's flush of the last token's text
            entries.tokens[-1] += piece
            entries.offset += len(piece)
            return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        start = len(entries.tokens)
        if capture is not None and capture.last is not None and capture.count == ev.index + 1:
            row = capture.last
            entries.add(piece, _lp(row, ev.token_id), self._top(row, ev.token_id))
        else:  # an engine that does not run logits processors: the sampled token only
            entries.add(piece, float(ev.logprob),
                        {self._piece(ev.token_id): float(ev.logprob)} if self.n_top else {})
        return entries.since(start)

    def usage(self) -> dict[str, Any]:
        n_prompt = len(self.ids)
        return usage_body(Usage(prompt_tokens=n_prompt, completion_tokens=self.n_generated,
                                total_tokens=n_prompt + self.n_generated,
                                cached_tokens=min(self.cached, n_prompt)))

    def warp(self) -> dict[str, Any]:
        """The reply's `warp` stats object (zeros when only the prompt was scored)."""
        return _api._stats(self.stats, self.n_generated, self.seconds)
