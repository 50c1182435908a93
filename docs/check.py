"""After `sphinx-build`: every tutorial page shows figures, and every image a page refers to was written.

    python docs/check.py docs/_build/html

A tutorial's figures are the images its executed cells left (matplotlib figures, mpinb's charts); a page without
one, or an image missing from the build, is a failure with the page named.
"""

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
    return found


def main():
    site = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html")
    found = problems(site)
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"{len(list((site / 'tutorials').glob('*.html')))} tutorial pages, each with its figures")


if __name__ == "__main__":
    main()
