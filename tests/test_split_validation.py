"""A split is validated when it is loaded: every bad config or client file ends the run before training with
exit code 2 and one line naming the file (or key) and what differs; nothing else is printed to stderr."""
import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import main
from conftest import cli
from utils.data_utils import generator_command
from utils.errors import FLError


@pytest.fixture
def split(digits_tiny_root, tmp_path):
    """A private copy of the tiny Digits split to damage."""
    root = tmp_path / "data"
    shutil.copytree(digits_tiny_root / "Digits", root / "Digits")
    return root


def config_of(root):
    return json.loads((root / "Digits" / "config.json").read_text())


def write_config(root, cfg):
    (root / "Digits" / "config.json").write_text(json.dumps(cfg))


def rewrite(root, part, i, **arrays):
    path = root / "Digits" / part / f"{i}.npz"
    with np.load(path) as f:
        data = {"x": f["x"], "y": f["y"]}
    data.update(arrays)
    np.savez(path, **data)


def refused(root, tmp_path, capsys, *flags):
    code = main.main(cli(root, tmp_path / "out", "-gr", "1", "--executor", "sequential", *flags))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not list((tmp_path / "out").glob("*.h5")) if (tmp_path / "out").exists() else True
    return err[0]


def test_valid_split_loads(split, tmp_path, capsys):
    assert main.main(cli(split, tmp_path / "out", "-gr", "1", "--executor", "sequential")) == 0


def test_config_not_json(split, tmp_path, capsys):
    (split / "Digits" / "config.json").write_text('{"num_clients": 5,')
    assert "config.json is not valid JSON" in refused(split, tmp_path, capsys)


@pytest.mark.parametrize("key", ["num_clients", "num_classes", "input_shape"])
def test_config_lacks_a_key(split, tmp_path, capsys, key):
    cfg = config_of(split)
    del cfg[key]
    write_config(split, cfg)
    assert f"lacks the key '{key}'" in refused(split, tmp_path, capsys)


@pytest.mark.parametrize("key,value", [("num_clients", "5"), ("num_classes", 0), ("input_shape", [1, 8, -8]),
                                       ("train_samples", [1, 2]), ("format_version", 99),
                                       ("normalize", {"mean": [0.5], "std": [0.0]})])
def test_config_key_of_the_wrong_type(split, tmp_path, capsys, key, value):
    cfg = config_of(split)
    cfg[key] = value
    write_config(split, cfg)
    assert f"key '{key}' must be" in refused(split, tmp_path, capsys)


@pytest.mark.parametrize("version", [0, 2, 1.0])
def test_a_split_format_this_library_does_not_read_is_refused(split, tmp_path, capsys, version):
    cfg = config_of(split)
    cfg["format_version"] = version  # 1 is the newest this library reads; a newer one is a newer library's
    write_config(split, cfg)
    assert "key 'format_version' must be a format this library reads (1..1)" in refused(split, tmp_path, capsys)


@pytest.mark.parametrize("name, script", [("Digits", "generate_Digits.py"), ("MNIST", "generate_MNIST.py"),
                                          ("Cifar10", "generate_Cifar10.py"), ("Nope", "generate_<Name>.py")])
def test_the_generator_command_names_the_splits_own_script(name, script):
    assert generator_command(name) == f"python dataset/{script} --out {name} ..."


def test_config_with_fewer_classes_than_the_labels(split, tmp_path, capsys):
    cfg = config_of(split)
    cfg["num_classes"] = 5
    write_config(split, cfg)
    assert "'label_counts' must be 5 rows of 5 per-class counts" in refused(split, tmp_path, capsys)
    del cfg["label_counts"]  # without the counts, the labels themselves are checked
    write_config(split, cfg)
    line = refused(split, tmp_path, capsys)
    assert "0.npz holds labels in [" in line and "the config has 5 classes" in line


def test_config_with_a_wrong_input_shape(split, tmp_path, capsys):
    cfg = config_of(split)
    cfg["input_shape"] = [3, 8, 8]
    write_config(split, cfg)
    assert "the config's input_shape is [3, 8, 8]" in refused(split, tmp_path, capsys)


