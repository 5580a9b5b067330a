"""Is the fast bench's choice the full comparison's? Compare two reports of the same run's variants.

    python -m benchmarks.studies.compare_full_policy --full models/minilm-l6-distilbert-imdb/report/report.json \\
        --fast /tmp/fastcmp/report/report.json --out benchmarks/reports/fast-vs-full

--full: a bench that compared every long-text policy on every variant (the bench before issue 30);
--fast: today's pipeline bench (policies on the reference and the recommended variant; the eval cut) over
the same variant files. Writes comparison.json and comparison.md into --out and prints the md. It checks:

1. replay: the full report's own records, with every policy record dropped except the reference's and the
   recommended variant's (what the fast bench measures), give the same recommendation and served policy;
2. the eval cut replayed on the full report (reference first, then fewer weight bytes first; a variant
   strictly slower at b1 on real texts than one already meeting its bar is cut) never cuts the recommended
   variant;
3. the two runs: the recommended variant and the served policy of each, and per variant agreement (with
   its text count) and real-text b1 p50 side by side;
4. the two reports measured the same variant files (sizes and export parity per variant) on the same CPU.
Exit status 0 when 1-4 agree, 1 otherwise.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import write_report
from qserve.bench import policies
from qserve.bench.recommend import recommend
from qserve.benchreport import load_report, real_text_b1
from qserve.provenance import provenance, with_header
from qserve.variants import REFERENCES, bar_for


def _load(path: str) -> dict[str, Any]:
    return load_report(path)[0]


def _choice(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "variant": (report.get("recommended") or {}).get("variant"),
        "policy": ((report.get("long_text") or {}).get("fast") or {}).get("policy"),
        "best_policy": ((report.get("long_text") or {}).get("best") or {}).get("policy"),
    }


def replay(full: dict[str, Any]) -> dict[str, Any]:
    """The full report's choice recomputed from the records the fast bench measures only."""
    r = copy.deepcopy(full)
    r["recommended"] = recommend(r)
    keep = {r["recommended"].get("variant"), r.get("agreement_reference")}
    dropped = []
    for v in r["variants"]:
        if v["name"] not in keep and v.get("long_text_policies"):
            v["long_text_policies"] = None
            dropped.append(v["name"])
    r.pop("long_text", None)
    r["recommended"] = recommend(r)
    policies.finish(r)
    return {**_choice(r), "dropped": dropped}


def replay_cut(full: dict[str, Any]) -> dict[str, Any]:
    """Which variants the eval cut would have cut in the full run, measured in the fast bench's order."""
    ok = [v for v in full["variants"] if v.get("status") == "ok"]
    names = [(v.get("spec") or {}).get("name") for v in ok]
    ref = next((names.index(n) for n in REFERENCES if n in names), None)
    order = ([ref] if ref is not None else []) + sorted(
        (i for i in range(len(ok)) if i != ref), key=lambda i: (ok[i].get("weights_bytes") or 0, i)
    )
    bound, cut = None, []
    for i in order:
        v, real = ok[i], real_text_b1(ok[i])
        if bound is not None and real is not None and real["p50"] > bound[0]:
            cut.append(v["name"])
            continue
        agr = v.get("agreement")
        if real is not None and agr is not None and agr >= bar_for((v.get("spec") or {}).get("bits")):
            if bound is None or real["p50"] < bound[0]:
                bound = (real["p50"], v["name"])
    rec = (full.get("recommended") or {}).get("variant")
    return {"cut": cut, "recommended_cut": rec in cut}


def rows(full: dict[str, Any], fast: dict[str, Any]) -> list[dict[str, Any]]:
    by = {v["name"]: v for v in fast["variants"]}
    out = []
    for v in full["variants"]:
        w = by.get(v["name"], {})
        out.append(
            {
                "variant": v["name"],
                "full_agreement": v.get("agreement"),
                "full_n": (v.get("accuracy") or {}).get("n"),
                "fast_agreement": w.get("agreement"),
                "fast_n": (w.get("accuracy") or {}).get("n"),
                "full_real_b1_ms": (real_text_b1(v) or {}).get("p50"),
                "fast_real_b1_ms": (real_text_b1(w) or {}).get("p50"),
                "fast_policies": bool(w.get("long_text_policies")),
            }
        )
    return out


def _pct(x: Any) -> str:
    return "–" if x is None else f"{x * 100:.2f}%"


def _ms(x: Any) -> str:
    return "–" if x is None else f"{x:.2f}"


