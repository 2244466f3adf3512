//! What a run's memory goes to, so that running out of it is explained in the run's
//! own terms (networks, batches, staging buffers, replay) with what to change.

use crate::device::DeviceChoice;

/// Bytes the learner's main consumers take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Footprint {
    pub device: DeviceChoice,
    /// Online and target networks plus Adam's two moments, and the gradient.
    pub params_bytes: usize,
    /// One batch on the device (observations and next observations, columns).
    pub batch_bytes: usize,
    /// Staging buffers (pinned host memory on a GPU host).
    pub staging_bytes: usize,
    /// Replay (host memory).
    pub replay_bytes: usize,
    pub batch_size: usize,
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

impl Footprint {
    /// What `agents` stacked agents of `params` parameters each hold on `device`:
    /// online and target networks, Adam's moments and the gradient; one batch of
    /// `batch_size` observations of `row_bytes` per agent (observations, next
    /// observations, columns), `staged` batches of it in staging; `replay_bytes` of
    /// replay.
    pub fn of(
        device: DeviceChoice,
        params: usize,
        agents: usize,
        batch_size: usize,
        row_bytes: usize,
        staged: usize,
        replay_bytes: usize,
    ) -> Self {
        let batch_bytes = agents * batch_size * (2 * row_bytes + 16);
        Self {
            device,
            params_bytes: 5 * 4 * params * agents,
            batch_bytes,
            staging_bytes: staged * batch_bytes,
            replay_bytes,
            batch_size,
        }
    }

    /// The error message for an allocation failure `what` (libtorch's message),
    /// naming the sizes involved and what to change. (Where the state was saved, the
    /// run's shutdown adds.)
    pub fn explain(&self, what: &str) -> String {
        let first_line = first_line(torch_words(what));
        let free = match self.device {
            DeviceChoice::Cuda(i) => match crate::cuda::memory(i) {
                Ok((free, total)) => format!(
                    " ({:.0} MiB free of {:.0} MiB on {})",
                    mib(free),
                    mib(total),
                    self.device
                ),
                Err(_) => String::new(),
            },
            DeviceChoice::Cpu => String::new(),
        };
        format!(
            "out of memory on {}{free}: {first_line}. The networks with their optimizer state \
             and gradient take {:.1} MiB, a batch of {} takes {:.1} MiB on the device plus its \
             activations, staging buffers {:.1} MiB of host memory, replay {:.1} MiB. Lower \
             --batch-size or --hidden, free the device of other processes, or use --cpu, and \
             continue with --resume",
            self.device,
            mib(self.params_bytes),
            self.batch_size,
            mib(self.batch_bytes),
            mib(self.staging_bytes),
            mib(self.replay_bytes),
        )
    }
}

/// libtorch's own words in a panic from `tch` (`called `Result::unwrap()` on an `Err`
/// value: Torch("…")`), or the message as it is.
fn torch_words(what: &str) -> &str {
    match what.find("Torch(\"") {
        Some(i) => {
            let words = &what[i + "Torch(\"".len()..];
            words.strip_suffix("\")").unwrap_or(words)
        }
        None => what,
    }
}

/// The first line, also where the line breaks are escaped (`\n` in a `Debug`-printed
/// error).
fn first_line(text: &str) -> &str {
    let line = text.lines().next().unwrap_or(text);
    line.split("\\n").next().unwrap_or(line).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_explanation_names_sizes_and_what_to_change() {
        let f = Footprint {
            device: DeviceChoice::Cpu,
            params_bytes: 20 << 20,
            batch_bytes: 3 << 20,
            staging_bytes: 64 << 20,
            replay_bytes: 2800 << 20,
            batch_size: 512,
        };
        let msg = f.explain(
            "CUDA out of memory. Tried to allocate 20.00 MiB\nException raised from malloc",
        );
        assert!(
            msg.contains("CUDA out of memory. Tried to allocate 20.00 MiB."),
            "{msg}"
        );
        assert!(!msg.contains("Exception raised"), "first line only: {msg}");
        // Through tch: libtorch's words alone, up to their first (escaped) line break.
        let wrapped = f.explain(
            "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. Tried to allocate 2.00 GiB\\nframe #0: c10::alloc\")",
        );
        assert!(
            wrapped.contains(
                "out of memory on cpu: CUDA out of memory. Tried to allocate 2.00 GiB. The"
            ) && !wrapped.contains("unwrap")
                && !wrapped.contains("frame #0"),
            "{wrapped}"
        );
        for part in [
            "20.0 MiB",
            "a batch of 512 takes 3.0 MiB",
            "--batch-size",
            "--resume",
        ] {
            assert!(msg.contains(part), "{part:?} missing: {msg}");
        }
    }
}
