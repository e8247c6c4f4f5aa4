//! Chained block hashes: the identity of a prompt prefix.
//!
//! A prompt's tokens are cut into fixed-size blocks; only *full* blocks are hashed (a trailing
//! partial block can never be shared, exactly as in vLLM's prefix cache). Each hash covers its
//! parent's hash and the block's tokens, so a block hash names the whole prefix up to and
//! including that block:
//!
//! ```text
//! root    = XXH3-64(seed = HASH_SEED, "prefix-router/v1\0" ‖ model ‖ "\0" ‖ salt?)
//! hash_0  = XXH3-64(seed = HASH_SEED, root.le_bytes()    ‖ tokens_0 as u32 LE)
//! hash_i  = XXH3-64(seed = HASH_SEED, hash_{i-1}.le_bytes() ‖ tokens_i as u32 LE)
//! ```
//!
//! Seeding the root with the model name and the request's `cache_salt` keeps models and
//! tenants apart: a different salt shares no block. The golden vectors in
//! `core/tests/data/golden_hashes.json` pin this down so any other component can prove it
//! computes the same values.

use std::fmt;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The pinned XXH3 seed for every hash in this scheme. Changing it changes every hash.
pub const HASH_SEED: u64 = 0x7072_6566_6978_3031; // "prefix01"

/// Domain prefix of the root hash, versioned so a future scheme can never collide with this one.
const ROOT_DOMAIN: &[u8] = b"prefix-router/v1\0";

/// Default block size in tokens (vLLM's prefix-cache block size used in the reference demo).
pub const DEFAULT_BLOCK_SIZE: u32 = crate::protocol::defaults::BLOCK_SIZE;

/// The chained hash of one full block (and therefore of the whole prefix ending with it).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct BlockHash(pub u64);

impl BlockHash {
    /// Lower-case, zero-padded hex: the form used in JSON, headers and shared-data keys.
    pub fn to_hex(self) -> String {
        format!("{:016x}", self.0)
    }

    /// Parses the form written by [`BlockHash::to_hex`].
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 16 {
            return None;
        }
        u64::from_str_radix(s, 16).ok().map(BlockHash)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl serde::Serialize for BlockHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for BlockHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        BlockHash::from_hex(&s)
            .ok_or_else(|| serde::de::Error::custom("block hash must be 16 lower-case hex digits"))
    }
}

/// A number of tokens.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default, serde::Serialize)]
pub struct TokenCount(pub u64);

/// The block size in tokens; never zero.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "u32")]
pub struct BlockSize(u32);

impl TryFrom<u32> for BlockSize {
    type Error = &'static str;
    fn try_from(tokens: u32) -> Result<Self, Self::Error> {
        BlockSize::new(tokens).ok_or("a block size must be at least 1 token")
    }
}

impl BlockSize {
    /// `None` for zero, the only invalid block size.
    pub fn new(tokens: u32) -> Option<Self> {
        (tokens > 0).then_some(BlockSize(tokens))
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// Tokens covered by `blocks` full blocks.
    pub fn tokens_in(self, blocks: usize) -> TokenCount {
        TokenCount(blocks as u64 * u64::from(self.0))
    }
}

impl Default for BlockSize {
    fn default() -> Self {
        BlockSize(DEFAULT_BLOCK_SIZE)
    }
}

/// The model name a chain's root is seeded with: the model's own, or for a request to one of
/// its LoRA adapters, both names (an adapter computes different K/V from the same tokens).
/// Whoever computes hashes for a pod (the filter, the `kv-events` sidecar) names roots so.
pub fn model_seed(model: &str, adapter: Option<&str>) -> String {
    match adapter {
        Some(a) => format!("{model}\u{0}lora:{a}"),
        None => model.to_owned(),
    }
}

/// The root of a request's hash chain: model name plus optional tenant salt.
pub fn root_hash(model: &str, cache_salt: Option<&str>) -> BlockHash {
    let salt = cache_salt.unwrap_or("");
    let mut buf = Vec::with_capacity(ROOT_DOMAIN.len() + model.len() + salt.len() + 2);
    buf.extend_from_slice(ROOT_DOMAIN);
    buf.extend_from_slice(model.as_bytes());
    buf.push(0);
    // `Some("")` and `None` are deliberately the same tenant: an empty salt isolates nothing.
    if !salt.is_empty() {
        buf.push(1);
        buf.extend_from_slice(salt.as_bytes());
    }
    BlockHash(xxh3_64_with_seed(&buf, HASH_SEED))
}

/// Hash of one block given its parent.
pub fn chain_hash(parent: BlockHash, block: &[u32]) -> BlockHash {
    chain_hash_in(&mut Vec::new(), parent, block)
}

/// [`chain_hash`] with a caller's scratch buffer: hashing a prompt reuses one, and writes
/// each token's four bytes at once (appending them a byte slice at a time, with a new buffer
/// per block, was half the time of hashing a repeated 2k-token prompt in the wasm filter:
/// measured under V8).
fn chain_hash_in(buf: &mut Vec<u8>, parent: BlockHash, block: &[u32]) -> BlockHash {
    buf.clear();
    buf.resize(8 + block.len() * 4, 0);
    let (head, body) = buf.split_at_mut(8);
    head.copy_from_slice(&parent.0.to_le_bytes());
    for (dst, t) in body.chunks_exact_mut(4).zip(block) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    BlockHash(xxh3_64_with_seed(buf, HASH_SEED))
}

/// Hashes of every full block of `tokens`, in order. A trailing partial block is ignored.
pub fn block_hashes(root: BlockHash, tokens: &[u32], block_size: BlockSize) -> Vec<BlockHash> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size.get() as usize);
    extend_block_hashes(root, &mut hashes, tokens, block_size);
    hashes
}

