"""Container writer: trunk.bin, expert banks, side files and manifest.json, atomically.

Owns the byte layout of FORMAT.md sections 2 and 5: 64-byte aligned trunk tensors with
CRC32C, one 4 KiB-aligned record per expert with its 64-byte ``WPXR`` header, and the
manifest written last. Everything goes into ``<out>.partial-<random>`` next to ``out``
and is renamed to ``out`` only by :meth:`ContainerWriter.commit`, so an interrupted or
failed run never leaves a directory that looks like a container. Data arrives tensor by
tensor and expert by expert; nothing is buffered beyond the piece being written.

Also owns CRC32C (Castagnoli, reflected, init/xorout 0xFFFFFFFF): the engine's C one when
the extension is built (GB/s), else pure numpy: many lanes are run in parallel with 16-bit
tables and then folded together with the CRC "shift by n zero bytes" operator, about
300 MB/s on one core.

Also owns the conversion driver :func:`write_container`: importers describe the model as
a :class:`~.plan.Plan` of lazy tensor sources (``plan.py``, re-exported here), and the
driver picks each tensor's dtype from the requested quantization, encodes it and writes it.

Refuses: writing into an existing ``out``, duplicate names, out-of-order experts,
sizes that disagree with dtype and shape. Called by the HF and GGUF importers.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import numpy as np

from . import quant
from .plan import ExpertLayerSrc, Plan, SrcTensor, const_rows
from .quant import BLOCK_DTYPES, DTYPE_IDS, QUANT_DTYPES, ConvertError, tensor_bytes

__all__ = [
    "ExpertLayerSrc",
    "Plan",
    "Progress",
    "Quantization",
    "SrcTensor",
    "shipped_experts",
    "const_rows",
    "write_container",
    "ALIGN_TRUNK",
    "ALIGN_RECORD",
    "HEADER_BYTES",
    "Crc32c",
    "ContainerWriter",
    "ExpertBankWriter",
    "crc32c",
    "pack_record_header",
]

ALIGN_TRUNK: Final[int] = 64
ALIGN_RECORD: Final[int] = 4096
HEADER_BYTES: Final[int] = 64
_BANK_BUFFER: Final[int] = 4 << 20  # bytes an expert bank is written in
_RECORD_MAGIC: Final[bytes] = b"WPXR"
_RECORD_VERSION: Final[int] = 1
_HEADER_STRUCT: Final[struct.Struct] = struct.Struct("<4sIIIIIQQQQ")  # 56 bytes, CRCs follow

# --------------------------------------------------------------------------- CRC32C

_POLY: Final[int] = 0x82F63B78
_SEGMENT: Final[int] = 1 << 24  # bytes per vectorized pass


def _byte_table() -> np.ndarray:
    c = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        c = np.where(c & 1, (c >> np.uint32(1)) ^ np.uint32(_POLY), c >> np.uint32(1)).astype(
            np.uint32
        )
    return c


_T8: Final[np.ndarray] = _byte_table()

# A linear operator on the 32-bit CRC register is stored as two 65536-entry tables:
# op(x) = tab[0][x & 0xffff] ^ tab[1][x >> 16].
_Op = np.ndarray


def _apply(op: _Op, x: np.ndarray) -> np.ndarray:
    return op[0][x & np.uint32(0xFFFF)] ^ op[1][x >> np.uint32(16)]


def _compose(outer: _Op, inner: _Op) -> _Op:
    """Return the operator ``outer(inner(x))``."""
    return _apply(outer, inner)


def _one_zero_byte() -> _Op:
    lo = np.arange(65536, dtype=np.uint32)
    hi = lo << np.uint32(16)
    step = lambda x: _T8[x & np.uint32(0xFF)] ^ (x >> np.uint32(8))  # noqa: E731
    return np.stack([step(lo), step(hi)])


_POW2_OPS: list[_Op] = [_one_zero_byte()]  # _POW2_OPS[j] shifts by 2**j zero bytes


def _pow2_op(j: int) -> _Op:
    while len(_POW2_OPS) <= j:
        last = _POW2_OPS[-1]
        _POW2_OPS.append(_compose(last, last))
    return _POW2_OPS[j]


def _shift_scalar(reg: int, nbytes: int) -> int:
    x = np.array([reg], dtype=np.uint32)
    j = 0
    while nbytes:
        if nbytes & 1:
            x = _apply(_pow2_op(j), x)
        nbytes >>= 1
        j += 1
    return int(x[0])


def _raw_crc(buf: np.ndarray) -> int:
    """CRC register after ``buf`` starting from 0, without final xor (linear in buf)."""
    n = int(buf.size)
    if n == 0:
        return 0
    lanes = 1
    while lanes < 16384 and lanes * 512 <= n:
        lanes *= 2
    # A power-of-two lane length keeps every fold span a cached power of two.
    words_per_lane = 1
    while words_per_lane * 4 * lanes < n:
        words_per_lane *= 2
    total = lanes * words_per_lane * 4
    # Leading zero bytes leave a zero register unchanged, so pad at the front.
    padded = np.zeros(total, dtype=np.uint8)
    padded[total - n :] = buf
    words = np.ascontiguousarray(padded.view("<u4").reshape(lanes, words_per_lane).T)
    z4 = _pow2_op(2)
    lo_t, hi_t = z4[0], z4[1]
    reg = np.zeros(lanes, dtype=np.uint32)
    lo = np.empty(lanes, dtype=np.uint32)
    hi = np.empty(lanes, dtype=np.uint32)
    for row in words:
        reg ^= row
        np.bitwise_and(reg, np.uint32(0xFFFF), out=lo)
        np.right_shift(reg, np.uint32(16), out=hi)
        np.take(lo_t, lo, out=reg)
        reg ^= np.take(hi_t, hi)
    j = (words_per_lane * 4).bit_length() - 1
    while reg.size > 1:
        reg = _apply(_pow2_op(j), reg[0::2]) ^ reg[1::2]
        j += 1
    return int(reg[0])


def _engine_crc() -> Callable[..., int] | None:
    """The engine's CRC32C (C, the CRC instruction where the CPU has it), or None when the
    extension is not built; the numpy code below is then the one used."""
    try:
        from warp_providers import _engine
    except ImportError:
        return None
    return getattr(_engine, "crc32c", None)


_FAST_CRC: Final[Callable[..., int] | None] = _engine_crc()


class Crc32c:
    """Incremental CRC32C (Castagnoli, reflected, init and xorout 0xFFFFFFFF).

    ``fast`` (default: when the engine extension is importable) runs the engine's C
    CRC32C (gigabytes a second); otherwise the numpy lanes above (about 300 MB/s).
    Both give the same value.
    """

    def __init__(self, fast: bool | None = None) -> None:
        self._raw = 0
        self._n = 0
        self._fast = _FAST_CRC if fast is None or fast else None
        self._crc = 0

    def update(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Feed more bytes."""
        buf = (
            np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            if isinstance(data, np.ndarray)
            else np.frombuffer(data, np.uint8)
        )
        if self._fast is not None:
            self._crc = self._fast(buf, self._crc)
            return
        for s in range(0, int(buf.size), _SEGMENT):
            seg = buf[s : s + _SEGMENT]
            self._raw = _shift_scalar(self._raw, int(seg.size)) ^ _raw_crc(seg)
            self._n += int(seg.size)

    def value(self) -> int:
        """Return the CRC of everything fed so far."""
        if self._fast is not None:
            return self._crc
        return (_shift_scalar(0xFFFFFFFF, self._n) ^ self._raw ^ 0xFFFFFFFF) & 0xFFFFFFFF


