"""One text, one answer across protocols, and what the new routes cost the old ones, in one run.

    python -m benchmarks.serve_protocols models/minilm-l6-distilbert-imdb/variants/onnx-int8 \\
        --reviews 64 --duration 10 --rounds 3 --out benchmarks/reports/serve-protocols --force

Two parts, one machine, the server in its own process (so the client's Python does not share its GIL):
1. answers: `--reviews` real IMDb test reviews (the embedded set, qserve.data.datasets) scored through /v1, V2 over
   HTTP and over gRPC, TEI's /predict and vLLM's /classify, first each text alone (one request at a time),
   then every (protocol, text) request at once in a shuffled order (32 in flight): every protocol's label and
   score row must equal /v1's alone, to the last bit (`bit_identical`), and `max_abs_diff` says by how much
   they would differ otherwise;
2. cost: served throughput on /v1 at concurrency 32 (`qserve loadtest`, every answer checked), this
   checkout's server against the code before the new routes (`--old-ref`, checked out into a temporary
   git worktree), interleaved old, new, old, new... for `--rounds` rounds of `--duration` s each, with
   the server's own CPU seconds per request from /proc (less noisy than wall time on a shared machine).
Writes report.json and report.md under --out.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import numpy as np

from benchmarks.harness import ROOT, Server, free_port, reviews, write_report
from qserve import QserveError
from qserve.devices import cpu_info, cpu_label
from qserve.files import now_iso, refuse_existing
from qserve.loadtest import run_loadtest
from qserve.provenance import provenance

PROTOCOLS = ("v1", "v2", "v2-grpc", "tei", "vllm")
Answer = tuple[str, tuple[float, ...]]
"""(best label, every label's score in the model's label order)"""


def start_server(tree: Path, variant: Path, grpc_port: int | None, threads: int | None, log: Path) -> Server:
    """`qserve serve` of the code at `tree` on `variant` (gRPC on `grpc_port` if given), not yet ready."""
    flags = [str(variant.resolve()), "--log-level", "warning", "--max-inputs", "64", "--max-chars", "100000"]
    if grpc_port is not None:
        flags += ["--grpc-port", str(grpc_port)]
    if threads:
        flags += ["--threads", str(threads)]
    return Server(flags, tree, log)


# -- part 1: answers ----------------------------------------------------------------------------------
class Caller:
    """One protocol's request for one text, decoded to an Answer."""

    def __init__(self, url: str, grpc_target: str, model: str, labels: list[str]):
        self.url, self.grpc_target, self.model, self.labels = url, grpc_target, model, labels

    def __call__(self, protocol: str, text: str, http: Any, grpc_client: Any) -> Answer:
        if protocol == "v1":
            preds = http.post("/v1/classify", json={"inputs": [text]}).json()["predictions"][0]
            return self.by_label(preds[0]["label"], {p["label"]: p["score"] for p in preds})
        if protocol == "tei":
            preds = http.post("/predict", json={"inputs": text}).json()
            return self.by_label(preds[0]["label"], {p["label"]: p["score"] for p in preds})
        if protocol == "vllm":
            d = http.post("/classify", json={"input": text}).json()["data"][0]
            return d["label"], tuple(float(x) for x in d["probs"])
        if protocol == "v2":
            out = {
                o["name"]: o["data"]
                for o in http.post(
                    f"/v2/models/{self.model}/infer",
                    json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]},
                ).json()["outputs"]
            }
            return out["label"][0], tuple(float(x) for x in out["probabilities"])
        import tritonclient.grpc as tg

        i = tg.InferInput("text", [1], "BYTES")
        i.set_data_from_numpy(np.array([text.encode("utf-8")], dtype=object))
        r = grpc_client.infer(self.model, [i])
        return r.as_numpy("label")[0].decode(), tuple(float(x) for x in r.as_numpy("probabilities")[0])

    def by_label(self, best: str, scores: dict[str, float]) -> Answer:
        return best, tuple(scores[x] for x in self.labels)


