"""What runs inside a benchmark child: load variants once, keep them loaded, time them in rounds the parent asks for.

    python -m qserve.bench.measure      # one JSON op a line on stdin: open, round, finish, policies, close, floor

Everything goes through `load_runtime`, the path the server uses. A failure is written as the op's answer with
the stage it happened in, and the worker exits 1 (docs/bench.md, "The bench in minutes").
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from qserve import problemtypes as problems
from qserve.bench import evalpass, invariance, policies
from qserve.bench.evalpass import tokenizer_key
from qserve.bench.floor import measure_peaks
from qserve.bench.realtext import real_text_check, real_text_round, synthetic_batch
from qserve.bench.rounds import merge_fixed, merge_real, per_round, round_iters
from qserve.bench.stats import summarize, throughput
from qserve.files import write_json_atomic
from qserve.modeling import skip_unused_imports
from qserve.problemtypes import headline
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.variants import REGISTRY, library_versions
from qserve.verify import verify

# without dataset text: real English (ordinary vocabulary ids), repeated to fill any length
FALLBACK_TEXT = (
    "The film opens slowly, but the performances are strong and the story builds to an ending "
    "that feels earned. Some scenes drag, and the dialogue is uneven, yet I would watch it again."
)
FAULT_ENV = "QSERVE_BENCH_FAULT"
"""Test hook: '<variant dir name>:abort|exit|raise' makes that variant's child fail after loading."""


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Peak resident set of this process: VmHWM (Linux), else ru_maxrss."""
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


def time_calls(fn, sync, warmup: int, budget_s: float, min_iters: int, max_iters: int) -> list[float]:
    """Latencies (ms) of fn()+sync() after warm-up, bounded by iterations and time."""
    w0 = time.perf_counter()
    for _ in range(warmup):
        fn()
        sync()
        if time.perf_counter() - w0 > budget_s / 2:
            break  # a slow variant is warm after one call; don't spend its budget here
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_iters and (len(samples) < min_iters or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def fixed_shapes(rt, job: dict[str, Any], text: str) -> list[dict[str, Any]]:
    out = []
    for b in job["batch_sizes"]:
        for s in job["seq_lens"]:
            rec: dict[str, Any] = {"batch": b, "seq": s}
            try:
                batch = synthetic_batch(rt, b, s, text)
                limits = (job["warmup"], job["time_budget_s"], job["min_iters"], job["max_iters"])
                samples = time_calls(lambda: rt.run(batch), rt.synchronize, *limits)
                rec.update(summarize(samples))
                rec["throughput"] = throughput(b * len(samples), sum(samples) / 1e3)
                rec["tokens_per_s"] = rec["throughput"] * s
            except Exception as e:  # e.g. seq beyond the position table: this shape only
                rec["error"] = f"{type(e).__name__}: {e}"[:500]
            log(
                f"{rt.name} b{b}/s{s}: "
                + (f"p50 {rec['p50']:.2f} ms ({rec['count']} calls)" if "p50" in rec else rec["error"])
            )
            out.append(rec)
    return out


def eager_beside_graphs(rt, job: dict[str, Any], text: str) -> dict[str, Any]:
    """A CUDA torch variant's execution record and, when it runs graphs or compile, its fixed shapes again eager
    ("fixed_eager"); other backends and CPU runs add nothing."""
    execution = getattr(rt, "execution", None)
    if not execution:
        return {}
    out: dict[str, Any] = {"execution": execution}
    log(f"{rt.name}: runs {execution.get('mode')} ({execution.get('why')})")
    if execution.get("mode") != "eager":
        with rt.eager_only():
            out["fixed_eager"] = fixed_shapes(rt, job, text)
        for rec in out["fixed_eager"]:
            rec["mode"] = "eager"
    return out


def accuracy(rt, ev: dict[str, Any], batch: int = 32, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """predict() over the test texts (or pairs) under the variant's own long-text policy, in length-sorted batches;
    quality by its problem type (problemtypes.metrics)."""
    texts, labels, problem = ev["texts"], ev["labels"], rt.problem_type
    pairs = ev.get("pairs")  # a text-pair test split
    cache = cache or {}
    stats = evalpass.piece_stats(rt, texts, rt.long_text, cache.get("dir"), cache.get("tokenizer"), pairs)
    preds, seconds = evalpass.score(rt, texts, None, stats["tokens"], batch, pairs)
    extra: dict[str, Any] = {"problem_type": problem} if problem != problems.SINGLE else {}
    if problem == problems.REGRESSION:  # the yardstick of regression agreement: mean |Δ| as a share of it
        extra["label_range"] = problems.value_range(labels)
    return {
        "dataset": ev.get("dataset"),
        "seed": ev.get("seed"),
        "n": len(texts),
        "policy": str(rt.long_text),
        **problems.metrics(preds, labels, problem, len(rt.labels)),
        **extra,
        "seconds": seconds,
        "predictions": preds,
    }


def _policies(
    rt, res: dict[str, Any], ev: dict[str, Any], job: dict[str, Any], own: dict[str, Any] | None, cache: dict[str, Any]
) -> None:
    """res["long_text_policies"]: every policy of job["long_text"] on the test texts, or on their first
    job["eval_limit"] (a reference that is not the recommended variant: its records feed agreement only)."""
    _stage(res, "long_text")
    limit = job.get("eval_limit")
    if limit and limit < len(ev["texts"]):
        ev = {**ev, "texts": ev["texts"][:limit], "labels": ev["labels"][:limit]}
    res["long_text_policies"] = policies.measure(rt, ev, job["long_text"], own=own, cache=cache)
    for r in res["long_text_policies"]:
        log(
            f"{rt.name} {r['policy']}: accuracy {r['accuracy']:.4f}, {r['texts_per_s'] or 0:.1f} texts/s, "
            f"{r['mean_windows']:.2f} windows per text"
        )


def _preimport(backend: str, device: str) -> None:
    """Import the backend's libraries (the registry's `libraries`) and start CUDA before the baseline, so 'model
    memory' and the load time exclude them; an unknown backend is left for load_runtime to refuse."""
    import tokenizers  # noqa: F401  (the tokenizer, every backend)

    entry = REGISTRY.get(backend)
    for module in entry.libraries if entry else ():
        importlib.import_module(module)
    if str(device).startswith("cuda") and "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():  # the context's start-up (seconds): once per process, not the variant's load
            torch.empty(1, device=device)


