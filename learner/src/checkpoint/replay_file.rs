//! Replay's contents in a checkpoint: length-prefixed `(shard, TransitionBatch)` records
//! in the wire codec, read back with the same framed reader as the network.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use millrace_proto::codec::{self, Framer, MAX_FRAME_CEILING};
use millrace_proto::{EnvSpec, TransitionBatch};
use millrace_replay::{ReplayError, Table};

use super::files::{invalid, io, write_atomic, CheckpointError};

/// Writes every batch replay holds to `path` (atomically), copying one batch at a time
/// while actors keep inserting (see [`Table::snapshot`]). Returns the rate limiter's
/// counters as of the end of the copy.
pub fn write(path: &Path, table: &Table) -> Result<(u64, u64), CheckpointError> {
    let mut counters = (0, 0);
    write_atomic(path, |tmp| {
        let mut out = BufWriter::new(File::create(tmp).map_err(io(tmp))?);
        let mut result = Ok(());
        counters = table.snapshot(|shard, batch| {
            if result.is_ok() {
                result = codec::encode(&(shard as u32, batch), MAX_FRAME_CEILING)
                    .map_err(|e| invalid(tmp, e.to_string()))
                    .and_then(|frame| out.write_all(&frame).map_err(io(tmp)));
            }
        });
        result?;
        out.flush().map_err(io(tmp))
    })?;
    Ok(counters)
}

/// What a replay file put back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Transitions read back into the table.
    pub read: usize,
    /// Transitions the table holds afterwards: fewer than read when it is smaller than
    /// the checkpointed run's (the oldest were evicted as it refilled).
    pub held: usize,
    /// Transitions in batches too large for this table's shards, not read back.
    pub skipped: usize,
}

/// Refills `table` from a replay file, checking every record as if it came from the
/// network (lengths before allocation, shapes, values). Batches larger than this
/// table's shards are skipped and counted.
pub fn load(path: &Path, env: &EnvSpec, table: &Table) -> Result<Restored, CheckpointError> {
    let (num_actions, obs_dtype) = (env.num_actions, env.obs.dtype);
    let mut input = BufReader::new(File::open(path).map_err(io(path))?);
    let mut framer = Framer::new(MAX_FRAME_CEILING);
    let mut restored = Restored::default();
    loop {
        let payload = match codec::read_frame(&mut input, &mut framer) {
            Ok(Some(p)) => p,
            Ok(None) => break,
            // A disk's error is not a damaged checkpoint.
            Err(codec::ReadError::Io(e)) => return Err(io(path)(e)),
            Err(e) => return Err(invalid(path, e.to_string())),
        };
        let (shard, batch): (u32, TransitionBatch) =
            codec::decode(payload).map_err(|e| invalid(path, e.to_string()))?;
        batch
            .check_values(num_actions, obs_dtype)
            .map_err(|e| invalid(path, e.to_string()))?;
        match table.restore(shard as usize, &batch) {
            Ok(()) => restored.read += batch.len(),
            // A smaller replay (or shards) than the checkpointed run's: keep what fits.
            Err(ReplayError::TooLarge(_)) => restored.skipped += batch.len(),
            // Whole stacks saved before replay stored frames once (or the other way
            // round): the run resumes without them rather than not at all.
            Err(ReplayError::Malformed(_)) if batch.frames.is_some() != (table.stack() > 1) => {
                restored.skipped += batch.len()
            }
            Err(e) => return Err(invalid(path, e.to_string())),
        }
    }
    restored.held = table.len();
    Ok(restored)
}
