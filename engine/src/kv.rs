//! The attention K/V of a run of positions, per layer, kept outside the model: a prefix cache
//! holds one per token block, a request being computed grows one in place. Its own module so
//! the prefill ([`crate::llama`]) and the decode step ([`crate::decode`]) both use it without
//! needing each other.

use crate::tensor::with_slice;
use crate::{bail, Result};
use candle_core::{DType, Tensor};

/// Longest position the rotary tables cover.
pub const MAX_POSITIONS: usize = 8192;

/// The type K/V are held in: f16, as vLLM and llama.cpp hold theirs by default. Half the
/// bytes of f32 for the prefix cache to keep and for a decode step's attention to read (with
/// eight sequences at ~300 positions, their f32 K/V were more bytes per step than the
/// weights); every pass reads the same rounded values, whether they were just computed or
/// came from the cache.
pub const KV_DTYPE: DType = DType::F16;

/// Per-layer K and V of the first `len` positions, each tensor `[1, kv_heads, capacity,
/// head_dim]` in [`KV_DTYPE`]. A sequence being computed keeps room beyond `len` (see
/// [`Kv::append`]), so a decode step writes one position in place instead of copying all of
/// them; a block cut out for the cache ([`Kv::slice`]) holds exactly its positions. Not
/// `Clone`: copies would share the room beyond `len`, and each one's appends would overwrite
/// the other's.
#[derive(Debug)]
pub struct Kv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
}

/// Positions of room a growing K/V gets at least, beyond what it needs.
const HEADROOM: usize = 64;

impl Kv {
    /// No positions yet, for `layers` layers of `kv_heads` K/V heads of `head_dim` values.
    pub fn empty(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        device: &candle_core::Device,
    ) -> Result<Kv> {
        let empty = Tensor::zeros((1, kv_heads, 0, head_dim), KV_DTYPE, device)?;
        Ok(Kv {
            k: vec![empty.clone(); layers],
            v: vec![empty; layers],
            len: 0,
        })
    }

    /// Number of positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions `start..start+len` as their own (contiguous) KV.
    pub fn slice(&self, start: usize, len: usize) -> Result<Kv> {
        if start + len > self.len {
            bail!("positions {start}..{} of {}", start + len, self.len);
        }
        let cut = |ts: &[Tensor]| -> Result<Vec<Tensor>> {
            ts.iter()
                .map(|t| Ok(t.narrow(2, start, len)?.contiguous()?))
                .collect()
        };
        Ok(Kv {
            k: cut(&self.k)?,
            v: cut(&self.v)?,
            len,
        })
    }

