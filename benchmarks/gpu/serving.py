"""Issue 54's must-shows on a GPU, side by side in one run: a torch variant eager and under CUDA graphs (plain
transformers and qserve's runtime), its scores with graphs equal to its scores alone, then served.

    python -m benchmarks.gpu.serving RUN_DIR --out /tmp/gpu-serving             # on the GPU (RUN_DIR: below)
    python -m benchmarks.gpu.serving --dry --out /tmp/gpu-serving-dry           # the same plumbing on CPU, < 1 min

    python -m benchmarks.gpu.serving --user RUN_DIR --out /tmp/serve             # `qserve serve RUN_DIR` + loadtest

RUN_DIR is a variant dir (manifest.json), or a dir holding variants/VARIANT or VARIANT (--variant, default
torch-bf16): a `qserve pipeline` run dir (benchmarks/gpu/check.sh keeps its own in .gpu-check/run).
The variant is an HF checkpoint as well, so plain transformers loads the same weights. One run measures:

  plain     transformers' AutoModelForSequenceClassification in the variant's dtype, at b1/b32/b256 x 128 tokens:
            eager, and one torch.cuda.CUDAGraph captured once per shape (the issue's reference table);
  runtime   qserve's runtime as `qserve bench` times it (measure.fixed_shapes: rt.run on real token ids, b1 p50
            and b32 seq/s at s128): --cuda-graphs off (eager, as served before) against auto (graphs captured at
            load; its execution record says what it chose and why), and torch.compile(mode="reduce-overhead") in
            a child under --compile-timeout (its compile time is part of the answer);
  texts     every test review scored alone, then in shuffled batches of 8 and 32 through the graphs runtime:
            per text the largest |Δprob| and whether its label moved; and alone against the eager runtime;
  served    `qserve serve VARIANT --workers W` for each W of --workers, then `qserve loadtest` on its 96
            built-in reviews at c1 and c32 (one client process) and c128 (--clients processes at once, their
            requests summed): p50, req/s, errors, lost, label changes; plus the served scores of the 96 texts
            against the graphs runtime's, text by text.

Targets (H200, the issue): b1/s128 p50 <= 0.6 ms, b32/s128 >= 35,000 seq/s; served c1 p50 <= 2 ms, c128 >= 10,000
req/s, 0 lost, 0 label changes; scores with graphs equal to scores alone. Writes report.json and report.md (naming
the GPU) under --out, rewritten at each step's start and end (a run killed at its limit keeps its finished steps;
`steps` and `running` say which), the servers', clients' and children's logs under --out/work; exit status 1 when a
target is missed (never on --dry, whose CPU numbers are plumbing only), 2 on a setup error. --workers auto starts at
most 4 servers on one GPU, each awaited by a deadline (--ready-s); the torch.compile child is the check's to ask for.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

import exporters
from benchmarks.gpu.stage import StageReport
from benchmarks.harness import (
    Server,
    finish,
    machine,
    per_worker,
    post_json,
    reviews,
    scrape,
    spawn,
    total,
    write_report,
)
from benchmarks.harness.server import ROOT, code_env
from qserve import QserveError
from qserve.artifact import read_manifest
from qserve.bench.measure import fixed_shapes
from qserve.loadtest import default_texts
from qserve.modeling import default_tokenizer
from qserve.runtime import RuntimeOptions, load_runtime

log = logging.getLogger("gpu_serving")
SEQ = 128
PLAIN_BATCHES = (1, 32, 256)
LEVELS = (1, 32, 128)
TARGETS = {
    "runtime_b1_p50_ms": ("<=", 0.6),
    "runtime_b32_seq_s": (">=", 35_000.0),
    "served_c1_p50_ms": ("<=", 2.0),
    "served_c128_rps": (">=", 10_000.0),
    "served_lost": ("<=", 0),
    "served_label_changes": ("<=", 0),
    "graphs_alone_vs_batched_max_dprob": ("<=", 1e-5),
    "graphs_label_flips": ("<=", 0),
}
"""The issue's bars, by the summary key each reads."""


# -- the variant and its texts ------------------------------------------------------------------------------
def find_variant(path: Path, name: str) -> Path:
    for cand in (path, path / name, path / "variants" / name):
        if (cand / "manifest.json").is_file():
            return cand
    raise QserveError(
        f"{path}: no variant here (looked for manifest.json in it, in {name}/ and in variants/{name}/);"
        f" give a variant dir, or a run dir holding variants/{name}"
    )


