"""trainer.logger: each built-in backend's output, read back with the backend's own reader, equals metrics.jsonl.

The runs are short (the fake engines of examples/fake-minimal.yaml, a 3-cycle simulation), so the
whole file takes seconds. wandb runs offline (``WANDB_MODE=offline``); TensorBoard is read with its
event accumulator, MLflow with a client on the file store, wandb from its offline run file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from dynres.core.hookspecs import hookimpl
from dynres.core.metrics import tracking_metrics
from dynres.core.plugins import get_plugin_manager, register_plugin
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend
from dynres.runtime import tracking
from dynres.runtime.cli import main
from dynres.runtime.realrun import execute, load_run_config
from dynres.runtime.tracking import TrackerSet, installed_backends, resolve_backends

ROOT = Path(__file__).resolve().parents[3]
FAKE_RUN = ROOT / "examples" / "fake-minimal.yaml"
ALL = ["console", "file", "tensorboard", "mlflow", "wandb"]


@pytest.fixture(autouse=True)
def _wandb_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


# ---- readers: each backend's own -------------------------------------------------------------


def read_tensorboard(logdir: Path) -> dict[int, dict[str, float]]:
    """{step: {tag: value}} from TensorBoard's event accumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    out: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            out.setdefault(event.step, {})[tag] = float(make_ndarray(event.tensor_proto))
    return out


def read_mlflow(store: Path, run_name: str) -> tuple[dict[int, dict[str, float]], dict[str, str], dict[str, float]]:
    """({step: {key: value}}, params, summary/* metrics) of one MLflow run, through a client on the file store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.run_name == run_name and run.info.status == "FINISHED"
    out: dict[int, dict[str, float]] = {}
    summary = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, key):
            if key.startswith("summary/"):
                summary[key.removeprefix("summary/")] = m.value
            else:
                out.setdefault(m.step, {})[key] = m.value
    return out, dict(run.data.params), summary


def _wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a W&B run file: a 7-byte header, then 32 KiB blocks of chunks, each
    ``crc32 (4) | length (2, little endian) | type (1: whole, 2: first, 3: middle, 4: last)``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, block, pending = 7, 32 * 1024, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_wandb(folder: Path) -> tuple[dict[int, dict[str, float]], str, dict[str, float]]:
    """({step: {key: value}}, run name, summary) from the offline run file under ``folder/wandb``."""
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[int, dict[str, float]] = {}
    name, summary = "", {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            name = record.run.display_name
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[int(row["_step"])] = {k: float(v) for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                if key in ("end_to_end_s", "cycles"):
                    summary[key] = json.loads(item.value_json)
    return history, name, summary


def read_file_logger(path: Path) -> dict[int, dict[str, float]]:
    """{step: data} of verl's file-logger lines."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {line["step"]: line["data"] for line in lines}


def expected(records: list[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """What every backend must hold: each record's tracking metrics, by step."""
    return {int(r["step"]): tracking_metrics(r) for r in records}


def assert_same(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]], *, rel: float = 1e-9) -> None:
    """The same steps, keys and values (``rel``: TensorBoard stores float32)."""
    assert sorted(got) == sorted(want)
    for step, metrics in want.items():
        assert sorted(got[step]) == sorted(metrics), step
        for key, value in metrics.items():
            assert got[step][key] == pytest.approx(value, rel=rel, abs=1e-6), (step, key)