def answers(url: str, grpc_target: str, texts: list[str], workers: int) -> dict[str, Any]:
    import tritonclient.grpc as tg

    with httpx2.Client(base_url=url, timeout=60, trust_env=False) as c:
        info = c.get("/v1/models").json()
    model = info["default"]
    labels = next(m["labels"] for m in info["models"] if m["id"] == model)
    call = Caller(url, grpc_target, model, labels)
    alone: dict[str, list[Answer]] = {}
    g = tg.InferenceServerClient(grpc_target)
    with httpx2.Client(base_url=url, timeout=60, trust_env=False) as c:
        for p in PROTOCOLS:
            alone[p] = [call(p, t, c, g) for t in texts]
    jobs = [(p, i) for p in PROTOCOLS for i in range(len(texts))]
    random.Random(0).shuffle(jobs)
    clients = [
        (httpx2.Client(base_url=url, timeout=60, trust_env=False), tg.InferenceServerClient(grpc_target))
        for _ in range(workers)
    ]

    def run(k: int) -> tuple[str, int, Answer]:
        p, i = jobs[k]
        c, gc = clients[k % workers]
        return p, i, call(p, texts[i], c, gc)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:  # httpx2 and gRPC clients are thread-safe: spread over `workers`
        together = list(pool.map(run, range(len(jobs))))
    wall = time.perf_counter() - t0
    for c, gc in clients:
        c.close()
        gc.close()
    g.close()
    ref = alone["v1"]
    rows: dict[str, dict[str, Any]] = {}
    for p in PROTOCOLS:
        got = {"alone": alone[p], "concurrent": [None] * len(texts)}
        for q, i, a in together:
            if q == p:
                got["concurrent"][i] = a
        rows[p] = {}
        for when, ans in got.items():
            diffs = [max(abs(x - y) for x, y in zip(a[1], r[1])) for a, r in zip(ans, ref)]
            rows[p][when] = {
                "same_label": sum(a[0] == r[0] for a, r in zip(ans, ref)),
                "bit_identical": sum(a == r for a, r in zip(ans, ref)),
                "max_abs_diff": max(diffs),
            }
    return {
        "model": model,
        "labels": labels,
        "texts": len(texts),
        "workers": workers,
        "concurrent_wall_s": wall,
        "requests": len(jobs) * 2,
        "by_protocol": rows,
    }


# -- part 2: cost -------------------------------------------------------------------------------------------
def old_tree(ref: str, where: Path) -> Path:
    path = where / "old"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True, capture_output=True
    )
    return path


