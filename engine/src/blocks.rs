//! The block-quantized multiplication a decode step spends its time in, shared by the 4-bit
//! ([`super::q4`]) and 8-bit ([`super::q8`]) weight matrices: the activations encoded in 8-bit
//! blocks (32 values, one f32 scale), and each weight row dotted with a group of activation
//! rows while its blocks are in registers.
//!
//! A decode step multiplies a few rows (one per sequence) by every weight matrix, so reading
//! the weights is the cost, and a batch's sequences should share each read. candle's quantized
//! matmul walks the batch's rows outermost, reading the weights once per sequence (measured:
//! eight sequences decoding together ran at 75 tokens/s through it against 85 with f32
//! weights), and converts f16 scales per block; here a group of up to [`ROWS_AT_ONCE`]
//! sequences is set up once per task and each weight row's blocks are read once for all of
//! them, scales kept in f32. With the activations in 8 bits too, a block's dot product is an
//! exact integer sum times the scales. Prefill multiplies other copies ([`super::bf16`]):
//! a chunk's many rows make its matmuls compute-bound, and there these kernels' per-block
//! scaling is slower than plain floating point.
//!
//! CPUs with AVX-512 VNNI multiply the same activations by another layout of the same
//! blocks, sixteen output features at a time ([`super::interleaved`]); these row-by-row
//! kernels (AVX2, or the scalar definition) are for the others.

use crate::{bail, Result};
use rayon::prelude::*;

/// Values per block (one scale each).
pub const BLOCK: usize = 32;

/// Sequences dotted with one weight block while it is in registers.
pub const ROWS_AT_ONCE: usize = 8;

/// Output features per parallel task: small enough to spread a 576-wide projection over the
/// cores, large enough that a task outlasts its scheduling (2 to 16 tasks per matrix measured
/// the same on 2 cores).
const COLUMNS_PER_TASK: usize = 32;

/// Rows of `width` values in 8 bits: `q[i]` ≈ `value[i] / d[i / 32]`.
pub(super) struct Rows {
    pub(super) width: usize,
    pub(super) q: Vec<i8>,
    pub(super) d: Vec<f32>,
}

