//! Decode-step weight matrices laid out sixteen output features at a time, for CPUs with
//! AVX-512 VNNI: one multiply-and-sum instruction then adds four values' products for sixteen
//! features at once, against four activation values broadcast from memory.
//!
//! Why: the row-by-row kernels ([`super::q4`], [`super::q8`]) spend six instructions per 64
//! products per activation row (load the row's values, multiply-and-sum, load its scales,
//! scale, convert, add), so with eight sequences in a step the 4-bit matrices took ~15 ms of a
//! ~31 ms step, bound by instructions rather than by reading the weights. Here a block of 32
//! values of 16 features is unpacked into eight registers once and each activation row costs
//! eight multiply-and-sums (memory-broadcast operands) plus one conversion and two scalings
//! for 512 products; the results come out as 16 features of a row, already in the row-major
//! order the caller wants. This is the layout llama.cpp's repacked CPU kernels use too.
//!
//! Both encodings of the GGUF's matrices fit it: 4-bit blocks (`m + d·q`, `q` in 0..15, as
//! [`super::q4`] finds them) and 8-bit blocks (`d·q`, `q` in ±127, stored plus 128 because the
//! instruction multiplies unsigned by signed bytes; 128 × the activation block's integer sum
//! is taken off again before scaling, so the block's sum stays exact).
//!
//! Each output is computed from its own activation row only, in the same order whatever else
//! is in the batch, so a sequence's numbers do not depend on what it is decoded with; the
//! block-by-block definition ([`Interleaved::dot_scalar`]) does the same floating-point
//! operations in the same order (fused multiply-adds), so the kernel is tested against it bit
//! for bit.

use super::blocks::{whole_rows, Act, ActRow, Rows, BLOCK, ROWS_AT_ONCE};
use super::q4::encode_block;
use crate::{bail, Result};
use rayon::prelude::*;

/// Output features per group: one 16-lane register of results.
pub const FEATURES: usize = 16;

/// Groups of features per parallel task (64 features: a 576-wide projection is 9 tasks; 2 to
/// 16 tasks per matrix measured the same on 2 cores for the row-by-row kernels).
const GROUPS_PER_TASK: usize = 4;

/// How a matrix's values are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bits {
    /// `m + d·q`, `q` in 0..15; two values per byte.
    Four,
    /// `d·q`, `q` in ±127; one byte per value, stored as `q + 128`.
    Eight,
}

impl Bits {
    /// Bytes of one block of [`FEATURES`] features.
    fn bytes(self) -> usize {
        match self {
            Bits::Four => FEATURES * BLOCK / 2,
            Bits::Eight => FEATURES * BLOCK,
        }
    }
}

/// A weight matrix `[out, in]` in groups of [`FEATURES`] output features: per group, per block
/// of 32 inputs, the 16 features' values interleaved four at a time (feature `f`'s values
/// `4i..4i + 4` at bytes `64i + 4f..`), then their 16 scales and (4-bit) 16 offsets.
pub struct Interleaved {
    out: usize,
    width: usize,
    bits: Bits,
    qs: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
}

impl Interleaved {
    /// The 4-bit layout of `values` (`out` rows of `width`, a multiple of 32) when each
    /// block's values lie on a 16-level grid from its smallest to its largest value, as the
    /// GGUF's Q4_1 blocks do; `None` otherwise.
    pub fn four_bits(values: &[f32], width: usize) -> Option<Interleaved> {
        if !whole_rows(values.len(), width) {
            return None;
        }
        let (out, blocks) = (values.len() / width, width / BLOCK);
        let groups = out.div_ceil(FEATURES);
        let mut qs = vec![0u8; groups * blocks * Bits::Four.bytes()];
        let mut d = vec![0f32; groups * blocks * FEATURES];
        let mut m = vec![0f32; groups * blocks * FEATURES];
        let exact = qs
            .par_chunks_mut(blocks * Bits::Four.bytes())
            .zip(d.par_chunks_mut(blocks * FEATURES))
            .zip(m.par_chunks_mut(blocks * FEATURES))
            .enumerate()
            .all(|(g, ((qs, d), m))| {
                for f in 0..FEATURES.min(out - g * FEATURES) {
                    let row = &values[(g * FEATURES + f) * width..][..width];
                    for (b, v) in row.chunks(BLOCK).enumerate() {
                        let at = b * FEATURES + f;
                        let Some(q) = encode_block(v, &mut d[at], &mut m[at]) else {
                            return false;
                        };
                        let bytes = &mut qs[b * Bits::Four.bytes()..][..Bits::Four.bytes()];
                        for i in 0..4 {
                            for j in 0..4 {
                                let (lo, hi) = (q[4 * i + j], q[16 + 4 * i + j]);
                                bytes[64 * i + 4 * f + j] = lo | (hi << 4);
                            }
                        }
                    }
                }
                true
            });
        exact.then_some(Interleaved {
            out,
            width,
            bits: Bits::Four,
            qs,
            d,
            m,
        })
    }

