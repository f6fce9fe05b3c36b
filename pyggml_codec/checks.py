"""Plain value checks shared by every layer (no ggml, no model): what counts as a whole number."""

from __future__ import annotations

import math

import numpy as np


def whole_number(value) -> int | None:
    """``value`` as an int where it is a whole number: an int or numpy integer, or a finite float with no
    fraction (2.0 is 2); None for anything else, a bool included (True is no count of anything)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and value == int(value):
        return int(value)
    return None
