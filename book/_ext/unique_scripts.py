"""Sphinx extension: drop repeated <script> entries from every page.

Under this stack the inline scripts of sphinx-thebe and sphinx-togglebutton
(both bundled with Jupyter Book 1.x) reach every page twice (once with filename
None, once with ""), and the second ``const THEBE_JS_URL`` raises "Identifier
'THEBE_JS_URL' has already been declared" in the browser. Keeping the first of
identical entries removes the error.
"""

from __future__ import annotations


def _unique_scripts(app, pagename, templatename, context, doctree) -> None:
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", script) or None,
               tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    if "script_files" in context:
        context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
