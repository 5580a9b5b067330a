"""End to end: a served, length-bucketed ov-int8 answers 32 concurrent clients exactly as one at a time.

    python -m pytest tests/integration/test_serve_buckets.py -q

The tiny fixture exported as ov-int8 (as tests/integration/test_openvino.py builds it; skipped with OpenVINO's
"unavailable on this CPU" reason where its probe fails), served by the real app under uvicorn with
the default --length-buckets auto (32,64 for the fixture's max_length 64) and batching on. The
sequential pass sends each text alone; then 32 clients at once, with short and long texts mixed, so
each batch holds texts of both buckets. Every score must be bit-identical, and the server must really
have batched (fewer forwards than requests) and run both buckets.
"""

from __future__ import annotations

import asyncio
import time

import pytest

httpx2 = pytest.importorskip("httpx2")
pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("optimum.intel")


@pytest.fixture(scope="module")
def ov_int8(tiny_checkpoint, tmp_path_factory):
    import exporters
    from qserve.runtime import ov_probe

    out = tmp_path_factory.mktemp("served") / "ov-int8"
    try:
        exporters.export(tiny_checkpoint, "ov-int8", out, options={"calibration_samples": 16})
    except ov_probe.OpenVINOUnavailable as e:
        pytest.skip(str(e))
    return out


def _texts() -> list[str]:
    from qserve.loadtest import default_texts

    short = default_texts(32)  # 10-40 tokens
    long = [f"{t} " * (2 + i % 3) for i, t in enumerate(short)]  # 40-64 (truncated) tokens
    return [x for pair in zip(short, long) for x in pair]


def _forwards(c) -> tuple[float, float, float]:
    """(batches, texts in them, batches run in lanes) so far, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
    vals = {s.name: s.value for s in fams["qserve_batch_size"].samples}
    lanes = sum(s.value for s in fams["qserve_lane_batches"].samples if s.name == "qserve_lane_batches_total")
    return vals["qserve_batch_size_count"], vals["qserve_batch_size_sum"], lanes


# threads=2: two row workers, so the concurrent clients' batches run in lanes (two at once, each whole on one
# single-threaded stream) while the sequential pass's lone requests run on the 2-thread stream
@pytest.mark.parametrize("threads", [1, 2])
def test_bucketed_ov_int8_answers_alike_sequential_and_32_way_concurrent(ov_int8, threads):
    import torch

    from qserve.runtime import load_runtime
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    texts = _texts()
    shapes: list[int] = []

    def loader(cfg):  # the real loader's runtime, with each forward's padded length noted
        from qserve.serve.core.state import load_model

        rt = load_model(cfg)
        forward = rt.forward
        rt.forward = lambda b: shapes.append(b["input_ids"].shape[1]) or forward(b)
        return rt

    threads = torch.get_num_threads()
    cfg = ServeConfig(variant_dir=str(ov_int8), device="cpu", threads=threads, max_batch_size=32, max_wait_ms=50)
    try:
        with (
            ServerThread(create_app(cfg, loader=loader)) as srv,
            httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c,
        ):
            deadline = time.monotonic() + 60
            while c.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.get("/v1/models").json()["models"][0]["length_buckets"] == [32, 64]
            seq = [c.post("/v1/classify", json={"inputs": t}).json()["predictions"][0] for t in texts]
            n0, s0, l0 = _forwards(c)
            shapes.clear()

            async def go():
                async with httpx2.AsyncClient(
                    base_url=srv.url, timeout=60, trust_env=False, limits=httpx2.Limits(max_connections=32)
                ) as ac:
                    sem = asyncio.Semaphore(32)  # 32 clients in flight at once

                    async def one(t):
                        async with sem:
                            return await ac.post("/v1/classify", json={"inputs": t})

                    return await asyncio.gather(*(one(t) for t in texts))

            responses = asyncio.run(go())
            n1, s1, l1 = _forwards(c)
    finally:
        torch.set_num_threads(threads)
    assert [r.status_code for r in responses] == [200] * len(texts)
    conc = [r.json()["predictions"][0] for r in responses]
    assert conc == seq  # labels and scores, bit for bit
    assert n1 - n0 < len(texts) and (s1 - s0) / (n1 - n0) > 1  # batches were formed
    assert (l1 - l0 > 0) if threads == 2 else (l1 == 0)  # in lanes with two row workers, never with one
    assert set(shapes) == {32, 64}  # and ran one forward per bucket
    # the bucketed scores are ov-int8's own: the same as the runtime computes for each text alone
    rt = load_runtime(ov_int8, "cpu")
    alone = [rt.predict([t])[0] for t in texts[:6]]
    labels = rt.labels
    for want, got in zip(alone, seq[:6]):
        assert {p["label"]: p["score"] for p in got} == pytest.approx(dict(zip(labels, map(float, want))), abs=1e-6)


def test_serve_buckets_benchmark_runs_on_the_tiny_fixture(tiny_onnx_int8, ov_int8, tmp_path):
    # The benchmark script end to end, seconds long: every server (the baseline from this commit's own code),
    # both text sets, both protocols; the lead runs it for real with the command in its docstring.
    from benchmarks.studies import serve_buckets as sb

    out = tmp_path / "report"
    rc = sb.main(
        [
            str(tiny_onnx_int8),
            str(ov_int8),
            "--baseline-ref",
            "HEAD",
            "--duration",
            "0.3",
            "--rounds",
            "1",
            "--sentences",
            "6",
            "--reviews",
            "6",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    rep = __import__("json").loads((out / "report.json").read_text())
    assert rc == 0 and rep["summary"]["mismatched"] == rep["summary"]["errors"] == rep["summary"]["lost"] == 0
    assert rep["servers"]["ov-int8"]["length_buckets"] == [32, 64]
    assert rep["servers"]["ov-int8 padded"]["length_buckets"] == [64]
    cells = rep["summary"]["cells"]
    assert len(cells) == 2 * 2 * 5 and all(c["requests"] > 0 for c in cells.values())
    comp = rep["summary"]["comparisons"]["sentences | c32"]
    assert all(
        comp[k]["ratio"] > 0
        for k in (
            "ov_buckets_over_onnx_int8",
            "grpc_over_http",
            "tracing_off_over_baseline",
            "ov_buckets_over_ov_padded",
        )
    )
    md = (out / "report.md").read_text()
    assert "by `python -m benchmarks.studies.serve_buckets " in md  # provenance: the command, commit and CPU
    assert "| sentences | 32 |" in md and "gRPC / HTTP" in md
