"""Clients with different models (``--client_models``): the assignment and its JSON map, the per-algorithm
declaration over the whole registry, the refusal of the averaging algorithms, the architectures each
client really trains and the shapes they share, a two-architecture run of every algorithm that takes the
flag, resume, executors, what crosses the wire, and -dp, parking (--client_state disk) and -dlg on each
client's own architecture. Runs: 1-3 rounds on the 5-client tiny Digits split."""
import json

import numpy as np
import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.registry import ALGORITHMS, get_server_class
from flcore.servers.serverbase import Server
from flcore.trainmodel import models
from flcore.trainmodel.assign import PRESETS, assign, read_client_models
from flcore.trainmodel.parts import shared_shapes
from utils.data_utils import load_split
from utils.errors import FLError
from utils.model_support import ModelSupport, support_table
from utils.results import read_h5

# What each model-heterogeneous algorithm exchanges, by hand from its paper (README's table): the part whose
# shape must agree, and whether a client's own architecture is a personal model beside the shared -m model.
SUPPORTED = {"Local": ("", False), "FD": ("logits", False), "FedProto": ("features", False),
             "FedPCL": ("features", False), "FedGH": ("head", False), "LG-FedAvg": ("head", False),
             "FML": ("logits", True), "FedKD": ("logits", True)}
TWO = ("--client_models", "CNN1,CNN3")  # client i trains CNN1 (one convolution) for even i, CNN3 (three) for odd i
FAST = ("-lr", "0.1", "-lbs", "20")


def one_line_error(capsys, argv: list[str]) -> str:
    """The run's exit code must be 2 with exactly one line on stderr; returns it."""
    assert main.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


# ---- the assignment ------------------------------------------------------------------------------------
def test_a_list_is_assigned_in_turn_and_a_preset_is_a_list():
    assert assign(read_client_models("CNN1, cnn ,ResNet-10"), 7) == ["CNN1", "CNN", "ResNet10", "CNN1", "CNN",
                                                                     "ResNet10", "CNN1"]
    assert read_client_models("HtFE-img") == ("CNN1", "CNN", "CNN3", "ResNet10") == PRESETS["HtFE-img"]
    assert assign(read_client_models("HtFE-text"), 2) == ["fastText", "TextCNN"]


def test_a_json_map_assigns_each_client(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"2": "CNN", "0": "ResNet10", "1": "cnn3"}))
    assert assign(read_client_models(str(path)), 3) == ["ResNet10", "CNN3", "CNN"]


BAD_MAPS = {
    "not JSON": ("{'0': 'CNN'}", "not valid JSON"),
    "a list": ('["CNN", "CNN1"]', "one non-empty JSON object"),
    "empty": ("{}", "one non-empty JSON object"),
    "a name as id": ('{"a": "CNN"}', "'a' is not a client id"),
    "a negative id": ('{"-1": "CNN"}', "'-1' is not a client id"),
    "a repeated id": ('{"0": "CNN", "0": "CNN1"}', "client '0' is listed twice"),
    "one id twice": ('{"0": "CNN", "00": "CNN1"}', "client 0 is listed twice"),
    "not a name": ('{"0": 3}', "client 0 maps to 3"),
    "an unknown model": ('{"0": "VGG"}', "unknown model 'VGG' for client 0"),
    "a missing client": ('{"0": "CNN", "1": "CNN", "3": "CNN", "4": "CNN"}', "no model for client(s) 2"),
    "an extra client": ('{"0": "CNN", "1": "CNN", "2": "CNN", "3": "CNN", "4": "CNN", "5": "CNN"}',
                        "names client(s) 5"),
}


@pytest.mark.parametrize("case", BAD_MAPS, ids=list(BAD_MAPS))
def test_a_bad_json_map_ends_with_one_line(case, digits_tiny_root, tmp_path, capsys):
    text, message = BAD_MAPS[case]
    path = tmp_path / "models.json"
    path.write_text(text)
    err = one_line_error(capsys, cli(digits_tiny_root, tmp_path / "out", "-algo", "Local", "-gr", "1",
                                     "--client_models", str(path)))
    assert message in err, err
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # nothing written


@pytest.mark.parametrize("value, message", [("CNN,,CNN1", "a comma list"), ("VGG,CNN", "unknown model 'VGG'"),
                                            ("missing.json", "does not exist")])
