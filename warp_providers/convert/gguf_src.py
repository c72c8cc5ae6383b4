"""GGUF importer: a .gguf file -> a Plan, with its tokenizer rebuilt for ``tokenizers``.

Owns: hparams from the ``llama.*`` metadata (dense llama and llama-architecture MoE such
as Mixtral, whose experts are stacked in ``ffn_*_exps``) and the ``qwen3moe.*`` metadata
(Qwen3-MoE: q/k rows not permuted, per-head q/k RMSNorm), tensor import into the
container contract of ``plan.py`` (F32, F16, BF16, Q4_0, Q4_1, Q8_0 and MXFP4 keep their
bytes; other types such as K-quants are dequantized and re-encoded), undoing llama.cpp's row
permutation of ``attn_q``/``attn_k`` (GGML's interleaved rope pairs back to HF's
"rotate_half" halves; rows move whole, so quantized
rows move without dequantizing), ``rope_freqs`` from ``rope.*`` metadata and GGUF's own
``rope_freqs.weight`` divisors, and a ``tokenizer.json`` + ``tokenizer_config.json``
rebuilt from ``tokenizer.ggml.*``: byte-level BPE (``gpt2``) vocabularies here,
SentencePiece (``llama``: Llama-2, Mistral and Mixtral files) through transformers' GGUF
tokenizer builder (a convert-time need: the ``gguf`` extra).

Refuses, with a ``ConvertError``: other architectures and tokenizer models, unknown
pre-tokenizers, missing or misshapen tensors. Called by ``convert()``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf import quants as _gq

from . import quant
from .base import rope_inv_freq
from .plan import (
    LAYER_TENSORS,
    ExpertLayerSrc,
    Plan,
    SrcTensor,
    expert_shapes,
    hparams,
    layer_shapes,
    rope_freqs,
)
from .quant import DTYPE_IDS, ConvertError

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "build_tokenizer_json",
    "load_gguf",
    "sentencepiece_tokenizer_json",
    "unpermute_rows",
]

SUPPORTED_ARCHITECTURES: Final[tuple[str, ...]] = ("llama", "qwen3moe")
_ID_DTYPE: Final[dict[int, str]] = {v: k for k, v in DTYPE_IDS.items()}

# Pre-tokenizer split patterns by ``tokenizer.ggml.pre``. ``None``: the GPT-2 pattern
# built into the ByteLevel pre-tokenizer.
_GPT2_PRE: Final[frozenset[str]] = frozenset(
    {"default", "gpt2", "smollm", "starcoder", "refact", "olmo"}
)
_SPLIT_PRE: Final[dict[str, str]] = {
    "llama-bpe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}
_SKIP_META: Final[frozenset[str]] = frozenset(
    {
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.scores",
    }
)
# The standard layer tensors a GGUF file of these architectures may hold (plan.py's names).
_LAYER_NAMES: Final[frozenset[str]] = frozenset({
    "attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias",
    "attn_v.weight", "attn_v.bias", "attn_output.weight", "attn_output.bias",
    "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight",
    "ffn_up.weight", "ffn_down.weight", "ffn_gate_inp.weight",
})
_IGNORED: Final[frozenset[str]] = frozenset({"rope_freqs.weight"})


class _Meta:
    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self.r = reader
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        f = self.r.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception as e:  # the gguf package raises assorted errors on bad fields
            raise ConvertError(f"{self.path}: metadata key {key!r} is unreadable ({e})") from e

    def need(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise ConvertError(f"{self.path}: missing metadata key {key!r}")
        return v

    def int(self, key: str, default: int | None = None) -> int:
        v = self.get(key, default) if default is not None else self.need(key)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ConvertError(
                f"{self.path}: metadata {key!r} must be a non-negative integer, got {v!r}"
            )
        return int(v)


def _f32(v: Any) -> float:
    """Return a float32 metadata value as its shortest round-trip decimal (1e-05)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise ConvertError(f"expected a number in GGUF metadata, got {v!r}")
    return float(str(np.float32(v)))


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: GGML interleaved pairs -> HF rotate_half halves.

    ``rows`` is ``[n_head * head_dim, ...]`` (floats or the raw bytes of each row). Within a
    head, GGUF row ``2*i + j`` is HF row ``j*head_dim/2 + i``.
    """
    n = rows.shape[0]
    if n_head <= 0 or n % n_head or (n // n_head) % 2:
        raise ConvertError(f"cannot unpermute {n} rows into {n_head} heads of even width")
    hd = n // n_head
    return np.ascontiguousarray(
        rows.reshape(n_head, hd // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


class _GTensor:
    """One GGUF tensor as rows of raw bytes, with decode to float."""

    def __init__(self, t: Any, path: Path) -> None:
        self.name: str = str(t.name)
        self.qtype = GGMLQuantizationType(int(t.tensor_type))
        ne = [int(d) for d in t.shape]
        self.shape: tuple[int, ...] = tuple(reversed(ne))  # numpy order, last = row length
        self.cols = self.shape[-1]
        self.nrows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        self.nbytes = int(t.n_bytes)
        block, size = _gq.GGML_QUANT_SIZES[self.qtype]
        if self.cols % block:
            raise ConvertError(
                f"{path}: tensor {self.name!r} rows of {self.cols} do not fit {self.qtype.name}"
            )
        self.row_bytes = self.cols // block * size
        if self.row_bytes * self.nrows != self.nbytes:
            raise ConvertError(
                f"{path}: tensor {self.name!r} has {self.nbytes} bytes, shape implies otherwise"
            )
        self._t = t
        self.dtype = _ID_DTYPE.get(int(self.qtype))

    def raw_rows(self) -> np.ndarray:
        """``[nrows, row_bytes]`` uint8 view of the mapped file."""
        return (
            np.asarray(self._t.data).reshape(-1).view(np.uint8).reshape(self.nrows, self.row_bytes)
        )

    def decode(self, raw: np.ndarray) -> np.ndarray:
        """Float32 rows from raw rows of this tensor's type."""
        n = raw.shape[0]
        if self.dtype is not None:
            return quant.decode(np.ascontiguousarray(raw), self.dtype, (n, self.cols))
        try:
            out = _gq.dequantize(np.ascontiguousarray(raw), self.qtype)
        except NotImplementedError as e:
            raise ConvertError(
                f"tensor {self.name!r}: GGUF type {self.qtype.name} cannot be decoded"
            ) from e
        return np.asarray(out, dtype=np.float32).reshape(n, self.cols)


