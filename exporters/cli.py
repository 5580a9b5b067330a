"""`qserve export` and `qserve variants`: the commands users type first.

qserve export models/minilm-l6-distilbert-imdb/checkpoint --bits 8   # -> .../variants/onnx-int8 on CPU
qserve export models/minilm-l6-distilbert-imdb/checkpoint --all      # every variant this device runs
qserve variants                                                  # what exists, with size and parity
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import exporters
from exporters.core import ExportFailed, checkpoint_info, one_line, parse_inputs, variant_policy
from qserve import QserveError, longtext
from qserve.artifact import VariantError, checkpoint_hash
from qserve.configflags import Flag, add_flags
from qserve.devices import resolve_device
from qserve.exportoption import Option, OptionValue
from qserve.placement import no_cuda, place, plan
from qserve.rundir import RunDir
from qserve.variantflags import BITS, DEFAULT_FOR_BITS, DTYPES, off_fast_path, resolve
from qserve.variants import BACKENDS, VARIANTS, UnsupportedVariant, VariantSpec, backend_of, flag_options, get_spec
from qserve.verify import verify

# Exporter options with a flag: option key -> (flag, the variants that understand it), from the registry.
OPTION_FLAGS: dict[str, tuple[str, set[str]]] = {
    key: (opts[0].flag, {name for o in opts for name in o.defaults}) for key, opts in flag_options().items()
}


def default_out_root(checkpoint: Path) -> Path:
    """Where variants land without --out: beside, never inside, the checkpoint (its hash is in every manifest):
    RUN/variants/<name> for a run dir's RUN/checkpoint, else X-variants/<name>."""
    run = RunDir.of_checkpoint(checkpoint)
    return run.variants if run else checkpoint.parent / f"{checkpoint.name}-variants"


def same_export(
    dest: Path, checkpoint: Path, spec: VariantSpec, options: dict, long_text: str | None, inputs: tuple | None
) -> bool:
    """True when `dest` already holds this very export, verified (same variant, options, policy, inputs and
    checkpoint hash), so re-running the same command keeps it; anything else in `dest` needs --force."""
    if not (dest / "manifest.json").is_file():
        return False
    try:
        m = verify(dest)
    except VariantError:
        return False
    info = checkpoint_info(checkpoint, inputs)
    return (
        m.spec.name == spec.name
        and dict(m.spec.options or {}) == {**spec.options, **options}
        and m.long_text == variant_policy(info, long_text)
        and tuple(m.inputs or ("text",)) == info.inputs
        and (m.source or {}).get("sha256") == checkpoint_hash(checkpoint)
    )


def options_for(name: str, args: argparse.Namespace, strict: bool) -> dict:
    opts = {}
    for key, (flag, owners) in OPTION_FLAGS.items():
        value = getattr(args, key, None)
        if value is None:
            continue
        if name in owners:
            opts[key] = value
        elif strict:
            raise QserveError(f"{flag} applies to {', '.join(sorted(owners))}, not {name}")
    return opts


def cmd_export(args: argparse.Namespace) -> int:
    return exported(args)[1]


