"""A server under test in a child process: start it, wait until it answers, read its CPU time, stop it.

    python -c "from benchmarks.harness.server import free_port; print(free_port())"

`spawn` is the one place a benchmark starts a child process that outlives a call (servers, and children
it talks to or measures while they run); `Server` is `qserve serve ARGS` (or an ASGI app factory under
uvicorn) on a free port of 127.0.0.1, its output in a log file, so every benchmark that launches a server
measures the same thing the same way. The code served may be another tree than this checkout (an older
commit's qserve/, see `archive_tree`): its directory goes first on the child's path.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx2

from qserve import QserveError

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the benchmarks' paths (reports, models, docs) start here."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def code_env(code_root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: offline, `code_root`'s qserve first on the path (a benchmark may serve an
    older tree beside this one), then this checkout (for `python -m benchmarks.X` children), then the caller's
    own PYTHONPATH (a private site dir, such as the wheels benchmarks/gpu/check.sh carries to a GPU machine).
    A server stops at its SIGTERM (no drain period) unless `base` sets QSERVE_DRAIN_SECONDS (the drain's own bench
    does). TOKENIZERS_PARALLELISM and the rest as the caller has them."""
    env = os.environ if base is None else base
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join(dict.fromkeys([str(code_root), str(ROOT), *inherited]))
    return {"QSERVE_DRAIN_SECONDS": "0", **env, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def spawn(cmd: list[str], cwd: Path, env: dict[str, str], **popen: Any) -> subprocess.Popen:
    """`cmd` in a child process run from `cwd` (stdin, stdout, stderr, text: as `popen` says)."""
    return subprocess.Popen(cmd, cwd=cwd, env=env, **popen)


def stat_cpu_s(stat: Path) -> float:
    """utime + stime (seconds) from a /proc stat file: /proc/PID/stat (every thread) or /proc/PID/task/TID/stat."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of every thread of `pid` so far (seconds), from /proc (the server's own CPU time)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def thread_cpu_s(pid: int) -> dict[str, float]:
    """utime + stime so far (seconds) of `pid`'s threads, by role: the event loop (the main thread), the
    inference thread (qserve-infer), a row-by-row runtime's row workers (qserve-rows) and every other
    thread (the backend's intra-op pool, the tokenizer's, uvloop's)."""
    out = {"event_loop": 0.0, "inference": 0.0, "rows": 0.0, "other": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, cpu = (task / "comm").read_text().strip(), stat_cpu_s(task / "stat")
        except OSError:  # the thread ended between the listing and the read
            continue
        role = (
            "event_loop"
            if task.name == str(pid)
            else "inference"
            if name.startswith("qserve-infer")
            else "rows"
            if name.startswith("qserve-rows")
            else "other"
        )
        out[role] += cpu
    return out


def archive_tree(root: Path, ref: str, dest: Path) -> Path:
    """qserve/ as it was at git `ref`, extracted under `dest` (a tree to put first on a server's PYTHONPATH)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(f"git -C {root} archive {ref} qserve | tar -x -C {dest}", shell=True, check=True)
    return dest


def _log_tail(log: IO[str] | None) -> str:
    if log is None or not isinstance(getattr(log, "name", None), str):
        return ""
    log.flush()
    return ": " + Path(log.name).read_text(errors="replace")[-2000:]


def wait_ready(
    url: str,
    proc: subprocess.Popen | None = None,
    timeout: float = 300.0,
    tag: str = "server",
    log: IO[str] | None = None,
    any_answer: bool = False,
) -> None:
    """Poll `url`/ready until it answers 200 (any_answer: until anything answers over HTTP); a QserveError (with
    the log's tail) if the child `proc` exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise QserveError(f"{tag} exited ({proc.returncode}) before it was ready{_log_tail(log)}")
        try:
            if httpx2.get(f"{url}/ready", timeout=2, trust_env=False).status_code == 200 or any_answer:
                return
        except httpx2.TransportError:
            pass
        if time.monotonic() > deadline:
            raise QserveError(f"{tag} at {url} not ready after {timeout:.0f} s")
        time.sleep(0.2)


class Server:
    """`qserve serve ARGS --port P` of the code at `code` in a child process (its own GIL), its log in `log`.

    app: "module:factory" of an ASGI app to run under uvicorn instead (ARGS are then uvicorn's flags); such
    an app need not have /ready: any HTTP answer at all means it is up."""

    def __init__(
        self,
        args: list[str],
        code: Path,
        log: Path,
        tag: str = "server",
        env: dict[str, str] | None = None,
        app: str | None = None,
    ):
        self.tag, self.code, self.app = tag, code, app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if app is None:
            cmd = [sys.executable, "-m", "qserve.serve", "serve", *args, "--port", str(self.port)]
        else:
            cmd = [sys.executable, "-m", "uvicorn", "--factory", app, "--port", str(self.port), *args]
        self.logf = open(log, "w+")
        self.proc = spawn(cmd, code, code_env(code) if env is None else env, stdout=self.logf, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300.0) -> Server:
        wait_ready(self.url, self.proc, timeout, self.tag, self.logf, any_answer=self.app is not None)
        return self

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    def models(self) -> dict[str, Any]:
        """The server's /v1/models answer."""
        return dict(httpx2.get(f"{self.url}/v1/models", timeout=30, trust_env=False).json())

    def stop(self) -> None:
        """SIGTERM (the server drains), SIGKILL after 60 s; then close the log."""
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()


class VariantServer(Server):
    """`qserve serve VARIANT EXTRA` of the code at `code`, tracing off ("GRPC" in `extra` becomes a free gRPC
    port); once ready it knows the model's labels and what /v1/models says about it."""

    def __init__(self, key: str, variant: Path, code: Path, extra: list[str], threads: int | None, logs: Path):
        self.key, self.variant = key, variant
        self.grpc_port = free_port() if "--grpc-port" in extra else None
        extra = [str(self.grpc_port) if x == "GRPC" else x for x in extra]
        env = code_env(code, {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
        super().__init__(
            [
                str(variant.resolve()),
                "--device",
                "cpu",
                "--log-level",
                "warning",
                *extra,
                *(["--threads", str(threads)] if threads else []),
            ],
            code,
            logs / f"{key.replace(' ', '-').replace('@', '')}.log",
            tag=key,
            env=env,
        )
        self.labels: list[str] = []
        self.info: dict[str, Any] = {}

    def wait_ready(self, timeout: float = 300.0) -> VariantServer:
        super().wait_ready(timeout)
        model = self.models()["models"][0]
        self.labels = list(model["labels"])
        self.info = {
            "variant": model["id"],
            "dir": str(self.variant),
            "code": str(self.code),
            "max_length": model.get("max_length"),
            "length_buckets": model.get("length_buckets"),
            "grpc": self.grpc_port is not None,
        }
        return self


class Container:
    """`docker run -d` of the serving image as deploy.md runs it: non-root, read-only root, /tmp a tmpfs, `variant`
    mounted read-only at /models, on the host's network (behind docker's userland proxy a connection made after
    the listener closed is accepted by the proxy and then reset, not refused)."""

    def __init__(self, image: str, variant: Path, *args: str, env: dict[str, str] | None = None):
        self.name = f"qserve-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = ["docker", "run", "-d", "--name", self.name, "--read-only", "--tmpfs", "/tmp", "--user", "10001:10001"]
        cmd += ["--network", "host", "-e", "QSERVE_HOST=127.0.0.1", "-e", f"QSERVE_PORT={self.port}"]
        cmd += [f"-e{k}={v}" for k, v in (env or {}).items()]
        cmd += ["-v", f"{variant}:/models:ro", image, "serve", *args]
        self.started = time.monotonic()
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds from `docker run` to /ready answering 200; a container that exits first fails at once."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                wait_ready(self.url, timeout=2.0, tag=f"container {self.name}")
                return time.monotonic() - self.started
            except QserveError:
                if self.inspect("{{.State.Running}}") != "true":
                    raise QserveError(f"container {self.name} exited before it was ready:\n{self.logs()[-3000:]}")
                if time.monotonic() > deadline:
                    raise QserveError(f"container {self.name} not ready after {timeout:.0f} s:\n{self.logs()[-3000:]}")

    def inspect(self, fmt: str) -> str:
        return subprocess.run(
            ["docker", "inspect", "-f", fmt, self.name], capture_output=True, text=True, check=True
        ).stdout.strip()

    def signal(self, sig: str = "TERM") -> None:
        subprocess.run(["docker", "kill", "--signal", sig, self.name], check=True, capture_output=True)

    def wait(self, timeout: float) -> int | None:
        """The exit status once it exits (None after `timeout` seconds)."""
        try:
            r = subprocess.run(["docker", "wait", self.name], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return int(r.stdout.strip())

    def logs(self) -> str:
        return subprocess.run(["docker", "logs", self.name], capture_output=True, text=True, check=False).stderr

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, check=False)
