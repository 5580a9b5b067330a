"""What one request costs on each protocol at one client: wrk per route, the code before and after, interleaved.

    python -m benchmarks.serve_protocol_cost models/minilm-l6-distilbert-imdb/variants/onnx-int8 \\
        --baseline-ref de8320f --rounds 3 --duration 8 --out benchmarks/reports/serve-protocol-cost

The same reviews (`--texts` IMDb test reviews, `--long-text head`) posted one at a time by `wrk` (a C load
generator, one thread, one connection) to each protocol's classify route: /v1/classify, TEI's /predict,
POST / in huggingface_hub's InferenceClient form (with `parameters`), vLLM's /classify, and KServe V2's
/v2/models/{name}/infer (JSON). Per route: wrk's p50, and the server's own CPU ms per request from /proc,
split into the event loop (HTTP, validation, the answer) and every other thread (the model, the tokenizer),
so a figure does not depend on what the client took (the servers run with --no-inline-lone, so the
model's forward is never on the event loop: the loop's CPU is the route's own serving work). The code
before (`--baseline-ref`, extracted with git archive) and this checkout alternate within each round, one
server per code tree, the routes in turn on it. Answers are checked: every review's top label on each
route equals /v1's on the same server. Needs wrk (Debian: apt-get install wrk). Writes report.json and
report.md to --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx2

from benchmarks.harness import (
    ROOT,
    Server,
    archive_tree,
    finish,
    in_turn,
    require_wrk,
    reviews,
    run_wrk,
    thread_cpu_s,
    wrk_lua,
)
from qserve.devices import cpu_info, cpu_label
from qserve.files import now_iso
from qserve.provenance import command_line, provenance

ROUTES = ("v1", "tei", "hf", "vllm", "v2")
PATHS = {"v1": "/v1/classify", "tei": "/predict", "hf": "/", "vllm": "/classify", "v2": "/v2/models/{model}/infer"}
TITLES = {
    "v1": "/v1/classify",
    "tei": "TEI POST /predict",
    "hf": "POST / (InferenceClient form)",
    "vllm": "vLLM POST /classify",
    "v2": "KServe V2 /infer (JSON)",
}


def body(route: str, text: str) -> dict[str, Any]:
    """One review as each protocol's client sends it (InferenceClient always sends `parameters`)."""
    if route == "v1":
        return {"inputs": [text]}
    if route == "tei":
        return {"inputs": text}
    if route == "hf":
        return {"inputs": text, "parameters": {"function_to_apply": None, "top_k": None}}
    if route == "vllm":
        return {"input": text}
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}


def top_label(route: str, answer: Any) -> str:
    if route == "v1":
        return answer["predictions"][0][0]["label"]
    if route == "tei":
        return answer[0]["label"]
    if route == "hf":
        return answer[0][0]["label"]
    if route == "vllm":
        return answer["data"][0]["label"]
    return next(o["data"][0] for o in answer["outputs"] if o["name"] == "label")


def lua(route: str, path: str, texts: list[str]) -> str:
    return wrk_lua([body(route, t) for t in texts], path)


