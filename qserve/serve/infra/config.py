"""Serving settings: one dataclass, filled from defaults < QSERVE_* env vars < CLI flags.

    QSERVE_MAX_BATCH_SIZE=16 QSERVE_API_KEY=secret qserve serve models/minilm-imdb-variants/onnx-int8

The settings assume one inference thread per variant and process, with throughput from dynamic batching sized by
device (BATCHING); why, and the exceptions (row workers, lanes, --workers): docs/serving.md, Concurrency model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from qserve import QserveError
from qserve.configflags import ENV_PREFIX, build, flag
from qserve.devices import cuda_available
from qserve.longtext import MAX_WINDOWS, parse
from qserve.runtime import graphs
from qserve.runtime.buckets import parse as parse_buckets


@dataclass
class ServeConfig:
    """Everything `qserve serve` can be told. Each field is a flag (its docstring the help) and the env var
    QSERVE_<FIELD>; a flag given on the command line wins over the env var, which wins over the default."""

    variant_dir: str = field(default="", metadata=flag(positional=True, metavar="DIR"))
    """Variant directory (weights + tokenizer + manifest.json) to serve, or a model dir from `qserve pipeline`
    (serves the variant its bench report recommends: the fastest meeting the agreement bar). Several models:
    DIR DIR ..., each optionally NAME=DIR (default name: the variant's spec name); requests name one, the
    first is the default. The env var holds one DIR."""
    host: str = "127.0.0.1"
    """Interface to bind; the default keeps the server on loopback (anything else should use --api-key)."""
    port: int = 8000
    """TCP port (0 = any free port)."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto."""
    threads: int | None = field(default=None, metadata=flag(default_text="the library's: all cores"))
    """Intra-op threads for torch / ONNX Runtime."""
    row_workers: int | None = field(default=None, metadata=flag(default_text="--threads, else the cores"))
    """Rows of a batch run side by side, one thread each: a row-by-row batch's rows (onnx-int8), an OpenVINO
    batch's shares on one stream each (1 = one row at a time, or the whole batch, on all intra-op threads).
    Answers are the same either way."""
    max_batch_size: int | None = field(default=None, metadata=flag(default_text="32 on CPU, 256 on CUDA"))
    """Most texts run in one forward pass (1 disables batching). A windowed text's windows are cut from it
    inside the runtime, which forwards at most this many pieces at once. Unset: by device (BATCHING)."""
    max_wait_ms: float | None = field(default=None, metadata=flag(default_text="5 on CPU, 2 on CUDA"))
    """How long the oldest queued text may wait for a batch to fill before it runs anyway. Unset: by device."""
    inline_lone: bool = True
    """A request alone in the server (one connection, nothing else queued or running) with one text read in
    one forward (any policy but windows) runs on the event loop, skipping the two thread hops to the inference
    thread and back (docs/serving.md says what they cost). Answers are the same; --no-inline-lone always hops."""
    max_queue: int = 1024
    """Most texts waiting for inference; beyond it requests get 429 with Retry-After."""
    max_inputs: int = 64
    """Most texts in one request."""
    max_chars: int = 20_000
    """Most characters in one text (longer token sequences are cut by the long-text policy, not refused)."""
    long_text: str | None = field(
        default=None, metadata=flag(metavar="POLICY", default_text="the variant's manifest, else head")
    )
    """Long-text policy of requests that name none: head, tail, head-tail[:H] or windows[:W[:S[:mean|max]]]."""
    threshold: float = 0.5
    """Multi-label models: the sigmoid score at and above which a label is `on` in /v1 answers (a request's
    `threshold` overrides it). Single-label and regression models have no threshold."""
    max_windows: int = MAX_WINDOWS
    """Most windows one text gets under a windows policy (more are spread over it; it is then truncated)."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted (413 beyond it)."""
    request_timeout_s: float = 60.0
    """A request still unanswered after this long gets 504 (guards against a stuck model)."""
    api_key: str | None = None
    """Bearer token ('Authorization: Bearer KEY') required on every route except health/ready/docs; None
    disables auth. Prefer the env var to the flag: command lines are visible to other local users."""
    model_name: str | None = field(default=None, metadata=flag(default_text="the variant's spec name"))
    """Name the model is served under (V2 routes, responses)."""
    model_repository: str | None = field(default=None, metadata=flag(metavar="ROOT"))
    """Serve every subdirectory of ROOT (each a variant or a model dir), named by its directory, instead of
    DIRs; POST /v2/repository/models/NAME/load (re)reads ROOT/NAME."""
    shadow: list[str] | None = field(default=None, metadata=flag(repeat=True, metavar="NAME=REFERENCE_DIR"))
    """Re-score a sample of model NAME's served texts with the variant in REFERENCE_DIR (e.g. its fp32
    export) on a thread of its own; rolling agreement and |dprob| go to /metrics and /v1/models, and a
    warning is logged when agreement falls under the variant's bench bar. Repeat per model."""
    shadow_rate: float = 0.05
    """Share of a shadowed model's served texts re-scored by its reference (0 < rate <= 1)."""
    shadow_threads: int = 1
    """Intra-op threads of each shadow reference (ONNX Runtime / OpenVINO; a torch reference shares torch's
    process-wide pool); its samples are dropped, and counted, while it cannot keep up."""
    allow_extra_files: bool = False
    """Serve a variant whose directory holds files its manifest does not list (refused by default)."""
    require_gate: bool = False
    """Serve only variants whose manifest holds a passing release gate (`qserve gate`); any other is refused,
    with why (never gated, or the reasons it failed), at start and on a repository load."""
    metrics_public: bool = False
    """Leave /metrics open without the API key (for a Prometheus scraper on a trusted network)."""
    header_timeout_s: float = 10.0
    """A connection must deliver a request's complete headers within this long (from connect, or from
    the request's first byte on a kept-alive connection), else it is closed (408)."""
    body_timeout_s: float = 30.0
    """A request's body must arrive completely within this long after its headers, else 408 + close."""
    keep_alive_s: float = 5.0
    """An idle kept-alive connection is closed after this long without a new request."""
    drain_seconds: float = 5.0
    """At SIGTERM (or SIGINT) /ready answers 503 at once and requests are still answered, each with Connection:
    close, for this long, while the orchestrator stops routing here; then the server stops accepting, answers what
    it accepted and exits (a second signal: at once). Keep it under terminationGracePeriodSeconds minus
    --header-timeout-s (docs/deploy.md). 0: stop at the signal."""
    max_connections: int = 512
    """Most open connections; beyond it a new connection gets 503 and is closed at once."""
    length_buckets: str = "auto"
    """Token lengths a variant that needs fixed shapes (ov-int8) pads each text to, e.g. 32,64,128: a batch runs
    as one forward per bucket and a text's bucket depends on its own length only, so its answer does not. auto:
    powers of two from 32, then max_length; off: every text at max_length. Variants that run unpadded ignore it."""
    max_batch_tokens: int | None = field(default=None, metadata=flag(default_text="no cap"))
    """Most rows x padded length in one forward; a larger batch runs as several forwards."""
    cuda_graphs: str = field(default=graphs.AUTO, metadata=flag(choices=graphs.MODES))
    """How a torch variant on CUDA runs: graphs (CUDA graphs captured at load per (batch, length) bucket, replayed),
    compile (torch.compile mode=reduce-overhead on the same buckets, compiled on first use), off (eager), auto
    (graphs where a short measurement at load finds them faster). CPU and other backends run as before; /v1/models
    says what runs and why (`execution`)."""
    grpc_port: int | None = field(default=None, metadata=flag(default_text="off"))
    """Also serve the KServe V2 gRPC API (tritonclient.grpc) on this port, beside HTTP, with the same model,
    limits, auth (metadata 'authorization: Bearer KEY') and metrics (0 = any free port; --engine uvicorn only)."""

    def validate(self) -> ServeConfig:
        def need(cond: bool, flag: str, msg: str) -> None:
            if not cond:
                raise QserveError(f"--{flag.replace('_', '-')} (or {ENV_PREFIX}{flag.upper()}) {msg}")

        need(
            self.max_batch_size is None or 1 <= self.max_batch_size <= 4096,
            "max_batch_size",
            f"must be 1..4096 (or unset: by device), got {self.max_batch_size}",
        )
        need(
            self.max_wait_ms is None or 0 <= self.max_wait_ms <= 10_000,
            "max_wait_ms",
            f"must be 0..10000 ms (or unset: by device), got {self.max_wait_ms}",
        )
        graphs.parse_mode(self.cuda_graphs)  # names --cuda-graphs and what it allows
        need(1 <= self.max_inputs <= 4096, "max_inputs", f"must be 1..4096, got {self.max_inputs}")
        need(
            self.max_queue >= self.max_inputs,
            "max_queue",
            f"must be >= --max-inputs ({self.max_inputs}) so a full request can ever fit, got {self.max_queue}",
        )
        need(self.max_chars >= 1, "max_chars", f"must be >= 1, got {self.max_chars}")
        need(
            not isinstance(self.threshold, bool) and 0 <= self.threshold <= 1,
            "threshold",
            f"must be a number in [0, 1], got {self.threshold}",
        )
        need(1 <= self.max_windows <= 256, "max_windows", f"must be 1..256, got {self.max_windows}")
        if self.long_text is not None:
            parse(self.long_text, f"--long-text (or {ENV_PREFIX}LONG_TEXT)")
        need(self.max_body_bytes >= 1024, "max_body_bytes", f"must be >= 1024, got {self.max_body_bytes}")
        need(self.request_timeout_s > 0, "request_timeout_s", f"must be > 0, got {self.request_timeout_s}")
        need(0 <= self.port <= 65535, "port", f"must be 0..65535, got {self.port}")
        need(self.threads is None or self.threads >= 1, "threads", f"must be >= 1, got {self.threads}")
        need(self.row_workers is None or self.row_workers >= 1, "row_workers", f"must be >= 1, got {self.row_workers}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            v = getattr(self, name)
            need(0 < v <= 3600, name, f"must be > 0 and <= 3600 seconds, got {v}")
        need(0 <= self.drain_seconds <= 3600, "drain_seconds", f"must be 0..3600 seconds, got {self.drain_seconds}")
        need(
            1 <= self.max_connections <= 1_000_000, "max_connections", f"must be 1..1000000, got {self.max_connections}"
        )
        need(0 < self.shadow_rate <= 1, "shadow_rate", f"must be > 0 and <= 1, got {self.shadow_rate}")
        need(self.shadow_threads >= 1, "shadow_threads", f"must be >= 1, got {self.shadow_threads}")
        for entry in self.shadow or []:
            name, sep, ref = entry.partition("=")
            need(
                bool(sep and name.strip() and ref.strip()),
                "shadow",
                f"takes NAME=REFERENCE_DIR (a served model's name, then the reference variant's dir), got {entry!r}",
            )
        need(
            not (self.variant_dir and self.model_repository),
            "model_repository",
            f"replaces DIRs: give DIRs ({self.variant_dir}) or --model-repository ({self.model_repository}), not both",
        )
        need(
            not (self.model_name and self.model_repository),
            "model_name",
            "names a single DIR's model; under --model-repository each model is named by its directory",
        )
        need(
            self.api_key is None or len(self.api_key) >= 8,
            "api_key",
            "must be at least 8 characters (or unset to disable auth)",
        )

        parse_buckets(self.length_buckets)  # names --length-buckets and what it allows
        need(
            self.max_batch_tokens is None or self.max_batch_tokens >= 2,
            "max_batch_tokens",
            f"must be >= 2 tokens (or unset for no cap), got {self.max_batch_tokens}",
        )
        need(
            self.grpc_port is None or 0 <= self.grpc_port <= 65535,
            "grpc_port",
            f"must be 0..65535 (or unset: no gRPC), got {self.grpc_port}",
        )
        need(
            self.grpc_port is None or self.grpc_port == 0 or self.grpc_port != self.port,
            "grpc_port",
            f"must differ from --port ({self.port})",
        )
        return self

    def for_device(self, device: str | None = None) -> ServeConfig:
        """This config with the batcher sized for `device` (default: --device) where --max-batch-size and
        --max-wait-ms (or their env vars) leave it unset: BATCHING's row for a CUDA device or a CPU. `auto` asks
        whether a GPU is usable (devices.cuda_available: imports torch, which loading the model does anyway)."""
        if self.max_batch_size is not None and self.max_wait_ms is not None:
            return self
        sized = BATCHING[device_kind(device or self.device)]
        return dataclasses.replace(
            self,
            max_batch_size=self.max_batch_size or sized.max_batch_size,
            max_wait_ms=sized.max_wait_ms if self.max_wait_ms is None else self.max_wait_ms,
        )

    @property
    def batch_size(self) -> int:
        """max_batch_size once for_device() has sized it (the CPU row before: what a config file says by default)."""
        return self.max_batch_size or BATCHING["cpu"].max_batch_size

    @property
    def wait_ms(self) -> float:
        """max_wait_ms once for_device() has sized it (the CPU row before)."""
        return BATCHING["cpu"].max_wait_ms if self.max_wait_ms is None else self.max_wait_ms


@dataclass(frozen=True)
class Batching:
    """The dynamic batcher's size on one kind of device."""

    max_batch_size: int
    max_wait_ms: float


BATCHING = {"cpu": Batching(max_batch_size=32, max_wait_ms=5.0), "cuda": Batching(max_batch_size=256, max_wait_ms=2.0)}
"""The batcher by device, where the flags leave it. A CPU's forward grows with its batch, so 32 texts and 5 ms
keep a batch's wait beside its compute; a GPU replays a 256-row graph in about the time of a few rows (CUDA graphs:
qserve/runtime/graphs.py), so it takes what a busy server gathers, and waits less for it (2 ms), its forward being
short. Both are ceilings: a batch runs as soon as nobody else is on the way (batcher.py)."""


def device_kind(device: str, probe: bool = True) -> str:
    """ "cuda" or "cpu": which BATCHING row `device` (cpu, cuda, cuda:N, auto) gets; `auto` is a GPU when one is
    usable (probe=False: `auto` counts as CPU, for callers that must not import torch)."""
    if device.startswith("cuda"):
        return "cuda"
    if device == "auto" and probe:
        return "cuda" if cuda_available() else "cpu"
    return "cpu"


def settings_batch_size(settings: Mapping[str, object]) -> int:
    """The batch a Ray deployment's options are sized for: the settings' max_batch_size, else BATCHING's row for
    their device (a driver does not probe for a GPU, so `auto` counts as CPU here; each replica sizes its own
    batcher for the device it finds)."""
    given = settings.get("max_batch_size")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return given
    return BATCHING[device_kind(str(settings.get("device") or "auto"), probe=False)].max_batch_size


def config_from_sources(
    flags: argparse.Namespace | Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> ServeConfig:
    """Defaults, then QSERVE_<FIELD> env vars, then flags that were given (not None); validated."""
    environ = os.environ if environ is None else environ
    return build(ServeConfig, flags or {}, environ=environ, env_prefix=ENV_PREFIX, error=QserveError).validate()
