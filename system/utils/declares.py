"""What an algorithm declares about itself, in one typed object per side: ``Server.declares`` (a
``Declares``) and ``Client.declares`` (a ``ClientDeclares``).

A subclass names only the fields it changes; every other field comes from its bases, field by field in the
order of its MRO (as class attributes would): FedProx-C's server takes ``pfllib_defaults`` from both its
parents. ``pfllib_defaults`` and ``checkpoint_skip`` accumulate over the bases instead (a subclass adds to
them). The engine, the plug-ins and the generated docs read ``cls.declares``, always complete.

    class FedNovaServer(Server):
        declares = Declares(client_class=FedNovaClient, personalized=False,
                            robust_refusal="its server rescales every update ...")
"""
from __future__ import annotations

import dataclasses
import dis
import types
from typing import Callable

from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.model_support import ModelSupport


class _Inherited:
    """The default of every field: take it from the bases."""

    def __repr__(self) -> str:
        return "INHERITED"


INHERITED = _Inherited()


@dataclasses.dataclass(frozen=True)
class Declares:
    """An algorithm's server-side declarations (``Server.declares``; the defaults are ``Server``'s).

    ``client_class``: its client. ``personalized``: False for traditional FL, whose clients are evaluated on the
    global model (the behaviour tests expect every personalised algorithm to beat FedAvg on a pathological
    split). ``dp_support``: its one privacy declaration (utils/dp_support.py: why it refuses DP-SGD or
    client-level DP, what its epsilon does not cover; docs/privacy.md's table is made from it).
    ``model_support``: its one ``--client_models`` declaration (utils/model_support.py; refused by default).
    ``averaging_refusal``: why its server does not average a model through ``average_uploads``
    (``--server_opt``, ``--aggregator`` and the upload attacks then refused at start-up), "" when it does.
    ``robust_refusal``: why a robust rule cannot guard it (its server reads uploaded content outside
    ``average_uploads``; ``--aggregator`` refused), "" when nothing does. ``new_client_refusal``: why a client
    that never trained has no defined start (``-nnc`` refused), "" when it receives ``new_client_payload``.
    ``slr_default``: ``-slr``'s default where its own server step reads it without ``--server_opt``
    (SCAFFOLD, FedGH). ``pfllib_defaults``: PFLlib's defaults of the flags it adds (marked by the start-up
    print where a run differs; accumulated over the bases). ``checkpoint_skip``: server attributes a
    checkpoint leaves out, rebuilt by the constructor or every broadcast (accumulated over the bases)."""
    client_class: type = INHERITED
    personalized: bool = INHERITED
    dp_support: DPSupport = INHERITED
    model_support: ModelSupport = INHERITED
    averaging_refusal: str = INHERITED
    robust_refusal: str = INHERITED
    new_client_refusal: str = INHERITED
    slr_default: float | None = INHERITED
    pfllib_defaults: dict = INHERITED
    checkpoint_skip: tuple[str, ...] = INHERITED


@dataclasses.dataclass(frozen=True)
class ClientDeclares:
    """An algorithm's client-side declarations (``Client.declares``; the defaults are ``Client``'s).

    ``personal_keys``: entries of the client's model state (name prefixes) that are its own and never cross
    the wire: FedRep's head ("head."), all of Local's model (""); every algorithm's uploads are checked against
    them (tests/test_executors.py). ``use_ala``: ALA always on (FedALA; any other algorithm gets it with
    ``-ala``). ``dp_modules``: the attributes holding the modules whose parameters local training's
    optimizers step (``("model",)``; Ditto's ``("model", "pmodel")``, APFL's v and alpha, FML's local model,
    FedKD's mentor): ``-dp``'s DP-SGD swaps per-sample copies into them (``utils.dp_sgd.dp_modules``) and
    refuses a trained parameter outside them; the batched executor stacks them. ``batch_state``:
    ``--executor batched`` (runtime/batched.py): None, its local update is not declared batchable; else the
    attributes besides the ``dp_modules`` that its ``loss`` (and its phases' objectives) read and that differ
    between clients (FedProx's anchor), stacked per client; a subclass that overrides a training hook or
    redeclares ``dp_modules`` or ``batch_step`` below the declaring class is refused
    (``runtime.batched.batch_refusal``). ``batch_step``: ``after_backward`` and the SGD step in functional
    form for the batched executor, ``f(params, grads, lrs) -> params`` on the trained entries of a phase
    (named as by ``dp_modules``, stacked over clients; ``lrs`` broadcast against them): plain SGD, p - lr g
    (``utils.batching.sgd_step``), unless ``after_backward`` changes the step (APFL's projection of alpha).
    ``new_client_model``: ``-nnc``, the attribute holding the model a client that joins after training
    fine-tunes and is evaluated on, once it has received its payload; None: the evaluated model
    (``eval_model``); ``"model"`` where that is a personal model the payload never reaches (Ditto's v: the
    received model, as PFLlib fine-tunes it). ``checkpoint_skip``: attributes a checkpoint (and a parked
    client) leaves out, state the client rebuilds by itself (accumulated over the bases)."""
    personal_keys: tuple[str, ...] = INHERITED
    use_ala: bool = INHERITED
    dp_modules: tuple[str, ...] = INHERITED
    batch_state: tuple[str, ...] | None = INHERITED
    batch_step: Callable[[dict, dict, dict], dict] = INHERITED
    new_client_model: str | None = INHERITED
    checkpoint_skip: tuple[str, ...] = INHERITED


