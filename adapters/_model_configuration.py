"""The guide's ``ModelConfiguration``: what an adapter is built with, checked, read as
a mapping, and shown with its secrets masked."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from convsim._errors import ConfigError, describe_validation_error
from convsim._secrets import is_secret_key, shown_setting

from ._base_url import check_base_url

__all__ = ["ModelConfiguration", "PACING_SETTINGS"]

PACING_SETTINGS = frozenset(
    {
        *("api_key", "api_key_env", "rpm", "tpm", "rpd", "concurrency", "timeout"),
        *("max_retries", "max_retry_time", "max_retry_after", "input_price", "output_price"),
        "context_length",
    }
)
"""Settings that decide how calls are made, paced or priced, not what comes back: left
out of an adapter's response-cache identity."""


class ModelConfiguration(BaseModel, Mapping[str, Any]):
    """What a model adapter is built with, in the guide's form::

        config = ModelConfiguration({
            "api_endpoint": "http://localhost:8080",
            "api_key": "test-key",
            "model_name": "custom-model",
        })
        adapter = get_model_adapter("custom", config)

    The guide's fields and convsim's run settings are typed and checked when it is
    made (a bad value raises :class:`~convsim.ConfigError` naming the field); any other
    key is kept as given, for the adapter's own use. It reads as a read-only mapping of
    the keys that were given (``config.get("api_endpoint")``, ``config["api_key"]``,
    ``"rpm" in config``, ``dict(config)``), secrets included, as an adapter needs them;
    it shows (``repr``, ``str``, logs, ``model_dump``, ``model_dump_json``) every
    value named like a secret (``api_key``, ``token``, ``password``, ...) as ``***`` and
    every URL without its credentials.

    Any adapter takes one: convsim's own adapters read it as their arguments (the
    guide's ``model_name`` and ``api_endpoint`` are accepted for ``model`` and
    ``base_url``), and an adapter written from the guide keeps it as
    :attr:`~convsim.adapters.ModelAdapter.configuration`, where the settings below give
    its calls their budgets, retries and deadline.
    """

    model_config = ConfigDict(
        extra="allow", frozen=True, hide_input_in_errors=True, validate_default=False
    )

    model_name: str | None = Field(default=None, min_length=1)
    """The model's name at the backend (convsim's adapters call it ``model``)."""
    api_endpoint: str | None = None
    """Where the backend lives: an http:// or https:// URL with a host (convsim's
    adapters call it ``base_url``)."""
    api_key: SecretStr | None = None
    """The key sent to the backend; never shown. Prefer ``api_key_env``."""
    api_key_env: str | None = Field(default=None, min_length=1)
    """The environment variable that holds the key: read when the configuration is made,
    and required to be set then, when ``api_key`` is not given."""
    rpm: float | None = Field(default=None, gt=0)
    """Requests per minute (default: what the adapter's ``get_rate_limits()`` says)."""
    tpm: float | None = Field(default=None, gt=0)
    """Tokens per minute (default: what the adapter's ``get_rate_limits()`` says)."""
    rpd: float | None = Field(default=None, gt=0)
    """Requests per day, as the provider states it: reported, not enforced."""
    concurrency: int | None = Field(default=None, ge=1)
    """Calls in flight at most (default: the run's concurrency, else 64)."""
    timeout: float | None = Field(default=None, gt=0)
    """Seconds one attempt of a call may take (default 60)."""
    max_retries: int | None = Field(default=None, ge=0, le=20)
    """Retries after the first attempt (default 3)."""
    max_retry_time: float | None = Field(default=None, gt=0)
    """No retry starts after this many seconds since the first attempt (default 120)."""
    max_retry_after: float | None = Field(default=None, ge=0)
    """The longest Retry-After a 429 is waited for (default 60)."""
    input_price: float | None = Field(default=None, ge=0)
    """USD per million prompt tokens, where the adapter prices none itself."""
    output_price: float | None = Field(default=None, ge=0)
    """USD per million completion tokens."""
    context_length: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """The default where a turn sets none (as ``max_tokens``, ``top_p`` and the
    penalties below)."""
    max_tokens: int | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)

    def __init__(
        self,
        data: Mapping[str, Any] | None = None,
        /,
        *,
        env: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> None:
        """Check ``data`` and ``fields`` (keywords win).

        Args:
            data: the settings, as the guide passes them (one dict).
            env: where ``api_key_env`` is looked up (default: the process environment).

        Raises:
            ConfigError: naming every invalid field.
        """
        given = {**dict(data or {}), **fields}
        bad = sorted(str(k) for k in given if not isinstance(k, str) or not k.isidentifier())
        if bad:
            raise ConfigError(f"invalid model configuration: {', '.join(bad)} is not a name")
        variable = given.get("api_key_env")
        if given.get("api_key") is None and isinstance(variable, str) and variable:
            key = (os.environ if env is None else env).get(variable)
            if not key:
                raise ConfigError(
                    f"invalid model configuration: api_key_env: the environment variable "
                    f"{variable} is not set (set it, or give api_key)"
                )
            given["api_key"] = key
        try:
            self.__pydantic_validator__.validate_python(given, self_instance=self)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "model configuration")) from None

    @classmethod
    def of(cls, config: ModelConfiguration | Mapping[str, Any] | None) -> ModelConfiguration:
        """``config`` itself if it is one, else one made from it."""
        return config if isinstance(config, ModelConfiguration) else cls(config)

    # -- checks ---------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _secret_extras(cls, data: Any) -> Any:
        """A key the model does not declare, named like a secret, is kept as a secret."""
        if isinstance(data, dict):
            data = {
                k: SecretStr(v)
                if k not in cls.model_fields and is_secret_key(k) and isinstance(v, str)
                else v
                for k, v in data.items()
            }
        return data

    @field_validator("api_endpoint")
    @classmethod
    def _usable_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)

    # -- read as a mapping ------------------------------------------------------------

    def _given(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in self.model_fields_set}
        values.update(self.model_extra or {})
        return {k: v for k, v in values.items() if v is not None}

    def __getitem__(self, key: str) -> Any:
        value = self._given()[key]
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        return iter(sorted(self._given()))

    def __len__(self) -> int:
        return len(self._given())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._given()

    # -- shown ------------------------------------------------------------------------

    @model_serializer(mode="wrap")
    def _dumped(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """Dumped, a secret is ``***`` and a URL has no credentials."""
        data = handler(self)
        return {k: v if v is None else shown_setting(k, v) for k, v in data.items()}

    def __repr_args__(self) -> Any:
        return [(k, shown_setting(k, v)) for k, v in sorted(self._given().items())]

    def __str__(self) -> str:
        return repr(self)
