"""Files written whole or not at all, and files read through one validator each.

Writing: `write_text_atomic` (sweep manifests, error records, the results ledger, the results
markdown) and `staged_outputs` (a command's output files: report, scaling-law, reproduce) write
into a temporary name of this process and rename it into place, so a full disk or a kill leaves
the old file; a link in the way is replaced, never written through; a directory in the way is
refused; temporaries left by killed writers are removed by the next writer. `check_writable_dir`
refuses a read-only or unwritable location before any work (one line, exit 2).

Reading: `load_json_file` is the one parser of the small JSON files groklens keeps (ledgers,
sweep manifests, error records): size, nesting depth and duplicate keys are checked before the
document is built, and every failure is one BadInput naming the file. The strict JSON text that
every `--json` prints is `strict_json`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from groklens.errors import BadInput, RunFailure

JSON_MAX_BYTES = 64 << 20  # a ledger of thousands of runs is a few MiB
JSON_MAX_DEPTH = 32  # our files are four or five levels deep


# ---------------------------------------------------------------------- processes and temporaries
def pid_alive(pid: int) -> bool:
    """True when process `pid` exists (also when it is another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0
    return True


def stale_temporaries(directory: Path, prefix: str, suffix: str = "") -> list[Path]:
    """Entries DIRECTORY/PREFIX<pid>... [SUFFIX] whose writer process <pid> is gone."""
    out = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return []
    for p in entries:
        name = p.name
        if not name.startswith(prefix) or not name.endswith(suffix):
            continue
        digits = ""
        for ch in name[len(prefix):]:
            if not ch.isdigit():
                break
            digits += ch
        if digits and not pid_alive(int(digits)):
            out.append(p)
    return sorted(out)


def remove_quietly(path: Path) -> None:
    """Remove a file, link or directory tree of ours; a failure (read-only place) is ignored."""
    with suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.tmp"


# ---------------------------------------------------------------------- writing
def check_writable_dir(directory: Path, what: str = "write into") -> None:
    """BadInput (before any work) when this process cannot create files in `directory`: a
    read-only file system, an immutable directory or missing permission."""
    directory = Path(directory)
    if os.access(directory, os.W_OK | os.X_OK):
        return
    why = "permission denied"
    with suppress(OSError):
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            why = "read-only file system"
    raise BadInput(f"cannot {what} {directory} ({why})")


def check_output_file(path: Path) -> None:
    """An output file name: a directory there is refused; a link or regular file is replaced."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise BadInput(f"{path} is a directory; a file is written there")
    if path.exists() and not path.is_symlink() and not path.is_file():
        raise BadInput(f"{path} is not a regular file (a device or pipe?); nothing is written over it")


def _failure(path: Path, exc: OSError, tail: str) -> RunFailure:
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        why = "no room left on the disk or under the file-size limit"
    else:
        why = exc.strerror or str(exc)
    return RunFailure(f"writing {path} failed ({why}); {tail}")


def write_text_atomic(path: Path, text: str) -> Path:
    """Replace `path` by `text` whole or not at all: a full disk or a kill leaves the old file
    (and no temporary: a killed writer's is removed by the next), a link at `path` is replaced
    (never written through), and the failure is one line naming the file."""
    path = Path(path)
    check_output_file(path)
    for stale in stale_temporaries(path.parent, _tmp_prefix(path)):
        remove_quietly(stale)
    tmp = path.with_name(f"{_tmp_prefix(path)}{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        remove_quietly(tmp)
        raise _failure(path, exc, "the file is as it was") from None
    return path


STAGE_MARK = ".stage-"


@contextmanager
def staged_outputs(out: Path) -> Iterator[Path]:
    """A temporary directory beside (or inside) `out` that receives a command's output files; on
    success its files are moved into `out` (a link in the way is replaced, never written through),
    on any failure it is removed and `out` is as it was. Staging directories of killed commands
    are removed first."""
    out = Path(out)
    parent = out if out.is_dir() else out.parent
    prefix = f".{out.name or 'out'}{STAGE_MARK}"
    for stale in stale_temporaries(parent, prefix):
        remove_quietly(stale)
    check_writable_dir(parent)
    stage = parent / f"{prefix}{os.getpid()}"
    remove_quietly(stage)  # a leftover of this very pid (reused after a reboot)
    try:
        os.mkdir(stage, 0o777)  # the umask applies: the report directory's mode when renamed to it
    except OSError as exc:
        raise _failure(stage, exc, "nothing was written") from None
    try:
        yield stage
        for item in sorted(stage.iterdir()):
            check_output_file(out / item.name)
        if not out.exists():
            os.rename(stage, out)  # the whole directory appears at once
            return
        for item in sorted(stage.iterdir()):
            os.replace(item, out / item.name)
    except OSError as exc:
        raise _failure(out, exc, "nothing was written there") from None
    finally:
        remove_quietly(stage)


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
        check_writable_dir(path.parent)
    elif not path.parent.is_dir():
        raise BadInput(f"cannot create {path}: directory {path.parent} does not exist")
    else:
        check_writable_dir(path.parent, f"create {path.name} in")


# ---------------------------------------------------------------------- reading
def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


class _Duplicate(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def json_depth(text: str) -> int:
    """The deepest nesting of [ and { in a JSON text (strings skipped), without parsing it."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json(text: str, what: str, max_depth: int = JSON_MAX_DEPTH, allow_nan: bool = False) -> Any:
    """JSON `text` with duplicate keys, nesting deeper than `max_depth` and (unless `allow_nan`)
    NaN / Infinity refused (BadInput naming `what`)."""
    if json_depth(text) > max_depth:
        raise BadInput(f"{what} is nested deeper than {max_depth} levels")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates,
                          **({} if allow_nan else {"parse_constant": _no_constant}))
    except _Duplicate as exc:
        raise BadInput(f"{what} holds the key {exc.key!r} twice") from None
    except (ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(f"{what} is not valid JSON ({first})") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def load_json_file(path: Path, what: str, max_bytes: int = JSON_MAX_BYTES, max_depth: int = JSON_MAX_DEPTH,
                   allow_nan: bool = False) -> Any:
    """The JSON document in `path` (a regular UTF-8 file of at most `max_bytes`), or BadInput."""
    path = Path(path)
    try:
        if not path.is_file():
            raise BadInput(f"{path}: {what} is not a regular file")
        size = path.stat().st_size
        if size > max_bytes:
            raise BadInput(f"{path}: {what} is {size >> 20} MiB, over the {max_bytes >> 20} MiB a {what} may have")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: {what} is not UTF-8 text") from None
    except OSError as exc:
        raise BadInput(f"{path}: {what} is unreadable ({exc.strerror or exc})") from None
    return parse_json(text, f"{path}: {what}", max_depth, allow_nan)


# ---------------------------------------------------------------------- names and JSON output
def check_utf8_args(args: list[str]) -> None:
    """BadInput for a command-line argument that is not valid UTF-8 (a file name in another
    encoding): groklens stores and draws names as text, so such a name is refused up front."""
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise BadInput(f"{shown!r} is not valid UTF-8 (a file name in another encoding?); rename it") from None


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
