"""The one service the E2B layer needed that Sandpit did not have.

Signals to a streamed run travel as a frame to its runner (the sandbox's pid namespace is
the runner's), so, like stdin to a streamed run (sandboxes.streaming.
sandbox_exec_stream_stdin), the door authorizes and counts and the caller then sends.
"""

from __future__ import annotations

import signal

from sandboxes.caller import Caller, metered


def e2b_run_signal_authorize(*, caller: Caller, number: int) -> None:
    """Authorize and count one signal to a streamed run ('process.signal'). SIGKILL stops
    whatever runs and is never refused by billing, as sandbox_process_signal. Raises
    PaymentRequired (402) for other signals past the plan. Synchronous: call from a thread."""
    with metered(
        caller,
        feature="processes",
        operation="process.signal",
        scope="exec",
        teardown=number == signal.SIGKILL,
    ):
        pass
