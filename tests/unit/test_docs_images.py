"""Every image the docs show exists, every image in docs/img/ is shown, and each of the live page's
is one the browser test writes (``LIVE_PAGE_SCREENSHOTS=docs/img``): a screenshot the docs
describe is one the page can still make, not a picture of a page that no longer is."""

from __future__ import annotations

import re

from tests.conftest import ROOT

IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)|<img[^>]*\bsrc=\"([^\"]+)\"")


def _shown() -> dict[str, list[str]]:
    """Image path (from the repository's root) -> the documents that show it."""
    shown: dict[str, list[str]] = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for match in IMAGE.finditer(doc.read_text()):
            target = match.group(1) or match.group(2)
            if "://" in target:
                continue
            path = (doc.parent / target).resolve().relative_to(ROOT)
            shown.setdefault(str(path), []).append(str(doc.relative_to(ROOT)))
    return shown


def test_every_image_the_docs_show_exists_and_every_image_is_shown():
    shown = _shown()
    missing = {path: docs for path, docs in shown.items() if not (ROOT / path).is_file()}
    assert not missing, f"images shown but not in the repository: {missing}"
    unused = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "docs" / "img").iterdir()
        if str(p.relative_to(ROOT)) not in shown
    )
    assert not unused, f"images no document shows: {unused}"


def test_the_live_pages_screenshots_are_the_ones_its_browser_test_writes():
    written = set(
        re.findall(
            r"screenshot\(\"(live-page[^\"]*\.png)\"\)",
            (ROOT / "tests/server/test_web_page.py").read_text(),
        )
    )
    shown = {p.rsplit("/", 1)[-1] for p in _shown() if p.startswith("docs/img/live-page")}
    assert shown and shown == written, (shown, written)
