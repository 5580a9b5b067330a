"""Benchmark suites and the committed reference reports; every script runs as a module of this package.

    python -m benchmarks.render.rebuild          # the `make reports` stages (benchmarks/render/stages.py)

The top level holds the maintained suites only: rerun as the code changes, each `python -m benchmarks.NAME` with
one `main(argv) -> int` over benchmarks.harness. A suite with parts is a package: its __main__.py is the suite, its
parts (run as its children or imported by it) are the modules beside it:

    serve_bench/             what dynamic batching buys and what the HTTP layer costs
        engines.py           uvicorn against Ray Serve replicas (--engine ray)
        trivial_app.py       an app with no model, the HTTP layer's own cost (engines' baseline rows)
    serve_overhead/          what a request costs beyond the model, by the server's own CPU time
        bare_server.py       the floor, a bare HTTP server with the model inline
        inproc.py            the runtime timed in one process
        steps.py             where a request's time goes, from the server's trace spans
    serve_protocol_cost.py   one request on each protocol's route at one client, the code before and after
    serve_protocols.py       one text, one answer across protocols, and what new routes cost the old ones
    flood_bench.py           overload: do admitted requests wait behind refusals?
    drain_bench.py           nothing lost at shutdown: SIGTERMs under load, venv server, image and --workers 2
    lifecycle_bench.py       shadow agreement's cost, a hot swap's latency and memory
    predict_bench.py         `qserve predict` over a corpus against the model-bound ceiling
    crosscheck.py            qserve bench's timings against plain onnxruntime / torch loops
    bench_repeat.py          does `qserve bench` give the same answer twice? N consecutive runs, one verdict
    report_screen.py         a bench report's first screen in Chromium at 1280x800: verdict and table in it
    repair_bench.py          every int8 and 4-bit variant of a run repaired, gated and benched beside its repair
    image_report.py          the serving image: size, no torch, container start to ready, the toolkit image's run
    gpu/                     the GPU check on a GPU machine (docs/gpu.md): `bash benchmarks/gpu/check.sh A|B`
        check.sh             the two calls, each stage a child under its time limit, at most 8 files out
        wheels.sh            packs here (PyPI reachable) what check.sh installs there
        stage.py             one stage's report kept as it goes, its verdict, the preflight, the logs' tails
        serving.py           CUDA graphs eager against captured, then served (call B); the user's serve (call A)
        tools.py             the CLI: pack, unpack, probe the machine (env), summarise a call
        pack.py              the wheels re-packed small enough to travel (tools' pack-dist, slim-wheel, unpack)
        summary.py           a call's summary.md and gpu_check.json (tools' summary)

Beside them: harness/ (what the suites share: servers, review texts, /metrics, load clients, rounds, the
repository root, report writing), render/ (the docs' rendering: `make reports`' stages and runner, the measured
blocks of README and docs/, the bring-your-own-model page), studies/ (finished one-off studies, each named after
its question, indexed in studies/README.md) and reports/ (the committed reports of suites and studies alike, where
render/ reads them; indexed in reports/README.md). Nothing outside tests imports this package (the import
contracts in pyproject.toml); it imports qserve and exporters.
"""
