"""Config dataclass -> argparse flags and QSERVE_* env vars: a documented field is a flag.

    python -c "import argparse; from qserve.configflags import add_flags; \\
from qserve.training.config import TrainConfig; p = argparse.ArgumentParser(); add_flags(p, TrainConfig); \\
p.print_help()"

`add_flags` makes each documented field a typed flag, `build` reads them back (unset -> QSERVE_<FIELD>); stdlib only.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ENV_PREFIX = "QSERVE_"
METADATA_KEY = "qserve.flag"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

C = TypeVar("C")


class FlagError(ValueError):
    """A flag or env value that cannot be read as its field's type; the message names it."""


@dataclass(frozen=True)
class Flag:
    """How one field appears on the command line, where its name and annotation are not enough."""

    option: str | None = None
    """The option string; default `--field-name` (`--no-field-name` for a bool that defaults to True).
    A field given another option string parses into argparse's own dest for it (`--time-budget` ->
    args.time_budget); `build` maps it back to the field."""
    choices: tuple[object, ...] | None = None
    """The allowed values (of the field's type); argparse refuses others and lists these."""
    repeat: bool = False
    """May be given several times (argparse append): the parsed value is a list, None when not given."""
    positional: bool = False
    """A positional argument (optional when the field has a default) instead of an option."""
    metavar: str | None = None
    default_text: str | None = None
    """What the help says the default is, where a None default does not say it (e.g. "cores / replicas")."""


def flag(
    *,
    option: str | None = None,
    choices: Iterable[object] | None = None,
    repeat: bool = False,
    positional: bool = False,
    metavar: str | None = None,
    default_text: str | None = None,
) -> dict[str, Flag]:
    """Metadata for `dataclasses.field(metadata=...)`: how the field appears on the command line."""
    return {
        METADATA_KEY: Flag(
            option, tuple(choices) if choices is not None else None, repeat, positional, metavar, default_text
        )
    }


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal under each field), whitespace collapsed."""
    docs: dict[str, str] = {}
    for klass in [k for k in reversed(cls.__mro__) if dataclasses.is_dataclass(k)]:  # a subclass's doc wins
        body = _class_node(klass)
        for node, nxt in zip(body.body, body.body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def env_name(field_name: str, prefix: str = ENV_PREFIX) -> str:
    """QSERVE_<FIELD>: the env var a field can come from where the command reads env."""
    return prefix + field_name.upper()


def add_flags(
    parser: argparse._ActionsContainer,
    cls: type,
    names: Iterable[str] | None = None,
    *,
    unset: bool = False,
    env_prefix: str | None = None,
    defaults: Mapping[str, object] | None = None,
    help: Mapping[str, str] | None = None,
    flags: Mapping[str, Flag] | None = None,
    negatable: bool = False,
) -> None:
    """Add one flag per field of dataclass `cls` (or per field in `names`, in that order) to `parser`.

    unset: parsed defaults are None (so `build` can try the env var); env_prefix: the env var named in the help;
    defaults / help / flags: per-field overrides; negatable: a bool is a `--x/--no-x` pair (None when neither).
    """
    docs = field_docs(cls)
    defaults, help, flags = defaults or {}, help or {}, flags or {}
    for fi in _fields(cls, names):
        if fi.name in flags:
            fi = dataclasses.replace(fi, spec=flags[fi.name])
        spec = fi.spec
        default = defaults.get(fi.name, fi.default)
        if fi.name in help:  # said in full by the caller, default included
            text = help[fi.name].replace("%", "%%")
        elif fi.name in docs:
            text = _help(docs[fi.name], fi, default, env_prefix)
        else:
            raise TypeError(f"{cls.__name__}.{fi.name} has no docstring: every flag needs its help")
        kw: dict[str, typing.Any] = {"help": text}
        if spec.metavar:
            kw["metavar"] = spec.metavar
        if spec.choices is not None:
            kw["choices"] = spec.choices
        if fi.typ is bool and negatable and not (spec.positional or spec.repeat or fi.is_list):
            kw.update(action=argparse.BooleanOptionalAction, default=None if unset else default)
        elif fi.typ is bool and not (spec.positional or spec.repeat or fi.is_list):
            kw.update(
                action="store_false" if default is True else "store_true", default=None if unset else default is True
            )
        else:
            if fi.is_list and isinstance(default, (list, tuple)):
                default = ",".join(map(str, default))  # a comma list, split by build() into the field's type
            if fi.typ is not str and not fi.is_list:
                kw["type"] = fi.typ
            if spec.repeat:
                kw["action"] = "append"
                default = None
            kw["default"] = None if unset or default is REQUIRED else default
            if spec.positional:
                kw["nargs"] = None if default is REQUIRED else "?"
            elif default is REQUIRED:
                kw["required"] = True
        if spec.positional:
            parser.add_argument(fi.name, **kw)
        else:
            parser.add_argument(fi.option, dest=fi.dest, **kw)


def option_name(cls: type, name: str) -> str:
    """The flag a user types for field `name` of `cls` (what an error message should name)."""
    return _fields(cls, [name])[0].option


def config_values(
    cls: type,
    args: argparse.Namespace | Mapping[str, object],
    names: Iterable[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    env_prefix: str = ENV_PREFIX,
    error: Callable[[str], Exception] = FlagError,
) -> dict[str, Any]:  # each value its field's type
    """The fields of `cls` that `args` sets (or, with `environ`, their env var), as the field's type.

    A value of None counts as not given: the field then keeps its dataclass default.
    """
    given = vars(args) if isinstance(args, argparse.Namespace) else args
    values: dict[str, object] = {}
    for fi in _fields(cls, names):
        value = given.get(fi.dest)
        if value is None and environ is not None:
            env = env_name(fi.name, env_prefix)
            raw = environ.get(env)
            if raw:
                value = _from_text(raw, fi, f"{env}={raw!r}", error)
        elif isinstance(value, str) and fi.is_list:
            value = _from_text(value, fi, fi.option, error)
        if value is not None:
            values[fi.name] = value
    return values


def build(
    cls: type[C],
    args: argparse.Namespace | Mapping[str, object],
    names: Iterable[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    env_prefix: str = ENV_PREFIX,
    overrides: Mapping[str, object] | None = None,
    error: Callable[[str], Exception] = FlagError,
) -> C:
    """The config the parsed flags (then, with `environ`, the env vars, then the defaults) describe."""
    values = config_values(cls, args, names, environ=environ, env_prefix=env_prefix, error=error)
    return cls(**{**values, **(overrides or {})})


# -- internals ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _module_tree(filename: str) -> ast.Module:
    return ast.parse(Path(filename).read_text(encoding="utf-8"))


def _class_node(cls: type) -> ast.ClassDef:
    """The class statement of `cls`: its module parsed once (cheap `--help`), else inspect's slower search."""
    filename = inspect.getsourcefile(cls)
    if filename and "<locals>" not in cls.__qualname__:
        body: list[ast.stmt] = _module_tree(filename).body
        node: ast.ClassDef | None = None
        for part in cls.__qualname__.split("."):
            node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
            if node is None:
                break
            body = node.body
        if node is not None:
            return node
    first = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(first, ast.ClassDef)
    return first


