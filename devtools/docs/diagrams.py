"""Two tiny diagram formats rendered to SVG offline, with no dependency but the stdlib.

Sequence diagrams (``docs/diagrams/*.seq``)::

    title: A claim the scheduler allocates
    participant user: kubectl
    participant api: kube-apiserver
    user -> api: create the pod and its claim
    api --> user: created                  # dashed: an answer or a watch event
    note api: stores the claim             # a note on one participant's lifeline
    # a comment

Layer diagrams (``docs/diagrams/*.layers``): rows top to bottom, each row a layer that may
import only the rows below it; ``|`` separates boxes that do not import each other::

    title: Import layers
    row commands: cli
    row frameworks: plugin | deviceplugin | resourceslice | webhook

The output is deterministic (fixed fonts, sizes and order), so the committed SVGs can be
checked against their sources like the generated reference pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from devtools.docs.pages import DOCS

SOURCES = DOCS / "diagrams"
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'
CHAR_W = 6.6  # px per character at 11-12 px: wide enough for common sans-serif fonts
ROW_H = 34
BOX_H = 30
PAD = 12


class DiagramError(ValueError):
    """A line of a diagram source that is not in the format; names the file and line."""


def _width(text: str) -> float:
    return len(text) * CHAR_W + 2 * PAD


def _svg(width: float, height: float, body: list[str], title: str) -> str:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(title)}">'
    )
    style = (
        '<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="9" refY="4" '
        'orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#333"/></marker></defs>'
    )
    return "\n".join([head, f"<title>{escape(title)}</title>", style, *body, "</svg>", ""])


def _text(
    x: float, y: float, text: str, *, size: int = 12, anchor: str = "middle", weight: str = "normal"
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" '
        f'font-weight="{weight}" fill="#222">{escape(text)}</text>'
    )


# --- sequence diagrams -----------------------------------------------------------------------


@dataclass
class Step:
    kind: str  # "message", "answer" or "note"
    source: str
    target: str
    text: str


@dataclass
class Sequence:
    title: str = ""
    participants: dict[str, str] = field(default_factory=dict)  # id -> label, in order
    steps: list[Step] = field(default_factory=list)


_MESSAGE = re.compile(r"^([\w-]+)\s*(-->|->)\s*([\w-]+)\s*:\s*(.+)$")


def parse_sequence(text: str, name: str = "<sequence>") -> Sequence:
    seq = Sequence()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        where = f"{name}:{number}"
        if line.startswith("title:"):
            seq.title = line.removeprefix("title:").strip()
        elif line.startswith("participant "):
            ident, _, label = line.removeprefix("participant ").partition(":")
            seq.participants[ident.strip()] = label.strip() or ident.strip()
        elif line.startswith("note "):
            ident, _, note = line.removeprefix("note ").partition(":")
            if ident.strip() not in seq.participants:
                raise DiagramError(f"{where}: unknown participant {ident.strip()!r}")
            seq.steps.append(Step("note", ident.strip(), ident.strip(), note.strip()))
        elif match := _MESSAGE.match(line):
            source, arrow, target, label = match.groups()
            for ident in (source, target):
                if ident not in seq.participants:
                    raise DiagramError(f"{where}: unknown participant {ident!r}")
            kind = "answer" if arrow == "-->" else "message"
            seq.steps.append(Step(kind, source, target, label.strip()))
        else:
            raise DiagramError(f"{where}: not a title, participant, note or message: {raw!r}")
    if not seq.participants:
        raise DiagramError(f"{name}: no participants")
    return seq


def render_sequence(seq: Sequence) -> str:
    ids = list(seq.participants)
    # Distance between neighbouring lifelines: room for both boxes, then for every label
    # of a message between two participants, spread over the gaps it crosses.
    widths = {i: max(_width(seq.participants[i]), 110.0) for i in ids}
    dist = [0.0] + [widths[ids[k - 1]] / 2 + widths[ids[k]] / 2 + 20 for k in range(1, len(ids))]
    for step in seq.steps:
        a, b = sorted((ids.index(step.source), ids.index(step.target)))
        need = _width(f"{len(seq.steps)}. {step.text}") + 10
        have = sum(dist[a + 1 : b + 1])
        if a != b and have < need:
            for k in range(a + 1, b + 1):
                dist[k] += (need - have) / (b - a)
    xs: dict[str, float] = {}
    x = PAD + widths[ids[0]] / 2
    for k, ident in enumerate(ids):
        x += dist[k]
        xs[ident] = x
    notes_right = max(
        (xs[s.source] + 8 + _width(s.text) for s in seq.steps if s.kind == "note"), default=0.0
    )
    width = max(max(xs[i] + widths[i] / 2 for i in ids) + PAD, notes_right + PAD)
    top = 30.0
    body_top = top + BOX_H + 20
    height = body_top + ROW_H * len(seq.steps) + 20
    body = [_text(PAD, 18, seq.title, anchor="start", size=14, weight="bold")]
    for ident in ids:
        w = widths[ident]
        body.append(
            f'<line x1="{xs[ident]:.1f}" y1="{top + BOX_H:.1f}" x2="{xs[ident]:.1f}" '
            f'y2="{height - 10:.1f}" stroke="#999" stroke-dasharray="4 3"/>'
        )
        body.append(
            f'<rect x="{xs[ident] - w / 2:.1f}" y="{top:.1f}" width="{w:.1f}" height="{BOX_H}" '
            'rx="4" fill="#e8eef7" stroke="#4a6fa5"/>'
        )
        body.append(_text(xs[ident], top + 19, seq.participants[ident]))
    number = 0
    for n, step in enumerate(seq.steps):
        y = body_top + ROW_H * n + 20
        x1, x2 = xs[step.source], xs[step.target]
        if step.kind == "note":
            w = _width(step.text)
            body.append(
                f'<rect x="{x1 + 8:.1f}" y="{y - 16:.1f}" width="{w:.1f}" height="22" '
                'fill="#fff8d6" stroke="#c9a800"/>'
            )
            body.append(_text(x1 + 8 + PAD, y - 1, step.text, anchor="start", size=11))
            continue
        dash = ' stroke-dasharray="6 4"' if step.kind == "answer" else ""
        if x1 == x2:  # a message to itself: a small loop to the right
            body.append(
                f'<path d="M{x1:.1f},{y - 8:.1f} h30 v14 h-28" fill="none" stroke="#333"'
                f'{dash} marker-end="url(#arrow)"/>'
            )
            number += 1
            body.append(_text(x1 + 36, y + 2, f"{number}. {step.text}", anchor="start", size=11))
            continue
        body.append(
            f'<line x1="{x1:.1f}" y1="{y:.1f}" x2="{x2:.1f}" y2="{y:.1f}" stroke="#333"'
            f'{dash} marker-end="url(#arrow)"/>'
        )
        number += 1
        body.append(_text((x1 + x2) / 2, y - 6, f"{number}. {step.text}", size=11))
    return _svg(width, height, body, seq.title)


# --- layer diagrams --------------------------------------------------------------------------


@dataclass
class Layers:
    title: str = ""
    rows: list[tuple[str, list[str]]] = field(default_factory=list)


def parse_layers(text: str, name: str = "<layers>") -> Layers:
    layers = Layers()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("title:"):
            layers.title = line.removeprefix("title:").strip()
        elif line.startswith("row "):
            label, _, boxes = line.removeprefix("row ").partition(":")
            names = [b.strip() for b in boxes.split("|") if b.strip()]
            if not names:
                raise DiagramError(f"{name}:{number}: a row needs at least one box")
            layers.rows.append((label.strip(), names))
        else:
            raise DiagramError(f"{name}:{number}: not a title or row: {raw!r}")
    if not layers.rows:
        raise DiagramError(f"{name}: no rows")
    return layers


def render_layers(layers: Layers) -> str:
    label_w = max(_width(label) for label, _ in layers.rows)
    gap = 10.0
    row_widths = [
        sum(_width(b) for b in boxes) + gap * (len(boxes) - 1) for _, boxes in layers.rows
    ]
    inner = max(row_widths)
    width = max(PAD + label_w + inner + 2 * PAD, _width(layers.title) * 14 / 12 + PAD)
    row_step = BOX_H + 22
    top = 34.0
    height = top + row_step * len(layers.rows)
    body = [_text(PAD, 20, layers.title, anchor="start", size=14, weight="bold")]
    for k, (label, boxes) in enumerate(layers.rows):
        y = top + row_step * k
        body.append(_text(PAD, y + 19, label, anchor="start", size=11, weight="bold"))
        # the row's boxes stretched so that every row spans the same width
        scale = (inner - gap * (len(boxes) - 1)) / sum(_width(b) for b in boxes)
        x = PAD + label_w + PAD
        for box in boxes:
            w = _width(box) * scale
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BOX_H}" rx="4" '
                'fill="#e8eef7" stroke="#4a6fa5"/>'
            )
            body.append(_text(x + w / 2, y + 19, box))
            x += w + gap
        if k + 1 < len(layers.rows):
            mid = PAD + label_w + PAD + inner / 2
            body.append(
                f'<line x1="{mid:.1f}" y1="{y + BOX_H:.1f}" x2="{mid:.1f}" '
                f'y2="{y + row_step - 2:.1f}" stroke="#333" marker-end="url(#arrow)"/>'
            )
    return _svg(width, height, body, layers.title)


def render_file(source: Path) -> str:
    text = source.read_text()
    if source.suffix == ".seq":
        return render_sequence(parse_sequence(text, source.name))
    if source.suffix == ".layers":
        return render_layers(parse_layers(text, source.name))
    raise DiagramError(f"{source}: unknown diagram kind (want .seq or .layers)")


def sources(root: Path = SOURCES) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.suffix in (".seq", ".layers"))


def outputs(root: Path = SOURCES) -> dict[Path, str]:
    """Each source's SVG, next to it (``claim-scheduler.seq`` -> ``claim-scheduler.svg``)."""
    return {s.with_suffix(".svg"): render_file(s) for s in sources(root)}
