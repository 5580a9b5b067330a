"""qserve.configflags: a documented dataclass field is a flag (and, where a command reads env, a QSERVE_* var).

python -m pytest -q tests/unit/test_configflags.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from qserve.configflags import FlagError, add_flags, build, config_values, field_docs, flag


@dataclass
class Knobs:
    """A config with one field of each kind a flag can be."""

    name: str = "tiny"
    """What to call it."""
    size: int = 8
    """How many, 100% of them."""
    ratio: float | None = None
    """A fraction."""
    out: Path | None = field(default=None, metadata=flag(default_text="./out"))
    """Where it goes."""
    sizes: list[int] = field(default_factory=lambda: [1, 8])
    """Comma-separated sizes."""
    fast: bool = True
    """Take the fast path."""
    force: bool = False
    """Replace what is there."""
    mode: str = field(default="a", metadata=flag(choices=("a", "b")))
    """Mode."""
    budget_s: float = field(default=2.0, metadata=flag(option="--budget"))
    """Seconds to spend."""
    tags: str | None = field(default=None, metadata=flag(repeat=True))
    """A tag; repeat for several."""


def parser(**kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    add_flags(p, Knobs, **kw)
    return p


def test_defaults_round_trip_and_every_field_is_a_flag():
    assert build(Knobs, parser().parse_args([])) == Knobs()
    assert set(field_docs(Knobs)) == set(Knobs.__dataclass_fields__)


def test_each_kind_of_field_parses_to_its_type():
    args = parser().parse_args(
        [
            "--name",
            "x",
            "--size",
            "3",
            "--ratio",
            "0.5",
            "--out",
            "o",
            "--sizes",
            "4, 2",
            "--no-fast",
            "--force",
            "--mode",
            "b",
            "--budget",
            "1.5",
            "--tags",
            "p",
            "--tags",
            "q",
        ]
    )
    assert args.budget == 1.5  # a renamed option keeps argparse's own dest ...
    cfg = build(Knobs, args, overrides={"tags": ",".join(args.tags)})
    assert cfg == Knobs(
        name="x",
        size=3,
        ratio=0.5,
        out=Path("o"),
        sizes=[4, 2],
        fast=False,
        force=True,
        mode="b",
        budget_s=1.5,
        tags="p,q",
    )  # ... and build maps it back to the field


def test_help_carries_the_docstring_the_default_and_escapes_percent():
    text = parser(env_prefix="QSERVE_").format_help()
    assert "How many, 100% of them. (default: 8; env QSERVE_SIZE)" in " ".join(text.split())
    assert "Where it goes. (default: ./out; env QSERVE_OUT)" in " ".join(text.split())
    assert "--no-fast" in text and "on by default; --no-fast turns it off" in " ".join(text.split())


def test_bad_values_are_errors_that_name_the_flag_or_the_env_var():
    with pytest.raises(FlagError, match=r"--sizes must be a comma-separated list of int values.*'1,x'"):
        build(Knobs, parser().parse_args(["--sizes", "1,x"]))
    unset = parser(unset=True)
    with pytest.raises(FlagError, match=r"QSERVE_SIZE='many' is not a valid int"):
        build(Knobs, unset.parse_args([]), environ={"QSERVE_SIZE": "many"})
    with pytest.raises(FlagError, match=r"QSERVE_FORCE='maybe': expected 1/true"):
        build(Knobs, unset.parse_args([]), environ={"QSERVE_FORCE": "maybe"})

    class Boom(Exception):
        pass

    with pytest.raises(Boom, match="--sizes"):
        build(Knobs, parser().parse_args(["--sizes", ","]), error=Boom)
    with pytest.raises(SystemExit):
        parser().parse_args(["--mode", "c"])


def test_unset_flags_fall_back_to_env_then_defaults():
    p = parser(unset=True)
    args = p.parse_args(["--size", "5"])
    assert args.name is None and args.fast is None and args.force is None  # not given: None, so env may decide
    env = {
        "QSERVE_SIZE": "6",
        "QSERVE_NAME": "from-env",
        "QSERVE_FAST": "off",
        "QSERVE_SIZES": "3,4",
        "QSERVE_RATIO": "",
        "QSERVE_OUT": "/x",
    }
    cfg = build(Knobs, args, environ=env)
    assert (cfg.size, cfg.name, cfg.fast, cfg.sizes, cfg.ratio, cfg.out) == (
        5,
        "from-env",
        False,
        [3, 4],
        None,
        Path("/x"),
    )
    assert config_values(Knobs, {"size": None}, ["size", "mode"]) == {}  # None = not given


def test_a_field_without_a_default_is_required_and_one_without_a_docstring_is_refused():
    @dataclass
    class Need:
        where: str = field(metadata=flag(positional=True))
        """The place."""
        out: str
        """Output file."""
        undocumented: int = 0

    p = argparse.ArgumentParser()
    with pytest.raises(TypeError, match="Need.undocumented has no docstring"):
        add_flags(p, Need)
    p = argparse.ArgumentParser()
    add_flags(p, Need, ["where", "out"])
    assert vars(p.parse_args(["here", "--out", "o"])) == {"where": "here", "out": "o"}
    with pytest.raises(SystemExit):
        p.parse_args(["here"])


def test_unsupported_annotation_is_refused_at_registration():
    @dataclass
    class Odd:
        pair: dict[str, int] = field(default_factory=dict)
        """A mapping."""

    with pytest.raises(TypeError, match="Odd.pair: a flag's type must be"):
        add_flags(argparse.ArgumentParser(), Odd)


def test_imports_only_the_standard_library():
    code = (
        "import sys; before = set(sys.modules); import qserve.configflags; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] == 'qserve'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['qserve', 'qserve.configflags']"  # the package itself, nothing else of ours
