"""The variant directory's format: manifest.json and qserve_model.json as typed, versioned dataclasses.

    python -c "from qserve.artifact import read_manifest; \\
print(read_manifest('models/minilm-l6-distilbert-imdb/variants/onnx-int8').spec)"

Built in a staged dir and renamed into place (qserve/files.py); the manifest hashes every file and seals its own
content (checked by qserve/verify.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.files import now_iso, sha256_file, write_json_atomic
from qserve.problemtypes import PROBLEM_TYPES, SINGLE
from qserve.textpairs import ALLOWED
from qserve.textpairs import SINGLE as ONE_TEXT  # problemtypes' SINGLE is the single-label problem type
from qserve.variants import STORED, VariantSpec, spec_of

MANIFEST = "manifest.json"
FORMAT = "qserve-variant/1"
"""The manifest's format tag, `qserve-variant/<version>`. The version rule (check_format): version 1 is read;
any other version, newer or older, and any other name is refused, naming the file and what this qserve reads."""
MODEL_META = "qserve_model.json"
MODEL_META_FORMAT = "qserve-model/1"
"""qserve_model.json has carried no format field so far: a file without one is version 1. A `format` field, if
present, must be this; anything else is refused (a newer qserve's checkpoint). qserve writes none, so the files
keep their bytes."""
DIGEST_KEY = "manifest_sha256"
ALLOW_EXTRA_HINT = "--allow-extra-files (QSERVE_ALLOW_EXTRA_FILES=1 for serve)"


class VariantError(QserveError):
    """A variant directory that is missing, half-written, tampered with or of another format."""


class CheckpointError(QserveError):
    """A checkpoint's qserve_model.json that is not valid JSON, of another format, or with a field of the wrong type."""


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


# -- the typed artifacts: read once, validated once, written back in their key order (same bytes, same digest) --


def check_format(path: Path, value: object) -> None:
    """The manifest's version rule: `qserve-variant/1` is read; another version or name is refused."""
    if value == FORMAT:
        return
    name, _, version = str(value).partition("/")
    if name == FORMAT.split("/")[0] and version.isdigit():
        newer = int(version) > int(FORMAT.split("/")[1])
        raise VariantError(
            f"{path} has format {value!r}; this qserve reads {FORMAT!r} only ("
            + ("written by a newer qserve: upgrade qserve" if newer else "re-export the variant")
            + ")"
        )
    raise VariantError(f"{path} has format {value!r}; this qserve reads {FORMAT!r}")


def _typed(
    path: Path,
    key: str,
    value: object,
    kind: type | tuple[type, ...],
    allowed: str,
    error: type[QserveError] = VariantError,
) -> Any:
    """`value` if it is of `kind` (a bool is no number), else an error naming the file, the field, what is allowed."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise error(f"{path}: {key} must be {allowed}, got {value!r}")
    return value


def _optional(
    path: Path,
    data: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    allowed: str,
    error: type[QserveError] = VariantError,
) -> Any:
    value = data.get(key)
    return None if value is None else _typed(path, key, value, kind, allowed, error)


def _strings(path: Path, key: str, value: object, error: type[QserveError] = VariantError) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise error(f"{path}: {key} must be a non-empty list of strings, got {value!r}")
    return tuple(value)


def _inputs(path: Path, value: object, error: type[QserveError] = VariantError) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, list) and tuple(value) in ALLOWED:
        return tuple(value)
    raise error(f"{path}: inputs must be " + " or ".join(str(list(a)) for a in ALLOWED) + f" (got {value!r})")


@dataclass(frozen=True)
class FileEntry:
    """One file of a variant: its sha256 and size."""

    sha256: str
    bytes: int


# the manifest's own fields in their written order; any other top-level key is a backend's record (`records`)
_HEAD = tuple(
    "format spec model_name labels problem_type max_length long_text inputs source export_device versions".split()
)
_TAIL = ("parity", "gate", "calibration", "files", "created", DIGEST_KEY)  # gate, calibration: by `qserve gate`


@dataclass(frozen=True)
class Manifest:
    """A variant's manifest.json: its spec, how its answers read, where it came from, its parity with fp32, its files'
    hashes, and the backend's own record (`records`)."""

    spec: VariantSpec
    labels: tuple[str, ...]
    max_length: int
    model_name: str | None = None
    problem_type: str | None = None
    """None: a manifest from before problem types, read as single-label (`problem`)."""
    long_text: str | None = None
    """None: a manifest from before the policy was recorded, served as head."""
    inputs: tuple[str, ...] | None = None
    """None: a manifest from before text pairs, one text per input (`takes`)."""
    source: dict[str, str] | None = None
    export_device: str | None = None
    versions: dict[str, str] | None = None
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The backend's records by key ("onnx", "bnb", "openvino", "conversion"): free-form JSON each backend
    writes and its runtime reads."""
    parity: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    """The release gate's verdict (`qserve gate`): agreement and accuracy delta with their intervals against the
    fp32 reference, on which data (fingerprint, n), the bar, passed or not, when and on which machine; None: not
    gated. Inside the sealed manifest, so an edited verdict fails verify like any other field."""
    calibration: dict[str, Any] | None = None
    """What serving applies to the logits (`qserve gate` fits it on held-out data the gate did not score):
    {"temperature": T} (single-label softmax of logits / T) or {"thresholds": [one per label]} (multi-label), with
    where it was fitted; None: uncalibrated, answered exactly as before."""
    files: dict[str, FileEntry] = field(default_factory=dict)
    created: str | None = None
    digest: str | None = None
    """manifest_sha256; None on a manifest from before the digest."""
    format: str = FORMAT

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def problem(self) -> str:
        """The problem type, single-label when the manifest records none."""
        return self.problem_type or SINGLE

    @property
    def takes(self) -> tuple[str, ...]:
        """The inputs, ("text",) when the manifest records none."""
        return self.inputs or ONE_TEXT

    @property
    def temperature(self) -> float | None:
        """The calibrated softmax temperature (single-label), or None: softmax of the raw logits."""
        value = (self.calibration or {}).get("temperature")
        return None if value is None else float(value)

    @property
    def thresholds(self) -> tuple[float, ...] | None:
        """The calibrated per-label thresholds (multi-label), in label order, or None: the server's --threshold."""
        value = (self.calibration or {}).get("thresholds")
        return None if value is None else tuple(float(x) for x in value)

    def record(self, key: str) -> dict[str, Any]:
        """A backend's record ({} when absent)."""
        return self.records.get(key) or {}

    @property
    def version(self) -> str:
        """The digest that names this exact variant (recomputed for a manifest from before the digest)."""
        return self.digest or manifest_digest(self.to_json())

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON, keys in the order qserve writes them; absent (None) fields stay absent."""
        head: dict[str, Any] = {
            "format": self.format,
            "spec": self.spec.to_json(),
            "model_name": self.model_name,
            "labels": list(self.labels),
            "problem_type": self.problem_type,
            "max_length": self.max_length,
            "long_text": self.long_text,
            "inputs": None if self.inputs is None else list(self.inputs),
            "source": self.source,
            "export_device": self.export_device,
            "versions": self.versions,
        }
        tail: dict[str, Any] = {
            "parity": self.parity,
            "gate": self.gate,
            "calibration": self.calibration,
            "files": {k: {"sha256": f.sha256, "bytes": f.bytes} for k, f in self.files.items()} or None,
            "created": self.created,
            DIGEST_KEY: self.digest,
        }
        return {
            **{k: v for k, v in head.items() if v is not None},
            **self.records,
            **{k: v for k, v in tail.items() if v is not None},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path = Path(MANIFEST)) -> Manifest:
        """A manifest from its JSON, every field validated (errors name `path` and the field)."""
        check_format(path, data.get("format"))
        for key in ("spec", "files", "labels", "max_length"):
            if key not in data:
                raise VariantError(f"{path} lacks the {key!r} field; the variant is damaged, re-export it")
        max_length = data["max_length"]
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise VariantError(f"{path}: max_length must be an integer >= 2, got {max_length!r}")
        problem = _optional(path, data, "problem_type", str, "a string")
        if problem is not None and problem not in PROBLEM_TYPES:
            raise VariantError(f"{path}: problem_type {problem!r} is not one of {', '.join(PROBLEM_TYPES)}")
        files = _typed(path, "files", data["files"], dict, "an object of file -> {sha256, bytes}")
        entries = {}
        for rel, info in files.items():
            if (
                not isinstance(info, dict)
                or not isinstance(info.get("sha256"), str)
                or isinstance(info.get("bytes"), bool)
                or not isinstance(info.get("bytes"), int)
            ):
                raise VariantError(f'{path}: files[{rel!r}] must be {{"sha256": str, "bytes": int}}, got {info!r}')
            entries[rel] = FileEntry(info["sha256"], info["bytes"])
        own = _HEAD + _TAIL
        records = {
            k: _typed(path, k, v, dict, "an object (a backend's record)") for k, v in data.items() if k not in own
        }
        return cls(
            spec=_spec(path, data["spec"]),
            labels=_strings(path, "labels", data["labels"]),
            max_length=max_length,
            model_name=_optional(path, data, "model_name", str, "a string"),
            problem_type=problem,
            long_text=_optional(path, data, "long_text", str, "a long-text policy string"),
            inputs=_inputs(path, data.get("inputs")),
            source=_optional(path, data, "source", dict, "an object {path, sha256}"),
            export_device=_optional(path, data, "export_device", str, "a device string"),
            versions=_optional(path, data, "versions", dict, "an object library -> version"),
            records=records,
            parity=_optional(path, data, "parity", dict, "an object"),
            gate=_optional(path, data, "gate", dict, "an object (qserve gate's verdict)"),
            calibration=_calibration(path, data.get("calibration"), len(data["labels"])),
            files=entries,
            created=_optional(path, data, "created", str, "an ISO time string"),
            digest=_optional(path, data, DIGEST_KEY, str, "a sha256 hex string"),
            format=str(data["format"]),
        )


def _calibration(path: Path, value: object, num_labels: int) -> dict[str, Any] | None:
    """The calibration record, checked: a temperature > 0 and/or one threshold in [0, 1] per label."""
    if value is None:
        return None
    cal = _typed(path, "calibration", value, dict, "an object {temperature} or {thresholds}")
    t = cal.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e3):
        raise VariantError(f"{path}: calibration.temperature must be a number in (0, 1000), got {t!r}")
    thr = cal.get("thresholds")
    if thr is not None and (
        not isinstance(thr, list)
        or len(thr) != num_labels
        or not all(not isinstance(x, bool) and isinstance(x, (int, float)) and 0 <= x <= 1 for x in thr)
    ):
        raise VariantError(
            f"{path}: calibration.thresholds must be {num_labels} numbers in [0, 1] (one per label), got {thr!r}"
        )
    return cal


def _spec(path: Path, value: object) -> VariantSpec:
    spec = _typed(path, "spec", value, dict, "an object with " + ", ".join(STORED))
    for key, allowed in {"name": "a variant name", "backend": "a backend name", "dtype": "a dtype name"}.items():
        _typed(path, f"spec.{key}", spec.get(key), str, allowed)
    unknown = sorted(set(spec) - set(STORED))
    if unknown:
        raise VariantError(f"{path}: spec has unknown field(s) {', '.join(unknown)}; allowed: {', '.join(STORED)}")
    if "options" in spec:
        _typed(path, "spec.options", spec["options"], dict, "an object option -> value")
    return spec_of(spec)


@dataclass(frozen=True)
class ModelMeta:
    """A checkpoint's qserve_model.json (recorded by `qserve train`, copied by every variant): name, base model, data,
    truncation and long-text policy, labels and problem type, the regression label range, `inputs` for pairs."""

    model_name: str | None = None
    base_model: str | None = None
    dataset: str | None = None
    seed: int | None = None
    max_length: int | None = None
    long_text: str | None = None
    max_eval_samples: int | None = None
    labels: tuple[str, ...] | None = None
    problem_type: str | None = None
    label_range: float | None = None
    inputs: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this qserve does not know (a file another tool extended), kept as read."""

    @property
    def takes(self) -> tuple[str, ...]:
        return self.inputs or ONE_TEXT

    def to_json(self) -> dict[str, Any]:
        """As `qserve train` writes it: the run's fields always, label_range for regression (even when None: the
        labels were constant) or when set, inputs only when set."""
        out: dict[str, Any] = {
            "model_name": self.model_name,
            "base_model": self.base_model,
            "dataset": self.dataset,
            "seed": self.seed,
            "max_length": self.max_length,
            "long_text": self.long_text,
            "max_eval_samples": self.max_eval_samples,
            "labels": None if self.labels is None else list(self.labels),
            "problem_type": self.problem_type,
        }
        if self.label_range is not None or self.problem_type == "regression":
            out["label_range"] = self.label_range
        if self.inputs is not None:
            out["inputs"] = list(self.inputs)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: object, path: Path = Path(MODEL_META)) -> ModelMeta:
        err = CheckpointError
        if not isinstance(data, dict):
            raise err(f"{path}: the file must be a JSON object, got {data!r}")
        fmt = data.get("format")
        if fmt is not None and fmt != MODEL_META_FORMAT:
            raise err(f"{path} has format {fmt!r}; this qserve reads {MODEL_META_FORMAT!r} (or none)")
        max_length = _optional(path, data, "max_length", int, "an integer >= 2", err)
        if max_length is not None and max_length < 2:
            raise err(f"{path}: max_length must be an integer >= 2, got {max_length!r}")
        span = _optional(path, data, "label_range", (int, float), "a number", err)
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}  # a format field is kept in extra
        return cls(
            model_name=_optional(path, data, "model_name", str, "a string", err),
            base_model=_optional(path, data, "base_model", str, "a string", err),
            dataset=_optional(path, data, "dataset", str, "a dataset name", err),
            seed=_optional(path, data, "seed", int, "an integer", err),
            max_length=max_length,
            long_text=_optional(path, data, "long_text", str, "a long-text policy string", err),
            max_eval_samples=_optional(path, data, "max_eval_samples", int, "an integer", err),
            labels=None if data.get("labels") is None else _strings(path, "labels", data["labels"], err),
            problem_type=_optional(path, data, "problem_type", str, "a problem type", err),
            label_range=span,
            inputs=_inputs(path, data.get("inputs"), err),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_json())


