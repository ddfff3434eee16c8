"""A JSON body is read as json.loads(bytes) reads it, as vLLM's (Starlette's request.json()
calls it): UTF-8 with or without a byte order mark (RFC 8259 section 8.1: a parser MAY ignore
one), UTF-16 and UTF-32 told apart by their first bytes (RFC 4627 section 3). They were 400s;
bytes that are really not text stay a 400 that says so."""

from __future__ import annotations

import codecs
import json

import httpx
import pytest
from server_helpers import MODEL_NAME

BODY = json.dumps({"model": MODEL_NAME, "prompt": "caf\u00e9 \U0001f600"}, ensure_ascii=False)
JSON_HEADERS = {"content-type": "application/json"}


def _post(server, path: str, content: bytes) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=content, timeout=60,
                      headers={**server.headers, **JSON_HEADERS})


@pytest.mark.parametrize("content", [
    codecs.BOM_UTF8 + BODY.encode("utf-8"),
    BODY.encode("utf-16-le"), BODY.encode("utf-16-be"), BODY.encode("utf-16"),  # last: with a BOM
    BODY.encode("utf-32-le"), BODY.encode("utf-32-be"), BODY.encode("utf-32"),
], ids=["utf-8-bom", "utf-16-le", "utf-16-be", "utf-16-bom", "utf-32-le", "utf-32-be", "utf-32-bom"])
def test_a_body_in_any_json_encoding_reads_as_its_utf8_twin(server, content):
    assert json.loads(content) == json.loads(BODY)  # the reference: what json.loads(bytes) reads
    expected = _post(server, "/tokenize", BODY.encode("utf-8"))
    got = _post(server, "/tokenize", content)
    assert got.status_code == 200, got.text
    assert got.json()["tokens"] == expected.json()["tokens"]


def test_a_completion_sent_with_a_byte_order_mark_is_served(server):
    body = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 3,
            "temperature": 0.0}
    plain = _post(server, "/v1/completions", json.dumps(body).encode())
    marked = _post(server, "/v1/completions", codecs.BOM_UTF8 + json.dumps(body).encode())
    assert marked.status_code == 200, marked.text
    assert marked.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]


@pytest.mark.parametrize(("content", "words"), [
    # the offset from the body's first byte: the mark's 3 bytes, then {"prompt": "caf (15)
    (codecs.BOM_UTF8 + b'{"prompt": "caf\xe9"}', "not valid UTF-8 (bad byte at offset 18)"),
    ('{"prompt": "\ud800"}'.encode("utf-16-le", "surrogatepass"), "not valid UTF-16"),
    (b'{"prompt": "\xed\xa0\x80"}', "not valid UTF-8"),  # a surrogate's bytes are not UTF-8
    (codecs.BOM_UTF8 + b"[1, 2]", "must be a JSON object"),
    (codecs.BOM_UTF8, "not valid JSON"),
])
def test_bytes_that_are_not_json_text_stay_a_400(server, content, words):
    r = _post(server, "/v1/completions", content)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
