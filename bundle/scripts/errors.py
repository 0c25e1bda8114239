"""The bundle's error type for a problem the user can fix."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A problem with the command, the configuration, the data or the folders that the user can fix.

    Its message is one line naming the file or option and what to do; the command line
    (:class:`scripts.workflow.GLAMWorkflow`) prints it as ``error: <message>`` without a traceback. It subclasses
    ``ValueError`` so that callers catching ``ValueError`` keep working.
    """
