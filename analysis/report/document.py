"""A report as data, rendered to Markdown or self-contained HTML (pure: returns text).

Blocks are paragraphs (plain text; `backticks` become code), tables, figures,
code blocks and collapsible details (log tails). Figures are referenced by
name; the caller says where each one lives (a file beside the Markdown, or a
``data:`` URI inside the HTML).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    """A table of text cells."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class FigureRef:
    """A figure, by name, with its caption."""

    name: str
    caption: str


@dataclass(frozen=True)
class Code:
    """A code block (shown verbatim)."""

    text: str


@dataclass(frozen=True)
class Details:
    """A collapsible block (log tails)."""

    summary: str
    text: str


Block = str | Table | FigureRef | Code | Details


@dataclass(frozen=True)
class Section:
    """A titled list of blocks."""

    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Document:
    """A titled list of sections."""

    title: str
    sections: tuple[Section, ...]


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """A table from any cell values (None shows as empty)."""
    return Table(tuple(columns), tuple(tuple("" if c is None else str(c) for c in r) for r in rows))


# --- Markdown --------------------------------------------------------------------------------


def to_markdown(doc: Document, figure_path: Callable[[str], str]) -> str:
    """The document as Markdown; figures link to ``figure_path(name)``."""
    parts = [f"# {doc.title}", ""]
    for section in doc.sections:
        parts += [f"## {section.title}", ""]
        for block in section.blocks:
            parts += [_md_block(block, figure_path), ""]
    return "\n".join(parts).rstrip() + "\n"


def _md_block(block: Block, figure_path: Callable[[str], str]) -> str:
    if isinstance(block, str):
        return block
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, FigureRef):
        return f"![{block.caption}]({figure_path(block.name)})\n\n*{block.caption}*"
    if isinstance(block, Code):
        return f"```\n{block.text}\n```"
    return f"<details><summary>{html.escape(block.summary)}</summary>\n\n```\n{block.text}\n```\n\n</details>"  # noqa: E501


def _md_table(t: Table) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(c) for c in t.columns) + " |",
        "|" + "|".join("---" for _ in t.columns) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


# --- HTML ------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 72rem;
       margin: 2rem auto; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3rem; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #eee; padding-bottom: .2rem; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
tr:nth-child(even) td { background: #fafafa; }
pre { background: #f6f8fa; padding: .7rem; overflow-x: auto; font-size: .85rem;
      white-space: pre-wrap; word-break: break-all; }
code { background: #f1f1f1; padding: 0 .2rem; border-radius: 3px; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .9rem; }
details { margin: .5rem 0; }
summary { cursor: pointer; }
"""


def to_html(doc: Document, figure_src: Callable[[str], str]) -> str:
    """The document as one self-contained HTML page; ``figure_src(name)`` gives each image."""
    body = [f"<h1>{html.escape(doc.title)}</h1>"]
    for section in doc.sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        body += [_html_block(block, figure_src) for block in section.blocks]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(doc.title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _inline(text: str) -> str:
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)


def _html_block(block: Block, figure_src: Callable[[str], str]) -> str:
    if isinstance(block, str):
        return f"<p>{_inline(block)}</p>"
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(c)}</th>" for c in block.columns)
        rows = "".join(
            "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in block.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    if isinstance(block, FigureRef):
        caption = html.escape(block.caption)
        return (
            f'<figure><img src="{figure_src(block.name)}" alt="{caption}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    if isinstance(block, Code):
        return f"<pre>{html.escape(block.text)}</pre>"
    return (
        f"<details><summary>{html.escape(block.summary)}</summary>"
        f"<pre>{html.escape(block.text)}</pre></details>"
    )
