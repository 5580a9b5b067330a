"""Overload benchmark: do admitted requests wait behind rejections? Measured with the server's own timings.

    flock /work/cpu.lock python -m benchmarks.flood_bench models/minilm-imdb-variants/onnx-int8 \\
        --baseline-ref 99c8efd --rounds 5 --out benchmarks/reports/flood

A flood is N simultaneous one-text POST /v1/classify requests (raw sockets, all connected
first, then every request written at once) against `qserve serve --max-inputs 16
--max-queue 16`. Each flood is read from both ends: the client's statuses and latencies, and
the server's /metrics scraped before and after (request latency by status, the queue wait of
admitted texts, the time spent refusing, the forward passes). With --baseline-ref, the same
floods also hit the server code of that git commit (the code before this change), started
beside the current one and flooded in alternating order, round by round, so background load on
this shared machine hits both alike.

A second phase measures a normal client's latency (sequential requests) with and without slow
clients holding connections (idle sockets and sockets trickling headers), interleaved.
Writes report.json and report.md to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Server, archive_tree, in_turn, scrape, trickle, write_report
from qserve.bench.envinfo import environment
from qserve.provenance import provenance


def start_server(variant: Path, code_root: Path, args: argparse.Namespace, log: Path) -> Server:
    """`qserve serve` of the code at `code_root` with the flood's limits (not yet ready)."""
    return Server(
        [
            str(variant),
            "--max-inputs",
            str(args.max_inputs),
            "--max-queue",
            str(args.max_queue),
            "--threads",
            str(args.threads),
            "--log-level",
            "warning",
        ],
        code_root,
        log,
        tag=f"server from {code_root}",
    )


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def hist(before: dict, after: dict, name: str, **labels: str) -> dict[str, Any] | None:
    """count, mean and bucket-bound quantiles of one histogram's growth between two scrapes."""
    want = {k: v for k, v in labels.items()}

    def pick(d: dict, suffix: str) -> dict[float, float]:
        out = {}
        for (n, lab), v in d.items():
            lab = dict(lab)
            if n == name + suffix and all(lab.get(k) == v2 for k, v2 in want.items()):
                out[float(lab.get("le", "nan")) if suffix == "_bucket" else 0.0] = (
                    out.get(float(lab.get("le", "nan")) if suffix == "_bucket" else 0.0, 0.0) + v
                )
        return out

    count = sum(pick(after, "_count").values()) - sum(pick(before, "_count").values())
    if count <= 0:
        return None
    total = sum(pick(after, "_sum").values()) - sum(pick(before, "_sum").values())
    b0, b1 = pick(before, "_bucket"), pick(after, "_bucket")
    cum = sorted((le, b1[le] - b0.get(le, 0.0)) for le in b1)

    def q(p: float) -> float | None:
        for le, c in cum:
            if c >= p * count:
                return le
        return None

    return {
        "count": int(count),
        "mean_ms": 1e3 * total / count,
        "p50_le_ms": _ms(q(0.5)),
        "p99_le_ms": _ms(q(0.99)),
        "max_le_ms": _ms(q(1.0)),
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else (x * 1e3 if x != float("inf") else float("inf"))


async def _flood(port: int, n: int, text: str) -> list[tuple[int, float, float]]:
    body = json.dumps({"inputs": [text]}).encode()
    req = (
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, t0: float) -> tuple[int, float, float]:
        status_line = await reader.readline()
        first = time.perf_counter() - t0
        await reader.read()  # Connection: close -> read to EOF
        writer.close()
        return int(status_line.split()[1]), first * 1e3, (time.perf_counter() - t0) * 1e3

    t0 = time.perf_counter()
    for _, w in conns:
        w.write(req)
    return await asyncio.gather(*(one(r, w, t0) for r, w in conns))


def flood(port: int, n: int, text: str) -> dict[str, Any]:
    before = scrape(_url(port))
    res = asyncio.run(_flood(port, n, text))
    time.sleep(0.3)  # let the server finish its bookkeeping
    after = scrape(_url(port))
    ok = sorted(r[1] for r in res if r[0] == 200)
    rej = sorted(r[1] for r in res if r[0] == 429)
    statuses: dict[str, int] = {}
    for r in res:
        statuses[str(r[0])] = statuses.get(str(r[0]), 0) + 1
    return {
        "statuses": statuses,
        "client_200_ms": {
            "n": len(ok),
            "first": ok[0] if ok else None,
            "p50": statistics.median(ok) if ok else None,
            "last": ok[-1] if ok else None,
        },
        "client_429_ms": {"n": len(rej), "p50": statistics.median(rej) if rej else None},
        "server_200_latency": hist(before, after, "qserve_request_latency_seconds", route="/v1/classify", status="200"),
        "server_429_latency": hist(before, after, "qserve_request_latency_seconds", route="/v1/classify", status="429"),
        "server_queue_wait": hist(before, after, "qserve_queue_wait_seconds"),
        "server_rejection": hist(before, after, "qserve_rejection_seconds"),
        "server_inference": hist(before, after, "qserve_inference_seconds"),
    }


def normal_latency(port: int, n: int, text: str) -> list[float]:
    out = []
    body = json.dumps({"inputs": [text]})
    for _ in range(n):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        t0 = time.perf_counter()
        c.request("POST", "/v1/classify", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        out.append((time.perf_counter() - t0) * 1e3)
        assert r.status == 200, r.status
        c.close()
    return out


SLOW_IDLE, SLOW_TRICKLING = 100, 20
"""The slow-client rounds' sockets: idle ones, and ones trickling headers a byte every 0.1 s."""


def slow_clients(port: int, idle: int, trickling: int, stop: threading.Event) -> list[socket.socket]:
    """`idle` connections that send nothing and `trickling` ones sending headers a byte every 0.1 s."""
    # not named `trickle`: that would hide the harness's trickle() from drip() (its threads then die on an int)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle + trickling)]

    def drip(s: socket.socket) -> None:
        trickle(s, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" * 10, 0.1, stop)

    for s in socks[idle:]:
        threading.Thread(target=drip, args=(s,), daemon=True).start()
    return socks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant_dir", type=Path)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--max-inputs", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-ref", help="git commit whose server code floods alongside (the code before)")
    ap.add_argument("--normal-requests", type=int, default=40, help="sequential requests per slow-client round")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "flood")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="flood-"))
    sides = {"current": ROOT}
    if args.baseline_ref:
        sides = {"baseline": archive_tree(ROOT, args.baseline_ref, work / "baseline"), "current": ROOT}
    servers: dict[str, Server] = {}
    text = "A wonderful, moving film with superb performances."
    rounds: list[dict[str, Any]] = []
    try:  # started inside: a side that fails to start stops the one already up
        for name, root in sides.items():
            servers[name] = start_server(args.variant_dir.resolve(), root, args, work / f"{name}.log")
            servers[name].wait_ready(180)
        for srv in servers.values():  # warm-up flood, not recorded
            flood(srv.port, 50, text)
        for r in range(args.rounds):
            for name in in_turn(servers, r):
                res = flood(servers[name].port, args.requests, text)
                rounds.append({"round": r, "side": name, **res})
                print(
                    json.dumps(
                        {
                            "round": r,
                            "side": name,
                            "statuses": res["statuses"],
                            "client_200_ms": res["client_200_ms"],
                            "server_200": res["server_200_latency"],
                            "queue_wait": res["server_queue_wait"],
                            "rejection": res["server_rejection"],
                        }
                    ),
                    flush=True,
                )
                time.sleep(1.0)
        port = servers["current"].port
        slow = []
        for r in range(args.rounds):
            for cond in in_turn(("quiet", "slow"), r):
                stop = threading.Event()
                socks = slow_clients(port, SLOW_IDLE, SLOW_TRICKLING, stop) if cond == "slow" else []
                time.sleep(0.2)
                lat = normal_latency(port, args.normal_requests, text)
                stop.set()
                for s in socks:
                    s.close()
                slow.append({"round": r, "condition": cond, "p50_ms": statistics.median(lat), "max_ms": max(lat)})
                print(json.dumps(slow[-1]), flush=True)
        closed = {k[1][0][1]: v for k, v in scrape(_url(port)).items() if k[0] == "qserve_connections_closed_total"}
    finally:
        for srv in servers.values():
            srv.stop()

    report = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "environment": environment(args.threads, "cpu"),
        "shared_machine": True,
        "floods": rounds,
        "slow_clients": slow,
        "connections_closed": closed,
        "provenance": provenance(),
    }
    write_report(args.out, report, render(report), echo=False)
    print((args.out / "report.md").read_text())
    return 0


