"""A griffe extension for the API reference: the docstrings' field lists become markdown lists.

The docstrings describe fields and arguments one per line, ``name: what it is`` (continuation lines indented),
which markdown would run together into one paragraph. Here each such line becomes a list item that names the
field in code, ``- `name`: what it is``, with its continuation lines kept in the item. Only lines that start
with lower-case identifiers (``lam:``, ``train_file, val_file:``, ``model_path (G):``) count, so prose such as
``Precision: ...`` and indented code blocks are left alone. A ``<placeholder>`` outside code is escaped so that
it shows instead of vanishing as an unknown HTML tag. The source files are not changed.
"""

from __future__ import annotations

import re

import griffe

FIELD = re.compile(r"^(?P<names>[a-z_][a-z0-9_]*(?:,\s*[a-z_][a-z0-9_]*)*)(?P<note>\s*\([^)]*\))?:\s+(?P<rest>\S.*)$")


PLACEHOLDER = re.compile(r"<([A-Za-z_][\w-]*)>")


def escape_placeholders(line: str) -> str:
    """``<dim>`` outside code spans is a placeholder, not an HTML tag: escape it so that it shows."""
    parts = line.split("`")
    return "`".join(PLACEHOLDER.sub(r"&lt;\1&gt;", s) if i % 2 == 0 else s for i, s in enumerate(parts))


def field_lists(text: str) -> str:
    out: list[str] = []
    in_item = False
    for line in text.splitlines():
        if not line.startswith("    ") or in_item:  # indented code blocks keep their text as written
            line = escape_placeholders(line)
        m = FIELD.match(line)
        if m:
            if out and out[-1].strip() and not in_item:
                out.append("")  # a markdown list needs a blank line before it
            names = ", ".join(f"`{n.strip()}`" for n in m["names"].split(","))
            out.append(f"- {names}{m['note'] or ''}: {m['rest']}")
            in_item = True
        elif in_item and line.startswith(" ") and line.strip():
            out.append("  " + line.strip())
        else:
            if in_item and line.strip():
                out.append("")  # the list ends before the next paragraph
            in_item = False
            out.append(line)
    return "\n".join(out)


class DocstringLayout(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = field_lists(obj.docstring.value)
