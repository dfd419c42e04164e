"""What an installed copy holds: the packages, and the examples and site profiles as package data, so that
`python -m examples.shapes` and the bundled site profiles work outside the checkout."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.mpirun import REPO


def test_the_wheel_ships_examples_and_site_profiles(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = set(zipfile.ZipFile(next(tmp_path.glob("galapagos-*.whl"))).namelist())
    sites = {p.name for p in (REPO / "examples" / "sites").glob("*.toml")}
    assert {f"examples/sites/{s}" for s in sites} <= names and "examples/demo.toml" in names
    assert {"examples/shapes.py", "examples/custom_task.py", "galapagos/cli.py", "launch/placement.py"} <= names
    assert not any(n.startswith("tests/") for n in names)
