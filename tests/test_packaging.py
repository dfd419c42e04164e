"""What an installed copy holds: one import name, `galapagos`, with the repository's folders under it (evolve/ as
galapagos.evolve, ...) and the examples and site profiles as package data, so that nothing a user has beside their
script (a `launch/`, `evolve/` or `examples/` of their own) can collide with Galapagos."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.mpirun import REPO

FOLDERS = {"evolve": "galapagos/evolve", "datashare": "galapagos/datashare", "ensemble": "galapagos/ensemble",
           "launch": "galapagos/launch", "examples": "galapagos/examples", "galapagos": "galapagos"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=300, cwd=out)
    assert proc.returncode == 0, proc.stderr
    return next(out.glob("galapagos_nas-*.whl"))


def test_the_wheel_has_one_top_level_name_and_every_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"galapagos"}
    tracked = subprocess.run(["git", "ls-files", *FOLDERS], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    for path in tracked:
        folder, _, rest = path.partition("/")
        if path.endswith(".py") or path.startswith("examples/") and path.endswith(".toml"):
            assert f"{FOLDERS[folder]}/{rest}" in names, f"{path} is not in the wheel"
    assert "galapagos/py.typed" in names and "galapagos/examples/sites/frontier.toml" in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Name: galapagos-nas" in meta and "Requires-Python: >=3.10" in meta


def test_a_user_s_own_folders_beside_their_script_change_nothing(wheel, tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / "work"
    for name in ("launch", "evolve", "examples", "datashare", "ensemble"):  # a user's own packages, broken on purpose
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name} was imported')\n")
    (work / "script.py").write_text(
        "import galapagos, galapagos.config, galapagos.flows.evolution, galapagos.launch.protocol\n"
        "from galapagos.examples import shapes\n"
        "print(galapagos.__version__, galapagos.launch.protocol.__file__, shapes.__file__)\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "script.py"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    version, protocol, shapes = proc.stdout.split()
    assert Path(protocol).is_relative_to(site) and Path(shapes).is_relative_to(site)
    cli = subprocess.run([sys.executable, "-m", "galapagos.cli", "--version"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and cli.stdout.strip() == f"galapagos {version}", cli.stderr


def test_the_api_functions_named_like_subpackages_are_both():
    """galapagos.evolve and galapagos.ensemble are the packages to import from and the API functions to call."""
    code = ("import galapagos, galapagos.evolve.genome, galapagos.ensemble.metrics\n"
            "from galapagos import evolve\n"
            "print(callable(galapagos.evolve), callable(galapagos.ensemble), evolve is galapagos.evolve,\n"
            "      galapagos.evolve.genome.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "True", "galapagos.evolve.genome"]
