"""Converter: an HF checkpoint directory or a .gguf file -> a warp container directory.

Owns the public entry point :func:`convert` and :class:`ConvertError`. The importers
(``hf.py``, ``gguf_src.py``) turn a source into a plan of lazy tensors and normalized
hyperparameters; ``writer.py`` encodes and writes it atomically (``quant.py`` holds the
encodings). Library code never prints: progress goes to an optional callback, which the
CLI wraps in tqdm.

Refuses: an existing ``out`` (unless ``resume`` finds the same conversion already
complete there), unknown dtype names, and anything the importers cannot map, always as a
``ConvertError`` naming the file, tensor or key at fault.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .quant import ConvertError

__all__ = ["DTYPES", "ConvertError", "convert"]

#: dtype names accepted for ``experts``, ``trunk``, ``embedding`` and ``output``.
DTYPES: tuple[str, ...] = ("q4_0", "q8_0", "mxfp4", "f16", "bf16", "f32")


def _check_choice(arg: str, value: str | None) -> None:
    if value is not None and value not in DTYPES:
        raise ConvertError(f"{arg}={value!r} is not one of {', '.join(DTYPES)}")


def _stale_partials(out: Path) -> list[Path]:
    if not out.parent.is_dir():
        return []
    prefix = out.name + ".partial-"
    return sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix) and p.is_dir())


def _same_conversion(out: Path, quantization: dict[str, str], source: str) -> bool:
    try:
        m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(m, dict)
        and m.get("format") == "warp"
        and m.get("format_version") == 1
        and m.get("quantization") == quantization
        and isinstance(m.get("converter"), dict)
        and m["converter"].get("source") == source
    )


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    experts: str | None = None,
    trunk: str = "q8_0",
    embedding: str | None = None,
    output: str | None = None,
    resume: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
    tensors: Any = None,
) -> Path:
    """Convert an HF checkpoint directory or a ``.gguf`` file into a warp container.

    Norms, routers, the shared-expert gate, biases and ``rope_freqs`` are always f32.
    A matrix whose rows are not a multiple of 32 cannot be block-quantized and is stored
    as f16 instead. From GGUF, tensors already in Q4_0/Q4_1/Q8_0 are copied unchanged
    when a quantized dtype is requested (never re-quantized); K-quants become q8_0.
    Routed experts shipped as MXFP4 (gpt-oss; GGUF MXFP4) are stored as shipped, every
    code and scale unchanged, unless another ``experts`` dtype is named.

    Args:
        src: an HF checkpoint directory (config.json + safetensors + tokenizer) or a
            ``.gguf`` file.
        out: the container directory to create; it must not exist.
        experts: dtype of the routed experts; default ``mxfp4`` when the source ships
            them as MXFP4 (kept byte for byte), else ``q4_0``.
        trunk: dtype of the other matrices (attention, dense FFN, shared expert).
        embedding: dtype of ``token_embd``; default q8_0 when ``trunk`` is quantized,
            else the same as ``trunk``.
        output: dtype of the LM head; same default as ``embedding``.
        resume: after an interrupted run (killed, Ctrl-C, out of disk): continue the
            newest ``<out>.partial-*`` directory whose journal names this conversion
            (the same source files, sizes and times, request and plan) from its last
            intact tensor or expert record, and remove the other partials; if ``out``
            already holds a complete container made from the same kind of source with
            the same quantization, return it unchanged. Without ``resume`` an existing
            ``out`` is an error. Conversion is deterministic, so a resumed run gives the
            bytes of an uninterrupted one; a partial directory never opens as a
            container (it has no manifest until the final rename).
        progress: called as ``progress(done_bytes, total_bytes, label)`` after each
            tensor or expert, in source bytes.
        tensors: the checkpoint's tensors in place of its safetensors shards (an HF
            directory holding the config and tokenizer only): generated ones, drawn as
            they are encoded (``warp_providers.synth.make_moe_container``).

    Returns:
        The path of the container directory.

    Raises:
        ConvertError: a bad argument, an existing ``out``, or a source that cannot be
            converted; the message names the file, tensor or key at fault.

    """
    for arg, value in (
        ("experts", experts),
        ("trunk", trunk),
        ("embedding", embedding),
        ("output", output),
    ):
        _check_choice(arg, value)
    from .writer import (
        Quantization,
        plan_fingerprint,
        read_journal,
        shipped_experts,
        write_container,
    )

    edge = "q8_0" if trunk in ("q4_0", "q8_0", "mxfp4") else trunk
    src_p = Path(src)
    out_p = Path(out)
    if not src_p.exists():
        raise ConvertError(f"{src_p}: no such file or directory")
    source = "gguf" if src_p.is_file() else "hf"
    if src_p.is_file() and src_p.suffix.lower() != ".gguf":
        with open(src_p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ConvertError(f"{src_p}: not a .gguf file nor an HF checkpoint directory")
    if not resume and out_p.exists():
        raise ConvertError(
            f"{out_p}: already exists (pass resume=True to reuse a finished conversion)"
        )

    plan: Any
    if source == "gguf":
        from .gguf_src import load_gguf

        plan = load_gguf(src_p)
    else:
        from .hf import load_hf

        plan = load_hf(src_p, tensors)
    q = Quantization(
        experts=experts or shipped_experts(plan), trunk=trunk, embedding=embedding or edge,
        output=output or edge,
    )
    fingerprint = None if tensors is not None else json.loads(json.dumps(
        plan_fingerprint(plan, q, _source_files(src_p))))
    partial = None
    if resume:
        if out_p.exists():
            if _same_conversion(out_p, q.as_dict(), source):
                return out_p
            raise ConvertError(
                f"{out_p}: exists and is not a finished container of this conversion; remove it"
            )
        for p in reversed(_stale_partials(out_p)):  # the newest journal of this conversion
            j = read_journal(p)
            if partial is None and fingerprint is not None and j is not None and \
                    j.get("fingerprint") == fingerprint:
                partial = p
            else:
                shutil.rmtree(p, ignore_errors=True)
    return write_container(plan, out_p, q, progress, fingerprint=fingerprint, resume=partial)


def _source_files(src: Path) -> list[list[Any]]:
    """Names, sizes and modification times of the source's files (a resumed run's
    source must be the interrupted run's)."""
    files = [src] if src.is_file() else sorted(p for p in src.iterdir() if p.is_file())
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
