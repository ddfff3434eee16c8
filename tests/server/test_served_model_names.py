"""vLLM's --served-model-name a b: requests may use any of the names, /v1/models lists a card a
name (its root the weights loaded), and a reply carries the name it was asked by."""

from __future__ import annotations

import httpx
from server_helpers import MODEL_NAME, start_server

from inferlab.cli import parse_command_line
from inferlab.server.cli import settings_from_args


def test_serve_takes_several_names_the_first_the_primary():
    """Once one name only: a second was taken for the model's path ('beta: no such file')."""
    settings = settings_from_args(parse_command_line(["serve", "--served-model-name", "alpha", "beta"]))
    assert (settings.served_model_name, settings.served_model_aliases) == ("alpha", ("beta",))


def test_a_model_path_after_the_names_is_refused_not_served_as_a_name(tmp_path, monkeypatch):
    """Before the several names, `--served-model-name a DIR` served DIR as a; then DIR became a
    second name and the embedded model was served. Now it is refused, saying where DIR goes; a
    name that is only some folder here (no model in it) stays a name."""
    import re

    import pytest

    from inferlab.errors import InferlabError

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "tests").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InferlabError, match=re.escape("put the model before the flag (inferlab serve model ")):
        settings_from_args(parse_command_line(["serve", "--served-model-name", "a", "model"]))
    plain = settings_from_args(parse_command_line(["serve", "--served-model-name", "a", "tests"]))
    assert plain.served_model_aliases == ("tests",)
    twice = settings_from_args(parse_command_line(["serve", "--served-model-name", "a", "b", "a"]))
    assert (twice.served_model_name, twice.served_model_aliases) == ("a", ("b",))


def test_embedded_after_the_names_is_refused_as_a_model_path_is():
    """`serve --served-model-name foo embedded` once served the embedded model as foo and
    embedded, though the refusal of a path there says that `embedded` names that model."""
    import pytest

    from inferlab.errors import InferlabError

    with pytest.raises(InferlabError) as refused:
        settings_from_args(parse_command_line(["serve", "--served-model-name", "foo", "embedded"]))
    assert str(refused.value) == (
        "--served-model-name takes every name after it, embedded too: put the model before the "
        "flag (inferlab serve embedded --served-model-name ...; `embedded` names the default model)")
    named = settings_from_args(parse_command_line(["serve", "embedded", "--served-model-name", "foo", "bar"]))
    assert (named.served_model_name, named.served_model_aliases) == ("foo", ("bar",))


def test_every_served_name_is_listed_answered_and_echoed(engine):
    servers = start_server(engine, served_model_aliases=("org/alias",))
    server = next(servers)
    try:
        cards = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
        assert [card["id"] for card in cards] == [MODEL_NAME, "org/alias"]
        assert {card["root"] for card in cards} == {engine.engine.loaded.path}  # once "embedded"
        # vLLM's card: no parent (a LoRA's base), one permission that allows sampling
        assert [card["parent"] for card in cards] == [None, None]
        for card in cards:
            [permission] = card["permission"]
            assert permission["object"] == "model_permission"
            assert permission["id"].startswith("modelperm-")
            assert (permission["allow_sampling"], permission["allow_logprobs"],
                    permission["allow_fine_tuning"]) == (True, True, False)
        assert httpx.get(f"{server.url}/v1/models/org/alias", timeout=30).json()["id"] == "org/alias"
        for name in (MODEL_NAME, "org/alias"):
            reply = httpx.post(f"{server.url}/v1/completions", timeout=60,
                               json={"model": name, "prompt": "Hi", "max_tokens": 2})
            assert reply.status_code == 200 and reply.json()["model"] == name
        missing = httpx.post(f"{server.url}/v1/completions", timeout=60,
                             json={"model": "other", "prompt": "Hi", "max_tokens": 2})
        assert missing.status_code == 404
        assert f"serves '{MODEL_NAME}' or 'org/alias'" in missing.json()["error"]["message"]
    finally:
        servers.close()
