"""The DLG / iDLG / IG evaluation of what clients expose (``-dlg``, the plug-in plugins/dlg.py; the attacks
themselves are ``utils/dlg.py``), for any algorithm."""
from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from utils import dlg
from utils.dp_sgd import dp_gradient
from utils.dp_support import sample_level
from utils.entries import aligned_names, trainable_names
from utils.errors import FLError
from utils.seeding import np_rng, torch_gen


def attacked_positions(seed: int, run: int, round_idx: int, n_active: int, k: int) -> np.ndarray:
    """Positions (in the round's active list) of the clients attacked in a round: ``k`` drawn without
    replacement from the round's own stream, so the choice never depends on the algorithm."""
    rng = np_rng(seed, run, "dlg-clients", round_idx)
    return np.sort(rng.choice(n_active, size=min(k, n_active), replace=False))


def attacked_batch(seed: int, run: int, round_idx: int, cid: int, b: int, n: int, batch: int) -> torch.Tensor:
    """Indices (into the client's training data) of its ``b``-th attacked batch in a round."""
    return torch.randperm(n, generator=torch_gen(seed, run, "dlg-batch", round_idx, cid, b))[:batch]


def guess_scores(originals: torch.Tensor, k: int, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """PSNR and SSIM that ``k`` know-nothing guesses reach under the same matching: images at the
    normalisation mean (mid-grey), matched to ``originals`` as reconstructions are. The floor to read
    scores against: best-of-N matching against a whole training set (the update target) or a smooth,
    low-contrast image can score well above a random image without revealing anything."""
    shape = (k, *originals.shape[1:])
    grey = dlg.denormalize(torch.zeros(shape, device=originals.device), mean, std)
    order, psnr = dlg.match(originals, grey)
    return psnr, dlg.ssim(originals[order.to(originals.device)], grey)


def align_state(model: nn.Module, state: dict) -> dict:
    """An upload's state keyed by ``model``'s own names (``entries.aligned_names``' rule)."""
    return {name: state[k] for k, name in aligned_names(model, state).items()}


class PrivacyMonitor:
    """Runs the DLG/iDLG evaluation (``-dlg``) for any algorithm.

    The plug-in calls ``before_training`` (snapshot of the models the attacked clients start the round
    from) and ``after_upload`` (the attack, before aggregation). The
    attacker is the server, given each attacked client's starting model: for FedAvg that is the global
    model it sent; for personalised methods (FedALA's ALA-initialised model, private heads) it is more
    than a real server knows, so the scores are an upper bound on what leaks."""

    def __init__(self, cfg, run: int, data, recorder=None):
        self.cfg, self.run, self.recorder = cfg, run, recorder
        self.input_shape, self.num_classes = tuple(data.input_shape), data.num_classes
        norm = data.config.get("normalize") or {}
        channels = self.input_shape[0] if len(self.input_shape) == 3 else 1
        self.mean, self.std = norm.get("mean", [0.0] * channels), norm.get("std", [1.0] * channels)
        self.starts: dict[int, nn.Module] = {}
        if len(self.input_shape) != 3:
            raise FLError(f"-dlg reconstructs images, but split '{data.name}' holds inputs of shape "
                          f"{list(self.input_shape)}; use an image split (Digits, MNIST, Cifar10, ...)")

    def attacks(self, round_idx: int) -> bool:
        return round_idx % self.cfg.dlg_gap == 0

    def before_training(self, round_idx: int, active: list) -> None:
        """Pick this round's attacked clients (own stream) and keep a copy of the model each starts from."""
        self.starts = {}
        if not self.attacks(round_idx) or not active:
            return
        for i in attacked_positions(self.cfg.seed, self.run, round_idx, len(active), self.cfg.dlg_clients):
            self.starts[active[i].id] = copy.deepcopy(active[i].model)

    def after_upload(self, round_idx: int, active: list, uploads: list) -> None:
        """Attack each snapshotted client ``-bnpc`` times; record and print the round's scores."""
        if not self.starts:
            return
        by_id = {u.id: u for u in uploads}
        rows = []
        for c in active:
            if c.id in self.starts:
                rows += self._attack_client(round_idx, c, self.starts[c.id], by_id.get(c.id))
        self.starts = {}
        self._report(round_idx, rows)

    def _attack_client(self, round_idx: int, client, start: nn.Module, upload) -> list[dict]:
        cfg = self.cfg
        names = trainable_names(start)
        batch = min(cfg.dlg_batch, client.train_samples)
        if cfg.dlg_target == "update":
            state = align_state(start, (upload.state if upload is not None else None) or {})
            names = [n for n in names if n in state]
            if not names:
                raise FLError(f"--dlg_target update: {cfg.algorithm}'s upload holds no model parameters to "
                              f"attack; use --dlg_target gradient")
            steps = client.steps_per_round()
            target = dlg.pseudo_gradient(start.state_dict(), state, client.learning_rate(round_idx), steps, names)
        rows = []
        for b in range(cfg.batch_num_per_client):
            if cfg.dlg_target == "gradient":
                idx = attacked_batch(cfg.seed, self.run, round_idx, client.id, b, client.train_samples, batch)
                x, y = client.x_train[idx.to(client.x_train.device)], client.y_train[idx.to(client.x_train.device)]
                if sample_level(cfg):
                    noise = torch_gen(cfg.seed, self.run, "dlg-dp", round_idx, client.id, b, device=cfg.device)
                    target = dp_gradient(start, x, y, cfg.dp_clip, cfg.dp_sigma, noise)
                else:
                    target = dlg.model_gradient(start, x, y, names)
            else:
                x, y = client.x_train, client.y_train  # the update mixes every local batch
            gen = torch_gen(cfg.seed, self.run, "dlg-init", round_idx, client.id, b, device=cfg.device)
            clip = cfg.dp_clip if sample_level(cfg) and cfg.dlg_target == "gradient" else None  # a DP-aware attacker
            if cfg.dlg_attack == "ig":
                rec = dlg.invert_gradients(start, target, self.input_shape, batch, self.num_classes,
                                           iters=cfg.ig_iters, tv=cfg.ig_tv, generator=gen, bounds=self.box(),
                                           clip=clip)
            else:
                rec = dlg.reconstruct(start, target, self.input_shape, batch, self.num_classes,
                                      method=cfg.dlg_attack, iters=cfg.dlg_iters, generator=gen, clip=clip)
            rows.append(self._score(x, y, rec, exact_batch=cfg.dlg_target == "gradient"))
        return rows

    def box(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised images of pixels 0 and 1 per channel (C x 1 x 1): IG's box constraint."""
        m = torch.as_tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        s = torch.as_tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        return (0 - m) / s, (1 - m) / s

    def _score(self, x, y, rec, exact_batch: bool) -> dict:
        orig = dlg.denormalize(x.float(), self.mean, self.std)
        recon = dlg.denormalize(rec.x.float(), self.mean, self.std)
        order, psnr = dlg.match(orig, recon)
        order = order.to(orig.device)
        ssim = dlg.ssim(orig[order], recon)
        base_psnr, base_ssim = guess_scores(orig, len(recon), self.mean, self.std)
        true = y[order].cpu()
        if exact_batch:  # label recovery as a multiset: the attacker does not know the batch order
            hits = sum((Counter(rec.labels.cpu().tolist()) & Counter(y.cpu().tolist())).values())
        else:  # an update mixes many images: a label counts if it is that of the image matched
            hits = int((rec.labels.cpu() == true).sum())
        return {"orig": orig[order].cpu(), "recon": recon.cpu(), "psnr": psnr.cpu(), "ssim": ssim.cpu(),
                "base_psnr": base_psnr.cpu(), "base_ssim": base_ssim.cpu(), "label_hits": hits, "n": len(recon),
                "loss": rec.loss}

    def _report(self, round_idx: int, rows: list[dict]) -> None:
        psnr = torch.cat([r["psnr"] for r in rows])
        ssim = torch.cat([r["ssim"] for r in rows])
        n = sum(r["n"] for r in rows)
        values = {"psnr": float(psnr.mean()), "psnr_max": float(psnr.max()), "ssim": float(ssim.mean()),
                  "label_acc": sum(r["label_hits"] for r in rows) / n, "images": n,
                  "psnr_guess": float(torch.cat([r["base_psnr"] for r in rows]).mean()),
                  "ssim_guess": float(torch.cat([r["base_ssim"] for r in rows]).mean())}
        tqdm.write(f"round {round_idx:4d} | {self.cfg.dlg_attack.upper()} on {self.cfg.dlg_target} | "
                   f"PSNR {values['psnr']:.2f} dB (max {values['psnr_max']:.2f}; grey guess "
                   f"{values['psnr_guess']:.2f}) | SSIM {values['ssim']:.3f} (guess {values['ssim_guess']:.3f}) | "
                   f"labels {values['label_acc']:.2f} | {n} image(s)")
        if self.recorder is None:
            return
        self.recorder.add_series("dlg", round_idx, values)
        self.recorder.save()
        dlg.save_grid(torch.cat([r["orig"] for r in rows]), torch.cat([r["recon"] for r in rows]),
                      self.recorder.out_dir / f"{self.recorder.stem}_dlg_r{round_idx}.png",
                      [f"{p:.1f} dB" for p in psnr.tolist()])
