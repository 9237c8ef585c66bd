//! Naming untrusted input in messages (pure): an error that quotes what a caller sent
//! quotes at most [`QUOTED_CHARS`] characters of it, escaped, and says how long it was;
//! a stored text is cut to a size ([`clip`]). So an answer, and the audit entry that
//! records it, never grows with the input: a 64 KiB label key of control characters
//! used to come back (and be stored) five times as large, escaped.
//!
//! No I/O.

/// Characters of an input an error quotes.
pub const QUOTED_CHARS: usize = 64;

/// `text` quoted and escaped (Rust's `{:?}`), cut after [`QUOTED_CHARS`] characters;
/// a cut one ends with `…` and its length in bytes. At most ~700 bytes whatever `text`.
pub fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &text[..cut], text.len()),
    }
}

/// `text` cut to at most `max_bytes` bytes (on a character boundary); a cut one ends
/// with a note of its length, inside the bound. `max_bytes` below the note's size
/// keeps only what fits.
pub fn clip(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let note = format!("… (cut from {} bytes)", text.len());
    let room = max_bytes.saturating_sub(note.len());
    let mut cut = room.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut clipped = String::with_capacity(max_bytes);
    clipped.push_str(&text[..cut]);
    if clipped.len() + note.len() <= max_bytes {
        clipped.push_str(&note);
    }
    clipped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_inputs_are_quoted_whole() {
        assert_eq!(quoted("zone"), "\"zone\"");
        assert_eq!(quoted(""), "\"\"");
        let exact = "k".repeat(QUOTED_CHARS);
        assert_eq!(quoted(&exact), format!("\"{exact}\""));
    }

    #[test]
    fn long_inputs_are_cut_escaped_with_their_length() {
        let key = "\u{1}".repeat(60_000);
        let q = quoted(&key);
        assert!(q.starts_with("\"\\u{1}\\u{1}"), "{q}");
        assert!(q.ends_with("… (60000 bytes)"), "{q}");
        assert!(q.len() < 700, "{}", q.len());
        // Multi-byte characters are cut on a boundary.
        let wide = "é".repeat(1000);
        assert!(quoted(&wide).ends_with("… (2000 bytes)"));
    }

    #[test]
    fn clipped_texts_stay_within_their_bound() {
        assert_eq!(clip("short", 10), "short");
        let long = "x".repeat(5000);
        let c = clip(&long, 100);
        assert!(c.len() <= 100, "{}", c.len());
        assert!(c.ends_with("… (cut from 5000 bytes)"), "{c}");
        let wide = "é".repeat(3000);
        for max in [0, 1, 2, 3, 25, 26, 27, 101] {
            let c = clip(&wide, max);
            assert!(c.len() <= max, "{max}: {}", c.len());
        }
    }
}

/// Properties over arbitrary input (proptest): the bounds hold for any text.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn quotes_are_bounded(text in any::<String>(), long in 0usize..3) {
            let text = text.repeat(1 + long * 40);
            prop_assert!(quoted(&text).len() < 800, "{}", quoted(&text).len());
        }

        #[test]
        fn clipped_texts_keep_their_bound_and_start(text in any::<String>(), max in 0usize..200) {
            let clipped = clip(&text, max);
            if text.len() <= max {
                prop_assert_eq!(clipped, text);
            } else {
                prop_assert!(clipped.len() <= max);
                let kept = clipped.split('…').next().unwrap_or("");
                prop_assert!(text.starts_with(kept));
            }
        }
    }
}
