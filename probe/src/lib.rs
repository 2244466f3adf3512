//! Set-up checks both binaries run: is there a libtorch the learner can load, does it
//! match the one millrace was built for, and can this machine's NVIDIA driver run its
//! CUDA build?
//!
//! Nothing here links libtorch or CUDA: both are loaded dynamically (`dlopen`), so
//! `actor doctor` can say exactly what is missing where a learner binary would not
//! start at all, and the learner can probe devices before it touches them. `learner
//! doctor` adds what only a process with libtorch loaded can see (cuDNN, pinned memory)
//! and shares the reporting ([`Check`], [`Report`]) and driver checks here.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// The `tch` release the learner uses (pinned in the workspace's Cargo.toml; the
/// learner's tests check the two agree).
pub const TCH_VERSION: &str = "0.24.0";

/// The PyTorch release `tch` [`TCH_VERSION`] is built against (see docs/guide/install.md, "libtorch").
pub const EXPECTED_TORCH: &str = "2.11.0";

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, but not as well as it could (no GPU: training runs on the CPU).
    Warn,
    /// Broken: training cannot run as set up.
    Fail,
}

/// One line of a report, with the explanation and the fix where it is not ok.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(name: &str, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// A list of checks: printed one per line, and an exit status (non-zero when any failed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report(pub Vec<Check>);

impl Report {
    pub fn failed(&self) -> bool {
        self.0.iter().any(|c| c.status == Status::Fail)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in &self.0 {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            writeln!(f, "{tag}  {:<18} {}", c.name, c.detail)?;
            if let Some(fix) = &c.fix {
                writeln!(f, "      {:<18} fix: {fix}", "")?;
            }
        }
        let (warn, fail) = self.0.iter().fold((0, 0), |(w, f), c| match c.status {
            Status::Warn => (w + 1, f),
            Status::Fail => (w, f + 1),
            Status::Ok => (w, f),
        });
        match (fail, warn) {
            (0, 0) => writeln!(f, "all checks passed"),
            (0, w) => writeln!(f, "{w} warning(s), no failures"),
            (n, _) => writeln!(f, "{n} check(s) failed: the set-up is broken"),
        }
    }
}

/// The PyTorch version of a `torch/lib` directory, from `torch/version.py`
/// (`__version__ = '2.11.0+cu130'`).
pub fn torch_version(lib_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(lib_dir.parent()?.join("version.py")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("__version__ = "))
        .map(|v| v.trim().trim_matches(['\'', '"']).to_string())
}

/// The CUDA major.minor a PyTorch version string was built for (`2.11.0+cu130` → 13.0),
/// or `None` for CPU builds and versions without a `+cuXYZ` suffix.
pub fn cuda_of_torch(version: &str) -> Option<(u32, u32)> {
    let cu = version.split('+').nth(1)?.strip_prefix("cu")?;
    let n: u32 = cu.parse().ok()?;
    Some((n / 10, n % 10))
}

/// Where a libtorch might be, in the order tried: `--libtorch`, `$LIBTORCH/lib`, the
/// project virtualenv (`$MILLRACE_VENV`, else `~/.cache/millrace/venv`), and beside
/// this binary (`lib/` and `../lib/`, where images put it).
pub fn libtorch_candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = explicit {
        dirs.push(d.to_path_buf());
        return dirs;
    }
    if let Some(root) = std::env::var_os("LIBTORCH") {
        dirs.push(PathBuf::from(root).join("lib"));
    }
    let venv = std::env::var_os("MILLRACE_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/millrace/venv"))
        });
    if let Some(venv) = venv {
        if let Ok(entries) = std::fs::read_dir(venv.join("lib")) {
            let mut pythons: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            pythons.sort();
            for py in pythons {
                dirs.push(py.join("site-packages/torch/lib"));
            }
        }
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.join("lib"));
        dirs.push(exe_dir.join("../lib"));
    }
    dirs
}

/// The library a `dlerror` message says could not be opened, if any
/// (`libcudart.so.13: cannot open shared object file: ...`).
fn missing_library(message: &str) -> Option<&str> {
    let at = message.find(": cannot open shared object file")?;
    let head = &message[..at];
    Some(head.rsplit([' ', ':']).next().unwrap_or(head).trim())
}

