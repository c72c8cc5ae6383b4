"""Routing traces for benchmarks: a trained model's expert choices replayed by the engine.

A trace in JSONL has one object per token, ``{"tok": i, "layers": [[ids of MoE layer 0],
...]}`` (the format of the recorded traces). The engine reads a compact binary form
(``WPRT``, engine/src/route_trace.h) that `binary_trace` writes to a temporary file for
`Engine.open(..., route_trace=...)`. A JSONL trace does not state how many experts its
model had: it is taken as the smallest power of two above the largest id unless given.
Refuses: a malformed line, rows of unequal shape, negative or too large ids (ValueError).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["MAGIC", "binary_trace", "experts_of", "read_jsonl", "write_binary"]

MAGIC = b"WPRT"
_HEADER = struct.Struct("<4sIIIII")


def read_jsonl(path: str | os.PathLike[str]) -> np.ndarray:
    """The ids of a JSONL trace as uint16 [tokens, moe_layers, top_k], in file order."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                layers = json.loads(line)["layers"]
                rows.append(np.asarray(layers, dtype=np.int64))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a trace row ({e})") from None
            if rows[-1].ndim != 2 or rows[-1].shape != rows[0].shape or rows[-1].size == 0:
                raise ValueError(
                    f"{path}:{n}: layers of shape {rows[-1].shape}, expected {rows[0].shape}"
                )
    if not rows:
        raise ValueError(f"{path}: no trace rows")
    ids = np.stack(rows)
    if ids.min() < 0 or ids.max() > 0xFFFE:
        raise ValueError(f"{path}: expert ids must lie in [0, 65534]")
    return ids.astype(np.uint16)


def experts_of(ids: np.ndarray) -> int:
    """The expert count a trace implies: the smallest power of two above its largest id."""
    return 1 << int(ids.max()).bit_length()


def write_binary(ids: np.ndarray, n_experts: int, path: str | os.PathLike[str]) -> None:
    """Writes ids [tokens, moe_layers, top_k] of a model with n_experts as a WPRT file."""
    if ids.ndim != 3 or int(ids.max()) >= n_experts:
        raise ValueError(f"ids of shape {ids.shape} (max {int(ids.max())}) for {n_experts} experts")
    t, layers, k = ids.shape
    with open(path, "wb") as f:
        f.write(_HEADER.pack(MAGIC, 1, t, layers, k, n_experts))
        f.write(np.ascontiguousarray(ids, dtype="<u2").tobytes())


@contextlib.contextmanager
def binary_trace(
    path: str | os.PathLike[str], n_experts: int | None = None
) -> Iterator[str]:
    """Yields the path of the engine's form of a trace (a WPRT file is used as it is)."""
    with open(path, "rb") as f:
        if f.read(4) == MAGIC:
            yield os.fspath(path)
            return
    ids = read_jsonl(path)
    with tempfile.TemporaryDirectory(prefix="wp-trace-") as tmp:
        out = Path(tmp) / "trace.wprt"
        write_binary(ids, n_experts or experts_of(ids), out)
        yield str(out)
