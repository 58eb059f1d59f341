"""The simulated-vs-measured tables of docs/explanation/fidelity.md are what `make fidelity`
produces today (when the shared measured data is on this machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "measured" / "distserve_opt13b" / "measured"


@pytest.mark.skipif(not DATA.is_dir(), reason="shared measured data not present")
def test_fidelity_tables_are_current():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fidelity.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
