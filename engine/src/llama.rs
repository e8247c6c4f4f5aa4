//! A Llama-architecture forward pass (SmolLM2 is one) over a GGUF's weights, with the
//! attention K/V kept *outside* the model so a prefix cache can hold them per token block.
//!
//! Two passes: [`Llama::forward`] prefills a chunk of one sequence (bf16 weights where the
//! CPU multiplies them, [`super::bf16`], else f32; candle's matmuls for attention, the causal
//! mask and softmax in one pass); [`Llama::forward_batch`] runs one decode step for several
//! sequences on plain slices ([`crate::decode`]: the GGUF's 4-bit weights where exact, 8 bits
//! otherwise).
//!
//! candle's own quantized Llama keeps one private KV cache per layer and masks a multi-token
//! step as if it started at position 0, so prefilling after a cached prefix is not possible
//! with it. Here the caller passes the KV of the cached prefix in; the step attends to
//! `prefix + new` tokens with a causal mask offset by the prefix length, and hands back the
//! grown KV, from which full blocks are cut for the cache.

use crate::kv::{Kv, MAX_POSITIONS};
use crate::tensor::with_slice;
use crate::{bail, Error, Result};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, IndexOp, Module, Tensor};
use candle_nn::Embedding;

use super::attention::causal_softmax;
use super::bf16::Dense;
use super::decode::{DecodeLayer, DecodeMatrix, Decoder};
use super::exp::silu_mul;

struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }
}

/// A layer's prefill weights (bf16 where the CPU multiplies it, else f32: a chunk's many
/// rows make the matmul compute-bound; see [`Dense`]). Decode steps read their own copy
/// ([`DecodeLayer`]).
struct Layer {
    wq: Dense,
    wk: Dense,
    wv: Dense,
    wo: Dense,
    attn_norm: RmsNorm,
    gate: Dense,
    up: Dense,
    down: Dense,
    ffn_norm: RmsNorm,
}

pub struct Llama {
    embed: Embedding,
    layers: Vec<Layer>,
    decoder: Decoder,
    cos: Tensor,
    sin: Tensor,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    pub vocab: usize,
    device: Device,
}

