"""AsyncEngine: one engine thread, asyncio streams, thread-safe abort, batch window, heartbeat."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from engine_fixtures import Reference
from frontier_runtime.engine.api import EngineDeadError
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.engine.loop import AsyncEngine
from frontier_runtime.requests import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


@pytest.fixture
def aengine(tied_dir):  # noqa: ANN001, ANN201
    engine = AsyncEngine(LLMEngine(tied_dir, max_batch_size=8))
    yield engine
    engine.shutdown()


async def _consume(stream) -> tuple[list[int], str, str | None]:  # noqa: ANN001
    tokens, text, reason = [], "", None
    async for out in stream:
        tokens += out.new_token_ids
        text += out.new_text
        reason = out.finish_reason
    return tokens, text, reason


def test_concurrent_streams_return_the_reference_outputs(aengine: AsyncEngine, tied_ref: Reference) -> None:
    async def main() -> list:
        streams = [aengine.submit(f"r{i}", p, GREEDY) for i, p in enumerate(tied_ref.prompts)]
        return await asyncio.gather(*(_consume(s) for s in streams))

    results = asyncio.run(main())
    assert [tokens for tokens, _, _ in results] == tied_ref.outputs
    assert [text for _, text, _ in results] == [aengine.tokenizer.decode(o) for o in tied_ref.outputs]


def test_leaving_a_stream_early_aborts_the_request_and_frees_its_blocks(
    aengine: AsyncEngine, tied_ref: Reference
) -> None:
    async def main() -> None:
        stream = aengine.submit("early", tied_ref.prompts[5], SamplingParams(max_tokens=200, temperature=0.0))
        async for out in stream:
            if out.completion_tokens >= 3:
                break
        await stream.aclose()

    asyncio.run(main())
    stats = aengine.call(lambda e: e.stats()).result(timeout=30)
    assert stats.running == 0 and stats.kv_blocks_free == stats.kv_blocks_total


def test_abort_from_another_thread_ends_the_stream_with_reason_abort(
    aengine: AsyncEngine, tied_ref: Reference
) -> None:
    # The loop thread is held between two steps once the request has two tokens, so the abort lands
    # mid-stream however fast the engine runs or however late this thread sees its outputs.
    held, release = threading.Event(), threading.Event()

    def hold_at_two_tokens(engine: LLMEngine) -> bool:
        seq = engine._seqs.get("x")
        if seq is None or seq.num_output_tokens < 2:
            return False
        held.set()
        release.wait(30)
        return True

    async def main() -> str | None:
        stream = aengine.submit(
            "x", tied_ref.prompts[3], SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        )
        while not held.is_set():
            call = aengine.call(hold_at_two_tokens)
            while not (call.done() or held.wait(0.001)):
                await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, aengine.abort, "x")
        release.set()
        reason, tokens = None, 0
        async for out in stream:
            reason, tokens = out.finish_reason, out.completion_tokens
        assert 2 <= tokens < 400
        return reason

    assert asyncio.run(main()) == "abort"
    stats = aengine.call(lambda e: e.stats()).result(timeout=30)
    assert stats.kv_blocks_free == stats.kv_blocks_total


def test_a_cancelled_consumer_task_aborts_its_request(aengine: AsyncEngine, tied_ref: Reference) -> None:
    async def main() -> None:
        task = asyncio.create_task(
            _consume(
                aengine.submit("c", tied_ref.prompts[3], SamplingParams(max_tokens=400, ignore_eos=True))
            )
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 30
    while aengine.stats().running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert aengine.stats().running == 0


def test_bad_requests_raise_at_submit(aengine: AsyncEngine) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="at least one token"):
            aengine.submit("bad", [], GREEDY)

    asyncio.run(main())


def test_warmup_runs_a_real_forward_and_the_heartbeat_advances_while_idle(aengine: AsyncEngine) -> None:
    assert aengine.warmup() > 0
    assert aengine.stats().steps >= 2
    before = aengine.heartbeat
    time.sleep(aengine.idle_poll_s * 3)
    assert aengine.heartbeat > before


def test_the_batch_window_gathers_companions_when_the_engine_is_idle(tied_dir) -> None:  # noqa: ANN001
    engine = AsyncEngine(LLMEngine(tied_dir, max_batch_size=8, window_ms=300))
    try:

        async def main() -> None:
            first = engine.submit("a", [1, 5, 6], SamplingParams(max_tokens=1))
            await asyncio.sleep(0.05)  # arrives inside the window
            second = engine.submit("b", [1, 7, 8], SamplingParams(max_tokens=1))
            await asyncio.gather(_consume(first), _consume(second))

        asyncio.run(main())
        stats = engine.stats()
        assert stats.steps == 1 and stats.last_batch_size == 2
    finally:
        engine.shutdown()


def test_the_batch_window_does_not_delay_requests_joining_a_busy_engine(tied_dir) -> None:  # noqa: ANN001
    engine = AsyncEngine(LLMEngine(tied_dir, max_batch_size=8, window_ms=1000))
    try:

        async def main() -> float:
            busy = asyncio.create_task(
                _consume(engine.submit("busy", [1, 5, 6], SamplingParams(max_tokens=300, ignore_eos=True)))
            )
            while engine.stats().steps < 2:
                await asyncio.sleep(0.01)
            start = time.monotonic()
            stream = engine.submit("late", [1, 7, 8], SamplingParams(max_tokens=1))
            await _consume(stream)
            waited = time.monotonic() - start
            engine.abort("busy")
            await busy
            return waited

        assert asyncio.run(main()) < 0.9  # a window would have held it for 1 s
    finally:
        engine.shutdown()


def test_shutdown_ends_open_streams_and_refuses_new_ones(tied_dir, tied_ref: Reference) -> None:  # noqa: ANN001
    engine = AsyncEngine(LLMEngine(tied_dir, max_batch_size=8))

    async def main() -> str | None:
        stream = engine.submit("s", tied_ref.prompts[0], SamplingParams(max_tokens=500, ignore_eos=True))
        reason = None
        async for out in stream:
            if out.completion_tokens == 1:
                await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
            reason = out.finish_reason
        with pytest.raises(EngineDeadError):
            engine.submit("t", [1, 2], GREEDY)
        return reason

    assert asyncio.run(main()) == "abort"
    assert not engine.is_running


def test_a_stop_string_ends_the_stream_before_it_and_frees_the_request(
    aengine: AsyncEngine, tied_ref: Reference
) -> None:
    full = aengine.tokenizer.decode(tied_ref.outputs[2])
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    params = SamplingParams(max_tokens=24, temperature=0.0, stop=(stop,))

    async def main() -> list:
        return [out async for out in aengine.submit("s", tied_ref.prompts[2], params)]

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop
    assert [o for o in outs if o.finished] == [outs[-1]]  # nothing after the end
    assert "".join(o.new_text for o in outs) == full[: full.index(stop)]
    tokens = [t for o in outs for t in o.new_token_ids]
    assert tokens == tied_ref.outputs[2][: len(tokens)]
    # The engine computed a token or two more before the abort reached it; then it let go.
    stats = aengine.call(lambda e: e.stats()).result(timeout=30)
    assert stats.running == 0 and stats.kv_blocks_free == stats.kv_blocks_total


def test_text_is_decoded_on_the_output_thread_not_the_engine_thread(
    aengine: AsyncEngine, tied_ref: Reference
) -> None:
    decoding_threads: set[str] = set()
    tokenizer = aengine.tokenizer
    decode, decode_stream = tokenizer.decode, tokenizer.decode_stream

    def recording_decode(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        decoding_threads.add(threading.current_thread().name)
        return decode(*args, **kwargs)

    def recording_stream(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        step = decode_stream(*args, **kwargs)

        def recording_step(token_id: int) -> str | None:
            decoding_threads.add(threading.current_thread().name)
            return step(token_id)

        return recording_step

    tokenizer.decode, tokenizer.decode_stream = recording_decode, recording_stream
    try:
        results = asyncio.run(_consume_all(aengine, tied_ref.prompts[:4]))
    finally:
        del tokenizer.decode, tokenizer.decode_stream
    assert [text for _, text, _ in results] == [decode(o) for o in tied_ref.outputs[:4]]
    assert decoding_threads == {"frontier-engine-outputs"}


async def _consume_all(engine: AsyncEngine, prompts: list[list[int]]) -> list:
    streams = [engine.submit(f"d{i}", p, GREEDY) for i, p in enumerate(prompts)]
    return await asyncio.gather(*(_consume(s) for s in streams))