def median_of(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def render(rep: dict[str, Any]) -> str:
    env, cfg = rep["environment"], rep["config"]
    cpu = env["cpu"]
    lines = [
        "# Flood: do admitted requests wait behind rejections?",
        "",
        f"CPU: {cpu.get('model')} ({env['physical_cores']} cores; AMX: "
        f"{'yes' if 'amx_int8' in (cpu.get('flags') or cpu.get('isa') or []) else 'see cpu flags'}); shared "
        f"machine, other jobs running. Variant: `{cfg['variant_dir']}`, `--max-inputs {cfg['max_inputs']} "
        f"--max-queue {cfg['max_queue']} --threads {cfg['threads']}`; {cfg['requests']} simultaneous one-text "
        f"requests per flood, {cfg['rounds']} rounds, sides alternating.",
        "",
        "Per side, the median over rounds of each flood's numbers (server numbers are bucket bounds of "
        "its own /metrics histograms, so `<= x ms`).",
        "",
        "| side | 200 | 429 | server 200 latency p50 / max | admitted queue wait p50 / max | "
        "refusal time p50 / p99 | server 429 latency p50 | client: first 200 / last 200 | forwards |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for side in dict.fromkeys(f["side"] for f in rep["floods"]):
        fl = [f for f in rep["floods"] if f["side"] == side]

        def m(key: str, field: str) -> float | None:
            return median_of([(f[key] or {}).get(field) for f in fl])

        lines.append(
            f"| {side} | {median_of([f['statuses'].get('200', 0) for f in fl]):.0f} | "
            f"{median_of([f['statuses'].get('429', 0) for f in fl]):.0f} | "
            f"<= {_f(m('server_200_latency', 'p50_le_ms'), 1)} / {_f(m('server_200_latency', 'max_le_ms'), 1)} ms | "
            f"<= {_f(m('server_queue_wait', 'p50_le_ms'), 1)} / {_f(m('server_queue_wait', 'max_le_ms'), 1)} ms | "
            f"<= {_f(m('server_rejection', 'p50_le_ms'), 3)} / {_f(m('server_rejection', 'p99_le_ms'), 3)} ms | "
            f"<= {_f(m('server_429_latency', 'p50_le_ms'), 1)} ms | "
            f"{_f(m('client_200_ms', 'first'), 1)} / {_f(m('client_200_ms', 'last'), 1)} ms | "
            f"{_f(m('server_inference', 'count'), 0)} |"
        )
    lines += [
        "",
        "`-`: the baseline has no queue-wait or refusal histogram (added by this change).",
        "",
        "## A normal client while slow clients hold connections",
        "",
        f"Sequential one-text requests, median per round; `slow` = {SLOW_IDLE} idle sockets + {SLOW_TRICKLING} "
        "trickling headers a byte per 100 ms, opened just before (default timeouts: they are closed after 10 s).",
        "",
        "| round | quiet p50 ms | slow p50 ms | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for r in sorted({s["round"] for s in rep["slow_clients"]}):
        q = next(s for s in rep["slow_clients"] if s["round"] == r and s["condition"] == "quiet")
        s = next(s for s in rep["slow_clients"] if s["round"] == r and s["condition"] == "slow")
        lines.append(f"| {r} | {q['p50_ms']:.2f} | {s['p50_ms']:.2f} | {s['p50_ms'] / q['p50_ms']:.2f} |")
    lines += ["", f"Connections the server closed during the run, by reason: {rep['connections_closed']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
