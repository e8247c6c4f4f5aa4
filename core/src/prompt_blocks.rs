//! A prompt's tokens and block hashes, computed only as deep as they are asked for.
//!
//! Why: block hashes are chained, so once a block of a prompt is held by no pod, no block
//! after it can be, and a router has nothing to look up past it. Tokenizing the rest of a
//! never-seen 2k-token prompt was most of the filter's own CPU on unique prompts (measured:
//! `scripts/bench.sh filter`). The router asks for the first block, and for the rest only
//! when a pod holds or computes that one; the pod, and the filter's debug headers, take the
//! whole prompt ([`PromptBlocks::finish`]). The tokens produced piece by piece are exactly
//! the whole prompt's first tokens ([`crate::fast_bpe::FastBpe::encode_from`] cuts only
//! where the encoding does not depend on what follows).

use crate::block::{extend_block_hashes, BlockHash, BlockSize};
use crate::fast_bpe::{Cursor, FastBpe};
use crate::model::PreparedPrompt;
use std::borrow::Cow;

/// Text still to tokenize, from `at` on.
struct Pending<'a> {
    fast: &'a FastBpe,
    text: Cow<'a, str>,
    /// Bytes of `text` to read: all of it, unless [`PromptBlocks::read_at_most`] cut it.
    end: usize,
    at: Cursor,
    /// Tokens the post-processor appends once the text is done (e.g. an EOS).
    after: &'a [u32],
    /// Tokens before the text's (e.g. a BOS), for the length estimate.
    before: usize,
}

/// A prompt's tokens and chained block hashes so far; see the module docs.
pub struct PromptBlocks<'a> {
    pending: Option<Pending<'a>>,
    /// Reading stopped short of the text's end ([`PromptBlocks::read_at_most`]): bytes read,
    /// and the text's length.
    stopped: Option<(usize, usize)>,
    tokens: Vec<u32>,
    hashes: Vec<BlockHash>,
    root: BlockHash,
    block_size: BlockSize,
}

impl<'a> PromptBlocks<'a> {
    /// A prompt whose tokens are all known already.
    pub fn whole(tokens: Vec<u32>, root: BlockHash, block_size: BlockSize) -> Self {
        let mut p = PromptBlocks {
            pending: None,
            stopped: None,
            tokens,
            hashes: Vec::new(),
            root,
            block_size,
        };
        p.hash_full_blocks();
        p
    }

    /// A prompt to tokenize lazily: `before`, then `text`'s ids, then `after`.
    pub fn lazy(
        fast: &'a FastBpe,
        text: Cow<'a, str>,
        before: &[u32],
        after: &'a [u32],
        root: BlockHash,
        block_size: BlockSize,
    ) -> Self {
        let mut p = PromptBlocks {
            pending: Some(Pending {
                fast,
                end: text.len(),
                text,
                at: Cursor::default(),
                after,
                before: before.len(),
            }),
            stopped: None,
            tokens: before.to_vec(),
            hashes: Vec::new(),
            root,
            block_size,
        };
        p.hash_full_blocks();
        p
    }

    /// Tokenizes and hashes until at least `blocks` full blocks are hashed, or the prompt
    /// ends.
    pub fn extend_to(&mut self, blocks: usize) {
        while self.hashes.len() < blocks {
            let Some(p) = self.pending.as_mut() else {
                return;
            };
            let want = blocks.saturating_mul(self.block_size.get() as usize);
            let text = p.text.get(..p.end).unwrap_or_default();
            p.fast.encode_from(text, &mut p.at, want, &mut self.tokens);
            if p.at.pos >= p.end {
                if p.end < p.text.len() {
                    self.stopped = Some((p.end, p.text.len()));
                } else {
                    self.tokens.extend_from_slice(p.after);
                }
                self.pending = None;
            }
            self.hash_full_blocks();
        }
    }

