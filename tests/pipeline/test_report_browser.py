"""reports/eval.html as the micro pipeline writes it, opened in a real headless browser (Debian's chromium):
no console or script errors, every image loaded, nothing fetched from outside the file, the tables, maps,
figures and gallery present, gallery cards of bounded height, and a screenshot written."""

from __future__ import annotations

import base64
import io

import yaml
from browser_check import check_page
from PIL import Image

# A card holds a thumbnail (<= 192 px), a few lines of text and one answer box (<= 7.5em) per policy: far below
# this, while a card stretched by a garbage answer of many lines ran to a screen or more.
MAX_CARD_PX = 900


def _png_data_uri() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 30, 30)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def test_the_checker_fails_a_broken_page_and_passes_a_clean_one(tmp_path):
    """The browser check itself: each kind of fault in a small page is reported, and a clean page has none."""
    broken = tmp_path / "broken.html"
    broken.write_text("<!DOCTYPE html><html><body><table><tr><td>1</td></tr></table>"
                      "<script>console.error('logged failure')</script>"
                      "<script>undefinedFunction()</script>"
                      "<img alt='missing file' src='no-such-image.png'>"
                      "<img alt='remote' src='http://192.0.2.1/x.png'>"
                      f"<img alt='fine' src='{_png_data_uri()}'></body></html>")
    report = check_page(broken, tmp_path / "broken.png", count=["table", "svg.map"])
    assert any("logged failure" in m for m in report.console_errors)
    assert any("undefinedFunction" in m for m in report.page_errors)
    assert sorted(report.broken_images) == ["missing file", "remote"] and report.images == 3
    assert any("no-such-image.png" in m for m in report.failed_requests)
    assert report.remote_requests == ["http://192.0.2.1/x.png"]
    assert report.counts == {"table": 1, "svg.map": 0}
    assert len(report.problems()) >= 5

    clean = tmp_path / "clean.html"
    clean.write_text(f"<!DOCTYPE html><html><body><img alt='fine' src='{_png_data_uri()}'></body></html>")
    report = check_page(clean, tmp_path / "clean.png")
    assert report.problems() == [] and report.images == 1
    assert (tmp_path / "clean.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pipeline_report_renders_cleanly_in_chromium(pipeline, tmp_path):
    """The page as the pipeline's first `dvc repro` wrote it (later tests change the checkout; the page is
    self-contained, so its saved text opens anywhere)."""
    params = yaml.safe_load((pipeline["root"] / "params.yaml").read_text())
    policies = params["rollout"]["policies"]
    text = pipeline["text"]["reports/eval.html"]
    # geospot's levels came from the train run in MLflow to the page and to DVC's plot data
    assert "each level&#x27;s own score, unweighted" in text
    assert "metrics/plots/train_reward_levels.csv" in pipeline["digests"]
    page = tmp_path / "eval.html"
    page.write_text(text, encoding="utf-8")
    # The screenshot lands in this test's tmp_path (pytest keeps the last few runs' under
    # /tmp/pytest-of-<user>/), e.g. .../test_the_pipeline_report_rend0/eval.png: look at it after a change.
    screenshot = tmp_path / "eval.png"
    report = check_page(page, screenshot, count=["table", "svg.map", "img[alt='Training reward']",
                                                 "img[alt='Distance CDF']", ".gallery .card"],
                        measure=[".gallery .card"])
    print(f"report screenshot: {screenshot}")
    assert report.problems() == []
    assert report.images >= 2 + params["eval"]["gallery_samples"]  # the two figures and a photo per card
    counts = report.counts
    # the summary, the HF baseline and the answer collapse check
    assert counts["table"] >= 3
    assert counts["svg.map"] == len(policies)  # one world map per policy
    assert counts["img[alt='Training reward']"] == 1 and counts["img[alt='Distance CDF']"] == 1
    assert counts[".gallery .card"] == params["eval"]["gallery_samples"]
    assert max(report.heights[".gallery .card"]) < MAX_CARD_PX
    with Image.open(screenshot) as shot:
        assert shot.width >= 1000 and shot.height > 2000  # the whole page, not just the first screen
