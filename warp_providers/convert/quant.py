"""Tensor encodings of the warp container: quantize, dequantize, float conversion.

Owns the mapping between dtype names (``q4_0``, ``q4_1``, ``q8_0``, ``f16``, ``bf16``,
``f32``) and GGUF ``ggml_type`` ids, the byte size of a tensor of a given dtype and
shape, and the conversion of float32 arrays to and from those encodings. Q4_0, Q4_1
and Q8_0 go through the ``gguf`` package's reference quantizers, so the bytes are
identical to GGUF's. Work is done in row chunks so a large tensor never needs more
than a bounded amount of scratch memory.

Defines ``ConvertError``. Refuses: quantizing rows whose length is not a multiple of 32
(callers fall back to a float type), and any dtype name outside the table. Called by the
HF and GGUF importers.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as _gq

__all__ = [
    "ConvertError",
    "DTYPE_IDS",
    "FLOAT_DTYPES",
    "QUANT_DTYPES",
    "QK",
    "bf16_to_f32",
    "can_quantize",
    "decode",
    "encode",
    "f32_to_bf16",
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
}
#: dtype name -> (elements per block, bytes per block).
_BLOCK: Final[dict[str, tuple[int, int]]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q8_0": (32, 34),
    "bf16": (1, 2),
}
QUANT_DTYPES: Final[frozenset[str]] = frozenset({"q4_0", "q4_1", "q8_0"})
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


def _encode_rows(rows: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f32":
        return rows.astype("<f4", copy=False).view(np.uint8)
    if dtype == "f16":
        with np.errstate(over="ignore"):
            return rows.astype("<f2").view(np.uint8)
    if dtype == "bf16":
        return f32_to_bf16(rows).astype("<u2", copy=False).view(np.uint8)
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
    rb = row_bytes(dtype, shape[-1])
    deq = _gq.dequantize(buf.reshape(-1, rb), _GGML[dtype])
    return np.asarray(deq, dtype=np.float32).reshape(shape)
