"""The corpus of `qserve predict`: INPUT read in chunks, OUTPUT written as complete parts, a ledger, one merge.

    python -c "from qserve.predict.corpus import open_input; print(open_input('rows.jsonl').columns())"

Memory holds one chunk whatever the corpus size; a jsonl line that is not a JSON object becomes a row carrying only
ROW_ERROR, never a crash. A part is renamed into place only when whole, so a part that exists is complete and a rerun
skips its rows (docs/predict.md).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.extras import require
from qserve.files import write_json_atomic

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
ROW_ERROR = "\x00qserve-row-error"
"""Key of a row that could not be read at all (a jsonl line that is not a JSON object): its error."""
LEDGER = "ledger.json"

Row = dict[str, Any]


def output_format(out: str | Path) -> str:
    fmt = SUFFIXES.get(Path(out).suffix.lower())
    if fmt is None:
        raise QserveError(f"--out {out}: the suffix picks the format; allowed: .parquet, .jsonl, .csv")
    return fmt


def _pyarrow() -> Any:
    require("pyarrow.parquet", "parquet")  # the submodule is used through pyarrow.parquet
    return require("pyarrow", "parquet")


@dataclass
class Input:
    """INPUT, opened: its format and where it is (`-` = stdin)."""

    path: str
    fmt: str
    files: list[Path]
    """The parquet files of a directory, in name order (a file: itself; stdin: none)."""

    def columns(self) -> list[str] | None:
        """The columns a parquet input declares (None for jsonl/csv: rows say for themselves)."""
        if self.fmt == "parquet":
            pq = _pyarrow().parquet
            return list(pq.read_schema(self.files[0]).names) if self.files else []
        if self.fmt == "csv":
            with _open_text(self) as f:
                return next(csv.reader(f), [])
        return None

    def total(self) -> int | None:
        """Rows in INPUT when cheap to know (parquet metadata, jsonl line count), else None."""
        if self.fmt == "parquet":
            pq = _pyarrow().parquet
            return sum(pq.ParquetFile(p).metadata.num_rows for p in self.files)
        if self.fmt == "jsonl" and self.path != "-":
            with open(self.path, "rb") as f:  # blank lines count too: close enough for a progress bar
                return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
        return None

    def chunks(self, rows: int, skip: int = 0) -> Iterator[list[Row]]:
        """Chunks of `rows` rows from row `skip` on (the rows of complete parts are skipped, not scored)."""
        read = {"jsonl": self._jsonl, "csv": self._csv, "parquet": self._parquet}[self.fmt]
        it = itertools.islice(read(), skip, None)
        while chunk := list(itertools.islice(it, rows)):
            yield chunk

    def _jsonl(self) -> Iterator[Row]:
        with _open_text(self) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue  # a blank line (a trailing newline) is no row
                try:
                    row = json.loads(line)
                except ValueError as e:
                    yield {ROW_ERROR: f"line {n} is not valid JSON ({e})"}
                    continue
                yield (
                    row
                    if isinstance(row, dict)
                    else {ROW_ERROR: f"line {n} is a JSON {type(row).__name__}, not an object of columns"}
                )

    def _csv(self) -> Iterator[Row]:
        with _open_text(self) as f:
            yield from csv.DictReader(f)

    def _parquet(self) -> Iterator[Row]:
        pq = _pyarrow().parquet
        for path in self.files:
            try:
                for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                    yield from batch.to_pylist()
            except OSError as e:
                raise QserveError(f"{path}: cannot read it as parquet ({e})") from None


def _open_text(inp: Input) -> Any:
    if inp.path == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    return open(inp.path, encoding="utf-8", errors="replace", newline="" if inp.fmt == "csv" else None)


def open_input(path: str) -> Input:
    """INPUT by its suffix (a directory: its .parquet files); one clear line when it cannot be read."""
    if path == "-":
        return Input("-", "jsonl", [])
    p = Path(path)
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.suffix.lower() == ".parquet" and q.is_file())
        if not files:
            raise QserveError(f"{path}: a directory of parquet files was expected, but it holds no .parquet file")
        _pyarrow()
        return Input(str(p), "parquet", files)
    if not p.is_file():
        raise QserveError(
            f"{path}: no such file (INPUT is a .jsonl, .csv, .parquet, a directory of parquet files, "
            "or - for jsonl on stdin)"
        )
    fmt = SUFFIXES.get(p.suffix.lower())
    if fmt is None:
        raise QserveError(
            f"{path}: unknown input format {p.suffix!r}; allowed: .jsonl, .csv, .parquet, a "
            "directory of .parquet files, or -"
        )
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as e:
        raise QserveError(f"{path}: cannot read the file ({e.strerror})") from None
    if fmt == "parquet":
        _pyarrow()
        try:
            _pyarrow().parquet.read_schema(p)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a file that is not parquet
            raise QserveError(f"{path}: cannot read it as parquet ({e})") from None
    return Input(str(p), fmt, [p] if fmt == "parquet" else [])


# -- parts, ledger, merge ------------------------------------------------------------------------


def parts_dir(out: str | Path) -> Path:
    return Path(f"{out}.parts")


def part_path(parts: Path, index: int, fmt: str) -> Path:
    return parts / f"part-{index:06d}.{fmt}"


def complete_parts(parts: Path, fmt: str) -> int:
    """How many parts, from the first on without a gap, are complete (a .tmp is a part cut short)."""
    n = 0
    while part_path(parts, n, fmt).is_file():
        n += 1
    return n


def _cell(value: Any) -> Any:
    """A csv cell: lists and dicts as JSON, None as empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return value