    /// The 8-bit layout of `values` (`out` rows of `width`, a multiple of 32): each block
    /// scaled to ±127 (GGML's Q8_0, which a Q8_0 file's values encode back to exactly).
    pub fn eight_bits(values: &[f32], width: usize) -> Result<Interleaved> {
        if !whole_rows(values.len(), width) {
            bail!("an 8-bit matrix needs rows of a multiple of {BLOCK} values, not {width}");
        }
        let (out, blocks) = (values.len() / width, width / BLOCK);
        let groups = out.div_ceil(FEATURES);
        // the rows' 8-bit blocks as the activations are encoded, then laid out
        let rows = Rows::encode(values, width);
        let mut qs = vec![0x80u8; groups * blocks * Bits::Eight.bytes()];
        let mut d = vec![0f32; groups * blocks * FEATURES];
        qs.par_chunks_mut(blocks * Bits::Eight.bytes())
            .zip(d.par_chunks_mut(blocks * FEATURES))
            .enumerate()
            .for_each(|(g, (qs, d))| {
                for f in 0..FEATURES.min(out - g * FEATURES) {
                    let (q, scales) = rows.row(g * FEATURES + f);
                    for (b, (q, &scale)) in q.chunks(BLOCK).zip(scales).enumerate() {
                        d[b * FEATURES + f] = scale;
                        let bytes = &mut qs[b * Bits::Eight.bytes()..][..Bits::Eight.bytes()];
                        for (k, &q) in q.iter().enumerate() {
                            bytes[64 * (k / 4) + 4 * f + k % 4] = (q as u8) ^ 0x80;
                        }
                    }
                }
            });
        Ok(Interleaved {
            out,
            width,
            bits: Bits::Eight,
            qs,
            d,
            m: Vec::new(),
        })
    }

    /// Output features (rows of the matrix).
    pub fn out(&self) -> usize {
        self.out
    }

    /// Bits per value (without the blocks' scales).
    pub fn bits(&self) -> u32 {
        match self.bits {
            Bits::Four => 4,
            Bits::Eight => 8,
        }
    }

    fn blocks(&self) -> usize {
        self.width / BLOCK
    }