def crc32c(data: bytes | bytearray | memoryview | np.ndarray, fast: bool | None = None) -> int:
    """CRC32C of ``data``; ``crc32c(b"123456789") == 0xE3069283`` (``fast``: see
    :class:`Crc32c`)."""
    c = Crc32c(fast)
    c.update(data)
    return c.value()


# --------------------------------------------------------------------------- records


def pack_record_header(
    *,
    layer: int,
    expert: int,
    dtype: str,
    gate_bytes: int,
    up_bytes: int,
    down_bytes: int,
    payload_crc: int,
) -> bytes:
    """Return the 64-byte expert record header of FORMAT.md section 5."""
    payload = gate_bytes + up_bytes + down_bytes
    head = _HEADER_STRUCT.pack(
        _RECORD_MAGIC,
        _RECORD_VERSION,
        layer,
        expert,
        DTYPE_IDS[dtype],
        3,
        payload,
        HEADER_BYTES,
        HEADER_BYTES + gate_bytes,
        HEADER_BYTES + gate_bytes + up_bytes,
    )
    head += struct.pack("<I", payload_crc & 0xFFFFFFFF)
    return head + struct.pack("<I", crc32c(head))


def _valid_records(path: Path, layer: int, record_bytes: int, n_experts: int) -> int:
    """How many leading records of a bank file are whole and intact (header CRC, layer,
    expert number and payload CRC), the first torn or unwritten one ending the count."""
    n = 0
    with open(path, "rb") as f:
        while n < n_experts:
            rec = f.read(record_bytes)
            if len(rec) < record_bytes:
                break
            head = rec[:HEADER_BYTES]
            fields = _HEADER_STRUCT.unpack(head[: _HEADER_STRUCT.size])
            (payload_crc,) = struct.unpack_from("<I", head, _HEADER_STRUCT.size)
            (head_crc,) = struct.unpack_from("<I", head, _HEADER_STRUCT.size + 4)
            if (fields[0] != _RECORD_MAGIC or fields[2] != layer or fields[3] != n
                    or head_crc != crc32c(head[: _HEADER_STRUCT.size + 4])
                    or payload_crc != crc32c(rec[HEADER_BYTES : HEADER_BYTES + fields[6]])):
                break
            n += 1
    return n


