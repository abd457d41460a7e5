"""One evaluation rule with -jr < 1, the last evaluation included: every client receives the broadcast; the
round's selected clients run ALA (every client with --ala_clients all, as PFLlib), the others are
evaluated on their own model. Checked by recording who ran ALA before each evaluation."""
import pytest

from cli import parse_config
from conftest import cli
from flcore.registry import get_server_class
from utils.ALA import ALA
from utils.data_utils import load_split
from runtime import loop


@pytest.mark.parametrize("who", ["selected", "all"])
def test_every_evaluation_runs_ala_by_one_rule(who, digits_root, monkeypatch):
    cfg = parse_config(cli(digits_root, digits_root, "--executor", "sequential", "-algo", "FedALA", "-jr", "0.4",
                                "-gr", "4", "-lbs", "20", "--train_loss_eval", "off", "--ala_max_epochs", "2",
                                "--ala_clients", who))
    server = get_server_class("FedALA")(cfg.replace(num_classes=10), load_split("Digits", digits_root))
    ran: list[int] = []  # ids of the clients whose ALA ran since the last evaluation
    calls = {"ALA": ran}
    owner = {id(c.ala): c.id for c in server.clients}
    aggregation = ALA.adaptive_local_aggregation

    def spy(self, *args, **kwargs):
        calls["ALA"].append(owner[id(self)])
        return aggregation(self, *args, **kwargs)

    monkeypatch.setattr(ALA, "adaptive_local_aggregation", spy)
    seen, trained = [], set()
    evaluate, train = loop.evaluate, loop.train_clients

    def check_then_evaluate(srv):
        chosen = {c.id for c in server.selected}
        assert len(chosen) == 2  # int(0.4 * 5)
        expected = trained if who == "all" else chosen & trained  # never-trained clients take Θ as is
        seen.append((server.round_idx, sorted(ran), sorted(expected)))
        ran.clear()
        return evaluate(srv)

    def record_training(srv, clients):
        trained.update(c.id for c in clients)
        train(srv, clients)

    monkeypatch.setattr(loop, "evaluate", check_then_evaluate)
    monkeypatch.setattr(loop, "train_clients", record_training)
    loop.train(server)
    assert [r for r, _, _ in seen] == [0, 1, 2, 3, 4]  # four rounds and the final evaluation
    for r, got, want in seen:
        assert got == want, (r, got, want)
    assert any(got for _, got, _ in seen[1:])  # ALA did run
    if who == "selected":
        assert len(seen[-1][1]) <= 2  # the final evaluation too: only the selected clients
