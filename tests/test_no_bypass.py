"""No bypass of the robust rule, for the whole registry: under a non-mean ``--aggregator`` every algorithm
either is refused at start-up with one line (its ``averaging_refusal`` or ``robust_refusal``) or runs a round
in which its server reads no upload's content outside ``Server.average_uploads``: the uploads its
``aggregate`` receives are sealed (``utils/entries.SealedUpload``) and reading one stops the run."""
from __future__ import annotations

import pytest

from cli import parse_config
from conftest import build_server, cli
from flcore.registry import ALGORITHMS, get_server_class
from utils.entries import SealedUpload
from utils.errors import FLError
from runtime import loop

FLAGS = {"FedCP": ["-lam", "1"]}  # as tests/test_behaviour.py: Digits' small features need a smaller λ


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_under_a_robust_rule_every_algorithm_is_refused_or_reads_uploads_only_through_the_seam(
        algo, digits_tiny_root, tmp_path):
    server_cls = get_server_class(algo)
    refusal = server_cls.declares.averaging_refusal or server_cls.declares.robust_refusal
    flags = ["-algo", algo, "--aggregator", "median", *FLAGS.get(algo, [])]
    if refusal:
        with pytest.raises(FLError, match=f"^--aggregator: {algo} cannot take it: "):
            parse_config(cli(digits_tiny_root, tmp_path, *flags))
        return
    server = build_server(digits_tiny_root, tmp_path, *flags, "--train_loss_eval", "off", "-ls", "1")
    seen = []
    aggregate = server.aggregate

    def watched(uploads):
        seen.extend(uploads)
        aggregate(uploads)

    server.aggregate = watched
    loop.run_round(server, 0)  # a read outside the seam raises FLError here
    assert seen and all(isinstance(u, SealedUpload) for u in seen)
    assert server.averaged


def test_reading_a_sealed_upload_is_one_line_naming_the_fix():
    from flcore.clients.clientbase import Upload

    sealed = SealedUpload(Upload(3, 7.0, {"w": 1}, {"protos": 2}), "--aggregator median: X's server reads")
    assert (sealed.id, sealed.weight, sealed.opened().state) == (3, 7.0, {"w": 1})
    with pytest.raises(FLError, match=r"^--aggregator median: X's server reads its uploads' model entries outside "
                                      r"average_uploads; declare robust_refusal$"):
        sealed.state
    with pytest.raises(FLError, match=r"extras \(protos\) outside average_uploads"):
        sealed.extras
