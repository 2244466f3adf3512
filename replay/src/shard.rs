//! One replay shard: preallocated rings of observation rows (or single frames of stacked
//! observations) and of transitions (stored as columns) that index them.

use std::collections::{HashMap, VecDeque};

use millrace_proto::{FrameLinks, TransitionBatch, NO_FRAME};

use crate::key::ItemKey;
use crate::selector::Selector;

/// Destination of a sampled batch: one slice per column, `[batch, ...]` row-major.
/// The learner's prefetcher points these at its staging tensors so rows are gathered
/// straight into the memory that is copied to the device.
#[derive(Debug)]
pub struct SampleBuffers<'a> {
    pub obs: &'a mut [u8],
    pub next_obs: &'a mut [u8],
    pub actions: &'a mut [i64],
    pub rewards: &'a mut [f32],
    pub discounts: &'a mut [f32],
    /// Which item each row is, for priority updates.
    pub keys: &'a mut [ItemKey],
    /// Each row's importance-sampling weight, normalised by the largest (1 everywhere
    /// for uniform replay).
    pub weights: &'a mut [f32],
}

impl SampleBuffers<'_> {
    pub fn rows(&self) -> usize {
        self.actions.len()
    }
}

/// One inserted batch (or, in frame mode, one shard's part of one), still live: its
/// items, the rows it stored, and the oldest row its items need.
#[derive(Clone, Copy, Debug)]
struct Extent {
    items: usize,
    first_seq: u64,
    /// Sequence number of its first stored row; its rows follow contiguously.
    rows_first: u64,
    rows: usize,
    /// Numbers extents in insertion order (for the running minimum of what they need).
    serial: u64,
}

/// A frame-mode stream's frames in this shard: `(number, row sequence number)`, oldest
/// first, for resolving the numbers later batches link to.
#[derive(Debug, Default)]
struct Stream {
    frames: VecDeque<(u64, u64)>,
}

/// Where a snapshot has got to in a shard: items and rows before these are copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    pub item: u64,
    pub row: u64,
}

/// A batch's transitions as they will be stored: `(index in the batch, sequence number
/// of the newest row of its observation, of its next observation, oldest row needed)`.
struct Plan {
    keep: Vec<(usize, u64, u64, u64)>,
    /// Frame mode: the links of the batch's rows, as row sequence numbers.
    links: Vec<u64>,
}

impl Plan {
    fn needs(&self) -> u64 {
        self.keep.iter().map(|k| k.3).min().unwrap_or(NONE)
    }
}

/// No row (a stack's bottom, a broken link, an extent without items).
const NONE: u64 = u64::MAX;

/// Two preallocated FIFO rings: stored rows, and transitions (struct-of-arrays) that
/// point at them.
///
/// Rows are whole observations (row mode) or single frames of stacked observations
/// (frame mode, `stack > 1`): each frame is stored once with a link to the frame below
/// it in its stack, an item points at the newest frame of each of its observations,
/// and sampling walks the links to rebuild the stacks straight into the caller's
/// buffers. Rows are numbered in insertion order (position `seq % row_capacity`) and
/// stay stored while any live item needs them; items are evicted a batch at a time,
/// oldest first, and the rows nobody needs any more go with them. In row mode batches
/// are self-contained; in frame mode a batch links to frames earlier batches of the
/// same actor stored here, resolved through the actor's [`Stream`] of frame numbers.
/// A transition whose stack cannot be rebuilt (a link to a frame no longer stored) is
/// dropped and counted, never stored wrong.
///
/// Items are numbered in insertion order (their sequence number); item `seq` lives at
/// position `seq % capacity` while it is live, so a sampled item's [`ItemKey`] finds it
/// again in O(1), and a key whose item was evicted is recognised as stale.
pub struct Shard {
    index: u16,
    capacity: usize,
    row_capacity: usize,
    row_bytes: usize,
    stack: usize,
    rows: Vec<u8>,
    /// Frame mode: per row, the sequence number of the row below it in its stack.
    links: Vec<u64>,
    next_row: u64,
    /// Oldest stored row: rows `row_start..next_row` are live.
    row_start: u64,
    obs_pos: Vec<u32>,
    next_pos: Vec<u32>,
    actions: Vec<i64>,
    rewards: Vec<f32>,
    discounts: Vec<f32>,
    /// Parameter version that produced each item (staleness metrics).
    versions: Vec<u64>,
    /// The stream (actor) whose batch brought each item: what an eviction is charged to.
    actors: Vec<u32>,
    /// Items evicted as poison ([`Shard::evict`]): never sampled, checkpointed or
    /// given a priority again; their places are reused in FIFO order as any other's.
    dead: Vec<bool>,
    /// Live batches, oldest first.
    extents: VecDeque<Extent>,
    /// The oldest row each live extent's items read (their stacks included), as a
    /// monotone queue of `(row, extent serial)`: its front is the oldest row any live
    /// item needs (rows from there on stay stored), in O(1) amortised per insert.
    needs: VecDeque<(u64, u64)>,
    next_extent: u64,
    streams: HashMap<u32, Stream>,
    /// Sequence number of the next item; live items are the `len` before it.
    next_seq: u64,
    len: usize,
    dropped: u64,
    selector: Box<dyn Selector>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("index", &self.index)
            .field("capacity", &self.capacity)
            .field("row_capacity", &self.row_capacity)
            .field("stack", &self.stack)
            .field("len", &self.len)
            .field("obs_len", &self.obs_len())
            .finish_non_exhaustive()
    }
}

/// A batch bigger than a whole shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("batch of {items} items and {rows} observation rows exceeds a shard ({capacity} items, {obs_capacity} rows)")]
pub struct TooLarge {
    pub items: usize,
    pub rows: usize,
    pub capacity: usize,
    pub obs_capacity: usize,
}

