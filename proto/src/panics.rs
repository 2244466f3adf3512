//! Panics of the threads a component runs, as messages to report.

/// The message of a caught panic (`&str` and `String` payloads; others are unnamed).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// A thread that panicked, with its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("panicked: {0}")]
pub struct Panicked(pub String);

impl From<Panicked> for String {
    fn from(p: Panicked) -> Self {
        p.to_string()
    }
}

/// Joins a thread; its panic, if it had one, with the message.
pub fn joined<T>(handle: std::thread::JoinHandle<T>) -> Result<T, Panicked> {
    handle.join().map_err(|p| Panicked(panic_message(&*p)))
}
