"""Old import path of the MXFP4 decoding, now in ``arch/gpt_oss.py`` and ``base.py``.

Kept only while tests still import it from here; new code imports ``arch.gpt_oss``.
"""

from .arch.gpt_oss import mxfp4_to_f32
from .base import FP4_E2M1 as FP4_VALUES

__all__ = ["FP4_VALUES", "mxfp4_to_f32"]
