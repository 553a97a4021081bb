"""The check of a finished structured output: does the text parse, and match its constraint?

The grammar makes a complete output valid by construction; this check is what would notice a
grammar library that let something through, and its failures are logged with the raw output.
JSON schemas are checked with ``jsonschema`` (the draft the schema names, else 2020-12).
"""

from __future__ import annotations

import json
import re

import jsonschema

from frontier_runtime.requests import StructuredOutput


def output_problem(output: StructuredOutput, text: str) -> str | None:
    """Why ``text`` does not satisfy ``output``; None when it does."""
    if output.kind in ("json_object", "json_schema"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            return f"not valid JSON: {exc}"
        if output.kind == "json_object":
            return None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
        schema = json.loads(output.spec)
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        error = jsonschema.exceptions.best_match(validator(schema).iter_errors(value))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"does not match the schema at {where}: {error.message}"
    if output.kind == "choice":
        choices = json.loads(output.spec)
        return None if text in choices else f"{text!r} is not one of the {len(choices)} choices"
    try:  # llguidance's regex dialect is Rust's; most patterns read the same in Python's re
        pattern = re.compile(output.spec)
    except re.error:
        return None
    return None if pattern.fullmatch(text) else f"does not match the regex {output.spec!r}"