    /// Reads at most `bytes` of the text, up to the last place before them where its ids
    /// are exactly the whole text's first ids ([`FastBpe::safe_prefix`]): every block hashed
    /// is then still one of the whole prompt's, and the work is bounded whatever the prompt
    /// (one 4 MiB word is not read at all). A router calls this; the server, which must see
    /// every token, does not. Tokens known whole are not cut.
    pub fn read_at_most(&mut self, bytes: usize) {
        if let Some(p) = self.pending.as_mut() {
            if p.text.len() > bytes {
                p.end = p.fast.safe_prefix(&p.text, bytes).len().max(p.at.pos);
            }
        }
    }

    /// The same prompt, marked as read only up to `read` of `total` bytes (a router that cut
    /// the text before tokenizing it whole).
    pub fn stopped_at(mut self, stopped: Option<(usize, usize)>) -> Self {
        if self.pending.is_none() {
            self.stopped = stopped;
        }
        self
    }

    /// `Some((read, total))` bytes of the text when reading stopped short of its end
    /// ([`PromptBlocks::read_at_most`]).
    pub fn stopped_short(&self) -> Option<(usize, usize)> {
        self.stopped
    }

    fn hash_full_blocks(&mut self) {
        extend_block_hashes(self.root, &mut self.hashes, &self.tokens, self.block_size);
    }

    /// Hashes of the full blocks so far.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Forgets the hashes past the first `blocks` (not the tokens), e.g. so that only the
    /// blocks a router looked at are recorded.
    pub fn truncate(&mut self, blocks: usize) {
        self.hashes.truncate(blocks);
    }

    /// Whether reading is over: the whole prompt is tokenized, or as much of it as
    /// [`PromptBlocks::read_at_most`] allows ([`PromptBlocks::stopped_short`]).
    pub fn is_complete(&self) -> bool {
        self.pending.is_none()
    }

    /// The prompt's length in tokens: exact once complete, else estimated from the tokens per
    /// byte of the text so far.
    pub fn estimated_tokens(&self) -> usize {
        let Some(p) = &self.pending else {
            return match self.stopped {
                // the unread text at the read part's tokens per byte (a quarter, English's,
                // when nothing was read: a one-word megabyte)
                Some((read, total)) => {
                    let per_byte = match read {
                        0 => 0.25,
                        _ => self.tokens.len() as f64 / read as f64,
                    };
                    self.tokens.len()
                        + (total.saturating_sub(read) as f64 * per_byte).ceil() as usize
                }
                None => self.tokens.len(),
            };
        };
        let text_tokens = self.tokens.len().saturating_sub(p.before) as f64;
        let rest = p.text.len().saturating_sub(p.at.pos) as f64;
        let per_byte = text_tokens / p.at.pos.max(1) as f64;
        self.tokens.len() + (rest * per_byte).ceil() as usize + p.after.len()
    }

    /// A lower bound of the whole prompt's tokens, known without tokenizing the rest
    /// ([`FastBpe::min_tokens`]): the tokens so far, then the rest's bound.
    pub fn min_tokens(&self) -> usize {
        let Some(p) = &self.pending else {
            return self.tokens.len();
        };
        let rest = p.text.get(p.at.pos..).unwrap_or_default();
        self.tokens.len() + p.fast.min_tokens(rest) + p.after.len()
    }

