"""Hugging Face checkpoint importer: config.json + safetensors + tokenizer -> a Plan.

Owns: reading sharded or single-file safetensors lazily (the header is parsed here and
tensors are memory-mapped, so bf16 and fp8 need no framework), DeepSeek-style fp8 e4m3
weights with ``weight_scale_inv`` block scales (block size from
``quantization_config.weight_block_size``, never from shapes), the HF -> FORMAT.md
tensor-name map for ``llama``, ``qwen3_moe``, ``qwen2_moe``, ``mixtral``, ``olmoe``,
``deepseek_v3`` (also as Kimi-K2's ``kimi_k2``; MLA tensors kept as stored, ``kv_b_proj``
included; multi-token-prediction layers skipped) and ``glm4_moe`` (per-expert tensors and
transformers-5 fused ``gate_up_proj``/``down_proj``; ``e_score_correction_bias`` ->
``exp_probs_b.bias``), the
normalized hparams of FORMAT.md section 3 including ``rope_freqs`` for every rope type and
the sliding-window layers of ``mixtral``, ``qwen2_moe`` and ``qwen3_moe`` (``attn_kinds``),
and the tokenizer/chat-template side files (for a tiktoken rank file, the split pattern
``pat_str`` is written into the container's tokenizer_config.json, taken from the source's
config or read from the literals its ``tokenization_*.py`` assigns).

Refuses, with a ``ConvertError`` naming the file, key or tensor: other model types,
unknown or missing tensors, shapes that disagree with the config, unsupported dtypes or
rope types, a ``hidden_act`` other than silu, and a checkpoint without a tokenizer.
Called by ``convert()``.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from .quant import ConvertError, bf16_to_f32
from .writer import ExpertLayerSrc, Plan, SrcTensor, const_rows

__all__ = [
    "MODEL_TYPE_ALIASES",
    "ROPE_TYPES",
    "SUPPORTED_MODEL_TYPES",
    "SafetensorsDir",
    "fp8_e4m3_to_f32",
    "load_hf",
    "rope_from_config",
    "rope_inv_freq",
]

SUPPORTED_MODEL_TYPES: Final[tuple[str, ...]] = (
    "llama",
    "mixtral",
    "olmoe",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v3",
    "glm4_moe",
)

#: Checkpoint model_type spellings whose config keys and weights are another type's; the
#: container gets the engine's name (Kimi-K2 ships DeepseekV3ForCausalLM as ``kimi_k2``).
MODEL_TYPE_ALIASES: Final[dict[str, str]] = {"kimi_k2": "deepseek_v3"}

# --------------------------------------------------------------------------- rope

ROPE_TYPES: Final[tuple[str, ...]] = ("default", "linear", "dynamic", "llama3", "yarn")


def _need(params: Mapping[str, Any], key: str, rope_type: str) -> float:
    v = params.get(key)
    if v is None:
        raise ConvertError(f"rope type {rope_type!r} needs rope parameter {key!r}")
    return float(v)


def _base(theta: float, dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(
    rope_type: str,
    theta: float,
    dim: int,
    params: Mapping[str, Any],
    max_position_embeddings: int,
) -> tuple[np.ndarray, float]:
    """Inverse frequencies (``[dim/2]`` float32) and attention factor of a rope config.

    Args:
        rope_type: one of :data:`ROPE_TYPES`.
        theta: the rope base.
        dim: rotated dims per head (even).
        params: the variant's parameters (``factor``, ``low_freq_factor``, ...).
        max_position_embeddings: the model's context length.

    Raises:
        ConvertError: unknown type, odd or non-positive ``dim``, or a missing parameter.

    """
    if dim <= 0 or dim % 2:
        raise ConvertError(f"rope dimension must be a positive even number, got {dim}")
    if theta <= 0:
        raise ConvertError(f"rope_theta must be positive, got {theta}")
    attn = 1.0
    if rope_type == "default":
        inv = _base(theta, dim)
    elif rope_type == "linear":
        inv = _base(theta, dim) / _need(params, "factor", rope_type)
    elif rope_type == "dynamic":
        # NTK-aware base stretch at sequence length = max_position_embeddings; at that
        # length the stretch is exactly 1, so the stored table equals the default one.
        factor = _need(params, "factor", rope_type)
        seq = float(max_position_embeddings)
        stretched = theta * ((factor * seq / max_position_embeddings) - (factor - 1)) ** (
            dim / (dim - 2)
        )
        inv = _base(stretched, dim)
    elif rope_type == "llama3":
        factor = _need(params, "factor", rope_type)
        low = _need(params, "low_freq_factor", rope_type)
        high = _need(params, "high_freq_factor", rope_type)
        old_ctx = float(params.get("original_max_position_embeddings") or max_position_embeddings)
        inv0 = _base(theta, dim)
        wavelen = 2 * math.pi / inv0
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        smooth = (old_ctx / wavelen - low) / (high - low)
        inv = np.where(
            wavelen < high_wavelen,
            inv0,
            np.where(
                wavelen > low_wavelen, inv0 / factor, (1 - smooth) * inv0 / factor + smooth * inv0
            ),
        )
    elif rope_type == "yarn":
        orig = float(params.get("original_max_position_embeddings") or max_position_embeddings)
        factor_v = params.get("factor")
        factor = float(factor_v) if factor_v is not None else max_position_embeddings / orig
        mscale = params.get("mscale")
        mscale_all = params.get("mscale_all_dim")
        af = params.get("attention_factor")
        if af is not None:
            attn = float(af)
        elif mscale and mscale_all:
            attn = _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
        else:
            attn = _yarn_mscale(factor)
        beta_fast = float(params.get("beta_fast") or 32)
        beta_slow = float(params.get("beta_slow") or 1)

        def corr_dim(rotations: float) -> float:
            return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        lo_d, hi_d = corr_dim(beta_fast), corr_dim(beta_slow)
        if params.get("truncate", True):
            lo_d, hi_d = math.floor(lo_d), math.ceil(hi_d)
        lo_d, hi_d = max(lo_d, 0), min(hi_d, dim - 1)
        if lo_d == hi_d:
            hi_d += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo_d) / (hi_d - lo_d), 0.0, 1.0)
        extrap = 1.0 - ramp
        inv0 = _base(theta, dim)
        inv = (inv0 / factor) * (1 - extrap) + inv0 * extrap
    else:
        raise ConvertError(
            f"unsupported rope type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
        )
    return np.asarray(inv, dtype=np.float32), float(attn)


def rope_from_config(
    cfg: Mapping[str, Any], head_dim: int
) -> tuple[str, float, int, dict[str, Any]]:
    """(rope_type, theta, rope_dim, params) from a config in either spelling.

    Reads transformers-5 ``rope_parameters`` and the older top-level ``rope_theta`` /
    ``rope_scaling`` / ``partial_rotary_factor``.
    """
    rp = cfg.get("rope_parameters")
    if rp is None:
        rp = cfg.get("rope_scaling")
    params: dict[str, Any] = dict(rp) if isinstance(rp, Mapping) else {}
    if rp is not None and not isinstance(rp, Mapping):
        raise ConvertError(
            f"config.json: rope_parameters must be an object, got {type(rp).__name__}"
        )
    if params and all(isinstance(v, Mapping) for v in params.values()):
        raise ConvertError("config.json: per-layer-type rope parameters are not supported")
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    theta_v = params.get("rope_theta", cfg.get("rope_theta"))
    theta = float(theta_v) if theta_v is not None else 10000.0
    prf_v = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    prf = float(prf_v) if prf_v is not None else 1.0
    if not 0.0 < prf <= 1.0:
        raise ConvertError(f"config.json: partial_rotary_factor must be in (0, 1], got {prf}")
    rope_dim = int(head_dim * prf)
    if (
        "original_max_position_embeddings" not in params
        and "original_max_position_embeddings" in cfg
    ):
        params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    return rope_type, theta, rope_dim, params


# --------------------------------------------------------------------------- safetensors

_ST_DTYPES: Final[dict[str, tuple[str, int]]] = {
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "F16": ("<f2", 2),
    "BF16": ("<u2", 2),
    "F8_E4M3": ("u1", 1),
    "U8": ("u1", 1),  # packed MXFP4 blocks/scales (gpt_oss, hf_ext.py); never a float weight
    "I64": ("<i8", 8),  # index tables (deepseek_v4 tid2eid, hf_dsv4.py); never a float weight
    "I32": ("<i4", 4),
    "I8": ("i1", 1),  # packed FP4 e2m1 pairs (deepseek_v4 experts, hf_dsv4.py)
    "F8_E8M0": ("u1", 1),  # power-of-two block scales 2^(b - 127) (deepseek_v4, hf_dsv4.py)
}
_MAX_HEADER: Final[int] = 100 << 20


def _fp8_table() -> np.ndarray:
    v = np.arange(256)
    sign = np.where(v & 0x80, -1.0, 1.0)
    exp = (v >> 3) & 0xF
    man = v & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    out = (sign * val).astype(np.float32)
    out[(exp == 0xF) & (man == 0x7)] = np.nan  # e4m3fn: no infinities, S.1111.111 is NaN
    return out


_FP8_LUT: Final[np.ndarray] = _fp8_table()


def fp8_e4m3_to_f32(raw: np.ndarray) -> np.ndarray:
    """Decode float8 e4m3fn bytes to float32 (exactly)."""
    return _FP8_LUT[np.asarray(raw, dtype=np.uint8)]


@dataclass(frozen=True)
class _StEntry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in file
    nbytes: int


def _read_st_header(path: Path) -> dict[str, _StEntry]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ConvertError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            n = int.from_bytes(head, "little")
            if n > min(_MAX_HEADER, size - 8):
                raise ConvertError(f"{path}: safetensors header length {n} is out of range")
            text = f.read(n)
    except OSError as e:
        raise ConvertError(f"{path}: cannot read ({e.strerror})") from e
    try:
        hdr = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: safetensors header is not valid JSON ({e})") from e
    if not isinstance(hdr, dict):
        raise ConvertError(f"{path}: safetensors header is not an object")
    data0 = 8 + n
    out: dict[str, _StEntry] = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(info["dtype"])
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise ConvertError(f"{path}: tensor {name!r} has a malformed header entry") from err
        if dtype not in _ST_DTYPES:
            raise ConvertError(
                f"{path}: tensor {name!r} has dtype {dtype}; "
                f"supported: {', '.join(sorted(_ST_DTYPES))}"
            )
        count = math.prod(shape)
        if (
            any(d < 0 for d in shape)
            or end < begin
            or end - begin != count * _ST_DTYPES[dtype][1]
            or data0 + end > size
        ):
            raise ConvertError(
                f"{path}: tensor {name!r} offsets {begin}..{end} do not fit its shape or the file"
            )
        out[name] = _StEntry(path, dtype, shape, data0 + begin, end - begin)
    return out


class SafetensorsDir:
    """All tensors of a checkpoint directory, memory-mapped on first use."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = model_dir
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ConvertError(f"{index}: unreadable or without weight_map") from e
            files = sorted({str(v) for v in wm.values()})
        else:
            wm = None
            files = sorted(p.name for p in model_dir.glob("*.safetensors"))
            # Some repos also ship Mistral-format consolidated*.safetensors; prefer HF's.
            hf_files = [f for f in files if f.startswith("model")]
            files = hf_files or files
        if not files:
            raise ConvertError(f"{model_dir}: no *.safetensors files")
        self.entries: dict[str, _StEntry] = {}
        for fn in files:
            p = model_dir / fn
            if "/" in fn or not p.is_file():
                raise ConvertError(f"{index if wm else model_dir}: shard {fn!r} is missing")
            for name, ent in _read_st_header(p).items():
                if name in self.entries:
                    raise ConvertError(
                        f"{p}: tensor {name!r} also in {self.entries[name].file.name}"
                    )
                self.entries[name] = ent
        if wm is not None:
            for name, fn in wm.items():
                found = self.entries.get(name)
                if found is None or found.file.name != fn:
                    raise ConvertError(f"{index}: tensor {name!r} is not in shard {fn!r}")
    def raw(self, name: str) -> np.ndarray:
        """Return the tensor as stored (bf16 as uint16, fp8 as uint8), memory-mapped.

        Each tensor gets its own mapping, released with the array: resident memory stays
        bounded by the tensor being converted, not by the size of the checkpoint (one
        long-lived mapping per shard kept every page read so far resident).
        """
        ent = self.entries[name]
        npdt = _ST_DTYPES[ent.dtype][0]
        if ent.nbytes == 0:
            return np.zeros(ent.shape, dtype=npdt)
        mm = np.memmap(ent.file, dtype=np.uint8, mode="r", offset=ent.begin,
                       shape=(ent.nbytes,))
        return mm.view(npdt).reshape(ent.shape)