def _file_crc(f: Any, offset: int, n: int, piece: int = 64 << 20) -> int | None:
    """CRC32C of ``n`` bytes of open file ``f`` from ``offset``, read a piece at a time;
    None when the file ends first."""
    f.seek(offset)
    crc = Crc32c()
    while n > 0:
        data = f.read(min(piece, n))
        if not data:
            return None
        crc.update(data)
        n -= len(data)
    return crc.value()


def _as_bytes(data: bytes | np.ndarray) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


class ExpertBankWriter:
    """Writes ``experts-L{layer}.bin``: records for experts 0..n-1, in order."""

    def __init__(
        self,
        path: Path,
        *,
        layer: int,
        n_experts: int,
        dtype: str,
        shapes: tuple[tuple[int, int], tuple[int, int], tuple[int, int]],
    ) -> None:
        self.layer = layer
        self.n_experts = n_experts
        self.dtype = dtype
        self.shapes = shapes
        self._sizes = [tensor_bytes(dtype, s) for s in shapes]
        payload = sum(self._sizes)
        self.record_bytes = -(-(HEADER_BYTES + payload) // ALIGN_RECORD) * ALIGN_RECORD
        self._pad = bytes(self.record_bytes - HEADER_BYTES - payload)
        self._path = path
        self._next = 0
        if path.exists():  # an interrupted run's bank: keep its leading valid records
            self._next = _valid_records(path, layer, self.record_bytes, n_experts)
            self._f = open(path, "r+b", buffering=_BANK_BUFFER)  # noqa: SIM115 - close()
            self._f.truncate(self._next * self.record_bytes)
            self._f.seek(self._next * self.record_bytes)
        else:
            self._f = open(path, "wb", buffering=_BANK_BUFFER)  # noqa: SIM115 - close()

    @property
    def written(self) -> int:
        """Experts already in the bank (an interrupted run's, when resumed)."""
        return self._next

    def write(
        self,
        expert: int,
        gate: bytes | np.ndarray,
        up: bytes | np.ndarray,
        down: bytes | np.ndarray,
    ) -> None:
        """Append the record of ``expert`` (must be the next one) from its encoded tensors."""
        if expert != self._next:
            raise ConvertError(
                f"layer {self.layer}: expert {expert} written out of order (expected {self._next})"
            )
        parts = [_as_bytes(gate), _as_bytes(up), _as_bytes(down)]
        for name, p, need in zip(("gate", "up", "down"), parts, self._sizes):
            if p.size != need:
                raise ConvertError(
                    f"layer {self.layer} expert {expert} {name}: {p.size} bytes, "
                    f"{self.dtype} shape needs {need}"
                )
        crc = Crc32c()
        for p in parts:
            crc.update(p)
        header = pack_record_header(
            layer=self.layer,
            expert=expert,
            dtype=self.dtype,
            gate_bytes=self._sizes[0],
            up_bytes=self._sizes[1],
            down_bytes=self._sizes[2],
            payload_crc=crc.value(),
        )
        self._f.write(header)
        for p in parts:
            self._f.write(p.data)
        self._f.write(self._pad)
        self._next += 1

    def close(self) -> dict[str, Any]:
        """Finish the bank and return its manifest entry."""
        if self._f.closed:
            raise ConvertError(f"layer {self.layer}: expert bank closed twice")
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        if self._next != self.n_experts:
            raise ConvertError(
                f"layer {self.layer}: wrote {self._next} experts, expected {self.n_experts}"
            )
        tensors = []
        off = HEADER_BYTES
        for name, shape, size in zip(("gate", "up", "down"), self.shapes, self._sizes):
            tensors.append(
                {
                    "name": name,
                    "dtype": self.dtype,
                    "shape": list(shape),
                    "offset": off,
                    "bytes": size,
                }
            )
            off += size
        return {
            "layer": self.layer,
            "file": self._path.name,
            "n_experts": self.n_experts,
            "record_bytes": self.record_bytes,
            "tensors": tensors,
        }

    def discard(self) -> None:
        """Close without producing an entry (used when the conversion fails)."""
        if not self._f.closed:
            self._f.close()


# --------------------------------------------------------------------------- container


JOURNAL: Final[str] = "journal.json"
_JOURNAL_SECONDS: Final[float] = 1.0  # trunk progress is journaled at most this often


class ContainerWriter:
    """Builds a container in ``<out>.partial-<random>`` and renames it to ``out`` on commit.

    Use as a context manager: leaving the block by an exception removes the partial
    directory, except an interruption (KeyboardInterrupt, SystemExit), which keeps it for
    a resumed run. ``out`` must not exist, checked at construction and again at commit.

    Resumption: with a ``fingerprint`` (what identifies the conversion: source files,
    request, plan), the partial directory holds ``journal.json``: the fingerprint, the
    trunk tensors written (with their offsets and CRCs), the finished banks. It is
    replaced atomically after the trunk was flushed, at most once a second for trunk
    tensors and at every bank boundary. ``resume`` reopens such a directory: trunk
    entries whose bytes still match their CRC are kept (the file cut after the last one),
    finished banks are kept, and the interrupted bank keeps its leading intact records;
    the caller skips what `has_trunk` / `has_bank` / `ExpertBankWriter.written` report.
    The partial directory never holds a manifest, so it never opens as a container.
    """

    def __init__(self, out: str | os.PathLike[str], *, fingerprint: Any = None,
                 resume: Path | None = None) -> None:
        self.out = Path(out)
        if self.out.exists():
            raise ConvertError(f"{self.out}: already exists")
        parent = self.out.parent
        if not parent.is_dir():
            raise ConvertError(f"{parent}: output directory's parent does not exist")
        self._fingerprint = fingerprint
        self._trunk_pos = 0
        self._trunk_entries: list[dict[str, Any]] = []
        self._names: set[str] = set()
        self._banks: list[dict[str, Any]] = []
        self._open_bank: ExpertBankWriter | None = None
        self._files: set[str] = set()
        self._done = False
        self._journaled = 0.0
        if resume is not None:
            self.tmp = resume
            self._reopen()
        else:
            self.tmp = parent / f"{self.out.name}.partial-{secrets.token_hex(6)}"
            self.tmp.mkdir()
            self._trunk = open(self.tmp / "trunk.bin", "wb")  # noqa: SIM115 - commit/abort
        self._journal(force=True)

    def _reopen(self) -> None:
        j = read_journal(self.tmp)
        trunk = self.tmp / "trunk.bin"
        if j is None or not trunk.is_file():
            raise ConvertError(f"{self.tmp}: no journal of an interrupted conversion")
        with open(trunk, "rb") as f:
            for e in j["trunk"]:
                if _file_crc(f, e["offset"], e["bytes"]) != e["crc32c"]:
                    break
                self._trunk_entries.append(e)
                self._names.add(e["name"])
                self._trunk_pos = e["offset"] + e["bytes"]
        for b in j["banks"]:
            if (self.tmp / b["file"]).stat().st_size != b["n_experts"] * b["record_bytes"]:
                break  # finished banks were fsynced before they were journaled
            self._banks.append(b)
        self._trunk = open(trunk, "r+b")  # noqa: SIM115 - closed in commit/abort
        self._trunk.truncate(self._trunk_pos)
        self._trunk.seek(self._trunk_pos)
        kept = {b["file"] for b in self._banks}
        for p in self.tmp.iterdir():  # side files are rewritten; unfinished banks resumed
            if p.name not in kept and p.name not in ("trunk.bin", JOURNAL) and \
                    not p.name.startswith("experts-L"):
                p.unlink()

    def _journal(self, force: bool = False) -> None:
        if self._fingerprint is None:
            return
        now = time.monotonic()
        if not force and now - self._journaled < _JOURNAL_SECONDS:
            return
        self._journaled = now
        self._trunk.flush()
        tmp = self.tmp / (JOURNAL + ".new")
        tmp.write_text(json.dumps({"fingerprint": self._fingerprint,
                                   "trunk": self._trunk_entries, "banks": self._banks}))
        os.replace(tmp, self.tmp / JOURNAL)

    def has_bank(self, layer: int) -> bool:
        """Whether the bank of ``layer`` is finished (a resumed run's)."""
        return any(b["layer"] == layer for b in self._banks)

    def __enter__(self) -> ContainerWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done:
            return
        if exc_type is not None and not issubclass(exc_type, Exception) and \
                self._fingerprint is not None:  # interrupted: kept for a resumed run
            if self._open_bank is not None:
                self._open_bank.discard()
            self._trunk.close()
            return
        self.abort()

    # -- trunk
    def add_trunk(
        self, name: str, dtype: str, shape: tuple[int, ...] | list[int], data: bytes | np.ndarray
    ) -> None:
        """Append one trunk tensor (already encoded as ``dtype``) at the next 64-byte boundary."""
        self.add_trunk_chunks(name, dtype, shape, [data])

    def add_trunk_chunks(
        self, name: str, dtype: str, shape: tuple[int, ...] | list[int],
        chunks: Iterable[bytes | np.ndarray],
    ) -> None:
        """Append one trunk tensor given as consecutive pieces of its ``dtype`` bytes (each
        written as it comes, so a tensor larger than RAM's share is never held whole)."""
        if name in self._names:
            raise ConvertError(f"trunk tensor {name!r} written twice")
        need = tensor_bytes(dtype, tuple(int(d) for d in shape))
        pad = (-self._trunk_pos) % ALIGN_TRUNK
        if pad:
            self._trunk.write(bytes(pad))
            self._trunk_pos += pad
        crc, n = Crc32c(), 0
        for piece in chunks:
            buf = _as_bytes(piece)
            if n + buf.size > need:
                break
            self._trunk.write(buf.data)
            crc.update(buf)
            n += int(buf.size)
        else:
            buf = None
        if buf is not None or n != need:
            got = "more than that" if buf is not None else f"{n} bytes"
            raise ConvertError(
                f"trunk tensor {name!r}: {got}, {dtype} {list(shape)} needs {need}"
            )
        self._trunk_entries.append(
            {
                "name": name,
                "dtype": dtype,
                "shape": [int(d) for d in shape],
                "offset": self._trunk_pos,
                "bytes": n,
                "crc32c": crc.value(),
            }
        )
        self._names.add(name)
        self._trunk_pos += n
        self._journal()

    def has_trunk(self, name: str) -> bool:
        """Whether a trunk tensor of that name was written."""
        return name in self._names

    # -- experts
    def expert_bank(
        self,
        layer: int,
        n_experts: int,
        dtype: str,
        shapes: tuple[tuple[int, int], tuple[int, int], tuple[int, int]],
    ) -> ExpertBankWriter:
        """Start the bank of MoE layer ``layer``; :meth:`close_bank` ends it."""
        if self._open_bank is not None:
            raise ConvertError(
                f"layer {layer}: expert bank of layer {self._open_bank.layer} still open"
            )
        if any(b["layer"] == layer for b in self._banks):
            raise ConvertError(f"layer {layer}: expert bank written twice")
        self._journal(force=True)  # the trunk so far, before the bank's records
        self._open_bank = ExpertBankWriter(
            self.tmp / f"experts-L{layer}.bin",
            layer=layer,
            n_experts=n_experts,
            dtype=dtype,
            shapes=shapes,
        )
        return self._open_bank

    def close_bank(self) -> None:
        """Finish the open bank and record it in the manifest."""
        if self._open_bank is None:
            raise ConvertError("no expert bank is open")
        bank, self._open_bank = self._open_bank, None
        self._banks.append(bank.close())
        self._journal(force=True)

    # -- side files
    def write_file(self, name: str, data: bytes | str) -> None:
        """Write a side file (tokenizer, template, ...) into the container."""
        if (
            "/" in name
            or name in ("", ".", "..", "manifest.json", "trunk.bin")
            or name.startswith("experts-L")
        ):
            raise ConvertError(f"side file name {name!r} not allowed")
        if name in self._files:
            raise ConvertError(f"side file {name!r} written twice")
        raw = data.encode("utf-8") if isinstance(data, str) else data
        with open(self.tmp / name, "wb") as f:
            f.write(raw)
        self._files.add(name)

    def copy_file(self, name: str, src: str | os.PathLike[str]) -> None:
        """Copy ``src`` into the container as ``name``."""
        try:
            data = Path(src).read_bytes()
        except OSError as e:
            raise ConvertError(f"{src}: cannot read ({e.strerror})") from e
        self.write_file(name, data)

    # -- finish
    def commit(self, manifest: dict[str, Any]) -> Path:
        """Write manifest.json (with trunk and experts filled in) and rename into place.

        ``manifest`` supplies every other key; key order of the written file follows
        FORMAT.md section 2.
        """
        if self._open_bank is not None:
            raise ConvertError(f"layer {self._open_bank.layer}: expert bank not closed")
        self._trunk.flush()
        os.fsync(self._trunk.fileno())
        self._trunk.close()
        full: dict[str, Any] = {}
        order = (
            "format",
            "format_version",
            "model_type",
            "source_config",
            "hparams",
            "quantization",
        )
        for k in order:
            full[k] = manifest[k]
        full["trunk"] = {
            "file": "trunk.bin",
            "bytes": self._trunk_pos,
            "tensors": self._trunk_entries,
        }
        full["experts"] = sorted(self._banks, key=lambda b: int(b["layer"]))
        for k, v in manifest.items():
            if k not in full:
                full[k] = v
        text = json.dumps(full, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
        for name in (JOURNAL, JOURNAL + ".new"):
            (self.tmp / name).unlink(missing_ok=True)
        with open(self.tmp / "manifest.json", "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if self.out.exists():
            raise ConvertError(f"{self.out}: appeared while converting; not replaced")
        os.replace(self.tmp, self.out)
        try:
            dfd = os.open(self.out.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass  # directory fsync is not supported everywhere; the rename itself is done
        self._done = True
        return self.out

    def abort(self) -> None:
        """Remove the partial directory (idempotent)."""
        self._done = True
        if self._open_bank is not None:
            self._open_bank.discard()
            self._open_bank = None
        if not self._trunk.closed:
            self._trunk.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


# --------------------------------------------------------------------------- plan + driver

#: progress(done_bytes, total_bytes, label), in source bytes.
Progress = Callable[[int, int, str], None]

_ROW_CHUNK_ELEMS: Final[int] = 1 << 22


@dataclass(frozen=True)
class Quantization:
    """Requested dtype per tensor role (FORMAT.md section 2 ``quantization``)."""

    experts: str
    trunk: str
    embedding: str
    output: str

    def for_kind(self, kind: str) -> str:
        """Return the requested dtype for role ``kind`` (``f32`` kinds are always f32)."""
        if kind == "f32":
            return "f32"
        return str(getattr(self, kind))

    def as_dict(self) -> dict[str, str]:
        """Return the manifest's ``quantization`` object."""
        return {
            "experts": self.experts,
            "trunk": self.trunk,
            "embedding": self.embedding,
            "output": self.output,
        }


def _fallback(dtype: str, cols: int) -> str:
    if dtype in BLOCK_DTYPES and not quant.can_quantize(cols):
        return "f16"
    return dtype


def choose_dtype(t: SrcTensor, want: str) -> tuple[str, bool]:
    """Return the dtype ``t`` is stored as, and whether its raw bytes are copied.

    Policy: a source already quantized in a container type is kept as is when a
    quantized dtype is requested (never re-quantized), but for mxfp4, kept only when
    mxfp4 is what is requested (another type re-quantizes it); a source in a lossy type the
    container lacks becomes q8_0 at most; rows that are not a multiple of 32 fall back to
    f16 when a quantized dtype is requested.
    """
    cols = t.matrix[1]
    if t.raw is not None and t.raw_dtype is not None:
        if t.raw_dtype == want:
            return want, True
        if t.raw_dtype in QUANT_DTYPES and want in QUANT_DTYPES:
            return t.raw_dtype, True
    if t.lossy and want in QUANT_DTYPES:
        want = "q8_0"
    return _fallback(want, cols), False


def encode_chunks(t: SrcTensor, dtype: str, copy_raw: bool) -> Iterator[np.ndarray]:
    """Yield the bytes of ``t`` encoded as ``dtype``, a chunk of rows at a time (each
    chunk read from the source when it is reached: nothing holds the whole tensor)."""
    n_rows, cols = t.matrix
    step = max(1, _ROW_CHUNK_ELEMS // max(cols, 1))
    if copy_raw:
        assert t.raw is not None
        flat = np.ascontiguousarray(t.raw()).reshape(-1).view(np.uint8)  # read once
        rb = flat.size // max(n_rows, 1)
        for r0 in range(0, n_rows, step):
            piece = flat[r0 * rb : min(n_rows, r0 + step) * rb]
            quant.check_blocks(piece, dtype, t.name)
            yield piece
        return
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        block = np.asarray(t.rows(r0, r1))
        if block.shape != (r1 - r0, cols):
            raise ConvertError(
                f"{t.name}: loader gave rows of shape {block.shape}, expected {(r1 - r0, cols)}"
            )
        yield quant.encode(block, dtype)


_chunks = encode_chunks


def encode_tensor(t: SrcTensor, dtype: str, copy_raw: bool) -> np.ndarray:
    """Return the bytes of ``t`` encoded as ``dtype`` (a chunk of rows at a time)."""
    if copy_raw:
        assert t.raw is not None
        raw = np.ascontiguousarray(t.raw()).reshape(-1).view(np.uint8)
        quant.check_blocks(raw, dtype, t.name)
        return raw
    n_rows, cols = t.matrix
    out = np.empty(n_rows * quant.row_bytes(dtype, cols), dtype=np.uint8)
    pos = 0
    for piece in _chunks(t, dtype, False):
        out[pos : pos + piece.size] = piece.reshape(-1).view(np.uint8)
        pos += piece.size
    return out


def _expert_dtype(ts: Sequence[SrcTensor], want: str) -> tuple[str, bool]:
    """One dtype for gate, up and down of a layer (the record header holds one)."""
    raws = {t.raw_dtype for t in ts}
    if all(t.raw is not None for t in ts) and len(raws) == 1:
        (rd,) = raws
        if rd == want or (rd in QUANT_DTYPES and want in QUANT_DTYPES):
            return str(rd), True
    if any(t.lossy for t in ts) and want in QUANT_DTYPES:
        want = "q8_0"
    if want in BLOCK_DTYPES and not all(quant.can_quantize(t.matrix[1]) for t in ts):
        want = "f16"
    return want, False


def shipped_experts(plan: Plan, otherwise: str = "q4_0") -> str:
    """The experts' dtype when none is requested: ``mxfp4`` if the source ships them so
    (kept byte for byte), else ``otherwise``."""
    if plan.experts:
        ts = plan.experts[0].expert(0)
        if all(t.raw is not None and t.raw_dtype == "mxfp4" for t in ts):
            return "mxfp4"
    return otherwise


def read_journal(partial: Path) -> dict[str, Any] | None:
    """The journal of an interrupted conversion's partial directory, or None."""
    try:
        j = json.loads((partial / JOURNAL).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(j, dict) and isinstance(j.get("trunk"), list) and \
        isinstance(j.get("banks"), list)
    return j if ok else None


def plan_fingerprint(plan: Plan, q: Quantization, source: Any) -> dict[str, Any]:
    """What a resumed run must share with the interrupted one: the source (its files'
    names, sizes and modification times), the request and the plan's tensors."""
    layout = [[t.name, list(t.shape), t.kind] for t in plan.trunk]
    layout += [[x.layer, x.n_experts, [list(s) for s in x.shapes]] for x in plan.experts]
    return {"version": _VERSION, "source": source, "quantization": q.as_dict(),
            "model_type": plan.model_type, "hparams": plan.hparams, "layout": layout}


def write_container(
    plan: Plan, out: str | os.PathLike[str], q: Quantization, progress: Progress | None,
    *, fingerprint: Any = None, resume: Path | None = None,
) -> Path:
    """Encode and write ``plan`` as a container at ``out`` (atomically).

    ``fingerprint`` journals the conversion so an interrupted run can be resumed;
    ``resume`` is such a run's partial directory (its journal's fingerprint equal to
    ``fingerprint``): what it finished is kept and skipped, the rest written as an
    uninterrupted run writes it, so the container is byte for byte the same.

    Raises:
        ConvertError: ``out`` exists, or a tensor cannot be encoded as planned.

    """
    total = sum(t.nbytes for t in plan.trunk) + sum(x.nbytes for x in plan.experts)
    done = 0

    def tick(n: int, label: str) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total, label)

    with ContainerWriter(out, fingerprint=fingerprint, resume=resume) as w:
        for t in plan.trunk:
            if w.has_trunk(t.name):  # a resumed run's
                tick(t.nbytes, t.name)
                continue
            dtype, copy_raw = choose_dtype(t, q.for_kind(t.kind))
            w.add_trunk_chunks(t.name, dtype, t.shape, encode_chunks(t, dtype, copy_raw))
            tick(t.nbytes, t.name)
        for layer in plan.experts:
            if w.has_bank(layer.layer):
                tick(layer.nbytes, f"blk.{layer.layer}.experts")
                continue
            first = layer.expert(0)
            dtype, copy_raw = _expert_dtype(first, q.experts)
            bank = w.expert_bank(layer.layer, layer.n_experts, dtype, layer.shapes)
            if bank.written:
                tick(bank.written * sum(t.nbytes for t in first), f"blk.{layer.layer}.experts")
            for e in range(bank.written, layer.n_experts):
                ts = first if e == 0 else layer.expert(e)
                if tuple(tuple(t.shape) for t in ts) != layer.shapes:
                    raise ConvertError(
                        f"layer {layer.layer} expert {e}: shapes {[list(t.shape) for t in ts]} "
                        f"differ from {[list(s) for s in layer.shapes]}"
                    )
                e_dtype, e_copy = _expert_dtype(ts, q.experts)
                if e_dtype != dtype:
                    raise ConvertError(
                        f"layer {layer.layer} expert {e}: source dtype differs from expert 0's"
                    )
                bank.write(e, *(encode_tensor(t, dtype, e_copy) for t in ts))
                tick(sum(t.nbytes for t in ts), f"blk.{layer.layer}.expert.{e}")
            w.close_bank()
        for name, data in plan.files:
            w.write_file(name, data)
        manifest = {
            "format": "warp",
            "format_version": 1,
            "model_type": plan.model_type,
            "source_config": plan.source_config,
            "hparams": plan.hparams,
            "quantization": q.as_dict(),
            "tokenizer": plan.tokenizer,
            "chat": plan.chat,
            "converter": {"name": "warp-providers", "version": _VERSION, "source": plan.source},
        }
        if plan.vision is not None:
            manifest["vision"] = plan.vision
        return w.commit(manifest)


_VERSION: Final[str] = "0.1.0"
