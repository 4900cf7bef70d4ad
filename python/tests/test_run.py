"""fedfuse.run: the same federation as `fedfuse run`, from Python; stopped and resumed."""

import json
import os
import signal
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

import fedfuse

from conftest import ROOT

QUICKSTART = ROOT / "examples" / "quickstart.toml"
# Five rounds of the quickstart: a second or so.
SETS = ["rounds=5"]


def cli_run(fedfuse_bin, out, *extra):
    done = subprocess.run(
        [str(fedfuse_bin), "run", str(QUICKSTART), "--out", str(out), "--quiet",
         *[a for s in SETS for a in ("--set", s)], *extra],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((out / "results.json").read_text()), load_file(str(out / "model.safetensors"))


def without_times(rounds):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rounds]


def test_run_equals_the_cli_run(tmp_path, fedfuse_bin):
    want, want_model = cli_run(fedfuse_bin, tmp_path / "cli")
    seen = []
    result = fedfuse.run(QUICKSTART, overrides=SETS, out=tmp_path / "py",
                         progress=lambda kind, a, b, *line: seen.append((kind, a)))
    assert result.final["global_accuracy"] == want["final"]["global_accuracy"]
    assert without_times(result.rounds) == without_times(want["rounds"])
    assert result.config == want["config"]
    assert sorted(result.model) == sorted(want_model)
    for name, value in want_model.items():
        assert result.model[name].dtype == value.dtype, name
        assert np.array_equal(result.model[name], value), name
    # The folder is the CLI's, file for file.
    assert sorted(p.name for p in (tmp_path / "py").iterdir()) == sorted(
        p.name for p in (tmp_path / "cli").iterdir())
    assert load_file(str(tmp_path / "py" / "model.safetensors")).keys() == want_model.keys()
    # Progress: the run's summary line, the start, each round's clients and end, in order.
    assert seen[0][0] == "note"
    assert [e for e in seen if e[0] != "note"][0] == ("start", 5)
    assert [a for kind, a in seen if kind == "end"] == [1, 2, 3, 4, 5]
    assert sum(kind == "client" for kind, _ in seen) == 5 * 10

    # Without a folder nothing is written and the results are the same.
    bare = fedfuse.run(QUICKSTART, overrides=SETS, progress=False)
    assert bare.out is None
    assert bare.final["global_accuracy"] == want["final"]["global_accuracy"]
    for name, value in want_model.items():
        assert np.array_equal(bare.model[name], value), name


def test_rounds_become_a_data_frame():
    pd = pytest.importorskip("pandas")
    result = fedfuse.run(QUICKSTART, overrides=SETS + ["method.name=fedsparse"], progress=False)
    frame = result.rounds.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.index) == [1, 2, 3, 4, 5]
    assert list(frame["global_accuracy"]) == [r["global_accuracy"] for r in result.rounds]
    # The method's own figures are columns of their names, as in metrics.csv.
    method_keys = set(result.rounds[-1]["method"])
    assert method_keys and method_keys <= set(frame.columns)
    assert (frame["rejected"] == 0).all()


def test_ctrl_c_stops_after_the_round_and_resume_finishes_the_run(tmp_path, fedfuse_bin):
    want, want_model = cli_run(fedfuse_bin, tmp_path / "cli")
    out = tmp_path / "py"

    def interrupt(kind, a, b, *line):
        # Ctrl-C during round 2: the run ends that round, writes its checkpoint, stops.
        if kind == "round" and a == 2:
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler: Flower code run in-process by earlier tests of the session
    # may leave its graceful-exit handler (or SIG_IGN) installed, under which Ctrl-C raises
    # nothing for fedfuse to see.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            fedfuse.run(QUICKSTART, overrides=SETS, out=out, progress=interrupt)
    finally:
        signal.signal(signal.SIGINT, previous)
    checkpoint = tmp_path / "py.checkpoint"
    assert checkpoint.exists()
    assert not out.exists()
    rounds = []
    result = fedfuse.run(QUICKSTART, overrides=SETS, out=out, resume=True,
                         progress=lambda kind, a, b, *line: rounds.append(a) if kind == "end" else None)
    assert rounds == [3, 4, 5]
    assert without_times(result.rounds) == without_times(want["rounds"])
    for name, value in want_model.items():
        assert np.array_equal(result.model[name], value), name
    assert not checkpoint.exists()


