"""The one Jinja environment every rendered file comes from (``templates/``).

StrictUndefined (a missing value is an error, never an empty string), no autoescaping (these are
config files, not HTML). Rendering is pure: the same settings and digest give the same bytes — no
clocks, no hostnames, no ordering taken from sets or dicts we did not sort.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
from frontier_settings import to_yaml

from frontier import project
from frontier.errors import FrontierError

TEMPLATES_DIR = project.templates_dir()


def _quote(value: object) -> str:
    """A scalar as a YAML/JSON literal: strings double-quoted and escaped, numbers and bools bare."""
    return json.dumps(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = _quote
    env.filters["yaml"] = to_yaml
    return env


ENV = _environment()


def render_template(template: str, **context: Any) -> str:
    """``templates/<template>`` rendered with ``context``; a missing value is an error."""
    try:
        return ENV.get_template(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise FrontierError(f"templates/{template}: {exc}") from exc
