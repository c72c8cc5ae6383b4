"""The container contract every importer fills in: canonical tensor names, order, shapes.

Owns the :class:`Plan` an importer hands to ``writer.write_container`` (lazy
:class:`SrcTensor` sources plus normalized hyperparameters and side files), the canonical
FORMAT.md names of the standard decoder-layer tensors with their role (``LAYER_TENSORS``,
in the order they are written to trunk.bin), their shapes as the hyperparameters imply
them (:func:`layer_shapes`), and the computed ``rope_freqs`` table. Architectures with
tensors of their own (attention sinks, hyper-connections, KDA, indexers) name them in
their ``arch/<model_type>.py`` and write them in the order documented there.

Used by both importers: ``hf.py`` (through ``arch/``) and ``gguf_src.py``. Holds no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

__all__ = [
    "HPARAMS",
    "LAYER_TENSORS",
    "ExpertLayerSrc",
    "Plan",
    "RowLoader",
    "SrcTensor",
    "const_rows",
    "expert_shapes",
    "hparams",
    "layer_shapes",
    "rope_freqs",
]

#: rows(r0, r1) -> float array of shape [r1 - r0, cols].
RowLoader = Callable[[int, int], np.ndarray]

#: Canonical per-layer tensor (``blk.{i}.`` + name) -> its role, in trunk.bin order. A role
#: is ``f32`` (always stored f32: norms, routers, biases) or ``trunk`` (the requested dtype).
LAYER_TENSORS: Final[dict[str, str]] = {
    "attn_norm.weight": "f32",
    "attn_q.weight": "trunk",
    "attn_q.bias": "f32",
    "attn_k.weight": "trunk",
    "attn_k.bias": "f32",
    "attn_v.weight": "trunk",
    "attn_v.bias": "f32",
    "attn_output.weight": "trunk",
    "attn_output.bias": "f32",
    "attn_q_norm.weight": "f32",
    "attn_k_norm.weight": "f32",
    "ffn_norm.weight": "f32",
    "ffn_gate.weight": "trunk",
    "ffn_up.weight": "trunk",
    "ffn_down.weight": "trunk",
    "ffn_gate.bias": "f32",
    "ffn_up.bias": "f32",
    "ffn_down.bias": "f32",
    "ffn_gate_inp.weight": "f32",
    "ffn_gate_shexp.weight": "trunk",
    "ffn_up_shexp.weight": "trunk",
    "ffn_down_shexp.weight": "trunk",
    "ffn_gate_inp_shexp.weight": "f32",
    "attn_q_a.weight": "trunk",
    "attn_q_a.bias": "f32",
    "attn_q_a_norm.weight": "f32",
    "attn_q_b.weight": "trunk",
    "attn_kv_a_mqa.weight": "trunk",
    "attn_kv_a_mqa.bias": "f32",
    "attn_kv_a_norm.weight": "f32",
    "attn_kv_b.weight": "trunk",
    "exp_probs_b.bias": "f32",
}


#: The hyperparameters every container carries (FORMAT.md section 3), in manifest order;
#: an architecture's own keys come before (routing, windows) or after them.
HPARAMS: Final[tuple[str, ...]] = (
    "vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "n_experts", "top_k", "norm_topk_prob",
    "shared_expert_intermediate_size", "shared_expert_gate", "layer_kinds", "rms_norm_eps",
    "rope_dim", "rope_theta", "rope_attn_factor", "qk_norm", "attn_scale",
    "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_ids", "clip_qkv",
)


def hparams(**values: Any) -> dict[str, Any]:
    """Return the :data:`HPARAMS` in manifest order; an importer must give each one, no other.

    Raises:
        ValueError: a key missing or unknown (an importer's bug, not the source's).

    """
    if set(values) != set(HPARAMS):
        raise ValueError(f"hparams: missing {sorted(set(HPARAMS) - set(values))}, "
                         f"unknown {sorted(set(values) - set(HPARAMS))}")
    return {k: values[k] for k in HPARAMS}


def const_rows(v: np.ndarray) -> RowLoader:
    """Return a row loader of the single row ``v`` (a computed vector such as rope_freqs)."""
    row = np.asarray(v, dtype=np.float32).reshape(1, -1)

    def rows(r0: int, r1: int) -> np.ndarray:
        return row[r0:r1]

    return rows


@dataclass(frozen=True)
class SrcTensor:
    """One tensor of the source, loaded only when written.

    ``rows`` yields float rows of the 2-D view ``[prod(shape[:-1]), shape[-1]]``.
    ``raw``/``raw_dtype`` offer the bytes already encoded in a container dtype, which are
    copied unchanged when the requested dtype allows. ``lossy`` marks a source stored in
    a lossy type the container lacks (GGUF K-quants): re-quantized to q8_0 at most.
    """

    name: str
    shape: tuple[int, ...]
    kind: str  # "f32" | "trunk" | "embedding" | "output" | "experts"
    rows: RowLoader
    nbytes: int
    raw: Callable[[], np.ndarray] | None = None
    raw_dtype: str | None = None
    lossy: bool = False

    @property
    def matrix(self) -> tuple[int, int]:
        """The 2-D view ``(rows, cols)``."""
        n = 1
        for d in self.shape[:-1]:
            n *= int(d)
        return n, int(self.shape[-1])


@dataclass(frozen=True)
class ExpertLayerSrc:
    """The routed experts of one MoE layer; ``expert(e)`` gives its gate, up, down."""

    layer: int
    n_experts: int
    shapes: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
    expert: Callable[[int], tuple[SrcTensor, SrcTensor, SrcTensor]]
    nbytes: int


@dataclass
class Plan:
    """Everything an importer found: what to write, and the manifest keys it decides."""

    model_type: str
    source_config: dict[str, Any]
    hparams: dict[str, Any]
    trunk: list[SrcTensor]
    experts: list[ExpertLayerSrc]
    files: list[tuple[str, bytes]]
    tokenizer: dict[str, Any]
    chat: dict[str, Any]
    source: str  # "hf" | "gguf"
    vision: dict[str, Any] | None = None  # the manifest's "vision" object (image towers)


def rope_freqs(inv: np.ndarray, name: str = "rope_freqs") -> SrcTensor:
    """Return the computed rope table ``[rope_dim / 2]`` (f32), from its inverse frequencies."""
    v = np.asarray(inv, dtype=np.float32)
    return SrcTensor(name, (int(v.shape[0]),), "f32", const_rows(v), 0)


ExpertShapes = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


def expert_shapes(hp: Mapping[str, Any]) -> ExpertShapes:
    """Gate, up and down shapes of one expert: ``[inter, hidden]`` twice, ``[hidden, inter]``."""
    inter, h = hp["moe_intermediate_size"], hp["hidden_size"]
    return (inter, h), (inter, h), (h, inter)


def layer_shapes(hp: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shape of every :data:`LAYER_TENSORS` entry as the normalized hyperparameters imply.

    ``qk_norm`` ``full`` norms the whole q/k row, ``head`` one head; MLA (``kv_lora_rank``
    set) replaces the q/k/v projections with the latent ones.
    """
    h, hd = hp["hidden_size"], hp["head_dim"]
    q, kv = hp["n_heads"] * hd, hp["n_kv_heads"] * hd
    full = hp["qk_norm"] == "full"
    inter, shared = hp["intermediate_size"], hp["shared_expert_intermediate_size"]
    shapes = {
        "attn_norm.weight": (h,),
        "ffn_norm.weight": (h,),
        "attn_q.weight": (q, h),
        "attn_k.weight": (kv, h),
        "attn_v.weight": (kv, h),
        "attn_output.weight": (h, q),
        "attn_q.bias": (q,),
        "attn_k.bias": (kv,),
        "attn_v.bias": (kv,),
        "attn_output.bias": (h,),
        "attn_q_norm.weight": (q,) if full else (hd,),
        "attn_k_norm.weight": (kv,) if full else (hd,),
        "ffn_gate.weight": (inter, h),
        "ffn_up.weight": (inter, h),
        "ffn_down.weight": (h, inter),
        "ffn_gate.bias": (inter,),
        "ffn_up.bias": (inter,),
        "ffn_down.bias": (h,),
        "ffn_gate_inp.weight": (hp["n_experts"], h),
        "ffn_gate_shexp.weight": (shared, h),
        "ffn_up_shexp.weight": (shared, h),
        "ffn_down_shexp.weight": (h, shared),
        "ffn_gate_inp_shexp.weight": (1, h),
        "exp_probs_b.bias": (hp["n_experts"],),
    }
    if hp.get("kv_lora_rank"):  # MLA
        ql, r, nh = hp["q_lora_rank"], hp["kv_lora_rank"], hp["n_heads"]
        shapes |= {
            "attn_q_a.weight": (ql, h),
            "attn_q_a.bias": (ql,),
            "attn_q_a_norm.weight": (ql,),
            "attn_q_b.weight": (q, ql),
            "attn_kv_a_mqa.weight": (r + hp["rope_dim"], h),
            "attn_kv_a_mqa.bias": (r + hp["rope_dim"],),
            "attn_kv_a_norm.weight": (r,),
            "attn_kv_b.weight": (nh * (hp["qk_nope_head_dim"] + hp["v_head_dim"]), r),
            "attn_output.weight": (h, nh * hp["v_head_dim"]),
        }
    return shapes
