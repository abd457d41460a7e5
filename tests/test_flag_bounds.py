"""Every algorithm's own flag bounds (its server's ``check_config``), each tested at the bound and just past it.

For each bounded flag: the values just outside its range are refused with one line naming the flag, each with
every other flag at its default (so a check joined to another by the wrong ``and`` / ``or`` shows), and the
bound itself is accepted (so ``<`` against ``<=`` shows); every refused value lies within one unit of its bound
(so a bound moved by one shows too).
"""
import pytest

from cli import parse_config
from conftest import cli
from utils.errors import FLError

# algorithm: [(flag, values refused, values accepted, other flags the check needs)]; each value alone
BOUNDS = {
    "FedAvg-C": [("-fte", ["0"], ["1"], ())],
    "FedProx-C": [("-fte", ["0"], ["1"], ()), ("-mu", ["-0.5"], ["0"], ())],
    "FedProx": [("-mu", ["-0.5"], ["0"], ())],
    "FedRep": [("-pls", ["-1"], ["0"], ())],
    "Ditto": [("-mu", ["-0.5"], ["0"], ()), ("-pls", ["0"], ["1"], ())],
    "Per-FedAvg": [("-bt", ["-0.5"], ["0", "0.5"], ())],
    "pFedMe": [("-K", ["0"], ["1"], ()), ("-lam", ["-0.5"], ["0"], ()), ("-lrp", ["0"], ["0.5"], ()),
               ("-bt", ["0"], ["0.5"], ())],
    "FedAMP": [("-alk", ["0"], ["0.5"], ()), ("-sg", ["0"], ["0.5"], ()), ("-lam", ["-0.5"], ["0"], ()),
               ("--xi_ii", ["-0.5", "1.5"], ["0", "1"], ("--amp_kernel", "heur"))],
    "APFL": [("-al", ["-0.5", "1.5"], ["0", "1"], ())],
    "APPLE": [("-dlr", ["-0.5"], ["0"], ()), ("-mu", ["-0.5"], ["0"], ()), ("-L", ["-0.5", "1.5"], ["0", "1"], ()),
              ("--core_lr_scale", ["0"], ["0.5"], ()), ("--sgd_momentum", ["-0.5", "1"], ["0", "0.5"], ())],
    "FedFomo": [("-M", ["0"], ["1"], ()), ("--val_ratio", ["0"], ["0.5"], ()),
                ("--epsilon", ["-0.5", "1.5"], ["0", "1"], ()), ("--epsilon_decay", ["-0.5"], ["0"], ())],
    "PartialFed": [("--tau", ["0"], ["0.5"], ()), ("--tau_decay", ["0", "1.5"], ["0.5", "1"], ()),
                   ("--strategy_lr", ["-0.5"], ["0"], ()), ("--strategy_percent", ["-0.5", "1"], ["0", "0.5"], ()),
                   ("--strategy_prior", ["0", "1"], ["0.5"], ())],
    "FedDyn": [("-al", ["0"], ["0.5"], ())],
    "FedLC": [("-tau", ["-0.5"], ["0"], ())],
    "FedNTD": [("-bt", ["-0.5"], ["0"], ()), ("-tau", ["0"], ["0.5"], ())],
    "FedPHP": [("-mu", ["-0.5", "1.5"], ["0", "1"], ()), ("-lam", ["-0.5", "1.5"], ["0", "1"], ()),
               ("--kd_temperature", ["0"], ["0.5"], ())],
    "MOON": [("-mu", ["-0.5"], ["0"], ()), ("-tau", ["0"], ["0.5"], ())],
    "FedGen": [("-nd", ["0"], ["1"], ()), ("-hd", ["0"], ["1"], ()), ("--gen_batch_size", ["0"], ["1"], ()),
               ("-se", ["-1"], ["0"], ()), ("-glr", ["0"], ["0.5"], ()), ("--generative_alpha", ["-0.5"], ["0"], ()),
               ("--diversity_weight", ["-0.5"], ["0"], ())],
    "FedMTL": [("-lam", ["-0.5"], ["0"], ()), ("--lamda2", ["-0.5"], ["0"], ())],
    "FedCross": [("-ca", ["-0.5", "1.5"], ["0", "1"], ()), ("-fsb", ["-1"], ["0"], ())],
    "FedCP": [("-lam", ["-0.5"], ["0"], ())],
    "GPFL": [("-lam", ["-0.5"], ["0"], ()), ("-mu", ["-0.5"], ["0"], ())],
    "FedDBE": [("-mo", ["0", "1.5"], ["0.5", "1"], ()), ("-klw", ["-0.5"], ["0"], ())],
    "FedCAC": [("-tau", ["0", "1.5"], ["0.5", "1"], ()), ("-bt", ["0"], ["0.5"], ())],
    "FedAS": [("--align_lr", ["0"], ["0.5"], ()), ("--align_epochs", ["-1"], ["0"], ()),
              ("--align_batch_size", ["0"], ["1"], ())],
    "FD": [("-lam", ["-0.5"], ["0"], ())],
    "FML": [("-al", ["-0.5", "1.5"], ["0", "1"], ()), ("-bt", ["-0.5", "1.5"], ["0", "1"], ())],
    "FedKD": [("-Ts", ["0", "0.9"], ["0.5", "0.8"], ("-Te", "0.8")), ("-Te", ["1.5"], ["1"], ()),
              ("-mlr", ["0"], ["0.5"], ())],
    "FedProto": [("-lam", ["-0.5"], ["0"], ())],
    "FedPCL": [("-tau", ["0"], ["0.5"], ())],
    "FedGC": [("-lam", ["-0.5"], ["0"], ())],
    "FedPAC": [("-lam", ["-0.5"], ["0"], ()), ("-pls", ["-1"], ["0"], ())],
    "PFL-DA": [("-lam", ["-0.5"], ["0"], ())],
}
CASES = [pytest.param(algo, flag, value, refused, extra, id=f"{algo}{flag}={value}")
         for algo, flags in BOUNDS.items() for flag, bad, good, extra in flags
         for values, refused in ((bad, True), (good, False)) for value in values]


def parse(root, algo, *flags):
    return parse_config(cli(root, root, "-algo", algo, *flags))


@pytest.mark.parametrize("algo, flag, value, refused, extra", CASES)
def test_each_bound_refuses_just_past_it_and_accepts_it(digits_root, algo, flag, value, refused, extra):
    if refused:
        with pytest.raises(FLError) as e:
            parse(digits_root, algo, *extra, flag, value)
        assert flag in str(e.value) and "\n" not in str(e.value)
    else:
        assert parse(digits_root, algo, *extra, flag, value) is not None


def test_amp_self_weight_needs_the_heuristic_kernel(digits_root):
    with pytest.raises(FLError, match="--xi_ii sets HeurFedAMP's self-weight"):
        parse(digits_root, "FedAMP", "--amp_kernel", "euclid", "--xi_ii", "0.5")
    assert parse(digits_root, "FedAMP", "--amp_kernel", "euclid").amp_kernel == "euclid"
