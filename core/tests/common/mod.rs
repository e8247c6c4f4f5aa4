//! Shared by the tokenizer equivalence tests: seeded random strings, each encoded by the
//! fast path and by the `tokenizers` crate, which must agree.

use prefix_core::tokenizer::Tokenizer;

/// Asserts the fast encoder's ids equal the `tokenizers` crate's for `text`.
pub fn check(what: &str, t: &Tokenizer, text: &str) {
    let fast = t.encode(text).unwrap();
    let reference = t.encode_reference(text).unwrap();
    assert_eq!(fast, reference, "{what}: mismatch for {text:?}");
}

/// A seeded xorshift64 generator.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// `count` strings of up to `max_len` pieces drawn from `alphabet` (seeded xorshift).
pub fn check_random(
    what: &str,
    t: &Tokenizer,
    alphabet: &[&str],
    seed: u64,
    count: usize,
    max_len: u64,
) {
    let mut next = xorshift(seed);
    for _ in 0..count {
        let len = next() % max_len;
        let text: String = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        check(what, t, &text);
    }
}

/// `count` long texts (hundreds of pieces, so each is cut into chunks and its chunks meet
/// again in other texts) drawn from words, spaces and their neighbours: punctuation, digits,
/// whitespace runs, non-ASCII letters, a combining accent (NFC), emoji.
pub fn check_long_random(what: &str, t: &Tokenizer, seed: u64, count: usize) {
    const PIECES: [&str; 32] = [
        "word",
        " word",
        " The",
        " on-call",
        " payments",
        " restart",
        ".",
        ",",
        ":",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "123",
        " 4567",
        "é",
        "e\u{301}",
        " naïve",
        "—",
        "'s",
        "'re",
        " \u{a0}x",
        "٣",
        "日本",
        " 🙂",
        "(",
        ")",
        "-",
        " a",
        " I",
        "x",
    ];
    let mut next = xorshift(seed);
    // a few passages that recur, so chunks are served from the cache in new surroundings
    let passages: Vec<String> = (0..4)
        .map(|_| {
            (0..120)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect()
        })
        .collect();
    for _ in 0..count {
        let mut text = String::new();
        for _ in 0..(2 + next() % 4) {
            match next() % 3 {
                0 => text.push_str(&passages[(next() % passages.len() as u64) as usize]),
                _ => {
                    for _ in 0..(next() % 150) {
                        text.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
                    }
                }
            }
        }
        check(what, t, &text);
    }
}

/// Texts made of very long words (1 KiB to 64 KiB: a hostile prompt's one-word "aaaa…", a
/// run of random letters, of multi-byte characters, of digits, a base64-like blob), each
/// alone and between ordinary words: the merges of a long word run on a heap, not the scan.
pub fn check_long_words(what: &str, t: &Tokenizer) {
    let mut next = xorshift(0x5eed_1234_abcd_0001);
    let letters: String = (0..65_536)
        .map(|_| char::from(b'a' + (next() % 26) as u8))
        .collect();
    let blob: String = (0..65_536)
        .map(|_| {
            const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            char::from(B64[(next() % 64) as usize])
        })
        .collect();
    for len in [1024usize, 4096, 16_384, 65_536] {
        let words = [
            "a".repeat(len),
            letters[..len].to_owned(),
            "日本語".repeat(len / 9),
            "0123456789".repeat(len / 10),
            blob[..len].to_owned(),
            "ab".repeat(len / 2),
        ];
        for w in &words {
            check(what, t, w);
            check(
                what,
                t,
                &format!("The runbook says {w} and then {w}, twice."),
            );
        }
    }
}
