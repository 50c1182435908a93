"""The words a rank and the notebook both use for a reported value: a rank says them on its stderr the moment a
value it reports becomes NaN or inf (``rank/report.py``), the notebook under its live chart (``notebook/models/
history.py``)."""

import math


def nonfinite_message(name, value, step):
    """``loss became NaN at step 212`` (the words the notebook uses too)."""
    word = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return f"{name} became {word} at step {step}"
