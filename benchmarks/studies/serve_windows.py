"""Served windows on real reviews: one text, one answer at concurrency 32, and windowed texts/s against the
ceiling that the window count sets.

    python -m benchmarks.studies.serve_windows models/minilm-l6-distilbert-imdb/variants/onnx-fp32 --threads 2 \\
        --out benchmarks/reports/serve-windows --force

One `qserve serve` of the variant (a child process, batching on) and the first --reviews reviews of the
embedded IMDb test split (the texts `qserve bench --max-eval-samples N` scores), one text per request
(--per-request K: K texts per request in the concurrent phase). Per long-text policy (--policies, each
sent as the request's `long_text`, so one server serves them all):

  c1   every review alone, one request at a time: the reference answer of each text under that policy;
  c32  every review again from 32 concurrent clients: texts/s, and against the c1 answer of the same text
       the label changes (the bar: 0; the server promises one text, one answer) and the largest |Δprob|.

The reviews are cut into --rounds chunks; each round runs every policy on its chunk, the policies' order
reversed every other round, so drift on a shared machine hits them alike. The ceiling of a windowed
policy is head's c32 texts/s divided by that policy's mean windows per text (from the responses'
`windows`): a text of 3 windows costs 3 forwards of a head-cut text, so windows cannot beat it; the bar
is windowed texts/s >= 0.9x the ceiling. Writes report.json and report.md (with provenance) to --out.

Time (estimate, 2 cores, onnx-fp32): ~7 min for the 2,000 reviews under head and windows:128:96:mean, each
text sent four times (c1 and c32 under each policy; windows score ~3.2 pieces a text, so they take ~3/4
of it). `--policies head,windows:128:96:mean,windows:128:126:mean` adds windows without overlap (126 text
tokens a window, ~2.9 a text): ~4 min more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Conn, VariantServer, batch_totals, finish, in_turn, review_split
from qserve.devices import cpu_info, cpu_label
from qserve.files import now_iso, refuse_existing
from qserve.longtext import parse_list
from qserve.provenance import command_line, provenance
from qserve.serve.infra.config import ServeConfig

log = logging.getLogger("serve_windows")
POLICIES = "head,windows:128:96:mean"
RATIO_BAR = 0.9
Answer = tuple[list[float], int]
"""One text's served answer: its probabilities in the model's label order, and how many windows were scored."""


# -- clients -----------------------------------------------------------------------------------
def _answers(data: bytes, labels: list[str]) -> list[Answer]:
    body = json.loads(data)
    return [
        ([{p["label"]: p["score"] for p in preds}[lb] for lb in labels], int(w))
        for preds, w in zip(body["predictions"], body["windows"])
    ]


def _body(texts: list[str], policy: str) -> bytes:
    return json.dumps({"inputs": texts if len(texts) > 1 else texts[0], "top_k": None, "long_text": policy}).encode()


async def send_all(
    url: str, labels: list[str], texts: list[str], policy: str, concurrency: int, per_request: int
) -> tuple[list[Answer | None], float, dict[str, int]]:
    """Every text once, `per_request` texts per request, from `concurrency` clients taking the next request as
    they finish one: (answer per text, None where it got none; elapsed seconds; errors and lost requests)."""
    chunks = [list(range(i, min(i + per_request, len(texts)))) for i in range(0, len(texts), per_request)]
    out: list[Answer | None] = [None] * len(texts)
    n = {"errors": 0, "lost": 0}
    todo = iter(chunks)

    async def worker() -> None:
        conn = Conn(f"{url}/v1/classify", {}, 300.0)
        for idx in todo:  # one shared iterator: each request is sent by exactly one client
            try:
                status, data = await conn.post(_body([texts[i] for i in idx], policy))
            except Exception:  # noqa: BLE001 - a request without an answer is counted, not fatal
                n["lost"] += 1
                await conn.close()
                continue
            if status != 200:
                n["errors"] += 1
                log.warning("%s answered %d: %s", policy, status, data[:300])
                continue
            for i, a in zip(idx, _answers(data, labels)):
                out[i] = a
        await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(chunks)))))
    return out, time.perf_counter() - t0, n


# -- pure parts (tests/unit/test_serve_windows.py) ----------------------------------------------------
def changes(ref: list[Answer | None], got: list[Answer | None]) -> dict[str, Any]:
    """Against the reference answer of the same text: label changes, the largest |Δprob|, and how many texts
    have both answers (a text missing either is counted as missing, never as agreeing)."""
    compared = flips = 0
    worst = 0.0
    for a, b in zip(ref, got):
        if a is None or b is None:
            continue
        compared += 1
        pa, pb = a[0], b[0]
        flips += max(range(len(pa)), key=pa.__getitem__) != max(range(len(pb)), key=pb.__getitem__)
        worst = max(worst, max(abs(x - y) for x, y in zip(pa, pb)))
    return {"compared": compared, "missing": len(ref) - compared, "label_changes": flips, "max_abs_dprob": worst}


def mean_windows(answers: list[Answer | None]) -> float | None:
    ws = [a[1] for a in answers if a is not None]
    return sum(ws) / len(ws) if ws else None


def ceiling(head_texts_per_s: float | None, windows_per_text: float | None) -> float | None:
    """The texts/s a windowed policy can reach at most: head's, shared among each text's windows."""
    if not head_texts_per_s or not windows_per_text:
        return None
    return head_texts_per_s / windows_per_text


def summarize(
    policies: list[str],
    texts: dict[str, int],
    elapsed: dict[str, dict[str, list[float]]],
    answers: dict[str, dict[str, list[Answer | None]]],
    labels: list[int],
) -> dict[str, Any]:
    """Per policy: texts/s at c1 and c32 (pooled over rounds, and per round), accuracy, windows per text,
    answer changes c32 vs c1; for every policy but head, its ceiling and texts/s over it."""
    out: dict[str, Any] = {}
    for pol in policies:
        row: dict[str, Any] = {}
        for phase in ("c1", "c32"):
            secs = elapsed[pol][phase]
            row[f"{phase}_texts_per_s"] = sum(texts[phase + str(r)] for r in range(len(secs))) / sum(secs)
            row[f"{phase}_rounds_texts_per_s"] = [texts[phase + str(r)] / s for r, s in enumerate(secs)]
        ref = answers[pol]["c1"]
        row["windows_per_text"] = mean_windows(ref)
        row["max_windows"] = max((a[1] for a in ref if a is not None), default=None)
        row["windowed_share"] = sum(a is not None and a[1] > 1 for a in ref) / len(ref)
        right = [a is not None and max(range(len(a[0])), key=a[0].__getitem__) == y for a, y in zip(ref, labels)]
        row["accuracy_c1"] = sum(right) / len(right)
        row["c32_vs_c1"] = changes(ref, answers[pol]["c32"])
        row["windows_changed"] = sum(
            a is not None and b is not None and a[1] != b[1] for a, b in zip(ref, answers[pol]["c32"])
        )
        out[pol] = row
    head = out.get("head", {}).get("c32_texts_per_s")
    for pol in policies:
        if pol == "head":
            continue
        row = out[pol]
        row["ceiling_texts_per_s"] = ceiling(head, row["windows_per_text"])
        row["ratio_to_ceiling"] = (
            row["c32_texts_per_s"] / row["ceiling_texts_per_s"] if row["ceiling_texts_per_s"] else None
        )
        # per round: the policy's rate over head's in the same round, times the round's windows per text
        row["ratio_rounds"] = (
            [
                w / h * row["windows_per_text"]
                for w, h in zip(row["c32_rounds_texts_per_s"], out["head"]["c32_rounds_texts_per_s"])
            ]
            if "head" in out
            else []
        )
    return {
        "policies": out,
        "label_changes": sum(r["c32_vs_c1"]["label_changes"] for r in out.values()),
        "missing": sum(r["c32_vs_c1"]["missing"] for r in out.values()),
        "ratios_ok": all(r.get("ratio_to_ceiling") is None or r["ratio_to_ceiling"] >= RATIO_BAR for r in out.values()),
    }


# -- the run -----------------------------------------------------------------------------------
def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    refuse_existing(args.out / "report.json", args.force)
    policies = parse_list(args.policies, "--policies")
    if "head" not in policies:
        policies = ["head", *policies]  # the ceiling is head's texts/s
    # the first N reviews of the IMDb test split, as `qserve bench --max-eval-samples N` scores them
    test = review_split(args.reviews, pool=args.reviews)
    texts, labels = test.texts, test.labels
    bounds = [round(r * len(texts) / args.rounds) for r in range(args.rounds + 1)]
    log.info(
        "%d reviews in %d rounds, policies %s, %d text(s) per request at c%d",
        len(texts),
        args.rounds,
        ", ".join(policies),
        args.per_request,
        args.concurrency,
    )
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    extra = ["--max-batch-size", str(args.max_batch_size)] if args.max_batch_size else []
    answers: dict[str, dict[str, list[Answer | None]]] = {
        p: {"c1": [None] * len(texts), "c32": [None] * len(texts)} for p in policies
    }
    elapsed: dict[str, dict[str, list[float]]] = {p: {"c1": [], "c32": []} for p in policies}
    counted: dict[str, int] = {}
    failures = {"errors": 0, "lost": 0}
    batches: dict[str, list[float]] = {p: [0.0, 0.0] for p in policies}  # c32 forwards, texts in them
    srv = VariantServer("server", args.variant_dir, ROOT, extra, args.threads, logs)
    try:
        srv.wait_ready()
        log.info("server ready on %s", srv.url)
        for phase, conc, per in (("c1", 1, 1), ("c32", args.concurrency, args.per_request)):
            for r in range(args.rounds):
                lo, hi = bounds[r], bounds[r + 1]
                counted[phase + str(r)] = hi - lo
                for pol in in_turn(policies, r):
                    n0, s0 = batch_totals(srv.url)
                    got, secs, n = asyncio.run(send_all(srv.url, srv.labels, texts[lo:hi], pol, conc, per))
                    n1, s1 = batch_totals(srv.url)
                    answers[pol][phase][lo:hi] = got
                    elapsed[pol][phase].append(secs)
                    failures["errors"] += n["errors"]
                    failures["lost"] += n["lost"]
                    if phase == "c32":
                        batches[pol][0] += n1 - n0
                        batches[pol][1] += s1 - s0
                    log.info(
                        "%s round %d %s: %d texts in %.1f s (%.1f texts/s)",
                        phase,
                        r + 1,
                        pol,
                        hi - lo,
                        secs,
                        (hi - lo) / secs,
                    )
    finally:
        srv.stop()
    summary = summarize(policies, counted, elapsed, answers, labels)
    for pol, (forwards, in_them) in batches.items():
        summary["policies"][pol]["c32_texts_per_batch"] = in_them / forwards if forwards else None
    summary.update(failures)
    return {
        "created": now_iso(),
        "environment": {"cpu": cpu_info(), "cpu_count": os.cpu_count()},
        "settings": {
            "variant": str(args.variant_dir),
            "reviews": len(texts),
            "rounds": args.rounds,
            "concurrency": args.concurrency,
            "per_request": args.per_request,
            "policies": policies,
            "threads": args.threads,
            "max_batch_size": args.max_batch_size,
            "max_windows": ServeConfig.max_windows,
            "ratio_bar": RATIO_BAR,
        },
        "server": srv.info,
        "summary": summary,
        "provenance": {**provenance(), "command": command_line([__file__, *argv])},
    }


# -- report ------------------------------------------------------------------------------------
def render(rep: dict[str, Any]) -> str:
    s, st = rep["summary"], rep["settings"]

    def f(x: Any, nd: int = 1) -> str:
        return "–" if x is None else f"{x:,.{nd}f}"

    def spread(xs: list[float], nd: int = 1) -> str:
        return f" ({min(xs):.{nd}f}-{max(xs):.{nd}f})" if len(xs) > 1 else ""

    conc = st["concurrency"]
    L = [
        f"# Served windows on real reviews: {rep['server'].get('variant')}",
        "",
        f"Created {rep['created']} on {cpu_label(rep['environment']['cpu'])} ({rep['environment']['cpu_count']} "
        f"logical CPUs), threads={st['threads'] or 'library default'}, max batch size "
        f"{st['max_batch_size'] or 'the server default'}, at most {st.get('max_windows')} windows a text. One "
        f"`qserve serve` of `{st['variant']}` (max_length "
        f"{rep['server'].get('max_length')}); the first {st['reviews']:,} reviews of the IMDb test split, each sent "
        f"once alone (c1, the reference) and once from {conc} concurrent clients ({st['per_request']} text(s) per "
        f"request), under every policy; {st['rounds']} rounds interleave the policies (order reversed every other "
        "round). Client and server share the machine's cores.",
        "",
        f"Answers at c{conc} that differ from the same text's c1 answer: **{s['label_changes']} label changes** "
        f"(bar: 0); requests with errors / lost: {s['errors']} / {s['lost']}; texts without both answers: "
        f"{s['missing']}.",
        "",
        f"| policy | c1 texts/s | c{conc} texts/s (rounds) | windows per text | ceiling texts/s (head / windows) "
        f"| c{conc} / ceiling (bar {st['ratio_bar']}) | texts per forward at c{conc} | accuracy (c1) "
        f"| label changes c{conc} vs c1 | max \\|Δprob\\| |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pol, r in s["policies"].items():
        ratio = r.get("ratio_to_ceiling")
        L.append(
            f"| {pol} | {f(r['c1_texts_per_s'])} | {f(r['c32_texts_per_s'])}{spread(r['c32_rounds_texts_per_s'])} "
            f"| {f(r['windows_per_text'], 2)} | {f(r.get('ceiling_texts_per_s'))} | "
            + ("–" if ratio is None else f"**{ratio:.2f}x**{spread(r['ratio_rounds'], 2)}")
            + f" | {f(r.get('c32_texts_per_batch'), 1)} | {r['accuracy_c1'] * 100:.2f}% | "
            f"{r['c32_vs_c1']['label_changes']} of {r['c32_vs_c1']['compared']:,} | "
            f"{r['c32_vs_c1']['max_abs_dprob']:.1e} |"
        )
    L += [
        "",
        "Reading it: a windowed text costs one forward row per window, so head's texts/s divided by the mean "
        "windows per text is the most a windowed policy can serve (its ceiling); the ratio says how much of it "
        "the server keeps (tokenizing the whole review, cutting, padding the last, shorter window and "
        "aggregating are the rest). Texts per forward counts texts in the server's batches (the batcher "
        "gathers up to --max-batch-size texts; the runtime forwards their windows at most that many rows at "
        "a time). Per-round ranges in brackets.",
        "",
    ]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "variant_dir",
        type=Path,
        nargs="?",
        default=ROOT / "models" / "minilm-l6-distilbert-imdb" / "variants" / "onnx-fp32",
        help="the variant served (default: models/minilm-l6-distilbert-imdb/variants/onnx-fp32)",
    )
    p.add_argument(
        "--policies",
        default=POLICIES,
        help=f"long-text policies, comma-separated; head is always among them (default {POLICIES})",
    )
    p.add_argument("--reviews", type=int, default=2000, help="test reviews sent (default 2000)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds the reviews are split into (default 4)")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent clients (default 32)")
    p.add_argument("--per-request", type=int, default=1, help="texts per request at --concurrency (default 1)")
    p.add_argument("--max-batch-size", type=int, default=None, help="the server's (default: serve's own)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of the server")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "serve-windows")
    p.add_argument("--force", action="store_true", help="replace an existing report")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    for name in ("reviews", "rounds", "concurrency", "per_request"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.rounds = min(args.rounds, args.reviews)
    return finish(
        "serve_windows",
        args,
        argv,
        run,
        render,
        lambda rep: (
            rep["summary"]["label_changes"]
            or rep["summary"]["errors"]
            or rep["summary"]["lost"]
            or rep["summary"]["missing"]
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
