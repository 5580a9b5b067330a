"""The export orchestration every backend shares: stage, build, manifest, parity, commit.

python -c "import exporters; exporters.export('models/minilm-imdb', 'torch-bf16', '/tmp/v')"
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from qserve import QserveError, longtext, variants
from qserve import problemtypes as problems
from qserve.artifact import Manifest, ModelMeta, checkpoint_hash, read_model_meta, write_manifest
from qserve.extras import require
from qserve.files import staged_dir
from qserve.modeling import ARCHITECTURES, model_inputs, usable_positions
from qserve.problemtypes import from_config
from qserve.runtime import load_runtime
from qserve.textpairs import ALLOWED, PAIR, PROBE_PAIRS, SINGLE, split_pairs
from qserve.variants import Backend, BackendOptions, UnsupportedVariant, VariantSpec, library_versions, load_target

log = logging.getLogger(__name__)

Builder = Callable[["ExportContext", Path, VariantSpec, BackendOptions], dict[str, dict[str, Any]]]
"""(context, out_dir, spec, its options as its backend's type) -> the backend's manifest records of the variant it
wrote into out_dir (Manifest.records: {"onnx": {...}}; the context: the checkpoint, read once, and its policy)."""

# the parity gate's probes: short and long, both polarities, markup, near-empty (padding and truncation paths)
PROBES = [
    "A wonderful, moving film with superb performances. I loved every minute.",
    "Terrible. The plot made no sense and the acting was wooden; I walked out.",
    "It was fine, I guess. Some good scenes, some boring ones.",
    "ok",
    "The cinematography is gorgeous but the script is lazy and the ending is predictable. " * 12,
    "Not bad at all!<br /><br />Would watch again with friends.",
    "I expected to hate it, and I did not: the second half completely won me over.",
    "Worst movie of the year. Avoid.",
]

# max |Δlogit| before the export warns, by dtype (VariantSpec.tolerance); the one table read here (tests patch it)
TOLERANCE: dict[str, float] = dict(variants.TOLERANCE)

# Truncation length of a variant whose checkpoint records none (no qserve_model.json).
DEFAULT_MAX_LENGTH = 256

TOKENIZER_FILES = tuple(
    "tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt added_tokens.json".split()
)


class ParityError(QserveError):
    """The variant's outputs have the wrong shape or dtype: it computes something else."""


class ExportFailed(QserveError):
    """A library's non-QserveError while building or checking a variant: one line for the user, the traceback on -v."""

    def __init__(self, variant: str, arch: str, error: BaseException):
        self.variant, self.exc_type = variant, type(error).__name__
        self.detail = one_line(str(error)) or "(no message)"
        super().__init__(f"{variant} failed for {arch}: {self.exc_type}: {self.detail}")


def one_line(text: str, limit: int = 300) -> str:
    """A multi-line library message (OpenVINO's carry source paths on their first lines) as one line."""
    flat = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True)
class CheckpointInfo:
    """What every export step needs from a checkpoint, read once: its HF config.json and qserve_model.json (`meta`)."""

    path: Path
    labels: tuple[str, ...]
    model_type: str | None
    max_length: int
    model_name: str
    long_text: str | None
    """The policy the checkpoint records (None: head), as written in its qserve_model.json."""
    problem_type: str
    label_range: float | None
    inputs: tuple[str, ...]
    meta: ModelMeta | None


