//! The decode step's weight matrices in 8 bits (blocks of 32 values sharing one f32 scale, as
//! GGML's Q8_0), multiplied so that each weight block is read once for the whole batch.
//!
//! A decode step's cost is reading the weights: at f32 that is ~0.5 GB per step for
//! SmolLM2-135M, about 18 steps/s on this machine's memory. Re-encoding the GGUF's 4-bit
//! values (Q4_1) in 8 bits is nearly exact (each block's 16 levels land on a 255-level grid)
//! and reads a quarter of the bytes. The activations are encoded the same way per step, so a
//! block's dot product is exact integer arithmetic times two scales.
//!
//! Why not candle's quantized matmul, which has the same arithmetic: it walks the batch's rows
//! outermost, so eight sequences read the weights eight times (measured: 8 sequences decoding
//! together ran at 75 tokens/s through it against 85 with f32 weights), and each dot product
//! converts f16 scales per block. Here each weight block is loaded once and dotted with up to
//! [`ROWS_AT_ONCE`] sequences' blocks while in registers, with scales kept in f32. Prefill
//! stays on f32 weights, where a chunk's many rows make the matmul compute-bound and candle's
//! f32 gemm is fastest.

use candle_core::{Device, Result, Tensor};
use rayon::prelude::*;

/// Values per block (one scale each).
pub const BLOCK: usize = 32;

/// Sequences dotted with one weight block while it is in registers.
const ROWS_AT_ONCE: usize = 4;

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

/// A weight matrix `[out, in]` in 8 bits, row by row.
pub struct Q8Matrix {
    out: usize,
    w: Rows,
}

impl Q8Matrix {
    /// Encodes an f32 matrix `[out, in]`; `in` must be a multiple of 32.
    pub fn new(w: &Tensor) -> Result<Q8Matrix> {
        let (out, inp) = w.dims2()?;
        if inp % BLOCK != 0 {
            candle_core::bail!(
                "an 8-bit matrix needs rows of a multiple of {BLOCK} values, not {inp}"
            );
        }
        let values = w.flatten_all()?.to_vec1::<f32>()?;
        Ok(Q8Matrix {
            out,
            w: Rows::encode(&values, inp),
        })
    }

    /// `x · Wᵀ` for `x` of shape `[.., in]`, f32, shaped `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let Some((&inp, lead)) = dims.split_last() else {
            candle_core::bail!("a scalar input");
        };
        if inp != self.w.width {
            candle_core::bail!("input of {inp} features for a matrix of {}", self.w.width);
        }
        let rows: usize = lead.iter().product();
        let xs = Rows::encode(&x.flatten_all()?.to_vec1::<f32>()?, inp);
        let xs: Vec<(&[i8], &[f32])> = (0..rows).map(|r| xs.row(r)).collect();
        // column-major result: each weight row's dot products with every input row together
        let mut out_t = vec![0f32; self.out * rows];
        out_t
            .par_chunks_mut(COLUMNS_PER_TASK * rows)
            .enumerate()
            .for_each(|(task, chunk)| {
                for (j, col) in chunk.chunks_mut(rows).enumerate() {
                    let w = self.w.row(task * COLUMNS_PER_TASK + j);
                    for (dst, group) in col.chunks_mut(ROWS_AT_ONCE).zip(xs.chunks(ROWS_AT_ONCE)) {
                        dot_rows(w, group, dst);
                    }
                }
            });
        let mut shape = lead.to_vec();
        shape.push(self.out);
        Tensor::from_vec(out_t, (self.out, rows), &Device::Cpu)?
            .t()?
            .contiguous()?
            .reshape(shape)
    }
}

/// `dst[r] = w · xs[r]` for up to [`ROWS_AT_ONCE`] rows, each weight block loaded once.
/// Every row goes through the same arithmetic in the same order whatever the group's size,
/// so a row's result does not depend on what it is batched with.
fn dot_rows(w: (&[i8], &[f32]), xs: &[(&[i8], &[f32])], dst: &mut [f32]) {
    #[cfg(target_feature = "avx2")]
    {
        fn fill<const R: usize>(w: (&[i8], &[f32]), xs: &[(&[i8], &[f32])], dst: &mut [f32]) {
            let mut group = [w; R];
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
fn dot_scalar((wq, wd): (&[i8], &[f32]), (xq, xd): (&[i8], &[f32])) -> f32 {
    wq.chunks(BLOCK)
        .zip(xq.chunks(BLOCK))
        .zip(wd.iter().zip(xd))
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

    use super::BLOCK;
    use std::arch::x86_64::*;

    pub fn dot<const R: usize>((wq, wd): (&[i8], &[f32]), xs: [(&[i8], &[f32]); R]) -> [f32; R] {
        let blocks = wd.len();
        let mut out = [0f32; R];
        if wq.len() < blocks * BLOCK
            || xs
                .iter()
                .any(|(q, d)| q.len() < blocks * BLOCK || d.len() < blocks)
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
                    let (xq, xd) = xs[r];
                    let x = _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK).cast());
                    let sx = _mm256_sign_epi8(x, w);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                    let s = _mm256_set1_ps(dw * *xd.get_unchecked(b));
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
mod tests {
    use super::*;

    /// The 8-bit product matches the f32 one within the encoding's error, for one row and
    /// for a batch, and a batch's rows equal each row's alone exactly (batches of 1 to 9, so
    /// groups of every size are covered).
    #[test]
    fn matches_f32_and_rows_are_independent() -> Result<()> {
        let dev = Device::Cpu;
        let (out, inp) = (70, 96);
        let w = Tensor::randn(0f32, 0.1, (out, inp), &dev)?;
        let q = Q8Matrix::new(&w)?;
        for batch in 1..=9 {
            let x = Tensor::randn(0f32, 1.0, (1, batch, inp), &dev)?;
            let got = q.forward(&x)?;
            assert_eq!(got.dims(), &[1, batch, out]);
            let want = x.broadcast_matmul(&w.t()?)?;
            let err = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(
                err < 0.02 * scale,
                "error {err} against values up to {scale}"
            );
            for r in 0..batch {
                let alone = q.forward(&x.narrow(1, r, 1)?)?;
                let together = got.narrow(1, r, 1)?;
                let diff = (&alone - &together)?.abs()?.max_all()?.to_scalar::<f32>()?;
                assert_eq!(diff, 0.0, "row {r} of {batch} differs in a batch");
            }
        }
        Ok(())
    }

    /// The SIMD kernel computes what the block-by-block definition does.
    #[test]
    fn the_kernel_agrees_with_the_definition() -> Result<()> {
        let dev = Device::Cpu;
        let w = Rows::encode(&Tensor::randn(0f32, 1.0, 3 * 160, &dev)?.to_vec1()?, 160);
        let x = Rows::encode(&Tensor::randn(0f32, 1.0, 3 * 160, &dev)?.to_vec1()?, 160);
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
        Ok(())
    }

    #[test]
    fn rejects_rows_not_in_whole_blocks() {
        let w = Tensor::zeros((4, 40), candle_core::DType::F32, &Device::Cpu);
        assert!(w.and_then(|w| Q8Matrix::new(&w)).is_err());
    }
}
