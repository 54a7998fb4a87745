"""Path converters of the sandbox API's URLs (imports nothing of the app's: the schema
module reads their bounds while the views are being declared)."""

from __future__ import annotations

PID_MAX = 4194304
"""Linux's largest process id (pid_max's ceiling, 2**22): a larger one names no process, and
the kernel's calls refuse numbers past a C int rather than answering that."""


class ProcessIdConverter:
    """`<pid:pid>`: a process id, 1 to PID_MAX; anything else matches no route (404)."""

    regex = "[1-9][0-9]{0,6}"

    def to_python(self, value: str) -> int:
        if int(value) > PID_MAX:
            raise ValueError(value)
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)
