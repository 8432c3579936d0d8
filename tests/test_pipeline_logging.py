"""The pipeline quiets the libraries' logging for its run only (``pipeline.runner.quiet_libraries``)."""

from __future__ import annotations

import logging
import warnings

import pytest
import transformers

from draftsmith.pipeline.runner import quiet_libraries


def test_quiet_libraries_restores_logging_warnings_and_progress_bars_on_exit():
    logger = logging.getLogger("lightning.pytorch")
    before_level, before_filters = logger.level, list(warnings.filters)
    logger.setLevel(logging.DEBUG)
    transformers.utils.logging.enable_progress_bar()
    try:
        with pytest.raises(RuntimeError), quiet_libraries():
            assert logger.level == logging.WARNING
            assert not transformers.utils.logging.is_progress_bar_enabled()
            raise RuntimeError("a stage failed")  # restored on the way out of a failing run too
        assert logger.level == logging.DEBUG
        assert transformers.utils.logging.is_progress_bar_enabled()
        assert warnings.filters == before_filters
    finally:
        logger.setLevel(before_level)
