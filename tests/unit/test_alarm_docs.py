"""docs/operate.md's table of the named alarms is the declaration's own (``python -m frontier.alarms``)."""

from __future__ import annotations

from pathlib import Path

from frontier.alarms import TABLE_BEGIN, TABLE_END, alarm_table_markdown

OPERATE = Path(__file__).resolve().parents[2] / "docs" / "operate.md"


def test_the_operators_alarm_table_is_generated_from_the_declaration():
    text = OPERATE.read_text()
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END) + len(TABLE_END)
    assert text[begin:end] == alarm_table_markdown(), "regenerate it: .venv/bin/python -m frontier.alarms"
