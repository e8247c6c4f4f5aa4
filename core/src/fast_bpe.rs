//! A fast encoder for byte-level BPE vocabularies, producing exactly the ids the `tokenizers`
//! crate produces: the GPT-2 family (SmolLM: the split inside the `ByteLevel`
//! pre-tokenizer, optionally digits first) and the `Split` + `ByteLevel` family (Llama-3 with
//! its `\p{N}{1,3}` numbers, Qwen2 with single digits and an NFC normalizer).
//!
//! Why: inside Envoy's wasm VM the `tokenizers` crate spends most of its time in fancy-regex
//! (the GPT-2 split pattern has a look-ahead, which forces the backtracking engine) and in
//! per-call bookkeeping. Here added tokens are found in one Aho-Corasick scan, the split is
//! decided by hand ([`crate::split`]: bytes for ASCII, characters elsewhere; no regex
//! engine), the single look-ahead alternative (`\s+(?!\S)`) is applied by hand, and each
//! split word's BPE result is cached (long segments between added tokens too, whole once seen
//! twice, and chunk by chunk when they start with text seen before). Only the tokenizer
//! shapes checked in [`FastBpe::from_json`] are handled; anything else returns `None` and the
//! caller keeps using the `tokenizers` crate (which the filter's build leaves out: there such
//! a vocabulary does not load). Equivalence is tested against the `tokenizers` crate on the
//! real vocabularies (`core/tests/fast_bpe_equivalence.rs`, `core/tests/tokenizer_families.rs`).

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;

/// Maps on the hot path use foldhash (std's SipHash, and XXH3's streaming hasher, are several
/// times slower on the short keys here, especially in wasm); randomly seeded per process.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The `Split` patterns of the Llama-3 and Qwen2 families, exactly as their `tokenizer.json`s
/// write them, and the same without their look-ahead alternative `\s+(?!\S)` (applied by
/// hand, as for GPT-2).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Most distinct words kept in the BPE cache before it is cleared (bounded memory).
const CACHE_LIMIT: usize = 100_000;

/// Segments (text between added tokens) at least this long are cached whole.
const SEGMENT_MIN_BYTES: usize = 256;

/// Bytes of text plus ids kept in the segment cache (and again in the chunk cache) before it
/// is cleared.
const SEGMENT_BUDGET: usize = 4 << 20;

/// Chunks of a long segment: at least this many bytes…
const CHUNK_MIN_BYTES: usize = 128;
/// …cut where the 8 bytes before a safe space hash to 0 modulo this (≈ every 16 words)…
const CHUNK_CUT_MASK: u64 = 31;
/// …or at the first safe space past this many bytes.
const CHUNK_MAX_BYTES: usize = 1024;
/// A long segment not seen whole is looked up chunk by chunk when one of its first this many
/// chunks was seen before: a new first line (a date, a request id, a counter) before a shared
/// passage makes the first chunk new, and its cut may shift the second.
const PROBED_CHUNKS: usize = 3;

/// A split word's ids: most words of a prompt are one token, kept inline (no second memory
/// access per word on the hot path).
enum WordIds {
    One(u32),
    Many(Box<[u32]>),
}

/// Slots of [`Words`]' table of words seen once: a fixed 32 KB.
const WORD_SEEN_SLOTS: usize = 4096;

/// Split words and their BPE results, kept from a word's second sighting on (as [`Recall`]
/// keeps texts): a word seen once costs a hash and a slot, not two allocations and a map
/// entry. Prompts decoded from random token ids (inference-perf's) glue pieces into words
/// that never come back; kept on first sight they filled the map to its limit, and each
/// lookup in the large map was a cache miss (measured with perf, natively).
struct Words {
    kept: FastMap<Box<str>, WordIds>,
    seen_once: SeenOnce,
    /// the merge loop's buffers, reused word after word
    scratch: Scratch,
}

impl Default for Words {
    fn default() -> Self {
        Words {
            kept: FastMap::default(),
            seen_once: SeenOnce::new(WORD_SEEN_SLOTS),
            scratch: Scratch::default(),
        }
    }
}

#[derive(Default)]
struct Scratch {
    ids: Vec<u32>,
    /// `ranks[i]`: (rank, merged id) of `ids[i]` and `ids[i + 1]`
    ranks: Vec<(u32, u32)>,
    /// long words ([`FastBpe::bpe_heap`]): each symbol's successor and predecessor, and the
    /// candidate pairs as rank << 32 | position
    next: Vec<u32>,
    prev: Vec<u32>,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<u64>>,
}

/// (rank, merged id) of a pair the vocabulary does not merge.
const NO_MERGE: (u32, u32) = (u32::MAX, u32::MAX);

/// Words up to this many bytes are merged by rescanning their pairs (fastest for the short
/// words text is made of); longer ones by a heap ([`FastBpe::bpe_heap`]), whose cost grows
/// as `n log n` instead of `n²`.
const SCAN_MAX_BYTES: usize = 64;

/// Longest word kept in the word cache (the map's entry count is bounded, this bounds its
/// bytes).
const WORD_KEEP_MAX_BYTES: usize = 1024;

/// Keys of things seen once, in a fixed table: a key goes to one slot, replacing whatever was
/// there, so a stream of things that never repeat costs one store each, with no allocation
/// and no rehashing. A cache keeps a thing from its second sighting on.
struct SeenOnce {
    slots: Box<[u64]>,
}

impl SeenOnce {
    fn new(slots: usize) -> Self {
        SeenOnce {
            slots: vec![0; slots.max(1)].into_boxed_slice(),
        }
    }

    fn slot(&self, key: u64) -> usize {
        (key as usize) % self.slots.len()
    }

    /// Whether `key` is the last key noted in its slot.
    fn holds(&self, key: u64) -> bool {
        self.slots.get(self.slot(key)) == Some(&key)
    }

