"""Old import path of the deepseek_v4 dequantizer, now in ``block_scaled.py``.

Kept only while tests still import it from here; new code imports ``block_scaled``.
"""

from .block_scaled import dequant_scaled

__all__ = ["dequant_scaled"]
