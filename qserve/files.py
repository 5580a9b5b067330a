"""Files written so that nothing half-written is ever read: atomic JSON/text writes, staged directories, hashes.

    python -c "from qserve.files import sha256_file; print(sha256_file('pyproject.toml'))"

A file goes to a temp file beside it and is renamed into place; a variant directory is built in a hidden temp dir
and renamed in only when complete (`staged_dir`); nothing existing is replaced unless asked (`refuse_existing`).
The variant format is qserve/artifact.py; checking a variant on load, qserve/verify.py.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qserve import QserveError


def repository_root() -> Path:
    """The directory holding qserve/ and exporters/: a checkout's root (or site-packages, installed)."""
    return Path(__file__).resolve().parents[1]


def with_root_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with the repository root first on PYTHONPATH, so a child `python -m qserve...` runs this same code."""
    return {**env, "PYTHONPATH": os.pathsep.join([str(repository_root()), *filter(None, [env.get("PYTHONPATH")])])}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temp file + rename so a reader never sees half a file."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; reports and manifests are meant to be read
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def refuse_existing(dest: Path, force: bool, flag: str = "--force") -> None:
    """Never overwrite silently: an existing non-empty destination needs `force`."""
    dest = Path(dest)
    if dest.exists() and (dest.is_file() or any(dest.iterdir())) and not force:
        raise QserveError(f"{dest} already exists; pass {flag} to replace it, or choose another --out")


@contextlib.contextmanager
def staged_dir(dest: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temp dir beside `dest`; on success rename it into place, on error delete it.

    The old destination (with --force) is moved aside first and removed only after
    the new one is in place, so a crash never leaves the user with neither.
    """
    dest = Path(dest)
    refuse_existing(dest, force)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a variant is meant to be shared and served
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def dir_size(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
