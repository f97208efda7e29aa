"""The layer kinds' tests import tests/nn/reference.py (the slow, obviously
right references) and share its tolerances."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
