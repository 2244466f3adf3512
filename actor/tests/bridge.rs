//! The Gymnasium bridge against the real packages (scripts/setup.sh installs them):
//! bridged CartPole and the Rust port agree step for step, Atari and MinAtar come out
//! with the shapes and types the networks expect, and what cannot run says why.
#![cfg(feature = "gym")]

use millrace_actor::env::gym::{AtariVec, GymVec};
use millrace_actor::env::{make_vec, spec_of, AnyVecEnv, CartPole, Env, EnvError, Step, VecEnv};
use millrace_proto::{DType, EnvConfig};

#[test]
fn bridged_cartpole_follows_the_port_from_the_same_state() {
    let mut bridged = GymVec::make_vector(&EnvConfig::new("gym:CartPole-v1"), 1).unwrap();
    assert_eq!(bridged.spec().obs.shape, [4]);
    assert_eq!(bridged.spec().max_episode_steps, 500);
    assert_eq!(bridged.spec().reward_threshold, Some(475.0));
    let mut port = CartPole::new(0);
    let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
    bridged.reset(&[1], &mut b).unwrap();
    let (mut first, mut steps) = ([0f32; 4], [Step::default()]);
    let mut episodes = 0;
    let mut t = 0usize;
    // Start states away from the port's own; a policy that balances for a while (so
    // one episode is truncated at 500) and one that falls.
    let starts = [
        [0.01, -0.02, 0.03, 0.04],
        [0.0, 0.0, 0.0, 0.0],
        [-0.03, 0.02, -0.01, 0.01],
    ];
    for (e, start) in starts.iter().enumerate() {
        port.set_state(start, &mut a).unwrap();
        bridged.set_state(0, start).unwrap();
        loop {
            let action = if e == 1 {
                // Push towards where the pole falls: balances until the time limit.
                usize::from(a[2] + 0.5 * a[3] > 0.0)
            } else {
                (t * 7 / 3) % 2
            };
            t += 1;
            let expected = port.step(action, &mut a);
            bridged
                .step(&[action], &mut b, &mut first, &mut steps)
                .unwrap();
            assert_eq!((steps[0], b), (expected, a), "step {t} of episode {e}");
            if expected.done() {
                episodes += 1;
                if e == 1 {
                    assert!(
                        expected.truncated,
                        "the balancing episode reaches the limit"
                    );
                }
                break;
            }
        }
    }
    assert_eq!(episodes, 3);
}

#[test]
fn atari_frames_have_the_dqn_shape_in_both_conventions() {
    for (id, actions) in [("PongNoFrameskip-v4", 6), ("ALE/Pong-v5", 18)] {
        let mut envs = AtariVec::new(&EnvConfig::new(id), 2).unwrap();
        let spec = envs.spec().clone();
        assert_eq!(
            (spec.obs.shape.clone(), spec.obs.dtype),
            (vec![4, 84, 84], DType::U8)
        );
        assert_eq!(spec.num_actions, actions, "{id}");
        let d = spec.obs.numel();
        let (mut obs, mut next, mut steps) =
            (vec![0u8; 2 * d], vec![0u8; 2 * d], [Step::default(); 2]);
        envs.reset(&[1, 2], &mut obs).unwrap();
        // The newest frame of the first stack shows the court.
        assert!(
            obs[3 * 84 * 84..d].iter().any(|p| *p != 0),
            "{id}: a blank first frame"
        );
        let mut rewards = 0.0;
        for t in 0..200 {
            envs.step(
                &[t % actions, (t + 1) % actions],
                &mut next,
                &mut obs,
                &mut steps,
            )
            .unwrap();
            for (i, s) in steps.iter().enumerate() {
                assert!(!s.done(), "Pong does not end in 200 steps");
                rewards += s.reward.abs();
                // Each stack shifts by one frame: the previous newest is now third.
                let stack = &next[i * d..(i + 1) * d];
                let prev = &obs[i * d..(i + 1) * d];
                assert_eq!(
                    stack[2 * 84 * 84..3 * 84 * 84],
                    prev[3 * 84 * 84..],
                    "{id} t={t}"
                );
            }
            obs.copy_from_slice(&next);
        }
        assert!(
            rewards > 0.0,
            "{id}: points are scored in 200 steps of random-ish play"
        );
    }
}

