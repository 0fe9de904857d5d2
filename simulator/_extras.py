"""Optional parts: a feature used without its extra says which one to install.

The core install carries what runs, scores and writes results; the HTML report, the
service, the lm-eval integration and the code-analysis plugin each have an extra
(pyproject's ``optional-dependencies``). Their imports sit under :func:`needs_extra`,
so a missing one reads ``convsim serve needs the service extra: pip install
'convsim[service]'`` instead of a ``ModuleNotFoundError`` from deep inside.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ._errors import MissingExtra

__all__ = ["needs_extra"]


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Imports in this block belong to ``extra``: one that fails raises
    :class:`MissingExtra` naming ``feature`` and the install command.

    A :class:`MissingExtra` for another extra passes through unchanged; one for the same
    extra is told again with this (outer, closer to the user) ``feature``. A failed
    import of convsim's own modules is a bug, not a missing extra, and is not touched.

    Raises:
        MissingExtra: a module of the extra could not be imported.
    """
    try:
        yield
    except MissingExtra as exc:
        if exc.extra != extra:
            raise
        raise MissingExtra(extra, feature) from exc.__cause__
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] == "convsim":
            raise
        raise MissingExtra(extra, feature) from exc
