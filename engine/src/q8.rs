//! Decode-step weight matrices in 8 bits (blocks of 32 values sharing one f32 scale, as GGML's
//! Q8_0), for matrices the GGUF holds in 8 bits: SmolLM2's token embedding, which is also its
//! output projection. Re-encoding the file's Q8_0 values lands each block's 255 levels on the
//! same grid. Multiplied through [`super::blocks::multiply`].

use super::blocks::{whole_rows, ActRow, BlockMatrix, RowKernel, Rows, BLOCK};
use crate::{bail, Result};

/// A weight matrix `[out, in]` in 8 bits, row by row.
pub struct Q8Matrix {
    out: usize,
    w: Rows,
}

impl Q8Matrix {
    /// Encodes `values`, `out` rows of `width` (a multiple of 32) each.
    pub fn new(values: &[f32], width: usize) -> Result<Q8Matrix> {
        if !whole_rows(values.len(), width) {
            bail!("an 8-bit matrix needs rows of a multiple of {BLOCK} values, not {width}");
        }
        Ok(Q8Matrix {
            out: values.len() / width,
            w: Rows::encode(values, width),
        })
    }
}

impl BlockMatrix for Q8Matrix {
    type Row<'a> = Q8Row<'a>;

    fn out(&self) -> usize {
        self.out
    }

    fn width(&self) -> usize {
        self.w.width
    }

    fn row(&self, col: usize) -> Q8Row<'_> {
        let (q, d) = self.w.row(col);
        Q8Row { q, d }
    }
}

/// One row of a [`Q8Matrix`].
pub struct Q8Row<'a> {
    q: &'a [i8],
    d: &'a [f32],
}

impl RowKernel for Q8Row<'_> {
    /// Whether the blocks of this row and of every activation row are there to read.
    fn readable(&self, xs: &[ActRow<'_>]) -> bool {
        let blocks = self.d.len();
        self.q.len() >= blocks * BLOCK
            && xs
                .iter()
                .all(|x| x.q.len() >= blocks * BLOCK && x.d.len() >= blocks)
    }

    /// Exact integer sums per block times both scales.
    fn dot_scalar(&self, x: ActRow<'_>) -> f32 {
        self.q
            .chunks(BLOCK)
            .zip(x.q.chunks(BLOCK))
            .zip(self.d.iter().zip(x.d))
            .map(|((w, x), (dw, dx))| {
                let s: i32 = w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum();
                s as f32 * dw * dx
            })
            .sum()
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_avx2<const R: usize>(&self, xs: &[ActRow<'_>; R]) -> [f32; R] {
        avx2::dot(self, xs)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The dot products with AVX2: per block, |w| (unsigned) times x with w's sign moved onto
    //! it, summed in pairs to 16 bits (at most 2·127·127, no saturation: values are in
    //! ±127) and to 32 bits, then scaled in f32.

    use super::{ActRow, Q8Row, RowKernel, BLOCK};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub fn dot<const R: usize>(w: &Q8Row<'_>, xs: &[ActRow<'_>; R]) -> [f32; R] {
        let mut out = [0f32; R];
        if !w.readable(xs) {
            return out;
        }
        // SAFETY: every load reads 32 bytes at `b * 32` for `b < blocks`, inside slices
        // checked above to hold `blocks * 32` values.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..w.d.len() {
                let wq = _mm256_loadu_si256(w.q.as_ptr().add(b * BLOCK).cast());
                let aw = _mm256_sign_epi8(wq, wq);
                let dw = *w.d.get_unchecked(b);
                for r in 0..R {
                    let x = xs[r];
                    let xq = _mm256_loadu_si256(x.q.as_ptr().add(b * BLOCK).cast());
                    let sx = _mm256_sign_epi8(xq, wq);
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
mod tests {
    use super::super::blocks::tests::{check, values};
    use super::super::blocks::{multiply, Act};
    use super::*;

    #[test]
    fn matches_f32_and_rows_are_independent() {
        let (out, width) = (70, 96);
        let w = values(out * width, 0);
        check(&Q8Matrix::new(&w, width).unwrap(), &w, 0.02);
    }

    /// The SIMD kernel computes what the block-by-block definition does (where the CPU has
    /// AVX2; said when it has not).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_kernels_agree_with_the_definition() {
        if !super::super::cpu::avx2() {
            println!("AVX2 kernel not run: this CPU lacks AVX2/FMA (or ENGINE_KERNELS caps it)");
            return;
        }
        let width = 192;
        let m = Q8Matrix::new(&values(3 * width, 1), width).unwrap();
        let x = Act::encode(&values(3 * width, 2), width).unwrap();
        let group = [x.row(0), x.row(1), x.row(2)];
        for c in 0..3 {
            let row = m.row(c);
            // SAFETY: the CPU has AVX2 and FMA (checked above)
            let avx2 = unsafe { avx2::dot(&row, &group) };
            for (r, x) in group.iter().enumerate() {
                let want = row.dot_scalar(*x);
                let close = |g: f32| (g - want).abs() <= 1e-4 * want.abs().max(1.0);
                assert!(close(avx2[r]), "{} vs {want}", avx2[r]);
            }
        }
    }

    #[test]
    fn rejects_rows_not_in_whole_blocks() {
        assert!(Q8Matrix::new(&[0.0; 160], 40).is_err());
        let m = Q8Matrix::new(&[0.0; 128], 64).unwrap();
        let x = Act::encode(&[0.0; 32], 32).unwrap();
        assert!(multiply(&m, &x, &mut [0.0; 2]).is_err());
    }
}
