"""The egress policy: which URLs a tenant's model calls may reach, checked on the
resolved address at every connection."""

from __future__ import annotations

from typing import Any

import pytest
from _listeners import Listener, redirect_to

from convsim import ConfigError, EgressRefused
from convsim.adapters import EgressPolicy, GenerationParams, Message, is_public_address
from convsim.adapters._openai import OpenAICompatibleAdapter

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "::1", "::ffff:127.0.0.1", "169.254.169.254", "10.1.2.3", "172.16.0.1",
     "192.168.0.1", "100.64.0.1", "0.0.0.0", "224.0.0.1", "239.255.255.250", "240.0.0.1",
     "255.255.255.255", "fe80::1", "fc00::1", "ff02::1", "64:ff9b::7f00:1", "2002:7f00:1::",
     "2001:0:4136:e378:8000:63bf:80ff:fffe", "::", "not an address"],
)  # fmt: skip
def test_addresses_that_are_not_public(address: str) -> None:
    assert not is_public_address(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111",
                                     "64:ff9b::808:808", "2002:808:808::"])  # fmt: skip
def test_public_addresses(address: str) -> None:
    assert is_public_address(address)


@pytest.mark.parametrize(
    "prefix", ["api.openai.com", "ftp://x", "https://x/v1?key=1", "https://u:p@x/v1",
               "https://x:notaport", "https://a*.b.com", "https://x/v1/../admin", "https://:80"],
)  # fmt: skip
def test_a_bad_prefix_is_a_config_error(prefix: str) -> None:
    with pytest.raises(ConfigError, match="--allow-base-url"):
        EgressPolicy([prefix])


def _refused(policy: EgressPolicy, url: str) -> str:
    with pytest.raises(EgressRefused) as refused:
        policy.check_url(url)
    return refused.value.reason


def test_prefixes_match_scheme_host_port_and_whole_path_segments() -> None:
    policy = EgressPolicy(["https://api.example.com/v1", "http://10.0.0.5:8000/v1"])
    assert policy.check_url("https://api.example.com/v1/chat/completions").named
    assert policy.check_url("https://API.example.com:443/v1").named
    assert policy.check_url("http://10.0.0.5:8000/v1/models").named  # named: private is fine
    for url in (
        "http://api.example.com/v1",  # scheme
        "https://api.example.com.evil.test/v1",  # host
        "https://api.example.com:8443/v1",  # port
        "https://api.example.com/v10",  # not a whole segment
        "https://api.example.com/",
        "http://10.0.0.5:8001/v1",
        "http://10.0.0.6:8000/v1",
    ):
        assert "not under an allowed prefix" in _refused(policy, url), url


def test_dot_segments_fragments_and_odd_schemes_are_refused() -> None:
    policy = EgressPolicy(["https://"])
    assert "." in _refused(policy, "https://example.com/v1/../admin")
    assert "." in _refused(policy, "https://example.com/v1/%2E%2E/admin")
    assert "fragment" in _refused(policy, "https://example.com/v1#")
    assert "http and https" in _refused(policy, "file:///etc/passwd")
    assert "http and https" in _refused(policy, "unix:///var/run/x.sock")
    assert "no host" in _refused(policy, "https:///v1")


def test_any_host_prefixes_refuse_private_literals() -> None:
    policy = EgressPolicy(["https://", "http://*.example.com"])
    assert not policy.check_url("https://203.0.114.7/v1").named  # public, not named
    refused = [
        "https://127.0.0.1/v1",
        "https://[::1]/v1",
        "https://[::ffff:127.0.0.1]/v1",
        "https://169.254.169.254/v1",
        "http://10.0.0.1.example.com.127.0.0.1/v1",
    ]
    for url in refused:
        with pytest.raises(EgressRefused):
            policy.check_url(url)
    assert not policy.check_url("http://a.example.com/v1").named  # wildcards name no host


def _resolver(answers: dict[str, list[list[str]]]) -> Any:
    """A resolver that gives each name its answers in turn (the last one repeats)."""
    calls: dict[str, int] = {}

    async def resolve(host: str, port: int) -> list[str]:
        n = calls.get(host, 0)
        calls[host] = n + 1
        given = answers[host]
        return given[min(n, len(given) - 1)]

    return resolve


