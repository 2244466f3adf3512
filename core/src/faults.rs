//! Injected allocation failures on the learner's device path, for tests of the
//! out-of-memory endings (`MILLRACE_INJECT_FAULT=oom:SITE[:cuda]`, parsed by the
//! application's configuration).

/// Where on the learner's device path an injected allocation failure strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomSite {
    /// Copying a batch to the device.
    Copy,
    /// The update itself.
    Update,
    /// Reading the TD errors back for prioritized replay.
    Priorities,
    /// Copying the parameters off the device to publish them.
    Publish,
    /// Reading the update statistics.
    Stats,
}

impl OomSite {
    pub const ALL: [OomSite; 5] = [
        OomSite::Copy,
        OomSite::Update,
        OomSite::Priorities,
        OomSite::Publish,
        OomSite::Stats,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OomSite::Copy => "copy",
            OomSite::Update => "update",
            OomSite::Priorities => "priorities",
            OomSite::Publish => "publish",
            OomSite::Stats => "stats",
        }
    }
}

/// An injected out-of-memory: where, and whose message (the CPU allocator's or CUDA's
/// caching allocator's, as PyTorch 2.11 words them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomFault {
    pub site: OomSite,
    pub cuda: bool,
}

impl OomFault {
    /// The panic message a failed allocation gives through `tch` (its error in an
    /// `unwrap`).
    pub fn message(&self) -> String {
        let torch = if self.cuda {
            "CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 0 has a total capacity of \
             139.81 GiB of which 120.53 GiB is free. Including non-PyTorch memory, this process \
             has 19.27 GiB memory in use. Of the allocated memory 18.50 GiB is allocated by \
             PyTorch, and 263.50 MiB is reserved by PyTorch but unallocated. If reserved but \
             unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
             to avoid fragmentation."
        } else {
            "DefaultCPUAllocator: not enough memory: you tried to allocate 1099511627776 bytes."
        };
        format!(
            "called `Result::unwrap()` on an `Err` value: Torch(\"{torch} (injected fault at {})\")",
            self.site.name()
        )
    }

    /// Panics as libtorch would at `site`, if this fault is there.
    pub fn strike(&self, site: OomSite) {
        if self.site == site {
            std::panic::panic_any(self.message());
        }
    }
}

/// An injected allocation failure at `site`, once `updates` reach its count.
pub fn inject_oom(oom: Option<(OomFault, u64)>, updates: u64, site: OomSite) {
    if let Some((fault, after)) = oom {
        if updates >= after {
            fault.strike(site);
        }
    }
}
