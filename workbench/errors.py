"""One error family for everything a user can act on.

Every layer raises a subclass of `WorkbenchError` with a message that says what is wrong and
what to do next; the CLI turns it into `error: <message>` and its `exit_code` in one place, the
app shows the message. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """A problem a user can act on; the message says how."""

    exit_code = 1


class NotFoundError(WorkbenchError):
    """The command named something that is not there (a path, a run, a log)."""

    exit_code = 2


class StoreError(WorkbenchError):
    """A store that cannot be opened or written as asked: missing, damaged, newer than this
    workbench, or out of disk space (the message says what to do)."""
