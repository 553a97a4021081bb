"""The demo's variants of the stack file: the file read as YAML, changed, written under a comment
that says what changed, and loaded as the stack in its place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from frontier.config.schema import Settings
from frontier.targets import load_stack


def stack_document(settings: Settings) -> Any:
    """The stack file ``settings`` were loaded from, as YAML to change."""
    return yaml.safe_load(Path(settings.source).read_text())


def load_variant(settings: Settings, document: Any, path: Path, comment: str) -> Settings:
    """``document`` written to ``path`` under the line ``# comment``, loaded as ``settings``'s stack."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {comment}\n" + yaml.safe_dump(document, sort_keys=False))
    return load_stack(settings.stack, path=path)
