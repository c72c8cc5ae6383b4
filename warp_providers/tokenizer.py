"""Text <-> token ids through `tokenizers` / `tiktoken`, markup kept apart from content.

Owns: `Tokenizer` with two entry points (PROTOCOLS §1.1): `encode_content`
never yields a control-token id, whatever the text spells; `encode_markup`
recognises control tokens. `encode_segments` encodes a rendered prompt one
segment at a time (§1.2), cutting very long text as K3's encoder does.
`IncrementalDecoder` turns a generated id stream into text pieces without
splitting UTF-8 characters.

Control tokens are every added token of a `tokenizer.json` (special or not:
Qwen marks `<tool_call>` non-special, and it must still never come out of
caller text) and every special token of a tiktoken vocabulary.

Refuses: hand-written BPE; a tiktoken vocabulary without a split pattern.
Called by: chat formats (`bind`), the engine wrapper and the adapters.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from warp_providers.errors import ModelFormatError, WarpError

if TYPE_CHECKING:
    import tiktoken
    import tokenizers

__all__ = ["IncrementalDecoder", "Tokenizer", "split_long_text"]

MAX_CHUNK_CHARS = 400_000
"""K3's encoder hands the BPE at most this many characters at a time (§1.2.5)."""
MAX_RUN_CHARS = 25_000
"""Longest run of same-class (whitespace / non-whitespace) characters handed to the BPE at once."""
MAX_TOKEN_ID = 1 << 24
"""Ids are below this (the engine's vocabulary bound) when no model vocab_size is given."""
MAX_SIDE_FILE_BYTES = 1 << 30
"""Largest tokenizer, config or template file read."""
_HF_MODELS = ("BPE", "WordPiece", "WordLevel", "Unigram")