impl Llama {
    /// Loads the weights of a GGUF file (architecture `llama`).
    ///
    /// # Errors
    /// [`Error::Model`] naming the file, for a file that cannot be read or is not a Llama.
    pub fn load(path: &std::path::Path) -> Result<Llama> {
        Self::read(path).map_err(|e| Error::Model {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }

    fn read(path: &std::path::Path) -> Result<Llama> {
        let device = Device::Cpu;
        let mut file = std::fs::File::open(path).map_err(|e| Error::Invalid(e.to_string()))?;
        let ct = gguf_file::Content::read(&mut file)?;
        let md = |k: &str| match ct.metadata.get(k) {
            Some(v) => Ok(v),
            None => Err(Error::Invalid(format!("GGUF metadata {k} missing"))),
        };
        let arch = md("general.architecture")?.to_string()?.clone();
        if arch != "llama" {
            bail!("unsupported architecture '{arch}' (this engine runs Llama-architecture GGUF models)");
        }
        let n_head = md("llama.attention.head_count")?.to_u32()? as usize;
        let n_kv_head = md("llama.attention.head_count_kv")?.to_u32()? as usize;
        let n_layer = md("llama.block_count")?.to_u32()? as usize;
        let hidden = md("llama.embedding_length")?.to_u32()? as usize;
        let eps = md("llama.attention.layer_norm_rms_epsilon")?.to_f32()?;
        let rope_base = md("llama.rope.freq_base")
            .and_then(|v| Ok(v.to_f32()?))
            .unwrap_or(10_000.0);
        let head_dim = hidden / n_head;
        let rope_dim = md("llama.rope.dimension_count")
            .and_then(|v| Ok(v.to_u32()? as usize))
            .unwrap_or(head_dim);

        let mut tensor = |name: &str| {
            ct.tensor(&mut file, name, &device)
                .map_err(|e| Error::Invalid(format!("tensor {name}: {e}")))
        };
        let dense = |t: candle_core::quantized::QTensor| t.dequantize(&device);
        let embed = dense(tensor("token_embd.weight")?)?;
        let vocab = embed.dim(0)?;
        let to_vec = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
        let norm = dense(tensor("output_norm.weight")?)?;
        let output = match tensor("output.weight") {
            Ok(t) => dense(t)?,
            Err(_) => embed.clone(), // tied embeddings
        };
        let mut layers = Vec::with_capacity(n_layer);
        let mut decode_layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let mut w =
                |n: &str| -> Result<Tensor> { Ok(dense(tensor(&format!("blk.{i}.{n}.weight"))?)?) };
            let (wq, wk, wv, wo) = (w("attn_q")?, w("attn_k")?, w("attn_v")?, w("attn_output")?);
            let (gate, up, down) = (w("ffn_gate")?, w("ffn_up")?, w("ffn_down")?);
            let (attn_norm, ffn_norm) = (w("attn_norm")?, w("ffn_norm")?);
            decode_layers.push(DecodeLayer {
                qkv: DecodeMatrix::new(&[&wq, &wk, &wv])?,
                wo: DecodeMatrix::new(&[&wo])?,
                gate_up: DecodeMatrix::new(&[&gate, &up])?,
                down: DecodeMatrix::new(&[&down])?,
                attn_norm: to_vec(&attn_norm)?,
                ffn_norm: to_vec(&ffn_norm)?,
            });
            layers.push(Layer {
                wq: Dense::new(wq)?,
                wk: Dense::new(wk)?,
                wv: Dense::new(wv)?,
                wo: Dense::new(wo)?,
                attn_norm: RmsNorm {
                    weight: attn_norm,
                    eps,
                },
                gate: Dense::new(gate)?,
                up: Dense::new(up)?,
                down: Dense::new(down)?,
                ffn_norm: RmsNorm {
                    weight: ffn_norm,
                    eps,
                },
            });
        }
        let theta: Vec<f32> = (0..rope_dim)
            .step_by(2)
            .map(|i| 1.0 / rope_base.powf(i as f32 / rope_dim as f32))
            .collect();
        let n_theta = theta.len();
        let theta = Tensor::from_vec(theta, (1, n_theta), &device)?;
        let positions = Tensor::arange(0u32, MAX_POSITIONS as u32, &device)?
            .to_dtype(DType::F32)?
            .reshape((MAX_POSITIONS, 1))?;
        let angles = positions.matmul(&theta)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let decoder = Decoder {
            layers: decode_layers,
            norm: to_vec(&norm)?,
            output: DecodeMatrix::new(&[&output])?,
            embed: embed.clone(),
            cos: to_vec(&cos)?,
            sin: to_vec(&sin)?,
            n_theta,
            n_head,
            n_kv_head,
            head_dim,
            hidden,
            vocab,
            eps,
        };
        Ok(Llama {
            embed: Embedding::new(embed, hidden),
            layers,
            decoder,
            cos,
            sin,
            n_head,
            n_kv_head,
            head_dim,
            vocab,
            device,
        })
    }

    /// An empty KV.
    pub fn empty_kv(&self) -> Result<Kv> {
        Kv::empty(
            self.layers.len(),
            self.n_kv_head,
            self.head_dim,
            &self.device,
        )
    }

    /// Runs `tokens` after the `kv.len()` positions already in `kv`, appends their K/V to it,
    /// and returns the logits of the last position (`[vocab]`, f32).
    pub fn forward(&self, tokens: &[u32], kv: &mut Kv) -> Result<Tensor> {
        let mut logits = self.forward_many(&mut [(tokens, kv)])?;
        match logits.pop() {
            Some(l) if logits.is_empty() => Ok(l),
            _ => bail!("one prompt chunk gave {} logits", logits.len() + 1),
        }
    }

    /// Prompt chunks of several sequences in one pass: chunk `i`'s tokens run after the
    /// positions in its own KV (appending to it), and logits `i` are its last position's
    /// (`[vocab]`, f32). The chunks' rows go through each weight matrix together, so the
    /// weights are read once for all of them (a pod that admits eight short prompts at once
    /// prefilled them in eight passes, each reading every matrix); attention runs per
    /// sequence over its own K/V. Each row is computed from its own values only (the
    /// prefill's matrices are row-independent, [`super::bf16`]), so a chunk's numbers are
    /// the same as in a pass of its own.
    pub fn forward_many(&self, chunks: &mut [(&[u32], &mut Kv)]) -> Result<Vec<Tensor>> {
        let spans: Vec<(usize, usize)> = chunks
            .iter()
            .map(|(tokens, kv)| (kv.len(), tokens.len()))
            .collect();
        for &(start, n) in &spans {
            if n == 0 || start + n > MAX_POSITIONS {
                bail!("{n} tokens after {start} do not fit in {MAX_POSITIONS} positions");
            }
        }
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let tokens: Vec<u32> = chunks.iter().flat_map(|(t, _)| t.iter().copied()).collect();
        let total = tokens.len();
        let ids = Tensor::new(tokens.as_slice(), &self.device)?.unsqueeze(0)?;
        let mut x = self.embed.forward(&ids)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let h = layer.attn_norm.forward(&x)?;
            let (q, k, v) = self.qkv(layer, &h, total)?;
            let mut ys = Vec::with_capacity(spans.len());
            let mut at = 0;
            for ((_, kv), &(start, n)) in chunks.iter_mut().zip(&spans) {
                let part = |t: &Tensor| -> Result<Tensor> {
                    if n == total {
                        Ok(t.clone())
                    } else {
                        Ok(t.narrow(2, at, n)?.contiguous()?)
                    }
                };
                let cos = self.cos.narrow(0, start, n)?;
                let sin = self.sin.narrow(0, start, n)?;
                let q = candle_nn::rotary_emb::rope_i(&part(&q)?, &cos, &sin)?;
                let k = candle_nn::rotary_emb::rope_i(&part(&k)?, &cos, &sin)?;
                kv.append(l, &k, &part(&v)?)?;
                let (k, v) = kv.in_f32(l, start + n)?;
                ys.push(self.attend(&q, &k, &v, start)?);
                at += n;
            }
            let y = if ys.len() == 1 {
                ys.swap_remove(0)
            } else {
                Tensor::cat(&ys, 1)?
            };
            x = self.feed_forward(layer, &y, &x)?;
        }
        // every chunk's last position, through the output matrix together
        let mut last = Vec::with_capacity(spans.len());
        let mut end = 0;
        for ((_, kv), &(_, n)) in chunks.iter_mut().zip(&spans) {
            kv.advance(n);
            end += n;
            last.push(x.i((0, end - 1))?);
        }
        let last = Tensor::stack(&last, 0)?.contiguous()?;
        let logits = with_slice(&last, |h: &[f32]| self.decoder.logits(h))??;
        logits
            .chunks(self.vocab)
            .map(|row| Ok(Tensor::from_slice(row, self.vocab, &self.device)?))
            .collect()
    }

