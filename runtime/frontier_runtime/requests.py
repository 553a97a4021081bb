"""What a request carries into the engine and what comes back: ``SamplingParams`` (with its
``StructuredOutput`` constraint) in, ``RequestOutput`` deltas (with ``TokenLogprob``) out.

The bottom of the runtime: the engine, the structured-output decoder and the server all speak
these types, and this module imports none of them. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from frontier_hostside import names

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)
StructuredKind = Literal["json_object", "json_schema", "regex", "choice"]
STRUCTURED_KINDS: tuple[StructuredKind, ...] = get_args(StructuredKind)


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on a request's output (``frontier_runtime.structured`` enforces it).

    ``spec`` is JSON text for ``json_schema`` (the schema) and ``choice`` (the list of strings),
    the pattern for ``regex``, and empty for ``json_object`` (any JSON object).
    """

    kind: StructuredKind
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(f"structured output kind {self.kind!r} is not one of {list(STRUCTURED_KINDS)}")


@dataclass(frozen=True)
class Continuation:
    """A generation another replica began, to be carried on here (a migrated stream).

    ``output_token_ids`` are the tokens already generated: the sequence starts as the prompt plus
    them, they count against ``max_tokens``, a constraint's grammar consumes them, a seeded
    generator is advanced past their draws, and the detokenizer reads them so stop strings and
    multi-byte characters that span the cut are found. ``emitted_chars`` is how much of their text
    the client already has: only text past it is sent.
    """

    output_token_ids: tuple[int, ...]
    emitted_chars: int = 0

    def __post_init__(self) -> None:
        if self.emitted_chars < 0:
            raise ValueError(f"emitted_chars must be >= 0, got {self.emitted_chars}")


@dataclass(frozen=True)
class KvTransferParams:
    """vLLM's ``kv_transfer_params`` (its NixlConnector's fields), in both directions.

    To a prefill replica: ``do_remote_decode`` (keep the prompt's KV for a decode replica). Back
    from it, and on to the decode replica: ``do_remote_prefill`` with where the blocks are
    (``remote_host``:``remote_port`` of engine ``remote_engine_id``, lease ``remote_request_id``)
    and which (``remote_block_ids``, in prompt order).
    """

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = None
    remote_request_id: str | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    remote_block_ids: tuple[int, ...] = ()
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.do_remote_decode and self.do_remote_prefill:
            raise ValueError("kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true")
        if self.do_remote_prefill:
            for name in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port"):
                if getattr(self, name) in (None, ""):
                    raise ValueError(f"kv_transfer_params.{name} is required with do_remote_prefill")
        if self.remote_port is not None and not 1 <= self.remote_port <= 65535:
            raise ValueError(
                f"kv_transfer_params.remote_port must be within 1..65535, got {self.remote_port}"
            )
        if any(b < 0 for b in self.remote_block_ids):
            raise ValueError("kv_transfer_params.remote_block_ids must be block ids >= 0")
        if self.tp_size != 1:
            raise ValueError(
                f"kv_transfer_params.tp_size must be 1 (one rank's cache moves), got {self.tp_size}"
            )

    def to_json(self) -> dict[str, object]:
        return {
            "do_remote_decode": self.do_remote_decode,
            "do_remote_prefill": self.do_remote_prefill,
            "remote_engine_id": self.remote_engine_id,
            "remote_request_id": self.remote_request_id,
            "remote_host": self.remote_host,
            "remote_port": self.remote_port,
            "remote_block_ids": list(self.remote_block_ids),
            "tp_size": self.tp_size,
        }


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token; None = off
    structured: StructuredOutput | None = None  # None: free text
    priority: str = names.INTERACTIVE  # one of names.PRIORITY_CLASSES
    kv_transfer: KvTransferParams | None = None  # prefill/decode disaggregation; None: colocated
    continuation: Continuation | None = None  # None: a fresh generation

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be within 0..2, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be within (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be within 0..20, got {self.logprobs}")
        if self.priority not in names.PRIORITY_CLASSES:
            raise ValueError(f"priority {self.priority!r} is not one of {list(names.PRIORITY_CLASSES)}")
        if self.structured is not None and self.stop:
            # A stop string could cut the output short of what the constraint guarantees.
            raise ValueError("stop sequences cannot be combined with a structured output constraint")
        if self.continuation is not None and len(self.continuation.output_token_ids) >= self.max_tokens:
            raise ValueError(
                f"the continuation already holds {len(self.continuation.output_token_ids)} generated tokens, "
                f"which leaves none of max_tokens {self.max_tokens}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class EngineTimes:
    """When the engine took a request, first ran it, sampled its first token and finished it
    (``time.monotonic()``; None until then). One object per request, written by the engine's
    thread as it goes and shared by reference with every output, so keeping it costs the engine
    one clock read per step; request traces are built from it after the request ends."""

    added: float
    scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass
class RequestOutput:
    """One request's progress in one step: ``new_token_ids`` and ``new_text`` are the deltas since
    its previous output; the last output has ``finished`` set."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    # What ended a "stop": the stop token id (not part of the text) or the stop string.
    stop_reason: int | str | None = None
    # The request's timeline in the engine (the same object on each of its outputs); None from
    # engines that keep none.
    times: EngineTimes | None = None
    # On a prefill replica's last output: where a decode replica fetches the prompt's KV blocks.
    kv_transfer_params: KvTransferParams | None = None
