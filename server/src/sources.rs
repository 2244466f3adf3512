//! Fair pre-authentication: bounds per source address on the handshakes it holds at
//! once and on how often it may connect, so that one source cannot hold the places an
//! honest actor needs.
//!
//! The server has few handshake places (`ServerConfig::max_handshakes`), and a socket
//! that never speaks holds one until its `hello_timeout`. Without a bound per source, 64
//! silent sockets reconnecting at a few per second from one machine held every place,
//! and no honest actor could join while they lasted (issue "One bad transition…",
//! part 3). A source is an IPv4 address, or an IPv6 /64 (what one host is usually
//! given): beyond its bounds a connection is closed at accept without a word, as when
//! every place is taken. Many sources together are still bounded by the global places.
//!
//! A plain synchronous type (the accept loop holds it under a lock for microseconds);
//! [`SourcePlace`] gives a source's place back when dropped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Sources remembered at once; beyond it idle ones are forgotten first, and a new source
/// is turned away while every remembered one is busy.
const MAX_SOURCES: usize = 4096;

/// The bounds per source.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SourceLimits {
    /// Handshakes one source may have in flight at once.
    pub in_flight: u32,
    /// Connections one source may open per second, on average...
    pub per_second: f64,
    /// ...with bursts of up to this many (an actor host's processes all coming back
    /// after a learner restart).
    pub burst: f64,
}

impl Default for SourceLimits {
    fn default() -> Self {
        Self {
            in_flight: 8,
            per_second: 20.0,
            burst: 64.0,
        }
    }
}

/// Why a connection was closed at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnedAway {
    /// Its source already has `in_flight` handshakes going.
    InFlight,
    /// Its source connects faster than `per_second` (beyond its burst).
    Rate,
    /// Every remembered source is busy and there is no room for another.
    Sources,
}

impl std::fmt::Display for TurnedAway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TurnedAway::InFlight => {
                "its address already has as many handshakes in flight as one may"
            }
            TurnedAway::Rate => "its address connects faster than one may",
            TurnedAway::Sources => "too many addresses are in their handshakes",
        })
    }
}

/// A source as the bounds count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    V4([u8; 4]),
    /// The first 64 bits.
    V6([u8; 8]),
}

impl Source {
    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Source::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => {
                    let o = v6.octets();
                    Source::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
                }
            },
        }
    }
}

#[derive(Debug)]
struct Entry {
    in_flight: u32,
    /// Connections it may still open now (a token bucket), as of `at`.
    tokens: f64,
    at: Instant,
}

/// Handshakes in flight and recent connections, by source.
#[derive(Debug)]
pub struct Sources {
    limits: SourceLimits,
    by_source: HashMap<Source, Entry>,
}

impl Sources {
    pub fn new(limits: SourceLimits) -> Self {
        Self {
            limits,
            by_source: HashMap::new(),
        }
    }

    /// Admits a connection from `ip` at `now` (one handshake place of its source, one
    /// connection of its rate), or says why not.
    pub fn admit(&mut self, ip: IpAddr, now: Instant) -> Result<(), TurnedAway> {
        let source = Source::of(ip);
        if !self.by_source.contains_key(&source) && self.by_source.len() >= MAX_SOURCES {
            self.forget_idle(now);
            if self.by_source.len() >= MAX_SOURCES {
                return Err(TurnedAway::Sources);
            }
        }
        let limits = self.limits;
        let entry = self.by_source.entry(source).or_insert(Entry {
            in_flight: 0,
            tokens: limits.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(entry.at).as_secs_f64();
        entry.tokens = (entry.tokens + elapsed * limits.per_second).min(limits.burst);
        entry.at = now;
        if entry.in_flight >= limits.in_flight {
            return Err(TurnedAway::InFlight);
        }
        if entry.tokens < 1.0 {
            return Err(TurnedAway::Rate);
        }
        entry.tokens -= 1.0;
        entry.in_flight += 1;
        Ok(())
    }

    /// Gives back a handshake place of `ip`'s source.
    pub fn release(&mut self, ip: IpAddr) {
        if let Some(entry) = self.by_source.get_mut(&Source::of(ip)) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
        }
    }

    /// Forgets the sources with nothing in flight whose bucket has refilled: they are
    /// as if never seen.
    fn forget_idle(&mut self, now: Instant) {
        let limits = self.limits;
        self.by_source.retain(|_, e| {
            let elapsed = now.saturating_duration_since(e.at).as_secs_f64();
            e.in_flight > 0 || e.tokens + elapsed * limits.per_second < limits.burst
        });
    }
}

/// A source's handshake place, given back when dropped.
#[derive(Debug)]
pub struct SourcePlace {
    sources: Arc<Mutex<Sources>>,
    ip: IpAddr,
}

impl SourcePlace {
    /// Takes a place for `ip` in `sources` at `now`.
    pub fn take(
        sources: &Arc<Mutex<Sources>>,
        ip: IpAddr,
        now: Instant,
    ) -> Result<Self, TurnedAway> {
        sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(ip, now)?;
        Ok(Self {
            sources: Arc::clone(sources),
            ip,
        })
    }
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release(self.ip);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const LIMITS: SourceLimits = SourceLimits {
        in_flight: 2,
        per_second: 10.0,
        burst: 4.0,
    };

