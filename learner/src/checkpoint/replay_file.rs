//! Replay's contents in a checkpoint: a header, then `(shard, TransitionBatch)` records
//! in the wire codec, each with its length and a CRC-32C of its bytes.
//!
//! ```text
//! "MRREPLAY" u32:version(2)   then per record:   u32:len  u32:crc32c(payload)  payload
//! ```
//!
//! Damage costs only what it touches: a record whose checksum, decoding or values fail
//! is skipped and counted, and the rest is read on; a length that cannot be a record's
//! (or a file cut short) ends the reading there, and the bytes after it are counted as
//! lost. Either way the run resumes with its networks and every intact record, and says
//! what was lost. Files of version 1 (no header, no checksums) are still read.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use millrace_proto::codec::{self, MAX_FRAME_CEILING};
use millrace_proto::{EnvSpec, TransitionBatch};
use millrace_replay::{ReplayError, Table};

use super::files::{invalid, io, write_atomic, CheckpointError};

const MAGIC: &[u8; 8] = b"MRREPLAY";
const VERSION: u32 = 2;

/// Writes every batch replay holds to `path` (atomically), copying one batch at a time
/// while actors keep inserting (see [`Table::snapshot`]). Returns the rate limiter's
/// counters as of the end of the copy.
pub fn write(path: &Path, table: &Table) -> Result<(u64, u64), CheckpointError> {
    let mut counters = (0, 0);
    write_atomic(path, |tmp| {
        let mut out = BufWriter::new(File::create(tmp).map_err(io(tmp))?);
        out.write_all(MAGIC).map_err(io(tmp))?;
        out.write_all(&VERSION.to_le_bytes()).map_err(io(tmp))?;
        let mut result = Ok(());
        counters = table.snapshot(|shard, batch| {
            if result.is_ok() {
                result = write_record(&mut out, &(shard as u32, batch)).map_err(|e| match e {
                    Record::Io(e) => io(tmp)(e),
                    Record::Encode(e) => invalid(tmp, e),
                });
            }
        });
        result?;
        out.flush().map_err(io(tmp))
    })?;
    Ok(counters)
}

enum Record {
    Io(std::io::Error),
    Encode(String),
}

fn write_record<W: Write>(out: &mut W, record: &(u32, TransitionBatch)) -> Result<(), Record> {
    let payload = codec::to_bytes(record).map_err(|e| Record::Encode(e.to_string()))?;
    if payload.len() > MAX_FRAME_CEILING {
        return Err(Record::Encode(format!(
            "a batch of {} bytes exceeds the record limit of {MAX_FRAME_CEILING}",
            payload.len()
        )));
    }
    let crc = crc32c::crc32c(&payload);
    out.write_all(&(payload.len() as u32).to_le_bytes())
        .and_then(|()| out.write_all(&crc.to_le_bytes()))
        .and_then(|()| out.write_all(&payload))
        .map_err(Record::Io)
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
    /// Records skipped as damaged (a checksum, their decoding or their values failed).
    pub damaged: usize,
    /// Bytes at the end of the file that could not be read as records (a damaged length,
    /// a file cut short).
    pub lost_bytes: u64,
}

impl Restored {
    /// What was lost, for the log; `None` when nothing was.
    pub fn losses(&self) -> Option<String> {
        (self.damaged > 0 || self.lost_bytes > 0).then(|| {
            format!(
                "{} damaged record(s) skipped, {} byte(s) at the end unreadable",
                self.damaged, self.lost_bytes
            )
        })
    }
}