    /// The whole prompt, tokenized and hashed.
    pub fn finish(mut self) -> PreparedPrompt {
        self.extend_to(usize::MAX);
        self.hash_full_blocks();
        PreparedPrompt {
            tokens: self.tokens,
            hashes: self.hashes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::tests::bs;
    use crate::block::{block_hashes, root_hash};
    use crate::fast_bpe::{smollm2, words};

    #[test]
    fn blocks_asked_for_step_by_step_are_the_whole_prompts_first_blocks() {
        let fast = smollm2();
        let root = root_hash("m", None);
        let text = format!("<|im_start|>system\n{}<|im_end|>\n", words(11, 900));
        let (before, after) = ([7u32], [8u32, 9]);
        let mut whole = before.to_vec();
        whole.extend(fast.encode(&text));
        whole.extend(after);
        let expected = block_hashes(root, &whole, bs(16));
        let mut p = PromptBlocks::lazy(&fast, Cow::Borrowed(&text), &before, &after, root, bs(16));
        let mut depth = 1;
        while !p.is_complete() {
            p.extend_to(depth);
            assert!(p.hashes().len() >= depth.min(expected.len()), "{depth}");
            assert_eq!(p.hashes(), &expected[..p.hashes().len()], "{depth}");
            depth *= 2;
        }
        let done = p.finish();
        assert_eq!((done.tokens, done.hashes), (whole, expected));
    }

    #[test]
    fn a_new_prompts_first_block_costs_a_fraction_of_its_tokens() {
        let fast = smollm2();
        let root = root_hash("m", None);
        let text = words(13, 2000);
        let total = fast.encode(&text).len();
        let mut p = PromptBlocks::lazy(&fast, Cow::Borrowed(&text), &[], &[], root, bs(128));
        p.extend_to(1);
        assert!(!p.hashes().is_empty());
        assert!(p.tokens.len() < total / 4, "{} of {total}", p.tokens.len());
        // the length is estimated from the part tokenized
        let est = p.estimated_tokens() as f64;
        assert!((est / total as f64 - 1.0).abs() < 0.2, "{est} for {total}");
        assert_eq!(p.finish().tokens.len(), total);
    }

    #[test]
    fn a_read_limit_keeps_the_whole_prompts_first_blocks_and_bounds_the_work() {
        let fast = smollm2();
        let root = root_hash("m", None);
        let head = words(17, 300);
        // a hostile middle: one 200 KiB word, then ordinary text again
        let text = format!("{head} {} and then {}", "a".repeat(200_000), words(5, 300));
        let whole = fast.encode(&text);
        let expected = block_hashes(root, &whole, bs(16));
        for limit in [10, 100, 1000, head.len() + 1, 150_000, text.len() - 10] {
            let mut p = PromptBlocks::lazy(&fast, Cow::Borrowed(&text), &[], &[9], root, bs(16));
            p.read_at_most(limit);
            p.extend_to(usize::MAX);
            let (read, total) = p.stopped_short().unwrap();
            assert!(read <= limit && total == text.len(), "{limit}: {read}");
            assert!(p.is_complete());
            assert_eq!(p.hashes(), &expected[..p.hashes().len()], "{limit}");
            if limit <= 200_000 + head.len() {
                // nothing of the long word is read
                assert!(read <= head.len(), "{limit}: {read}");
            } else {
                assert!(read > 200_000, "{limit}: {read}");
            }
            let est = p.estimated_tokens();
            assert!(est > p.tokens.len(), "{limit}: {est}");
        }
        // one long word: nothing read, the length estimated at four bytes a token
        let word = "a".repeat(100_000);
        let mut p = PromptBlocks::lazy(&fast, Cow::Borrowed(&word), &[], &[], root, bs(16));
        p.read_at_most(1000);
        p.extend_to(usize::MAX);
        assert_eq!(p.stopped_short(), Some((0, 100_000)));
        assert_eq!((p.hashes().len(), p.estimated_tokens()), (0, 25_000));
        let mut p = PromptBlocks::lazy(&fast, Cow::Borrowed(&text), &[], &[9], root, bs(16));
        p.read_at_most(text.len());
        assert_eq!(
            p.finish().tokens.len(),
            whole.len() + 1,
            "no cut: the whole prompt"
        );
    }

    #[test]
    fn known_tokens_are_hashed_at_once_and_truncation_keeps_them() {
        let root = root_hash("m", None);
        let tokens: Vec<u32> = (0..100).collect();
        let mut p = PromptBlocks::whole(tokens.clone(), root, bs(16));
        assert!(p.is_complete());
        assert_eq!(p.hashes().len(), 6);
        assert_eq!(p.estimated_tokens(), 100);
        p.truncate(2);
        assert_eq!(p.hashes().len(), 2);
        assert_eq!(p.finish().hashes, block_hashes(root, &tokens, bs(16)));
    }
}
