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

from flcore.registry import ALGORITHMS, canonical_name, get_server_class, pfllib_flag_defaults
from flcore.trainmodel.names import ALIASES, MODELS
from plugins import plugin_classes
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
    a value follows; scripts/run/sweep.py, scripts/run/table.py)."""

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
    for plugin in plugin_classes():  # each cross-cutting feature's own flags (plugins/)
        plugin.add_flags(p)
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
    from utils import bounds

    bounds.check(cfg, bounds.numeric_actions(parser))  # every numeric flag's range: one table (utils/bounds.py)
    validate(cfg)
    check_paths(cfg)
    if cfg.client_models is not None:
        from flcore.trainmodel.assign import read_client_models
        from utils.model_support import check_model_support

        check_model_support(cfg, server_cls)  # the algorithm's --client_models declaration
        read_client_models(cfg.client_models)  # a bad list or file fails here, before any work
    cfg = check_plugins(cfg, server_cls, given={a.split("=", 1)[0] for a in argv})
    server_cls.check_config(cfg)
    if cfg.tensorboard is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise FLError("--tensorboard needs the tensorboard package: pip install tensorboard")
        if Path(cfg.tensorboard).is_absolute() or ".." in Path(cfg.tensorboard).parts or not cfg.tensorboard:
            raise FLError(f"--tensorboard must be a folder under --results_dir, a relative name without '..' "
                          f"(got '{cfg.tensorboard}')")
    if cfg.num_new_clients and server_cls.declares.new_client_refusal:
        raise FLError(f"-nnc: {cfg.algorithm} cannot evaluate new clients: {server_cls.declares.new_client_refusal}")
    return cfg


def check_plugins(cfg: Config, server_cls, given: set[str]) -> Config:
    """Every plug-in's checks of its own flags (plugins/), each resolving its defaults (-slr's by optimizer
    or the algorithm's ``slr_default``, the attack's share)."""
    for plugin in plugin_classes():
        cfg = plugin.check(cfg, server_cls, given)
    return cfg


def validate(cfg: Config) -> None:
    """The checks between flags; every numeric flag's own range is utils/bounds.py's (``bounds.check``)."""
    if not cfg.times > cfg.prev:
        raise FLError(f"need -pv < -t (got -pv {cfg.prev}, -t {cfg.times})")


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
    pfllib = {**PFLLIB_DEFAULTS, **pfllib_flag_defaults(get_server_class(cfg.algorithm))}
    lines = []
    for key, value in vars(cfg).items():
        mark = ""
        if key in pfllib and pfllib[key] != value and value is not None:
            mark = f"   (PFLlib default: {pfllib[key]})"
        lines.append(f"  {key} = {value}{mark}")
    print("configuration:\n" + "\n".join(lines))