# ---- dynres run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_backends_hold_what_metrics_jsonl_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_run_config(FAKE_RUN, {"trainer.logger": ALL, "trainer.project_name": "readback"})
    out = tmp_path / "fake"
    outcome = execute(cfg, out, plots=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    want = expected(records)
    assert len(want) == 3 and all("timing_s/step" in m and "dynamic_resource/mq_size" in m for m in want.values())

    assert_same(read_tensorboard(out / "tensorboard" / "fake"), want, rel=1e-6)
    history, params, summary = read_mlflow(out / "mlruns", "fake")
    assert_same(history, want)
    assert params["run.steps"] == "3" and params["trainer.project_name"] == "readback"
    assert summary["end_to_end_s"] == pytest.approx(outcome.report.end_to_end_s)
    rows, name, wsummary = read_wandb(out)
    assert name == "fake"
    assert_same(rows, want)
    assert wsummary["end_to_end_s"] == pytest.approx(outcome.report.end_to_end_s)
    assert_same(read_file_logger(out / "file" / "fake.jsonl"), want)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("cycle ")]
    assert [ln.split()[1] for ln in lines] == ["1/3", "2/3", "3/3"]  # console: a line per cycle


def test_run_without_console_prints_no_cycle_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    execute(load_run_config(FAKE_RUN, {"trainer.logger": []}), tmp_path / "quiet", plots=False)
    assert "cycle " not in capsys.readouterr().err
    assert not (tmp_path / "quiet" / "tensorboard").exists()


# ---- dynres simulate: one tracked run per label ------------------------------------------------


def test_simulate_tracks_one_run_per_label(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    args = [
        "simulate", "--preset", "seed-dynamic-16-16", "--compare-policy", "static_fully_async",
        "--set", "steps=3", "--set", "trainer.logger=[tensorboard, mlflow, file]",
        "--out", str(out), "--json", str(tmp_path / "sim.json"),
    ]  # fmt: skip
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    runs = json.loads((tmp_path / "sim.json").read_text())["runs"]
    labels = [r["label"] for r in runs]
    assert labels == ["seed-dynamic-16-16[default]", "seed-dynamic-16-16[static_fully_async]"]
    assert sorted(p.name for p in (out / "tensorboard").iterdir()) == labels
    for run in runs:
        want = expected(run["steps"])
        assert_same(read_tensorboard(out / "tensorboard" / run["label"]), want, rel=1e-6)
        assert_same(read_file_logger(out / "file" / f"{run['label']}.jsonl"), want)
    # Both runs went to one MLflow experiment, side by side.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == "dynres"]
    assert sorted(r.info.run_name for r in client.search_runs([exp.experiment_id])) == labels
    # The line may wrap at the terminal's width (a long tmp path): compare its words.
    assert f"tracked runs (tensorboard, mlflow, file) in {out}" in " ".join(res.output.split())


def test_simulate_without_logger_writes_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["simulate", "--preset", "seed-dynamic-16-16", "--set", "steps=2"])
    assert res.exit_code == 0, res.output
    assert list(tmp_path.iterdir()) == []


# ---- errors before anything starts -------------------------------------------------------------


def _hide_module(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))


