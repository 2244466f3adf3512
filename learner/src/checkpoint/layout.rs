//! Where a run's checkpoint lives: `latest/`, `best/`, `solved/` under one root, and
//! which of them a path names.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::files::{invalid, read_json};
use super::{CheckpointError, FORMAT_VERSION, META, OLDEST_FORMAT};

/// A saved policy in a checkpoint directory, named as its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Which {
    Latest,
    Best,
    Solved,
}

impl Which {
    pub const ALL: [Which; 3] = [Which::Latest, Which::Best, Which::Solved];

    /// Its directory's name, and how users spell it (`--which`).
    pub fn name(self) -> &'static str {
        match self {
            Which::Latest => "latest",
            Which::Best => "best",
            Which::Solved => "solved",
        }
    }
}

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a run's checkpoints live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn latest(&self) -> PathBuf {
        self.dir(Which::Latest)
    }

    pub fn best(&self) -> PathBuf {
        self.dir(Which::Best)
    }

    pub fn solved(&self) -> PathBuf {
        self.dir(Which::Solved)
    }

    pub fn config(&self) -> PathBuf {
        self.root.join("config.json")
    }

    pub fn dir(&self, which: Which) -> PathBuf {
        self.root.join(which.name())
    }

    /// Removes what saves killed mid-way left here (`meta.tmp.*` and the like, in the
    /// root and each directory; see [`super::files::is_temporary`]), and says so: for a
    /// run that is about to write this layout and holds its logdir's lock.
    pub fn remove_leftovers(&self) {
        let dirs = [self.root.clone()]
            .into_iter()
            .chain(Which::ALL.map(|w| self.dir(w)));
        let removed: usize = dirs.map(|d| super::files::remove_temporaries(&d)).sum();
        if removed > 0 {
            tracing::info!(
                "checkpoint: removed {removed} temporary file(s) an interrupted save left in {}",
                self.root.display()
            );
        }
    }

    /// The layout a user's path refers to: a checkpoint root, one of its
    /// `latest/`, `best/` or `solved/` directories, or a `meta.json` in one.
    pub fn find(path: &Path) -> Result<Self, CheckpointError> {
        let dir = if path.file_name() == Some(META.as_ref()) {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            path.to_path_buf()
        };
        if Which::ALL
            .iter()
            .any(|w| dir.join(w.name()).join(META).exists())
        {
            return Ok(Self::new(dir));
        }
        let named = dir
            .file_name()
            .is_some_and(|n| Which::ALL.iter().any(|w| n == w.name()));
        if named && dir.join(META).exists() {
            return Ok(Self::new(dir.parent().unwrap_or(Path::new("."))));
        }
        if dir.join(META).exists() {
            // A directory of the older flat format, or something else entirely.
            let format = read_json::<serde_json::Value>(&dir.join(META))
                .ok()
                .and_then(|v| v.get("format").and_then(serde_json::Value::as_u64));
            return Err(invalid(
                &dir.join(META),
                match format {
                    Some(f) if (u64::from(OLDEST_FORMAT)..=u64::from(FORMAT_VERSION)).contains(&f) => format!(
                        "a format {f} checkpoint's files, but not in latest/, best/ or solved/"
                    ),
                    Some(f) => format!(
                        "checkpoint format {f} (this build reads {OLDEST_FORMAT} to {FORMAT_VERSION})"
                    ),
                    None => "no checkpoint format".into(),
                },
            ));
        }
        Err(CheckpointError::Missing(format!(
            "{}: no checkpoint here (expected latest/meta.json, best/ or solved/)",
            path.display()
        )))
    }
}
