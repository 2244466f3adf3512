//! Prometheus' text exposition format, version 0.0.4
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/>): one `# HELP` and one
//! `# TYPE` line per family, then its samples, label values escaped.

use std::fmt::Write;

/// A metric family's type, as Prometheus reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (its name ends in `_total`); Prometheus computes rates from it.
    Counter,
    /// Any value at the time of the scrape.
    Gauge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// A page of metrics being written. Families are written whole, one after another;
/// names and label names are checked (a bad one is a programming error, so it panics in
/// debug builds and is skipped in release builds rather than corrupting the page).
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

fn valid_name(name: &str, colons: bool) -> bool {
    let mut chars = name.chars();
    let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':');
    chars.next().is_some_and(first_ok) && chars.all(|c| first_ok(c) || c.is_ascii_digit())
}

fn escape_help(s: &str) -> String {
    s.replace('\\', r"\\").replace('\n', r"\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// Prometheus' float syntax: `NaN`, `+Inf`, `-Inf`, otherwise Go-parsable decimals.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// One unlabelled sample.
    pub fn metric(&mut self, name: &str, kind: Kind, help: &str, v: f64) -> &mut Self {
        self.family(name, kind, help, std::iter::once((Vec::new(), v)))
    }

    /// A family with one label: `name{label="key"} value` per sample.
    pub fn labelled<'a>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> &mut Self {
        self.family(
            name,
            kind,
            help,
            samples.into_iter().map(|(k, v)| (vec![(label, k)], v)),
        )
    }

    /// A whole family: its help and type, then every sample with its labels.
    pub fn family<'a>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, f64)>,
    ) -> &mut Self {
        let ok = valid_name(name, true) && (kind != Kind::Counter || name.ends_with("_total"));
        debug_assert!(ok, "bad metric name {name:?} for a {}", kind.name());
        if !ok {
            return self;
        }
        let t = &mut self.text;
        let _ = writeln!(t, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(t, "# TYPE {name} {}", kind.name());
        for (labels, v) in samples {
            t.push_str(name);
            if !labels.is_empty() {
                t.push('{');
                for (i, (k, val)) in labels.iter().enumerate() {
                    debug_assert!(valid_name(k, false), "bad label name {k:?}");
                    if i > 0 {
                        t.push(',');
                    }
                    let _ = write!(t, "{k}=\"{}\"", escape_label(val));
                }
                t.push('}');
            }
            let _ = writeln!(t, " {}", value(v));
        }
        self
    }

    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_type_and_escaped_labels() {
        let mut e = Exposition::new();
        e.metric(
            "millrace_env_steps_total",
            Kind::Counter,
            "Env steps.\nAll.",
            12.0,
        )
        .labelled(
            "millrace_actor_lag",
            Kind::Gauge,
            "Lag.",
            "actor",
            [("a\"b\\c", 2.0), ("d", f64::NAN)],
        );
        assert_eq!(
            e.finish(),
            "# HELP millrace_env_steps_total Env steps.\\nAll.\n\
             # TYPE millrace_env_steps_total counter\n\
             millrace_env_steps_total 12\n\
             # HELP millrace_actor_lag Lag.\n\
             # TYPE millrace_actor_lag gauge\n\
             millrace_actor_lag{actor=\"a\\\"b\\\\c\"} 2\n\
             millrace_actor_lag{actor=\"d\"} NaN\n"
        );
    }

    #[test]
    fn special_floats_use_prometheus_spelling() {
        assert_eq!(value(f64::INFINITY), "+Inf");
        assert_eq!(value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(value(0.25), "0.25");
        assert_eq!(value(1e-9), "0.000000001");
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("millrace_x:y", true));
        assert!(!valid_name("9lives", true));
        assert!(!valid_name("a-b", true));
        assert!(!valid_name("a:b", false));
        assert!(!valid_name("", true));
    }
}