def _src(
    g: _GTensor,
    cname: str,
    kind: str,
    shape: tuple[int, ...],
    raw_fn: Callable[[], np.ndarray],
    nbytes: int,
) -> SrcTensor:
    def rows(r0: int, r1: int) -> np.ndarray:
        return g.decode(raw_fn()[r0:r1])

    def raw() -> np.ndarray:
        return raw_fn()

    return SrcTensor(
        cname,
        shape,
        kind,
        rows,
        nbytes,
        raw=raw if g.dtype is not None else None,
        raw_dtype=g.dtype,
        lossy=g.dtype is None,
    )


# --------------------------------------------------------------------------- tokenizer


def build_tokenizer_json(
    *,
    tokens: list[str],
    merges: list[str],
    token_types: list[int] | None,
    pre: str,
    bos_id: int | None,
    add_bos: bool,
) -> dict[str, Any]:
    """Build a ``tokenizers`` JSON object for a GPT-2-style byte-level BPE vocabulary.

    Control tokens (type 3) become special added tokens, user-defined ones (type 4)
    non-special added tokens.

    Raises:
        ConvertError: an unknown pre-tokenizer name.

    """
    if pre in _GPT2_PRE:
        pre_tok: dict[str, Any] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        }
    elif pre in _SPLIT_PRE:
        pre_tok = {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": _SPLIT_PRE[pre]},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        }
    else:
        known = ", ".join(sorted(_GPT2_PRE | set(_SPLIT_PRE)))
        raise ConvertError(f"tokenizer.ggml.pre {pre!r} is not supported; supported: {known}")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    added = []
    types = token_types or []
    for i, tt in enumerate(types):
        if tt in (3, 4):
            added.append(
                {
                    "id": i,
                    "content": tokens[i],
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": tt == 4,
                    "special": tt == 3,
                }
            )
    seq_a = {"Sequence": {"id": "A", "type_id": 0}}
    seq_b = {"Sequence": {"id": "B", "type_id": 1}}
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        sp = {"SpecialToken": {"id": bos, "type_id": 0}}
        post: dict[str, Any] = {
            "type": "TemplateProcessing",
            "single": [sp, seq_a],
            "pair": [sp, seq_a, {"SpecialToken": {"id": bos, "type_id": 1}}, seq_b],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        }
    else:
        post = {
            "type": "TemplateProcessing",
            "single": [seq_a],
            "pair": [seq_a, seq_b],
            "special_tokens": {},
        }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tok,
        "post_processor": post,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [m.split(" ", 1) for m in merges],
        },
    }


