# The case table keeps one case per line (a failing id is one grep away), so long lines are fine here.
"""Issue 12: every bad input to the ``dynres`` CLI is one ``dynres: error:`` line, exit 2, before any work.

Each case is classified as ``one-line`` (exit 2, exactly one ``dynres: error:`` line on stderr
naming the thing), ``not-one-line`` (rejected, but with several lines: a click usage block, or
after work had started), ``traceback`` (an exception escaped), ``hang`` (no answer within
``HANG_S`` seconds) or ``accepted`` (exit 0). Run this file
as a script to print the counts: ``.venv/bin/python packages/dynres-runtime/tests/test_cli_bad_input.py``.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from dynres.runtime.cli import main

HANG_S = 15
REPO = Path(__file__).resolve().parents[3]
FAKE_RUN = (REPO / "examples" / "fake-minimal.yaml").read_text(encoding="utf-8")

POLICY_RAISES = """
from dynres.core import Policy
class Boom(Policy):
    name = "boom"
    def __init__(self, params=None):
        super().__init__(params)
        raise RuntimeError("constructor broke")
    def should_deactivate(self, ctx): return True
    def deactivate_wait_samples(self, ctx): return 0
    def should_activate_after_step(self, ctx): return False
"""
NOT_A_POLICY = "class Plain:\n    pass\n"
SYNTAX_ERROR = "def broken(:\n"

DYN = "async_training:\n  use_dynamic_resource_scheduling: true\n"


def run_file(*replace: tuple[str, str], append: str = "") -> str:
    """The shipped fake run file with text replaced / appended."""
    text = FAKE_RUN
    for old, new in replace:
        assert old in text, old
        text = text.replace(old, new)
    return text + append


@dataclass(frozen=True)
class Case:
    """One bad input: files to write, the argv (``{d}`` = the case's directory) and what the line names."""

    name: str
    argv: tuple[str, ...]
    names: str
    files: tuple[tuple[str, str | bytes], ...] = ()


def _c(name: str, argv: str | tuple[str, ...], names: str, **files: str | bytes) -> Case:
    args = tuple(argv.split()) if isinstance(argv, str) else argv
    return Case(name, args, names, tuple(files.items()))


BINARY = bytes(range(256)) * 4
CASES: list[Case] = [
    # ---- config check: unreadable or empty files -------------------------------------------
    _c("check-binary", "config check {d}/f_yaml", r"f_yaml.*not UTF-8 text", f_yaml=BINARY),
    _c("check-empty", "config check {d}/f_yaml", r"f_yaml.*is empty", f_yaml=""),
    _c("check-comment-only", "config check {d}/f_yaml", r"f_yaml.*is empty", f_yaml="# nothing here\n"),
    _c("check-list", "config check {d}/f_yaml", r"f_yaml.*mapping", f_yaml="- a\n- b\n"),
    _c("check-scalar", "config check {d}/f_yaml", r"f_yaml.*mapping", f_yaml="42\n"),
    _c("check-string", "config check {d}/f_yaml", r"f_yaml.*mapping", f_yaml="hello\n"),
    _c("check-bad-yaml", "config check {d}/f_yaml", r"invalid YAML", f_yaml="a: [1,\n"),
    _c("check-tabs", "config check {d}/f_yaml", r"invalid YAML", f_yaml="a:\n\tb: 1\n"),
    _c("check-dir", "config check {d}", r"directory"),
    _c("check-missing", "config check {d}/nope.yaml", r"nope.yaml: file not found"),
    # ---- config check: DynresConfig values -------------------------------------------------
    _c("cfg-unknown-key", "config check {d}/f_yaml", r"async_training.stalenes", f_yaml=DYN + "  stalenes: 1\n"),
    _c("cfg-top-typo", "config check {d}/f_yaml", r"trainr", f_yaml="trainr: {nnodes: 1}\n"),
    _c("cfg-stal-str", "config check {d}/f_yaml", r"staleness_threshold", f_yaml=DYN + "  staleness_threshold: abc\n"),
    _c("cfg-stal-neg", "config check {d}/f_yaml", r"staleness_threshold", f_yaml=DYN + "  staleness_threshold: -1\n"),
    _c(
        "cfg-stal-huge",
        "config check {d}/f_yaml",
        r"staleness_threshold",
        f_yaml=DYN + "  staleness_threshold: 1e300\n",
    ),
    _c("cfg-stal-nan", "config check {d}/f_yaml", r"staleness_threshold", f_yaml=DYN + "  staleness_threshold: .nan\n"),
    _c("cfg-stal-inf", "config check {d}/f_yaml", r"staleness_threshold", f_yaml=DYN + "  staleness_threshold: .inf\n"),
    _c(
        "cfg-trigger-0",
        "config check {d}/f_yaml",
        r"trigger_parameter_sync_step",
        f_yaml=DYN + "  trigger_parameter_sync_step: 0\n",
    ),
    _c(
        "cfg-trigger-huge",
        "config check {d}/f_yaml",
        r"trigger_parameter_sync_step",
        f_yaml=DYN + "  trigger_parameter_sync_step: 1000000000\n",
    ),
    _c(
        "cfg-trigger-float",
        "config check {d}/f_yaml",
        r"trigger_parameter_sync_step",
        f_yaml=DYN + "  trigger_parameter_sync_step: 1.5\n",
    ),
    _c(
        "cfg-csr-0",
        "config check {d}/f_yaml",
        r"concurrent_samples_per_replica",
        f_yaml=DYN + "  concurrent_samples_per_replica: 0\n",
    ),
    _c(
        "cfg-csr-huge",
        "config check {d}/f_yaml",
        r"concurrent_samples_per_replica",
        f_yaml=DYN + "  concurrent_samples_per_replica: 100000000\n",
    ),
    _c(
        "cfg-mini-huge",
        "config check {d}/f_yaml",
        r"ppo_mini_batch_size",
        f_yaml="actor_rollout_ref: {actor: {ppo_mini_batch_size: 1e8}}\n",
    ),
    _c(
        "cfg-mini-0",
        "config check {d}/f_yaml",
        r"ppo_mini_batch_size",
        f_yaml="actor_rollout_ref: {actor: {ppo_mini_batch_size: 0}}\n",
    ),
    _c(
        "cfg-mini-str",
        "config check {d}/f_yaml",
        r"ppo_mini_batch_size",
        f_yaml="actor_rollout_ref: {actor: {ppo_mini_batch_size: lots}}\n",
    ),
    _c("cfg-n-0", "config check {d}/f_yaml", r"rollout.n", f_yaml="actor_rollout_ref: {rollout: {n: 0}}\n"),
    _c("cfg-n-huge", "config check {d}/f_yaml", r"rollout.n", f_yaml="actor_rollout_ref: {rollout: {n: 10000000}}\n"),
    _c("cfg-nnodes-neg", "config check {d}/f_yaml", r"nnodes", f_yaml="trainer: {nnodes: -1}\n"),
    _c("cfg-gpus-huge", "config check {d}/f_yaml", r"n_gpus_per_node", f_yaml="trainer: {n_gpus_per_node: 1000000}\n"),
    _c("cfg-nnodes-huge", "config check {d}/f_yaml", r"nnodes", f_yaml="rollout: {nnodes: 100000000}\n"),
    _c("cfg-section-list", "config check {d}/f_yaml", r"async_training", f_yaml="async_training: [1, 2]\n"),
    _c(
        "cfg-bool-str",
        "config check {d}/f_yaml",
        r"use_dynamic_resource_scheduling",
        f_yaml="async_training: {use_dynamic_resource_scheduling: maybe}\n",
    ),
    _c(
        "cfg-policy-unknown",
        "config check {d}/f_yaml",
        r"unknown policy 'nope'",
        f_yaml=DYN + "  dynamic_schedule_policy: nope\n",
    ),
    _c(
        "cfg-policy-raises",
        "config check {d}/f_yaml",
        r"boom|Boom.*constructor broke",
        f_yaml=DYN + "  dynamic_schedule_policy: {d}/p_py:Boom\n",
        p_py=POLICY_RAISES,
    ),
    _c(
        "cfg-policy-not-policy",
        "config check {d}/f_yaml",
        r"Plain",
        f_yaml=DYN + "  dynamic_schedule_policy: {d}/p_py:Plain\n",
        p_py=NOT_A_POLICY,
    ),
    _c(
        "cfg-policy-syntax",
        "config check {d}/f_yaml",
        r"p_py",
        f_yaml=DYN + "  dynamic_schedule_policy: {d}/p_py:X\n",
        p_py=SYNTAX_ERROR,
    ),
    _c(
        "cfg-policy-missing-file",
        "config check {d}/f_yaml",
        r"nofile",
        f_yaml=DYN + "  dynamic_schedule_policy: {d}/nofile.py:X\n",
    ),
    _c(
        "cfg-policy-module-missing",
        "config check {d}/f_yaml",
        r"no_such_mod",
        f_yaml=DYN + "  dynamic_schedule_policy: no_such_mod:X\n",
    ),
    _c(
        "cfg-params-typo",
        "config check {d}/f_yaml",
        r"ratio_increse_max",
        f_yaml=DYN + "  dynamic_schedule_policy_params: {ratio_increse_max: 0.2}\n",
    ),
    _c(
        "cfg-params-type",
        "config check {d}/f_yaml",
        r"ratio_increase_max",
        f_yaml=DYN + "  dynamic_schedule_policy_params: {ratio_increase_max: lots}\n",
    ),
    _c(
        "cfg-ratio-2",
        "config check {d}/f_yaml",
        r"dynamic_schedule_deactivate_ratio",
        f_yaml=DYN + "  dynamic_schedule_deactivate_ratio: 2\n",
    ),
    # ---- config check: scenarios --------------------------------------------------------------
    _c("scn-steps-0", "config check {d}/f_yaml", r"steps", f_yaml="extends: seed-static-8-24\nsteps: 0\n"),
    _c("scn-steps-huge", "config check {d}/f_yaml", r"steps", f_yaml="extends: seed-static-8-24\nsteps: 1000000000\n"),
    _c("scn-extends-unknown", "config check {d}/f_yaml", r"nope-preset", f_yaml="extends: nope-preset\nsteps: 3\n"),
    _c("scn-workload-typo", "config check {d}/f_yaml", r"respons", f_yaml="steps: 3\nworkload: {respons: {}}\n"),
    _c(
        "scn-mini-huge",
        "config check {d}/f_yaml",
        r"ppo_mini_batch_size",
        f_yaml="extends: seed-static-8-24\nactor_rollout_ref: {actor: {ppo_mini_batch_size: 100000000}}\n",
    ),
    _c(
        "scn-policy-raises",
        "config check {d}/f_yaml",
        r"constructor broke",
        f_yaml="extends: seed-dynamic-16-16\nasync_training: {dynamic_schedule_policy: '{d}/p_py:Boom'}\n",
        p_py=POLICY_RAISES,
    ),
    _c("scn-seed-neg", "config check {d}/f_yaml", r"seed", f_yaml="extends: seed-static-8-24\nseed: -4\n"),
    # ---- config check: run files --------------------------------------------------------------
    _c(
        "runfile-tps-0",
        "config check {d}/f_yaml",
        r"tokens_per_s",
        f_yaml=run_file(("tokens_per_s: 400.0", "tokens_per_s: 0")),
    ),
    _c(
        "runfile-tps-neg",
        "config check {d}/f_yaml",
        r"tokens_per_s",
        f_yaml=run_file(("tokens_per_s: 400.0", "tokens_per_s: -5")),
    ),
    _c(
        "runfile-failon-unknown",
        "config check {d}/f_yaml",
        r"fail_on",
        f_yaml=run_file(("response_tokens: 16", "response_tokens: 16\n    fail_on: {generate: NoSuchError}")),
    ),
    _c(
        "runfile-failon-op",
        "config check {d}/f_yaml",
        r"genrate",
        f_yaml=run_file(("response_tokens: 16", "response_tokens: 16\n    fail_on: {genrate: RuntimeError}")),
    ),
    _c(
        "runfile-latency-neg",
        "config check {d}/f_yaml",
        r"latency",
        f_yaml=run_file(("latency: {sleep: 0.02, wake_up: 0.02}", "latency: -1")),
    ),
    _c(
        "runfile-rollout-opt-typo",
        "config check {d}/f_yaml",
        r"tokens_per_sec",
        f_yaml=run_file(("tokens_per_s: 400.0", "tokens_per_sec: 400.0")),
    ),
    _c(
        "runfile-trainer-opt-typo",
        "config check {d}/f_yaml",
        r"phase_time",
        f_yaml=run_file(("phase_times: {update_actor: 0.1}", "phase_time: {update_actor: 0.1}")),
    ),
    _c("runfile-steps-0", "config check {d}/f_yaml", r"run.steps", f_yaml=run_file(("steps: 3 ", "steps: 0 "))),
    _c(
        "runfile-steps-huge",
        "config check {d}/f_yaml",
        r"run.steps",
        f_yaml=run_file(("steps: 3 ", "steps: 1000000000 ")),
    ),
    _c("runfile-date", "config check {d}/f_yaml", r"run.seed", f_yaml=run_file(("seed: 0", "seed: 2024-01-01"))),
    _c(
        "runfile-runtime-typo",
        "config check {d}/f_yaml",
        r"engines.runtim",
        f_yaml=run_file(("runtime: local", "runtim: local")),
    ),
    _c(
        "runfile-rollout-bad",
        "config check {d}/f_yaml",
        r"engines.rollout",
        f_yaml=run_file(("rollout: fake", "rollout: sglang")),
    ),
    _c(
        "runfile-op-timeout-0",
        "config check {d}/f_yaml",
        r"op_timeout_s",
        f_yaml=run_file(("seed: 0", "seed: 0\n  op_timeout_s: 0")),
    ),
    # ---- dynres run -----------------------------------------------------------------------------
    _c("run-missing", "run {d}/nope.yaml --out {d}/o", r"nope.yaml: file not found"),
    _c("run-dir", "run {d} --out {d}/o", r"directory"),
    _c("run-binary", "run {d}/f_yaml --out {d}/o", r"not UTF-8 text", f_yaml=BINARY),
    _c("run-empty", "run {d}/f_yaml --out {d}/o", r"is empty", f_yaml=""),
    _c(
        "run-set-unclosed",
        ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "run.steps=[1,"),
        r"run.steps",
        f_yaml=FAKE_RUN,
    ),
    _c(
        "run-set-noequals", ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "run.steps"), r"run.steps", f_yaml=FAKE_RUN
    ),
    _c("run-set-nokey", ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "=3"), r"--set", f_yaml=FAKE_RUN),
    _c(
        "run-set-unknown",
        ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "run.stepz=3"),
        r"run.stepz",
        f_yaml=FAKE_RUN,
    ),
    _c(
        "run-set-type",
        ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "run.steps=many"),
        r"run.steps",
        f_yaml=FAKE_RUN,
    ),
    _c("run-steps-0", "run {d}/f_yaml --out {d}/o --steps 0", r"steps", f_yaml=FAKE_RUN),
    _c("run-steps-neg", "run {d}/f_yaml --out {d}/o --steps -3", r"steps", f_yaml=FAKE_RUN),
    _c("run-steps-huge", "run {d}/f_yaml --out {d}/o --steps 1000000000", r"steps", f_yaml=FAKE_RUN),
    _c(
        "run-steps-conflict",
        ("run", "{d}/f_yaml", "--out", "{d}/o", "--steps", "1", "--set", "run.steps=3"),
        r"--steps.*run.steps",
        f_yaml=FAKE_RUN,
    ),
    _c(
        "run-policy-conflict",
        (
            "run",
            "{d}/f_yaml",
            "--out",
            "{d}/o",
            "--policy",
            "fixed_ratio",
            "--set",
            "async_training.dynamic_schedule_policy=default",
        ),
        r"--policy.*dynamic_schedule_policy",
        f_yaml=FAKE_RUN,
    ),
    _c(
        "run-address-conflict",
        ("run", "{d}/f_yaml", "--out", "{d}/o", "--address", "auto", "--set", "ray.address=x:1"),
        r"--address.*ray.address",
        f_yaml=FAKE_RUN,
    ),
    _c("run-out-under-file", "run {d}/f_yaml --out {d}/f_yaml/o", r"--out", f_yaml=FAKE_RUN),
    _c("run-out-is-file", "run {d}/f_yaml --out {d}/f_yaml", r"--out", f_yaml=FAKE_RUN),
    _c("run-policy-unknown", "run {d}/f_yaml --out {d}/o --policy nope", r"unknown policy 'nope'", f_yaml=FAKE_RUN),
    _c(
        "run-policy-raises",
        "run {d}/f_yaml --out {d}/o --policy {d}/p_py:Boom",
        r"constructor broke",
        f_yaml=FAKE_RUN,
        p_py=POLICY_RAISES,
    ),
    _c(
        "run-policy-not-policy",
        "run {d}/f_yaml --out {d}/o --policy {d}/p_py:Plain",
        r"Plain",
        f_yaml=FAKE_RUN,
        p_py=NOT_A_POLICY,
    ),
    _c(
        "run-policy-syntax",
        "run {d}/f_yaml --out {d}/o --policy {d}/p_py:X",
        r"p_py",
        f_yaml=FAKE_RUN,
        p_py=SYNTAX_ERROR,
    ),
    _c("run-date", "run {d}/f_yaml --out {d}/o", r"run.seed", f_yaml=run_file(("seed: 0", "seed: 2024-01-01"))),
    _c(
        "run-date-options",
        "run {d}/f_yaml --out {d}/o",
        r"when",
        f_yaml=run_file(("response_tokens: 16", "response_tokens: 16\n    when: 2024-01-01")),
    ),
    _c(
        "run-tps-0",
        "run {d}/f_yaml --out {d}/o",
        r"tokens_per_s",
        f_yaml=run_file(("tokens_per_s: 400.0", "tokens_per_s: 0")),
    ),
    _c(
        "run-tps-neg",
        "run {d}/f_yaml --out {d}/o",
        r"tokens_per_s",
        f_yaml=run_file(("tokens_per_s: 400.0", "tokens_per_s: -5")),
    ),
    _c(
        "run-failon-unknown",
        "run {d}/f_yaml --out {d}/o",
        r"fail_on",
        f_yaml=run_file(("response_tokens: 16", "response_tokens: 16\n    fail_on: {generate: NoSuchError}")),
    ),
    _c(
        "run-hybrid-opt-typo",
        "run {d}/f_yaml --out {d}/o",
        r"tokenz",
        f_yaml=run_file(("  trainer_options:", "  hybrid_options: {tokenz: 1}\n  trainer_options:")),
    ),
    _c(
        "run-stal-huge",
        ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "async_training.staleness_threshold=1e300"),
        r"staleness_threshold",
        f_yaml=FAKE_RUN,
    ),
    _c(
        "run-mini-huge",
        ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "actor_rollout_ref.actor.ppo_mini_batch_size=100000000"),
        r"ppo_mini_batch_size",
        f_yaml=FAKE_RUN,
    ),
    _c("run-seed-str", ("run", "{d}/f_yaml", "--out", "{d}/o", "--set", "run.seed=abc"), r"run.seed", f_yaml=FAKE_RUN),
    _c("run-list-file", "run {d}/f_yaml --out {d}/o", r"mapping", f_yaml="- 1\n"),
    _c("run-no-steps", "run {d}/f_yaml --out {d}/o", r"run", f_yaml="engines: {runtime: local}\n"),
    _c("run-bad-yaml", "run {d}/f_yaml --out {d}/o", r"invalid YAML", f_yaml="run: {steps: [1,\n"),
    # ---- dynres simulate ------------------------------------------------------------------------
    _c("sim-nothing", "simulate", r"SCENARIO or --preset"),
    _c("sim-both", "simulate x.yaml --preset seed-static-8-24", r"SCENARIO or --preset"),
    _c("sim-preset-unknown", "simulate --preset nope", r"nope"),
    _c("sim-list-and-preset", "simulate --list-presets --preset nope", r"--list-presets"),
    _c("sim-list-and-scenario", "simulate x.yaml --list-presets", r"--list-presets"),
    _c("sim-missing", "simulate {d}/nope.yaml", r"nope.yaml"),
    _c("sim-empty", "simulate {d}/f_yaml", r"is empty", f_yaml=""),
    _c("sim-comment", "simulate {d}/f_yaml", r"is empty", f_yaml="# nothing\n"),
    _c("sim-binary", "simulate {d}/f_yaml", r"not UTF-8 text", f_yaml=BINARY),
    _c("sim-list", "simulate {d}/f_yaml", r"mapping", f_yaml="- 1\n"),
    _c("sim-set-unclosed", ("simulate", "--preset", "seed-static-8-24", "--set", "steps=[1,"), r"steps"),
    _c("sim-set-noequals", ("simulate", "--preset", "seed-static-8-24", "--set", "steps"), r"steps"),
    _c("sim-set-unknown", ("simulate", "--preset", "seed-static-8-24", "--set", "stepz=3"), r"stepz"),
    _c("sim-steps-0", ("simulate", "--preset", "seed-static-8-24", "--set", "steps=0"), r"steps"),
    _c("sim-steps-huge", ("simulate", "--preset", "seed-static-8-24", "--set", "steps=1000000000"), r"steps"),
    _c(
        "sim-mini-huge",
        ("simulate", "--preset", "seed-static-8-24", "--set", "actor_rollout_ref.actor.ppo_mini_batch_size=100000000"),
        r"ppo_mini_batch_size",
    ),
    _c(
        "sim-stal-huge",
        ("simulate", "--preset", "seed-static-8-24", "--set", "async_training.staleness_threshold=1e300"),
        r"staleness_threshold",
    ),
    _c(
        "sim-stal-nan",
        ("simulate", "--preset", "seed-static-8-24", "--set", "async_training.staleness_threshold=.nan"),
        r"staleness_threshold",
    ),
    _c("sim-seed-neg", "simulate --preset seed-static-8-24 --seed -1", r"--seed"),
    _c("sim-seed-str", "simulate --preset seed-static-8-24 --seed x", r"--seed"),
    _c("sim-policy-unknown", "simulate --preset seed-static-8-24 --policy nope", r"unknown policy 'nope'"),
    _c(
        "sim-policy-bench-form",
        ("simulate", "--preset", "seed-static-8-24", "--policy", "fixed_ratio[deactivate_ratio=0.5]"),
        r"name it 'fixed_ratio'.*--set async_training\.dynamic_schedule_policy_params\.deactivate_ratio=0\.5",
    ),
    _c(
        "sim-policy-raises",
        "simulate --preset seed-dynamic-16-16 --policy {d}/p_py:Boom",
        r"constructor broke",
        p_py=POLICY_RAISES,
    ),
    _c(
        "sim-policy-not-policy",
        "simulate --preset seed-static-8-24 --policy {d}/p_py:Plain",
        r"Plain",
        p_py=NOT_A_POLICY,
    ),
    _c("sim-policy-syntax", "simulate --preset seed-static-8-24 --policy {d}/p_py:X", r"p_py", p_py=SYNTAX_ERROR),
    _c("sim-compare-unknown", "simulate --preset seed-static-8-24 --compare nope", r"nope"),
    _c("sim-json-no-dir", "simulate --preset seed-static-8-24 --json {d}/no/such/dir/r.json", r"--json"),
    _c("sim-json-is-dir", "simulate --preset seed-static-8-24 --json {d}", r"--json"),
    _c("sim-plot-is-file", "simulate --preset seed-static-8-24 --plot {d}/f_yaml", r"--plot", f_yaml="x: 1\n"),
    _c("sim-plot-under-file", "simulate --preset seed-static-8-24 --plot {d}/f_yaml/p", r"--plot", f_yaml="x: 1\n"),
    _c(
        "sim-policy-conflict",
        (
            "simulate",
            "--preset",
            "seed-static-8-24",
            "--policy",
            "default",
            "--set",
            "async_training.dynamic_schedule_policy=fixed_ratio",
        ),
        r"--policy.*dynamic_schedule_policy",
    ),
    _c(
        "sim-seed-conflict",
        ("simulate", "--preset", "seed-static-8-24", "--seed", "1", "--set", "seed=2"),
        r"--seed.*seed",
    ),
    # ---- the group ------------------------------------------------------------------------------
    _c("cli-unknown-command", "simulat", r"simulat"),
    _c("cli-unknown-option", "run --nope x", r"--nope"),
    _c("cli-config-unknown-sub", "config chek x", r"chek"),
    _c("cli-policies-unknown-sub", "policies lst", r"lst"),
]


