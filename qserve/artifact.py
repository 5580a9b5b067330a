"""The variant directory: weights + tokenizer + manifest.json, written atomically, verified on load.

    python -c "from qserve.artifact import verify; print(verify('models/minilm-imdb-variants/onnx-int8'))"

A variant is built in a hidden temporary directory beside its destination and
renamed into place only when complete, so a crash or a failed parity gate leaves
nothing behind, and an existing variant is replaced only when asked (`force`).

Integrity on load (`verify`): every listed file must match its size and sha256; the
manifest's own content must match the digest recorded in it (`manifest_sha256`), so
an edit to labels, max_length or the spec is refused; labels and max_length are also
cross-checked against the hashed files they came from (config.json id2label and problem_type,
qserve_model.json, the model's position table); and a file the manifest does not list
is refused unless the caller allows extra files. Manifests written before the digest
existed still load: the cross-checks cover the fields that change answers, and a
warning says the rest is unverified.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qserve import QserveError

MANIFEST = "manifest.json"
FORMAT = "qserve-variant/1"
DIGEST_KEY = "manifest_sha256"
ALLOW_EXTRA_HINT = "--allow-extra-files (QSERVE_ALLOW_EXTRA_FILES=1 for serve)"

log = logging.getLogger("qserve.artifact")


class VariantError(QserveError):
    """A variant directory that is missing, half-written, tampered with or of another format."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_files(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under root except the manifest itself."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[p.relative_to(root).as_posix()] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return out


def checkpoint_hash(checkpoint: Path) -> str:
    """One hash for a checkpoint directory: sha256 over its files' names and hashes."""
    h = hashlib.sha256()
    for rel, info in hash_files(Path(checkpoint)).items():
        h.update(f"{rel}\0{info['sha256']}\n".encode())
    return h.hexdigest()


def library_versions(names: tuple[str, ...] = ("torch", "transformers", "optimum", "optimum-onnx", "onnx",
                                               "onnxruntime", "onnxruntime-gpu", "bitsandbytes", "lightning",
                                               "openvino", "nncf", "optimum-intel",
                                               "qserve")) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for n in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[n] = metadata.version(n)
    return out


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


def manifest_digest(data: dict[str, Any]) -> str:
    """sha256 of the manifest's content (every field but the digest itself), canonical JSON."""
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(canon.encode("ascii")).hexdigest()