/// Why a library from a PyTorch wheel might be missing, and what to do.
fn explain_missing(lib: &str) -> String {
    if [
        "libcudart",
        "libcupti",
        "libnvrtc",
        "libcublas",
        "libcudnn",
        "libnccl",
        "libcusparse",
        "libcufft",
        "libcurand",
        "libnvJitLink",
        "libcusolver",
    ]
    .iter()
    .any(|p| lib.starts_with(p))
    {
        format!(
            "{lib} comes from the nvidia-* packages PyTorch's wheel depends on (even its CPU \
             library needs them): install torch with its dependencies, \
             `pip install torch=={EXPECTED_TORCH}` (not --no-deps), or run scripts/setup.sh"
        )
    } else {
        format!("{lib} is missing: reinstall torch=={EXPECTED_TORCH} (scripts/setup.sh)")
    }
}

/// An open library handle, or `dlerror`'s message.
fn dlopen(path: &Path) -> Result<*mut c_void, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path; the handle is deliberately never closed (closing
    // libtorch is not supported, and the process ends soon after a doctor run).
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local NUL-terminated string or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown dlopen error".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated, valid until the next dl* call.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(msg);
    }
    Ok(handle)
}

/// Finds libtorch among `candidates`, loads it (as the learner would) and reports what
/// is missing or mismatched, then checks the NVIDIA driver against its CUDA build.
pub fn libtorch_checks(candidates: &[PathBuf]) -> Report {
    let mut report = Report::default();
    let Some(dir) = candidates
        .iter()
        .find(|d| d.join("libtorch_cpu.so").exists())
    else {
        let tried: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
        report.0.push(Check::fail(
            "libtorch",
            format!("libtorch_cpu.so not found (looked in: {})", tried.join(", ")),
            format!(
                "run scripts/setup.sh (installs torch=={EXPECTED_TORCH} into the project \
                 virtualenv), or point --libtorch / LIBTORCH at a PyTorch {EXPECTED_TORCH} torch/lib"
            ),
        ));
        return report;
    };
    let version = torch_version(dir);
    let shown = version.as_deref().unwrap_or("version unknown");
    match &version {
        Some(v) if v.split('+').next() == Some(EXPECTED_TORCH) => {
            report.0.push(Check::ok("libtorch", format!("{} (PyTorch {v})", dir.display())));
        }
        Some(v) => report.0.push(Check::fail(
            "libtorch",
            format!(
                "{} is PyTorch {v}; tch {TCH_VERSION} was built for {EXPECTED_TORCH}",
                dir.display()
            ),
            format!(
                "install torch=={EXPECTED_TORCH} (scripts/setup.sh); a learner built against another \
                 libtorch fails with undefined symbols or crashes"
            ),
        )),
        None => report.0.push(Check::warn(
            "libtorch",
            format!("{} (no version.py beside it)", dir.display()),
            format!("make sure it is PyTorch {EXPECTED_TORCH}"),
        )),
    }
    for lib in ["libtorch_cpu.so", "libtorch.so", "libtorch_cuda.so"] {
        let path = dir.join(lib);
        if lib == "libtorch_cuda.so" && !path.exists() {
            report.0.push(Check::warn(
                lib,
                "not present: a CPU-only libtorch",
                "fine for CPU training; for a GPU install the CUDA build of torch",
            ));
            continue;
        }
        match dlopen(&path) {
            Ok(_) => report.0.push(Check::ok(lib, "loads")),
            Err(msg) => {
                let explanation = missing_library(&msg)
                    .map(explain_missing)
                    .unwrap_or_else(|| {
                        format!("reinstall torch=={EXPECTED_TORCH} (scripts/setup.sh)")
                    });
                report.0.push(Check::fail(
                    lib,
                    format!("cannot be loaded: {msg}"),
                    explanation,
                ));
            }
        }
    }
    report.0.push(driver_check(
        driver_cuda_version(),
        version.as_deref().and_then(cuda_of_torch),
        shown,
    ));
    report
}

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type CuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` and `_MINOR`.
const CU_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_COMPUTE_CAPABILITY_MINOR: c_int = 76;

/// A CUDA device as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    pub total_bytes: usize,
    /// Compute capability (major, minor), when the driver reports it.
    pub compute_capability: Option<(i32, i32)>,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} ({:.1} GiB",
            self.index,
            self.name,
            self.total_bytes as f64 / f64::from(1u32 << 30)
        )?;
        match self.compute_capability {
            Some((major, minor)) => write!(f, ", compute capability {major}.{minor})"),
            None => f.write_str(")"),
        }
    }
}

/// The CUDA devices the NVIDIA driver sees (none without a driver), from the driver
/// API, so that errors can list them by name and memory.
pub fn cuda_devices() -> Vec<DeviceInfo> {
    let Ok(handle) = dlopen(Path::new("libcuda.so.1")) else {
        return Vec::new();
    };
    let sym = |name: &CStr| {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, name.as_ptr() as *const c_char) };
        (!p.is_null()).then_some(p)
    };
    let (Some(init), Some(count), Some(get), Some(name), Some(mem)) = (
        sym(c"cuInit"),
        sym(c"cuDeviceGetCount"),
        sym(c"cuDeviceGet"),
        sym(c"cuDeviceGetName"),
        sym(c"cuDeviceTotalMem_v2"),
    ) else {
        return Vec::new();
    };
    // SAFETY: the CUDA driver API's function of that name and signature.
    let attribute = sym(c"cuDeviceGetAttribute")
        .map(|p| unsafe { std::mem::transmute::<*mut c_void, CuDeviceGetAttribute>(p) });
    // SAFETY: the CUDA driver API's functions of those names and signatures.
    let (init, count, get, name, mem) = unsafe {
        (
            std::mem::transmute::<*mut c_void, CuInit>(init),
            std::mem::transmute::<*mut c_void, CuDeviceGetCount>(count),
            std::mem::transmute::<*mut c_void, CuDeviceGet>(get),
            std::mem::transmute::<*mut c_void, CuDeviceGetName>(name),
            std::mem::transmute::<*mut c_void, CuDeviceTotalMem>(mem),
        )
    };
    let mut n: c_int = 0;
    // SAFETY: valid out-pointers throughout; buffers sized as passed.
    unsafe {
        if init(0) != 0 || count(&mut n) != 0 {
            return Vec::new();
        }
        (0..n)
            .filter_map(|i| {
                let mut dev: c_int = 0;
                if get(&mut dev, i) != 0 {
                    return None;
                }
                let mut buf = [0 as c_char; 256];
                let named = name(buf.as_mut_ptr(), buf.len() as c_int, dev) == 0;
                let mut total = 0usize;
                let _ = mem(&mut total, dev);
                let compute_capability = attribute.and_then(|attr| {
                    let (mut major, mut minor): (c_int, c_int) = (0, 0);
                    let ok = attr(&mut major, CU_COMPUTE_CAPABILITY_MAJOR, dev) == 0
                        && attr(&mut minor, CU_COMPUTE_CAPABILITY_MINOR, dev) == 0;
                    ok.then_some((major, minor))
                });
                Some(DeviceInfo {
                    index: i as usize,
                    name: if named {
                        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
                    } else {
                        "unnamed device".into()
                    },
                    total_bytes: total,
                    compute_capability,
                })
            })
            .collect()
    }
}

/// The CUDA version the NVIDIA driver supports (e.g. 13000 for 13.0), from
/// `libcuda.so.1`'s `cuDriverGetVersion`; `Err` says why there is none.
pub fn driver_cuda_version() -> Result<i32, String> {
    let handle = dlopen(Path::new("libcuda.so.1"))?;
    let sym = |name: &CStr| {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, name.as_ptr() as *const c_char) };
        (!p.is_null())
            .then_some(p)
            .ok_or_else(|| format!("libcuda.so.1 has no {name:?}"))
    };
    // SAFETY: these are the CUDA driver API's functions of those names and signatures.
    let (init, get_version) = unsafe {
        (
            std::mem::transmute::<*mut c_void, CuInit>(sym(c"cuInit")?),
            std::mem::transmute::<*mut c_void, CuDriverGetVersion>(sym(c"cuDriverGetVersion")?),
        )
    };
    let mut v: c_int = 0;
    // SAFETY: a valid out-pointer; cuDriverGetVersion works before cuInit too.
    let status = unsafe { get_version(&mut v) };
    if status != 0 {
        return Err(format!(
            "cuDriverGetVersion failed with CUDA error {status}"
        ));
    }
    // SAFETY: plain call; a failure here (no device) is reported, not fatal.
    let status = unsafe { init(0) };
    if status != 0 {
        return Err(format!(
            "the driver (CUDA {}.{}) is installed but cuInit failed with CUDA error {status} \
             (no usable GPU, or a driver/kernel module mismatch)",
            v / 1000,
            v % 1000 / 10
        ));
    }
    Ok(v)
}

/// Compares the driver's CUDA version (see [`driver_cuda_version`]) with the one
/// libtorch (version string `torch`) was built for.
pub fn driver_check(
    driver: Result<i32, String>,
    torch_cuda: Option<(u32, u32)>,
    torch: &str,
) -> Check {
    match (driver, torch_cuda) {
        (Err(why), _) => Check::warn(
            "NVIDIA driver",
            format!("none usable ({why}): training runs on the CPU"),
            "for a GPU, install the NVIDIA driver (and pass the device to containers)",
        ),
        (Ok(v), None) => Check::ok(
            "NVIDIA driver",
            format!(
                "CUDA {}.{} (libtorch {torch} is a CPU build)",
                v / 1000,
                v % 1000 / 10
            ),
        ),
        (Ok(v), Some((major, minor))) => {
            let driver = (v as u32 / 1000, v as u32 % 1000 / 10);
            if driver >= (major, minor) {
                Check::ok(
                    "NVIDIA driver",
                    format!(
                        "supports CUDA {}.{}; libtorch needs {major}.{minor}",
                        driver.0, driver.1
                    ),
                )
            } else {
                Check::fail(
                    "NVIDIA driver",
                    format!(
                        "supports CUDA {}.{}, but libtorch ({torch}) is built for CUDA {major}.{minor}: \
                         CUDA calls will fail with 'driver version is insufficient'",
                        driver.0, driver.1
                    ),
                    format!(
                        "update the NVIDIA driver to one for CUDA {major}.{minor}, or install a \
                         torch=={EXPECTED_TORCH} build for CUDA {}.{} or older (PyTorch's --index-url \
                         for that CUDA)",
                        driver.0, driver.1
                    ),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_cuda_builds_are_read_from_torch() {
        assert_eq!(cuda_of_torch("2.11.0+cu130"), Some((13, 0)));
        assert_eq!(cuda_of_torch("2.11.0+cu128"), Some((12, 8)));
        assert_eq!(cuda_of_torch("2.11.0+cpu"), None);
        assert_eq!(cuda_of_torch("2.11.0"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("lib")).unwrap();
        std::fs::write(
            dir.path().join("version.py"),
            "from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\n",
        )
        .unwrap();
        assert_eq!(
            torch_version(&dir.path().join("lib")).as_deref(),
            Some("2.11.0+cu130")
        );
    }

    #[test]
    fn a_missing_libtorch_is_a_failure_that_says_where_it_looked() {
        let report = libtorch_checks(&[PathBuf::from("/nonexistent/torch/lib")]);
        assert!(report.failed());
        let text = report.to_string();
        assert!(text.contains("/nonexistent/torch/lib"), "{text}");
        assert!(text.contains("scripts/setup.sh"), "{text}");
    }

    #[test]
    fn a_library_that_cannot_load_names_what_is_missing() {
        // A stand-in libtorch whose CUDA dependency is missing, as dlopen reports it.
        let msg = "/v/torch/lib/libtorch_cpu.so: libcudart.so.13: cannot open shared object file: No such file or directory";
        assert_eq!(missing_library(msg), Some("libcudart.so.13"));
        assert!(explain_missing("libcudart.so.13").contains("nvidia-* packages"));
        // And a real failed load: a file that is not a library.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libtorch_cpu.so"), b"not an ELF file").unwrap();
        let report = libtorch_checks(&[dir.path().to_path_buf()]);
        assert!(report.failed(), "{report}");
        assert!(report.to_string().contains("cannot be loaded"), "{report}");
    }

    #[test]
    fn an_old_driver_for_the_cuda_build_is_explained() {
        let old = driver_check(Ok(12080), Some((13, 0)), "2.11.0+cu130");
        assert_eq!(old.status, Status::Fail);
        assert!(old.detail.contains("supports CUDA 12.8"), "{}", old.detail);
        assert!(old.fix.unwrap().contains("update the NVIDIA driver"));
        let fine = driver_check(Ok(13010), Some((13, 0)), "2.11.0+cu130");
        assert_eq!(fine.status, Status::Ok);
        let none = driver_check(Err("no libcuda".into()), Some((13, 0)), "2.11.0+cu130");
        assert_eq!(none.status, Status::Warn, "no GPU is a warning");
        assert!(!Report(vec![none]).failed(), "warnings are not failures");
        let r = Report(vec![Check::warn("a", "b", "c")]);
        assert!(r.to_string().contains("1 warning(s), no failures"));
    }
}