def checkpoint_info(checkpoint: Path, inputs: tuple[str, ...] | None = None) -> CheckpointInfo:
    """Read `checkpoint`'s config.json and qserve_model.json once; `inputs` (qserve export --inputs) over the
    recorded ones: a model trained elsewhere declares that it reads text pairs."""
    checkpoint = Path(checkpoint)
    cfg_path = checkpoint / "config.json"
    if not cfg_path.is_file():
        raise QserveError(
            f"{checkpoint} is not a checkpoint directory (no config.json); "
            "pass a directory written by `qserve train` or save_pretrained"
        )
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    id2label = cfg.get("id2label") or {"0": "LABEL_0", "1": "LABEL_1"}
    labels = tuple(id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label)))
    meta = read_model_meta(checkpoint)
    if meta is not None and meta.max_length is not None:
        max_length = meta.max_length
    else:  # a checkpoint qserve did not train: DEFAULT_MAX_LENGTH tokens, or what fits the model's positions
        max_length = min(DEFAULT_MAX_LENGTH, usable_positions(cfg) or DEFAULT_MAX_LENGTH)
    return CheckpointInfo(
        path=checkpoint,
        labels=labels,
        model_type=cfg.get("model_type"),
        max_length=max_length,
        model_name=(meta.model_name if meta is not None and meta.model_name else None) or checkpoint.name,
        long_text=None if meta is None else meta.long_text,
        problem_type=from_config(cfg, str(cfg_path)),
        label_range=None if meta is None else meta.label_range,
        inputs=inputs or (meta.takes if meta is not None else SINGLE),
        meta=meta,
    )


@dataclass(frozen=True)
class ExportContext:
    """What one variant's build reads besides its spec and options: the source checkpoint (read once) and the
    long-text policy the variant records (calibration texts are cut by it)."""

    checkpoint: Path
    info: CheckpointInfo
    policy: str

    @classmethod
    def of(cls, checkpoint: Path, long_text: str | None = None, inputs: tuple[str, ...] | None = None) -> ExportContext:
        """The context for exporting from `checkpoint`: `long_text` and `inputs` over the recorded ones."""
        info = checkpoint_info(Path(checkpoint), inputs)
        return cls(Path(checkpoint), info, variant_policy(info, long_text))


def as_context(source: ExportContext | Path | str) -> ExportContext:
    """A context as given, or the checkpoint's own (its recorded policy and inputs) for a bare path: what a
    caller outside an export (a test, a benchmark) calibrates on."""
    return source if isinstance(source, ExportContext) else ExportContext.of(Path(source))


def parse_inputs(value: str | None) -> tuple[str, ...] | None:
    """`qserve export --inputs text` or `text,text_pair` -> the inputs tuple (None: the checkpoint's own)."""
    if value is None:
        return None

    got = tuple(p.strip() for p in value.split(","))
    if got not in ALLOWED:
        raise QserveError(
            f"--inputs {value!r}: allowed values are "
            + " or ".join(",".join(a) for a in ALLOWED)
            + " (text_pair: a model that reads two texts, such as an NLI or cross-encoder classifier)"
        )
    return got


def variant_policy(info: CheckpointInfo | Path, long_text: str | None = None) -> str:
    """The long-text policy a variant records, in full: `long_text` (--long-text), else the checkpoint's, else head."""
    if not isinstance(info, CheckpointInfo):
        info = checkpoint_info(Path(info))
    if long_text:
        return str(longtext.resolve(long_text, info.max_length, "--long-text"))
    recorded = info.long_text or longtext.DEFAULT
    return str(longtext.resolve(recorded, info.max_length, f"{info.path}/qserve_model.json long_text"))


def copy_tokenizer(checkpoint: Path, out: Path) -> None:
    """The checkpoint's tokenizer files; a checkpoint saved without tokenizer.json (a slow-only tokenizer) gets one,
    written by transformers as it loads that tokenizer, so the variant serves without transformers
    (qserve/tokenization.py)."""
    for n in TOKENIZER_FILES:
        if (checkpoint / n).is_file():
            shutil.copy2(checkpoint / n, out / n)
    if not (out / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(checkpoint)).save_pretrained(str(out))
    if (checkpoint / "qserve_model.json").is_file():
        shutil.copy2(checkpoint / "qserve_model.json", out / "qserve_model.json")


