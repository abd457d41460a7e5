"""The bases show an author only what an algorithm overrides or calls, each documented; what an algorithm is
lives in one declaration per class (utils/declares.py), inherited field by field; a subclass written for
the members the bases used to carry stops at import with one line naming the new place."""
import inspect

import pytest

from flcore.clients.clientavg import FedAvgClient
from flcore.clients.clientbase import Client, ClientDeclares
from flcore.registry import get_server_class, pfllib_flag_defaults
from flcore.servers.serveravg import FedAvgServer
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError


def public(cls) -> list[str]:
    return [n for n in dir(cls) if not n.startswith("_")]


def test_the_bases_show_few_names_each_documented():
    assert len(public(Server)) <= 15, public(Server)
    assert len(public(Client)) <= 15, public(Client)
    for cls in (Server, Client):
        for name in public(cls):
            assert inspect.getdoc(getattr(cls, name)), f"{cls.__name__}.{name} has no docstring"


@pytest.mark.parametrize("body, says", [
    ("personalized = False", "FooServer.personalized: now a field of the class's one declaration: "
                             "declares = Declares(personalized=...) (utils/declares.py)"),
    ("client_class = FedAvgClient", "FooServer.client_class: now a field of the class's one declaration"),
    ("def run_round(self, t): pass", "FooServer.run_round: no longer a Server member; a round is "
                                     "runtime.loop.run_round(server, t)"),
    ("def evaluate(self): pass", "FooServer.evaluate: no longer a Server member; evaluation is "
                                 "runtime.loop.evaluate(server)"),
    ("def state_dict(self): pass", "FooServer.state_dict: no longer a Server member; a server's state is "
                                   "runtime.checkpoint.server_state(server)"),
    ("def _send_models(self, p): pass", "FooServer._send_models: no longer a Server member; runtime.loop.send"),
    ("declares = {'personalized': False}", "FooServer.declares must be a Declares(...)"),
    ("def after_round(self):\n        self.evaluate()", "FooServer.after_round reads self.evaluate: no longer a "
                                                       "Server member; evaluation is runtime.loop.evaluate(server)"),
])
def test_an_old_server_subclass_stops_at_import_with_one_line_naming_the_new_place(body, says):
    with pytest.raises(FLError) as e:
        exec(f"class FooServer(FedAvgServer):\n    {body}\n", {"FedAvgServer": FedAvgServer,
                                                              "FedAvgClient": FedAvgClient})
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("body, says", [
    ("personal_keys = ('head.',)", "FooClient.personal_keys: now a field of the class's one declaration: "
                                   "declares = ClientDeclares(personal_keys=...)"),
    ("batch_state = ()", "FooClient.batch_state: now a field of the class's one declaration"),
    ("def train(self, round_idx=0): pass", "FooClient.train: no longer a Client member; a round's local training "
                                           "is runtime.client_steps.train(client, round); override local_update"),
    ("def test_metrics(self): pass", "FooClient.test_metrics: no longer a Client member"),
    ("def dp_backward(self, *a): pass", "FooClient.dp_backward: no longer a Client member; -dp's step is "
                                        "utils.dp_sgd.dp_backward"),
    ("def state_dict(self, skip=()): pass", "FooClient.state_dict: no longer a Client member"),
    # the helpers that draw a client's batches are functions of the client now
    ("def batches(self, epochs, batch_size=None, generator=None): pass",
     "FooClient.batches: no longer a Client member; a client's batches are utils.batching.batches(client, "),
    ("def train_count(self): return 1", "FooClient.train_count: no longer a Client member; "
                                        "utils.batching.train_count(client)"),
    # and what the methods declared is a field of the declaration
    ("def dp_modules(self): return {'model': self.model}",
     "FooClient.dp_modules: no longer a Client member; the modules local training steps are named by attribute "
     "in the declaration: declares = ClientDeclares(dp_modules=(\"model\", ...))"),
    ("dp_modules = ('model',)", "FooClient.dp_modules: no longer a Client member; the modules local training"),
    ("def batched_step(self, params, grads, lrs): return params",
     "FooClient.batched_step: no longer a Client member; --executor batched's step is a function in the "
     "declaration: declares = ClientDeclares(batch_step=f)"),
    ("def new_client_model(self): return self.model",
     "FooClient.new_client_model: no longer a Client member; -nnc's model is named by attribute in the "
     "declaration: declares = ClientDeclares(new_client_model=\"model\")"),
    # a method that still reads a moved member, through self or super(), in a nested function too
    ("def local_update(self, r):\n        for idx in self.batches(1): pass",
     "FooClient.local_update reads self.batches: no longer a Client member; a client's batches are "
     "utils.batching.batches(client, "),
    ("def steps_per_round(self):\n        return 2 * super().batches_per_epoch()",
     "FooClient.steps_per_round reads self.batches_per_epoch: no longer a Client member; "
     "utils.batching.batches_per_epoch(client, batch_size)"),
    ("def upload(self):\n        f = lambda: self.train_count()\n        return f()",
     "FooClient.upload reads self.train_count: no longer a Client member"),
])
def test_an_old_client_subclass_stops_at_import_with_one_line_naming_the_new_place(body, says):
    with pytest.raises(FLError) as e:
        exec(f"class FooClient(FedAvgClient):\n    {body}\n", {"FedAvgClient": FedAvgClient})
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