#[test]
fn minatar_images_become_channel_first_bytes() {
    let cfg = EnvConfig::new("gym:MinAtar/Breakout-v1");
    let spec = spec_of(&cfg).unwrap();
    assert_eq!(
        (spec.obs.shape.clone(), spec.obs.dtype),
        (vec![4, 10, 10], DType::U8)
    );
    assert_eq!(spec.num_actions, 3);
    assert_eq!(
        spec.max_episode_steps, 27_000,
        "a limit where none is registered"
    );
    let AnyVecEnv::Pixels(mut envs) = make_vec(&cfg, 3, 0).unwrap() else {
        panic!("MinAtar has image observations");
    };
    let d = spec.obs.numel();
    let mut obs = vec![7u8; 3 * d];
    envs.reset(&[1, 2, 3], &mut obs).unwrap();
    assert!(
        obs.iter().all(|p| *p == 0 || *p == 255),
        "bool planes become 0/255"
    );
    // Breakout shows the paddle in channel 0 on the bottom row.
    assert!(obs[..100][90..].contains(&255));
    // Seaquest is [10, 10, 10] height-width-channels: channel-first after the bridge,
    // its submarine (channel 0) a single cell near the top.
    let cfg = EnvConfig::new("gym:MinAtar/Seaquest-v1");
    let AnyVecEnv::Pixels(mut envs) = make_vec(&cfg, 1, 0).unwrap() else {
        panic!("MinAtar has image observations");
    };
    assert_eq!(envs.spec().obs.shape, [10, 10, 10]);
    let mut obs = vec![0u8; 1000];
    envs.reset(&[5], &mut obs).unwrap();
    let sub: Vec<usize> = (0..100).filter(|i| obs[*i] == 255).collect();
    assert_eq!(sub.len(), 1, "one submarine cell in channel 0: {sub:?}");
    assert!(sub[0] < 30, "near the surface: cell {}", sub[0]);
}

#[test]
fn what_cannot_run_is_one_clear_error() {
    let err = |cfg: EnvConfig| {
        let msg = match make_vec(&cfg, 1, 0) {
            Err(EnvError::Bridge(msg) | EnvError::Options(msg)) => msg,
            Err(e) => e.to_string(),
            Ok(_) => panic!("{} should not build", cfg.id),
        };
        assert!(!msg.contains('\n'), "one line: {msg}");
        msg
    };
    let msg = err(EnvConfig::new("gym:NoSuchEnv-v0"));
    assert!(msg.contains("NoSuchEnv"), "{msg}");
    let msg = err(EnvConfig::new("gym:Pendulum-v1"));
    assert!(msg.contains("not Discrete"), "{msg}");
    let msg = err(EnvConfig {
        module: Some("no_such_module_here".into()),
        ..EnvConfig::new("gym:Foo-v0")
    });
    assert!(
        msg.contains("no_such_module_here") && msg.contains("does not import"),
        "{msg}"
    );
    let msg = err(EnvConfig::new("ALE/NoSuchGame-v5"));
    assert!(msg.contains("no ROM"), "{msg}");
    let msg = err(EnvConfig {
        kwargs: Some("{}".into()),
        ..EnvConfig::new("CartPole-v1")
    });
    assert!(msg.contains("gym: ids"), "{msg}");
}

#[test]
fn atari_reports_lost_lives_only_when_asked() {
    for report in [false, true] {
        let cfg = EnvConfig {
            terminal_on_life_loss: report,
            ..EnvConfig::new("BreakoutNoFrameskip-v4")
        };
        let mut envs = AtariVec::new(&cfg, 2).unwrap();
        let d = envs.spec().obs.numel();
        let (mut obs, mut next, mut steps) =
            (vec![0u8; 2 * d], vec![0u8; 2 * d], [Step::default(); 2]);
        envs.reset(&[3, 4], &mut obs).unwrap();
        let mut lost = 0;
        // Random play loses a life every ~40 steps; NOOP (0) and FIRE (1) mostly.
        for t in 0..600 {
            envs.step(&[t % 4, (t / 3) % 4], &mut next, &mut obs, &mut steps)
                .unwrap();
            for s in &steps {
                assert!(
                    !(s.life_lost && s.terminated),
                    "a game over is not a lost life"
                );
                lost += usize::from(s.life_lost);
            }
        }
        assert_eq!(
            lost > 0,
            report,
            "{lost} lives reported lost (asked: {report})"
        );
    }
}