    /// Notes `key`; true if it was already noted (seen before).
    fn note(&mut self, key: u64) -> bool {
        let at = self.slot(key);
        match self.slots.get_mut(at) {
            Some(seen) if *seen == key => true,
            Some(seen) => {
                *seen = key;
                false
            }
            None => false,
        }
    }
}

/// Per-encoder memo. Three levels, all exact: text between two added tokens is encoded
/// independently of everything around it, so a repeated segment (a runbook prompt sent again,
/// a chat's system prompt or earlier turns, each delimited by the template's special tokens)
/// reuses its ids whole; a long segment seen for the first time is cut into chunks at places
/// no word crosses ([`chunk_end`]), and a chunk seen before (a shared document, a system
/// prompt followed by other text, an earlier turn) reuses its ids; and every split word
/// reuses its BPE result.
#[derive(Default)]
struct Memo {
    words: Words,
    segments: Recall,
    chunks: Recall,
}

/// Slots of [`Recall`]'s table of texts seen once: a fixed 64 KB.
const SEEN_SLOTS: usize = 8192;

/// Texts (segments or chunks) and their ids, kept from their second sighting on: a text seen
/// once costs a hash and a set entry, not a copy, so prompts that never repeat pay almost
/// nothing for the cache (keeping every chunk of them cost more than the cache saved:
/// measured, 2k-token prompts whose words were shuffled per request).
struct Recall {
    kept: FastMap<u64, (Box<str>, Box<[u32]>)>,
    seen_once: SeenOnce,
    bytes: usize,
}

impl Default for Recall {
    fn default() -> Self {
        Recall {
            kept: FastMap::default(),
            seen_once: SeenOnce::new(SEEN_SLOTS),
            bytes: 0,
        }
    }
}

impl Recall {
    fn key(text: &str) -> u64 {
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    }

    /// A key for a long text from its length, its ends and 16 samples of 16 bytes spread over
    /// it, not all of it: a whole prompt's segment is looked up once per request, and hashing
    /// all of a 2k-token prompt cost as much as a cache hit saves (measured under V8). Texts
    /// that differ only between the samples share a key; [`Recall::get`] compares the text, so
    /// that costs a miss, never a wrong answer.
    fn sampled_key(text: &str) -> u64 {
        const END: usize = 256;
        const SAMPLES: usize = 16;
        let b = text.as_bytes();
        if b.len() <= 2 * END + SAMPLES * 16 {
            return Self::key(text);
        }
        // a fingerprint: length, head, tail, samples (copied by zip: no length can mismatch)
        let fill = |dst: &mut [u8], from: usize| {
            dst.iter_mut()
                .zip(b.iter().skip(from))
                .for_each(|(d, s)| *d = *s)
        };
        let mut fp = [0u8; 8 + 2 * END + SAMPLES * 16];
        let (len, rest) = fp.split_at_mut(8);
        len.copy_from_slice(&(b.len() as u64).to_le_bytes());
        let (ends, samples) = rest.split_at_mut(2 * END);
        let (head, tail) = ends.split_at_mut(END);
        fill(head, 0);
        fill(tail, b.len() - END);
        let step = (b.len() - 16) / SAMPLES;
        for (i, dst) in samples.chunks_exact_mut(16).enumerate() {
            fill(dst, i * step);
        }
        xxhash_rust::xxh3::xxh3_64(&fp)
    }

    fn get(&self, key: u64, text: &str) -> Option<&[u32]> {
        self.kept
            .get(&key)
            .filter(|(t, _)| same_text(t, text))
            .map(|(_, ids)| &**ids)
    }

    /// Notes `key` as seen; true if it was not the last key noted in its slot.
    fn note(&mut self, key: u64) -> bool {
        !self.seen_once.note(key)
    }

    /// Whether `text` was seen before (kept, or noted once).
    fn recognizes(&self, key: u64, text: &str) -> bool {
        self.get(key, text).is_some() || self.seen_once.holds(key)
    }

    /// `text` was just encoded to `ids`: kept if it was seen before, within `budget` bytes
    /// (noted as seen once otherwise).
    fn offer(&mut self, key: u64, text: &str, ids: &[u32], budget: usize) {
        if self.note(key) {
            return; // first sighting (or its slot was taken since)
        }
        let cost = text.len() + 4 * ids.len();
        if cost > budget / 4 {
            return; // one huge text must not flush everything else
        }
        if self.bytes + cost > budget {
            self.kept.clear();
            self.bytes = 0;
        }
        self.kept.insert(key, (text.into(), ids.into()));
        self.bytes += cost;
    }
}

/// `a == b`, eight bytes at a step: the wasm build's `memcmp` goes a byte at a time, and
/// checking a repeated 2k-token prompt against the cached one that way was a fifth of the
/// filter's time for it (measured under V8).
fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tails = wa.remainder() == wb.remainder();
    tails
        && wa
            .zip(wb)
            .all(|(x, y)| u64::from_ne_bytes(word(x)) == u64::from_ne_bytes(word(y)))
}

/// An eight-byte chunk as an array (`chunks_exact(8)` yields only those).
fn word(c: &[u8]) -> [u8; 8] {
    <[u8; 8]>::try_from(c).unwrap_or_default()
}

/// Whether the space at `b[i]` is one a text may be cut before ([`chunk_end`]'s rule): it
/// follows a non-space ASCII character and precedes an ASCII letter.
fn safe_space(b: &[u8], i: usize) -> bool {
    let before = i.checked_sub(1).and_then(|j| b.get(j));
    let next = b.get(i + 1);
    matches!((before, next), (Some(&p), Some(&n))
        if n.is_ascii_alphabetic() && p.is_ascii() && !p.is_ascii_whitespace())
}

