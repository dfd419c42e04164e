"""The fingerprint of the data a run evolves on (RUN/data.json): what `--resume` compares, so that a run never
mixes evaluations made on two different files."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np

from galapagos.datashare.format import DatasetInfo

EDGE_BYTES = 1 << 20  # the data's content hash reads the first and the last MiB of the file,
BLOCKS, BLOCK_BYTES = 16, 64 << 10  # and 16 evenly spaced blocks of 64 KiB between them (cheap on a multi-TB file)
STRUCTURE = {"task": "task", "sample_shape": "sample shape", "x_dtype": "input dtype", "outputs": "classes/targets",
             "splits": "split sizes"}  # what a resumed run must find unchanged in its data, and how it is named


def data_fingerprint(info: DatasetInfo, path: str | Path) -> dict:
    """What a run is evolved on, for `--resume` to compare: the data as the run sees it (task, sample shape, input
    dtype, classes or targets, split sizes) and a sha256 over the file's HDF5 structure (dataset names, shapes,
    dtypes, root attributes), its size and a sample of its bytes (:func:`sample_ranges`). A rewritten or edited file
    changes the hash, except for an edit of a large file that misses every sampled block: the hash guards against
    the wrong file, it is no checksum."""
    path = Path(path).resolve()
    size = path.stat().st_size
    with h5py.File(path, "r") as f:
        datasets: dict[str, list] = {}
        f.visititems(lambda name, obj: datasets.update({name: [list(obj.shape), obj.dtype.str]})
                     if isinstance(obj, h5py.Dataset) else None)
        attrs = {k: np.asarray(v).tolist() for k, v in f.attrs.items()}
    digest = hashlib.sha256(json.dumps([datasets, attrs, size], sort_keys=True, default=str).encode())
    content = hashlib.sha256()
    with open(path, "rb") as f:
        for offset, length in sample_ranges(size):
            f.seek(offset)
            piece = f.read(length)
            digest.update(piece)
            content.update(piece)
    # What a changed file's message names: its datasets (shape, dtype), a hash of each root attribute, and the
    # sampled bytes alone (the sha256 covers them all together).
    return {"path": str(path), "size": size, "task": info.task, "sample_shape": list(info.sample_shape),
            "x_dtype": info.x_dtype, "outputs": info.num_targets, "splits": dict(info.splits),
            "sha256": digest.hexdigest(), "datasets": datasets,
            "attributes": {k: _short_hash(v) for k, v in attrs.items()}, "sampled_sha256": content.hexdigest()}


def _short_hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def what_changed(old: dict, new: dict) -> str:
    """How a file of the same structure as a run's data differs from it, in words, from what both fingerprints
    hold (one from before the datasets, attributes and sampled bytes were kept says less)."""
    found = []
    if old["size"] != new["size"]:
        found.append(f"its size ({old['size']:,} bytes, now {new['size']:,})")
    if "datasets" in old:
        names = sorted(set(old["datasets"]) | set(new["datasets"]))
        found += [f"dataset /{n} ({_shape(old['datasets'].get(n))}, now {_shape(new['datasets'].get(n))})"
                  for n in names if old["datasets"].get(n) != new["datasets"].get(n)]
        keys = sorted(set(old["attributes"]) | set(new["attributes"]))
        found += [f"root attribute {k}" for k in keys if old["attributes"].get(k) != new["attributes"].get(k)]
    if old.get("sampled_sha256", new["sampled_sha256"]) != new["sampled_sha256"]:
        found.append("its values (other bytes in the sampled blocks)")
    same = "" if old["size"] != new["size"] else f"the same size, {new['size']:,} bytes; "
    if found:
        return same + "what differs: " + ", ".join(found)
    return same + "its data.json is too old to say what differs"


def _shape(entry: list | None) -> str:
    return "absent" if entry is None else f"shape {tuple(entry[0])}, dtype {entry[1]}"


def sample_ranges(size: int) -> list[tuple[int, int]]:
    """The (offset, length) pieces of a file of `size` bytes that its content hash reads: a small file whole, a
    large one's first and last MiB and BLOCKS evenly spaced blocks between them."""
    if size <= 2 * EDGE_BYTES + BLOCKS * BLOCK_BYTES:
        return [(0, size)]
    step = (size - 2 * EDGE_BYTES - BLOCK_BYTES) // (BLOCKS - 1)
    return [(0, EDGE_BYTES), *((EDGE_BYTES + i * step, BLOCK_BYTES) for i in range(BLOCKS)),
            (size - EDGE_BYTES, EDGE_BYTES)]


def describe_data(fp: dict) -> str:
    """A fingerprint's structure in words: "classification, float32 samples (1, 16, 16), 6 classes, splits ..."."""
    outputs = f"{fp['outputs']} {'classes' if fp['task'] == 'classification' else 'targets'}"
    splits = ", ".join(f"{k} {v}" for k, v in fp["splits"].items())
    return f"{fp['task']}, {fp['x_dtype']} samples {tuple(fp['sample_shape'])}, {outputs}, splits {splits}"