def measure(code: Path, variant: Path, texts: list[str], workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One server of the code at `code`: each route's answers checked, then wrk at one connection per route."""
    # --no-inline-lone: a lone request's forward then runs on the inference thread, not the event loop, so the
    # loop's CPU is the route's own serving work (HTTP, validation, the answer) and nothing of the model's
    flags = [str(variant), "--long-text", "head", "--log-level", args.log_level, "--no-inline-lone"]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    srv = Server(flags, code, workdir / f"server-{code.name}.log")
    try:
        srv.wait_ready(240)
        out: dict[str, Any] = {}
        with httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c:
            model = c.get("/v1/models").json()["default"]
            paths = {r: PATHS[r].format(model=model) for r in ROUTES}
            want = [top_label("v1", c.post(paths["v1"], json=body("v1", t)).json()) for t in texts]
            mismatched = {
                r: sum(top_label(r, c.post(paths[r], json=body(r, t)).json()) != w for t, w in zip(texts, want))
                for r in ROUTES
            }
        for route in ROUTES:
            script = workdir / f"{route}.lua"
            script.write_text(lua(route, paths[route], texts), encoding="utf-8")
            t0 = thread_cpu_s(srv.proc.pid)
            w = run_wrk(args.wrk, srv.url, script, 1, args.duration)
            t1 = thread_cpu_s(srv.proc.pid)
            n = max(1, w["requests"])
            loop = (t1["event_loop"] - t0["event_loop"]) * 1e3 / n
            total = sum(t1[k] - t0[k] for k in t1) * 1e3 / n
            out[route] = {
                "requests": w["requests"],
                "errors": w["errors"],
                "p50_ms": w["p50_us"] / 1e3,
                "event_loop_cpu_ms_per_req": loop,
                "other_cpu_ms_per_req": total - loop,
                "server_cpu_ms_per_req": total,
                "label_mismatches_vs_v1": mismatched[route],
            }
        return out
    finally:
        srv.stop()


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    args.wrk = require_wrk()
    variant = Path(args.variant_dir).resolve()  # the servers run in their own code trees
    texts = reviews(args.texts, pool=max(args.texts, 8))  # serve_overhead's reviews
    workdir = Path(tempfile.mkdtemp(prefix="serve-protocol-cost-"))
    codes = {"before": archive_tree(ROOT, args.baseline_ref, workdir / "before"), "after": ROOT}
    rounds: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        row = {}
        for code in in_turn(codes, rnd):
            print(f"round {rnd + 1}/{args.rounds}: code {code}", file=sys.stderr, flush=True)
            row[code] = measure(codes[code], variant, texts, workdir, args)
        rounds.append(row)
    median = {
        code: {
            r: {
                k: statistics.median(x[code][r][k] for x in rounds)
                for k in ("p50_ms", "event_loop_cpu_ms_per_req", "other_cpu_ms_per_req", "server_cpu_ms_per_req")
            }
            for r in ROUTES
        }
        for code in codes
    }
    for code in codes:
        for r in ROUTES:
            median[code][r]["errors"] = sum(x[code][r]["errors"] for x in rounds)
            median[code][r]["label_mismatches_vs_v1"] = sum(x[code][r]["label_mismatches_vs_v1"] for x in rounds)
    return {
        "created": now_iso(),
        "provenance": {**provenance(), "command": command_line([__file__, *argv])},
        "cpu": cpu_info(),
        "cpu_count": os.cpu_count(),
        "variant": args.variant_dir,
        "texts": len(texts),
        "baseline_ref": args.baseline_ref,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "load_generator": "wrk -t1 -c1",
        "median": median,
        "per_round": rounds,
    }


def render(rep: dict[str, Any]) -> str:
    lines = [
        f"# One request on each protocol: the code before (`{rep['baseline_ref']}`) and after",
        "",
        f"Created {rep['created']} on {cpu_label(rep['cpu'])} ({rep['cpu_count']} logical CPUs). "
        f"Variant `{rep['variant']}`, {rep['texts']} IMDb test "
        f"reviews under `--long-text head`, posted one at a time by {rep['load_generator']} for "
        f"{rep['duration_s']:g} s per route; medians of {rep['rounds']} rounds, the two code trees alternating. "
        "CPU ms are the server's own (utime + stime from /proc): the event loop is its main thread (HTTP, "
        "validation, the answer), other is every other thread (the model, the tokenizer); the servers run with "
        "`--no-inline-lone`, so no forward runs on the event loop.",
        "",
        "| route | p50 ms before | after | event loop CPU ms/req before | after | other CPU ms/req before | "
        "after | errors, label mismatches vs /v1 (after) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    b, a = rep["median"]["before"], rep["median"]["after"]
    for r in ROUTES:
        lines.append(
            f"| {TITLES[r]} | {b[r]['p50_ms']:.2f} | {a[r]['p50_ms']:.2f} | "
            f"{b[r]['event_loop_cpu_ms_per_req']:.3f} | **{a[r]['event_loop_cpu_ms_per_req']:.3f}** | "
            f"{b[r]['other_cpu_ms_per_req']:.2f} | {a[r]['other_cpu_ms_per_req']:.2f} | "
            f"{a[r]['errors']}, {a[r]['label_mismatches_vs_v1']} |"
        )
    lines += [
        "",
        "Wall-clock p50 on this shared 2-core machine moves by more than a millisecond between runs of the "
        "same code; the event loop's CPU per request is the steady figure for what a route's serving costs.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variant_dir")
    p.add_argument("--baseline-ref", default="de8320f", help="the code before (a git ref)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds of wrk per route")
    p.add_argument("--texts", type=int, default=64, help="IMDb test reviews posted in turn")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--log-level", default="info", help="the server's --log-level (info: the access log on)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "serve-protocol-cost")
    args = p.parse_args(argv)
    return finish("serve_protocol_cost", args, argv, run, render, lambda rep: False)


if __name__ == "__main__":
    sys.exit(main())
