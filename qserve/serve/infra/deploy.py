"""Ray deployment options, and `qserve deploy ray`: a Ray Serve config that `serve run` (or KubeRay) starts.

    qserve deploy ray /srv/models/minilm-imdb-variants/onnx-int8 --replicas 2 --out serve_config.yaml
    serve run serve_config.yaml          # or: serve deploy serve_config.yaml; or KubeRay's serveConfigV2

Plain data and no Ray import, so `qserve serve --engine ray` computes its options with these same functions and
cannot drift from the file. Secrets never go in the file: replicas read QSERVE_API_KEY from their environment.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.configflags import add_flags, config_values, flag
from qserve.files import write_text_atomic
from qserve.serve.infra.config import ServeConfig, settings_batch_size

IMPORT_PATH = "qserve.serve.ray_engine:build_app"
APP_NAME = "qserve"
DEPLOYMENT_NAME = "QserveReplica"
# ServeConfig fields that are not a replica's app settings: the variant is the builder's first arg,
# host/port and the connection limits belong to Ray's proxy (to uvicorn in `qserve serve`), the API key
# to the replicas' environment (never a config file); the Ray engine serves HTTP only, so no grpc_port.
PROXY_FIELDS = (
    "variant_dir",
    "host",
    "port",
    "api_key",
    "header_timeout_s",
    "body_timeout_s",
    "keep_alive_s",
    "max_connections",
    "grpc_port",
)
# Every other ServeConfig field configures the app inside each replica, so a new field reaches Ray (and
# `qserve deploy ray` gets its flag) with no edit here.
APP_FIELDS = tuple(f.name for f in fields(ServeConfig) if f.name not in PROXY_FIELDS)


@dataclass
class RayOptions:
    """How the app is laid out on Ray: flags of `qserve serve --engine ray` and `qserve deploy ray`."""

    replicas: str = "1"
    """N replicas, or auto: autoscale between --min-replicas and --max-replicas on ongoing requests."""
    min_replicas: int | None = field(default=None, metadata=flag(default_text="1"))
    """With --replicas auto: fewest replicas."""
    max_replicas: int | None = field(default=None, metadata=flag(default_text="max(--min-replicas, 2)"))
    """With --replicas auto: most replicas."""
    ray_address: str | None = field(
        default=None, metadata=flag(default_text="start a local Ray with this machine's cores, shut it down on exit")
    )
    """serve --engine ray: join this Ray cluster (auto, ray://host:10001). CPUs per replica = --threads,
    else cores / replicas."""


@dataclass
class RayConfigFile:
    """What `qserve deploy ray` serves and where it writes the config."""

    variant_dir: str = field(metadata=flag(positional=True))
    """ABSOLUTE path of the variant directory, readable on every Ray node."""
    out: str
    """Where to write the YAML (e.g. serve_config.yaml)."""
    force: bool = False
    """Replace an existing --out file."""


@dataclass
class Scaling:
    """How many replicas and how big each is: `--replicas N|auto --min-replicas --max-replicas --threads`."""

    replicas: int | None = 1
    """Fixed replica count; None = autoscale between min_replicas and max_replicas."""
    min_replicas: int = 1
    max_replicas: int | None = None
    num_cpus: float | None = None
    """CPUs Ray reserves per replica (= intra-op threads); None = the machine's cores / replicas."""

    @classmethod
    def parse(
        cls, replicas: str | None, min_replicas: int | None, max_replicas: int | None, threads: int | None
    ) -> Scaling:
        raw = (replicas or "1").strip().lower()
        if raw == "auto":
            lo = 1 if min_replicas is None else min_replicas
            hi = max_replicas if max_replicas is not None else max(lo, 2)
            if lo < 0 or hi < 1 or hi < lo:
                raise QserveError(f"--min-replicas {lo} / --max-replicas {hi}: need 0 <= min <= max and max >= 1")
            return cls(None, lo, hi, float(threads) if threads else None)
        if min_replicas is not None or max_replicas is not None:
            raise QserveError("--min-replicas/--max-replicas only apply with --replicas auto")
        try:
            n = int(raw)
        except ValueError:
            raise QserveError(f"--replicas {replicas!r}: expected a positive integer or 'auto'") from None
        if n < 1:
            raise QserveError(f"--replicas {n}: must be >= 1 (or 'auto')")
        return cls(n, num_cpus=float(threads) if threads else None)

    def cpus_per_replica(self, cores: int | None = None) -> float:
        """--threads if given; else the local cores split evenly, so N replicas fit on this machine."""
        if self.num_cpus:
            return self.num_cpus
        cores = cores or os.cpu_count() or 1
        most = self.replicas or self.max_replicas or 1
        return max(0.1, round(cores / most, 2))

    def threads_per_replica(self, cores: int | None = None) -> int:
        return max(1, math.floor(self.cpus_per_replica(cores)))


def deployment_options(scaling: Scaling, max_batch_size: int, cores: int | None = None) -> dict[str, Any]:
    """Ray Serve deployment options (the `deployments:` entry of a serve config, and .options() kwargs)."""
    # A replica batches in-process: it must be allowed at least a full batch of requests at once,
    # and a little more so the next batch queues while the current one runs.
    opts: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "max_ongoing_requests": 2 * max_batch_size,
        "ray_actor_options": {"num_cpus": scaling.cpus_per_replica(cores)},
    }
    if scaling.replicas is None:
        # Autoscale on ongoing requests per replica: a full batch in flight is the sweet spot.
        opts["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "initial_replicas": max(1, scaling.min_replicas),
            "target_ongoing_requests": max_batch_size,
        }
    else:
        opts["num_replicas"] = scaling.replicas
    return opts


