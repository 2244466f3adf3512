//! `actor doctor`'s own check: the Gymnasium bridge. The libtorch and CUDA checks are
//! `millrace_probe`'s, shared with the learner.

pub use millrace_probe::{Check, Report};

/// The Gymnasium bridge: the embedded interpreter and the packages it runs
/// environments with (one check each), or that this build has no bridge.
pub fn bridge_checks() -> Report {
    #[cfg(feature = "gym")]
    {
        let fix = "scripts/setup.sh installs them into the project virtualenv";
        match crate::env::gym::packages() {
            Ok(found) => Report(
                found
                    .into_iter()
                    .map(|(name, version)| match version {
                        Ok(v) => Check::ok(&name, v),
                        // Without a package, the environments needing it are refused
                        // when asked for; the Rust ports still run.
                        Err(why) => Check::warn(&name, why, fix),
                    })
                    .collect(),
            ),
            Err(e) => Report(vec![Check::warn("python", e.to_string(), fix)]),
        }
    }
    #[cfg(not(feature = "gym"))]
    {
        Report(vec![Check::warn(
            "gym bridge",
            "not built (--no-default-features): the Rust ports only",
            "build with the default features for gym: and Atari ids",
        )])
    }
}
