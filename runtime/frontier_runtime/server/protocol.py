"""The OpenAI request bodies the server accepts, validated into engine ``SamplingParams``.

Validation happens in two stages so that a refused request costs nothing: ``parse_body`` and
``check_supported`` check the shape, ranges and features of the JSON (cheap, before admission),
and ``resolve_max_tokens`` checks the prompt against the model's context once it has been
tokenised (after admission succeeded).
Nothing is dropped silently: an unknown field is a 400 naming it (``extra="forbid"``), and a
field this runtime knows but does not implement (``NOT_IMPLEMENTED``: penalties, n > 1, tools,
audio, ...) is a 400 naming it unless it carries its no-op value (``n: 1``, ``store: false``),
which some clients always send. The README's runtime section lists both sets.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from frontier_hostside.names import INTERACTIVE, PRIORITY_CLASSES
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from frontier_runtime.requests import Continuation, KvTransferParams, SamplingParams, StructuredOutput
from frontier_runtime.server.errors import APIError, invalid

MAX_STOP_SEQUENCES = 16
MAX_STOP_LENGTH = 512
MAX_SEED = 2**63 - 1

Probability = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False


# Known fields this runtime does not implement, with the values that mean "not used" (accepted, as
# they change nothing); any other value is a 400 naming the field.
NOT_IMPLEMENTED_COMMON: dict[str, tuple[Any, ...]] = {
    "min_p": (None, 0, 0.0),
    "min_tokens": (None, 0),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "include_stop_str_in_output": (None, False),
    "truncate_prompt_tokens": (None,),
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "guided_grammar": (None,),
    "guided_decoding_backend": (None,),
    "guided_whitespace_pattern": (None,),
    "structured_outputs": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "metadata": (None, {}),
    "prompt_cache_key": (None,),
}
NOT_IMPLEMENTED_CHAT: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "continue_final_message": (None, False),
    "documents": (None, []),
    "echo": (None, False),
}


class ResponseFormatText(_Body):
    type: Literal["text"]


class ResponseFormatJsonObject(_Body):
    type: Literal["json_object"]


class JsonSchemaFormat(_Body):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(alias="schema")
    # The output always follows the schema, strict or not: accepted, changes nothing.
    strict: bool | None = None


class ResponseFormatJsonSchema(_Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class ContinuationBody(_Body):
    """``frontier_continuation``: carry on a generation another replica began (the gateway sends it
    when it migrates a stream). The prompt is the request's own, tokenised here as it was there;
    ``token_ids`` are the tokens generated so far (they count against max_tokens), and
    ``emitted_chars`` how many characters of their text the client already has."""

    token_ids: list[Annotated[int, Field(ge=0)]] = Field(max_length=1_048_576)
    emitted_chars: int = Field(default=0, ge=0)


class KvTransferBody(BaseModel):
    """vLLM's ``kv_transfer_params`` (its NixlConnector's fields): ``do_remote_decode`` to a prefill
    replica; ``do_remote_prefill`` with the prefill's answer to a decode replica. Fields of other
    connectors are ignored, as vLLM's proxy passes them along."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = Field(default=None, max_length=256)
    remote_request_id: str | None = Field(default=None, max_length=512)
    remote_host: str | None = Field(default=None, max_length=253)
    remote_port: int | None = Field(default=None, ge=1, le=65535)
    remote_block_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=1_048_576)
    tp_size: int = Field(default=1, ge=1, le=1)


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema, Field(discriminator="type")
]


