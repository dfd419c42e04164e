"""The layering rules of ARCHITECTURE.md, checked on the code: one installed namespace, which package may import
which, no import circle, mpi4py in one place, the lower packages free of MPI, and modules and functions of a
readable size."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.mpirun import REPO

# The repository's folders and the names they install under (setup.cfg's package_dir).
FOLDERS = {"galapagos": "galapagos", "launch": "galapagos.launch", "ensemble": "galapagos.ensemble",
           "evolve": "galapagos.evolve", "datashare": "galapagos.datashare"}
LOWER = ("launch", "ensemble", "evolve", "datashare")
# What each package may import (besides itself); ARCHITECTURE.md draws the same picture. "galapagos" is the
# application (galapagos/ without the lower packages).
ALLOWED = {
    "galapagos": {"launch", "ensemble", "evolve", "datashare"},
    "launch": {"evolve", "datashare"},
    "ensemble": {"evolve", "datashare"},
    "evolve": {"datashare"},
    "datashare": set(),
}
MAX_LINES = 430
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, Path]:
    out = {}
    for folder, installed in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            out[".".join([installed, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = path
    return out


def package(name: str) -> str:
    """The layer a module belongs to: one of the lower packages, or the application."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LOWER else "galapagos"


def imports(name: str, path: Path) -> set[str]:
    """Every project module `name` imports, at the top or inside a function (lazy imports count too)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package
                base = name.split(".")[:len(name.split(".")) - node.level + is_package]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            subs = {f"{target}.{a.name}" for a in node.names} & set(modules())
            found |= subs if len(subs) == len(node.names) else subs | {target}  # names from the module itself
    known = modules()
    # every module's import runs the top package's __init__ first: that edge is implicit, not a layering choice
    return {m for m in found if m in known and m != name and m != "galapagos"}


def test_one_namespace_no_bare_imports_of_the_folders():
    """Code imports the installed names (galapagos.evolve, ...), never the repository's folders as top-level
    packages, which a user's own evolve/ or launch/ would shadow."""
    bare = re.compile(r"^\s*(from|import)\s+(evolve|datashare|ensemble|launch|examples)\b", re.M)
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    offenders = [f for f in tracked if bare.search((REPO / f).read_text())]
    assert not offenders, f"bare imports of the repository's folders in {offenders}"


def test_packages_import_only_downwards():
    for name, path in modules().items():
        own = package(name)
        for target in imports(name, path):
            other = package(target)
            assert other == own or other in ALLOWED[own], f"{name} imports {target}"


def test_no_import_circle():
    graph = {name: imports(name, path) for name, path in modules().items()}
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_mpi4py_is_imported_in_one_place():
    users = [name for name, path in modules().items() if "mpi4py" in {n.split(".")[0] for n in _all_imports(path)}]
    assert users == ["galapagos.launch.mpi"]


def _all_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module)
    return out


def test_lower_packages_load_no_mpi_launch_or_galapagos():
    """Importing every module of evolve, datashare and ensemble loads neither mpi4py nor launch nor any module of
    the application (only the top package's __init__, which every import of galapagos.* runs)."""
    lower = [name for name in modules() if package(name) in ("evolve", "datashare", "ensemble")]
    code = ("import importlib, json, sys\n"
            f"for name in {lower!r}: importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert {"galapagos.evolve", "galapagos.datashare", "galapagos.ensemble", "torch"} <= loaded
    assert "mpi4py" not in loaded
    assert not {m for m in loaded if m.startswith("galapagos") and package(m) not in ("evolve", "datashare",
                                                                                      "ensemble") and m != "galapagos"}


def test_import_galapagos_gives_the_api_without_mpi_or_torch():
    code = ("import json, sys, galapagos\n"
            "api = [n for n in ('evolve', 'design', 'ensemble', 'predict', 'load', 'report') "
            "if callable(getattr(galapagos, n))]\n"
            "print(json.dumps([api, sorted({m.split('.')[0] for m in sys.modules})]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    api, loaded = json.loads(proc.stdout)
    assert api == ["evolve", "design", "ensemble", "predict", "load", "report"]
    assert not set(loaded) & {"mpi4py", "torch"}


def test_what_a_worker_rank_runs_and_unpickles_loads_no_torch():
    """A worker rank relays tasks to its trainer child: its modules and a task's payload (evolve.task) import no
    torch, which only the child needs (tests/test_api.py checks it on real ranks)."""
    code = ("import pickle, sys, galapagos.flows.ranks, galapagos.api, galapagos.flows.mpijob, galapagos.launch.session, galapagos.evolve.task\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_the_checks_before_a_run_and_the_master_s_genomes_load_no_torch(tmp_path):
    """The starting command checks config, data and run directory, and rank 0 checks and counts every genome it
    sends (evolve/check.py: shape arithmetic), without torch; only the trainer children import it."""
    code = f"""import sys
import numpy as np
from galapagos.datashare.write import write_dataset
from galapagos.evolve.check import count_params
from galapagos.evolve.engine import Engine
from galapagos.evolve.problem import Problem
from galapagos.api import FLOWS
from galapagos.options import EvolveOptions
rng = np.random.default_rng(0)
write_dataset("{tmp_path}/d.h5", {{s: (rng.normal(size=(n, 1, 16, 16)).astype(np.float32), rng.integers(0, 3, n))
                                  for s, n in (("train", 64), ("val", 16))}}, task="classification", num_classes=3)
config, info, _ = FLOWS["evolve"].load().check(EvolveOptions("{tmp_path}/d.h5", "{tmp_path}/run", evaluations=4,
                                                                workers=2))
problem = Problem.of_dataset(info)
engine = Engine(config.space, problem, config.evolution)
assert all(count_params(engine.ask().genome, problem) > 0 for _ in range(20))
print('torch' in sys.modules)"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_modules_stay_readable():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_functions_stay_readable():
    """No function over about 80 lines, argument parsers (which list options, one per line) aside."""
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "parser" not in node.name:
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


RUN_FILES = {"results.jsonl", "summary.json", "config.toml", "plan.json", "pareto.json", "report.json", "clock.json",
             "data.json", "ensemble.json", ".lock"}
RUN_FOLDERS = {"best", "models", "members", "front", "log", "ensemble", "tensorboard", "job"}


def test_only_the_store_builds_paths_inside_run_and_ensemble_directories():
    """galapagos/store owns every run and ensemble directory format: no other module names one of their files, or
    joins one of their folders onto a path (`x / "best"`)."""
    found = []
    for name, path in modules().items():
        if name.startswith(("galapagos.store.", "galapagos.launch.scripts.")):  # the latter owns a job's folder, job/
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RUN_FILES:
                found.append(f"{name}:{node.lineno} {node.value!r}")
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
                  and node.right.value in RUN_FOLDERS):
                found.append(f"{name}:{node.lineno} / {node.right.value!r}")
    assert not found, f"paths inside a run or ensemble directory built outside galapagos/store: {found}"
