//! The pre-tokenizer splits of the byte-level BPE families, decided character by character
//! for any Unicode text: where the match of the family's split pattern that starts at a
//! position ends, exactly as the `regex` crate finds it (leftmost-first).
//!
//! Why by hand: the patterns need only four character classes (letters `\p{L}`, numbers
//! `\p{N}`, white space `\s`, the rest), and the `regex` crate that matched them was about a
//! fifth of the filter's .wasm (its automata, its parser and their Unicode tables), for text
//! that is mostly ASCII and split by hand already ([`crate::fast_bpe`]). Checked against the
//! `tokenizers` crate on random multilingual text (`core/tests/fast_bpe_equivalence.rs`,
//! `core/tests/tokenizer_families.rs`).
//!
//! The patterns' look-ahead alternative `\s+(?!\S)` is not here: the caller applies it to the
//! white-space run it gets back (see [`crate::fast_bpe`]).

use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// A character's class in the split patterns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Class {
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\s` (Unicode White_Space)
    Space,
    /// `[^\s\p{L}\p{N}]`
    Other,
}

/// The class of `c`. `\s` is White_Space and `\p{N}` is Nd, Nl and No, as Rust's
/// `is_whitespace` and `is_numeric` define them; `\p{L}` is the Letter group.
pub fn class(c: char) -> Class {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' => Class::Letter,
            '0'..='9' => Class::Number,
            // \s in ASCII: \t \n \x0B \x0C \r and space
            '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | ' ' => Class::Space,
            _ => Class::Other,
        };
    }
    if c.is_whitespace() {
        Class::Space
    } else if c.is_numeric() {
        Class::Number
    } else if c.general_category_group() == GeneralCategoryGroup::Letter {
        Class::Letter
    } else {
        Class::Other
    }
}

/// The character at byte `i` of `s` and its class.
fn at(s: &str, i: usize) -> Option<(char, Class)> {
    let c = s.get(i..)?.chars().next()?;
    Some((c, class(c)))
}

/// Where the run of `want` characters from byte `i` ends.
fn run(s: &str, i: usize, want: Class) -> usize {
    s.get(i..)
        .and_then(|rest| {
            rest.char_indices()
                .find(|&(_, c)| class(c) != want)
                .map(|(k, _)| i + k)
        })
        .unwrap_or(s.len())
}

/// GPT-2's split without its look-ahead:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+`, from `pos`.
/// Every character is in one of the alternatives' classes, so the match starts at `pos`.
pub fn gpt2_end(s: &str, pos: usize) -> usize {
    if let Some(end) = gpt2_ascii_end(s.as_bytes(), pos) {
        return end;
    }
    let Some((c, first)) = at(s, pos) else {
        return s.len();
    };
    if c == '\'' {
        let rest = &s[pos + 1..];
        for suffix in ["s", "t", "re", "ve", "m", "ll", "d"] {
            if rest.starts_with(suffix) {
                return pos + 1 + suffix.len();
            }
        }
    }
    if c == ' ' {
        // ` ?` takes the space when the class after it follows
        if let Some((_, next)) = at(s, pos + 1) {
            if next != Class::Space {
                return run(s, pos + 1, next);
            }
        }
    }
    run(s, pos, first)
}

