//! Replays Gymnasium 1.4.0's reference trajectories (`shared/golden/`, or `GOLDEN_DIR`)
//! against the ports: observations within the file's tolerance, rewards and episode-end
//! flags exact, time limits included.

use std::path::PathBuf;

use serde::Deserialize;

use super::{Acrobot, CartPole, Env, MountainCar};

#[derive(Deserialize)]
struct Golden {
    env: String,
    float_tolerance: f64,
    episodes: Vec<Episode>,
}

#[derive(Deserialize)]
struct Episode {
    seed: u64,
    policy: String,
    initial_state: Vec<f64>,
    reset_obs: Vec<f32>,
    steps: Vec<GoldenStep>,
}

#[derive(Deserialize)]
struct GoldenStep {
    action: usize,
    obs: Vec<f32>,
    reward: f32,
    terminated: bool,
    truncated: bool,
}

fn golden_dir() -> PathBuf {
    // Cargo sets CARGO_MANIFEST_DIR when it runs a test: read it then, not at build
    // time, since a test binary built in another clone (a shared target dir, sources
    // unchanged) would carry that clone's path.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    match std::env::var_os("GOLDEN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => manifest.join("../../shared/golden"),
    }
}

fn load(id: &str) -> Golden {
    let path = golden_dir().join(format!("{id}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}); set GOLDEN_DIR to the reference directory",
            path.display()
        )
    });
    let golden: Golden = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not a golden file: {e}", path.display()));
    assert_eq!(golden.env, id);
    assert!(!golden.episodes.is_empty(), "{id}: no episodes");
    golden
}

/// Replays every episode of `id`, starting each from its recorded internal state.
fn replay<E: Env>(id: &str, mut make: impl FnMut() -> E, set: fn(&mut E, &[f64], &mut [f32])) {
    let golden = load(id);
    let tol = golden.float_tolerance;
    let mut env = make();
    let mut obs = vec![0.0f32; env.spec().obs.numel()];
    for (e, episode) in golden.episodes.iter().enumerate() {
        let ctx = format!(
            "{id} episode {e} (seed {}, {})",
            episode.seed, episode.policy
        );
        set(&mut env, &episode.initial_state, &mut obs);
        assert_close(&obs, &episode.reset_obs, tol, &format!("{ctx} reset"));
        for (t, want) in episode.steps.iter().enumerate() {
            let got = env.step(want.action, &mut obs);
            let at = format!("{ctx} step {t}");
            assert_close(&obs, &want.obs, tol, &at);
            assert_eq!(got.reward, want.reward, "{at}: reward");
            assert_eq!(got.terminated, want.terminated, "{at}: terminated");
            assert_eq!(got.truncated, want.truncated, "{at}: truncated");
        }
        let last = episode.steps.last().expect("episode has steps");
        assert!(
            last.terminated || last.truncated,
            "{ctx}: reference ends mid-episode"
        );
    }
}

fn assert_close(got: &[f32], want: &[f32], tol: f64, at: &str) {
    assert_eq!(got.len(), want.len(), "{at}: observation length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let diff = (f64::from(*g) - f64::from(*w)).abs();
        assert!(
            diff <= tol,
            "{at}: obs[{i}] = {g}, reference {w} (|diff| {diff:e} > {tol:e})"
        );
    }
}

#[test]
fn cartpole_matches_gymnasium() {
    replay(
        "CartPole-v1",
        || CartPole::new(0),
        |env, s, o| env.set_state(s, o).unwrap(),
    );
}

#[test]
fn acrobot_matches_gymnasium() {
    replay(
        "Acrobot-v1",
        || Acrobot::new(0),
        |env, s, o| env.set_state(s, o).unwrap(),
    );
}

#[test]
fn mountain_car_matches_gymnasium() {
    replay(
        "MountainCar-v0",
        || MountainCar::new(0),
        |env, s, o| env.set_state(s, o).unwrap(),
    );
}

#[test]
fn reset_draws_within_gymnasium_bounds_and_is_seeded() {
    for id in super::KNOWN_IDS {
        let mut a = super::make(id, 7).unwrap();
        let mut b = super::make(id, 999).unwrap();
        let n = a.spec().obs.numel();
        let (mut oa, mut ob) = (vec![0.0; n], vec![0.0; n]);
        a.reset(Some(42), &mut oa);
        b.reset(Some(42), &mut ob);
        assert_eq!(oa, ob, "{id}: same seed, same start");
        b.reset(Some(43), &mut ob);
        assert_ne!(oa, ob, "{id}: another seed, another start");
    }
    let mut env = CartPole::new(1);
    let mut obs = [0.0f32; 4];
    for _ in 0..100 {
        env.reset(None, &mut obs);
        assert!(obs.iter().all(|x| x.abs() <= 0.05));
    }
}

#[test]
fn unknown_id_is_a_clear_error() {
    let err = super::make("Pong-v5", 0).err().unwrap();
    assert!(err.to_string().contains("CartPole-v1"), "{err}");
}
