"""Where the tutorial notebooks are: the repository's notebooks/ folder."""

from pathlib import Path

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
