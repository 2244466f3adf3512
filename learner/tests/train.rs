//! `learner --env CartPole-v1` with its defaults solves CartPole: 100 greedy episodes
//! averaging at least 475, well within a step budget small enough for CI.

use std::process::Command;

#[test]
fn defaults_solve_cartpole() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args([
            "--env",
            "CartPole-v1",
            "--max-steps",
            "100000",
            "--no-progress",
        ])
        .arg("--logdir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("learner runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "not solved:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("solved at"), "{text}");
    let eval_line = text.lines().find(|l| l.contains("eval return:")).unwrap();
    let mean: f32 = eval_line
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert!(mean >= 475.0, "{eval_line}");
    assert!(dir.path().join("checkpoint/meta.json").exists());
}
