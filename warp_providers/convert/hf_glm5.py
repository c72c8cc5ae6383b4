"""Old import path of ``arch/glm5_next.py``'s config readers, under their old names.

Kept only while tests still import it from here; new code imports ``arch.glm5_next``
(``text_config``, ``schedules``).
"""

from .arch.glm5_next import schedules as _schedules
from .arch.glm5_next import text_config as _text_config

__all__ = ["_schedules", "_text_config"]