impl Rows {
    /// Encodes rows of `width` values (a multiple of 32) each.
    pub(super) fn encode(values: &[f32], width: usize) -> Rows {
        let mut q = vec![0i8; values.len()];
        let mut d = vec![0f32; values.len() / BLOCK];
        #[cfg(target_arch = "x86_64")]
        let simd = super::cpu::avx2();
        let encode_block = |(v, (q, d)): (&[f32], (&mut [i8], &mut f32))| {
            #[cfg(target_arch = "x86_64")]
            if let (true, Ok(v), Ok(q)) = (simd, v.try_into(), q.try_into()) {
                // SAFETY: the CPU has AVX2 (checked)
                *d = unsafe { avx2::encode_block(v, q) };
                return;
            }
            let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            *d = amax / 127.0;
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for (q, x) in q.iter_mut().zip(v) {
                *q = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
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
    pub(super) fn row(&self, r: usize) -> (&[i8], &[f32]) {
        let per_row = self.width / BLOCK;
        (
            &self.q[r * self.width..(r + 1) * self.width],
            &self.d[r * per_row..(r + 1) * per_row],
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! One block's encoding eight values at a time: a decode step encodes every matrix's
    //! input (eight sequences × up to 1536 values, 121 times a step), and the scalar loop
    //! (its rounding a library call per value) was ~5 % of an eight-sequence step, on one
    //! core while the other waited.

    use super::BLOCK;
    use std::arch::x86_64::*;

    /// Encodes 32 values into `q` (each `value / d` rounded to the nearest, ties to even, as
    /// the scalar loop does) and returns their scale `d` (the largest magnitude / 127).
    ///
    /// # Safety
    /// The CPU must have the features enabled here (`cpu::avx2`).
    #[target_feature(enable = "avx2")]
    pub fn encode_block(v: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> f32 {
        // SAFETY: loads read 8 floats at 0, 8, 16, 24 of `v` (32 values), the store writes
        // 32 bytes at `q`
        unsafe {
            let x: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(v.as_ptr().add(8 * i)));
            let sign = _mm256_set1_ps(-0.0);
            let abs = |x: __m256| _mm256_andnot_ps(sign, x);
            let a = _mm256_max_ps(
                _mm256_max_ps(abs(x[0]), abs(x[1])),
                _mm256_max_ps(abs(x[2]), abs(x[3])),
            );
            let h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h)));
            let inv = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
            let (lo, hi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
            // the conversion rounds to nearest, ties to even (the default rounding mode)
            let i: [__m256i; 4] = std::array::from_fn(|k| {
                let n = _mm256_cvtps_epi32(_mm256_mul_ps(x[k], inv));
                _mm256_max_epi32(lo, _mm256_min_epi32(hi, n))
            });
            // packing works within 128-bit lanes: dwords come out as [0a 1a 2a 3a 0b 1b 2b 3b]
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            _mm256_storeu_si256(
                q.as_mut_ptr().cast(),
                _mm256_permutevar8x32_epi32(packed, order),
            );
            amax / 127.0
        }
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
    /// Each block's integer sum (Σ values, without the scale).
    pub sum: &'a [i32],
}

impl ActRow<'_> {
    /// Whether this row holds `blocks` blocks: values, scales and sums.
    pub fn whole(&self, blocks: usize) -> bool {
        self.q.len() >= blocks * BLOCK
            && self.d.len() >= blocks
            && self.s.len() >= blocks
            && self.sum.len() >= blocks
    }
}

/// A batch's activation rows (`rows × width`, row-major) in 8 bits, ready to multiply.
pub struct Act {
    rows: usize,
    x: Rows,
    s: Vec<f32>,
    sum: Vec<i32>,
}

impl Act {
    /// Encodes `values` (rows of `width`, a multiple of 32).
    pub fn encode(values: &[f32], width: usize) -> Result<Act> {
        if !whole_rows(values.len(), width) {
            bail!(
                "{} values in rows of {width}, which must be a multiple of {BLOCK}",
                values.len()
            );
        }
        let x = Rows::encode(values, width);
        let sum: Vec<i32> =
            x.q.chunks(BLOCK)
                .map(|q| q.iter().map(|&v| v as i32).sum())
                .collect();
        let s = sum.iter().zip(&x.d).map(|(&n, d)| d * n as f32).collect();
        Ok(Act {
            rows: values.len() / width,
            x,
            s,
            sum,
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
            sum: &self.sum[r * per_row..(r + 1) * per_row],
        }
    }
}

/// A weight matrix `[out, in]` in some block encoding, as [`multiply`] reads it.
pub trait BlockMatrix: Sync {
    /// One of its rows, as a kernel reads it.
    type Row<'a>: RowKernel
    where
        Self: 'a;
    /// Output features (rows of the matrix).
    fn out(&self) -> usize;
    /// Input features (a multiple of [`BLOCK`]).
    fn width(&self) -> usize;
    fn row(&self, col: usize) -> Self::Row<'_>;
}

/// One weight row's dot products with a group of activation rows, each of its blocks read
/// once for the group. Every row must go through the same arithmetic in the same order
/// whatever the group's size, so that a sequence's numbers do not depend on what it is
/// batched with.
pub trait RowKernel {
    /// Whether this row's blocks and every activation row's are there to read.
    fn readable(&self, xs: &[ActRow<'_>]) -> bool;

    /// One activation row's dot product, block by block: the definition the SIMD kernels are
    /// tested against, and the kernel of builds without AVX2.
    fn dot_scalar(&self, x: ActRow<'_>) -> f32;

    /// The products with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA (`cpu::avx2`).
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_avx2<const R: usize>(&self, xs: &[ActRow<'_>; R]) -> [f32; R];

    /// The products through the best kernel this CPU runs (one choice per process).
    fn dot<const R: usize>(&self, xs: &[ActRow<'_>; R]) -> [f32; R] {
        #[cfg(target_arch = "x86_64")]
        if super::cpu::avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked)
            return unsafe { self.dot_avx2(xs) };
        }
        std::array::from_fn(|r| self.dot_scalar(xs[r]))
    }
}

/// `out = x · Wᵀ`, row-major `[x.rows(), w.out()]`; the matrix's rows are spread over the cores,
/// and each is dotted with a group of activation rows while its blocks are in registers.
pub fn multiply<M: BlockMatrix>(w: &M, x: &Act, out: &mut [f32]) -> Result<()> {
    let rows = x.rows();
    if x.width() != w.width() || out.len() != rows * w.out() {
        bail!(
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
            let first = task * COLUMNS_PER_TASK;
            for (g, group) in xs.chunks(ROWS_AT_ONCE).enumerate() {
                let row0 = g * ROWS_AT_ONCE;
                match group.len() {
                    1 => columns::<1, M>(w, first, group, row0, rows, chunk),
                    2 => columns::<2, M>(w, first, group, row0, rows, chunk),
                    3 => columns::<3, M>(w, first, group, row0, rows, chunk),
                    4 => columns::<4, M>(w, first, group, row0, rows, chunk),
                    5 => columns::<5, M>(w, first, group, row0, rows, chunk),
                    6 => columns::<6, M>(w, first, group, row0, rows, chunk),
                    7 => columns::<7, M>(w, first, group, row0, rows, chunk),
                    _ => columns::<ROWS_AT_ONCE, M>(w, first, group, row0, rows, chunk),
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

/// For the columns from `first` that `chunk` (column-major, `rows` per column) holds, the
/// products with `group`, activation rows `row0..`, `R` of them (the kernel instance for the
/// group's size, set up once for all the columns).
fn columns<const R: usize, M: BlockMatrix>(
    w: &M,
    first: usize,
    group: &[ActRow<'_>],
    row0: usize,
    rows: usize,
    chunk: &mut [f32],
) {
    let Some(x0) = group.first() else {
        return;
    };
    let mut xs = [*x0; R];
    for (slot, x) in xs.iter_mut().zip(group) {
        *slot = *x;
    }
    for (j, col) in chunk.chunks_mut(rows).enumerate() {
        let sums = w.row(first + j).dot(&xs);
        for (d, v) in col[row0..].iter_mut().zip(sums) {
            *d = v;
        }
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
    pub fn reference(w: &[f32], x: &[f32], width: usize) -> Vec<f32> {
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
        let batches: Vec<usize> = (1..=9).collect();
        let mul = |x: &Act, out: &mut [f32]| multiply(m, x, out).unwrap();
        check_product(
            m.out(),
            m.width(),
            &batches,
            w,
            tolerance,
            mul,
            |_, _, _| {},
        );
    }

    /// The checks of [`check`] for any multiplication `mul` of `out × width` weights `w`,
    /// with `batches` rows; `each(batch, r, outputs)` checks row `r`'s outputs further.
    pub fn check_product(
        out: usize,
        width: usize,
        batches: &[usize],
        w: &[f32],
        tolerance: f32,
        mul: impl Fn(&Act, &mut [f32]),
        each: impl Fn(&Act, usize, &[f32]),
    ) {
        for &batch in batches {
            let x = values(batch * width, batch);
            let act = Act::encode(&x, width).unwrap();
            let mut got = vec![0f32; batch * out];
            mul(&act, &mut got);
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
            for (r, together) in got.chunks(out).enumerate() {
                let alone_act = Act::encode(&x[r * width..(r + 1) * width], width).unwrap();
                let mut alone = vec![0f32; out];
                mul(&alone_act, &mut alone);
                assert_eq!(alone, together, "row {r} of {batch} differs in a batch");
                each(&act, r, together);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_block_encoding_agrees_with_the_scalar_loop() {
        if !super::super::cpu::avx2() {
            println!("AVX2 encoding not run: this CPU lacks AVX2 (or ENGINE_KERNELS caps it)");
            return;
        }
        let mut v = values(32 * 40, 5);
        // a block whose values land on ties (x · 127 / 2 = k + 0.5) and one of zeros
        for (i, x) in v[..32].iter_mut().enumerate() {
            *x = (i as f32 - 16.0) / 127.0 * 2.0 + 1.0 / 127.0;
        }
        v[0] = 2.0;
        v[32..64].fill(0.0);
        for (b, block) in v.chunks(32).enumerate() {
            let mut q = [0i8; 32];
            // SAFETY: the CPU has AVX2 (checked above)
            let d = unsafe { avx2::encode_block(block.try_into().unwrap(), &mut q) };
            let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert_eq!(d, amax / 127.0, "block {b}");
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for (k, x) in block.iter().enumerate() {
                let want = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                assert_eq!(q[k], want, "block {b} value {k}: {x}");
            }
        }
    }

    #[test]
    fn rejects_rows_not_in_whole_blocks() {
        assert!(Act::encode(&[0.0; 160], 40).is_err());
        assert!(Act::encode(&[0.0; 100], 32).is_err());
        assert!(!whole_rows(96, 0));
    }
}