def test_a_bad_list_or_file_ends_with_one_line(value, message, digits_tiny_root, tmp_path, capsys):
    err = one_line_error(capsys, cli(digits_tiny_root, tmp_path, "-algo", "Local", "-gr", "1",
                                     "--client_models", str(tmp_path / value) if value.endswith(".json") else value))
    assert message in err, err


# ---- the declaration and the refusal -----------------------------------------------------------------
def test_the_declaration_covers_every_registered_algorithm(digits_tiny_root, tmp_path):
    """Every algorithm declares (once, its server's ``model_support``) whether it takes different
    architectures; exactly those of SUPPORTED do, as they say; every other one is refused at start-up with its
    reason, before any data is read."""
    for name in ALGORITHMS:
        support = get_server_class(name).declares.model_support
        assert isinstance(support, ModelSupport), name
        if name in SUPPORTED:
            assert not support.refusal and (support.same_shape, support.personal) == SUPPORTED[name], name
            assert support.shares, name
            parse_config(cli(digits_tiny_root, tmp_path, "-algo", name, *TWO))
        else:
            assert support.refusal, name
            with pytest.raises(FLError, match=f"--client_models: {name} is refused: its server averages") as e:
                parse_config(cli(digits_tiny_root, tmp_path, "-algo", name, *TWO))
            assert "\n" not in str(e.value)


def test_fedavg_refuses_client_models(digits_tiny_root, tmp_path, capsys):
    err = one_line_error(capsys, cli(digits_tiny_root, tmp_path, "-algo", "FedAvg", "-gr", "1", *TWO))
    assert "FedAvg is refused: its server averages model entries across clients" in err
    assert not list(tmp_path.glob("*.h5"))


def test_readme_lists_the_algorithms_that_take_client_models():
    from pathlib import Path

    table = support_table({n: get_server_class(n) for n in ALGORITHMS})
    assert [line.split(" | ")[0][2:] for line in table.splitlines()[2:]] == [a for a in ALGORITHMS if a in SUPPORTED]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert table in readme


# ---- the models each client trains, and what they share ------------------------------------------------
def conv_count(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Conv2d) for m in model.modules())


def server_for(algo: str, root, *extra) -> Server:
    cfg = parse_config(cli(root, root, "--executor", "sequential", "-algo", algo, "-fd", "48", *TWO, *extra))
    return get_server_class(algo)(cfg.replace(num_classes=10), load_split("Digits", root))


@pytest.mark.parametrize("algo", sorted(SUPPORTED))
def test_each_client_trains_its_own_architecture_with_features_of_one_width(algo, digits_tiny_root):
    server = server_for(algo, digits_tiny_root)
    same_shape, personal = SUPPORTED[algo]
    x = server.clients[0].x_train[:3]
    glob = server.global_model.state_dict()
    for c in server.clients:
        own = getattr(c, {"FML": "local", "FedKD": "mentor"}.get(algo, "model"))
        assert conv_count(own) == (1 if c.id % 2 == 0 else 3), (algo, c.id)  # CNN1, CNN3, CNN1, ...
        assert shared_shapes(own, "features", x) == {"features": (48,)}  # -fd 48 on every architecture
        # FedPCL's model is the representation network (its head the identity): its output is the features
        assert shared_shapes(own, "logits", x) == {"logits": (48 if algo == "FedPCL" else 10,)}
        if same_shape == "head":  # the head has the server's shape: 48 x 10 and 10
            assert shared_shapes(own, "head", x) == {"weight": (10, 48), "bias": (10,)}
            assert {k: v.shape for k, v in c.model.head.state_dict().items()} == \
                {k[5:]: v.shape for k, v in glob.items() if k.startswith("head.")}
        if personal:  # the shared model is -m (the 4-layer CNN, two convolutions) on every client
            assert conv_count(c.model) == 2
            assert {k: v.shape for k, v in c.model.state_dict().items()} == {k: v.shape for k, v in glob.items()}


