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

/// Joins a thread; its panic, if it had one, as a message.
pub fn joined<T>(handle: std::thread::JoinHandle<T>) -> Result<T, String> {
    handle
        .join()
        .map_err(|p| format!("panicked: {}", panic_message(&*p)))
}
