"""MONAI's ``StatsHandler`` that leaves a user's error to the command line."""

from __future__ import annotations

from ignite.engine import Engine
from monai.handlers import StatsHandler as MonaiStatsHandler

from ..errors import user_error


class StatsHandler(MonaiStatsHandler):
    """``monai.handlers.StatsHandler`` whose exception log skips a user's error, printed once as one line."""

    def exception_raised(self, _engine: Engine, e: Exception) -> None:
        """Re-raise ``e``; log it with its traceback first unless it is a user's error."""
        if user_error(e) is not None:
            raise e
        super().exception_raised(_engine, e)
