//! `learner doctor`: what libtorch this process runs with, whether CUDA works, which
//! devices there are, and for each known mismatch the explanation and the fix. No GPU
//! is a warning (training runs on the CPU); a broken set-up fails.
//!
//! A learner binary cannot start at all without its libtorch; `actor doctor` (which
//! does not link it) covers that case by loading libtorch dynamically.

use std::path::{Path, PathBuf};

pub use millrace_probe::TCH_VERSION;
use millrace_probe::{
    cuda_devices, cuda_of_torch, driver_check, driver_cuda_version, torch_version, Check, Report,
    EXPECTED_TORCH,
};

/// The path of a loaded shared library whose file name starts with `name`, from this
/// process's memory map.
fn loaded(name: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(name))
        })
        .map(PathBuf::from)
}

/// Runs every check.
pub fn report() -> Report {
    let mut r = Report::default();
    let (dir, version) = check_libtorch(&mut r);
    check_cuda(&mut r, dir.as_deref(), version.as_deref());
    if check_devices(&mut r) {
        check_gpu(&mut r);
    }
    r
}

/// libtorch: the one loaded, against the one built with, and tch's own version.
/// Returns libtorch's directory and PyTorch version, where found.
fn check_libtorch(r: &mut Report) -> (Option<PathBuf>, Option<String>) {
    let built = option_env!("MILLRACE_LIBTORCH_LIB").map(PathBuf::from);
    let dir = loaded("libtorch_cpu.so").and_then(|p| p.parent().map(Path::to_path_buf));
    let version = dir.as_deref().and_then(torch_version);
    match (&dir, &version) {
        (Some(d), Some(v)) if v.split('+').next() == Some(EXPECTED_TORCH) => r.0.push(Check::ok(
            "libtorch",
            format!("{} (PyTorch {v})", d.display()),
        )),
        (Some(d), Some(v)) => r.0.push(Check::fail(
            "libtorch",
            format!(
                "{} is PyTorch {v}; tch {TCH_VERSION} needs {EXPECTED_TORCH}",
                d.display()
            ),
            format!(
                "point LD_LIBRARY_PATH at a PyTorch {EXPECTED_TORCH} torch/lib, or unset it to use \
                 the one this binary was built with{}",
                built.as_ref().map_or(String::new(), |b| format!(" ({})", b.display()))
            ),
        )),
        (Some(d), None) => r.0.push(Check::warn(
            "libtorch",
            format!(
                "{} (version unknown: no torch/version.py beside it)",
                d.display()
            ),
            format!("make sure it is PyTorch {EXPECTED_TORCH}"),
        )),
        (None, _) => r.0.push(Check::fail(
            "libtorch",
            "libtorch_cpu.so is not among this process's libraries",
            "rebuild with scripts/setup.sh and cargo build",
        )),
    }
    if let (Some(built), Some(d)) = (&built, &dir) {
        let same = std::fs::canonicalize(built).ok() == std::fs::canonicalize(d).ok();
        if !same {
            r.0.push(Check::warn(
                "libtorch path",
                format!(
                    "running with {}, built against {}",
                    d.display(),
                    built.display()
                ),
                "fine if it is the same PyTorch release (LD_LIBRARY_PATH overrides the rpath)",
            ));
        }
    }
    r.0.push(Check::ok(
        "tch",
        format!("{TCH_VERSION} (for PyTorch {EXPECTED_TORCH})"),
    ));

    (dir, version)
}

/// libtorch_cuda present beside libtorch_cpu and linked (not dropped by the linker),
/// the CUDA runtime, and the driver against the CUDA that PyTorch `version` was built
/// for.
fn check_cuda(r: &mut Report, dir: Option<&Path>, version: Option<&str>) {
    let cuda_lib = dir.map(|d| d.join("libtorch_cuda.so"));
    let cuda_linked = loaded("libtorch_cuda.so").is_some();
    match (cuda_lib.as_ref().is_some_and(|p| p.exists()), cuda_linked) {
        (true, true) => r.0.push(Check::ok("libtorch_cuda", "linked")),
        (true, false) => r.0.push(Check::fail(
            "libtorch_cuda",
            "present but not linked: CUDA is unavailable to this binary whatever the GPU",
            "the linker dropped it (--as-needed): build with the crate's build.rs, which links it \
             with --no-as-needed (see docs/guide/install.md, \"libtorch\")",
        )),
        (false, _) => r.0.push(Check::warn(
            "libtorch_cuda",
            "not present: a CPU-only libtorch",
            "fine for CPU training; for a GPU install the CUDA build of torch",
        )),
    }
    match millrace_core::cuda::runtime_soname() {
        Ok(name) => {
            r.0.push(Check::ok("CUDA runtime", format!("{name} loaded")))
        }
        Err(e) => r.0.push(Check::warn(
            "CUDA runtime",
            e.to_string(),
            "needed only on a GPU host",
        )),
    }
    let shown = version.unwrap_or("unknown");
    r.0.push(driver_check(
        driver_cuda_version(),
        version.and_then(cuda_of_torch),
        shown,
    ));
}

