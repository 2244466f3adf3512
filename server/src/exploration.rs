//! Exploration indices: which Ape-X ε each remote environment gets.

/// Most indices a server hands out in all (64 actors × 4096 envs).
pub const MAX_INDICES: u32 = 1 << 18;

/// Hands out exploration indices, lowest first, and takes them back when a connection
/// ends, so an actor that reconnects gets its old indices (and Ape-X ε) back instead
/// of ever-greedier new ones. ε is computed over the high-water mark of indices in use.
#[derive(Debug, Default)]
pub struct ExplorationIndices {
    inner: std::sync::Mutex<(std::collections::BTreeSet<u32>, u32)>,
}

impl ExplorationIndices {
    /// `n` indices and the number of indices the ε schedule spans, or `None` when the
    /// server has handed out all it may.
    pub fn take(&self, n: u32) -> Option<(Vec<u32>, u32)> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (free, next) = &mut *guard;
        let from_free = (n as usize).min(free.len());
        if from_free < n as usize && next.checked_add(n - from_free as u32)? > MAX_INDICES {
            return None;
        }
        let mut indices: Vec<u32> = (0..from_free).filter_map(|_| free.pop_first()).collect();
        while indices.len() < n as usize {
            indices.push(*next);
            *next += 1;
        }
        indices.sort_unstable();
        Some((indices, *next))
    }

    pub fn give_back(&self, indices: &[u32]) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.extend(indices.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_reused_lowest_first_and_bounded() {
        let pool = ExplorationIndices::default();
        assert_eq!(pool.take(3), Some((vec![0, 1, 2], 3)));
        assert_eq!(pool.take(2), Some((vec![3, 4], 5)));
        pool.give_back(&[0, 1, 2]);
        assert_eq!(pool.take(2), Some((vec![0, 1], 5)), "old indices first");
        assert_eq!(pool.take(MAX_INDICES), None, "beyond the bound");
        assert_eq!(pool.take(1), Some((vec![2], 5)), "a refusal takes nothing");
    }
}
