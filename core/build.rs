//! The C++ shims over libtorch where tch exposes nothing (`src/torch_settings.cpp`: TF32
//! and cuDNN's benchmark mode; `src/op_record.cpp`: an operation recorder over
//! RecordFunction callbacks), built against the headers beside
//! the libtorch it links (`torch/include`), with that libtorch's C++ ABI (PyTorch's
//! wheels: the new one; `LIBTORCH_CXX11_ABI` overrides it, as for torch-sys). And, for
//! this crate's own test binaries, an rpath to libtorch and (feature `cuda`)
//! libtorch_cuda kept linked, as the learner's build script does for its binary.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    let lib = std::path::Path::new(&lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    shims(lib);
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-ltorch_cuda");
    }
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
}

/// The C++ files, one job each.
const SHIMS: [&str; 2] = ["src/torch_settings.cpp", "src/op_record.cpp"];

fn shims(lib: &std::path::Path) {
    for file in SHIMS {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let include = lib.join("../include");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .files(SHIMS)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        // As libtorch's release build: some classes (RecordFunction) have debug-only
        // members, so their layout differs without it.
        .define("NDEBUG", None)
        .warnings(false)
        .compile("millrace_torch_shims");
}
