"""The verification set's file format: one pydantic model per case kind, told apart by ``kind``.

A set is a YAML file of ``cases``; each case says what to send and what must come back. Every
field is checked when the file is read, so a set that cannot be run fails before any request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

Route = Literal["chat", "completions"]
CASE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResponseExpectation(_Model):
    """What a request that should be answered must come back with. At least one check is named:
    a case that checks nothing would pass against any endpoint."""

    status: int = Field(default=200, ge=200, le=299)
    #: Dotted paths that must be present in the body, e.g. ``usage.total_tokens``, ``choices.0.index``.
    fields: tuple[str, ...] = ()
    finish_reason: tuple[str, ...] = ()
    non_empty: bool = False
    #: usage present, total = prompt + completion, completion within max_tokens.
    usage: bool = False
    #: Words the generated text must contain (case-insensitive): for a real model's known answers.
    contains: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _checks_something(self) -> ResponseExpectation:
        if not self.model_fields_set:
            raise ValueError(
                "names no check: give at least one of status, fields, finish_reason, non_empty, usage, contains"
            )
        return self


class ErrorExpectation(_Model):
    """What a request that must be refused comes back with: a 4xx and words of its message."""

    #: One status, or the statuses accepted (e.g. 400 or 413 for a body over the server's limit).
    status: tuple[Annotated[int, Field(ge=400, le=499)], ...] = Field(min_length=1)
    message_contains: tuple[str, ...] = ()

    @field_validator("status", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, int) else value


Body = dict[str, JsonValue]


class _Case(_Model):
    name: str = Field(pattern=CASE_NAME)


class NormalCase(_Case):
    """A chat or completion request that must be answered in the right shape."""

    kind: Literal["normal"]
    route: Route = "chat"
    request: Body
    expect: ResponseExpectation


class OverlongCase(_Case):
    """An input the model's context cannot hold: a prompt of ``factor`` × the context in ``filler``
    repetitions (each one token or more), or ``max_tokens`` of ``factor`` × the context."""

    kind: Literal["overlong"]
    route: Route = "chat"
    over: Literal["prompt", "max_tokens"] = "prompt"
    factor: float = Field(default=2.0, gt=1.0, le=100.0)
    filler: str = Field(default="hello ", min_length=1, max_length=64)
    expect: ErrorExpectation


class BadInputCase(_Case):
    """A malformed body: ``request`` (sent as JSON, wrong on purpose) or ``raw`` (sent as written)."""

    kind: Literal["bad_input"]
    route: Route = "chat"
    request: Body | None = None
    raw: str | None = None
    expect: ErrorExpectation

    @model_validator(mode="after")
    def _one_body(self) -> BadInputCase:
        if (self.request is None) == (self.raw is None):
            raise ValueError("give exactly one of request (a JSON body) or raw (bytes sent as written)")
        return self


class StructuredCase(_Case):
    """A request whose output must parse as JSON and validate against ``schema``; the runner asks
    for it with ``response_format: json_schema``."""

    kind: Literal["structured"]
    route: Route = "chat"
    request: Body
    schema_: dict[str, JsonValue] = Field(alias="schema")
    expect: ResponseExpectation = ResponseExpectation(status=200)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _is_a_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        from jsonschema import SchemaError
        from jsonschema.validators import validator_for

        try:
            validator_for(value).check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema: {exc.message}") from None
        return value


class MultiTurnCase(_Case):
    """A conversation: each user turn is sent with every earlier turn and the assistant's replies;
    every turn must be answered, and ``expect`` holds for the last."""

    kind: Literal["multi_turn"]
    system: str | None = None
    turns: tuple[str, ...] = Field(min_length=2)
    #: Sampling fields sent with every turn (max_tokens, temperature, ...).
    params: Body = Field(default_factory=dict)
    expect: ResponseExpectation


class GoldenCase(_Case):
    """A greedy request whose output must equal the one recorded from a reference release, token
    for token. The runner sends it with temperature 0; with nothing recorded for it yet, the case
    is reported as not recorded (``fab verify --record``), neither passed nor failed."""

    kind: Literal["golden"]
    route: Route = "chat"
    request: Body


CASE_TYPES = (NormalCase, OverlongCase, BadInputCase, StructuredCase, MultiTurnCase, GoldenCase)
Case = Annotated[
    NormalCase | OverlongCase | BadInputCase | StructuredCase | MultiTurnCase | GoldenCase,
    Field(discriminator="kind"),
]
#: The kinds in the order reports list them, read from the models' own ``kind`` literals.
KINDS: tuple[str, ...] = tuple(get_args(c.model_fields["kind"].annotation)[0] for c in CASE_TYPES)


class SetFile(_Model):
    """The whole file: its cases, in the order they run."""

    cases: tuple[Case, ...] = Field(min_length=1)


class GoldenOutput(_Model):
    text: str
    #: The tokens as the endpoint returned them (logprobs), when it returns them.
    tokens: tuple[str, ...] | None = None
    finish_reason: str | None = None


class GoldenFile(_Model):
    """Greedy outputs of one model from one release, stored in the stack's history beside that
    release (``releases/<id>/verify/<set>.golden.json``): they belong to that model and release,
    not to the set, which every stack may share."""

    model: str = Field(min_length=1)
    release: str = Field(min_length=1)
    recorded_at: str
    outputs: dict[str, GoldenOutput]


class VerifySet(_Model):
    """A set ready to run: its cases, and the golden outputs its golden cases are held to (None:
    nothing recorded yet, or loaded to record them)."""

    source: str
    cases: tuple[Case, ...]
    golden: GoldenFile | None = None
