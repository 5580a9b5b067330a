"""One exporter option's declaration: its key, default per variant, type, allowed values and flag.

    python -c "from qserve.variants import backend_of; \\
print([o.flag for o in backend_of('onnx-int8').options if o.help])"

Declared once, as an `option(...)` field of its backend's BackendOptions; `options_of` reads them back as `Option`s,
which the registry lists, `qserve export` makes flags of and `resolve` validates every value through.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from qserve import QserveError

OptionValue = bool | int | float | str | None
"""An exporter option's value as it travels through the CLI, the options dict and the manifest."""
_DECLARED = "qserve.option"
"""The dataclass field metadata key an `option(...)` declaration is kept under."""
_READ: dict[type, tuple[Option, ...]] = {}
"""options_of's answers, by options type (read once: registry lookups ask for them per variant)."""


@dataclass(frozen=True)
class Option:
    """One exporter option: its key in the variant's options, its default per variant, its flag."""

    key: str
    defaults: dict[str, OptionValue]
    """Variant name -> default, for exactly the variants that understand the option (None = the library's)."""
    kind: type = bool
    """bool (a --flag/--no-flag pair), int, float or str."""
    help: str = ""
    """`qserve export --help` text, without the default (derived from `defaults`). Empty: no flag, the
    option is set through `exporters.export(..., options=...)` only."""
    choices: tuple[OptionValue, ...] = ()
    metavar: str | None = None
    allowed: str = ""
    """What a valid value is, as the error says it ("an integer from 14 to 21"); default: from kind/choices."""
    note: str = ""
    """Said in the error before the rejected value ("training texts that calibrate the weight clipping")."""
    check: Callable[[Any], bool] | None = None
    """A range or shape rule beyond the type (e.g. 14 <= opset <= 21); None (the library's default) passes."""
    coerce: bool = False
    """Read "true"/"0"/"6.0" strings as the kind (bnb's options, given as text through the Python API)."""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def validate(self, variant: str, value: OptionValue) -> OptionValue:
        """`value` checked against the declaration (and coerced where `coerce`); a bad one is an error naming the
        option, the variant, what is allowed and, where the option has one, its `qserve export` flag."""
        if value is None and self.defaults.get(variant, 0) is None:
            return None  # None: the library's own default (opset)
        got = _coerce(value, self.kind) if self.coerce else value
        ok = (
            isinstance(got, bool)
            if self.kind is bool
            else isinstance(got, self.kind) and not isinstance(got, bool)
            if self.kind is not float
            else isinstance(got, (int, float)) and not isinstance(got, bool)
        )
        ok = ok and (not self.choices or got in self.choices) and (self.check is None or bool(self.check(got)))
        if not ok:
            allowed = self.allowed or (
                ", ".join(map(str, self.choices))
                if self.choices
                else {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
                    self.kind, self.kind.__name__
                )
            )
            if self.choices and not self.allowed:
                allowed = "one of " + allowed
            where = f" for {variant}" if not self.coerce else ""
            said = f"{self.note}; " if self.note else ""
            flag = f"; flag {self.flag}" if self.help else ""
            raise QserveError(f"option {self.key}{where} must be {allowed} ({said}got {value!r}){flag}")
        return float(got) if self.kind is float and got is not None else got


def _coerce(value: OptionValue, kind: type) -> OptionValue:
    if kind is bool and isinstance(value, str):
        text = value.strip().lower()
        return True if text in ("1", "true", "yes", "on") else False if text in ("0", "false", "no", "off") else value
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def option(
    defaults: dict[str, OptionValue],
    help: str = "",
    *,
    choices: tuple[OptionValue, ...] = (),
    metavar: str | None = None,
    allowed: str = "",
    note: str = "",
    check: Callable[[Any], bool] | None = None,
    coerce: bool = False,
) -> Any:
    """A BackendOptions field that is an exporter option (default None: the variant does not understand it, or
    takes `defaults`' value): everything `Option` holds except the key and the kind, which are the field's."""
    return field(
        default=None,
        metadata={
            _DECLARED: {
                "defaults": defaults,
                "help": help,
                "choices": choices,
                "metavar": metavar,
                "allowed": allowed,
                "note": note,
                "check": check,
                "coerce": coerce,
            }
        },
    )


def options_of(options_type: type) -> tuple[Option, ...]:
    """The `option(...)` fields of a BackendOptions dataclass as Options, in declaration order: the key is the
    field's name, the kind its type without None (`int | None` -> int)."""
    if options_type in _READ:
        return _READ[options_type]
    hints = typing.get_type_hints(options_type)
    out = []
    for f in fields(options_type):
        declared = f.metadata.get(_DECLARED)
        if declared is None:
            continue
        kinds = [k for k in typing.get_args(hints[f.name]) if k is not type(None)]
        if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
            raise TypeError(
                f"{options_type.__name__}.{f.name}: an option is `bool | None`, `int | None`, "
                f"`float | None` or `str | None`, not {hints[f.name]}"
            )
        out.append(Option(f.name, kind=kinds[0], **declared))
    _READ[options_type] = tuple(out)
    return _READ[options_type]
