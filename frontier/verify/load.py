"""Read a verification set and its golden outputs, refusing either with the file, line and field.

Everything that can be known without the endpoint is checked here: the case kinds, each case's
expectation, unique names, and that the golden outputs were recorded for the model being verified.
YAML's node marks give the lines (``yaml.compose``); golden outputs are JSON, which YAML reads too.
Where the golden outputs are kept (the stack's history) is the caller's: this module reads text.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from frontier import project
from frontier.errors import FrontierError
from frontier.verify.cases import KINDS, GoldenCase, GoldenFile, GoldenOutput, SetFile, VerifySet

Loc = tuple[str | int, ...]


class VerifySetError(FrontierError):
    """A verification set (or its golden file) that cannot be run as written."""


class Problem(BaseModel):
    """One thing wrong in a file: where (a path of keys and indexes) and what."""

    path: Loc
    text: str
    value: str = ""


@dataclass(frozen=True)
class Recording:
    """Golden outputs as stored (a :class:`GoldenFile` as JSON) and where they were read from, which
    messages name: an ``s3://`` URI in the stack's history, or a file."""

    where: str
    text: str


def set_file(file: str) -> Path:
    """The set a stack's ``verify.file`` names: relative paths are the project's."""
    path = Path(file)
    return path if path.is_absolute() else project.root() / path


def read_set(path: Path, *, model: str, golden: Recording | None) -> VerifySet:
    """The set at ``path``, its golden cases held to ``golden`` (recorded for ``model``).

    Without ``golden`` (nothing recorded yet, or the run is about to record) the golden cases are
    run as not recorded; so is a golden case added to the set after the recording was made."""
    root, data = _read(str(path), _text(path))
    try:
        parsed = SetFile.model_validate(data)
    except ValidationError as exc:
        raise VerifySetError(_describe(str(path), root, _problems(exc))) from None
    problems = list(_repeated_names(parsed))
    if problems:
        raise VerifySetError(_describe(str(path), root, problems))
    held = None
    if golden is not None and any(isinstance(c, GoldenCase) for c in parsed.cases):
        held = _golden_for(golden, model)
    return VerifySet(source=str(path), cases=parsed.cases, golden=held)


def golden_path(set_path: Path) -> Path:
    """Where a working copy of a set keeps its golden outputs: beside it, ``<set>.golden.json``."""
    return set_path.with_name(f"{set_path.stem}.golden.json")


def load_set(path: Path, *, model: str, recording: bool = False) -> VerifySet:
    """A working copy of a set (a quality sweep's, in its own folder) with the golden outputs
    beside it, if any; ``recording`` reads none: the run is about to write them. A stack's
    golden outputs are kept in its history instead (:func:`read_set` with what it holds)."""
    beside = golden_path(path)
    golden = None if recording or not beside.is_file() else Recording(str(beside), beside.read_text())
    return read_set(path, model=model, golden=golden)


def write_golden(set_path: Path, model: str, release: str, outputs: dict[str, GoldenOutput]) -> Path:
    """Store the outputs recorded from ``release`` beside a working copy of a set."""
    target = golden_path(set_path)
    target.write_text(golden_text(model, release, outputs))
    return target


