//! The actors' SGEMM ([`millrace_actor::gemm`], weights packed once per version) beside
//! `matrixmultiply` 0.3 (what they used before: both operands packed, into a freshly
//! allocated buffer, on every call), on the products of one forward pass of the three
//! networks at 8 observations. Both give the same bits (gemm's tests); this is speed.
//!
//! `cargo bench -p millrace-actor --bench gemm [-- --seconds 0.5]`: a Markdown table,
//! GFLOP/s, each row timed for both in turn.

use std::time::Instant;

use millrace_actor::gemm::{PackedCols, PackedRows};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// Calls `f` for about `seconds`; GFLOP/s for a product of `m · k · n`.
fn gflops(seconds: f64, (m, k, n): (usize, usize, usize), mut f: impl FnMut()) -> f64 {
    f();
    let (started, mut calls) = (Instant::now(), 0u64);
    while started.elapsed().as_secs_f64() < seconds {
        f();
        calls += 1;
    }
    2.0 * (m * k * n) as f64 * calls as f64 / started.elapsed().as_secs_f64() / 1e9
}

fn values(len: usize) -> Vec<f32> {
    (0..len).map(|i| (i % 13) as f32 * 0.05 - 0.3).collect()
}

/// `c[m, n] += a[m, k] · b[k, n]`, row-major, through `matrixmultiply`.
fn sgemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: row-major strides of the given shapes; lengths checked above.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            1.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

fn main() {
    let seconds: f64 = arg("--seconds", "0.5").parse().expect("--seconds");
    // (network, layer, kind, m, k, n): a dense layer is [m = batch, k] · [k, n]; a
    // convolution is [m = out channels, k = in·k·k] · [k, n = batch · out pixels].
    let rows = [
        ("MLP (CartPole)", "dense 1", "dense", 8, 4, 128),
        ("MLP (CartPole)", "dense 2", "dense", 8, 128, 128),
        ("MLP (CartPole)", "output", "dense", 8, 128, 2),
        ("MinAtar CNN", "conv 3×3", "conv", 16, 36, 8 * 64),
        ("MinAtar CNN", "dense", "dense", 8, 1024, 128),
        ("Nature CNN", "conv 8×8/4", "conv", 32, 256, 8 * 400),
        ("Nature CNN", "conv 4×4/2", "conv", 64, 512, 8 * 81),
        ("Nature CNN", "conv 3×3/1", "conv", 64, 576, 8 * 49),
        ("Nature CNN", "dense 3136→512", "dense", 8, 3136, 512),
    ];
    println!("| network | layer | m × k × n | matrixmultiply GFLOP/s | packed GFLOP/s | packed / matrixmultiply |");
    println!("|---|---|---|---|---|---|");
    for (net, layer, kind, m, k, n) in rows {
        let (a, b) = (values(m * k), values(k * n));
        let mut c = vec![0.0f32; m * n];
        let theirs = gflops(seconds, (m, k, n), || sgemm(m, k, n, &a, &b, &mut c));
        let ours = if kind == "dense" {
            let mut w = PackedCols::default();
            w.pack(&b, k, n);
            gflops(seconds, (m, k, n), || w.mul_add_to(&a, m, &mut c))
        } else {
            let mut w = PackedRows::default();
            w.pack(&a, m, k);
            gflops(seconds, (m, k, n), || w.mul_add_to(&b, n, &mut c))
        };
        println!(
            "| {net} | {layer} | {m} × {k} × {n} | {theirs:.1} | {ours:.1} | {:.2} |",
            ours / theirs
        );
    }
}
