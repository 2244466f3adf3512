//! Which connections the monitoring endpoint keeps when it is full: the probes'.
//!
//! Every connection holds a place from its acceptance until it is answered (or gives
//! up). Places are bounded in all ([`MAX_CONNECTIONS`]) and per source address
//! ([`MAX_PER_SOURCE`]). When a new connection finds no place, the oldest connection
//! that has not sent its request yet (an idle one) is closed to make room, first of its
//! own source; only when every place holds a request being answered is the newcomer
//! turned away (503). A health probe sends its request at once, so 2,000 sockets held
//! open without a word can no longer make a healthy process look dead: before, they
//! filled the places and `/livez` answered `503 busy` to 13–16 probes of 17 (issue
//! "One bad transition…", part 4).
//!
//! A plain synchronous type; the server holds it under a lock for microseconds.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

/// Connections open at once (each holds a task and a request buffer of at most
/// `MAX_REQUEST` bytes).
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections one source address may hold at once.
pub const MAX_PER_SOURCE: usize = 256;

/// A place given to a connection: its id (to give it back), the flag its service sets
/// once a request arrived, and what tells it to close when it is evicted.
#[derive(Debug)]
pub struct Place {
    pub id: u64,
    pub busy: Arc<AtomicBool>,
    pub evicted: oneshot::Receiver<()>,
}

#[derive(Debug)]
struct Open {
    source: IpAddr,
    busy: Arc<AtomicBool>,
    evict: oneshot::Sender<()>,
}

/// The open connections, oldest first.
#[derive(Debug)]
pub struct Connections {
    max: usize,
    max_per_source: usize,
    next: u64,
    open: BTreeMap<u64, Open>,
    per_source: HashMap<IpAddr, usize>,
}

impl Default for Connections {
    fn default() -> Self {
        Self::new(MAX_CONNECTIONS, MAX_PER_SOURCE)
    }
}

impl Connections {
    pub fn new(max: usize, max_per_source: usize) -> Self {
        Self {
            max,
            max_per_source,
            next: 0,
            open: BTreeMap::new(),
            per_source: HashMap::new(),
        }
    }

    /// A place for a connection from `source`, evicting an idle one if need be; `None`
    /// when every place it could take is busy answering.
    pub fn admit(&mut self, source: IpAddr) -> Option<Place> {
        if self.per_source.get(&source).copied().unwrap_or(0) >= self.max_per_source
            && !self.evict_oldest_idle(Some(source))
        {
            return None;
        }
        if self.open.len() >= self.max && !self.evict_oldest_idle(None) {
            return None;
        }
        let (id, busy, (evict, evicted)) = (self.next, Arc::default(), oneshot::channel());
        self.next += 1;
        self.open.insert(
            id,
            Open {
                source,
                busy: Arc::clone(&busy),
                evict,
            },
        );
        *self.per_source.entry(source).or_default() += 1;
        Some(Place { id, busy, evicted })
    }

    /// Gives back connection `id`'s place (nothing if it was evicted already).
    pub fn close(&mut self, id: u64) {
        if let Some(open) = self.open.remove(&id) {
            self.forget(open.source);
        }
    }

    /// How many are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    fn forget(&mut self, source: IpAddr) {
        if let Some(n) = self.per_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&source);
            }
        }
    }

    /// Closes the oldest connection that has not sent a request (of `source`, if
    /// given); whether there was one.
    fn evict_oldest_idle(&mut self, source: Option<IpAddr>) -> bool {
        let idle = self
            .open
            .iter()
            .find(|(_, o)| !o.busy.load(Ordering::Acquire) && source.is_none_or(|s| o.source == s))
            .map(|(id, _)| *id);
        let Some(open) = idle.and_then(|id| self.open.remove(&id)) else {
            return false;
        };
        self.forget(open.source);
        // Its task may have ended already: nothing to tell then.
        let _ = open.evict.send(());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn when_full_the_oldest_idle_connection_makes_room() {
        let mut c = Connections::new(3, 3);
        let mut first = c.admit(ip("10.0.0.1")).unwrap();
        let second = c.admit(ip("10.0.0.2")).unwrap();
        second.busy.store(true, Ordering::Release);
        let _third = c.admit(ip("10.0.0.3")).unwrap();
        let fourth = c.admit(ip("10.0.0.4"));
        assert!(fourth.is_some(), "room made");
        assert_eq!(first.evicted.try_recv(), Ok(()), "the oldest idle one went");
        assert_eq!(c.len(), 3);
        // Giving back an evicted place changes nothing.
        c.close(first.id);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn when_every_place_is_answering_the_newcomer_is_turned_away() {
        let mut c = Connections::new(2, 2);
        for s in ["10.0.0.1", "10.0.0.2"] {
            c.admit(ip(s)).unwrap().busy.store(true, Ordering::Release);
        }
        assert!(c.admit(ip("10.0.0.3")).is_none());
    }

    #[test]
    fn a_source_at_its_bound_gives_up_its_own_idle_connections_first() {
        let mut c = Connections::new(10, 2);
        let mut other = c.admit(ip("10.0.0.9")).unwrap();
        let mut a1 = c.admit(ip("10.0.0.1")).unwrap();
        let _a2 = c.admit(ip("10.0.0.1")).unwrap();
        assert!(c.admit(ip("10.0.0.1")).is_some());
        assert_eq!(a1.evicted.try_recv(), Ok(()), "its own oldest idle one");
        assert!(other.evicted.try_recv().is_err(), "not another source's");
        assert_eq!(c.per_source[&ip("10.0.0.1")], 2);
    }

    #[test]
    fn places_given_back_are_counted_out() {
        let mut c = Connections::default();
        let places: Vec<Place> = (0..5).map(|_| c.admit(ip("10.0.0.1")).unwrap()).collect();
        for p in &places {
            c.close(p.id);
        }
        assert!(c.is_empty());
        assert!(c.per_source.is_empty());
    }
}