REQUIRED = object()
"""The default of a field that has none: a required flag, or a required positional."""


@dataclass(frozen=True)
class _FieldInfo:
    name: str
    dest: str  # the attribute the parsed value lands in
    spec: Flag
    typ: type  # the scalar type: int for `int | None` and for `list[int]`
    is_list: bool
    default: object  # REQUIRED when the field has none

    @property
    def option(self) -> str:
        if self.spec.option:
            return self.spec.option
        if self.spec.positional:
            return self.name.upper()
        return ("--no-" if self.typ is bool and self.default is True else "--") + self.name.replace("_", "-")


def _fields(cls: type, names: Iterable[str] | None) -> list[_FieldInfo]:
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    names = list(by_name) if names is None else list(names)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(missing)}")
    out = []
    for name in names:
        f = by_name[name]
        spec = f.metadata.get(METADATA_KEY, Flag())
        typ, is_list = _scalar_type(hints[name], f"{cls.__name__}.{name}")
        if f.default is not dataclasses.MISSING:
            default: object = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        dest = spec.option.lstrip("-").replace("-", "_") if spec.option and not spec.positional else name
        out.append(_FieldInfo(name, dest, spec, typ, is_list, default))
    return out


def _scalar_type(hint: object, where: str) -> tuple[type, bool]:
    """`int | None` -> (int, False); `list[int] | None` -> (int, True)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"{where}: a flag needs one type (or it | None), got {hint!r}")
        hint = rest[0]
    is_list = typing.get_origin(hint) in (list, tuple)
    if is_list:
        hint = typing.get_args(hint)[0]
    if not isinstance(hint, type) or hint not in (bool, int, float, str, Path):
        raise TypeError(f"{where}: a flag's type must be bool, int, float, str, Path or a list of one, got {hint!r}")
    return hint, is_list


def _help(text: str, fi: _FieldInfo, default: object, env_prefix: str | None) -> str:
    notes = []
    if fi.spec.default_text is not None:
        notes.append(f"default: {fi.spec.default_text}")
    elif fi.typ is bool and default is True and not fi.is_list:
        notes.append(f"on by default; {fi.option} turns it off")
    elif not (default is REQUIRED or default is None or default is False or default == "" or fi.spec.repeat):
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        notes.append(f"default: {shown}")
    if env_prefix:
        notes.append(f"env {env_name(fi.name, env_prefix)}")
    text = text.replace("%", "%%")  # argparse %-formats help strings
    return f"{text} ({'; '.join(notes)})" if notes else text


def _from_text(raw: str, fi: _FieldInfo, where: str, error: Callable[[str], Exception]) -> object:
    """An env var's text, or a comma-list flag's, as the field's type; errors say where it came from."""
    if fi.typ is bool and not fi.is_list:
        word = raw.strip().lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise error(f"{where}: expected 1/true/yes/on or 0/false/no/off")
    items = [x.strip() for x in raw.split(",") if x.strip()] if fi.is_list else [raw]
    try:
        values = [fi.typ(x) for x in items]
    except ValueError:
        values = []
    if values:
        return values if fi.is_list else values[0]
    if fi.is_list:
        raise error(f"{where} must be a comma-separated list of {fi.typ.__name__} values, e.g. 1,8,32 (got {raw!r})")
    raise error(f"{where} is not a valid {fi.typ.__name__}")
