"""Finished measurements kept in the report dir, so a killed bench resumes where it stopped.

    qserve pipeline          # killed mid-bench? run it again: only the variants not yet measured are measured

Keyed by the manifest's file hashes, the job and the test texts' identity; failed results are never reused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from qserve.files import write_json_atomic

# Job fields that are not inputs of the measurement: paths of this run, and what an op reuses of it.
NOT_KEYED = ("variant_dir", "data_file", "token_cache", "own")


def key(manifest_files: dict[str, Any] | None, job: dict[str, Any], data: dict[str, Any]) -> str:
    payload = {"files": manifest_files, "job": {k: v for k, v in job.items() if k not in NOT_KEYED}, "data": data}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def path_for(store: Path, vdir: Path, mode: str) -> Path:
    tag = hashlib.sha256(str(Path(vdir).resolve()).encode()).hexdigest()[:8]
    return store / f"{Path(vdir).name}-{tag}.{mode}.json"


def load(store: Path | None, vdir: Path, mode: str, k: str) -> dict[str, Any] | None:
    """The stored result for this key, or None (absent, another key, failed, unreadable)."""
    if store is None:
        return None
    try:
        entry = json.loads(path_for(store, vdir, mode).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    res = entry.get("result") if isinstance(entry, dict) and entry.get("key") == k else None
    return res if isinstance(res, dict) and res.get("status") == "ok" else None


def save(store: Path | None, vdir: Path, mode: str, k: str, res: dict[str, Any]) -> None:
    if store is None or res.get("status") != "ok":
        return

    store.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path_for(store, vdir, mode), {"key": k, "result": res})
