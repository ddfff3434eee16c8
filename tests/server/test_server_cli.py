"""`inferlab serve` as a user runs it: a real process, its printed URL, SIGTERM while streaming."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from server_helpers import wait_until


def serve_args(port: int) -> list[str]:
    return ["serve", "--port", str(port), "--dtype", "float32", "--kv-cache-memory", "64MiB",
            "--max-model-len", "512", "--served-model-name", "cli-model"]


def serve_command(port: int) -> list[str]:
    return [sys.executable, "-m", "inferlab.cli", *serve_args(port)]


def _read_lines(stream, into: list[str]) -> threading.Thread:
    def pump():
        for line in stream:
            into.append(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def _wait_for(lines: list[str], pattern: str, timeout_s: float) -> re.Match | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(lines):
            match = re.search(pattern, line)
            if match:
                return match
        time.sleep(0.05)
    return None


@contextlib.contextmanager
def _serving(*flags: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, str, list[str]]]:
    """`inferlab serve` as a process for the block: (the process, its URL, its stderr lines)."""
    proc = subprocess.Popen([*serve_command(0), *flags], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[str] = []
    err: list[str] = []
    readers = [_read_lines(proc.stdout, out), _read_lines(proc.stderr, err)]
    try:
        match = _wait_for(out, r"serving cli-model at (http://127\.0\.0\.1:\d+)", 180)
        if match is None and proc.poll() is not None and "embedded model is not installed" in "".join(err):
            pytest.skip("the embedded model is not installed")
        assert match, f"no URL printed; stderr: {''.join(err)[-2000:]}"
        yield proc, match.group(1), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for reader in readers:
            reader.join(timeout=5)


@pytest.mark.parametrize(("key", "words"), [
    (" ", "the API key must not be empty or blank"),  # "" was refused, whitespace taken
    ("\t", "the API key must not be empty or blank"),
    (" sk-1", "the API key must not start or end with whitespace: no request's key could match it"),
    ("sk-1 ", "the API key must not start or end with whitespace: no request's key could match it"),
])
@pytest.mark.parametrize("given", ["flag", "env"])
def test_an_api_key_no_request_can_send_is_refused(capsys, monkeypatch, key, words, given):
    """A server with such a key answers every request 401: the key a request sends is read
    without the spaces around it (as HTTP servers read a header's value)."""
    import inferlab.engine.llm_engine as llm_engine
    from inferlab.cli import main

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", _no_model)
    monkeypatch.setenv("INFERLAB_API_KEY", key if given == "env" else "")
    assert main(["serve", *(["--api-key", key] if given == "flag" else []), "--port", "0"]) == 2
    assert capsys.readouterr().err == f"error: {words}\n"


def _no_model(*args) -> None:
    raise AssertionError("the model was loaded before the settings were checked")


def test_serve_prints_its_url_and_drains_on_sigterm():
    env = {**os.environ, "INFERLAB_API_KEY": "sk-from-env"}
    with _serving("--shutdown-timeout", "2", env=env) as (proc, url, err):
        key = {"Authorization": "Bearer sk-from-env"}
        assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401  # the env key is on
        assert httpx.get(f"{url}/v1/models", headers=key, timeout=30).json()["data"][0]["id"] == "cli-model"

        events: list[str] = []
        streamer = _streaming(url, key, events)
        proc.send_signal(signal.SIGTERM)

        # new connections are refused at once, while the in-flight stream carries on
        host, port = url.removeprefix("http://").split(":")

        def refused() -> bool:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return False
            except OSError:
                return True

        deadline = time.monotonic() + 5
        while not refused() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused() and streamer.is_alive()

        # after --shutdown-timeout the unfinished request is aborted, its stream closed properly
        streamer.join(timeout=30)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])["choices"][0]
        assert last["finish_reason"] == "abort"
        assert proc.wait(timeout=30) == 0
        access = [line for line in err if "POST /v1/completions" in line]
        assert re.search(r"status=200 prompt_tokens=\d+ output_tokens=\d+ ttft_ms=[\d.]+ "
                         r"total_ms=[\d.]+", access[-1])