/// Reads up to `buf.len()` bytes; how many there were before the end of the file.
fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Refills `table` from a replay file, checking every record as if it came from the
/// network (lengths before allocation, its checksum, shapes, values). Batches larger
/// than this table's shards are skipped and counted; damaged records are skipped and
/// counted (see the module's note). Only the disk failing is an error.
pub fn load(path: &Path, env: &EnvSpec, table: &Table) -> Result<Restored, CheckpointError> {
    let (num_actions, obs_dtype) = (env.num_actions, env.obs.dtype);
    let file = File::open(path).map_err(io(path))?;
    let size = file.metadata().map_err(io(path))?.len();
    let mut file = BufReader::new(file);
    let mut restored = Restored::default();
    // The header, or a version-1 file's first bytes (read again as its first record).
    let mut head = [0u8; 12];
    let got = read_full(&mut file, &mut head).map_err(io(path))?;
    let checked = got == 12 && &head[..8] == MAGIC;
    if checked {
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if version != VERSION {
            return Err(invalid(
                path,
                format!("replay file version {version} (this build reads 1 and {VERSION})"),
            ));
        }
    }
    let (again, mut offset, want) = if checked { (0, 12, 8) } else { (got, 0, 4) };
    let mut input = std::io::Cursor::new(head[..again].to_vec()).chain(file);
    let mut payload = Vec::new();
    loop {
        // The record's header: its length (and checksum).
        let mut header = [0u8; 8];
        let got = read_full(&mut input, &mut header[..want]).map_err(io(path))?;
        if got == 0 {
            break;
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if got < want || len > MAX_FRAME_CEILING {
            restored.lost_bytes = size - offset;
            break;
        }
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        payload.resize(len, 0);
        if read_full(&mut input, &mut payload).map_err(io(path))? < len {
            restored.lost_bytes = size - offset;
            break;
        }
        offset += (want + len) as u64;
        if checked && crc32c::crc32c(&payload) != crc {
            restored.damaged += 1;
            continue;
        }
        let Ok((shard, batch)) = codec::decode::<(u32, TransitionBatch)>(&payload) else {
            restored.damaged += 1;
            continue;
        };
        // Finite values, as when they were stored: their bounds were checked then
        // (against that run's flags, which a resumed run may have changed).
        if batch
            .check_values(num_actions, obs_dtype, &millrace_proto::ValueBounds::FINITE)
            .is_err()
        {
            restored.damaged += 1;
            continue;
        }
        match table.restore(shard as usize, &batch) {
            Ok(()) => restored.read += batch.len(),
            // A smaller replay (or shards) than the checkpointed run's: keep what fits.
            Err(ReplayError::TooLarge(_)) => restored.skipped += batch.len(),
            // Whole stacks saved before replay stored frames once (or the other way
            // round): the run resumes without them rather than not at all.
            Err(ReplayError::Malformed(_)) if batch.frames.is_some() != (table.stack() > 1) => {
                restored.skipped += batch.len()
            }
            Err(_) => restored.damaged += 1,
        }
    }
    restored.held = table.len();
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_replay::{PriorityConfig, RateLimiterConfig, ReplayConfig};

    /// A prioritized CartPole-sized replay (16-byte observations) of `capacity` items.
    fn prioritized(capacity: usize) -> Table {
        Table::new(&ReplayConfig {
            capacity,
            shards: 1,
            obs_row_bytes: 16,
            stack: 1,
            obs_rows_per_item: 2.0,
            limiter: RateLimiterConfig::sample_to_insert_ratio(4.0, 10, 1e9, 8).unwrap(),
            priority: Some(PriorityConfig {
                alpha: 0.6,
                beta: 0.4,
            }),
        })
        .unwrap()
    }

    /// A valid batch of `rows` transitions with two observation rows each.
    fn batch(rows: usize, seq: u64) -> TransitionBatch {
        let mut b = TransitionBatch::with_capacity(16, rows, 2 * rows);
        b.seq = seq;
        for i in 0..rows {
            let x = (seq as usize * rows + i) as f32;
            b.push_f32(
                &[x, 0.5, -x, 1.0],
                (i % 2) as i64,
                1.0,
                0.99,
                &[x, 0.0, 0.0, 0.0],
            );
        }
        b
    }

    #[test]
    fn an_intact_replay_of_records_straddling_a_size_class_resumes_whole() {
        // Regression (issue "One bad transition…", part 2): three valid batches, ~61 KB
        // each encoded (under 64 KiB) but ~72 KB decoded (3-byte indices decode to 4,
        // 1-byte actions to 8), resumed as "3 damaged record(s) skipped … holds 0
        // transitions". Then the same across the next class boundary (1 MiB): a record
        // under it that decodes to more, and one over it.
        let env = millrace_actor::env::spec("CartPole-v1").unwrap();
        for (rows, records) in [(1200, 3), (19_000, 1), (22_000, 1)] {
            let table = prioritized(40_000);
            for seq in 0..records {
                table.insert(&batch(rows, seq)).unwrap();
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("replay.bin");
            write(&path, &table).unwrap();
            let size = std::fs::metadata(&path).unwrap().len();
            let restored = load(&path, &env, &prioritized(40_000)).unwrap();
            assert_eq!(
                (restored.read, restored.damaged, restored.lost_bytes),
                (rows * records as usize, 0, 0),
                "{records} record(s) of {rows} transitions, {size} bytes in all"
            );
        }
    }

    #[test]
    fn a_record_is_its_length_its_checksum_and_its_bytes() {
        let mut b = TransitionBatch::with_capacity(16, 1, 2);
        b.push_f32(&[1.0; 4], 0, 1.0, 0.99, &[2.0; 4]);
        let mut out = Vec::new();
        write_record(&mut out, &(3, b.clone())).ok().unwrap();
        let len = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(out[4..8].try_into().unwrap());
        assert_eq!(out.len(), 8 + len);
        assert_eq!(crc, crc32c::crc32c(&out[8..]));
        assert_eq!(
            codec::decode::<(u32, TransitionBatch)>(&out[8..]),
            Ok((3, b))
        );
    }
}