def _real(text: str, d: Path) -> str:
    """File names in cases are spelt ``f_yaml`` / ``p_py`` (keyword arguments); on disk they are
    ``f.yaml`` / ``p.py``."""
    return text.replace("{d}", str(d)).replace("f_yaml", "f.yaml").replace("p_py", "p.py")


def _materialise(case: Case, d: Path) -> list[str]:
    for fname, content in case.files:
        p = d / _real(fname, d)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(_real(content, d), encoding="utf-8")
    return [_real(a, d) for a in case.argv]


class _Hang(BaseException):
    """Raised by the alarm when a case does not answer within HANG_S seconds."""


def classify(case: Case, d: Path) -> tuple[str, str, int]:
    """(``one-line`` | ``not-one-line`` | ``traceback`` | ``hang`` | ``accepted``, stderr, exit code)."""
    argv = _materialise(case, d)

    def on_alarm(signum: int, frame: object) -> None:
        raise _Hang

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HANG_S)
    try:
        res = CliRunner().invoke(main, argv)
    except _Hang:
        return "hang", "", -1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        return "traceback", f"{type(res.exception).__name__}: {res.exception}", res.exit_code
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("dynres: error:"):
        return "one-line", lines[0], 2
    if res.exit_code == 0:
        return "accepted", err, 0
    return "not-one-line", err, res.exit_code


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_naming_the_thing(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    kind, line, code = classify(case, tmp_path)
    assert kind == "one-line", f"{case.name}: {kind} (exit {code}): {line}"
    import re

    assert re.search(_real(case.names, tmp_path), line), f"{case.name}: the line does not name it: {line}"


def test_there_are_at_least_100_cases() -> None:
    assert len(CASES) >= 100 and len({c.name for c in CASES}) == len(CASES)


def test_shorthand_and_set_for_one_key_is_the_one_shared_error() -> None:
    """Both commands' shorthand check is core's shorthand_overrides: given shorthands come back, a clash raises."""
    from dynres.core.config import parse_set_items, shorthand_overrides
    from dynres.core.errors import ConfigError

    sets = parse_set_items(["run.steps=3", "ray.address=x:1"])
    given = shorthand_overrides(
        sets, [("--policy", "async_training.dynamic_schedule_policy", "p"), ("--seed", "seed", None)]
    )
    assert given == {"async_training.dynamic_schedule_policy": "p"}
    assert shorthand_overrides(sets, [("--seed", "seed", 0)]) == {"seed": 0}  # 0 is a value, not "not given"
    with pytest.raises(ConfigError, match=r"^--steps and --set run.steps=\.\.\. both set run.steps; give only one"):
        shorthand_overrides(sets, [("--seed", "seed", 1), ("--steps", "run.steps", 2)])


def _classify_forked(case: Case, d: Path) -> tuple[str, str, int]:
    """classify() in a forked child, killed after HANG_S seconds (a hang in C code, or memory)."""
    import json
    import os
    import time

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        os.chdir(d)
        try:
            out = classify(case, d)
        except BaseException as exc:  # reported as the case's outcome
            out = ("traceback", f"{type(exc).__name__}: {exc}", -1)
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + HANG_S + 5
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        return "hang", "", -1
    data = os.read(r, 1 << 20)
    os.close(r)
    kind, line, code = json.loads(data) if data else ("hang", "child died", -1)
    return kind, line, code


def _count(make_dir: Callable[[str], Path]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for case in CASES:
        kind, line, code = _classify_forked(case, make_dir(case.name))
        counts[kind] += 1
        if kind != "one-line":
            print(f"  {kind:9} {case.name}: exit {code}: {line.strip()[:150]}")
    return counts


if __name__ == "__main__":
    import os
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="dynres-bad-input-"))

    def make_dir(name: str) -> Path:
        p = base / name
        p.mkdir()
        return p

    os.chdir(base)
    counts = _count(make_dir)
    print(
        f"{len(CASES)} cases: "
        + ", ".join(f"{k} {counts[k]}" for k in ("one-line", "not-one-line", "traceback", "hang", "accepted"))
    )
    sys.exit(0)
