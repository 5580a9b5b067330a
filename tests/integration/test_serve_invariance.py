"""End to end: a served onnx-int8, batching on, answers 64 concurrent clients exactly as one at a time.

    python -m pytest tests/integration/test_serve_invariance.py -q

Real uvicorn (ServerThread) on a random port, the tiny model's onnx-int8 (ORT dynamic quantization:
one activation scale per batch). The sequential pass sends each text alone; then 64 clients at
once, so the batcher packs short texts next to 64-token ones. The same run against a server whose
runtime forwards the batch as one (RuntimeOptions(batch_dependent="batched")) shows the check bites.
"""

from __future__ import annotations

import asyncio

import pytest

httpx2 = pytest.importorskip("httpx2")
pytest.importorskip("onnxruntime")


def _texts() -> list[str]:
    from qserve.loadtest import default_texts

    short = default_texts(48)
    long = [f"{t} " * (3 + i % 5) for i, t in enumerate(short[:16])]  # 40-64+ tokens: pads the short ones
    return [x for pair in zip(short[:32], short[32:] + long) for x in pair][:64]


def _serve_and_compare(variant, batch_dependent: str, row_workers: int = 1) -> tuple[int, float, int, int]:
    """(label differences, max |Δscore|, forwards, of them run in lanes) of 64 concurrent clients vs the
    sequential pass."""
    from prometheus_client.parser import text_string_to_metric_families

    from qserve.runtime import RuntimeOptions, load_runtime
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    texts = _texts()
    cfg = ServeConfig(variant_dir=str(variant), threads=1, max_batch_size=32, max_wait_ms=50)
    app = create_app(
        cfg,
        loader=lambda c: load_runtime(
            c.variant_dir, "cpu", RuntimeOptions(threads=1, batch_dependent=batch_dependent, row_workers=row_workers)
        ),
    )
    with ServerThread(app) as srv, httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c:
        for _ in range(300):
            if c.get("/ready").status_code == 200:
                break
            import time

            time.sleep(0.05)
        seq = [c.post("/v1/classify", json={"inputs": t, "top_k": None}).json()["predictions"][0] for t in texts]

        def forwards() -> tuple[float, float]:
            fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
            return (
                next(s.value for s in fams["qserve_batch_size"].samples if s.name == "qserve_batch_size_count"),
                sum(s.value for s in fams["qserve_lane_batches"].samples if s.name == "qserve_lane_batches_total"),
            )

        before = forwards()

        async def go():
            async with httpx2.AsyncClient(
                base_url=srv.url, timeout=60, trust_env=False, limits=httpx2.Limits(max_connections=64)
            ) as ac:
                return await asyncio.gather(
                    *(ac.post("/v1/classify", json={"inputs": t, "top_k": None}) for t in texts)
                )

        responses = asyncio.run(go())
        after = forwards()
        n_forwards, n_lanes = int(after[0] - before[0]), int(after[1] - before[1])
    assert [r.status_code for r in responses] == [200] * len(texts)
    conc = [r.json()["predictions"][0] for r in responses]
    flips, worst = 0, 0.0
    for a, b in zip(seq, conc):
        sa, sb = {p["label"]: p["score"] for p in a}, {p["label"]: p["score"] for p in b}
        flips += int(max(sa, key=sa.get) != max(sb, key=sb.get))
        worst = max(worst, max(abs(sa[k] - sb[k]) for k in sa))
    return flips, worst, n_forwards, n_lanes


@pytest.mark.parametrize("row_workers", [1, 2])  # 2: a batch's rows run side by side (the default on 2 cores)
def test_served_onnx_int8_answers_64_concurrent_clients_as_the_sequential_pass(tiny_onnx_int8, row_workers):
    """With 2 row workers the concurrent clients' batches run in lanes (two at once, each on one single-threaded
    worker; the lone sequential requests on both): the answers are the same."""
    flips, worst, forwards, lanes = _serve_and_compare(tiny_onnx_int8, "rows", row_workers)
    assert forwards < 64, "64 concurrent requests were never batched"
    assert flips == 0 and worst <= 1e-5, f"{flips} label differences, max |Δscore| {worst:.3g}"
    if row_workers == 1:
        assert lanes == 0  # --row-workers 1: no lanes
    else:
        assert 0 < lanes <= forwards


def test_the_same_check_catches_a_server_whose_answers_move_with_batchmates(tiny_onnx_int8):
    flips, worst, forwards, _ = _serve_and_compare(tiny_onnx_int8, "batched")
    assert forwards < 64
    assert worst > 1e-5  # the per-batch graph forwarded as one batch: scores move with batchmates


def test_row_workers_setting_reaches_every_engine_and_names_its_flag():
    from qserve import QserveError
    from qserve.serve.infra.config import config_from_sources
    from qserve.serve.infra.deploy import app_args

    assert config_from_sources({}, {"QSERVE_ROW_WORKERS": "2"}).row_workers == 2
    assert config_from_sources({"row_workers": 1}, {"QSERVE_ROW_WORKERS": "2"}).row_workers == 1  # flag wins
    with pytest.raises(QserveError, match=r"--row-workers \(or QSERVE_ROW_WORKERS\) must be >= 1, got 0"):
        config_from_sources({"row_workers": 0}, {})
    # Ray replicas build their ServeConfig from these settings (qserve deploy ray, --engine ray).
    assert app_args("/abs/v", {"row_workers": 2, "threads": 2})["row_workers"] == 2
