//! The decode step's weight matrices in 8 bits (blocks of 32 values sharing one f32 scale, as
//! GGML's Q8_0), the activations they multiply (encoded the same way per step), and the
//! multiplication both this and the 4-bit matrices ([`super::q4`]) use: each weight block is
//! read once for the whole batch.
//!
//! A decode step's cost is reading the weights: at f32 that is ~0.5 GB per step for
//! SmolLM2-135M, about 18 steps/s on this machine's memory. A matrix the GGUF holds in 8 bits
//! (its Q8_0 token embedding, which is also the output projection) is re-encoded here exactly
//! enough (each block's 255 levels land on the same grid). With the activations in 8 bits as
//! well, a block's dot product is exact integer arithmetic times two scales.
//!
//! Why not candle's quantized matmul, which has the same arithmetic: it walks the batch's rows
//! outermost, so eight sequences read the weights eight times (measured: 8 sequences decoding
//! together ran at 75 tokens/s through it against 85 with f32 weights), and each dot product
//! converts f16 scales per block. Here each weight block is loaded once and dotted with up to
//! [`ROWS_AT_ONCE`] sequences' blocks while in registers, with scales kept in f32. Prefill
//! stays on f32 weights, where a chunk's many rows make the matmul compute-bound and candle's
//! f32 gemm is fastest.

use candle_core::Result;
use rayon::prelude::*;

/// Values per block (one scale each).
pub const BLOCK: usize = 32;

/// Sequences dotted with one weight block while it is in registers.
pub const ROWS_AT_ONCE: usize = 4;

/// Output features per parallel task: small enough to spread a 576-wide projection over the
/// cores, large enough that a task outlasts its scheduling (2 to 16 tasks per matrix measured
/// the same on 2 cores).
const COLUMNS_PER_TASK: usize = 32;

/// Rows of `width` values in 8 bits: `q[i]` ≈ `value[i] / d[i / 32]`.
struct Rows {
    width: usize,
    q: Vec<i8>,
    d: Vec<f32>,
}

impl Rows {
    /// Encodes rows of `width` values (a multiple of 32) each.
    fn encode(values: &[f32], width: usize) -> Rows {
        let mut q = vec![0i8; values.len()];
        let mut d = vec![0f32; values.len() / BLOCK];
        let encode_block = |(v, (q, d)): (&[f32], (&mut [i8], &mut f32))| {
            let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            *d = amax / 127.0;
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for (q, x) in q.iter_mut().zip(v) {
                *q = (x * inv).round().clamp(-127.0, 127.0) as i8;
            }
        };
        if values.len() >= 1 << 16 {
            values
                .par_chunks(BLOCK)
                .zip(q.par_chunks_mut(BLOCK).zip(d.par_iter_mut()))
                .for_each(encode_block);
        } else {
            values
                .chunks(BLOCK)
                .zip(q.chunks_mut(BLOCK).zip(d.iter_mut()))
                .for_each(encode_block);
        }
        Rows { width, q, d }
    }

    /// Row `r`'s values and scales.
    fn row(&self, r: usize) -> (&[i8], &[f32]) {
        let per_row = self.width / BLOCK;
        (
            &self.q[r * self.width..(r + 1) * self.width],
            &self.d[r * per_row..(r + 1) * per_row],
        )
    }
}

/// Whether `len` values make whole rows of `width`, and a row whole blocks.
pub fn whole_rows(len: usize, width: usize) -> bool {
    width > 0 && width.is_multiple_of(BLOCK) && len.is_multiple_of(width)
}

/// One activation row as the kernels read it: 8-bit values, each block's scale, and each
/// block's sum (scale × Σ values; the 4-bit kernels need it for their blocks' offsets).
#[derive(Clone, Copy)]
pub struct ActRow<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
}

/// A batch's activation rows (`rows × width`, row-major) in 8 bits, ready to multiply.
pub struct Act {
    rows: usize,
    x: Rows,
    s: Vec<f32>,
}