    /// Concatenates blocks in order.
    pub fn concat(blocks: &[&Kv]) -> Result<Option<Kv>> {
        let Some(first) = blocks.first() else {
            return Ok(None);
        };
        let layers = first.k.len();
        let len: usize = blocks.iter().map(|b| b.len).sum();
        // room for the prompt's rest and some answer, as `append` would grow it: the first
        // chunk after a hit then writes in place instead of copying every cached position
        let room = (len + (len / 4).max(HEADROOM)).min(MAX_POSITIONS.max(len));
        let join = |part: fn(&Kv) -> &[Tensor], l: usize| -> Result<Tensor> {
            let shape = &part(first)[l];
            let (b, heads, _, dim) = shape.dims4()?;
            let joined = Tensor::zeros((b, heads, room, dim), KV_DTYPE, shape.device())?;
            let mut at = 0;
            for block in blocks {
                let t = &part(block)[l];
                joined.slice_set(&t.narrow(2, 0, block.len)?.contiguous()?, 2, at)?;
                at += block.len;
            }
            Ok(joined)
        };
        let k = (0..layers)
            .map(|l| join(|b| &b.k, l))
            .collect::<Result<Vec<_>>>()?;
        let v = (0..layers)
            .map(|l| join(|b| &b.v, l))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Kv { k, v, len }))
    }

    /// Bytes of the positions held.
    pub fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|t| match t.dims() {
                [_, heads, _, dim] => heads * dim * self.len * t.dtype().size_in_bytes(),
                _ => 0,
            })
            .sum()
    }

    /// Writes layer `l`'s K and V of `n` new positions (`[1, kv_heads, n, head_dim]`, any
    /// float type) after the `len` held, growing the room when needed (by a quarter, at least
    /// [`HEADROOM`] positions: a copy every so many steps instead of every step). `len`
    /// itself moves on with [`Kv::advance`], once every layer has its positions.
    pub(crate) fn append(&mut self, l: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let n = k.dim(2)?;
        let need = self.len + n;
        let len = self.len;
        let grow = |t: &mut Tensor| -> Result<()> {
            let (b, heads, cap, dim) = t.dims4()?;
            if cap >= need {
                return Ok(());
            }
            let room = (need + (need / 4).max(HEADROOM)).min(MAX_POSITIONS.max(need));
            let bigger = Tensor::zeros((b, heads, room, dim), t.dtype(), t.device())?;
            if len > 0 {
                bigger.slice_set(&t.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
            }
            *t = bigger;
            Ok(())
        };
        let (Some(ck), Some(cv)) = (self.k.get_mut(l), self.v.get_mut(l)) else {
            bail!("no layer {l} in this K/V");
        };
        grow(ck)?;
        grow(cv)?;
        ck.slice_set(&k.to_dtype(KV_DTYPE)?.contiguous()?, 2, len)?;
        cv.slice_set(&v.to_dtype(KV_DTYPE)?.contiguous()?, 2, len)?;
        Ok(())
    }

    /// Layer `l`'s K and V of the first `n` positions (held or just appended), in f32,
    /// `[1, kv_heads, n, head_dim]` each. Converted eight values per instruction (F16C,
    /// through `half`) and both at once: candle's `to_dtype` one value at a time was a
    /// fifth of a 16-token prefill after 6 cached blocks.
    pub(crate) fn in_f32(&self, l: usize, n: usize) -> Result<(Tensor, Tensor)> {
        use half::slice::HalfFloatSliceExt;
        let (Some(k), Some(v)) = (self.k.get(l), self.v.get(l)) else {
            bail!("no layer {l} in this K/V");
        };
        let (_, heads, cap, hd) = k.dims4()?;
        if n > cap {
            bail!("{n} positions of a K/V with room for {cap}");
        }
        let f32 = |t: &Tensor| -> Result<Tensor> {
            let mut out = vec![0f32; heads * n * hd];
            with_slice(t, |all: &[half::f16]| -> Result<()> {
                for (h, dst) in out.chunks_mut(n * hd).enumerate() {
                    let Some(src) = all.get(h * cap * hd..h * cap * hd + n * hd) else {
                        bail!("K/V head {h} is not {n} positions");
                    };
                    src.convert_to_f32_slice(dst);
                }
                Ok(())
            })??;
            Ok(Tensor::from_vec(out, (1, heads, n, hd), t.device())?)
        };
        let (k, v) = rayon::join(|| f32(k), || f32(v));
        Ok((k?, v?))
    }

    /// Runs `f` on layer `l`'s K and V of K/V head `head`, over the positions held plus the
    /// one just appended (before [`Kv::advance`]).
    pub(crate) fn with_head<R>(
        &self,
        l: usize,
        head: usize,
        f: impl FnOnce(&[half::f16], &[half::f16]) -> R,
    ) -> Result<R> {
        let (Some(k), Some(v)) = (self.k.get(l), self.v.get(l)) else {
            bail!("no layer {l} in this K/V");
        };
        let (_, _, cap, hd) = k.dims4()?;
        let (at, n) = (head * cap * hd, (self.len + 1) * hd);
        with_slice(k, |k| {
            with_slice(v, |v| match (k.get(at..at + n), v.get(at..at + n)) {
                (Some(k), Some(v)) => Ok(f(k, v)),
                _ => bail!("no K/V head {head} of {} positions", self.len + 1),
            })
        })??
    }

    /// After every layer appended `n` positions.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