def test_sigterm_gives_beam_searches_the_grace_period_and_never_a_400():
    """Between two of its rounds a beam search holds no engine request: the drain once found
    nothing running, stopped the engine at once, and the next round's add failed the request
    with a 400 ("the engine is shutting down"). With --shutdown-timeout 15 a search of 4 tokens
    completes (8 s once fell short under a load of 9 on 2 cores, where OpenMP barriers wait on
    descheduled threads) while the server waits on one of 400, which a second signal then cuts:
    a 503, never a 400 (a cut at the deadline takes the same path, 15 s later)."""
    with _serving("--shutdown-timeout", "15") as (proc, url, err):
        replies: dict[str, httpx.Response] = {}

        def search(name: str, max_tokens: int) -> threading.Thread:
            body = {"prompt": f"The history of {name}", "max_tokens": max_tokens, "n": 2,
                    "use_beam_search": True, "ignore_eos": True, "temperature": 0}
            thread = threading.Thread(target=lambda: replies.__setitem__(name, httpx.post(
                f"{url}/v1/completions", json=body, timeout=120)))
            thread.start()
            return thread

        short, long = search("Rome", 4), search("Greece", 400)
        in_flight = re.compile(r"^inferlab:num_requests_in_flight\{[^}]*\} 4\.0$", re.M)
        assert wait_until(lambda: in_flight.search(httpx.get(f"{url}/metrics", timeout=10).text), 30)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        short.join(60)
        assert replies["Rome"].status_code == 200
        assert replies["Rome"].json()["usage"]["completion_tokens"] == 2 * 4
        assert proc.poll() is None and "Greece" not in replies  # still draining for the long one
        proc.send_signal(signal.SIGINT)
        long.join(60)
        assert proc.wait(timeout=30) == 0
        cut = replies["Greece"]
        assert cut.status_code == 503 and cut.json()["error"]["code"] == "shutting_down"
        assert "Traceback" not in "".join(err)