/// A shard's storage could not be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {bytes} bytes for a replay shard")]
pub struct OutOfMemory {
    pub bytes: usize,
}

/// A zeroed vector of `len` elements, or `OutOfMemory` instead of aborting.
///
/// A fallible reservation first (an allocation the allocator refuses is an error, not
/// an abort), released at once; then `vec!` of zeros, which takes zeroed pages from the
/// allocator (calloc) instead of writing every byte: a replay of gigabytes starts in
/// no time and its memory is committed as it fills.
fn zeroed<T: Clone + Default>(len: usize) -> Result<Vec<T>, OutOfMemory> {
    let bytes = len.saturating_mul(std::mem::size_of::<T>());
    let mut probe = Vec::<T>::new();
    probe
        .try_reserve_exact(len)
        .map_err(|_| OutOfMemory { bytes })?;
    drop(probe);
    Ok(vec![T::default(); len])
}

impl Shard {
    /// Bytes a shard of this size allocates: rows of `row_bytes` (with their links in
    /// frame mode) and item columns.
    pub fn bytes_for(
        capacity: usize,
        row_capacity: usize,
        row_bytes: usize,
        stack: usize,
    ) -> usize {
        // Frame mode: a link per row, and the stream index's (number, row) entry.
        let link = if stack > 1 { 8 + 16 } else { 0 };
        row_capacity
            .saturating_mul(row_bytes + link)
            .saturating_add(capacity.saturating_mul(Self::ITEM_BYTES))
    }

    /// Bytes of the per-item columns.
    const ITEM_BYTES: usize = 4 + 4 + 8 + 4 + 4 + 8;