def tiny_variant(root: Path) -> Path:
    """--dry: a 2-layer DistilBERT of width 32 with the embedded tokenizer, exported as torch-fp32 (seconds)."""
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(0)
    tok = default_tokenizer()
    cfg = DistilBertConfig(
        vocab_size=tok.vocab_size,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=128,
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    model = DistilBertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(20)  # logits that differ clearly between texts
    ckpt = root / "checkpoint"
    model.save_pretrained(ckpt, safe_serialization=True)
    tok.save_pretrained(ckpt)
    (ckpt / "qserve_model.json").write_text(json.dumps({"model_name": "tiny-distilbert", "max_length": 64}))
    exporters.export(ckpt, "torch-fp32", root / "torch-fp32")
    return root / "torch-fp32"


def ids_of(tokenizer: Any, texts: list[str], batch: int, seq: int) -> dict[str, np.ndarray]:
    """(batch, seq) real token ids, full attention: the reviews' tokens, [CLS] ... [SEP], rows at other offsets."""
    body = [i for t in texts for i in tokenizer(t, add_special_tokens=False)["input_ids"]] or [tokenizer.unk_token_id]
    cls, sep = tokenizer.cls_token_id or body[0], tokenizer.sep_token_id or body[-1]
    rows = [[cls, *(body[(j + 7 * r) % len(body)] for j in range(seq - 2)), sep] for r in range(batch)]
    ids = np.asarray(rows, dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


# -- timing -------------------------------------------------------------------------------------------------
def timed(fn: Any, sync: Any, warmup: int, iters: int) -> float:
    """Median ms of fn()+sync() over `iters` calls after `warmup`."""
    for _ in range(warmup):
        fn()
        sync()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def plain(
    variant: Path, device: str, texts: list[str], seq: int, batches: tuple[int, ...], iters: int
) -> dict[str, Any]:
    """transformers alone: eager, and a torch.cuda.CUDAGraph captured once per shape (CUDA only)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[read_manifest(variant).spec.dtype]
    model = AutoModelForSequenceClassification.from_pretrained(variant, dtype=dtype).eval().to(device)
    tok = AutoTokenizer.from_pretrained(variant)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for b in batches:
        feed = {k: torch.from_numpy(v).to(device) for k, v in ids_of(tok, texts, b, seq).items()}
        rec: dict[str, Any] = {"batch": b, "seq": seq}
        with torch.inference_mode():
            rec["eager_ms"] = timed(lambda feed=feed: model(**feed), sync, 3, iters)
            if cuda:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        model(**feed)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model(**feed)
                rec["graph_ms"] = timed(graph.replay, sync, 3, iters)
                rec["graph_seq_s"] = b / (rec["graph_ms"] / 1e3)
                del graph
        rec["eager_seq_s"] = b / (rec["eager_ms"] / 1e3)
        rows.append(rec)
        log.info(
            "plain b%d/s%d: eager %.3f ms%s",
            b,
            seq,
            rec["eager_ms"],
            f", graph {rec['graph_ms']:.3f} ms" if "graph_ms" in rec else "",
        )
    model = None  # freed before the runtime loads
    if cuda:
        torch.cuda.empty_cache()
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "rows": rows,
        **({} if cuda else {"graph": "not measured: CUDA graphs need a CUDA device"}),
    }


def runtime_rows(rt: Any, text: str, seq: int, budget_s: float) -> dict[str, Any]:
    """b1 and b32 at `seq` as `qserve bench` times them (measure.fixed_shapes: rt.run on real token ids)."""
    job = {
        "batch_sizes": [1, 32],
        "seq_lens": [seq],
        "warmup": 5,
        "time_budget_s": budget_s,
        "min_iters": 5,
        "max_iters": 2000,
    }
    recs = {r["batch"]: r for r in fixed_shapes(rt, job, text)}
    return {
        "b1_p50_ms": recs[1].get("p50"),
        "b1_p99_ms": recs[1].get("p99"),
        "b32_seq_s": recs[32].get("throughput"),
        "b32_p50_ms": recs[32].get("p50"),
    }


def load(variant: Path, device: str, mode: str) -> Any:
    return load_runtime(variant, device, RuntimeOptions(cuda_graphs=mode))


def compare_texts(graphed: Any, eager: Any, texts: list[str]) -> dict[str, Any]:
    """Per text: alone vs in shuffled batches of 8 and 32 (graphs runtime), and graphs alone vs eager alone."""
    alone = np.concatenate([graphed.predict([t]) for t in texts]).astype(np.float64)
    worst = np.zeros(len(texts))
    flips = np.zeros(len(texts), dtype=bool)
    for b in (8, 32):
        order = list(range(len(texts)))
        random.Random(b).shuffle(order)
        got = np.empty_like(alone)
        for i in range(0, len(order), b):
            idx = order[i : i + b]
            got[idx] = graphed.predict([texts[j] for j in idx])
        worst = np.maximum(worst, np.abs(got - alone).max(axis=1))
        flips |= got.argmax(1) != alone.argmax(1)
    base = np.concatenate([eager.predict([t]) for t in texts]).astype(np.float64)
    vs_eager = np.abs(alone - base).max(axis=1)
    top = np.argsort(-worst)[:5]
    return {
        "texts": len(texts),
        "max_abs_dprob": float(worst.max()),
        "over_1e-5": int((worst > 1e-5).sum()),
        "flips": int(flips.sum()),
        "worst": [{"text": texts[i][:80], "dprob": float(worst[i])} for i in top],
        "vs_eager_max_abs_dprob": float(vs_eager.max()),
        "vs_eager_label_changes": int((alone.argmax(1) != base.argmax(1)).sum()),
    }


def compile_part(args: argparse.Namespace) -> int:
    """--part compile (a child of the main run, under --compile-timeout): torch.compile's b1/b32 as the bench times
    them, and how long its load and compiling took."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    rt = load(Path(args.run_dir), args.device, "compile")
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0, "execution": rt.execution}
    t1 = time.perf_counter()
    out.update(runtime_rows(rt, " ".join(reviews(8)), min(SEQ, rt.max_length), 1.0))
    out["measure_s"] = time.perf_counter() - t1  # the first calls of each shape compile
    Path(args.out).write_text(json.dumps(out, default=str))
    return 0


def run_compile(variant: Path, device: str, work: Path, timeout_s: float) -> dict[str, Any]:
    if not device.startswith("cuda"):
        return {"skipped": "torch.compile's reduce-overhead mode records CUDA graphs: CUDA only"}
    if timeout_s <= 0:
        return {"skipped": "--compile-timeout 0"}
    out, logf = work / "compile.json", open(work / "compile.log", "w")
    proc = spawn(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu.serving",
            "--part",
            "compile",
            str(variant),
            "--device",
            device,
            "--out",
            str(out),
        ],
        ROOT,
        code_env(ROOT),
        stdout=logf,
        stderr=logf,
    )
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:  # its compiling is itself the answer
        proc.kill()
        proc.wait()
        return {"skipped": f"not done within --compile-timeout {timeout_s:g} s (load, compile, time b1 and b32)"}
    finally:
        logf.close()
    if proc.returncode != 0 or not out.is_file():
        tail = (work / "compile.log").read_text(errors="replace")[-600:]
        return {"failed": f"exit {proc.returncode}: {tail}"}
    return dict(json.loads(out.read_text()))


