//! A minimal TensorBoard event-file writer: scalar summaries as `Event` protobufs in
//! TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C of the
//! data). No maintained Rust crate does this; the format is small and stable.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `tensorflow.Event`, the fields a scalar summary needs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`: a `simple_value`, or a plugin's tensor with its
/// metadata (see [`crate::tensorboard_hparams`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
}

/// `tensorflow.SummaryMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `tensorflow.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    pub content: Vec<u8>,
}

/// `tensorflow.TensorProto`: the plugin's null tensor is a float scalar with no value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `DT_FLOAT` is 1.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShape>,
}

/// `tensorflow.TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShape {
    #[prost(message, repeated, tag = "2")]
    pub dim: Vec<Dim>,
}

/// `tensorflow.TensorShapeProto.Dim`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dim {
    #[prost(int64, tag = "1")]
    pub size: i64,
}

/// TFRecord's CRC mask: rotate right by 15 and add a constant.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Frames one record in TFRecord format.
pub fn write_record<W: Write>(out: &mut W, data: &[u8]) -> io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc32c(&len).to_le_bytes())?;
    out.write_all(data)?;
    out.write_all(&masked_crc32c(data).to_le_bytes())
}

/// Appends scalar summaries to `events.out.tfevents.<time>.<host>` in a log directory.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("path", &self.path)
            .finish()
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Summary {
    /// Scalars as simple values (non-finite ones left out: TensorBoard cannot plot
    /// them).
    pub fn scalars(values: &[(&str, f64)]) -> Self {
        let value = values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(tag, v)| SummaryValue {
                tag: (*tag).to_string(),
                simple_value: Some(*v as f32),
                ..SummaryValue::default()
            })
            .collect();
        Self { value }
    }
}

/// Appends `events` to the event file at `path` (created with its header if new),
/// and closes it: for many runs written now and then, no file stays open.
pub fn append(path: &Path, events: &[Event]) -> io::Result<()> {
    let fresh = !path.exists();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = BufWriter::new(file);
    if fresh {
        write_record(&mut out, &prost::Message::encode_to_vec(&Event::header()))?;
    }
    for event in events {
        write_record(&mut out, &prost::Message::encode_to_vec(event))?;
    }
    out.flush()
}

/// A new event file's name: `events.out.tfevents.<time>.<host>.<pid>`.
pub fn file_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!(
        "events.out.tfevents.{}.{host}.{}",
        now() as u64,
        std::process::id()
    )
}

impl Event {
    /// The record an event file starts with.
    pub fn header() -> Self {
        Self {
            wall_time: now(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        }
    }

    /// `summary` at `step`, now.
    pub fn at(step: u64, summary: Summary) -> Self {
        Self {
            wall_time: now(),
            step: step as i64,
            file_version: None,
            summary: Some(summary),
        }
    }
}

impl EventWriter {
    /// Creates the directory if needed and starts a new event file.
    pub fn create(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(file_name());
        let mut writer = Self {
            out: BufWriter::new(File::create(&path)?),
            path,
        };
        writer.write_event(&Event::header())?;
        writer.flush()?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, event: &Event) -> io::Result<()> {
        write_record(&mut self.out, &prost::Message::encode_to_vec(event))
    }

    /// Writes several scalars at one step as one event.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> io::Result<()> {
        self.summary(step, Summary::scalars(values))
    }

    /// Writes a summary at one step as one event.
    pub fn summary(&mut self, step: u64, summary: Summary) -> io::Result<()> {
        self.write_event(&Event::at(step, summary))
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // CRC-32C (Castagnoli) of "123456789" is 0xE3069283 (RFC 3720).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        // Masked as TFRecord does: rotate right by 15, add 0xa282ead8.
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
    }

    /// Reads records back, checking both CRCs, as TensorBoard's reader does.
    fn read_records(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(len_bytes), "length crc");
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data), "data crc");
            out.push(data.to_vec());
            at += 16 + len;
        }
        out
    }

    #[test]
    fn writes_a_version_header_then_scalar_events() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalars(
            10,
            &[
                ("train/return", 21.5),
                ("train/epsilon", 0.5),
                ("nan", f64::NAN),
            ],
        )
        .unwrap();
        w.flush().unwrap();
        let records = read_records(&std::fs::read(w.path()).unwrap());
        assert_eq!(records.len(), 2);
        let head = Event::decode(records[0].as_slice()).unwrap();
        assert_eq!(head.file_version.as_deref(), Some("brain.Event:2"));
        let ev = Event::decode(records[1].as_slice()).unwrap();
        assert_eq!(ev.step, 10);
        let values = ev.summary.unwrap().value;
        assert_eq!(values.len(), 2, "non-finite values are dropped");
        assert_eq!(values[0].tag, "train/return");
        assert_eq!(values[0].simple_value, Some(21.5));
    }
}
