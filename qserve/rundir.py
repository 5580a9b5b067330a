"""A `qserve pipeline` run dir: its layout, its bench report, and what it says to serve, read once.

    qserve serve models/minilm-l6-distilbert-imdb      # serves served(RunDir(...)): variant, policy and why

RUN/checkpoint/ (train), RUN/variants/NAME/ (export), RUN/report/report.json and inputs.json (bench, gate). The
bench and the gate write the report's recommendation; serve and predict read it here and never recompute it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.artifact import Manifest, read_manifest
from qserve.benchreport import VERSUS, load_report
from qserve.devices import cpu_info
from qserve.gatepolicy import UNGATED, gated_policy, verdict_for
from qserve.longtext import LongTextPolicy, parse


@dataclass(frozen=True)
class RunDir:
    """The directories and files of one run, by name."""

    path: Path

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint"

    @property
    def variants(self) -> Path:
        return self.path / "variants"

    @property
    def report_dir(self) -> Path:
        return self.path / "report"

    @property
    def report_json(self) -> Path:
        return self.report_dir / "report.json"

    def variant(self, name: str) -> Path:
        return self.variants / name

    @staticmethod
    def holding(variant_dir: str | Path) -> RunDir:
        """The run dir a variant dir sits in (RUN/variants/NAME), whether or not it is one."""
        return RunDir(Path(variant_dir).parent.parent)

    @staticmethod
    def of_checkpoint(checkpoint: Path) -> RunDir | None:
        """RUN for RUN/checkpoint; None for a checkpoint kept elsewhere."""
        return RunDir(checkpoint.parent) if checkpoint.name == "checkpoint" else None

    def is_run_dir(self) -> bool:
        """A run dir (report or variants), not a variant itself."""
        return not (self.path / "manifest.json").is_file() and (self.report_dir.is_dir() or self.variants.is_dir())


@dataclass(frozen=True)
class Served:
    """What a run dir serves and why: /v1/models' `selection`, the log's lines, predict's model."""

    variant: str
    dir: str
    why: str
    report: str
    measured_on: str | None
    same_cpu: bool | None
    long_text: LongTextPolicy | None
    """The policy to serve: the report's choice where the variant's gate verdict covers it, else the one its gate
    verified (None: the variant's own)."""
    long_text_why: str
    versus: dict[str, Any] | None

    def record(self) -> dict[str, Any]:
        """As JSON: /v1/models' `selection`."""
        return {**asdict(self), "long_text": None if self.long_text is None else str(self.long_text)}


def served(run: RunDir) -> Served:
    """The variant a run dir's report recommends, with its long-text policy; an error names what is missing."""
    path = run.report_json
    if not path.is_file():
        raise QserveError(
            f"{run.path} is neither a variant dir (no manifest.json) nor a run dir with a bench report ({path} is "
            "missing); pass a variant dir, or run `qserve pipeline` first"
        )
    report, _ = load_report(path)
    rec = report.get("recommended") or {}
    if not rec.get("variant"):
        raise QserveError(f"{path} recommends no variant ({rec.get('why', 'none recorded')}); pass a variant dir")
    name = rec["variant"]
    vdir = next((d for d in (run.variant(name), Path(rec.get("dir") or "")) if (d / "manifest.json").is_file()), None)
    if vdir is None:
        raise QserveError(f"{path} recommends {name}, but {run.variant(name)} does not hold it; re-export it")
    here = cpu_info().get("model")
    policy, policy_why = served_policy(report, name, read_manifest(vdir))
    return Served(
        variant=name,
        dir=str(vdir),
        why=rec["why"],
        report=str(path),
        measured_on=rec.get("cpu"),
        same_cpu=here == rec["cpu"] if here not in (None, "unknown") and rec.get("cpu") else None,
        long_text=None if policy is None else parse(policy),
        long_text_why=policy_why,
        versus={k: rec[k] for k in VERSUS if k in rec} or None,
    )


def served_policy(report: dict[str, Any], variant: str, manifest: Manifest) -> tuple[str | None, str]:
    """(the policy the recommended `variant` is served under, why): the report's choice when made on its own
    records and gated; else the policy its gate verified (None: the variant's own)."""
    lt = report.get("long_text") or {}
    chosen = (lt.get("fast") or {}).get("policy")
    gated = gated_policy(manifest)
    fallback = None if gated is None or gated == verdict_for(manifest, None)["long_text"] else gated
    if not chosen or lt.get("variant") != variant:
        return fallback, "the policy its gate verified" if gated else "the variant's own policy (never gated)"
    held = verdict_for(manifest, chosen)
    if held["verdict"] != UNGATED or gated is None:
        return chosen, f"the report's choice ({lt.get('why')})"
    return fallback, f"the policy its gate verified, {gated}: the report chose {chosen}, but {held['why']}"