    #[test]
    fn one_source_holds_at_most_its_places_and_others_are_unaffected() {
        let mut s = Sources::new(LIMITS);
        let t = Instant::now();
        assert_eq!(s.admit(ip("10.0.0.1"), t), Ok(()));
        assert_eq!(s.admit(ip("10.0.0.1"), t), Ok(()));
        assert_eq!(s.admit(ip("10.0.0.1"), t), Err(TurnedAway::InFlight));
        assert_eq!(s.admit(ip("10.0.0.2"), t), Ok(()), "another source");
        s.release(ip("10.0.0.1"));
        assert_eq!(s.admit(ip("10.0.0.1"), t), Ok(()), "a place given back");
    }

    #[test]
    fn connections_beyond_the_burst_wait_for_the_rate() {
        let mut s = Sources::new(LIMITS);
        let t = Instant::now();
        let a = ip("10.0.0.1");
        for _ in 0..4 {
            assert_eq!(s.admit(a, t), Ok(()));
            s.release(a);
        }
        assert_eq!(s.admit(a, t), Err(TurnedAway::Rate), "the burst is spent");
        // 10 per second: one more after 100 ms.
        assert_eq!(s.admit(a, t + Duration::from_millis(100)), Ok(()));
        s.release(a);
        assert_eq!(
            s.admit(a, t + Duration::from_millis(100)),
            Err(TurnedAway::Rate)
        );
    }

    #[test]
    fn an_ipv6_host_is_its_64_prefix_and_a_mapped_ipv4_is_the_ipv4() {
        let mut s = Sources::new(LIMITS);
        let t = Instant::now();
        assert_eq!(s.admit(ip("2001:db8:1:2::1"), t), Ok(()));
        assert_eq!(s.admit(ip("2001:db8:1:2::ffff"), t), Ok(()));
        assert_eq!(
            s.admit(ip("2001:db8:1:2:abcd::9"), t),
            Err(TurnedAway::InFlight),
            "the same /64"
        );
        assert_eq!(s.admit(ip("2001:db8:1:3::1"), t), Ok(()), "another /64");
        assert_eq!(s.admit(ip("192.0.2.7"), t), Ok(()));
        assert_eq!(s.admit(ip("::ffff:192.0.2.7"), t), Ok(()));
        assert_eq!(s.admit(ip("192.0.2.7"), t), Err(TurnedAway::InFlight));
    }

    #[test]
    fn the_memory_of_sources_is_bounded_and_idle_ones_make_room() {
        let mut s = Sources::new(LIMITS);
        let t = Instant::now();
        for i in 0..MAX_SOURCES as u32 {
            assert_eq!(s.admit(IpAddr::from(i.to_be_bytes()), t), Ok(()));
        }
        let new = ip("203.0.113.1");
        assert_eq!(s.admit(new, t), Err(TurnedAway::Sources), "all busy");
        for i in 0..MAX_SOURCES as u32 {
            s.release(IpAddr::from(i.to_be_bytes()));
        }
        // Released, and their buckets refilled a second later: forgotten for the new one.
        assert_eq!(s.admit(new, t + Duration::from_secs(1)), Ok(()));
        assert!(s.by_source.len() <= MAX_SOURCES);
    }

    #[test]
    fn a_place_is_given_back_when_dropped() {
        let sources = Arc::new(Mutex::new(Sources::new(LIMITS)));
        let t = Instant::now();
        let a = ip("10.0.0.1");
        let first = SourcePlace::take(&sources, a, t).unwrap();
        let _second = SourcePlace::take(&sources, a, t).unwrap();
        assert_eq!(
            SourcePlace::take(&sources, a, t).map(|_| ()),
            Err(TurnedAway::InFlight)
        );
        drop(first);
        assert!(SourcePlace::take(&sources, a, t).is_ok());
    }
}
