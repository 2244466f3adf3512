//! A user's own Gymnasium environment through the bridge, as users bring one: a package
//! on the Python path, registered by a function `--env-module pkg:fn` names, configured
//! by `--env-kwargs`; the learner trains on it and `learner eval` plays its saved policy.
#![cfg(feature = "gym")]

use std::process::{Command, Output};

const PACKAGE: &str = r#"
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right `length` cells to the goal (reward 1); left does nothing."""

    def __init__(self, length=4):
        self.length = length
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)

    def obs(self):
        o = np.zeros(self.length, np.float32)
        o[self.pos] = 1.0
        return o

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self.obs(), {}

    def step(self, action):
        self.pos = min(self.pos + int(action), self.length - 1)
        done = self.pos == self.length - 1
        return self.obs(), float(done), done, False, {}


def register():
    gym.register("MyPkg/Corridor-v0", entry_point=Corridor, max_episode_steps=50)
"#;

fn learner(args: &[&str], pythonpath: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("PYTHONPATH", pythonpath)
        .output()
        .expect("learner runs")
}

#[test]
fn a_users_registered_env_with_kwargs_trains_and_its_policy_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("my_corridor.py"), PACKAGE).unwrap();
    let logdir = dir.path().join("run");
    let out = learner(
        &[
            "--env",
            "gym:MyPkg/Corridor-v0",
            "--env-module",
            "my_corridor:register",
            "--env-kwargs",
            r#"{"length": 6}"#,
            "--cpu",
            "--max-steps",
            "2000",
            "--learning-starts",
            "256",
            "--eval-every",
            "1000",
            "--eval-episodes",
            "5",
            "--target-return",
            "2",
            "--logdir",
            logdir.to_str().unwrap(),
            "--no-progress",
        ],
        dir.path(),
    );
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    // The corridor returns at most 1: the budget ends the run.
    assert_eq!(out.status.code(), Some(2), "{text}");
    let latest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(logdir.join("checkpoint/latest/meta.json")).unwrap(),
    )
    .unwrap();
    // The kwargs reached the environment: six cells, one-hot.
    assert_eq!(latest["env"]["obs"]["shape"], serde_json::json!([6]));
    assert_eq!(latest["env"]["max_episode_steps"], 50);
    // The checkpoint names the module; eval imports it only when told to. A marker
    // the module would write on import shows it was not.
    let checkpoint = logdir.join("checkpoint");
    let marker = dir.path().join("imported");
    std::fs::write(
        dir.path().join("my_corridor.py"),
        format!(
            "open({:?}, 'w').close()\n{PACKAGE}",
            marker.to_str().unwrap()
        ),
    )
    .unwrap();
    let eval = |extra: &[&str]| {
        let mut args = vec![
            "eval",
            "--episodes",
            "3",
            "--json",
            "--checkpoint",
            checkpoint.to_str().unwrap(),
        ];
        args.extend(extra);
        learner(&args, dir.path())
    };
    let out = eval(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"my_corridor\"") && err.contains("--allow-env-module my_corridor"),
        "{err}"
    );
    assert!(!marker.exists(), "imported without being allowed");
    let out = eval(&["--allow-env-module", "my_corridor"]);
    assert!(marker.exists(), "allowed, it is imported");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["returns"].as_array().unwrap().len(), 3);
}

const NAN_ENV: &str = r#"
import gymnasium as gym
import numpy as np


class NanAfter(gym.Env):
    """Rewards 1, then NaN from the 3,000th step on: a user environment's bug."""

    def __init__(self):
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float("nan") if self.t > 3000 else 1.0
        return np.zeros(3, np.float32), reward, False, self.t % 50 == 0, {}


def register():
    gym.register("MyPkg/NanAfter-v0", entry_point=NanAfter, max_episode_steps=50)
"#;

#[test]
fn an_environment_that_keeps_giving_nan_stops_the_run_in_one_line_after_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nan_after.py"), NAN_ENV).unwrap();
    let logdir = dir.path().join("run");
    let out = learner(
        &[
            "--env",
            "gym:MyPkg/NanAfter-v0",
            "--env-module",
            "nan_after:register",
            "--cpu",
            "--actors",
            "1",
            "--envs-per-actor",
            "1",
            "--max-steps",
            "100000",
            "--logdir",
            logdir.to_str().unwrap(),
            "--no-progress",
        ],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    for part in [
        "gym:MyPkg/NanAfter-v0",
        "non-finite reward",
        "none was stored",
        "a checkpoint was written",
    ] {
        assert!(line.contains(part), "{part:?} not in: {line}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(logdir.join("checkpoint/latest/meta.json").exists());
}
