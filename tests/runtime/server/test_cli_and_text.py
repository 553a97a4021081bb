"""The command line's refusals, and chat rendering with and without the model's template."""

from __future__ import annotations

from pathlib import Path

import pytest
from frontier_runtime.__main__ import main
from frontier_runtime.server.protocol import resolve_max_tokens
from frontier_runtime.server.text import TemplateRenderError, TextCodec
from frontier_runtime.tokenizer import Tokenizer
from server_harness import ENGINE_MAX_SEQ_LEN


def test_a_bad_config_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "runtime.yaml"
    config.write_text("model: {name: m, weights_uri: /x, max_seq_len: 4}\nqueue: {max_length: -1}\n")
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "model.max_seq_len = 4" in err and "queue.max_length = -1" in err


def test_a_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_a_port_out_of_range_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--config", "runtime.yaml", "--port", "70000"])
    assert exit_info.value.code == 2 and "0..65535" in capsys.readouterr().err


def test_the_probe_without_a_server_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FRONTIER_PROBE_FILE", str(tmp_path / "none.json"))
    assert main(["probe"]) == 1


def test_chat_uses_the_models_template(codec: TextCodec) -> None:
    text = codec.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_falls_back_to_a_default_template(tiny_model: Path) -> None:
    tokenizer = Tokenizer(tiny_model)
    tokenizer.chat_template = None
    codec = TextCodec(tokenizer)
    text = codec.render_chat([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert (
        text == "<s><|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_that_refuses_the_messages_is_a_render_error(codec: TextCodec) -> None:
    with pytest.raises(TemplateRenderError, match="role must be system, user or assistant"):
        codec.render_chat([{"role": "tool", "content": "x"}])


def test_max_tokens_resolution() -> None:
    kw = {"tokens_param": "max_tokens", "prompt_param": "prompt"}
    assert resolve_max_tokens(None, 10, ENGINE_MAX_SEQ_LEN, **kw) == ENGINE_MAX_SEQ_LEN - 10
    assert resolve_max_tokens(5, 10, ENGINE_MAX_SEQ_LEN, **kw) == 5
    with pytest.raises(
        Exception, match=r"maximum context length is 256 tokens.*260 tokens \(10 in the prompt, 250"
    ):
        resolve_max_tokens(250, 10, ENGINE_MAX_SEQ_LEN, **kw)