    /// Group `g`'s values, scales and offsets (offsets empty for 8 bits).
    fn group(&self, g: usize) -> Group<'_> {
        let blocks = self.blocks();
        let scales = blocks * FEATURES;
        Group {
            bits: self.bits,
            qs: &self.qs[g * blocks * self.bits.bytes()..][..blocks * self.bits.bytes()],
            d: &self.d[g * scales..][..scales],
            m: self.m.get(g * scales..(g + 1) * scales).unwrap_or(&[]),
        }
    }

    /// Feature `f` of group `g` dotted with activation row `x`, block by block: the definition
    /// the kernel is tested against, and the kernel where there is no AVX-512 VNNI.
    fn dot_scalar(&self, g: usize, f: usize, x: &ActRow<'_>) -> f32 {
        let group = self.group(g);
        let mut acc = 0f32;
        for b in 0..self.blocks() {
            let bytes = &group.qs[b * self.bits.bytes()..][..self.bits.bytes()];
            let mut sum = 0i32;
            for k in 0..BLOCK {
                let w = match self.bits {
                    Bits::Four => {
                        let byte = bytes[64 * (k % 16 / 4) + 4 * f + k % 4];
                        (if k < 16 { byte & 15 } else { byte >> 4 }) as i32
                    }
                    Bits::Eight => bytes[64 * (k / 4) + 4 * f + k % 4] as i32,
                };
                sum += w * x.q[b * BLOCK + k] as i32;
            }
            if self.bits == Bits::Eight {
                sum -= x.sum[b] << 7;
            }
            let at = b * FEATURES + f;
            acc = (sum as f32).mul_add(group.d[at] * x.d[b], acc);
            if self.bits == Bits::Four {
                acc = group.m[at].mul_add(x.s[b], acc);
            }
        }
        acc
    }

    /// `out = x · Wᵀ`, row-major `[x.rows(), self.out()]`; groups of features are spread over
    /// the cores, each group's blocks unpacked once for up to [`ROWS_AT_ONCE`] rows.
    pub fn multiply(&self, x: &Act, out: &mut [f32]) -> Result<()> {
        let rows = x.rows();
        if x.width() != self.width || out.len() != rows * self.out {
            bail!(
                "{rows} rows of {} features into a {}×{} matrix, {} outputs",
                x.width(),
                self.out,
                self.width,
                out.len()
            );
        }
        let xs: Vec<ActRow<'_>> = (0..rows).map(|r| x.row(r)).collect();
        if xs.iter().any(|x| !x.whole(self.blocks())) {
            bail!("activation rows shorter than {} blocks", self.blocks());
        }
        let fast = kernel_available();
        // per group, its rows' 16 results; then copied into place row by row
        let groups = self.out.div_ceil(FEATURES);
        let mut by_group = vec![0f32; groups * rows * FEATURES];
        by_group
            .par_chunks_mut(GROUPS_PER_TASK * rows * FEATURES)
            .enumerate()
            .for_each(|(task, chunk)| {
                for (i, results) in chunk.chunks_mut(rows * FEATURES).enumerate() {
                    let g = task * GROUPS_PER_TASK + i;
                    if fast {
                        self.group_kernel(g, &xs, results);
                    } else {
                        for (x, result) in xs.iter().zip(results.chunks_mut(FEATURES)) {
                            for (f, r) in result.iter_mut().enumerate() {
                                *r = self.dot_scalar(g, f, x);
                            }
                        }
                    }
                }
            });
        for (r, row) in out.chunks_mut(self.out).enumerate() {
            for (g, dst) in row.chunks_mut(FEATURES).enumerate() {
                let src = &by_group[(g * rows + r) * FEATURES..][..dst.len()];
                dst.copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// Group `g` times every row of `xs` into `results` (16 per row), through the AVX-512
    /// kernel, up to [`ROWS_AT_ONCE`] rows per pass over the group's blocks.
    fn group_kernel(&self, g: usize, xs: &[ActRow<'_>], results: &mut [f32]) {
        let group = self.group(g);
        for (xs, results) in xs
            .chunks(ROWS_AT_ONCE)
            .zip(results.chunks_mut(ROWS_AT_ONCE * FEATURES))
        {
            macro_rules! run {
                ($r:literal) => {{
                    let xs: &[ActRow<'_>; $r] = match xs.try_into() {
                        Ok(xs) => xs,
                        Err(_) => return,
                    };
                    // SAFETY: `kernel_available` (checked by the caller) says the CPU has
                    // the features; the group's slices hold `blocks` blocks and each row
                    // was checked whole for them in `multiply`
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        avx512::group(&group, xs, results)
                    }
                    // never called elsewhere: `kernel_available` is false
                    #[cfg(not(target_arch = "x86_64"))]
                    let _ = (&group, xs, &results);
                }};
            }
            match xs.len() {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                4 => run!(4),
                5 => run!(5),
                6 => run!(6),
                7 => run!(7),
                _ => run!(8),
            }
        }
    }
}

/// One group's slices.
struct Group<'a> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    bits: Bits,
    qs: &'a [u8],
    d: &'a [f32],
    m: &'a [f32],
}

/// Whether this CPU runs the 16-feature kernel (AVX-512 F, BW and VNNI; checked once).
pub fn kernel_available() -> bool {
    super::cpu::avx512_vnni()
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{ActRow, Bits, Group, BLOCK, FEATURES};
    use std::arch::x86_64::*;

    /// Blocks ahead the weights are prefetched.
    const AHEAD: usize = 4;

    /// The group's 16 features times each of `xs` into `results` (16 per row, rows in order).
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI; the group's slices must hold whole blocks
    /// for its width and each row of `xs` as many blocks (values, scales, sums);
    /// `results` at least `R × 16` floats.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn group<const R: usize>(g: &Group<'_>, xs: &[ActRow<'_>; R], results: &mut [f32]) {
        let blocks = g.d.len() / FEATURES;
        // SAFETY: block `b < blocks` reads `bits.bytes()` bytes at `b * bits.bytes()` of
        // `qs` and 16 floats at `16b` of `d` and `m` (4-bit), and per row 32 bytes at `32b`
        // of its values and one value at `b` of its scales and sums: inside the slices as the
        // caller promised; stores write 16 floats at `16r` of `results`
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let mut acc = [_mm512_setzero_ps(); R];
            for b in 0..blocks {
                let p = g.qs.as_ptr().add(b * g.bits.bytes());
                // the weights a few blocks ahead (into the next group's, which follow in
                // memory): measured, the loads of each block's weights waited on memory
                let ahead = p.wrapping_add(AHEAD * g.bits.bytes());
                for line in 0..g.bits.bytes() / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
                }
                for s in [g.d.as_ptr(), g.m.as_ptr()] {
                    _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add((b + AHEAD) * FEATURES).cast());
                }
                let mut w = [_mm512_setzero_si512(); 8];
                match g.bits {
                    Bits::Four => {
                        for i in 0..4 {
                            let raw = _mm512_loadu_si512(p.add(64 * i).cast());
                            w[i] = _mm512_and_si512(raw, low);
                            w[i + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
                        }
                    }
                    Bits::Eight => {
                        for (i, w) in w.iter_mut().enumerate() {
                            *w = _mm512_loadu_si512(p.add(64 * i).cast());
                        }
                    }
                }
                let d = _mm512_loadu_ps(g.d.as_ptr().add(b * FEATURES));
                for r in 0..R {
                    let x = &xs[r];
                    let xq = x.q.as_ptr().add(b * BLOCK).cast::<i32>();
                    // two independent chains of four; integer sums, so the split is exact
                    let mut s0 = _mm512_setzero_si512();
                    let mut s1 = _mm512_setzero_si512();
                    for i in 0..4 {
                        s0 = _mm512_dpbusd_epi32(
                            s0,
                            w[i],
                            _mm512_set1_epi32(xq.add(i).read_unaligned()),
                        );
                        s1 = _mm512_dpbusd_epi32(
                            s1,
                            w[i + 4],
                            _mm512_set1_epi32(xq.add(i + 4).read_unaligned()),
                        );
                    }
                    let mut sum = _mm512_add_epi32(s0, s1);
                    if g.bits == Bits::Eight {
                        sum =
                            _mm512_sub_epi32(sum, _mm512_set1_epi32(*x.sum.get_unchecked(b) << 7));
                    }
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(*x.d.get_unchecked(b)));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
                    if g.bits == Bits::Four {
                        let m = _mm512_loadu_ps(g.m.as_ptr().add(b * FEATURES));
                        acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(*x.s.get_unchecked(b)), acc[r]);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(results.as_mut_ptr().add(r * FEATURES), *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::blocks::tests::{check_product, values};
    use super::*;

    /// Values on a 4-bit grid per block, as a Q4_1 file's dequantized weights are.
    fn on_grid(n: usize) -> Vec<f32> {
        super::super::q4::tests::on_grid(n)
    }

    /// The product matches the f32 one within `tolerance` of the largest value for batches of
    /// 1 to 17 rows (every kernel instance, and more than one pass of eight), each row equals
    /// that row multiplied alone bit for bit, and every output equals the block-by-block
    /// definition bit for bit.
    fn check(m: &Interleaved, w: &[f32], width: usize, tolerance: f32) {
        let batches: Vec<usize> = (1..=9).chain([17]).collect();
        let mul = |x: &Act, out: &mut [f32]| m.multiply(x, out).unwrap();
        let definition = |act: &Act, r: usize, outputs: &[f32]| {
            let row = act.row(r);
            for (c, v) in outputs.iter().enumerate() {
                let def = m.dot_scalar(c / FEATURES, c % FEATURES, &row);
                assert_eq!(
                    v.to_bits(),
                    def.to_bits(),
                    "row {r} feature {c}: {v} vs {def}"
                );
            }
        };
        check_product(m.out(), width, &batches, w, tolerance, mul, definition);
    }

    #[test]
    fn four_bits_match_f32_and_the_definition() {
        // 70 features: four whole groups and a part
        let (out, width) = (70, 128);
        let w = on_grid(out * width);
        let m = Interleaved::four_bits(&w, width).expect("values on the grid encode exactly");
        assert_eq!(m.bits(), 4);
        // only the activations' 8-bit rounding is left
        check(&m, &w, width, 0.01);
    }

    #[test]
    fn eight_bits_match_f32_and_the_definition() {
        let (out, width) = (70, 96);
        let w = values(out * width, 0);
        let m = Interleaved::eight_bits(&w, width).unwrap();
        assert_eq!(m.bits(), 8);
        check(&m, &w, width, 0.02);
    }

    #[test]
    fn values_off_the_grid_or_rows_not_in_blocks_are_refused() {
        let width = 128;
        assert!(Interleaved::four_bits(&values(10 * width, 4), width).is_none());
        let mut w = on_grid(10 * width);
        w[40] += 0.01;
        assert!(Interleaved::four_bits(&w, width).is_none());
        assert!(Interleaved::four_bits(&w[..100], 50).is_none());
        assert!(Interleaved::eight_bits(&[0.0; 160], 40).is_err());
        let m = Interleaved::eight_bits(&[0.0; 128], 64).unwrap();
        let x = Act::encode(&[0.0; 32], 32).unwrap();
        assert!(m.multiply(&x, &mut [0.0; 2]).is_err());
    }
}
