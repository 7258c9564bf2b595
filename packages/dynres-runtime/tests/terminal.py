"""Start a ``dynres`` subprocess the way a terminal starts a foreground job, for Ctrl-C tests."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_like_a_terminal(cmd: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """``Popen(cmd)`` in its own process group (the test signals the group, as a terminal's Ctrl-C
    does) with SIGINT at its default: a shell that runs the test suite in the background without
    job control (``nohup ... &``) makes it ignore SIGINT, every child inherits that, and the
    Python under test would then never see the Ctrl-C."""
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_default_sigint, text=True, **kwargs)