/// Where the chunk of `b` that starts at `start` ends (`b.len()` for the last). A cut goes
/// right before a space that follows a non-space ASCII character and precedes an ASCII
/// letter: every split pattern here ends a word before such a space and starts the next one
/// with it (` ?\p{L}+`, `[^\r\n\p{L}\p{N}]?\p{L}+`), no look-ahead reaches across it, and NFC
/// composes nothing across a space, so encoding the chunks one by one gives the segment's
/// ids. Whether a safe space is a cut depends on the 8 bytes before it (content-defined), so
/// two texts that share a passage cut it alike whatever comes before it.
fn chunk_end(b: &[u8], start: usize) -> usize {
    // spaces found with memchr (a per-byte loop here was a fifth of the encoding time), none
    // looked at within CHUNK_MIN_BYTES of the start
    let mut from = start + CHUNK_MIN_BYTES;
    while let Some(off) = b.get(from..).and_then(|rest| memchr::memchr(b' ', rest)) {
        let i = from + off;
        from = i + 1;
        if i + 1 >= b.len() {
            break;
        }
        if !safe_space(b, i) {
            continue;
        }
        let Some(window) = b.get(i - 8..i).and_then(|w| <[u8; 8]>::try_from(w).ok()) else {
            continue;
        };
        let h = u64::from_le_bytes(window).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        if h & CHUNK_CUT_MASK == 0 || i - start >= CHUNK_MAX_BYTES {
            return i;
        }
    }
    b.len()
}

struct AddedTokens {
    /// one scan of the text for all of them, leftmost then longest
    matcher: AhoCorasick,
    /// pattern index → token id
    ids: Vec<u32>,
    /// bytes of the longest one
    longest: usize,
}

/// How text is cut into words before BPE.
enum Splitter {
    /// GPT-2's pattern, inside the `ByteLevel` pre-tokenizer; `digits`: every digit is cut
    /// out first (the `Digits{individual_digits}` pre-tokenizer)
    Gpt2 { digits: bool },
    /// A `Split` pre-tokenizer's pattern (Llama-3, Qwen2) without its look-ahead alternative;
    /// `max_digits`: its `\p{N}{1,3}` (Llama-3) or `\p{N}` (Qwen2)
    Pattern { max_digits: usize },
}

/// Where a piecewise encoding stopped ([`FastBpe::encode_from`]); start from `default()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Bytes of the text encoded so far.
    pub pos: usize,
    /// Where the segment (text between added tokens) that `pos` is in starts, and where its
    /// ids start in the output.
    segment: usize,
    segment_ids: usize,
}

pub struct FastBpe {
    /// Most bytes of text one token can stand for (see [`FastBpe::min_tokens`]).
    bytes_per_token_max: usize,
    splitter: Splitter,
    /// NFC-normalize the text between added tokens first (the `NFC` normalizer)
    nfc: bool,
    /// byte → id of its byte-level character
    byte_ids: [u32; 256],
    /// (left id, right id) → (rank, merged id)
    merges: FastMap<(u32, u32), (u32, u32)>,
    /// ids are below this
    vocab_size: usize,
    /// added (special) tokens, matched in the text before any splitting
    added: Option<AddedTokens>,
    cache: Mutex<Memo>,
}