def test_a_shared_part_of_two_shapes_is_refused_at_start_up(digits_tiny_root, monkeypatch):
    """The start-up check compares the shared part over every architecture and the server's model: one
    architecture whose classifier ignores -fd stops the run with one line naming it."""
    import flcore.building as building

    build = building.build_client_model

    def cnn3_ignores_fd(name, shape, classes, fd, *args, **kwargs):
        return build(name, shape, classes, fd + 16 if name == "CNN3" else fd, *args, **kwargs)

    monkeypatch.setattr(building, "build_client_model", cnn3_ignores_fd)
    for algo, part in [("LG-FedAvg", "head"), ("FedProto", "features")]:
        with pytest.raises(FLError, match=f"exchanges {part} of one shape, but CNN1 gives .*48.* and CNN3 gives .*64"):
            server_for(algo, digits_tiny_root)
    server_for("Local", digits_tiny_root)  # shares nothing: nothing to compare


def test_projected_model_exposes_the_common_width():
    """A model whose classifier takes another width gets a projection to -fd and a new fc (ResNet-10's 512,
    MobileNetV2's 1280); one that -fd sizes is built at -fd and left as it is."""
    resnet = models.build_client_model("ResNet10", (1, 28, 28), 10, 64)
    assert isinstance(resnet, models.ProjectedModel) and resnet.proj[0].in_features == 512
    assert (resnet.fc.in_features, resnet.fc.out_features) == (64, 10)
    assert resnet(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    cnn = models.build_client_model("CNN", (1, 28, 28), 10, 64)
    assert type(cnn) is models.FedAvgCNN and cnn.fc1[0].out_features == 64
    text = models.build_client_model("TextCNN", (30,), 4, 32, config={"modality": "text", "vocab_size": 50})
    assert isinstance(text, models.ProjectedModel) and text.proj[0].in_features == 300
    assert text(torch.ones(2, 30, dtype=torch.long)).shape == (2, 4)


# ---- runs ----------------------------------------------------------------------------------------------
def final_acc(out, algo) -> float:
    return float(read_h5(out / f"Digits_{algo}_test_0.h5")["rs_test_acc"][-1])


@pytest.mark.parametrize("algo", sorted(SUPPORTED))
def test_two_architectures_learn(algo, digits_tiny_root, tmp_path):
    """3 rounds on CNN1 / CNN3 clients: well above chance (0.1; the tiny split's clients hold 3-10 classes)."""
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", algo, "-gr", "3", "-lr", "0.1", *TWO)) == 0
    assert final_acc(tmp_path, algo) > 0.4, algo
    meta = json.loads((tmp_path / f"Digits_{algo}_test_0.json").read_text())
    assert meta["client_models_built"] == ["CNN1", "CNN3", "CNN1", "CNN3", "CNN1"]


def series(out, algo) -> dict:
    return {k: v for k, v in read_h5(out / f"Digits_{algo}_test_0.h5").items() if k != "rs_round_time"}


@pytest.mark.parametrize("algo, extra", [("LG-FedAvg", ()), ("FedKD", ("--client_state", "cpu"))])
def test_resume_and_executors_give_the_uninterrupted_sequential_run(algo, extra, digits_tiny_root, tmp_path,
                                                                    stop_in_round):
    """Bit for bit: a fork run crashed in round 2 and resumed from its checkpoint equals the sequential run
    (the server's head and the clients' personal models of two architectures survive the checkpoint)."""
    torch.set_num_threads(1)  # as in the fork workers: the same kernels on both sides
    flags = ("-algo", algo, "-gr", "3", "-jr", "0.6", "--checkpoint_every", "2", *FAST, *TWO, *extra)
    assert main.main(cli(digits_tiny_root, tmp_path / "seq", *flags, "--executor", "sequential")) == 0
    stop_in_round(2)
    with pytest.raises(RuntimeError, match="killed"):
        main.main(cli(digits_tiny_root, tmp_path / "fork", *flags, "--executor", "fork", "--workers", "2"))
    stop_in_round(None)
    assert main.main(cli(digits_tiny_root, tmp_path / "fork", *flags, "--executor", "fork", "--workers", "2",
                         "--resume")) == 0
    a, b = series(tmp_path / "seq", algo), series(tmp_path / "fork", algo)
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), k


