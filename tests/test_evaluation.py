"""Evaluation beyond the trained clients' test splits: new clients (-nnc / -ften), few-shot training data
(-fs), the validation holdout (--val_ratio) and the fairness figures of every evaluation."""
import copy
from pathlib import Path

import numpy as np
import pytest
import torch

import main
from cli import parse_config
from cli import add_other_algorithms_flags, base_parser
from conftest import cli
from flcore.registry import ALGORITHMS, get_server_class
from utils.data_utils import ClientData, few_shot_indices, load_split, local_split
from utils.metrics import predict, summarize
from utils.results import read_h5
from utils.seeding import torch_gen
from runtime import loop


def accuracy(model, x, y) -> np.float64:
    return np.float64(int((predict(model, x, 256).argmax(1) == y).sum())) / len(y)


def reference_fine_tune(model, data: ClientData, epochs: int, lr: float, batch: int, cid: int, seed: int = 0):
    """-ften by hand: SGD on cross-entropy over consecutive -lbs slices of one permutation per epoch from
    the client's (seed, run 0, "new-client", id) stream (the CNN has no BatchNorm: no batch merging)."""
    gen = torch_gen(seed, 0, "new-client", cid)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(data.y_train), generator=gen)
        for i in range(0, len(perm), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
            opt.step()
    return model


# ---- -nnc / -ften -----------------------------------------------------------------------------------------
def test_new_clients_are_the_ones_after_nc_or_the_last_of_the_split(digits_tiny_root):
    full = load_split("Digits", digits_tiny_root)
    after = load_split("Digits", digits_tiny_root, 2, new_clients=2)  # trained 0, 1; new 2, 3
    last = load_split("Digits", digits_tiny_root, None, new_clients=2)  # trained 0-2; new 3, 4
    for data, trained, new in ((after, [0, 1], [2, 3]), (last, [0, 1, 2], [3, 4])):
        assert len(data.clients) == len(trained) and len(data.new_clients) == len(new)
        for got, i in zip(data.clients + data.new_clients, trained + new):
            assert torch.equal(got.y_train, full.clients[i].y_train) and torch.equal(got.y_test, full.clients[i].y_test)
    with pytest.raises(main.FLError, match=r"-nc 4 \+ -nnc 2 = 6 asks for more clients than split 'Digits' has \(5\)"):
        load_split("Digits", digits_tiny_root, 4, new_clients=2)


def test_fedavg_new_clients_fine_tune_the_final_global_model(digits_root, tmp_path):
    """-nc 3 -nnc 2 -ften 1: clients 3 and 4 never train; each fine-tunes the final global model (saved by
    -sfn) one epoch and is tested; the reference loop gives the same accuracies. They stay out of the
    trained clients' series."""
    flags = ("-gr", "3", "-nc", "3", "-nnc", "2", "-ften", "1", "-lbs", "32", "-lr", "0.05", "-sfn", "models",
             "--executor", "sequential", "--train_loss_eval", "off")
    assert main.main(cli(digits_root, tmp_path, *flags)) == 0
    h5 = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    assert h5["rs_client_test_acc"].shape == (4, 3)  # rounds 0-3 x the trained clients
    assert h5["rs_new_round"].tolist() == [3]
    data = load_split("Digits", digits_root)
    initial = get_server_class("FedAvg")(
        parse_config(cli(digits_root, tmp_path, *flags)).replace(num_classes=10),
        load_split("Digits", digits_root, 3)).global_model
    global_model = copy.deepcopy(initial)
    global_model.load_state_dict(torch.load(tmp_path / "models" / "Digits_FedAvg_test_0_server.pt", weights_only=True))

    def tuned(model, i):
        d = data.clients[i]
        return accuracy(reference_fine_tune(copy.deepcopy(model), d, 1, 0.05, 32, i), d.x_test, d.y_test)

    want = [tuned(global_model, i) for i in (3, 4)]
    assert h5["rs_new_client_test_acc"][0].tolist() == pytest.approx(want, abs=1e-12)
    n = [len(data.clients[i].y_test) for i in (3, 4)]
    assert h5["rs_new_test_acc"][0] == pytest.approx(np.dot(want, n) / sum(n))
    untuned = [accuracy(global_model, data.clients[i].x_test, data.clients[i].y_test) for i in (3, 4)]
    assert untuned != want and [tuned(initial, i) for i in (3, 4)] != want  # both the start and the epochs count


def test_fedrep_new_clients_take_the_global_body_under_their_initial_head(digits_tiny_root, tmp_path):
    """FedRep sends only the body: with -ften 0 a new client is the final global body under the head of the
    common initial model (its own, never trained), and is evaluated as that."""
    flags = ("-gr", "2", "-nc", "3", "-nnc", "2", "-ften", "0", "-algo", "FedRep", "--executor", "sequential",
             "--train_loss_eval", "off")
    cfg = parse_config(cli(digits_tiny_root, tmp_path, *flags)).replace(num_classes=10)
    data = load_split("Digits", digits_tiny_root, 3, new_clients=2)
    server = get_server_class("FedRep")(cfg, data)
    initial = copy.deepcopy(server.global_model)
    loop.train(server)
    summary = loop.evaluate_new_clients(server)
    want = []
    for d in data.new_clients:
        model = copy.deepcopy(initial)
        model.base.load_state_dict(server.global_model.base.state_dict())
        want.append(accuracy(model, d.x_test, d.y_test))
    assert summary["client_test_acc"].tolist() == pytest.approx(want, abs=1e-12)
    untrained = [accuracy(initial, d.x_test, d.y_test) for d in data.new_clients]
    assert untrained != want  # the received body matters


def test_an_algorithm_without_a_new_client_start_refuses_nnc(digits_tiny_root, tmp_path, capsys):
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "FedAMP", "-nnc", "1", "-gr", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: -nnc: FedAMP cannot evaluate new clients: its cloud model") and "\n" not in err
    assert not list(tmp_path.iterdir())  # refused before any work


# ---- -fs ------------------------------------------------------------------------------------------------
def test_few_shot_keeps_k_per_class_from_the_seeded_stream():
    y = torch.tensor([0, 1, 1, 2, 0, 1, 0, 0, 1, 2, 1])  # class counts 4, 5, 2
    picks = few_shot_indices(y, 3, torch_gen(0, 0, "few-shot", 7))
    assert torch.bincount(y[picks]).tolist() == [3, 3, 2]  # class 2 has only 2
    assert picks.tolist() == sorted(set(picks.tolist()))
    again = few_shot_indices(y, 3, torch_gen(0, 0, "few-shot", 7))
    others = {tuple(few_shot_indices(y, 3, torch_gen(s, 0, "few-shot", 7)).tolist()) for s in range(1, 20)}
    assert torch.equal(picks, again) and len(others) > 1


def test_few_shot_then_validation_in_a_client(digits_tiny_root, tmp_path):
    """-fs 2 --val_ratio 0.25 on a client: min(2, count) samples of each of its classes, then round(0.25 n)
    of those held out for validation; all drawn from its training split; the test split untouched."""
    cfg = parse_config(cli(digits_tiny_root, tmp_path, "-fs", "2", "--val_ratio", "0.25"))
    data = load_split("Digits", digits_tiny_root).clients[1]
    counts = torch.bincount(data.y_train, minlength=10)
    part = local_split(data, cfg, 0, 1)
    together = torch.cat([part.y_train, part.y_val])
    assert torch.bincount(together, minlength=10).tolist() == counts.clamp(max=2).tolist()
    assert len(part.y_val) == round(0.25 * len(together))
    assert torch.equal(part.x_test, data.x_test)
    rows = {tuple(r.tolist()) for r in data.x_train.flatten(1)}
    assert all(tuple(r.tolist()) in rows for r in torch.cat([part.x_train, part.x_val]).flatten(1))


# ---- fairness -----------------------------------------------------------------------------------------------
def test_fairness_figures_by_hand():
    """Accuracies 0.5, 1, 0.25, 0.75 and one client without test data: worst 0.25; 10th percentile
    0.25 + 0.3 * (0.5 - 0.25) = 0.325 (position 0.1 * 3 between the sorted values); std sqrt(0.078125)."""
    correct = np.array([2, 4, 1, 3, 0.0])
    n_test = np.array([4, 4, 4, 4, 0.0])
    s = summarize(correct, n_test, np.full(5, np.nan), np.zeros(5), np.ones(5))
    assert s["test_acc_min"] == 0.25
    assert s["test_acc_p10"] == pytest.approx(0.325)
    assert s["test_acc_std"] == pytest.approx(0.078125 ** 0.5)
    assert s["test_acc_mean"] == pytest.approx(0.625)


# ---- no flag reachable by a prefix of its name ------------------------------------------------------------
def full_parser(algo: str):
    """The parser parse_config builds for ``-algo algo``: common flags, its own, the others' (hidden)."""
    parser = base_parser()
    get_server_class(algo).add_args(parser.add_argument_group(f"{algo} flags"))
    add_other_algorithms_flags(parser, algo)
    return parser


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_no_flag_is_reached_by_a_prefix_of_its_name(algo):
    """Every proper prefix of every multi-character flag (single dash included: argparse matches those
    even with allow_abbrev=False) that is not a flag itself never sets that flag: it fails (exit 2) or
    means a one-letter flag with its value attached (``-s80``)."""
    parser = full_parser(algo)
    flags = parser._option_string_actions
    for flag, action in flags.items():
        dashes = 2 if flag.startswith("--") else 1
        for end in range(dashes + 1, len(flag)):
            prefix = flag[:end]
            if prefix in flags:
                continue
            try:
                ns = parser.parse_args([prefix, "3"])
            except SystemExit as e:
                assert e.code == 2
                continue
            short = flags.get(prefix[:2])
            assert short is not None and short is not action, f"{prefix} reached {flag}"


@pytest.mark.parametrize("algo", [None, *ALGORITHMS])
def test_every_help_line_states_exactly_one_default(algo):
    """-h (and -algo NAME -h): each flag's help ends with one "(default: ...)", a value or its meaning in
    words, never "None", and mentions no second default of this library."""
    parser = base_parser()
    if algo:
        get_server_class(algo).add_args(parser.add_argument_group(algo))
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        text = formatter._expand_help(action)
        name = action.option_strings[0]
        assert text.count("(default: ") == 1, f"{name}: {text}"
        assert "(default: None)" not in text, f"{name}: {text}"
        rest = text.replace("(default: ", "")
        assert " default " not in rest and "default:" not in rest, f"{name}: {text}"


# ---- friction ---------------------------------------------------------------------------------------------
def test_an_existing_result_is_refused_before_any_work(tmp_path, capsys):
    """The name check comes once the split is known to exist or be makeable (Digits is generated when
    missing), before it is generated or loaded and before any output; the line names the flags that proceed
    and a free -go tag."""
    (tmp_path / "Digits_FedAvg_test_0.h5").write_bytes(b"")
    (tmp_path / "Digits_FedAvg_test2_0.h5").write_bytes(b"")
    argv = ["-data", "Digits", "--dataset_root", str(tmp_path / "none"), "--results_dir", str(tmp_path), "-dev", "cpu"]
    assert main.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == (f"error: {tmp_path / 'Digits_FedAvg_test_0.h5'} already exists; pass --overwrite to "
                           f"replace it, --resume to continue it, or -go test3 to keep both")
    assert not (tmp_path / "none").exists()  # not generated


def test_offline_download_names_the_folder_and_leaves_nothing(tmp_path, monkeypatch):
    from torchvision import datasets

    from dataset import generate_MNIST
    from dataset.utils.dataset_utils import DatasetError

    def offline(root, train, download):
        (Path(root) / "MNIST" / "raw").mkdir(parents=True, exist_ok=True)  # as torchvision does before fetching
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(datasets, "MNIST", offline)
    root = tmp_path / "data"
    root.mkdir()
    with pytest.raises(DatasetError, match=r"pass --source FILE\.npz .*README's 'Generating client splits'"):
        generate_MNIST.main(["--root", str(root)])
    assert not list(root.iterdir())  # no empty MNIST/rawdata left behind


def test_list_shows_the_default_split_of_emnist():
    from dataset import generate

    assert generate.describe("EMNIST")[2] == 10
    assert generate.describe("FEMNIST")[2] == 62


# ---- repeatable runs --------------------------------------------------------------------------------------
def test_config_file_values_with_command_line_overrides(digits_tiny_root, tmp_path):
    """A JSON file sets -gr, -lr, -algo and a switch; -lr on the command line wins; the sidecar records the
    file; an unknown key and a nested value are refused with one line."""
    import json

    cfg_file = tmp_path / "run.json"
    cfg_file.write_text(json.dumps({"algorithm": "FedProx", "global_rounds": 1, "local_learning_rate": 0.2,
                                    "mu": 0.3, "learning_rate_decay": True, "progress": False, "num_classes": None}))
    cfg = parse_config(["--config", str(cfg_file), "-lr", "0.05"])
    assert (cfg.algorithm, cfg.global_rounds, cfg.local_learning_rate, cfg.mu) == ("FedProx", 1, 0.05, 0.3)
    assert cfg.learning_rate_decay is True and cfg.progress is False and cfg.config == str(cfg_file)
    out = tmp_path / "out"
    assert main.main(cli(digits_tiny_root, out, "--config", str(cfg_file), "--train_loss_eval", "off")) == 0
    side = json.loads((out / "Digits_FedProx_test_0.json").read_text())
    assert side["config_file"] == {"path": str(cfg_file), "values": json.loads(cfg_file.read_text())}
    assert side["config"]["mu"] == 0.3 and side["evaluations"] == 2
    for bad, message in (({"rounds": 3}, "'rounds' is not a flag of -algo FedAvg"),
                         ({"global_rounds": [3]}, "'global_rounds' must be a single value")):
        cfg_file.write_text(json.dumps(bad))
        with pytest.raises(main.FLError, match=message):
            parse_config(["--config", str(cfg_file)])


@pytest.mark.optional_deps("yaml")
def test_yaml_config_file(tmp_path):
    (tmp_path / "run.yaml").write_text("global_rounds: 7\nalgorithm: FedALA\nala_clients: all\n")
    cfg = parse_config(["--config", str(tmp_path / "run.yaml")])
    assert (cfg.global_rounds, cfg.algorithm, cfg.ala_clients) == (7, "FedALA", "all")
    (tmp_path / "bad.yaml").write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(main.FLError, match="not valid YAML"):  # the safe loader builds no objects
        parse_config(["--config", str(tmp_path / "bad.yaml")])


@pytest.mark.optional_deps("tensorboard")
def test_tensorboard_logs_every_series(digits_tiny_root, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "2", "--tensorboard", "tb", "--val_ratio", "0.2",
                         "--executor", "sequential")) == 0
    h5 = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")
    events = EventAccumulator(str(tmp_path / "tb" / "Digits_FedAvg_test_0")).Reload()
    for name in ("test_acc", "val_acc", "test_acc_min", "train_loss"):
        logged = events.Scalars(name)
        assert [e.step for e in logged] == [0, 1, 2]
        assert [e.value for e in logged] == pytest.approx(h5[f"rs_{name}"].tolist(), rel=1e-6)