def padded_batches(
    tok: Any, texts: list[str], max_length: int, size: int, policy: str | None = None, pairs: list[str] | None = None
) -> tuple[longtext.Pieces, list[dict]]:
    """The pieces of `texts` under `policy` (a pair model: the tokenizer's pair encoding of `pairs`) and their
    padded batches of `size` rows, segment ids included where the tokenizer makes them, as the runtime runs them."""
    if pairs is not None:
        pieces = split_pairs(tok, texts, pairs, max_length)
    else:
        pieces = longtext.split_texts(tok, texts, policy, max_length)
    segments, types = "token_type_ids" in tok.model_input_names, pieces.types
    cuts = [slice(i, i + size) for i in range(0, len(pieces.ids), size)]
    pad_id = int(tok.pad_token_id or 0)
    return pieces, [
        longtext.pad(pieces.ids[c], pad_id, tok.padding_side, segments, None if types is None else types[c])
        for c in cuts
    ]


def reference_logits(
    checkpoint: Path, texts: list[str], max_length: int, policy: str | None = None, pairs: list[str] | None = None
) -> np.ndarray:
    """fp32 torch logits of the source checkpoint under `policy` (None = head), windows and pairs as the runtime
    handles them: the yardstick every variant is held to."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.float32).eval()
    pieces, batches = padded_batches(tok, texts, max_length, 64, policy, pairs)
    takes = set(model_inputs(model))  # token_type_ids where the model takes them, as the runtimes feed them
    with torch.inference_mode():
        out = [
            model(**{k: torch.from_numpy(v) for k, v in b.items() if k in takes}).logits.float().numpy()
            for b in batches
        ]
    return longtext.aggregate(np.concatenate(out), pieces)


def parity_inputs(info: CheckpointInfo, probes: list[str] | None) -> tuple[list[str], list[str] | None]:
    """The parity probes: the given texts or PROBES, or for a pair model the probe pairs (textpairs.PROBE_PAIRS;
    given texts are then paired with themselves reversed in order, so every probe is a pair)."""
    if info.inputs != PAIR:
        return list(probes or PROBES), None
    if probes:
        return list(probes), list(reversed(probes))
    return [a for a, _ in PROBE_PAIRS], [b for _, b in PROBE_PAIRS]


def parity(
    ref: np.ndarray,
    got: np.ndarray,
    tolerance: float,
    name: str,
    problem: str = "single_label_classification",
    label_range: float | None = None,
) -> dict[str, Any]:
    """Max |Δlogit| against the fp32 reference and agreement by problem type (problemtypes.agreement; regression's
    range from qserve_model.json, else the reference's)."""
    if got.shape != ref.shape:
        raise ParityError(f"{name}: output shape {got.shape} differs from the fp32 reference {ref.shape}")
    if not np.issubdtype(got.dtype, np.floating) or not np.all(np.isfinite(got)):
        raise ParityError(f"{name}: outputs are {got.dtype} with non-finite values; expected finite float logits")
    max_abs = float(np.max(np.abs(got - ref)))
    agree = problems.agreement(
        problems.predictions(problems.scores(got, problem), problem),
        problems.predictions(problems.scores(ref, problem), problem),
        problem,
        label_range,
    )
    ok = max_abs <= tolerance
    if not ok:
        warnings.warn(
            f"{name}: max |Δlogit| {max_abs:.4g} exceeds tolerance {tolerance:g} "
            f"(prediction agreement on probes {agree:.0%}); recorded in the manifest",
            stacklevel=3,
        )
    extra: dict[str, Any] = {"problem_type": problem} if problem != problems.SINGLE else {}
    if problem == problems.REGRESSION:
        extra["mean_abs_diff"] = float(np.mean(np.abs(got - ref)))
    return {
        "probes": len(ref),
        "max_abs_logit_diff": max_abs,
        "agreement": agree,
        "tolerance": tolerance,
        "within_tolerance": ok,
        **extra,
    }


# intermediate exports (fp32 ONNX graph, fp32 IR) shared by a checkpoint's variants in this process, by (content
# hash, what): `export --all` traces once per backend; temp dirs removed at exit
_SHARED: dict[tuple, tempfile.TemporaryDirectory] = {}
_SHARED_LOCK = threading.Lock()


def shared_export(checkpoint: Path, what: tuple, make: Callable[[Path], object]) -> Path:
    """A directory holding `make(dir)`'s output for `checkpoint`, made once per process; callers copy out of it."""
    key = (checkpoint_hash(checkpoint), *what)  # content, not path: a checkpoint retrained in place is new
    with _SHARED_LOCK:
        if key not in _SHARED:
            scratch = tempfile.TemporaryDirectory(prefix="qserve-shared-")
            try:
                make(Path(scratch.name) / "out")
            except BaseException:
                scratch.cleanup()
                raise
            _SHARED[key] = scratch
        return Path(_SHARED[key].name) / "out"


def get_builder(backend: Backend) -> Builder:
    """The exporter `backend` names, imported now (a missing backend fails here)."""
    return cast(Builder, load_target(backend.exporter, backend))


def export(
    checkpoint: str | Path,
    variant: str | VariantSpec,
    out: str | Path,
    force: bool = False,
    options: dict[str, Any] | None = None,
    device: str = "cpu",
    probes: list[str] | None = None,
    long_text: str | None = None,
    inputs: tuple[str, ...] | None = None,
) -> Manifest:
    """Build `variant` (its name or spec) from `checkpoint` into `out`; returns the written manifest. `long_text`
    overrides the checkpoint's policy; `inputs` what one input is (("text", "text_pair"): a pair model)."""
    spec = variants.get_spec(variant) if isinstance(variant, str) else variant  # resolved here, once, and passed on
    checkpoint, info = Path(checkpoint), checkpoint_info(Path(checkpoint), inputs)
    arch = ARCHITECTURES.get(info.model_type or "", info.model_type or "an unknown architecture")
    reason = spec.unsupported.get(info.model_type or "")
    if reason:
        raise UnsupportedVariant(f"{spec.name} unsupported for {arch}: {reason}")
    # before the slow build: a bad --long-text fails at once
    ctx = ExportContext(checkpoint, info, variant_policy(info, long_text))
    try:
        return _export(ctx, spec, variants.REGISTRY[spec.backend], Path(out), force, options, device, probes)
    except QserveError:
        raise
    except Exception as e:  # noqa: BLE001 - torch, optimum, ORT, OpenVINO and NNCF raise anything
        log.debug("exporting %s from %s", spec.name, checkpoint, exc_info=True)
        raise ExportFailed(spec.name, arch, e) from e


def _export(
    ctx: ExportContext,
    spec: VariantSpec,
    backend: Backend,
    out: Path,
    force: bool,
    options: dict[str, Any] | None,
    device: str,
    probes: list[str] | None,
) -> Manifest:
    checkpoint, info, policy = ctx.checkpoint, ctx.info, ctx.policy
    spec = replace(spec, options={**spec.options, **(options or {})})
    texts, pairs = parity_inputs(info, probes)
    for module in backend.needs + backend.export_needs:  # a missing one: its install hint, before any work
        require(module, spec.name)
    opts = backend.options_type.resolve(spec.name, spec.options)  # typed and checked, then the rules across them
    with staged_dir(out, force=force) as tmp:
        extra = get_builder(backend)(ctx, tmp, spec, opts) or {}
        copy_tokenizer(checkpoint, tmp)
        manifest = Manifest(
            spec=spec,
            model_name=info.model_name,
            labels=info.labels,
            problem_type=info.problem_type,
            max_length=info.max_length,
            long_text=policy,
            inputs=info.inputs,
            source={"path": str(checkpoint.resolve()), "sha256": checkpoint_hash(checkpoint)},
            export_device=device,
            versions=library_versions(),
            records=extra,
        )
        write_manifest(tmp, manifest)
        runtime = load_runtime(tmp, device=device)
        got = runtime.logits(texts, pairs=pairs)
        runtime.close()
        ref = reference_logits(checkpoint, texts, info.max_length, policy, pairs=pairs)
        manifest = replace(
            manifest, parity=parity(ref, got, TOLERANCE[spec.dtype], spec.name, info.problem_type, info.label_range)
        )
        return write_manifest(tmp, manifest)