/// GPT-2's reversible byte → printable character mapping.
pub fn byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable =
            (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        out[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    out
}

fn is(v: &Value, key: &str, want: &Value) -> bool {
    v.get(key).unwrap_or(&Value::Null) == want
}

impl FastBpe {
    /// Builds the fast encoder for a `tokenizer.json`, or `None` if its shape is not one this
    /// encoder reproduces exactly.
    pub fn from_json(json: &[u8]) -> Option<FastBpe> {
        Self::from_value(&serde_json::from_slice(json).ok()?)
    }

    /// [`FastBpe::from_json`] of an already parsed `tokenizer.json`.
    pub fn from_value(t: &Value) -> Option<FastBpe> {
        let f = Value::Bool(false);
        let tr = Value::Bool(true);
        let null = Value::Null;
        let nfc = match t["normalizer"]["type"].as_str() {
            None if t["normalizer"].is_null() => false,
            Some("NFC") => true,
            _ => return None,
        };
        let byte_level = |p: &Value, regex: bool| {
            is(p, "type", &Value::from("ByteLevel"))
                && is(p, "add_prefix_space", &f)
                && p.get("use_regex").unwrap_or(&tr) == &Value::Bool(regex)
        };
        let pre = &t["pre_tokenizer"];
        let splitter = match pre["type"].as_str()? {
            "ByteLevel" if byte_level(pre, true) => Splitter::Gpt2 { digits: false },
            "Sequence" => match pre["pretokenizers"].as_array()?.as_slice() {
                [d, b]
                    if is(d, "type", &Value::from("Digits"))
                        && is(d, "individual_digits", &tr)
                        && byte_level(b, true) =>
                {
                    Splitter::Gpt2 { digits: true }
                }
                [s, b]
                    if is(s, "type", &Value::from("Split"))
                        && is(s, "behavior", &Value::from("Isolated"))
                        && is(s, "invert", &f)
                        && byte_level(b, false) =>
                {
                    let pattern = s["pattern"]["Regex"].as_str()?;
                    let max_digits = match pattern {
                        LLAMA3_SPLIT => 3,
                        QWEN2_SPLIT => 1,
                        _ => return None,
                    };
                    Splitter::Pattern { max_digits }
                }
                _ => return None,
            },
            _ => return None,
        };
        let m = &t["model"];
        if !is(m, "type", &Value::from("BPE"))
            || !(is(m, "dropout", &null))
            || !(m.get("byte_fallback").unwrap_or(&f) == &f)
            || !(m.get("ignore_merges").unwrap_or(&f) == &f)
            // absent, null or "" all mean none (Qwen2 writes "")
            || !m["continuing_subword_prefix"].as_str().unwrap_or("").is_empty()
            || !m["end_of_word_suffix"].as_str().unwrap_or("").is_empty()
        {
            return None;
        }
        let vocab: HashMap<&str, u32> = m["vocab"]
            .as_object()?
            .iter()
            .map(|(k, v)| Some((k.as_str(), u32::try_from(v.as_u64()?).ok()?)))
            .collect::<Option<_>>()?;
        let chars = byte_to_char();
        let mut byte_ids = [0u32; 256];
        for (b, c) in chars.iter().enumerate() {
            // Bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5..) may be missing from the
            // vocabulary; a Rust `str` can never contain them.
            byte_ids[b] = vocab
                .get(c.to_string().as_str())
                .copied()
                .unwrap_or(u32::MAX);
        }
        let mut merges = FastMap::default();
        for (rank, mv) in m["merges"].as_array()?.iter().enumerate() {
            let (a, b) = match mv {
                Value::String(s) => s.split_once(' ')?,
                Value::Array(p) => (p.first()?.as_str()?, p.get(1)?.as_str()?),
                _ => return None,
            };
            let merged = format!("{a}{b}");
            let ids = (*vocab.get(a)?, *vocab.get(b)?);
            merges
                .entry(ids)
                .or_insert((u32::try_from(rank).ok()?, *vocab.get(merged.as_str())?));
        }
        let mut added = Vec::new();
        for a in t["added_tokens"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
        {
            if a["single_word"] == tr
                || a["lstrip"] == tr
                || a["rstrip"] == tr
                || a["normalized"] == tr
            {
                return None;
            }
            added.push((
                a["content"].as_str()?.to_owned(),
                u32::try_from(a["id"].as_u64()?).ok()?,
            ));
        }
        // every token covers at least one byte and at most the longest token's; NFC may
        // compose a few characters' bytes into one's (at most 3:1, Hangul jamo)
        let longest = vocab
            .keys()
            .map(|k| k.chars().count())
            .chain(added.iter().map(|(s, _)| s.len()))
            .max()
            .unwrap_or(1)
            .max(1);
        let bytes_per_token_max = longest * if nfc { 4 } else { 1 };
        let vocab_size = vocab
            .values()
            .chain(added.iter().map(|(_, id)| id))
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        Some(FastBpe {
            vocab_size,
            bytes_per_token_max,
            splitter,
            nfc,
            byte_ids,
            merges,
            added: if added.is_empty() {
                None
            } else {
                Some(AddedTokens {
                    matcher: AhoCorasick::builder()
                        .match_kind(MatchKind::LeftmostLongest)
                        .build(added.iter().map(|(s, _)| s.as_str()))
                        .ok()?,
                    ids: added.iter().map(|(_, id)| *id).collect(),
                    longest: added.iter().map(|(s, _)| s.len()).max().unwrap_or(0),
                })
            },
            cache: Mutex::new(Memo::default()),
        })
    }

    /// The longest prefix of `text`, at most `max` bytes, whose ids are exactly the first ids
    /// of `text`'s: it ends at the text's end or right before a safe space (the rule of
    /// [`chunk_end`]) that no added token's match crosses. Empty when there is none: a text
    /// of one long word has no cut. Linear in the bytes it looks at (from `max` backwards).
    pub fn safe_prefix<'t>(&self, text: &'t str, max: usize) -> &'t str {
        if text.len() <= max {
            return text;
        }
        let b = text.as_bytes();
        let longest_added = self.added.as_ref().map_or(0, |a| a.longest);
        let mut end = max.min(b.len());
        while let Some(i) = b.get(..end).and_then(|head| memchr::memrchr(b' ', head)) {
            end = i;
            if !safe_space(b, i) {
                continue;
            }
            // an added token matched across the cut would be lost to the prefix
            let crosses = self.added.as_ref().is_some_and(|a| {
                let from = i.saturating_sub(2 * longest_added);
                let to = (i + longest_added).min(b.len());
                text.get(from..to).is_some_and(|window| {
                    a.matcher
                        .find_iter(window)
                        .any(|m| from + m.start() < i && from + m.end() > i)
                })
            });
            if !crosses {
                return text.get(..i).unwrap_or_default();
            }
        }
        ""
    }

    /// A lower bound of the tokens `text` encodes to, known without encoding it (one pass
    /// over its bytes): a server can refuse a prompt far over its context at once. Its bytes
    /// that have an id (a byte without one is dropped, so a text of such bytes is no tokens
    /// at all), over the most bytes one token stands for.
    pub fn min_tokens(&self, text: &str) -> usize {
        let kept = text
            .bytes()
            .filter(|&b| self.byte_ids[b as usize] != u32::MAX)
            .count();
        kept.div_ceil(self.bytes_per_token_max)
    }

    /// One past the largest token id.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        self.encode_from(text, &mut Cursor::default(), usize::MAX, &mut out);
        out
    }

    /// Appends the ids of `text` from `cursor` on to `out`, stopping early at the first safe
    /// cut (an added token's end, or a chunk's: `chunk_end`) where `out` holds at least
    /// `want` ids; `cursor` then says where. Call after call with the same text, cursor and
    /// `out`, the ids are exactly [`FastBpe::encode`]'s (tested), so a router can tokenize a
    /// prompt only as far as it needs to; a segment finished over several calls is cached
    /// whole as if encoded in one.
    pub fn encode_from(&self, text: &str, cursor: &mut Cursor, want: usize, out: &mut Vec<u32>) {
        // a thread that finds the memo in use encodes without it rather than wait: one long
        // encode never holds up another request's (the server tokenizes on several threads)
        let (mut guard, mut local);
        let memo: &mut Memo = match self.cache.try_lock() {
            Ok(g) => {
                guard = g;
                &mut guard
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                guard = p.into_inner();
                &mut guard
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                local = Memo::default();
                &mut local
            }
        };
        if memo.words.kept.len() > CACHE_LIMIT {
            memo.words.kept.clear();
        }
        let start = cursor.pos;
        let Some(rest) = text.get(start..) else {
            cursor.pos = text.len();
            return;
        };
        if let Some(added) = &self.added {
            // leftmost added token, the longest where several start there (as `tokenizers`);
            // a cursor is never inside one, so scanning from there finds the same ones
            for m in added.matcher.find_iter(rest) {
                let (from, to) = (start + m.start(), start + m.end());
                if !self.encode_memo(text, from, cursor, memo, out, want) {
                    return;
                }
                if let Some(&id) = added.ids.get(m.pattern().as_usize()) {
                    out.push(id);
                }
                *cursor = Cursor {
                    pos: to,
                    segment: to,
                    segment_ids: out.len(),
                };
                if out.len() >= want {
                    return;
                }
            }
        }
        self.encode_memo(text, text.len(), cursor, memo, out, want);
    }

    /// The rest of one segment between added tokens, `text[cursor.pos..end]` (the segment
    /// starts at `cursor.segment`): whole from the segment cache when it is long and was seen
    /// before. True once it is all encoded; false when it stopped at a chunk cut because
    /// `out` holds `want` ids.
    fn encode_memo(
        &self,
        text: &str,
        end: usize,
        cursor: &mut Cursor,
        memo: &mut Memo,
        out: &mut Vec<u32>,
        want: usize,
    ) -> bool {
        let resumed = cursor.pos > cursor.segment;
        if !resumed {
            cursor.segment_ids = out.len();
        }
        let whole = text.get(cursor.segment..end).unwrap_or_default();
        let rest = text.get(cursor.pos..end).unwrap_or_default();
        if whole.len() < SEGMENT_MIN_BYTES {
            self.encode_segment(rest, &mut memo.words, out);
            cursor.pos = end;
            return true;
        }
        if !resumed {
            if let Some(ids) = memo.segments.get(Recall::sampled_key(whole), whole) {
                out.extend_from_slice(ids);
                cursor.pos = end;
                return true;
            }
        }
        cursor.pos += self.encode_chunks(rest, memo, out, want);
        if cursor.pos < end {
            return false;
        }
        let ids = out.get(cursor.segment_ids..).unwrap_or_default();
        memo.segments
            .offer(Recall::sampled_key(whole), whole, ids, SEGMENT_BUDGET);
        true
    }

    /// A long segment not seen whole before. When one of its first [`PROBED_CHUNKS`] chunks
    /// was seen before (the text shares a passage near its start with an earlier one: a
    /// document, a system prompt, an earlier turn, perhaps behind a new first line), chunk by
    /// chunk from the chunk cache; otherwise whole, noting those chunks, so text that never
    /// repeats pays for finding a few cuts and nothing more (cutting all of it cost a fifth
    /// more than it saved there: measured) — unless only its start is wanted, then chunk by
    /// chunk up to the cut where `out` holds `want` ids. Returns the bytes encoded.
    fn encode_chunks(&self, seg: &str, memo: &mut Memo, out: &mut Vec<u32>, want: usize) -> usize {
        let b = seg.as_bytes();
        let mut probed = [(0u64, 0usize); PROBED_CHUNKS];
        let mut known = false;
        let mut end = 0;
        for slot in &mut probed {
            if end == b.len() {
                break;
            }
            let next = chunk_end(b, end);
            let chunk = seg.get(end..next).unwrap_or_default();
            let key = Recall::key(chunk);
            *slot = (key, next);
            end = next;
            // a segment that is one chunk is the segment cache's
            if next < b.len() && memo.chunks.recognizes(key, chunk) {
                known = true;
                break;
            }
        }
        if !known {
            for &(key, end) in probed.iter().take_while(|(_, end)| *end > 0) {
                if end < b.len() {
                    memo.chunks.note(key);
                }
            }
            if want == usize::MAX {
                self.encode_segment(seg, &mut memo.words, out);
                return b.len();
            }
        }
        let (mut start, mut end) = (0, probed[0].1);
        while start < b.len() {
            let Some(chunk) = seg.get(start..end) else {
                // never: cuts are at ASCII spaces
                self.encode_segment(seg.get(start..).unwrap_or_default(), &mut memo.words, out);
                return b.len();
            };
            if !known {
                self.encode_segment(chunk, &mut memo.words, out);
            } else {
                let key = Recall::key(chunk);
                if let Some(ids) = memo.chunks.get(key, chunk) {
                    out.extend_from_slice(ids);
                } else {
                    let from = out.len();
                    self.encode_segment(chunk, &mut memo.words, out);
                    let ids = out.get(from..).unwrap_or_default();
                    memo.chunks.offer(key, chunk, ids, SEGMENT_BUDGET);
                }
            }
            if out.len() >= want {
                return end;
            }
            start = end;
            end = chunk_end(b, start);
        }
        b.len()
    }

    fn encode_segment(&self, seg: &str, cache: &mut Words, out: &mut Vec<u32>) {
        if seg.is_empty() {
            return;
        }
        if self.nfc && !seg.is_ascii() && !unicode_normalization_alignments::is_nfc(seg) {
            let normalized: String = {
                use unicode_normalization_alignments::UnicodeNormalization;
                seg.nfc().map(|(c, _)| c).collect()
            };
            return self.encode_split(&normalized, cache, out);
        }
        self.encode_split(seg, cache, out)
    }

    fn encode_split(&self, seg: &str, cache: &mut Words, out: &mut Vec<u32>) {
        let digits = match self.splitter {
            Splitter::Pattern { max_digits } => {
                return self.encode_pattern(seg, max_digits, cache, out)
            }
            Splitter::Gpt2 { digits } => digits,
        };
        if !digits {
            return self.encode_piece(seg, cache, out);
        }
        // every numeric character is a piece of its own; ASCII bytes are judged as bytes (the
        // per-character decoding was a tenth of the encoding time on English text: measured)
        let b = seg.as_bytes();
        let (mut start, mut i) = (0, 0);
        while let Some(off) = b.get(i..).and_then(|rest| {
            rest.iter()
                .position(|&x| x.is_ascii_digit() || !x.is_ascii())
        }) {
            i += off;
            let Some(c) = seg.get(i..).and_then(|rest| rest.chars().next()) else {
                break;
            };
            let len = c.len_utf8();
            if c.is_numeric() {
                self.encode_piece(&seg[start..i], cache, out);
                self.encode_piece(&seg[i..i + len], cache, out);
                start = i + len;
            }
            i += len;
        }
        self.encode_piece(&seg[start..], cache, out);
    }

    /// The GPT-2 split of one pre-tokenized piece, then BPE on each word.
    fn encode_piece(&self, piece: &str, cache: &mut Words, out: &mut Vec<u32>) {
        let mut pos = 0;
        while pos < piece.len() {
            let mut end = crate::split::gpt2_end(piece, pos);
            let word = &piece[pos..end];
            // `\s+(?!\S)`: a whitespace run followed by a non-space leaves its last character
            // to the next match
            if end < piece.len() && word.chars().all(char::is_whitespace) {
                let last = word.chars().next_back().map(char::len_utf8).unwrap_or(0);
                if word.len() > last {
                    end -= last;
                }
            }
            self.word(&piece[pos..end], cache, out);
            pos = end;
        }
    }

    /// The Llama-3 / Qwen2 split of a segment, then BPE on each word. The pattern's
    /// alternatives are tried in order; the one removed, `\s+(?!\S)`, comes right after
    /// `\s*[\r\n]+` and before `\s+`: a whitespace run with no line break that is followed
    /// by a non-space leaves its last character to the next word (which may then start with
    /// it, e.g. `" word"`).
    fn encode_pattern(&self, seg: &str, max_digits: usize, cache: &mut Words, out: &mut Vec<u32>) {
        let mut pos = 0;
        while pos < seg.len() {
            let mut end = crate::split::pattern_end(seg, pos, max_digits);
            let word = &seg[pos..end];
            if end < seg.len()
                && !word.ends_with(['\r', '\n'])
                && word.chars().all(char::is_whitespace)
            {
                let last = word.chars().next_back().map(char::len_utf8).unwrap_or(0);
                if word.len() > last {
                    end -= last;
                }
            }
            self.word(&seg[pos..end], cache, out);
            pos = end;
        }
    }

    /// One word's ids, from the cache or by BPE.
    fn word(&self, word: &str, cache: &mut Words, out: &mut Vec<u32>) {
        match cache.kept.get(word) {
            Some(WordIds::One(id)) => out.push(*id),
            Some(WordIds::Many(ids)) => out.extend_from_slice(ids),
            None => {
                self.bpe(word, &mut cache.scratch);
                out.extend_from_slice(&cache.scratch.ids);
                // a long word is merged in n log n and kept nowhere: kept, a hostile
                // client's distinct 1 MiB words would each hold a map entry
                if word.len() <= WORD_KEEP_MAX_BYTES && cache.seen_once.note(Recall::key(word)) {
                    let ids = match *cache.scratch.ids {
                        [id] => WordIds::One(id),
                        ref ids => WordIds::Many(ids.into()),
                    };
                    cache.kept.insert(word.into(), ids);
                }
            }
        }
    }

    /// Byte-level BPE of one word: merge the lowest-ranked adjacent pair (leftmost on ties)
    /// until none applies. Short words (nearly all) scan their pairs after each merge: each
    /// pair's rank is looked up once and kept beside it, and a merge looks up only the two
    /// pairs it changes (as tiktoken does; looking every pair up again cost a new 64-token
    /// random question 67 → 41 µs p50 natively). That scan is quadratic in the word's length,
    /// so a word longer than [`SCAN_MAX_BYTES`] (a hostile prompt's one 1 MiB "word") takes
    /// [`FastBpe::bpe_heap`] instead: the same merges in the same order, `O(n log n)`.
    fn bpe(&self, word: &str, scratch: &mut Scratch) {
        // a byte whose character the vocabulary lacks is dropped, as `tokenizers` does for
        // a BPE model without an unknown token (its neighbours may then merge)
        scratch.ids.clear();
        scratch.ids.extend(
            word.bytes()
                .map(|b| self.byte_ids[b as usize])
                .filter(|&id| id != u32::MAX),
        );
        if scratch.ids.len() > SCAN_MAX_BYTES {
            self.bpe_heap(scratch)
        } else {
            self.bpe_scan(scratch)
        }
    }

    /// [`FastBpe::bpe`] by rescanning the pairs after each merge.
    fn bpe_scan(&self, scratch: &mut Scratch) {
        let Scratch { ids, ranks, .. } = scratch;
        ranks.clear();
        ranks.extend(ids.windows(2).map(|w| self.pair(w[0], w[1])));
        loop {
            let mut at = None;
            let mut best = u32::MAX;
            for (i, &(rank, _)) in ranks.iter().enumerate() {
                if rank < best {
                    best = rank;
                    at = Some(i);
                }
            }
            let Some(i) = at else { break };
            ids[i] = ranks[i].1;
            ids.remove(i + 1);
            ranks.remove(i);
            if i > 0 {
                ranks[i - 1] = self.pair(ids[i - 1], ids[i]);
            }
            if i < ranks.len() {
                ranks[i] = self.pair(ids[i], ids[i + 1]);
            }
        }
    }

    /// (rank, merged id) of the pair `a b`, or [`NO_MERGE`].
    fn pair(&self, a: u32, b: u32) -> (u32, u32) {
        self.merges.get(&(a, b)).copied().unwrap_or(NO_MERGE)
    }

    /// [`FastBpe::bpe`] for long words: the symbols form a linked list over their first
    /// byte's position and every candidate pair waits in a min-heap keyed (rank, position),
    /// so the next merge is the heap's top, leftmost on ties exactly as the scan picks it.
    /// A merge pushes the (at most two) pairs it creates; an entry a merge made stale is
    /// skipped when it surfaces: the pair now at its position has another rank (a rank names
    /// one pair of ids, and a position's ids only grow, so a pair never comes back). Entries
    /// are one `u64` and the links `u32`s: the heap of a 4 MiB word is its working set, and
    /// halving it measured faster. `scratch.ids` holds the word's byte ids on entry and its
    /// token ids on return.
    fn bpe_heap(&self, scratch: &mut Scratch) {
        use std::cmp::Reverse;
        const GONE: u32 = u32::MAX;
        let Scratch {
            ids,
            next,
            prev,
            heap,
            ..
        } = scratch;
        let Ok(n) = u32::try_from(ids.len()) else {
            // over 4 GiB in one word: never within a request's limits
            return self.bpe_scan(scratch);
        };
        let key = |rank: u32, at: u32| Reverse(u64::from(rank) << 32 | u64::from(at));
        // next[i]: the symbol after the one starting at i (n: none); prev[i]: before it (GONE:
        // none); a merged-away symbol's id becomes GONE
        next.clear();
        next.extend(1..=n);
        prev.clear();
        prev.extend((0..n).map(|i| i.checked_sub(1).unwrap_or(GONE)));
        heap.clear();
        heap.extend(
            ids.windows(2)
                .zip(0..)
                .map(|(w, i)| (self.pair(w[0], w[1]).0, i))
                .filter(|&(rank, _)| rank != u32::MAX)
                .map(|(rank, i)| key(rank, i)),
        );
        let at = |v: &Vec<u32>, i: u32| v.get(i as usize).copied();
        while let Some(Reverse(top)) = heap.pop() {
            let (rank, i) = ((top >> 32) as u32, top as u32);
            let Some(j) = at(next, i) else { continue };
            let (Some(a), Some(b)) = (at(ids, i), at(ids, j)) else {
                continue;
            };
            let (now, merged) = self.pair(a, b);
            if now != rank || a == GONE {
                continue; // stale
            }
            let k = at(next, j).unwrap_or(n);
            if let Some(x) = ids.get_mut(i as usize) {
                *x = merged;
            }
            if let Some(y) = ids.get_mut(j as usize) {
                *y = GONE;
            }
            if let Some(x) = next.get_mut(i as usize) {
                *x = k;
            }
            if let Some(p) = prev.get_mut(k as usize) {
                *p = i;
            }
            if let Some(l) = at(prev, i).filter(|&l| l != GONE) {
                if let Some(left) = at(ids, l) {
                    let (r, _) = self.pair(left, merged);
                    if r != u32::MAX {
                        heap.push(key(r, l));
                    }
                }
            }
            if let Some(c) = at(ids, k) {
                let (r, _) = self.pair(merged, c);
                if r != u32::MAX {
                    heap.push(key(r, i));
                }
            }
        }
        ids.retain(|&id| id != GONE);
    }
}

