"""`qserve serve` and `qserve loadtest`.

    qserve serve models/minilm-imdb-variants/onnx-int8 --max-batch-size 32 --max-wait-ms 5
    qserve loadtest http://127.0.0.1:8000 --concurrency 1,8,32,64 --duration 10

Every serve flag can also come from the environment as QSERVE_<FLAG> (e.g.
QSERVE_PORT, QSERVE_API_KEY); a flag given on the command line wins. Prefer
QSERVE_API_KEY to --api-key: command lines are visible to other local users.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import fields
from pathlib import Path

from qserve import QserveError

log = logging.getLogger("qserve.serve")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a variant over HTTP with dynamic batching",
        description="Serve one variant with FastAPI + uvicorn: POST /v1/classify (HF pipeline format), "
                    "the KServe V2 protocol under /v2, /health, /ready, /metrics, /docs. One process, one "
                    "inference thread; throughput comes from dynamic batching and the backend's intra-op "
                    "threads (--threads). Every flag can be set as env var QSERVE_<FLAG>; defaults in [].")
    p.add_argument("variant_dir", nargs="?", default=None,
                   help="variant directory, or a model dir from `qserve pipeline` (serves the variant its report "
                        "recommends: the fastest meeting the agreement bar) (env QSERVE_VARIANT_DIR)")
    p.add_argument("--host", help="interface to bind [127.0.0.1]; anything else should use --api-key")
    p.add_argument("--port", type=int, help="TCP port, 0 = any free one [8000]")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto [auto]")
    p.add_argument("--threads", type=int, help="intra-op threads of torch / ONNX Runtime [library default]")
    p.add_argument("--row-workers", type=int, help="onnx-int8 (run row by row): rows of a batch computed side by "
                                                  "side, one thread each [--threads, else cores]; 1 = one at a time")
    p.add_argument("--max-batch-size", type=int, help="most texts in one forward pass [32]; 1 disables batching")
    p.add_argument("--max-wait-ms", type=float, help="longest wait for a batch to fill [5]")
    p.add_argument("--max-queue", type=int, help="most texts waiting; beyond it 429 + Retry-After [1024]")
    p.add_argument("--max-inputs", type=int, help="most texts per request [64]")
    p.add_argument("--max-chars", type=int, help="most characters per text [20000]")
    p.add_argument("--long-text", metavar="POLICY",
                   help="what to read of a text longer than max_length when a request names no long_text: head, "
                        "tail, head-tail[:H] or windows[:W[:S[:mean|max]]] [the variant's manifest, else head]")
    p.add_argument("--max-windows", type=int, help="most windows one text gets under a windows policy [8]")
    p.add_argument("--max-body-bytes", type=int, help="largest request body, 413 beyond it [1048576]")
    p.add_argument("--request-timeout-s", type=float, help="answer 504 after this long [60]")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (prefer env QSERVE_API_KEY)")
    p.add_argument("--model-name", help="name to serve the model under [the variant's spec name]")
    p.add_argument("--allow-extra-files", action="store_true", default=None,
                   help="serve a variant whose directory holds files its manifest does not list [refused]")
    p.add_argument("--metrics-public", action="store_true", default=None,
                   help="leave /metrics open without the API key, for a Prometheus scraper [needs the key]")
    p.add_argument("--header-timeout-s", type=float,
                   help="close a connection whose request headers are not complete within this long [10]")
    p.add_argument("--body-timeout-s", type=float,
                   help="close a connection whose request body is not complete this long after its headers [30]")
    p.add_argument("--keep-alive-s", type=float, help="close an idle kept-alive connection after this long [5]")
    p.add_argument("--max-connections", type=int,
                   help="most open connections; a new one beyond it gets 503 and is closed [512]")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    ray = p.add_argument_group("engine", "uvicorn: one process (default). ray: Ray Serve replicas of the same app "
                                         "behind Ray's HTTP proxy on --host/--port (needs the qserve[ray] extra)")
    ray.add_argument("--engine", choices=["uvicorn", "ray"], default="uvicorn", help="serving engine [uvicorn]")
    ray.add_argument("--replicas", help="ray: N replicas, or auto (autoscaling) [1]")
    ray.add_argument("--min-replicas", type=int, help="ray, --replicas auto: fewest replicas [1]")
    ray.add_argument("--max-replicas", type=int, help="ray, --replicas auto: most replicas [max(min, 2)]")
    ray.add_argument("--ray-address", help="ray: join this cluster (auto, ray://host:10001) [start a local Ray "
                                           "with this machine's cores, shut it down on exit]; CPUs per replica = "
                                           "--threads, else cores / replicas")
    p.set_defaults(func=run_serve)


def _add_loadtest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "loadtest", help="load-test a local qserve server and check every answer",
        description="Send /v1/classify requests from N concurrent clients for a fixed time per level; report "
                    "p50/p99 latency, throughput, errors, lost requests and label mismatches against a "
                    "sequential first pass (or a csv of text,label). Loopback targets only.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000 (loopback only)")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated client counts, each 1..1024")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per concurrency level (max 600)")
    p.add_argument("--max-requests", type=int, default=100_000, help="request cap per level")
    p.add_argument("--texts", help="csv with header text[,label] (label = expected), or one text per line; "
                                   "default: 96 built-in review sentences")
    p.add_argument("--api-key", default=None, help="bearer token (default: env QSERVE_API_KEY)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")
    p.add_argument("--json", dest="json_out", help="also write the report as JSON here")
    p.set_defaults(func=run_loadtest_cmd)


def register(subparsers: argparse._SubParsersAction) -> None:
    _add_serve(subparsers)
    _add_loadtest(subparsers)


def run_serve(args: argparse.Namespace) -> int:
    from qserve.serve.config import ServeConfig, config_from_sources

    flags = {f.name: getattr(args, f.name, None) for f in fields(ServeConfig)}
    cfg = config_from_sources(flags)
    if not cfg.variant_dir:
        raise QserveError("no variant: give VARIANT_DIR or set QSERVE_VARIANT_DIR")
    selection = None
    model_dir = Path(cfg.variant_dir)
    if not (model_dir / "manifest.json").is_file() and any((model_dir / d).is_dir() for d in ("report", "variants")):
        # A model dir (`qserve pipeline`'s run dir): serve the variant its bench report recommends.
        from qserve.bench.recommend import from_model_dir

        vdir, selection = from_model_dir(cfg.variant_dir)
        if cfg.long_text is None and selection.get("long_text"):
            cfg.long_text = selection["long_text"]  # the report's policy at >= half head's texts/s
        log.info("model dir %s: serving %s (%s; from %s)", cfg.variant_dir, selection["variant"], selection["why"],
                 selection["report"])
        if selection["same_cpu"] is False:
            log.warning("that report was measured on %s, not on this CPU: the fastest variant here may differ "
                        "(re-run `qserve pipeline` here, or pass a variant dir)", selection["measured_on"])
        cfg.variant_dir = str(vdir)
    if not (Path(cfg.variant_dir) / "manifest.json").is_file():
        raise QserveError(f"VARIANT_DIR {cfg.variant_dir}: no manifest.json; export one with `qserve export`")
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and not cfg.api_key:
        log.warning("binding %s without an API key: anyone who can reach this port can use the model", cfg.host)

    ray_flags = {"--replicas": args.replicas, "--min-replicas": args.min_replicas,
                 "--max-replicas": args.max_replicas, "--ray-address": args.ray_address}
    if args.engine == "ray":
        from qserve.deploy import Scaling

        scaling = Scaling.parse(args.replicas, args.min_replicas, args.max_replicas, cfg.threads)
        from qserve.serve.ray_engine import run_ray  # imports Ray; a clear error names the extra if missing

        return run_ray(cfg, scaling, args.ray_address, args.log_level)
    given = [flag for flag, v in ray_flags.items() if v is not None]
    if given:
        raise QserveError(f"{', '.join(given)} only apply with --engine ray (this is --engine {args.engine})")

    import uvicorn

    from qserve.serve.app import create_app
    from qserve.serve.server import uvicorn_config

    failed: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_failure(exc: BaseException) -> None:
        failed.append(exc)
        if server is not None:
            server.should_exit = True

    loader = None
    if selection is not None:
        from qserve.serve.app import _default_loader

        def loader(config):  # the runtime carries why it was chosen, for /v1/models
            runtime = _default_loader(config)
            runtime.selection = selection
            return runtime

    app = create_app(cfg, loader=loader, on_load_failure=on_load_failure)
    server = uvicorn.Server(uvicorn_config(app, cfg.host, cfg.port, args.log_level))
    server.run()
    if failed:
        print(f"qserve serve: error: could not load {cfg.variant_dir}: {failed[0]}", file=sys.stderr)
        return 2
    return 0


def run_loadtest_cmd(args: argparse.Namespace) -> int:
    from qserve.artifact import write_json_atomic
    from qserve.serve.loadtest import format_report, read_texts_file, run_loadtest

    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        raise QserveError(f"--concurrency {args.concurrency!r}: expected comma-separated integers, e.g. 1,8,32") \
            from None
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one INFO line per request would drown the report
    texts, labels = read_texts_file(args.texts) if args.texts else (None, None)
    report = run_loadtest(args.url, levels, args.duration, texts=texts, labels=labels,
                          max_requests=args.max_requests, api_key=args.api_key or os.environ.get("QSERVE_API_KEY"),
                          timeout_s=args.timeout)
    print(format_report(report))
    if args.json_out:
        write_json_atomic(Path(args.json_out), report)
    bad = sum(lv["errors"] + lv["lost"] + lv["mismatched"] for lv in report["levels"])
    return 1 if bad else 0