def same_exports(full: dict[str, Any], fast: dict[str, Any]) -> dict[str, Any]:
    """Whether the two reports measured the same variant files: per variant, the same bytes on disk and in
    weights and the same export-time parity figures (max |Δlogit| and probe agreement against the checkpoint,
    which move with any change of the weights); the names where any differs."""
    by = {v["name"]: v for v in fast["variants"]}
    keys = ("disk_bytes", "weights_bytes", "parity")
    differ = [
        v["name"]
        for v in full["variants"]
        if v["name"] not in by or any(v.get(k) != by[v["name"]].get(k) for k in keys)
    ]
    return {"same": not differ, "differ": differ, "compared": keys}


def render(c: dict[str, Any]) -> str:
    f, s, r = c["full"], c["fast"], c["replay"]
    L = [
        "# The fast bench's choice against a full policy comparison",
        "",
        f"Full comparison: `{c['full_report']}` (every policy on every variant). Fast bench: `{c['fast_report']}`.",
        "",
        "| | recommended variant | served policy | most accurate policy |",
        "|---|---|---|---|",
        f"| full comparison | {f['variant']} | {f['policy']} | {f['best_policy']} |",
        f"| full, replayed on the reference's and the recommended variant's records only | {r['variant']} | "
        f"{r['policy']} | {r['best_policy']} |",
        f"| fast bench | {s['variant']} | {s['policy']} | {s['best_policy']} |",
        "",
        f"Replay: policy records dropped for {', '.join(r['dropped']) or 'none'}. "
        f"Eval cut replayed on the full run: cuts {', '.join(c['cut']['cut']) or 'none'}; the recommended "
        f"variant {'IS' if c['cut']['recommended_cut'] else 'is not'} among them.",
        "",
        f"Measured on the same CPU: {'yes' if c['same_cpu'] else 'NO'} ({c['environment']['full_cpu_model']}). "
        f"Same variant files: {'yes' if c['exports']['same'] else 'NO (' + ', '.join(c['exports']['differ']) + ')'} "
        f"(per variant: {', '.join(c['exports']['compared'])}).",
        "",
        f"**Same choice: {'yes' if c['same'] else 'NO'}.**",
        "",
        "| variant | agreement, full (texts) | agreement, fast (texts) | real b1 p50 full (ms) | real b1 p50 fast (ms) "
        "| policies compared in the fast bench |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for x in c["rows"]:
        L.append(
            f"| {x['variant']} | {_pct(x['full_agreement'])} ({x['full_n']}) | {_pct(x['fast_agreement'])} "
            f"({x['fast_n']}) | {_ms(x['full_real_b1_ms'])} | {_ms(x['fast_real_b1_ms'])} | "
            f"{'yes' if x['fast_policies'] else 'no'} |"
        )
    st = c.get("fast_stage_s") or {}
    if st:
        L += ["", "Fast pipeline stage times (s): " + ", ".join(f"{k} {v:,.0f}" for k, v in st.items()) + "."]
    L += [
        "",
        f"Sum of the variants' own children's wall time: full {c['full_child_s']:,.0f} s, fast "
        f"{c['fast_child_s']:,.0f} s (the fast bench's first pass only; its policy passes are in the bench stage "
        "time).",
        "",
    ]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", required=True, help="report.json (or its dir) of the full comparison")
    p.add_argument("--fast", required=True, help="report.json (or its dir) of the fast bench, same variant files")
    p.add_argument("--out", help="directory for comparison.json and comparison.md")
    args = p.parse_args(argv)

    full, fast = _load(args.full), _load(args.fast)
    c = {
        "full_report": str(args.full),
        "fast_report": str(args.fast),
        "full": _choice(full),
        "fast": _choice(fast),
        "replay": replay(full),
        "cut": replay_cut(full),
        "rows": rows(full, fast),
        "exports": same_exports(full, fast),
        "fast_stage_s": (fast.get("pipeline") or {}).get("stage_s"),
        "full_child_s": sum(v.get("wall_s") or 0 for v in full["variants"]),
        "fast_child_s": sum(v.get("wall_s") or 0 for v in fast["variants"]),
    }
    # the figures are the two reports' own: the same CPU measured both, or the side-by-side means nothing
    cpus = [((r.get("environment") or {}).get("cpu") or {}).get("model") for r in (full, fast)]
    c["environment"] = {"cpu": (fast.get("environment") or {}).get("cpu"), "full_cpu_model": cpus[0]}
    c["same_cpu"] = cpus[0] == cpus[1] and cpus[0] is not None
    keys = ("variant", "policy")
    c["same"] = (
        all(c["full"][k] == c["replay"][k] == c["fast"][k] for k in keys)
        and not c["cut"]["recommended_cut"]
        and c["exports"]["same"]
        and c["same_cpu"]
    )
    c["provenance"] = provenance()
    print(with_header(render(c), c["provenance"]))
    if args.out:
        write_report(Path(args.out), c, render(c), stem="comparison", echo=False)
    return 0 if c["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
