"""Lightning's console output: hidden inside ``quiet_lightning`` / a ``QuietSpan``, shown with HF_LIGHTNING_VERBOSE."""

from __future__ import annotations

import logging
import warnings

import lightning.pytorch  # noqa: F401  (sets its logger to INFO, as in any run)
import pytest

from hf_lightning.console import VERBOSE_ENV, QuietSpan, quiet_lightning

LEAF_SPEC = "`isinstance(treespec, LeafSpec)` is deprecated"


@pytest.mark.parametrize("verbose", [False, True])
def test_quiet_lightning_hides_info_and_lightnings_own_warnings_unless_verbose(monkeypatch, verbose):
    if verbose:
        monkeypatch.setenv(VERBOSE_ENV, "1")
    else:
        monkeypatch.delenv(VERBOSE_ENV, raising=False)
    lightning_logger = logging.getLogger("lightning.pytorch")
    level = lightning_logger.level
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_lightning():
            info_on = lightning_logger.isEnabledFor(logging.INFO)
            warnings.warn(LEAF_SPEC, DeprecationWarning)
            warnings.warn("a warning about the user's own settings", UserWarning)
    assert info_on == verbose
    messages = [str(w.message) for w in caught]
    assert ("a warning about the user's own settings" in messages) and ((LEAF_SPEC in messages) == verbose)
    assert lightning_logger.level == level


def test_quiet_span_is_left_once_whatever_the_number_of_leaves(monkeypatch):
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    lightning_logger = logging.getLogger("lightning.pytorch")
    level = lightning_logger.level
    span = QuietSpan()
    span.leave()
    span.enter()
    span.enter()
    assert not lightning_logger.isEnabledFor(logging.INFO)
    span.leave()
    span.leave()
    assert lightning_logger.level == level
