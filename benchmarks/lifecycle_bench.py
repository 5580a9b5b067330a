"""Model lifecycle benchmark: what shadow agreement costs, and what a hot swap does to latency and memory.

    python -m benchmarks.lifecycle_bench models/minilm-l6-distilbert-imdb/variants/onnx-int8 \\
        --swap-to models/minilm-l6-distilbert-imdb/extra/onnx-int8-v2 \\
        --reference models/minilm-l6-distilbert-imdb/variants/onnx-fp32 --duration 10 --rounds 3

Side by side in one run, on one machine (client and servers share its cores):
1. shadow cost: two `qserve serve --model-repository ROOT` servers in child processes serve the same
   model m (ROOT/m -> VARIANT_DIR); one adds `--shadow m=REFERENCE --shadow-rate 0.05`. A closed loop of
   --concurrency clients (one short review per request) drives each for --duration seconds, alternating
   plain, shadowed, plain, ... for --rounds rounds, so drift on a shared machine hits both. Reported:
   requests/s (median of rounds), the cost 1 - shadowed/plain, p50/p99, and what the shadow re-scored
   and dropped.
2. hot swap: the plain server under --swap-concurrency clients. After --swap-before-s, ROOT/m is
   repointed (one atomic rename of a symlink) to the other dir and POST /v2/repository/models/m/load is
   timed; it answers once the new version serves and the old one is released. Latency p50/p99/max of
   requests started before the load call, during it, and after it; the server's RSS sampled every 20 ms:
   before (median), during (peak), after (median, from --settle-s after the load answered). Rounds swap
   back and forth. Every answer is checked: status 200, model_version the old or the new version.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import psutil

from benchmarks.harness import ROOT, Server, write_report
from qserve import QserveError
from qserve.artifact import read_manifest
from qserve.devices import cpu_info, cpu_label
from qserve.files import now_iso, refuse_existing
from qserve.loadtest import default_texts
from qserve.provenance import provenance

log = logging.getLogger("lifecycle_bench")
MODEL = "m"


# -- servers --------------------------------------------------------------------------------------
class RepositoryServer(Server):
    """`qserve serve --model-repository ROOT` in a child process (its own GIL), ready to take load."""

    def __init__(self, args: argparse.Namespace, root: Path, workdir: Path, tag: str, shadow: bool):
        flags = ["--model-repository", str(root), "--device", args.device, "--log-level", "warning"]
        if args.threads:
            flags += ["--threads", str(args.threads)]
        if shadow:
            flags += ["--shadow", f"{MODEL}={args.reference}", "--shadow-rate", str(args.shadow_rate)]
        super().__init__(flags, ROOT, workdir / f"server-{tag}.log", tag=f"{tag} server")

    def model(self) -> dict[str, Any]:
        return dict(self.models()["models"][0])


class RssSampler:
    """The server process's resident set size every `every_s` seconds, on a thread: [(t, bytes)]."""

    def __init__(self, pid: int, every_s: float = 0.02):
        self.proc, self.every_s = psutil.Process(pid), every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self.proc.memory_info().rss))
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> list[int]:
        return [rss for t, rss in self.samples if t0 <= t < t1]


# -- load -----------------------------------------------------------------------------------------
Record = tuple[float, float, int, str | None]  # (start, end, status, model_version)


async def _client(c: Any, texts: list[str], k: int, stop: asyncio.Event, out: list[Record]) -> None:
    i = k
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            r = await c.post("/v1/classify", json={"inputs": texts[i % len(texts)], "model": MODEL})
            status, version = r.status_code, (r.json().get("model_version") if r.status_code == 200 else None)
        except Exception:  # noqa: BLE001 - a request without an answer is recorded as status 0 (lost)
            status, version = 0, None
        out.append((t0, time.perf_counter(), status, version))
        i += 97


async def _drive(url: str, texts: list[str], concurrency: int, during: Any) -> list[Record]:
    """`concurrency` closed-loop clients while the coroutine `during(client)` runs."""
    out: list[Record] = []
    stop = asyncio.Event()
    async with httpx2.AsyncClient(
        base_url=url, timeout=120, trust_env=False, limits=httpx2.Limits(max_connections=concurrency + 4)
    ) as c:
        tasks = [asyncio.create_task(_client(c, texts, k, stop, out)) for k in range(concurrency)]
        try:
            await during(c)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    return out