impl Act {
    /// Encodes `values` (rows of `width`, a multiple of 32).
    pub fn encode(values: &[f32], width: usize) -> Result<Act> {
        if !whole_rows(values.len(), width) {
            candle_core::bail!(
                "{} values in rows of {width}, which must be a multiple of {BLOCK}",
                values.len()
            );
        }
        let x = Rows::encode(values, width);
        let s =
            x.q.chunks(BLOCK)
                .zip(&x.d)
                .map(|(q, d)| d * q.iter().map(|&v| v as i32).sum::<i32>() as f32)
                .collect();
        Ok(Act {
            rows: values.len() / width,
            x,
            s,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn width(&self) -> usize {
        self.x.width
    }

    pub(super) fn row(&self, r: usize) -> ActRow<'_> {
        let (q, d) = self.x.row(r);
        let per_row = self.x.width / BLOCK;
        ActRow {
            q,
            d,
            s: &self.s[r * per_row..(r + 1) * per_row],
        }
    }
}

/// A weight matrix `[out, in]` in some block encoding, as [`multiply`] reads it.
pub trait BlockMatrix: Sync {
    /// Output features (rows of the matrix).
    fn out(&self) -> usize;
    /// Input features (a multiple of [`BLOCK`]).
    fn width(&self) -> usize;
    /// `dst[r] = row(col) · xs[r]` for up to [`ROWS_AT_ONCE`] activation rows. Every row must
    /// go through the same arithmetic in the same order whatever the group's size, so that a
    /// sequence's numbers do not depend on what it is batched with.
    fn dot_rows(&self, col: usize, xs: &[ActRow<'_>], dst: &mut [f32]);
}

/// `out = x · Wᵀ`, row-major `[x.rows(), w.out()]`; the matrix's rows are spread over the cores,
/// and each is dotted with every activation row while its blocks are in registers.
pub fn multiply(w: &impl BlockMatrix, x: &Act, out: &mut [f32]) -> Result<()> {
    let rows = x.rows();
    if x.width() != w.width() || out.len() != rows * w.out() {
        candle_core::bail!(
            "{rows} rows of {} features into a {}×{} matrix, {} outputs",
            x.width(),
            w.out(),
            w.width(),
            out.len()
        );
    }
    let xs: Vec<ActRow<'_>> = (0..rows).map(|r| x.row(r)).collect();
    // column-major first: each weight row's dot products with every input row together
    let mut out_t = vec![0f32; w.out() * rows];
    out_t
        .par_chunks_mut(COLUMNS_PER_TASK * rows)
        .enumerate()
        .for_each(|(task, chunk)| {
            for (j, col) in chunk.chunks_mut(rows).enumerate() {
                for (dst, group) in col.chunks_mut(ROWS_AT_ONCE).zip(xs.chunks(ROWS_AT_ONCE)) {
                    w.dot_rows(task * COLUMNS_PER_TASK + j, group, dst);
                }
            }
        });
    for (c, col) in out_t.chunks(rows).enumerate() {
        for (r, v) in col.iter().enumerate() {
            out[r * w.out() + c] = *v;
        }
    }
    Ok(())
}

/// A weight matrix `[out, in]` in 8 bits, row by row.
pub struct Q8Matrix {
    out: usize,
    w: Rows,
}

impl Q8Matrix {
    /// Encodes `values`, `out` rows of `width` (a multiple of 32) each.
    pub fn new(values: &[f32], width: usize) -> Result<Q8Matrix> {
        if !whole_rows(values.len(), width) {
            candle_core::bail!(
                "an 8-bit matrix needs rows of a multiple of {BLOCK} values, not {width}"
            );
        }
        Ok(Q8Matrix {
            out: values.len() / width,
            w: Rows::encode(values, width),
        })
    }
}

impl BlockMatrix for Q8Matrix {
    fn out(&self) -> usize {
        self.out
    }

    fn width(&self) -> usize {
        self.w.width
    }

    fn dot_rows(&self, col: usize, xs: &[ActRow<'_>], dst: &mut [f32]) {
        dot_rows(self.w.row(col), xs, dst)
    }
}

/// `dst[r] = w · xs[r]` for up to [`ROWS_AT_ONCE`] rows, each weight block loaded once.
fn dot_rows(w: (&[i8], &[f32]), xs: &[ActRow<'_>], dst: &mut [f32]) {
    #[cfg(target_feature = "avx2")]
    {
        fn fill<const R: usize>(w: (&[i8], &[f32]), xs: &[ActRow<'_>], dst: &mut [f32]) {
            let Some(first) = xs.first() else {
                return;
            };
            let mut group = [*first; R];
            for (slot, x) in group.iter_mut().zip(xs) {
                *slot = *x;
            }
            for (d, v) in dst.iter_mut().zip(avx2::dot(w, group)) {
                *d = v;
            }
        }
        match xs.len() {
            0 => {}
            1 => fill::<1>(w, xs, dst),
            2 => fill::<2>(w, xs, dst),
            3 => fill::<3>(w, xs, dst),
            _ => fill::<ROWS_AT_ONCE>(w, xs, dst),
        }
    }
    #[cfg(not(target_feature = "avx2"))]
    for (d, x) in dst.iter_mut().zip(xs) {
        *d = dot_scalar(w, *x);
    }
}

/// One row's dot product, block by block: exact integer sums times both scales (the
/// definition the SIMD kernel is tested against, and the kernel of builds without AVX2).
#[cfg_attr(target_feature = "avx2", allow(dead_code))]
fn dot_scalar((wq, wd): (&[i8], &[f32]), x: ActRow<'_>) -> f32 {
    wq.chunks(BLOCK)
        .zip(x.q.chunks(BLOCK))
        .zip(wd.iter().zip(x.d))
        .map(|((w, x), (dw, dx))| {
            let s: i32 = w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum();
            s as f32 * dw * dx
        })
        .sum()
}

#[cfg(target_feature = "avx2")]
mod avx2 {
    //! The dot products with AVX2: per block, |w| (unsigned) times x with w's sign moved onto
    //! it, summed in pairs to 16 bits (at most 2·127·127, no saturation: values are in
    //! ±127) and to 32 bits, then scaled in f32.

    use super::{ActRow, BLOCK};
    use std::arch::x86_64::*;

    pub fn dot<const R: usize>((wq, wd): (&[i8], &[f32]), xs: [ActRow<'_>; R]) -> [f32; R] {
        let blocks = wd.len();
        let mut out = [0f32; R];
        if wq.len() < blocks * BLOCK
            || xs
                .iter()
                .any(|x| x.q.len() < blocks * BLOCK || x.d.len() < blocks)
        {
            return out;
        }
        // SAFETY: every load reads 32 bytes at `b * 32` for `b < blocks`, inside slices
        // checked above to hold `blocks * 32` values; AVX2 is enabled for the whole build.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..blocks {
                let w = _mm256_loadu_si256(wq.as_ptr().add(b * BLOCK).cast());
                let aw = _mm256_sign_epi8(w, w);
                let dw = *wd.get_unchecked(b);
                for r in 0..R {
                    let x = xs[r];
                    let xq = _mm256_loadu_si256(x.q.as_ptr().add(b * BLOCK).cast());
                    let sx = _mm256_sign_epi8(xq, w);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                    let s = _mm256_set1_ps(dw * *x.d.get_unchecked(b));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r]);
                }
            }
            for (o, v) in out.iter_mut().zip(acc) {
                *o = super::super::simd::hsum(v);
            }
        }
        out
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    pub fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1999) as f32 / 999.5 - 1.0)
            .collect()
    }

    /// `w` (`out × width` f32, row-major) times `x`'s rows, in f64.
    fn reference(w: &[f32], x: &[f32], width: usize) -> Vec<f32> {
        x.chunks(width)
            .flat_map(|xr| {
                w.chunks(width).map(move |wr| {
                    wr.iter()
                        .zip(xr)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>() as f32
                })
            })
            .collect()
    }

    /// A block matrix's product matches the f32 one within `tolerance` of the largest value,
    /// for batches of 1 to 9 rows (groups of every size), and each row of a batch equals
    /// that row multiplied alone, bit for bit.
    pub fn check(m: &impl BlockMatrix, w: &[f32], tolerance: f32) {
        let width = m.width();
        for batch in 1..=9 {
            let x = values(batch * width, batch);
            let act = Act::encode(&x, width).unwrap();
            let mut got = vec![0f32; batch * m.out()];
            multiply(m, &act, &mut got).unwrap();
            let want = reference(w, &x, width);
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(
                err <= tolerance * scale,
                "error {err} against values up to {scale}"
            );
            for (r, together) in got.chunks(m.out()).enumerate() {
                let alone_act = Act::encode(&x[r * width..(r + 1) * width], width).unwrap();
                let mut alone = vec![0f32; m.out()];
                multiply(m, &alone_act, &mut alone).unwrap();
                assert_eq!(alone, together, "row {r} of {batch} differs in a batch");
            }
        }
    }

    #[test]
    fn matches_f32_and_rows_are_independent() {
        let (out, width) = (70, 96);
        let w = values(out * width, 0);
        check(&Q8Matrix::new(&w, width).unwrap(), &w, 0.02);
    }

    /// The SIMD kernel computes what the block-by-block definition does.
    #[test]
    fn the_kernel_agrees_with_the_definition() {
        let width = 160;
        let w = Rows::encode(&values(3 * width, 1), width);
        let x = Act::encode(&values(3 * width, 2), width).unwrap();
        let xs: Vec<_> = (0..3).map(|r| x.row(r)).collect();
        for c in 0..3 {
            let mut got = [0f32; 3];
            dot_rows(w.row(c), &xs, &mut got);
            for (r, g) in got.iter().enumerate() {
                let want = dot_scalar(w.row(c), xs[r]);
                assert!(
                    (g - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn rejects_rows_not_in_whole_blocks() {
        assert!(Q8Matrix::new(&[0.0; 160], 40).is_err());
        assert!(Act::encode(&[0.0; 160], 40).is_err());
        let m = Q8Matrix::new(&[0.0; 128], 64).unwrap();
        let x = Act::encode(&[0.0; 32], 32).unwrap();
        assert!(multiply(&m, &x, &mut [0.0; 2]).is_err());
    }
}
