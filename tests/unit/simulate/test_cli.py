"""``weightstream simulate`` through the real command (typer's CliRunner): the table, --json, the
cluster sources, and bad input refused with exit 2 and a message naming the option."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.simulate_cases import SMALL_GPT2
from weightstream.cli import app
from weightstream.simulate.cluster import cerebras_like

runner = CliRunner()


@pytest.fixture
def params(tmp_path: Path) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(SMALL_GPT2))
    return path


def test_table_with_the_default_preset(params: Path) -> None:
    r = runner.invoke(app, ["simulate", str(params), "--num_csx", "1,4,16"])
    assert r.exit_code == 0, r.output
    assert "cluster cerebras-like" in r.output and "8 samples per worker" in r.output
    header = next(line for line in r.output.splitlines() if line.startswith("┃"))
    assert [h.strip() for h in header.strip("┃").split("┃")] == [
        *("N", "batch/worker", "depth", "step s", "tokens/s", "efficiency", "limit"),
        *("compute", "broadcast", "reduce", "cores", "update", "barrier"),
    ]
    rows = [line for line in r.output.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["1", "4", "16"]
    assert "scaling" in r.output and "assumed: a CS-2 worker sustains 1 PFLOP/s" in r.output


def test_json_output(params: Path) -> None:
    r = runner.invoke(app, ["simulate", str(params), "--num_csx", "1,2,192", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [p["n"] for p in doc["predictions"]] == [1, 2, 192]
    first = doc["predictions"][0]
    assert first["efficiency"] == pytest.approx(1.0)
    assert sum(first["terms"].values()) == pytest.approx(first["step_s"])
    assert doc["predictions"][2]["tree_depth"] == 4
    assert doc["cluster"]["name"] == "cerebras-like"


def test_figures_on_the_command_line_and_a_cluster_file(params: Path, tmp_path: Path) -> None:
    args = ["simulate", str(params), "--num_csx", "16", "--json"]
    slow = runner.invoke(app, [*args, "--link-bandwidth", "1e6"])
    fast = runner.invoke(app, args)
    assert slow.exit_code == 0 and fast.exit_code == 0, slow.output + fast.output
    step = [json.loads(r.output)["predictions"][0]["step_s"] for r in (slow, fast)]
    assert step[0] > 10 * step[1]  # 1 MB/s links: the broadcast dominates
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({**cerebras_like().to_dict(), "name": "mine", "notes": []}))
    r = runner.invoke(app, ["simulate", str(params), "--num_csx", "1", "--cluster", str(path)])
    assert r.exit_code == 0, r.output
    assert "cluster mine" in r.output


def test_held_global_batch_marks_what_does_not_split(params: Path) -> None:
    r = runner.invoke(app, ["simulate", str(params), "--num_csx", "1,3,8", "--global-batch"])
    assert r.exit_code == 0, r.output
    assert "global batch 8" in r.output and "does not split in 3" in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num_csx", "1,x"], "--num_csx: 'x' is not a worker count"),
        (["--num_csx", "0"], "--num_csx: '0' is not a worker count"),
        (["--cluster", "nosuch"], "--cluster: 'nosuch' is neither a preset (cerebras-like) nor a file"),
        (["--link-bandwidth", "-5"], "--link-bandwidth link_bandwidth: -5.0, expected a number > 0"),
        (["--fanout", "1"], "--fanout swarmx_fanout: 1, expected an integer >= 2"),
        (["--relay", "teleport"], "--relay relay: 'teleport', expected store_and_forward or cut_through"),
        (["--per-worker-batch", "2", "--global-batch"], "--per-worker-batch and --global-batch"),
    ],
)
def test_bad_input_names_the_option(params: Path, args: list[str], message: str) -> None:
    r = runner.invoke(app, ["simulate", str(params), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


def test_bad_cluster_and_calibration_files_are_named(params: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "worker_flops": 1e12, "link_bandwidth": 0}))
    r = runner.invoke(app, ["simulate", str(params), "--cluster", str(bad)])
    assert r.exit_code == 2 and "--cluster" in r.output and "link_bandwidth: 0" in r.output, r.output
    r = runner.invoke(app, ["simulate", str(params), "--calibration", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "--calibration" in r.output and "cannot be read" in r.output, r.output
    r = runner.invoke(app, ["simulate", str(params), "--cluster", "cerebras-like", "--calibration", str(bad)])
    assert r.exit_code == 2 and "use one" in r.output, r.output


def test_bad_params_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({**SMALL_GPT2, "model": {**SMALL_GPT2["model"], "hidden_size": -1}}))
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 2 and "model.hidden_size" in r.output, r.output


def test_plot_without_matplotlib_names_the_extra(params: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    r = runner.invoke(app, ["simulate", str(params), "--num_csx", "1", "--plot", "out.png"])
    assert r.exit_code == 2, r.output
    assert 'pip install "weightstream[plot]"' in " ".join(r.output.split())


def test_plot_with_matplotlib(params: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra weightstream[plot]")
    out = tmp_path / "scaling.png"
    r = runner.invoke(app, ["simulate", str(params), "--num_csx", "1,2,4", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_left_out_hdf5_sequence_length_is_read_from_the_files(tmp_path: Path) -> None:
    """As `run` does: the workload's tokens per sample come from the files, not from a default of 1."""
    import copy

    import h5py
    import numpy as np

    (tmp_path / "h5").mkdir()
    with h5py.File(tmp_path / "h5" / "a.h5", "w") as f:
        f.create_dataset("data", data=np.ones((4, 3, 16), np.int32))
    docs = []
    for given in (16, None):
        raw = copy.deepcopy(SMALL_GPT2)
        raw["train_input"] = {"data_processor": "GptHDF5MapDataProcessor", "data_dir": str(tmp_path / "h5")}
        raw["train_input"] |= {"batch_size": 8, **({"max_sequence_length": given} if given else {})}
        path = tmp_path / f"p{given}.yaml"
        path.write_text(yaml.safe_dump(raw))
        r = runner.invoke(app, ["simulate", str(path), "--num_csx", "1,4", "--json"])
        assert r.exit_code == 0, r.output
        docs.append(json.loads(r.output)["predictions"])
    assert docs[0] == docs[1]


