"""Peers for bench/atari_actor.sh: Atari agent steps per second driven from Python.

  --impl ale-vector   ale-py's own vectorised env (AtariVectorEnv: C++ threads, DQN
                      preprocessing inside), random actions;
  --impl gymnasium    N Gymnasium envs in a plain loop, each wrapped as the DQN papers
                      do: AtariPreprocessing (noop 30, frame skip 4 with max-pool, 84x84
                      grayscale) + FrameStackObservation(4).
  --infer             also run a Nature-DQN CNN in PyTorch (CPU, one thread) on the
                      batch of observations every step, as a PyTorch actor does.

Prints one JSON line like the Rust bench (actor/benches/throughput.rs).
"""

import argparse
import json
import time

import numpy as np


def nature_cnn(actions):
    import torch
    from torch import nn

    torch.set_num_threads(1)
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, 4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, 1), nn.ReLU(),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, actions),
    ).eval()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["ale-vector", "gymnasium"], required=True)
    p.add_argument("--game", default="pong")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--infer", action="store_true")
    a = p.parse_args()

    import gymnasium as gym
    import ale_py

    n = a.envs
    if a.impl == "ale-vector":
        env = ale_py.vector_env.AtariVectorEnv(a.game, num_envs=n, reward_clipping=False)
        actions_n = env.single_action_space.n
        obs, _ = env.reset(seed=0)

        def step(actions):
            obs, *_ = env.step(actions)
            return obs
    else:
        gym.register_envs(ale_py)
        name = "".join(w.capitalize() for w in a.game.split("_"))

        def make():
            e = gym.make(f"{name}NoFrameskip-v4")
            e = gym.wrappers.AtariPreprocessing(e, noop_max=30, frame_skip=4, screen_size=84,
                                                grayscale_obs=True)
            return gym.wrappers.FrameStackObservation(e, 4)

        envs = [make() for _ in range(n)]
        actions_n = envs[0].action_space.n
        frames = np.stack([e.reset(seed=i)[0] for i, e in enumerate(envs)])

        def step(actions):
            for i, e in enumerate(envs):
                o, _, term, trunc, _ = e.step(int(actions[i]))
                if term or trunc:
                    o, _ = e.reset()
                frames[i] = o
            return frames

        obs = frames
    net = nature_cnn(actions_n) if a.infer else None
    rng = np.random.default_rng(0)

    def act(obs):
        if net is None:
            return rng.integers(0, actions_n, n)
        import torch

        with torch.no_grad():
            q = net(torch.from_numpy(np.asarray(obs)).float().div_(255.0))
        return q.argmax(1).numpy()

    warm = time.perf_counter()
    while time.perf_counter() - warm < min(2.0, a.seconds):
        obs = step(act(obs))
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        obs = step(act(obs))
        steps += n
    elapsed = time.perf_counter() - t0
    print(json.dumps({
        "impl": a.impl, "env": a.game, "mode": "actor" if a.infer else "env", "envs": n,
        "threads": 1, "steps_per_s": round(steps / elapsed, 1), "seconds": round(elapsed, 1),
    }))


if __name__ == "__main__":
    main()
