"""After `sphinx-build`: every tutorial page shows figures, every image a page refers to was written, and the
site works offline.

    python docs/check.py docs/_build/html

A tutorial's figures are the images its executed cells left (matplotlib figures, mpinb's charts); a page without
one, or an image missing from the build, is a failure with the page named. So is a page that loads a script,
style sheet or font from another host, or that logs a console error when Chromium opens it from disk.
"""

import shutil
import sys
from pathlib import Path

from bs4 import BeautifulSoup


def problems(site):
    found = []
    pages = sorted((site / "tutorials").glob("*.html"))
    if not pages:
        found.append(f"no tutorial pages under {site / 'tutorials'}")
    for page in sorted(site.rglob("*.html")):
        soup = BeautifulSoup(page.read_text(), "html.parser")
        images = soup.select("article img")
        for image in images:
            source = image.get("src", "")
            if not source.startswith("data:") and not (page.parent / source).is_file():
                found.append(f"{page.relative_to(site)}: image {source} is not in the build")
        if page in pages and not images:
            found.append(f"{page.relative_to(site)}: a tutorial page without a figure")
        for tag in soup.select("script[src], link[href]"):
            source = tag.get("src") or tag.get("href")
            loads = tag.name == "script" or "stylesheet" in tag.get("rel", []) or "preload" in tag.get("rel", [])
            if loads and source.startswith(("http://", "https://", "//")):
                found.append(f"{page.relative_to(site)}: loads {source} from another host (the site must work "
                             "offline)")
    return found


def console_errors(site):
    """``{page: [message, ...]}``: what Chromium logs as errors (and requests that fail) opening each page."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise SystemExit("Chromium is missing: apt-get install chromium (make chromium)")
    errors = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page()
        logged = []
        page.on("console", lambda message: logged.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: logged.append(str(error)))
        page.on("requestfailed", lambda request: logged.append(f"failed to load {request.url}"))
        for path in sorted(site.rglob("*.html")):
            if "_static" in path.parts or ".doctrees" in path.parts:
                continue
            logged.clear()
            page.goto(path.resolve().as_uri(), wait_until="load")
            page.wait_for_timeout(200)  # scripts that run after load
            if logged:
                errors[str(path.relative_to(site))] = list(logged)
        browser.close()
    return errors


def main():
    site = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html")
    found = problems(site)
    pages = len([path for path in site.rglob("*.html") if "_static" not in path.parts])
    errors = console_errors(site)
    found += [f"{page}: console error: {message}" for page, messages in errors.items() for message in messages]
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"{len(list((site / 'tutorials').glob('*.html')))} tutorial pages, each with its figures; {pages} pages "
          "opened in Chromium from disk: nothing loaded from another host, 0 console errors")


if __name__ == "__main__":
    main()
