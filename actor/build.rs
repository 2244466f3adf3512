//! With the `gym` feature: finds the Python the bridge embeds (`$PYO3_PYTHON`, else
//! `python3` on the path, as PyO3 does), puts its `libpython` on the rpath of this
//! crate's binaries and tests (no `LD_LIBRARY_PATH` needed), tells dependents' build
//! scripts where it is (`DEP_MILLRACE_PYTHON_LIBDIR`), and records the virtualenv's
//! site-packages for the interpreter to load at start-up.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    if std::env::var_os("CARGO_FEATURE_GYM").is_none() {
        return;
    }
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_config_var('LIBDIR')); \
             print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap_or_else(|e| panic!("the gym feature needs Python: cannot run {python}: {e}"));
    assert!(
        out.status.success(),
        "{python} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8 paths");
    let mut lines = text.lines();
    let (libdir, site) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    println!("cargo:libdir={libdir}");
    println!("cargo:rustc-env=MILLRACE_PYTHON_SITE={site}");
}