def exported(args: argparse.Namespace) -> tuple[list[Path], int]:
    """`qserve export`: (the variant dirs it wrote or kept, its exit status)."""
    checkpoint = Path(args.checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise QserveError(
            f"CHECKPOINT {checkpoint} is not a checkpoint directory (no config.json); "
            "pass a directory written by `qserve train` or save_pretrained"
        )
    device = resolve_device(args.device)
    if args.long_text:
        variant_policy(checkpoint, args.long_text)  # a bad policy fails once, before any variant is built

    inputs = parse_inputs(args.inputs)  # a bad --inputs fails once, before any variant is built
    if args.all:
        if args.bits or args.backend or args.dtype or args.variant:
            raise QserveError(
                "--all exports every supported variant; do not combine it with --bits/--backend/--dtype/--variant"
            )
        # every variant this machine runs, each on its device: on CUDA, what the GPU cannot run goes to the CPU
        run = plan(device, include_slow=args.include_slow)
        for name, why in run.skipped.items():
            print(f"skipping {name}: {why}", file=sys.stderr)
        for name, moved in run.elsewhere.items():
            print(f"note: {name} is exported and parity-checked on the {moved.device}: {moved.why}", file=sys.stderr)
        specs = [get_spec(n) for n in run.runs]
        devices = {n: run.device_of(n) for n in run.runs}
    else:
        if args.variant:
            specs = [get_spec(args.variant)]
        elif args.bits:
            # --device auto on a GPU: the GPU's default for the bits; a variant it cannot run goes to the CPU below
            specs = [resolve(args.bits, args.backend, args.dtype, device, check_device=args.device != "auto")]
        else:
            raise QserveError(
                "say what to export: --bits {32,16,8,4} (optionally --backend/--dtype), --variant NAME, or --all"
            )
        devices = {specs[0].name: place(specs[0], args.device)}  # an explicit --device cuda that cannot hold: error
        if devices[specs[0].name] != device:
            print(
                f"note: {specs[0].name} cannot run on {device} here ({no_cuda(specs[0])}); exported and "
                f"parity-checked on the {devices[specs[0].name]} (--device auto)",
                file=sys.stderr,
            )
    root = Path(args.out) if args.out else default_out_root(checkpoint)
    # A single variant with --out names the variant dir itself; several go under it.
    single_dir = len(specs) == 1 and args.out is not None and not args.all
    failures, written = [], []
    for spec in specs if not args.all else []:
        slow = off_fast_path(spec, devices[spec.name])
        if slow:  # exported as asked, never silently: the user asked for this variant, not for speed at any cost
            print(
                f"note: {slow}; a faster choice here: --bits 8 ({resolve(8, device=devices[spec.name]).name}) or "
                "--bits 32",
                file=sys.stderr,
            )
    for i, spec in enumerate(specs, 1):
        dest = root if single_dir else root / spec.name
        if dest.exists() and args.all and not args.force and (dest / "manifest.json").is_file():
            print(f"[{i}/{len(specs)}] {spec.name}: exists at {dest}, kept (use --force to rebuild)")
            written.append(dest)
            continue
        if (
            dest.exists()
            and not args.all
            and not args.force
            and same_export(dest, checkpoint, spec, options_for(spec.name, args, strict=True), args.long_text, inputs)
        ):
            print(
                f"[{i}/{len(specs)}] {spec.name}: {dest} already holds this export (same checkpoint, options and "
                "long-text policy), kept (use --force to rebuild)"
            )
            written.append(dest)
            continue
        print(f"[{i}/{len(specs)}] {spec.name}: exporting to {dest} ...", flush=True)
        t0 = time.perf_counter()
        try:
            m = exporters.export(
                checkpoint,
                spec,
                dest,
                force=args.force,
                options=options_for(spec.name, args, strict=not args.all),
                device=devices[spec.name],
                long_text=args.long_text,
                inputs=inputs,
            )
        except UnsupportedVariant as e:
            if not args.all:
                raise
            # a crashing OpenVINO plugin or an architecture the variant cannot hold skips it; the rest go on
            print(f"    skipped: {e}", file=sys.stderr)
            continue
        except QserveError as e:
            if not args.all:
                raise
            # One line per failed variant (the exporter's traceback is behind -v); the others go on.
            failures.append(spec.name)
            kind, detail = (
                (e.exc_type, e.detail) if isinstance(e, ExportFailed) else (type(e).__name__, one_line(str(e)))
            )
            print(f"    failed: {spec.name}: {kind}: {detail}", file=sys.stderr)
            continue
        written.append(dest)
        p = m.parity or {}
        size = sum(f.bytes for f in m.files.values())
        print(
            f"    done in {time.perf_counter() - t0:.1f}s: {size / 1e6:.1f} MB, long text {m.long_text}, "
            f"parity max|Δlogit| "
            f"{p['max_abs_logit_diff']:.3g} (tol {p['tolerance']:g}), probe agreement {p['agreement']:.0%}"
        )
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
        return written, 1
    return written, 0


def find_variants(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        if (p / "manifest.json").is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(sorted(m.parent for m in p.rglob("manifest.json") if not m.parent.name.startswith(".")))
    return out


def cmd_variants(args: argparse.Namespace) -> int:
    rows = []
    for d in find_variants([Path(p) for p in (args.paths or ["models"])]):
        try:
            m = verify(d, check_hashes=args.verify)
            p = m.parity or {}
            size = sum(f.bytes for f in m.files.values())
            rows.append(
                {
                    "path": str(d),
                    "variant": m.name,
                    "model": m.model_name,
                    "size_mb": round(size / 1e6, 2),
                    "max_abs_logit_diff": p.get("max_abs_logit_diff"),
                    "agreement": p.get("agreement"),
                    "created": m.created,
                    "status": "ok",
                }
            )
        except VariantError as e:
            rows.append({"path": str(d), "variant": "?", "status": f"invalid: {e}"})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no variants under {', '.join(args.paths or ['models'])}; create one with `qserve export`")
        return 0
    print(f"{'variant':<11} {'size MB':>8} {'max|Δ|':>8} {'agree':>6}  {'model':<32} path")
    for r in rows:
        if r["status"] != "ok":
            print(f"{'?':<11} {'':>8} {'':>8} {'':>6}  {'':<32} {r['path']}  ({r['status']})")
            continue
        print(
            f"{r['variant']:<11} {r['size_mb']:>8.2f} {r['max_abs_logit_diff']:>8.3g} "
            f"{r['agreement']:>6.0%}  {str(r['model']):<32} {r['path']}"
        )
    return 0


def _default_text(opt: Option) -> str:
    def show(v: OptionValue) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    values = {n: v for n, v in opt.defaults.items() if v not in (None, "")}  # None/"": nothing to show
    if not values:
        return ""
    if len(set(map(repr, values.values()))) == 1:
        return f" (default {show(next(iter(values.values())))})"
    return " (default " + ", ".join(f"{show(v)} for {n}" for n, v in values.items()) + ")"


def _add_option_flag(p: argparse.ArgumentParser, opts: list[Option]) -> None:
    """One `qserve export` flag for an option key, from the backend's typed options (configflags.add_flags)."""
    help_text = "; ".join(f"{', '.join(o.defaults)}: {o.help}{_default_text(o)}" for o in opts)
    first = opts[0]
    typed = backend_of(next(iter(first.defaults))).options_type
    add_flags(
        p,
        typed,
        [first.key],
        unset=True,
        negatable=True,
        help={first.key: help_text},
        flags={first.key: Flag(choices=tuple(first.choices) or None, metavar=first.metavar)},
    )


def register(sub) -> None:
    defaults = "; ".join(
        f"on {dev.upper()}: " + ", ".join(f"{b} -> {n}" for b, n in table.items())
        for dev, table in DEFAULT_FOR_BITS.items()
    )
    p = sub.add_parser(
        "export",
        help="turn a checkpoint into quantized / converted variants",
        description="Export a fine-tuned checkpoint to a served-ready variant directory "
        f"(weights + tokenizer + manifest.json). Defaults per --bits {defaults}.",
    )
    p.add_argument("checkpoint", help="checkpoint directory (from `qserve train` or save_pretrained)")
    p.add_argument("--bits", type=int, choices=list(BITS), help="weight bits; picks the device's default backend")
    p.add_argument("--backend", choices=list(BACKENDS), help="with --bits: which backend produces it")
    p.add_argument(
        "--dtype", choices=list(DTYPES), help="with --bits: which storage type (e.g. --bits 16 --dtype fp16)"
    )
    p.add_argument("--variant", choices=list(VARIANTS), help="name the variant directly")
    p.add_argument(
        "--all",
        action="store_true",
        help="every variant this machine runs (existing ones kept); on "
        "CUDA, those the GPU cannot run are exported on the CPU",
    )
    p.add_argument(
        "--include-slow",
        action="store_true",
        help="with --all: also variants that run but only slowly here (torch-fp16 on CPU)",
    )
    p.add_argument(
        "--out",
        help="output dir (single variant: the variant dir; --all: the parent). "
        "Default: RUN/variants/<variant> for a run dir's RUN/checkpoint (what `qserve "
        "train` and `qserve pipeline` write), else <checkpoint>-variants/<variant>",
    )
    p.add_argument("--force", action="store_true", help="replace an existing variant directory")
    p.add_argument(
        "--device",
        default="auto",
        help="auto|cpu|cuda|cuda:N: device for --bits defaults and the parity "
        "check (auto: the GPU where the variant runs on it, else the CPU)",
    )
    # Not a registry option: every variant records a long-text policy in its manifest, whatever its backend.
    p.add_argument(
        "--inputs",
        metavar="INPUTS",
        choices=None,
        help="what one input of the model is: text, or text,text_pair for a model that reads text "
        "pairs (NLI, cross-encoder) saved by save_pretrained elsewhere; recorded in the manifest "
        "and used by calibration, parity and serving (default: the checkpoint's qserve_model.json, "
        "else text)",
    )
    p.add_argument(
        "--long-text",
        metavar="POLICY",
        help=f"what the variant reads of a text longer than max_length, recorded in its manifest and "
        f"served by default: {longtext.FORMS} (default: the checkpoint's qserve_model.json, "
        f"else {longtext.DEFAULT})",
    )
    for opts in flag_options().values():
        _add_option_flag(p, opts)
    p.set_defaults(func=cmd_export)

    v = sub.add_parser("variants", help="list variant directories with size and parity")
    v.add_argument("paths", nargs="*", help="variant dirs or folders to search (default: models)")
    v.add_argument("--verify", action="store_true", help="also check every file's sha256 (slower)")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=cmd_variants)