def app_args(variant_dir: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The builder's args: the variant and the ServeConfig fields that were set (JSON/YAML-safe)."""
    return {"variant_dir": str(variant_dir), **{k: settings[k] for k in APP_FIELDS if settings.get(k) is not None}}


def serve_config(
    variant_dir: str, settings: dict[str, Any], scaling: Scaling, host: str, port: int, cores: int | None = None
) -> dict[str, Any]:
    """A whole ServeDeploySchema document: what `serve run` / `serve deploy` / serveConfigV2 read."""
    settings = dict(settings)
    settings.setdefault("threads", scaling.threads_per_replica(cores))
    mbs = settings_batch_size(settings)
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": IMPORT_PATH,
                "args": app_args(variant_dir, settings),
                "deployments": [deployment_options(scaling, mbs, cores)],
            }
        ],
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "deploy",
        help="write a deployment config for a serving platform (ray)",
        description="Write the config a serving platform starts the variant from.",
    )
    targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    r = targets.add_parser(
        "ray",
        help="a Ray Serve config: `serve run FILE`, `serve deploy FILE`, or KubeRay serveConfigV2",
        description="Write a Ray Serve config (import path + args + deployment options) that Ray's own "
        "`serve run FILE` starts unchanged and KubeRay's RayService takes as serveConfigV2. "
        "VARIANT_DIR must be an absolute path that every Ray node can read (a shared volume, "
        "or baked into the image); the API key is not written: set QSERVE_API_KEY in the "
        "replicas' environment.",
    )
    add_flags(r, RayConfigFile, ("variant_dir", "out"))
    add_flags(r, RayOptions, ("replicas", "min_replicas", "max_replicas"))
    add_flags(
        r,
        ServeConfig,
        ("threads",),
        unset=True,
        help={
            "threads": "CPUs Ray reserves, and intra-op threads, per replica (default: the machine's cores / replicas)."
        },
    )
    add_flags(
        r,
        ServeConfig,
        ("host", "port"),
        defaults={"host": "0.0.0.0"},
        help={
            "host": "Interface Ray's proxy binds (default: 0.0.0.0, so that it is reachable in a cluster; set "
            "QSERVE_API_KEY in the replicas' environment)."
        },
    )
    # The replica's own settings: the same flags as `qserve serve`, unset unless given (the file serves
    # VARIANT_DIR: several models or a repository are `qserve serve --engine ray`'s).
    add_flags(r, ServeConfig, [f for f in APP_FIELDS if f not in ("threads", "model_repository")], unset=True)
    add_flags(r, RayConfigFile, ("force",))
    r.set_defaults(func=run_deploy_ray)


def run_deploy_ray(args: argparse.Namespace) -> int:
    import yaml

    variant = Path(args.variant_dir)
    if not variant.is_absolute():
        raise QserveError(
            f"VARIANT_DIR {args.variant_dir!r} is relative; Ray replicas run on other nodes and in "
            f"other working directories, so give an absolute path every node can read (e.g. "
            f"{variant.resolve()}, if that path exists on every node)"
        )
    if not (variant / "manifest.json").is_file():
        raise QserveError(
            f"VARIANT_DIR {variant}: no manifest.json here; export one with `qserve export` "
            "(the path must also exist on every Ray node)"
        )
    out = Path(args.out)
    if out.exists() and not args.force:
        raise QserveError(f"--out {out} exists; pass --force to replace it")
    scaling = Scaling.parse(args.replicas, args.min_replicas, args.max_replicas, args.threads)
    settings = config_values(ServeConfig, args, APP_FIELDS, error=QserveError)  # the flags given; no env here
    for entry in settings.get("shadow") or []:
        if not Path(str(entry).partition("=")[2]).is_absolute():
            raise QserveError(f"--shadow {entry}: REFERENCE_DIR must be an absolute path, readable on every Ray node")
    ServeConfig(variant_dir=str(variant), **settings).validate()
    doc = serve_config(str(variant), settings, scaling, args.host, args.port)
    header = (
        "# Ray Serve config written by `qserve deploy ray`: start it with `serve run <this file>`,\n"
        "# `serve deploy <this file>` on a running cluster, or paste its `applications:` block under a\n"
        "# KubeRay RayService's spec.serveConfigV2 (KubeRay owns the proxy's host and port there).\n"
        "# variant_dir must exist at this absolute path on every Ray node.\n"
        "# Auth: set QSERVE_API_KEY in the replicas' environment (never in this file).\n"
    )
    write_text_atomic(out, header + yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {out}: {scaling.replicas or 'auto'} replica(s) of {variant}; start with `serve run {out}`")
    return 0