def golden_text(model: str, release: str, outputs: dict[str, GoldenOutput]) -> str:
    """The outputs recorded from ``release``, as stored (JSON)."""
    golden = GoldenFile(
        model=model,
        release=release,
        recorded_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        outputs=outputs,
    )
    return json.dumps(golden.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def _golden_for(recording: Recording, model: str) -> GoldenFile:
    golden_root, data = _read(recording.where, recording.text)
    try:
        golden = GoldenFile.model_validate(data)
    except ValidationError as exc:
        raise VerifySetError(_describe(recording.where, golden_root, _problems(exc))) from None
    if golden.model != model:
        raise VerifySetError(
            _describe(
                recording.where,
                golden_root,
                [
                    Problem(
                        path=("model",),
                        text=f"recorded for another model (release {golden.release}); this run verifies "
                        f"{model!r}: record again with `fab verify --record`",
                        value=repr(golden.model),
                    )
                ],
            )
        )
    return golden


def _text(path: Path) -> str:
    if not path.is_file():
        raise VerifySetError(f"{path}: no such verification file")
    return path.read_text()


def _read(where: str, text: str) -> tuple[yaml.Node, Any]:
    """The file's node tree (for line numbers) and its data."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise VerifySetError(f"{where}:{line}: not valid YAML: {exc.problem}") from None
    if root is None or not isinstance(data, dict):
        raise VerifySetError(f"{where}:1: expected a mapping with 'cases:' at the top")
    return root, data


def _repeated_names(parsed: SetFile) -> list[Problem]:
    # Reports and golden outputs find cases by name: two of one name would share a recording.
    seen: set[str] = set()
    problems = []
    for index, case in enumerate(parsed.cases):
        if case.name in seen:
            problems.append(
                Problem(
                    path=("cases", index, "name"), text="another case has this name", value=repr(case.name)
                )
            )
        seen.add(case.name)
    return problems


def _problems(exc: ValidationError) -> list[Problem]:
    """Each problem once, where it is: a list whose item failed is also "too short" to pydantic
    (the failed item is not counted), which says nothing the item's own problem does not."""
    problems = [_problem(e) for e in exc.errors()]
    return [
        p
        for p in problems
        if not any(len(q.path) > len(p.path) and q.path[: len(p.path)] == p.path for q in problems)
    ]


def _problem(error: ErrorDetails) -> Problem:
    """A pydantic error in the words of the file: the tag pydantic puts after a case's index
    (``cases.3.normal.expect``) is not a key of the file, so it is left out of the path."""
    loc = error["loc"]
    path: Loc = tuple(
        part for i, part in enumerate(loc) if not (part in KINDS and i > 0 and isinstance(loc[i - 1], int))
    )
    kinds = ", ".join(KINDS)
    kind = error["type"]
    if kind == "union_tag_invalid":
        tag = (error.get("ctx") or {}).get("tag")
        return Problem(
            path=(*path, "kind"), text=f"unknown case kind; the kinds are {kinds}", value=repr(tag)
        )
    if kind == "union_tag_not_found":
        return Problem(path=(*path, "kind"), text=f"missing: every case names its kind ({kinds})")
    if kind == "missing" and path[-1:] == ("expect",):
        return Problem(
            path=path, text="missing: a case with no expectation checks nothing; say what must come back"
        )
    if kind == "missing" and path[-1:] == ("schema",):
        return Problem(path=path, text="missing: the JSON Schema the output must validate against")
    if kind == "extra_forbidden":
        return Problem(path=path, text="unknown field")
    value = error.get("input")
    shown = "" if kind == "missing" or isinstance(value, dict | list) else repr(value)
    return Problem(path=path, text=error["msg"].removeprefix("Value error, "), value=shown)


def _describe(file: str, root: yaml.Node, problems: list[Problem]) -> str:
    lines = [f"{file}: {len(problems)} problem(s)"] if len(problems) > 1 else []
    for p in problems:
        shown = f" = {p.value}" if p.value else ""
        lines.append(f"{file}:{_line(root, p.path)}: {_field(p.path)}{shown}: {p.text}")
    return "\n".join(lines)


def _field(path: Loc) -> str:
    """``("cases", 3, "expect")`` → ``cases[3].expect``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top)"


def _line(root: yaml.Node, path: Loc) -> int:
    """The line where the deepest field of ``path`` that the file has is written (a missing field:
    its parent's line). A mapping's field is on its key's line; a nested value starts below it."""
    node, line = root, root.start_mark.line + 1
    for part in path:
        found = _child(node, part)
        if found is None:
            break
        node, mark = found
        line = mark.line + 1
    return line


def _child(node: yaml.Node, part: str | int) -> tuple[yaml.Node, yaml.Mark] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == str(part):
                return value, key.start_mark
        return None
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        item: yaml.Node = node.value[part]
        return item, item.start_mark
    return None