/// SmolLM2's fast encoder, for unit tests (the vocabulary `scripts/setup.sh` installs).
#[cfg(test)]
pub(crate) fn smollm2() -> FastBpe {
    let repo = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let dir = crate::protocol::defaults::model_dir(&crate::protocol::defaults::data_dir(repo));
    let json = std::fs::read(dir.join("tokenizer.json")).unwrap_or_default();
    FastBpe::from_json(&json).unwrap_or_else(|| panic!("{}: run scripts/setup.sh", dir.display()))
}

/// `n` words drawn from a small list by a generator seeded with `seed`, for unit tests.
#[cfg(test)]
pub(crate) fn words(seed: u64, n: usize) -> String {
    const WORDS: [&str; 12] = [
        "drain", "queue", "rotate", "keys", "page", "oncall", "disk", "full", "retry", "shard",
        "quorum", "lost",
    ];
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            WORDS[(x % WORDS.len() as u64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both merge loops on one word's bytes.
    fn scan_and_heap(t: &FastBpe, word: &str) -> (Vec<u32>, Vec<u32>) {
        let mut scratch = Scratch::default();
        let mut run = |heap: bool| {
            scratch.ids.clear();
            scratch
                .ids
                .extend(word.bytes().map(|b| t.byte_ids[b as usize]));
            if heap {
                t.bpe_heap(&mut scratch);
            } else {
                t.bpe_scan(&mut scratch);
            }
            scratch.ids.clone()
        };
        (run(false), run(true))
    }

    #[test]
    fn the_heap_merges_exactly_as_the_scan() {
        let t = smollm2();
        // letters that merge into many tokens of every length, runs of one letter (ties
        // between equal pairs), digits, multi-byte characters
        let alphabet = [
            "a", "aa", "b", "e", "th", "in", "er", "x", "0", "1", "é", "日", "ing", "tion",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 1..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let word: String = (0..len)
                .map(|i| alphabet[((x >> (i % 60)) as usize + i) % alphabet.len()])
                .collect();
            let (scan, heap) = scan_and_heap(&t, &word);
            assert_eq!(scan, heap, "{word:?}");
        }
        for word in ["a".repeat(1000), "ab".repeat(777), "日本".repeat(300)] {
            let (scan, heap) = scan_and_heap(&t, &word);
            assert_eq!(scan, heap, "{word:?}");
            assert!(heap.len() <= word.len() / 2, "merged: {}", heap.len());
        }
    }

    #[test]
    fn a_safe_prefix_encodes_to_the_whole_texts_first_ids() {
        let t = smollm2();
        let text = format!(
            "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{} {} x<|im_end|>",
            words(3, 400),
            "b".repeat(5000),
            words(4, 200)
        );
        let whole = t.encode(&text);
        let mut cuts = 0;
        for max in (0..text.len() + 10).step_by(37) {
            let prefix = t.safe_prefix(&text, max);
            assert!(prefix.len() <= max || prefix.len() == text.len());
            let ids = t.encode(prefix);
            assert_eq!(ids, whole[..ids.len()], "{max}");
            cuts += usize::from(!prefix.is_empty() && prefix.len() < text.len());
        }
        assert!(cuts > 20, "{cuts}");
        // one long word has no cut
        assert_eq!(t.safe_prefix(&"a".repeat(10_000), 5000), "");
    }

    #[test]
    fn a_text_is_at_least_its_bytes_over_the_longest_token() {
        let t = smollm2();
        let text = "a".repeat(81 * 1000);
        let bound = t.min_tokens(&text);
        assert_eq!(bound, 1000, "SmolLM2's longest token is 81 bytes");
        assert!(t.encode(&text).len() >= bound);
        // bytes without an id are no tokens: they do not count
        assert_eq!(t.min_tokens("\u{4}\u{4}\u{4}"), 0);
        assert_eq!(t.encode("\u{4}\u{4}\u{4}"), Vec::<u32>::new());
    }

    #[test]
    fn byte_map_is_gpt2() {
        let m = byte_to_char();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'a' as usize], 'a');
        let distinct: std::collections::HashSet<char> = m.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn texts_compare_equal_only_when_every_byte_is() {
        let a = "0123456789abcdefghij".repeat(7); // 140 bytes: words and a tail
        for i in 0..a.len() {
            let mut b = a.clone().into_bytes();
            b[i] = b'#';
            let b = String::from_utf8(b).unwrap();
            assert!(!same_text(&a, &b), "differs at {i}");
        }
        assert!(same_text(&a, &a.clone()));
        assert!(!same_text(&a, &a[..139]));
        assert!(same_text("", ""));
    }

    #[test]
    fn a_long_texts_sampled_key_sees_its_length_ends_and_samples() {
        let a = "check the service logs before restarting any node ".repeat(100);
        let key = Recall::sampled_key(&a);
        assert_eq!(key, Recall::sampled_key(&a.clone()));
        let edit = |at: usize| {
            let mut b = a.clone().into_bytes();
            b[at] = b'#';
            Recall::sampled_key(&String::from_utf8(b).unwrap())
        };
        assert_ne!(edit(0), key, "head");
        assert_ne!(edit(a.len() - 1), key, "tail");
        assert_ne!(edit((a.len() - 16) / 16), key, "a sample");
        assert_ne!(Recall::sampled_key(&a[1..]), key, "length");
        // a short text's key is its whole hash
        assert_eq!(Recall::sampled_key("short"), Recall::key("short"));
        // a text differing only between samples shares the key: the cache compares the text
        let mut recall = Recall::default();
        let other = String::from_utf8({
            let mut b = a.clone().into_bytes();
            b[300] = b'#';
            b
        })
        .unwrap();
        assert_eq!(Recall::sampled_key(&other), key);
        recall.offer(key, &a, &[1, 2], usize::MAX);
        recall.offer(key, &a, &[1, 2], usize::MAX);
        assert_eq!(recall.get(key, &a), Some(&[1, 2][..]));
        assert_eq!(recall.get(key, &other), None);
    }

    fn kept_chunks(t: &FastBpe) -> usize {
        t.cache.lock().map_or(0, |m| m.chunks.kept.len())
    }

    #[test]
    fn a_text_encoded_piece_by_piece_is_encoded_exactly() {
        let doc = words(3, 600);
        let texts = [
            // never seen, seen again (segment and chunk caches), behind a new first line
            doc.clone(),
            doc.clone(),
            format!("ticket 42: {doc}"),
            // added tokens between segments, non-ASCII text
            format!("<|im_start|>system\n{doc}<|im_end|>\n<|im_start|>user\nünïcödé 🚀 {doc}<|im_end|>\n"),
            words(5, 40),
        ];
        let t = smollm2();
        for (n, text) in texts.iter().enumerate() {
            let whole = smollm2().encode(text);
            for step in [1, 7, 128, 1000] {
                let (mut out, mut at, mut calls) = (Vec::new(), Cursor::default(), 0);
                while at.pos < text.len() {
                    t.encode_from(text, &mut at, out.len() + step, &mut out);
                    calls += 1;
                    assert_eq!(out[..], whole[..out.len()], "text {n}, step {step}");
                }
                assert_eq!(out, whole, "text {n}, step {step}");
                if (n, step) == (0, 1) {
                    assert!(calls > 3, "never seen: stopped early only {calls} times");
                }
                if n == 1 {
                    // finished piece by piece twice before: kept whole, like a whole encode
                    assert_eq!(calls, 1, "text {n}, step {step}");
                }
            }
        }
    }

    #[test]
    fn a_shared_passage_behind_a_new_first_line_comes_from_the_chunk_cache() {
        let doc = words(7, 1000);
        let t = smollm2();
        let fresh = |text: &str| smollm2().encode(text);
        for i in 0..4 {
            let text = format!("request {i} of the day. {doc}");
            assert_eq!(t.encode(&text), fresh(&text), "request {i}");
        }
        // every chunk but the first (which holds the new line) is kept from its second sighting
        let b = format!("request 0 of the day. {doc}").into_bytes();
        let (mut chunks, mut at) = (0, 0);
        while at < b.len() {
            at = chunk_end(&b, at);
            chunks += 1;
        }
        assert!(chunks >= 3, "{chunks}");
        assert_eq!(kept_chunks(&t), chunks - 1);

        // text that never repeats keeps nothing
        let t = smollm2();
        for i in 0..4 {
            let text = words(101 + 2 * i, 1000);
            assert_eq!(t.encode(&text), fresh(&text));
        }
        assert_eq!(kept_chunks(&t), 0);
    }

    #[test]
    fn a_word_is_kept_from_its_second_sighting() {
        let t = smollm2();
        let kept = |t: &FastBpe| t.cache.lock().map_or(0, |m| m.words.kept.len());
        let ids = t.encode("drain the queue");
        assert_eq!(kept(&t), 0, "seen once: noted, not kept");
        assert_eq!(t.encode("drain the queue"), ids);
        assert_eq!(kept(&t), 3, "\"drain\", \" the\", \" queue\"");
        assert_eq!(t.encode("drain the queue"), ids, "from the cache");
        assert_eq!(t.encode("the queue"), smollm2().encode("the queue"));
        assert_eq!(kept(&t), 3, "\"the\" is seen once");
    }

    #[test]
    fn unsupported_shapes_are_refused() {
        assert!(FastBpe::from_json(
            br#"{"normalizer":{"type":"NFC"},"pre_tokenizer":null,"model":{}}"#
        )
        .is_none());
        assert!(FastBpe::from_json(b"not json").is_none());
    }
}
