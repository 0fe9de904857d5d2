"""``convsim serve`` and ``convsim serve keys``: the evaluation service."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .._extras import needs_extra
from ._console import (
    clear_errors,
)
from ._console import stderr as _stderr

if TYPE_CHECKING:
    pass


@click.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8600, show_default=True)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("convsim-service.db"),
    show_default=True,
    help="SQLite database of keys and jobs.",
)
@click.option(
    "--results-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("service-results"),
    show_default=True,
    help="Where each job's results file goes.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="YAML file of settings: endpoints, allow_base_url, limits, max_body_bytes, "
    "upload_retention_s, pack_sources, max_starts (the flags add to it).",
)
@click.option(
    "--endpoint",
    "endpoints",
    multiple=True,
    metavar="NAME=SPEC[,KEY=VALUE...]",
    help="A model tenants may name (repeatable), called with the server's key: "
    "gpt=openai:gpt-4o-mini,api_key_env=OPENAI_API_KEY,rpm=500",
)
@click.option(
    "--allow-base-url",
    "allow_base_url",
    multiple=True,
    metavar="PREFIX",
    help="A URL prefix tenants' own models may be at (repeatable); without one, tenants "
    "use --endpoint models only. Private and loopback addresses need a prefix naming "
    "the host.",
)
@click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="NAME=VALUE",
    help="A limit for every key without its own (repeatable): jobs, conversations, "
    "concurrency, max_tokens, response_bytes, inflight_bytes, trials, turns, "
    "transcript_chars, results_bytes, streams, uploads, upload_bytes.",
)
@click.option(
    "--pack-source",
    "pack_sources",
    multiple=True,
    metavar="SOURCE",
    help="Let tenants name SOURCE:NAME packs (repeatable): lm-eval (lm-eval:TASK; "
    "loading one costs seconds of a worker process) or a source an installed package "
    "registers (entry-point group convsim.pack_sources). task:NAME packs and installed "
    "task classes are taken by default.",
)
@click.option("--max-jobs-per-key", type=click.IntRange(min=1), help="Same as --limit jobs=N.")
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    help="The largest request body, however it is sent  [default: 1048576]",
)
@click.pass_context
@clear_errors
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    db: Path,
    results_dir: Path,
    config_file: Path | None,
    endpoints: tuple[str, ...],
    allow_base_url: tuple[str, ...],
    limits: tuple[str, ...],
    pack_sources: tuple[str, ...],
    max_jobs_per_key: int | None,
    max_body_bytes: int | None,
) -> None:
    """Run the evaluation service (FastAPI on uvicorn); `serve keys` manages its API keys.

    Jobs left queued or running by a killed server are resumed at startup. See
    README's "Running the service for others" before exposing it.
    """
    if ctx.invoked_subcommand is not None:
        return
    with needs_extra("service", "convsim serve"):  # all of it, before the server starts
        import cryptography.fernet  # noqa: F401
        import uvicorn  # noqa: F401

        from ..service import ServiceSettings, create_app
    from ..service._settings import parse_endpoint, parse_limits

    chosen = parse_limits(limits)
    if max_jobs_per_key is not None:
        chosen["jobs"] = max_jobs_per_key
    settings = ServiceSettings.load(
        config_file,
        endpoints=dict(parse_endpoint(e) for e in endpoints),
        allow_base_url=list(allow_base_url),
        pack_sources=list(pack_sources),
        limits=chosen,
        max_body_bytes=max_body_bytes,
    )
    if "lm-eval" in settings.pack_sources:
        with needs_extra("lm-eval", "--pack-source lm-eval"):
            import lm_eval  # noqa: F401
    os.umask(0o077)  # the database, results and uploads are the server owner's alone
    app = create_app(db, results_dir, settings=settings)
    _stderr().print(f"convsim serve: http://{host}:{port} (db {db})", highlight=False)
    _serve_app(app, host, port)


def _serve_app(app: Any, host: str, port: int) -> None:
    """uvicorn, stopping at once on SIGTERM or SIGINT: open result streams end."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.stopping.set()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    _Server(config).run()


@serve.group()
def keys() -> None:
    """Create, list and revoke the service's API keys."""


_DB_OPTION = click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("convsim-service.db"),
    show_default=True,
)


_KEY_LIMIT_OPTION = click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="NAME=VALUE",
    help="This key's own limit (repeatable), in place of the server's: jobs, "
    "conversations, concurrency, max_tokens, response_bytes, inflight_bytes, trials, "
    "turns, transcript_chars, results_bytes, streams, uploads, upload_bytes.",
)


@keys.command("create")
@_DB_OPTION
@click.option("--name", required=True, help="Whose key it is (unique).")
@_KEY_LIMIT_OPTION
@click.option(
    "--key-stdin",
    is_flag=True,
    help="Take the key from the first line of standard input (one another system issued, "
    "at least 8 characters) instead of making one; it is not printed.",
)
@clear_errors
def keys_create(db: Path, name: str, limits: tuple[str, ...], key_stdin: bool) -> None:
    """Create a key; it is printed once, as the last line (only its hash is kept)."""
    from ..service import Store
    from ..service._settings import parse_limits

    own = parse_limits(limits)
    given = sys.stdin.readline().rstrip("\r\n") if key_stdin else None
    store = Store(db)
    key = store.create_key(name, given)
    if own:
        store.set_limits(name, own)
    if given is not None:
        click.echo(f"created key {name!r} from standard input")
        return
    click.echo(f"created key {name!r}; store it now, it is not shown again:")
    click.echo(key)


@keys.command("limits")
@_DB_OPTION
@click.option("--name", required=True)
@_KEY_LIMIT_OPTION
@clear_errors
def keys_limits(db: Path, name: str, limits: tuple[str, ...]) -> None:
    """Set a key's own limits (none given: the server's apply again); a running
    server applies them to the key's next jobs."""
    from ..service import Store
    from ..service._settings import parse_limits

    own = parse_limits(limits)
    Store(db).set_limits(name, own)
    shown = ", ".join(f"{k}={v}" for k, v in own.items()) or "the server's"
    click.echo(f"key {name!r}: limits {shown}")


@keys.command("list")
@_DB_OPTION
@clear_errors
def keys_list(db: Path) -> None:
    """The keys by name: when created and revoked, their own limits, what they spent."""
    from ..service import Store

    for row in Store(db).list_keys():
        revoked = "" if row.revoked is None else f" revoked {time.ctime(row.revoked)}"
        own = ", ".join(f"{k}={v}" for k, v in row.limits.items())
        limits = f"\tlimits {own}" if own else ""
        click.echo(
            f"{row.name}\tcreated {time.ctime(row.created)}{revoked}\t"
            f"spent ${row.spent_usd:.4f}{limits}"
        )


@keys.command("revoke")
@_DB_OPTION
@click.option("--name", required=True)
@clear_errors
def keys_revoke(db: Path, name: str) -> None:
    """Revoke a key: every request with it is refused from now on."""
    from ..service import Store

    Store(db).revoke_key(name)
    click.echo(f"revoked key {name!r}")
