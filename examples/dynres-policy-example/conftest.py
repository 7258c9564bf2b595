"""Lets the dynres workspace run these tests without installing the example first.

An author's project would instead ``pip install -e .[test]``; this file is not part of the wheel.
"""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("dynres_policy_example") is None:
    sys.path.insert(0, str(Path(__file__).parent / "src"))
