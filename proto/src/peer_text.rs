//! Text a peer sent (an actor's name, a goodbye's or a refusal's reason), made safe to
//! log and to use as a Prometheus label value: bounded in length, with every control
//! character (a line break that would forge a log line, an escape sequence for the
//! terminal) written out as its escape instead.

/// Most characters of an actor's name that are kept (names become log fields and label
/// values).
pub const MAX_NAME_CHARS: usize = 64;
/// Most characters of a peer's reason (a goodbye, a refusal) that are kept.
pub const MAX_REASON_CHARS: usize = 256;

/// `text` with control characters escaped (`\n`, `\u{1b}`), cut to `max_chars`
/// characters of output, ending with `…` where it was cut.
pub fn peer_text(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars * 4));
    let mut kept = 0;
    for ch in text.chars() {
        let piece: String = if ch.is_control() {
            ch.escape_default().collect()
        } else {
            ch.to_string()
        };
        let n = piece.chars().count();
        if kept + n > max_chars {
            out.push('…');
            return out;
        }
        out.push_str(&piece);
        kept += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_text_is_kept_as_it_is() {
        assert_eq!(
            peer_text("actor-7 (pod a/b)", MAX_NAME_CHARS),
            "actor-7 (pod a/b)"
        );
        assert_eq!(peer_text("Zürich 東京", 64), "Zürich 東京");
        assert_eq!(peer_text("", 8), "");
    }

    #[test]
    fn control_characters_cannot_forge_a_line_or_drive_a_terminal() {
        let forged = "bye\n2026-12-03T00:00:00Z ERROR learner: forged\r\u{1b}[2J";
        let safe = peer_text(forged, MAX_REASON_CHARS);
        assert!(!safe.chars().any(char::is_control), "{safe}");
        assert!(safe.starts_with("bye\\n2026"), "{safe}");
        assert!(safe.contains("\\r\\u{1b}[2J"), "{safe}");
    }

    #[test]
    fn long_text_is_cut_with_a_mark_and_escapes_count_in_full() {
        let huge = "x".repeat(60_000);
        let name = peer_text(&huge, MAX_NAME_CHARS);
        assert_eq!(name.chars().count(), MAX_NAME_CHARS + 1);
        assert!(name.ends_with('…'));
        // An escape is never split: what is kept of it is all of it.
        let cut = peer_text("abc\n", 4);
        assert_eq!(cut, "abc…");
        assert_eq!(peer_text("ab\n", 4), "ab\\n");
    }
}
