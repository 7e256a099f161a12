"""Sphinx extension: search that works from the book's files, with no server.

Sphinx's search page shows a summary under each result by fetching the page
it found; Chromium refuses such requests under ``file://`` (a CORS error and
an uncaught "Failed to fetch" per result). With
``html_show_search_summary = False`` (``_config.yml``) nothing is fetched;
instead this extension writes the text of every page's article into
``_static/book_search_text.js``, which only the search page loads, and
``search_scorer.js`` (``html_search_scorer``) uses it to

- rank first the pages whose text contains the query exactly, as typed (case
  aside): Sphinx's index splits "M-RoPE" into "m" and "rope", which every
  page contains;
- show under each result a snippet of its page's text around the query.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

from sphinx.builders.html._assets import _JavaScript

TEXT_FILE = "book_search_text.js"


def _page_text(html: str) -> str:
    """The text of a written page's article, as the reader sees it."""
    start, end = html.find("<article"), html.rfind("</article>")
    article = re.sub(r"<(script|style)\b.*?</\1>", " ", html[start:end],
                     flags=re.S)
    article = re.sub(r'<a class="headerlink".*?</a>', "", article, flags=re.S)
    inline = r"</?(?:a|span|em|strong|code|b|i|sub|sup|abbr)\b[^>]*>"
    text = unescape(re.sub(r"<[^>]+>", " ", re.sub(inline, "", article)))
    return re.sub(r"\s+", " ", text).strip()


def _write_texts(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    texts = {}
    for doc in sorted(app.env.found_docs):
        page = out / app.builder.get_target_uri(doc)
        if page.is_file():
            texts[doc] = _page_text(page.read_text(encoding="utf-8"))
    target = out / "_static" / TEXT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"window.BOOK_PAGE_TEXT = {json.dumps(texts)};\n")


def _load_on_search_page(app, pagename, templatename, context,
                         doctree) -> None:
    if pagename == "search" and "script_files" in context:
        context["script_files"] = [*context["script_files"],
                                   _JavaScript(f"_static/{TEXT_FILE}")]


def setup(app):
    app.connect("html-page-context", _load_on_search_page)
    app.connect("build-finished", _write_texts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
