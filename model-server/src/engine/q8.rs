//! The decode step's weight matrices in 8 bits (GGML's Q8_0: blocks of 32 values sharing one
//! scale), multiplied so that each weight row is read once for the whole batch.
//!
//! A decode step's cost is reading the weights: at f32 that is ~0.5 GB per step for
//! SmolLM2-135M, about 18 steps/s on this machine's memory. Re-encoding the GGUF's 4-bit
//! values (Q4_1) in Q8_0 is nearly exact (each block's 16 levels land on a 255-level grid)
//! and reads a quarter of the bytes. candle has the kernel (`vec_dot` of two Q8_0 rows, AVX2
//! when the build enables it) but its quantized matmul walks the batch's rows outermost, so
//! eight sequences read the weights eight times: measured, 8 sequences decoding together ran
//! at 75 tokens/s through it against 85 with f32 weights. Here the loop is the other way
//! round: each weight row's blocks are dotted with every sequence's row while they are in
//! cache. Prefill stays on f32 weights, where a chunk's many rows make the matmul
//! compute-bound and f32 gemm is fastest.

use candle_core::quantized::k_quants::{BlockQ8_0, GgmlType, QK8_0};
use candle_core::{Device, Result, Tensor};
use rayon::prelude::*;

/// Output features per parallel task: small enough to spread a 576-wide projection over the
/// cores, large enough that a task outlasts its scheduling (2 to 16 tasks per matrix measured
/// the same on 2 cores).
const COLUMNS_PER_TASK: usize = 32;

/// A weight matrix `[out, in]` in Q8_0, row by row.
pub struct Q8Matrix {
    out: usize,
    inp: usize,
    /// `out` rows of `inp / 32` blocks each.
    blocks: Vec<BlockQ8_0>,
}

impl Q8Matrix {
    /// Encodes an f32 matrix `[out, in]`; `in` must be a multiple of 32.
    pub fn new(w: &Tensor) -> Result<Q8Matrix> {
        let (out, inp) = w.dims2()?;
        if inp % QK8_0 != 0 {
            candle_core::bail!(
                "a Q8_0 matrix needs rows of a multiple of {QK8_0} values, not {inp}"
            );
        }
        let values = w.flatten_all()?.to_vec1::<f32>()?;
        Ok(Q8Matrix {
            out,
            inp,
            blocks: quantize(&values, inp),
        })
    }

    /// `x · Wᵀ` for `x` of shape `[.., in]`, f32, shaped `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let Some((&inp, lead)) = dims.split_last() else {
            candle_core::bail!("a scalar input");
        };
        if inp != self.inp {
            candle_core::bail!("input of {inp} features for a matrix of {}", self.inp);
        }
        let rows: usize = lead.iter().product();
        let xs = quantize(&x.flatten_all()?.to_vec1::<f32>()?, inp);
        let per_row = inp / QK8_0;
        // column-major result: each weight row's dot products with every input row together
        let mut out_t = vec![0f32; self.out * rows];
        out_t
            .par_chunks_mut(COLUMNS_PER_TASK * rows)
            .enumerate()
            .for_each(|(task, chunk)| {
                for (j, col) in chunk.chunks_mut(rows).enumerate() {
                    let c = task * COLUMNS_PER_TASK + j;
                    let w = &self.blocks[c * per_row..(c + 1) * per_row];
                    for (r, dst) in col.iter_mut().enumerate() {
                        *dst = BlockQ8_0::vec_dot(inp, w, &xs[r * per_row..(r + 1) * per_row]);
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

    /// Bytes the weights take.
    pub fn bytes(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<BlockQ8_0>()
    }
}

/// Rows of `width` values (a multiple of 32) as Q8_0 blocks.
fn quantize(values: &[f32], width: usize) -> Vec<BlockQ8_0> {
    let per_row = width / QK8_0;
    let rows = values.len() / width;
    let mut blocks = vec![BlockQ8_0::zeros(); rows * per_row];
    blocks
        .par_chunks_mut(per_row)
        .zip(values.par_chunks(width))
        .for_each(|(b, v)| BlockQ8_0::from_float(v, b));
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-bit product matches the f32 one within the encoding's error, for one row and
    /// for a batch, and a batch's rows equal each row's alone exactly.
    #[test]
    fn matches_f32_and_rows_are_independent() -> Result<()> {
        let dev = Device::Cpu;
        let (out, inp, batch) = (70, 96, 5);
        let w = Tensor::randn(0f32, 0.1, (out, inp), &dev)?;
        let x = Tensor::randn(0f32, 1.0, (1, batch, inp), &dev)?;
        let q = Q8Matrix::new(&w)?;
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
            assert_eq!(diff, 0.0, "row {r} differs in a batch");
        }
        Ok(())
    }

    #[test]
    fn rejects_rows_not_in_whole_blocks() {
        let w = Tensor::zeros((4, 40), candle_core::DType::F32, &Device::Cpu);
        assert!(w.and_then(|w| Q8Matrix::new(&w)).is_err());
    }
}
