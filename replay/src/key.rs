//! Stable item keys: what sampling hands out and priority updates name.

/// One stored transition: its shard and its sequence number there (items are numbered
/// in insertion order per shard), packed in 64 bits. A key stays valid while its item
/// is live; once the item is evicted, updates through the key are ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemKey(u64);

/// Bits of the sequence number: 2^48 items per shard (centuries at a million inserts
/// per second).
const SEQ_BITS: u32 = 48;

impl ItemKey {
    pub fn new(shard: u16, seq: u64) -> Self {
        debug_assert!(seq < 1 << SEQ_BITS);
        Self(u64::from(shard) << SEQ_BITS | (seq & ((1 << SEQ_BITS) - 1)))
    }

    pub fn shard(self) -> u16 {
        (self.0 >> SEQ_BITS) as u16
    }

    pub fn seq(self) -> u64 {
        self.0 & ((1 << SEQ_BITS) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_pack_shard_and_sequence() {
        let k = ItemKey::new(7, 123_456_789);
        assert_eq!((k.shard(), k.seq()), (7, 123_456_789));
        assert!(ItemKey::new(0, 5) < ItemKey::new(1, 0));
    }
}
