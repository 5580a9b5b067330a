"""The engine of tests/integration/test_docs_examples.py: find the docs' examples, lay out what they assume, run them.

    python -m pytest tests/integration/test_docs_examples.py -q

The rules (marker syntax, what "as written" and "parsed" mean) are in that test's docstring and in
docs/bench.md ("Examples that run"); this module implements them and holds no test of its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import socketserver
import stat
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LANGS = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "console", "python": "python", "py": "python"}
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^<!-- example: (?P<body>.*?) -->$")
ILLUSTRATIVE = re.compile(r"^illustrative: (?P<reason>\S.*)$")
PARSE_ONLY = re.compile(r'^parse-only "(?P<text>[^"]+)": (?P<reason>\S.*)$')
# Commands too slow for the suite: each must be covered by a marker (the test fails otherwise, naming it).
EXPENSIVE = (
    ("qserve train", "fine-tunes a model: minutes"),
    ("qserve pipeline", "the main job: minutes"),
    ("qserve bench", "each variant in a child process: a minute even on the tiny model"),
    ("qserve loadtest", "seconds of load per concurrency level"),
    ("qserve serve --engine ray", "starts a local Ray instance"),
    ("qserve predict --engine ray", "starts a local Ray instance"),
    ("qserve export --all", "every variant the device runs"),
    ("make", "make demo / test / reports: the main job, the suite, a committed report"),
    ("python -m benchmarks", "a benchmark: minutes"),
    ("ray", "Ray's CLI: a cluster"),
    ("serve", "Ray Serve's CLI: a cluster"),
)

# Commands parsed without a marker: the suite's own tests, which the suite runs anyway.
IMPLICIT = (("python -m pytest", "the suite's own tests: the suite runs them"),)


# -- the examples -------------------------------------------------------------------------------------------------
@dataclass
class Example:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str  # bash | console | python
    code: str
    illustrative: str | None = None  # its reason
    parse_only: dict[str, str] = field(default_factory=dict)  # text -> reason
    answer: dict[str, Any] | None = None  # a ```json block right after it: what its last curl answers

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class MarkerError(ValueError):
    pass


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def examples(path: Path, root: Path = ROOT) -> list[Example]:
    """Every example of one page, in order, with the markers right above it; a bad or stray marker raises."""
    rel = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if MARKER.match(lines[i]) and not (
                i + 1 < len(lines) and (MARKER.match(lines[i + 1]) or FENCE.match(lines[i + 1]))
            ):
                raise MarkerError(f"{rel}:{i + 1}: an example marker must sit right above a fenced block")
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise MarkerError(f"{rel}:{i + 1}: unclosed code fence")
        lang = LANGS.get(m["lang"])
        if lang:
            ex = Example(rel, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n")
            k = i - 1
            while k >= 0 and MARKER.match(lines[k]):
                body = MARKER.match(lines[k])["body"]  # type: ignore[index]
                if ill := ILLUSTRATIVE.match(body):
                    ex.illustrative = ill["reason"]
                elif po := PARSE_ONLY.match(body):
                    ex.parse_only[po["text"]] = po["reason"]
                else:
                    raise MarkerError(
                        f"{rel}:{k + 1}: not a marker: <!-- example: {body} -->; write "
                        '`illustrative: REASON` or `parse-only "TEXT": REASON`'
                    )
                k -= 1
            nxt = end + 1
            if nxt < len(lines) and lines[nxt].strip() == "```json":
                stop = next(j for j in range(nxt + 1, len(lines)) if lines[j].startswith("```"))
                ex.answer = json.loads("\n".join(lines[nxt + 1 : stop]))
            out.append(ex)
        i = end + 1
    return out


# -- ports: the one rewrite ---------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_ports(code: str, http: int, grpc: int) -> str:
    """The docs' 8000 (HTTP) and 8001 (gRPC), where they name a local server or a port flag, on free ports."""
    for doc, port in (("8000", http), ("8001", grpc)):
        code = re.sub(
            rf"(?<=127\.0\.0\.1:){doc}\b|(?<=localhost:){doc}\b|(?<=--port ){doc}\b|(?<=--grpc-port ){doc}\b",
            str(port),
            code,
        )
    return code


# -- parsing a command without running it -------------------------------------------------------------------------
class _Parsed(Exception):
    pass


@contextlib.contextmanager
def _stop_after_parsing():
    """argparse parses as usual (a bad flag exits 2 with its message), then the program stops."""
    import argparse

    real = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]