def calibration_file(path: Path, network: bool) -> Path:
    """A calibration of a 2-core host, as bench/scaling.py writes it: with the network plane's figures
    (its null run over gRPC), or without them (a file written before that run existed)."""
    cluster = {
        "name": "this machine",
        "worker_flops": 1e9,
        "link_bandwidth": 5e9,
        "memoryx_bandwidth": 5e9,
        "swarmx_bandwidth": 1e10,
        "host_cores": 2,
        "workers_per_host": 0,
        "stream_cpu_s_per_byte": 3e-10,
        "notes": ["measured (N=1, no compute, shared memory): transport 0.30 CPU-ns per byte and link"],
    }
    if network:
        cluster |= {"network_stream_cpu_s_per_byte": 2e-9, "network_link_bandwidth": 5e8}
    path.write_text(json.dumps({"cluster": cluster, "measured": {"step_s_n1": 1.0}, "model": "gpt2"}))
    return path


def test_data_plane_network_prices_roles_on_separate_hosts(params: Path, tmp_path: Path) -> None:
    calibration = calibration_file(tmp_path / "calibration.json", network=True)
    args = ["simulate", str(params), "--num_csx", "1,2,4", "--calibration", str(calibration), "--json"]
    docs = {}
    for plane in ("default", "shared_memory", "network"):
        r = runner.invoke(app, args + ([] if plane == "default" else ["--data-plane", plane]))
        assert r.exit_code == 0, r.output
        docs[plane] = json.loads(r.output)
    assert docs["default"] == docs["shared_memory"]  # what simulate priced before the option existed
    shm, net = docs["shared_memory"], docs["network"]
    assert shm["cluster"]["link_bandwidth"] == 5e9 and shm["cluster"]["stream_cpu_s_per_byte"] == 3e-10
    assert net["cluster"]["link_bandwidth"] == 5e8 and net["cluster"]["stream_cpu_s_per_byte"] == 2e-9
    assert net["cluster"]["swarmx_bandwidth"] == 1e9  # two links' worth, as in the calibration
    for a, b in zip(shm["predictions"], net["predictions"], strict=True):
        assert b["step_s"] > a["step_s"], (a, b)
    assert "network data plane" in net["cluster"]["notes"][-1]
    # the figures on the command line still apply, on top of the network plane's
    r = runner.invoke(app, [*args, "--data-plane", "network", "--link-bandwidth", "1.25e8"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["cluster"]["link_bandwidth"] == 1.25e8
    # the table's notes say which plane the figures are for
    r = runner.invoke(
        app, ["simulate", str(params), "--calibration", str(calibration), "--data-plane", "network"]
    )
    assert r.exit_code == 0, r.output
    assert "predicted over the network data plane" in " ".join(r.output.split()), r.output


def test_data_plane_network_without_network_figures_says_how_to_get_them(
    params: Path, tmp_path: Path
) -> None:
    old = calibration_file(tmp_path / "old.json", network=False)
    r = runner.invoke(app, ["simulate", str(params), "--calibration", str(old), "--num_csx", "1,2"])
    assert r.exit_code == 0, r.output  # an old calibration still prices shared memory as before
    r = runner.invoke(app, ["simulate", str(params), "--calibration", str(old), "--data-plane", "network"])
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())
    assert f"--data-plane network: --calibration {old} has no network-plane figures" in said, said
    assert "recalibrate with `python bench/scaling.py --calibration-out FILE`" in said
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["simulate", str(params), "--data-plane", "network"])  # the preset has none either
    assert r.exit_code == 2 and "--cluster cerebras-like has no network-plane figures" in " ".join(
        r.output.split()
    )
