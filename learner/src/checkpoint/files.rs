//! Files of a checkpoint: written atomically (temporary name, fsync, rename, directory
//! fsync), read with their sizes checked, named only by plain names.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Metadata files are small; refuse to read anything larger (it may not be ours).
const MAX_META_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a millrace checkpoint: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Tensor {
        path: PathBuf,
        source: tch::TchError,
    },
    #[error("checkpoint does not match this run: {0}")]
    Mismatch(String),
    #[error("{0}")]
    Missing(String),
    /// Copying the state off the device panicked (the device gone).
    #[error("copying the state off the device failed: {}", .0 .0)]
    NotCopied(millrace_proto::panics::Panicked),
}

pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub fn tensor_err(path: &Path) -> impl FnOnce(tch::TchError) -> CheckpointError + '_ {
    move |source| CheckpointError::Tensor {
        path: path.to_path_buf(),
        source,
    }
}

pub fn invalid(path: &Path, reason: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Invalid {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Makes a rename (or creation) in `dir` durable.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// A temporary file's extension, unique per host, process and write: every container
/// is PID 1, so a PID alone would let two learners' temporaries collide on a shared
/// volume.
fn temporary_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static HOST: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let host = HOST.get_or_init(|| {
        let name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        // A plain file-name piece.
        let name: String = name
            .trim()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        if name.is_empty() {
            "host".into()
        } else {
            name
        }
    });
    format!(
        "tmp.{host}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether `name` is a temporary of [`write_atomic`]: `<stem>.tmp.<host>.<pid>.<n>`,
/// with `<stem>` one of the names a checkpoint writes (`model-…`, `replay-…`,
/// `policy-…`, `meta`, `config`). Nothing else matches, so a user's own files beside a
/// checkpoint are never taken for ours.
pub fn is_temporary(name: &str) -> bool {
    let Some((stem, rest)) = name.split_once(".tmp.") else {
        return false;
    };
    let ours = ["model-", "replay-", "policy-"]
        .iter()
        .any(|p| stem.starts_with(p))
        || stem == "meta"
        || stem == "config";
    let mut parts = rest.rsplitn(3, '.');
    let (Some(n), Some(pid), Some(host)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ours && digits(n) && digits(pid) && host_ok
}

/// Removes the temporaries a killed save left in `dir` (see [`is_temporary`]); how many.
/// Only for a directory this process owns (a run holds its logdir's lock), since a
/// temporary there is then no live writer's.
pub fn remove_temporaries(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| is_temporary(&e.file_name().to_string_lossy()))
        .filter(|e| fs::remove_file(e.path()).is_ok())
        .count()
}

/// Writes `path` atomically: `write` fills a temporary file, which is synced and renamed
/// over `path`; a crash at any moment leaves either the old file or the new one.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    let tmp = path.with_extension(temporary_suffix());
    let result = write(&tmp)
        .and_then(|()| {
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(io(&tmp))
        })
        .and_then(|()| fs::rename(&tmp, path).map_err(io(path)));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    Ok(())
}

/// Writes `value` as pretty JSON, atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), CheckpointError> {
    let text = serde_json::to_vec_pretty(value).map_err(|e| invalid(path, e.to_string()))?;
    write_atomic(path, |tmp| {
        File::create(tmp)
            .and_then(|mut f| f.write_all(&text))
            .map_err(io(tmp))
    })
}

/// Reads a small JSON file (metadata), refusing oversized or malformed ones.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, CheckpointError> {
    let len = fs::metadata(path).map_err(io(path))?.len();
    if len > MAX_META_BYTES {
        return Err(invalid(
            path,
            format!("{len} bytes is too large for metadata"),
        ));
    }
    let text = fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&text).map_err(|e| invalid(path, e.to_string()))
}

/// `name` if it names a file directly inside a directory (names come from metadata).
pub fn plain_name<'a>(meta: &Path, name: &'a str) -> Result<&'a str, CheckpointError> {
    if Path::new(name).components().count() == 1 && !name.starts_with('.') {
        Ok(name)
    } else {
        Err(invalid(meta, format!("file {name:?} is not a plain name")))
    }
}

/// Removes files in `dir` that start with one of `prefixes` and are not in `keep`
/// (older generations, unreferenced once the new metadata is in place), temporaries
/// included: one thread writes a directory, so once its write is done any temporary
/// left there is a crashed process's (gigabytes, for a replay). Failing to remove one
/// is harmless.
pub fn remove_unreferenced(dir: &Path, prefixes: &[&str], keep: &[&str]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = prefixes.iter().any(|p| name.starts_with(p));
        if ours && !keep.contains(&name.as_str()) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.json");
        write_json(&path, &serde_json::json!({"v": 1})).unwrap();
        let err = write_atomic(&path, |tmp| {
            fs::write(tmp, b"half").unwrap();
            Err(invalid(tmp, "disk full"))
        });
        assert!(err.is_err());
        let v: serde_json::Value = read_json(&path).unwrap();
        assert_eq!(v["v"], 1);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn only_this_schemes_temporaries_count_as_leftovers() {
        for ours in [
            "meta.tmp.host-1.4242.0",
            "config.tmp.node_7.1.12",
            "model-000000000012-000003.tmp.h.99.3",
            "replay-000000000012-000003.tmp.h.99.4",
            "policy-000000000005-000001.tmp.a-b.7.0",
        ] {
            assert!(is_temporary(ours), "{ours}");
        }
        for theirs in [
            "meta.json",
            "notes.tmp.host.1.2",
            "meta.tmp.host.1",
            "meta.tmp..1.2",
            "meta.tmp.host.x.2",
            "meta.tmp.ho.st.1.2",
            "model-000000000012.safetensors",
        ] {
            assert!(!is_temporary(theirs), "{theirs}");
        }
    }

    #[test]
    fn a_killed_saves_leftovers_are_removed_and_nothing_else() {
        // Regression (issue "One bad transition…", part 5): a save killed mid-way left
        // `meta.tmp.*` files that nothing ever removed.
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "meta.json",
            "meta.tmp.host.4242.0",
            "model-000000000001-000001.tmp.host.4242.1",
            "model-000000000001-000001.safetensors",
            "notes.txt",
        ];
        for name in names {
            fs::write(dir.path().join(name), b"x").unwrap();
        }
        assert_eq!(remove_temporaries(dir.path()), 2);
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "meta.json",
                "model-000000000001-000001.safetensors",
                "notes.txt"
            ]
        );
    }

    #[test]
    fn older_generations_and_a_crashed_writes_temporaries_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "model-000000000001.safetensors",
            "model-000000000002.safetensors",
            "replay-000000000001.tmp.4242",
            "meta.json",
        ] {
            fs::write(dir.path().join(name), b"x").unwrap();
        }
        remove_unreferenced(
            dir.path(),
            &["model-", "replay-"],
            &["model-000000000002.safetensors"],
        );
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["meta.json", "model-000000000002.safetensors"]);
    }

    #[test]
    fn metadata_is_read_with_limits() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.json");
        fs::write(&big, vec![b' '; (MAX_META_BYTES + 1) as usize]).unwrap();
        let err = read_json::<serde_json::Value>(&big).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        assert!(plain_name(&big, "../etc/passwd").is_err());
        assert!(plain_name(&big, ".hidden").is_err());
        assert_eq!(
            plain_name(&big, "model-1.safetensors").unwrap(),
            "model-1.safetensors"
        );
    }
}
