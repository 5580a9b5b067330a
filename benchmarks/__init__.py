"""Benchmark suites and the committed reference reports; every script runs as a module of this package.

    python -m benchmarks.render.rebuild          # the `make reports` stages (benchmarks/render/stages.py)

The top level holds the maintained suites only: rerun as the code changes, each `python -m benchmarks.NAME` with
one `main(argv) -> int` over benchmarks.harness (a suite's parts run as its children or are imported by it):

    serve_bench.py           what dynamic batching buys and what the HTTP layer costs
    serve_engines.py         part of serve_bench: uvicorn against Ray Serve replicas (--engine ray)
    trivial_app.py           part of serve_engines: an app with no model, the HTTP layer's own cost
    serve_overhead.py        what a request costs beyond the model, by the server's own CPU time
    bare_server.py           part of serve_overhead: the floor, a bare HTTP server with the model inline
    inproc.py                part of serve_overhead: the runtime timed in one process
    serve_steps.py           part of serve_overhead: where a request's time goes, from the server's trace spans
    serve_protocol_cost.py   one request on each protocol's route at one client, the code before and after
    serve_protocols.py       one text, one answer across protocols, and what new routes cost the old ones
    flood_bench.py           overload: do admitted requests wait behind refusals?
    lifecycle_bench.py       shadow agreement's cost, a hot swap's latency and memory
    predict_bench.py         `qserve predict` over a corpus against the model-bound ceiling
    crosscheck.py            qserve bench's timings against plain onnxruntime / torch loops
    bench_repeat.py          does `qserve bench` give the same answer twice? N consecutive runs, one verdict
    repair_bench.py          every int8 and 4-bit variant of a run repaired, gated and benched beside its repair
    image_report.py          the serving image: size, no torch, container start to ready, the toolkit image's run
    gpu_*                    the GPU check on a GPU machine (docs/gpu.md): gpu_check.sh and its parts

Beside them: harness/ (what the suites share: servers, review texts, /metrics, load clients, rounds, the
repository root, report writing), render/ (the docs' rendering: `make reports`' stages and runner, the measured
blocks of README and docs/, the bring-your-own-model page), studies/ (finished one-off studies, each named after
its question, indexed in studies/README.md) and reports/ (the committed reports of suites and studies alike, where
render/ reads them). Nothing outside tests imports this package (the import contracts in pyproject.toml); it
imports qserve and exporters.
"""
