//! Durations in the configurations and summaries people read: seconds, as a float
//! (`#[serde(serialize_with = "secs")]`).

use std::time::Duration;

use serde::Serializer;

/// Serializes a duration as seconds (a float).
pub fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// [`secs`] for an optional duration.
pub fn opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}
