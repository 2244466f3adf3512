//! Link-time fixes for binaries and tests that use tch (see docs/guide/install.md, "libtorch") and
//! the Gymnasium bridge (an rpath to its libpython):
//! an rpath to libtorch so no `LD_LIBRARY_PATH` is needed, and `libtorch_cuda`
//! kept linked (the linker's `--as-needed` would drop it, leaving CUDA unavailable)
//! unless the `cuda` feature is off (a CPU-only learner, as in the CPU image: it starts
//! with none of CUDA's large libraries present). A second rpath, `$ORIGIN/../lib`, lets
//! a binary copied beside a `lib/` folder (the images in `deploy/`) find its libraries
//! there.
fn main() {
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../lib");
    // The Gymnasium bridge's libpython (the actor crate's build script found it).
    println!("cargo:rerun-if-env-changed=DEP_MILLRACE_PYTHON_LIBDIR");
    if let Ok(lib) = std::env::var("DEP_MILLRACE_PYTHON_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // `learner doctor` compares the libtorch it runs with against this one.
    println!("cargo:rustc-env=MILLRACE_LIBTORCH_LIB={lib}");
    // libtorch.so is a thin library that needs libtorch_cuda.so: a CPU-only build links
    // neither (the linker keeps libtorch_cpu and libc10, whose symbols it uses).
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-ltorch_cuda");
    }
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
}
