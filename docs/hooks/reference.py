"""MkDocs hook: the reference pages are generated from the code at build time, so they cannot drift from it.

A page holds a marker where generated text goes:
- `<!-- galapagos:config -->`: every table of the TOML config, from the tables themselves (galapagos.config.SECTIONS:
  each field's default, type, allowed values from `choices` and `checks()`, and the comment beside it in the source),
  and the complete default file.
- `<!-- galapagos:cli -->`: every subcommand's help, from the argparse parser (galapagos.parser.build_parser).
- `<!-- galapagos:api -->`: mkdocstrings blocks for the public surface, `galapagos.__all__`.
- `<!-- galapagos:results -->`: bench/RESULTS.md, whose history pages (bench/history/*.md) are added to the site.
Site pages (sites/NAME.md) get their profile (examples/sites/NAME.toml) appended.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import os
import re
import types
from pathlib import Path

import tomli_w

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- galapagos:(\w+) -->")


# -- the config tables ----------------------------------------------------------------------------------------------
def _comments(cls: type) -> tuple[dict[str, str], list[str]]:
    """The comment beside each field in the class's source, and what is said around the fields: comment lines right
    under a field continue its comment; a block of comment lines that leads into fields is a note on the table."""
    names = {f.name for f in dataclasses.fields(cls)}
    described: dict[str, str] = {}
    notes: list[str] = []
    block: list[str] = []
    last = None
    for line in inspect.getsource(cls).splitlines():
        field = re.match(r"    (\w+)\s*:[^=]*=.*?(?:  # (.*))?$", line)
        comment = re.match(r"    # ?(.*)$", line)
        if comment:
            block.append(comment.group(1))
            continue
        if field and field.group(1) in names:
            if block:
                notes.append(" ".join(block))
            last = field.group(1)
            if field.group(2):
                described[last] = field.group(2)
        elif block and last in described:
            described[last] += " " + " ".join(block)
        block = []
        if not field:
            last = None
    return described, notes


def _toml(value) -> str:
    """A value as it is written in the TOML file (lists on one line)."""
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).partition("=")[2].strip()


def _rst(text: str) -> str:
    """Docstring markup as Markdown: ``code`` and :role:`name` as `code`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    from galapagos.config import SECTIONS

    out = []
    for section, cls in SECTIONS.items():
        default = cls()
        described, notes = _comments(cls)
        expected = {key: text for key, _, text in default.checks()}
        out += [f"## [{section}]", "", _rst(inspect.cleandoc(cls.__doc__ or "")), "",
                "| key | default | allowed | what it does |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            value = getattr(default, f.name)
            allowed = [] if f.name in cls.choices else [_TYPES.get(type(value), type(value).__name__)]
            if f.name in cls.choices:
                many = "one or more of " if isinstance(value, tuple) else "one of "
                allowed.append(many + ", ".join(f"`{c}`" for c in cls.choices[f.name]))
            if expected.get(f.name):
                if re.match(r"an? ", expected[f.name]):  # it names the type itself
                    allowed = [a for a in allowed if a != _TYPES.get(type(value))]
                allowed.append(expected[f.name])
            out.append(f"| `{section}.{f.name}` | `{_cell(_toml(value))}` | "
                       f"{_cell('; '.join(allowed))} | {_cell(_rst(described.get(f.name, '')))} |")
        if notes:
            out += [""] + [f"*Note.* {_rst(n)}" for n in notes]
        out.append("")
    from galapagos.config import Config

    out += ["## Every default in one file", "",
            "Every table with its defaults, as a run's resolved `config.toml` lists them:", "",
            "```toml", *_default_file(Config.from_dict({}).to_dict()), "```", ""]
    return "\n".join(out)


def _default_file(tables: dict) -> list[str]:
    lines = []
    for section, values in tables.items():
        lines += [f"[{section}]"] + [f"{key} = {_toml(v)}" for key, v in values.items()] + [""]
    return lines[:-1]


_TYPES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list"}


# -- the command line -----------------------------------------------------------------------------------------------
def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand shown in the help, in the order the parser lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.help != argparse.SUPPRESS:
                    out.append((choice.dest, choice.help or "", action.choices[choice.dest]))
    return out


def cli_reference() -> str:
    from galapagos.parser import build_parser

    with _columns(90):
        root = build_parser()
        out = ["```text", root.format_help().strip(), "```", ""]
        for name, summary, parser in _subparsers(root):
            out += [f"## galapagos {name}", "", _cell(summary).capitalize() + ".", "", "```text",
                    parser.format_help().strip(), "```", ""]
            for sub, subsummary, subparser in _subparsers(parser):
                out += [f"### galapagos {name} {sub}", "", subsummary.capitalize() + ".", "", "```text",
                        subparser.format_help().strip(), "```", ""]
    return "\n".join(out)


@contextlib.contextmanager
def _columns(n: int):
    """argparse wraps help at $COLUMNS: a fixed width, so the page does not depend on the terminal it was built on."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(n)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


# -- the Python API -------------------------------------------------------------------------------------------------
def api_reference() -> str:
    """A mkdocstrings block per name of galapagos.__all__: functions first, then classes (result objects), then
    errors."""
    import galapagos

    groups: dict[str, list[str]] = {"Functions": [], "Result objects": [], "Errors": []}
    for name in galapagos.__all__:
        if name.startswith("_"):
            continue
        obj = getattr(galapagos, name)
        if isinstance(obj, types.ModuleType):  # galapagos.evolve and .ensemble: the subpackage that calls the function
            obj = getattr(__import__("galapagos.api", fromlist=[name]), name)
        target = f"{getattr(obj, '__module__', 'galapagos')}.{getattr(obj, '__qualname__', name)}"
        kind = ("Errors" if isinstance(obj, type) and issubclass(obj, BaseException)
                else "Result objects" if isinstance(obj, type) else "Functions")
        groups[kind].append(target)
    out = []
    for title, targets in groups.items():
        if targets:
            out += [f"## {title}", ""] + [f"::: {t}\n" for t in targets]
    return "\n".join(out)


# -- benchmarks -----------------------------------------------------------------------------------------------------
def results_page() -> str:
    """bench/RESULTS.md under the page's own title: its headings one level down."""
    text = (REPO / "bench" / "RESULTS.md").read_text()
    text = re.sub(r"^# .*\n", "", text, count=1)
    return text


GENERATORS = {"config": config_reference, "cli": cli_reference, "api": api_reference, "results": results_page}


# -- mkdocs events --------------------------------------------------------------------------------------------------
def on_files(files, config):
    """The benchmarks' history (bench/history/*.md) as pages beside the benchmarks page."""
    from mkdocs.structure.files import File

    for path in sorted((REPO / "bench" / "history").glob("*.md")):
        content = path.read_text().replace("](../RESULTS.md)", "](../index.md)")
        files.append(File.generated(config, f"benchmarks/history/{path.name}", content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    markdown = MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
    site = re.fullmatch(r"sites/([\w-]+)\.md", page.file.src_uri)
    if site:
        profile = REPO / "examples" / "sites" / f"{site.group(1)}.toml"
        markdown += (f"\n## The profile\n\n`examples/sites/{profile.name}`, installed with the package "
                     f"(copy it to add your account, modules and paths):\n\n```toml\n{profile.read_text()}```\n")
    return markdown
