"""In a real headless browser (the system's chromium + chromedriver, driven by selenium): the served
models' page at / and report.html opened from disk.

    python -m pytest tests/e2e/test_browser.py -q

`make test` installs chromium and chromium-driver with apt when it runs as root. Without them these
tests skip and say why, except under CI (CI=true), where a skip would hide a broken page: they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from conftest import serving

httpx2 = pytest.importorskip("httpx2")

KEY = "page-key-5b1c9e"
REVIEW = "A warm, funny film with a clever script; the cast is superb and I would happily watch it again."
EMBEDDED = Path(__file__).resolve().parents[2] / "benchmarks" / "reports" / "embedded-default" / "report.json"
# what that committed report recommends (ov-int8 or ov-bf16, by the run): never torch-fp32, which the tests serve
RECOMMENDED = json.loads(EMBEDDED.read_text(encoding="utf-8"))["recommended"]["variant"]


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser test cannot run under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def driver():
    try:
        from benchmarks.report_screen import chromium  # selenium, a dev extra

        d = chromium()
    except ImportError:
        _unavailable("selenium is not installed (pip install -e '.[dev]')")
    except RuntimeError as e:
        _unavailable(str(e))
    yield d
    d.quit()


def _errors(d) -> list[dict]:
    return [e for e in d.get_log("browser") if e["level"] == "SEVERE"]


def _wait(d, predicate, what: str, timeout: float = 30.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(d, timeout).until(lambda _: predicate(), message=what)


@pytest.fixture(scope="module")
def run_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    """A `qserve pipeline` run dir: variants/torch-fp32 (the tiny model) and report/report.json (the embedded
    default's real report, which recommends RECOMMENDED: so the page must say torch-fp32 is not the recommendation)."""
    assert RECOMMENDED != "torch-fp32"
    import exporters

    run = tmp_path_factory.mktemp("run")
    exporters.export(tiny_checkpoint, "torch-fp32", run / "variants" / "torch-fp32")
    (run / "report").mkdir()
    shutil.copy(EMBEDDED, run / "report" / "report.json")
    return run


@pytest.fixture(scope="module")
def keyed_server(run_dir):
    from qserve.serve.infra.config import ServeConfig

    cfg = ServeConfig(variant_dir=str(run_dir / "variants" / "torch-fp32"), threads=1, api_key=KEY)
    with serving(cfg) as srv:
        yield srv


def test_page_is_open_holds_no_model_data_and_fetches_nothing(keyed_server):
    with httpx2.Client(base_url=keyed_server.url, timeout=30, trust_env=False) as c:
        r = c.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        page = r.text
        csp = r.headers["content-security-policy"]
        assert (
            "default-src 'none'" in csp
            and "connect-src 'self'" in csp
            and "unsafe-inline" not in csp.split("style-src")[0]
        )
        assert "http://" not in page and "https://" not in page  # no external asset of any kind
        assert "torch-fp32" not in page and "tiny-distilbert" not in page and KEY not in page
        assert 'data-auth="required"' in page
        # every JSON route still needs the key, the new one included
        assert c.get("/v1/report").status_code == 401 and c.get("/v1/models").status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        rep = c.get("/v1/report", headers=auth).json()
        assert rep["served"] == "torch-fp32" and rep["recommended"] == RECOMMENDED
        assert rep["served_is_recommended"] is False and rep["measured_files_match"] is None
        # the served variant, the recommended one, then every other candidate that meets its bar, in ranked order
        ranked = json.loads(EMBEDDED.read_text())["recommended"]["ranking"]
        candidates = [
            r["variant"] for r in ranked if r.get("meets_bar") and r["variant"] not in ("torch-fp32", RECOMMENDED)
        ]
        assert candidates and [row["variant"] for row in rep["rows"]] == ["torch-fp32", RECOMMENDED, *candidates]
        assert rep["rows"][1]["p50_ms"] == pytest.approx(json.loads(EMBEDDED.read_text())["recommended"]["p50_ms"])
        # a page: HTML, open (POST / beside it is TEI's predict: serve/protocols/tei.py)
        page_op = c.get("/openapi.json", headers=auth).json()["paths"]["/"]["get"]
        assert list(page_op["responses"]["200"]["content"]) == ["text/html"] and page_op["security"] == []


def test_page_asks_for_the_key_classifies_and_shows_why(driver, keyed_server):
    from selenium.webdriver.common.by import By

    d = driver
    d.get(keyed_server.url + "/")
    _wait(d, lambda: d.find_element(By.ID, "keybox").is_displayed(), "the page never asked for the API key")
    d.find_element(By.ID, "key").send_keys(KEY)
    d.find_element(By.ID, "keysubmit").click()
    _wait(d, lambda: "torch-fp32" in d.find_element(By.ID, "models").text, "the served model never showed")
    models = d.find_element(By.ID, "models").text
    assert "negative, positive" in models and "64 tokens" in models and "tiny-distilbert" in models
    # the long-text policy /v1/models reports, in words
    assert "head: a text longer than 64 tokens is read as the first 64 tokens" in models
    _wait(d, lambda: RECOMMENDED in d.find_element(By.ID, "report").text, "the recommendation never showed")
    assert "serves torch-fp32 instead" in d.find_element(By.ID, "report").text

    d.find_element(By.ID, "text").send_keys(REVIEW)
    d.find_element(By.ID, "classify").click()
    _wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#result .label"), "no label after classifying")
    shown = d.find_element(By.CSS_SELECTOR, "#result .label").text
    with httpx2.Client(base_url=keyed_server.url, timeout=30, trust_env=False) as c:
        api = c.post("/v1/classify", json={"inputs": REVIEW}, headers={"Authorization": f"Bearer {KEY}"}).json()
    assert shown == api["predictions"][0][0]["label"]
    read = d.find_element(By.CSS_SELECTOR, "#result .read").text
    assert read == f"{api['tokens'][0]} tokens, read under head"

    # a long text under the windows policy chosen on the page: the answer says how it was read
    from selenium.webdriver.support.ui import Select

    Select(d.find_element(By.ID, "policy")).select_by_value("windows")
    d.find_element(By.ID, "text").send_keys(" " + REVIEW * 6)
    d.find_element(By.ID, "classify").click()
    _wait(
        d,
        lambda: (
            "windows"
            in d.execute_script("const r = document.querySelector('#result .read'); return r ? r.textContent : ''")
        ),
        "the page never said the text was read as windows",
    )
    with httpx2.Client(base_url=keyed_server.url, timeout=30, trust_env=False) as c:
        api = c.post(
            "/v1/classify",
            json={"inputs": REVIEW + " " + REVIEW * 6, "long_text": "windows"},
            headers={"Authorization": f"Bearer {KEY}"},
        ).json()
    assert api["windows"][0] > 1
    assert (
        d.find_element(By.CSS_SELECTOR, "#result .read").text
        == f"{api['tokens'][0]} tokens, read under {api['long_text']} as {api['windows'][0]} windows"
    )
    # the counters come from /metrics: the page's own classification is counted
    _wait(d, lambda: d.find_element(By.ID, "m-requests").text not in ("–", "0"), "counters never updated")
    assert "ms" in d.find_element(By.ID, "m-latency").text
    assert _errors(d) == []


def test_report_html_opens_from_disk_without_errors(driver, tmp_path):
    from selenium.webdriver.common.by import By

    from qserve.cli import main

    assert main(["report", str(EMBEDDED), "--out", str(tmp_path)]) == 0
    d = driver
    d.get((tmp_path / "report.html").as_uri())
    rec = json.loads(EMBEDDED.read_text())["recommended"]["variant"]
    assert rec in d.find_element(By.ID, "recommended").text
    loaded = d.execute_script("return [...document.images].map(i => i.complete && i.naturalWidth > 0)")
    assert len(loaded) == 3 and all(loaded)
    assert _errors(d) == []


@pytest.mark.parametrize("which", ["embedded-default", "pipeline-auto-zen4", "pipeline-auto-xeon"])
def test_report_html_opens_on_its_verdict_and_summary_table(driver, tmp_path, which):
    """At 1280x800 the verdict sentence and the summary table lie inside the first screen; the screenshot is what
    `python -m benchmarks.report_screen REPORT_DIR` saves beside a committed report."""
    from benchmarks.report_screen import HEIGHT, SHOT, WIDTH, first_screen, inside
    from qserve.bench import analysis
    from qserve.bench.report import write_reports

    report = json.loads((EMBEDDED.parents[1] / which / "report.json").read_text(encoding="utf-8"))
    analysis.apply_gates(report, {})  # every verdict by today's rule, on the report's own measurements
    write_reports(report, tmp_path)
    boxes = first_screen(driver, tmp_path / "report.html", tmp_path / SHOT)
    assert (boxes["width"], boxes["height"]) == (WIDTH, HEIGHT) and inside(boxes), boxes
    assert boxes["verdict"]["bottom"] <= boxes["table"]["top"]  # the sentence first, then the table
    png = (tmp_path / SHOT).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (WIDTH, HEIGHT)
    assert _errors(driver) == []
