"""The OpenAPI document against the live server's behaviour: schemathesis, all checks, 0 failures.

    python -m pytest tests/integration/test_serve_openapi.py -q

schemathesis runs as its own CLI (`schemathesis run URL/openapi.json --checks all`) against a
real uvicorn serving the tiny variant; examples per operation are bounded and the seed is
fixed, so the run is reproducible and stays well under two minutes on 2 cores.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import serving

httpx2 = pytest.importorskip("httpx2")
pytest.importorskip("schemathesis")

MAX_EXAMPLES = 12


@pytest.fixture(scope="module")
def server(tiny_variant):
    from qserve.serve.infra.config import ServeConfig

    # Small limits keep generated bodies small; the body limit fits the largest valid request
    # (8 texts x 200 characters, each up to 12 bytes as a JSON \\u escape pair), so every schema-valid
    # body is accepted, as the document promises.
    cfg = ServeConfig(
        variant_dir=str(tiny_variant), threads=1, max_inputs=8, max_chars=200, max_queue=256, max_body_bytes=64 * 1024
    )
    with serving(cfg) as srv:
        yield srv


def test_openapi_states_the_limits(server):
    spec = httpx2.get(server.url + "/openapi.json", trust_env=False).json()
    req = spec["components"]["schemas"]["ClassifyRequest"]["properties"]["inputs"]["anyOf"]
    text, texts = req  # a one-text model: no {text, text_pair} form (serve/core/pairs.py publish_inputs)
    assert text["minLength"] == 1 and text["maxLength"] == 200 and "pattern" in text
    assert texts["minItems"] == 1 and texts["maxItems"] == 8 and "TextPair" not in str(req)
    assert all(p["maxLength"] == 200 for p in spec["components"]["schemas"]["TextPair"]["properties"].values())
    assert spec["components"]["schemas"]["V2InputTensor"]["properties"]["name"]["enum"] == ["text"]
    assert spec["components"]["schemas"]["V2RequestedOutput"]["properties"]["name"]["enum"] == [
        "probabilities",
        "label",
        "truncated",
    ]
    ready = spec["paths"]["/v2/models/{name}/ready"]["get"]["responses"]
    assert {"200", "404", "503"} <= set(ready)
    assert "/v2/models/{name}/config" in spec["paths"]


def test_schemathesis_all_checks_pass(server, tmp_path):
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert exe, "schemathesis CLI missing: `make test` installs it with the dev extra"
    # Every /v2/models/{name}/... operation gets the served model's name (and version), so
    # schemathesis tests them beyond their 404 for unknown names, inference included: the document
    # lists every valid shape/data pairing, so a generated valid body really is one. Repository load and
    # unload change what is served (test_serve_lifecycle.py covers them): left out here.
    (version,) = httpx2.get(server.url + "/v2/models/torch-fp32", trust_env=False).json()["versions"]
    config = tmp_path / "schemathesis.toml"
    # TEI's routes answer a refused input 413 (TEI's Validation error: too many inputs, a text past max_length
    # with truncate=false), which a stock TEI client expects: schemathesis counts it as a rejection there.
    statuses = (
        "checks.negative_data_rejection.expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, "
        '422, 428, 429, "5XX"]\n'
        'checks.positive_data_acceptance.expected-statuses = ["2XX", "3XX", 401, 403, 404, 409, 413, 429, '
        '"5XX"]\n'
    )
    tei = (
        '[[operations]]\ninclude-path-regex = "^/(predict|tokenize|decode)$"\n'
        + statuses
        + '[[operations]]\ninclude-path-regex = "^/$"\n'
        + statuses
    )
    config.write_text(
        '[[operations]]\ninclude-path-regex = "^/v2/models/"\n'
        f'parameters = {{ "path.name" = "torch-fp32", "path.version" = "{version}" }}\n' + tei
    )
    cmd = [
        exe,
        "--config-file",
        str(config),
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        "all",
        "--exclude-path-regex",
        "^/v2/repository/models/",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        "14",
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--no-color",
        "--request-timeout",
        "30",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "No issues found" in out or " passed" in out, out[-3000:]
    assert " 0 passed" not in out and "Tested: 25" in out, out[-3000:]
    # The generated valid requests really reached the model on both APIs.
    import re

    metrics = httpx2.get(server.url + "/metrics", trust_env=False).text
    for route in ("/v1/classify", "/v2/models/{name}/infer"):
        series = r'qserve_requests_total\{method="POST",model="torch-fp32",route="%s",status="200"\} ([0-9.e+]+)'
        m = re.search(series % re.escape(route), metrics)
        assert m and float(m.group(1)) >= 1, (route, [ln for ln in metrics.splitlines() if route in ln][:8])
