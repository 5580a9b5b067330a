"""Child processes (one per CPU variant, one shared by the CUDA ones), interleaved rounds, agreement, floor, reports.

    python -c "from pathlib import Path; from qserve.bench.runner import run_bench; \\
from qserve.bench.config import BenchConfig; \\
run_bench([Path('models/minilm-imdb-variants/onnx-int8')], BenchConfig(batch_sizes=[1], seq_lens=[128]))"

The parent never imports torch. A crash, a timeout or an error is a `failed` entry while the others run on.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from qserve import QserveError
from qserve.artifact import CheckpointError, ModelMeta, VariantError, read_manifest, read_model_meta
from qserve.bench import analysis
from qserve.bench import store as stored
from qserve.bench.analysis import VariantMeta
from qserve.bench.config import BenchConfig
from qserve.bench.envinfo import environment, load_avg, merge_child_env, physical_cores
from qserve.bench.floor import flops_per_sequence, gemm_shapes
from qserve.bench.invariance import select_texts
from qserve.bench.recommend import RACE_KEEP, candidate, decisive, race, screen_p50
from qserve.bench.report import write_reports
from qserve.bench.rounds import merge_fixed, merge_real
from qserve.data.datasets import load_dataset
from qserve.devices import resolve_device
from qserve.files import dir_size, now_iso, refuse_existing, with_root_on_path
from qserve.placement import Plan
from qserve.placement import plan as plan_run
from qserve.provenance import provenance
from qserve.variants import REFERENCES, VARIANTS

log = logging.getLogger("qserve.bench")
FORMAT = "qserve-bench/1"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def variant_meta(vdir: Path) -> VariantMeta:
    """What the parent can read without loading: manifest, qserve_model.json, config.json, size."""
    meta = VariantMeta(str(vdir), config=_read_json(vdir / "config.json"))
    try:
        meta.model = read_model_meta(vdir)
    except CheckpointError as e:  # an unreadable qserve_model.json: the flags (or defaults) decide the data
        log.warning("bench: %s", e)
    try:
        meta.manifest = read_manifest(vdir)
    except VariantError as e:
        meta.manifest_error = str(e)
    if vdir.is_dir():
        meta.disk_bytes = dir_size(vdir)
        files = meta.manifest.files if meta.manifest is not None else {}
        meta.weights_bytes = sum(
            i.bytes
            for r, i in files.items()
            if not r.startswith(("tokenizer", "vocab", "special_tokens", "added_tokens"))
            and r.endswith((".safetensors", ".bin", ".onnx", ".onnx_data", ".data", ".pt"))
        )
    return meta


def default_out(cfg: BenchConfig, metas: list[VariantMeta]) -> Path:
    model = ([m.manifest.model_name for m in metas if m.manifest is not None] + ["bench"])[0]
    return Path("benchmarks") / "reports" / (cfg.name or f"{model}-{cfg.device}-t{cfg.threads}")


def data_key(cfg: BenchConfig, meta: VariantMeta) -> tuple[str | None, int, int | None, bool, str | None]:
    """(dataset, seed, max_eval_samples, accuracy?, problem type) for one variant: flags override
    qserve_model.json; the problem type is the manifest's (how the labels are read)."""
    m = meta.model or ModelMeta()
    dataset = cfg.dataset or m.dataset
    seed = cfg.seed if cfg.seed is not None else (m.seed if m.seed is not None else 42)
    max_eval = cfg.max_eval_samples if cfg.max_eval_samples is not None else m.max_eval_samples
    acc = bool(cfg.accuracy and dataset)
    problem = meta.manifest.problem_type if meta.manifest is not None else None
    return (dataset or "default"), seed, max_eval, acc, problem  # a speed-only run's real texts: the embedded split


