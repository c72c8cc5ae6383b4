"""What every Hugging Face architecture module builds on.

Owns: the safetensors reader (sharded or single-file; headers parsed here, tensors
memory-mapped, so bf16 and fp8 need no framework) and DeepSeek-style fp8 e4m3 weights
with ``weight_scale_inv`` block scales (block size from
``quantization_config.weight_block_size``, never from shapes); :class:`TensorSource`, the
one way an architecture takes a stored tensor (shape and dtype checks, fp8 scales, the
bookkeeping of what was used); the typed config getters (``get_int``, ``get_number``,
``get_flag``, ``get_ids``, ``expert_count``), each raising a ``ConvertError`` naming the
key; the rope tables of every supported rope type; the routed experts of a layer from
per-expert or fused tensors; and :func:`finish_plan`, which ends every loader (checks
every expert, refuses unused tensors, adds the tokenizer side files).

Called by ``hf.py`` and ``arch/<model_type>.py``; imports no architecture.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from .hf_files import load_json, tokenizer_files
from .plan import ExpertLayerSrc, Plan, SrcTensor, expert_shapes
from .quant import ConvertError, bf16_to_f32

__all__ = [
    "EXPERT_COUNT_KEYS",
    "EXPERT_PART",
    "EXPERT_RE",
    "FP4_E2M1",
    "FUSED_RE",
    "ROPE_TYPES",
    "Rows",
    "SafetensorsDir",
    "StEntry",
    "TensorSource",
    "collect_experts",
    "computed",
    "expert_count",
    "expert_layer",
    "finish_plan",
    "fp8_e4m3_to_f32",
    "get_flag",
    "get_ids",
    "get_int",
    "get_number",
    "get_optional_number",
    "load_json",
    "rope_from_config",
    "rope_inv_freq",
    "rope_param",
    "to_f32",
    "top_tensors",
    "yarn_mscale",
]

# --------------------------------------------------------------------------- config


def get_int(
    cfg: Mapping[str, Any],
    key: str,
    *,
    default: int | None = None,
    minimum: int = 0,
    where: str = "config.json",
) -> int:
    """Return an integer key (an integral float is accepted); null or absent gives ``default``.

    Raises:
        ConvertError: absent without a default, not an integer, or below ``minimum``.

    """
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ConvertError(f"{where}: missing required key {key!r}")
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
        what = {0: "a non-negative", 1: "a positive"}.get(minimum, f"an (>= {minimum})")
        raise ConvertError(f"{where}: {key!r} must be {what} integer, got {v!r}")
    return int(v)


def get_number(
    cfg: Mapping[str, Any],
    key: str,
    *,
    default: float | None = None,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    where: str = "config.json",
) -> float:
    """Return a number key; null or absent gives ``default`` (absent without one is refused).

    ``above`` is an exclusive lower bound, ``at_least``/``at_most`` inclusive ones.

    Raises:
        ConvertError: not a number, or outside the bounds, naming the key.

    """
    v = cfg.get(key)
    if v is None:
        v = default
    ok = not isinstance(v, bool) and isinstance(v, (int, float))
    if ok and above is not None:
        ok = v > above
    if ok and at_least is not None:
        ok = v >= at_least
    if ok and at_most is not None:
        ok = v <= at_most
    if not ok:
        what = ("a positive number" if above == 0 and at_least is None and at_most is None
                else "a number" + "".join(f" {op} {b}" for op, b in (
                    (">", above), (">=", at_least), ("<=", at_most)) if b is not None))
        raise ConvertError(f"{where}: {key} must be {what}, got {v!r}")
    return float(v)  # type: ignore[arg-type]


def get_optional_number(cfg: Mapping[str, Any], key: str, **bounds: float) -> float | None:
    """:func:`get_number` for a key whose null (or absence) means "off": returns None then."""
    return None if cfg.get(key) is None else get_number(cfg, key, **bounds)


def get_flag(cfg: Mapping[str, Any], key: str, default: bool, where: str = "config.json") -> bool:
    """Return a boolean key; null or absent gives ``default``.

    Raises:
        ConvertError: a value that is not true or false.

    """
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConvertError(f"{where}: {key!r} must be true or false, got {v!r}")
    return v


def get_ids(v: Any, key: str, where: str) -> list[int]:
    """Return a token id or a list of them (``eos_token_id`` style); None gives []."""
    if v is None:
        return []
    vals = v if isinstance(v, list) else [v]
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ConvertError(f"{where}: {key!r} must be a token id or a list of them, got {v!r}")
        out.append(int(x))
    return out


EXPERT_COUNT_KEYS: Final[tuple[str, ...]] = ("num_experts", "num_local_experts", "n_routed_experts")


def expert_count(cfg: Mapping[str, Any], *, allow_none: bool = False) -> int:
    """Return the routed-expert count, whichever family spelling wrote it.

    ``allow_none``: 0 is valid (every layer is then dense).
    """
    found = {k: get_int(cfg, k) for k in EXPERT_COUNT_KEYS if cfg.get(k) is not None}
    if not found:
        raise ConvertError(
            f"config.json: missing the expert count ({' or '.join(EXPERT_COUNT_KEYS)})"
        )
    if len(set(found.values())) > 1:
        raise ConvertError(f"config.json: expert counts disagree: {found}")
    n = next(iter(found.values()))
    if n == 0 and not allow_none:
        raise ConvertError("config.json: a MoE model needs an expert count > 0")
    return n


# --------------------------------------------------------------------------- rope

ROPE_TYPES: Final[tuple[str, ...]] = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_param(params: Mapping[str, Any], key: str, rope_type: str) -> float:
    """Return a required float parameter of a rope variant."""
    v = params.get(key)
    if v is None:
        raise ConvertError(f"rope type {rope_type!r} needs rope parameter {key!r}")
    return float(v)


def _base(theta: float, dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention scaling of a context stretched by ``scale``."""
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
        inv = _base(theta, dim) / rope_param(params, "factor", rope_type)
    elif rope_type == "dynamic":
        # NTK-aware base stretch at sequence length = max_position_embeddings; at that
        # length the stretch is exactly 1, so the stored table equals the default one.
        factor = rope_param(params, "factor", rope_type)
        seq = float(max_position_embeddings)
        stretched = theta * ((factor * seq / max_position_embeddings) - (factor - 1)) ** (
            dim / (dim - 2)
        )
        inv = _base(stretched, dim)
    elif rope_type == "llama3":
        factor = rope_param(params, "factor", rope_type)
        low = rope_param(params, "low_freq_factor", rope_type)
        high = rope_param(params, "high_freq_factor", rope_type)
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
            attn = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all))
        else:
            attn = yarn_mscale(factor)
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

