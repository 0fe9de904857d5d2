"""The lm-eval commands of ``convsim``: ``convsim lm-eval`` and ``convsim lm-eval-tasks``.

They reach the command line through the entry-point group ``convsim.commands``; nothing
here imports lm_eval until a command runs, so ``convsim --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from convsim._extras import needs_extra
from convsim.cli._console import clear_errors, stdout

__all__ = ["lm_eval_command", "lm_eval_tasks_command"]


@click.command(
    "lm-eval",
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],  # --help goes to lm-eval
    },
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@clear_errors
def lm_eval_command(args: tuple[str, ...]) -> None:
    """Run lm-evaluation-harness with the `convsim` model registered (args go to lm-eval).

    e.g. convsim lm-eval --model convsim --model_args model=scripted --tasks TASK
    --include_path DIR. HF_DATASETS_OFFLINE and HF_HUB_OFFLINE default to 1, and
    LM_HARNESS_CACHE_PATH (--cache_requests) to ~/.cache/convsim/lm-eval. A secret in
    --model_args (api_key=, a base_url with credentials) reaches lm-eval only as the
    name of an environment variable, so lm-eval's output never shows it.
    """
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before lm_eval imports datasets
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # --cache_requests would write into lm-eval's installed package
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    os.environ.setdefault("LM_HARNESS_CACHE_PATH", str(cache_home / "convsim" / "lm-eval"))
    with needs_extra("lm-eval", "convsim lm-eval"):
        from lm_eval.__main__ import cli_evaluate

        from ._model import register_lm_eval_model
    from ._secret_args import hide_model_arg_secrets

    register_lm_eval_model()
    saved = sys.argv
    sys.argv = ["lm-eval", *hide_model_arg_secrets(args, os.environ)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved


@click.command("lm-eval-tasks")
@click.argument("packs", nargs=-1, metavar="[PACK_OR_FOLDER]...")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("lm_eval_tasks"),
    show_default=True,
    help="Folder to write the task files into (lm-eval's --include_path).",
)
@click.option(
    "--allow-code",
    is_flag=True,
    help="Export packs that run code they name (python goal criteria); their "
    "conversations then run only with --model_args ...,allow_code=true.",
)
@clear_errors
def lm_eval_tasks_command(packs: tuple[str, ...], out: Path, allow_code: bool) -> None:
    """Write every bundled pack (and each PACK_OR_FOLDER given) as an lm-eval task:
    single_turn_scenarios_<pack> or multi_turn_scenarios_<pack>."""
    from ._export import export_lm_eval_tasks

    console = stdout()
    for task in export_lm_eval_tasks(list(packs), out, allow_code=allow_code):
        console.print(
            f"{task.task}: {task.yaml_path} (metrics: {', '.join(task.metrics)})",
            highlight=False,
        )
        for name, reason in task.skipped:
            console.print(f"  left out {name}: {reason}", highlight=False)
    console.print(f"--include_path {out.resolve()}", highlight=False)
