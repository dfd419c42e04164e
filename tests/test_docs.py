"""The documentation: the site builds with warnings as errors, every relative link resolves, the README stays a short
front door, and its examples run as written on a fresh folder."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from galapagos.examples import shapes

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = sorted(p for p in (REPO / "docs").rglob("*.md"))
LINKED = [README, *PAGES, REPO / "bench" / "RESULTS.md", *sorted((REPO / "bench" / "history").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FIRST_SCREEN = 60  # lines: set-up, the main job and the API must be there


@functools.cache
def hooks():
    """docs/hooks/reference.py, the generator the site's build runs."""
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose(text: str) -> str:
    """Markdown without its fenced code blocks and inline code, where a bracket is not a link."""
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """A heading's anchor as the site's toc extension (Python-Markdown's slugify) and GitHub make it."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, those of the text the site's build generates into it included."""
    generated = hooks()
    text = generated.MARKER.sub(lambda m: generated.GENERATORS[m.group(1)](), page.read_text())
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", text)
    return {slug(h) for h in re.findall(r"(?m)^#{1,6}\s+(.+?)\s*#*$", text)}


def blocks(text: str, lang: str = "") -> list[str]:
    return re.findall(rf"(?ms)^```{lang}\n(.*?)^```", text)


def clean_env() -> dict:
    """Outside any MPI job (no launcher variables), with this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


# -- the site -------------------------------------------------------------------------------------------------------
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """mkdocs --strict: every page in the nav, every link and anchor between pages, the generated references and
    the API pages from the docstrings, without a warning."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(site)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**clean_env(), "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = (site / "configuration" / "index.html").read_text()
    from galapagos.config import SECTIONS

    missing = [f"{s}.{f}" for s, table in SECTIONS.items() for f in table.__dataclass_fields__
               if f"{s}.{f}" not in config]
    assert not missing, f"keys missing from the configuration page: {missing}"
    cli = (site / "cli" / "index.html").read_text()
    assert all(f"galapagos {name}" in cli for name, _, _ in hooks()._subparsers(_parser()))
    import galapagos

    api = (site / "api" / "index.html").read_text()
    assert all(name in api for name in galapagos.__all__ if not name.startswith("_")), "a public name without its page"
    assert (site / "benchmarks" / "history" / "search" / "index.html").exists()


def _parser():
    from galapagos.parser import build_parser

    return build_parser()


def test_the_configuration_reference_is_generated_from_the_tables():
    """Every key of every table, its default as the table has it, and the comment beside it in the source."""
    from galapagos.config import SECTIONS

    text = hooks().config_reference()
    for section, table in SECTIONS.items():
        default = table()
        for name in table.__dataclass_fields__:
            row = next((line for line in text.splitlines() if line.startswith(f"| `{section}.{name}` |")), None)
            assert row is not None, f"{section}.{name}"
            assert f"`{hooks()._toml(getattr(default, name))}`".replace("|", "\\|") in row, row
    assert "epochs of a child that inherited at least half its parameters" in text  # a comment beside a field
    assert "[run]\nevaluations = 0" in text  # the whole default file


def test_the_cli_reference_follows_the_parser():
    """Every subcommand the help lists, with its usage line, and none that the help hides."""
    text = hooks().cli_reference()
    parser = _parser()
    names = [name for name, _, _ in hooks()._subparsers(parser)]
    assert {"evolve", "design", "ensemble", "predict", "launch"} <= set(names)
    for name in names:
        assert f"## galapagos {name}\n" in text and f"usage: galapagos {name}" in text


def test_every_command_in_the_docs_parses():
    """Each complete `galapagos ...` line of the README's and the docs' code blocks is one the parser takes (lines
    with placeholders such as [--x], a|b or ... are left out)."""
    parser, wrong, checked = _parser(), [], 0
    for page in [README, *PAGES]:
        for block in re.findall(r"(?ms)^\s*```[a-z]*\n(.*?)^\s*```", page.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                argv = shlex.split(line, comments=True) if "'" not in line or line.count("'") % 2 == 0 else []
                placeholders = re.search(r"[\[|<]|\.\.\.", line)
                if argv[:1] != ["galapagos"] or len(argv) < 2 or argv[1].endswith(":") or placeholders:
                    continue  # not a command (an error message: "galapagos evolve: ..."), or one with placeholders
                checked += 1
                with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
                    try:
                        parser.parse_args(argv[1:])
                    except SystemExit as exc:
                        if exc.code:
                            wrong.append(f"{page.relative_to(REPO)}: {line.strip()}: {err.getvalue().strip()}")
    assert checked >= 20 and not wrong, "\n".join(wrong)


# -- links ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    """Links from the README, the docs and the benchmark results go to a file that exists, and to a heading of it."""
    broken = []
    for match in LINK.finditer(prose(page.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


# -- the README -----------------------------------------------------------------------------------------------------
def test_the_readme_is_a_short_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail into docs/"
    first = "\n".join(lines[:FIRST_SCREEN])
    for what in ("make demo", "make test", "pip install", "galapagos evolve", "import galapagos"):
        assert what in first, f"{what!r} is not on the README's first screen"
    for job in ("design", "evolve", "ensemble", "predict", "launch"):
        assert f"galapagos {job} " in README.read_text()


@pytest.mark.mpi
def test_the_readme_s_first_commands_run_on_a_fresh_folder(tmp_path):
    """The first block with `galapagos evolve`, line by line in an empty folder, with a small budget and dataset:
    its --out's parent does not exist yet."""
    block = next(b for b in blocks(README.read_text()) if "galapagos evolve" in b)
    for line in block.splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        if argv[0] == "galapagos":
            argv = [sys.executable, "-m", "galapagos.cli", *argv[1:]]
        elif argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        if "galapagos.examples.shapes" in argv:
            argv += ["--samples", "600", "--size", "12"]
        if "--budget-minutes" in argv:  # a few short evaluations instead of minutes
            i = argv.index("--budget-minutes")
            argv[i:i + 2] = ["--evaluations", "3", "--set", "train.epochs=1", "--set", "space.max_layers=4",
                             "--set", "space.channels=[4, 8]"]
        proc = subprocess.run(argv, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "runs" / "first" / "best" / "model.pt").exists()


@pytest.mark.mpi
def test_the_readme_s_api_example_runs_as_written(tmp_path):
    """The README's Python block, as written, in an empty folder beside a small shapes.h5."""
    code = next(b for b in blocks(README.read_text(), "python") if "import galapagos" in b)
    shapes.generate(tmp_path / "shapes.h5", samples=600, size=12, seed=1)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True,
                          text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "runs" / "api.html").exists()
    assert (tmp_path / "runs" / "api-ens" / "ensemble.json").exists()
    assert proc.stdout.strip(), "the example prints the best network's fitness and parameters"