def _fault(variant_dir: Path) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    name, _, mode = spec.partition(":")
    if not spec or name != variant_dir.name:
        return
    log(f"injected fault {mode!r} in {variant_dir.name}")
    if mode == "abort":
        os.abort()
    if mode == "exit":
        os._exit(3)
    raise RuntimeError(f"injected failure ({FAULT_ENV}={spec})")


def _stage(res: dict[str, Any], name: str) -> None:
    """Enter stage `name` (what a failure names): the stage left gets its seconds in res["stage_s"], the
    breakdown of where a variant's bench time goes."""
    now = time.perf_counter()
    if "_t" in res:
        spent = res.setdefault("stage_s", {})
        spent[res["stage"]] = round(spent.get(res["stage"], 0.0) + now - res["_t"], 3)
    res["stage"], res["_t"] = name, now
    if name == "done":
        del res["_t"]


class Session:
    """One variant loaded and kept loaded, measured op by op (open, round, finish, policies, close); `res` is its result
    as it grows, and a failing op raises with res["stage"] naming where."""

    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.res: dict[str, Any] = {"variant_dir": job["variant_dir"], "pid": os.getpid()}
        job["_result"] = self.res
        self.rt: Any = None
        self.cursor: dict[int, int] = {}  # real-text batch size -> where the next round continues in the texts
        self.last: dict[tuple[int, int], float] = {}  # a shape's last round p50: is a warm-up call cheap?
        self.batches: dict[tuple[int, int], Any] = {}
        self.cache: dict[str, Any] = {}
        self.backend = ""

    @property
    def texts(self) -> list[str]:
        return (self.job.get("data") or {}).get("real_texts") or []

    def open(self) -> dict[str, Any]:
        res, job = self.res, self.job
        variant_dir, extra = Path(job["variant_dir"]), bool(job.get("allow_extra_files"))
        _stage(res, "load")  # the files first (sha256): a tampered variant fails before the seconds of imports
        t0 = time.perf_counter()
        manifest = verify(variant_dir, allow_extra_files=extra)
        checked_s = time.perf_counter() - t0
        _stage(res, "import")
        t0 = time.perf_counter()
        self.backend = manifest.backend
        if __name__ == "__main__":  # the bench's own child process, not a user's: seconds of its start (modeling.py)
            skip_unused_imports()
        _preimport(self.backend, job["device"])
        res.update(import_s=time.perf_counter() - t0, rss_before_load_mb=rss_mb())
        _stage(res, "load")
        t0 = time.perf_counter()
        options = RuntimeOptions(threads=job.get("threads"), length_buckets=job.get("length_buckets") or "auto")
        rt = self.rt = load_runtime(
            variant_dir, device=job["device"], options=options, verify_hashes=False, allow_extra_files=extra
        )
        load_s = checked_s + time.perf_counter() - t0  # with the check, as load_runtime's own
        res.update(load_s=load_s, rss_after_load_mb=rss_mb(), peak_rss_load_mb=peak_rss_mb())
        res.update(name=rt.name, labels=list(rt.labels), max_length=rt.max_length, long_text=str(rt.long_text))
        res.update(length_buckets=list(rt.buckets) if rt.buckets else None, device=rt.device)
        log(f"{rt.name}: loaded in {res['load_s']:.2f} s")
        _fault(variant_dir)
        self.cache = {"dir": job.get("token_cache"), "tokenizer": tokenizer_key(manifest.to_json().get("files") or {})}
        _stage(res, "idle")
        return {k: res[k] for k in ("name", "device", "load_s", "import_s", "pid")}

    def round(self, op: dict[str, Any]) -> dict[str, Any]:
        """One round (op["round"], named op["id"]): every fixed shape and every real-text batch size (or op["only"]'s:
        ["fixed", b, s], ["real", b]) for its share of the time budget; the raw calls, the parent merges the rounds."""
        rt, job, res, k, only = self.rt, self.job, self.res, op["round"], op.get("only")
        rounds = int(job.get("rounds") or 1)
        budget = per_round(job["time_budget_s"], rounds)
        lo, hi = round_iters(job["min_iters"], job["max_iters"], rounds)
        text = " ".join(self.texts[:8]) if self.texts else FALLBACK_TEXT
        out: dict[str, Any] = {"id": op["id"], "round": k, "pid": os.getpid(), "t0": time.time(), "fixed": []}
        out["real_text"] = []
        _stage(res, "fixed")
        for b in job["batch_sizes"]:
            for s in job["seq_lens"]:
                if only is not None and ["fixed", b, s] not in only:
                    continue
                rec: dict[str, Any] = {"batch": b, "seq": s}
                try:
                    if (b, s) not in self.batches:
                        self.batches[(b, s)] = synthetic_batch(rt, b, s, text)
                    batch = self.batches[(b, s)]
                    warm = job["warmup"] if (b, s) not in self.last else int(self.last[(b, s)] / 1e3 < budget / 4)
                    rec["samples"] = time_calls(lambda: rt.run(batch), rt.synchronize, warm, budget, lo, hi)
                    self.last[(b, s)] = statistics.median(rec["samples"])
                except Exception as e:  # e.g. seq beyond the position table: this shape only
                    rec["error"] = f"{type(e).__name__}: {e}"[:500]
                out["fixed"].append(rec)
        if self.texts:
            _stage(res, "real_text")
            for b in job["batch_sizes"]:
                if only is not None and ["real", b] not in only:
                    continue
                rec, self.cursor[b] = real_text_round(
                    rt, b, self.texts, self.cursor.get(b, 0), budget, lo, hi, warm=k == 0 or b not in self.cursor
                )
                out["real_text"].append(rec)
        _stage(res, "idle")
        out["t1"] = time.time()
        return out

    def finish(self, op: dict[str, Any]) -> dict[str, Any]:
        """Everything measured once (real-text check, eager beside graphs, accuracy, the reference's policies,
        invariance, memory), or for a variant raced out (op["raced_out"]) its memory alone; the fixed and real-text
        records are the parent's."""
        rt, job, res = self.rt, self.job, self.res
        full = not op.get("raced_out")
        data, texts = (job.get("data") or {}) if full else {}, self.texts if full else []
        cuda = str(rt.device).startswith("cuda")  # a fresh process: torch's peak counters cover the load too
        if texts:
            _stage(res, "real_text")
            res["real_text_check"] = real_text_check(rt, job, texts)
        if cuda and full:
            _stage(res, "fixed")
            res.update(eager_beside_graphs(rt, job, " ".join(texts[:8]) if texts else FALLBACK_TEXT))
        if data.get("eval"):
            _stage(res, "accuracy")
            res["accuracy"] = accuracy(rt, data["eval"], cache=self.cache)
            log(f"{rt.name}: {headline(res['accuracy'])} on {res['accuracy']['n']} texts")
            if job.get("long_text"):  # the reference compares policies in its own child (runner: the first one)
                _policies(rt, res, data["eval"], job, res["accuracy"], self.cache)
        if data.get("invariance_texts"):
            _stage(res, "invariance")
            res["invariance"] = invariance.measure(rt, data["invariance_texts"])
            log(f"{rt.name}: batch invariance {invariance.cell(res['invariance'])} (max |Δprob| / label flips)")
        _stage(res, "idle")
        res.update(peak_rss_mb=peak_rss_mb(), model_rss_mb=res["rss_after_load_mb"] - res["rss_before_load_mb"])
        if cuda:
            import torch

            free, total = torch.cuda.mem_get_info()
            # ONNX Runtime's CUDA allocations are invisible to torch's counters; device-wide use covers them
            res["cuda"] = {
                "max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
                "max_reserved_mb": torch.cuda.max_memory_reserved() / 2**20,
                "device_used_mb": (total - free) / 2**20,
                "gpu": torch.cuda.get_device_name(),
            }
        res.update(env=child_env(self.backend), versions=library_versions())
        if op.get("shared"):  # measured in the shared worker, after the variants before it
            res["isolation"] = "shared"
        return self.result()

    def policies(self, op: dict[str, Any]) -> dict[str, Any]:
        """The long-text comparison in this loaded process (the recommended variant's, after the rounds)."""
        job = {**self.job, **{k: op.get(k) for k in ("long_text", "eval_limit")}}
        out: dict[str, Any] = {}
        _policies(self.rt, out, (self.job.get("data") or {})["eval"], job, op.get("own"), self.cache)
        _stage(out, "idle")
        return {"long_text_policies": out["long_text_policies"], "stage_s": out.get("stage_s")}

    def result(self) -> dict[str, Any]:
        out = {k: v for k, v in self.res.items() if k not in ("_t",)}
        if out.get("stage_s"):
            out["stage_s"] = {k: v for k, v in out["stage_s"].items() if k != "idle"}
        out["stage"] = "done"
        return out

    def close(self) -> None:
        if self.rt is not None:
            self.rt.close()
            self.rt = None


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """One variant in this process: open, job["rounds"] rounds back to back, finish (the runner interleaves instead)."""
    s = Session(job)
    s.open()
    rounds = [s.round({"id": str(k), "round": k}) for k in range(int(job.get("rounds") or 1))]
    tolerance = float(job.get("stability") or 0.1)
    fixed, real = merge_fixed(rounds, tolerance), merge_real(rounds, tolerance)
    res = s.finish({})
    res.update({"fixed": fixed, "real_text": real})
    s.close()
    return res