def test_sample_counts_must_match_the_config(split, tmp_path, capsys):
    cfg = config_of(split)
    cfg["test_samples"][2] += 1
    write_config(split, cfg)
    line = refused(split, tmp_path, capsys)
    assert "test/2.npz holds" in line and "test_samples says" in line


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_corrupt_client_file(split, tmp_path, capsys, damage):
    path = split / "Digits" / "train" / "3.npz"
    blob = path.read_bytes()
    path.write_bytes({"truncate": blob[: len(blob) // 2], "empty": b"", "garbage": b"\x00" * 100}[damage])
    line = refused(split, tmp_path, capsys)
    assert "corrupt client file" in line and "train/3.npz" in line


def test_missing_client_file(split, tmp_path, capsys):
    (split / "Digits" / "test" / "4.npz").unlink()
    assert "test/4.npz is missing" in refused(split, tmp_path, capsys)


def test_pickled_arrays_are_refused_not_unpickled(split, tmp_path, capsys):
    rewrite(split, "train", 0, y=np.array([object()] * 3, dtype=object))
    assert "corrupt client file" in refused(split, tmp_path, capsys)


@pytest.mark.parametrize("arrays,what", [
    ({"y": None}, "labels in"),  # filled below: a label beyond the classes
    ({"x": "float64-wrong-shape"}, "input_shape"),
    ({"x": "int32"}, "dtype int32"),
    ({"y": "float"}, "1-d integer array"),
    ({"y": "short"}, "inputs but"),
])
def test_client_arrays_checked(split, tmp_path, capsys, arrays, what):
    with np.load(split / "Digits" / "train" / "1.npz") as f:
        x, y = f["x"], f["y"]
    kind = next(iter(arrays.values()))
    new = {"x": x, "y": y}
    if kind is None:
        new["y"] = y.copy()
        new["y"][0] = 99
    elif kind == "float64-wrong-shape":
        new["x"] = np.zeros((len(y), 64), dtype=np.float64)
    elif kind == "int32":
        new["x"] = x.astype(np.int32)
    elif kind == "float":
        new["y"] = y.astype(np.float32)
    elif kind == "short":
        new["y"] = y[:-1]
    rewrite(split, "train", 1, **new)
    line = refused(split, tmp_path, capsys, "-ncl", "10") if kind is None else refused(split, tmp_path, capsys)
    assert what in line and "train/1.npz" in line


@pytest.mark.parametrize("nc", ["0", "-3"])
def test_non_positive_client_count(split, tmp_path, capsys, nc):
    assert f"-nc {nc} is out of range: it takes [1, 10^6]" in refused(split, tmp_path, capsys, "-nc", nc)


def _integer_slots(cfg: dict) -> list[tuple]:
    """Every place of a split's config.json that holds an integer: (container, key) pairs."""
    places = [(cfg, k) for k in ("num_clients", "num_classes", "format_version", "vocab_size") if k in cfg]
    places += [(cfg["input_shape"], i) for i in range(len(cfg["input_shape"]))]
    for key in ("train_samples", "test_samples"):
        places += [(cfg[key], i) for i in range(len(cfg.get(key, [])))]
    places += [(row, j) for row in cfg.get("label_counts", []) for j in range(len(row))]
    return places


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.floats(0, 1, exclude_max=True), flag=st.booleans(), vocab=st.booleans())
def test_true_or_false_in_any_integer_slot_of_a_config_is_refused(digits_tiny_root, tmp_path, pick, flag, vocab):
    """The class, not one case: a JSON bool is an int to Python, so every integer the config reader checks (a
    count, a shape, a version, a per-client or per-class count) refuses true and false, naming the key."""
    from utils.data_utils import read_config

    cfg = config_of(digits_tiny_root)
    cfg["format_version"] = 1
    if vocab:
        cfg["vocab_size"] = 64
    places = _integer_slots(cfg)
    assert len(places) > 20  # counts per client and per class are among them
    holder, key = places[int(pick * len(places))]
    holder[key] = flag
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # rewritten by each example
    with pytest.raises(FLError, match=r"^split 'Digits': config\.json key '\w+' must be "):
        read_config("Digits", tmp_path)


@pytest.mark.parametrize("mean, std, ok", [
    (1e6, 1e6, True), (-1e6, 1e-6, True),  # the bounds themselves: |mean| <= 1e6, 1e-6 <= std <= 1e6
    (1e6 + 0.5, 1.0, False), (-1e6 - 0.5, 1.0, False), (0.0, 1e6 + 0.5, False), (0.0, 0.99e-6, False),
])
def test_normalisation_constants_are_checked_at_their_bounds(digits_tiny_root, tmp_path, mean, std, ok):
    from utils.data_utils import read_config

    cfg = config_of(digits_tiny_root)
    cfg["normalize"] = {"mean": [mean], "std": [std]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if ok:
        assert read_config("Digits", tmp_path)[0]["normalize"] == {"mean": [mean], "std": [std]}
    else:
        with pytest.raises(FLError, match=r"key 'normalize' must be .* \(\|mean\| <= 1e\+06, 1e-06 <= std <= 1e\+06\)"):
            read_config("Digits", tmp_path)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.floats(0, 1, exclude_max=True), value=st.sampled_from([-1, -2, -10 ** 9]))
def test_a_negative_count_in_any_slot_of_a_config_is_refused(digits_tiny_root, tmp_path, pick, value):
    """Every integer of a split's config is a count or a size: none may be negative (0 is a count)."""
    from utils.data_utils import read_config

    cfg = config_of(digits_tiny_root)
    cfg["format_version"] = 1
    places = _integer_slots(cfg)
    holder, key = places[int(pick * len(places))]
    holder[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FLError, match=r"^split 'Digits': config\.json key '\w+' must be "):
        read_config("Digits", tmp_path)


REGENERATE = "; regenerate it: python dataset/generate_Digits.py --out Digits ..."


def config_refusal(folder, config) -> str:
    """The one line ``read_config`` refuses ``config`` (an object to write as JSON, or the file's text) with."""
    from utils.data_utils import read_config

    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(FLError) as e:
        read_config("Digits", folder)
    return str(e.value)


def config_accepted(folder, config: dict) -> dict:
    """The configuration ``read_config`` reads from ``config`` written as JSON in ``folder``."""
    from utils.data_utils import read_config

    (folder / "config.json").write_text(json.dumps(config))
    return read_config("Digits", folder)[0]


def test_each_config_refusal_is_one_exact_line_naming_the_split_and_its_generator(digits_tiny_root, tmp_path):
    cfg = config_of(digits_tiny_root)
    assert config_refusal(tmp_path, "[1]") == "split 'Digits': config.json does not hold a JSON object" + REGENERATE
    assert config_refusal(tmp_path, {k: v for k, v in cfg.items() if k != "num_classes"}) == (
        "split 'Digits': config.json lacks the key 'num_classes'" + REGENERATE)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").mkdir()  # the I/O layer's message, without the folder's path
    from utils.data_utils import read_config
    with pytest.raises(FLError) as e:
        read_config("Digits", tmp_path / "folder")
    assert str(e.value) == ("split 'Digits': config.json cannot be read: it is a folder, not a regular file"
                            + REGENERATE)


@pytest.mark.parametrize("width, shown", [(58, None), (59, "...")])
def test_a_refused_values_text_is_cut_at_60_characters(digits_tiny_root, tmp_path, width, shown):
    """The value is shown as its repr: whole up to 60 characters, its first 60 and '...' beyond."""
    cfg = config_of(digits_tiny_root)
    cfg["num_clients"] = "x" * width  # repr adds two quotes: 60 or 61 characters
    text = repr(cfg["num_clients"])
    got = text if len(text) <= 60 else text[:60] + "..."
    assert config_refusal(tmp_path, cfg) == (f"split 'Digits': config.json key 'num_clients' must be an integer >= 1 "
                                             f"(got {got})" + REGENERATE)
    assert got.endswith("...") == (shown == "...")


@pytest.mark.parametrize("key, at, past", [("num_classes", 10 ** 6, 10 ** 6 + 1), ("vocab_size", 10 ** 7, 10 ** 7 + 1),
                                           ("vocab_size", 2, 1), ("input_shape", 10 ** 5, 10 ** 5 + 1)])
def test_each_integer_bound_of_a_config_holds_at_the_bound_and_refuses_past_it(digits_tiny_root, tmp_path, key, at,
                                                                               past):
    from utils.data_utils import read_config

    def with_value(v):
        cfg = config_of(digits_tiny_root)
        if key == "input_shape":
            cfg["input_shape"] = [1, v, 8]
        else:
            cfg[key] = v
        cfg.pop("label_counts")  # its rows would have num_classes entries
        return cfg

    (tmp_path / "config.json").write_text(json.dumps(with_value(at)))
    read_config("Digits", tmp_path)
    assert f"key '{key}' must be " in config_refusal(tmp_path, with_value(past))


BASE = {"num_clients": 1, "num_classes": 3, "input_shape": [2], "train_samples": [2]}
U8 = np.zeros((2, 2), np.uint8)


@pytest.mark.parametrize("config, x, y, part, says", [
    ({}, np.zeros((2, 2), np.int16), [0, 2], "train", "holds x of dtype int16; expected uint8 pixels or float vectors"),
    ({}, np.zeros((2, 3), np.uint8), [0, 2], "train", "holds x of shape (2, 3); the config's input_shape is [2]"),
    ({"x_dtype": "float32"}, U8, [0, 2], "train", "holds x of dtype uint8; the config's x_dtype is float32"),
    ({}, np.array([[0.0, np.inf], [0.0, 0.0]]), [0, 2], "train", "holds NaN or infinite values in x"),
    ({}, U8, [[0], [2]], "train", "holds y of shape (2, 1) and dtype int64; expected a 1-d integer array"),
    ({}, U8, [0, 1, 2], "train", "holds 2 inputs but 3 labels"),
    ({}, U8, [0, 3], "train", "holds labels in [0, 3]; the config has 3 classes"),
    ({}, U8, [-1, 2], "train", "holds labels in [-1, 2]; the config has 3 classes"),
    ({"train_samples": [3]}, U8, [0, 2], "train", "holds 2 samples; the config's train_samples says 3"),
    ({"train_samples": [0]}, U8[:0], np.zeros(0, np.int64), "train", "holds no training samples"),
    ({"modality": "text", "vocab_size": 5}, np.zeros((2, 2), np.float32), [0, 2], "train",
     "holds x of dtype float32; a text split holds integer token ids"),
    ({"modality": "text", "vocab_size": 5}, np.array([[0, 5], [1, 1]]), [0, 2], "train",
     "holds token ids in [0, 5]; the config's vocab_size is 5"),
    ({"modality": "text", "vocab_size": 5}, np.array([[-1, 4], [1, 1]]), [0, 2], "train",
     "holds token ids in [-1, 4]; the config's vocab_size is 5"),
    # at the bounds: the last label, the last token id, an empty test split: read
    ({}, U8, [0, 2], "train", None),
    ({"x_dtype": "float32"}, np.zeros((2, 2), np.float32), [0, 2], "train", None),  # finite floats
    ({"modality": "text", "vocab_size": 5}, np.array([[0, 4], [1, 1]]), [0, 2], "train", None),
    ({"test_samples": [0]}, U8[:0], np.zeros(0, np.int64), "test", None),
])
def test_each_client_file_refusal_is_one_exact_line(tmp_path, config, x, y, part, says):
    from utils.data_utils import _read_npz

    path = tmp_path / part / "0.npz"
    path.parent.mkdir()
    np.savez(path, x=x, y=np.asarray(y, dtype=np.int64))
    if says is None:
        got_x, got_y = _read_npz("Digits", path, {**BASE, **config}, part, 0)
        assert np.array_equal(got_x, x) and np.array_equal(got_y, y)
        return
    with pytest.raises(FLError) as e:
        _read_npz("Digits", path, {**BASE, **config}, part, 0)
    assert str(e.value) == f"split 'Digits': client file {path} {says}" + REGENERATE


def test_a_missing_or_corrupt_client_file_is_one_exact_line(tmp_path):
    from utils.data_utils import _read_npz

    path = tmp_path / "0.npz"
    with pytest.raises(FLError) as e:
        _read_npz("Digits", path, BASE, "train", 0)
    assert str(e.value) == f"split 'Digits': client file {path} is missing" + REGENERATE
    path.write_bytes(b"\0" * 100)
    with pytest.raises(FLError) as e:
        _read_npz("Digits", path, BASE, "train", 0)
    assert str(e.value) == (f"split 'Digits': corrupt client file {path} is not an npz (File is not a zip file)"
                            + REGENERATE)


def test_which_clients_a_run_loads_and_the_counts_it_refuses(digits_tiny_root):
    """The split holds 5 clients: -nc n loads the first n, -nnc k the k after them (after all of them
    without -nc: the split's last k); the config's hash is its file's sha256, cut to 16 hex digits."""
    import hashlib

    from utils.data_utils import load_split

    def ids(data):  # a client is known by its labels
        return [c.y_train.tolist() for c in data]

    every = load_split("Digits", digits_tiny_root).clients
    assert len(every) == 5
    two = load_split("Digits", digits_tiny_root, num_clients=2, new_clients=3)
    assert ids(two.clients) == ids(every[:2]) and ids(two.new_clients) == ids(every[2:])
    last = load_split("Digits", digits_tiny_root, new_clients=4)
    assert ids(last.clients) == ids(every[:1]) and ids(last.new_clients) == ids(every[1:])
    raw = (digits_tiny_root / "Digits" / "config.json").read_bytes()
    assert last.config_hash == hashlib.sha256(raw).hexdigest()[:16]
    for kwargs, says in [
        ({"num_clients": 0}, "-nc must be >= 1 (got 0)"),
        ({"new_clients": 5}, "-nnc 5 leaves no client of split 'Digits' (5) to train"),
        ({"num_clients": 6}, "-nc 6 asks for more clients than split 'Digits' has (5); use at most 5 or "
                             "regenerate with --num-clients 6"),
        ({"num_clients": 5, "new_clients": 1}, "-nc 5 + -nnc 1 = 6 asks for more clients than split 'Digits' has "
                                               "(5); use at most 5 or regenerate with --num-clients 6"),
    ]:
        with pytest.raises(FLError) as e:
            load_split("Digits", digits_tiny_root, **kwargs)
        assert str(e.value) == says


def test_inputs_become_tensors_by_hand():
    """uint8 pixels become x / 255, then (x - mean) / std per channel; floats float32; token ids int64."""
    from utils.data_utils import _to_tensor

    x = np.array([[[[0, 255]], [[51, 102]]]], np.uint8)  # one image, 2 channels of 1 x 2
    t = _to_tensor(x, {"mean": [0.5, 0.2], "std": [0.5, 0.1]}, "cpu")
    assert t.dtype == torch.float32 and t.shape == (1, 2, 1, 2)
    assert t.flatten().tolist() == pytest.approx([-1.0, 1.0, 0.0, 2.0])
    assert _to_tensor(x, None, "cpu").flatten().tolist() == pytest.approx([0.0, 1.0, 0.2, 0.4])
    floats = _to_tensor(np.array([[1.5, -2.0]], np.float64), {"mean": [9.0], "std": [9.0]}, "cpu")
    assert floats.dtype == torch.float32 and floats.tolist() == [[1.5, -2.0]]  # vectors are not normalised
    assert _to_tensor(np.array([[3, 7]], np.int16), None, "cpu").dtype == torch.int64


def test_an_input_shape_holds_one_to_four_sizes(digits_tiny_root, tmp_path):
    for shape, ok in (([2], True), ([1, 1, 1, 2], True), ([], False), ([1, 1, 1, 1, 2], False)):
        cfg = config_of(digits_tiny_root)
        cfg["input_shape"] = shape
        if ok:
            assert config_accepted(tmp_path, cfg)["input_shape"] == shape
        else:
            assert "key 'input_shape' must be a list of 1 to 4 integers" in config_refusal(tmp_path, cfg)


@pytest.mark.parametrize("key", ["x_dtype", "format_version", "normalize", "label_counts"])
def test_each_optional_config_key_may_be_absent(digits_tiny_root, tmp_path, key):
    """A split written before a key existed (or by hand) is read without it; only the three keys a run
    cannot do without (num_clients, num_classes, input_shape) are required."""
    cfg = config_of(digits_tiny_root)
    assert key in cfg  # the generator writes every key: the test removes one
    del cfg[key]
    assert key not in config_accepted(tmp_path, cfg)


@pytest.mark.parametrize("value", [5, None, ["uint8"]])
def test_x_dtype_must_be_a_dtype_name(digits_tiny_root, tmp_path, value):
    cfg = {**config_of(digits_tiny_root), "x_dtype": value}
    assert config_refusal(tmp_path, cfg) == (f"split 'Digits': config.json key 'x_dtype' must be a numpy dtype name "
                                             f"such as uint8 (got {value!r})" + REGENERATE)


@pytest.mark.parametrize("part", ["train", "test"])
def test_sample_counts_of_either_part_must_match_the_config(split, part):
    from utils.data_utils import load_split

    cfg = config_of(split)
    cfg[f"{part}_samples"][2] += 1
    write_config(split, cfg)
    n = cfg[f"{part}_samples"][2]
    with pytest.raises(FLError) as e:
        load_split("Digits", split)
    assert str(e.value) == (f"split 'Digits': client file {split / 'Digits' / part / '2.npz'} holds {n - 1} samples; "
                            f"the config's {part}_samples says {n}" + REGENERATE)


def test_a_missing_split_names_itself_its_root_and_its_generator(tmp_path):
    from utils.data_utils import load_split

    with pytest.raises(FLError) as e:
        load_split("MNIST", tmp_path)
    assert str(e.value).startswith(f"split 'MNIST' not found in {tmp_path}; generate it first: "
                                   f"python dataset/generate_MNIST.py --out MNIST ... (offline: ")


def vector_split(root, test_y) -> None:
    """Split 'V': one client of two 2-d float vectors, its test file holding ``test_y``'s labels."""
    folder = root / "V"
    for part, y in (("train", [0, 1]), ("test", test_y)):
        (folder / part).mkdir(parents=True)
        np.savez(folder / part / "0.npz", x=np.zeros((len(y), 2), np.float32), y=np.asarray(y, np.int64))
    (folder / "config.json").write_text(json.dumps({**BASE, "x_dtype": "float32", "test_samples": [len(test_y)]}))


def test_white_is_a_full_pixel_after_normalisation_for_images_only(digits_tiny_root, tmp_path):
    from utils.data_utils import load_split

    cfg = config_of(digits_tiny_root)
    c, norm = cfg["input_shape"][0], cfg["normalize"]
    want = torch.ones(c, 1, 1) if norm is None else (
        (1.0 - torch.tensor(norm["mean"])) / torch.tensor(norm["std"])).view(-1, 1, 1).expand(c, 1, 1)
    data = load_split("Digits", digits_tiny_root, num_clients=3, new_clients=1)
    for client in data.clients + data.new_clients:
        assert client.white.shape == (c, 1, 1) and torch.allclose(client.white, want)
    vector_split(tmp_path, [0, 2])
    assert load_split("V", tmp_path).clients[0].white is None  # not an image: no trigger pixel


def test_a_split_whose_test_files_are_all_empty_is_refused(tmp_path):
    from utils.data_utils import load_split

    vector_split(tmp_path, [])
    with pytest.raises(FLError) as e:
        load_split("V", tmp_path)
    assert str(e.value) == ("split 'V': every test split of its 1 client(s) is empty: there is nothing to evaluate; "
                            "regenerate it: python dataset/generate_<Name>.py --out V ...")


def test_few_shot_then_validation_by_hand_from_the_clients_streams(digits_tiny_root, tmp_path):
    """-fs 2 --val_ratio 0.25 --seed 3, run 1, client 1, worked out step by step: the few-shot permutation's
    first two samples of each class (in index order), then round(0.25 m) of those held out by the validation
    permutation's head; seed and run differ so that a swapped stream would be caught."""
    from cli import parse_config
    from utils.data_utils import load_split, local_split
    from utils.seeding import torch_gen

    cfg = parse_config(cli(digits_tiny_root, tmp_path, "-fs", "2", "--val_ratio", "0.25", "--seed", "3"))
    data = load_split("Digits", digits_tiny_root).clients[1]
    perm = torch.randperm(len(data.y_train), generator=torch_gen(3, 1, "few-shot", 1)).tolist()
    shots = sorted(i for c in sorted(set(data.y_train.tolist()))
                   for i in [j for j in perm if data.y_train[j] == c][:2])
    m = len(shots)
    order = torch.randperm(m, generator=torch_gen(3, 1, "validation", 1)).tolist()
    n_val = min(max(1, round(0.25 * m)), m - 1)
    val, kept = [shots[k] for k in order[:n_val]], [shots[k] for k in sorted(order[n_val:])]
    part = local_split(data, cfg, 1, 1)
    assert torch.equal(part.y_val, data.y_train[val]) and torch.equal(part.x_val, data.x_train[val])
    assert torch.equal(part.y_train, data.y_train[kept]) and torch.equal(part.x_train, data.x_train[kept])
    assert part.x_test is data.x_test and part.white is data.white


def test_without_few_shot_or_validation_the_training_data_is_untouched(digits_tiny_root, tmp_path):
    from cli import parse_config
    from utils.data_utils import load_split, local_split

    data = load_split("Digits", digits_tiny_root).clients[2]
    part = local_split(data, parse_config(cli(digits_tiny_root, tmp_path)), 0, 2)
    assert part.x_val is None and part.y_val is None
    assert torch.equal(part.x_train, data.x_train) and torch.equal(part.y_train, data.y_train)


@pytest.mark.parametrize("ratio, n, n_val", [(0.9, 1, None), (0.9, 2, 1), (0.9, 3, 2), (0.1, 3, 1), (0.5, 4, 2)])
def test_validation_holds_out_round_rn_at_least_one_and_leaves_one(tmp_path, ratio, n, n_val):
    """round(r n) samples held out, at least one, and at least one left to train on; one sample is refused."""
    from cli import parse_config
    from utils.data_utils import ClientData, local_split

    x, y = torch.arange(n, dtype=torch.float32).view(n, 1), torch.zeros(n, dtype=torch.int64)
    data = ClientData(x, y, x[:1], y[:1])
    cfg = parse_config(["--val_ratio", str(ratio), "--results_dir", str(tmp_path)])
    if n_val is None:
        with pytest.raises(FLError) as e:
            local_split(data, cfg, 0, 4)
        assert str(e.value) == "--val_ratio: client 4 has 1 training sample(s); it needs 2 to hold one out"
        return
    part = local_split(data, cfg, 0, 4)
    assert (len(part.y_train), len(part.y_val)) == (n - n_val, n_val)
    assert sorted(torch.cat([part.x_train, part.x_val]).flatten().tolist()) == list(range(n))


@pytest.mark.parametrize("key, value, ok", [
    ("modality", "image", True), ("modality", "series", True), ("modality", "audio", False), ("modality", 1, False),
    ("default_model", "a", True), ("default_model", "x" * 64, True), ("default_model", "", False),
    ("default_model", "x" * 65, False), ("default_model", 5, False)])
def test_the_optional_modality_and_default_model_are_checked_at_their_bounds(digits_tiny_root, tmp_path, key, value,
                                                                               ok):
    cfg = {**config_of(digits_tiny_root), key: value}
    if ok:
        assert config_accepted(tmp_path, cfg)[key] == value
        return
    what = "one of image, text, vector, series" if key == "modality" else "a model name"
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
    assert config_refusal(tmp_path, cfg) == (f"split 'Digits': config.json key '{key}' must be {what} "
                                             f"(got {shown})" + REGENERATE)