def sentencepiece_tokenizer_json(
    *,
    architecture: str,
    tokens: list[str],
    scores: list[float] | None,
    token_types: list[int] | None,
    merges: list[str],
    add_space_prefix: bool | None,
    where: str = "this file",
) -> dict[str, Any]:
    """Build a ``tokenizers`` JSON object for a SentencePiece (``llama``) GGUF vocabulary.

    The conversion is transformers' own GGUF tokenizer builder (the one its
    ``from_pretrained(gguf_file=...)`` uses): SentencePiece BPE with byte fallback, merges
    from the file or derived from the scores, control tokens special. transformers is a
    convert-time need only, imported here.

    Raises:
        ConvertError: transformers is not installed, or its tokenizer does not keep the
            file's token ids.

    """
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            convert_gguf_tokenizer,
        )
    except ImportError:
        try:  # transformers 4.x spelled it here
            from transformers.integrations.ggml import convert_gguf_tokenizer
        except ImportError:
            raise ConvertError(
                f"{where}: its SentencePiece ('llama') tokenizer is converted with "
                "transformers' GGUF tokenizer builder, which is not installed: "
                "pip install 'warp-providers[gguf]'"
            ) from None
    spec: dict[str, Any] = {"tokenizer_type": "llama", "tokens": tokens}
    if scores is not None:
        spec["scores"] = scores
    if token_types is not None:
        spec["token_type"] = token_types
    if merges:
        spec["merges"] = merges
    if add_space_prefix is not None:
        spec["add_prefix_space"] = add_space_prefix
    backend, _ = convert_gguf_tokenizer(architecture, spec)
    first: dict[str, int] = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    if backend.get_vocab_size(with_added_tokens=True) != len(tokens) or any(
        backend.token_to_id(t) != i for t, i in first.items()
    ):
        raise ConvertError(f"{where}: the converted SentencePiece tokenizer renumbers tokens")
    return dict(json.loads(backend.to_str()))


