//! The fast byte-level BPE encoder gives exactly the `tokenizers` crate's ids on the real
//! SmolLM2 vocabulary: realistic texts and tens of thousands of random strings built to hit
//! every branch of the GPT-2 split pattern (contractions, whitespace runs before words and at
//! the end, digits, non-ASCII letters and numbers, combining marks, emoji, special tokens).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use prefix_core::protocol::defaults;
use prefix_core::tokenizer::Tokenizer;
use std::path::Path;

fn tokenizer_json() -> Vec<u8> {
    let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let dir = defaults::model_dir(&defaults::data_dir(repo));
    std::fs::read(dir.join("tokenizer.json"))
        .unwrap_or_else(|e| panic!("{}: {e} — run scripts/setup.sh", dir.display()))
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_json_bytes(&tokenizer_json()).unwrap()
}

mod common;

fn check(t: &Tokenizer, text: &str) {
    common::check("SmolLM2", t, text);
}

fn check_random(t: &Tokenizer, alphabet: &[&str], seed: u64, max_len: u64) {
    common::check_random("SmolLM2", t, alphabet, seed, 30_000, max_len);
}

#[test]
fn fast_path_is_used_for_the_default_model() {
    assert!(tokenizer().is_fast());
}

#[test]
fn realistic_texts_match() {
    let t = tokenizer();
    for text in [
        "",
        "Hello, world!",
        "You are the on-call assistant for the payments platform. Don't restart stateful services; we'll check it's fine.",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "fn main() {\n    let x = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");   \n}\n\n\n",
        "Prices: $1,234.56 — 12% off!! (was €99)   ",
        "Ünïcödé: naïve café, straße, Москва, 東京都, 서울, العربية, हिन्दी, ½ ² ³ ٣",
        "emoji 🚀🔥 and ZWJ 👩‍💻 and flags 🇫🇷",
        "trailing spaces   ",
        "   leading spaces",
        "tabs\t\tand\r\nwindows line ends\r\n",
        "  \n  \n\n word",
        "I'M SHOUTING 'S 'T 're 've 'm 'll 'd and it's he'll they've",
        "non-breaking\u{a0}space and thin\u{2009}space and ideographic\u{3000}space",
        "<|endoftext|><|endoftext|>glued<|im_end|>",
    ] {
        check(&t, text);
    }
}

#[test]
fn random_strings_match() {
    let t = tokenizer();
    let alphabet: Vec<&str> = vec![
        "a",
        "b",
        "Z",
        "q",
        " ",
        " ",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "\r",
        "0",
        "7",
        "42",
        "'",
        "'s",
        "'t",
        "'re",
        "'ll",
        "'D",
        "'ve",
        "'m",
        ".",
        ",",
        "!",
        "?",
        "-",
        "_",
        "(",
        ")",
        "{",
        "}",
        "\"",
        "é",
        "ß",
        "ж",
        "東",
        "京",
        "ह",
        "ि",
        "\u{301}",
        "½",
        "²",
        "٣",
        "🚀",
        "👩\u{200d}💻",
        "\u{a0}",
        "\u{2009}",
        "\u{3000}",
        "\u{200b}",
        "\u{85}",
        "\u{2028}",
        "ſ",
        "ǅ",
        "ʰ",
        "Ⅻ",
        "<|im_start|>",
        "<|im_end|>",
        "<|",
        "|>",
        "word",
        " word",
        "the",
    ];
    check_random(&t, &alphabet, 0x1234_5678_9abc_def0, 24);
}

#[test]
fn routing_bundle_encodes_identically() {
    let routing = Tokenizer::for_encoding(&tokenizer_json()).unwrap();
    let full = tokenizer();
    let text = "<|im_start|>user\nDon't restart 42 pods — check logs first.<|im_end|>\n";
    assert_eq!(
        routing.encode(text).unwrap(),
        full.encode_reference(text).unwrap()
    );
    assert_eq!(routing.vocab_size(), full.vocab_size());
    assert!(routing.decode(&[1]).is_err(), "encode-only");
}

/// Every ASCII character (the hand-written ASCII split path), words and runs of them, with a
/// few non-ASCII characters mixed in where a run could continue past them.
#[test]
fn random_ascii_heavy_strings_match() {
    let t = tokenizer();
    let mut alphabet: Vec<String> = (1u8..0x80).map(|b| char::from(b).to_string()).collect();
    for extra in [
        " ",
        " ",
        "  ",
        "'",
        "'s",
        "'ll",
        "'re",
        "word",
        " word",
        "12",
        "\n\n",
        "\u{a0}",
        "é",
        "\u{85}",
        "٣",
        "<|im_end|>",
    ] {
        alphabet.push(extra.to_owned());
    }
    let alphabet: Vec<&str> = alphabet.iter().map(String::as_str).collect();
    check_random(&t, &alphabet, 0x0bad_cafe_dead_beef, 20);
}

/// Long segments between special tokens are reused whole from the segment cache: the same
/// segment in other surroundings, again and again, and past the cache's budget (it is
/// cleared and refilled) must still give the reference ids.
#[test]
fn repeated_long_segments_match() {
    let t = tokenizer();
    let system = "You are the on-call assistant for the payments platform. ".repeat(12);
    let turns: Vec<String> = (0..6)
        .map(|i| format!("Turn {i}: the error rate is {i}.5% in eu-west-{i}; what now? ").repeat(6))
        .collect();
    for _ in 0..2 {
        let mut chat = format!("<|im_start|>system\n{system}<|im_end|>\n");
        for turn in &turns {
            chat.push_str(&format!("<|im_start|>user\n{turn}<|im_end|>\n"));
            check(&t, &format!("{chat}<|im_start|>assistant\n"));
        }
        // the same text as a bare prompt, and glued to other text (a different segment)
        check(&t, &system);
        check(&t, &format!("{system}{}", turns[0]));
        check(&t, &format!("x{system}"));
    }
    // unique long segments beyond the budget: the cache is cleared and refilled
    let text = "check the service logs before restarting any node ".repeat(80);
    for i in 0..1300 {
        check(&t, &format!("{i} {text}<|im_end|>{text}"));
    }
}

/// Long texts are cut into chunks at spaces no word crosses, each chunk cached: the chunks'
/// ids joined are the whole text's, whatever precedes a passage and however it recurs.
#[test]
fn long_texts_cut_into_chunks_match() {
    common::check_long_random("SmolLM2", &tokenizer(), 0x0c4a_2c4a_2c4a, 600);
}

/// Text decoded from random token ids, as load generators make prompts (inference-perf's
/// `shared_prefix` data): runs of word pieces glued into long words no dictionary has, the
/// case the BPE merge loop is slowest on.
#[test]
fn random_token_texts_match() {
    let t = tokenizer();
    let vocab = t.vocab_size() as u64;
    let mut next = common::xorshift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..300 {
        let ids: Vec<u32> = (0..64).map(|_| (next() % vocab) as u32).collect();
        check(&t, &t.decode(&ids).unwrap());
    }
}

#[test]
fn long_words_match() {
    common::check_long_words("SmolLM2", &tokenizer());
}
