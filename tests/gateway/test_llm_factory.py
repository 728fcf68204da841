"""make_provider: the configured provider, built from llm: settings."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from gateway.config import LLMConfig
from gateway.errors import ConfigError
from gateway.llm.anthropic_provider import AnthropicProvider
from gateway.llm.factory import make_provider
from gateway.llm.openai_provider import OpenAIProvider


def test_openai_config_builds_an_openai_provider_with_its_settings() -> None:
    config = LLMConfig(
        provider="openai",
        model="gpt-4o-mini",
        base_url="http://127.0.0.1:11434/v1",
        api_key=SecretStr("sk-local"),
        timeout_seconds=12,
        max_retries=2,
        temperature=0.7,
        max_tokens=300,
    )

    provider = make_provider(config)

    assert isinstance(provider, OpenAIProvider)
    assert (provider.name, provider.model, provider.base_url) == ("openai", "gpt-4o-mini", "http://127.0.0.1:11434/v1")
    assert (provider.timeout, provider.max_retries, provider.temperature, provider.max_tokens) == (12, 2, 0.7, 300)


async def test_openai_local_server_needs_no_key() -> None:
    provider = make_provider(LLMConfig(provider="openai", model="llama3.1", base_url="http://127.0.0.1:11434/v1"))

    assert isinstance(provider, OpenAIProvider)
    await provider.start()  # no I/O: only builds the client
    await provider.stop()


def test_anthropic_config_builds_an_anthropic_provider() -> None:
    config = LLMConfig(provider="anthropic", model="claude-sonnet-4-5", api_key=SecretStr("sk-ant"))

    provider = make_provider(config)

    assert isinstance(provider, AnthropicProvider)
    assert (provider.name, provider.model, provider.base_url) == ("anthropic", "claude-sonnet-4-5", None)


def test_network_provider_with_the_builtin_model_name_is_a_config_error() -> None:
    # The config refuses it at load (what `goclaw config check` reports) ...
    with pytest.raises(ValidationError, match=r"llm.model must name the openai model"):
        LLMConfig(provider="openai", api_key=SecretStr("sk"))
    # ... and the factory refuses it again for a config built around validation.
    config = LLMConfig.model_construct(provider="openai", api_key=SecretStr("sk"), model="builtin-offline")
    with pytest.raises(ConfigError, match=r"llm.model: name the openai model"):
        make_provider(config)


def test_builtin_is_the_default() -> None:
    provider = make_provider(LLMConfig())

    assert provider.name == "builtin"