def child_env(backend: str) -> dict[str, Any]:
    """Thread counts as the libraries actually see them, in this child."""
    env: dict[str, Any] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if "torch" in sys.modules:
        import torch

        env.update(torch_threads=torch.get_num_threads(), torch_interop_threads=torch.get_num_interop_threads())
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
    return env


def _read_job(path: Path) -> dict[str, Any]:
    job = json.loads(path.read_text(encoding="utf-8"))
    if job.get("data_file"):
        job["data"] = json.loads(Path(job["data_file"]).read_text(encoding="utf-8"))
    return job


def _failure(job: dict[str, Any], e: BaseException) -> dict[str, Any]:
    res = dict(job.get("_result") or {"variant_dir": job.get("variant_dir")})
    res["error"] = f"{type(e).__name__}: {e}"
    res.pop("_t", None)  # the failed stage's start mark (_stage), not a result
    res.pop("stage_s", None)
    res.update(traceback=traceback.format_exc()[-4000:], peak_rss_mb=peak_rss_mb())
    log(f"{job.get('variant_dir')}: failed in stage {res.get('stage')}: {res['error']}")
    return res


def _reset_peaks() -> None:
    """Before a shared worker's next variant: CUDA's peak counters and this process's peak RSS (VmHWM) start over
    from what is resident now, so each variant's peaks are its own plus what the earlier ones left."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # 5: reset the peak resident set size (Linux >= 4.0)
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()


def _free() -> None:
    """After a shared worker's variant: drop what it left (its runtime is closed), and CUDA's cached blocks."""
    gc.collect()
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def worker(lines=None) -> int:
    """Serve JSON ops from stdin, one a line (open, round, finish, policies, close; floor), each answer to its "out".

    A failed op ends the worker (exit 1) once its failure is written: the parent opens the variants it still needs in
    a fresh one, so none runs in a process another left in an unknown state (CUDA errors are sticky)."""
    sessions: dict[str, Session] = {}
    for line in lines if lines is not None else sys.stdin:
        if not line.strip():
            continue
        op = json.loads(line)
        tag, out = op.get("tag"), op.get("out")
        s = sessions.get(tag)
        try:
            if op["op"] == "floor":  # the compute floor's peak GEMM rates (runner.run_floor), in a process of their own
                shapes = [tuple(x) for x in op["shapes"]]
                answer = measure_peaks(shapes, op["threads"], op["device"], op["budget_s"], op["model_shapes"])
                answer["pid"] = os.getpid()
            elif op["op"] == "open":
                if op.get("shared"):
                    _reset_peaks()
                s = sessions[tag] = Session(_read_job(Path(op["job"])))
                answer = s.open()
            elif s is None:
                raise RuntimeError(f"no variant {tag!r} is open in this worker")
            elif op["op"] == "close":
                sessions.pop(tag).close()
                _free()
                continue
            else:  # round, finish, policies
                answer = getattr(s, op["op"])(op)
        except BaseException as e:  # report the failure as data; the parent marks the variant failed
            if out:
                failed = _failure(s.job if s is not None else {"variant_dir": tag}, e)
                if op.get("shared"):
                    failed["isolation"] = "shared"
                write_json_atomic(Path(out), failed)
            return 1
        if out:
            write_json_atomic(Path(out), answer)
    for s in sessions.values():
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(worker())