/// Appends to `hashes` (those of the first full blocks of `tokens`, chained from `root`) the
/// hashes of the full blocks of `tokens` after them: a prompt tokenized piece by piece is
/// hashed as it grows, with the same result as [`block_hashes`] on all of it.
pub fn extend_block_hashes(
    root: BlockHash,
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: BlockSize,
) {
    let size = block_size.get() as usize;
    let mut parent = hashes.last().copied().unwrap_or(root);
    let done = hashes.len().saturating_mul(size);
    let mut buf = Vec::with_capacity(8 + size * 4);
    for block in tokens.get(done..).unwrap_or_default().chunks_exact(size) {
        parent = chain_hash_in(&mut buf, parent, block);
        hashes.push(parent);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn bs(n: u32) -> BlockSize {
        BlockSize::new(n).unwrap()
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        let root = root_hash("m", None);
        let t: Vec<u32> = (0..300).collect();
        assert_eq!(block_hashes(root, &t, bs(128)).len(), 2);
        assert_eq!(block_hashes(root, &t[..127], bs(128)).len(), 0);
        assert_eq!(block_hashes(root, &t[..128], bs(128)).len(), 1);
    }

    #[test]
    fn hashes_are_chained() {
        let root = root_hash("m", None);
        let a: Vec<u32> = (0..256).collect();
        let mut b = a.clone();
        b[0] = 999; // differ only in the first block
        let ha = block_hashes(root, &a, bs(128));
        let hb = block_hashes(root, &b, bs(128));
        assert_ne!(ha[0], hb[0]);
        // identical second blocks still differ because their parents differ
        assert_ne!(ha[1], hb[1]);
        // a shared first block gives the same first hash
        let mut c = a.clone();
        c[200] = 7;
        let hc = block_hashes(root, &c, bs(128));
        assert_eq!(ha[0], hc[0]);
        assert_ne!(ha[1], hc[1]);
    }

    #[test]
    fn salt_and_model_separate_roots() {
        assert_ne!(root_hash("m", None), root_hash("m", Some("tenant-a")));
        assert_ne!(root_hash("m", Some("a")), root_hash("m", Some("b")));
        assert_ne!(root_hash("m1", None), root_hash("m2", None));
        assert_eq!(root_hash("m", None), root_hash("m", Some("")));
        // the separator keeps ("ab", salt "c") apart from ("a", salt "bc")
        assert_ne!(root_hash("ab", Some("c")), root_hash("a", Some("bc")));
    }

    #[test]
    fn hex_round_trip() {
        let h = BlockHash(0x0123_4567_89ab_cdef);
        assert_eq!(h.to_hex(), "0123456789abcdef");
        assert_eq!(BlockHash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(BlockHash::from_hex("xyz"), None);
        assert!(BlockSize::new(0).is_none());
    }
}
