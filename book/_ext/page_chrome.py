"""Sphinx extension: the theme's colour mode and the landing page's title tag.

- pydata-sphinx-theme's page template reads the colour mode from
  ``html_context``'s ``default_mode``; Jupyter Book leaves it unset, so every
  page logged "Got invalid theme mode: . Resetting to auto." to the console.
  The mode is set to ``auto`` (follow the reader's system setting) unless the
  configuration names one.
- The title tag of a page is its heading, a dash and the book's title (the
  theme's template adds the second part). The landing page's heading is the
  book's title, which the tag then showed twice: there the first part reads
  "Home" instead.
"""

from __future__ import annotations

MODES = ("auto", "light", "dark")


def _default_mode(app, config) -> None:
    mode = config.html_context.setdefault("default_mode", "auto")
    if mode not in MODES:
        raise ValueError(f"html_context['default_mode'] is {mode!r}; "
                         f"expected one of {MODES}")


def _title_once(app, pagename, templatename, context, doctree) -> None:
    if (pagename == app.config.root_doc
            and context.get("title") == app.config.html_title):
        context["title"] = "Home"


def setup(app):
    app.connect("config-inited", _default_mode)
    app.connect("html-page-context", _title_once)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
