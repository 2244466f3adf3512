//! The Gymnasium bridge: environments from Python, embedded through PyO3 (the `gym`
//! feature, on by default).
//!
//! [`GymVec`] runs anything registered with Gymnasium (`gym:<id>`); [`AtariVec`] runs
//! Atari games in ale-py's vectorised C++ interface, which steps all of an actor's games
//! in its own threads and releases the GIL meanwhile. Both are a [`PyVecEnv`]: a Python
//! object (`bridge.py`) that steps its environments and writes into arrays it owns,
//! copied out here through the buffer protocol, once per step for all environments.
//!
//! The interpreter is the one the build found (its `libpython` is on the binary's
//! rpath); the project virtualenv's packages are added to its path at start-up
//! (`$VIRTUAL_ENV` if set, else the virtualenv the binary was built with).

mod atari;
mod pyvec;

pub use atari::AtariVec;
pub use pyvec::{GymVec, PyVecEnv};

use std::ffi::CString;
use std::sync::OnceLock;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyModule;

use super::EnvError;

/// The virtualenv's site-packages the build found (`build.rs`).
const BUILT_SITE: &str = env!("MILLRACE_PYTHON_SITE");

const BRIDGE_PY: &str = include_str!("bridge.py");

/// One clear line for a Python failure: our own `RuntimeError`s carry their message
/// alone, anything else its type too.
pub(crate) fn py_err(py: Python<'_>, e: PyErr) -> EnvError {
    let msg = e.value(py).to_string();
    if e.is_instance_of::<PyRuntimeError>(py) {
        EnvError::Bridge(msg)
    } else {
        let ty = e
            .get_type(py)
            .name()
            .map_or_else(|_| "exception".to_string(), |n| n.to_string());
        EnvError::Bridge(format!("{ty}: {msg}"))
    }
}

/// Starts the interpreter once per process and puts the virtualenv's packages first on
/// its path (before the base interpreter's and the user's, as the virtualenv's own
/// `python` would); the result is shared by every caller.
fn started() -> Result<(), EnvError> {
    static STARTED: OnceLock<Result<(), EnvError>> = OnceLock::new();
    STARTED
        .get_or_init(|| {
            Python::initialize();
            Python::attach(|py| {
                let code = format!(
                    "import os, site, sys\n\
                     venv = os.environ.get('VIRTUAL_ENV')\n\
                     path = os.path.join(venv, 'lib', 'python%d.%d' % sys.version_info[:2], 'site-packages') if venv else {BUILT_SITE:?}\n\
                     before = list(sys.path)\n\
                     site.addsitedir(path)\n\
                     added = [p for p in sys.path if p not in before]\n\
                     sys.path[:] = added + before\n"
                );
                let code = CString::new(code).map_err(|e| EnvError::Bridge(e.to_string()))?;
                py.run(&code, None, None).map_err(|e| py_err(py, e))
            })
        })
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

/// The bridge module (`bridge.py`), loaded once per interpreter.
fn bridge(py: Python<'_>) -> Result<Bound<'_, PyModule>, EnvError> {
    static MODULE: OnceLock<Py<PyModule>> = OnceLock::new();
    if let Some(m) = MODULE.get() {
        return Ok(m.bind(py).clone());
    }
    let code = CString::new(BRIDGE_PY).map_err(|e| EnvError::Bridge(e.to_string()))?;
    let module = PyModule::from_code(py, &code, c"millrace_bridge.py", c"millrace_bridge")
        .map_err(|e| py_err(py, e))?;
    // Two threads may load it at once; either copy works, one is kept.
    let kept = MODULE.get_or_init(|| module.clone().unbind());
    Ok(kept.bind(py).clone())
}

/// Builds a bridge object: `bridge.<class>(*args)`.
fn construct<'py>(
    py: Python<'py>,
    class: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> Result<Bound<'py, PyAny>, EnvError> {
    bridge(py)?
        .getattr(class)
        .and_then(|c| c.call1(args))
        .map_err(|e| py_err(py, e))
}

/// Runs `f` with the interpreter started and attached to this thread.
pub(crate) fn with_python<T>(
    f: impl FnOnce(Python<'_>) -> Result<T, EnvError>,
) -> Result<T, EnvError> {
    started()?;
    Python::attach(f)
}

/// A package's name, and its version or why it does not import.
pub type PackageVersion = (String, Result<String, String>);

/// The interpreter and the bridge's packages, each with its version or why it does not
/// import (`actor doctor`).
pub fn packages() -> Result<Vec<PackageVersion>, EnvError> {
    with_python(|py| {
        let found: Vec<(String, String)> = bridge(py)?
            .getattr("packages")
            .and_then(|f| f.call1((vec!["gymnasium", "numpy", "ale_py", "minatar"],)))
            .and_then(|r| r.extract())
            .map_err(|e| py_err(py, e))?;
        Ok(found
            .into_iter()
            .map(|(name, v)| match v.strip_prefix("ERROR ") {
                Some(why) => (name, Err(why.to_string())),
                None => (name, Ok(v)),
            })
            .collect())
    })
}
