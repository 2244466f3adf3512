//! Throttling of failed authentication: each source address's recent wrong tokens make
//! its next refusal wait longer, so guessing costs time (a refusal used to come back in
//! well under a millisecond: 5,500-11,000 guesses a second). The wait holds the
//! connection's handshake place, of which there are few, so parallel guessing is
//! bounded too.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Failures older than this are forgotten.
const WINDOW: Duration = Duration::from_secs(10);
/// The wait per recent failure from the same address...
const STEP: Duration = Duration::from_millis(50);
/// ...up to this.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// Addresses remembered at once (a flood from many addresses forgets the oldest).
const MAX_ADDRESSES: usize = 4096;

/// Recent failures by source address: how many in the window, since when.
#[derive(Debug, Default)]
pub(super) struct Failures {
    by_addr: HashMap<IpAddr, (u32, Instant)>,
}

impl Failures {
    /// Records a failed authentication from `addr` at `now`; how long its refusal waits.
    pub(super) fn failed(&mut self, addr: IpAddr, now: Instant) -> Duration {
        if self.by_addr.len() >= MAX_ADDRESSES {
            self.by_addr
                .retain(|_, (_, since)| now.duration_since(*since) < WINDOW);
            if self.by_addr.len() >= MAX_ADDRESSES {
                self.by_addr.clear();
            }
        }
        let entry = self.by_addr.entry(addr).or_insert((0, now));
        if now.duration_since(entry.1) >= WINDOW {
            *entry = (0, now);
        }
        entry.0 = entry.0.saturating_add(1);
        (STEP * entry.0).min(MAX_WAIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failures_from_one_address_wait_longer_up_to_a_bound() {
        let mut f = Failures::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t = Instant::now();
        assert_eq!(f.failed(a, t), STEP);
        assert_eq!(f.failed(a, t), 2 * STEP);
        assert_eq!(f.failed(b, t), STEP, "another address is its own");
        for _ in 0..100 {
            f.failed(a, t);
        }
        assert_eq!(f.failed(a, t), MAX_WAIT);
        // After a quiet window, it starts over.
        assert_eq!(f.failed(a, t + WINDOW), STEP);
    }

    #[test]
    fn the_memory_of_addresses_is_bounded() {
        let mut f = Failures::default();
        let t = Instant::now();
        for i in 0..(MAX_ADDRESSES as u32 + 10) {
            f.failed(IpAddr::from(i.to_be_bytes()), t);
        }
        assert!(f.by_addr.len() <= MAX_ADDRESSES);
    }
}