def _streaming(url: str, headers: dict[str, str], events: list[str]) -> threading.Thread:
    """A 400-token stream in a thread, its SSE data lines into events; returns once one came."""
    first = threading.Event()

    def stream() -> None:
        body = {"prompt": "Once upon a time", "stream": True, "max_tokens": 400, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    first.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert first.wait(60)
    return streamer


def test_a_body_still_coming_at_sigterm_is_answered_503_and_does_not_hold_the_exit():
    """uvicorn waited for it to the end of --shutdown-timeout plus its margin, then cancelled it:
    a traceback and a plain-text 500."""
    with _serving("--shutdown-timeout", "120") as (proc, url, err):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            reply = http.client.HTTPResponse(sock)
            reply.begin()
            assert (reply.status, reply.getheader("Retry-After")) == (503, "1")
            assert json.loads(reply.read())["error"]["code"] == "shutting_down"
        assert proc.wait(timeout=60) == 0  # not 125 s
    assert "Traceback" not in "".join(err)


def test_a_whole_answer_aborted_before_its_first_token_is_a_503_to_retry():
    """A request still queued behind a stream (one sequence at a time) when the grace period
    ends never ran: once a 200 with an empty text and finish_reason "abort", which a client
    takes for the answer; now a 503 with Retry-After, which it retries on another replica. A
    queued stream likewise: its headers wait for its first output (once a 200 whose one chunk
    was that empty abort)."""
    with _serving("--shutdown-timeout", "1", "--max-num-seqs", "1") as (proc, url, err):
        events: list[str] = []
        streamer = _streaming(url, {}, events)
        replies: list[httpx.Response] = []
        queued = [threading.Thread(target=lambda stream=stream: replies.append(httpx.post(
            f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 5, "stream": stream},
            timeout=60))) for stream in (False, True)]
        for thread in queued:
            thread.start()
        assert wait_until(lambda: 'vllm:num_requests_waiting{engine="0",model_name="cli-model"} 2.0' in
                          httpx.get(f"{url}/metrics", timeout=30).text, timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        for thread in queued:
            thread.join(timeout=60)
        streamer.join(timeout=60)
        for reply in replies:
            assert (reply.status_code, reply.headers.get("Retry-After")) == (503, "1"), reply.text
            assert reply.json()["error"]["code"] == "shutting_down"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"  # it had tokens
        assert proc.wait(timeout=30) == 0
    refused = [line for line in err if "status=503" in line]
    assert len(refused) == 2 and not any("ttft_ms" in line for line in refused)  # no token came


def test_a_second_ctrl_c_ends_the_drain_at_once():
    """The first Ctrl-C drains for --shutdown-timeout (here 120 s); a second one, as in uvicorn
    and vLLM, aborts what runs and exits. It once had no effect: the drain ran its course."""
    with _serving("--shutdown-timeout", "120") as (proc, url, _):
        events: list[str] = []
        streamer = _streaming(url, {}, events)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        streamer.join(timeout=30)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"  # not its 400 tokens
        assert proc.wait(timeout=30) == 0


def test_serve_on_a_taken_port_fails_with_one_line(one_line_error):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert one_line_error(*serve_args(port)).startswith("error: cannot listen on 127.0.0.1:")


def test_serve_steps_in_smaller_chunks_than_the_offline_commands():
    """serve's default prefill chunk is the latency-minded one; generate keeps the larger step,
    and either can be set."""
    from inferlab.cli import build_parser
    from inferlab.engine.args import SERVING_MAX_NUM_BATCHED_TOKENS, engine_config_from_args

    def step(argv):
        return engine_config_from_args(build_parser(argv).parse_args(argv)).max_num_batched_tokens

    assert step(["serve"]) == SERVING_MAX_NUM_BATCHED_TOKENS == 768
    assert step(["generate", "hi"]) == 2048
    assert step(["serve", "--max-num-batched-tokens", "1024"]) == 1024


@pytest.mark.parametrize("flags, words", [
    (["--chat-template", "{% if %}"], "chat template: "),  # a Jinja syntax error
    (["--chat-template", "no-such-template.jinja"], "no such file, and not a Jinja template"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    (["--timeout-keep-alive", "0"], "keep-alive timeout must be > 0 s, got 0.0"),
    (["--health-max-silence", "0.15"], "health max silence must be at least 1 s"),
    (["--served-model-name", ""], "a served model name must not be empty"),  # once the default name
    (["--max-num-batched-tokens", "64"],  # vLLM's words; the default batch is 256 requests
     "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (256)"),
])
def test_serve_with_broken_settings_fails_with_one_line(flags, words, one_line_error):
    stderr = one_line_error(*serve_args(0), *flags)
    assert stderr.startswith("error: ") and words in stderr


def test_health_max_silence_is_one_an_idle_engine_meets(engine):
    """An idle engine loop refreshes its heartbeat every 0.2 s: with 0.15 s, /health of an idle
    server flapped between 200 and 503. Such a limit is refused; the lowest one accepted holds
    on the idle engine, polled every 10 ms for 1.5 s."""
    from inferlab.errors import InferlabError
    from inferlab.server.settings import MIN_HEALTH_MAX_SILENCE_S, ServerSettings

    for too_short in (0.15, 0.5):
        with pytest.raises(InferlabError, match=f"at least 1 s .*, got {too_short}$"):
            ServerSettings(served_model_name="m", health_max_silence_s=too_short)
    assert ServerSettings(served_model_name="m", health_max_silence_s=1.0).health_max_silence_s == 1.0
    assert engine.stats().scheduler.num_running == 0
    polls = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        polls.append(engine.is_healthy(MIN_HEALTH_MAX_SILENCE_S))
        time.sleep(0.01)
    assert all(polls) and len(polls) > 50


def test_the_server_flags_reach_its_settings(tmp_path):
    from inferlab.cli import build_parser
    from inferlab.server.cli import settings_from_args

    path = tmp_path / "template.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    argv = ["serve", "--chat-template", str(path), "--allowed-origins", "http://a.test",
            "--allowed-origins", '["http://b.test", "*"]', "--enable-auto-tool-choice",
            "--tool-call-parser", "llama3_json", "--exclude-tools-when-tool-choice-none",
            "--reasoning-parser", "deepseek_r1", "--timeout-keep-alive", "75", "some-model-dir"]
    args = build_parser(argv).parse_args(argv)
    settings = settings_from_args(args)
    assert settings.chat_template == path.read_text()  # the file's text, read at start
    assert settings.allowed_origins == ("http://a.test", "http://b.test", "*")  # vLLM's JSON too
    assert settings.enable_auto_tool_choice and settings.tool_call_parser == "llama3_json"
    assert settings.exclude_tools_when_tool_choice_none and settings.reasoning_parser == "deepseek_r1"
    assert settings.keep_alive_timeout_s == 75.0
    assert args.model == "some-model-dir"
