"""What Lightning prints while hf_lightning runs it: quiet by default, everything with ``HF_LIGHTNING_VERBOSE=1``.

HF users expect HF's output only, so Lightning's INFO banners ("GPU available", the 💡 tips, "`Trainer.fit`
stopped: `max_steps=N` reached") and the warnings listed below are hidden while the facade runs, while
``build_lightning_trainer`` builds a trainer, and while a fit that carries the flow callback runs (from its
``setup`` to its ``teardown``). Lightning's warnings and errors about the user's own settings still show.
Setting the environment variable ``HF_LIGHTNING_VERBOSE`` to ``1`` (or ``true`` / ``yes``) shows everything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

#: The environment variable that turns Lightning's own output back on.
VERBOSE_ENV = "HF_LIGHTNING_VERBOSE"

_LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning")


def lightning_output_wanted() -> bool:
    """Whether the user asked for Lightning's banners, tips and the warnings hidden here (``HF_LIGHTNING_VERBOSE``)."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's INFO banners and the warnings below inside the block (unless ``HF_LIGHTNING_VERBOSE``)."""
    if lightning_output_wanted():
        yield
        return
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        with warnings.catch_warnings():
            # Lightning 2.6's own use of a torch pytree API that torch 2.13 deprecates: nothing the user can act on.
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
            # A model from from_pretrained() is in eval mode; HF's Trainer (and the module, before each
            # micro-batch) switches it to training mode itself, so Lightning's warning about it is only noise here.
            warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class QuietSpan:
    """:func:`quiet_lightning` entered in one hook and left in another (a fit's ``setup`` … ``teardown``).

    Leaving twice, or without entering, does nothing, so ``on_exception`` and ``teardown`` may both leave.
    """

    def __init__(self) -> None:
        self._active: contextlib.AbstractContextManager | None = None

    def enter(self) -> None:
        if self._active is None:
            self._active = quiet_lightning()
            self._active.__enter__()

    def leave(self) -> None:
        active, self._active = self._active, None
        if active is not None:
            active.__exit__(None, None, None)