def _call_main(main, argv: list[str]) -> tuple[int, str]:
    """main(argv), or main() reading sys.argv for a script whose main takes none, stopped after argparse."""
    import inspect

    err = io.StringIO()
    takes_argv = bool(inspect.signature(main).parameters)
    real_argv = sys.argv
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), _stop_after_parsing():
        try:
            if takes_argv:
                main(argv)
            else:
                sys.argv = [main.__module__, *argv]
                main()
        except _Parsed:
            return 0, ""
        except SystemExit as e:
            return (e.code if isinstance(e.code, int) else 1), err.getvalue()
        finally:
            sys.argv = real_argv
    return 1, f"{main.__module__}.main returned without parsing its arguments"


def makefile_names() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", text, re.M))
    variables = set(re.findall(r"\$\((\w+)\)", text)) | set(re.findall(r"^(\w+) \??:?=", text, re.M))
    return targets, variables


def parse(prog: str, argv: list[str], cwd: Path) -> tuple[int, str]:
    """Check a command the docs show without running it: (0, "") or (non-zero, why)."""
    if prog == "qserve":
        from qserve.cli import main

        return _call_main(main, argv)
    if prog == "make":
        from benchmarks.render.stages import BY_NAME

        targets, variables = makefile_names()
        for a in argv:
            name, eq, value = a.partition("=")
            if eq and name == "STAGE" and value not in {*BY_NAME, "all"}:
                return 2, f"make: STAGE={value} is not a stage of `make reports` ({', '.join(BY_NAME)})"
            if eq and name not in variables:
                return 2, f"make: {name} is not a variable of the Makefile"
            if not eq and not a.startswith("-") and a not in targets:
                return 2, f"make: {a} is not a Makefile target ({', '.join(sorted(targets))})"
        return 0, ""
    if prog in ("python", "python3"):
        if argv[:1] == ["-m"] and len(argv) > 1:
            mod, rest = argv[1], argv[2:]
            if mod == "pytest":
                # the suite's paths: relative to the repository, whatever the example's working directory
                missing = [a for a in rest if not a.startswith("-") and not (ROOT / a.split("::")[0]).exists()]
                return (2, f"python -m pytest: no such test path: {', '.join(missing)}") if missing else (0, "")
            if mod in ("qserve", "qserve.cli"):
                return parse("qserve", rest, cwd)
            import importlib

            try:
                module = importlib.import_module(mod)
            except ImportError as e:
                return 2, f"python -m {mod}: {e}"
            if not hasattr(module, "main"):
                return 2, f"python -m {mod}: the module has no main(argv) to parse the example's arguments"
            return _call_main(module.main, rest)
        if argv[:1] == ["-c"]:
            try:
                compile(argv[1], "<-c>", "exec")
            except SyntaxError as e:
                return 2, f"python -c: {e}"
            return 0, ""
        return (0, "") if argv and (cwd / argv[0]).is_file() else (2, f"python: no such script {argv[:1]}")
    return 0, ""  # curl, ray, Ray's serve ...: nothing to parse


# -- the shim: `qserve` & co. on PATH, answered by this process ---------------------------------------------------
SHIM = textwrap.dedent("""\
    import json, os, socket, subprocess, sys, tempfile
    prog, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
    if prog == "_missing":  # bash's command_not_found_handle
        prog, argv = argv[0], argv[1:]
    stdin, data = None, b""
    if not sys.stdin.isatty():
        data = sys.stdin.buffer.read()
        if data:
            fd, stdin = tempfile.mkstemp(prefix="docs-stdin-")
            os.write(fd, data)
            os.close(fd)
    req = {"prog": prog, "argv": argv, "cwd": os.getcwd(), "stdin": stdin,
           "env": {k: v for k, v in os.environ.items() if k.startswith(("QSERVE_", "OTEL_"))}}
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["DOCS_SOCKET"])
    s.sendall(json.dumps(req).encode() + b"\\n")
    s.shutdown(socket.SHUT_WR)
    buf = b""
    while chunk := s.recv(65536):
        buf += chunk
    res = json.loads(buf)
    if res.get("exec"):  # run it here, as the shell would (curl, python): its output teed for the answer check
        p = subprocess.run(res["exec"], stdout=subprocess.PIPE, input=data)
        sys.stdout.buffer.write(p.stdout)
        if res.get("tee"):
            open(res["tee"], "wb").write(p.stdout)
        sys.exit(p.returncode)
    sys.stdout.write(res["stdout"])
    sys.stderr.write(res["stderr"])
    sys.exit(res["rc"])
""")


@dataclass
class Served:
    thread: threading.Thread
    server: Any  # uvicorn.Server
    rc: list[int]
    threads: int  # torch's intra-op threads before it started (the server sets them process-wide)