def test_errors_name_the_setting():
    with pytest.raises(fedfuse.FedfuseError, match="rounds"):
        fedfuse.run(QUICKSTART, overrides=["rounds=0"], progress=False)
    with pytest.raises(fedfuse.FedfuseError, match="out"):
        fedfuse.run(QUICKSTART, resume=True, progress=False)
    with pytest.raises(fedfuse.FedfuseError, match="nothing.toml"):
        fedfuse.run(ROOT / "nothing.toml", progress=False)


def test_the_default_progress_shows_each_round(capfd):
    fedfuse.run(QUICKSTART, overrides=["rounds=2"])
    err = capfd.readouterr().err
    # tqdm's bar when tqdm is installed, else a line per round.
    assert "round 2" in err or "2/2" in err, err


def test_evaluate_scores_a_saved_model_as_the_run_did(tmp_path, fedfuse_bin):
    want, model = cli_run(fedfuse_bin, tmp_path / "cli")
    # The file's names in the file's (sorted) order: matched by name.
    got = fedfuse.evaluate(model, QUICKSTART, overrides=SETS)
    assert got["accuracy"] == want["final"]["global_accuracy"]
    assert got["loss"] == pytest.approx(want["final"]["global_loss"], rel=1e-12)
    assert got["split"] == "test" and got["samples"] > 0
    # A state_dict in its own order scores the same.
    reordered = dict(reversed(list(model.items())))
    assert fedfuse.evaluate(reordered, QUICKSTART, overrides=SETS)["accuracy"] == got["accuracy"]
    # The validation split is another set.
    val = fedfuse.evaluate(model, QUICKSTART, overrides=SETS + ["dataset.validation_fraction=0.2"],
                           split="validation")
    assert val["split"] == "validation" and 0 < val["samples"] != got["samples"]
    # A model of another shape is refused, naming the tensor.
    wrong = dict(model)
    wrong["layers.0.weight"] = np.zeros((3, 3), dtype=np.float32)
    with pytest.raises(fedfuse.FedfuseError, match="layers.0.weight"):
        fedfuse.evaluate(wrong, QUICKSTART, overrides=SETS)


COMPARE = """title = "py"
seeds = [1, 2]
[base]
rounds = 2
clients = 4
[base.dataset]
name = "digits"
[base.model]
kind = "mlp"
hidden = [16]
[[arms]]
label = "FedAvg"
method = { name = "fedavg" }
[[arms]]
label = "FedProx, 0.01"
method = { name = "fedprox", mu = 0.01 }
"""


def test_compare_equals_the_cli_comparison(tmp_path, fedfuse_bin):
    cfg = tmp_path / "compare.toml"
    cfg.write_text(COMPARE)
    done = subprocess.run([str(fedfuse_bin), "compare", str(cfg), "--out", str(tmp_path / "cli")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    got = fedfuse.compare(cfg, tmp_path / "py", progress=False)
    assert (tmp_path / "py" / "results.csv").read_text() == (tmp_path / "cli" / "results.csv").read_text()
    assert len(got.results) == 2 * 2 * 2
    assert [r["arm"] for r in got.summary] == ["FedAvg", "FedProx, 0.01"]
    assert got.summary[0]["seeds"] == 2
    frame = got.results.to_pandas()
    assert set(frame["arm"]) == {"FedAvg", "FedProx, 0.01"}
    # --seeds
    one = fedfuse.compare(cfg, tmp_path / "one", seeds=[7], progress=False)
    assert {r["seed"] for r in one.results} == {7}


def test_sweep_equals_the_cli_sweep(tmp_path, fedfuse_bin):
    smoke = ROOT / "experiments" / "digits-smoke.toml"
    done = subprocess.run([str(fedfuse_bin), "sweep", str(smoke), "--out", str(tmp_path / "cli"),
                           "--seeds", "0"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    got = fedfuse.sweep(smoke, tmp_path / "py", seeds=[0], progress=False)
    want = fedfuse.runs._read_csv(tmp_path / "cli" / "results.csv")
    # Every figure but the wall time.
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in got.results] == [
        {k: v for k, v in r.items() if k != "seconds"} for r in want]
    assert len(got.results) > 5 and got.summary


def test_evaluate_takes_a_model_section_and_a_dataset(tmp_path, fedfuse_bin):
    want, model = cli_run(fedfuse_bin, tmp_path / "cli")
    got = fedfuse.evaluate(model, {"kind": "mlp", "hidden": [64]}, dataset="digits")
    # The quickstart's test set is the dataset's: the same score as the run's config gives.
    assert got["accuracy"] == want["final"]["global_accuracy"]
    with pytest.raises(ValueError, match="dataset="):
        fedfuse.evaluate(model, {"kind": "mlp", "hidden": [64]})
