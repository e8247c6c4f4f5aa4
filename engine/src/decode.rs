//! One decode step for a batch of sequences, on plain slices: the hidden states of a few rows
//! go through every layer without candle's tensor operations.
//!
//! A decode step computes one position per sequence, so its norms, rotary embeddings and
//! activations are a few thousand values each; through candle each was an operation with its
//! own allocation, layout checks and thread-pool dispatch, ~15 per layer, which cost as much
//! as a third of a step. Here they are loops over slices, and the step's time is where it
//! belongs: the weight matrices ([`DecodeMatrix`], read once for the whole batch, in the
//! GGUF's own 4 bits where that is exact) and each sequence's attention over its K/V.
//!
//! The matrices a layer multiplies the same input by are stacked into one at load (Q, K and V;
//! the feed-forward's gate and up), so a layer is four multiplications, each spread over the
//! cores once.

use crate::{bail, Result};
use candle_core::Tensor;
use rayon::prelude::*;

use super::attention;
use super::blocks::{multiply, Act, BlockMatrix};
use super::exp::silu_mul;
use super::interleaved::{self, Interleaved};
use super::q4::Q4Matrix;
use super::q8::Q8Matrix;
use crate::kv::Kv;
use crate::tensor::with_slice;

/// A weight matrix's decode-step copy: in 4 bits when the values re-encode exactly (the GGUF's
/// Q4_1 matrices), otherwise in 8 bits.
pub enum DecodeMatrix {
    Q4(Q4Matrix),
    Q8(Q8Matrix),
    /// Either, sixteen features at a time, where the CPU has AVX-512 VNNI.
    Interleaved(Interleaved),
}

impl DecodeMatrix {
    /// The rows of `parts` (f32 matrices of one width), stacked in order.
    pub fn new(parts: &[&Tensor]) -> Result<DecodeMatrix> {
        let mut values = Vec::new();
        let mut width = None;
        for part in parts {
            let (_, w) = part.dims2()?;
            if width.is_some_and(|first| first != w) {
                bail!("stacked matrices of different widths");
            }
            width = Some(w);
            values.extend(part.flatten_all()?.to_vec1::<f32>()?);
        }
        let Some(width) = width else {
            bail!("no matrix to stack");
        };
        if interleaved::kernel_available() {
            return Ok(DecodeMatrix::Interleaved(
                match Interleaved::four_bits(&values, width) {
                    Some(m) => m,
                    None => Interleaved::eight_bits(&values, width)?,
                },
            ));
        }
        Ok(match Q4Matrix::exact(&values, width) {
            Some(q4) => DecodeMatrix::Q4(q4),
            None => DecodeMatrix::Q8(Q8Matrix::new(&values, width)?),
        })
    }

    /// Bits per value (without the blocks' scales).
    pub fn bits(&self) -> u32 {
        match self {
            DecodeMatrix::Q4(_) => 4,
            DecodeMatrix::Q8(_) => 8,
            DecodeMatrix::Interleaved(m) => m.bits(),
        }
    }

    fn out(&self) -> usize {
        match self {
            DecodeMatrix::Q4(m) => m.out(),
            DecodeMatrix::Q8(m) => m.out(),
            DecodeMatrix::Interleaved(m) => m.out(),
        }
    }

    /// `x`'s rows times this matrix, `[rows, out]` row-major.
    fn multiply(&self, x: &Act) -> Result<Vec<f32>> {
        let mut out = vec![0f32; x.rows() * self.out()];
        match self {
            DecodeMatrix::Q4(m) => multiply(m, x, &mut out)?,
            DecodeMatrix::Q8(m) => multiply(m, x, &mut out)?,
            DecodeMatrix::Interleaved(m) => m.multiply(x, &mut out)?,
        }
        Ok(out)
    }
}

/// One layer's decode-step weights.
pub struct DecodeLayer {
    /// Q, K and V stacked: `n_head·hd + 2·n_kv·hd` outputs.
    pub qkv: DecodeMatrix,
    pub wo: DecodeMatrix,
    /// Gate and up stacked: `2·ff` outputs.
    pub gate_up: DecodeMatrix,
    pub down: DecodeMatrix,
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
}

/// The model as a decode step reads it.
pub struct Decoder {
    pub layers: Vec<DecodeLayer>,
    pub norm: Vec<f32>,
    pub output: DecodeMatrix,
    /// Token embeddings, f32 `[vocab, hidden]` (shared with the prefill's copy).
    pub embed: Tensor,
    /// Rotary angles' cosines and sines, `n_theta` per position.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub n_theta: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub hidden: usize,
    pub vocab: usize,
    pub eps: f32,
}

