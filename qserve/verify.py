"""Checking a variant directory on load: its manifest's digest, every listed file, and the fields that change answers.

    python -c "from qserve.verify import verify; print(verify('models/minilm-l6-distilbert-imdb/variants/onnx-int8'))"

Listed files must match size and sha256 and the manifest its own digest (`manifest_sha256`); labels and max_length
are cross-checked against the hashed files they came from; unlisted files are refused unless allowed. Manifests
from before the digest load, cross-checked, with a warning (docs/serving.md, "Variant integrity").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.artifact import (
    ALLOW_EXTRA_HINT,
    DIGEST_KEY,
    MANIFEST,
    Manifest,
    VariantError,
    manifest_digest,
    read_model_meta,
    read_raw,
)
from qserve.files import sha256_file
from qserve.longtext import LongTextError, resolve
from qserve.problemtypes import from_config

log = logging.getLogger("qserve.verify")


def verify(root: Path, check_hashes: bool = True, allow_extra_files: bool = False) -> Manifest:
    """Read the manifest and check its digest, every listed file (present, size, sha256), no unlisted file (unless
    `allow_extra_files`), and the fields that change answers against the files they came from.

    Returns the manifest. Raises VariantError naming the first problem.
    """
    root = Path(root)
    raw = read_raw(root)
    path = root / MANIFEST
    recorded = raw.get(DIGEST_KEY)
    if recorded is not None and recorded != manifest_digest(raw):
        raise VariantError(
            f"{path} was edited after export: its content no longer matches its recorded "
            f"{DIGEST_KEY}. Fields such as labels, max_length and spec change every answer, so an "
            "edited manifest is refused; re-export the variant (`qserve export ... --force`)"
        )
    data = Manifest.from_json(raw, path)
    if recorded is None:
        log.warning(
            "%s has no %s (written before qserve recorded one): labels and max_length are "
            "cross-checked against the variant's files, its other fields are unverified; re-export "
            "the variant to seal it",
            path,
            DIGEST_KEY,
        )
    extra = sorted(rel for rel in _files_on_disk(root) if rel not in data.files)
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        if not allow_extra_files:
            raise VariantError(
                f"{root} holds {len(extra)} file(s) its manifest does not list: {shown}. A variant "
                "holds exactly the files it was exported with; remove them, or pass "
                f"{ALLOW_EXTRA_HINT} to load it anyway"
            )
        log.warning(
            "%s: ignoring %d file(s) the manifest does not list (allowed by --allow-extra-files): %s",
            root,
            len(extra),
            shown,
        )
    for rel, info in data.files.items():
        p = root / rel
        if not p.is_file():
            raise VariantError(f"{p} is listed in the manifest but missing; the variant is incomplete")
        size = p.stat().st_size
        if size != info.bytes:
            raise VariantError(f"{p} is {size} bytes, the manifest says {info.bytes}: truncated or altered")
        if check_hashes and sha256_file(p) != info.sha256:
            raise VariantError(f"{p} does not match its sha256 in the manifest: the file was altered")
    _cross_check(root, data)
    return data


def _files_on_disk(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST]


def _read_listed_json(root: Path, data: Manifest, rel: str) -> dict[str, Any] | None:
    """A JSON file the manifest lists (so verify has hashed it), or None."""
    if rel not in data.files:
        return None
    try:
        obj = json.loads((root / rel).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VariantError(f"{root / rel} is not valid JSON ({e}); the variant is damaged, re-export it") from None
    return obj if isinstance(obj, dict) else None


def _cross_check(root: Path, data: Manifest) -> None:
    """The manifest's labels and max_length must agree with the hashed files they came from."""
    path = root / MANIFEST
    labels, max_length = list(data.labels), data.max_length
    config = _read_listed_json(root, data, "config.json")
    if config is not None:
        id2label = config.get("id2label")
        if isinstance(id2label, dict) and id2label:
            try:
                from_config = [id2label[str(i)] for i in range(len(id2label))]
            except KeyError:
                from_config = None
            if from_config is not None and from_config != labels:
                raise VariantError(
                    f"{path} says labels {labels} but the hashed config.json maps ids to "
                    f"{from_config}: the manifest was edited; re-export the variant"
                )
        _check_problem_type(path, data, config)
        positions = config.get("max_position_embeddings")
        if isinstance(positions, int) and max_length > positions:
            raise VariantError(
                f"{path} says max_length {max_length} but the model has only {positions} "
                "positions (config.json): the manifest was edited; re-export the variant"
            )
    policy = data.long_text
    if policy is not None:  # absent: a variant from before the policy was recorded, served as head
        try:
            full = str(resolve(policy, max_length, "long_text"))
        except LongTextError as e:
            raise VariantError(f"{path}: {e}") from None
        if full != policy:
            raise VariantError(
                f"{path}: long_text {policy!r} is not written out in full ({full!r}); "
                "the manifest was edited; re-export the variant"
            )
    if "qserve_model.json" in data.files:
        meta = read_model_meta(root)
        if meta is not None and meta.max_length is not None and meta.max_length != max_length:
            raise VariantError(
                f"{path} says max_length {max_length} but the hashed qserve_model.json says "
                f"{meta.max_length}: the manifest was edited; re-export the variant"
            )


def _check_problem_type(path: Path, data: Manifest, config: dict[str, Any]) -> None:
    """The manifest's problem type (absent: single-label, a manifest from before problem types) must be the
    hashed config.json's: it decides whether logits are read by softmax, sigmoid or as values."""
    recorded = data.problem_type
    if recorded is None:
        return
    try:
        from_cfg = from_config(config)
    except QserveError as e:
        raise VariantError(f"{path.parent / 'config.json'}: {e}") from None
    if from_cfg != recorded:
        raise VariantError(
            f"{path} says problem_type {recorded!r} but the hashed config.json reads as "
            f"{from_cfg!r}: the manifest was edited; re-export the variant"
        )
