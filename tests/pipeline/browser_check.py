"""Open a local HTML page in Debian's chromium (headless, driven by playwright) and collect what a reader would
see go wrong: console errors, script errors, failed or remote requests, images that did not load.

Playwright only drives the system browser (`executable_path`): its own browser downloads are never used, so the
check runs offline. `make test` installs chromium (the Makefile's `browser` target).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")

# Every <img> that has not loaded: still loading, or decoded to nothing (a broken source has naturalWidth 0).
BROKEN_IMAGES_JS = """() => Array.from(document.images)
    .filter(img => !img.complete || img.naturalWidth === 0)
    .map(img => img.alt || img.src.slice(0, 80))"""

HEIGHTS_JS = "selector => Array.from(document.querySelectorAll(selector)).map(e => e.getBoundingClientRect().height)"


def chromium_path() -> str | None:
    """Debian's chromium launcher, when installed."""
    return shutil.which("chromium")


@dataclass
class PageReport:
    """What the browser saw while loading one page."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)  # uncaught exceptions in the page's scripts
    failed_requests: list[str] = field(default_factory=list)
    remote_requests: list[str] = field(default_factory=list)  # anything not from the file itself
    broken_images: list[str] = field(default_factory=list)
    images: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # CSS selector -> elements matching it
    heights: dict[str, list[float]] = field(default_factory=dict)  # CSS selector -> rendered heights (px)

    def on_console(self, message) -> None:
        if message.type == "error":  # warnings and logs are no fault of the page
            self.console_errors.append(message.text)

    def on_request(self, request) -> None:
        if not request.url.startswith(LOCAL_SCHEMES):
            self.remote_requests.append(request.url)

    def problems(self) -> list[str]:
        """Everything that makes the page fail the check, one line each (empty: clean)."""
        return ([f"console error: {m}" for m in self.console_errors] + [f"script error: {m}" for m in self.page_errors]
                + [f"failed request: {m}" for m in self.failed_requests]
                + [f"remote request: {m}" for m in self.remote_requests]
                + [f"image not loaded: {m}" for m in self.broken_images])


def check_page(page_path: Path, screenshot: Path, *, count: Sequence[str] = (), measure: Sequence[str] = (),
               width: int = 1280, height: int = 900) -> PageReport:
    """Load `page_path` in headless chromium, wait for its load event, count the `count` selectors' elements,
    measure the heights of the `measure` ones, and write a full-page PNG screenshot to `screenshot`."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    if executable is None:
        raise RuntimeError("chromium is not installed: `make test` installs it (apt-get install chromium)")
    report = PageReport()
    with sync_playwright() as driver:
        # Containers often have a small /dev/shm, where chromium's shared memory would run out.
        browser = driver.chromium.launch(executable_path=executable, headless=True,
                                         args=["--disable-dev-shm-usage", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.on("console", report.on_console)
            page.on("pageerror", lambda error: report.page_errors.append(str(error)))
            page.on("requestfailed", lambda r: report.failed_requests.append(f"{r.url[:120]} ({r.failure})"))
            page.on("request", report.on_request)
            page.goto(Path(page_path).resolve().as_uri(), wait_until="load")
            report.images = page.evaluate("() => document.images.length")
            report.broken_images = page.evaluate(BROKEN_IMAGES_JS)
            report.counts = {selector: page.locator(selector).count() for selector in count}
            report.heights = {selector: page.evaluate(HEIGHTS_JS, selector) for selector in measure}
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return report