    /// One decode step for several sequences at once: sequence `i` runs token `steps[i].0`
    /// after the positions in its own KV `steps[i].1` (appending to it), and row `i` of the
    /// result (`[sequences, vocab]`) is its logits. Each weight matrix is read once for all
    /// the sequences, which is where a decode step spends its time; only attention, over each
    /// sequence's own K/V, runs per sequence ([`Decoder::step`]).
    pub fn forward_batch(&self, steps: &mut [(u32, &mut Kv)]) -> Result<Tensor> {
        let b = steps.len();
        if b == 0 {
            bail!("an empty batch");
        }
        if steps.iter().any(|(_, kv)| kv.len() + 1 > MAX_POSITIONS) {
            bail!("a sequence in the batch is at {MAX_POSITIONS} positions");
        }
        // on a thread of the pool: the step's ~150 parallel sections then hand work to the
        // other threads directly, instead of each waking the pool from outside and sleeping
        // until it is done (measured: one sequence's step ~10.5 → ~9 ms)
        let logits = rayon::scope(|_| self.decoder.step(steps))?;
        Ok(Tensor::from_vec(logits, (b, self.vocab), &self.device)?)
    }

    /// Bits per weight value of each decode-step matrix, in load order (for logs and tests).
    pub fn decode_bits(&self) -> Vec<u32> {
        self.decoder
            .layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.wo, &l.gate_up, &l.down])
            .chain([&self.decoder.output])
            .map(|m| m.bits())
            .collect()
    }

    /// Q, K and V of `n` positions' hidden states `h` (`[1, n, hidden]`), each as
    /// `[1, heads, n, head_dim]`, contiguous.
    fn qkv(&self, layer: &Layer, h: &Tensor, n: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let heads = |w: &Dense, count: usize| -> Result<Tensor> {
            Ok(w.forward(h)?
                .reshape((1, n, count, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        Ok((
            heads(&layer.wq, self.n_head)?,
            heads(&layer.wk, self.n_kv_head)?,
            heads(&layer.wv, self.n_kv_head)?,
        ))
    }

    /// The attention output of one sequence's `n` queries (`[1, heads, n, head_dim]`, rotary
    /// applied, positions `start..start + n`) over its K and V (`[1, kv_heads, start + n,
    /// head_dim]`, the new positions included), `[1, n, hidden]`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
        let n = q.dim(2)?;
        // grouped-query attention without copying K/V once per query head: the `rep` query
        // heads that share a K/V head (consecutive heads) become `rep × n` rows against it
        let rep = self.n_head / self.n_kv_head;
        let hd = self.head_dim;
        let q = q.reshape((1, self.n_kv_head, rep * n, hd))?;
        let scores = q.matmul(&k.t()?)?;
        // scale, causal mask and softmax in one pass over the scores (through candle's
        // operations they were four, each writing every score, plus a mask tensor)
        let shape = scores.shape().clone();
        let p = with_slice(&scores, |s| {
            let mut p = vec![0f32; s.len()];
            causal_softmax(s, &mut p, n, start, 1.0 / (hd as f32).sqrt());
            p
        })?;
        let att = Tensor::from_vec(p, shape, &self.device)?;
        let y = att.matmul(v)?;
        if n == 1 {
            // one position: heads are already in order, no transpose (and no copy) needed
            return Ok(y.reshape((1, 1, self.n_head * hd))?);
        }
        Ok(y.reshape((1, self.n_head, n, hd))?
            .transpose(1, 2)?
            .reshape((1, n, self.n_head * hd))?)
    }

    /// The attention's output projection and the feed-forward block, each with its residual:
    /// `x + wo(y)`, then that plus the SwiGLU of its norm.
    fn feed_forward(&self, layer: &Layer, y: &Tensor, x: &Tensor) -> Result<Tensor> {
        let x = (layer.wo.forward(y)? + x)?;
        let h = layer.ffn_norm.forward(&x)?;
        let (gate, up) = (layer.gate.forward(&h)?, layer.up.forward(&h)?);
        let act = with_slice(&gate, |g| {
            with_slice(&up, |u| {
                let mut act = vec![0f32; g.len()];
                silu_mul(g, u, &mut act);
                act
            })
        })??;
        let act = Tensor::from_vec(act, gate.shape(), &self.device)?;
        let ff = layer.down.forward(&act)?;
        Ok((ff + &x)?)
    }
}
