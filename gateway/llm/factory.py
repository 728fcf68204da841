"""Build the configured LLM provider from ``llm:`` in the config."""

from __future__ import annotations

from gateway.config import LLMConfig
from gateway.errors import ConfigError
from gateway.llm.base import LLMProvider

# LLMConfig's default model name, which means nothing to a real server.
_BUILTIN_MODEL = "builtin-offline"


def make_provider(llm_config: LLMConfig) -> LLMProvider:
    """The provider ``llm.provider`` names, not yet started (call ``start()``).

    Raises:
        ConfigError: when a network provider is left with the builtin model name.
    """
    if llm_config.provider == "builtin":
        # Imported here: the builtin provider is its own module, loaded only when chosen.
        from gateway.llm.builtin import BuiltinProvider

        return BuiltinProvider()
    if llm_config.model == _BUILTIN_MODEL:
        example = "gpt-4o-mini" if llm_config.provider == "openai" else "claude-sonnet-4-5"
        raise ConfigError([f"llm.model: name the {llm_config.provider} model to use, for example {example}"])
    api_key = llm_config.api_key.get_secret_value() if llm_config.api_key is not None else None
    # The SDKs are imported only when chosen: the offline default never loads them.
    if llm_config.provider == "openai":
        from gateway.llm.openai_provider import OpenAIProvider

        return OpenAIProvider(
            model=llm_config.model,
            base_url=llm_config.base_url,
            api_key=api_key or None,
            timeout=llm_config.timeout_seconds,
            max_retries=llm_config.max_retries,
            temperature=llm_config.temperature,
            max_tokens=llm_config.max_tokens,
        )
    if llm_config.provider == "anthropic":
        from gateway.llm.anthropic_provider import AnthropicProvider

        return AnthropicProvider(
            model=llm_config.model,
            base_url=llm_config.base_url,
            api_key=api_key or None,
            timeout=llm_config.timeout_seconds,
            max_retries=llm_config.max_retries,
            temperature=llm_config.temperature,
            max_tokens=llm_config.max_tokens,
        )
    raise ConfigError([f"llm.provider: unknown provider {llm_config.provider!r}; use builtin, openai or anthropic"])