def test_lg_fedavg_sends_only_the_head_of_one_shape(digits_tiny_root, tmp_path):
    """Bytes per round: down, the global head (48 x 10 + 10 floats) to each of the 5 clients; up, the same
    from each, whatever body each client has."""
    assert main.main(cli(digits_tiny_root, tmp_path, "-algo", "LG-FedAvg", "-gr", "1", "-fd", "48", *FAST, *TWO)) == 0
    got = read_h5(tmp_path / "Digits_LG-FedAvg_test_0.h5")
    head = (48 * 10 + 10) * 4
    assert got["rs_bytes_down"][0] == pytest.approx(5 * head, rel=0.05)
    assert got["rs_bytes_up"][0] == pytest.approx(5 * head, rel=0.05)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_builds_features_of_the_common_width(preset):
    text = preset.endswith("text")
    shape, config = ((20,), {"modality": "text", "vocab_size": 50}) if text else ((3, 32, 32), None)
    x = torch.ones(2, 20, dtype=torch.long) if text else torch.zeros(2, 3, 32, 32)
    for name in PRESETS[preset]:
        model = models.build_client_model(name, shape, 7, 32, config=config)
        assert shared_shapes(model, "features", x) == {"features": (32,)}, name
        assert shared_shapes(model, "logits", x) == {"logits": (7,)}, name


@pytest.mark.optional_deps("ray")
def test_ray_gives_the_sequential_numbers(digits_tiny_root, tmp_path):
    torch.set_num_threads(1)
    flags = ("-algo", "FedKD", "-gr", "2", *FAST, *TWO)
    assert main.main(cli(digits_tiny_root, tmp_path / "seq", *flags, "--executor", "sequential")) == 0
    assert main.main(cli(digits_tiny_root, tmp_path / "ray", *flags, "--executor", "ray", "--workers", "2")) == 0
    a, b = series(tmp_path / "seq", "FedKD"), series(tmp_path / "ray", "FedKD")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


# ---- -dp, parking and -dlg with different architectures -----------------------------------------------
# -dp by hand from docs/privacy.md: these four upload statistics of the private data (prototypes, class-mean
# representations, per-label logits) that DP-SGD does not privatise, so they refuse it; the other four
# train with DP-SGD on every module their optimizer steps.
DP_REFUSED = {"FedGH", "FD", "FedProto", "FedPCL"}
OWN = {"FML": "local", "FedKD": "mentor"}  # the attribute holding a client's own architecture (else model)


def own_convs(cid: int) -> int:
    """Convolutions of client ``cid``'s own architecture under TWO: CNN1 for even ids, CNN3 for odd."""
    return 1 if cid % 2 == 0 else 3


@pytest.mark.optional_deps("opacus")
@pytest.mark.parametrize("algo", sorted(SUPPORTED))
def test_dp_trains_each_clients_own_architecture_or_is_refused_with_one_line(algo, digits_tiny_root, tmp_path,
                                                                            capsys, monkeypatch):
    """-dp with --client_models: the four algorithms that upload data statistics stop at start-up with one
    line (exit 2, nothing written); the others finish 2 rounds in which every client's DP-SGD steps reach its
    own architecture (CNN1 or CNN3; FML's and FedKD's beside the shared 4-layer CNN), with a finite epsilon."""
    from utils import dp_sgd

    assert bool(get_server_class(algo).declares.dp_support.refusal) == (algo in DP_REFUSED)
    flags = cli(digits_tiny_root, tmp_path, "--executor", "sequential", "-algo", algo, "-gr", "2", "-dp",
                "--train_loss_eval", "off", *FAST, *TWO)
    if algo in DP_REFUSED:
        err = one_line_error(capsys, flags)
        assert f"-dp: {algo} is refused" in err and err.endswith("drop -dp"), err
        assert not [p for p in tmp_path.rglob("*") if p.is_file()]
        return
    stepped: dict[int, set] = {}  # client id -> {(module name, its convolutions)} of every DP-SGD step
    backward = dp_sgd.dp_backward

    def counting(client, objective, optimizer, x, y, modules=None, noise=None):
        named = dp_sgd.dp_modules(client) if modules is None else modules
        stepped.setdefault(client.id, set()).update((k, conv_count(m)) for k, m in named.items())
        return backward(client, objective, optimizer, x, y, modules, noise)

    monkeypatch.setattr(dp_sgd, "dp_backward", counting)
    assert main.main(flags) == 0
    for cid in range(5):
        assert (OWN.get(algo, "model"), own_convs(cid)) in stepped[cid], (algo, cid, stepped[cid])
        if algo in OWN:  # the shared model (-m CNN: two convolutions) is privatised too
            assert ("model", 2) in stepped[cid], (algo, cid, stepped[cid])
    eps = read_h5(tmp_path / f"Digits_{algo}_test_0.h5")["rs_dp_epsilon_max"]
    assert len(eps) == 3 and eps[0] == 0 and 0 < eps[1] < eps[2] < np.inf, eps  # rounds 0, 1, 2


