//! The flag reference cannot drift: `docs/reference/{learner,actor,millrace-health}.md`
//! are the binaries' own `--help` (clap's, from the flag definitions), every subcommand
//! included, and this test fails when a page and its binary disagree. After changing a
//! flag, rewrite the pages with
//!
//! ```sh
//! MILLRACE_BLESS=1 cargo test -p millrace-tests --test reference
//! ```

use std::path::PathBuf;
use std::process::Command;

use millrace_tests::binary;

fn help(bin: &str, sub: Option<&str>) -> String {
    let mut cmd = Command::new(binary(bin));
    cmd.args(sub).arg("--help").env_remove("RUST_LOG");
    let out = cmd.output().expect("the binary runs");
    assert!(
        out.status.success(),
        "{bin} {sub:?} --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands a help page lists (`Commands:` up to the next blank line), but
/// `help`.
fn subcommands(page: &str) -> Vec<String> {
    page.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The page for `bin`: its help, then each subcommand's.
fn reference(bin: &str, what: &str) -> String {
    let top = help(bin, None);
    let mut page = format!(
        "# `{bin}`: flags and subcommands\n\n{what}\n\n\
         This page is the binary's own `--help`, generated from its flag definitions: \
         `tests/tests/reference.rs` fails when the two disagree, and `MILLRACE_BLESS=1 \
         cargo test -p millrace-tests --test reference` rewrites it.\n"
    );
    let subs = subcommands(&top);
    if !subs.is_empty() {
        page.push_str("\nSubcommands: ");
        let links: Vec<String> = subs
            .iter()
            .map(|s| format!("[`{s}`](#{bin}-{s})"))
            .collect();
        page.push_str(&links.join(", "));
        page.push_str(".\n");
    }
    page.push_str(&format!("\n## `{bin}`\n\n```text\n{}```\n", top));
    for sub in &subs {
        page.push_str(&format!(
            "\n## `{bin} {sub}`\n\n```text\n{}```\n",
            help(bin, Some(sub))
        ));
    }
    page
}

fn check(bin: &str, what: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/reference")
        .join(format!("{bin}.md"));
    let want = reference(bin, what);
    if std::env::var_os("MILLRACE_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "{} is not `{bin} --help` any more (first difference at line {}: {:?} against \
             the binary's {:?}); rewrite it with MILLRACE_BLESS=1 cargo test -p \
             millrace-tests --test reference",
            path.display(),
            line + 1,
            have.lines().nth(line).unwrap_or("<end of page>"),
            want.lines().nth(line).unwrap_or("<end of help>"),
        );
    }
}

#[test]
fn the_learner_reference_is_its_help() {
    check(
        "learner",
        "The learner: training (embedded, `--listen`, `--population`, `--sweep`) and the \
         subcommands that read what a run saved.",
    );
}

#[test]
fn the_actor_reference_is_its_help() {
    check(
        "actor",
        "The actor process: `actor --n 64 --learner HOST:PORT` steps environments for a \
         learner started with `--listen`.",
    );
}

#[test]
fn the_health_check_reference_is_its_help() {
    check(
        "millrace-health",
        "The containers' health check: the same check as `learner health` and `actor \
         health`, in a binary that loads neither libtorch nor Python.",
    );
}

#[test]
fn subcommands_are_read_from_the_commands_section() {
    let page = "Usage: x\n\nCommands:\n  export  Write\n  eval    Play\n  help    Print\n\nOptions:\n  --a\n";
    assert_eq!(subcommands(page), ["export", "eval"]);
    assert!(subcommands("Usage: x\n\nOptions:\n").is_empty());
}
