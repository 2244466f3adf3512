"""millrace's side of the Gymnasium and ale-py bridge, run in the actor's embedded Python.

Each class steps N environments and writes into arrays it owns, which Rust copies out
through the buffer protocol: `next` (the observation after each action, the last of the
episode where it ended), `first` (where an episode ended: the next one's first
observation), `rewards` (float32), `terminated`, `truncated`, `life_lost` (uint8, 0 or 1). Observations are
converted here to what millrace trains on: float vectors to float32, uint8 or bool
images to uint8 in channel-first layout, bool as 0/255 (networks scale images by 1/255,
so a set bit is a full-scale input, as MinAtar's networks see it).
"""

import importlib
import json
import re

import numpy as np

# Steps an episode may last where Gymnasium registered no limit (MinAtar): Atari's
# 108,000 frames at frame skip 4.
DEFAULT_TIME_LIMIT = 27_000

# Gymnasium namespaces whose environments register when a function of theirs runs
# (importing the package is not enough).
REGISTER = {"MinAtar": "minatar.gym:register_envs", "ALE": "ale_py"}


# Modules already imported (and registration functions already called) by this process.
_IMPORTED = set()


def _import(spec):
    """Imports `pkg` or `pkg:register_fn` (and calls the function), once per process."""
    if spec in _IMPORTED:
        return
    module, _, fn = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure is the user's module failing
        raise RuntimeError(f"module {module!r} does not import: {type(e).__name__}: {e}") from None
    if fn:
        register = getattr(mod, fn, None)
        if register is None:
            raise RuntimeError(f"module {module!r} has no function {fn!r}")
        register()
    _IMPORTED.add(spec)


class Layout:
    """How observations of a Box space become millrace rows."""

    def __init__(self, space, env_id):
        from gymnasium.spaces import Box

        if not isinstance(space, Box):
            raise RuntimeError(
                f"{env_id}: observation space {space} is not a Box (millrace trains on "
                "float vectors and uint8/bool images)"
            )
        dtype = np.dtype(space.dtype)
        shape = tuple(int(d) for d in space.shape)
        self.transpose = None
        # The value a True becomes (networks see images scaled by 1/255).
        self.on = 255 if dtype == np.bool_ else 1
        if dtype.kind == "f":
            self.dtype = np.float32
            self.shape = (int(np.prod(shape)),)
        elif dtype == np.uint8 or dtype == np.bool_:
            self.dtype = np.uint8
            if len(shape) == 2:
                self.shape = (1,) + shape
            elif len(shape) == 3 and shape[0] < min(shape[1], shape[2]):
                # Channels first already (a frame stack: [4, 84, 84]).
                self.shape = shape
            elif len(shape) == 3:
                # Height, width, channels: Gymnasium's image convention (RGB frames,
                # MinAtar's [10, 10, C], Seaquest's [10, 10, 10] included).
                self.transpose = (2, 0, 1)
                self.shape = (shape[2], shape[0], shape[1])
            else:
                raise RuntimeError(
                    f"{env_id}: image observations must be 2-D or 3-D, got shape {shape}"
                )
        else:
            raise RuntimeError(
                f"{env_id}: observation dtype {dtype} is not supported (float, uint8 or bool)"
            )

    def write(self, out, obs):
        obs = np.asarray(obs)
        if self.transpose is not None:
            obs = obs.transpose(self.transpose)
        if self.on != 1:
            obs = obs.astype(np.uint8) * np.uint8(self.on)
        out[...] = obs.reshape(self.shape)


class GymVec:
    """N Gymnasium environments made from one id, stepped one after another."""

    def __init__(self, env_id, n, module, kwargs):
        try:
            import gymnasium as gym
            from gymnasium.spaces import Discrete
        except ImportError as e:
            raise RuntimeError(f"the Gymnasium bridge needs gymnasium: {e}") from None
        if module:
            _import(module)
        else:
            namespace = env_id.split("/")[0] if "/" in env_id else None
            if namespace in REGISTER:
                _import(REGISTER[namespace])
        kwargs = json.loads(kwargs) if kwargs else {}
        if not isinstance(kwargs, dict):
            raise RuntimeError("--env-kwargs must be a JSON object")
        try:
            self.envs = [gym.make(env_id, **kwargs) for _ in range(n)]
        except gym.error.Error as e:
            raise RuntimeError(f"gymnasium cannot make {env_id!r}: {e}") from None
        env = self.envs[0]
        spec = env.spec
        if spec is None or not spec.max_episode_steps:
            # No time limit: one as Atari's (27,000 agent steps), so that a policy that
            # never loses cannot hold an actor's episode, or an evaluation, forever.
            self.envs = [gym.wrappers.TimeLimit(e, DEFAULT_TIME_LIMIT) for e in self.envs]
            env = self.envs[0]
        if not isinstance(env.action_space, Discrete) or env.action_space.start != 0:
            raise RuntimeError(
                f"{env_id}: action space {env.action_space} is not Discrete(n) (millrace's DQN "
                "needs discrete actions)"
            )
        self.layout = Layout(env.observation_space, env_id)
        self.num_actions = int(env.action_space.n)
        self.max_episode_steps = env.spec.max_episode_steps if env.spec else DEFAULT_TIME_LIMIT
        self.reward_threshold = spec.reward_threshold if spec else None
        shape = (n,) + self.layout.shape
        self.next = np.zeros(shape, self.layout.dtype)
        self.first = np.zeros(shape, self.layout.dtype)
        self.rewards = np.zeros(n, np.float32)
        self.terminated = np.zeros(n, np.uint8)
        self.truncated = np.zeros(n, np.uint8)
        self.life_lost = np.zeros(n, np.uint8)

    def reset(self, seeds):
        for i, (env, seed) in enumerate(zip(self.envs, seeds)):
            # 32 bits: what NumPy's legacy RandomState (MinAtar among others) accepts.
            obs, _ = env.reset(seed=int(seed) % 2**32)
            self.layout.write(self.first[i], obs)

    def step(self, actions):
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            self.layout.write(self.next[i], obs)
            self.rewards[i] = reward
            self.terminated[i] = terminated
            self.truncated[i] = truncated
            if terminated or truncated:
                obs, _ = env.reset()
                self.layout.write(self.first[i], obs)

    def set_state(self, i, state):
        """Sets a classic-control environment's `state` (tests compare trajectories)."""
        self.envs[i].unwrapped.state = np.asarray(state, dtype=np.float64)


