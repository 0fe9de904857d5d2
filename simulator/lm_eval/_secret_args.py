"""Keeping credentials given in ``--model_args`` out of what lm-eval prints and writes.

lm-eval echoes ``--model_args`` verbatim: in its log, in the header of its results table
and in the results JSON. Before lm-eval sees the command line, each secret argument
(``api_key=``, and a ``base_url`` with credentials in it) moves into an environment
variable of this process, and the argument becomes ``NAME_env=VARIABLE``, which the
convsim model reads back. What lm-eval shows is the variable's name.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping, Sequence
from typing import Any

from convsim._secrets import is_secret_key, looks_like_url, redact_url

__all__ = ["ENV_PREFIX", "hide_model_arg_secrets"]

ENV_PREFIX = "CONVSIM_LM_EVAL_"
_OPTIONS = ("--model_args", "-a")


def _is_secret(name: str, value: Any) -> bool:
    return is_secret_key(name) or (looks_like_url(value) and redact_url(value) != value)


def _hide(name: str, value: Any, env: MutableMapping[str, str]) -> str:
    """Move ``value`` into ``env``; the name of the variable that now holds it."""
    variable = ENV_PREFIX + name.upper()
    env[variable] = str(value)
    return variable


def _hide_token(token: str, env: MutableMapping[str, str]) -> str:
    """One ``--model_args`` value: ``k=v,k2=v2`` or a JSON object."""
    if token.lstrip().startswith("{"):
        try:
            data = json.loads(token)
        except ValueError:
            return token  # lm-eval reports it
        if not isinstance(data, dict):
            return token
        hidden = {
            f"{k}_env" if _is_secret(k, v) else k: _hide(k, v, env) if _is_secret(k, v) else v
            for k, v in data.items()
        }
        return json.dumps(hidden)
    pairs = []
    for part in token.split(","):
        name, sep, value = part.partition("=")
        if sep and _is_secret(name, value):
            pairs.append(f"{name}_env={_hide(name, value, env)}")
        else:
            pairs.append(part)
    return ",".join(pairs)


def hide_model_arg_secrets(args: Sequence[str], env: MutableMapping[str, str]) -> list[str]:
    """``args`` (lm-eval's command line) with each secret model argument moved to ``env``."""
    out: list[str] = []
    in_model_args = False
    for arg in args:
        option, eq, value = arg.partition("=")
        if arg.startswith("-") and not (eq and option in _OPTIONS):
            in_model_args = arg in _OPTIONS
            out.append(arg)
        elif eq and option in _OPTIONS:
            in_model_args = False
            out.append(f"{option}={_hide_token(value, env)}")
        elif in_model_args:
            out.append(_hide_token(arg, env))
        else:
            out.append(arg)
    return out