@pytest.mark.parametrize("algo", sorted(SUPPORTED))
def test_clients_parked_on_disk_give_the_unparked_curve(algo, digits_tiny_root, tmp_path, monkeypatch):
    """--client_state disk with 3 of the 5 clients a round: idle clients of both architectures are parked
    (their state written to a file, the objects dropped) and rebuilt, and the run's every series is the
    unparked run's, bit for bit."""
    from runtime.parking import ClientStore

    flags = ("--executor", "sequential", "-algo", algo, "-gr", "2", "-jr", "0.6", *FAST, *TWO)
    assert main.main(cli(digits_tiny_root, tmp_path / "live", *flags)) == 0
    rebuilt: dict[int, int] = {}  # client id -> convolutions of its own architecture once unparked
    unpark = ClientStore.unpark

    def counting(store, c):
        unpark(store, c)
        rebuilt[c.id] = conv_count(getattr(c, OWN.get(algo, "model")))

    monkeypatch.setattr(ClientStore, "unpark", counting)
    assert main.main(cli(digits_tiny_root, tmp_path / "disk", *flags, "--client_state", "disk",
                         "--client_state_dir", str(tmp_path / "parked"))) == 0
    assert {cid % 2 for cid in rebuilt} == {0, 1}, rebuilt  # clients of both architectures went to disk and back
    assert all(n == own_convs(cid) for cid, n in rebuilt.items()), rebuilt
    a, b = series(tmp_path / "live", algo), series(tmp_path / "disk", algo)
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), (algo, k)


@pytest.mark.parametrize("algo", sorted(set(SUPPORTED) - {"FedPCL"}))
def test_dlg_attacks_the_model_each_client_trains(algo, digits_tiny_root, tmp_path, monkeypatch):
    """-dlg with --client_models: every client is attacked in round 0 on the model it starts the round from,
    of its own architecture (CNN1 or CNN3), or for FML and FedKD the shared 4-layer CNN, the one they
    upload; the run records the attack's scores and writes its figure."""
    from utils.privacy_monitor import PrivacyMonitor

    attacked: dict[int, tuple] = {}
    attack = PrivacyMonitor._attack_client

    def recording(monitor, round_idx, client, start, upload):
        shapes = lambda m: [tuple(p.shape) for p in m.parameters()]  # noqa: E731
        attacked[client.id] = (conv_count(start), shapes(start) == shapes(client.model))
        return attack(monitor, round_idx, client, start, upload)

    monkeypatch.setattr(PrivacyMonitor, "_attack_client", recording)
    assert main.main(cli(digits_tiny_root, tmp_path, "--executor", "sequential", "-algo", algo, "-gr", "1",
                         "-dlg", "-dlgg", "1", "--dlg_clients", "5", "--dlg_iters", "3", "-bnpc", "1",
                         "--train_loss_eval", "off", *FAST, *TWO)) == 0
    want = {cid: (2 if algo in OWN else own_convs(cid), True) for cid in range(5)}
    assert attacked == want, algo
    got = read_h5(tmp_path / f"Digits_{algo}_test_0.h5")
    assert list(got["rs_dlg_round"]) == [0] and got["rs_dlg_images"][0] == 5
    assert np.isfinite(got["rs_dlg_psnr"][0]) and np.isfinite(got["rs_dlg_ssim"][0])
    assert (tmp_path / f"Digits_{algo}_test_0_dlg_r0.png").exists()


@pytest.mark.parametrize("extra", [(), TWO], ids=["one model", "two architectures"])
def test_fedpcl_refuses_dlg_with_one_line(extra, digits_tiny_root, tmp_path, capsys):
    """FedPCL's model outputs representations, not class scores: -dlg has no cross-entropy gradient to match,
    so it is refused at start-up instead of failing in round 0."""
    err = one_line_error(capsys, cli(digits_tiny_root, tmp_path, "-algo", "FedPCL", "-gr", "1", "-dlg", *extra))
    assert "-dlg: FedPCL is refused" in err and err.endswith("drop -dlg"), err
