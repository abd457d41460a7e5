"""Flags -> a validated, read-only Config: the command line of system/main.py, apart from running it.

Importing this module loads neither torch nor any algorithm: ``-h`` lists the common flags, ``-algo X -h``
adds X's own (importing X only). The chosen algorithm's flags come from its server's ``add_args``; the other
algorithms' flags are accepted with a warning (a shared sweep passes ``-mu`` to every algorithm, as PFLlib
allows), read from their source without importing them (flcore/flags.py).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

from flcore.registry import ALGORITHMS, canonical_name, get_server_class
from flcore.trainmodel.names import ALIASES, MODELS
from utils.config import Config
from utils.errors import FLError
from utils.paths import DATASET_ROOT, RESULTS_DIR


def canonical_model(name: str) -> str:
    """A model name or alias in any case (``cnn``, ``resnet18``, ``MobileNetV2``) as registered; unknown names
    come back unchanged."""
    known = {**{a.lower(): m for a, m in ALIASES.items()}, **{m.lower(): m for m in ("auto", *MODELS)}}
    return known.get(name.lower(), name)


def did_you_mean(message: str) -> str:
    """argparse's "invalid choice: 'X' (choose from ...)" with the closest choices put first: ``-algo FedAwg``
    answers "did you mean FedAvg?", ``-m resnet`` names resnet18 and its kin."""
    import difflib

    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not m:
        return message
    choices = re.findall(r"'([^']*)'", m.group(2)) or [c.strip() for c in m.group(2).split(",")]
    folded = {c.lower(): c for c in choices}
    close = [folded[c] for c in difflib.get_close_matches(m.group(1).lower(), list(folded), n=3, cutoff=0.6)]
    close += [c for c in choices if c.lower().startswith(m.group(1).lower()) and c not in close][:3 - len(close)]
    if not close:
        return message
    return (f"{message[:m.start()]}unknown value '{m.group(1)}'; did you mean {' or '.join(close)}? "
            f"(choices: {', '.join(choices)})")


def device_list(text: str) -> str:
    """``-did``: one CUDA device index or a comma-separated list of them (``0``, ``0,1``, ``"0, 2"``),
    written back without spaces or empty entries (``0,2``) so every reader splits it the same way."""
    ids = [d.strip() for d in text.split(",") if d.strip()]
    if not ids or not all(d.isascii() and d.isdigit() for d in ids):
        raise argparse.ArgumentTypeError(f"expected device indices such as 0 or 0,1, got '{text}'")
    return ",".join(str(int(d)) for d in ids)


def parse_bool(text: str) -> bool:
    """A boolean flag's explicit value, as PFLlib's scripts pass them (``-ld True``): true/false/1/0/yes/no/on/off."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false/1/0, got '{text}'")


