"""Sphinx extension: search that works from the book's files, with no server.

Sphinx's search page shows a summary under each result by fetching the page
it found; Chromium refuses such requests under ``file://`` (a CORS error and
an uncaught "Failed to fetch" per result). With
``html_show_search_summary = False`` (``_config.yml``) nothing is fetched;
instead this extension writes the text of every page's article into
``_static/book_search_text.js``, which only the search page loads, and
``search_scorer.js`` (``html_search_scorer``) uses it to

- rank first the pages whose title contains the query, then those whose text
  contains it exactly, as typed (case aside): Sphinx's index splits "M-RoPE"
  into "m" and "rope", which every page contains;
- show under each result a snippet of its page's text around the query.

The text is the prose a reader sees, figure captions included: code cells
(their source and printed output) are left out, and TeX is written as text
(``\\(\\theta_i\\)`` becomes ``θ_i``), so that snippets read as sentences.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from sphinx.builders.html._assets import _JavaScript

TEXT_FILE = "book_search_text.js"

INLINE_TAGS = set("a span em strong code b i sub sup abbr".split())
VOID_TAGS = set("area base br col embed hr img input link meta source track "
                "wbr".split())
# Subtrees that are not prose: code cells' source and output, the toggles
# that hide them, the pilcrow links of headings.
SKIPPED_CLASSES = {"cell_input", "cell_output", "hide", "headerlink"}

_GREEK_NAMES = ("alpha beta gamma delta epsilon zeta eta theta iota kappa "
                "lambda mu nu xi omicron pi rho varsigma sigma tau upsilon "
                "phi chi psi omega").split()
GREEK = {name: chr(0x3B1 + i) for i, name in enumerate(_GREEK_NAMES)}
GREEK |= {name.capitalize(): chr(0x391 + i)
          for i, name in enumerate(_GREEK_NAMES) if name != "varsigma"}
GREEK |= {"varepsilon": "ε", "vartheta": "ϑ", "varphi": "φ"}
SYMBOLS = {
    "top": "ᵀ", "cdot": "·", "times": "×", "le": "≤", "leq": "≤",
    "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈", "to": "→",
    "rightarrow": "→", "leftarrow": "←", "mapsto": "↦", "iff": "⟺",
    "Leftrightarrow": "⟺", "Rightarrow": "⇒", "infty": "∞", "sum": "∑",
    "prod": "∏", "int": "∫", "langle": "⟨", "rangle": "⟩", "lvert": "|",
    "rvert": "|", "vert": "|", "mid": "|", "lVert": "‖", "rVert": "‖",
    "dots": "…", "ldots": "…", "cdots": "…", "vdots": "⋮", "ddots": "⋱",
    "pm": "±", "in": "∈", "notin": "∉", "sqrt": "√", "partial": "∂",
    "nabla": "∇", "odot": "⊙", "otimes": "⊗", "circ": "∘", "lfloor": "⌊",
    "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "equiv": "≡",
    "propto": "∝", "sim": "∼", "ell": "ℓ", "subset": "⊂", "cup": "∪",
    "cap": "∩", "forall": "∀", "exists": "∃",
}
# Commands that only format or space: dropped, their braced argument kept
# (function names such as \cos and \max are written without the backslash).
DROPPED = set(
    "left right big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr "
    "displaystyle textstyle mathbf mathrm mathit mathcal mathbb mathsf "
    "mathtt operatorname text textrm textbf textit boldsymbol bm quad qquad "
    "underbrace overbrace overline underline bar hat tilde vec dot widehat "
    "widetilde nonumber notag limits tfrac dfrac frac binom phantom "
    "hphantom".split())
TEX_COMMAND = re.compile(r"\\([A-Za-z]+)\s?|\\(.)")
TEX_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[^}]*\}")
TEX_FRACTION = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def tex_to_text(tex: str) -> str:
    """TeX as plain text for a search snippet: ``\\theta_i`` -> ``θ_i``,
    ``\\frac{a}{b}`` -> ``a/b``; formatting and spacing commands dropped."""
    text = tex.strip()
    for delimiters in (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$")):
        if text.startswith(delimiters[0]) and text.endswith(delimiters[1]):
            text = text[len(delimiters[0]) : -len(delimiters[1])]
    text = TEX_ENVIRONMENT.sub(" ", text)
    text = TEX_FRACTION.sub(r"(\1)/(\2)", text)
    text = text.replace("\\\\", "; ").replace("&", " ")

    def command(match: re.Match) -> str:
        name, symbol = match.group(1), match.group(2)
        if symbol is not None:  # \, \; \! \{ \} \| \_ and the like
            return {"{": "{", "}": "}", "|": "‖", "_": "_", "%": "%"}.get(
                symbol, " "
            )
        if name in GREEK:
            return GREEK[name]
        if name in SYMBOLS:
            return SYMBOLS[name] + " "
        if name in DROPPED:
            return ""
        return name

    text = TEX_COMMAND.sub(command, text)
    text = text.replace("{", "").replace("}", "").replace("^ᵀ", "ᵀ")
    return re.sub(r"\s+", " ", text).strip()


class _ProseText(HTMLParser):
    """The visible prose of an article, as one line of text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.stack: list[tuple[str, bool, bool]] = []  # tag, skipped, math
        self.math: list[str] | None = None

    def _skipped(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def handle_starttag(self, tag: str, attrs: list) -> None:
        classes = set((dict(attrs).get("class") or "").split())
        caption = tag == "figcaption"
        skipped = (
            (self._skipped() and not caption)
            or bool(classes & SKIPPED_CLASSES)
            or tag in {"script", "style"}
        )
        math = "math" in classes and not skipped
        if tag not in INLINE_TAGS:
            self.parts.append(" ")
        if math:
            self.math = []
        if tag not in VOID_TAGS:
            self.stack.append((tag, skipped, math))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            open_tag, _, math = self.stack.pop()
            if math and self.math is not None:
                self.parts.append(" " + tex_to_text("".join(self.math)) + " ")
                self.math = None
            if open_tag == tag:
                break
        if tag not in INLINE_TAGS:
            self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if self._skipped():
            return
        if self.math is not None:
            self.math.append(data)
        else:
            self.parts.append(data)

    def text(self) -> str:
        text = re.sub(r"\s+", " ", "".join(self.parts)).strip()
        return re.sub(r" ([.,;:!?)])", r"\1", text)


def page_text(html: str) -> str:
    """The text of a written page's article, as the reader sees its prose."""
    start, end = html.find("<article"), html.rfind("</article>")
    parser = _ProseText()
    parser.feed(html[start:end])
    parser.close()
    return parser.text()


def _write_texts(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    texts = {}
    for doc in sorted(app.env.found_docs):
        page = out / app.builder.get_target_uri(doc)
        if page.is_file():
            texts[doc] = page_text(page.read_text(encoding="utf-8"))
    target = out / "_static" / TEXT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"window.BOOK_PAGE_TEXT = {json.dumps(texts)};\n")


def _load_on_search_page(
    app, pagename, templatename, context, doctree
) -> None:
    if pagename == "search" and "script_files" in context:
        context["script_files"] = [
            *context["script_files"],
            _JavaScript(f"_static/{TEXT_FILE}"),
        ]


def setup(app):
    app.connect("html-page-context", _load_on_search_page)
    app.connect("build-finished", _write_texts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
