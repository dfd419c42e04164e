"""The command line the bundled dataset generators share:
`python -m galapagos.examples.NAME --out FILE [options] [--seed S]`,
which writes the file and prints one line saying what it holds."""
from __future__ import annotations

import argparse
import time
from typing import Callable

from galapagos.datashare.format import DatasetInfo


def generator_main(argv: list[str] | None, name: str, doc: str, generate: Callable[..., DatasetInfo],
                   options: dict[str, tuple[type, object, str]], what: Callable[[DatasetInfo], str]) -> None:
    """Parse `--out`, each of `options` ({option: (type, default, help)}, passed to `generate` by name) and
    `--seed`; write the file; print "wrote PATH: <what(info)>; <split sizes> (<seconds> s)"."""
    parser = argparse.ArgumentParser(prog=f"python -m galapagos.examples.{name}", description=doc.splitlines()[0])
    parser.add_argument("--out", required=True, help="output HDF5 file")
    for option, (kind, default, text) in options.items():
        parser.add_argument(f"--{option}", type=kind, default=default, help=f"{text} (default {default})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = vars(parser.parse_args(argv))
    t0 = time.perf_counter()
    info = generate(args.pop("out"), **args)
    sizes = ", ".join(f"{k} {v}" for k, v in info.splits.items())
    print(f"wrote {info.path}: {what(info)}; {sizes} ({time.perf_counter() - t0:.1f} s)")
