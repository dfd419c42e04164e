"""The test session's devices: every process the tests start runs on the CPU, unless a test is about GPUs.

On a GPU machine each MPI rank and trainer child that the placement gives a GPU starts a CUDA (ROCm, Level Zero)
runtime of its own: seconds per process for tiny networks that a CPU trains as fast. So the session hides the GPUs
from the placement (launch.placement reads these variables; an empty list leaves no GPU) and from torch, in this
process and every process it starts, which then train, predict and compare numbers as on a CPU-only machine. The
tests marked `gpu` (tests/test_gpu.py) take the `gpu_env` fixture: the variables as they were, for the processes
they start, and they skip where there is no GPU.

GALAPAGOS_TEST_GPUS=1 leaves the GPUs visible to the whole suite (slower; float32 tolerances where the numbers came
from a GPU, tests/test_ensemble_predict.py), with TF32 off so that float32 convolutions and matrix products keep
float32 precision: PyTorch enables TF32 for cuDNN convolutions by default
(https://docs.pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices), and
NVIDIA_TF32_OVERRIDE=0 turns it off in every NVIDIA library of every process
(https://docs.nvidia.com/cuda/cublas/index.html#cublas-environment-variables-for-tf32).
"""
from __future__ import annotations

import os
import sys
import tempfile

import pytest

# The variables that choose a process's GPUs: NVIDIA (and ROCm's fallback), AMD, Intel (launch/placement.py).
VISIBILITY = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
ORIGINAL = {k: os.environ.get(k) for k in VISIBILITY}
ALL_ON_GPUS = os.environ.get("GALAPAGOS_TEST_GPUS", "") == "1"

# PYTHONDONTWRITEBYTECODE with packages installed without their bytecode (torch in a GPU container image): every
# process a test starts would compile torch's sources again, 2.4 s to import it where 1.2 s read the bytecode on
# the H200 machine (bench/RESULTS.md, The test suite on a GPU machine). The session's processes write theirs to a
# cache of their own instead (https://docs.python.org/3/using/cmdline.html#envvar-PYTHONPYCACHEPREFIX), leaving the
# installed packages as they are; a PYTHONPYCACHEPREFIX already set is kept.
if sys.flags.dont_write_bytecode and not os.environ.get("PYTHONPYCACHEPREFIX"):
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    prefix = os.path.join(tempfile.gettempdir(), f"galapagos-pycache-{os.getuid()}")
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False

if ALL_ON_GPUS:
    os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
else:  # before anything in this process starts a GPU runtime: they read these once, at their start
    os.environ.update({k: "" for k in VISIBILITY})


def original_env() -> dict[str, str]:
    """This process's environment with the GPU variables as they were before the session hid them."""
    env = dict(os.environ)
    for k, v in ORIGINAL.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


@pytest.fixture
def gpu_env() -> dict[str, str]:
    """The environment for a process that should use this machine's GPUs; skips where there is none."""
    from galapagos.launch.placement import read_topology

    env = original_env()
    topology = read_topology(env=env)
    if not topology.gpus:
        pytest.skip("no GPU on this machine (launch.placement finds none)")
    import torch

    backend = torch.backends.cuda if topology.kind == "cuda" else None
    if backend is not None and not backend.is_built():
        pytest.skip(f"this torch ({torch.__version__}) was built without CUDA/ROCm")
    return env


# pytest-xdist (`make test` on a machine of 8 cores or more, `pytest -n N --dist loadfile`): each test process gets
# its own slice of the cores, which every process it starts inherits and shares out as a job would
# (launch.placement reads the affinity), so that N tests at once do not each place their ranks on the whole machine.
# A slice under MIN_TEST_CORES cores is not made: a test starts up to 4 ranks, and MPICH's ranks slow to a crawl
# when they outnumber their cores (bench/RESULTS.md, Datashare); such processes share the machine's cores.
MIN_TEST_CORES = 4


def worker_cores(cores: list[int], index: int, count: int) -> list[int] | None:
    """Test process `index` of `count`'s contiguous share of `cores`, or None where a share would be too small."""
    if count < 2 or len(cores) // count < MIN_TEST_CORES:
        return None
    return cores[index * len(cores) // count:(index + 1) * len(cores) // count]


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...: set by pytest-xdist in its test processes
    if worker and hasattr(os, "sched_setaffinity"):
        share = worker_cores(sorted(os.sched_getaffinity(0)), int(worker[2:]),
                             int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
        if share:
            os.sched_setaffinity(0, share)
