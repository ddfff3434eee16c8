"""Options a server is started with, each on a server of its own: --scheduling-policy priority,
--generation-config, --chat-template, --allowed-origins and --timeout-keep-alive."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from urllib.parse import urlsplit

import httpx
import pytest
from server_helpers import MAX_MODEL_LEN, MODEL_NAME, start_server, tokenize, wait_until

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.llm_engine import LLMEngine

GREEDY = {"temperature": 0.0}


def test_priority_server_serves_a_later_higher_priority_request_first(engine):
    """--scheduling-policy priority, one sequence at a time: B (priority 5) and then C
    (priority 0) queue behind A; C runs before B."""
    config = EngineConfig(dtype=engine.engine.config.dtype, kv_cache_memory_bytes=24 * 2**20, max_num_seqs=1,
                          max_model_len=MAX_MODEL_LEN, scheduling_policy="priority")
    own = AsyncEngine(LLMEngine(config, loaded=engine.engine.loaded))
    added: list[str] = []  # request ids, as the engine thread adds them
    add_requests = own.engine.add_requests

    def logged_add(prompts, params, *args, **kwargs):
        added.extend(request_id for request_id, _, _ in prompts)
        return add_requests(prompts, params, *args, **kwargs)

    own.engine.add_requests = logged_add
    servers = start_server(own)
    server = next(servers)
    finished: list[str] = []
    responses: dict[str, httpx.Response] = {}

    def post(name: str, max_tokens: int, priority: int) -> threading.Thread:
        def run() -> None:
            responses[name] = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
                "prompt": f"Request {name}:", "max_tokens": max_tokens, "ignore_eos": True,
                "priority": priority})
            finished.append(name)
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    try:
        threads = [post("A", 64, 0)]
        for name, priority in (("B", 5), ("C", 0)):
            assert wait_until(lambda: len(added) == len(threads), 10)
            threads.append(post(name, 4, priority))
        assert wait_until(lambda: len(added) == 3, 10)
        assert not finished, "A (64 tokens) was still running when C arrived"
        for thread in threads:
            thread.join(60)
        assert [r.status_code for r in responses.values()] == [200] * 3
        assert finished == ["A", "C", "B"]
        assert own.engine.scheduler.stats().num_free_blocks == own.engine.num_kv_blocks
    finally:
        servers.close()
        asyncio.run(own.shutdown(timeout_s=0))


def test_the_models_generation_config_defaults_what_a_request_leaves_out(engine, client, tmp_path):
    """--generation-config FOLDER: top_k 1 makes a request without sampling fields greedy, and
    max_new_tokens caps one without max_tokens; a request's own values win."""
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.9, "top_k": 1, "max_new_tokens": 6}))
    own = AsyncEngine(LLMEngine(EngineConfig(
        dtype=engine.engine.config.dtype, kv_cache_memory_bytes=24 * 2**20, max_model_len=MAX_MODEL_LEN,
        generation_config=str(tmp_path)), loaded=engine.engine.loaded))
    servers = start_server(own)
    defaulted = next(servers)
    messages = [{"role": "user", "content": "Name a colour."}]
    try:
        def chat(**fields):
            r = httpx.post(f"{defaulted.url}/v1/chat/completions", timeout=60,
                           json={"messages": messages, **fields})
            assert r.status_code == 200, r.text
            return r.json()

        greedy = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6,
                                                **GREEDY)
        plain = chat()
        assert plain["choices"][0]["message"]["content"] == greedy.choices[0].message.content
        assert plain["usage"]["completion_tokens"] == greedy.usage.completion_tokens == 6
        assert chat(max_tokens=3)["usage"]["completion_tokens"] == 3
    finally:
        servers.close()
        asyncio.run(own.shutdown(timeout_s=0))