def _to_f32(a: np.ndarray, st_dtype: str) -> np.ndarray:
    if st_dtype == "BF16":
        return bf16_to_f32(a)
    if st_dtype == "F8_E4M3":
        return fp8_e4m3_to_f32(a)
    if st_dtype == "U8":
        raise ConvertError("a U8 tensor is not a float weight (only MXFP4 blocks are U8)")
    return np.asarray(a, dtype=np.float32)


class _Rows:
    """Float rows of a 2-D view of a stored tensor, dequantizing fp8 block scales."""

    def __init__(
        self,
        arr: np.ndarray,
        st_dtype: str,
        *,
        scale: np.ndarray | None = None,
        scale_dtype: str = "F32",
        block: tuple[int, int] | None = None,
        row0: int = 0,
    ) -> None:
        self.arr = arr
        self.st_dtype = st_dtype
        self.scale = scale
        self.scale_dtype = scale_dtype
        self.block = block
        self.row0 = row0

    def __call__(self, r0: int, r1: int) -> np.ndarray:
        a0, a1 = self.row0 + r0, self.row0 + r1
        x = _to_f32(self.arr[a0:a1], self.st_dtype)
        if self.scale is not None and self.block is not None:
            b0, b1 = self.block
            s = _to_f32(self.scale[np.arange(a0, a1) // b0], self.scale_dtype)
            x = x * np.repeat(s, b1, axis=1)[:, : x.shape[1]]
        return np.asarray(x, dtype=np.float32)


# --------------------------------------------------------------------------- names

_TOP: Final[dict[str, tuple[str, str]]] = {
    "model.embed_tokens.weight": ("token_embd.weight", "embedding"),
    "model.norm.weight": ("output_norm.weight", "f32"),
    "lm_head.weight": ("output.weight", "output"),
}
_LAYER: Final[dict[str, tuple[str, str]]] = {
    "input_layernorm.weight": ("attn_norm.weight", "f32"),
    "post_attention_layernorm.weight": ("ffn_norm.weight", "f32"),
    "self_attn.q_proj.weight": ("attn_q.weight", "trunk"),
    "self_attn.k_proj.weight": ("attn_k.weight", "trunk"),
    "self_attn.v_proj.weight": ("attn_v.weight", "trunk"),
    "self_attn.o_proj.weight": ("attn_output.weight", "trunk"),
    "self_attn.q_proj.bias": ("attn_q.bias", "f32"),
    "self_attn.k_proj.bias": ("attn_k.bias", "f32"),
    "self_attn.v_proj.bias": ("attn_v.bias", "f32"),
    "self_attn.o_proj.bias": ("attn_output.bias", "f32"),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", "f32"),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", "f32"),
    "mlp.gate_proj.weight": ("ffn_gate.weight", "trunk"),
    "mlp.up_proj.weight": ("ffn_up.weight", "trunk"),
    "mlp.down_proj.weight": ("ffn_down.weight", "trunk"),
    "mlp.gate_proj.bias": ("ffn_gate.bias", "f32"),  # llama mlp_bias
    "mlp.up_proj.bias": ("ffn_up.bias", "f32"),
    "mlp.down_proj.bias": ("ffn_down.bias", "f32"),
    "mlp.gate.weight": ("ffn_gate_inp.weight", "f32"),
    "block_sparse_moe.gate.weight": ("ffn_gate_inp.weight", "f32"),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", "trunk"),
    "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", "trunk"),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", "trunk"),
    "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", "f32"),
    # deepseek_v3 / glm4_moe: shared experts, routing bias, multi-head latent attention
    "mlp.shared_experts.gate_proj.weight": ("ffn_gate_shexp.weight", "trunk"),
    "mlp.shared_experts.up_proj.weight": ("ffn_up_shexp.weight", "trunk"),
    "mlp.shared_experts.down_proj.weight": ("ffn_down_shexp.weight", "trunk"),
    "mlp.gate.e_score_correction_bias": ("exp_probs_b.bias", "f32"),
    "self_attn.q_a_proj.weight": ("attn_q_a.weight", "trunk"),
    "self_attn.q_a_proj.bias": ("attn_q_a.bias", "f32"),
    "self_attn.q_a_layernorm.weight": ("attn_q_a_norm.weight", "f32"),
    "self_attn.q_b_proj.weight": ("attn_q_b.weight", "trunk"),
    "self_attn.kv_a_proj_with_mqa.weight": ("attn_kv_a_mqa.weight", "trunk"),
    "self_attn.kv_a_proj_with_mqa.bias": ("attn_kv_a_mqa.bias", "f32"),
    "self_attn.kv_a_layernorm.weight": ("attn_kv_a_norm.weight", "f32"),
    "self_attn.kv_b_proj.weight": ("attn_kv_b.weight", "trunk"),
}
# Canonical order of a layer's trunk tensors in trunk.bin.
_LAYER_ORDER: Final[tuple[str, ...]] = (
    "attn_norm.weight",
    "attn_q.weight",
    "attn_q.bias",
    "attn_k.weight",
    "attn_k.bias",
    "attn_v.weight",
    "attn_v.bias",
    "attn_output.weight",
    "attn_output.bias",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "ffn_gate.bias",
    "ffn_up.bias",
    "ffn_down.bias",
    "ffn_gate_inp.weight",
    "ffn_gate_shexp.weight",
    "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
    "ffn_gate_inp_shexp.weight",
    "attn_q_a.weight",
    "attn_q_a.bias",
    "attn_q_a_norm.weight",
    "attn_q_b.weight",
    "attn_kv_a_mqa.weight",
    "attn_kv_a_mqa.bias",
    "attn_kv_a_norm.weight",
    "attn_kv_b.weight",
    "exp_probs_b.bias",
)
_LAYER_RE: Final[re.Pattern[str]] = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT_RE: Final[re.Pattern[str]] = re.compile(
    r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight"
)
_FUSED_RE: Final[re.Pattern[str]] = re.compile(
    r"(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?"
)
_EXPERT_PART: Final[dict[str, str]] = {
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
    "w1": "gate",
    "w3": "up",
    "w2": "down",
}
_IGNORED_SUFFIXES: Final[tuple[str, ...]] = ("rotary_emb.inv_freq",)


