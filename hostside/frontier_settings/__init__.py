"""Reading a settings file into a pydantic model, with every problem named by file, field and value.

The runtime (``runtime.yaml``), the gateway (``gateway.yaml``) and the toolkit (stack files) all
report problems the same way: ``source: field.path = value: what is allowed``. Rules that span
several fields raise :class:`FieldProblems` from a model validator; each problem keeps the path of
the field it is about, relative to the model that raised it, so the report names that field (not the
model) wherever the model is nested.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class FieldProblem:
    """One broken rule: the field's dotted path, its value, and what is allowed.

    The message names the other fields of the rule as ``{path}`` relative to the same model; they
    are written out under the same prefix as the field, so a rule reads right in ``runtime.yaml``
    (``max_concurrency``) and in a stack file (``runtime.max_concurrency``) alike.
    """

    path: str
    value: object
    message: str
    scope: str = ""

    def under(self, prefix: str) -> FieldProblem:
        def join(a: str, b: str) -> str:
            return f"{a}.{b}" if a and b else a or b

        return FieldProblem(join(prefix, self.path), self.value, self.message, join(prefix, self.scope))

    @property
    def text(self) -> str:
        """The message with the fields it names written out in full."""
        scope = f"{self.scope}." if self.scope else ""
        return self.naming(lambda ref: scope + ref)

    def naming(self, where: Callable[[str], str]) -> str:
        """The message with each field it names written as ``where(path)``."""
        return _FIELD_REF.sub(lambda m: where(m.group(1)), self.message)

    def __str__(self) -> str:
        shown = "" if self.value is None or isinstance(self.value, dict) else f" = {self.value!r}"
        return f"{self.path or '(root)'}{shown}: {self.text}"


_FIELD_REF = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.\[\]]*)\}")


class FieldProblems(ValueError):
    """Raised by a model validator for rules that span fields; carries each problem's own path."""

    def __init__(self, *problems: FieldProblem) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


class ConfigError(ValueError):
    """A settings file that is refused; the message names the file, field and value of each problem."""


def loc_path(loc: tuple[int | str, ...]) -> str:
    """``("models", 1, "runtime", "port")`` → ``models[1].runtime.port``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def problems_of(exc: ValidationError) -> Iterator[FieldProblem]:
    """Every problem of a validation error, cross-field ones at the field they name."""
    for err in exc.errors():
        where = loc_path(err["loc"])
        raised = (err.get("ctx") or {}).get("error")
        if isinstance(raised, FieldProblems):
            for problem in raised.problems:
                yield problem.under(where)
            continue
        value = err.get("input")
        yield FieldProblem(where, None if isinstance(value, dict) else value, err["msg"])


def parse_model(model: type[M], text: str, source: str) -> M:
    """``text`` (YAML) as a ``model``; :class:`ConfigError` naming every problem otherwise."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{source}: {p}" for p in problems_of(exc))) from None


def load_model(model: type[M], path: str | Path) -> M:
    path = Path(path)
    return parse_model(model, path.read_text(), source=str(path))


def to_yaml(model: BaseModel) -> str:
    """A model as YAML in its fields' order, every value written out (defaults too), so the file
    says exactly what the process will run with."""
    text: str = yaml.safe_dump(model.model_dump(mode="json"), sort_keys=False, default_flow_style=False)
    return text
