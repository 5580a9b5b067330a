"""The command-line surface users rely on, pinned: every flag of every `qserve` command (option strings,
dest, default, choices, action, type, nargs, required) and every QSERVE_* env var a command reads, with
its default. The expected table is data: tests/unit/cli_surface.json.

    python -m pytest -q tests/unit/test_cli_surface.py
    python tests/unit/test_cli_surface.py --write     # after a deliberate change: rewrite the json, review its diff

A flag or env var that is renamed, dropped, retyped or gets another default fails here; adding one
means adding it to the json too, so the change is visible in review.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = Path(__file__).with_name("cli_surface.json")
NO_SUCH_VARIANT = "no-such-variant-dir"  # relative and absent: `serve` stops at "no manifest.json"


def _jsonable(value: object) -> object:
    return json.loads(json.dumps(value, default=str))


def flag_table() -> dict[str, dict[str, dict[str, object]]]:
    """{"qserve train": {"--epochs": {...}, ...}, ...}: every command's arguments, walked from the real parser."""
    from qserve.cli import build_parser

    out: dict[str, dict[str, dict[str, object]]] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        rows: dict[str, dict[str, object]] = {}
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, f"{path} {name}")
                continue
            key = a.option_strings[0] if a.option_strings else a.dest
            rows[key] = {
                "options": list(a.option_strings),
                "dest": a.dest,
                "default": _jsonable(a.default),
                "choices": _jsonable(list(a.choices)) if a.choices is not None else None,
                "action": type(a).__name__,
                # str and no type convert alike: both hand the text through unchanged
                "type": "str" if a.type in (None, str) else getattr(a.type, "__name__", repr(a.type)),
                "nargs": a.nargs,
                "required": a.required,
            }
        out[path] = rows

    walk(build_parser(), "qserve")
    return out


class _RecordingEnviron(dict):
    """os.environ stand-in that remembers every QSERVE_* name looked up (get, [], in)."""

    def __init__(self, values: dict[str, str]):
        super().__init__(values)
        self.read: set[str] = set()

    def _note(self, key: object) -> None:
        if isinstance(key, str) and key.startswith("QSERVE_"):
            self.read.add(key)

    def get(self, key, default=None):  # type: ignore[override]
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def _run(monkeypatch, argv: list[str], env: dict[str, str]) -> tuple[int, set[str]]:
    """Run `qserve ARGV` in-process with only `env`'s QSERVE_* vars set; (exit code, QSERVE_* names read)."""
    from qserve.cli import main

    base = {k: v for k, v in os.environ.items() if not k.startswith("QSERVE_")}
    environ = _RecordingEnviron({**base, **env})
    monkeypatch.setattr(os, "environ", environ)
    rc = main(argv)
    return rc, environ.read


def _serve_config(monkeypatch, env: dict[str, str]):
    """The ServeConfig `qserve serve` builds from `env` (it then stops: the variant dir does not exist)."""
    from qserve.serve.infra.config import ServeConfig

    built: list[ServeConfig] = []
    validate = ServeConfig.validate

    def capture(self: ServeConfig) -> ServeConfig:
        built.append(self)
        return validate(self)

    monkeypatch.setattr(ServeConfig, "validate", capture)
    rc, read = _run(monkeypatch, ["serve"], env)
    assert rc == 2 and built, "serve should build its config, then stop at the missing variant"
    return built[-1], read


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def test_every_flag_of_every_command_is_pinned(expected):
    have, want = flag_table(), expected["flags"]
    assert sorted(have) == sorted(want), "commands added or removed"
    for cmd in want:
        assert sorted(have[cmd]) == sorted(want[cmd]), f"{cmd}: flags added or removed"
        for flag in want[cmd]:
            assert have[cmd][flag] == want[cmd][flag], f"{cmd} {flag}"


def test_serve_reads_exactly_these_env_vars_with_these_defaults(monkeypatch, expected):
    env = expected["env"]["qserve serve"]
    cfg, read = _serve_config(monkeypatch, {})
    assert read == set(env)
    assert {name: _jsonable(getattr(cfg, row["field"])) for name, row in env.items()} == {
        name: row["default"] for name, row in env.items()
    }


def test_each_serve_env_var_sets_its_field(monkeypatch, expected):
    env = expected["env"]["qserve serve"]
    examples = {name: row["example"] for name, row in env.items()}
    cfg, _ = _serve_config(monkeypatch, {name: raw for name, (raw, _) in examples.items()})
    assert {name: _jsonable(getattr(cfg, env[name]["field"])) for name in env} == {
        name: value for name, (_, value) in examples.items()
    }


