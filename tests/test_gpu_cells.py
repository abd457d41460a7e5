"""scripts/experiments/gpu_cells.py: time-limited cells compared at equal rounds, never at their own last round."""
import json

from scripts.experiments import gpu_cells
from test_table import write_run


def test_cells_read_at_the_listed_rounds(tmp_path, capsys):
    # A slow cell stopped after round 2 and a fast one after round 4 (interrupted: -gr was larger)
    write_run(tmp_path, "FedCP", 0, [0.1, 0.5, 0.8], round_time=(30.0, 40.0), goal="gpu-cell", status="interrupted",
              global_rounds=2000, dataset="D")
    write_run(tmp_path, "Local", 0, [0.1, 0.6, 0.7, 0.9, 0.95], round_time=(10.0, 10.0, 10.0, 14.0), goal="gpu-cell",
              status="interrupted", global_rounds=2000, dataset="D")
    write_run(tmp_path, "FedAvg", 0, [0.1, 0.2], goal="other", dataset="D")  # another goal: not a cell
    out = tmp_path / "cells.json"
    assert gpu_cells.main([str(tmp_path), "--rounds", "2,4", "--json", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert lines[2:] == ["| FedCP | 80.00 | - | 2 | 80.00 | 35.00 |",     # round 4 not reached: "-"
                         "| Local | 70.00 | 95.00 | 4 | 95.00 | 11.00 |"]  # mean of 10, 10, 10, 14
    cells = json.loads(out.read_text())["cells"]
    assert [c["algorithm"] for c in cells] == ["FedCP", "Local"]
    assert cells[1]["rounds"] == [0, 1, 2, 3, 4] and cells[1]["acc"][3] == 90.0


def test_bad_rounds_and_no_cells_exit_2(tmp_path, capsys):
    write_run(tmp_path, "FedAvg", 0, [0.1, 0.2], goal="other")
    assert gpu_cells.main([str(tmp_path), "--rounds", "a,b"]) == 2
    assert gpu_cells.main([str(tmp_path)]) == 2
    assert "no gpu-cell runs" in capsys.readouterr().err


def test_a_malformed_result_file_is_one_warning_line_and_the_cells_still_print(tmp_path, capsys):
    write_run(tmp_path, "Local", 0, [0.1, 0.6, 0.7], goal="gpu-cell", status="interrupted", global_rounds=2000,
              dataset="D")
    (tmp_path / "D_FedAvg_test_0.h5").write_bytes(b"not HDF5")
    (tmp_path / "D_FedAvg_test_0.json").write_text("{}")
    assert gpu_cells.main([str(tmp_path), "--rounds", "2"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: D_FedAvg_test_0.h5 left out"), err
