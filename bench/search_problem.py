"""The training bench_search.py races the searches on: a small real training on the CPU, with learning curves.

A one-hidden-layer network (numpy) learns scikit-learn's bundled 8x8 digits,
each training image also shifted by a pixel in each of eight directions
(about 10,800 images); 600 untouched images are held out. One unit of budget is one
epoch; after each, the held-out accuracy is what every search maximizes. The
hyperparameters: learning rate, momentum, weight decay, batch size and (but
for PBT, whose checkpoints must fit every member) the hidden layer's width.
Everything a trial draws (initial weights, the order of each epoch) is seeded
by its parameters, so a configuration trains alike under every system.

Only numpy here: the trials of each system import this module (trialkit's
trials are processes, Ray's workers and Optuna's threads import it once).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Mapping

import numpy

MAX_EPOCHS = 27  # R, max_budget, max_t: the most a configuration trains
SPACE = {
    "lr": {"_type": "loguniform", "_value": [1e-3, 1.0]},
    "momentum": {"_type": "uniform", "_value": [0.0, 0.95]},
    "weight_decay": {"_type": "loguniform", "_value": [1e-6, 1e-2]},
    "batch_size": {"_type": "choice", "_value": [16, 32, 64, 128]},
    "hidden": {"_type": "choice", "_value": [32, 64, 128, 256]},
}
PBT_HIDDEN = 64
PBT_SPACE = {key: value for key, value in SPACE.items() if key != "hidden"}


def prepare_data(path: Path, scale: int = 1) -> None:
    """The images and labels, split and augmented, as one .npz (read by every trial). `scale` > 1: that many
    copies of the training images, each with its own faint noise, so an epoch costs `scale` times as much."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = digits.images / 16.0, digits.target
    order = numpy.random.RandomState(0).permutation(len(labels))
    held, train = order[:600], order[600:]
    shifted = [images[train]]
    for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1)):
        shifted.append(_shift(images[train], dy, dx))
    x = numpy.concatenate(shifted).reshape(-1, 64)
    y = numpy.concatenate([labels[train]] * len(shifted))
    noise = numpy.random.RandomState(1)
    x = numpy.concatenate([x] + [numpy.clip(x + noise.normal(0, 0.05, x.shape), 0, 1) for _ in range(scale - 1)])
    y = numpy.concatenate([y] * scale)
    numpy.savez(path, x=x.astype(numpy.float32), y=y, x_held=images[held].reshape(-1, 64).astype(numpy.float32),
                y_held=labels[held])


def _shift(images: numpy.ndarray, dy: int, dx: int) -> numpy.ndarray:
    """The 8x8 images moved by (dy, dx) pixels, the uncovered edge blank."""
    out = numpy.zeros_like(images)
    rows = slice(max(dy, 0), 8 + min(dy, 0)), slice(max(-dy, 0), 8 + min(-dy, 0))
    cols = slice(max(dx, 0), 8 + min(dx, 0)), slice(max(-dx, 0), 8 + min(-dx, 0))
    out[:, rows[0], cols[0]] = images[:, rows[1], cols[1]]
    return out


def load_data(path: Path) -> Dict[str, numpy.ndarray]:
    with numpy.load(path) as data:
        return {key: data[key] for key in data.files}


def _seed(params: Mapping[str, Any], salt: int) -> int:
    key = json.dumps({k: params[k] for k in sorted(params) if k in SPACE}, sort_keys=True) + f"/{salt}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")


def init(params: Mapping[str, Any]) -> Dict[str, Any]:
    """A fresh model: weights (He's normal), momentum buffers, epochs trained."""
    hidden = int(params.get("hidden", PBT_HIDDEN))
    rng = numpy.random.RandomState(_seed(params, 0))
    w1 = rng.normal(0.0, numpy.sqrt(2.0 / 64), (64, hidden)).astype(numpy.float32)
    w2 = rng.normal(0.0, numpy.sqrt(2.0 / hidden), (hidden, 10)).astype(numpy.float32)
    weights = {"w1": w1, "b1": numpy.zeros(hidden, numpy.float32), "w2": w2, "b2": numpy.zeros(10, numpy.float32)}
    return {"weights": weights, "velocity": {k: numpy.zeros_like(v) for k, v in weights.items()}, "epochs": 0}


def train_epoch(state: Dict[str, Any], params: Mapping[str, Any], data: Mapping[str, numpy.ndarray]) -> None:
    """One epoch of SGD with momentum and weight decay on the softmax cross-entropy, in place."""
    w, v = state["weights"], state["velocity"]
    lr, momentum, decay = float(params["lr"]), float(params["momentum"]), float(params["weight_decay"])
    batch = int(params["batch_size"])
    order = numpy.random.RandomState(_seed(params, 1 + state["epochs"])).permutation(len(data["y"]))
    for start in range(0, len(order), batch):
        index = order[start:start + batch]
        x, y = data["x"][index], data["y"][index]
        hidden = numpy.maximum(x @ w["w1"] + w["b1"], 0.0)
        logits = hidden @ w["w2"] + w["b2"]
        logits -= logits.max(axis=1, keepdims=True)
        probs = numpy.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        probs[numpy.arange(len(y)), y] -= 1.0
        probs /= len(y)
        grads = {"w2": hidden.T @ probs, "b2": probs.sum(axis=0)}
        back = (probs @ w["w2"].T) * (hidden > 0)
        grads.update(w1=x.T @ back, b1=back.sum(axis=0))
        for key in w:
            v[key] = momentum * v[key] - lr * (grads[key] + decay * w[key])
            w[key] += v[key]
    state["epochs"] += 1


def accuracy(state: Dict[str, Any], data: Mapping[str, numpy.ndarray]) -> float:
    w = state["weights"]
    if not all(numpy.isfinite(value).all() for value in w.values()):
        return 0.1  # diverged: chance
    hidden = numpy.maximum(data["x_held"] @ w["w1"] + w["b1"], 0.0)
    return float(((hidden @ w["w2"] + w["b2"]).argmax(axis=1) == data["y_held"]).mean())


def save(state: Dict[str, Any], path: Path) -> None:
    arrays = {f"w_{k}": a for k, a in state["weights"].items()}
    arrays.update({f"v_{k}": a for k, a in state["velocity"].items()})
    numpy.savez(path, epochs=state["epochs"], **arrays)


def load(path: Path) -> Dict[str, Any]:
    with numpy.load(path) as data:
        return {"weights": {k[2:]: data[k] for k in data.files if k.startswith("w_")},
                "velocity": {k[2:]: data[k] for k in data.files if k.startswith("v_")}, "epochs": int(data["epochs"])}
