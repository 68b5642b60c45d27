"""Small files written whole or not at all (sweep manifests, error records, the results ledger,
the results markdown), the check of a text file about to be updated, and the strict JSON text
that every `--json` prints."""

from __future__ import annotations

import json
import os
from pathlib import Path

from groklens.errors import BadInput, RunFailure


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


def check_text_target(path: Path) -> None:
    """A Markdown file a command will update: an existing writable text file, or a new one in
    a writable directory. Checked before the work whose result it will hold, not after."""
    path = Path(path)
    if path.exists():
        if not path.is_file():
            raise BadInput(f"{path} is not a regular file")
        try:
            text = path.read_bytes()
            text.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            raise BadInput(f"{path} is not a UTF-8 text file") from None
        if b"\0" in text:
            raise BadInput(f"{path} is not a text file (it holds NUL bytes)")
        if not os.access(path, os.W_OK):
            raise BadInput(f"cannot write {path} (permission denied)")
    elif not path.parent.is_dir():
        raise BadInput(f"cannot create {path}: directory {path.parent} does not exist")
    elif not os.access(path.parent, os.W_OK | os.X_OK):
        raise BadInput(f"cannot create {path}: directory {path.parent} is not writable")


def _finite(obj):
    if isinstance(obj, float) and obj != obj:
        return "nan"
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def strict_json(obj, **kwargs) -> str:
    """JSON that every parser reads: inf / nan (routing_width inf, a diverged loss) as strings."""
    return json.dumps(_finite(obj), allow_nan=False, **kwargs)
