"""Writing the files a run leaves so that a reader never sees half of one: write beside it, then rename."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def replace_atomically(path: str | Path, write: Callable[[Path], Any]) -> None:
    """`write(tmp)` writes the new content to a temporary file beside `path`, which then replaces `path`.

    A failed write (a full disk, an exception) leaves `path` as it was and no temporary file behind.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    replace_atomically(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n"))