/// The Llama-3 (`max_digits` 3) and Qwen2 (`max_digits` 1) split without its look-ahead:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+`, from `pos`. The match starts at `pos`.
pub fn pattern_end(s: &str, pos: usize, max_digits: usize) -> usize {
    if let Some(end) = pattern_ascii_end(s.as_bytes(), pos, max_digits) {
        return end;
    }
    let Some((c, first)) = at(s, pos) else {
        return s.len();
    };
    // 1. the contractions, in any case: `(?i)` folds ſ (U+017F) to s, the only character
    //    outside ASCII that folds to one of these letters
    if c == '\'' {
        // the next two characters, case-folded, with their lengths in the text
        let mut rest = s[pos + 1..].chars().map(|c| match c {
            'ſ' => ('s', c.len_utf8()),
            c => (c.to_ascii_lowercase(), c.len_utf8()),
        });
        match (rest.next(), rest.next()) {
            (Some(('s' | 't' | 'm' | 'd', n)), _) => return pos + 1 + n,
            (Some(('r' | 'v', n)), Some(('e', m))) | (Some(('l', n)), Some(('l', m))) => {
                return pos + 1 + n + m
            }
            _ => {}
        }
    }
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    if first == Class::Letter {
        return run(s, pos, Class::Letter);
    }
    if c != '\r' && c != '\n' && first != Class::Number {
        if let Some((_, Class::Letter)) = at(s, pos + c.len_utf8()) {
            return run(s, pos + c.len_utf8(), Class::Letter);
        }
    }
    match first {
        // 3. \p{N}{1,max}
        Class::Number => s[pos..]
            .char_indices()
            .take(max_digits)
            .take_while(|&(_, c)| class(c) == Class::Number)
            .last()
            .map_or(pos, |(k, c)| pos + k + c.len_utf8()),
        // 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
        Class::Other => punctuation_end(s, pos),
        Class::Space if c == ' ' && at(s, pos + 1).is_some_and(|(_, k)| k == Class::Other) => {
            punctuation_end(s, pos + 1)
        }
        // 5. \s*[\r\n]+ (to the run's last line break), else \s+
        _ => {
            let end = run(s, pos, Class::Space);
            match s[pos..end].rfind(['\r', '\n']) {
                Some(last) => pos + last + 1,
                None => end,
            }
        }
    }
}

/// `[^\s\p{L}\p{N}]+[\r\n]*` from `i`.
fn punctuation_end(s: &str, i: usize) -> usize {
    let end = run(s, i, Class::Other);
    end + s[end..]
        .bytes()
        .take_while(|&b| b == b'\r' || b == b'\n')
        .count()
}

/// An ASCII byte's class; `None` for a non-ASCII byte, whose character is decoded instead.
fn ascii_class(b: &[u8], i: usize) -> Option<Class> {
    match *b.get(i)? {
        b'a'..=b'z' | b'A'..=b'Z' => Some(Class::Letter),
        b'0'..=b'9' => Some(Class::Number),
        // the regex crate's Unicode `\s` on ASCII: \t \n \v \f \r and space
        b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ' => Some(Class::Space),
        0x80.. => None,
        _ => Some(Class::Other),
    }
}

/// End of the run of `want` starting at `i`: `None` if a non-ASCII byte could extend it.
fn ascii_run(b: &[u8], mut i: usize, want: Class) -> Option<usize> {
    while i < b.len() {
        match ascii_class(b, i) {
            Some(c) if c == want => i += 1,
            Some(_) => return Some(i),
            None => return None,
        }
    }
    Some(i)
}