/// The devices the driver sees against those libtorch sees, with each one's free
/// memory; whether libtorch sees any.
fn check_devices(r: &mut Report) -> bool {
    let driver_devices = cuda_devices();
    let available = tch::Cuda::is_available();
    let count = tch::Cuda::device_count();
    match (available, driver_devices.is_empty()) {
        (true, _) => {
            let list: Vec<String> = driver_devices.iter().map(ToString::to_string).collect();
            r.0.push(Check::ok(
                "CUDA devices",
                format!("{count} visible to libtorch: {}", list.join("; ")),
            ));
            for d in &driver_devices {
                if let Ok((free, total)) = millrace_core::cuda::memory(d.index) {
                    r.0.push(Check::ok(
                        "device memory",
                        format!(
                            "cuda:{}: {:.1} GiB free of {:.1} GiB",
                            d.index,
                            free as f64 / f64::from(1u32 << 30),
                            total as f64 / f64::from(1u32 << 30)
                        ),
                    ));
                }
            }
        }
        (false, true) => r.0.push(Check::warn(
            "CUDA devices",
            "none: training runs on the CPU (--gpu is refused)",
            "for a GPU, run on a machine with an NVIDIA GPU and driver",
        )),
        (false, false) => r.0.push(Check::fail(
            "CUDA devices",
            format!(
                "the driver sees {} device(s) but libtorch sees none",
                driver_devices.len()
            ),
            "check CUDA_VISIBLE_DEVICES, that libtorch_cuda is linked, and that the driver \
             supports libtorch's CUDA (see the lines above)",
        )),
    }
    available
}

/// On a GPU: cuDNN, the fp32 math settings, and pinned memory.
fn check_gpu(r: &mut Report) {
    let cudnn = tch::Cuda::cudnn_is_available();
    let v = tch::utils::version_cudnn();
    r.0.push(if cudnn {
        Check::ok("cuDNN", format!("available (version {v})"))
    } else {
        Check::warn(
            "cuDNN",
            "not available: convolutions run slower",
            "install torch with its nvidia-cudnn dependency",
        )
    });
    r.0.push(match millrace_core::torch_settings::current() {
        Ok(math) => Check::ok(
            "fp32 math",
            format!("{math} (libtorch's defaults; the learner sets --tf32 conv and cuDNN benchmark on unless told otherwise)"),
        ),
        Err(e) => Check::warn("fp32 math", e.to_string(), "TF32 settings cannot be read back"),
    });
    let t = tch::Tensor::zeros([1024], (tch::Kind::Float, tch::Device::Cpu));
    match t.f_internal_pin_memory(tch::Device::Cuda(0)) {
        Ok(p) if p.is_pinned(tch::Device::Cuda(0)) => {
            r.0.push(Check::ok("pinned memory", "works (non-blocking copies)"))
        }
        Ok(_) => r.0.push(Check::warn(
            "pinned memory",
            "pin_memory returned unpinned memory: copies block the learner",
            "check the driver and ulimit -l (locked memory)",
        )),
        Err(e) => r.0.push(Check::fail(
            "pinned memory",
            format!("cannot pin host memory: {e}"),
            "check the driver and ulimit -l (locked memory)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This crate's directory, as cargo gives it when running the test (not the path
    /// baked in at build time, which may be another clone's).
    fn crate_dir() -> PathBuf {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
    }

    #[test]
    fn the_tch_version_matches_the_workspace_pin() {
        let cargo = std::fs::read_to_string(crate_dir().join("../Cargo.toml")).unwrap();
        assert!(
            cargo.contains(&format!("tch = \"={TCH_VERSION}\"")),
            "update TCH_VERSION"
        );
    }

    #[test]
    fn this_process_passes_its_own_checks() {
        // The test binary links libtorch like the learner: whatever the machine, the
        // set-up that built it works (a missing GPU is only a warning).
        let report = report();
        let text = report.to_string();
        assert!(!report.failed(), "{text}");
        assert!(text.contains("libtorch "), "{text}");
        assert!(text.contains("CUDA devices"), "{text}");
        if !tch::Cuda::is_available() {
            assert!(text.contains("training runs on the CPU"), "{text}");
        }
    }
}