class GenerationRequest(_Body):
    """The fields and checks both generation routes share."""

    model: str | None = Field(default=None, max_length=512)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: Probability = 1.0
    top_k: int = Field(default=0, ge=-1, le=1_000_000)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=64)
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=256)  # recorded in the request log
    safety_identifier: str | None = Field(default=None, max_length=256)  # recorded in the request log
    # Structured output: OpenAI's response_format, and vLLM's guided_* extensions.
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(default=None, max_length=4096)
    guided_choice: list[Annotated[str, Field(min_length=1, max_length=1024)]] | None = Field(
        default=None, min_length=1, max_length=256
    )

    frontier_continuation: ContinuationBody | None = None
    kv_transfer_params: KvTransferBody | None = None

    NOT_IMPLEMENTED: ClassVar[dict[str, tuple[Any, ...]]] = NOT_IMPLEMENTED_COMMON
    # The request's class (the gateway sets it from the tenant's): batch work is admitted only on
    # capacity interactive work leaves free, and preempted first.
    priority: Literal[PRIORITY_CLASSES] = INTERACTIVE  # type: ignore[valid-type]

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else (value or [])
        if len(items) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(items)}")
        for item in items:
            if not item or len(item) > MAX_STOP_LENGTH:
                raise ValueError(
                    f"each stop sequence must be 1..{MAX_STOP_LENGTH} characters, got {len(item)}"
                )
        return value

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def check_supported(self) -> None:
        """400 for fields this server knows but cannot honour."""
        if self.n != 1:
            raise invalid(f"n = {self.n} is not supported: send one request per choice (n must be 1)", "n")
        if self.presence_penalty != 0.0:
            raise invalid("presence_penalty is not supported (must be 0)", "presence_penalty")
        if self.frequency_penalty != 0.0:
            raise invalid("frequency_penalty is not supported (must be 0)", "frequency_penalty")
        if self.repetition_penalty != 1.0:
            raise invalid("repetition_penalty is not supported (must be 1)", "repetition_penalty")
        if self.logit_bias:
            raise invalid("logit_bias is not supported", "logit_bias")
        constraints = [
            name
            for name, value in (
                ("response_format", self.structured_output_param() if self.response_format else None),
                ("guided_json", self.guided_json),
                ("guided_regex", self.guided_regex),
                ("guided_choice", self.guided_choice),
            )
            if value is not None
        ]
        if len(constraints) > 1:
            raise invalid(
                f"at most one output constraint per request, got {', '.join(constraints)}", constraints[1]
            )
        if constraints and self.stop:
            raise invalid(
                f"stop cannot be combined with {constraints[0]}: a stop sequence would cut the structured "
                f"output short",
                "stop",
            )

    def structured_output_param(self) -> str | None:
        """The body field that carries the output constraint, named in errors; None when there is none."""
        rf = self.response_format
        if isinstance(rf, ResponseFormatJsonSchema):
            return "response_format.json_schema.schema"
        if isinstance(rf, ResponseFormatJsonObject):
            return "response_format"
        for name in ("guided_json", "guided_regex", "guided_choice"):
            if getattr(self, name) is not None:
                return name
        return None

    def structured_output(self) -> StructuredOutput | None:
        rf = self.response_format
        if isinstance(rf, ResponseFormatJsonObject):
            return StructuredOutput("json_object")
        if isinstance(rf, ResponseFormatJsonSchema):
            return StructuredOutput("json_schema", json.dumps(rf.json_schema.schema_, sort_keys=True))
        if self.guided_json is not None:
            spec = self.guided_json
            text = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
            return StructuredOutput("json_schema", text)
        if self.guided_regex is not None:
            return StructuredOutput("regex", self.guided_regex)
        if self.guided_choice is not None:
            return StructuredOutput("choice", json.dumps(self.guided_choice))
        return None

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def max_tokens_param(self) -> str:
        """The field that set the completion length, named in errors."""
        return "max_tokens"

    def requested_logprobs(self) -> int | None:
        """Top-N logprobs per token; None when not asked for."""
        raise NotImplementedError

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(0, self.top_k),
            seed=self.seed,
            stop=stop,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            logprobs=self.requested_logprobs(),
            structured=self.structured_output(),
            priority=self.priority,
            continuation=self.continuation(),
            kv_transfer=self.kv_transfer(),
        )

    def kv_transfer(self) -> KvTransferParams | None:
        body = self.kv_transfer_params
        if body is None or not (body.do_remote_decode or body.do_remote_prefill):
            return None
        try:
            return KvTransferParams(**{**body.model_dump(), "remote_block_ids": tuple(body.remote_block_ids)})
        except ValueError as exc:
            raise APIError(400, str(exc), param="kv_transfer_params") from None

    def continuation(self) -> Continuation | None:
        body = self.frontier_continuation
        if body is None:
            return None
        return Continuation(tuple(body.token_ids), body.emitted_chars)


