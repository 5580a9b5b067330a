"""Which long-text policy a gate verdict holds for, and the verdict for the policy a server serves.

    python -c "from qserve.artifact import read_manifest; from qserve.gatepolicy import verdict_for; \\
print(verdict_for(read_manifest('models/minilm-imdb-variants/onnx-int8'), 'tail'))"

A verdict holds only under the policy its texts were scored under (`gate.long_text`, else the manifest's own): another
policy cuts long texts differently, so its agreement and accuracy are another variant's (docs/gate.md).
"""

from __future__ import annotations

from qserve import longtext
from qserve.artifact import Manifest
from qserve.longtext import LongTextPolicy

PASSED, FAILED, UNGATED = "passed", "failed", "ungated"


def written(policy: str | LongTextPolicy | None, manifest: Manifest) -> str:
    """`policy` (None: the manifest's own, else head) written out for the variant's max_length."""
    return str(longtext.resolve(policy or manifest.long_text or "head", manifest.max_length))


def gated_policy(manifest: Manifest) -> str | None:
    """The policy the manifest's gate verdict holds for, written out; None when never gated."""
    g = manifest.gate
    if not g:
        return None
    return written(g.get("long_text"), manifest)


def verdict_for(manifest: Manifest, policy: str | LongTextPolicy | None) -> dict[str, str | None]:
    """{"verdict": passed | failed | undecided | ungated, "long_text": the served policy, "gated_long_text", "why"}
    for the variant served under `policy` (None: its own)."""
    served, gated = written(policy, manifest), gated_policy(manifest)
    if gated is None:
        return {"verdict": UNGATED, "long_text": served, "gated_long_text": None, "why": "never gated"}
    if gated != served:
        return {
            "verdict": UNGATED,
            "long_text": served,
            "gated_long_text": gated,
            "why": f"the gate verified {gated}, not {served}; gate it under {served} with "
            f"`qserve gate VARIANT --long-text {served}`",
        }
    g = manifest.gate or {}
    verdict = g.get("decision") or (PASSED if g.get("passed") else FAILED)  # undecided: more texts could decide it
    return {"verdict": verdict, "long_text": served, "gated_long_text": gated, "why": None}
