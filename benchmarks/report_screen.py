"""A bench report's first screen in a real Chromium at 1280x800: where the verdict and the summary table lie, and a
screenshot of it saved beside the report.

    python -m benchmarks.report_screen benchmarks/reports/pipeline-auto-zen4     # -> first-screen.png there

Drives the system's chromium through chromedriver (selenium), as tests/e2e/test_browser.py does; exits 1 when the
verdict or the summary table reaches past the first screen.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

WIDTH, HEIGHT = 1280, 800
SHOT = "first-screen.png"
BOXES = """
const box = e => { const r = e.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right,
                   bottom: r.bottom}; };
return {verdict: box(document.getElementById('recommended')), table: box(document.querySelector('main table')),
        width: window.innerWidth, height: window.innerHeight};
"""


def chromium() -> Any:
    """A headless Chromium under selenium; RuntimeError saying why when none can start here."""
    names = ("chromium", "chromium-browser", "google-chrome")
    browser = next((shutil.which(n) for n in names if shutil.which(n)), None)
    chromedriver = shutil.which("chromedriver")
    if not browser or not chromedriver:
        raise RuntimeError("no chromium/chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-proxy-server"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1400,1800")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:  # an explicit driver path: selenium-manager would otherwise try to download one
        return webdriver.Chrome(service=Service(chromedriver), options=opts)
    except Exception as e:  # a browser that cannot start here (no shared memory, a broken install)
        raise RuntimeError(f"chromium did not start: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def first_screen(driver: Any, html: Path, shot: Path | None = None) -> dict[str, Any]:
    """Open `html` in a WIDTH x HEIGHT viewport: the verdict's and the summary table's boxes (CSS pixels) and the
    viewport's size; the screenshot of that screen into `shot`, if given."""
    metrics = {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        driver.get(Path(html).resolve().as_uri())
        boxes = driver.execute_script(BOXES)
        if shot is not None:
            driver.save_screenshot(str(shot))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return boxes


def inside(boxes: dict[str, Any]) -> bool:
    """Whether the verdict and the summary table lie wholly inside the first screen."""
    return all(
        b["left"] >= 0 and b["top"] >= 0 and b["right"] <= boxes["width"] and b["bottom"] <= boxes["height"]
        for b in (boxes["verdict"], boxes["table"])
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report_dir", type=Path, help="a bench report's directory (holding report.html)")
    args = p.parse_args(argv)
    try:
        driver = chromium()
    except RuntimeError as e:
        print(f"report_screen: {e}", file=sys.stderr)
        return 2
    try:
        boxes = first_screen(driver, args.report_dir / "report.html", args.report_dir / SHOT)
    finally:
        driver.quit()
    ok = inside(boxes)
    print(
        f"{args.report_dir / SHOT}: {boxes['width']}x{boxes['height']}, verdict bottom {boxes['verdict']['bottom']:.0f}"
        f" px, summary table bottom {boxes['table']['bottom']:.0f} px: "
        + ("both inside the first screen" if ok else "NOT inside the first screen")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
