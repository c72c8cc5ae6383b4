"""Tensor encodings of the warp container: quantize, dequantize, float conversion.

Owns the mapping between dtype names (``q4_0``, ``q4_1``, ``q8_0``, ``mxfp4``, ``f16``,
``bf16``, ``f32``) and GGUF ``ggml_type`` ids, the byte size of a tensor of a given dtype
and shape, and the conversion of float32 arrays to and from those encodings. Q4_0, Q4_1
and Q8_0 go through the ``gguf`` package's reference quantizers, so the bytes are
identical to GGUF's; MXFP4 has its own (gguf-py's rule with an exact ``floor(log2)``).
Also owns the repacking of MXFP4 as checkpoints ship it (packed nibbles + E8M0 scales)
into the container's blocks, code for code (:func:`mxfp4_pack`, :func:`mxfp4_unpack`).
Work is done in row chunks so a large tensor never needs more than a bounded amount of
scratch memory.

Defines ``ConvertError``. Refuses: quantizing rows whose length is not a multiple of 32
(callers fall back to a float type), any dtype name outside the table, and an MXFP4
scale byte 255 (NaN). Called by the HF and GGUF importers.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as _gq

__all__ = [
    "BLOCK_DTYPES",
    "ConvertError",
    "DTYPE_IDS",
    "FLOAT_DTYPES",
    "QUANT_DTYPES",
    "QK",
    "bf16_to_f32",
    "can_quantize",
    "check_blocks",
    "check_e8m0",
    "decode",
    "encode",
    "f32_to_bf16",
    "mxfp4_pack",
    "mxfp4_unpack",
    "row_bytes",
    "tensor_bytes",
]


class ConvertError(ValueError):
    """A conversion failed; the message names the file, tensor or key at fault.

    Defined here, in the lowest module of the package, so every converter module can
    raise it without import cycles; ``warp_providers.convert`` re-exports it.
    """


#: dtype name -> GGUF ``ggml_type`` id (FORMAT.md section 1).
DTYPE_IDS: Final[dict[str, int]] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 8,
    "bf16": 30,
    "mxfp4": 39,
}
#: dtype name -> (elements per block, bytes per block).
_BLOCK: Final[dict[str, tuple[int, int]]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q8_0": (32, 34),
    "bf16": (1, 2),
    "mxfp4": (32, 17),
}
#: Block types the converter re-encodes between freely (a GGUF source in one of them is
#: copied when another is requested). mxfp4 is a block type too, but copied only when
#: asked for by name (or kept as shipped): ``--experts q4_0`` re-quantizes it.
QUANT_DTYPES: Final[frozenset[str]] = frozenset({"q4_0", "q4_1", "q8_0"})
BLOCK_DTYPES: Final[frozenset[str]] = QUANT_DTYPES | {"mxfp4"}
FLOAT_DTYPES: Final[frozenset[str]] = frozenset({"f32", "f16", "bf16"})
#: Elements per quantization block.
QK: Final[int] = 32

_GGML: Final[dict[str, GGMLQuantizationType]] = {
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "q8_0": GGMLQuantizationType.Q8_0,
}
# Elements converted per chunk: bounds scratch memory to a few hundred MiB
# whatever the tensor size.
_CHUNK_ELEMS: Final[int] = 1 << 23


def _check_dtype(dtype: str) -> None:
    if dtype not in _BLOCK:
        raise ConvertError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(_BLOCK))}")


def can_quantize(cols: int) -> bool:
    """Whether a row of ``cols`` elements can be stored in a 32-element block type."""
    return cols > 0 and cols % QK == 0


def row_bytes(dtype: str, cols: int) -> int:
    """Bytes of one row of ``cols`` elements in ``dtype``.

    Raises:
        ConvertError: unknown dtype, or a block type and ``cols % 32 != 0``.

    """
    _check_dtype(dtype)
    block, size = _BLOCK[dtype]
    if cols % block:
        raise ConvertError(f"{dtype} needs a row length that is a multiple of {block}, got {cols}")
    return cols // block * size


def tensor_bytes(dtype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor of ``shape`` (last dimension = row length) in ``dtype``."""
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    return rows * row_bytes(dtype, int(shape[-1]))


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even; NaN stays a quiet NaN), as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (
        u.astype(np.uint64) + (np.uint64(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    ) >> np.uint64(16)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 (uint16 view) to float32, exactly."""
    return (np.ascontiguousarray(u16).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(
        np.float32
    )


#: Twice the value of each E2M1 code: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the negatives.
_MXFP4_X2: Final[np.ndarray] = np.array(
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32
)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """``2 ** (e - 128)`` as float32, exactly (e = 0, 1 are subnormals)."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _mxfp4_quantize(rows: np.ndarray) -> np.ndarray:
    """MXFP4 blocks of float32 rows: e = floor(log2(amax)) - 2 + 127 (0 when amax is 0),
    clamped to 0..254, and each weight the code nearest to it, the first on a tie."""
    blocks = rows.reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1)
    _, k = np.frexp(amax)  # amax = m * 2**k, m in [0.5, 1): floor(log2 amax) = k - 1
    e = np.where(amax > 0, np.clip(k.astype(np.int64) + 124, 0, 254), 0).astype(np.uint8)
    vals = _e8m0_half(e)[:, None, None] * _MXFP4_X2[None, None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        err = np.abs(vals - blocks[:, :, None])
    codes = np.argmin(err, axis=2).astype(np.uint8)
    out = np.empty((blocks.shape[0], 17), dtype=np.uint8)
    out[:, 0] = e
    out[:, 1:] = codes[:, :16] | (codes[:, 16:] << np.uint8(4))
    return out.reshape(-1)


def _mxfp4_dequantize(buf: np.ndarray) -> np.ndarray:
    b = buf.reshape(-1, 17)
    codes = np.concatenate([b[:, 1:] & np.uint8(15), b[:, 1:] >> np.uint8(4)], axis=1)
    with np.errstate(over="ignore"):
        return (_MXFP4_X2[codes] * _e8m0_half(b[:, 0])[:, None]).astype(np.float32)


def check_blocks(raw: np.ndarray, dtype: str, name: str) -> None:
    """Refuse container ``mxfp4`` bytes with a scale byte 255 (NaN in E8M0), naming ``name``.

    Raises:
        ConvertError: a block's scale byte is 255.

    """
    if dtype != "mxfp4":
        return
    scales = np.asarray(raw).reshape(-1).view(np.uint8)[::17]
    bad = np.flatnonzero(scales == 255)
    if bad.size:
        raise ConvertError(
            f"tensor {name!r}: MXFP4 scale byte 255 (NaN) in block {int(bad[0])} "
            f"({bad.size} such blocks)"
        )


def check_e8m0(scales: np.ndarray, name: str) -> None:
    """Refuse E8M0 scales ``[rows, blocks]`` holding 255 (NaN), naming ``name``.

    Raises:
        ConvertError: naming the tensor, the first such row and block, and their count.

    """
    s = np.asarray(scales, dtype=np.uint8)
    bad = np.argwhere(s.reshape(-1, s.shape[-1]) == 255)
    if bad.size:
        r, g = (int(v) for v in bad[0])
        raise ConvertError(f"tensor {name!r}: MXFP4 scale byte 255 (NaN) at row {r}, "
                           f"block {g} ({len(bad)} such blocks)")


@cache
def _engine_interleave() -> Any:
    """The engine's C repacking of MXFP4 (``_engine.mxfp4_interleave``), or None when the
    extension is not built."""
    try:
        from warp_providers import _engine
    except ImportError:
        return None
    return getattr(_engine, "mxfp4_interleave", None)


def mxfp4_pack(packed: np.ndarray, scales: np.ndarray, name: str,
               fast: bool | None = None) -> np.ndarray:
    """Container ``mxfp4`` bytes of a matrix shipped as MXFP4, every code and scale kept.

    ``packed`` is U8 ``[rows, cols / 2]`` (or ``[rows, cols / 32, 16]``): byte k holds
    element 2k in its low nibble and 2k + 1 in its high nibble; ``scales`` is U8 E8M0
    ``[rows, cols / 32]``, one per 32 elements. Both layouts in the wild (gpt-oss's
    ``*_blocks``/``*_scales``, compressed-tensors' ``weight_packed``/``weight_scale``)
    are this one. ``name`` names the tensor in errors. ``fast`` (default: when the engine
    extension is importable) repacks in the engine's C (disk speed); otherwise numpy
    (about 150 MB/s); both give the same bytes.

    Raises:
        ConvertError: shapes that do not match, or a scale byte 255 (NaN).

    """
    s = np.asarray(scales, dtype=np.uint8)
    if s.ndim != 2:
        raise ConvertError(f"tensor {name!r}: MXFP4 scales must be 2-D, got {list(s.shape)}")
    rows, groups = s.shape
    p = np.asarray(packed, dtype=np.uint8)
    if p.size != rows * groups * 16 or p.shape[0] != rows:
        raise ConvertError(f"tensor {name!r}: MXFP4 codes {list(p.shape)} do not match scales "
                           f"{list(s.shape)} (16 bytes per scale)")
    if fast is None or fast:
        fn = _engine_interleave()
        if fn is not None:
            out = np.empty(rows * groups * 17, dtype=np.uint8)
            if fn(np.ascontiguousarray(p).reshape(-1), np.ascontiguousarray(s).reshape(-1), out):
                check_e8m0(s, name)  # names the first NaN block
            return out
    check_e8m0(s, name)
    p = p.reshape(rows, groups, 16)
    lo, hi = p & np.uint8(15), p >> np.uint8(4)
    codes = np.empty((rows, groups, 32), dtype=np.uint8)
    codes[..., 0::2], codes[..., 1::2] = lo, hi  # element order
    out = np.empty((rows, groups, 17), dtype=np.uint8)
    out[..., 0] = s
    out[..., 1:] = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    return out.reshape(-1)


def mxfp4_unpack(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`mxfp4_pack`: ``(packed [rows, cols / 2], scales [rows, cols / 32])``."""
    b = np.asarray(raw).reshape(-1).view(np.uint8).reshape(rows, cols // QK, 17)
    codes = np.concatenate([b[..., 1:] & np.uint8(15), b[..., 1:] >> np.uint8(4)], axis=2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))
    return packed.reshape(rows, cols // 2), np.ascontiguousarray(b[..., 0])


def _encode_rows(rows: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f32":
        return rows.astype("<f4", copy=False).view(np.uint8)
    if dtype == "f16":
        with np.errstate(over="ignore"):
            return rows.astype("<f2").view(np.uint8)
    if dtype == "bf16":
        return f32_to_bf16(rows).astype("<u2", copy=False).view(np.uint8)
    if dtype == "mxfp4":
        return _mxfp4_quantize(rows)
    return np.asarray(_gq.quantize(rows, _GGML[dtype]), dtype=np.uint8)


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """Encode a float array (any float dtype) as ``dtype``; returns the bytes as uint8.

    The last dimension is the row. Quantized dtypes need ``shape[-1] % 32 == 0``.

    Raises:
        ConvertError: unknown dtype or a row length the dtype cannot hold.

    """
    _check_dtype(dtype)
    x = np.asarray(x)
    cols = int(x.shape[-1]) if x.ndim else 1
    rb = row_bytes(dtype, cols)
    rows = x.reshape(-1, cols)
    n = rows.shape[0]
    out = np.empty(n * rb, dtype=np.uint8)
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        chunk = rows[r0:r1].astype(np.float32, copy=False)
        out[r0 * rb : r1 * rb] = _encode_rows(np.ascontiguousarray(chunk), dtype).reshape(-1)
    return out


def decode(
    raw: np.ndarray | bytes | memoryview, dtype: str, shape: tuple[int, ...] | list[int]
) -> np.ndarray:
    """Decode ``dtype`` bytes of a tensor of ``shape`` to float32.

    Raises:
        ConvertError: unknown dtype or a byte count that does not match the shape.

    """
    _check_dtype(dtype)
    shape = tuple(int(d) for d in shape)
    need = tensor_bytes(dtype, shape)
    buf = (
        np.frombuffer(raw, dtype=np.uint8)
        if not isinstance(raw, np.ndarray)
        else raw.view(np.uint8).reshape(-1)
    )
    if buf.size != need:
        raise ConvertError(
            f"{dtype} tensor of shape {list(shape)} needs {need} bytes, got {buf.size}"
        )
    if dtype == "f32":
        return buf.view("<f4").astype(np.float32).reshape(shape)
    if dtype == "f16":
        return buf.view("<f2").astype(np.float32).reshape(shape)
    if dtype == "bf16":
        return bf16_to_f32(buf.view("<u2")).reshape(shape)
    if dtype == "mxfp4":
        return _mxfp4_dequantize(buf).reshape(shape)
    rb = row_bytes(dtype, shape[-1])
    deq = _gq.dequantize(buf.reshape(-1, rb), _GGML[dtype])
    return np.asarray(deq, dtype=np.float32).reshape(shape)
