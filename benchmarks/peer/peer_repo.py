"""Reading a peer's repository: a checkout, or the git directory that `fetch` gives (read with
`git show`). Shared by the peer scripts in this folder."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(repo: Path) -> list[str]:
    return ["git", f"--git-dir={repo}"] if (repo / "HEAD").is_file() else ["git", "-C", str(repo)]


def read(repo: Path, name: str, binary: bool = False):
    """A file of the repository's HEAD (text, or bytes with `binary`); SystemExit when it is absent."""
    if (repo / name).is_file():
        return (repo / name).read_bytes() if binary else (repo / name).read_text()
    out = subprocess.run([*_git(repo), "show", f"HEAD:{name}"], capture_output=True, text=not binary)
    if out.returncode:
        raise SystemExit(f"{name} not found in {repo}")
    return out.stdout


def head_commit(repo: Path) -> str:
    """The repository's HEAD commit ('' when git cannot read it)."""
    return subprocess.run([*_git(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