def load_texts(key: tuple, cfg: BenchConfig, cache: dict) -> dict[str, Any]:
    """Real-text inputs and (when asked) the labelled test split, loaded once per key."""
    dataset, seed, max_eval, acc, problem = key
    if key in cache:
        return cache[key]
    out: dict[str, Any] = {"dataset": dataset, "seed": seed, "max_eval_samples": max_eval}
    if cfg.real_text_samples or acc or cfg.invariance_samples:
        try:
            splits = load_dataset(dataset, seed=seed, max_eval_samples=max_eval, problem_type=problem)
            test = splits.test
            texts, labels = list(test.texts), list(test.labels)
            if max_eval:
                texts, labels = texts[:max_eval], labels[:max_eval]
            out["dataset"] = getattr(splits, "name", dataset)
            out["real_texts"] = texts[: cfg.real_text_samples]

            out["invariance_texts"] = select_texts(texts, cfg.invariance_samples)
            if acc:
                out["eval"] = {
                    "dataset": getattr(splits, "name", dataset),
                    "seed": seed,
                    "texts": texts,
                    "labels": labels,
                    "label_names": list(splits.labels),
                    **({"pairs": list(test.pairs)[: len(texts)]} if test.pairs is not None else {}),
                }
        except Exception as e:  # no data is a skipped measurement, not a failed run
            out["error"] = f"{type(e).__name__}: {e}"
            log.warning("bench: could not load dataset %r (%s); real-text latency and accuracy skipped", dataset, e)
    cache[key] = out
    return out


def _child_env(cfg: BenchConfig, device: str | None = None) -> dict[str, str]:
    """The environment of a child measuring on `device` (default: the run's)."""
    env = with_root_on_path(dict(os.environ))
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(cfg.threads)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"  # the tokenizer must not steal the benchmark's cores
    if (device or cfg.device) == "cpu":
        env["QSERVE_FORCE_CPU"] = "1"  # never initialise CUDA in a CPU benchmark
    return env