impl Decoder {
    /// Runs token `steps[i].0` of each sequence after the positions in its K/V (appending to
    /// it); returns the logits, `[sequences, vocab]` row-major.
    pub fn step(&self, steps: &mut [(u32, &mut Kv)]) -> Result<Vec<f32>> {
        let (b, hidden, hd) = (steps.len(), self.hidden, self.head_dim);
        let (q_width, kv_width) = (self.n_head * hd, self.n_kv_head * hd);
        let positions: Vec<usize> = steps.iter().map(|(_, kv)| kv.len()).collect();
        let mut x = vec![0f32; b * hidden];
        with_slice(&self.embed, |e: &[f32]| -> Result<()> {
            for (row, (token, _)) in x.chunks_mut(hidden).zip(steps.iter()) {
                let at = *token as usize * hidden;
                let Some(values) = e.get(at..at + hidden) else {
                    bail!("token {token} is not in the vocabulary");
                };
                row.copy_from_slice(values);
            }
            Ok(())
        })??;
        let rep = (self.n_head / self.n_kv_head.max(1)).max(1);
        for (l, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, self.eps);
            let mut qkv = layer.qkv.multiply(&Act::encode(&h, hidden)?)?;
            let width = q_width + 2 * kv_width;
            for ((row, (_, kv)), &pos) in
                qkv.chunks_mut(width).zip(steps.iter_mut()).zip(&positions)
            {
                let (q, rest) = row.split_at_mut(q_width);
                let (k, v) = rest.split_at_mut(kv_width);
                self.rope(q, pos);
                self.rope(k, pos);
                let dev = self.embed.device();
                kv.append(
                    l,
                    &Tensor::from_slice(k, (1, self.n_kv_head, 1, hd), dev)?,
                    &Tensor::from_slice(v, (1, self.n_kv_head, 1, hd), dev)?,
                )?;
            }
            // every sequence's heads, spread over the cores: a task per K/V head (its query
            // heads read the K/V once) when that makes enough tasks, else a task per head;
            // a head's numbers are the same either way
            let mut ys = vec![0f32; b * q_width];
            let per_task = if b * self.n_kv_head >= 2 * rayon::current_num_threads()
                && self.n_head.is_multiple_of(rep)
            {
                rep
            } else {
                1
            };
            let qkv = &qkv;
            let steps = &*steps;
            ys.par_chunks_mut(per_task * hd).enumerate().try_for_each(
                |(task, out)| -> Result<()> {
                    let heads = self.n_head / per_task;
                    let (i, head) = (task / heads, task % heads * per_task);
                    let at = i * width + head * hd;
                    let q = &qkv[at..at + per_task * hd];
                    steps[i].1.with_head(l, head / rep, |k, v| {
                        attention::attend_heads(q, k, v, hd, out)
                    })
                },
            )?;
            let o = layer.wo.multiply(&Act::encode(&ys, q_width)?)?;
            add(&mut x, &o);
            let h = rms_norm(&x, &layer.ffn_norm, self.eps);
            let gate_up = layer.gate_up.multiply(&Act::encode(&h, hidden)?)?;
            let ff = gate_up.len() / b / 2;
            let mut act = vec![0f32; b * ff];
            for (row, out) in gate_up.chunks(2 * ff).zip(act.chunks_mut(ff)) {
                let (g, u) = row.split_at(ff);
                silu_mul(g, u, out);
            }
            let down = layer.down.multiply(&Act::encode(&act, ff)?)?;
            add(&mut x, &down);
        }
        for (_, kv) in steps.iter_mut() {
            kv.advance(1);
        }
        self.logits(&x)
    }

    /// The logits of final hidden states `x` (rows of `hidden`, before the output norm),
    /// `[rows, vocab]` row-major: a decode step's, and a prefill's of its last position
    /// (the output matrix is 49152 × 576 for SmolLM2: in 8 bits a quarter of the bytes of
    /// the f32 copy the prefill read it from, for one row).
    pub fn logits(&self, x: &[f32]) -> Result<Vec<f32>> {
        let h = rms_norm(x, &self.norm, self.eps);
        self.output.multiply(&Act::encode(&h, self.hidden)?)
    }

    /// Rotates each head's consecutive pairs of values by the position's angles (candle's
    /// `rope_i`, the layout GGUF Llama weights are stored for).
    fn rope(&self, heads: &mut [f32], pos: usize) {
        let at = pos * self.n_theta;
        let (Some(cos), Some(sin)) = (
            self.cos.get(at..at + self.n_theta),
            self.sin.get(at..at + self.n_theta),
        ) else {
            return;
        };
        for head in heads.chunks_mut(self.head_dim) {
            for ((pair, c), s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}

/// Each row of `x` divided by its root mean square (plus `eps`), times `weight`, as candle's
/// `rms_norm` computes it.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let dim = weight.len().max(1);
    x.chunks(dim)
        .flat_map(|row| {
            let sum2: f32 = row.iter().map(|v| v * v).sum();
            let scale = (sum2 / dim as f32 + eps).sqrt();
            row.iter().zip(weight).map(move |(v, w)| v / scale * w)
        })
        .collect()
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