class Runner:
    """Runs one page's examples in `cwd`: the shell blocks through bash and the shim, the servers in-process."""

    def __init__(self, cwd: Path, scratch: Path):
        self.cwd, self.scratch = cwd, scratch
        self.shims = scratch / "bin"
        self.shims.mkdir(parents=True, exist_ok=True)
        (self.shims / "_shim.py").write_text(SHIM, encoding="utf-8")
        for prog in ("qserve", "make", "python", "python3", "curl", "_missing"):
            p = self.shims / prog
            p.write_text(f"#!{sys.executable} -IS\nexec(open({str(self.shims / '_shim.py')!r}).read())\n")
            p.chmod(p.stat().st_mode | stat.S_IEXEC)
        self.sock = str(scratch / "qserve.sock")
        self.curl = shutil.which("curl") or "curl"
        self.bash = shutil.which("bash") or "/bin/bash"
        self.served: Served | None = None
        self.example: Example | None = None
        self.parse_mode = False
        self.log: list[str] = []  # what ran and how, for the failure message
        self.http, self.grpc = free_port(), free_port()
        runner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                req = json.loads(self.rfile.readline())
                try:
                    res = runner.answer(req)
                except Exception:  # noqa: BLE001 - the example fails with the traceback, the suite goes on
                    res = {"rc": 1, "stdout": "", "stderr": traceback.format_exc()}
                self.wfile.write(json.dumps(res).encode())

        self.server = socketserver.UnixStreamServer(self.sock, Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True, name="docs-shim").start()

    # one command, as the shim asks
    def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        prog, argv, cwd = req["prog"], req["argv"], Path(req["cwd"])
        text = " ".join([prog, *argv])
        ex = self.example
        assert ex is not None
        covered = next((t for t in ex.parse_only if t in text or _is(text, t)), None) or next(
            (w for w, _ in IMPLICIT if _is(text, w)), None
        )
        if self.parse_mode or covered:
            rc, why = parse(prog, argv, cwd)
            self.log.append(f"parsed ({'illustrative' if self.parse_mode else 'parse-only ' + repr(covered)}): {text}")
            return {"rc": rc, "stdout": "", "stderr": why + ("\n" if why else "")}
        slow = next((w for w, why in EXPENSIVE if _is(text, w)), None)
        if slow:
            reason = dict(EXPENSIVE)[slow]
            return {
                "rc": 3,
                "stdout": "",
                "stderr": f"{ex.where}: `{text}` is not run by the suite ({reason}): mark "
                f'it: <!-- example: parse-only "{slow}": REASON --> or <!-- example: illustrative: REASON -->\n',
            }
        self.log.append(f"ran: {text}")
        if prog == "qserve":
            return self.qserve(argv, cwd, req["env"], req["stdin"])
        if prog == "curl":
            return {"exec": [self.curl, "--fail-with-body", *argv], "tee": str(self.scratch / "last-curl.out")}
        if prog in ("python", "python3"):
            return {"exec": [sys.executable, *argv]}
        return {"rc": 127, "stdout": "", "stderr": f"{prog}: command not found (no shim runs it here; mark it)\n"}

    def qserve(self, argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None) -> dict[str, Any]:
        if argv[:1] == ["serve"]:
            return self.serve(argv, cwd, env)
        import torch

        from qserve.cli import main

        out, err = io.StringIO(), io.StringIO()
        threads = torch.get_num_threads()
        real_stdin = sys.stdin
        try:
            with contextlib.ExitStack() as stack:
                for cm in (
                    _environ(env),
                    _chdir(cwd),
                    contextlib.redirect_stdout(out),
                    contextlib.redirect_stderr(err),
                ):
                    stack.enter_context(cm)
                if stdin:  # the block piped text into qserve (`cat rows.jsonl | qserve predict ... -`)
                    piped = stack.enter_context(open(stdin, "rb"))
                    sys.stdin = io.TextIOWrapper(piped, encoding="utf-8")
                try:
                    rc = main(argv)
                except SystemExit as e:
                    rc = e.code if isinstance(e.code, int) else 1
        finally:
            sys.stdin = real_stdin
            torch.set_num_threads(threads)
        return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}

    def serve(self, argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
        """`qserve serve ...` as the CLI runs it (qserve.cli.main, real uvicorn), in a thread: ready, then return."""
        import torch

        from qserve.cli import main
        from qserve.serve.infra import uvicorn_server

        self.stop()
        threads = torch.get_num_threads()
        made: list[Any] = []
        # the class the CLI's server() builds (looked up at each call); not uvicorn.Server, which DrainingServer
        # subclassed once, when it was first imported
        real = uvicorn_server.DrainingServer

        class Recorded(real):  # type: ignore[misc, valid-type]
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                made.append(self)

        rc: list[int] = []

        def run() -> None:
            try:
                rc.append(main(argv))
            except SystemExit as e:
                rc.append(e.code if isinstance(e.code, int) else 1)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                rc.append(1)

        uvicorn_server.DrainingServer = Recorded  # type: ignore[misc]
        try:
            with _environ(env), _chdir(cwd):
                t = threading.Thread(target=run, daemon=True, name="docs-qserve-serve")
                t.start()
                deadline = time.monotonic() + 120
                while not (made and made[0].started) and t.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.02)
        finally:
            uvicorn_server.DrainingServer = real  # type: ignore[misc]
        if not (made and made[0].started):
            t.join(10)
            return {
                "rc": (rc or [1])[0] or 1,
                "stdout": "",
                "stderr": f"qserve serve {' '.join(argv[1:])}: the server did not start (see the log above)\n",
            }
        self.served = Served(t, made[0], rc, threads)
        port = made[0].servers[0].sockets[0].getsockname()[1]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if rc:
                return {"rc": rc[0] or 1, "stdout": "", "stderr": "qserve serve exited before it was ready\n"}
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
                    if r.status == 200:
                        return {"rc": 0, "stdout": f"(serving on 127.0.0.1:{port})\n", "stderr": ""}
            except OSError:
                pass
            time.sleep(0.05)
        return {"rc": 1, "stdout": "", "stderr": "qserve serve: /ready did not answer 200 within 120 s\n"}

    def stop(self) -> None:
        import torch

        if self.served is not None:
            s, self.served = self.served, None
            s.server.should_exit = True
            s.thread.join(60)
            torch.set_num_threads(s.threads)

    def close(self) -> None:
        self.stop()
        self.server.shutdown()
        self.server.server_close()

    # one example
    def run(self, ex: Example, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        self.example, self.parse_mode = ex, ex.illustrative is not None
        code = with_ports(ex.code, self.http, self.grpc)
        last = self.scratch / "last-curl.out"
        last.unlink(missing_ok=True)
        env = {
            "PATH": f"{self.shims}{os.pathsep}/usr/bin{os.pathsep}/bin",
            "HOME": os.environ.get("HOME", "/tmp"),
            "LANG": "C.UTF-8",
            "DOCS_SOCKET": self.sock,
            "QSERVE_PORT": str(self.http),
            "HF_HUB_OFFLINE": "1",
            "TMPDIR": str(self.scratch),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        }
        if ex.lang == "python":
            if self.parse_mode:
                compile(code, ex.where, "exec")
                return subprocess.CompletedProcess([ex.where], 0, "", "")
            script = self.scratch / "example.py"
            script.write_text(code, encoding="utf-8")
            return subprocess.run(
                [sys.executable, str(script)],
                cwd=self.cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        if ex.lang == "console":
            code = "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ ")) + "\n"
        prelude = "set -eo pipefail\n"
        if self.parse_mode:  # nothing runs but the shims, which parse; every other command is a no-op
            env["PATH"] = str(self.shims)
            # echo and printf are builtins: they would still write, e.g. a nice value to /proc/$$/autogroup,
            # which only some machines (root, autogroup on) allow
            prelude += "command_not_found_handle() { return 0; }\necho() { :; }\nprintf() { :; }\n"
        else:  # a command with no shim reaches the runner, which says it must be marked
            prelude += f'command_not_found_handle() {{ "{self.shims}/_missing" "$@"; }}\n'
        return subprocess.run(
            [self.bash, "-c", prelude + code],
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def check_answer(self, ex: Example) -> str | None:
        """None, or what the last curl's answer lacks of the ```json answer the docs show after the block."""
        if ex.answer is None or ex.illustrative:
            return None
        last = self.scratch / "last-curl.out"
        if not last.is_file():
            return f"{ex.where}: a ```json answer follows the block, but no curl ran"
        got = json.loads(last.read_text(encoding="utf-8"))
        missing = [k for k in ex.answer if k != "..." and k not in got]
        wrong = [
            f"{k}: docs {v!r}, served {got[k]!r}"
            for k, v in ex.answer.items()
            if isinstance(v, str) and k != "..." and k in got and got[k] != v
        ]
        if missing or wrong:
            return f"{ex.where}: the answer shown after the block differs: missing {missing}; {wrong}"
        return None


def _is(text: str, what: str) -> bool:
    """`text` is the command `what`: the same program and sub-command, `what`'s flags anywhere after (`qserve serve
    X --engine ray`); `python -m M` by its module prefix."""
    words, have = what.split(), text.replace("python3 ", "python ", 1).split()
    if have[:1] != words[:1]:
        return False
    if len(words) == 1:
        return True
    if words[1] == "-m":
        return have[1:2] == ["-m"] and len(have) > 2 and (have[2] + ".").startswith(words[2] + ".")
    return have[1:2] == words[1:2] and all(w in have for w in words[2:])


@contextlib.contextmanager
def _environ(env: dict[str, str]):
    """The example's QSERVE_*/OTEL_* variables, for one command; the others put back as they were."""
    keys = {k for k in os.environ if k.startswith(("QSERVE_", "OTEL_"))} | set(env)
    old = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _chdir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def shell_words(line: str) -> list[str]:
    return shlex.split(line, comments=True)
