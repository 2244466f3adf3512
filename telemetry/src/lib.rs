//! Monitoring for the learner and the actors: what they expose to Prometheus and to the
//! health checks of docker-compose and Kubernetes.
//!
//! - [`Exposition`] renders metrics in Prometheus' text format (version 0.0.4);
//!   the process re-renders its page on its own schedule (the learner once per metrics
//!   tick) and [`Endpoint::publish`]es it, so a scrape never touches the hot loops.
//! - [`serve`] answers `GET /metrics`, `GET /healthz` (ready: 200, or 503 with the
//!   reason) and `GET /livez` (alive: the process answers and its watched parts make
//!   progress) on one small thread with a runtime of its own, through hyper: one
//!   request per connection, bounded request size (431 beyond it), a deadline from
//!   acceptance, and places kept for the probes ([`connections`]: the oldest idle
//!   connection makes room), so nothing a client sends can stall it or starve them.
//! - [`check`] is the client the binaries' `health` subcommands and `millrace-health`
//!   (the images' probe, which links neither libtorch nor Python) use, so images need
//!   no curl.

pub mod connections;
mod endpoint;
mod exposition;
mod health;
mod server;

pub use endpoint::Endpoint;
pub use exposition::{Exposition, Kind};
pub use health::{check, HealthArgs, HealthError, Probe};
pub use server::{serve, start, ServerHandle};
