"""What the serving benchmarks share (a module below them, so they never import each other).

    python -c "import sys; sys.path.insert(0, 'benchmarks'); from netutil import free_port; print(free_port())"

One way to start `qserve serve` in a child process, wait until it answers /ready, read its CPU time from
/proc and stop it, so every benchmark that launches a server measures the same thing the same way; and
one way to end such a benchmark (`finish`: report.json + report.md, exit status 0 / 1 missed bar / 2 error).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_cmd(*args: str) -> list[str]:
    """`qserve serve ARGS` as a child command line, run by this interpreter (the venv's packages)."""
    return [sys.executable, "-m", "qserve.serve", "serve", *args]


def code_env(code_root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: offline, `code_root`'s qserve first on the path (a benchmark may serve an
    older tree beside this one). TOKENIZERS_PARALLELISM and the rest as the caller has them."""
    return {**(os.environ if base is None else base), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(code_root)}


def start(cmd: list[str], code_root: Path, log: IO[str] | int | None,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """`cmd` in a child process run from `code_root`, stdout and stderr into `log`."""
    return subprocess.Popen(cmd, env=code_env(code_root) if env is None else env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=code_root)


def _log_tail(log: IO[str] | None) -> str:
    if log is None or not getattr(log, "name", None) or not isinstance(log.name, str):
        return ""
    log.flush()
    return ": " + Path(log.name).read_text(errors="replace")[-2000:]


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 300.0, tag: str = "server",
               log: IO[str] | None = None) -> None:
    """Poll `url`/ready until it answers 200; a QserveError (with the log's tail) if the child exits first
    or `timeout` seconds pass."""
    import httpx2

    from qserve import QserveError

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise QserveError(f"{tag} exited ({proc.returncode}) before it was ready{_log_tail(log)}")
        try:
            if httpx2.get(f"{url}/ready", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        if time.monotonic() > deadline:
            raise QserveError(f"{tag} at {url} not ready after {timeout:.0f} s")
        time.sleep(0.2)


def stop(proc: subprocess.Popen, log: IO[str] | None = None) -> None:
    """SIGTERM (the server drains), SIGKILL after 60 s; then close `log`."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if log is not None:
        log.close()


def stat_cpu_s(stat: Path) -> float:
    """utime + stime (seconds) from a /proc stat file: /proc/PID/stat (every thread) or /proc/PID/task/TID/stat."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of every thread of `pid` so far (seconds), from /proc (the server's own CPU time)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


class Server:
    """`qserve serve ARGS --port P` of the code at `code` in a child process (its own GIL), its log in `log`."""

    def __init__(self, args: list[str], code: Path, log: Path, tag: str = "server",
                 env: dict[str, str] | None = None):
        self.tag, self.code = tag, code
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logf = open(log, "w+")
        self.proc = start(serve_cmd(*args, "--port", str(self.port)), code, self.logf, env)

    def wait_ready(self, timeout: float = 300.0) -> Server:
        wait_ready(self.url, self.proc, timeout, self.tag, self.logf)
        return self

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        stop(self.proc, self.logf)


def archive_tree(root: Path, ref: str, dest: Path) -> Path:
    """qserve/ as it was at git `ref`, extracted under `dest` (a tree to put first on a server's PYTHONPATH)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(f"git -C {root} archive {ref} qserve | tar -x -C {dest}", shell=True, check=True)
    return dest


def finish(tag: str, args: argparse.Namespace, argv: list[str], run_fn: Callable[[argparse.Namespace, list[str]], dict],
           render_fn: Callable[[dict], str], failed: Callable[[dict], Any]) -> int:
    """A serving benchmark's main after its flags: run it, write report.json and report.md under args.out
    (provenance header), print the md. Exit status 2 on a setup error, 1 when `failed(report)` says the run
    missed its bar, else 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from qserve import QserveError
    from reportio import write_report

    try:
        rep = run_fn(args, argv)
    except (QserveError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"{tag}: error: {e}", file=sys.stderr)
        return 2
    write_report(args.out, rep, render_fn(rep))
    return 1 if failed(rep) else 0


def scrape_batches(url: str) -> tuple[float, float]:
    """(number of forwards, texts in them) from the server's batch-size histogram."""
    import httpx2
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx2.get(f"{url}/metrics", timeout=10, trust_env=False).text
    vals = {s.name: s.value for f in text_string_to_metric_families(text) if f.name == "qserve_batch_size"
            for s in f.samples if s.name.endswith(("_count", "_sum"))}
    return vals.get("qserve_batch_size_count", 0.0), vals.get("qserve_batch_size_sum", 0.0)


def trickle(s: socket.socket, data: bytes, every_s: float, stop: Any) -> None:
    """Send `data` one byte every `every_s` seconds until it is sent, `stop` (a threading.Event) is set, or the
    server closes the socket: a slow client, as a slowloris attack sends its headers."""
    for i in range(len(data)):
        if stop.is_set():
            return
        try:
            s.send(data[i:i + 1])
        except OSError:
            return  # the server closed it
        time.sleep(every_s)
