"""The cases an earlier adversarial pass found open after docs/security.md's first table (each broke then):
writes outside the run's folder from a crafted checkpoint, generators and -sfn / --tensorboard following
planted symlinks, silent corruption on resume, reports, resources and tracebacks. Each now holds by the
mechanism docs/security.md names for its class."""
from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import pytest
import torch

import main
from conftest import cli
from test_hostile import SEQ, STEM, World, craft, generate, pristine, result, safe, table_text  # noqa: F401


@pytest.fixture
def world(tmp_path, pristine):  # noqa: F811
    return World(tmp_path, pristine)


def resume(w, *flags, gr="3"):
    return w.call(main.main, cli(w.root, w.out, "-gr", gr, "--checkpoint_every", "1", "--resume", *SEQ, *flags))


def test_a_recorder_stem_in_a_checkpoint_cannot_move_the_results(world):
    craft(world, lambda c: c["server"].__setitem__("recorder", {
        "__state__": "object", "type": "utils.results.RunRecorder", "attrs": {"stem": "../outside/pwned"}}))
    world.seal()
    safe(*resume(world), refused=True, says="recorder")
    world.intact()


@pytest.mark.parametrize("edit,says", [
    (lambda c: c.__setitem__("round", -7), "round -7"),
    (lambda c: c["clients"][0].__setitem__("y_test", torch.zeros(5, dtype=torch.long)), "x_train"),
    (lambda c: c["identity"].__setitem__("run", 1), "holds another run"),
])
def test_a_checkpoint_of_another_run_or_with_other_values_is_refused(world, edit, says):
    craft(world, edit)
    world.seal()
    code, err = resume(world)
    safe(code, err, refused=True)
    assert says in err[0] or "comes from the flags and the split" in err[0], err
    world.intact()


def test_resume_with_fewer_rounds_than_the_checkpoint_is_refused(world):
    world.seal()
    code, err = resume(world, gr="1")
    safe(code, err, refused=True, says="more than -gr 1")
    assert json.loads((world.out / f"{STEM}.json").read_text())["config"]["global_rounds"] == 2  # not rewritten


def test_generators_do_not_follow_a_train_link_or_a_planted_temporary_config(world):
    (world.gen / "G").mkdir()
    (world.gen / "G" / "train").symlink_to(world.outside)
    world.seal()
    safe(*generate(world), refused=True, says="symlink")
    world.intact()
    shutil.rmtree(world.gen / "G")
    (world.gen / "G").mkdir()
    (world.gen / "G" / ".config.json.tmp").symlink_to(world.outside / "victim.txt")
    safe(*generate(world))
    world.intact()
    assert (world.gen / "G" / "config.json").is_file() and not (world.gen / "G" / "config.json").is_symlink()


@pytest.mark.parametrize("flag", ["-sfn", pytest.param("--tensorboard", marks=pytest.mark.optional_deps("tensorboard"))])
def test_sfn_and_tensorboard_do_not_follow_a_planted_folder_link(world, flag):
    (world.out / "m").symlink_to(world.outside)
    world.seal()
    safe(*world.run(flag, "m"), refused=True, says="symlink")
    world.intact()


@pytest.mark.parametrize("flags,says", [
    (("--attack", "signflip", "--attack_frac", "0.99"), "leaves at least one benign client"),
    (("-fd", "0"), "-fd 0 is out of range"), (("-lr", "1e308"), "-lr 1e+308 is out of range"),
    (("-ld", "-ldg", "1e300"), "-ldg 1e+300 is out of range"), (("-go", "g" * 230), "-go is part"),
])
def test_numbers_and_names_no_run_can_take_are_refused_up_front(world, flags, says):
    world.seal()
    safe(*world.run(*flags), refused=True, says=says)
    assert not (world.out / "Digits_FedAvg_test_0.lock").exists()
    world.intact()


def test_dp_sigma_below_its_range_is_one_line(world):
    pytest.importorskip("opacus")
    safe(*world.run("-dp", "-dps", "1e-300"), refused=True, says="-dps 1e-300 is out of range")


def test_a_figure_over_no_client_is_nan():
    from utils.metrics import summarize

    empty = np.zeros(0)
    assert np.isnan(summarize(empty, empty, empty, empty, empty)["test_acc"])


def test_latex_comment_lines_and_csv_formulas_are_escaped(world):
    result(world.out / "r", "Digits_X_t_0", label="FedAvg\n\\input{/etc/hostname}\n%")
    result(world.out / "r", "Digits_Y_t_0", label="=HYPERLINK(1)")
    code, err, latex = table_text(world, "--format", "latex", "--commands")
    safe(code, err)
    assert not [line for line in latex.splitlines() if "\\input" in line and not line.startswith("%")], latex
    code, err, text = table_text(world, "--format", "csv")
    assert "\n=HYPERLINK" not in text and "'=HYPERLINK" in text, text


def not_hdf5(p):
    p.write_bytes(b"not hdf5")