@pytest.mark.parametrize("backend", ["tensorboard", "mlflow", "wandb"])
def test_missing_extra_is_one_line_before_anything_starts(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hide_module(monkeypatch, backend)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", str(FAKE_RUN), "--out", str(out), "--set", f"trainer.logger=[{backend}]"])
    assert res.exit_code == 2
    assert res.output.splitlines() == [
        f"dynres: error: trainer.logger lists {backend!r}, which needs {backend!r}; it is not installed. "
        f"Install it with: pip install 'dynres-runtime[{backend}]'"
    ]
    assert not out.exists()  # no header, no folder: nothing started
    res = CliRunner().invoke(main, ["simulate", "--preset", "seed-dynamic-16-16", "--set", f"trainer.logger={backend}"])
    assert res.exit_code == 2 and f"pip install 'dynres-runtime[{backend}]'" in res.output


def test_unknown_backend_names_the_nearest_and_the_installed(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["run", str(FAKE_RUN), "--out", str(tmp_path / "r"), "--set", "trainer.logger=[tensorbord]"]
    )
    assert res.exit_code == 2
    assert "no tracking backend 'tensorbord' (did you mean 'tensorboard'?)" in res.output
    assert "installed: console, file, mlflow, tensorboard, wandb" in res.output


def test_builtin_backends_come_from_entry_points_even_without_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(ALL) <= set(installed_backends())
    monkeypatch.setenv("DYNRES_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert set(ALL) <= set(installed_backends())


# ---- a third party's backend, through the same hook ------------------------------------------


class MemoryTracker(Tracker):
    def __init__(self, run: TrackedRun, store: dict[str, Any]) -> None:
        self.store = store
        store["run"] = run
        store["rows"] = {}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.store.get("fail"):
            raise RuntimeError("disk full")
        self.store["rows"][step] = dict(metrics)

    def finish(self, summary: Mapping[str, float]) -> None:
        self.store["summary"] = dict(summary)


class MemoryBackend(TrackingBackend):
    name = "memory"
    writes_files = False
    store: ClassVar[dict[str, Any]] = {}

    def open(self, run: TrackedRun) -> Tracker:
        return MemoryTracker(run, self.store)


class MemoryPlugin:
    @hookimpl
    def dynres_tracking_backends(self) -> list[TrackingBackend]:
        return [MemoryBackend()]


@pytest.fixture
def memory_plugin(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A plugin manager with the installed plugins plus MemoryPlugin, as an entry point would add it."""

    def manager() -> Any:
        pm = get_plugin_manager()
        register_plugin(pm, MemoryPlugin(), name="memory-plugin")
        return pm

    monkeypatch.setattr(tracking, "_plugin_manager", manager)
    MemoryBackend.store = {}
    return MemoryBackend.store


def test_a_third_party_backend_gets_every_cycle(tmp_path: Path, memory_plugin: dict[str, Any]) -> None:
    cfg = load_run_config(FAKE_RUN, {"trainer.logger": ["memory"], "trainer.experiment_name": "mine"})
    outcome = execute(cfg, tmp_path / "r", plots=False)
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert memory_plugin["run"].name == "mine" and memory_plugin["run"].total_steps == 3
    assert memory_plugin["rows"] == expected(records)
    assert memory_plugin["summary"]["end_to_end_s"] == outcome.report.end_to_end_s


def test_a_failing_tracker_is_stopped_and_named_once_and_the_run_goes_on(
    tmp_path: Path, memory_plugin: dict[str, Any]
) -> None:
    memory_plugin["fail"] = True
    problems: list[str] = []
    cfg = load_run_config(FAKE_RUN, {"trainer.logger": ["memory"]})
    outcome = execute(cfg, tmp_path / "r", plots=False, on_tracking_problem=problems.append)
    assert len(outcome.report.cycles) == 3
    assert len(problems) == 1 and "'memory' failed" in problems[0] and "disk full" in problems[0]


def test_two_plugins_offering_one_name_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Again(MemoryPlugin):
        pass

    def manager() -> Any:
        pm = get_plugin_manager(load_plugins=False)
        register_plugin(pm, MemoryPlugin(), name="one")
        register_plugin(pm, Again(), name="two")
        return pm

    monkeypatch.setattr(tracking, "_plugin_manager", manager)
    with pytest.raises(Exception, match="'memory' is offered by plugins 'one' and 'two'"):
        resolve_backends(["memory"])


def test_tracker_set_closes_what_it_opened_when_one_fails_to_open(tmp_path: Path) -> None:
    closed: list[str] = []

    class Opens(TrackingBackend):
        name = "opens"

        def open(self, run: TrackedRun) -> Tracker:
            class T(Tracker):
                def log(self, metrics: Mapping[str, float], step: int) -> None: ...

                def finish(self, summary: Mapping[str, float]) -> None:
                    closed.append("opens")

            return T()

    class Breaks(TrackingBackend):
        name = "breaks"

        def open(self, run: TrackedRun) -> Tracker:
            raise OSError("no route")

    with pytest.raises(Exception, match="'breaks' could not start run 'x': OSError: no route"):
        TrackerSet([Opens(), Breaks()], TrackedRun("x", "p", tmp_path))
    assert closed == ["opens"]