async def test_a_name_resolving_to_loopback_is_refused_unless_named() -> None:
    resolve = _resolver({"sneaky.test": [["127.0.0.1"]], "llm.internal": [["10.0.0.5"]]})
    policy = EgressPolicy(["https://", "http://llm.internal:8000/v1"], resolve=resolve)
    with pytest.raises(EgressRefused, match="loopback, private"):
        await policy.check("https://sneaky.test/v1")
    await policy.check("http://llm.internal:8000/v1")  # the operator named it
    with pytest.raises(EgressRefused):  # the same host under another prefix is not named
        await policy.check("https://llm.internal/v1")


async def _call(adapter: OpenAICompatibleAdapter) -> Any:
    try:
        return await adapter.generate([Message(role="user", content="hi")], GenerationParams())
    finally:
        await adapter.aclose()


async def test_dns_rebinding_is_refused_at_the_connection() -> None:
    with Listener() as target:
        # public at the first look (the job's check), loopback at the connection
        resolve = _resolver({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
        policy = EgressPolicy(["http://"], resolve=resolve)
        url = f"http://rebind.test:{target.port}/v1"
        await policy.check(url)
        adapter = OpenAICompatibleAdapter({"model": "m", "base_url": url, "max_retries": 0},
                                          egress=policy, env={})  # fmt: skip
        with pytest.raises(EgressRefused):
            await _call(adapter)
        assert target.connections == 0


async def test_a_named_host_is_reached_through_the_policy() -> None:
    with Listener() as target:
        policy = EgressPolicy([target.url + "/v1"])
        adapter = OpenAICompatibleAdapter({"model": "m", "base_url": target.url + "/v1"},
                                          egress=policy, env={})  # fmt: skip
        completion = await _call(adapter)
        assert completion.text == "Happy to help with that."
        assert target.connections == 1


async def test_a_redirect_is_not_followed_under_a_policy() -> None:
    with Listener() as internal, Listener() as redirector:
        redirector.answer = redirect_to(internal.url + "/v1/chat/completions")
        policy = EgressPolicy([redirector.url])
        adapter = OpenAICompatibleAdapter(
            {"model": "m", "base_url": redirector.url + "/v1", "max_retries": 0},
            egress=policy, env={},
        )  # fmt: skip
        with pytest.raises(Exception) as failed:
            await _call(adapter)
        assert getattr(failed.value, "status_code", None) == 307
        assert internal.connections == 0 and redirector.connections == 1


async def test_without_a_policy_redirects_are_followed_as_before() -> None:
    with Listener() as model, Listener() as redirector:
        redirector.answer = redirect_to(model.url + "/v1/chat/completions")
        adapter = OpenAICompatibleAdapter({"model": "m", "base_url": redirector.url + "/v1"})
        assert (await _call(adapter)).text == "Happy to help with that."


def test_an_adapter_refuses_a_url_or_a_transport_the_policy_cannot_check() -> None:
    policy = EgressPolicy(["https://"])
    with pytest.raises(EgressRefused):
        OpenAICompatibleAdapter({"model": "m", "base_url": "http://127.0.0.1:9/v1"},
                                egress=policy, env={})  # fmt: skip
    with pytest.raises(ConfigError, match="aiohttp"):
        OpenAICompatibleAdapter({"model": "m", "base_url": "https://x.test/v1", "http": "httpx"},
                                egress=policy, env={})  # fmt: skip


def test_an_adapter_built_with_an_empty_environment_reads_no_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVSIM_HTTP_API_KEY", "server-secret")
    from convsim.adapters._custom_http import CustomHttpAdapter

    adapter = CustomHttpAdapter({"model": "m", "base_url": "https://x.test"}, env={})
    assert "Authorization" not in adapter._headers


def test_hosts_are_checked_as_the_client_will_connect_to_them() -> None:
    policy = EgressPolicy(["http://"])
    for url in (
        "http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11:8000/v1",  # full width
        "http://127\u30020\u30020\u30021:8000/v1",  # ideographic full stops
        "http://[::ffff:7f00:1]:8000/v1",
    ):
        with pytest.raises(EgressRefused):
            policy.check_url(url)
    wide = "http://\uff25\uff38\uff21\uff2d\uff30\uff2c\uff25.com/v1"  # EXAMPLE, full width
    assert policy.check_url(wide).host == "example.com"


async def test_a_name_the_resolver_cannot_encode_is_refused_not_an_error() -> None:
    policy = EgressPolicy(["http://"])
    with pytest.raises(EgressRefused, match="not a valid host name"):
        await policy.check("http://127.0.0.1\u200d.1:8000/v1")