def no_acc(p):
    with h5py.File(p, "a") as f:
        del f["rs_test_acc"]


def series(data):
    def damage(p):
        with h5py.File(p, "a") as f:
            del f["rs_test_acc"]
            f.create_dataset("rs_test_acc", data=data)
    return damage


def sidecar(text):
    return lambda p: p.with_suffix(".json").write_text(text)


@pytest.mark.parametrize("damage", [not_hdf5, no_acc, series(np.zeros(0)), series(np.zeros((2, 2))),
                                    series(np.array([b"a", b"b"])), sidecar("{"), sidecar("[1]"),
                                    sidecar(json.dumps({"config": {"dataset": ["a"], "algorithm": "A"}}))])
@pytest.mark.parametrize("script", ["table", "get_mean_std", "plot"])
def test_one_malformed_result_never_aborts_a_report(world, damage, script):
    import contextlib

    import get_mean_std
    from scripts.run import plot
    from scripts.run import table

    good = result(world.out / "r", "Digits_FedAvg_t_0")
    damage(result(world.out / "r", "Digits_FedAvg_t_1"))
    entry = {"table": lambda: table.main([str(good.parent)]), "get_mean_std": lambda: get_mean_std.main([str(good.parent)]),
             "plot": lambda: plot.main(["curves", str(good.parent), "--out", str(world.out / "fig")])}[script]
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        code, err = world.call(entry)
    assert code == 0 and not [e for e in err if "Traceback" in e], err


@pytest.mark.parametrize("where", ["client file", "config.json", "--config"])
def test_a_fifo_where_a_file_is_read_is_one_line(world, where):
    path = {"client file": world.root / "Digits" / "train" / "0.npz", "config.json": world.root / "Digits" / "config.json",
            "--config": world.tmp / "c.json"}[where]
    world.fifo(path)
    flags = ("--config", str(path)) if where == "--config" else ()
    safe(*world.run(*flags, seconds=15), refused=True, says="FIFO")


def test_an_npz_that_unpacks_far_beyond_its_size_is_refused_before_it_is_read(world):
    import zipfile

    path = world.root / "Digits" / "train" / "0.npz"
    with np.load(path) as f:
        y = f["y"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as m:
            np.lib.format.write_array(m, np.zeros((400_000, 1, 8, 8), np.uint8))
        with z.open("y.npy", "w") as m:
            np.lib.format.write_array(m, y)
    safe(*world.run(), refused=True, says="unpacks to")


@pytest.mark.parametrize("kind", ["json", pytest.param("yaml", marks=pytest.mark.optional_deps("yaml"))])
def test_deep_nesting_is_one_line_in_config_files(world, kind):
    from flcore.trainmodel.assign import read_client_models
    from utils.errors import FLError

    text = '{"a": ' * 3000 + "1" + "}" * 3000 if kind == "json" else "a: " + "[" * 3000 + "]" * 3000
    (world.tmp / f"c.{kind}").write_text(text)
    safe(*world.run("--config", str(world.tmp / f"c.{kind}")), refused=True, says="nested more than 64")
    (world.tmp / "m.json").write_text('{"0": ' * 3000 + '"CNN"' + "}" * 3000)
    with pytest.raises(FLError, match="nested more than 64"):
        read_client_models(str(world.tmp / "m.json"))


@pytest.mark.parametrize("key,value", [("default_model", ["CNN"]), ("vocab_size", "abc"), ("vocab_size", [80]),
                                       ("num_classes", 10 ** 7)])
def test_split_config_values_of_the_wrong_type_are_one_line(world, key, value):
    path = world.root / "Digits" / "config.json"
    config = json.loads(path.read_text())
    config[key] = value
    path.write_text(json.dumps(config))
    safe(*world.run(), refused=True, says=key)


def test_a_split_config_number_beyond_float_is_one_line(world):
    path = world.root / "Digits" / "config.json"
    path.write_text(path.read_text().replace('"num_classes": 10', '"num_classes": 1e999'))
    safe(*world.run(), refused=True, says="num_classes")


def test_nul_in_a_path_of_a_config_file_is_one_line(world):
    (world.tmp / "c.json").write_text(json.dumps({"client_state_dir": "a\u0000b"}))
    safe(*world.run("--config", str(world.tmp / "c.json")), refused=True, says="control character")


def test_client_state_dir_naming_a_file_is_one_line(world):
    (world.tmp / "f").write_text("")
    safe(*world.run("--client_state", "disk", "-jr", "0.4", "--client_state_dir", str(world.tmp / "f")), refused=True,
         says="--client_state_dir")


def test_a_generator_out_of_300_characters_is_one_line(world):
    safe(*generate(world, out="o" * 300), refused=True)
    assert list(world.gen.iterdir()) == []


def test_a_fifo_source_is_named_as_a_fifo(world):
    from dataset.utils.dataset_utils import DatasetError, load_source_npz

    world.fifo(world.tmp / "s.npz")
    with pytest.raises(DatasetError, match="FIFO"):
        load_source_npz(world.tmp / "s.npz")