SHOUTING_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}{% if shout %}!{% endif %}>"
                     "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def test_chat_template_and_its_kwargs(engine, server):
    """--chat-template replaces the model's; a request's chat_template_kwargs are variables of it."""
    servers = start_server(engine, chat_template=SHOUTING_TEMPLATE)
    templated = next(servers)
    messages = [{"role": "user", "content": "Hi"}]
    try:
        def tokens(**fields):
            r = httpx.post(f"{templated.url}/tokenize", json={"messages": messages, **fields},
                           timeout=30)
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        plain = tokenize(server, prompt="<user>Hi\n<assistant>", add_special_tokens=False)
        shouted = tokenize(server, prompt="<user!>Hi\n<assistant>", add_special_tokens=False)
        assert tokens() == plain and tokens(chat_template_kwargs={"shout": True}) == shouted
        reply = httpx.post(f"{templated.url}/v1/chat/completions", timeout=60, json={
            "messages": messages, "max_tokens": 2, "chat_template_kwargs": {"shout": True}})
        assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == len(shouted)
        refused = httpx.post(f"{templated.url}/v1/chat/completions", timeout=60, json={
            "messages": messages, "chat_template_kwargs": {"add_generation_prompt": False}})
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "chat_template_kwargs"
    finally:
        servers.close()
    # the model's own template ignores a variable it does not use
    assert (tokenize(server, messages=messages, chat_template_kwargs={"shout": True})
            == tokenize(server, messages=messages))


def test_cors_is_off_unless_origins_are_allowed(engine, server):
    """--allowed-origins: a browser's preflight from an allowed origin is answered, and the
    response names the origin; from another origin, or on a server without the option, not."""
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    ui = "http://localhost:3000"
    servers = start_server(engine, allowed_origins=(ui,))
    browser_facing = next(servers)
    try:
        url = f"{browser_facing.url}/v1/completions"
        allowed = httpx.options(url, headers={"Origin": ui, **preflight}, timeout=10)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ui
        assert "POST" in allowed.headers["access-control-allow-methods"]
        other = httpx.options(url, headers={"Origin": "https://evil.example", **preflight}, timeout=10)
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        reply = httpx.post(url, headers={"Origin": ui}, timeout=60,
                           json={"prompt": "Hi", "max_tokens": 1})
        assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == ui
    finally:
        servers.close()
    closed = httpx.options(f"{server.url}/v1/completions", headers={"Origin": ui, **preflight},
                           timeout=10)
    assert closed.status_code == 405 and "access-control-allow-origin" not in closed.headers


def idle_connection(url: str) -> socket.socket:
    """A keep-alive connection that has had one answer and now waits, non-blocking."""
    address = urlsplit(url)
    conn = socket.create_connection((address.hostname, address.port), timeout=10)
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
    assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    conn.setblocking(False)
    return conn


def closed_by_server(conn: socket.socket) -> bool:
    try:
        return conn.recv(1) == b""
    except BlockingIOError:  # nothing to read: still open
        return False


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(engine):
    """--timeout-keep-alive 0.2 closes an idle connection; one to a server keeping them open
    for an hour, idle as long, is still open."""
    servers = [start_server(engine, keep_alive_timeout_s=0.2), start_server(engine)]
    short, long = (next(s) for s in servers)
    try:
        kept, dropped = idle_connection(long.url), idle_connection(short.url)
        with kept, dropped:
            assert wait_until(lambda: closed_by_server(dropped), 30)
            assert not closed_by_server(kept)
    finally:
        for s in servers:
            s.close()


def test_serve_help_gives_the_server_limits_defaults(capsys):
    """A user sizing backpressure reads them there (they were only in ServerSettings)."""
    from inferlab.cli import main

    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--max-queued-requests", "(default: 256)"), ("--max-request-body", "(default: 8MiB)"),
                          ("--shutdown-timeout", "(default: 10.0)"),
                          ("--health-max-silence", "(at least 1; default: 30.0)"),
                          ("--timeout-keep-alive", "(default: 5.0)")):
        described = text.split(f"{flag} {flag[2:].upper().replace('-', '_')}")[-1]  # not the usage's
        assert default in described.split(" --")[0], flag
