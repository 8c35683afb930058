"""devtools.docs.diagrams: the two source formats, their errors, and what the SVG draws."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from devtools.docs import diagrams

SVG = "{http://www.w3.org/2000/svg}"


def test_a_sequence_draws_one_arrow_per_message_and_numbers_only_messages() -> None:
    seq = diagrams.parse_sequence(
        "title: t\n"
        "participant a: Alpha\n"
        "participant b: Beta   # a comment\n"
        "# a comment line\n"
        "a -> b: ask\n"
        "note b: think\n"
        "b --> a: answer\n"
    )
    assert list(seq.participants.values()) == ["Alpha", "Beta"]
    root = ET.fromstring(diagrams.render_sequence(seq))
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts == ["t", "Alpha", "Beta", "1. ask", "think", "2. answer"]
    arrows = [ln for ln in root.iter(f"{SVG}line") if ln.get("marker-end")]
    assert len(arrows) == 2
    assert [a.get("stroke-dasharray") for a in arrows] == [None, "6 4"]  # the answer is dashed
    ask, answer = arrows
    assert float(ask.get("x1", 0)) < float(ask.get("x2", 0))  # a -> b points right
    assert float(answer.get("x1", 0)) > float(answer.get("x2", 0))


def test_labels_get_room_between_their_participants() -> None:
    long = "x" * 120
    seq = diagrams.parse_sequence(f"participant a: A\nparticipant b: B\na -> b: {long}\n")
    root = ET.fromstring(diagrams.render_sequence(seq))
    (arrow,) = [ln for ln in root.iter(f"{SVG}line") if ln.get("marker-end")]
    span = float(arrow.get("x2", 0)) - float(arrow.get("x1", 0))
    assert span >= len(f"1. {long}") * diagrams.CHAR_W


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("participant a: A\na -> c: hi\n", "x.seq:2: unknown participant 'c'"),
        ("participant a: A\nnote c: hi\n", "x.seq:2: unknown participant 'c'"),
        ("participant a: A\na => a: hi\n", "x.seq:2: not a title, participant, note or message"),
        ("title: only\n", "x.seq: no participants"),
    ],
)
def test_sequence_errors_name_the_file_and_line(source: str, message: str) -> None:
    with pytest.raises(diagrams.DiagramError, match=re.escape(message)):
        diagrams.parse_sequence(source, "x.seq")


def test_layers_rows_share_one_width_and_point_down() -> None:
    layers = diagrams.parse_layers("title: L\nrow top: a | bb | ccc\nrow bottom: d\n", "x.layers")
    root = ET.fromstring(diagrams.render_layers(layers))
    rects = list(root.iter(f"{SVG}rect"))
    assert len(rects) == 4
    right = [float(r.get("x", 0)) + float(r.get("width", 0)) for r in rects]
    assert abs(right[2] - right[3]) < 0.5  # the last box of each row ends at the same x
    width = float(root.get("width", 0))
    assert all(x <= width for x in right)
    assert len([ln for ln in root.iter(f"{SVG}line") if ln.get("marker-end")]) == 1
    with pytest.raises(
        diagrams.DiagramError, match=re.escape("x.layers:1: a row needs at least one box")
    ):
        diagrams.parse_layers("row empty: \n", "x.layers")
