//! Monitoring for the learner and the actors: what they expose to Prometheus and to the
//! health checks of docker-compose and Kubernetes.
//!
//! - [`Exposition`] renders metrics in Prometheus' text format (version 0.0.4);
//!   the process re-renders its page on its own schedule (the learner once per metrics
//!   tick) and [`Endpoint::publish`]es it, so a scrape never touches the hot loops.
//! - [`serve`] answers `GET /metrics`, `GET /healthz` (ready: 200, or 503 with the
//!   reason) and `GET /livez` (the process answers at all) on one small thread with a
//!   runtime of its own. It is a deliberately tiny HTTP/1.1 responder, not a web
//!   framework: one request per connection, bounded request size, a deadline from
//!   acceptance, idle connections as cheap tasks, so nothing a client sends can stall
//!   it or starve the probes.
//! - [`check`] is the client the binaries' `health` subcommands and `millrace-health`
//!   (the images' probe, which links neither libtorch nor Python) use, so images need
//!   no curl.

mod exposition;
mod health;
mod server;

pub use exposition::{Exposition, Kind};
pub use health::{check, HealthArgs, HealthError, Probe};
pub use server::{serve, start, Endpoint, ServerHandle};