def packages(names):
    """Each package's version, or why it does not import (for `actor doctor`)."""
    import importlib.metadata
    import sys

    out = [("python", sys.version.split()[0] + " at " + sys.prefix)]
    for name in names:
        try:
            module = importlib.import_module(name)
            version = getattr(module, "__version__", None) or importlib.metadata.version(name)
            out.append((name, str(version)))
        except Exception as e:  # noqa: BLE001 - report whatever stops the import
            out.append((name, f"ERROR {type(e).__name__}: {e}"))
    return out


def rom_name(game):
    """`SpaceInvaders` -> `space_invaders` (ale-py's ROM names)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


class AtariVec:
    """N Atari games in ale-py's vectorised C++ interface (it steps them in its own
    threads, without the GIL) with the DQN preprocessing: frame skip 4 with max-pooling
    over the last two frames, 84x84 grayscale, a stack of 4, up to 30 no-op starts,
    episodes capped at 108,000 frames. Rewards come back unclipped (true scores)."""

    def __init__(self, game, n, v5, threads):
        try:
            import ale_py
            from ale_py import roms
        except ImportError as e:
            raise RuntimeError(f"Atari needs ale-py (pip install ale-py): {e}") from None
        rom = roms.get_rom_path(rom_name(game))
        if rom is None:
            raise RuntimeError(f"ale-py has no ROM for {game!r} ({rom_name(game)})")
        self.ale = ale_py.ALEVectorInterface(
            rom_path=rom,
            num_envs=n,
            frame_skip=4,
            stack_num=4,
            img_height=84,
            img_width=84,
            grayscale=True,
            maxpool=True,
            noop_max=30,
            # Gymnasium's AtariPreprocessing does not press FIRE at reset; SB3's
            # AtariWrapper (the NoFrameskip-v4 convention) does.
            use_fire_reset=not v5,
            episodic_life=False,
            life_loss_info=False,
            reward_clipping=False,
            max_episode_steps=108_000,
            repeat_action_probability=0.25 if v5 else 0.0,
            full_action_space=v5,
            batch_size=0,
            num_threads=threads,
            thread_affinity_offset=-1,
            autoreset_mode="SameStep",
        )
        self.n = n
        # Set by millrace when training with terminal-on-life-loss.
        self.report_life_loss = False
        self.num_actions = len(self.ale.get_action_set())
        self.shape = (4, 84, 84)
        self.lives = np.zeros(n, np.int64)
        self.ids = np.arange(n, dtype=np.int32)
        self.paddle = np.ones(n, dtype=np.float32)
        self.actions = np.zeros(n, dtype=np.int32)
        self.next = np.zeros((n,) + self.shape, np.uint8)
        self.first = np.zeros((n,) + self.shape, np.uint8)
        self.rewards = np.zeros(n, np.float32)
        self.terminated = np.zeros(n, np.uint8)
        self.truncated = np.zeros(n, np.uint8)
        self.life_lost = np.zeros(n, np.uint8)

    def reset(self, seeds):
        # ALE seeds are 31-bit.
        seeds = np.asarray([int(s) % (2**31 - 1) for s in seeds], dtype=np.int64)
        obs, info = self.ale.reset(self.ids, seeds)
        self.first[...] = obs
        self.lives[...] = info["lives"]

    def step(self, actions):
        self.actions[...] = actions
        self.ale.send(self.actions, self.paddle)
        obs, rewards, terminated, truncated, info = self.ale.recv()
        ids = info["env_id"]
        if not np.array_equal(ids, self.ids):
            # Results in environment order, whatever order the threads finished in.
            order = np.argsort(ids)
            obs, rewards, terminated, truncated = (
                obs[order], rewards[order], terminated[order], truncated[order])
            info = {"lives": info["lives"][order], "final_obs": info.get("final_obs", obs)[order]}
        done = terminated | truncated
        lives = info["lives"]
        # A life lost on a step that also ends the game is the game's end, not a lost
        # life; on a step the time limit cut, it is both.
        self.life_lost[...] = self.report_life_loss & (lives < self.lives) & ~terminated
        self.lives[...] = lives
        self.rewards[...] = rewards
        self.terminated[...] = terminated
        self.truncated[...] = truncated
        # Same-step autoreset: `obs` starts the next episode where one ended.
        self.next[...] = obs
        if done.any():
            self.next[done] = info["final_obs"][done]
            self.first[done] = obs[done]
