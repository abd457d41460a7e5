"""The dataset zoo: every generator parses a tiny fixture written in its dataset's official on-disk layout
(class folders, LEAF json, UCI text files, WILDS metadata.csv, .mat files, CSVs, archives), then the split
is checked against what the fixture encodes. Image fixtures are 16x16 with the left half set to
10 + 20 * label and the right half to 10 + 20 * group (natural client or domain), so every stored sample
can be traced back to its label and group even through JPEG."""

import csv
import gzip
import json
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dataset import generate as registry
from dataset.utils import readers as rd
from dataset.utils.dataset_utils import run_cli

REPO = Path(__file__).resolve().parents[1]

SIDE = 16


def code(v):
    return 10 + 20 * v


def img(path, label, group=0, mode="RGB"):
    """A 16x16 image: left half code(label), right half code(group)."""
    from PIL import Image

    a = np.zeros((SIDE, SIDE), dtype=np.uint8)
    a[:, : SIDE // 2], a[:, SIDE // 2:] = code(label), code(group)
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.fromarray(a, "L")
    (im if mode == "L" else im.convert("RGB")).save(path)


def decode(x, col):
    return np.round((x[:, 0, SIDE // 2, col].astype(float) - 10) / 20).astype(int)


def run(name, *argv):
    """Run generator ``name``; returns (config, [(x, y) per client, train+test merged])."""
    module = __import__(registry.GENERATORS[name], fromlist=["main"])
    assert module.main(list(argv)) == 0
    root = Path(argv[argv.index("--root") + 1])
    out = root / (argv[argv.index("--out") + 1] if "--out" in argv else name)
    config = json.loads((out / "config.json").read_text())
    clients = []
    for i in range(config["num_clients"]):
        parts = [np.load(out / p / f"{i}.npz", allow_pickle=False) for p in ("train", "test")]
        clients.append((np.concatenate([p["x"] for p in parts]), np.concatenate([p["y"] for p in parts])))
        assert len(parts[0]["y"]) == config["train_samples"][i] >= 1
    return config, clients


def check(config, clients, total, num_classes, modality, model, scenario):
    """Invariants of every split: sample count, labels in range, x dtype/shape, config keys."""
    assert sum(len(y) for _, y in clients) == total
    assert config["num_classes"] == num_classes and config["modality"] == modality
    assert config["default_model"] == model and config["scenario"] == scenario
    for x, y in clients:
        assert y.dtype == np.int64 and 0 <= y.min() and y.max() < num_classes
        assert list(x.shape[1:]) == config["input_shape"]
        assert x.dtype == {"image": np.uint8, "text": np.int64, "vector": np.float32, "series": np.float32}[modality]


def check_images(clients, natural=None):
    """Every image's label matches its code; with natural=True each client holds exactly one group,
    and no two clients share one (natural clients preserved)."""
    seen = []
    for x, y in clients:
        np.testing.assert_array_equal(decode(x, 0), y)
        if natural:
            groups = set(decode(x, SIDE - 1).tolist())
            assert len(groups) == 1
            seen += groups
    assert len(seen) == len(set(seen))
    return seen


def root_args(tmp_path, src, *extra):
    return ["--root", str(tmp_path / "out"), "--source", str(src), "--seed", "1", *extra]


# ---------------------------------------------------------------- the registry

def test_registry_lists_every_generator_with_its_facts():
    out = subprocess.run([sys.executable, str(REPO / "dataset/generate.py"), "--list"], capture_output=True,
                         text=True, check=True).stdout
    assert len(registry.GENERATORS) == 26
    for name in registry.GENERATORS:
        assert (REPO / "dataset" / f"generate_{name}.py").is_file()
        assert f"\n{name} " in out
    line = next(r for r in out.splitlines() if r.startswith("TinyImagenet"))
    assert "label skew" in line and "200" in line and "ResNet18" in line and "3x64x64" in line
    assert "feature shift" in next(r for r in out.splitlines() if r.startswith("DomainNet"))


def test_dispatch_unknown_name_lists_the_valid_ones(capsys):
    assert registry.main(["Nope"]) == 2
    assert "choose one of" in capsys.readouterr().err


# ---------------------------------------------------------------- label skew, images

def test_emnist_idx_files_transposed_and_letters_shifted(tmp_path):
    def idx(path, arr, magic_dims):
        data = bytes([0, 0, 8, magic_dims]) + np.array(arr.shape, ">i4").tobytes() + arr.astype(np.uint8).tobytes()
        (gzip.open if path.suffix == ".gz" else open)(path, "wb").write(data)

    src = tmp_path / "EMNIST" / "raw"
    src.mkdir(parents=True)
    for split, labels in (("digits", np.repeat(np.arange(3), 8)), ("letters", np.repeat(np.arange(1, 4), 8))):
        for part, sl in (("train", slice(0, 18)), ("test", slice(18, 24))):
            x = np.zeros((len(labels[sl]), 28, 28), np.uint8)
            x[:, 0, 5] = code(labels[sl])  # row 0, column 5 of the stored (transposed) image
            gz = ".gz" if part == "test" else ""
            idx(src / f"emnist-{split}-{part}-images-idx3-ubyte{gz}", x, 3)
            idx(src / f"emnist-{split}-{part}-labels-idx1-ubyte{gz}", labels[sl], 1)
    config, clients = run("EMNIST", *root_args(tmp_path, tmp_path / "EMNIST"), "--num-clients", "3",
                          "--partition", "iid", "--least-samples", "2")
    check(config, clients, 24, 10, "image", "CNN", "label skew")
    for x, y in clients:
        np.testing.assert_array_equal(x[:, 0, 5, 0], code(y))  # upright: column 5 became row 5
    config, clients = run("EMNIST", *root_args(tmp_path, tmp_path / "EMNIST"), "--split", "letters", "--out", "L",
                          "--num-clients", "3", "--partition", "iid", "--least-samples", "2")
    assert config["num_classes"] == 26 and sorted(np.unique(np.concatenate([y for _, y in clients]))) == [0, 1, 2]


def test_flowers102_labels_from_mat(tmp_path):
    from scipy.io import savemat

    base = tmp_path / "flowers-102"
    labels = np.repeat([1, 2, 3], 6)  # 1-based, as the .mat file stores them
    for i, lab in enumerate(labels, start=1):
        img(base / "jpg" / f"image_{i:05d}.jpg", lab - 1)
    savemat(base / "imagelabels.mat", {"labels": labels[None]})
    config, clients = run("Flowers102", *root_args(tmp_path, base), "--image-size", "16", "--num-clients", "2",
                          "--partition", "dir", "--alpha", "1", "--least-samples", "2")
    check(config, clients, 18, 102, "image", "CNN", "label skew")
    check_images(clients)
    assert config["input_shape"] == [3, 16, 16]


def test_gtsrb_training_folders_and_test_csv(tmp_path):
    base = tmp_path / "gtsrb"
    for c in range(3):
        for k in range(5):
            img(base / "GTSRB/Training" / f"{c:05d}" / f"00000_{k:05d}.ppm", c)
    rows = [(f"{i:05d}.ppm", i % 3) for i in range(6)]
    for f, c in rows:
        img(base / "GTSRB/Final_Test/Images" / f, c)
    with open(base / "GT-final_test.csv", "w", newline="") as f:
        w = csv.writer(f, delimiter=";")
        w.writerow(["Filename", "Width", "Height", "Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2", "ClassId"])
        w.writerows([fn, 16, 16, 0, 0, 15, 15, c] for fn, c in rows)
    config, clients = run("GTSRB", *root_args(tmp_path, base), "--image-size", "16", "--num-clients", "3",
                          "--partition", "pat", "--class-per-client", "2", "--least-samples", "2")
    check(config, clients, 21, 43, "image", "CNN", "label skew")
    check_images(clients)


def test_stanford_cars_annotation_mats(tmp_path):
    from scipy.io import savemat

    base = tmp_path / "stanford_cars"
    (base / "devkit").mkdir(parents=True)
    savemat(base / "devkit/cars_meta.mat", {"class_names": np.array(["A car", "B car", "C car"], dtype=object)[None]})
    for annos, folder, n in (("devkit/cars_train_annos.mat", "cars_train", 12), ("cars_test_annos_withlabels.mat",
                                                                                  "cars_test", 6)):
        rec = np.zeros(n, dtype=[("bbox_x1", "O"), ("class", "O"), ("fname", "O")])
        for i in range(n):
            rec[i] = (0, i % 3 + 1, f"{i:05d}.jpg")
            img(base / folder / f"{i:05d}.jpg", i % 3)
        savemat(base / annos, {"annotations": rec[None]})
    config, clients = run("StanfordCars", *root_args(tmp_path, base), "--image-size", "16", "--num-clients", "2",
                          "--partition", "iid", "--least-samples", "2")
    check(config, clients, 18, 3, "image", "CNN", "label skew")
    check_images(clients)
    assert config["class_names"] == ["A car", "B car", "C car"]


def test_country211_split_folders(tmp_path):
    base = tmp_path / "country211"
    for s in ("train", "valid", "test"):
        for c, cc in enumerate(("AD", "AE", "AF")):
            for k in range(3):
                img(base / s / cc / f"{k}.jpg", c)
    config, clients = run("Country211", *root_args(tmp_path, base), "--image-size", "16", "--num-clients", "3",
                          "--partition", "iid", "--least-samples", "2")
    check(config, clients, 27, 3, "image", "CNN", "label skew")
    check_images(clients)
    assert config["class_names"] == ["AD", "AE", "AF"]


def test_tiny_imagenet_zip_wnids_and_val_annotations(tmp_path):
    base = tmp_path / "build" / "tiny-imagenet-200"
    wnids = ["n02", "n01", "n03"]  # file order, not sorted order, defines the class index
    (base / "val/images").mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (base / "words.txt").write_text("".join(f"{w}\tthing {w}, other\n" for w in wnids))
    for c, w in enumerate(wnids):
        for k in range(4):
            img(base / "train" / w / "images" / f"{w}_{k}.JPEG", c)
    lines = []
    for i in range(6):
        img(base / "val/images" / f"val_{i}.JPEG", i % 3)
        lines.append(f"val_{i}.JPEG\t{wnids[i % 3]}\t0\t0\t8\t8")
    (base / "val/val_annotations.txt").write_text("\n".join(lines) + "\n")
    archive = tmp_path / "tiny-imagenet-200.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for p in sorted(base.rglob("*")):
            z.write(p, p.relative_to(base.parent).as_posix())
    config, clients = run("TinyImagenet", *root_args(tmp_path, archive), "--image-size", "16", "--num-clients", "2",
                          "--partition", "iid", "--least-samples", "2")
    check(config, clients, 18, 3, "image", "ResNet18", "label skew")
    check_images(clients)
    assert config["class_names"][0] == "thing n02"


def test_covidx_label_files(tmp_path):
    base = tmp_path / "covidx"
    for split, n in (("train", 12), ("test", 6)):
        lines = []
        for i in range(n):
            label = ("negative", "positive")[i % 2]
            img(base / split / f"{split}{i}.png", i % 2)
            lines.append(f"p{i} {split}{i}.png {label} rsna")
        (base / f"{split}.txt").write_text("\n".join(lines) + "\n")
    config, clients = run("COVIDx", *root_args(tmp_path, base), "--image-size", "16", "--num-clients", "2",
                          "--partition", "iid", "--least-samples", "2")
    check(config, clients, 18, 2, "image", "CNN", "label skew")
    check_images(clients)
    assert config["normalize"] is None and config["class_names"] == ["negative", "positive"]


def test_kvasir_class_folders_in_zip(tmp_path):
    base = tmp_path / "build" / "kvasir-dataset-v2"
    classes = ["dyed-lifted-polyps", "normal-cecum", "polyps"]
    for c, name in enumerate(classes):
        for k in range(5):
            img(base / name / f"{k}.jpg", c)
    archive = tmp_path / "kvasir-dataset-v2.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for p in sorted(base.rglob("*")):
            z.write(p, p.relative_to(base.parent).as_posix())
    config, clients = run("kvasir", *root_args(tmp_path, archive), "--image-size", "16", "--num-clients", "3",
                          "--least-samples", "2", "--class-per-client", "1")
    check(config, clients, 15, 3, "image", "CNN", "label skew")
    check_images(clients)
    assert all(len(np.unique(y)) == 1 for _, y in clients)  # pat with one class per client


# ---------------------------------------------------------------- text

def write_news(folder, classes, rows_per_class, words):
    folder.mkdir(parents=True)
    (folder / "classes.txt").write_text("\n".join(classes) + "\n")
    for part, n in (("train", rows_per_class), ("test", 2)):
        with open(folder / f"{part}.csv", "w", newline="") as f:
            w = csv.writer(f, quoting=csv.QUOTE_ALL)
            for c in range(len(classes)):
                for k in range(n):
                    w.writerow([c + 1, f"{words[c]} Title", f"{words[c]} body, number {k}!\\nmore {words[c]}"])


def test_tokenizer_and_vocabulary_by_hand():
    assert rd.tokenize("Wall St. Bears' claw-back\\nIt's 2x!") == [
        "wall", "st", ".", "bears", "'", "claw", "-", "back", "it's", "2x", "!"]
    vocab = rd.build_vocab([["b", "a", "b"], ["c", "a", "b"]], 4)
    assert vocab == ["<pad>", "<unk>", "b", "a"]  # b: 3, a: 2, c: 1 cut by the size
    np.testing.assert_array_equal(rd.encode([["a", "c", "b"], []], vocab, 4), [[3, 1, 2, 0], [0, 0, 0, 0]])


def test_ag_news_csv_tgz_tokens_vocab_and_padding(tmp_path):
    base = tmp_path / "build" / "ag_news_csv"
    write_news(base, ["World", "Sports", "Business", "Sci/Tech"], 6, ["war", "goal", "stock", "chip"])
    archive = tmp_path / "ag_news_csv.tgz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(base, arcname="ag_news_csv")
    config, clients = run("AGNews", *root_args(tmp_path, archive), "--num-clients", "2", "--partition", "iid",
                          "--least-samples", "2", "--max-len", "12")
    check(config, clients, 32, 4, "text", "fastText", "label skew")
    vocab = (tmp_path / "out/AGNews/vocab.txt").read_text().split("\n")[:-1]
    assert vocab[:2] == ["<pad>", "<unk>"] and config["vocab_size"] == len(vocab) and config["input_shape"] == [12]
    words = ["war", "goal", "stock", "chip"]
    for x, y in clients:
        for row, label in zip(x, y):
            tokens = [vocab[i] for i in row if i]
            assert tokens[:2] == [words[label], "title"] and tokens[2] == words[label]
            assert len(tokens) == 12 or row[len(tokens)] == 0


def test_sogou_news_folder_and_vocab_cap(tmp_path):
    base = tmp_path / "sogou_news_csv"
    write_news(base, ["sports", "finance", "entertainment", "automobile", "technology"], 4,
               ["tiyu", "caijing", "yule", "qiche", "keji"])
    config, clients = run("SogouNews", *root_args(tmp_path, base), "--num-clients", "2", "--partition", "dir",
                          "--alpha", "1", "--least-samples", "2", "--vocab-size", "6")
    check(config, clients, 30, 5, "text", "fastText", "label skew")
    assert config["vocab_size"] == 6 and max(x.max() for x, _ in clients) <= 5
    assert config["input_shape"] == [200]


# ---------------------------------------------------------------- real world (natural clients)

def leaf(path, users):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"users": list(users), "num_samples": [len(v["y"]) for v in users.values()],
                                "user_data": users}))


def test_femnist_leaf_writers_merged_across_files(tmp_path):
    def samples(writer, labels):
        x = np.zeros((len(labels), 28, 28))
        x[:, 8, :14], x[:, 8, 14:] = code(np.array(labels))[:, None] / 255, code(writer) / 255
        return {"x": x.reshape(len(labels), -1).tolist(), "y": labels}

    src = tmp_path / "femnist" / "data"
    leaf(src / "train/a.json", {"f0": samples(0, [0, 1, 2, 3]), "f1": samples(1, [4, 5, 6])})
    leaf(src / "test/a.json", {"f0": samples(0, [7, 8]), "f1": samples(1, [11]), "f2": samples(2, [9])})
    config, clients = run("FEMNIST", *root_args(tmp_path, src.parent))
    check(config, clients, 10, 62, "image", "CNN", "real world")  # f2 (1 sample) is below least 2
    assert config["client_groups"] == ["f0", "f1"] and config["partition"] == "natural"
    for (x, y), writer in zip(clients, (0, 1)):
        np.testing.assert_array_equal(x[:, 0, 8, 0], code(y))
        assert set(x[:, 0, 8, 27].tolist()) == {code(writer)}
    config, clients = run("FEMNIST", *root_args(tmp_path, src.parent), "--num-clients", "1", "--out", "top")
    assert config["client_groups"] == ["f0"] and len(clients[0][1]) == 6
    config, clients = run("FEMNIST", *root_args(tmp_path, src.parent), "--partition", "dir", "--alpha", "1",
                          "--num-clients", "2", "--least-samples", "2", "--out", "relabelled")
    assert config["partition"] == "dir" and config["client_groups"] is None
    assert sum(len(y) for _, y in clients) == 11  # every writer's samples, f2's too


def test_shakespeare_leaf_characters_and_roles(tmp_path):
    letters = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"  # LEAF's alphabet
    roles = {f"ROLE_{k}": {"x": [(c * 80) for c in "abc"[k] * 3 + "Z"], "y": list("xyz") + ["\u00e9"]}
             for k in range(3)}  # the last target is outside LEAF's alphabet: dropped
    leaf(tmp_path / "shakespeare/all_data.json", roles)
    config, clients = run("Shakespeare", *root_args(tmp_path, tmp_path / "shakespeare"))
    check(config, clients, 9, 80, "text", "fastText", "real world")
    assert config["vocab_size"] == 81 and config["client_groups"] == list(roles)
    vocab = (tmp_path / "out/Shakespeare/vocab.txt").read_text().split("\n")[:-1]
    assert len(vocab) == 81 and vocab[0] == "<pad>" and vocab[1] == "\\n"
    for k, (x, y) in enumerate(clients):
        assert (x == letters.index("abc"[k]) + 1).all()
        assert sorted(y.tolist()) == sorted(letters.index(c) for c in "xyz")


def test_omniglot_drawers_are_clients_alphabets_are_labels(tmp_path):
    base = tmp_path / "omniglot-py"
    alphabets = {"images_background": ["Greek", "Latin"], "images_evaluation": ["Angelic"]}
    label = 0
    for part, names in alphabets.items():
        for name in names:
            for ch in ("character01", "character02"):
                for drawer in (1, 2, 3):
                    img(base / part / name / ch / f"0{label}{ch[-1]}_{drawer:02d}.png", label, drawer, mode="L")
            label += 1
    config, clients = run("Omniglot", *root_args(tmp_path, base), "--image-size", "16")
    check(config, clients, 18, 50, "image", "CNN", "real world")
    assert check_images(clients, natural=True) == [1, 2, 3]
    assert config["client_groups"] == ["drawer 1", "drawer 2", "drawer 3"]
    assert config["class_names"] == ["Greek", "Latin", "Angelic"] and config["normalize"] is None


def test_har_nested_uci_zip_subjects(tmp_path):
    base = tmp_path / "build" / "UCI HAR Dataset"
    signals = ["body_acc_x", "body_acc_y", "body_acc_z", "body_gyro_x", "body_gyro_y", "body_gyro_z",
               "total_acc_x", "total_acc_y", "total_acc_z"]  # PFLlib's channel order
    rows = {"train": [(s, a) for s in (1, 3) for a in (1, 2, 3) for _ in range(2)],
            "test": [(2, a) for a in (4, 5, 6) for _ in range(2)]}
    for part, pairs in rows.items():
        (base / part / "Inertial Signals").mkdir(parents=True)
        for c, sig in enumerate(signals):
            values = [[s * 100 + a * 10 + c + t / 1000 for t in range(128)] for s, a in pairs]
            np.savetxt(base / part / "Inertial Signals" / f"{sig}_{part}.txt", values, fmt="%.4f")
        np.savetxt(base / part / f"y_{part}.txt", [a for _, a in pairs], fmt="%d")
        np.savetxt(base / part / f"subject_{part}.txt", [s for s, _ in pairs], fmt="%d")
    (base / "activity_labels.txt").write_text("".join(f"{a} ACT{a}\n" for a in range(1, 7)))
    inner = tmp_path / "build" / "UCI HAR Dataset.zip"
    with zipfile.ZipFile(inner, "w") as z:
        for p in sorted(base.rglob("*")):
            z.write(p, p.relative_to(base.parent).as_posix())
    outer = tmp_path / "human+activity+recognition+using+smartphones.zip"
    with zipfile.ZipFile(outer, "w") as z:
        z.write(inner, "UCI HAR Dataset.zip")
    config, clients = run("HAR", *root_args(tmp_path, outer))
    check(config, clients, 18, 6, "series", "HARCNN", "real world")
    assert config["client_groups"] == ["subject 1", "subject 2", "subject 3"] and config["input_shape"] == [9, 1, 128]
    for (x, y), s in zip(clients, (1, 2, 3)):
        np.testing.assert_allclose(x[:, :, 0, 0], s * 100 + (y[:, None] + 1) * 10 + np.arange(9), atol=1e-3)
        np.testing.assert_allclose(x[:, 0, 0, 127] - x[:, 0, 0, 0], 0.127, atol=1e-3)


def test_pamap2_windows_labels_and_subjects(tmp_path):
    base = tmp_path / "PAMAP2_Dataset"
    (base / "Protocol").mkdir(parents=True)
    (base / "Optional").mkdir()
    for s in (101, 102, 103):
        acts = [1] * 512 + [0] * 100 + [24] * 512  # pure windows start at 0, 128, 256 (activity 1), 640, 768 (24)
        data = np.full((len(acts), 54), np.nan)
        data[:, 0] = np.arange(len(acts)) / 100
        data[:, 1] = acts
        data[:, 4] = np.arange(len(acts))  # hand acc16 x: the row number, scaled by the subject's largest
        data[:, 5] = s
        np.savetxt(base / "Protocol" / f"subject{s}.dat", data, fmt="%g")
    extra = np.ones((300, 54))
    extra[:, 1], extra[:, 4], extra[:, 5] = 17, 1124 + np.arange(300), 103  # ironing (-> 11); windows lie on the 128-step grid: 1152
    np.savetxt(base / "Optional" / "subject103.dat", extra, fmt="%g")  # appended to subject 103's rows
    config, clients = run("PAMAP2", *root_args(tmp_path, base))
    check(config, clients, 16, 12, "series", "HARCNN", "real world")
    assert config["client_groups"] == ["subject 101", "subject 102", "subject 103"]
    for k, (x, y) in enumerate(clients):
        largest = 1123 if k < 2 else 1423  # each channel is divided by its largest absolute value in the subject
        got = sorted(zip(np.round(x[:, 0, 0, 0] * largest).astype(int).tolist(), y.tolist()))
        assert got == [(0, 1), (128, 1), (256, 1), (640, 0), (768, 0)] + ([(1152, 11)] if k == 2 else [])
        np.testing.assert_allclose(x[:, 1], 1.0)  # a constant channel scales to 1
        np.testing.assert_allclose(x[y != 11, 3], 0.0)  # NaN becomes 0


def test_camelyon17_wilds_metadata(tmp_path):
    base = tmp_path / "camelyon17_v1.0"
    with open(tmp_path / "meta.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["", "patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"])
        for i in range(24):
            p, n, center, tumor = i % 4 + 4, i % 2, i % 3, (i // 3) % 2
            w.writerow([i, p, n, 32 * i, 64, tumor, p * 5 + n, center, 0])
            img(base / "patches" / f"patient_{p:03d}_node_{n}" / f"patch_patient_{p:03d}_node_{n}_x_{32 * i}_y_64.png",
                tumor, center)
    (tmp_path / "meta.csv").rename(base / "metadata.csv")
    config, clients = run("Camelyon17", *root_args(tmp_path, base), "--image-size", "16")
    check(config, clients, 24, 2, "image", "CNN", "real world")
    assert check_images(clients, natural=True) == [0, 1, 2]


def test_iwildcam_wilds_metadata_drops_traps_with_two_classes(tmp_path):
    base = tmp_path / "iwildcam_v2.0"
    with open(tmp_path / "meta.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["split", "location_remapped", "location", "sequence", "datetime", "y", "filename"])
        for i in range(30):
            trap, label = i % 3, i % (2 if i % 3 == 1 else 4)  # trap 1 sees only 2 classes
            w.writerow(["train", trap, 100 + trap, "s", "2013-01-01", label, f"{i}.jpg"])
            img(base / "train" / f"{i}.jpg", label, trap)
    (tmp_path / "meta.csv").rename(base / "metadata.csv")
    with open(base / "categories.csv", "w", newline="") as f:
        csv.writer(f).writerows([["y", "category_id", "name"]] + [[c, c, f"animal{c}"] for c in range(5)])
    config, clients = run("iWildCam", *root_args(tmp_path, base), "--image-size", "16", "--least-samples", "2")
    check(config, clients, 20, 5, "image", "CNN", "real world")
    assert check_images(clients, natural=True) == [0, 2]
    assert config["least_samples"] == 2 and config["class_names"][4] == "animal4"


# ---------------------------------------------------------------- feature shift (domains)

def test_digit5_mat_files_one_domain_per_client(tmp_path):
    from scipy.io import savemat

    base = tmp_path / "Digit5"
    base.mkdir()
    lab = {"train": np.array([0, 1, 2, 3]), "test": np.array([4, 5])}
    onehot = {k: np.eye(10)[v] for k, v in lab.items()}
    savemat(base / "mnist_data.mat", {"train_32": np.repeat(code(lab["train"]), 1024).reshape(4, 32, 32).astype(np.uint8),
                                      "test_32": np.repeat(code(lab["test"]), 1024).reshape(2, 32, 32).astype(np.uint8),
                                      "label_train": onehot["train"], "label_test": onehot["test"]})
    savemat(base / "mnistm_with_label.mat", {
        k: np.repeat(code(lab[p]), 3072).reshape(-1, 32, 32, 3).astype(np.uint8) for k, p in (("train", "train"),
                                                                                           ("test", "test"))}
            | {"label_train": onehot["train"], "label_test": onehot["test"]})
    for stem in ("svhn", "synth"):
        for part in ("train", "test"):
            x = np.repeat(code(lab[part]), 3072).reshape(-1, 32, 32, 3).transpose(1, 2, 3, 0).astype(np.uint8)
            y = np.where(lab[part] == 0, 10, lab[part])[:, None]  # digit 0 is stored as 10
            savemat(base / f"{stem}_{part}_32x32.mat", {"X": x, "y": y})
    cells = np.empty((2, 2), dtype=object)
    for i, part in enumerate(("train", "test")):
        cells[i, 0] = np.repeat(code(lab[part]) / 255, 784).reshape(-1, 1, 28, 28)
        cells[i, 1] = np.where(lab[part] == 0, 10, lab[part])[:, None]
    savemat(base / "usps_28x28.mat", {"dataset": cells})
    config, clients = run("Digit5", *root_args(tmp_path, base), "--image-size", "16")
    check(config, clients, 30, 10, "image", "CNN", "feature shift")
    assert config["client_groups"] == ["mnistm", "mnist", "syn", "usps", "svhn"] and config["partition"] == "domain"
    for x, y in clients:
        assert sorted(y.tolist()) == [0, 1, 2, 3, 4, 5]
        np.testing.assert_array_equal(x[:, :, 8, 8], np.repeat(code(y)[:, None], 3, axis=1))
    config, clients = run("Digit5", *root_args(tmp_path, base), "--clients-per-domain", "2", "--out", "two",
                          "--least-samples", "2", "--partition", "dir", "--alpha", "1")
    assert config["num_clients"] == 10 and config["client_groups"][:2] == ["mnistm", "mnistm"]
    assert config["partition"] == "dir" and [len(clients[2 * d][1]) + len(clients[2 * d + 1][1]) for d in range(5)] == [6] * 5
    for d in range(5):  # the two clients of a domain hold its six images between them
        assert sorted(np.concatenate([clients[2 * d][1], clients[2 * d + 1][1]]).tolist()) == [0, 1, 2, 3, 4, 5]


def test_domainnet_domains_and_split_lists(tmp_path):
    base = tmp_path / "domainnet"
    for g, d in enumerate(("clipart", "sketch")):
        lines = {"train": [], "test": []}
        for c, cls in enumerate(("aircraft_carrier", "zebra")):
            for k in range(4):
                rel = f"{d}/{cls}/{d}_{c}_{k}.jpg"
                img(base / rel, c, g)
                lines["train" if k < 3 else "test"].append(f"{rel} {c}")
        (base / "splits").mkdir(exist_ok=True)
        for part, ls in lines.items():
            (base / "splits" / f"{d}_{part}.txt").write_text("\n".join(ls) + "\n")
    config, clients = run("DomainNet", *root_args(tmp_path, base), "--image-size", "16")
    check(config, clients, 16, 345, "image", "CNN", "feature shift")
    assert check_images(clients, natural=True) == [0, 1] and config["client_groups"] == ["clipart", "sketch"]


def test_amazon_review_sparse_npz_to_dense(tmp_path):
    reviews, features = 16, 5003
    rng = np.random.default_rng(0)
    dense = np.zeros((reviews, features), np.float32)
    rows, cols = rng.integers(0, features, 80), rng.integers(0, reviews, 80)
    rows[:16] = 5001  # features beyond the first 5,000 are dropped
    cols[:16] = np.arange(16)
    vals = rng.integers(1, 4, 80).astype(np.float64)
    np.add.at(dense, (cols, rows), vals)
    dense[:, 0] = np.arange(reviews)  # feature 0 traces each review
    rows, cols, vals = np.concatenate([rows, np.zeros(reviews, int)]), np.concatenate([cols, np.arange(reviews)]), \
        np.concatenate([vals, np.arange(reviews)])
    yy = np.where(np.arange(reviews) % 2, 1, -1)[:, None]
    np.savez(tmp_path / "amazon.npz", xx_data=vals, xx_row=rows, xx_col=cols, xx_shape=np.array([features, reviews]),
             yy=yy, offset=np.array([0, 4, 8, 12, 16])[:, None])
    config, clients = run("AmazonReview", *root_args(tmp_path, tmp_path / "amazon.npz"))
    check(config, clients, 16, 2, "vector", "AmazonMLP", "feature shift")
    assert config["client_groups"] == ["books", "dvd", "electronics", "kitchen"]
    for g, (x, y) in enumerate(clients):
        ids = x[:, 0].astype(int)
        assert set(ids.tolist()) == set(range(4 * g, 4 * g + 4))
        np.testing.assert_array_equal(x, dense[ids, :5000])
        np.testing.assert_array_equal(y, ids % 2)
    config, clients = run("AmazonReview", *root_args(tmp_path, tmp_path / "amazon.npz"), "--clients-per-domain", "2",
                          "--balance", "--least-samples", "2", "--out", "two")
    assert config["partition"] == "iid" and config["num_clients"] == 8  # default within a domain: iid
    for g in range(4):
        for x, y in clients[2 * g: 2 * g + 2]:
            assert sorted(y.tolist()) == [0, 1] and set((x[:, 0].astype(int) // 4).tolist()) == {g}


# ---------------------------------------------------------------- generic paths and errors

def test_prepared_npz_with_groups_and_plot(tmp_path):
    x = np.zeros((12, 27, 1, 256), np.float32)
    x[:, 0, 0, 0] = np.arange(12)
    np.savez(tmp_path / "p.npz", x=x, y=np.arange(12) % 3, groups=np.arange(12) // 4)
    config, clients = run("PAMAP2", *root_args(tmp_path, tmp_path / "p.npz"), "--plot")
    assert [sorted(c[0][:, 0, 0, 0].astype(int).tolist()) for c in clients] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert (tmp_path / "out/PAMAP2/label_distribution.png").stat().st_size > 0


def test_rerun_with_same_parameters_is_skipped(tmp_path, capsys):
    base = tmp_path / "kvasir-dataset-v2"
    for c, name in enumerate(("a", "polyps")):
        for k in range(4):
            img(base / name / f"{k}.jpg", c)
    argv = root_args(tmp_path, base, "--image-size", "16", "--num-clients", "2", "--partition", "iid",
                     "--least-samples", "2")
    run("kvasir", *argv)
    run("kvasir", *argv)
    assert "already exists with the same parameters" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(n for n in registry.GENERATORS if n not in registry._CLASSIC))
def test_offline_without_source_is_one_line_naming_the_file(name, tmp_path, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setitem(sys.modules, "wilds", None)  # the optional package, absent or not, cannot download
    module = __import__(registry.GENERATORS[name], fromlist=["main"])
    with pytest.raises(SystemExit) as e:
        run_cli(module.main, ["--root", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: {name} needs {module.SPEC.raw_name}")
    assert str(tmp_path / name / "rawdata") in err and "--source" in err


def test_split_validation_accepts_text_and_series_and_rejects_bad_token_ids(tmp_path):
    from utils.data_utils import load_split
    from utils.errors import FLError

    base = tmp_path / "ag"
    write_news(base, ["a", "b"], 6, ["x", "y"])
    run("AGNews", *root_args(tmp_path, base), "--num-clients", "2", "--partition", "iid", "--least-samples", "2",
        "--max-len", "8")
    data = load_split("AGNews", tmp_path / "out")
    assert data.clients[0].x_train.dtype.is_floating_point is False and data.clients[0].x_train.shape[1] == 8
    np.savez(tmp_path / "p.npz", x=np.ones((12, 9, 1, 128), np.float32), y=np.arange(12) % 6, groups=np.arange(12) // 4)
    run("HAR", *root_args(tmp_path, tmp_path / "p.npz"))
    assert load_split("HAR", tmp_path / "out").clients[0].x_train.dtype.is_floating_point
    config_path = tmp_path / "out/AGNews/config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(dict(config, vocab_size=3)))
    with pytest.raises(FLError, match="token ids in"):
        load_split("AGNews", tmp_path / "out")


# ---------------------------------------------------------------- fixture -> split -> two rounds of FedAvg

def _fedavg(root, out, name, model, *extra):
    import main

    return main.main(["-data", name, "--dataset_root", str(root), "--results_dir", str(out), "-dev", "cpu",
                      "--no-progress", "--no-print_config", "--overwrite", "-algo", "FedAvg", "-gr", "2", "-nc", "2",
                      "-m", model, "-lbs", "4", "--executor", "sequential", *extra])


def test_tiny_imagenet_resnet18_two_rounds(tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    wnids = ["n01", "n02"]
    (base / "wnids.txt").parent.mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for c, w in enumerate(wnids):
        for k in range(6):
            img(base / "train" / w / "images" / f"{w}_{k}.JPEG", c)
    run("TinyImagenet", *root_args(tmp_path, base), "--image-size", "16", "--num-clients", "2", "--partition", "iid",
        "--least-samples", "2")
    assert _fedavg(tmp_path / "out", tmp_path / "res", "TinyImagenet", "auto") == 0  # the split's default_model
    assert '"model_built": "ResNet"' in next((tmp_path / "res").rglob("*.json")).read_text()


def test_ag_news_fasttext_two_rounds(tmp_path):
    base = tmp_path / "ag_news_csv"
    write_news(base, ["World", "Sports", "Business", "Sci/Tech"], 8, ["war", "goal", "stock", "chip"])
    run("AGNews", *root_args(tmp_path, base), "--num-clients", "2", "--partition", "iid", "--least-samples", "2",
        "--max-len", "16")
    assert _fedavg(tmp_path / "out", tmp_path / "res", "AGNews", "auto") == 0  # fastText, vocab_size from the split
    assert '"model_built": "FastText"' in next((tmp_path / "res").rglob("*.json")).read_text()


@pytest.mark.parametrize("name, argv, says", [
    ("HAR", ["--alpha", "0.5"], "--alpha needs a label partition"),
    ("Digit5", ["--num-clients", "4"], "--num-clients is set by the domains"),
    ("Digit5", ["--partition", "dir"], "needs --clients-per-domain > 1"),
    ("AGNews", ["--partition", "dir", "--class-per-client", "2"], "--class-per-client is not used by the dir"),
])
def test_flags_the_scenario_cannot_use_are_rejected(name, argv, says, tmp_path, capsys):
    module = __import__(registry.GENERATORS[name], fromlist=["main"])
    with pytest.raises(SystemExit) as e:
        module.main(["--root", str(tmp_path), *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_prepared_text_npz_records_its_vocab_size(tmp_path):
    from utils.data_utils import load_split

    x = np.zeros((12, 80), np.int64)
    x[:, 0] = np.arange(12) + 5
    np.savez(tmp_path / "t.npz", x=x, y=np.arange(12) % 4, groups=np.arange(12) // 6)
    config, clients = run("Shakespeare", *root_args(tmp_path, tmp_path / "t.npz"))
    assert config["vocab_size"] == 17 and config["num_clients"] == 2
    assert load_split("Shakespeare", tmp_path / "out").clients[1].x_train.shape[1] == 80