class Worker:
    """One `python -m qserve.bench.measure` process answering ops one at a time, for one CPU variant or the
    CUDA ones (--isolation); a failed op ends it, and a variant still needed opens again in a fresh one (`starts`)."""

    def __init__(self, work: Path, cfg: BenchConfig, device: str, name: str):
        self.work, self.cfg, self.device = work, cfg, device
        self.log_path = work / f"worker-{name.replace(':', '_')}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.polled = 0.0  # the peak RSS seen of this worker's processes

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with open(self.log_path, "ab") as logf:  # the child holds its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "qserve.bench.measure"],
                stdin=subprocess.PIPE,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=_child_env(self.cfg, self.device),
            )
        self.starts += 1

    def send(self, op: dict[str, Any]) -> dict[str, Any]:
        """Write one op; returns what wait() needs (its answer file, its start, where its log begins)."""
        if not self.alive():
            self.start()
        out = Path(op["out"])
        out.unlink(missing_ok=True)
        start = self.log_path.stat().st_size if self.log_path.is_file() else 0
        with contextlib.suppress(OSError):  # it died between two ops: polled in wait() as any other death
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(op) + "\n").encode())
            self.proc.stdin.flush()
        return {"out": out, "t0": time.perf_counter(), "log": start}

    def wait(self, sent: dict[str, Any]) -> dict[str, Any]:
        """The op's answer with its status (ok, or failed with why: crash, exit, timeout) and its wall time: the
        process polled (its peak RSS kept) until it answers or exits, and killed past --child-timeout."""
        proc, out, t0, timed_out = self.proc, sent["out"], sent["t0"], False
        assert proc is not None
        try:
            ps: psutil.Process | None = psutil.Process(proc.pid)
        except psutil.Error:
            ps = None
        while proc.poll() is None and not out.is_file():
            with contextlib.suppress(psutil.Error):
                self.polled = max(self.polled, ps.memory_info().rss / 2**20) if ps else self.polled
            if time.perf_counter() - t0 > self.cfg.child_timeout_s:
                proc.kill()
                timed_out = True
            time.sleep(0.02)
        res, rc = _read_json(out) if out.is_file() else None, 0
        if res is None or res.get("error") or timed_out:
            try:
                rc = proc.wait(timeout=60)  # a failed op ends the worker (measure.worker); a killed one is dead
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            self.proc = None
        with open(self.log_path, "rb") as f:
            f.seek(sent["log"])
            tail = f.read().decode("utf-8", errors="replace")[-3000:]
        res = res if res is not None else {"stage": "unknown"}
        res.update({"returncode": rc, "wall_s": time.perf_counter() - t0, "polled_peak_rss_mb": self.polled})
        if rc == 0 and not res.get("error") and not timed_out:
            return {**res, "status": "ok"}
        why = (
            f"killed after --child-timeout {self.cfg.child_timeout_s:g} s"
            if timed_out
            else f"child died with signal {signal.Signals(-rc).name}"
            if rc < 0
            else f"child exited with code {rc}"
        )
        res.update(status="failed", error=res.get("error") or why, failure=why, log_tail=tail)
        return res

    def close(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of ops: the worker closes its variants and returns
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class Variant:
    """The parent's handle on one variant measured in interleaved rounds: its worker, its job, its rounds so far,
    its wall time (every op's), and whether it failed (then `failed` is its result)."""

    def __init__(self, index: int, tag: str, job_path: Path, worker: Worker, shared: bool):
        self.index, self.tag, self.job_path, self.worker, self.shared = index, tag, job_path, worker, shared
        self.opened: dict[str, Any] | None = None
        self.gen = -1  # worker.starts when it was opened: another process means open it again
        self.rounds: list[dict[str, Any]] = []
        self.wall = 0.0
        self.failed: dict[str, Any] | None = None
        self.ops = 0

    def _send(self, op: dict[str, Any]) -> dict[str, Any]:
        self.ops += 1
        out = str(self.job_path.parent / f"{self.tag}.{self.ops}.json")
        return self.worker.send({**op, "tag": self.tag, "shared": self.shared, "out": out})

    def _wait(self, sent: dict[str, Any]) -> dict[str, Any]:
        res = self.worker.wait(sent)
        self.wall += res["wall_s"]
        if res["status"] == "failed":
            self.failed = res
        return res

    def send_open(self) -> dict[str, Any]:
        sent = self._send({"op": "open", "job": str(self.job_path)})
        self.gen = self.worker.starts
        return sent

    def finish_open(self, sent: dict[str, Any]) -> dict[str, Any]:
        res = self._wait(sent)
        if res["status"] != "failed":
            self.opened = res
        return res

    def op(self, op: dict[str, Any]) -> dict[str, Any]:
        """One op on this variant, opening it again first in a fresh worker when its process is gone (another
        variant crashed the shared worker)."""
        if self.failed is not None:
            return self.failed
        if not self.worker.alive() or self.gen != self.worker.starts:
            self.finish_open(self.send_open())
            if self.failed is not None:
                return self.failed
        return self._wait(self._send(op))


def shared(cfg: BenchConfig, device: str) -> bool:
    """Whether a variant measured on `device` goes to the shared worker (--isolation; auto: the CUDA ones)."""
    return cfg.isolation == "shared" or (cfg.isolation == "auto" and str(device).startswith("cuda"))


def run_floor(cfg: BenchConfig, config: dict[str, Any] | None, work: Path) -> dict[str, Any]:
    if config is None:
        return {"error": "no variant has a config.json to count FLOPs from"}
    try:
        b, s = cfg.headline()
        flops = {str(s_): flops_per_sequence(config, s_) for s_ in cfg.seq_lens}
    except ValueError as e:
        return {"error": str(e)}
    out: dict[str, Any] = {"flops_per_sequence": flops}
    if cfg.floor:  # in a worker of its own, as a variant is measured: the GEMMs have the machine to themselves
        op: dict[str, Any] = {"op": "floor", "out": str(work / "floor.json"), "threads": cfg.threads}
        op.update(device=cfg.device, budget_s=cfg.floor_budget_s, shapes=gemm_shapes(config, b * s), model_shapes=3)
        worker = Worker(work, cfg, cfg.device, "floor")
        res = worker.wait(worker.send(op))
        worker.close()
        if res.get("status") == "failed":
            out.update(error=res["error"], log_tail=res.get("log_tail"))
        else:
            out |= {k: res[k] for k in ("peaks", "model_peaks", "attempts", "threads", "torch_threads") if k in res}
    return out


JOB_FIELDS = tuple(  # what a child's job copies from the config as it is
    "threads batch_sizes seq_lens time_budget_s warmup min_iters max_iters rounds stability allow_extra_files "
    "length_buckets".split()
)
REFERENCE_POLICY_TEXTS = 200
"""Test texts the reference compares long-text policies on when it is not the recommended variant: its records
feed only the agreement column (docs/bench.md)."""
CI = "order-statistic interval of the median over rounds (stats.median_ci)"  # what report["rounds"] says
MAX_ROUNDS_FACTOR = 3
"""Stability's extra rounds stop at this many times --rounds (or at --stability-budget seconds, first reached)."""


@dataclass
class Run:
    """One bench run as its steps pass it down: the variants as read once (their manifests), where each is
    measured, its job, data and store key, its handle while measured, and its result once done."""

    cfg: BenchConfig
    dirs: list[Path]
    metas: list[VariantMeta]
    device_of: list[str]
    work: Path
    store: Path | None
    reuse: bool
    # each variant's (job, what identifies its texts, its store key), its texts, and its result as its child
    # returned it (thread counts, GPU name) or as the store kept it
    jobs: dict[int, tuple[dict[str, Any], dict[str, Any], str]] = field(default_factory=dict)
    data: dict[int, dict[str, Any]] = field(default_factory=dict)
    raw: dict[int, dict[str, Any]] = field(default_factory=dict)
    handles: dict[int, Variant] = field(default_factory=dict)
    workers: dict[str, Worker] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # who measured when, in the order it happened
    extra: int = 0
    # the variant agreement is measured against (variants.REFERENCES, by its spec), and the measuring order: the
    # reference, then fewer weight bytes first
    ref: int | None = field(init=False)
    order: list[int] = field(init=False)

    def __post_init__(self) -> None:
        names = [m.manifest.name if m.manifest is not None else None for m in self.metas]
        self.ref = next((names.index(n) for n in REFERENCES if n in names), None)
        rest = sorted((i for i in range(len(names)) if i != self.ref), key=lambda i: self.metas[i].weights_bytes or 0)
        self.order = ([self.ref] if self.ref is not None else []) + rest

    def files(self, i: int) -> dict[str, Any] | None:
        """The manifest's file hashes (the store key's "exact files measured")."""
        manifest = self.metas[i].manifest
        return manifest.to_json()["files"] if manifest is not None else None

    def handle(self, i: int, tag: str) -> Variant:
        """A handle on variant i: its job written, in the shared worker of its device or in one of its own."""
        job_path, device = self.work / f"{tag}.job.json", self.device_of[i]
        job_path.write_text(json.dumps(self.jobs[i][0]), encoding="utf-8")
        key = f"shared-{device}" if shared(self.cfg, device) else tag
        worker = self.workers.setdefault(key, Worker(self.work, self.cfg, device, key))
        self.handles[i] = Variant(i, tag, job_path, worker, shared(self.cfg, device))
        return self.handles[i]


def _texts_sha(data: dict[str, Any]) -> str:
    """Which texts a measurement saw (real-text, invariance, the labelled test split): part of its store key."""
    ev = data.get("eval") or {}
    seen = [data.get("real_texts"), data.get("invariance_texts"), ev.get("texts"), ev.get("labels"), ev.get("pairs")]
    return hashlib.sha256(json.dumps(seen, default=str).encode()).hexdigest()


def _jobs(run: Run) -> None:
    """Each variant's job and its data file (one per dataset key), its store key, and the stored result where
    --reuse finds one."""
    cfg, cache = run.cfg, dict[tuple, dict]()
    for i in run.order:
        key = data_key(cfg, run.metas[i])
        data = run.data[i] = load_texts(key, cfg, cache)
        data_file = run.work / f"data-{abs(hash(key))}.json"
        if not data_file.exists():
            payload = {k: data.get(k) or [] for k in ("real_texts", "invariance_texts")}
            if key[3] and data.get("eval"):
                payload["eval"] = data["eval"]
            data_file.write_text(json.dumps(payload), encoding="utf-8")
        job = {k: getattr(cfg, k) for k in JOB_FIELDS}
        job.update(variant_dir=str(run.dirs[i].resolve()), device=run.device_of[i], data_file=str(data_file))
        job.update(long_text=None, token_cache=str((run.store or run.work) / "pieces"))
        if cfg.long_text and i == run.ref:
            # the reference's policies, for agreement only: on its first texts, in its own child
            job.update({"long_text": cfg.long_text, "eval_limit": REFERENCE_POLICY_TEXTS})
        ident = {"key": list(key), "texts": _texts_sha(data)}
        run.jobs[i] = (job, ident, stored.key(run.files(i), job, ident))
        res = stored.load(run.store, run.dirs[i], "variant", run.jobs[i][2]) if run.reuse else None
        if res is not None:
            log.info("bench: %s: reusing the measurement in %s", run.dirs[i].name, run.store)
            run.raw[i] = {**res, "reused": True}


def _open_all(handles: list[Variant], cfg: BenchConfig) -> None:
    """Load every variant once, untimed: own processes in parallel, one per physical core; a shared worker's in turn."""
    alone = [h for h in handles if not h.shared]
    width = max(1, physical_cores() or 1)
    for at in range(0, len(alone), width):
        group = alone[at : at + width]
        sent = [(h, h.send_open()) for h in group]
        for h, x in sent:
            if h.finish_open(x)["status"] == "ok" and h.opened is not None:
                h.opened["parallel"] = len(group)
    for h in handles:
        if h.shared:
            h.finish_open(h.send_open())


def _round(run: Run, live: list[Variant], rid: str, k: int, only: list | None = None) -> None:
    """One round over `live` in turn (one variant measuring, the others idle): each one's calls kept on its
    handle, the order it happened in on run.rounds."""
    for h in live:
        if h.failed is not None:
            continue
        ans = h.op({"op": "round", "id": rid, "round": k, "only": only})
        if ans["status"] == "ok":
            h.rounds.append(ans)
            when = {x: ans.get(x) for x in ("t0", "t1", "pid")}
            run.rounds.append({"variant": run.dirs[h.index].name, "round": k, **when})
        else:
            log.error("bench: %s failed in round %d: %s", run.dirs[h.index], k + 1, ans.get("error"))


def _merged(h: Variant, cfg: BenchConfig) -> dict[str, Any]:
    return {"fixed": merge_fixed(h.rounds, cfg.stability), "real_text": merge_real(h.rounds, cfg.stability)}


def _measure(run: Run) -> int | None:
    """Open every variant not reused, the screen round, the race (a raced-out variant finished at once), the other
    rounds and the extra ones for stability; returns the fastest candidate of the screen round."""
    cfg = run.cfg
    for i in run.order:
        if i not in run.raw:
            run.handle(i, f"v{i}")
    _open_all(list(run.handles.values()), cfg)
    token = now_iso()
    live = [run.handles[i] for i in run.order if i in run.handles]
    log.info("bench: round 1/%d over %d variants, the screen", cfg.rounds, len(live))
    _round(run, live, f"{token}#0", 0)
    raced, best = _race(run, live)
    for h in live:
        if h.index in raced:  # measured once: its memory and environment, nothing scored, its process gone
            run.raw[h.index] = _finish(h, cfg, raced[h.index])
            if not h.shared:
                h.worker.close()
    live = [h for h in live if h.index not in raced]
    for k in range(1, cfg.rounds):
        log.info("bench: round %d/%d over %d variants", k + 1, cfg.rounds, len(live))
        _round(run, live, f"{token}#{k}", k)
    only = [["fixed", *cfg.headline()], ["real", 1]]
    t0, k = time.perf_counter(), cfg.rounds
    while k < cfg.rounds * MAX_ROUNDS_FACTOR and time.perf_counter() - t0 < cfg.stability_budget_s:
        # the numbers a variant is ranked by (real-text b1, the headline shape) agree between rounds within --stability?
        shaky = [
            h
            for h in live
            if h.failed is None and not all(r.get("stable") for r in decisive(_merged(h, cfg), cfg.headline()) if r)
        ]
        if not shaky:
            break
        names = ", ".join(run.dirs[h.index].name for h in shaky)
        log.info("bench: round %d: %s disagree between rounds; more rounds", k + 1, names)
        _round(run, shaky, f"{token}#{k}", k, only)
        k, run.extra = k + 1, run.extra + 1
    return best


def _race(run: Run, live: list[Variant]) -> tuple[dict[int, dict[str, Any]], int | None]:
    """After the screen round: ({index: its race record} of the variants raced out, the fastest candidate there).
    A candidate is what can still win before agreement is known (recommend.candidate, from the manifests' gates)."""
    headline = run.cfg.headline()
    screen = {h.index: screen_p50(_merged(h, run.cfg), headline) for h in live if h.failed is None}
    screen |= {i: screen_p50(r, headline) for i, r in run.raw.items() if r.get("status") == "ok"}
    gates = {i: m.manifest.gate for i, m in enumerate(run.metas) if m.manifest is not None and m.manifest.gate}
    cands = sorted((i for i in screen if candidate(gates.get(i), i == run.ref, bool(gates))), key=screen.__getitem__)
    keep = race(screen, cands, run.cfg.race, run.ref) | set(run.raw)
    return {i: {"screen_ms": p, "of_best": p / screen[cands[0]]} for i, p in screen.items() if i not in keep}, (
        cands[0] if cands else None
    )


def _finish(h: Variant, cfg: BenchConfig, raced_out: dict[str, Any] | None = None) -> dict[str, Any]:
    """A variant's result: its rounds merged, and what is measured once (the full evaluation, or for a raced-out
    variant only its memory and environment)."""
    if h.failed is not None:
        return h.failed
    ans = h.op({"op": "finish", "raced_out": raced_out is not None})
    if ans["status"] == "ok":
        ans.update({**_merged(h, cfg), "wall_s": h.wall, **({"raced_out": raced_out} if raced_out else {})})
        ans["load_parallel"] = h.opened.get("parallel") if h.opened else None
    return ans


def _entries(run: Run, plan: Plan | None) -> list[dict[str, Any]]:
    """Each variant finished (its result kept in the store) and turned into its report entry, in the order given."""
    entries: dict[int, dict[str, Any]] = {}
    for step, i in enumerate(run.order):
        if i not in run.raw:
            run.raw[i] = _finish(run.handles[i], run.cfg)
            stored.save(run.store, run.dirs[i], "variant", run.jobs[i][2], run.raw[i])
        res, d = run.raw[i], run.dirs[i]
        res["data"] = {k: v for k, v in run.data[i].items() if k in ("dataset", "seed", "max_eval_samples", "error")}
        if res["status"] == "failed":
            log.error("bench: %s failed (%s): %s", d, res.get("failure"), res.get("error"))
        else:
            log.info("bench: [%d/%d] %s done (%.1f s in all)", step + 1, len(run.dirs), d, res.get("wall_s") or 0)
        e = entries[i] = analysis.variant_entry(run.metas[i], res)
        e["device"] = e["device"] or run.device_of[i]  # a child that died before loading: where it was to run
        placed = plan.get(e["spec"]["name"]) if plan is not None and e.get("spec") else None
        if placed is not None and placed.device != run.cfg.device and placed.why:
            e["placement"] = placed.why
    return [entries[i] for i in range(len(run.dirs))]


def _policy_pass(run: Run, entries: list[dict[str, Any]]) -> None:
    """The long-text comparison on the reference and the recommended variant, in the process that holds it
    loaded already (a variant reused from the store is opened for it)."""
    picked, rec = _policy_candidates(entries, run.cfg)
    for i in picked:
        job, ident, _ = run.jobs[i]
        done = entries[i].get("long_text_policies")
        if done and (i != rec or all(r["n"] == (entries[i].get("accuracy") or {}).get("n") for r in done)):
            continue  # the reference, compared in its own child already (on every text, if it is chosen)
        own = run.raw[i].get("accuracy") or {}
        # a reference that is not the recommended one feeds only agreement: its first texts
        op: dict[str, Any] = {
            "long_text": run.cfg.long_text,
            "eval_limit": REFERENCE_POLICY_TEXTS if i != rec else None,
        }
        k = stored.key(run.files(i), {**job, "mode": "policies", **op}, ident)
        res = stored.load(run.store, run.dirs[i], "policies", k) if run.reuse else None
        if res is None:
            log.info("bench: %s: long-text policies %s", run.dirs[i], ",".join(run.cfg.long_text or []))
            h = run.handles.get(i)
            if h is None or h.failed is not None:
                h = run.handle(i, f"p{i}")
            res = h.op({"op": "policies", **op, "own": {x: own.get(x) for x in ("policy", "predictions", "seconds")}})
            stored.save(run.store, run.dirs[i], "policies", k, res)
        if res["status"] == "ok":
            entries[i]["long_text_policies"] = res["long_text_policies"]
        else:
            log.error("bench: %s: policy comparison failed: %s", run.dirs[i], res.get("error"))
            entries[i]["long_text_policies_error"] = res.get("error")


def _policy_candidates(entries: list[dict[str, Any]], cfg: BenchConfig) -> tuple[list[int], int | None]:
    """(the variants that compare policies, the one whose records name the served policy): the reference and the
    recommended variant, as analysis.finish will choose them; else the reference, else the first measured."""
    draft: dict[str, Any] = {"variants": copy.deepcopy(entries), "config": cfg.to_json(), "floor": {}}
    draft.update(headline=dict(zip(("batch", "seq"), cfg.headline())), environment={})
    analysis.finish(draft)  # the same rule, on the same records: which variant the report will recommend
    names = [v["name"] for v in draft["variants"]]
    want = [draft.get("agreement_reference"), (draft.get("recommended") or {}).get("variant")]
    picked = list(dict.fromkeys(names.index(n) for n in want if n in names))
    if not picked:
        picked = [i for i, v in enumerate(entries) if v.get("status") == "ok" and v.get("accuracy")][:1]
    rec = want[1] if want[1] in names else None
    return picked, (names.index(rec) if rec else (picked[0] if picked else None))


def bench_plan(cfg: BenchConfig, metas: list[VariantMeta]) -> Plan | None:
    """Where each variant is measured: --device auto, the placement plan; an explicit device, None (all there)."""
    if cfg.device != "auto":
        return None
    names = [m.manifest.name for m in metas if m.manifest is not None and m.manifest.name in VARIANTS]
    return plan_run("auto", list(dict.fromkeys(names)))


def run_bench(
    variant_dirs: list[Path], cfg: BenchConfig, store: Path | None = None, reuse: bool = False, plan: Plan | None = None
) -> dict[str, Any]:
    """Benchmark every variant in its own child; write report.json/csv/md and plots into cfg.out.

    The --long-text comparison runs on the reference and the recommended variant only (docs/bench.md). `store`: keep
    each finished measurement there; `reuse`: read those whose key matches; `plan`: each variant's device."""
    if not variant_dirs:
        raise QserveError("qserve bench needs at least one VARIANT_DIR")
    cfg.validate()
    if cfg.threads is None:
        cfg.threads = physical_cores()
    dirs = [Path(d) for d in variant_dirs]
    metas = [variant_meta(d) for d in dirs]  # the manifests, read once: every step below takes them from here
    plan = plan or bench_plan(cfg, metas)
    cfg.device = plan.device if plan is not None else resolve_device(cfg.device)
    device_of = [plan.device_of(m.manifest.name) if plan and m.manifest is not None else cfg.device for m in metas]
    out = cfg.out = Path(cfg.out) if cfg.out else default_out(cfg, metas)
    refuse_existing(out, cfg.force)
    created, env = now_iso(), environment(cfg.threads, cfg.device)
    with tempfile.TemporaryDirectory(prefix="qserve-bench-") as tmp:
        run = Run(cfg, dirs, metas, device_of, Path(tmp), store, reuse)
        log.info("bench: measuring the compute floor at %d threads", cfg.threads)
        floor = run_floor(cfg, next((m.config for m in metas if m.config), None), run.work)
        _jobs(run)
        try:
            best = _measure(run)
            entries = _entries(run, plan)
            if cfg.long_text:
                _policy_pass(run, entries)
        finally:
            for w in run.workers.values():
                w.close()
    env["load_avg_end"] = load_avg()
    report = {
        "format": FORMAT,
        "created": created,
        "run": {"name": out.name, "out": str(out)},
        "config": cfg.to_json(),
        "environment": merge_child_env(env, [run.raw[i] for i in range(len(dirs))]),
        "provenance": provenance(),
        "headline": dict(zip(("batch", "seq"), cfg.headline())),
        "model": analysis.model_block(metas),
        "floor": floor,
        "race": {"factor": cfg.race, "keep": RACE_KEEP, "best": entries[best]["name"] if best is not None else None},
        "variants": entries,
        "rounds": {"asked": cfg.rounds, "extra": run.extra, "stability": cfg.stability, "ci": CI, "log": run.rounds},
    }
    analysis.finish(report)
    write_reports(report, out)
    return report