ACCUMULATED = ("pfllib_defaults", "checkpoint_skip")


def given(decl) -> dict:
    """The fields ``decl`` sets itself (not ``INHERITED``)."""
    return {f.name: getattr(decl, f.name) for f in dataclasses.fields(decl) if getattr(decl, f.name) is not INHERITED}


def declared_by(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO whose own declaration sets field ``name`` (None: none does)."""
    return next((k for k in cls.__mro__ if name in given(own_declares(k) or _NONE)), None)


def own_declares(k: type):
    """What class ``k`` declares itself: settled by ``settle``, or a mixin's own ``declares`` (a family base
    that is no ``Server`` subclass, such as fine-tuned evaluation's)."""
    return vars(k)["_own_declares"] if "_own_declares" in vars(k) else vars(k).get("declares")


_NONE = ClientDeclares()  # sets nothing


def settle(cls: type, kind: type, old_names: dict[str, str], old_members: dict[str, str] | None = None) -> None:
    """At a subclass's creation: keep what it declares itself (``_own_declares``) and set ``cls.declares``
    to the declarations in force, each field from the first class of its MRO that sets it (the accumulated
    ones over all of them, the nearest last). A class attribute of one of the old names (``old_names``: the
    attributes that are fields now, and what else moved) stops the import with one line naming the new place;
    so does a method that still reads one of ``old_members`` (members the base no longer has) as
    ``self.<name>`` or ``super().<name>``."""
    for name in vars(cls):
        if name in old_names:
            raise FLError(f"{cls.__name__}.{name}: {old_names[name]}")
    for where, name in old_reads(cls, old_members or {}):
        raise FLError(f"{cls.__name__}.{where} reads self.{name}: {old_members[name]}")
    own = vars(cls).get("declares")
    if own is not None and not isinstance(own, kind):
        raise FLError(f"{cls.__name__}.declares must be a {kind.__name__}(...) (utils/declares.py), not "
                      f"{type(own).__name__}")
    cls._own_declares = own
    chain = [d for d in map(own_declares, cls.__mro__) if isinstance(d, kind)]
    values = {}
    for f in dataclasses.fields(kind):
        found = [given(d)[f.name] for d in chain if f.name in given(d)]
        if f.name not in ACCUMULATED:
            values[f.name] = found[0]
        elif f.name == "pfllib_defaults":
            values[f.name] = {k: v for d in reversed(found) for k, v in d.items()}
        else:
            values[f.name] = tuple(dict.fromkeys(n for d in reversed(found) for n in d))
    cls.declares = kind(**values)


def moved_to_declares(kind: type) -> dict[str, str]:
    """The one line for a class attribute that is now a field of ``kind``."""
    return {f.name: f"now a field of the class's one declaration: declares = {kind.__name__}({f.name}=...) "
                    f"(utils/declares.py)" for f in dataclasses.fields(kind)}


def old_reads(cls: type, names) -> list[tuple[str, str]]:
    """(method, name) for every ``self.<name>`` or ``super().<name>`` of ``names`` that a method defined in
    ``cls`` (or a function nested in one) reads, from its bytecode."""
    found = []
    for where, value in vars(cls).items():
        fn = getattr(value, "__func__", value)  # staticmethod, classmethod
        fns = [fn.fget, fn.fset, fn.fdel] if isinstance(fn, property) else [fn]
        for f in fns:
            code = getattr(f, "__code__", None)
            if isinstance(code, types.CodeType):
                found += [(where, name) for name in _self_reads(code) if name in names]
    return found


def _self_reads(code: types.CodeType):
    """The attribute names read from ``self`` or from ``super()`` in ``code`` and the code nested in it."""
    window = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"):
            on_self = window and window[-1].opname in ("LOAD_FAST", "LOAD_DEREF") and window[-1].argval == "self"
            on_super = (ins.opname == "LOAD_SUPER_ATTR"
                        or [(i.opname, i.argval) for i in window[-3:-2]] == [("LOAD_GLOBAL", "super")])
            if on_self or on_super:
                yield ins.argval
        window = (window + [ins])[-3:]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _self_reads(const)
