"""Check every link between the pages of a built site, and every anchor, offline.

Usage: ``python docs/_ext/check_links.py docs/_build/html``. Links to other sites are
not fetched (the build has no network); a relative link must name a file of the site,
and a ``#fragment`` an ``id`` (or ``name``) on that page. Exits 1 and lists what is broken.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if key in attrs and attrs[key] is not None and (tag != "link" or key == "href"):
                self.links.append(attrs[key])


def check(root: Path) -> list[str]:
    pages = {}
    for path in root.rglob("*.html"):
        if path.relative_to(root).parts[0] in ("_static", "_sources"):
            continue  # the theme's templates and the pages' sources, not pages
        page = _Page()
        page.feed(path.read_text(errors="replace"))
        pages[path.resolve()] = page
    broken = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            where = path.relative_to(root.resolve())
            if not target.exists():
                broken.append(f"{where}: {link}: no such file")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where}: {link}: no anchor #{parts.fragment}")
    return broken


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    broken = check(root)
    for line in broken:
        print(line)
    print(f"links: {len(broken)} broken" if broken else "links: all links between pages and anchors resolve")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
