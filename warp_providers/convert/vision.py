"""What the image towers' converters share (``arch/kimi_k25.py``, ``arch/glm5_next.py``).

Owns :func:`preprocessor` (the checkpoint's ``preprocessor_config.json``, copied verbatim
into the manifest's ``vision`` object) and :class:`TowerTensors`, which appends a tower's
tensors as the container's ``v.*`` trunk tensors: each checked against the config when
planned (present, its stored shape), read and reshaped (or permuted) only when written.

Refuses, with a ``ConvertError`` naming the file or tensor: an unreadable preprocessor
config, a missing or misshapen tower tensor.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .base import TensorSource, computed
from .plan import SrcTensor
from .quant import ConvertError

__all__ = ["TowerTensors", "preprocessor"]


def preprocessor(src: Path, required: bool = True) -> dict[str, Any] | None:
    """The checkpoint's ``preprocessor_config.json`` as shipped (None when absent and not
    ``required``)."""
    p = src / "preprocessor_config.json"
    if not p.is_file():
        if not required:
            return None
        raise ConvertError(f"{src}: no preprocessor_config.json (an image model's pixel "
                           "normalisation and patch budget are read from it, never assumed)")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConvertError(f"{p}: unreadable JSON: {e}") from None
    if not isinstance(d, dict):
        raise ConvertError(f"{p}: not a JSON object")
    return d


def merge_and_grid(mk: Any, gh: int, gw: int, where: str) -> int:
    """The tower's spatial merge (one side of its square kernel) after checking it and the
    position grid (square too).

    Raises:
        ConvertError: naming ``where``.

    """
    if not (isinstance(mk, (list, tuple)) and len(mk) == 2 and mk[0] == mk[1]
            and isinstance(mk[0], int) and mk[0] > 0):
        raise ConvertError(
            f"{where}: merge_kernel_size {mk!r} must be two equal positive integers")
    if gh != gw:
        raise ConvertError(f"{where}: the position grid {gh} x {gw} must be square")
    return int(mk[0])


class TowerTensors:
    """A tower's ``v.*`` tensors of a plan, taken from a :class:`TensorSource`."""

    def __init__(self, s: TensorSource) -> None:
        self.s = s
        self.out: list[SrcTensor] = []

    def add(self, names: tuple[str, ...], cname: str, shape: tuple[int, ...],
            to: tuple[int, ...], kind: str, *, optional: bool = False,
            fn: Callable[[np.ndarray], np.ndarray] | None = None) -> bool:
        """Append the first stored of ``names`` (of ``shape``) as ``cname`` of shape ``to``
        (``fn`` maps the stored array first, else a reshape); False when ``optional`` and
        none is stored."""
        name = next((n for n in names if self.s.has(n)), None)
        if name is None:
            if optional:
                return False
            raise ConvertError(f"{self.s.dir}: tensor {names[0]!r} is missing")
        ent = self.s.entry(name)
        if tuple(ent.shape) != shape:
            raise ConvertError(f"tensor {name!r}: shape {list(ent.shape)}, config implies "
                               f"{list(shape)}")
        s = self.s

        def load() -> np.ndarray:
            a = s.f32(name, shape)
            return (fn(a) if fn is not None else a).reshape(to)

        self.out.append(computed(cname, load, to, kind=kind, nbytes=ent.nbytes))
        return True
