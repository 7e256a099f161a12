"""Sphinx extension: an exercise's worked code inside its Solution dropdown.

The layout of every exercise (book/AUTHORING.md, "Exercises"): a markdown cell
with the ``:::{admonition} Exercise N.k`` block, then the code cell that works
the solution, tagged ``solution``, then a markdown cell that starts with the
``:::{dropdown} Solution`` block (the reasoning; it may quote numbers the code
computed, since it runs after it). A notebook cannot put a code cell inside a
markdown block, so this transform moves each code cell tagged ``solution`` to
the end of the dropdown right after it: the HTML shows one collapsed
"Solution" whose body is the reasoning followed by the executed, asserted code
and its output. A ``solution`` cell without a Solution dropdown right after it
is reported as a warning (an error under ``-W``).
"""

from __future__ import annotations

from docutils import nodes
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx_design.shared import is_component

logger = logging.getLogger(__name__)
TAG_CLASS = "tag_solution"
TITLE = "Solution"


def _is_solution_dropdown(node: nodes.Node | None) -> bool:
    return (isinstance(node, nodes.Element)
            and is_component(node, "dropdown") and node.get("has_title")
            and node[0].astext().strip() == TITLE)


class SolutionCodeIntoDropdown(SphinxTransform):
    default_priority = 500

    def apply(self, **kwargs) -> None:
        cells = [node for node in self.document.findall(nodes.container)
                 if node.get("nb_element") == "cell_code"
                 and TAG_CLASS in node.get("classes", [])]
        for cell in cells:
            parent = cell.parent
            index = parent.index(cell)
            after = parent[index + 1] if index + 1 < len(parent) else None
            if not _is_solution_dropdown(after):
                logger.warning(
                    "a code cell tagged 'solution' must be followed by a "
                    "markdown cell starting with a ':::{dropdown} Solution' "
                    "block", location=cell)
                continue
            parent.remove(cell)
            after.append(cell)


def setup(app):
    app.add_transform(SolutionCodeIntoDropdown)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