# -- served ------------------------------------------------------------------------------------------------
def loadtest(
    url: str, levels: list[int], duration: float, work: Path, tag: str, processes: int = 1
) -> list[dict[str, Any]]:
    """`qserve loadtest` at `levels`, in `processes` client processes at once (each concurrency/processes
    clients), their levels combined: requests, ok, errors, lost, mismatches and req/s summed; p50 the median of
    the processes' p50s, p99 the largest p99."""
    procs = []
    for k in range(processes):
        conc = ",".join(str(max(1, c // processes)) for c in levels)
        out = work / f"{tag}-{k}.json"
        logf = open(work / f"{tag}-{k}.log", "w")
        procs.append(
            (
                spawn(
                    [
                        sys.executable,
                        "-m",
                        "qserve",
                        "loadtest",
                        url,
                        "--concurrency",
                        conc,
                        "--duration",
                        str(duration),
                        "--json",
                        str(out),
                    ],
                    ROOT,
                    code_env(ROOT),
                    stdout=logf,
                    stderr=logf,
                ),
                out,
                logf,
            )
        )
    reports = []
    for proc, out, logf in procs:
        try:
            proc.wait(120 + duration * len(levels) * 3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logf.close()
        if not out.is_file():
            raise QserveError(f"qserve loadtest ({tag}) wrote no report: see {work}/{tag}-*.log")
        reports.append(json.loads(out.read_text()))
    combined = []
    for i, c in enumerate(levels):
        lv = [r["levels"][i] for r in reports]
        combined.append(
            {
                "concurrency": c,
                "processes": processes,
                **{k: sum(x[k] for x in lv) for k in ("requests", "ok", "errors", "lost", "mismatched")},
                "throughput_rps": sum(x["throughput_rps"] for x in lv),
                "p50_ms": statistics.median(x["p50_ms"] for x in lv if x["p50_ms"] is not None)
                if any(x["p50_ms"] is not None for x in lv)
                else None,
                "p99_ms": max((x["p99_ms"] for x in lv if x["p99_ms"] is not None), default=None),
            }
        )
    return combined


def served_scores(url: str, texts: list[str], graphed: np.ndarray, labels: list[str]) -> dict[str, Any]:
    """The served scores of `texts`, one request each, against the in-process graphs runtime's."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    got = []
    for t in texts:
        preds = {
            p["label"]: p["score"]
            for p in post_json(conn, "/v1/classify", {"inputs": t, "top_k": None})["predictions"][0]
        }
        got.append([preds[lb] for lb in labels])
    conn.close()
    served = np.asarray(got, dtype=np.float64)
    return {
        "texts": len(texts),
        "max_abs_dscore": float(np.abs(served - graphed).max()),
        "label_changes": int((served.argmax(1) != graphed.argmax(1)).sum()),
    }


def serve(
    variant: Path,
    device: str,
    workers: int,
    args: argparse.Namespace,
    work: Path,
    texts: list[str],
    graphed: np.ndarray | None,
    labels: list[str],
) -> dict[str, Any]:
    srv = Server(
        [str(variant), "--device", device, "--workers", str(workers), "--log-level", "warning"],
        ROOT,
        work / f"serve-w{workers}.log",
        tag=f"serve --workers {workers}",
    )
    t0 = time.perf_counter()
    try:
        srv.wait_ready(args.ready_s)
        if workers > 1:  # every worker listens once loaded (and its graphs captured): all of them, by a deadline
            per_worker(srv.url, workers, max(5.0, args.ready_s - (time.perf_counter() - t0)))
        ready_s = time.perf_counter() - t0
        execution = srv.models()["models"][0].get("execution")
        check = served_scores(srv.url, texts, graphed, labels) if graphed is not None else None
        if args.clients > 1:  # c1 and c32 from one client process, c128 from several at once
            levels = loadtest(srv.url, list(LEVELS[:2]), args.duration, work, f"lt-w{workers}")
            levels += loadtest(srv.url, [LEVELS[2]], args.duration, work, f"lt-w{workers}-c128", args.clients)
        else:
            levels = loadtest(srv.url, list(LEVELS), args.duration, work, f"lt-w{workers}")
        metrics = per_worker(srv.url, workers) if workers > 1 else {"0": scrape(srv.url)}
        batches = sum(total(s, "qserve_batch_size_count") for s in metrics.values())
        texts_run = sum(total(s, "qserve_batch_size_sum") for s in metrics.values())
    finally:
        srv.stop()
    for lv in levels:
        log.info(
            "served w%d c%d: %.0f req/s, p50 %s ms, lost %d, label changes %d",
            workers,
            lv["concurrency"],
            lv["throughput_rps"],
            f"{lv['p50_ms']:.2f}" if lv["p50_ms"] is not None else "-",
            lv["lost"],
            lv["mismatched"],
        )
    return {
        "workers": workers,
        "ready_s": ready_s,
        "execution": execution,
        "levels": levels,
        "check": check,
        "mean_batch": texts_run / batches if batches else None,
        "per_worker_requests": {w: total(s, "qserve_requests_total", route="/v1/classify") for w, s in metrics.items()},
    }


# -- the user's commands: `qserve serve RUN_DIR` + `qserve loadtest`, one level at a time --------------------------
USER_TARGETS = {"served c1 p50 ms": ("<=", 2.0), "served c128 req/s": (">=", 10_000.0)}
"""The served bars (on a GPU) of `qserve serve RUN_DIR`; errors, lost and label changes must be 0 everywhere."""


def user_serve(args: argparse.Namespace) -> int:
    """--user RUN_DIR: the run's recommended variant served as the user serves it, loaded at each level in turn;
    out/report.json rewritten after each step, out/loadtest.json after each level. 0, or 1 when a target missed."""
    out = Path(args.out)
    levels = [int(c) for c in args.levels.split(",")]
    rep = StageReport(out, "serve", run_dir=args.user, levels=levels, duration_s=args.duration)
    rep.start("start the server")
    srv = Server([args.user, "--log-level", "warning"], ROOT, out / "server.log", tag="qserve serve RUN_DIR")
    done: list[dict[str, Any]] = []
    try:
        srv.wait_ready(args.ready_s)
        rep.done("start the server", ready_s=round(time.monotonic() - rep.t0, 2))
        for c in levels:
            rep.start(f"loadtest c{c}")
            lv = loadtest(srv.url, [c], args.duration, out, f"loadtest-c{c}")[0]
            done.append(lv)
            (out / "loadtest.json").write_text(json.dumps({"levels": done}, indent=2), encoding="utf-8")
            rep.done(f"loadtest c{c}", **{k: lv[k] for k in ("requests", "errors", "lost", "mismatched", "p50_ms")})
    finally:
        srv.stop()
    by = {lv["concurrency"]: lv for lv in done}
    for k in ("errors", "lost", "mismatched"):
        rep.check(f"served {k}", sum(lv[k] for lv in done), "<=", 0)
    for (name, (op, bar)), c, key in zip(USER_TARGETS.items(), (1, 128), ("p50_ms", "throughput_rps")):
        rep.check(name, (by.get(c) or {}).get(key), op, None if args.dry else bar)
    return rep.finish()


# -- the run -----------------------------------------------------------------------------------------------
def workers_list(spec: str, cores: int, device: str = "cpu") -> list[int]:
    """--workers: comma-separated counts, `auto` = half the cores, at most 8 (the rest for the clients); on a GPU at
    most 4 (each worker holds the model and its captured graphs on the one GPU)."""
    cap = 4 if device.startswith("cuda") else 8
    out = []
    for part in spec.split(","):
        part = part.strip().lower()
        out.append(max(1, min(cap, cores // 2)) if part == "auto" else int(part))
    if not out or any(w < 1 for w in out):
        raise QserveError(f"--workers {spec!r}: comma-separated counts >= 1, or auto")
    return list(dict.fromkeys(out))


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    import torch

    cores = os.cpu_count() or 1
    device = "cpu" if args.dry else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise QserveError("--device cuda: no CUDA GPU here; run with --dry for the CPU rehearsal")
    work = Path(args.out) / "work"  # the servers', clients' and children's logs: kept, the check packs their tails
    work.mkdir(parents=True, exist_ok=True)
    return measure(args, device, work, cores)


def measure(args: argparse.Namespace, device: str, work: Path, cores: int) -> dict[str, Any]:
    import torch

    if args.dry:
        variant = tiny_variant(work / "tiny")
    elif args.run_dir is None:
        raise QserveError("give RUN_DIR (a variant dir, or a dir holding variants/VARIANT), or --dry")
    else:
        variant = find_variant(Path(args.run_dir), args.variant)
    manifest = read_manifest(variant)
    seq = min(SEQ, manifest.max_length)
    review_texts = list(dict.fromkeys(reviews(args.texts)))
    rep: dict[str, Any] = {
        "variant": {"dir": str(variant), "name": manifest.name, "model": manifest.model_name, "seq": seq},
        "dry": bool(args.dry),
        "device": device,
        "machine": machine(),
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "settings": {
            "workers": args.workers,
            "clients": args.clients,
            "duration_s": args.duration,
            "texts": len(review_texts),
            "compile_timeout_s": args.compile_timeout,
        },
    }
    t0 = time.perf_counter()
    errors: dict[str, str] = {}
    steps: list[dict[str, Any]] = []
    rep.update(errors=errors, steps=steps, running=None, done=False, plain={}, served=[])

    def save() -> None:
        """report.json/md as they stand: rewritten at each step's start and end, so a run killed at its limit
        keeps every finished step."""
        rep["summary"] = summarize(rep)
        rep["checks"] = checks(rep["summary"], args.dry)
        rep["total_s"] = time.perf_counter() - t0
        write_report(Path(args.out), rep, render(rep), echo=False)

    def guarded(step: str, fn: Any, default: Any = None) -> Any:
        """A step that fails is recorded and the run goes on: the report always comes out."""
        rep["running"] = step
        save()
        t = time.perf_counter()
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - every failure is a finding of this run
            log.exception("%s failed", step)
            errors[step] = f"{type(e).__name__}: {e}"[:800]
            return default
        finally:
            steps.append({"step": step, "s": round(time.perf_counter() - t, 2), "ok": step not in errors})
            rep["running"] = None

    log.info("plain transformers on %s: eager and one CUDA graph per shape", device)
    rep["plain"] = guarded(
        "plain",
        lambda: plain(variant, device, review_texts[:8], seq, PLAIN_BATCHES if not args.dry else (1, 4), args.iters),
        {},
    )
    log.info("qserve's runtime: --cuda-graphs off, then auto")
    loaded = guarded("runtime", lambda: runtimes(variant, device, " ".join(review_texts[:8]), seq, args.budget))
    lt_texts = default_texts()
    ref, labels = None, []
    if loaded is not None:
        rep["runtime"], eager, graphed = loaded
        log.info("texts: %d scored alone and in batches of 8 and 32", len(review_texts))
        rep["texts"] = guarded("texts", lambda: compare_texts(graphed, eager, review_texts), {})
        labels = list(graphed.labels)
        ref = guarded("reference", lambda: np.concatenate([graphed.predict([t]) for t in lt_texts]).astype(np.float64))
        for rt in (eager, graphed):
            rt.close()
        del eager, graphed, loaded
    rep["compile"] = guarded("compile", lambda: run_compile(variant, device, work, args.compile_timeout), {})
    rep["in_process_s"] = time.perf_counter() - t0
    save()
    for w in workers_list(args.workers, cores, device):
        r = guarded(f"served --workers {w}", lambda w=w: serve(variant, device, w, args, work, lt_texts, ref, labels))
        if r:
            rep["served"].append(r)
        save()
    rep["done"] = True
    save()
    return rep


def runtimes(variant: Path, device: str, text: str, seq: int, budget: float) -> tuple[dict[str, Any], Any, Any]:
    """qserve's runtime eager (--cuda-graphs off: as served before) and with graphs (auto; `graphs` when auto
    kept eager on a GPU, so both rows exist), each timed as the bench times it; the two runtimes, still loaded."""
    eager = load(variant, device, "off")
    rows: dict[str, Any] = {"eager": {"execution": eager.execution, **runtime_rows(eager, text, seq, budget)}}
    graphed = load(variant, device, "auto")
    if graphed.execution and graphed.execution.get("mode") != "graphs" and device.startswith("cuda"):
        rows["auto"] = {"execution": graphed.execution}  # auto kept eager: say so, then time graphs anyway
        graphed.close()
        graphed = load(variant, device, "graphs")
    rows["graphs"] = {"execution": graphed.execution, **runtime_rows(graphed, text, seq, budget)}
    return rows, eager, graphed


def summarize(rep: dict[str, Any]) -> dict[str, Any]:
    """The must-show numbers: the graphs runtime's, and the best served run's (most c128 req/s)."""
    g = (rep.get("runtime") or {}).get("graphs") or {}
    served = [s for s in rep.get("served") or [] if s.get("levels")]
    best = max(served, key=lambda s: s["levels"][-1]["throughput_rps"]) if served else None
    lv = {x["concurrency"]: x for x in best["levels"]} if best else {}
    t = rep.get("texts") or {}
    return {
        "runtime_b1_p50_ms": g.get("b1_p50_ms"),
        "runtime_b32_seq_s": g.get("b32_seq_s"),
        "served_workers": best["workers"] if best else None,
        "served_c1_p50_ms": (lv.get(1) or {}).get("p50_ms"),
        "served_c128_rps": (lv.get(128) or {}).get("throughput_rps"),
        "served_lost": sum(x["lost"] for s in served for x in s["levels"]) if served else None,
        "served_label_changes": sum(x["mismatched"] for s in served for x in s["levels"])
        + sum((s.get("check") or {}).get("label_changes") or 0 for s in served)
        if served
        else None,
        "graphs_alone_vs_batched_max_dprob": t.get("max_abs_dprob"),
        "graphs_label_flips": t.get("flips"),
    }


def checks(summary: dict[str, Any], dry: bool) -> list[dict[str, Any]]:
    out = []
    for key, (op, bar) in TARGETS.items():
        v = summary.get(key)
        passed = None if dry or v is None else (v <= bar if op == "<=" else v >= bar)
        out.append({"name": key, "value": v, "target": f"{op} {bar:g}", "passed": passed})
    return out


def _f(x: Any, nd: int = 2) -> str:
    return "–" if x is None else (f"{x:,.{nd}f}" if isinstance(x, float) else str(x))


def render(rep: dict[str, Any]) -> str:
    dev = rep["gpu"] or f"CPU ({rep['machine']['cpu']}, dry run: plumbing only, no target applies)"
    v = rep["variant"]
    L = [
        f"# Served at the GPU's speed: {v['name']} on {dev}",
        "",
        f"Variant `{v['dir']}` ({v['model']}), {v['seq']} tokens; torch {rep['versions']['torch']} "
        f"(CUDA {rep['versions']['cuda']}); {rep['machine']['cores']} cores. One run, `python -m "
        f"benchmarks.gpu.serving` ({rep['total_s']:.0f} s).",
        "",
        "## Targets",
        "",
        "| check | measured | target | result |",
        "|---|---:|---|---|",
    ]
    for c in rep["checks"]:
        res = "–" if c["passed"] is None else ("**pass**" if c["passed"] else "**FAIL**")
        val = c["value"]
        nd = 3 if isinstance(val, float) and abs(val) < 10 else 1
        L.append(
            f"| {c['name']} | {f'{val:.2e}' if isinstance(val, float) and 0 < abs(val) < 1e-3 else _f(val, nd)}"
            f" | {c['target']} | {res} |"
        )
    if rep["errors"]:
        L += ["", "## Steps that failed", ""] + [f"- {k}: `{e}`" for k, e in rep["errors"].items()]
    L += _plain_lines(rep["plain"]) + _runtime_lines(rep) + _text_lines(rep.get("texts") or {})
    L += _served_lines(rep["served"])
    return "\n".join(L) + "\n"


def _plain_lines(p: dict[str, Any]) -> list[str]:
    if not p.get("rows"):
        return []
    L = [
        "",
        f"## Plain transformers ({p['dtype']}): eager and one CUDA graph per shape",
        "",
        "| b x s | eager (ms) | eager seq/s | CUDA graph (ms) | graph seq/s |",
        "|---|---:|---:|---:|---:|",
    ]
    L += [
        f"| {r['batch']} x {r['seq']} | {_f(r['eager_ms'], 3)} | {_f(r['eager_seq_s'], 0)} | "
        f"{_f(r.get('graph_ms'), 3)} | {_f(r.get('graph_seq_s'), 0)} |"
        for r in p["rows"]
    ]
    return L + (["", p["graph"] + "."] if p.get("graph") else [])


def _runtime_lines(rep: dict[str, Any]) -> list[str]:
    runtime, comp, seq = rep.get("runtime") or {}, rep.get("compile") or {}, rep["variant"]["seq"]
    rows = [(k, r) for k, r in runtime.items() if "b1_p50_ms" in r] + (
        [("compile", comp)] if "b1_p50_ms" in comp else []
    )
    if not rows:
        return []
    L = [
        "",
        "## qserve's runtime, as `qserve bench` times it",
        "",
        f"| execution | b1/s{seq} p50 (ms) | b1 p99 (ms) | b32/s{seq} (seq/s) | why |",
        "|---|---:|---:|---:|---|",
    ]
    for k, r in rows:
        ex = r.get("execution") or {}
        L.append(
            f"| {k} ({ex.get('mode')}) | {_f(r['b1_p50_ms'], 3)} | {_f(r['b1_p99_ms'], 3)} | "
            f"{_f(r['b32_seq_s'], 0)} | {ex.get('why')} |"
        )
    if "auto" in runtime:
        L += [
            "",
            f"auto kept eager here: {runtime['auto']['execution'].get('why')}; the graphs row was loaded with "
            "--cuda-graphs graphs.",
        ]
    if "b1_p50_ms" in comp:
        L += [
            "",
            f"torch.compile: loaded (and checked) in {comp['load_s']:.1f} s, its b1/b32 timing (compiling "
            f"each shape on first use) took {comp['measure_s']:.1f} s.",
        ]
    elif comp:
        L += ["", f"torch.compile: {comp.get('skipped') or comp.get('failed')}."]
    gx = (runtime.get("graphs") or {}).get("execution") or {}
    if gx.get("graphs"):
        gs = gx["graphs"]
        more = ", ..." if gs["count"] > 6 else ""
        L += [
            "",
            f"Graphs: {gs['count']} captured ({', '.join(gs['captured'][:6])}{more}), {gs['memory_mb']} MiB, "
            f"set up in {gx.get('setup_s')} s; refused: {len(gs['refused'])}; replay vs eager at load "
            f"|Δlogit| {gx.get('check_max_abs_dlogit')}; auto measured (ms) {gx.get('measured_ms')}.",
        ]
    return L


def _text_lines(t: dict[str, Any]) -> list[str]:
    if "max_abs_dprob" not in t:
        return []
    L = [
        "",
        "## Scores with graphs against scores alone, text by text",
        "",
        f"{t['texts']} test reviews, each scored alone and in shuffled batches of 8 and 32 (graphs runtime): largest "
        f"|Δprob| {t['max_abs_dprob']:.2e}, {t['over_1e-5']} texts over 1e-5, {t['flips']} label flips. Graphs "
        f"alone against eager alone: largest |Δprob| {t['vs_eager_max_abs_dprob']:.2e}, "
        f"{t['vs_eager_label_changes']} label changes.",
        "",
        "| worst texts | \\|Δprob\\| |",
        "|---|---:|",
    ]
    return L + [f"| {w['text'].replace('|', '/')} | {w['dprob']:.2e} |" for w in t["worst"]]


def _served_lines(served: list[dict[str, Any]]) -> list[str]:
    if not served:
        return []
    L = [
        "",
        "## Served: `qserve serve --workers W` + `qserve loadtest` (96 built-in reviews)",
        "",
        "| workers | clients | requests | ok | errors | lost | label changes | p50 (ms) | p99 (ms) | req/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in served:
        for lv in s["levels"]:
            L.append(
                f"| {s['workers']} | c{lv['concurrency']} ({lv['processes']} proc) | {lv['requests']} | "
                f"{lv['ok']} | {lv['errors']} | {lv['lost']} | {lv['mismatched']} | {_f(lv['p50_ms'])} | "
                f"{_f(lv['p99_ms'])} | {_f(lv['throughput_rps'], 0)} |"
            )
    for s in served:
        c = s.get("check")
        said = (
            f"; the 96 texts served one by one against the graphs runtime in this process: largest |Δscore| "
            f"{c['max_abs_dscore']:.2e}, {c['label_changes']} label changes"
            if c
            else ""
        )
        L += [
            "",
            f"--workers {s['workers']}: ready in {s['ready_s']:.1f} s, runs {(s['execution'] or {}).get('mode')}"
            f", mean batch {_f(s['mean_batch'])}, /v1/classify requests per worker {s['per_worker_requests']}"
            f"{said}.",
        ]
    return L


def failed(rep: dict[str, Any]) -> bool:
    return any(c["passed"] is False for c in rep.get("checks", []))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", nargs="?", help="a variant dir, or a dir holding variants/VARIANT (not with --dry)")
    p.add_argument("--variant", default="torch-bf16", help="the variant under RUN_DIR (default torch-bf16)")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N (--dry: cpu)")
    p.add_argument(
        "--workers",
        default="auto",
        help="server processes to try, comma-separated; auto = half the cores, at most 8, at most 4 on a GPU "
        "(default auto)",
    )
    p.add_argument("--clients", type=int, default=None, help="loadtest processes at c128 (default 4; --dry 1)")
    p.add_argument("--duration", type=float, default=None, help="seconds per loadtest level (default 5; --dry 1)")
    p.add_argument(
        "--texts", type=int, default=None, help="test reviews compared alone/batched (default 256; --dry 32)"
    )
    p.add_argument("--iters", type=int, default=None, help="timed calls per plain shape (default 50; --dry 5)")
    p.add_argument("--budget", type=float, default=None, help="seconds per runtime shape (default 1.5; --dry 0.2)")
    p.add_argument(
        "--compile-timeout",
        type=float,
        default=180.0,
        help="seconds for the torch.compile child (load, compile, time); 0 skips it (default 180; the GPU check "
        "passes 0 unless asked)",
    )
    p.add_argument(
        "--ready-s", type=float, default=180.0, help="seconds for a server and all its workers to answer (default 180)"
    )
    p.add_argument("--dry", action="store_true", help="the CPU rehearsal: a tiny model, short levels, no targets")
    p.add_argument(
        "--user",
        metavar="RUN_DIR",
        help="instead: `qserve serve RUN_DIR` + `qserve loadtest` at each of --levels in turn, as the user runs them",
    )
    p.add_argument("--levels", default="1,32,128", help="with --user: the loadtest's concurrencies (default 1,32,128)")
    p.add_argument("--part", choices=["compile"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, required=True, help="where report.json and report.md go")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if args.part == "compile":
        return compile_part(args)
    if args.user:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx2").setLevel(logging.WARNING)  # its /ready polls: one line each
        args.duration = 4.0 if args.duration is None else args.duration
        try:
            return user_serve(args)
        except QserveError as e:
            print(f"gpu_serving --user: error: {e}", file=sys.stderr)
            return 2
    dry = args.dry
    for name, gpu, cpu in (
        ("clients", 4, 1),
        ("duration", 5.0, 1.0),
        ("texts", 256, 32),
        ("iters", 50, 5),
        ("budget", 1.5, 0.2),
    ):
        if getattr(args, name) is None:
            setattr(args, name, cpu if dry else gpu)
    if dry and args.workers == "auto":
        args.workers = "2"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return finish("gpu_serving", args, argv, run, render, failed)


if __name__ == "__main__":
    sys.exit(main())
