#!/usr/bin/env python3
"""Plays a policy exported by `learner export` in Gymnasium itself.

Rebuilds the network from the JSON description as a `torch.nn.Sequential`, loads the
safetensors `state_dict` into it (strictly: every key, every shape), and plays N
episodes greedily (argmax of the outputs) in `gymnasium.make(env_id)`. Prints one JSON
object: the mean return, its spread and the per-episode returns.

A `gym:<id>` policy (trained through millrace's Gymnasium bridge, e.g. MinAtar) plays
`gymnasium.make(<id>)` with its observations converted by the bridge's own code
(actor/src/env/gym/bridge.py: images to channel-first uint8, bool as 0/255), the
module and keyword arguments the run used, and the bridge's time limit where Gymnasium
registered none, so the network sees what it trained on. Atari policies (ale-py's vectorised preprocessing) are
evaluated with `learner eval`.

    scripts/play_policy.py policy.safetensors [--episodes 100] [--seed 0]

Needs torch, safetensors, gymnasium and numpy (scripts/setup.sh installs them).
"""

import argparse
import json
import math
import pathlib
import sys

import gymnasium as gym
import numpy as np
import torch
from safetensors.torch import load_file

# Version 2 added convolutions' padding, max-pools and residual blocks (the IMPALA
# network) and the IQN head's embedding and quantile mean; a version-1 file is read as
# well (no padding).
FORMATS = ("millrace-policy/1", "millrace-policy/2")


def load_bridge():
    """millrace's bridge module (observation conversion), from this checkout."""
    import importlib.util

    path = pathlib.Path(__file__).resolve().parent.parent / "actor/src/env/gym/bridge.py"
    spec = importlib.util.spec_from_file_location("millrace_bridge", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Residual(torch.nn.Module):
    """A residual block, x + body(x) (the IMPALA network's)."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class IqnEmbedding(torch.nn.Module):
    """IQN's fraction embedding (Dabney et al. 2018): each row x becomes `quantiles`
    rows x * ReLU(cos(pi * i * tau_j) @ W.T + b), tau_j = (j + 1/2) / quantiles."""

    def __init__(self, embedding, width, quantiles):
        super().__init__()
        self.linear = torch.nn.Linear(embedding, width)
        taus = (torch.arange(quantiles, dtype=torch.float32) + 0.5) / quantiles
        i = torch.arange(embedding, dtype=torch.float32)
        self.register_buffer("cosines", torch.cos(math.pi * i[None, :] * taus[:, None]), persistent=False)

    def forward(self, x):
        phi = torch.relu(self.linear(self.cosines))
        return (x[:, None, :] * phi[None, :, :]).reshape(-1, x.shape[-1])


class QuantileMean(torch.nn.Module):
    """The mean over each observation's `quantiles` rows: Q-values from quantiles."""

    def __init__(self, quantiles):
        super().__init__()
        self.quantiles = quantiles

    def forward(self, x):
        return x.reshape(-1, self.quantiles, x.shape[-1]).mean(1)


def build(layers):
    """The nn.Sequential the description lists, in order."""
    modules = []
    for layer in layers:
        kind = layer["type"]
        if kind == "linear":
            modules.append(torch.nn.Linear(layer["in_features"], layer["out_features"]))
        elif kind == "conv2d":
            modules.append(
                torch.nn.Conv2d(
                    layer["in_channels"],
                    layer["out_channels"],
                    layer["kernel"],
                    stride=layer["stride"],
                    padding=layer.get("padding", 0),
                )
            )
        elif kind == "max_pool2d":
            modules.append(
                torch.nn.MaxPool2d(layer["kernel"], stride=layer["stride"], padding=layer["padding"])
            )
        elif kind == "adaptive_max_pool2d":
            modules.append(torch.nn.AdaptiveMaxPool2d(layer["size"]))
        elif kind == "residual":
            modules.append(Residual(build(layer["body"])))
        elif kind == "iqn_embedding":
            modules.append(IqnEmbedding(layer["embedding"], layer["width"], layer["quantiles"]))
        elif kind == "quantile_mean":
            modules.append(QuantileMean(layer["quantiles"]))
        elif kind == "layer_norm":
            modules.append(torch.nn.LayerNorm(layer["normalized_shape"], eps=layer["eps"]))
        elif kind == "relu":
            modules.append(torch.nn.ReLU())
        elif kind == "flatten":
            modules.append(torch.nn.Flatten())
        else:
            raise SystemExit(f"unknown layer type {kind!r}")
    return torch.nn.Sequential(*modules)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights", type=pathlib.Path, help="the exported .safetensors file")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    args = parser.parse_args()

    description = json.loads(args.weights.with_suffix(".json").read_text())
    if description.get("format") not in FORMATS:
        raise SystemExit(f"not a {' or '.join(FORMATS)} description: {description.get('format')!r}")
    net = build(description["layers"])
    net.load_state_dict(load_file(str(args.weights)), strict=True)
    net.eval()
    pre = description["preprocessing"]
    dtype = {"float32": np.float32, "uint8": np.uint8}[pre["dtype"]]
    scale = float(pre["scale"])

    env_id = description["env_id"]
    convert = None
    if env_id.startswith("gym:"):
        bridge = load_bridge()
        env_id = env_id[len("gym:"):]
        namespace = env_id.split("/")[0] if "/" in env_id else None
        module = description.get("env_module") or bridge.REGISTER.get(namespace)
        if module:
            bridge._import(module)
    kwargs = json.loads(description.get("env_kwargs") or "{}")
    env = gym.make(env_id, **kwargs)
    if description["env_id"].startswith("gym:") and env.spec.max_episode_steps is None:
        # As the bridge trained and evaluated it.
        env = gym.wrappers.TimeLimit(env, bridge.DEFAULT_TIME_LIMIT)
    if description["env_id"].startswith("gym:"):
        layout = bridge.Layout(env.observation_space, env_id)
        if list(layout.shape) != list(pre["shape"]):
            raise SystemExit(f"{env_id} converts to {layout.shape}, the policy expects {pre['shape']}")

        def convert(obs):
            out = np.zeros(layout.shape, layout.dtype)
            layout.write(out, obs)
            return out
    elif tuple(env.observation_space.shape) != tuple(pre["shape"]):
        raise SystemExit(
            f"{description['env_id']} observes {env.observation_space.shape}, "
            f"the policy expects {pre['shape']}"
        )
    returns = []
    with torch.no_grad():
        for episode in range(args.episodes):
            obs, _ = env.reset(seed=args.seed + episode)
            total, done = 0.0, False
            while not done:
                if convert is not None:
                    obs = convert(obs)
                x = torch.as_tensor(np.asarray(obs, dtype=dtype)).float().unsqueeze(0) * scale
                action = int(net(x).argmax(dim=1).item())
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    n = len(returns)
    mean = sum(returns) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / (n - 1)) if n > 1 else 0.0
    json.dump(
        {
            "env_id": description["env_id"],
            "gymnasium": gym.__version__,
            "episodes": n,
            "seed": args.seed,
            "mean": mean,
            "std": std,
            "stderr": std / math.sqrt(n),
            "min": min(returns),
            "max": max(returns),
            "returns": returns,
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
