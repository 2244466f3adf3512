//! Calling the C++ shims (`build.rs`): each entry point returns 0, or non-zero with
//! libtorch's message written into the caller's buffer.

use std::ffi::{c_char, CStr};

/// Runs `f` with an error buffer; `Err` with the first line of the message it wrote.
pub(crate) fn call(f: impl FnOnce(*mut c_char, usize) -> i32) -> Result<(), String> {
    let mut err = [0 as c_char; 512];
    if f(err.as_mut_ptr(), err.len()) == 0 {
        return Ok(());
    }
    // SAFETY: the shim wrote a NUL-terminated message (snprintf) into `err`.
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) };
    Err(msg
        .to_string_lossy()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string())
}
