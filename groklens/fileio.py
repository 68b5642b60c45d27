"""Small files written whole or not at all (sweep manifests, error records, the results ledger,
the results markdown)."""

from __future__ import annotations

import os
from pathlib import Path

from groklens.errors import RunFailure


def write_text_atomic(path: Path, text: str) -> Path:
    """Replace `path` by `text` whole or not at all: a full disk or a kill leaves the old file
    (and no temporary), and the failure is one line naming the file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RunFailure(f"writing {path} failed ({exc.strerror or exc}); the file is as it was") from None
    return path
