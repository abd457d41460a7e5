"""FedFomo client: the held-out validation split (``--val_ratio``), ε-greedy neighbour choice and the first-order weighted
update (see servers/serverfomo.py)."""
import copy

import torch
from torch import nn

from flcore.clients.clientbase import Client
from utils.aggregate import weighted_average
from utils.metrics import predict
from utils.personal_aggregation import flat, fomo_affinity_step, fomo_scores, fomo_weights
from utils.seeding import np_rng, torch_gen


class FedFomoClient(Client):
    def __init__(self, cfg, cid, data, model, run=0):
        super().__init__(cfg, cid, data, model, run)  # x_val, y_val: the --val_ratio holdout of every client
        self.affinity: dict[int, float] = {}  # client id -> its summed normalised scores here
        self.neighbour_rng = np_rng(cfg.seed, run, "fomo-neighbours", cid)
        self.scratch = copy.deepcopy(self.model)
        self.last_weights: dict[int, float] = {}

    def choose_neighbours(self, round_idx: int, candidates: list[int]) -> list[int]:
        """Up to -M ids: each pick explores a random remaining candidate with probability
        ε_t = max(0, ε - t * decay), else takes the remaining one of highest affinity (ties at random)."""
        eps = max(0.0, self.cfg.epsilon - round_idx * self.cfg.epsilon_decay)
        rest = list(candidates)
        rank = {j: (-self.affinity.get(j, 0.0), t) for j, t in zip(rest, self.neighbour_rng.random(len(rest)))}
        chosen = []
        for _ in range(min(self.cfg.M, len(rest))):
            if self.neighbour_rng.random() < eps:
                j = rest[int(self.neighbour_rng.integers(len(rest)))]
            else:
                j = min(rest, key=rank.__getitem__)
            rest.remove(j)
            chosen.append(j)
        return chosen

    def val_loss(self, model: nn.Module) -> float:
        logits = predict(model, self.x_val, self.cfg.eval_batch_size)
        return float(nn.functional.cross_entropy(logits.float(), self.y_val))

    def receive(self, states: dict, participating: bool = True) -> None:
        """``states``: the models of the neighbours this client asked for (``choose_neighbours``), by id.
        Score them on the validation split, initialise from their weighted mean (θ_i + Σ w_n (θ_n - θ_i)
        with Σ w_n = 1; keep θ_i when none lowers the loss) and move each one's affinity by its normalised
        score."""
        if not states:
            return
        keys = [n for n, _ in self.model.named_parameters()]
        own, own_loss = flat(self.model.state_dict(), keys), self.val_loss(self.model)
        losses, dists = [], []
        for s in states.values():
            self.scratch.load_state_dict(s)
            losses.append(self.val_loss(self.scratch))
            dists.append(float((flat(s, keys) - own).norm()))
        self.model.train()
        scores = fomo_scores(own_loss, losses, dists)
        w = fomo_weights(scores)
        self.last_weights = dict(zip(states, w.tolist()))
        for j, step in zip(states, fomo_affinity_step(scores).tolist()):
            self.affinity[j] = self.affinity.get(j, 0.0) + step
        if w.sum() > 0:
            self.scratch.load_state_dict(weighted_average(list(states.values()), w.tolist()))
            self.initialize_local(self.model, self.scratch, participating)