/// Where the Llama-3 / Qwen2 split (its alternatives in order, the look-ahead one left to
/// the caller as `\s+`) matches from `pos`, when ASCII bytes alone decide it; `None` when a
/// non-ASCII character could change the answer (then [`pattern_end`] decodes characters).
/// Bytes instead of characters: faster on the English-heavy text most prompts are.
fn pattern_ascii_end(b: &[u8], pos: usize, max_digits: usize) -> Option<usize> {
    let first = ascii_class(b, pos)?;
    // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if b[pos] == b'\'' {
        let next = |k: usize| b.get(pos + k).copied();
        if next(1).is_some_and(|c| c >= 0x80) {
            return None; // a Unicode case variant (ſ) could match
        }
        let lower = |k: usize| next(k).map(|c| c.to_ascii_lowercase());
        match (lower(1), lower(2)) {
            (Some(b's' | b't' | b'm' | b'd'), _) => return Some(pos + 2),
            (Some(b'r'), Some(b'e')) | (Some(b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => {
                return Some(pos + 3)
            }
            (Some(b'r' | b'v' | b'l'), None) => {}
            (Some(b'r' | b'v' | b'l'), Some(c)) if c >= 0x80 => return None,
            _ => {}
        }
    }
    match first {
        // 2. [^\r\n\p{L}\p{N}]?\p{L}+
        Class::Letter => return ascii_run(b, pos, Class::Letter),
        _ if b[pos] != b'\r' && b[pos] != b'\n' && first != Class::Number => {
            match ascii_class(b, pos + 1) {
                Some(Class::Letter) => return ascii_run(b, pos + 1, Class::Letter),
                None if pos + 1 < b.len() => return None,
                _ => {}
            }
        }
        _ => {}
    }
    match first {
        // 3. \p{N}{1,max}
        Class::Number => {
            let mut end = pos;
            while end < b.len() && end - pos < max_digits {
                match ascii_class(b, end) {
                    Some(Class::Number) => end += 1,
                    Some(_) => break,
                    None => return None,
                }
            }
            Some(end)
        }
        // 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
        Class::Other => ascii_punctuation_end(b, pos),
        Class::Space if b[pos] == b' ' && ascii_class(b, pos + 1) == Some(Class::Other) => {
            ascii_punctuation_end(b, pos + 1)
        }
        Class::Space if b[pos] == b' ' && pos + 1 < b.len() && b[pos + 1] >= 0x80 => None,
        // 5. \s*[\r\n]+ (to the run's last line break), else 7. \s+
        Class::Space => {
            let run_end = ascii_run(b, pos, Class::Space)?;
            let run = &b[pos..run_end];
            Some(match run.iter().rposition(|&c| c == b'\r' || c == b'\n') {
                Some(last) => pos + last + 1,
                None => run_end,
            })
        }
        Class::Letter => None,
    }
}

/// `[^\s\p{L}\p{N}]+[\r\n]*` from `i`, on ASCII.
fn ascii_punctuation_end(b: &[u8], i: usize) -> Option<usize> {
    let mut end = ascii_run(b, i, Class::Other)?;
    while end < b.len() && (b[end] == b'\r' || b[end] == b'\n') {
        end += 1;
    }
    Some(end)
}

/// Where the GPT-2 match starting at `pos` ends, when ASCII bytes alone decide it; `None`
/// when a non-ASCII character could change the answer (then [`gpt2_end`] decodes characters).
fn gpt2_ascii_end(b: &[u8], pos: usize) -> Option<usize> {
    let class = |i: usize| ascii_class(b, i);
    let run = |i: usize, want: Class| ascii_run(b, i, want);
    let first = class(pos)?;
    if b[pos] == b'\'' {
        let rest = &b[pos + 1..];
        for c in [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"] {
            if rest.starts_with(c) {
                return Some(pos + 1 + c.len());
            }
        }
    }
    match first {
        Class::Space if b[pos] == b' ' && pos + 1 < b.len() => match class(pos + 1)? {
            Class::Space => run(pos, Class::Space),
            c => run(pos + 1, c),
        },
        c => run(pos, c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str, end: impl Fn(&str, usize) -> usize) -> Vec<&str> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < s.len() {
            let e = end(s, pos);
            assert!(e > pos, "no progress at {pos} in {s:?}");
            out.push(&s[pos..e]);
            pos = e;
        }
        out
    }

    #[test]
    fn classes() {
        assert_eq!(class('ж'), Class::Letter);
        assert_eq!(class('東'), Class::Letter);
        assert_eq!(class('ि'), Class::Other); // a spacing mark, not a letter
        assert_eq!(class('½'), Class::Number);
        assert_eq!(class('٣'), Class::Number);
        assert_eq!(class('\u{3000}'), Class::Space);
        assert_eq!(class('\u{200b}'), Class::Other); // zero width space is a format character
        assert_eq!(class('🚀'), Class::Other);
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words("Hello wörld's 42½ ¿qué?  \u{3000}東京", gpt2_end),
            [
                "Hello",
                " wörld",
                "'s",
                " 42½",
                " ¿",
                "qué",
                "?",
                "  \u{3000}",
                "東京"
            ]
        );
    }

    #[test]
    fn llama3_words() {
        let end = |s: &str, p: usize| pattern_end(s, p, 3);
        assert_eq!(
            words("I'LL ¿qué 12345 x'ſ\r\n\n  东京!\n", end),
            [
                "I", "'LL", " ¿", "qué", " ", "123", "45", " x", "'ſ", "\r\n\n", "  ", "东京",
                "!\n"
            ]
        );
    }
}