def _tokenizer(
    meta: _Meta, vocab_size: int
) -> tuple[list[tuple[str, bytes]], dict[str, Any], dict[str, Any]]:
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ConvertError(
            f"{meta.path}: tokenizer.ggml.model {model!r} is not supported "
            "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)"
        )
    tokens = meta.need("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges") or []
    types = meta.get("tokenizer.ggml.token_type")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ConvertError(f"{meta.path}: tokenizer.ggml.tokens is not a list of strings")
    if len(tokens) > vocab_size:
        raise ConvertError(
            f"{meta.path}: {len(tokens)} tokens but the embedding has {vocab_size} rows"
        )
    if types is not None and len(types) != len(tokens):
        raise ConvertError(f"{meta.path}: tokenizer.ggml.token_type length differs from tokens")
    if not all(isinstance(m, str) and " " in m for m in merges):
        raise ConvertError(f"{meta.path}: tokenizer.ggml.merges must be 'left right' strings")

    def tok_id(key: str) -> int | None:
        v = meta.get(key)
        if v is None:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, np.integer))
            or not 0 <= int(v) < len(tokens)
        ):
            raise ConvertError(f"{meta.path}: {key} = {v!r} is not a token id")
        return int(v)

    bos = tok_id("tokenizer.ggml.bos_token_id")
    eos = tok_id("tokenizer.ggml.eos_token_id")
    unk = tok_id("tokenizer.ggml.unknown_token_id")
    pad = tok_id("tokenizer.ggml.padding_token_id")
    if model == "llama":
        # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
        scores = meta.get("tokenizer.ggml.scores")
        if scores is not None and len(scores) != len(tokens):
            raise ConvertError(f"{meta.path}: tokenizer.ggml.scores length differs from tokens")
        space = meta.get("tokenizer.ggml.add_space_prefix")
        tj = sentencepiece_tokenizer_json(
            architecture=str(meta.get("general.architecture", "llama")), tokens=tokens,
            scores=[float(x) for x in scores] if scores is not None else None,
            token_types=[int(t) for t in types] if types is not None else None,
            merges=list(merges), add_space_prefix=None if space is None else bool(space),
            where=str(meta.path),
        )
    else:
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        tj = build_tokenizer_json(
            tokens=tokens, merges=merges, token_types=types, pre=pre, bos_id=bos, add_bos=add_bos
        )
    tc: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add_bos}
    for key, tid in (
        ("bos_token", bos),
        ("eos_token", eos),
        ("unk_token", unk),
        ("pad_token", pad),
    ):
        if tid is not None:
            tc[key] = tokens[tid]
    ctx = meta.get("llama.context_length")
    if isinstance(ctx, (int, np.integer)):
        tc["model_max_length"] = int(ctx)
    files: list[tuple[str, bytes]] = [
        ("tokenizer.json", json.dumps(tj, ensure_ascii=False).encode("utf-8")),
    ]
    chat: dict[str, Any] = {"template": None, "format": None}
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        tc["chat_template"] = template
        files.append(("chat_template.jinja", template.encode("utf-8")))
        chat["template"] = "chat_template.jinja"
    files.append(
        (
            "tokenizer_config.json",
            (json.dumps(tc, indent=1, ensure_ascii=False) + "\n").encode("utf-8"),
        )
    )
    tokenizer = {"kind": "hf", "file": "tokenizer.json", "config": "tokenizer_config.json"}
    return files, tokenizer, chat


# --------------------------------------------------------------------------- loader


