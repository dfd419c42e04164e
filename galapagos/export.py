"""`export`: a saved network, or an ensemble as one module that averages its members, as one file that plain torch
(or an ONNX runtime) runs without Galapagos installed.

The exported module computes what `predict` does: inputs (N, *sample_shape) float32 -> class probabilities (N, K)
for classification, outputs (N, T) for regression; N is free. Formats (https://docs.pytorch.org/docs/stable/):
- torchscript: `torch.jit.load(FILE)`;
- pt2: a torch.export program, `torch.export.load(FILE).module()`;
- onnx: the ONNX graph of the same program (needs the `onnx` and `onnxscript` packages to write it).
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from galapagos.datashare.rules import CLASS_TASKS
from galapagos.errors import UsageError
from galapagos.store.ensembledir import is_ensemble, load_manifest

FORMATS = ("torchscript", "pt2", "onnx")


class Probabilities(torch.nn.Module):
    """One classification network's logits as class probabilities, as `predict` reports them."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).float().softmax(1)


def exportable(model: str | Path) -> tuple[torch.nn.Module, tuple[int, ...], str]:
    """The module to export (eval mode, on the CPU), the per-sample input shape and the task."""
    from galapagos.models import load_ensemble, load_network

    if is_ensemble(model):
        problem = load_manifest(model).problem
        module: torch.nn.Module = load_ensemble(model)
    else:
        net, _, problem = load_network(model)
        module = Probabilities(net) if problem.task in CLASS_TASKS else net
    return module.eval(), problem.sample_shape, problem.task


def export(model: str | Path, out: str | Path, fmt: str = "torchscript") -> dict:
    """Write `model` (a run, a network directory or an ensemble directory) to `out` in `fmt`; returns what was
    written: the file, its format, its input and output shapes (None for the free batch size) and the task."""
    out = Path(out)
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if not out.absolute().parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.absolute().parent} does not exist")
    module, shape, task = exportable(model)
    example = torch.zeros((2, *shape))  # two samples: a batch of one would let BatchNorm-free traces fix N=1
    with torch.no_grad():
        outputs = list(module(example).shape[1:])  # (K,) or (T,); per pixel (K, *spatial) or (T, *spatial)
    batch = torch.export.Dim("batch", min=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and exporter advice about code that is not the user's
        if fmt == "torchscript":
            with torch.no_grad():
                torch.jit.trace(module, example).save(str(out))
        elif fmt == "pt2":
            torch.export.save(torch.export.export(module, (example,), dynamic_shapes=({0: batch},)), str(out))
        else:
            _onnx(module, example, batch, out)
    return {"model": str(model), "out": str(out), "format": fmt, "task": task, "input": [None, *shape],
            "output": [None, *outputs],
            "outputs": "probabilities" if task in CLASS_TASKS else "predictions"}


def _onnx(module: torch.nn.Module, example: torch.Tensor, batch, out: Path) -> None:
    try:
        import onnx  # noqa: F401 - torch.onnx needs both to write a file
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--format onnx needs the {exc.name} package: pip install onnx onnxscript (or "
                         "'galapagos-nas[onnx]'); torchscript and pt2 need nothing more") from None
    quiet = {name: logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")}
    levels = {name: lg.level for name, lg in quiet.items()}
    for lg in quiet.values():  # the exporter's optimisation passes log at INFO; they are not the user's business
        lg.setLevel(logging.ERROR)
    try:
        program = torch.onnx.export(module, (example,), input_names=["x"], output_names=["y"],
                                    dynamic_shapes=({0: batch},), dynamo=True, verbose=False)
        program.save(str(out))
    finally:
        for name, lg in quiet.items():
            lg.setLevel(levels[name])
