"""Time for Stable-Baselines3's DQN to solve CartPole-v1, with rl-zoo3's hyperparameters.

Judged by the rule millrace uses: every 2,000 env steps, 100 greedy episodes
(deterministic=True); a candidate when their mean return is >= 475. Then the rule both
implementations are held to: the solving model is saved, loaded back from the file, and
replayed on 100 fresh Gymnasium episodes; the run counts as solved only if that replay
also averages >= 475. Evaluation time is excluded from the training clock. Prints one
JSON line per seed.

    python time_to_solve.py --seeds 0 1 2 3 4 [--max-steps 100000]
"""

import argparse
import json
import os
import tempfile
import time

import gymnasium as gym
import numpy as np
import rl_zoo3
import stable_baselines3
import torch
import yaml
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback

ENV_ID = "CartPole-v1"


def zoo_hyperparams():
    """rl-zoo3's shipped DQN hyperparameters for CartPole-v1, as rl_zoo3 train reads them."""
    path = os.path.join(os.path.dirname(rl_zoo3.__file__), "hyperparams", "dqn.yml")
    with open(path) as f:
        params = dict(yaml.safe_load(f)[ENV_ID])
    params.pop("n_timesteps")
    policy = params.pop("policy")
    if isinstance(params.get("policy_kwargs"), str):
        params["policy_kwargs"] = eval(params["policy_kwargs"])  # rl-zoo3 does the same
    return policy, params


def greedy_mean(model, episodes, seed):
    """Mean return of `episodes` greedy episodes, stepped side by side."""
    envs = [gym.make(ENV_ID) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    active = list(range(episodes))
    while active:
        actions, _ = model.predict(obs[active], deterministic=True)
        still = []
        for slot, e in enumerate(active):
            o, r, term, trunc, _ = envs[e].step(int(actions[slot]))
            returns[e] += r
            obs[e] = o
            if not (term or trunc):
                still.append(e)
        active = still
    return float(returns.mean())


class SolveCallback(BaseCallback):
    def __init__(self, every, target, episodes, seed):
        super().__init__()
        self.every, self.target, self.episodes, self.seed = every, target, episodes, seed
        self.eval_time = 0.0
        self.solved_at = None
        self.last_mean = None

    def _on_step(self):
        if self.num_timesteps % self.every != 0:
            return True
        t0 = time.perf_counter()
        self.last_mean = greedy_mean(self.model, self.episodes, 10_000 + self.seed)
        self.eval_time += time.perf_counter() - t0
        if self.last_mean >= self.target:
            self.solved_at = self.num_timesteps
            return False
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--eval-every", type=int, default=2_000)
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--target", type=float, default=475.0)
    args = ap.parse_args()
    policy, params = zoo_hyperparams()
    for seed in args.seeds:
        env = gym.make(ENV_ID)
        model = DQN(policy, env, seed=seed, verbose=0, device="cpu", **params)
        cb = SolveCallback(args.eval_every, args.target, args.episodes, seed)
        t0 = time.perf_counter()
        model.learn(total_timesteps=args.max_steps, callback=cb)
        wall = time.perf_counter() - t0
        replay = None
        if cb.solved_at is not None:
            # The saved solving policy, replayed from its file on fresh episodes.
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "solved")
                model.save(path)
                saved = DQN.load(path, device="cpu")
                replay = greedy_mean(saved, args.episodes, 20_000 + seed)
        print(json.dumps({
            "impl": f"sb3-{stable_baselines3.__version__}",
            "seed": seed,
            "claimed": cb.solved_at is not None,
            "replay_mean": replay,
            "solved": replay is not None and replay >= args.target,
            "env_steps": cb.solved_at or model.num_timesteps,
            "train_s": round(wall - cb.eval_time, 2),
            "eval_s": round(cb.eval_time, 2),
            "last_eval": cb.last_mean,
            "updates": int(model._n_updates),
            "torch_threads": torch.get_num_threads(),
            "hyperparams": {k: str(v) for k, v in params.items()},
        }), flush=True)


if __name__ == "__main__":
    main()
