"""`qserve deploy ray`: write a Ray Serve config that Ray's own `serve run` (or KubeRay) starts unchanged.

    qserve deploy ray /srv/models/minilm-imdb-variants/onnx-int8 --replicas 2 --out serve_config.yaml
    serve run serve_config.yaml          # or: serve deploy serve_config.yaml; or KubeRay's serveConfigV2

The file holds one application: import path `qserve.serve.ray_engine:build_app`, its
args (the ServeConfig fields given, absolute variant path first) and the deployment
options (replicas or autoscaling, CPUs per replica, max ongoing requests). Everything
here is plain data and no Ray import happens in this module, so `qserve serve --engine
ray` computes its deployment options with the same functions without drifting from
the file. Secrets never go in the file: replicas read QSERVE_API_KEY from their own
environment (runtime_env env_vars, or a Kubernetes secret on the Ray pods).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qserve import QserveError

IMPORT_PATH = "qserve.serve.ray_engine:build_app"
APP_NAME = "qserve"
DEPLOYMENT_NAME = "QserveReplica"
RAY_INSTALL_HINT = "pip install 'qserve[ray]'  (installs ray[serve]==2.60.0)"
# ServeConfig fields a replica needs; host/port belong to Ray's proxy, the API key to the environment.
APP_FIELDS = ("device", "threads", "row_workers", "max_batch_size", "max_wait_ms", "max_queue", "max_inputs",
              "max_chars", "max_body_bytes", "request_timeout_s", "model_name", "long_text", "max_windows")


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
    def parse(cls, replicas: str | None, min_replicas: int | None, max_replicas: int | None,
              threads: int | None) -> Scaling:
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
    opts: dict[str, Any] = {"name": DEPLOYMENT_NAME, "max_ongoing_requests": 2 * max_batch_size,
                            "ray_actor_options": {"num_cpus": scaling.cpus_per_replica(cores)}}
    if scaling.replicas is None:
        # Autoscale on ongoing requests per replica: a full batch in flight is the sweet spot.
        opts["autoscaling_config"] = {"min_replicas": scaling.min_replicas, "max_replicas": scaling.max_replicas,
                                      "initial_replicas": max(1, scaling.min_replicas),
                                      "target_ongoing_requests": max_batch_size}
    else:
        opts["num_replicas"] = scaling.replicas
    return opts


def app_args(variant_dir: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The builder's args: the variant and the ServeConfig fields that were set (JSON/YAML-safe)."""
    return {"variant_dir": str(variant_dir), **{k: settings[k] for k in APP_FIELDS if settings.get(k) is not None}}


def serve_config(variant_dir: str, settings: dict[str, Any], scaling: Scaling, host: str, port: int,
                 cores: int | None = None) -> dict[str, Any]:
    """A whole ServeDeploySchema document: what `serve run` / `serve deploy` / serveConfigV2 read."""
    from qserve.serve.config import ServeConfig

    settings = dict(settings)
    settings.setdefault("threads", scaling.threads_per_replica(cores))
    mbs = settings.get("max_batch_size") or ServeConfig.max_batch_size
    return {"proxy_location": "EveryNode",
            "http_options": {"host": host, "port": port},
            "applications": [{"name": APP_NAME, "route_prefix": "/", "import_path": IMPORT_PATH,
                              "args": app_args(variant_dir, settings),
                              "deployments": [deployment_options(scaling, mbs, cores)]}]}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("deploy", help="write a deployment config for a serving platform (ray)",
                       description="Write the config a serving platform starts the variant from.")
    targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    r = targets.add_parser(
        "ray", help="a Ray Serve config: `serve run FILE`, `serve deploy FILE`, or KubeRay serveConfigV2",
        description="Write a Ray Serve config (import path + args + deployment options) that Ray's own "
                    "`serve run FILE` starts unchanged and KubeRay's RayService takes as serveConfigV2. "
                    "VARIANT_DIR must be an absolute path that every Ray node can read (a shared volume, "
                    "or baked into the image); the API key is not written: set QSERVE_API_KEY in the "
                    "replicas' environment.")
    r.add_argument("variant_dir", help="ABSOLUTE path of the variant directory, readable on every node")
    r.add_argument("--out", required=True, help="where to write the YAML (e.g. serve_config.yaml)")
    r.add_argument("--replicas", default="1", help="N or auto [1]")
    r.add_argument("--min-replicas", type=int, help="with --replicas auto [1]")
    r.add_argument("--max-replicas", type=int, help="with --replicas auto [max(min, 2)]")
    r.add_argument("--threads", type=int, help="CPUs and intra-op threads per replica [cores / replicas]")
    r.add_argument("--host", default="0.0.0.0", help="interface Ray's proxy binds [0.0.0.0: in a cluster the "
                                                     "proxy must be reachable; put auth (QSERVE_API_KEY) in front]")
    r.add_argument("--port", type=int, default=8000, help="proxy port [8000]")
    for f in APP_FIELDS:
        if f != "threads":
            r.add_argument(f"--{f.replace('_', '-')}", dest=f, type=_FIELD_TYPES.get(f, str), help="as for serve")
    r.add_argument("--force", action="store_true", help="replace an existing --out file")
    r.set_defaults(func=run_deploy_ray)


_FIELD_TYPES = {"row_workers": int, "max_batch_size": int, "max_wait_ms": float, "max_queue": int, "max_inputs": int,
                "max_chars": int, "max_body_bytes": int, "request_timeout_s": float, "max_windows": int}


def run_deploy_ray(args: argparse.Namespace) -> int:
    import yaml

    from qserve.artifact import write_text_atomic
    from qserve.serve.config import ServeConfig

    variant = Path(args.variant_dir)
    if not variant.is_absolute():
        raise QserveError(f"VARIANT_DIR {args.variant_dir!r} is relative; Ray replicas run on other nodes and in "
                          f"other working directories, so give an absolute path every node can read (e.g. "
                          f"{variant.resolve()}, if that path exists on every node)")
    if not (variant / "manifest.json").is_file():
        raise QserveError(f"VARIANT_DIR {variant}: no manifest.json here; export one with `qserve export` "
                          "(the path must also exist on every Ray node)")
    out = Path(args.out)
    if out.exists() and not args.force:
        raise QserveError(f"--out {out} exists; pass --force to replace it")
    scaling = Scaling.parse(args.replicas, args.min_replicas, args.max_replicas, args.threads)
    settings = {f: getattr(args, f, None) for f in APP_FIELDS}
    ServeConfig(variant_dir=str(variant), **{k: v for k, v in settings.items() if v is not None}).validate()
    doc = serve_config(str(variant), settings, scaling, args.host, args.port)
    header = ("# Ray Serve config written by `qserve deploy ray`: start it with `serve run <this file>`,\n"
              "# `serve deploy <this file>` on a running cluster, or paste its `applications:` block under a\n"
              "# KubeRay RayService's spec.serveConfigV2 (KubeRay owns the proxy's host and port there).\n"
              "# variant_dir must exist at this absolute path on every Ray node.\n"
              "# Auth: set QSERVE_API_KEY in the replicas' environment (never in this file).\n")
    write_text_atomic(out, header + yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {out}: {scaling.replicas or 'auto'} replica(s) of {variant}; start with `serve run {out}`")
    return 0