PromptTokens = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(GenerationRequest):
    prompt: str | PromptTokens | list[str] | list[PromptTokens]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=128)

    def _is_batch(self) -> bool:
        prompt = self.prompt
        return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str | list)

    def single_prompt(self) -> str | list[int]:
        """The prompt: text or token ids (``check_supported`` refuses more than one)."""
        return self.prompt[0] if self._is_batch() else self.prompt  # type: ignore[return-value]

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def check_supported(self) -> None:
        super().check_supported()
        if self._is_batch() and len(self.prompt) != 1:
            raise invalid(
                f"prompt holds {len(self.prompt)} prompts; send one prompt per request",
                "prompt",
                "batch_not_supported",
            )
        if self.suffix:
            raise invalid("suffix is not supported", "suffix")
        if self.best_of not in (None, 1):
            raise invalid(f"best_of = {self.best_of} is not supported (must be 1)", "best_of")
        if self.echo and self.stream:
            raise invalid("echo is not supported together with stream", "echo")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=256)

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name:
            message["name"] = self.name
        return message


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True

    NOT_IMPLEMENTED: ClassVar[dict[str, tuple[Any, ...]]] = NOT_IMPLEMENTED_COMMON | NOT_IMPLEMENTED_CHAT

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs requires logprobs = true", "top_logprobs")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def requested_logprobs(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


def parse_body(model: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` into ``model``; a failure is a 400 naming the field and the problem."""
    if not isinstance(data, dict):
        raise invalid(f"the request body must be a JSON object, got {type(data).__name__}")
    not_implemented: dict[str, tuple[Any, ...]] = getattr(model, "NOT_IMPLEMENTED", {})
    if not_implemented.keys() & data.keys():
        data = dict(data)
        for name in sorted(not_implemented.keys() & data.keys()):
            value = data.pop(name)
            if not any(value == v and type(value) is type(v) for v in not_implemented[name]):
                raise invalid(
                    f"{name} is not supported by this runtime (got {json.dumps(value)[:80]}); leave it out",
                    name,
                    "unsupported_parameter",
                )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _validation_error(exc: ValidationError) -> APIError:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    if first["type"] == "extra_forbidden":
        param = ".".join(str(p) for p in first["loc"])
        return invalid(
            f"{param}: unknown field; this runtime does not implement it (leave it out)",
            param,
            "unsupported_parameter",
        )
    # Union branches show up in the location (``prompt.str``); keep only real field names and indices.
    loc = [str(p) for p in first["loc"] if isinstance(p, int) or not _looks_like_type(str(p))]
    where = ".".join(loc) or None
    extra = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return invalid(f"{where or 'body'}: {first['msg']}{extra}", where)


def _looks_like_type(part: str) -> bool:
    return any(ch in part for ch in "[]()") or part in {
        "str",
        "int",
        "float",
        "bool",
        "list",
        "dict",
        "function-after",
    }


def resolve_max_tokens(
    requested: int | None, prompt_tokens: int, max_seq_len: int, *, tokens_param: str, prompt_param: str
) -> int:
    """``max_tokens`` that fits the context: omitted → what is left; too many → 400 naming both numbers."""
    room = max_seq_len - prompt_tokens
    if room < 1:
        raise invalid(
            f"This model's maximum context length is {max_seq_len} tokens. However, your prompt has "
            f"{prompt_tokens} tokens, which leaves no room for any output. Please reduce the prompt.",
            prompt_param,
            "context_length_exceeded",
        )
    if requested is None:
        return room
    if requested > room:
        raise invalid(
            f"This model's maximum context length is {max_seq_len} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, {requested} for the "
            f"completion). Please reduce the prompt or {tokens_param}.",
            tokens_param,
            "context_length_exceeded",
        )
    return requested