def write_manifest(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Hash every file in root, then write manifest.json (format tag, files, creation time, own digest)."""
    root = Path(root)
    data = {"format": FORMAT, **{k: v for k, v in manifest.items() if k != DIGEST_KEY}}
    data["files"] = hash_files(root)
    data.setdefault("created", now_iso())
    # Round-trip through JSON first so the digest covers exactly what a reader will see.
    data = json.loads(json.dumps(data, default=str))
    data[DIGEST_KEY] = manifest_digest(data)
    write_json_atomic(root / MANIFEST, data)
    return data


def read_manifest(root: Path) -> dict[str, Any]:
    root = Path(root)
    path = root / MANIFEST
    if not root.is_dir():
        raise VariantError(f"{root} is not a directory; expected a variant directory made by `qserve export`")
    if not path.is_file():
        raise VariantError(f"{path} is missing: {root} is not a complete qserve variant (re-run `qserve export`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VariantError(f"{path} is not valid JSON ({e}); the variant is damaged, re-export it") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise VariantError(f"{path} has format {data.get('format') if isinstance(data, dict) else None!r}; "
                           f"this qserve reads {FORMAT!r}")
    for key in ("spec", "files", "labels", "max_length"):
        if key not in data:
            raise VariantError(f"{path} lacks the {key!r} field; the variant is damaged, re-export it")
    return data


def verify(root: Path, check_hashes: bool = True, allow_extra_files: bool = False) -> dict[str, Any]:
    """Read the manifest and check it: its own digest, every listed file (present, same size,
    same sha256), no unlisted file (unless `allow_extra_files`), and the fields that change
    answers against the files they came from.

    Returns the manifest. Raises VariantError naming the first problem.
    """
    root = Path(root)
    data = read_manifest(root)
    path = root / MANIFEST
    recorded = data.get(DIGEST_KEY)
    if recorded is None:
        log.warning("%s has no %s (written before qserve recorded one): labels and max_length are "
                    "cross-checked against the variant's files, its other fields are unverified; re-export "
                    "the variant to seal it", path, DIGEST_KEY)
    elif recorded != manifest_digest(data):
        raise VariantError(f"{path} was edited after export: its content no longer matches its recorded "
                           f"{DIGEST_KEY}. Fields such as labels, max_length and spec change every answer, so an "
                           "edited manifest is refused; re-export the variant (`qserve export ... --force`)")
    extra = sorted(rel for rel in _files_on_disk(root) if rel not in data["files"])
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        if not allow_extra_files:
            raise VariantError(f"{root} holds {len(extra)} file(s) its manifest does not list: {shown}. A variant "
                               "holds exactly the files it was exported with; remove them, or pass "
                               f"{ALLOW_EXTRA_HINT} to load it anyway")
        log.warning("%s: ignoring %d file(s) the manifest does not list (allowed by --allow-extra-files): %s",
                    root, len(extra), shown)
    for rel, info in data["files"].items():
        p = root / rel
        if not p.is_file():
            raise VariantError(f"{p} is listed in the manifest but missing; the variant is incomplete")
        size = p.stat().st_size
        if size != info["bytes"]:
            raise VariantError(f"{p} is {size} bytes, the manifest says {info['bytes']}: truncated or altered")
        if check_hashes and sha256_file(p) != info["sha256"]:
            raise VariantError(f"{p} does not match its sha256 in the manifest: the file was altered")
    _cross_check(root, data)
    return data


def _files_on_disk(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST]


def _read_listed_json(root: Path, data: dict[str, Any], rel: str) -> dict[str, Any] | None:
    """A JSON file the manifest lists (so verify has hashed it), or None."""
    if rel not in data["files"]:
        return None
    try:
        obj = json.loads((root / rel).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VariantError(f"{root / rel} is not valid JSON ({e}); the variant is damaged, re-export it") from None
    return obj if isinstance(obj, dict) else None


def _cross_check(root: Path, data: dict[str, Any]) -> None:
    """The manifest's labels and max_length must agree with the hashed files they came from."""
    path = root / MANIFEST
    labels, max_length = data["labels"], data["max_length"]
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise VariantError(f"{path}: labels must be a non-empty list of strings, got {labels!r}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise VariantError(f"{path}: max_length must be an integer >= 2, got {max_length!r}")
    config = _read_listed_json(root, data, "config.json")
    if config is not None:
        id2label = config.get("id2label")
        if isinstance(id2label, dict) and id2label:
            try:
                from_config = [id2label[str(i)] for i in range(len(id2label))]
            except KeyError:
                from_config = None
            if from_config is not None and from_config != labels:
                raise VariantError(f"{path} says labels {labels} but the hashed config.json maps ids to "
                                   f"{from_config}: the manifest was edited; re-export the variant")
        _check_problem_type(path, data, config)
        positions = config.get("max_position_embeddings")
        if isinstance(positions, int) and max_length > positions:
            raise VariantError(f"{path} says max_length {max_length} but the model has only {positions} "
                               "positions (config.json): the manifest was edited; re-export the variant")
    policy = data.get("long_text")
    if policy is not None:  # absent: a variant from before the policy was recorded, served as head
        from qserve.longtext import LongTextError, resolve

        try:
            full = str(resolve(policy, max_length, "long_text"))
        except LongTextError as e:
            raise VariantError(f"{path}: {e}") from None
        if full != policy:
            raise VariantError(f"{path}: long_text {policy!r} is not written out in full ({full!r}); "
                               "the manifest was edited; re-export the variant")
    meta = _read_listed_json(root, data, "qserve_model.json")
    if meta is not None and "max_length" in meta and meta["max_length"] != max_length:
        raise VariantError(f"{path} says max_length {max_length} but the hashed qserve_model.json says "
                           f"{meta['max_length']}: the manifest was edited; re-export the variant")


def _check_problem_type(path: Path, data: dict[str, Any], config: dict[str, Any]) -> None:
    """The manifest's problem type (absent: single-label, a manifest from before problem types) must be the
    hashed config.json's: it decides whether logits are read by softmax, sigmoid or as values."""
    from qserve.problemtypes import PROBLEM_TYPES, from_config

    recorded = data.get("problem_type")
    if recorded is None:
        return
    if recorded not in PROBLEM_TYPES:
        raise VariantError(f"{path}: problem_type {recorded!r} is not one of {', '.join(PROBLEM_TYPES)}")
    try:
        from_cfg = from_config(config)
    except QserveError as e:
        raise VariantError(f"{path.parent / 'config.json'}: {e}") from None
    if from_cfg != recorded:
        raise VariantError(f"{path} says problem_type {recorded!r} but the hashed config.json reads as "
                           f"{from_cfg!r}: the manifest was edited; re-export the variant")


def dir_size(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