class _SegmentLike(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def markup(self) -> bool: ...


def split_long_text(text: str) -> Iterator[str]:
    """Cut text into the pieces K3's encoder hands to its BPE (PROTOCOLS §1.2.5).

    Chunks of at most 400 000 characters; inside a chunk, a run of more than
    25 000 consecutive whitespace (or non-whitespace) characters is cut so no
    piece holds more than 25 000 of them. Empty pieces are skipped.

    Args:
        text: Any text.

    Yields:
        Consecutive non-empty pieces whose concatenation is `text`.

    """
    for start in range(0, len(text), MAX_CHUNK_CHARS):
        chunk = text[start : start + MAX_CHUNK_CHARS]
        piece_start = 0
        run = 0
        run_space = chunk[0].isspace() if chunk else False
        for i, ch in enumerate(chunk):
            space = ch.isspace()
            if space != run_space:
                run_space = space
                run = 1
                continue
            run += 1
            if run > MAX_RUN_CHARS:
                if i > piece_start:
                    yield chunk[piece_start:i]
                piece_start = i
                run = 1
        if piece_start < len(chunk):
            yield chunk[piece_start:]


class _Backend(Protocol):
    def content(self, text: str) -> list[int]: ...
    def markup(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_bytes(self, token_id: int) -> bytes | None: ...
    def lookup(self, token: str) -> int | None: ...
    def size(self) -> int: ...


WORD_PROBE = "a b\nc"
"""Text any word-splitting pre-tokenizer cuts into more than one word."""


def _drop_segment_cache(tok: tokenizers.Tokenizer) -> None:
    """Turns off the BPE word cache of a tokenizer whose pre-tokenizer does not split.

    `tokenizers` keeps that cache per thread (each thread that encodes holds its own, up
    to 10,000 words, until it exits). A vocabulary that splits text into words caches
    words, which repeat; one that does not (no pre-tokenizer, or byte-level without its
    regex, as the synthetic models have) caches whole text segments, so every distinct
    prompt adds about 1 KiB to each long-lived thread that encodes it (a server's worker
    and connection threads), a copy that only an identical segment would ever hit.
    Such a vocabulary gets capacity 0. A `tokenizers` without `_resize_cache` (before
    the per-thread cache) keeps its default.
    """
    model = tok.model
    resize = getattr(model, "_resize_cache", None)
    if resize is None:
        return
    pre = tok.pre_tokenizer
    if pre is None or len(pre.pre_tokenize_str(WORD_PROBE)) <= 1:
        resize(0)


class _HFBackend:
    """`tokenizers` backend: a markup tokenizer plus a content copy that never matches them."""

    def __init__(self, spec: dict[str, Any], extra_special: Mapping[str, int]) -> None:
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as HFTokenizer

        self.markup_tok: tokenizers.Tokenizer = HFTokenizer.from_str(json.dumps(spec))
        missing = [
            AddedToken(t, special=True, normalized=False)
            for t in extra_special
            if self.markup_tok.token_to_id(t) is None
        ]
        if missing:
            self.markup_tok.add_special_tokens(missing)
        self.control: dict[int, str] = {}
        for tid, added in self.markup_tok.get_added_tokens_decoder().items():
            self.control[tid] = added.content
        for content, tid in extra_special.items():
            got = self.markup_tok.token_to_id(content)
            if got is None or (tid is not None and got != tid):
                raise ValueError(
                    f"special token {content!r} is id {got} in the vocabulary, not {tid}"
                )
            self.control[got] = content
        # The content copy: every control token is re-flagged special and
        # `encode_special_tokens` makes the library BPE their spelling as text.
        content_spec = json.loads(self.markup_tok.to_str())
        for entry in content_spec.get("added_tokens", []):
            entry["special"] = True
        self.content_tok: tokenizers.Tokenizer = HFTokenizer.from_str(json.dumps(content_spec))
        self.content_tok.encode_special_tokens = True
        for tok in (self.markup_tok, self.content_tok):
            _drop_segment_cache(tok)

    def content(self, text: str) -> list[int]:
        enc = self.content_tok.encode(text, add_special_tokens=False)
        ids = list(enc.ids)
        if not any(i in self.control for i in ids):
            return ids
        # A vocabulary that holds a control spelling as an ordinary entry (a
        # WordLevel model, say) can still emit it: cut the offending span
        # smaller until no control id remains.
        out: list[int] = []
        for tid, (start, end) in zip(ids, enc.offsets):
            out.extend(self._split_encode(text[start:end]) if tid in self.control else [tid])
        return out

    def _split_encode(self, text: str) -> list[int]:
        if len(text) <= 1:
            ids = list(self.content_tok.encode(text, add_special_tokens=False).ids)
            if any(i in self.control for i in ids):
                return list(self._bytes_fallback(text))
            return ids
        mid = len(text) // 2
        out: list[int] = []
        for half in (text[:mid], text[mid:]):
            ids = list(self.content_tok.encode(half, add_special_tokens=False).ids)
            out.extend(self._split_encode(half) if any(i in self.control for i in ids) else ids)
        return out

    def _bytes_fallback(self, text: str) -> Iterator[int]:
        for b in text.encode("utf-8"):
            tid = self.content_tok.token_to_id(f"<0x{b:02X}>")
            if tid is not None and tid not in self.control:
                yield tid

    def markup(self, text: str) -> list[int]:
        return list(self.markup_tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.markup_tok.decode(list(ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes | None:
        return None

    def lookup(self, token: str) -> int | None:
        tid = self.markup_tok.token_to_id(token)
        return None if tid is None else int(tid)

    def size(self) -> int:
        return int(self.markup_tok.get_vocab_size(with_added_tokens=True))


class _TiktokenBackend:
    """`tiktoken` backend: `encode_ordinary` for content, all specials allowed for markup."""

    def __init__(self, enc: tiktoken.Encoding) -> None:
        self.enc = enc
        self.control: dict[int, str] = {tid: tok for tok, tid in enc._special_tokens.items()}
        self.ranks: dict[bytes, int] = enc._mergeable_ranks

    def content(self, text: str) -> list[int]:
        return list(self.enc.encode_ordinary(text))

    def markup(self, text: str) -> list[int]:
        return list(self.enc.encode(text, allowed_special="all", disallowed_special=()))

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.token_bytes(i) or b"" for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes | None:
        if token_id in self.control:
            return self.control[token_id].encode("utf-8")
        try:
            return bytes(self.enc.decode_single_token_bytes(token_id))
        except KeyError:
            return None

    def lookup(self, token: str) -> int | None:
        for tid, tok in self.control.items():
            if tok == token:
                return tid
        return self.ranks.get(token.encode("utf-8"))

    def size(self) -> int:
        return int(self.enc.n_vocab)


class Tokenizer:
    """A model's vocabulary with separate content and markup entry points.

    Example:
        >>> tok = Tokenizer.from_dir("model/")          # doctest: +SKIP
        >>> tok.encode_content("<|im_end|>") != tok.encode_markup("<|im_end|>")  # doctest: +SKIP
        True

    """

    def __init__(
        self,
        backend: _Backend,
        control: Mapping[int, str],
        *,
        eos_ids: Iterable[int] | None = None,
        bos_id: int | None = None,
        chat_template: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        """Wrap a backend; use the `from_*` constructors instead of calling this."""
        self._backend = backend
        self._control = dict(control)
        self._by_spelling = {text: tid for tid, text in self._control.items()}
        self.eos_ids: tuple[int, ...] = tuple(eos_ids or ())
        """Ids that end generation by default (from the tokenizer config, or given)."""
        self.bos_id: int | None = bos_id
        """Beginning-of-sequence id, never added by the chat path (§1.2.4)."""
        self.chat_template: str | None = chat_template
        """The model's own jinja2 chat template, when its directory carries one."""
        self.config: dict[str, Any] = dict(config or {})
        """`tokenizer_config.json` as read by `from_dir` (empty otherwise)."""

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_tokenizer_json(
        cls,
        path_or_json_str: str | os.PathLike[str],
        special_tokens: Mapping[str, int] | None = None,
        eos_ids: Iterable[int] | None = None,
        bos_id: int | None = None,
        **kwargs: Any,
    ) -> Tokenizer:
        """Build from a Hugging Face `tokenizer.json` (a path, or the JSON text itself).

        Args:
            path_or_json_str: File path or the JSON document.
            special_tokens: Extra control tokens, spelling -> id; spellings
                not yet in the vocabulary are added as special tokens.
            eos_ids: End-of-sequence ids.
            bos_id: Beginning-of-sequence id.
            **kwargs: `chat_template` and `config`, stored as attributes.

        Returns:
            The tokenizer.

        Raises:
            ValueError: The document is not a tokenizer, or a special token's
                id disagrees with the vocabulary.

        """
        text = str(path_or_json_str)
        name = "tokenizer.json"
        if not text.lstrip().startswith("{"):
            name = text
            text = _read_side_text(Path(text), name)
        spec = _parse_json(text, name)
        _check_hf_spec(spec, name, MAX_TOKEN_ID)
        return cls._from_checked_spec(spec, name, special_tokens, eos_ids, bos_id, **kwargs)

    @classmethod
    def _from_checked_spec(
        cls,
        spec: dict[str, Any],
        name: str,
        special_tokens: Mapping[str, int] | None,
        eos_ids: Iterable[int] | None,
        bos_id: int | None,
        **kwargs: Any,
    ) -> Tokenizer:
        extra = {k: int(v) for k, v in (special_tokens or {}).items()}
        try:
            backend = _HFBackend(spec, extra)
        except WarpError:
            raise
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the library's own errors, panics included
            raise ModelFormatError(f"{name}: not a usable tokenizer: {exc}") from None
        return cls(backend, backend.control, eos_ids=eos_ids, bos_id=bos_id, **kwargs)

    @classmethod
    def from_tiktoken(
        cls,
        rank_file_path: str | os.PathLike[str],
        pattern: str,
        special_tokens: Mapping[str, int],
        eos_ids: Iterable[int] | None = None,
        bos_id: int | None = None,
        **kwargs: Any,
    ) -> Tokenizer:
        """Build from a tiktoken rank file (`base64-token rank` per line).

        Args:
            rank_file_path: The `tiktoken.model` file.
            pattern: The pre-tokenizer split regex (model specific; required).
            special_tokens: Control tokens, spelling -> id.
            eos_ids: End-of-sequence ids.
            bos_id: Beginning-of-sequence id.
            **kwargs: `chat_template` and `config`, stored as attributes.

        Returns:
            The tokenizer.

        Raises:
            ValueError: A malformed rank file.

        """
        ranks = _read_ranks(Path(rank_file_path), str(rank_file_path), MAX_TOKEN_ID)
        return cls.from_tiktoken_ranks(
            ranks, pattern, special_tokens, eos_ids=eos_ids, bos_id=bos_id, **kwargs
        )

    @classmethod
    def from_tiktoken_ranks(
        cls,
        ranks: Mapping[bytes, int],
        pattern: str,
        special_tokens: Mapping[str, int],
        eos_ids: Iterable[int] | None = None,
        bos_id: int | None = None,
        name: str = "warp",
        **kwargs: Any,
    ) -> Tokenizer:
        """Build from an in-memory rank table (see `from_tiktoken`)."""
        import tiktoken

        try:
            enc = tiktoken.Encoding(
                name,
                pat_str=pattern,
                mergeable_ranks=dict(ranks),
                special_tokens=dict(special_tokens),
            )
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the library's own errors, panics included
            raise ModelFormatError(f"tiktoken vocabulary {name!r} is not usable: {exc}") from None
        return cls.from_tiktoken_encoding(enc, eos_ids=eos_ids, bos_id=bos_id, **kwargs)

    @classmethod
    def from_tiktoken_encoding(
        cls,
        encoding: tiktoken.Encoding,
        eos_ids: Iterable[int] | None = None,
        bos_id: int | None = None,
        **kwargs: Any,
    ) -> Tokenizer:
        """Wrap an existing `tiktoken.Encoding`; its special tokens are the control tokens."""
        backend = _TiktokenBackend(encoding)
        return cls(backend, backend.control, eos_ids=eos_ids, bos_id=bos_id, **kwargs)

    @classmethod
    def from_dir(
        cls,
        directory: str | os.PathLike[str],
        pattern: str | None = None,
        *,
        vocab_size: int | None = None,
    ) -> Tokenizer:
        """Load the tokenizer a model directory carries.

        Reads `tokenizer.json`, or `tiktoken.model` plus the special tokens of
        `tokenizer_config.json` (`added_tokens_decoder`). EOS/BOS come from
        `tokenizer_config.json` (`eos_token`, `bos_token`) and
        `generation_config.json` (`eos_token_id`); the chat template from
        `tokenizer_config.json` or `chat_template.jinja`. Every file is checked
        (JSON shape, sizes, every token id in [0, vocab_size)) before a tokenizer
        library sees it.

        Args:
            directory: The model directory.
            pattern: tiktoken split regex; else `pat_str` of the config.
            vocab_size: The model's vocabulary (embedding rows); token ids at or
                above it are refused. None: the engine's bound, 2^24.

        Returns:
            The tokenizer.

        Raises:
            ModelFormatError: A side file is missing, unreadable or malformed (the
                detail names it), or a tiktoken vocabulary has no split pattern.

        """
        root = Path(directory)
        limit = MAX_TOKEN_ID if vocab_size is None else int(vocab_size)
        config = _read_side_json(root / "tokenizer_config.json", "tokenizer_config.json")
        specials = _check_tokenizer_config(config, "tokenizer_config.json", limit)
        template = _chat_template_of(root, config)
        gen = _read_side_json(root / "generation_config.json", "generation_config.json")
        eos = _eos_ids_of(gen, "generation_config.json", limit)
        if (root / "tokenizer.json").is_file():
            text = _read_side_text(root / "tokenizer.json", "tokenizer.json")
            spec = _parse_json(text, "tokenizer.json")
            _check_hf_spec(spec, "tokenizer.json", limit)
            tok = cls._from_checked_spec(
                spec, "tokenizer.json", None, None, None, chat_template=template, config=config
            )
        elif (root / "tiktoken.model").is_file():
            pat = pattern or config.get("pat_str")
            if not isinstance(pat, str) or not pat:
                raise ModelFormatError(
                    f"tokenizer_config.json: tiktoken.model needs a split pattern: pass "
                    f"pattern= or set 'pat_str' ({root})"
                )
            ranks = _read_ranks(root / "tiktoken.model", "tiktoken.model", limit)
            clash = sorted(set(ranks.values()) & set(specials.values()))
            if clash:
                raise ModelFormatError(
                    f"tokenizer_config.json: added_tokens_decoder id {clash[0]} is also a "
                    f"rank of tiktoken.model"
                )
            try:
                tok = cls.from_tiktoken_ranks(
                    ranks, pat, specials, chat_template=template, config=config
                )
            except ModelFormatError as exc:
                raise ModelFormatError(f"tiktoken.model: {exc}") from None
        else:
            raise ModelFormatError(f"{root} has neither tokenizer.json nor tiktoken.model")
        for key in ("eos_token", "bos_token"):
            spelling = config.get(key)
            spelling = spelling.get("content") if isinstance(spelling, dict) else spelling
            tid = tok.token_to_id(spelling) if isinstance(spelling, str) else None
            if tid is None:
                continue
            if key == "bos_token":
                tok.bos_id = tid
            elif tid not in eos:
                eos.append(tid)
        tok.eos_ids = tuple(eos)
        return tok

    # ----------------------------------------------------------- encoding
    def encode_content(self, text: str) -> list[int]:
        """Encode caller text; never yields a control-token id, whatever the text spells."""
        out: list[int] = []
        for piece in split_long_text(text):
            out.extend(self._backend.content(piece))
        return out

    def encode_markup(self, text: str) -> list[int]:
        """Encode template markup; control-token spellings become their ids."""
        out: list[int] = []
        for piece in split_long_text(text):
            out.extend(self._backend.markup(piece))
        return out

    def encode_segments(self, segments: Iterable[_SegmentLike]) -> list[int]:
        """Encode a rendered prompt one segment at a time (PROTOCOLS §1.2).

        No merging of neighbours, empty segments contribute nothing, no BOS.

        Args:
            segments: `Segment`s (anything with `text` and `markup`).

        Returns:
            The concatenated ids.

        """
        out: list[int] = []
        for seg in segments:
            if seg.text:
                out.extend(
                    self.encode_markup(seg.text) if seg.markup else self.encode_content(seg.text)
                )
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids to text; control tokens appear as their spelling."""
        return self._backend.decode(list(ids))

    # ----------------------------------------------------------- vocabulary
    def id_to_piece(self, token_id: int) -> str:
        """Text of one token alone (a control token's spelling; U+FFFD for a partial character)."""
        return self.decode([token_id])

    def token_to_id(self, token: str) -> int | None:
        """Return the id of the entry spelled exactly `token` (control tokens too), else None."""
        if token in self._by_spelling:
            return self._by_spelling[token]
        return self._backend.lookup(token)

    def marker_id(self, marker: str) -> int | None:
        """Id of `marker` if it markup-encodes to exactly one control token, else None."""
        ids = self.encode_markup(marker)
        return ids[0] if len(ids) == 1 and ids[0] in self._control else None

    def markup_count(self, marker: str) -> int:
        """How many ids `marker` markup-encodes to (for error messages)."""
        return len(self.encode_markup(marker))

    @property
    def control_ids(self) -> frozenset[int]:
        """Ids that only `encode_markup` can produce."""
        return frozenset(self._control)

    @property
    def control_tokens(self) -> dict[str, int]:
        """Control-token spelling -> id."""
        return dict(self._by_spelling)

    def is_control(self, token_id: int) -> bool:
        """Whether `token_id` is a control token."""
        return token_id in self._control

    @property
    def vocab_size(self) -> int:
        """Number of ids, control tokens included."""
        return self._backend.size()

    def incremental_decoder(self) -> IncrementalDecoder:
        """Return a fresh decoder for one generated id stream."""
        return IncrementalDecoder(self)

    def _token_bytes(self, token_id: int) -> bytes | None:
        return self._backend.token_bytes(token_id)


class IncrementalDecoder:
    """Turn generated ids into text pieces, holding incomplete UTF-8 until it completes.

    Concatenating every `feed` result and the final `flush` equals
    `tokenizer.decode(all_ids)` (up to a leading-space strip some decoders
    apply to a sequence's first token).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        """Start an empty stream over `tokenizer`."""
        self._tok = tokenizer
        self._bytes_mode = isinstance(tokenizer._backend, _TiktokenBackend)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def feed(self, token_id: int) -> str:
        """Add one id; return the text it completes ('' while a character is still partial)."""
        if self._bytes_mode:
            data = self._tok._token_bytes(token_id) or b""
            return str(self._utf8.decode(data))
        self._ids.append(token_id)
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Return whatever is held back (invalid bytes become U+FFFD)."""
        if self._bytes_mode:
            return str(self._utf8.decode(b"", final=True))
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :] if after.startswith(before) else after


# ---------------------------------------------------------------- side files
# Everything below checks a file before a library sees it: the tokenizers library aborts
# the process on some out-of-range ids (a vocab id of 2^31 - 1 never returns), so the
# bounds are ours, and every refusal is a ModelFormatError that names the file.


def _read_side_bytes(path: Path, name: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_SIDE_FILE_BYTES:
            raise ModelFormatError(f"{name}: {size} bytes, more than {MAX_SIDE_FILE_BYTES}")
        return path.read_bytes()
    except OSError as exc:
        raise ModelFormatError(f"{name}: cannot be read: {exc.strerror or exc}") from None


def _read_side_text(path: Path, name: str) -> str:
    try:
        return _read_side_bytes(path, name).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFormatError(f"{name}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ModelFormatError(f"{name}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ModelFormatError(f"{name}: not JSON: {exc}") from None


def _read_side_json(path: Path, name: str) -> dict[str, Any]:
    """An optional JSON object file: {} when absent."""
    if not path.exists():
        return {}
    value = _parse_json(_read_side_text(path, name), name)
    if not isinstance(value, dict):
        raise ModelFormatError(f"{name}: expected a JSON object, got {type(value).__name__}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(value: Any) -> bool:
    """A str the tokenizer libraries accept: no lone surrogates (a JSON escape can spell one)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_id(value: Any, where: str, limit: int) -> int:
    if not _is_int(value) or not 0 <= value < limit:
        raise ModelFormatError(f"{where}: {value!r} is not a token id in [0, {limit})")
    return int(value)


def _check_hf_spec(spec: Any, name: str, limit: int) -> None:
    """The shape of a tokenizers JSON document and every id in it."""
    if not isinstance(spec, dict):
        raise ModelFormatError(f"{name}: expected a JSON object")
    model = spec.get("model")
    if not isinstance(model, dict):
        raise ModelFormatError(f"{name}: model: expected an object")
    kind = model.get("type")
    if kind not in _HF_MODELS:
        raise ModelFormatError(f"{name}: model.type {kind!r} is not one of {', '.join(_HF_MODELS)}")
    vocab = model.get("vocab")
    if kind == "Unigram":
        if not isinstance(vocab, list) or len(vocab) > limit:
            raise ModelFormatError(f"{name}: model.vocab: expected at most {limit} [piece, score]")
        for i, entry in enumerate(vocab):
            if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str)
                    or not isinstance(entry[1], (int, float)) or isinstance(entry[1], bool)):
                raise ModelFormatError(f"{name}: model.vocab[{i}]: expected [piece, score]")
        unk = model.get("unk_id")
        if unk is not None:
            _check_id(unk, f"{name}: model.unk_id", len(vocab))
    else:
        if not isinstance(vocab, dict) or len(vocab) > limit:
            raise ModelFormatError(f"{name}: model.vocab: expected an object of <= {limit} ids")
        if not all(type(t) is int and 0 <= t < limit for t in vocab.values()):
            for piece, tid in vocab.items():  # name the first offender
                _check_id(tid, f"{name}: model.vocab[{piece[:40]!r}]", limit)
        for key in ("unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key) is not None and not isinstance(model[key], str):
                raise ModelFormatError(f"{name}: model.{key}: expected a string")
    merges = model.get("merges")
    if kind == "BPE":
        if not isinstance(merges, list):
            raise ModelFormatError(f"{name}: model.merges: expected a list")
        for i, m in enumerate(merges):
            if not (isinstance(m, str) or (isinstance(m, list) and len(m) == 2
                                           and all(isinstance(x, str) for x in m))):
                raise ModelFormatError(f"{name}: model.merges[{i}]: expected 'a b' or [a, b]")
    added = spec.get("added_tokens", [])
    if not isinstance(added, list):
        raise ModelFormatError(f"{name}: added_tokens: expected a list")
    for i, entry in enumerate(added):
        where = f"{name}: added_tokens[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str) \
                or not entry["content"]:
            raise ModelFormatError(f"{where}: expected an object with a non-empty content")
        _check_id(entry.get("id"), f"{where}.id", limit)
        for flag in ("special", "single_word", "lstrip", "rstrip", "normalized"):
            if flag in entry and not isinstance(entry[flag], bool):
                raise ModelFormatError(f"{where}.{flag}: expected true or false")
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation",
                 "padding"):
        value = spec.get(part)
        if value is not None and not isinstance(value, dict):
            raise ModelFormatError(f"{name}: {part}: expected an object or null")
    _check_nested_ids(spec.get("post_processor"), f"{name}: post_processor", limit)
    padding = spec.get("padding")
    if isinstance(padding, dict) and "pad_id" in padding:
        _check_id(padding["pad_id"], f"{name}: padding.pad_id", limit)


def _check_nested_ids(value: Any, where: str, limit: int) -> None:
    """Every `id` / `ids` under a post-processor (template special tokens)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "ids" and isinstance(item, list):
                for k, tid in enumerate(item):
                    _check_id(tid, f"{where}.ids[{k}]", limit)
            elif key == "id" and _is_int(item):
                _check_id(item, f"{where}.id", limit)
            else:
                _check_nested_ids(item, f"{where}.{key}", limit)
    elif isinstance(value, list):
        for k, item in enumerate(value):
            _check_nested_ids(item, f"{where}[{k}]", limit)


def _check_tokenizer_config(config: dict[str, Any], name: str, limit: int) -> dict[str, int]:
    """The keys of tokenizer_config.json read here; returns added_tokens_decoder's specials."""
    specials: dict[str, int] = {}
    decoder = config.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict):
            raise ModelFormatError(f"{name}: added_tokens_decoder: expected an object")
        for key, entry in decoder.items():
            where = f"{name}: added_tokens_decoder[{key[:20]!r}]"
            try:
                tid = int(key)
            except ValueError:
                raise ModelFormatError(f"{where}: the key is not a token id") from None
            _check_id(tid, where, limit)
            content = entry.get("content") if isinstance(entry, dict) else None
            if not _is_text(content) or not content:
                raise ModelFormatError(f"{where}: expected an object with a non-empty content")
            if content in specials and specials[content] != tid:
                raise ModelFormatError(f"{where}: {content!r} is also id {specials[content]}")
            specials[content] = tid
    for key in ("eos_token", "bos_token", "pad_token", "unk_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None and not _is_text(value):
            raise ModelFormatError(f"{name}: {key}: expected a string or {{\"content\": ...}}")
    if config.get("pat_str") is not None and not _is_text(config["pat_str"]):
        raise ModelFormatError(f"{name}: pat_str: expected a string")
    return specials


def _eos_ids_of(gen: dict[str, Any], name: str, limit: int) -> list[int]:
    value = gen.get("eos_token_id")
    if value is None:
        return []
    eos: list[int] = []
    for k, tid in enumerate(value if isinstance(value, list) else [value]):
        where = f"{name}: eos_token_id" + (f"[{k}]" if isinstance(value, list) else "")
        tid = _check_id(tid, where, limit)
        if tid not in eos:
            eos.append(tid)
    return eos


def _read_ranks(path: Path, name: str, limit: int) -> dict[bytes, int]:
    """A tiktoken rank file: one `<base64 token> <rank>` per line, ranks unique in [0, limit)."""
    try:
        text = _read_side_bytes(path, name).decode("ascii")
    except UnicodeDecodeError as exc:
        raise ModelFormatError(f"{name}: not ASCII (byte {exc.start})") from None
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ModelFormatError(f"{name}:{n}: expected '<base64> <rank>'")
        try:
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except (binascii.Error, ValueError):
            raise ModelFormatError(f"{name}:{n}: expected '<base64> <rank>'") from None
        if not token or not 0 <= rank < limit:
            raise ModelFormatError(f"{name}:{n}: rank {rank} is not a token id in [0, {limit})"
                                   if token else f"{name}:{n}: an empty token")
        if token in ranks or rank in seen:
            raise ModelFormatError(f"{name}:{n}: token or rank {rank} appears twice")
        ranks[token] = rank
        seen.add(rank)
    if not ranks:
        raise ModelFormatError(f"{name}: no ranks")
    return ranks


_JINJA: Any = None  # one parser environment, made on first use


def _check_template(template: Any, name: str) -> str | None:
    """A chat template must be text that jinja2 parses (with the loop controls it may use)."""
    if template is None or template == "":
        return None
    if not isinstance(template, str):
        raise ModelFormatError(f"{name}: expected a string")
    try:  # a JSON escape can spell a lone surrogate, which no tokenizer can encode
        template.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ModelFormatError(f"{name}: not valid Unicode (at character {exc.start})") from None
    import jinja2

    global _JINJA
    if _JINJA is None:
        _JINJA = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        _JINJA.parse(template)
    except jinja2.TemplateError as exc:
        raise ModelFormatError(f"{name}: the chat template does not parse: {exc}") from None
    except RecursionError:
        raise ModelFormatError(f"{name}: the chat template nests too deeply") from None
    return template


def read_chat_template(path: Path, name: str) -> str | None:
    """A chat template file, checked like the one `Tokenizer.from_dir` reads (None: absent).

    Raises:
        ModelFormatError: the file is unreadable, not UTF-8 or does not parse (named).

    """
    if not path.exists():
        return None
    return _check_template(_read_side_text(path, name), name)


def _chat_template_of(root: Path, config: Mapping[str, Any]) -> str | None:
    name = "tokenizer_config.json: chat_template"
    template = config.get("chat_template")
    if isinstance(template, list):
        named: dict[Any, Any] = {}
        for i, t in enumerate(template):
            if not isinstance(t, dict) or not isinstance(t.get("template"), str):
                raise ModelFormatError(f"{name}[{i}]: expected {{\"name\", \"template\"}}")
            named[t.get("name")] = t["template"]
        template = named.get("default") or next(iter(named.values()), None)
    if template is not None and template != "":
        return _check_template(template, name)
    return read_chat_template(root / "chat_template.jinja", "chat_template.jinja")