#: FP4 e2m1 code -> value (sign in bit 3), for the MXFP4 and packed-FP4 sources.
FP4_E2M1: Final[np.ndarray] = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)

_ST_DTYPES: Final[dict[str, tuple[str, int]]] = {
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "F16": ("<f2", 2),
    "BF16": ("<u2", 2),
    "F8_E4M3": ("u1", 1),
    "U8": ("u1", 1),  # packed MXFP4 blocks/scales (gpt_oss); never a float weight
    "I64": ("<i8", 8),  # index tables (deepseek_v4 tid2eid); never a float weight
    "I32": ("<i4", 4),
    "I8": ("i1", 1),  # packed FP4 e2m1 pairs (deepseek_v4 experts)
    "F8_E8M0": ("u1", 1),  # power-of-two block scales 2^(b - 127) (deepseek_v4)
}
_MAX_HEADER: Final[int] = 100 << 20
_OPEN_SHARDS: Final[int] = 8  # shard files SafetensorsDir.read keeps open at most


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


@dataclass(frozen=True, slots=True)
class StEntry:
    """Where one stored tensor lives: file, safetensors dtype, shape, byte range."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in file
    nbytes: int


def read_st_header(path: Path) -> dict[str, StEntry]:
    """Parse and check the header of one safetensors file."""
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
    out: dict[str, StEntry] = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        try:
            dtype = sys.intern(str(info["dtype"]))  # one string, not one per tensor
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
        out[name] = StEntry(path, dtype, shape, data0 + begin, end - begin)
    return out


class SafetensorsDir:
    """All tensors of a checkpoint directory, memory-mapped on first use."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = model_dir
        self._files: dict[Path, Any] = {}
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
        self.entries: dict[str, StEntry] = {}
        for fn in files:
            p = model_dir / fn
            if "/" in fn or not p.is_file():
                raise ConvertError(f"{index if wm else model_dir}: shard {fn!r} is missing")
            for name, ent in read_st_header(p).items():
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

    def read(self, name: str) -> np.ndarray:
        """Return the bytes of the tensor as stored, read into a new uint8 array (one read
        call on a shard file kept open): what is copied whole goes at the disk's speed,
        without a mapping set up per tensor, and stays resident only while it is held."""
        ent = self.entries[name]
        buf = np.empty(ent.nbytes, dtype=np.uint8)
        f = self._files.get(ent.file)
        if f is None:
            if len(self._files) >= _OPEN_SHARDS:
                self._files.pop(next(iter(self._files))).close()
            f = self._files[ent.file] = open(ent.file, "rb", buffering=0)  # noqa: SIM115
        try:
            f.seek(ent.begin)
            got = f.readinto(buf)
        except OSError as e:
            raise ConvertError(f"{ent.file}: cannot read tensor {name!r} ({e.strerror})") from e
        if got != ent.nbytes:
            raise ConvertError(f"{ent.file}: tensor {name!r} cut short ({got} of {ent.nbytes} "
                               "bytes)")
        return buf

    def close(self) -> None:
        """Close the shard files :meth:`read` keeps open (reopened when read again)."""
        while self._files:
            self._files.popitem()[1].close()

    def __del__(self) -> None:
        self.close()

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


