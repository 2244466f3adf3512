//! Log lines and the progress bar on one terminal: tracing writes through the bar, so a
//! log line never tears it.

use std::io::{IsTerminal, Write};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Log output that shares the terminal with the progress bar.
#[derive(Clone)]
struct LogWriter(Option<ProgressBar>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &self.0 {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf))?,
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

pub(crate) fn init_logging(bar: Option<ProgressBar>) {
    let writer = LogWriter(bar);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(move || writer.clone())
        .init();
}

/// A bar of `max_steps` env steps on standard error, where standard error is a terminal
/// and `--no-progress` was not given.
pub(crate) fn progress_bar(max_steps: u64, no_progress: bool) -> Option<ProgressBar> {
    let show = !no_progress && std::io::stderr().is_terminal();
    show.then(|| {
        let bar = ProgressBar::with_draw_target(Some(max_steps), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar
    })
}