def throughput(
    trees: dict[str, Path],
    variant: Path,
    rounds: int,
    duration: float,
    texts: list[str],
    threads: int | None,
    workdir: Path,
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for r in range(rounds):
        for key, tree in trees.items():  # interleaved: a machine's slow minute lands on both sides
            srv = start_server(tree, variant, None, threads, workdir / f"{key}-{r}.log")
            try:
                srv.wait_ready()
                cpu0 = srv.cpu_s()
                level = run_loadtest(srv.url, [32], duration, texts=texts)["levels"][0]
                cpu = srv.cpu_s() - cpu0
            finally:
                srv.stop()
            runs[key].append(
                {
                    "round": r,
                    "rps": level["throughput_rps"],
                    "p50_ms": level["p50_ms"],
                    "p99_ms": level["p99_ms"],
                    "requests": level["requests"],
                    "errors": level["errors"],
                    "mismatched": level["mismatched"],
                    "lost": level["lost"],
                    "server_cpu_ms_per_request": 1e3 * cpu / max(1, level["requests"]),
                }
            )

    summary = {
        k: {
            "median_rps": statistics.median(x["rps"] for x in v),
            "median_cpu_ms_per_request": statistics.median(x["server_cpu_ms_per_request"] for x in v),
        }
        for k, v in runs.items()
    }
    ratios = [n["rps"] / o["rps"] for o, n in zip(runs["old"], runs["new"]) if o["rps"]]
    summary["rps_ratio_new_over_old"] = statistics.median(ratios) if ratios else None
    summary["rps_ratio_per_round"] = ratios
    return {"runs": runs, "summary": summary, "rounds": rounds, "duration_s": duration, "concurrency": 32}


def render_md(rep: dict[str, Any]) -> str:
    a, t = rep["answers"], rep["throughput"]
    lines = [
        "# One text, one answer across protocols; /v1 throughput before and after the new routes",
        "",
        f"Variant `{rep['variant']}`, {a['texts']} real IMDb test reviews, {rep['machine']}.",
        "",
        "## Answers: every protocol against /v1 alone",
        "",
        "| protocol | alone: same label | alone: bit-identical | concurrent: same label | "
        "concurrent: bit-identical | max abs diff |",
        "|---|---|---|---|---|---|",
    ]
    for p, row in a["by_protocol"].items():
        al, co = row["alone"], row["concurrent"]
        lines.append(
            f"| {p} | {al['same_label']}/{a['texts']} | {al['bit_identical']}/{a['texts']} | "
            f"{co['same_label']}/{a['texts']} | {co['bit_identical']}/{a['texts']} | "
            f"{max(al['max_abs_diff'], co['max_abs_diff']):.3g} |"
        )
    lines += [
        "",
        f"Concurrent: {a['workers']} requests in flight, every protocol mixed in a shuffled order "
        f"({a['concurrent_wall_s']:.1f} s). Alone, each protocol sends the text alone, as /v1 did: the "
        "same bits are the claim. Concurrently a text shares its batch; a variant that runs each row "
        "alone (onnx-int8) gives the same bits still, a padded torch batch may move a score by an ulp, on "
        "/v1 itself too (its own row above).",
        "",
        f"## /v1 at concurrency 32: `{rep['old_ref']}` (old) and this checkout (new), interleaved",
        "",
        "| round | old req/s | new req/s | new / old | old server CPU ms/req | new server CPU ms/req |",
        "|---|---|---|---|---|---|",
    ]
    for o, n in zip(t["runs"]["old"], t["runs"]["new"]):
        lines.append(
            f"| {o['round']} | {o['rps']:.1f} | {n['rps']:.1f} | {n['rps'] / o['rps']:.3f} | "
            f"{o['server_cpu_ms_per_request']:.2f} | {n['server_cpu_ms_per_request']:.2f} |"
        )
    s = t["summary"]
    lines += [
        "",
        f"Median new / old: {s['rps_ratio_new_over_old']:.3f} ({t['rounds']} rounds of "
        f"{t['duration_s']:.0f} s each; errors, lost and mismatched answers: "
        f"{sum(x['errors'] + x['lost'] + x['mismatched'] for v in t['runs'].values() for x in v)}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variant_dir", type=Path)
    p.add_argument("--reviews", type=int, default=64, help="real test reviews scored through every protocol")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of /v1 load per server per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved old/new rounds")
    p.add_argument("--old-ref", default="b7b3591", help="the code before the new routes (a git ref)")
    p.add_argument("--threads", type=int, default=None, help="the servers' intra-op threads")
    p.add_argument("--workers", type=int, default=32, help="requests in flight in the concurrent answers pass")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "serve-protocols")
    p.add_argument("--force", action="store_true", help="replace an existing report")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    try:
        refuse_existing(args.out / "report.json", args.force)
        texts = reviews(args.reviews)
        with tempfile.TemporaryDirectory(prefix="serve-protocols-") as tmp:
            work = Path(tmp)
            grpc_port = free_port()
            srv = start_server(ROOT, args.variant_dir, grpc_port, args.threads, work / "answers.log")
            try:
                srv.wait_ready()
                ans = answers(srv.url, f"127.0.0.1:{grpc_port}", texts, args.workers)
            finally:
                srv.stop()
            old = old_tree(args.old_ref, work)
            try:
                tput = throughput(
                    {"old": old, "new": ROOT}, args.variant_dir, args.rounds, args.duration, texts, args.threads, work
                )
            finally:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                    check=False,
                    capture_output=True,
                )
    except (QserveError, subprocess.CalledProcessError) as e:
        print(f"serve_protocols: error: {e}", file=sys.stderr)
        return 2

    cpu = cpu_info()
    rep = {
        "created": now_iso(),
        "variant": str(args.variant_dir),
        "old_ref": args.old_ref,
        "environment": {"machine": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count()},
        "machine": f"{cpu_label(cpu)}, {os.cpu_count()} CPUs",
        "answers": ans,
        "throughput": tput,
        "provenance": provenance(),
    }
    write_report(args.out, rep, render_md(rep))
    alone_ok = all(r["alone"]["bit_identical"] == ans["texts"] for r in ans["by_protocol"].values())
    labels_ok = all(r["concurrent"]["same_label"] == ans["texts"] for r in ans["by_protocol"].values())
    return 0 if alone_ok and labels_ok else 1


if __name__ == "__main__":
    sys.exit(main())