    /// Allocates all storage up front: `capacity` items and `row_capacity` rows of
    /// `row_bytes` each (frames, when `stack > 1` rows make one observation), or
    /// `OutOfMemory` if the allocator refuses. `selector` must select among positions
    /// `0..capacity` that it was told about through `insert` and `delete`. `index` is
    /// the shard's place in its table (item keys).
    ///
    /// More than `u32::MAX` rows is refused as `OutOfMemory` too.
    ///
    /// # Panics
    /// If either capacity or `stack` is 0.
    pub fn new(
        index: u16,
        capacity: usize,
        row_capacity: usize,
        row_bytes: usize,
        stack: usize,
        selector: Box<dyn Selector>,
    ) -> Result<Self, OutOfMemory> {
        assert!(capacity > 0 && row_capacity > 0, "a shard needs room");
        assert!(stack > 0, "an observation is at least one row");
        let bytes = row_capacity
            .checked_mul(row_bytes)
            .ok_or(OutOfMemory { bytes: usize::MAX })?;
        if u32::try_from(row_capacity).is_err() {
            // Row positions are stored as u32.
            return Err(OutOfMemory {
                bytes: Self::bytes_for(capacity, row_capacity, row_bytes, stack),
            });
        }
        Ok(Self {
            index,
            capacity,
            row_capacity,
            row_bytes,
            stack,
            rows: zeroed(bytes)?,
            links: zeroed(if stack > 1 { row_capacity } else { 0 })?,
            next_row: 0,
            row_start: 0,
            obs_pos: zeroed(capacity)?,
            next_pos: zeroed(capacity)?,
            actions: zeroed(capacity)?,
            rewards: zeroed(capacity)?,
            discounts: zeroed(capacity)?,
            versions: zeroed(capacity)?,
            actors: zeroed(capacity)?,
            dead: vec![false; capacity],
            extents: VecDeque::new(),
            needs: VecDeque::new(),
            next_extent: 0,
            streams: HashMap::new(),
            next_seq: 0,
            len: 0,
            dropped: 0,
            selector,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rows (frames, in frame mode) from the oldest a live item needs to the newest:
    /// what the live items take (older rows are overwritten as room is needed).
    pub fn obs_len(&self) -> usize {
        (self.next_row - self.oldest_needed()) as usize
    }

    /// Transitions dropped because a frame their stacks need was no longer stored.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Sampling weight of this shard (see [`Selector`]).
    pub fn total(&self) -> f64 {
        self.selector.total()
    }

    /// The smallest weight of an item stored here (`+∞` when empty).
    pub fn min_weight(&self) -> f64 {
        self.selector.min_weight()
    }

    /// Bytes of storage allocated per item of capacity, rows included.
    pub fn bytes_per_item(&self) -> f64 {
        Self::bytes_for(self.capacity, self.row_capacity, self.row_bytes, self.stack) as f64
            / self.capacity as f64
    }

    /// Sequence number of the oldest live item.
    fn first_seq(&self) -> u64 {
        self.next_seq - self.len as u64
    }

    fn pos(&self, seq: u64) -> usize {
        (seq % self.capacity as u64) as usize
    }

    fn row_pos(&self, seq: u64) -> usize {
        (seq % self.row_capacity as u64) as usize
    }

    /// The sequence number of the live row at position `pos`.
    fn row_seq(&self, pos: u32) -> u64 {
        let cap = self.row_capacity as u64;
        let offset = (u64::from(pos) + cap - self.row_start % cap) % cap;
        self.row_start + offset
    }

    /// The position of a live item's key, or `None` if it was evicted since (or
    /// belongs to another shard).
    pub fn position(&self, key: ItemKey) -> Option<usize> {
        (key.shard() == self.index && (self.first_seq()..self.next_seq).contains(&key.seq()))
            .then(|| self.pos(key.seq()))
    }

    /// Copies a (validated) batch in, evicting the oldest batches to make room. Items
    /// get the batch's priorities (at most `cap`), or `default_priority` where it has
    /// none or an invalid one (negative or not finite). Returns how
    /// many transitions were stored (in frame mode, those whose stacks can be rebuilt).
    pub fn insert(
        &mut self,
        batch: &TransitionBatch,
        default_priority: f64,
        cap: f64,
    ) -> Result<usize, TooLarge> {
        let (items, rows) = (batch.len(), batch.obs_rows());
        if items > self.capacity || rows > self.row_capacity {
            return Err(TooLarge {
                items,
                rows,
                capacity: self.capacity,
                obs_capacity: self.row_capacity,
            });
        }
        let base = self.next_row;
        let mut plan = match &batch.frames {
            None => Plan {
                keep: (0..items)
                    .map(|i| {
                        let (o, n) = (batch.obs_index[i], batch.next_index[i]);
                        (i, base + u64::from(o), base + u64::from(n), base)
                    })
                    .collect(),
                links: Vec::new(),
            },
            Some(links) => self.plan_frames(batch.actor_id, links),
        };
        // Rows this insert overwrites, whoever needs them: a transition whose stacks
        // reach back that far cannot be stored (rather than evicting everything else
        // in a vain attempt to keep its frames).
        let must_free = (base + rows as u64).saturating_sub(self.row_capacity as u64);
        plan.keep.retain(|k| k.3 >= must_free);
        let fits = self.make_room(plan.keep.len(), rows, plan.needs());
        debug_assert!(
            fits,
            "a batch that fits an empty shard fits after evictions"
        );
        self.dropped += (items - plan.keep.len()) as u64;

        // Rows: the longest runs that fit before the ring wraps.
        let rb = self.row_bytes;
        let mut row = 0;
        while row < rows {
            let at = self.row_pos(base + row as u64);
            let run = (rows - row).min(self.row_capacity - at);
            self.rows[at * rb..(at + run) * rb]
                .copy_from_slice(&batch.obs[row * rb..(row + run) * rb]);
            row += run;
        }
        for (j, link) in plan.links.iter().enumerate() {
            let at = self.row_pos(base + j as u64);
            self.links[at] = *link;
        }
        self.next_row += rows as u64;
        if let Some(links) = &batch.frames {
            let stream = self.streams.entry(batch.actor_id).or_default();
            stream
                .frames
                .extend(links.number.iter().zip(base..).map(|(n, s)| (*n, s)));
            self.prune_streams();
        }

        let first_seq = self.next_seq;
        for &(i, obs, next, _) in &plan.keep {
            let dst = self.pos(self.next_seq);
            self.obs_pos[dst] = self.row_pos(obs) as u32;
            self.next_pos[dst] = self.row_pos(next) as u32;
            self.actions[dst] = batch.actions[i];
            self.rewards[dst] = batch.rewards[i];
            self.discounts[dst] = batch.discounts[i];
            self.versions[dst] = batch.version;
            self.actors[dst] = batch.actor_id;
            self.dead[dst] = false;
            // The table counted invalid priorities; they are never stored.
            let priority = batch
                .priorities
                .get(i)
                .map(|p| f64::from(*p))
                .filter(|p| p.is_finite() && *p >= 0.0)
                .map_or(default_priority, |p| p.min(cap));
            self.selector.insert(dst, priority);
            self.next_seq += 1;
        }
        self.len += plan.keep.len();
        if !plan.keep.is_empty() || rows > 0 {
            let (needs, serial) = (plan.needs(), self.next_extent);
            self.next_extent += 1;
            self.extents.push_back(Extent {
                items: plan.keep.len(),
                first_seq,
                rows_first: base,
                rows,
                serial,
            });
            while self.needs.back().is_some_and(|(n, _)| *n >= needs) {
                self.needs.pop_back();
            }
            self.needs.push_back((needs, serial));
        }
        Ok(plan.keep.len())
    }

    /// Resolves a frame-mode batch against what is stored: the links of its frames as
    /// row sequence numbers (they will be stored from `next_row` on), and the
    /// transitions whose two stacks can be rebuilt.
    fn plan_frames(&mut self, actor: u32, links: &FrameLinks) -> Plan {
        let base = self.next_row;
        let stream = self.streams.entry(actor).or_default();
        if let (Some(first), Some((last, _))) = (links.number.first(), stream.frames.back()) {
            if first <= last {
                // The numbers went back: the actor started a new stream.
                stream.frames.clear();
            }
        }
        let stream = &self.streams[&actor];
        let row_start = self.row_start;
        let resolve = |n: u64| -> u64 {
            if n == NO_FRAME {
                return NONE;
            }
            if let Ok(j) = links.number.binary_search(&n) {
                return base + j as u64;
            }
            let f = &stream.frames;
            let i = f.partition_point(|(number, _)| *number < n);
            match f.get(i) {
                Some(&(number, seq)) if number == n && seq >= row_start => seq,
                _ => NONE,
            }
        };
        let new_links: Vec<u64> = links.prev.iter().map(|p| resolve(*p)).collect();
        // The bottom of the stack whose newest row is `seq`, if every link is live.
        let bottom = |seq: u64| -> Option<u64> {
            let mut at = seq;
            for _ in 1..self.stack {
                let below = if at >= base {
                    new_links[(at - base) as usize]
                } else {
                    self.links[self.row_pos(at)]
                };
                if below == NONE || below < row_start {
                    return None;
                }
                at = below;
            }
            Some(at)
        };
        let mut keep = Vec::with_capacity(links.obs.len());
        for (i, (o, n)) in links.obs.iter().zip(&links.next).enumerate() {
            let (o, n) = (resolve(*o), resolve(*n));
            if o == NONE || n == NONE {
                continue;
            }
            if let (Some(a), Some(b)) = (bottom(o), bottom(n)) {
                keep.push((i, o, n, a.min(b)));
            }
        }
        Plan {
            keep,
            links: new_links,
        }
    }

    /// Evicts the oldest extents until `items` more items and `rows` more rows fit while
    /// the rows from `needs` on stay; `false` if they do not fit even in an empty shard.
    ///
    /// Rows are freed only for room, oldest first (the ring's own order), and only those
    /// older than every row a live item needs: the newest rows stay even before an item
    /// needs them, since later batches link to them.
    fn make_room(&mut self, items: usize, rows: usize, needs: u64) -> bool {
        loop {
            let must_free = (self.next_row + rows as u64).saturating_sub(self.row_capacity as u64);
            let fits =
                self.len + items <= self.capacity && must_free <= needs.min(self.oldest_needed());
            if fits {
                self.row_start = self.row_start.max(must_free);
                return true;
            }
            let Some(old) = self.extents.pop_front() else {
                return false;
            };
            if self.needs.front().is_some_and(|(_, s)| *s == old.serial) {
                self.needs.pop_front();
            }
            for seq in old.first_seq..old.first_seq + old.items as u64 {
                self.selector.delete(self.pos(seq));
            }
            self.len -= old.items;
        }
    }

    /// The oldest row a live item needs (`next_row` when none does).
    fn oldest_needed(&self) -> u64 {
        self.needs
            .front()
            .map_or(self.next_row, |(n, _)| (*n).min(self.next_row))
    }

    /// Forgets the frame numbers of rows no longer stored, and streams left with none.
    fn prune_streams(&mut self) {
        let row_start = self.row_start;
        self.streams.retain(|_, s| {
            while s.frames.front().is_some_and(|(_, seq)| *seq < row_start) {
                s.frames.pop_front();
            }
            !s.frames.is_empty()
        });
    }

    /// Sets the priority of the item `key` names; `false` (and nothing changes) when
    /// that item was evicted since it was sampled.
    pub fn update(&mut self, key: ItemKey, priority: f64) -> bool {
        match self.position(key).filter(|pos| !self.dead[*pos]) {
            Some(pos) => {
                self.selector.update(pos, priority);
                true
            }
            None => false,
        }
    }

    /// Takes the item `key` names out of replay for good (its TD error showed it poison,
    /// see the learner's feedback): it is never sampled, checkpointed or given a
    /// priority again. Its place is reused in FIFO order like any other (`len` counts it
    /// until then). Returns the stream (actor) whose batch brought it, or `None` when it
    /// was evicted already or its key is stale.
    pub fn evict(&mut self, key: ItemKey) -> Option<u32> {
        let pos = self.position(key).filter(|pos| !self.dead[*pos])?;
        self.dead[pos] = true;
        // Prioritized: weight 0, so the tree never lands on it (Uniform cannot remove
        // from the middle of its ring: `gather` steps over dead items instead).
        if self.selector.priority(pos).is_some() {
            self.selector.delete(pos);
        }
        Some(self.actors[pos])
    }

    /// Live items evicted as poison and not yet overwritten.
    pub fn dead(&self) -> usize {
        (self.first_seq()..self.next_seq)
            .filter(|seq| self.dead[self.pos(*seq)])
            .count()
    }

    /// The first live item at or after position `pos` (in insertion order, wrapping
    /// to the oldest) that is not dead; `pos` itself when every live item is dead.
    fn alive_from(&self, pos: usize) -> usize {
        let first = self.first_seq();
        let offset = (pos + self.capacity - self.pos(first)) % self.capacity;
        let live = (self.next_seq - first) as usize;
        (0..live)
            .map(|k| self.pos(first + ((offset + k) % live.max(1)) as u64))
            .find(|p| !self.dead[*p])
            .unwrap_or(pos)
    }

    /// Where a snapshot taken now ends: it covers the batches stored before it.
    pub fn end(&self) -> Cursor {
        Cursor {
            item: self.next_seq,
            row: self.next_row,
        }
    }

    /// The oldest live batch not yet copied (after `from`, before `end`), rebuilt (with
    /// priorities where the selector keeps them), and the cursor after it. For
    /// checkpoints, one batch per lock.
    ///
    /// In frame mode the batches form one stream per shard (actor id `u32::MAX −
    /// index`), numbered by row sequence numbers: each carries the frames stored since
    /// the one before that are still stored, so restoring them in order rebuilds the
    /// same frames, links and transitions.
    pub fn batch_from(&self, from: Cursor, end: Cursor) -> Option<(TransitionBatch, Cursor)> {
        let rb = self.row_bytes;
        // Extents are in order: a binary search, not a walk from the oldest.
        let i = self.extents.partition_point(|e| {
            e.first_seq + e.items as u64 <= from.item && e.rows_first + e.rows as u64 <= from.row
        });
        let e = self.extents.get(i).filter(|e| {
            e.first_seq + e.items as u64 <= end.item && e.rows_first + e.rows as u64 <= end.row
        })?;
        let items = e.first_seq..e.first_seq + e.items as u64;
        let (lo, hi) = if self.stack > 1 {
            let lo = from.row.max(self.oldest_needed());
            (lo, (e.rows_first + e.rows as u64).max(lo))
        } else {
            (e.rows_first, e.rows_first + e.rows as u64)
        };
        let mut b = TransitionBatch::with_capacity(rb, e.items, (hi - lo) as usize);
        for seq in lo..hi {
            let p = self.row_pos(seq);
            b.push_obs_bytes(&self.rows[p * rb..(p + 1) * rb]);
        }
        let mut links = (self.stack > 1).then(|| FrameLinks::new(self.stack as u32));
        if let Some(l) = &mut links {
            for seq in lo..hi {
                let below = self.links[self.row_pos(seq)];
                l.number.push(seq);
                l.env.push(0);
                l.prev.push(if below >= self.row_start {
                    below
                } else {
                    NO_FRAME
                });
            }
        }
        for seq in items.clone() {
            let p = self.pos(seq);
            if self.dead[p] {
                continue;
            }
            let (o, n) = (
                self.row_seq(self.obs_pos[p]),
                self.row_seq(self.next_pos[p]),
            );
            match &mut links {
                Some(l) => {
                    b.actions.push(self.actions[p]);
                    b.rewards.push(self.rewards[p]);
                    b.discounts.push(self.discounts[p]);
                    l.item_env.push(0);
                    l.obs.push(o);
                    l.next.push(n);
                }
                None => b.push_transition(
                    (o - lo) as u32,
                    self.actions[p],
                    self.rewards[p],
                    self.discounts[p],
                    (n - lo) as u32,
                ),
            }
            b.version = self.versions[p];
            if let Some(priority) = self.selector.priority(p) {
                b.priorities.push(priority as f32);
            }
        }
        if links.is_some() {
            b.actor_id = u32::MAX - u32::from(self.index);
        }
        b.frames = links.map(Box::new);
        let next = Cursor {
            item: items.end,
            row: hi,
        };
        Some((b, next))
    }

    /// The live batches, oldest first (see [`Shard::batch_from`]).
    #[cfg(test)]
    fn batches(&self) -> impl Iterator<Item = TransitionBatch> + '_ {
        let end = self.end();
        let mut from = Cursor::default();
        std::iter::from_fn(move || {
            let (b, next) = self.batch_from(from, end)?;
            from = next;
            Some(b)
        })
    }

    /// Copies the observation whose newest row is at `pos` into `dst` (one whole
    /// observation), walking the links down its stack.
    fn copy_obs(&self, pos: u32, dst: &mut [u8]) {
        let rb = self.row_bytes;
        let mut p = pos as usize;
        for s in (0..self.stack).rev() {
            dst[s * rb..(s + 1) * rb].copy_from_slice(&self.rows[p * rb..(p + 1) * rb]);
            if s > 0 {
                p = self.row_pos(self.links[p]);
            }
        }
    }

    /// Gathers the item chosen by weight `u` into row `row` of `out` (all but its
    /// importance weight, which the table computes); returns its version and sampling
    /// weight, or `None` (and writes nothing) when the shard is empty.
    ///
    /// A dead item drawn (uniform replay keeps them in its ring) is replaced by the next
    /// live one in insertion order: each dead item doubles one neighbour's chance, a
    /// negligible bias for the few items ever evicted as poison.
    pub fn gather(&self, u: f64, out: &mut SampleBuffers<'_>, row: usize) -> Option<(u64, f64)> {
        let pos = self.selector.sample(u)?;
        let pos = if self.dead[pos] {
            self.alive_from(pos)
        } else {
            pos
        };
        let ob = self.row_bytes * self.stack;
        self.copy_obs(self.obs_pos[pos], &mut out.obs[row * ob..(row + 1) * ob]);
        self.copy_obs(
            self.next_pos[pos],
            &mut out.next_obs[row * ob..(row + 1) * ob],
        );
        out.actions[row] = self.actions[pos];
        out.rewards[row] = self.rewards[pos];
        out.discounts[row] = self.discounts[pos];
        // The live item at `pos` is the one whose sequence number is congruent to it.
        let first = self.first_seq();
        let offset = (pos + self.capacity - self.pos(first)) % self.capacity;
        out.keys[row] = ItemKey::new(self.index, first + offset as u64);
        Some((self.versions[pos], self.selector.weight(pos)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Uniform;

    /// Transitions `v → v + 0.5` for each value, each with its own two rows.
    fn batch(values: std::ops::Range<i64>) -> TransitionBatch {
        let n = (values.end - values.start) as usize;
        let mut b = TransitionBatch::with_capacity(4, n, 2 * n);
        for v in values {
            b.push_f32(&[v as f32], v, v as f32, 0.5, &[v as f32 + 0.5]);
        }
        b
    }

    /// A chain like an actor's: rows 0..=n, transition i from row i to row i + 1.
    fn chain(start: i64, n: usize) -> TransitionBatch {
        let mut b = TransitionBatch::with_capacity(4, n, n + 1);
        for i in 0..=n {
            b.push_obs_f32(&[(start + i as i64) as f32]);
        }
        for i in 0..n as u32 {
            b.push_transition(i, start + i64::from(i), 0.0, 0.9, i + 1);
        }
        b
    }

    struct Out(
        Vec<u8>,
        Vec<u8>,
        Vec<i64>,
        Vec<f32>,
        Vec<f32>,
        Vec<ItemKey>,
        Vec<f32>,
    );

    impl Out {
        fn new(n: usize) -> Self {
            Self(
                vec![0; n * 4],
                vec![0; n * 4],
                vec![0; n],
                vec![0.0; n],
                vec![0.0; n],
                vec![ItemKey::default(); n],
                vec![0.0; n],
            )
        }
        fn buffers(&mut self) -> SampleBuffers<'_> {
            SampleBuffers {
                obs: &mut self.0,
                next_obs: &mut self.1,
                actions: &mut self.2,
                rewards: &mut self.3,
                discounts: &mut self.4,
                keys: &mut self.5,
                weights: &mut self.6,
            }
        }
        fn obs(&self, i: usize) -> f32 {
            f32::from_ne_bytes(self.0[i * 4..i * 4 + 4].try_into().unwrap())
        }
        fn next(&self, i: usize) -> f32 {
            f32::from_ne_bytes(self.1[i * 4..i * 4 + 4].try_into().unwrap())
        }
    }

    fn shard(capacity: usize, obs_capacity: usize) -> Shard {
        Shard::new(
            3,
            capacity,
            obs_capacity,
            4,
            1,
            Box::new(Uniform::new(capacity)),
        )
        .unwrap()
    }

    /// Every live item, gathered in position order.
    fn gather_all(shard: &Shard) -> Out {
        let mut out = Out::new(shard.len());
        for i in 0..shard.len() {
            shard.gather(i as f64 + 0.5, &mut out.buffers(), i).unwrap();
        }
        out
    }

    #[test]
    fn wraparound_evicts_whole_oldest_batches() {
        let mut shard = shard(5, 10);
        shard.insert(&batch(0..3), 1.0, f64::INFINITY).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (3, 6));
        // 3 + 2 items fit, and 6 + 4 rows do: no eviction yet.
        shard.insert(&batch(3..5), 1.0, f64::INFINITY).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (5, 10));
        // The next batch needs room: the oldest batch (0..3) goes as a whole.
        shard.insert(&batch(5..7), 1.0, f64::INFINITY).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (4, 8));
        let out = gather_all(&shard);
        assert_eq!(
            out.2,
            [3, 4, 5, 6],
            "oldest first, positions 0 and 1 reused"
        );
        for i in 0..4 {
            assert_eq!(out.obs(i), out.2[i] as f32);
            assert_eq!(
                out.next(i),
                out.2[i] as f32 + 0.5,
                "row pairs survive the wrap"
            );
        }
        assert!(out.4.iter().all(|x| *x == 0.5));
    }

    #[test]
    fn an_item_evicted_as_poison_is_never_gathered_checkpointed_or_reprioritized() {
        // Uniform: the ring keeps it; a draw that lands on it takes the next live item.
        let mut shard = shard(5, 10);
        let mut poisoned = batch(0..3);
        poisoned.actor_id = 42;
        shard.insert(&poisoned, 1.0, f64::INFINITY).unwrap();
        let key = gather_all(&shard).5[1];
        assert_eq!(
            shard.evict(key),
            Some(42),
            "charged to the stream that sent it"
        );
        assert_eq!(shard.evict(key), None, "once");
        assert_eq!(shard.dead(), 1);
        let out = gather_all(&shard);
        assert!(!out.2.contains(&1), "item 1 never drawn: {:?}", out.2);
        assert!(!shard.update(key, 5.0), "no priority for it");
        let kept: Vec<i64> = shard.batches().flat_map(|b| b.actions).collect();
        assert_eq!(kept, [0, 2], "nor checkpointed");
        // Its place is reused in FIFO order like any other's.
        shard.insert(&batch(3..5), 1.0, f64::INFINITY).unwrap();
        shard.insert(&batch(5..8), 1.0, f64::INFINITY).unwrap();
        assert_eq!(shard.dead(), 0);
        assert_eq!(gather_all(&shard).2, [3, 4, 5, 6, 7]);
    }

    #[test]
    fn prioritized_an_item_evicted_as_poison_loses_its_weight() {
        let mut shard =
            Shard::new(0, 4, 8, 4, 1, Box::new(crate::Prioritized::new(4, 1.0))).unwrap();
        let mut b = batch(0..4);
        b.priorities = vec![1.0, 1e30, 1.0, 1.0];
        shard.insert(&b, 1.0, f64::INFINITY).unwrap();
        let key = ItemKey::new(0, 1);
        assert_eq!(shard.evict(key), Some(0));
        assert_eq!(shard.selector.total(), 3.0, "its weight is gone");
        let mut out = Out::new(64);
        for i in 0..64 {
            shard
                .gather(i as f64 * 3.0 / 64.0, &mut out.buffers(), i)
                .unwrap();
        }
        assert!(!out.2.contains(&1), "{:?}", out.2);
    }

    #[test]
    fn keys_name_items_until_they_are_evicted() {
        let mut shard = shard(5, 10);
        shard.insert(&batch(0..3), 1.0, f64::INFINITY).unwrap();
        let out = gather_all(&shard);
        assert_eq!(out.5[1], ItemKey::new(3, 1), "item 1 of shard 3");
        for (key, action) in out.5.iter().zip(&out.2) {
            assert_eq!(key.seq() as i64, *action, "the key names the item gathered");
            assert!(shard.position(*key).is_some());
        }
        // Evict the first batch: its keys go stale, and updates through them do nothing.
        shard.insert(&batch(3..5), 1.0, f64::INFINITY).unwrap();
        shard.insert(&batch(5..7), 1.0, f64::INFINITY).unwrap();
        assert_eq!(shard.position(ItemKey::new(3, 0)), None);
        assert!(!shard.update(ItemKey::new(3, 2), 5.0), "stale key");
        assert!(shard.update(ItemKey::new(3, 5), 5.0), "live key");
        assert_eq!(shard.position(ItemKey::new(3, 5)), Some(0));
        assert_eq!(
            shard.position(ItemKey::new(2, 5)),
            None,
            "another shard's key"
        );
        let keys = gather_all(&shard).5;
        assert_eq!(
            keys.iter().map(|k| k.seq()).collect::<Vec<_>>(),
            [3, 4, 5, 6]
        );
    }

    #[test]
    fn an_empty_shard_gathers_nothing() {
        let shard = shard(4, 8);
        let mut out = Out::new(1);
        assert_eq!(shard.gather(0.0, &mut out.buffers(), 0), None);
    }

    #[test]
    fn shared_rows_cost_one_observation_per_transition() {
        let mut shard = shard(1000, 1100);
        for k in 0..40 {
            shard
                .insert(&chain(k * 100, 99), 1.0, f64::INFINITY)
                .unwrap();
        }
        // Ten batches of 99 items with 100 rows each fit; older ones were evicted.
        assert_eq!((shard.len(), shard.obs_len()), (990, 1000));
        let out = gather_all(&shard);
        for i in 0..shard.len() {
            assert_eq!(out.obs(i), out.2[i] as f32);
            assert_eq!(out.next(i), out.2[i] as f32 + 1.0);
        }
        assert!(shard.bytes_per_item() < 1.1 * 4.0 + 32.0 + 1e-9);
    }

    #[test]
    fn batches_rebuild_the_live_contents_across_the_wrap() {
        let mut shard = shard(10, 16);
        for k in 0..7 {
            let mut b = chain(k * 10, 3);
            b.version = k as u64;
            shard.insert(&b, 1.0, f64::INFINITY).unwrap();
        }
        let mut copy = Shard::new(3, 10, 16, 4, 1, Box::new(Uniform::new(10))).unwrap();
        let batches: Vec<_> = shard.batches().collect();
        assert_eq!(batches.len(), 3, "three batches of 3 items fit");
        assert_eq!(batches[0].version, 4);
        for b in &batches {
            b.validate(4, 1).unwrap();
            copy.insert(b, 1.0, f64::INFINITY).unwrap();
        }
        let (a, b) = (gather_all(&shard), gather_all(&copy));
        assert_eq!((&a.0, &a.1, &a.2), (&b.0, &b.1, &b.2));
        let mut actions = a.2.clone();
        actions.sort_unstable();
        assert_eq!(actions, [40, 41, 42, 50, 51, 52, 60, 61, 62]);
        // One batch at a time, up to a bound: a batch inserted after the bound was
        // taken is not part of the snapshot.
        let end = shard.end();
        let (first, next) = shard.batch_from(Cursor::default(), end).unwrap();
        assert_eq!(first.actions, [40, 41, 42]);
        shard.insert(&chain(70, 3), 1.0, f64::INFINITY).unwrap();
        let (second, next) = shard.batch_from(next, end).unwrap();
        assert_eq!(
            second.actions,
            [50, 51, 52],
            "the oldest was evicted meanwhile"
        );
        let (third, next) = shard.batch_from(next, end).unwrap();
        assert_eq!(third.actions, [60, 61, 62]);
        assert!(
            shard.batch_from(next, end).is_none(),
            "70.. came after the bound"
        );
    }

    #[test]
    fn a_batch_larger_than_the_shard_is_refused_and_nothing_changes() {
        let mut shard = shard(4, 8);
        shard.insert(&batch(0..2), 1.0, f64::INFINITY).unwrap();
        assert!(shard.insert(&batch(0..10), 1.0, f64::INFINITY).is_err());
        assert!(
            shard.insert(&chain(0, 4), 1.0, f64::INFINITY).is_ok(),
            "4 items, 5 rows fit alone"
        );
        assert_eq!((shard.len(), shard.obs_len()), (4, 5));
        assert_eq!(gather_all(&shard).2, [0, 1, 2, 3]);
    }

    #[test]
    fn storage_that_cannot_be_allocated_is_an_error_not_an_abort() {
        let err = Shard::new(0, 1, 1 << 31, 1 << 40, 1, Box::new(Uniform::new(1))).unwrap_err();
        assert_eq!(err.bytes, usize::MAX);
        let err = Shard::new(0, 1, 1 << 33, 1, 1, Box::new(Uniform::new(1))).unwrap_err();
        assert!(err.bytes >= 1 << 33, "more rows than u32 positions");
        let err = Shard::new(0, 1, 1 << 20, 1 << 40, 1, Box::new(Uniform::new(1))).unwrap_err();
        assert!(err.bytes >= 1 << 60, "{err}");
    }

    /// A frame-mode batch of actor `actor`: frames `(value, number, link)` of one byte,
    /// transitions `(obs frame, next frame, action)`.
    fn frames(actor: u32, frames: &[(u8, u64, u64)], items: &[(u64, u64, i64)]) -> TransitionBatch {
        let mut b = TransitionBatch {
            actor_id: actor,
            obs_row_bytes: 1,
            frames: Some(Box::new(FrameLinks::new(2))),
            ..TransitionBatch::default()
        };
        for (value, number, prev) in frames {
            b.push_obs_bytes(&[*value]);
            let l = b.frames.as_mut().unwrap();
            l.number.push(*number);
            l.env.push(0);
            l.prev.push(*prev);
        }
        for (obs, next, action) in items {
            b.actions.push(*action);
            b.rewards.push(0.0);
            b.discounts.push(0.9);
            let l = b.frames.as_mut().unwrap();
            l.item_env.push(0);
            l.obs.push(*obs);
            l.next.push(*next);
        }
        b.validate(2, 2).unwrap();
        b
    }

    fn frame_shard(capacity: usize, rows: usize) -> Shard {
        Shard::new(3, capacity, rows, 1, 2, Box::new(Uniform::new(capacity))).unwrap()
    }

    /// Every live item as (observation, next observation, action), by action.
    fn stacks(shard: &Shard) -> Vec<([u8; 2], [u8; 2], i64)> {
        let n = shard.len();
        let (mut o, mut x) = (vec![0u8; 2 * n], vec![0u8; 2 * n]);
        let (mut a, mut r, mut d) = (vec![0i64; n], vec![0f32; n], vec![0f32; n]);
        let mut k = vec![ItemKey::default(); n];
        let mut w = vec![0f32; n];
        let mut out = SampleBuffers {
            obs: &mut o,
            next_obs: &mut x,
            actions: &mut a,
            rewards: &mut r,
            discounts: &mut d,
            keys: &mut k,
            weights: &mut w,
        };
        for i in 0..n {
            shard.gather(i as f64 + 0.5, &mut out, i).unwrap();
        }
        let mut all: Vec<_> = (0..n)
            .map(|i| ([o[2 * i], o[2 * i + 1]], [x[2 * i], x[2 * i + 1]], a[i]))
            .collect();
        all.sort_by_key(|t| t.2);
        all
    }

    #[test]
    fn frame_stacks_rebuild_across_batches_and_outlive_their_batch() {
        let mut shard = frame_shard(4, 6);
        shard
            .insert(
                &frames(
                    1,
                    &[(10, 0, NO_FRAME), (11, 1, 0), (12, 2, 1)],
                    &[(1, 2, 1)],
                ),
                1.0,
                f64::INFINITY,
            )
            .unwrap();
        // The next batch links to frames the first one carried.
        shard
            .insert(&frames(1, &[(13, 3, 2)], &[(2, 3, 2)]), 1.0, f64::INFINITY)
            .unwrap();
        assert_eq!(
            stacks(&shard),
            [([10, 11], [11, 12], 1), ([11, 12], [12, 13], 2)]
        );
        assert_eq!(shard.obs_len(), 4, "each frame once");
        // Room for three more items evicts the first batch's item, but not the frames
        // the second batch's item still reads (11 and 12); 10 goes.
        shard
            .insert(
                &frames(
                    1,
                    &[(14, 4, 3), (15, 5, 4)],
                    &[(3, 4, 3), (4, 5, 4), (3, 5, 5)],
                ),
                1.0,
                f64::INFINITY,
            )
            .unwrap();
        assert_eq!(
            stacks(&shard),
            [
                ([11, 12], [12, 13], 2),
                ([12, 13], [13, 14], 3),
                ([13, 14], [14, 15], 4),
                ([12, 13], [14, 15], 5)
            ]
        );
        assert_eq!((shard.obs_len(), shard.dropped()), (5, 0));
    }

    #[test]
    fn a_transition_whose_frames_are_gone_is_dropped_not_rebuilt_wrong() {
        let mut shard = frame_shard(8, 8);
        shard
            .insert(
                &frames(1, &[(50, 5, NO_FRAME), (51, 6, 5)], &[(6, 6, 1)]),
                1.0,
                f64::INFINITY,
            )
            .unwrap();
        // Numbers that go back: the actor started a new stream (it reconnected), so the
        // old stream's frame 6 is not this one's.
        let new = [(60, 0, NO_FRAME), (61, 1, 0), (62, 7, 1)];
        let kept = shard
            .insert(
                &frames(1, &new, &[(1, 7, 2), (6, 7, 3)]),
                1.0,
                f64::INFINITY,
            )
            .unwrap();
        assert_eq!(kept, 1);
        // A link into a frame never sent; another actor's numbers.
        let kept = shard
            .insert(
                &frames(1, &[(63, 8, 7), (64, 10, 9)], &[(7, 8, 4), (8, 10, 5)]),
                1.0,
                f64::INFINITY,
            )
            .unwrap();
        assert_eq!(kept, 1);
        let kept = shard
            .insert(&frames(2, &[], &[(1, 1, 6)]), 1.0, f64::INFINITY)
            .unwrap();
        assert_eq!(kept, 0);
        assert_eq!(shard.dropped(), 3);
        assert_eq!(
            stacks(&shard),
            [
                ([50, 51], [50, 51], 1),
                ([60, 61], [61, 62], 2),
                ([61, 62], [62, 63], 4)
            ]
        );
    }

    #[test]
    fn frame_mode_checkpoints_restore_the_same_stacks() {
        let mut shard = frame_shard(6, 9);
        let mut number = 0u64;
        // Two actors, interleaved, each linking into its own earlier batches; the ring
        // wraps, so the first batches' items are evicted while their frames stay.
        let mut last = [NO_FRAME; 2];
        for round in 0..6u8 {
            for actor in 0..2u32 {
                let a = actor as usize;
                let value = round * 10 + actor as u8;
                let n = number;
                number += 1;
                let items: Vec<(u64, u64, i64)> = if last[a] == NO_FRAME {
                    vec![]
                } else {
                    vec![(last[a], n, i64::from(value))]
                };
                shard
                    .insert(
                        &frames(actor, &[(value, n, last[a])], &items),
                        1.0,
                        f64::INFINITY,
                    )
                    .unwrap();
                last[a] = n;
            }
        }
        let before = stacks(&shard);
        assert!(before.len() >= 5, "{before:?} {} dropped", shard.dropped());
        let mut copy = frame_shard(6, 9);
        for b in shard.batches() {
            b.validate(2, 2).unwrap();
            copy.insert(&b, 1.0, f64::INFINITY).unwrap();
        }
        assert_eq!(stacks(&copy), before);
        assert_eq!((copy.obs_len(), copy.dropped()), (shard.obs_len(), 0));
    }

    #[test]
    fn a_transition_reaching_into_overwritten_rows_is_dropped_alone() {
        let mut shard = frame_shard(8, 6);
        let chain = [(10, 0, NO_FRAME), (11, 1, 0), (12, 2, 1), (13, 3, 2)];
        shard
            .insert(&frames(1, &chain, &[(1, 2, 1)]), 1.0, f64::INFINITY)
            .unwrap();
        shard
            .insert(&frames(1, &[(14, 4, 3)], &[(3, 4, 2)]), 1.0, f64::INFINITY)
            .unwrap();
        // Two more rows overwrite row 0: the first batch's item (it reads 10) goes,
        // and so does a transition reaching back to 10, but nothing else: the second
        // batch's item stays.
        let kept = shard
            .insert(
                &frames(1, &[(15, 5, 4), (16, 6, 5)], &[(5, 6, 3), (1, 6, 4)]),
                1.0,
                f64::INFINITY,
            )
            .unwrap();
        assert_eq!((kept, shard.dropped()), (1, 1));
        assert_eq!(
            stacks(&shard),
            [([12, 13], [13, 14], 2), ([14, 15], [15, 16], 3)]
        );
    }
}
