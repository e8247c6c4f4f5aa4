//! Shared by the tokenizer equivalence tests: seeded random strings, each encoded by the
//! fast path and by the `tokenizers` crate, which must agree.

use prefix_core::tokenizer::Tokenizer;

/// Asserts the fast encoder's ids equal the `tokenizers` crate's for `text`.
pub fn check(what: &str, t: &Tokenizer, text: &str) {
    let fast = t.encode(text).unwrap();
    let reference = t.encode_reference(text).unwrap();
    assert_eq!(fast, reference, "{what}: mismatch for {text:?}");
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
    let mut state = seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..count {
        let len = next() % max_len;
        let text: String = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        check(what, t, &text);
    }
}