def _source_config(reader: GGUFReader, meta: _Meta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in reader.fields:
        if key.startswith("GGUF.") or key in _SKIP_META:
            continue
        v = meta.get(key)
        if isinstance(v, list) and len(v) > 256:
            continue
        if isinstance(v, float) and not np.isfinite(v):
            v = None
        out[key] = v
    return out


def load_gguf(path: Path) -> Plan:
    """Read a ``.gguf`` file into a :class:`Plan` (tensor data is read when written).

    Raises:
        ConvertError: naming the metadata key or tensor at fault.

    """
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # the gguf package raises ValueError/struct.error/... on bad files
        raise ConvertError(f"{path}: not a readable GGUF file ({e})") from e
    meta = _Meta(reader, path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConvertError(
            f"{path}: general.architecture {arch!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    gts: dict[str, _GTensor] = {}
    for t in reader.tensors:
        g = _GTensor(t, path)
        if g.name in gts:
            raise ConvertError(f"{path}: tensor {g.name!r} appears twice")
        gts[g.name] = g

    a = str(arch)
    n_layers = meta.int(f"{a}.block_count")
    hidden = meta.int(f"{a}.embedding_length")
    n_heads = meta.int(f"{a}.attention.head_count")
    n_kv = meta.int(f"{a}.attention.head_count_kv", n_heads)
    if 0 in (n_layers, hidden, n_heads, n_kv) or n_heads % n_kv:
        raise ConvertError(
            f"{path}: inconsistent head counts ({n_heads} heads, {n_kv} KV heads) or zero sizes"
        )
    head_dim = meta.int(f"{a}.attention.key_length", hidden // n_heads)
    rope_dim = meta.int(f"{a}.rope.dimension_count", head_dim)
    n_experts = meta.int(f"{a}.expert_count", 0)
    top_k = meta.int(f"{a}.expert_used_count", 0)
    ffn = meta.int(f"{a}.feed_forward_length", 0)
    moe_inter = meta.int(f"{a}.expert_feed_forward_length", ffn) if n_experts else 0
    eps = _f32(meta.need(f"{a}.attention.layer_norm_rms_epsilon"))
    theta = _f32(meta.get(f"{a}.rope.freq_base", 10000.0))
    max_pos = meta.int(f"{a}.context_length", 2048)
    if n_experts and not 0 < top_k <= n_experts:
        raise ConvertError(f"{path}: {a}.expert_used_count={top_k} must be in 1..{n_experts}")

    if "token_embd.weight" not in gts:
        raise ConvertError(f"{path}: tensor 'token_embd.weight' is missing")
    vocab = gts["token_embd.weight"].shape[0]
    tied = "output.weight" not in gts

    # rope: scaling type from metadata; GGUF's rope_freqs.weight holds per-pair divisors.
    scaling = str(meta.get(f"{a}.rope.scaling.type", "none"))
    params: dict[str, Any] = {}
    rope_type = "default"
    if scaling == "linear":
        rope_type = "linear"
        params["factor"] = float(meta.need(f"{a}.rope.scaling.factor"))
    elif scaling == "yarn":
        rope_type = "yarn"
        params["factor"] = float(meta.need(f"{a}.rope.scaling.factor"))
        params["original_max_position_embeddings"] = meta.int(
            f"{a}.rope.scaling.original_context_length", max_pos
        )
        af = meta.get(f"{a}.rope.scaling.attn_factor")
        if af is not None:
            params["attention_factor"] = float(af)
    elif scaling != "none":
        raise ConvertError(f"{path}: {a}.rope.scaling.type {scaling!r} is not supported")
    inv, attn_factor = rope_inv_freq(rope_type, theta, rope_dim, params, max_pos)
    if "rope_freqs.weight" in gts:
        g = gts["rope_freqs.weight"]
        if g.shape != (rope_dim // 2,):
            raise ConvertError(
                f"{path}: rope_freqs.weight has shape {list(g.shape)}, expected [{rope_dim // 2}]"
            )
        div = g.decode(g.raw_rows()).reshape(-1)
        if not np.all(np.isfinite(div)) or np.any(div <= 0):
            raise ConvertError(f"{path}: rope_freqs.weight has non-positive or non-finite divisors")
        inv = (inv.astype(np.float64) / div).astype(np.float32)

    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        v = meta.get(key)
        if isinstance(v, (int, np.integer)) and int(v) not in eos:
            eos.append(int(v))
    bos_v = meta.get("tokenizer.ggml.bos_token_id")
    for i in eos + ([int(bos_v)] if bos_v is not None else []):
        if not 0 <= i < vocab:
            raise ConvertError(f"{path}: bos/eos token id {i} is outside the vocabulary of {vocab}")

    kinds = ["moe" if n_experts else "dense"] * n_layers
    hp = hparams(
        vocab_size=vocab, hidden_size=hidden, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim, intermediate_size=0 if n_experts else ffn,
        moe_intermediate_size=moe_inter, n_experts=n_experts, top_k=top_k,
        # llama-architecture MoE is Mixtral's router; llama.cpp's qwen3moe graph always
        # renormalizes the top-k weights.
        norm_topk_prob=bool(n_experts), shared_expert_intermediate_size=0,
        shared_expert_gate=False, layer_kinds=kinds, rms_norm_eps=eps, rope_dim=rope_dim,
        rope_theta=theta, rope_attn_factor=attn_factor,
        qk_norm="head" if a == "qwen3moe" else "none", attn_scale=head_dim**-0.5,
        max_position_embeddings=max_pos, tie_word_embeddings=tied,
        bos_token_id=int(bos_v) if bos_v is not None else None, eos_token_ids=eos,
        clip_qkv=0.0,
    )

    used: set[str] = set(_IGNORED)
    want = layer_shapes(hp)

    def take(name: str, kind: str, shape: tuple[int, ...], permute_heads: int = 0) -> SrcTensor:
        g = gts.get(name)
        if g is None:
            raise ConvertError(f"{path}: tensor {name!r} is missing")
        if g.shape != shape:
            raise ConvertError(
                f"{path}: tensor {name!r} has shape {list(g.shape)}, metadata implies {list(shape)}"
            )
        used.add(name)
        raw_fn: Callable[[], np.ndarray] = g.raw_rows
        if permute_heads:

            def raw_fn() -> np.ndarray:
                return unpermute_rows(g.raw_rows(), permute_heads)

        return _src(g, name, kind, shape, raw_fn, g.nbytes)

    trunk = [
        take("token_embd.weight", "embedding", (vocab, hidden)),
        take("output_norm.weight", "f32", (hidden,)),
    ]
    if not tied:
        trunk.append(take("output.weight", "output", (vocab, hidden)))
    trunk.append(rope_freqs(inv))
    experts: list[ExpertLayerSrc] = []
    dense_names = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
    for i in range(n_layers):
        for suffix, kind in LAYER_TENSORS.items():
            if suffix not in _LAYER_NAMES:
                continue
            name = f"blk.{i}.{suffix}"
            optional = suffix.endswith(".bias")
            if suffix in dense_names and n_experts:
                continue
            if suffix == "ffn_gate_inp.weight" and not n_experts:
                continue
            if suffix in ("attn_q_norm.weight", "attn_k_norm.weight") and a != "qwen3moe":
                continue
            if optional and name not in gts:
                continue
            heads = 0
            if a == "llama" and suffix == "attn_q.weight":
                heads = n_heads
            elif a == "llama" and suffix == "attn_k.weight":
                heads = n_kv
            if a == "llama" and suffix in ("attn_q.bias", "attn_k.bias"):
                raise ConvertError(
                    f"{path}: tensor {name!r}: q/k biases of permuted llama rows are not supported"
                )
            trunk.append(take(name, kind, want[suffix], heads))
        if n_experts:
            experts.append(_gguf_experts(path, gts, used, i, hp))
    extra = sorted(set(gts) - used)
    if extra:
        raise ConvertError(f"{path}: tensors not used by {a}: {', '.join(extra[:5])}")
    files, tokenizer, chat = _tokenizer(meta, vocab)
    return Plan(
        model_type="qwen3_moe" if a == "qwen3moe" else ("mixtral" if n_experts else "llama"),
        source_config=_source_config(reader, meta),
        hparams=hp,
        trunk=trunk,
        experts=experts,
        files=files,
        tokenizer=tokenizer,
        chat=chat,
        source="gguf",
    )


def _expert_rows(g: _GTensor, e: int, rows: int) -> Callable[[], np.ndarray]:
    def fn() -> np.ndarray:
        return g.raw_rows()[e * rows : (e + 1) * rows]

    return fn


def _gguf_experts(
    path: Path, gts: dict[str, _GTensor], used: set[str], i: int, hp: dict[str, Any]
) -> ExpertLayerSrc:
    n_e, shapes = hp["n_experts"], expert_shapes(hp)
    parts = []
    for part, shape in zip(("gate", "up", "down"), shapes):
        name = f"blk.{i}.ffn_{part}_exps.weight"
        g = gts.get(name)
        if g is None:
            raise ConvertError(f"{path}: tensor {name!r} is missing")
        if g.shape != (n_e, *shape):
            raise ConvertError(
                f"{path}: tensor {name!r} has shape {list(g.shape)}, expected {[n_e, *shape]}"
            )
        used.add(name)
        parts.append((g, shape))

    def expert(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
        out = []
        for part, (g, shape) in zip(("gate", "up", "down"), parts):
            fn = _expert_rows(g, e, shape[0])
            out.append(_src(g, f"blk.{i}.expert.{e}.{part}", "experts", shape, fn, g.nbytes // n_e))
        return out[0], out[1], out[2]

    return ExpertLayerSrc(i, n_e, shapes, expert, sum(g.nbytes for g, _ in parts))