def to_f32(a: np.ndarray, st_dtype: str) -> np.ndarray:
    """Float32 of a stored tensor (bf16 and fp8 decoded exactly)."""
    if st_dtype == "BF16":
        return bf16_to_f32(a)
    if st_dtype == "F8_E4M3":
        return fp8_e4m3_to_f32(a)
    if st_dtype == "U8":
        raise ConvertError("a U8 tensor is not a float weight (only MXFP4 blocks are U8)")
    return np.asarray(a, dtype=np.float32)


class Rows:
    """Float rows of a 2-D view of a stored tensor, dequantizing fp8 block scales.

    ``arr`` is the view, or a function mapping it anew at each call (so what was read is
    not kept resident by the plan once converted)."""

    def __init__(
        self,
        arr: np.ndarray | Callable[[], np.ndarray],
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
        """Return rows ``r0..r1`` as float32."""
        a0, a1 = self.row0 + r0, self.row0 + r1
        arr = self.arr() if callable(self.arr) else self.arr
        x = to_f32(arr[a0:a1], self.st_dtype)
        if self.scale is not None and self.block is not None:
            b0, b1 = self.block
            s = to_f32(self.scale[np.arange(a0, a1) // b0], self.scale_dtype)
            x = x * np.repeat(s, b1, axis=1)[:, : x.shape[1]]
        return np.asarray(x, dtype=np.float32)


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


def _raw_loader(arr: np.ndarray) -> Any:
    return lambda: np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


class TensorSource:
    """The stored tensors of a checkpoint as an architecture takes them.

    Every lookup checks shape and dtype and records the name in ``used`` (fp8 scales it
    consumes in ``used_scales``), so :func:`finish_plan` can refuse what nothing took.
    ``alias`` maps the names an architecture asks for to the stored ones (a checkpoint
    with its own spelling); without it the stored names are the ones asked for.
    """

    def __init__(
        self, st: SafetensorsDir, cfg: Mapping[str, Any], alias: Mapping[str, str] | None = None
    ) -> None:
        self.st = st
        self.cfg = cfg
        self.alias = alias
        self.used: set[str] = set()
        self.used_scales: set[str] = set()
        self._block: tuple[int, int] | None = None

    @property
    def dir(self) -> Path:
        """The checkpoint directory (named in error messages)."""
        return self.st.dir

    def stored(self, name: str) -> str:
        """Return the stored name of ``name``."""
        return name if self.alias is None else self.alias.get(name, name)

    def spellings(self) -> Iterable[tuple[str, str]]:
        """(name as asked for, stored name) of every tensor."""
        return self.alias.items() if self.alias is not None else ((n, n) for n in self.st.entries)

    def has(self, name: str) -> bool:
        """Whether the checkpoint stores ``name``."""
        return self.stored(name) in self.st.entries

    def first(self, pre: str, names: Iterable[str]) -> str | None:
        """``pre + n`` for the first of ``names`` that is stored, or None."""
        for n in names:
            if self.has(pre + n):
                return pre + n
        return None

    def entry(self, name: str) -> StEntry:
        """Return the header entry of ``name``, marked used."""
        stored = self.stored(name)
        if stored not in self.st.entries:
            raise ConvertError(f"tensor {stored!r} is missing")
        self.used.add(stored)
        return self.st.entries[stored]

    def raw(self, name: str) -> np.ndarray:
        """Return the tensor as stored (memory-mapped)."""
        return self.st.raw(self.stored(name))

    def f32(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Return the whole tensor as float32, which must have ``shape``."""
        ent = self.entry(name)
        if tuple(ent.shape) != shape:
            raise ConvertError(
                f"tensor {self.stored(name)!r}: shape {list(ent.shape)}, config implies "
                f"{list(shape)}"
            )
        if ent.dtype == "U8":
            raise ConvertError(f"tensor {self.stored(name)!r}: u8 is not a float type")
        return to_f32(self.raw(name), ent.dtype)

    def u8(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Return a packed U8 tensor (MXFP4 blocks or scales) of ``shape``."""
        self.u8_entry(name, shape)
        return self.raw(name)

    def u8_entry(self, name: str, shape: tuple[int, ...]) -> StEntry:
        """Check a packed U8 tensor of ``shape`` and mark it used, without mapping it (its
        bytes come later, from :meth:`SafetensorsDir.read` or ``raw``)."""
        ent = self.entry(name)
        if tuple(ent.shape) != shape or ent.dtype != "U8":
            raise ConvertError(
                f"tensor {self.stored(name)!r}: {ent.dtype} {list(ent.shape)}, expected U8 "
                f"{list(shape)}"
            )
        return ent

    def block(self) -> tuple[int, int]:
        """Return the fp8 block size of the checkpoint."""
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
        """Return stored ``name`` as container tensor ``cname`` (role ``kind``, shape ``want``)."""
        ent = self.entry(name)
        name = self.stored(name)
        if ent.shape != want:
            raise ConvertError(
                f"tensor {name!r}: shape {list(ent.shape)}, config implies {list(want)}"
            )
        arr = self.st.raw(name)
        cols = want[-1]
        arr2: np.ndarray | Callable[[], np.ndarray] = arr.reshape(-1, cols)
        raw = None
        raw_dtype = None
        st = self.st
        lazy = isinstance(arr, np.memmap)  # mapped again when read: the plan keeps no pages
        if lazy:
            arr2 = lambda: st.raw(name).reshape(-1, cols)  # noqa: E731
        if ent.dtype == "F8_E4M3":
            if len(want) != 2:
                raise ConvertError(f"tensor {name!r}: fp8 is supported for matrices only")
            scale, sdt = self._scale(name, want[0], cols)
            rows = Rows(arr2, ent.dtype, scale=scale, scale_dtype=sdt, block=self.block())
        else:
            rows = Rows(arr2, ent.dtype)
            raw_dtype = {"F32": "f32", "F16": "f16", "BF16": "bf16"}.get(ent.dtype)
            if raw_dtype is not None:
                raw = (lambda: _raw_loader(st.raw(name))()) if lazy else _raw_loader(arr)
            encoded = getattr(arr, "encoded_as", None)  # a generated tensor in container bytes
            if encoded is not None:
                raw_dtype, raw = encoded, arr.raw_bytes
        return SrcTensor(cname, want, kind, rows, ent.nbytes, raw=raw, raw_dtype=raw_dtype)

    def expert_part(
        self, name: str, e: int, n_experts: int, want: tuple[int, int], row0: int, cname: str
    ) -> SrcTensor:
        """Part of expert ``e`` of a fused 3-D tensor: rows row0..row0+want[0] of slice e."""
        ent = self.entry(name)
        name = self.stored(name)
        a = self.st.raw(name)[e]
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
        rows = Rows(a, ent.dtype, scale=scale, scale_dtype=sdt, block=block, row0=row0)
        nbytes = ent.nbytes // max(n_experts, 1) * want[0] // max(a.shape[0], 1)
        return SrcTensor(cname, want, "experts", rows, nbytes)


def computed(
    cname: str,
    arr_fn: Callable[[], np.ndarray],
    shape: tuple[int, ...],
    kind: str = "f32",
    nbytes: int = 0,
) -> SrcTensor:
    """Return a tensor computed on first use by ``arr_fn()`` (rows of its 2-D view)."""
    memo: dict[str, np.ndarray] = {}

    def rows(r0: int, r1: int) -> np.ndarray:
        if "a" not in memo:
            a = np.asarray(arr_fn(), dtype=np.float32)
            memo["a"] = a.reshape(-1, shape[-1])
        return memo["a"][r0:r1]

    return SrcTensor(cname, shape, kind, rows, nbytes)


def top_tensors(s: TensorSource, hp: Mapping[str, Any], prefix: str = "model.") -> list[SrcTensor]:
    """``token_embd``, ``output_norm`` and (unless tied) ``output`` from their HF names."""
    v, h = hp["vocab_size"], hp["hidden_size"]
    out = [
        s.tensor(prefix + "embed_tokens.weight", "token_embd.weight", "embedding", (v, h)),
        s.tensor(prefix + "norm.weight", "output_norm.weight", "f32", (h,)),
    ]
    if not hp["tie_word_embeddings"]:
        out.append(s.tensor("lm_head.weight", "output.weight", "output", (v, h)))
    return out


# --------------------------------------------------------------------------- experts

EXPERT_RE: Final[re.Pattern[str]] = re.compile(
    r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight"
)
FUSED_RE: Final[re.Pattern[str]] = re.compile(
    r"(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?"
)
EXPERT_PART: Final[dict[str, str]] = {
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
    "w1": "gate",
    "w3": "up",
    "w2": "down",
}


def _fused_layout(ent: StEntry, n_experts: int, rows: int, cols: int, name: str) -> None:
    if ent.shape == (n_experts, rows, cols) or ent.shape == (n_experts, cols, rows):
        return
    raise ConvertError(
        f"tensor {name!r}: shape {list(ent.shape)}, config implies {[n_experts, rows, cols]}"
    )


def expert_layer(
    s: TensorSource,
    hp: Mapping[str, Any],
    i: int,
    per: Mapping[int, Mapping[str, str]] | None,
    fz: Mapping[str, str] | None,
) -> ExpertLayerSrc:
    """Return the routed experts of layer ``i``: ``per[e][part]`` or fused ``fz[kind]`` names.

    Raises:
        ConvertError: both forms, neither, a missing projection or a misshapen tensor.

    """
    src = s.dir
    n_e = hp["n_experts"]
    shapes = expert_shapes(hp)
    gshape, _, dshape = shapes
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
                s.tensor(p["gate"], f"blk.{i}.expert.{e}.gate", "experts", gshape),
                s.tensor(p["up"], f"blk.{i}.expert.{e}.up", "experts", gshape),
                s.tensor(p["down"], f"blk.{i}.expert.{e}.down", "experts", dshape),
            )

        nbytes = sum(s.st.entries[n].nbytes for d in per.values() for n in d.values())
        return ExpertLayerSrc(i, n_e, shapes, expert, nbytes)
    if fz:
        st = s.st
        h, inter = hp["hidden_size"], hp["moe_intermediate_size"]
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

        def expert_f(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
            pre = f"blk.{i}.expert.{e}."
            return (
                s.expert_part(g_name, e, n_e, gshape, g_row0, pre + "gate"),
                s.expert_part(u_name, e, n_e, gshape, u_row0, pre + "up"),
                s.expert_part(down, e, n_e, dshape, 0, pre + "down"),
            )

        nbytes = sum(st.entries[n].nbytes for n in set(fz.values()))
        return ExpertLayerSrc(i, n_e, shapes, expert_f, nbytes)
    raise ConvertError(f"{src}: layer {i} is a MoE layer by the config but has no expert tensors")


def collect_experts(s: TensorSource, hp: Mapping[str, Any], i: int, pre: str) -> ExpertLayerSrc:
    """Return the routed experts of layer ``i``: per-expert or fused tensors under ``pre``."""
    per: dict[int, dict[str, str]] = {}
    fused: dict[str, str] = {}
    for spelled, name in s.spellings():
        if not spelled.startswith(pre):
            continue
        rest = spelled[len(pre):]
        if (em := EXPERT_RE.fullmatch(rest)) is not None:
            per.setdefault(int(em.group(1)), {})[EXPERT_PART[em.group(2)]] = name
            s.used.add(name)
        elif (fm := FUSED_RE.fullmatch(rest)) is not None:
            fused[fm.group(1)] = name
            s.used.add(name)
    return expert_layer(s, hp, i, per or None, fused or None)


# --------------------------------------------------------------------------- finish


def finish_plan(
    s: TensorSource,
    model_type: str,
    cfg: dict[str, Any],
    hp: dict[str, Any],
    trunk: list[SrcTensor],
    experts: list[ExpertLayerSrc],
    *,
    skipped: Callable[[str], bool] | None = None,
) -> Plan:
    """End a loader: the :class:`Plan`, once every check has passed.

    Builds each expert once (so shape and fp8-scale errors come before anything is
    written), refuses stored tensors that nothing used (``skipped`` names the ones an
    architecture leaves out on purpose) and adds the tokenizer side files.

    Raises:
        ConvertError: an unused tensor or fp8 scale, a bad expert, no tokenizer.

    """
    for layer in experts:
        for e in range(layer.n_experts):
            layer.expert(e)
    taken = s.used | s.used_scales
    unused = sorted(
        n for n in s.st.entries if n not in taken and not (skipped is not None and skipped(n))
    )
    weights = [n for n in unused if not n.endswith("_scale_inv")]
    if weights:
        more = f" and {len(weights) - 5} more" if len(weights) > 5 else ""
        raise ConvertError(
            f"{s.dir}: tensors not used by {model_type}: {', '.join(weights[:5])}{more}"
        )
    if unused:
        raise ConvertError(f"{s.dir}: scale tensor {unused[0]!r} belongs to no fp8 weight")
    files, tokenizer, chat = tokenizer_files(s.dir)
    return Plan(model_type, cfg, hp, trunk, experts, files, tokenizer, chat, source="hf")