def read_model_meta(root: Path) -> ModelMeta | None:
    """A checkpoint's (or a variant's copy of its) qserve_model.json, validated; None when absent."""
    path = Path(root) / MODEL_META
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    return ModelMeta.from_json(data, path)


def manifest_digest(data: dict[str, Any]) -> str:
    """sha256 of the manifest's content (every field but the digest itself), canonical JSON."""
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(canon.encode("ascii")).hexdigest()


def write_manifest(root: Path, manifest: Manifest) -> Manifest:
    """Hash every file in root, then write manifest.json (format tag, files, creation time, own digest)."""
    root = Path(root)
    data = {"format": FORMAT, **{k: v for k, v in manifest.to_json().items() if k not in ("format", DIGEST_KEY)}}
    data["files"] = hash_files(root)  # in its place when the manifest had files (a reseal), else after parity
    data.setdefault("created", now_iso())
    return _seal(root, data)


def reseal(root: Path, manifest: Manifest) -> Manifest:
    """Write `manifest` (e.g. with a gate verdict) over root's manifest.json atomically, file hashes kept, digest
    recomputed: for a variant just verified, whose files did not change."""
    return _seal(Path(root), {k: v for k, v in manifest.to_json().items() if k != DIGEST_KEY})


def _seal(root: Path, data: dict[str, Any]) -> Manifest:
    """Write `data` as root's manifest.json with its digest, and read it back."""
    data = json.loads(json.dumps(data, default=str))  # the digest covers exactly what a reader will see
    data[DIGEST_KEY] = manifest_digest(data)
    write_json_atomic(root / MANIFEST, data)
    return Manifest.from_json(data, root / MANIFEST)


def read_raw(root: Path) -> dict[str, Any]:
    """manifest.json as JSON, its format checked (the version rule: see `check_format`)."""
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
    if not isinstance(data, dict):
        raise VariantError(f"{path} has format None; this qserve reads {FORMAT!r}")
    check_format(path, data.get("format"))
    return data


def read_manifest(root: Path) -> Manifest:
    """The variant's manifest, read and validated once (no hashes checked: that is `verify`)."""
    return Manifest.from_json(read_raw(root), Path(root) / MANIFEST)