def write_part(rows: list[Row], path: Path, fmt: str, types: dict[str, Any] | None = None) -> None:
    """One part, whole or not at all: written to PATH.tmp, flushed to disk, renamed to PATH.
    `types`: pyarrow types of the answer columns (parquet), so every part has the same schema."""
    tmp = path.with_name(path.name + ".tmp")
    if fmt == "parquet":
        _pyarrow().parquet.write_table(rows_to_table(rows, types or {}), tmp)
    else:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            if fmt == "jsonl":
                f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            else:
                names = list(dict.fromkeys(k for row in rows for k in row))
                w = csv.DictWriter(f, fieldnames=names)
                w.writeheader()
                for row in rows:
                    w.writerow({k: _cell(v) for k, v in row.items()})
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def rows_to_table(rows: list[Row], types: dict[str, Any]) -> Any:
    """Rows as a pyarrow table: the carried columns as pyarrow infers them, the answer columns typed."""
    pa = _pyarrow()
    names = list(dict.fromkeys(k for row in rows for k in row))
    cols = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            cols[name] = pa.array(values, type=types.get(name))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if name in types:
                raise
            # A column that mixes types (a bad row's number where the others hold text) cannot be one parquet
            # column: it is written as text, each non-string value as its JSON (jsonl output keeps it as it is).
            cols[name] = pa.array(
                [v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values],
                type=pa.string(),
            )
    return pa.table(cols)


def merge(parts: Path, count: int, out: Path, fmt: str) -> tuple[int, int]:
    """OUTPUT from parts 0..count-1 in order (through a temp name); returns (rows, rows with an error)."""
    tmp = out.with_name(f".{out.name}.tmp")
    paths = [part_path(parts, i, fmt) for i in range(count)]
    rows = failed = 0
    if fmt == "parquet":
        pa = _pyarrow()
        pq = pa.parquet
        schemas = [pq.read_schema(p) for p in paths]
        schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
        with pq.ParquetWriter(tmp, schema) as w:
            for p in paths:
                table = pq.read_table(p)
                for name in schema.names:  # a column a part lacks (its rows never had it): nulls
                    if name not in table.column_names:
                        table = table.append_column(name, pa.nulls(len(table), schema.field(name).type))
                table = table.select(schema.names).cast(schema)
                rows += len(table)
                if "error" in table.column_names:
                    failed += len(table) - table.column("error").null_count
                w.write_table(table)
    elif fmt == "jsonl":
        with open(tmp, "wb") as w:
            for p in paths:
                with open(p, "rb") as f:
                    for line in f:
                        rows += 1
                        failed += json.loads(line).get("error") is not None
                        w.write(line)
    else:
        names: list[str] = []
        for p in paths:  # the header is every part's columns, first seen first
            with open(p, encoding="utf-8", newline="") as f:
                names += [n for n in next(csv.reader(f), []) if n not in names]
        with open(tmp, "w", encoding="utf-8", newline="") as w:
            writer = csv.DictWriter(w, fieldnames=names)
            writer.writeheader()
            for p in paths:
                with open(p, encoding="utf-8", newline="") as f:
                    for row in csv.DictReader(f):
                        rows += 1
                        failed += bool(row.get("error"))
                        writer.writerow(row)
    os.replace(tmp, out)
    shutil.rmtree(parts, ignore_errors=True)
    return rows, failed


def prepare(out: Path, fmt: str, ledger: dict[str, Any], force: bool) -> int:
    """Set up OUTPUT.parts/ for this job; returns how many parts are already complete (0 for a fresh job).
    A ledger from another TARGET, INPUT or setting is refused, naming both, unless --force."""
    parts = parts_dir(out)
    if force:
        shutil.rmtree(parts, ignore_errors=True)
    elif (parts / LEDGER).is_file():
        try:
            old = json.loads((parts / LEDGER).read_text(encoding="utf-8"))
        except ValueError:
            old = {}
        for key, what in (("target", "TARGET"), ("input", "INPUT")):
            if old.get(key) != ledger[key]:
                raise QserveError(
                    f"{parts} holds parts of a job with {what} {old.get(key)}, not {ledger[key]}; "
                    f"rerun that job to finish it, or pass --force to start this one over"
                )
        for key in ledger:
            if old.get(key) != ledger[key]:
                raise QserveError(
                    f"{parts} holds parts of a job with {key} {old.get(key)!r}, not "
                    f"{ledger[key]!r}; rerun it as it was, or pass --force to start over"
                )
        for stale in parts.glob("*.tmp"):  # a part cut short by the crash
            stale.unlink()
        return complete_parts(parts, fmt)
    elif out.exists():
        raise QserveError(f"--out {out} already exists (a finished job); pass --force to score again over it")
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    write_json_atomic(parts / LEDGER, ledger)
    return 0