def test_a_subclass_names_only_what_differs_and_inherits_the_rest_field_by_field():
    class Plain(FedAvgServer):
        declares = Declares(personalized=True)

    assert Plain.declares.personalized and not FedAvgServer.declares.personalized
    assert Plain.declares.client_class is FedAvgClient  # from FedAvg's declaration
    assert Plain.declares.dp_support is Server.declares.dp_support  # from the base's

    class Silent(Plain):  # declares nothing of its own: Plain's, whole
        pass

    assert Silent.declares == Plain.declares
    # two parents: FedProx-C takes its client and personalized from its own, pfllib_defaults from both
    proxc = get_server_class("FedProx-C")
    assert pfllib_flag_defaults(proxc) == {"mu": 0.0, "fine_tuning_epochs": 10}
    assert proxc.declares.personalized and proxc.declares.client_class.__name__ == "FedProxCClient"
    # checkpoint_skip accumulates over the bases (FedDBE's and the part-sharing base's)
    assert set(get_server_class("FedDBE").declares.checkpoint_skip) == {"shared_part", "payload"}


def test_a_client_declaration_is_inherited_too_and_the_instance_carries_its_personal_keys():
    class Keeps(FedAvgClient):
        declares = ClientDeclares(personal_keys=("head.",))

    assert Keeps.declares.personal_keys == ("head.",)
    assert Keeps.declares.batch_state == FedAvgClient.declares.batch_state  # FedProx-style fields inherited
    assert Keeps.declares.use_ala is False
    assert get_server_class("FedALA").declares.client_class.declares.use_ala


def test_reading_other_names_or_moved_names_on_other_objects_is_not_refused():
    """Only ``self.<moved>`` and ``super().<moved>`` stop an import: the new functions of the same names, an
    attribute of another object and the members that stayed are read freely."""
    from utils.batching import batches, batches_per_epoch, train_count

    class Fine(FedAvgClient):
        def local_update(self, round_idx):
            for idx in batches(self, 1):  # utils.batching's, called with the client
                self.model(self.x_train[idx])
            return batches_per_epoch(self) + train_count(self) + self.steps_per_round() + len(self.other.batches)

    assert Fine.declares == FedAvgClient.declares


@pytest.mark.parametrize("base", [FedAvgServer, FedAvgClient])
def test_a_mixins_class_hook_still_runs_beside_the_bases_own(base):
    """A researcher's subclass that also takes a mixin with its own ``__init_subclass__`` (a registry of
    variants, say): the base's hook settles ``declares`` and passes the class on along the MRO, so the mixin's
    hook runs too and receives its class keywords."""
    seen = []

    class Registered:
        def __init_subclass__(cls, tag=None, **kwargs):
            super().__init_subclass__(**kwargs)
            seen.append((cls.__name__, tag))

    class Mine(base, Registered, tag="mine"):
        pass

    assert seen == [("Mine", "mine")]
    assert Mine.declares == base.declares
