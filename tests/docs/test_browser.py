"""The built documentation site, as a reader's browser shows it (``make docs-test``).

The site is built with ``mkdocs build --strict``, served over HTTP and opened in Debian's
headless Chromium, driven through the DevTools protocol: the home page, a guide and the
API reference render with their titles and content, and the search box finds
"watermark". Screenshots of the pages go to ``build/docs-screenshots/``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "docs-screenshots"

# (path, title, a text the page's main content shows, screenshot name)
PAGES = (
    ("", "decaton-aio", "commits a watermark", "home"),
    ("processors/", "Writing processors - decaton-aio", "Per-key order", "guide"),
    ("reference/api/", "Python API - decaton-aio", "Application", "api"),
    ("deploying/", "Deploying - decaton-aio", "scaled on lag", "deploying"),
)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site, built strictly into a fresh directory and served on a free port."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", site],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=120,
    )
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class DevTools:
    """A page of a headless Chromium, driven through the DevTools protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        await self._ws.send_json({"id": self._next, "method": method, "params": params})
        while True:  # events arrive in between; only the answer to this call matters
            message = await self._ws.receive_json(timeout=30)
            if message.get("id") == self._next:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        answer = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return answer["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        async with asyncio.timeout(timeout_s):
            while True:
                value = await self.evaluate(expression)
                if value:
                    return value
                await asyncio.sleep(0.1)

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await asyncio.sleep(0.2)
        await self.wait_for("document.readyState === 'complete' && location.href")

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[DevTools]:
    chromium = shutil.which("chromium")
    assert chromium, "Chromium is missing: make docs-test installs Debian's chromium package"
    process = await asyncio.create_subprocess_exec(
        chromium,
        "--headless",
        "--no-sandbox",  # as root, as in CI
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1280,1000",
        "--remote-debugging-port=0",
        f"--user-data-dir={tmp_path / 'profile'}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(30):
            while True:
                line = (await process.stderr.readline()).decode()
                assert line, "Chromium exited before it listened for DevTools"
                found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
                if found:
                    break
        async with aiohttp.ClientSession() as session:
            listed = await session.get(f"http://127.0.0.1:{found.group(1)}/json/list")
            targets = await listed.json()
            page = next(t for t in targets if t["type"] == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                tools = DevTools(ws)
                await tools.call("Page.enable")
                yield tools
    finally:
        process.kill()
        await process.wait()


@pytest.mark.parametrize(("path", "title", "text", "name"), PAGES)
async def test_page_renders_with_its_title(
    site_url: str, browser: DevTools, path: str, title: str, text: str, name: str
) -> None:
    """Given the built site, when Chromium opens the page, then it shows its title, its
    heading and its content, styled by the theme."""
    await browser.open(site_url + path)
    assert await browser.evaluate("document.title") == title
    heading = await browser.evaluate("document.querySelector('article h1').textContent")
    assert heading.strip().removesuffix("¶") == title.removesuffix(" - decaton-aio")
    article = await browser.evaluate("document.querySelector('article').innerText")
    assert text in article
    # The theme's stylesheet applied: the header bar is laid out, not bare markup.
    assert await browser.evaluate("document.querySelector('.md-header').offsetHeight") > 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await browser.screenshot(SCREENSHOTS / f"docs-{name}.png")


async def test_api_reference_is_rendered_from_docstrings(site_url: str, browser: DevTools) -> None:
    """The API page holds mkdocstrings' rendering: a heading per object, with the text of
    its docstring."""
    await browser.open(site_url + "reference/api/")
    headings = await browser.evaluate(
        "[...document.querySelectorAll('.doc-heading')].map(h => h.textContent.trim())"
    )
    assert any(h.startswith("Application") for h in headings)
    assert any(h.startswith("TaskProducer") for h in headings)
    article = await browser.evaluate("document.querySelector('article').innerText")
    assert "Per-key order" not in article  # the API page, not a guide
    assert "bootstrap_servers" in article


async def test_search_finds_watermark(site_url: str, browser: DevTools) -> None:
    """The search index holds the word, and the search box lists pages that have it."""
    async with aiohttp.ClientSession() as session:
        answer = await session.get(site_url + "search/search_index.json")
        index = json.loads(await answer.text())
    assert any("watermark" in doc["text"].lower() for doc in index["docs"])

    await browser.open(site_url)
    # As a reader does: click into the search box and type.
    await browser.evaluate("document.querySelector('[data-md-component=search-query]').focus()")
    await browser.call("Input.insertText", text="watermark")
    count = await browser.wait_for("document.querySelectorAll('.md-search-result__item').length")
    assert count > 0
    meta = await browser.evaluate("document.querySelector('.md-search-result__meta').innerText")
    assert re.match(r"\d+ matching documents?", meta), meta
    results = await browser.evaluate(
        "document.querySelector('.md-search-result__list').innerText.toLowerCase()"
    )
    assert "watermark" in results
    await asyncio.sleep(0.5)  # the result list fades in
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await browser.screenshot(SCREENSHOTS / "docs-search.png")
