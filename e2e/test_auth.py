"""API keys: with any configured, every route but /health, /ready and /metrics needs
one, as `Authorization: Bearer KEY` (the openai SDK's way) or
`x-api-key: KEY`."""

import httpx
import openai
import pytest

from conftest import MODEL, Server

BODY = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def keyed():
    s = Server(MODEL, ["--api-key", "k-one", "--api-key", "k-two"])
    yield s
    s.stop()


def sdk(server, key):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=key, max_retries=0, timeout=60)


def test_the_sdk_with_a_right_key_completes(keyed):
    for key in ["k-one", "k-two"]:
        out = sdk(keyed, key).completions.create(model=MODEL, prompt="Hello", max_tokens=2)
        assert out.usage.completion_tokens == 2


def test_the_sdk_with_a_wrong_key_gets_401(keyed):
    with pytest.raises(openai.AuthenticationError) as e:
        sdk(keyed, "k-three").completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert e.value.status_code == 401
    assert e.value.body["type"] == "authentication_error"


@pytest.mark.parametrize(
    "headers, status",
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": "k-one"}, 401),
        ({"x-api-key": "wrong"}, 401),
        ({"x-api-key": "k-two"}, 200),
        ({"Authorization": "Bearer k-two"}, 200),
    ],
)
def test_both_headers_are_checked(keyed, headers, status):
    r = httpx.post(f"{keyed.base}/v1/completions", json=BODY, headers=headers, timeout=60)
    assert r.status_code == status, r.text
    if status == 401:
        error = r.json()["error"]
        assert error["type"] == "authentication_error"
        assert error["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"


def test_other_protected_routes_need_the_key_too(keyed):
    assert httpx.get(f"{keyed.base}/v1/models", timeout=10).status_code == 401
    chat = {"model": BODY["model"], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert httpx.post(f"{keyed.base}/v1/chat/completions", json=chat, timeout=10).status_code == 401
    assert httpx.post(f"{keyed.base}/v1/chat/completions", json=chat, timeout=60,
                      headers={"x-api-key": "k-two"}).status_code == 200
    r = httpx.post(f"{keyed.base}/tokenize", json={"prompt": "hi"}, timeout=10)
    assert r.status_code == 401
    ok = httpx.get(f"{keyed.base}/v1/models", headers={"x-api-key": "k-one"}, timeout=10)
    assert ok.status_code == 200


def test_health_ready_and_metrics_stay_open_and_the_openapi_document_does_not(keyed):
    for path in ["/health", "/ready", "/metrics"]:
        assert httpx.get(f"{keyed.base}{path}", timeout=10).status_code == 200, path
    assert httpx.get(f"{keyed.base}/openapi.json", timeout=10).status_code == 401


def test_keys_from_the_environment_and_a_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# one per line\nfrom-file\n")
    s = Server(MODEL, ["--api-key-file", str(keys)], env={"FERRITE_API_KEY": "from-env"})
    try:
        for key, status in [("from-env", 200), ("from-file", 200), ("k-one", 401)]:
            r = httpx.post(
                f"{s.base}/v1/completions",
                json=BODY,
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
            assert r.status_code == status, (key, r.text)
    finally:
        s.stop()