class BoolFlag(argparse.Action):
    """A switch that also takes an explicit value: ``-ld`` and ``-ld True`` turn it on, ``-ld false`` off.
    Registered as the parser's ``store_true``, so every algorithm's switches behave alike."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):
        super().__init__(option_strings, dest, nargs="?", const=True, default=default, type=parse_bool,
                         required=required, help=help, metavar="BOOL")

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


class OneDefaultFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``-h`` gives every flag exactly one default: ``(default: X)`` appended, unless the help states its
    own ``(default: ...)`` (a value in words, such as "all in the split" for ``-nc``)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default: " in text or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)".lstrip()


def finite_float(text: str) -> float:
    """A number flag's value: NaN and infinities are refused (no rate, weight or threshold means them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got '{text}'")
    return value


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line on stderr (exit code 2), not the whole usage text. No flag is reachable by a
    prefix of its name, ``store_true`` switches accept an explicit value (``BoolFlag``), and every ``type=float``
    flag (an algorithm's too) takes finite numbers only (``finite_float``). ``flags`` lists every flag added
    through ``add_argument`` or a ``flag_group``: what scripts read about the flags (names, defaults, whether
    a value follows; scripts/sweep.py, scripts/table.py)."""

    def __init__(self, *args, **kwargs):
        self.flags: list[argparse.Action] = []
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.register("action", "store_true", BoolFlag)
        self.register("type", float, finite_float)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags.append(action)
        return action

    def flag_group(self, title: str) -> "FlagGroup":
        """An argument group (its own heading in -h) whose flags join ``flags``."""
        return FlagGroup(self.add_argument_group(title), self.flags)

    def error(self, message):
        self.exit(2, f"error: {did_you_mean(message)} (python system/main.py -h lists the flags)\n")

    def _get_option_tuples(self, option_string):
        # argparse matches a single-dash flag by any prefix of its name even with allow_abbrev=False
        # (-fs 3 read as -fsb 3): keep only a one-letter flag with its value attached (-s80).
        return [t for t in super()._get_option_tuples(option_string) if t[1] == option_string[:2]]


class FlagGroup:
    """An argument group that records the flags added to it (``OneLineParser.flag_group``)."""

    def __init__(self, group, flags: list):
        self.group, self.flags = group, flags

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = self.group.add_argument(*args, **kwargs)
        self.flags.append(action)
        return action

    def set_defaults(self, **kwargs) -> None:
        self.group.set_defaults(**kwargs)


def parser_for(name: str | None) -> OneLineParser:
    """``base_parser`` plus the own flags of algorithm ``name`` (none for an unknown name or None)."""
    parser = base_parser()
    if name in ALGORITHMS:
        get_server_class(name).add_args(parser.flag_group(f"{name} flags"))
    return parser


def base_parser() -> OneLineParser:
    p = OneLineParser(description="Personalized federated learning experiments.",
                      formatter_class=OneDefaultFormatter)
    a = p.add_argument
    a("-go", "--goal", default="test", help="free tag, part of the result file name")
    a("-dev", "--device", default="auto", choices=["auto", "cpu", "cuda"],
      help="auto = cuda when available; cuda without a GPU warns and falls back to cpu")
    a("-did", "--device_id", "--devices", default="0", type=device_list,
      help="CUDA device index; with --executor ray a list (0,1,2,3) spreads clients over those GPUs")
    a("-data", "--dataset", default="Digits", help="split folder under the dataset root (see dataset/)")
    a("--dataset_root", default=str(DATASET_ROOT), help="folder holding the generated splits")
    a("--source", default=None, help="local npz (x, y) to generate a missing split from with the generator's settings (default: none)")
    a("-ncl", "-nb", "--num_classes", type=int, default=None,
      help="checked against the split; -nb is the FedALA repository's name (default: taken from the split)")
    a("-m", "--model", default="auto", choices=["auto", *MODELS], type=canonical_model,
      help="a model, by PFLlib's name; auto = the split's default_model, else by its "
           "data: CNN for images, fastText for text, HARCNN for sensor series, DNN for vectors")
    a("-fd", "--feature_dim", type=int, default=512,
      help="embedding/hidden width of the text models (fastText, TextCNN, LSTM, BiLSTM, Transformer d_model; "
           "PFLlib's meaning) and of the CNNs' fc1 layer; the other models have fixed widths, except with "
           "--client_models, where every model's classifier takes -fd features")
    a("--client_models", default=None,
      help="different architectures on different clients: a preset (HtFE-cnn, HtFE-img, HtFE-img-large, "
           "HtFE-text), a comma list of -m names assigned to clients in turn, or a .json file mapping client ids "
           "to names; only algorithms that exchange no whole model take it (README: Clients with different "
           "models) (default: every client trains -m)")
    a("-vs", "--vocab_size", type=int, default=80,
      help="vocabulary size of the text models when the split's config does not record one")
    a("-lbs", "--batch_size", type=int, default=10, help="local batch size")
    a("-lr", "--local_learning_rate", type=float, default=0.005, help="client SGD learning rate")
    a("-ld", "--learning_rate_decay", action="store_true", help="decay lr by -ldg every round")
    a("-ldg", "--learning_rate_decay_gamma", type=float, default=0.99, help="lr factor per round with -ld")
    a("-gr", "--global_rounds", type=int, default=2000, help="communication rounds")
    a("-ls", "--local_epochs", type=int, default=1, help="local epochs per round")
    a("-algo", "--algorithm", default="FedAvg", choices=list(ALGORITHMS), type=canonical_name,
      help="a registered name, PFLlib's spelling (PerAvg, FedROD, ...) or either in any case")
    a("-jr", "--join_ratio", type=float, default=1.0, help="fraction of clients selected per round")
    a("-rjr", "--random_join_ratio", action="store_true", help="draw the count in [jr*N, N] each round")
    a("-nc", "--num_clients", type=int, default=None, help="clients to use (default: all in the split)")
    a("--bn_stats", default="shared", choices=["shared", "local"],
      help="BatchNorm running statistics: shared = averaged with the parameters and received with the "
           "model (FedAvg over the whole state); local = parameters only, every client keeps its own "
           "statistics and ALA leaves them alone (PFLlib)")
    a("-cdr", "--client_drop_rate", type=float, default=0.0, help="probability a selected client drops out")
    a("-pv", "--prev", type=int, default=0, help="first run index (resume a multi-run sweep)")
    a("-t", "--times", type=int, default=1, help="runs are indices prev..times-1 (PFLlib semantics)")
    a("-eg", "--eval_gap", type=int, default=1, help="evaluate every N rounds")
    a("--eval_batch_size", type=int, default=256,
      help="batch size of no-grad evaluation (256: the CNN's activations stay in a CPU's cache; larger "
           "batches were slower on the CPU, docs/performance.md)")
    a("--train_loss_eval", default="full", choices=["full", "sampled", "off"],
      help="train loss over all training data every evaluation (comparable with PFLlib), over a fixed "
           "seeded sample of --train_loss_fraction of each client's data, or not at all")
    a("--train_loss_fraction", type=float, default=0.1,
      help="share of each client's training samples in the sampled train loss (drawn once per run)")
    a("-sfn", "--save_folder_name", default="",
      help="if set, save the final global model's state in this folder under the results folder (a relative "
           "name without '..': a run writes nothing outside --results_dir)")
    a("-ab", "--auto_break", action="store_true", help="stop when the best accuracy is -tc evaluations old")
    a("-tc", "--top_cnt", type=int, default=100, help="evaluations -ab waits for a new best accuracy")
    a("--seed", type=int, default=0, help="run i uses seed + i for every random stream")
    a("--results_dir", default=None, help="where result files go (default: results/ in the repository)")
    a("--config", default=None,
      help="a JSON (or, with PyYAML installed, YAML) file of flag values by their long names (global_rounds: 5; "
           "a sidecar's config works too); flags on the command line override it; recorded in the sidecar "
           "(default: none)")
    a("--tensorboard", default=None,
      help="also log every per-evaluation series to TensorBoard event files in this folder under the results "
           "folder, one subfolder per run (needs the tensorboard package) (default: off)")
    a("--overwrite", action="store_true",
      help="replace existing result files of the same name (without it, a run whose result file exists is refused)")
    a("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm progress bar")
    a("--print_config", action=argparse.BooleanOptionalAction, default=False,
      help="print every setting at start-up, marking values that differ from PFLlib's defaults (without it, "
           "one summary line: the data, the model built, ALA, the schedule and where it runs)")
    g = p.flag_group("evaluation: new clients, few-shot, validation (README: Evaluation)")
    g.add_argument("-nnc", "--num_new_clients", type=int, default=0,
                   help="clients held out of training (the ones after the -nc trained ones; without -nc the "
                        "split's last ones); after training each receives what the algorithm sends, fine-tunes "
                        "-ften epochs on its training data and is evaluated on its test data (PFLlib's flag)")
    g.add_argument("-ften", "--fine_tuning_epoch_new", type=int, default=0,
                   help="fine-tuning epochs of each new client (-nnc) before its evaluation (PFLlib's flag)")
    g.add_argument("-fs", "--few_shot", type=int, default=0,
                   help="keep K training samples of each class per client, drawn from the client's seeded "
                        "stream (PFLlib's flag, which keeps the first K in file order); 0 = all")
    g.add_argument("--val_ratio", type=float, default=0.0,
                   help="share of each client's training data held out (seeded) as a validation split, whose "
                        "accuracy every evaluation records (rs_val_acc) for model selection; 0 = none")
    g = p.flag_group("execution, faults and checkpoints (docs/distributed.md, docs/performance.md)")
    g.add_argument("--executor", default="auto", choices=["auto", "sequential", "fork", "ray", "batched"],
                   help="where clients live: this process; single-thread worker processes forked from it "
                        "(CPU); Ray workers on several devices/machines; batched: this process, the round's "
                        "clients stacked into one computation (GPU; the algorithms that declare it). Same "
                        "numbers on each (batched: up to float rounding). auto = fork on a CPU with several "
                        "cores, batched on CUDA where the algorithm batches, else sequential")
    g.add_argument("--batch_clients", type=int, default=0,
                   help="--executor batched: stack at most this many clients at a time (memory); 0 = all")
    g.add_argument("--cuda_graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="--executor batched on CUDA: capture the stacked training step as a CUDA graph")
    g.add_argument("--workers", type=int, default=0,
                   help="fork or Ray workers holding the clients; 0 = one per CPU core (Ray: per CPU of the "
                        "cluster, or per GPU share)")
    g.add_argument("--ray_address", default=None,
                   help="join this Ray cluster (e.g. auto, or ray://head:10001) (default: start a local one)")
    g.add_argument("--gpus_per_worker", type=float, default=None,
                   help="GPUs per Ray worker (0.5 = two workers share a GPU) (default: 1 on CUDA, else 0)")
    g.add_argument("--max_restarts", type=int, default=3,
                   help="lost workers survived per run (each replays from the last checkpoint)")
    g.add_argument("--client_state", default="device", choices=["device", "cpu", "disk"],
                   help="where idle clients' state lives: on the device, or (only a round's worth of "
                        "clients stay live, in every process holding clients) serialised in CPU memory or "
                        "in files")
    g.add_argument("--client_state_dir", default=None,
                   help="folder for --client_state disk (default: a temporary folder, removed at exit)")
    g.add_argument("-tsr", "--train_slow_rate", type=float, default=0.0,
                   help="fraction of clients that are slow to train (simulated time, PFLlib's flag)")
    g.add_argument("-ssr", "--send_slow_rate", type=float, default=0.0,
                   help="fraction of clients that are slow to send (simulated time, PFLlib's flag)")
    g.add_argument("-tth", "--time_threshold", "--time_threthold", type=float, default=10000,
                   help="seconds of simulated train + send time after which an upload misses the round "
                        "(PFLlib's 10000 too: never); nothing really sleeps")
    g.add_argument("--checkpoint_every", type=int, default=0,
                   help="save server + all client states every N rounds to <results>/<run>.ckpt (0: never)")
    g.add_argument("--resume", action="store_true",
                   help="continue each run from its checkpoint (same flags); runs without one start over")
    g.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"],
                   help="mixed precision for forward passes (bf16: CPU or CUDA; fp16: CUDA, loss-scaled)")
    g = p.flag_group("ALA (adaptive local aggregation, pluggable into any algorithm)")
    g.add_argument("-ala", "--ala", action="store_true", help="initialise local models with ALA")
    g.add_argument("-et", "--eta", type=float, default=1.0, help="ALA weight learning rate η (paper: 1.0)")
    g.add_argument("-s", "--rand_percent", type=int, default=80, help="s: %% of local data for ALA (paper: 80)")
    g.add_argument("-p", "--layer_idx", type=int, default=2,
                   help="ALA adapts the last p parameter tensors, counted as PFLlib counts them (2 = the "
                        "classifier's weight and bias: the paper's p = 1 layer); 0 = all")
    g.add_argument("--ala_layers", type=int, default=None,
                   help="count ALA's p in layers as the FedALA paper does (1 = the classifier; a norm layer joins "
                        "the layer below, a ResNet stage is one layer); given, it replaces -p (default: unset, -p counts)")
    g.add_argument("--ala_threshold", type=float, default=0.1,
                   help="start phase stops when the std of the last --ala_window losses is below this")
    g.add_argument("--ala_window", type=int, default=10, help="number of recent ALA losses in the std")
    g.add_argument("--ala_max_epochs", type=int, default=100, help="cap on start-phase ALA epochs")
    g.add_argument("--ala_clients", default="selected", choices=["selected", "all"],
                   help="who runs ALA on each broadcast: the round's selected clients (the others are evaluated "
                        "on their own last model) or every client, before every evaluation (PFLlib; with -jr < 1 "
                        "ALA then costs N clients per round instead of jr*N)")
    g = p.flag_group("server optimizers, robust aggregation and attacks (any algorithm whose server averages a "
                     "model; README: Server optimizers, Attacks and robust aggregation)")
    g.add_argument("--server_opt", default="off", choices=["off", "sgd", "avgm", "adagrad", "adam", "yogi"],
                   help="step the averaged model as a pseudo-gradient, g = global - aggregate (Reddi et al. 2021; "
                        "avgm: FedAvgM, Hsu et al. 2019); off: the aggregate is the new model")
    g.add_argument("-slr", "--server_learning_rate", type=float, default=None,
                   help="server learning rate η (PFLlib's flag): --server_opt's step size, SCAFFOLD's and FedGH's "
                        "server step (default: 1 for sgd, avgm, SCAFFOLD and FedGH; 0.1 adagrad; 0.01 adam, yogi)")
    g.add_argument("--server_momentum", type=float, default=0.9,
                   help="--server_opt β1 of avgm, adagrad, adam, yogi (Reddi et al. and Hsu et al.: 0.9)")
    g.add_argument("--server_beta2", type=float, default=0.99,
                   help="--server_opt β2 of adam and yogi (Reddi et al.: 0.99)")
    g.add_argument("--server_tau", type=float, default=1e-3,
                   help="--server_opt adaptivity τ of adagrad, adam, yogi (Reddi et al.'s grid 1e-5..1e-1)")
    g.add_argument("--aggregator", default="mean",
                   choices=["mean", "median", "trimmed_mean", "krum", "multikrum", "geomed", "bulyan", "cclip",
                            "normclip"],
                   help="how the uploads are combined: the sample-weighted mean (FedAvg), the coordinate-wise "
                        "median or trimmed mean (Yin et al. 2018), Krum or Multi-Krum (Blanchard et al. 2017), "
                        "the weighted geometric median (Weiszfeld; RFA, Pillutla et al. 2022), Bulyan (El Mhamdi "
                        "et al. 2018), centered clipping (Karimireddy et al. 2021), norm bounding of the updates "
                        "(Sun et al. 2019)")
    g.add_argument("--trim_frac", type=float, default=0.2,
                   help="--aggregator trimmed_mean: share of the uploads dropped at each end, per coordinate")
    g.add_argument("--krum_f", type=int, default=None,
                   help="--aggregator krum / multikrum / bulyan: the number f of Byzantine uploads assumed "
                        "(default: the round's uploads from malicious clients, 0 without --attack)")
    g.add_argument("--cclip_tau", type=float, default=10.0,
                   help="--aggregator cclip: clipping radius τ around the previous aggregate update "
                        "(Karimireddy et al.'s code: 10)")
    g.add_argument("--cclip_iters", type=int, default=1,
                   help="--aggregator cclip: clipping iterations per round (Karimireddy et al.: 1)")
    g.add_argument("--norm_bound", type=float, default=None,
                   help="--aggregator normclip: the bound M on each update's L2 norm (Sun et al. 2019) "
                        "(default: the median of the round's update norms)")
    g.add_argument("--attack", default=None, choices=["signflip", "gaussian", "labelflip", "scaled", "alie", "ipm",
                                                      "minmax", "minsum", "backdoor"],
                   help="malicious clients flip their training labels (y -> C-1-y) or poison their upload: "
                        "W - s(W_i - W), W + N(0, s^2), W + s(W_i - W); omniscient, from the round's benign "
                        "updates: ALIE (Baruch et al. 2019), IPM (Xie et al. 2020), Min-Max / Min-Sum (Shejwalkar "
                        "& Houmansadr 2021); backdoor: a pixel trigger with model replacement (Bagdasaryan et al. "
                        "2020) (default: none)")
    g.add_argument("--attack_frac", type=float, default=None,
                   help="share of the clients that are malicious, a fixed set drawn from --seed "
                        "(default: 0.2 with --attack)")
    g.add_argument("--attack_scale", type=float, default=None,
                   help="s of the upload attacks, IPM's ε, or the backdoor's boost γ (the paper's other IPM setting: "
                        "100; the backdoor's k attackers of a round replace the model together, so one attacker "
                        "boosts by the paper's n / η) (default: per attack: 1 signflip, 1 gaussian, 10 scaled, "
                        "0.1 ipm, n / (η k) backdoor)")
    g.add_argument("--backdoor_target", type=int, default=0,
                   help="--attack backdoor: the class triggered images are labelled and should be classified as")
    g.add_argument("--backdoor_frac", type=float, default=0.3,
                   help="--attack backdoor: share of a malicious client's training images that carry the trigger "
                        "(the rest stay clean: a mix, as in Bagdasaryan et al. 2020)")
    g.add_argument("--trigger_size", type=int, default=3,
                   help="--attack backdoor: side of the full-intensity square trigger in the bottom-right corner")
    g.add_argument("--minmax_perturbation", default="std", choices=["unit_vec", "std", "sign"],
                   help="--attack minmax / minsum: the perturbation vector, inverse unit vector -μ/||μ||, inverse "
                        "std -σ or inverse sign -sign(μ) of the benign updates (Shejwalkar & Houmansadr 2021)")
    g = p.flag_group("privacy (any algorithm): DLG/iDLG evaluation and DP-SGD, see docs/privacy.md")
    g.add_argument("-dlg", "--dlg_eval", action="store_true",
                   help="attack a few clients every -dlgg rounds by gradient inversion (PFLlib's flag)")
    g.add_argument("-dlgg", "--dlg_gap", type=int, default=100, help="attack every N rounds (PFLlib: 100)")
    g.add_argument("-bnpc", "--batch_num_per_client", type=int, default=2,
                   help="attacks per attacked client (PFLlib: 2)")
    g.add_argument("--dlg_clients", type=int, default=2,
                   help="clients attacked per attacked round, drawn from the round's active clients")
    g.add_argument("-dlga", "--dlg_attack", default="dlg", choices=["dlg", "idlg", "ig"],
                   help="DLG (Zhu et al. 2019: inputs and labels), iDLG (Zhao et al. 2020: label from the "
                        "classifier gradient's sign, then inputs) or ig, Inverting Gradients (Geiping et al. 2020: "
                        "cosine matching + total variation, signed Adam, iDLG's label)")
    g.add_argument("--ig_iters", type=int, default=4000,
                   help="-dlga ig: Adam iterations per attack (the reference code's CIFAR-10 setting: 4000)")
    g.add_argument("--ig_tv", type=float, default=1e-4, help="-dlga ig: total-variation weight alpha_TV (the reference code's value)")
    g.add_argument("--dlg_iters", type=int, default=300, help="L-BFGS iterations per attack (DLG paper: 300)")
    g.add_argument("--dlg_batch", type=int, default=1, help="images per attacked batch (DLG paper: 1)")
    g.add_argument("--dlg_target", default="gradient", choices=["gradient", "update"],
                   help="gradient: one true batch gradient of the model the client starts from (the textbook "
                        "threat; DP-SGD-noised with -dp); update: the client's upload as (start - upload) / "
                        "(lr * local steps)")
    g.add_argument("-dp", "--privacy", action="store_true",
                   help="DP-SGD local training: per-sample clipping and Gaussian noise (PFLlib's flag)")
    g.add_argument("-dps", "--dp_sigma", type=float, default=1.0,
                   help="noise multiplier sigma (PFLlib's flag; PFLlib: 0.0, no noise); with "
                        "--dp_level client the multiplier z of the server's noise N(0, z^2 S^2 / m^2)")
    g.add_argument("--dp_clip", type=float, default=1.0,
                   help="per-sample L2 clip norm C (Abadi et al. 2016: 4); with --dp_level client the clip norm S "
                        "of each client's model update (its initial value with --dp_quantile)")
    g.add_argument("--dp_level", default="sample", choices=["sample", "client"],
                   help="sample: DP-SGD on every client (record-level privacy); client: DP-FedAvg (McMahan et al. "
                        "2018), the server clips each client's update to --dp_clip and adds Gaussian noise to their "
                        "unweighted mean (client-level privacy)")
    g.add_argument("--dp_quantile", type=float, default=None,
                   help="--dp_level client: adaptive clipping (Andrew et al. 2021) towards this quantile of the "
                        "update norms (their gamma, e.g. 0.5) (default: off, a fixed clip norm)")
    g.add_argument("--dp_delta", type=float, default=1e-5, help="delta of the reported (epsilon, delta)")
    g.add_argument("--dp_secure_rng", action="store_true",
                   help="seed the DP noise from the OS (secrets) instead of -seed, as a deployment needs (anyone "
                        "with the seed can remove seeded noise); results are then not reproducible")
    return p


OTHER = "other_algorithm__"  # dest prefix of flags that only other algorithms use


def add_other_algorithms_flags(parser: argparse.ArgumentParser, chosen: str) -> dict[str, list[str]]:
    """Every other algorithm's flags (read from their source, flcore/flags.py: no algorithm is imported),
    hidden from -h and never given a default, so they never reach the Config, unless the name is already
    taken by a common flag or an algorithm added before; returns their dest -> flag names."""
    from flcore.flags import algorithm_flags

    group = parser.add_argument_group("flags of other algorithms")
    taken: dict[str, list[str]] = {}
    for name in ALGORITHMS:
        if name == chosen:
            continue
        for spec in algorithm_flags(name):
            kwargs = {"dest": OTHER + spec.dest, "default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
            if spec.action == "store_true":
                kwargs["action"] = "store_true"
            elif spec.action == "optional":
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = {"float": float, "int": int}.get(spec.type, str)
                if spec.choices is not None:
                    kwargs["choices"] = spec.choices
            for flag in spec.names:
                try:
                    group.add_argument(flag, **kwargs)
                except argparse.ArgumentError:  # the name is taken
                    continue
                taken.setdefault(kwargs["dest"], []).append(flag)
    return taken


def algorithm_arg(argv: list[str], default: str | None = "FedAvg") -> str | None:
    """The ``-algo`` value (``default`` when absent), read before any parsing: a parser of the common flags
    would misread an algorithm's own short flag before it exists (``-mu 0.1`` as ``-m u``), and argparse
    matches unknown single-dash flags as abbreviations (``-al`` as ``-algo``)."""
    name = default
    for i, arg in enumerate(argv):
        if arg in ("-algo", "--algorithm") and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--algorithm="):
            name = arg.split("=", 1)[1]
    return None if name is None else canonical_name(name)


# PFLlib flags this library does not take, and why (a PFLlib script passing one stops with this line).
_TS = "-ts/--time_select is not a flag here: PFLlib declares it and never reads it (it has no effect there); drop it"
REMOVED = {"-ts": _TS, "--time_select": _TS}


def read_config_file(path: str) -> dict:
    """``--config``: a mapping of flag names (long, without dashes: a Config's keys) to values, from JSON or
    (``.yaml`` / ``.yml``, with PyYAML's safe loader: plain values only) YAML."""
    from utils import fileio

    file = Path(path)
    try:  # a regular file, capped in size and nesting (utils/fileio.py)
        text = fileio.read_bytes(file, "--config", cap=fileio.CONFIG_CAP).decode("utf-8-sig")
        if file.suffix in (".yaml", ".yml"):
            try:
                import yaml  # noqa: F401
            except ImportError:
                raise FLError(f"--config {path}: YAML needs PyYAML (pip install -r requirements-optional.txt); "
                              f"or write the file as JSON") from None
            values = fileio.parse_yaml(text, f"--config {path}")
        else:
            values = fileio.parse_json(text, f"--config {path}")
    except UnicodeDecodeError as e:
        raise FLError(f"--config {path}: cannot read it ({e})") from None
    except fileio.FileIOError as e:
        raise FLError(str(e).replace(f"--config {file} ", f"--config {path}: ", 1)) from None
    if not isinstance(values, dict):
        raise FLError(f"--config {path}: expected a mapping of flag names to values")
    return values


def config_file_flags(argv: list[str]) -> list[str]:
    """``argv`` with the ``--config`` file's values put in front as flags (so the command line overrides
    them, and argparse checks every value as if typed): a key is a long flag's name without dashes; null
    leaves the default; unknown keys and values that are not plain are refused."""
    path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"),
                next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None))
    if path is None:
        return argv
    values = read_config_file(path)
    name = algorithm_arg(argv, default=None) or canonical_name(str(values.get("algorithm") or "FedAvg"))
    actions = {a.dest: a for a in parser_for(name).flags}
    flags = []
    for key, value in values.items():
        if value is None:
            continue
        action = actions.get(key)
        if key == "config":
            raise FLError(f"--config {path}: a config file cannot name another (config: {value})")
        if action is None or key == "help":
            raise FLError(f"--config {path}: '{key}' is not a flag of -algo {name} (keys are long flag names "
                          f"without dashes, e.g. global_rounds)")
        if isinstance(value, (dict, list)):
            raise FLError(f"--config {path}: '{key}' must be a single value (got {type(value).__name__})")
        flag = next(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse.BooleanOptionalAction):
            flags.append(flag if value is True else "--no-" + flag[2:] if value is False else f"{flag}={value}")
        else:
            flags.append(f"{flag}={str(value).lower() if isinstance(value, bool) else value}")
    return flags + argv


def parse_config(argv=None) -> Config:
    """Parse flags (common ones, then the chosen algorithm's own; a ``--config`` file's values first) into a
    read-only Config, checked by ``validate`` and the algorithm's ``check_config``."""
    argv = config_file_flags(sys.argv[1:] if argv is None else list(argv))
    name = algorithm_arg(argv, default=None)
    helping = "-h" in argv or "--help" in argv
    parser = base_parser()
    others = {}
    if helping and name is None:
        parser.epilog = "python system/main.py -algo NAME -h adds that algorithm's own flags."
    elif (name or "FedAvg") in ALGORITHMS:  # otherwise parse_args below fails, listing the valid names
        name = name or "FedAvg"
        get_server_class(name).add_args(parser.flag_group(f"{name} flags"))
        if not helping:
            others = add_other_algorithms_flags(parser, name)
    for arg in argv:
        if arg in REMOVED or arg.split("=", 1)[0] in REMOVED:
            parser.error(REMOVED[arg.split("=", 1)[0]])
    args = parser.parse_args(argv)
    unused = sorted(k for k in vars(args) if k.startswith(OTHER))
    if unused:
        given = {a.split("=", 1)[0] for a in argv}
        shown = sorted(next((n for n in others[k] if n in given), others[k][0]) for k in unused)
        print(f"warning: -algo {args.algorithm} does not use {', '.join(shown)}; ignored", file=sys.stderr)
        for k in unused:
            delattr(args, k)
    server_cls = get_server_class(args.algorithm)
    cfg = split_data_path(Config(**vars(args)))
    validate(cfg)
    from utils import bounds

    bounds.check(cfg, bounds.numeric_actions(parser))  # every numeric flag's range: one table (utils/bounds.py)
    check_paths(cfg)
    from utils.dp_support import check_support

    check_support(cfg, server_cls)  # the algorithm's privacy declaration
    if cfg.client_models is not None:
        from flcore.trainmodel.assign import read_client_models
        from utils.model_support import check_model_support

        check_model_support(cfg, server_cls)  # the algorithm's --client_models declaration
        read_client_models(cfg.client_models)  # a bad list or file fails here, before any work
    cfg = server_options(cfg, server_cls, given={a.split("=", 1)[0] for a in argv})
    server_cls.check_config(cfg)
    if cfg.tensorboard is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise FLError("--tensorboard needs the tensorboard package: pip install tensorboard")
        if Path(cfg.tensorboard).is_absolute() or ".." in Path(cfg.tensorboard).parts or not cfg.tensorboard:
            raise FLError(f"--tensorboard must be a folder under --results_dir, a relative name without '..' "
                          f"(got '{cfg.tensorboard}')")
    if cfg.num_new_clients and server_cls.new_client_refusal:
        raise FLError(f"-nnc: {cfg.algorithm} cannot evaluate new clients: {server_cls.new_client_refusal}")
    return cfg


def server_options(cfg: Config, server_cls, given: set[str]) -> Config:
    """``--server_opt``, ``--aggregator`` and ``--attack``: refused where the algorithm's server does not
    average a model (its ``averaging_refusal``), checked, and their defaults resolved (-slr's by optimizer,
    or the algorithm's own ``slr_default``; the attack's share)."""
    from utils.attacks import UPLOAD_ATTACKS

    robust = [f for f, on in (("--server_opt", cfg.server_opt != "off"), ("--aggregator", cfg.aggregator != "mean"),
                              ("--attack", cfg.attack in UPLOAD_ATTACKS)) if on]
    if robust and server_cls.averaging_refusal:
        raise FLError(f"{' / '.join(robust)}: {cfg.algorithm} cannot take it: {server_cls.averaging_refusal}")
    checks = [
        (cfg.server_learning_rate is None or cfg.server_learning_rate > 0, "-slr must be > 0"),
        (0 <= cfg.server_momentum < 1, "--server_momentum must be in [0, 1)"),
        (0 <= cfg.server_beta2 < 1, "--server_beta2 must be in [0, 1)"), (cfg.server_tau > 0, "--server_tau must be > 0"),
        (0 <= cfg.trim_frac < 0.5, "--trim_frac must be in [0, 0.5)"),
        (cfg.krum_f is None or cfg.krum_f >= 0, "--krum_f must be >= 0"),
        (cfg.krum_f is None or cfg.aggregator in ("krum", "multikrum", "bulyan"),
         "--krum_f needs --aggregator krum, multikrum or bulyan"),
        (cfg.cclip_tau > 0, "--cclip_tau must be > 0"), (cfg.cclip_iters >= 1, "--cclip_iters must be >= 1"),
        (cfg.aggregator == "cclip" or (cfg.cclip_tau == 10.0 and cfg.cclip_iters == 1),
         "--cclip_tau and --cclip_iters need --aggregator cclip"),
        (cfg.norm_bound is None or cfg.norm_bound > 0, "--norm_bound must be > 0"),
        (cfg.norm_bound is None or cfg.aggregator == "normclip", "--norm_bound needs --aggregator normclip"),
        (cfg.attack is not None or (cfg.attack_frac is None and cfg.attack_scale is None),
         "--attack_frac and --attack_scale need --attack"),
        (cfg.attack_frac is None or 0 < cfg.attack_frac < 1, "--attack_frac must be in (0, 1)"),
        (cfg.attack not in ("labelflip", "alie", "minmax", "minsum") or cfg.attack_scale is None,
         f"--attack {cfg.attack} takes no --attack_scale"),
        (cfg.attack == "backdoor" or (cfg.backdoor_target == 0 and cfg.backdoor_frac == 0.3
                                      and cfg.trigger_size == 3),
         "--backdoor_target, --backdoor_frac and --trigger_size need --attack backdoor"),
        (cfg.backdoor_target >= 0, "--backdoor_target must be >= 0"),
        (0 < cfg.backdoor_frac <= 1, "--backdoor_frac must be in (0, 1]"), (cfg.trigger_size >= 1, "--trigger_size must be >= 1"),
        (cfg.attack in ("minmax", "minsum") or cfg.minmax_perturbation == "std",
         "--minmax_perturbation needs --attack minmax or minsum"),
        (cfg.attack_scale is None or cfg.attack_scale > 0, "--attack_scale must be > 0"),
    ]
    for ok, msg in checks:
        if not ok:
            raise FLError(msg)
    lr = cfg.server_learning_rate
    if cfg.server_opt != "off":
        from utils.server_opt import DEFAULT_LR

        lr = DEFAULT_LR[cfg.server_opt] if lr is None else lr
    elif server_cls.slr_default is not None:
        lr = server_cls.slr_default if lr is None else lr
    elif lr is not None:
        shown = "-slr" if "-slr" in given else "--server_learning_rate"
        print(f"warning: -algo {cfg.algorithm} does not use {shown} without --server_opt; ignored", file=sys.stderr)
        lr = None
    frac = cfg.attack_frac
    if cfg.attack is not None and frac is None:
        from utils.attacks import DEFAULT_FRACTION

        frac = DEFAULT_FRACTION
    return cfg.replace(server_learning_rate=lr, attack_frac=frac)


def validate(cfg: Config) -> None:
    checks = [
        (cfg.num_clients is None or cfg.num_clients >= 1, f"-nc must be >= 1 (got {cfg.num_clients})"),
        (cfg.seed >= 0, f"--seed must be >= 0 (got {cfg.seed})"),
        (cfg.global_rounds >= 0, "-gr must be >= 0"), (cfg.eval_batch_size >= 1, "--eval_batch_size must be >= 1"),
        (cfg.num_classes is None or cfg.num_classes >= 1, "-ncl must be >= 1"), (cfg.top_cnt >= 0, "-tc must be >= 0"), (cfg.local_epochs >= 1, "-ls must be >= 1"),
        (cfg.batch_size >= 1, "-lbs must be >= 1"), (cfg.local_learning_rate > 0, "-lr must be > 0"),
        (0 < cfg.join_ratio <= 1, "-jr must be in (0, 1]"), (0 <= cfg.client_drop_rate < 1, "-cdr must be in [0, 1)"),
        (cfg.eval_gap >= 1, "-eg must be >= 1"), (cfg.times > cfg.prev >= 0, "need 0 <= -pv < -t"),
        (0 < cfg.rand_percent <= 100, "-s must be in (0, 100]"), (cfg.layer_idx >= 0, "-p must be >= 0"),
        (cfg.ala_layers is None or cfg.ala_layers >= 0, "--ala_layers must be >= 0"),
        (cfg.ala_max_epochs >= 1, "--ala_max_epochs must be >= 1"), (cfg.ala_window >= 2, "--ala_window must be >= 2"),
        (cfg.workers >= 0, "--workers must be >= 0"), (cfg.max_restarts >= 0, "--max_restarts must be >= 0"),
        (cfg.batch_clients >= 0, "--batch_clients must be >= 0"),
        (cfg.gpus_per_worker in (None, 0) or cfg.gpus_per_worker >= 0.0001,
         "--gpus_per_worker must be 0 or at least 0.0001 (Ray's least share of a GPU)"),
        (0 <= cfg.train_slow_rate <= 1, "-tsr must be in [0, 1]"),
        (0 <= cfg.send_slow_rate <= 1, "-ssr must be in [0, 1]"), (cfg.time_threshold > 0, "-tth must be > 0 s"),
        (cfg.checkpoint_every >= 0, "--checkpoint_every must be >= 0"),
        (cfg.dlg_gap >= 1, "-dlgg must be >= 1"), (cfg.batch_num_per_client >= 1, "-bnpc must be >= 1"),
        (cfg.dlg_clients >= 1, "--dlg_clients must be >= 1"), (cfg.dlg_iters >= 1, "--dlg_iters must be >= 1"),
        (cfg.dlg_batch >= 1, "--dlg_batch must be >= 1"),
        (cfg.ig_iters >= 1, "--ig_iters must be >= 1"), (cfg.ig_tv >= 0, "--ig_tv must be >= 0"), (cfg.dp_clip > 0, "--dp_clip must be > 0"),
        (not cfg.privacy or cfg.dp_sigma > 0, "-dps must be > 0 with -dp (sigma 0 adds no noise: drop -dp)"),
        (0 < cfg.dp_delta < 1, "--dp_delta must be in (0, 1)"),
        (cfg.privacy or not getattr(cfg, "dp_secure_rng", False), "--dp_secure_rng needs -dp"),
        (cfg.privacy or cfg.dp_level == "sample", "--dp_level client needs -dp"),
        (cfg.dp_quantile is None or (cfg.privacy and cfg.dp_level == "client"),
         "--dp_quantile (adaptive clipping) needs -dp --dp_level client"),
        (cfg.dp_quantile is None or 0 < cfg.dp_quantile < 1, "--dp_quantile must be in (0, 1)"),
        (0 < cfg.train_loss_fraction <= 1, "--train_loss_fraction must be in (0, 1]"),
        (cfg.num_new_clients >= 0, "-nnc must be >= 0"), (cfg.fine_tuning_epoch_new >= 0, "-ften must be >= 0"),
        (cfg.few_shot >= 0, "-fs must be >= 0"), (0 <= cfg.val_ratio < 1, "--val_ratio must be in [0, 1)"),
        (cfg.amp != "fp16" or not cfg.privacy, "--amp fp16 does not combine with -dp; use --amp bf16 or off"),
    ]
    for ok, msg in checks:
        if not ok:
            raise FLError(msg)
    if cfg.privacy:
        import importlib.util

        if importlib.util.find_spec("opacus") is None:
            raise FLError("-dp reports epsilon with opacus' RDP accountant, which is not installed: "
                          "pip install -r requirements-optional.txt")


# PFLlib's defaults of the common flags (its main.py), where they matter for comparison: the start-up print
# marks every value that differs (README's "Coming from PFLlib"). An algorithm's own flags' PFLlib defaults
# are its server's ``pfllib_defaults``.
PFLLIB_DEFAULTS = {
    "dataset": "MNIST", "model": "CNN", "num_classes": 10, "num_clients": 20, "save_folder_name": "items",
    "layer_idx": 2, "dp_sigma": 0.0, "bn_stats": "local", "ala_clients": "all", "server_learning_rate": 1.0,
}


def split_data_path(cfg: Config) -> Config:
    """``-data`` given as a path (``-data ../splits/Digits``, ``-data Digits/``) names the split folder: its
    last part is the dataset, the rest is joined to ``--dataset_root``. Result names use the dataset only,
    so results still go to ``--results_dir``."""
    data = Path(cfg.dataset)
    if data.name in ("", ".", ".."):
        raise FLError(f"-data must name a split folder, such as Digits (got '{cfg.dataset}')")
    if str(data) == data.name == cfg.dataset:
        return cfg
    return cfg.replace(dataset=data.name, dataset_root=str(Path(cfg.dataset_root) / data.parent))


def results_folder(cfg: Config) -> Path:
    """Where the run's files go: ``--results_dir``, else results/ in the repository."""
    return Path(cfg.results_dir) if cfg.results_dir else RESULTS_DIR


def check_paths(cfg: Config) -> None:
    """Before any work: what a run writes stays under ``--results_dir`` (``-go`` is part of a file name,
    ``-sfn`` a folder inside it), and that folder is, or can be made, a writable folder."""
    if cfg.goal in ("", ".", "..") or any(c in cfg.goal for c in "/\\\0") or any(ord(c) < 32 for c in cfg.goal) \
            or len(cfg.goal.encode("utf-8", "surrogateescape")) > 100:
        raise FLError(f"-go is part of the result file names: it cannot be empty or hold / or \\ or control "
                      f"characters, and takes at most 100 bytes (got {cfg.goal[:60]!r})")
    for key in ("results_dir", "dataset_root", "dataset", "config", "client_state_dir", "save_folder_name", "tensorboard",
                "source", "client_models", "goal"):
        value = getattr(cfg, key, None)
        if isinstance(value, str) and any(ord(c) < 32 for c in value):
            raise FLError(f"--{key} holds a control character (NUL, line break, ...): not a path the run can use "
                          f"(got {value[:60]!r})")
    sfn = Path(cfg.save_folder_name)
    if cfg.save_folder_name and (sfn.is_absolute() or ".." in sfn.parts):
        raise FLError(f"-sfn must be a folder under --results_dir, a relative name without '..' "
                      f"(got '{cfg.save_folder_name}')")
    out = results_folder(cfg)
    existing = out
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise FLError(f"--results_dir {out}: {existing} is not a folder; choose another --results_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FLError(f"--results_dir {out}: {existing} is not writable; choose another --results_dir")


def print_config(cfg: Config) -> None:
    """Every setting of the run, one per line as PFLlib prints them, marking values that differ from
    PFLlib's default for the same flag."""
    pfllib = {**PFLLIB_DEFAULTS, **get_server_class(cfg.algorithm).pfllib_flag_defaults()}
    lines = []
    for key, value in vars(cfg).items():
        mark = ""
        if key in pfllib and pfllib[key] != value and value is not None:
            mark = f"   (PFLlib default: {pfllib[key]})"
        lines.append(f"  {key} = {value}{mark}")
    print("configuration:\n" + "\n".join(lines))
