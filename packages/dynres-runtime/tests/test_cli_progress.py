"""Progress of dynres run (start-up phases, then a cycle bar) and dynres simulate: for a person at a
terminal only, never with -q, --json - or a non-terminal stdout.

The terminal cases run the real command under a pseudo-terminal (``pty``), as a person would.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dynres.runtime.cli import main, simulate
from dynres.runtime.cli.output import show_progress

ROOT = Path(__file__).resolve().parents[3]
FAKE_RUN = ROOT / "examples" / "fake-minimal.yaml"
DYNRES = Path(sys.executable).parent / "dynres"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _in_terminal(args: list[str], cwd: Path) -> str:
    """Run ``dynres ARGS`` with stdout and stderr on a pseudo-terminal; return what it drew, escapes removed."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(
        [str(DYNRES), *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def test_run_on_a_terminal_shows_start_up_phases_then_the_cycle_bar(tmp_path: Path) -> None:
    screen = _in_terminal(["run", str(FAKE_RUN), "--out", str(tmp_path / "r"), "--no-plot", "--steps", "4"], tmp_path)
    for phase in ("preparing the model", "starting engines", "switch calibration"):
        assert phase in screen, phase
    assert re.search(r"starting engines .* [0-3]/3", screen)  # engines counted, n of m
    assert re.search(r"cycles .* \d/4  ETA \d:\d\d:\d\d .*queue \d+  hybrid (on|off|\w+)", screen)
    assert screen.index("starting engines") < screen.index("switch calibration") < screen.index("cycles ")
    assert "cycle   4/4" in screen  # the console backend's line per cycle is still there


def test_run_quiet_on_a_terminal_shows_no_progress(tmp_path: Path) -> None:
    screen = _in_terminal(["run", str(FAKE_RUN), "--out", str(tmp_path / "r"), "--no-plot", "-q"], tmp_path)
    assert "starting engines" not in screen and "ETA" not in screen
    assert "cycle   3/3" in screen and "finished 3 cycles" in screen


def test_progress_is_for_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: take stdout and stderr for terminals
    assert show_progress(False, None)
    assert show_progress(False, "out.json")
    assert not show_progress(True, None)  # -q
    assert not show_progress(False, "-")  # --json -: stdout is data
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert not show_progress(False, None)  # a pipe or a file


def test_run_off_a_terminal_prints_lines_but_no_progress(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", str(FAKE_RUN), "--out", str(tmp_path / "r"), "--no-plot"])
    assert res.exit_code == 0, res.output
    assert "starting engines" not in res.output and "ETA" not in res.output
    assert "cycle   3/3" in res.output


@pytest.mark.parametrize(("after_s", "drawn"), [(0.0, True), (1000.0, False)])
def test_simulate_draws_bars_only_for_plans_longer_than_a_few_seconds(
    after_s: float, drawn: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simulate, "SHOW_AFTER_S", after_s)
    monkeypatch.setattr("dynres.runtime.cli.output.show_progress", lambda quiet, json_dest: not quiet)
    args = ["simulate", "--preset", "seed-dynamic-16-16", "--compare-policy", "fixed_ratio", "--set", "steps=3"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert ("steps, " in res.stderr and "simulated, ETA" in res.stderr) is drawn
    quiet = CliRunner().invoke(main, [*args, "-q"])
    assert "simulated, ETA" not in quiet.stderr