# --------------------------------------------------------------------------- config


def _load_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConvertError(f"{path}: cannot read ({e.strerror})") from e
    except ValueError as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(obj, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return obj


def _int(
    cfg: Mapping[str, Any], key: str, *, default: int | None = None, where: str = "config.json"
) -> int:
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ConvertError(f"{where}: missing required key {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
        raise ConvertError(f"{where}: {key!r} must be a non-negative integer, got {v!r}")
    return int(v)


def _ids(v: Any, key: str, where: str) -> list[int]:
    if v is None:
        return []
    vals = v if isinstance(v, list) else [v]
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ConvertError(f"{where}: {key!r} must be a token id or a list of them, got {v!r}")
        out.append(int(x))
    return out


def _layer_kinds(cfg: Mapping[str, Any], n_layers: int, n_experts: int) -> list[str]:
    """Per-layer "dense"/"moe" from whichever of the families' spellings is present."""
    if n_experts == 0:
        return ["dense"] * n_layers
    types = cfg.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ConvertError(f"config.json: mlp_layer_types must list {n_layers} entries")
        kinds = []
        for t in types:
            if t in ("dense", "mlp"):
                kinds.append("dense")
            elif t in ("sparse", "moe"):
                kinds.append("moe")
            else:
                raise ConvertError(f"config.json: unknown mlp_layer_types entry {t!r}")
        return kinds
    step = _int(cfg, "decoder_sparse_step", default=1)
    if step < 1:
        raise ConvertError("config.json: decoder_sparse_step must be >= 1")
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
        raise ConvertError("config.json: mlp_only_layers must be a list of layer indices")
    first_dense = _int(cfg, "first_k_dense_replace", default=0)
    return [
        "moe" if (i not in only and (i + 1) % step == 0 and i >= first_dense) else "dense"
        for i in range(n_layers)
    ]


_EXPERT_COUNT_KEYS: Final[tuple[str, ...]] = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
)


def _n_experts(cfg: Mapping[str, Any], *, allow_none: bool = False) -> int:
    """Return the routed-expert count, whichever family spelling wrote it.

    ``allow_none``: 0 is valid (qwen2_moe, qwen3_moe: every layer is then dense).
    """
    found = {k: _int(cfg, k) for k in _EXPERT_COUNT_KEYS if cfg.get(k) is not None}
    if not found:
        raise ConvertError(
            f"config.json: missing the expert count ({' or '.join(_EXPERT_COUNT_KEYS)})"
        )
    if len(set(found.values())) > 1:
        raise ConvertError(f"config.json: expert counts disagree: {found}")
    n = next(iter(found.values()))
    if n == 0 and not allow_none:
        raise ConvertError("config.json: a MoE model needs an expert count > 0")
    return n


def _flag(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConvertError(f"config.json: {key!r} must be true or false, got {v!r}")
    return v


# transformers' defaults of the keys a deepseek_v3 / glm4_moe config.json may omit.
_NOAUX_DEFAULTS: Final[dict[str, dict[str, Any]]] = {
    "deepseek_v3": {"n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
                    "routed_scaling_factor": 2.5, "n_shared_experts": 1, "rope_interleave": True,
                    "norm_topk_prob": True},
    "glm4_moe": {"n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                 "routed_scaling_factor": 1.0, "n_shared_experts": 1, "norm_topk_prob": True,
                 "use_qk_norm": False},
}


def _noaux_hparams(mt: str, cfg: Mapping[str, Any], n_experts: int, top_k: int) -> dict[str, Any]:
    """Routing keys of deepseek_v3 / glm4_moe: sigmoid scores, groups, scaling (noaux_tc)."""
    scoring = cfg.get("scoring_func")
    if scoring not in (None, "sigmoid"):
        raise ConvertError(
            f"config.json: scoring_func {scoring!r}: {mt} routes with sigmoid scores (noaux_tc)"
        )
    method = cfg.get("topk_method")
    if method not in (None, "noaux_tc"):
        raise ConvertError(f"config.json: topk_method {method!r}: only noaux_tc is supported")
    n_group = _int(cfg, "n_group", default=1) or 1
    topk_group = _int(cfg, "topk_group", default=1) or 1
    if n_group > 1:
        if n_experts % n_group or n_experts // n_group < 2:
            raise ConvertError(
                f"config.json: n_group={n_group} must split {n_experts} experts into groups of >= 2"
            )
        if not 1 <= topk_group <= n_group or topk_group * (n_experts // n_group) < top_k:
            raise ConvertError(
                f"config.json: topk_group={topk_group} must be in 1..{n_group} and its groups "
                f"must hold num_experts_per_tok={top_k} experts"
            )
    rsf = cfg.get("routed_scaling_factor")
    if not isinstance(rsf, (int, float)) or isinstance(rsf, bool) or not rsf > 0:
        raise ConvertError(f"config.json: routed_scaling_factor must be > 0, got {rsf!r}")
    return {
        "scoring_func": "sigmoid",
        "n_group": n_group,
        "topk_group": min(topk_group, n_group),
        "routed_scaling_factor": float(rsf),
    }


def _sliding(mt: str, cfg: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
    """``sliding_window`` and ``attn_kinds`` as transformers derives them, or nothing.

    mixtral: ``sliding_window`` (null: none) on every layer; qwen3_moe: the same when
    ``use_sliding_window``; qwen2_moe: the layers ``layer_types`` marks (by default, as
    Qwen2MoeConfig derives it: even layers below ``max_window_layers``) when
    ``use_sliding_window``.
    """
    if mt not in ("mixtral", "qwen2_moe", "qwen3_moe"):
        return {}
    use = mt == "mixtral" or _flag(cfg, "use_sliding_window", False)
    window = cfg.get("sliding_window") if use else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 0):
        raise ConvertError(
            f"config.json: sliding_window must be null or a non-negative integer, got {window!r}"
        )
    kinds = ["sliding" if window else "full"] * n_layers
    if mt == "qwen2_moe":
        types = cfg.get("layer_types")
        if types is None:
            mwl = _int(cfg, "max_window_layers", default=28)
            types = ["sliding_attention" if (i + 1) % 2 and i < mwl and use else "full_attention"
                     for i in range(n_layers)]
        if not isinstance(types, list) or len(types) != n_layers or not all(
                t in ("sliding_attention", "full_attention") for t in types):
            raise ConvertError(
                f"config.json: layer_types must list {n_layers} entries of "
                "'sliding_attention' or 'full_attention'"
            )
        kinds = ["sliding" if t == "sliding_attention" else "full" for t in types]
        if "sliding" in kinds and not window:
            raise ConvertError(
                "config.json: layer_types has sliding_attention layers, but sliding_window is "
                "off (use_sliding_window false, or sliding_window null or 0)"
            )
    if "sliding" not in kinds:
        return {}
    return {"sliding_window": int(window), "attn_kinds": kinds}


def _hparams(mt: str, cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
    if mt in _NOAUX_DEFAULTS:
        cfg = {**_NOAUX_DEFAULTS[mt], **{k: v for k, v in cfg.items() if v is not None}}
        rp = cfg.get("rope_parameters") or cfg.get("rope_scaling")
        if (mt == "glm4_moe" and "partial_rotary_factor" not in cfg
                and not (isinstance(rp, Mapping) and "partial_rotary_factor" in rp)):
            cfg["partial_rotary_factor"] = 0.5  # transformers' Glm4MoeConfig default
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers' ACT2FN: swish is silu
        raise ConvertError(
            f"config.json: hidden_act {act!r} is not supported: the engine's MLPs are SwiGLU "
            "(silu)"
        )
    hidden = _int(cfg, "hidden_size")
    n_layers = _int(cfg, "num_hidden_layers")
    n_heads = _int(cfg, "num_attention_heads")
    if hidden == 0 or n_layers == 0 or n_heads == 0:
        raise ConvertError(
            "config.json: hidden_size, num_hidden_layers and num_attention_heads must be > 0"
        )
    n_kv = _int(cfg, "num_key_value_heads", default=n_heads)
    if n_kv == 0 or n_heads % n_kv:
        raise ConvertError(
            f"config.json: num_key_value_heads={n_kv} does not divide num_attention_heads={n_heads}"
        )
    head_dim = _int(cfg, "head_dim", default=hidden // n_heads) or hidden // n_heads
    rope_head = head_dim
    mla: dict[str, Any] = {}
    if mt == "deepseek_v3":  # MLA: head_dim is the q/k width, rope on qk_rope_head_dim dims
        nope, rope_head = _int(cfg, "qk_nope_head_dim"), _int(cfg, "qk_rope_head_dim")
        head_dim, n_kv = nope + rope_head, n_heads
        mla = {
            "q_lora_rank": _int(cfg, "q_lora_rank", default=0),
            "kv_lora_rank": _int(cfg, "kv_lora_rank"),
            "qk_nope_head_dim": nope,
            "v_head_dim": _int(cfg, "v_head_dim"),
            "rope_interleave": _flag(cfg, "rope_interleave", True),
        }
        if mla["kv_lora_rank"] == 0 or mla["v_head_dim"] == 0 or head_dim == 0:
            raise ConvertError(
                "config.json: kv_lora_rank, v_head_dim and the qk head dims must be > 0"
            )
    inter = _int(cfg, "intermediate_size", default=0)
    if mt == "llama":
        n_experts, top_k, moe_inter, shared, norm_topk = 0, 0, 0, 0, False
    elif mt == "mixtral":
        n_experts = _n_experts(cfg)
        top_k = _int(cfg, "num_experts_per_tok")
        moe_inter, inter, shared, norm_topk = inter, 0, 0, True
    elif mt == "olmoe":
        n_experts = _n_experts(cfg)
        top_k = _int(cfg, "num_experts_per_tok")
        moe_inter, inter, shared = inter, 0, 0
        norm_topk = _flag(cfg, "norm_topk_prob", False)
    elif mt in _NOAUX_DEFAULTS:  # deepseek_v3, glm4_moe
        n_experts = _n_experts(cfg)
        top_k = _int(cfg, "num_experts_per_tok")
        moe_inter = _int(cfg, "moe_intermediate_size")
        shared = moe_inter * _int(cfg, "n_shared_experts")
        norm_topk = _flag(cfg, "norm_topk_prob", True)
    else:  # qwen2_moe, qwen3_moe
        n_experts = _n_experts(cfg, allow_none=True)
        top_k = _int(cfg, "num_experts_per_tok") if n_experts else 0
        moe_inter = _int(cfg, "moe_intermediate_size") if n_experts else 0
        shared = _int(cfg, "shared_expert_intermediate_size", default=0) if mt == "qwen2_moe" else 0
        shared = shared if n_experts else 0
        norm_topk = _flag(cfg, "norm_topk_prob", False)
    if n_experts and not 0 < top_k <= n_experts:
        raise ConvertError(f"config.json: num_experts_per_tok={top_k} must be in 1..{n_experts}")
    kinds = _layer_kinds(cfg, n_layers, n_experts)
    if mt == "mixtral" or mt == "olmoe":
        kinds = ["moe"] * n_layers
    if "dense" not in kinds:
        inter = 0
    elif inter == 0:
        raise ConvertError("config.json: intermediate_size is needed for the dense layers")
    rope_type, theta, rope_dim, rope_params = rope_from_config(cfg, rope_head)
    max_pos = _int(cfg, "max_position_embeddings", default=2048)
    _, attn_factor = rope_inv_freq(rope_type, theta, rope_dim, rope_params, max_pos)
    eps = cfg.get("rms_norm_eps")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise ConvertError(f"config.json: rms_norm_eps must be a positive number, got {eps!r}")
    clip = cfg.get("clip_qkv") if mt == "olmoe" else None
    if clip is not None and (
        not isinstance(clip, (int, float)) or isinstance(clip, bool) or clip < 0
    ):
        raise ConvertError(
            f"config.json: clip_qkv must be null or a non-negative number, got {clip!r}"
        )
    eos: list[int] = []
    for src, where in ((gen, "generation_config.json"), (cfg, "config.json")):
        for i in _ids(src.get("eos_token_id"), "eos_token_id", where):
            if i not in eos:
                eos.append(i)
    bos_v = cfg.get("bos_token_id")
    bos_l = _ids(gen.get("bos_token_id") if bos_v is None else bos_v, "bos_token_id", "config.json")
    vocab = _int(cfg, "vocab_size")
    for i in eos + bos_l:
        if i >= vocab:
            raise ConvertError(
                f"config.json: token id {i} (bos/eos) is outside the vocabulary of {vocab}"
            )
    attn_scale = head_dim**-0.5
    extra: dict[str, Any] = dict(mla)
    if mt in _NOAUX_DEFAULTS:
        extra.update(_noaux_hparams(mt, cfg, n_experts, top_k))
    msa = rope_params.get("mscale_all_dim")
    if mt == "deepseek_v3" and rope_type != "default" and msa:
        # transformers' yarn_apply_mscale: the softmax scale carries mscale(factor, all_dim)^2
        m = _yarn_mscale(float(_need(rope_params, "factor", rope_type)), float(msa))
        attn_scale *= m * m
    extra.update(_sliding(mt, cfg, n_layers))
    qk_norm = {"qwen3_moe": "head", "olmoe": "full"}.get(mt, "none")
    if mt == "glm4_moe" and _flag(cfg, "use_qk_norm", False):
        qk_norm = "head"
    return extra | {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": n_kv,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "moe_intermediate_size": moe_inter,
        "n_experts": n_experts,
        "top_k": top_k,
        "norm_topk_prob": norm_topk,
        "shared_expert_intermediate_size": shared,
        "shared_expert_gate": mt == "qwen2_moe" and shared > 0,
        "layer_kinds": kinds,
        "rms_norm_eps": float(eps),
        "rope_dim": rope_dim,
        "rope_theta": theta,
        "rope_attn_factor": attn_factor,
        "qk_norm": qk_norm,
        "attn_scale": attn_scale,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": _flag(cfg, "tie_word_embeddings", False),
        "bos_token_id": bos_l[0] if bos_l else None,
        "eos_token_ids": eos,
        "clip_qkv": float(clip) if clip is not None else 0.0,
        "_rope": (rope_type, rope_params),
    }


def _expected_shapes(hp: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    h, hd = hp["hidden_size"], hp["head_dim"]
    q, kv = hp["n_heads"] * hd, hp["n_kv_heads"] * hd
    full = hp["qk_norm"] == "full"
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
        "ffn_gate.weight": (hp["intermediate_size"], h),
        "ffn_up.weight": (hp["intermediate_size"], h),
        "ffn_down.weight": (h, hp["intermediate_size"]),
        "ffn_gate.bias": (hp["intermediate_size"],),
        "ffn_up.bias": (hp["intermediate_size"],),
        "ffn_down.bias": (h,),
        "ffn_gate_inp.weight": (hp["n_experts"], h),
        "ffn_gate_shexp.weight": (hp["shared_expert_intermediate_size"], h),
        "ffn_up_shexp.weight": (hp["shared_expert_intermediate_size"], h),
        "ffn_down_shexp.weight": (h, hp["shared_expert_intermediate_size"]),
        "ffn_gate_inp_shexp.weight": (1, h),
        "exp_probs_b.bias": (hp["n_experts"],),
    }
    if hp.get("kv_lora_rank"):  # MLA (deepseek_v3)
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


def _required(hp: Mapping[str, Any], kind: str) -> list[str]:
    req = ["attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight"]
    if hp.get("kv_lora_rank"):  # MLA
        req = ["attn_norm.weight", "ffn_norm.weight", "attn_kv_a_mqa.weight",
               "attn_kv_a_norm.weight", "attn_kv_b.weight"]
        req += (["attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight"]
                if hp["q_lora_rank"] else ["attn_q.weight"])
    req.append("attn_output.weight")
    if hp["qk_norm"] != "none":
        req += ["attn_q_norm.weight", "attn_k_norm.weight"]
    if kind == "dense":
        req += ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
    else:
        req.append("ffn_gate_inp.weight")
        if hp["shared_expert_intermediate_size"]:
            req += ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"]
        if hp["shared_expert_gate"]:
            req.append("ffn_gate_inp_shexp.weight")
    return req


def _allowed(hp: Mapping[str, Any], kind: str) -> set[str]:
    ok = set(_required(hp, kind)) | {
        "attn_q.bias",
        "attn_k.bias",
        "attn_v.bias",
        "attn_output.bias",
    }
    if hp.get("kv_lora_rank"):
        ok |= {"attn_q_a.bias", "attn_kv_a_mqa.bias"}
    if kind == "dense" and hp["n_experts"] == 0:  # llama's mlp_bias
        ok |= {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}
    if kind == "moe" and hp.get("scoring_func") == "sigmoid":
        ok.add("exp_probs_b.bias")
    return ok


# --------------------------------------------------------------------------- loader


def _fp8_block(cfg: Mapping[str, Any]) -> tuple[int, int]:
    qc = cfg.get("quantization_config")
    blk = qc.get("weight_block_size") if isinstance(qc, Mapping) else None
    if (
        not isinstance(blk, list)
        or len(blk) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in blk)
    ):
        raise ConvertError(
            "config.json: fp8 weights need quantization_config.weight_block_size = [rows, cols], "
            f"got {blk!r}"
        )
    return int(blk[0]), int(blk[1])


class _Builder:
    """Turns stored tensors into SrcTensors with shape and fp8-scale checks."""

    def __init__(self, st: SafetensorsDir, cfg: Mapping[str, Any]) -> None:
        self.st = st
        self.cfg = cfg
        self.used_scales: set[str] = set()
        self._block: tuple[int, int] | None = None

    def block(self) -> tuple[int, int]:
        if self._block is None:
            self._block = _fp8_block(self.cfg)
        return self._block

    def _scale(
        self, name: str, rows: int, cols: int, lead: tuple[int, ...] = ()
    ) -> tuple[np.ndarray, str]:
        sname = name + "_scale_inv"
        ent = self.st.entries.get(sname)
        if ent is None:
            raise ConvertError(f"tensor {name!r} is fp8 but {sname!r} is missing")
        b0, b1 = self.block()
        want = (*lead, -(-rows // b0), -(-cols // b1))
        if ent.shape != want:
            raise ConvertError(
                f"{sname!r}: shape {list(ent.shape)} does not match block size [{b0}, {b1}] of "
                f"{name!r} (expected {list(want)})"
            )
        if ent.dtype == "F8_E4M3":
            raise ConvertError(f"{sname!r}: scales must be a float type, not fp8")
        self.used_scales.add(sname)
        return self.st.raw(sname), ent.dtype

    def tensor(self, name: str, cname: str, kind: str, want: tuple[int, ...]) -> SrcTensor:
        ent = self.st.entries[name]
        if ent.shape != want:
            raise ConvertError(
                f"tensor {name!r}: shape {list(ent.shape)}, config implies {list(want)}"
            )
        arr = self.st.raw(name)
        cols = want[-1]
        arr2 = arr.reshape(-1, cols)
        raw = None
        raw_dtype = None
        if ent.dtype == "F8_E4M3":
            if len(want) != 2:
                raise ConvertError(f"tensor {name!r}: fp8 is supported for matrices only")
            scale, sdt = self._scale(name, want[0], cols)
            rows = _Rows(arr2, ent.dtype, scale=scale, scale_dtype=sdt, block=self.block())
        else:
            rows = _Rows(arr2, ent.dtype)
            raw_dtype = {"F32": "f32", "F16": "f16", "BF16": "bf16"}.get(ent.dtype)
            if raw_dtype is not None:
                raw = _raw_loader(arr)
        return SrcTensor(cname, want, kind, rows, ent.nbytes, raw=raw, raw_dtype=raw_dtype)

    def expert_part(
        self,
        name: str,
        e: int,
        n_experts: int,
        want: tuple[int, int],
        row0: int,
        part: str,
        layer: int,
    ) -> SrcTensor:
        """Part of expert ``e`` of a fused 3-D tensor: rows row0..row0+want[0] of slice e."""
        ent = self.st.entries[name]
        arr = self.st.raw(name)
        a = arr[e]
        scale = None
        sdt = "F32"
        block = None
        if ent.dtype == "F8_E4M3":
            scale_all, sdt = self._scale(name, ent.shape[1], ent.shape[2], lead=(n_experts,))
            scale = scale_all[e]
            block = self.block()
        if ent.shape[1] < row0 + want[0] or ent.shape[2] != want[1]:
            # transposed storage [E, cols, rows]
            a = a.T
            if scale is not None and block is not None:
                scale = scale.T
                block = (block[1], block[0])
        rows = _Rows(a, ent.dtype, scale=scale, scale_dtype=sdt, block=block, row0=row0)
        nbytes = ent.nbytes // max(n_experts, 1) * want[0] // max(a.shape[0], 1)
        return SrcTensor(f"blk.{layer}.expert.{e}.{part}", want, "experts", rows, nbytes)


def _raw_loader(arr: np.ndarray) -> Any:
    return lambda: np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def _fused_layout(ent: _StEntry, n_experts: int, rows: int, cols: int, name: str) -> None:
    if ent.shape == (n_experts, rows, cols) or ent.shape == (n_experts, cols, rows):
        return
    raise ConvertError(
        f"tensor {name!r}: shape {list(ent.shape)}, config implies {[n_experts, rows, cols]}"
    )


def _literal_str(node: ast.expr) -> str | None:
    """Evaluate a string built from literals only: "a", "a" + "b", "|".join([...])."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal_str(node.left), _literal_str(node.right)
        return a + b if a is not None and b is not None else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join" and len(node.args) == 1 and not node.keywords
            and isinstance(node.args[0], (ast.List, ast.Tuple))):
        sep = _literal_str(node.func.value)
        parts = [_literal_str(e) for e in node.args[0].elts]
        if sep is not None and all(p is not None for p in parts):
            return sep.join(p for p in parts if p is not None)
    return None


def _tiktoken_pattern(src: Path, rank_file: str) -> str:
    """Find the split regex of a tiktoken checkpoint.

    It is the ``pat_str`` that a ``tokenization_*.py`` of the checkpoint assigns, read as
    literals and never executed.

    Raises:
        ConvertError: no such assignment (naming the rank file and the config key).

    """
    for py in sorted(src.glob("tokenization_*.py")):
        try:
            tree = ast.parse(py.read_text(encoding="utf-8"), filename=str(py))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            named = any(getattr(t, "id", getattr(t, "attr", None)) == "pat_str" for t in targets)
            value = getattr(node, "value", None)
            if named and value is not None and (pat := _literal_str(value)):
                return pat
    raise ConvertError(
        f"{src / rank_file}: a tiktoken vocabulary needs its split pattern: set 'pat_str' "
        f"in tokenizer_config.json (no tokenization_*.py here assigns one)"
    )


def _tokenizer_files(src: Path) -> tuple[list[tuple[str, bytes]], dict[str, Any], dict[str, Any]]:
    files: list[tuple[str, bytes]] = []
    tok = src / "tokenizer.json"
    tiktoken_files = sorted(
        p for p in src.iterdir() if p.name == "tiktoken.model" or p.suffix == ".tiktoken"
    )
    if tok.is_file():
        files.append(("tokenizer.json", tok.read_bytes()))
        tokenizer: dict[str, Any] = {"kind": "hf", "file": "tokenizer.json", "config": None}
    elif tiktoken_files:
        files.append(("tiktoken.model", tiktoken_files[0].read_bytes()))
        tokenizer = {"kind": "tiktoken", "file": "tiktoken.model", "config": None}
    else:
        raise ConvertError(
            f"{src}: no tokenizer.json or tiktoken rank file (tiktoken.model, *.tiktoken)"
        )
    tc_path = src / "tokenizer_config.json"
    template: str | None = None
    tc = _load_json(tc_path) if tc_path.is_file() else {}
    if tokenizer["kind"] == "tiktoken" and not isinstance(tc.get("pat_str"), str):
        # tiktoken has no file of its own for the split regex; the container's
        # tokenizer_config.json carries it so the container needs nothing else.
        tc["pat_str"] = _tiktoken_pattern(src, tiktoken_files[0].name)
        files.append(("tokenizer_config.json", json.dumps(tc, indent=1).encode("utf-8")))
        tokenizer["config"] = "tokenizer_config.json"
    elif tc_path.is_file():
        files.append(("tokenizer_config.json", tc_path.read_bytes()))
        tokenizer["config"] = "tokenizer_config.json"
    ct = tc.get("chat_template")
    if isinstance(ct, str):
        template = ct
    elif isinstance(ct, list):
        named = {d.get("name"): d.get("template") for d in ct if isinstance(d, Mapping)}
        pick = named.get("default")
        template = pick if isinstance(pick, str) else None
    jinja = src / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    elif template is None and (src / "chat_template.json").is_file():
        ct = _load_json(src / "chat_template.json").get("chat_template")
        template = ct if isinstance(ct, str) else None
    chat: dict[str, Any] = {"template": None, "format": None}
    if template is not None:
        files.append(("chat_template.jinja", template.encode("utf-8")))
        chat["template"] = "chat_template.jinja"
    return files, tokenizer, chat


_SHEXP: Final[tuple[str, ...]] = (
    "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
)


def _empty_shared_expert(mt: Any, hp: Mapping[str, Any], cname: str, ent: _StEntry) -> bool:
    """A qwen2_moe shared expert of width 0: its empty matrices, and the gate that scales
    its zero output, change nothing (transformers still stores them)."""
    if mt != "qwen2_moe" or hp["shared_expert_intermediate_size"] or not hp["n_experts"]:
        return False
    return cname == "ffn_gate_inp_shexp.weight" or (cname in _SHEXP and 0 in ent.shape)


def load_hf(src: Path) -> Plan:
    """Read an HF checkpoint directory into a :class:`Plan` (no tensor data is read yet).

    Raises:
        ConvertError: naming the file, key or tensor at fault.

    """
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ConvertError(f"{src}: no config.json (not an HF checkpoint directory)")
    cfg = _load_json(cfg_path)
    mt = cfg.get("model_type")
    mt = MODEL_TYPE_ALIASES.get(mt, mt) if isinstance(mt, str) else mt
    from .hf_ext import EXT_MODEL_TYPES, load_ext
    from .hf_glm5 import GLM5_MODEL_TYPES, load_glm5

    if mt in EXT_MODEL_TYPES:
        return load_ext(src, cfg)
    if mt in GLM5_MODEL_TYPES:
        return load_glm5(src, cfg)
    if mt not in SUPPORTED_MODEL_TYPES:
        known = SUPPORTED_MODEL_TYPES + EXT_MODEL_TYPES + GLM5_MODEL_TYPES
        known += tuple(MODEL_TYPE_ALIASES)
        raise ConvertError(
            f"{cfg_path}: model_type {mt!r} is not supported; supported: "
            f"{', '.join(sorted(known))}"
        )
    gen_path = src / "generation_config.json"
    gen = _load_json(gen_path) if gen_path.is_file() else {}
    hp = _hparams(str(mt), cfg, gen)
    rope_type, rope_params = hp.pop("_rope")
    mtp = _int(cfg, "num_nextn_predict_layers", default=0) if mt in _NOAUX_DEFAULTS else 0
    st = SafetensorsDir(src)
    b = _Builder(st, cfg)
    n_layers = hp["n_layers"]

    top: dict[str, str] = {}
    layers: dict[int, dict[str, str]] = {i: {} for i in range(n_layers)}
    experts: dict[int, dict[int, dict[str, str]]] = {}
    fused: dict[int, dict[str, str]] = {}
    unknown: list[str] = []
    for name in sorted(st.entries):
        if name.endswith("_scale_inv") or name.endswith(_IGNORED_SUFFIXES):
            continue
        if name in _TOP:
            top[_TOP[name][0]] = name
            continue
        m = _LAYER_RE.fullmatch(name)
        if m is not None and n_layers <= int(m.group(1)) < n_layers + mtp:
            continue  # multi-token-prediction layers: not part of the decoder
        if m is None or int(m.group(1)) >= n_layers:
            unknown.append(name)
            continue
        i, rest = int(m.group(1)), m.group(2)
        if rest in _LAYER:
            cname = _LAYER[rest][0]
            if _empty_shared_expert(mt, hp, cname, st.entries[name]):
                continue
            if cname in layers[i]:
                raise ConvertError(
                    f"tensors {layers[i][cname]!r} and {name!r} both map to blk.{i}.{cname}"
                )
            layers[i][cname] = name
        elif (em := _EXPERT_RE.fullmatch(rest)) is not None:
            experts.setdefault(i, {}).setdefault(int(em.group(1)), {})[
                _EXPERT_PART[em.group(2)]
            ] = name
        elif (fm := _FUSED_RE.fullmatch(rest)) is not None:
            fused.setdefault(i, {})[fm.group(1)] = name
        else:
            unknown.append(name)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ConvertError(f"{src}: tensors not used by {mt}: {', '.join(unknown[:5])}{more}")

    h, vocab = hp["hidden_size"], hp["vocab_size"]
    kinds_of = {
        "token_embd.weight": "embedding",
        "output_norm.weight": "f32",
        "output.weight": "output",
    }
    trunk: list[SrcTensor] = []
    for cname in ("token_embd.weight", "output_norm.weight", "output.weight"):
        if cname == "output.weight" and hp["tie_word_embeddings"]:
            continue
        if cname not in top:
            hf_name = next(k for k, v in _TOP.items() if v[0] == cname)
            raise ConvertError(f"{src}: tensor {hf_name!r} is missing")
        want = (h,) if cname == "output_norm.weight" else (vocab, h)
        trunk.append(b.tensor(top[cname], cname, kinds_of[cname], want))
    rope_dim = hp["rope_dim"]
    inv, _ = rope_inv_freq(
        rope_type, hp["rope_theta"], rope_dim, rope_params, hp["max_position_embeddings"]
    )
    trunk.append(SrcTensor("rope_freqs", (rope_dim // 2,), "f32", const_rows(inv), 0))

    shapes = _expected_shapes(hp)
    expert_layers: list[ExpertLayerSrc] = []
    for i in range(n_layers):
        kind = hp["layer_kinds"][i]
        have = layers[i]
        if not hp["shared_expert_intermediate_size"]:
            # n_shared_experts=0: transformers still writes the shared MLP, 0 rows wide
            for cname in ("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"):
                if cname in have and 0 in st.entries[have[cname]].shape:
                    del have[cname]
        for cname in _required(hp, kind):
            if cname not in have:
                hf = next(k for k, v in _LAYER.items() if v[0] == cname)
                raise ConvertError(
                    f"{src}: tensor 'model.layers.{i}.{hf}' is missing ({kind} layer)"
                )
        extra = sorted(set(have) - _allowed(hp, kind))
        if extra:
            raise ConvertError(
                f"{src}: tensor {have[extra[0]]!r} is not used by a {kind} layer of {mt}"
            )
        if kind == "dense" and (i in experts or i in fused):
            raise ConvertError(f"{src}: layer {i} is dense by the config but has expert tensors")
        for cname in _LAYER_ORDER:
            if cname in have:
                kind_t = _LAYER[next(k for k, v in _LAYER.items() if v[0] == cname)][1]
                trunk.append(b.tensor(have[cname], f"blk.{i}.{cname}", kind_t, shapes[cname]))
        if kind == "moe":
            expert_layers.append(_expert_layer(src, b, hp, i, experts.get(i), fused.get(i)))
    # Expert tensors are built lazily; build each once now so every check (shapes,
    # fp8 scales) fails before anything is written.
    for layer in expert_layers:
        for e in range(layer.n_experts):
            layer.expert(e)
    unused_scales = sorted(
        n for n in st.entries if n.endswith("_scale_inv") and n not in b.used_scales
    )
    if unused_scales:
        raise ConvertError(f"{src}: scale tensor {unused_scales[0]!r} belongs to no fp8 weight")

    files, tokenizer, chat = _tokenizer_files(src)
    return Plan(
        model_type=str(mt),
        source_config=cfg,
        hparams=hp,
        trunk=trunk,
        experts=expert_layers,
        files=files,
        tokenizer=tokenizer,
        chat=chat,
        source="hf",
    )


def _expert_layer(
    src: Path,
    b: _Builder,
    hp: Mapping[str, Any],
    i: int,
    per: dict[int, dict[str, str]] | None,
    fz: dict[str, str] | None,
) -> ExpertLayerSrc:
    n_e, inter, h = hp["n_experts"], hp["moe_intermediate_size"], hp["hidden_size"]
    gshape, dshape = (inter, h), (h, inter)
    shapes = (gshape, gshape, dshape)
    if per and fz:
        raise ConvertError(f"{src}: layer {i} has both per-expert and fused expert tensors")
    if per:
        for e in range(n_e):
            parts = per.get(e, {})
            for p in ("gate", "up", "down"):
                if p not in parts:
                    raise ConvertError(f"{src}: layer {i} expert {e} has no {p} projection")
        if max(per) >= n_e:
            raise ConvertError(
                f"{src}: layer {i} has expert {max(per)} but the config says {n_e} experts"
            )
        names = per

        def expert(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
            p = names[e]
            return (
                b.tensor(p["gate"], f"blk.{i}.expert.{e}.gate", "experts", gshape),
                b.tensor(p["up"], f"blk.{i}.expert.{e}.up", "experts", gshape),
                b.tensor(p["down"], f"blk.{i}.expert.{e}.down", "experts", dshape),
            )

        nbytes = sum(b.st.entries[n].nbytes for d in per.values() for n in d.values())
        return ExpertLayerSrc(i, n_e, shapes, expert, nbytes)
    if fz:
        st = b.st
        down = fz.get("down_proj")
        if down is None:
            raise ConvertError(f"{src}: layer {i} has fused experts without down_proj")
        _fused_layout(st.entries[down], n_e, h, inter, down)
        if "gate_up_proj" in fz:
            gu = fz["gate_up_proj"]
            if "gate_proj" in fz or "up_proj" in fz:
                raise ConvertError(
                    f"{src}: layer {i} has gate_up_proj and separate gate/up experts"
                )
            _fused_layout(st.entries[gu], n_e, 2 * inter, h, gu)
            g_name, g_row0, u_name, u_row0 = gu, 0, gu, inter
        elif "gate_proj" in fz and "up_proj" in fz:
            g_name, g_row0, u_name, u_row0 = fz["gate_proj"], 0, fz["up_proj"], 0
            _fused_layout(st.entries[g_name], n_e, inter, h, g_name)
            _fused_layout(st.entries[u_name], n_e, inter, h, u_name)
        else:
            raise ConvertError(
                f"{src}: layer {i} fused experts lack gate_up_proj (or gate_proj + up_proj)"
            )

        def expert(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
            return (
                b.expert_part(g_name, e, n_e, gshape, g_row0, "gate", i),
                b.expert_part(u_name, e, n_e, gshape, u_row0, "up", i),
                b.expert_part(down, e, n_e, dshape, 0, "down", i),
            )

        nbytes = sum(st.entries[n].nbytes for n in set(fz.values()))
        return ExpertLayerSrc(i, n_e, shapes, expert, nbytes)
    raise ConvertError(f"{src}: layer {i} is a MoE layer by the config but has no expert tensors")
