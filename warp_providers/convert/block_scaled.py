"""FP8 / FP4 matrices with a sibling ``<name>.scale`` block grid, as DeepSeek releases ship.

Owns the exact dequantization of FP8 e4m3 (``F8_E4M3``) and packed FP4 e2m1 (``I8``, two
values per byte, low nibble first) matrices times a grid of power-of-two exponents
(``F8_E8M0``/``U8``: 2^(b - 127)) or float scales, the block size following from the
grid's shape; and :class:`ScaledSource`, a :class:`~.base.TensorSource` that reads such a
matrix wherever its ``.scale`` sibling is stored. Transformers' ``*_scale_inv`` form is
``base.py``'s. Refuses a grid that does not tile its matrix. Used by ``arch/deepseek_v4.py``.
"""

from __future__ import annotations

import numpy as np

from .base import FP4_E2M1, TensorSource, computed, fp8_e4m3_to_f32, to_f32
from .plan import SrcTensor
from .quant import ConvertError

__all__ = ["ScaledSource", "dequant_scaled"]


def _scale_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in ("F8_E8M0", "U8"):
        return np.ldexp(np.float32(1.0), np.asarray(raw, dtype=np.int32) - 127).astype(np.float32)
    return to_f32(raw, dtype)


def dequant_scaled(w: np.ndarray, w_dtype: str, scale: np.ndarray, s_dtype: str) -> np.ndarray:
    """Return the f32 of an FP8 (``F8_E4M3``) or packed FP4 (``I8``) matrix times its grid.

    The block-scale grid is ``[rows / bm, cols / bn]``; the block follows from its shape.
    """
    if w_dtype == "I8":
        u = np.asarray(w).view(np.uint8)
        q = np.empty((*u.shape[:-1], 2 * u.shape[-1]), dtype=np.float32)
        q[..., 0::2] = FP4_E2M1[u & 0x0F]
        q[..., 1::2] = FP4_E2M1[u >> 4]
    else:
        q = fp8_e4m3_to_f32(w)
    s = _scale_f32(scale, s_dtype)
    rows, cols = q.shape
    if s.ndim != 2 or rows % s.shape[0] or cols % s.shape[1]:
        raise ConvertError(f"scale grid {list(s.shape)} does not tile a [{rows}, {cols}] matrix")
    bm, bn = rows // s.shape[0], cols // s.shape[1]
    return (q.reshape(s.shape[0], bm, s.shape[1], bn) * s[:, None, :, None]).reshape(rows, cols)


class ScaledSource(TensorSource):
    """The common source, plus the release's ``<name>.scale`` FP8 / FP4 matrices."""

    def scale_of(self, name: str) -> str | None:
        """Return the ``.scale`` grid of stored ``name``, if it has one."""
        ent = self.st.entries[name]
        if ent.dtype not in ("F8_E4M3", "I8") or not name.endswith(".weight"):
            return None
        sname = name[: -len(".weight")] + ".scale"
        return sname if sname in self.st.entries else None

    def tensor(self, name: str, cname: str, kind: str, want: tuple[int, ...]) -> SrcTensor:
        """Return a scaled matrix dequantized, anything else as the common source reads it."""
        ent = self.entry(name)
        name = self.stored(name)
        sname = self.scale_of(name)
        if sname is None:
            return super().tensor(name, cname, kind, want)
        sent = self.st.entries[sname]
        packed = (want[0], want[1] // 2) if ent.dtype == "I8" else want
        if len(want) != 2 or ent.shape != packed:
            fp4 = " (two FP4 values per byte)" if ent.dtype == "I8" else ""
            raise ConvertError(f"tensor {name!r}: {ent.dtype} {list(ent.shape)}, config "
                               f"implies {list(want)}{fp4}")
        self.used_scales.add(sname)
        st = self.st
        return computed(cname, lambda: dequant_scaled(st.raw(name), ent.dtype,
                                                      st.raw(sname), sent.dtype),
                        want, kind, ent.nbytes)
