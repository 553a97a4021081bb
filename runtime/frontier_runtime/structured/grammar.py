"""A request's ``StructuredOutput`` as an llguidance grammar, or a ``GrammarError`` naming the problem.

Why llguidance rather than xgrammar (both are maintained and both install here):

- it compiles lazily: building a matcher for a new JSON schema takes about a millisecond, with no
  up-front compile per schema, so a schema that every request brings anew costs nothing to cache;
- its validation names the problem: an unknown type, an unknown ``format``, keywords it does not
  implement (``Unimplemented keys: ["if", "then"]``), an unsatisfiable schema, a regex's parse
  error with its position; each becomes the 400 the client sees;
- masks are computed in Rust with the GIL released (``LLExecutor``), so a Python thread can fill
  the next step's masks while the model runs, on CPU and CUDA alike, and one token's mask takes
  tens of microseconds;
- the wheel has no dependencies (no transformers, no JIT-compiled kernel at run time).

JSON grammars are compact (no free whitespace between tokens): a free-whitespace grammar lets a
weak model spend its whole budget on blanks, and the output is the same JSON either way.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING

import llguidance

from frontier_runtime.requests import StructuredOutput

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # declared in the stub only

# Applied before the schema's own "x-guidance" options.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
MAX_CHOICES = 256
MAX_SPEC_CHARS = 256 * 1024
_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$#&\-~])")


class GrammarError(ValueError):
    """The constraint cannot be compiled; the message names the problem."""


def _escape(text: str) -> str:
    """A literal for llguidance's (Rust) regex syntax."""
    return _REGEX_META.sub(r"\\\1", text)


def _build(output: StructuredOutput) -> str:
    if len(output.spec) > MAX_SPEC_CHARS:
        raise GrammarError(
            f"the {output.kind} constraint is {len(output.spec)} characters; at most {MAX_SPEC_CHARS}"
        )
    if output.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if output.kind == "json_schema":
        try:
            schema = json.loads(output.spec)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
        try:
            # A boolean schema goes as its JSON text: llguidance reads both forms alike.
            spec = schema if isinstance(schema, dict) else json.dumps(schema)
            return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema cannot be compiled: {exc}") from None
    if output.kind == "regex":
        if not output.spec:
            raise GrammarError("the regex is empty")
        return llguidance.LLMatcher.grammar_from_regex(output.spec)
    choices = json.loads(output.spec)
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("choice must be a non-empty list of non-empty strings")
    if len(choices) > MAX_CHOICES:
        raise GrammarError(f"choice holds {len(choices)} strings; at most {MAX_CHOICES}")
    return llguidance.LLMatcher.grammar_from_regex("|".join(f"({_escape(c)})" for c in choices))


@lru_cache(maxsize=512)
def compile_grammar(output: StructuredOutput) -> str:
    """The llguidance grammar for ``output``, validated; raises ``GrammarError`` naming the problem.

    Cached: clients usually send the same schema again and again.
    """
    grammar = _build(output)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        what = {"json_schema": "JSON schema", "regex": "regex", "choice": "choice list"}.get(
            output.kind, output.kind
        )
        raise GrammarError(f"the {what} is not supported: {' '.join(messages).strip()}")
    return grammar
