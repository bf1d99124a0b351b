"""Screenshots of the documentation site, to look at how its pages come out.

``python docs/screenshots.py [OUT_DIR] [PAGE ...]`` builds the site (``mkdocs build
--strict``) into a temporary folder, serves it on 127.0.0.1 with the standard library's
HTTP server, and has Debian's chromium (/usr/bin/chromium, driven by playwright: no browser
download) take a screenshot of each PAGE (its top 2400 px) (a path of the site, default: the
worker options and the API reference) into OUT_DIR (default /tmp/streamwork-docs). It
prints the PNG files it wrote.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGES = ["reference/options/", "reference/api/"]
MAX_HEIGHT = 2400  # px of a long page kept in its screenshot (the top of it)


def build(out: Path) -> None:
    """The site into ``out``; exits with mkdocs's output when the strict build fails."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}")


def shoot(site: Path, pages: list[str], out_dir: Path) -> list[Path]:
    """Serve ``site`` on a free loopback port and screenshot each of ``pages``."""
    from playwright.sync_api import sync_playwright

    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    written = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for path in pages:
                page.goto(base + path, wait_until="networkidle")
                name = path.strip("/").replace("/", "-") or "index"
                png = out_dir / f"docs-{name}.png"
                height = min(page.evaluate("document.body.scrollHeight"), MAX_HEIGHT)
                page.screenshot(path=str(png), full_page=True,
                                clip={"x": 0, "y": 0, "width": 1280, "height": height})
                written.append(png)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return written


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # no line per request


def main(argv: list[str]) -> None:
    out_dir = Path(argv[0]) if argv else Path("/tmp/streamwork-docs")
    pages = argv[1:] or PAGES
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="streamwork-site-") as site:
        build(Path(site))
        for png in shoot(Path(site), pages, out_dir):
            print(png)


if __name__ == "__main__":
    main(sys.argv[1:])