def _lat(records: list[Record]) -> dict[str, Any]:
    ms = np.asarray([(e - s) * 1e3 for s, e, status, _ in records if status == 200])
    if not len(ms):
        return {"requests": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "requests": int(len(ms)),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def shadow_round(srv: RepositoryServer, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    marks: dict[str, float] = {}

    async def hold(_c: Any) -> None:
        await asyncio.sleep(min(1.0, args.duration))  # ramp up: connections open, batches forming
        marks["t0"] = time.perf_counter()
        await asyncio.sleep(args.duration)
        marks["t1"] = time.perf_counter()

    recs = asyncio.run(_drive(srv.url, texts, args.concurrency, hold))
    window = [r for r in recs if marks["t0"] <= r[1] < marks["t1"]]
    ok = sum(r[2] == 200 for r in window)
    return {
        "rps": ok / (marks["t1"] - marks["t0"]),
        **_lat(window),
        "errors": sum(r[2] not in (0, 200) for r in recs),
        "lost": sum(r[2] == 0 for r in recs),
    }


def point(root: Path, target: Path) -> None:
    """ROOT/m -> target, atomically (a new symlink renamed over the old one)."""
    tmp = root / f".{MODEL}.next"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(target.resolve(), target_is_directory=True)
    os.replace(tmp, root / MODEL)


def swap_round(
    srv: RepositoryServer, root: Path, target: Path, texts: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    old = srv.model()["version"]
    marks: dict[str, Any] = {}

    async def swap(c: Any) -> None:
        await asyncio.sleep(args.swap_before_s)
        point(root, target)
        marks["t0"] = time.perf_counter()
        r = await c.post(f"/v2/repository/models/{MODEL}/load", timeout=600)
        marks["t1"] = time.perf_counter()
        marks["status"], marks["body"] = r.status_code, r.json()
        await asyncio.sleep(args.swap_after_s)
        marks["end"] = time.perf_counter()

    start = time.perf_counter()
    with RssSampler(srv.proc.pid) as rss:
        recs = asyncio.run(_drive(srv.url, texts, args.swap_concurrency, swap))
    if marks["status"] != 200:
        raise QserveError(f"load of {target} answered {marks['status']}: {marks['body']}")
    new = marks["body"]["version"]
    t0, t1 = marks["t0"], marks["t1"]
    warm = start + min(1.0, args.swap_before_s / 2)  # skip the clients' ramp-up
    before = [r for r in recs if warm <= r[0] < t0]
    during = [r for r in recs if t0 <= r[0] <= t1]
    after = [r for r in recs if r[0] > t1]
    mb = 1 / (1 << 20)
    settle = t1 + args.settle_s
    rss_before = rss.between(t0 - args.swap_before_s / 2, t0)
    rss_after = rss.between(settle, marks["end"]) or rss.between(t1, marks["end"])
    return {
        "from": old,
        "to": new,
        "target": str(target),
        "load_s": t1 - t0,
        "latency": {"before": _lat(before), "during": _lat(during), "after": _lat(after)},
        "rss_mb": {
            "before": statistics.median(rss_before) * mb if rss_before else None,
            "during_peak": max(rss.between(t0, t1 + 1e-3) or [0]) * mb or None,
            "after": statistics.median(rss_after) * mb if rss_after else None,
        },
        "requests": len(recs),
        "errors": sum(r[2] not in (0, 200) for r in recs),
        "lost": sum(r[2] == 0 for r in recs),
        "other_versions": sum(r[2] == 200 and r[3] not in (old, new) for r in recs),
        "answered_by": {"old": sum(r[3] == old for r in recs), "new": sum(r[3] == new for r in recs)},
    }


# -- report ---------------------------------------------------------------------------------------
def summarize(shadow: list[dict[str, Any]], swaps: list[dict[str, Any]]) -> dict[str, Any]:
    def med(rows: list[dict[str, Any]], *keys: str) -> float | None:
        vals = []
        for r in rows:
            for k in keys:
                r = r.get(k) if isinstance(r, dict) else None
            if r is not None:
                vals.append(r)
        return statistics.median(vals) if vals else None

    plain = [r["plain"] for r in shadow]
    shad = [r["shadowed"] for r in shadow]
    p, s = med(plain, "rps"), med(shad, "rps")
    return {
        "rps_plain": p,
        "rps_shadowed": s,
        "shadow_cost": (1 - s / p) if p and s else None,
        "p99_plain_ms": med(plain, "p99_ms"),
        "p99_shadowed_ms": med(shad, "p99_ms"),
        "swap_load_s": med(swaps, "load_s"),
        "swap_p99_before_ms": med(swaps, "latency", "before", "p99_ms"),
        "swap_p99_during_ms": med(swaps, "latency", "during", "p99_ms"),
        "swap_max_during_ms": med(swaps, "latency", "during", "max_ms"),
        "rss_before_mb": med(swaps, "rss_mb", "before"),
        "rss_peak_during_mb": med(swaps, "rss_mb", "during_peak"),
        "rss_after_mb": med(swaps, "rss_mb", "after"),
        "errors": sum(r[k]["errors"] for r in shadow for k in ("plain", "shadowed")) + sum(r["errors"] for r in swaps),
        "lost": sum(r[k]["lost"] for r in shadow for k in ("plain", "shadowed")) + sum(r["lost"] for r in swaps),
        "other_versions": sum(r["other_versions"] for r in swaps),
    }


def render(rep: dict[str, Any]) -> str:
    s, st, v = rep["summary"], rep["settings"], rep["variants"]
    env = rep["environment"]

    def f(x: Any, nd: int = 1) -> str:
        return "–" if x is None else f"{x:,.{nd}f}"

    def pct(x: Any, nd: int = 1) -> str:
        return f(None if x is None else 100 * x, nd)

    sh = rep.get("shadow_state") or {}
    L = [
        f"# Model lifecycle: shadow cost, hot swap latency and memory ({v['served']['name']})",
        "",
        f"Created {rep['created']} on {env['cpu']} ({env['cpu_count']} logical CPUs, Python {env['python']}). "
        "Servers: `qserve serve --model-repository` in child processes, "
        f"threads={st['threads'] or 'library default'}; "
        f"clients in this process, one review per request. Served {v['served']['dir']}; shadow reference "
        f"{v['reference']['dir']} at rate {st['shadow_rate']}; swaps between the served dir and "
        f"{v['swap_to']['dir']}.",
        "",
        "## Headline",
        "",
        "| | value |",
        "|---|---:|",
        f"| throughput at {st['concurrency']} clients, plain (req/s) | {f(s['rps_plain'])} |",
        f"| throughput at {st['concurrency']} clients, shadow at rate {st['shadow_rate']} (req/s) | "
        f"{f(s['rps_shadowed'])} |",
        f"| shadow cost (1 - shadowed / plain) | **{pct(s['shadow_cost'])}%** |",
        f"| p99 plain / shadowed (ms) | {f(s['p99_plain_ms'])} / {f(s['p99_shadowed_ms'])} |",
        f"| swap: load call, load + warm-up + switch + release (s) | {f(s['swap_load_s'], 2)} |",
        f"| swap: p99 before / during the load at {st['swap_concurrency']} clients (ms) | "
        f"{f(s['swap_p99_before_ms'])} / **{f(s['swap_p99_during_ms'])}** |",
        f"| swap: slowest request during the load (ms) | {f(s['swap_max_during_ms'])} |",
        f"| server RSS before / peak during / after a swap (MiB) | {f(s['rss_before_mb'], 0)} / "
        f"{f(s['rss_peak_during_mb'], 0)} / {f(s['rss_after_mb'], 0)} |",
        f"| errors / lost / answers naming neither version (all runs) | {s['errors']} / {s['lost']} / "
        f"{s['other_versions']} |",
        "",
    ]
    if sh:
        L += [
            f"The shadowed server's reference re-scored {sh.get('samples')} sampled texts and "
            f"dropped {sh.get('dropped')} (queue full); rolling agreement {pct(sh.get('agreement'), 2)}% against "
            f"the bar {pct(sh.get('bar'), 0)}%.",
            "",
        ]
    L += [
        "## Shadow rounds",
        "",
        "| round | plain req/s | shadowed req/s | plain p99 ms | shadowed p99 ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rep["shadow_rounds"]):
        L.append(
            f"| {i} | {f(r['plain']['rps'])} | {f(r['shadowed']['rps'])} | {f(r['plain']['p99_ms'])} | "
            f"{f(r['shadowed']['p99_ms'])} |"
        )
    L += [
        "",
        "## Swap rounds",
        "",
        "| round | from -> to | load s | p50 before / during / after ms | "
        "p99 before / during / after ms | RSS before / peak / after MiB | answers old / new |",
        "|---:|---|---:|---|---|---|---|",
    ]
    for i, r in enumerate(rep["swap_rounds"]):
        lat, m = r["latency"], r["rss_mb"]
        L.append(
            f"| {i} | {r['from']} -> {r['to']} | {f(r['load_s'], 2)} | {f(lat['before']['p50_ms'])} / "
            f"{f(lat['during']['p50_ms'])} / {f(lat['after']['p50_ms'])} | {f(lat['before']['p99_ms'])} / "
            f"{f(lat['during']['p99_ms'])} / {f(lat['after']['p99_ms'])} | {f(m['before'], 0)} / "
            f"{f(m['during_peak'], 0)} / {f(m['after'], 0)} | {r['answered_by']['old']} / "
            f"{r['answered_by']['new']} |"
        )
    L += [
        "",
        "During a swap the new version loads on a side thread while the old one keeps serving, both in "
        "memory (the peak); its warm-up shares the inference thread; the switch is one assignment, then the old "
        "version drains what it accepted and is closed and collected (gc.unfreeze, collect, freeze). A swap's "
        "requests are those started between the load call and its answer. RSS after is what the allocator "
        "kept of the freed version, if anything.",
        "",
    ]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variant_dir", type=Path, help="the served variant (the model m)")
    p.add_argument(
        "--swap-to", type=Path, help="the dir m is swapped to and back from (default: VARIANT_DIR again: a reload)"
    )
    p.add_argument("--reference", type=Path, required=True, help="the shadow reference variant (e.g. onnx-fp32)")
    p.add_argument("--shadow-rate", type=float, default=0.05)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per shadow-cost cell (default 10)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of plain/shadowed cells and of swaps")
    p.add_argument("--concurrency", type=int, default=32, help="clients for the shadow cost")
    p.add_argument("--swap-concurrency", type=int, default=8, help="clients during a swap")
    p.add_argument("--swap-before-s", type=float, default=5.0)
    p.add_argument("--swap-after-s", type=float, default=4.0)
    p.add_argument("--settle-s", type=float, default=1.0, help="after the load answered, before RSS 'after'")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of each server")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "lifecycle")
    p.add_argument("--force", action="store_true", help="replace an existing report.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)

    swap_to = args.swap_to or args.variant_dir
    servers: list[RepositoryServer] = []
    try:
        refuse_existing(args.out / "report.json", args.force)
        variants = {}
        for key, d in (("served", args.variant_dir), ("swap_to", swap_to), ("reference", args.reference)):
            m = read_manifest(d)
            variants[key] = {"name": m.name, "dir": str(d), "version": (m.digest or "")[:12]}
        texts = default_texts()
        with tempfile.TemporaryDirectory(prefix="lifecycle-bench-") as tmp:
            work = Path(tmp)
            roots = {k: work / f"repo-{k}" for k in ("plain", "shadowed")}
            for r in roots.values():
                r.mkdir()
                point(r, args.variant_dir)
            log.info("starting the plain and the shadowed server")
            plain = RepositoryServer(args, roots["plain"], work, "plain", shadow=False)
            servers.append(plain)
            shadowed = RepositoryServer(args, roots["shadowed"], work, "shadowed", shadow=True)
            servers.append(shadowed)
            for srv in servers:  # both start at once; nothing is measured until both are ready
                srv.wait_ready()
            shadow_rounds, swap_rounds = [], []
            for i in range(args.rounds):
                row = {}
                for key, srv in (("plain", plain), ("shadowed", shadowed)):
                    log.info("round %d: %s server, %d clients, %.0f s", i, key, args.concurrency, args.duration)
                    row[key] = shadow_round(srv, texts, args)
                shadow_rounds.append(row)
            shadow_state = shadowed.model()["shadow"]
            shadowed.stop()
            servers.remove(shadowed)
            for i in range(args.rounds):
                target = swap_to if i % 2 == 0 else args.variant_dir
                log.info("swap %d: m -> %s under %d clients", i, target, args.swap_concurrency)
                swap_rounds.append(swap_round(plain, roots["plain"], target, texts, args))
    except QserveError as e:
        print(f"lifecycle_bench: error: {e}", file=sys.stderr)
        return 2
    finally:
        for srv in servers:
            srv.stop()

    info = cpu_info()
    rep = {
        "created": now_iso(),
        "variants": variants,
        "environment": {
            "machine": platform.platform(),
            "cpu": cpu_label(info),
            "cpu_info": info,
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "force"},
        "summary": summarize(shadow_rounds, swap_rounds),
        "shadow_rounds": shadow_rounds,
        "swap_rounds": swap_rounds,
        "shadow_state": shadow_state,
        "provenance": provenance(),
    }
    write_report(args.out, rep, render(rep))
    s = rep["summary"]
    return 0 if not (s["errors"] or s["lost"] or s["other_versions"]) else 1


if __name__ == "__main__":
    sys.exit(main())