def test_a_serve_flag_wins_over_its_env_var(monkeypatch):
    from qserve.serve.infra.config import ServeConfig

    built: list[ServeConfig] = []
    validate = ServeConfig.validate
    monkeypatch.setattr(ServeConfig, "validate", lambda self: built.append(self) or validate(self))
    rc, _ = _run(
        monkeypatch,
        ["serve", NO_SUCH_VARIANT, "--port", "9002", "--max-batch-size", "4"],
        {"QSERVE_PORT": "9001", "QSERVE_MAX_BATCH_SIZE": "8", "QSERVE_MAX_WAIT_MS": "7"},
    )
    assert rc == 2 and (built[-1].port, built[-1].max_batch_size, built[-1].max_wait_ms) == (9002, 4, 7.0)


def test_loadtest_reads_only_the_api_key(monkeypatch, expected):
    rc, read = _run(monkeypatch, ["loadtest", "http://10.0.0.1:1", "--duration", "1"], {})
    assert rc == 2 and read == set(expected["env"]["qserve loadtest"])


def test_deploy_ray_reads_no_env_var(monkeypatch, expected, tmp_path):
    # The replicas read QSERVE_* (the API key) in their own environment; the written file holds none of it.
    rc, read = _run(
        monkeypatch,
        ["deploy", "ray", "/no/such/variant", "--out", str(tmp_path / "c.yaml")],
        {"QSERVE_API_KEY": "k" * 8, "QSERVE_MAX_BATCH_SIZE": "8"},
    )
    assert rc == 2 and read == set(expected["env"]["qserve deploy ray"]) == set()


@pytest.mark.parametrize(
    "argv", [["train"], ["bench", "{tmp}"], ["export", "{tmp}", "--bits", "8"], ["pipeline"]], ids=lambda a: a[0]
)
def test_device_resolution_reads_qserve_force_cpu(monkeypatch, expected, tmp_path, capsys, argv):
    # QSERVE_FORCE_CPU=1 hides a GPU: `--device cuda` is then refused before any work starts.
    (tmp_path / "config.json").write_text("{}")  # enough of a checkpoint for export to reach the device
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--device", "cuda"]
    name = "QSERVE_FORCE_CPU"
    rc, read = _run(monkeypatch, argv, {name: expected["env"]["device resolution"][name]["example"][0]})
    assert rc == 2 and "no CUDA GPU" in capsys.readouterr().err
    assert read == {name}


def test_every_qserve_env_name_in_the_code_is_in_the_table(expected):
    """A QSERVE_* name the code reads or its docs mention must be one of the pinned ones."""
    known = {name for table in expected["env"].values() for name in table}
    found: dict[str, str] = {}
    for base in ("qserve", "exporters"):
        for path in sorted((ROOT / base).rglob("*.py")):
            for name in re.findall(r"\bQSERVE_[A-Z][A-Z0-9_]*", path.read_text(encoding="utf-8")):
                found.setdefault(name, str(path.relative_to(ROOT)))
    assert {n: p for n, p in found.items() if n not in known} == {}


def _dumps(data: dict) -> str:
    """Two levels of nesting, then one line per flag or env var: a change reads as a one-line diff."""
    lines = ["{"]
    for i, (section, commands) in enumerate(sorted(data.items())):
        lines.append(f" {json.dumps(section)}: {{")
        for j, (cmd, rows) in enumerate(sorted(commands.items())):
            lines.append(f"  {json.dumps(cmd)}: {{")
            items = sorted(rows.items())
            lines += [
                f"   {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if n < len(items) - 1 else "")
                for n, (k, v) in enumerate(items)
            ]
            lines.append("  }" + ("," if j < len(commands) - 1 else ""))
        lines.append(" }" + ("," if i < len(data) - 1 else ""))
    return "\n".join(lines + ["}"]) + "\n"


def write_table() -> None:
    """Regenerate cli_surface.json from today's code (env examples are kept from the old file)."""
    old = json.loads(TABLE.read_text(encoding="utf-8")) if TABLE.exists() else {"env": {}}
    TABLE.write_text(_dumps({"flags": flag_table(), "env": old["env"]}), encoding="utf-8")
    print(f"wrote {TABLE}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/unit/test_cli_surface.py --write")
    write_table()
