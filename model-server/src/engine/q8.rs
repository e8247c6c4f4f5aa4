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
pub const ROWS_AT_ONCE: usize = 8;

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
    /// Per pair of blocks `a, b`, the lanes a 16-lane kernel multiplies by: `d[a]` ×8,
    /// `d[b]` ×8, `s[a]/8` ×8, `s[b]/8` ×8 (empty when a row is not whole pairs).
    pub wide: &'a [f32],
    /// The values plus 128, unsigned, for kernels whose instruction multiplies unsigned by
    /// signed bytes (empty when a row is not whole pairs).
    pub unsigned: &'a [u8],
}

/// Floats of [`ActRow::wide`] per pair of blocks.
pub const WIDE: usize = 32;

/// A batch's activation rows (`rows × width`, row-major) in 8 bits, ready to multiply.
pub struct Act {
    rows: usize,
    x: Rows,
    s: Vec<f32>,
    wide: Vec<f32>,
    unsigned: Vec<u8>,
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
        let s: Vec<f32> =
            x.q.chunks(BLOCK)
                .zip(&x.d)
                .map(|(q, d)| d * q.iter().map(|&v| v as i32).sum::<i32>() as f32)
                .collect();
        let (wide, unsigned) = if width.is_multiple_of(2 * BLOCK) {
            let wide =
                x.d.chunks(2)
                    .zip(s.chunks(2))
                    .flat_map(|(d, s)| {
                        let lanes = [d[0], d[1], s[0] / 8.0, s[1] / 8.0];
                        lanes.into_iter().flat_map(|v| [v; 8])
                    })
                    .collect();
            (wide, x.q.iter().map(|&v| (v as u8) ^ 0x80).collect())
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Act {
            rows: values.len() / width,
            x,
            s,
            wide,
            unsigned,
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
        let (width, wide) = (self.x.width, per_row / 2 * WIDE);
        ActRow {
            q,
            d,
            s: &self.s[r * per_row..(r + 1) * per_row],
            wide: self.wide.get(r * wide..(r + 1) * wide).unwrap_or(&[]),
            unsigned: self.unsigned.get(r * width..(r + 1) * width).unwrap_or(&[]),
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
    fn dot<const R: usize>(&self, xs: &[ActRow<'_>; R]) -> [f32; R];
}

/// `out = x · Wᵀ`, row-major `[x.rows(), w.out()]`; the matrix's rows are spread over the cores,
/// and each is dotted with a group of activation rows while its blocks are in registers.
pub fn multiply<M: BlockMatrix>(w: &M, x: &Act, out: &mut [f32]) -> Result<()> {
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
            let first = task * COLUMNS_PER_TASK;
            for (g, group) in xs.chunks(ROWS_AT_ONCE).enumerate() {
                columns(w, first, group, g * ROWS_AT_ONCE, rows, chunk);
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
/// products with `group`, activation rows `row0..` (the kernel instance for the group's
/// size, set up once for all the columns).
fn columns<M: BlockMatrix>(
    w: &M,
    first: usize,
    group: &[ActRow<'_>],
    row0: usize,
    rows: usize,
    chunk: &mut [f32],
) {
    fn run<const R: usize, M: BlockMatrix>(
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
    match group.len() {
        0 => {}
        1 => run::<1, M>(w, first, group, row0, rows, chunk),
        2 => run::<2, M>(w, first, group, row0, rows, chunk),
        3 => run::<3, M>(w, first, group, row0, rows, chunk),
        4 => run::<4, M>(w, first, group, row0, rows, chunk),
        5 => run::<5, M>(w, first, group, row0, rows, chunk),
        6 => run::<6, M>(w, first, group, row0, rows, chunk),
        7 => run::<7, M>(w, first, group, row0, rows, chunk),
        _ => run::<ROWS_AT_ONCE, M>(w, first, group, row0, rows, chunk),
    }
}

/// A weight matrix `[out, in]` in 8 bits, row by row.
pub struct Q8Matrix {
    out: usize,
    w: Rows,
    /// Per block, 16 × its scale × the sum of its values: what a 16-lane kernel that reads
    /// the activations as unsigned (plus 128) subtracts per lane, times the activations'
    /// scale.
    correction: Vec<f32>,
}

impl Q8Matrix {
    /// Encodes `values`, `out` rows of `width` (a multiple of 32) each.
    pub fn new(values: &[f32], width: usize) -> Result<Q8Matrix> {
        if !whole_rows(values.len(), width) {
            candle_core::bail!(
                "an 8-bit matrix needs rows of a multiple of {BLOCK} values, not {width}"
            );
        }
        let w = Rows::encode(values, width);
        let correction =
            w.q.chunks(BLOCK)
                .zip(&w.d)
                .map(|(q, d)| 16.0 * d * q.iter().map(|&v| v as i32).sum::<i32>() as f32)
                .collect();
        Ok(Q8Matrix {
            out: values.len() / width,
            w,
            correction,
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
        let per_row = self.w.width / BLOCK;
        let correction = &self.correction[col * per_row..(col + 1) * per_row];
        Q8Row { q, d, correction }
    }
}

/// One row of a [`Q8Matrix`].
pub struct Q8Row<'a> {
    q: &'a [i8],
    d: &'a [f32],
    correction: &'a [f32],
}

impl RowKernel for Q8Row<'_> {
    fn dot<const R: usize>(&self, xs: &[ActRow<'_>; R]) -> [f32; R] {
        #[cfg(target_feature = "avx2")]
        {
            if super::simd::avx512_vnni() && self.readable(xs, true) {
                // SAFETY: the CPU has the features (checked above), the rows are whole
                unsafe { avx512::dot(self, xs) }
            } else {
                avx2::dot(self, xs)
            }
        }
        #[cfg(not(target_feature = "avx2"))]
        std::array::from_fn(|r| self.dot_scalar(xs[r]))
    }
}

impl Q8Row<'_> {
    /// Whether the blocks of this row and of every activation row are there to read (and
    /// for a 16-lane kernel, whole pairs with their wide lanes).
    #[cfg_attr(not(target_feature = "avx2"), allow(dead_code))]
    fn readable(&self, xs: &[ActRow<'_>], wide: bool) -> bool {
        let blocks = self.d.len();
        self.q.len() >= blocks * BLOCK
            && self.correction.len() >= blocks
            && (!wide || blocks.is_multiple_of(2))
            && xs.iter().all(|x| {
                x.q.len() >= blocks * BLOCK
                    && x.d.len() >= blocks
                    && (!wide
                        || (x.wide.len() >= blocks / 2 * WIDE
                            && x.unsigned.len() >= blocks * BLOCK))
            })
    }

    /// One row's dot product, block by block: exact integer sums times both scales (the
    /// definition the SIMD kernels are tested against, and the kernel of builds without
    /// AVX2).
    #[cfg_attr(target_feature = "avx2", allow(dead_code))]
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
}

#[cfg(target_feature = "avx2")]
mod avx2 {
    //! The dot products with AVX2: per block, |w| (unsigned) times x with w's sign moved onto
    //! it, summed in pairs to 16 bits (at most 2·127·127, no saturation: values are in
    //! ±127) and to 32 bits, then scaled in f32.

    use super::{ActRow, Q8Row, BLOCK};
    use std::arch::x86_64::*;

    pub fn dot<const R: usize>(w: &Q8Row<'_>, xs: &[ActRow<'_>; R]) -> [f32; R] {
        let mut out = [0f32; R];
        if !w.readable(xs, false) {
            return out;
        }
        // SAFETY: every load reads 32 bytes at `b * 32` for `b < blocks`, inside slices
        // checked above to hold `blocks * 32` values; AVX2 is enabled for the whole build.
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

#[cfg(target_feature = "avx2")]
mod avx512 {
    //! Sixteen lanes at a time where the CPU has AVX-512 with VNNI (checked at run time; the
    //! build targets AVX2): a pair of blocks' 64 weights against a row's 64 activations in
    //! one multiply-and-sum instruction, which multiplies unsigned by signed bytes, so the
    //! activations are read plus 128 ([`ActRow::unsigned`]) and 128 × the weights' sum is
    //! taken off again ([`super::Q8Matrix`]'s correction).

    use super::{ActRow, Q8Row, BLOCK, WIDE};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI, and `w.readable(&xs, true)`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dot<const R: usize>(w: &Q8Row<'_>, xs: &[ActRow<'_>; R]) -> [f32; R] {
        let mut out = [0f32; R];
        // SAFETY: loads read 64 bytes at `p * 64` of the weights and of each row's unsigned
        // values and 16 floats at `p * 32` of its wide lanes, for pairs `p` inside slices the
        // caller checked.
        unsafe {
            let zero = _mm512_setzero_si512();
            let mut acc = [_mm512_setzero_ps(); R];
            for pair in 0..w.d.len() / 2 {
                let (b0, b1) = (2 * pair, 2 * pair + 1);
                let wq = _mm512_loadu_si512(w.q.as_ptr().add(b0 * BLOCK).cast());
                let lanes = |v: &[f32]| {
                    _mm512_mask_blend_ps(
                        0xFF00,
                        _mm512_set1_ps(*v.get_unchecked(b0)),
                        _mm512_set1_ps(*v.get_unchecked(b1)),
                    )
                };
                let (dw, correction) = (lanes(w.d), lanes(w.correction));
                for r in 0..R {
                    let x = xs[r];
                    let xu = _mm512_loadu_si512(x.unsigned.as_ptr().add(b0 * BLOCK).cast());
                    let sums = _mm512_dpbusd_epi32(zero, xu, wq);
                    let dx = _mm512_loadu_ps(x.wide.as_ptr().add(pair * WIDE));
                    let scale = _mm512_mul_ps(dw, dx);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[r]);
                    acc[r] = _mm512_fnmadd_ps(correction, dx, acc[r]);
                }
            }
            for (o, v) in out.iter_mut().zip(acc) {
                *o = _mm512_reduce_add_ps(v);
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

    /// The SIMD kernels compute what the block-by-block definition does (the AVX-512 one on
    /// CPUs that have it).
    #[cfg(target_feature = "avx2")]
    #[test]
    fn the_kernels_agree_with_the_definition() {
        let width = 192;
        let m = Q8Matrix::new(&values(3 * width, 1), width).unwrap();
        let x = Act::encode(&values(3 * width, 2), width).unwrap();
        let group = [x.row(0), x.row(1), x.row(2)];
        for c in 0..3 {
            let row = m.row(c);
            let avx2 = avx2::dot(&row, &group);
            let avx512 =
                (super::super::simd::avx512_vnni() && row.readable(&group, true)).then(|| {
                    // SAFETY: the CPU has the features, the rows are whole pairs (checked)
                    unsafe { avx512::dot(&row, &group) }
                });
            for (r, x) in group.iter().enumerate() {
                let want = row.dot_scalar(*x);
                let close = |g: f32| (g - want).abs() <= 1e-4 * want.abs().max(1.0);
                assert!(close(avx2[r]), "{} vs {want}", avx2[r]);
                if let Some(got) = avx512 {
                    assert!(close(got[r]), "{} vs {want}", got[r]);
                }
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
