//! What the monitoring endpoint serves: the last published metrics page, whether the
//! process is ready, and whether it is alive (each watched part's last progress).
//! Written by the process (the learner's metrics tick, the actor's session loop), read
//! by the HTTP server's tasks ([`crate::server`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the endpoint serves: the last published page and whether the process is ready.
/// Written by the process (the learner's metrics tick, the actor's session loop), read by
/// the server's threads; a std `Mutex` because nothing awaits while holding it.
#[derive(Debug)]
pub struct Endpoint {
    page: Mutex<Arc<str>>,
    /// `Ok` when ready; otherwise why not (the body of the 503).
    ready: Mutex<Result<(), String>>,
    /// Each watched part's last sign of progress and how long it may go without one,
    /// once it has shown the first (see [`Endpoint::progress_of`]); `""` is the
    /// process as a whole.
    progress: Mutex<BTreeMap<String, (Instant, Duration)>>,
    /// Whether any part ever showed progress.
    progressed: AtomicBool,
    /// Something an operator should know while the process stays ready (a checkpoint
    /// that failed): said in `/healthz`'s body, with status 200.
    warning: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Endpoint {
    /// Not ready yet, for `reason`, with an empty page.
    pub fn new(reason: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            page: Mutex::new(Arc::from("")),
            ready: Mutex::new(Err(reason.into())),
            progress: Mutex::new(BTreeMap::new()),
            progressed: AtomicBool::new(false),
            warning: Mutex::new(None),
        })
    }

    /// Replaces the page `/metrics` serves.
    pub fn publish(&self, page: String) {
        *lock(&self.page) = Arc::from(page);
    }

    pub fn set_ready(&self) {
        *lock(&self.ready) = Ok(());
    }

    pub fn set_not_ready(&self, reason: impl Into<String>) {
        *lock(&self.ready) = Err(reason.into());
    }

    pub fn ready(&self) -> Result<(), String> {
        lock(&self.ready).clone()
    }

    /// Sets (or clears) what `/healthz` adds to "ready" (see [`Endpoint::warning`]).
    pub fn set_warning(&self, warning: Option<String>) {
        *lock(&self.warning) = warning;
    }

    /// What `/healthz` adds to "ready": a trouble that does not stop the process
    /// serving, such as checkpoints failing.
    pub fn warning(&self) -> Option<String> {
        lock(&self.warning).clone()
    }

    /// Whether any progress has been recorded (`/livez` watches from then on).
    pub fn progressed(&self) -> bool {
        self.progressed.load(Ordering::Relaxed)
    }

    /// Records progress now: from the first call on, `/livez` fails (503) once `limit`
    /// passes without another, so a wedged process is restarted. Before it (a
    /// checkpoint still loading, say), `/livez` answers as long as the process does.
    pub fn progress(&self, limit: Duration) {
        self.progress_of("", limit);
    }

    /// Records progress of one `part` of the process (a population's group of agents,
    /// named as the failure should say): `/livez` fails once any part watched goes
    /// `limit` without progress, even while the others progress, until the part is
    /// [`finished`](Endpoint::finished).
    pub fn progress_of(&self, part: &str, limit: Duration) {
        let mut parts = lock(&self.progress);
        match parts.get_mut(part) {
            Some(p) => *p = (Instant::now(), limit),
            None => {
                parts.insert(part.to_owned(), (Instant::now(), limit));
            }
        }
        self.progressed.store(true, Ordering::Relaxed);
    }

    /// `part` ended its work: its silence from now on is no failure.
    pub fn finished(&self, part: &str) {
        lock(&self.progress).remove(part);
    }

    /// `Ok` while alive; otherwise why not (the part most overdue).
    pub fn live(&self) -> Result<(), String> {
        let parts = lock(&self.progress);
        let overdue = parts
            .iter()
            .map(|(part, (last, limit))| (part, last.elapsed(), *limit))
            .filter(|(_, quiet, limit)| quiet > limit)
            .max_by_key(|(_, quiet, limit)| quiet.saturating_sub(*limit));
        match overdue {
            Some((part, quiet, limit)) => Err(format!(
                "{}no progress for {:.0} s (the limit is {:.0} s)",
                if part.is_empty() {
                    String::new()
                } else {
                    format!("{part}: ")
                },
                quiet.as_secs_f64(),
                limit.as_secs_f64()
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn page(&self) -> Arc<str> {
        Arc::clone(&lock(&self.page))
    }
}
