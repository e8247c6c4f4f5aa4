//! Continuous batching for the engine: the requests running on a pod share forward
//! passes instead of each running its own.
//!
//! A decode step of a 135M-parameter model on a CPU spends its time reading the weights, the
//! same for one sequence as for eight; so one thread owns the model's compute and, in a loop,
//! (1) takes in new requests, (2) prefills the requests still prefilling, oldest first, up to
//! [`PREFILL_CHUNK`] prompt tokens in all (so a long prompt delays the others' next tokens by
//! one chunk, not by its whole prefill, and several short ones start together, in one pass
//! that reads the weights once for all of them: [`Llama::forward_many`]), and (3) runs one
//! batched decode step for every request past its prefill ([`Llama::forward_batch`], which
//! spreads the sequences' attention over the cores). How many requests run at once
//! is the server's admission (`--max-num-seqs`), as before; the prefix cache's blocks come in
//! with the request and the new full blocks go out after its prefill, as before.
//!
//! Output goes out without ever blocking the loop: a request whose client reads slowly keeps
//! its pieces in a backlog (at most its `max_tokens`) that is offered again every step.

use super::{Emitted, EngineError, FinishReason, GenerateRequest, KvBlock};
use crate::kv::{Kv, MAX_POSITIONS};
use crate::llama::Llama;
use candle_core::{IndexOp, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use prefix_core::ModelBundle;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Prompt tokens one turn of the loop prefills at most: two 128-token blocks (a request's
/// first chunk boundary then falls on a block boundary, where a cache hit would resume).
pub const PREFILL_CHUNK: usize = 256;

type Done = oneshot::Sender<Result<FinishReason, EngineError>>;

struct Job {
    req: GenerateRequest,
    out: mpsc::Sender<Emitted>,
    done: Done,
}

/// The handle requests are submitted through; the loop's thread ends when it is dropped.
pub struct Batcher {
    jobs: std::sync::mpsc::Sender<Job>,
}

/// What the loop needs besides the requests.
pub struct Model {
    pub llama: Arc<Llama>,
    pub bundle: Arc<ModelBundle>,
    pub eos: Vec<u32>,
    /// Told the tokens computed per turn of the loop, prompt and output (a server's
    /// `vllm:iteration_tokens_total`).
    pub on_step: Box<dyn Fn(usize) + Send + Sync>,
}

impl Batcher {
    pub fn start(model: Model) -> std::io::Result<Batcher> {
        let (jobs, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("engine-batcher".into())
            .spawn(move || supervise(&model, &rx))?;
        Ok(Batcher { jobs })
    }

    /// Queues a request; the future says how it ended, once all its output was handed over.
    /// Should the loop be gone, the job (and the sender of that answer) is dropped, and the
    /// future says so.
    pub fn submit(
        &self,
        req: GenerateRequest,
        out: mpsc::Sender<Emitted>,
    ) -> impl std::future::Future<Output = Result<FinishReason, EngineError>> + Send + 'static {
        let (done, rx) = oneshot::channel();
        let _ = self.jobs.send(Job { req, out, done });
        async move {
            rx.await
                .unwrap_or_else(|_| Err(failed("the engine thread stopped")))
        }
    }
}

fn failed(e: impl std::fmt::Display) -> EngineError {
    EngineError::Failed(e.to_string())
}

/// Greedy by default; `temperature` (and `top_p`) sample, seeded.
fn sampler(req: &GenerateRequest) -> LogitsProcessor {
    let seed = req.seed.unwrap_or(299_792_458);
    let sampling = match (req.temperature, req.top_p) {
        (None, _) => Sampling::ArgMax,
        (Some(t), _) if t <= 0.0 => Sampling::ArgMax,
        (Some(t), Some(p)) if p < 1.0 => Sampling::TopP { p, temperature: t },
        (Some(t), _) => Sampling::All { temperature: t },
    };
    LogitsProcessor::from_sampling(seed, sampling)
}

/// One request in the loop.
struct Seq {
    req: GenerateRequest,
    kv: Kv,
    /// Prompt tokens computed so far (cached ones included).
    computed: usize,
    /// Logits of the last position computed, once the prompt is done.
    logits: Option<Tensor>,
    sampler: LogitsProcessor,
    generated: Vec<u32>,
    text: String,
    out: mpsc::Sender<Emitted>,
    backlog: VecDeque<Emitted>,
    done: Option<Done>,
    /// Set once the request has ended; it leaves the loop when its backlog is handed over.
    ended: Option<Result<FinishReason, EngineError>>,
}

impl Seq {
    fn new(job: Job, kv: Kv) -> Seq {
        Seq {
            computed: kv.len(),
            kv,
            logits: None,
            sampler: sampler(&job.req),
            generated: Vec::new(),
            text: String::new(),
            backlog: VecDeque::new(),
            req: job.req,
            out: job.out,
            done: Some(job.done),
            ended: None,
        }
    }

    fn prefilled(&self) -> bool {
        self.logits.is_some()
    }

    /// Where the next chunk of the prompt ends, given `budget` tokens left in this turn
    /// (`first`: no chunk has been taken this turn yet); `None` when no whole block fits.
    fn chunk_end(&self, budget: usize, first: bool) -> Option<usize> {
        let prompt = &self.req.prompt_tokens;
        let start = self.computed;
        let bs = self.req.block_size.max(1);
        // a chunk that does not finish the prompt ends on a block boundary, where a cache hit
        // would resume: the K/V computed are then those the cached-vs-uncached tests compare
        // the turn's first chunk takes a whole block even when blocks exceed the budget
        let budget = if first { budget.max(bs) } else { budget };
        let end = if start + budget >= prompt.len() {
            prompt.len()
        } else {
            (start + budget) / bs * bs
        };
        (end > start).then_some(end)
    }

    /// Records a computed chunk ending at `end` with its last position's `logits`; after the
    /// prompt's last chunk, hands its new full blocks to the cache.
    fn chunk_done(&mut self, end: usize, logits: Tensor) -> Result<(), EngineError> {
        self.computed = end;
        let prompt_len = self.req.prompt_tokens.len();
        if end < prompt_len {
            return Ok(());
        }
        let bs = self.req.block_size.max(1);
        let blocks: Vec<KvBlock> = (self.req.cached_kv.len()..prompt_len / bs)
            .map(|b| self.kv.slice(b * bs, bs).map(Arc::new))
            .collect::<Result<_, _>>()
            .map_err(failed)?;
        self.req.cached_kv.clear(); // the cache's copies are not needed any longer
        self.backlog.push_back(Emitted::Blocks(blocks));
        self.logits = Some(logits);
        Ok(())
    }

    /// Samples the next token from the last logits and queues its text; `Some(token)` when
    /// the request goes on (the token is then the next decode step's input).
    fn sample(&mut self, model: &Model) -> Result<Option<u32>, EngineError> {
        let Some(logits) = &self.logits else {
            return Ok(None);
        };
        if self.generated.len() >= self.req.max_tokens as usize {
            self.ended = Some(Ok(FinishReason::Length));
            return Ok(None);
        }
        let next = self.sampler.sample(logits).map_err(failed)?;
        if model.eos.contains(&next) {
            self.ended = Some(Ok(FinishReason::Stop));
            return Ok(None);
        }
        self.generated.push(next);
        let decoded = model
            .bundle
            .tokenizer()
            .decode(&self.generated)
            .map_err(failed)?;
        // hold back an incomplete UTF-8 character until the next token completes it
        // (and never cut inside a character, should decoding have changed earlier text)
        let piece = if decoded.ends_with('\u{fffd}') {
            String::new()
        } else {
            decoded
                .get(self.text.len()..)
                .unwrap_or_default()
                .to_owned()
        };
        self.text.push_str(&piece);
        let piece_len = piece.len();
        self.backlog.push_back(Emitted::Token(piece));
        if self.req.stop.reached(&self.text, piece_len) {
            self.ended = Some(Ok(FinishReason::Stop));
            return Ok(None);
        }
        if self.generated.len() >= self.req.max_tokens as usize
            || self.kv.len() + 1 >= MAX_POSITIONS
        {
            self.ended = Some(Ok(FinishReason::Length));
            return Ok(None);
        }
        Ok(Some(next))
    }

    /// Offers the backlog to the request's channel; `false` once the client has gone.
    fn flush(&mut self) -> bool {
        while let Some(e) = self.backlog.pop_front() {
            match self.out.try_send(e) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(e)) => {
                    self.backlog.push_front(e);
                    return true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
            }
        }
        true
    }

    fn end(&mut self, result: Result<FinishReason, EngineError>) {
        if self.ended.is_none() {
            self.ended = Some(result);
        }
    }

    /// Whether the request is over and all it produced was handed over (then `done` is sent).
    fn finish_if_over(&mut self) -> bool {
        if !self.flush() {
            self.ended = Some(Err(EngineError::Cancelled));
            self.backlog.clear();
        }
        if self.ended.is_none() || !self.backlog.is_empty() {
            return false;
        }
        if let (Some(done), Some(result)) = (self.done.take(), self.ended.take()) {
            let _ = done.send(result);
        }
        true
    }
}

/// Runs the loop until the [`Batcher`] is dropped. Should a step panic (a bug, say a tensor
/// shape), the requests in the loop fail (their `done` is dropped: "the engine thread
/// stopped") and the loop starts again for the next ones, instead of the pod failing every
/// request from then on.
fn supervise(model: &Model, jobs: &std::sync::mpsc::Receiver<Job>) {
    while std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(model, jobs))).is_err() {
        tracing::error!("the engine's loop panicked; its requests failed, restarting it");
    }
}

fn run(model: &Model, jobs: &std::sync::mpsc::Receiver<Job>) {
    let mut seqs: Vec<Seq> = Vec::new();
    loop {
        // (1) new requests: wait for one when idle
        if seqs.is_empty() {
            match jobs.recv() {
                Ok(job) => admit(model, job, &mut seqs),
                Err(_) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            admit(model, job, &mut seqs);
        }
        // (2) prefill, oldest first, up to PREFILL_CHUNK prompt tokens in all, in one pass
        let prefilled = prefill(model, &mut seqs);
        // (3) one decode step for every request past its prefill
        let mut batch: Vec<(u32, &mut Seq)> = Vec::new();
        for seq in seqs.iter_mut() {
            if seq.ended.is_some() || !seq.prefilled() {
                continue;
            }
            match seq.sample(model) {
                Ok(Some(next)) => batch.push((next, seq)),
                Ok(None) => {}
                Err(e) => seq.end(Err(e)),
            }
        }
        if prefilled + batch.len() > 0 {
            (model.on_step)(prefilled + batch.len());
        }
        if !batch.is_empty() {
            decode(model, &mut batch);
        }
        seqs.retain_mut(|s| !s.finish_if_over());
    }
}

/// Plans this turn's prompt chunks (oldest request first, up to [`PREFILL_CHUNK`] tokens in
/// all) and computes them in one pass ([`Llama::forward_many`]: the weights are read once for
/// every request admitted together); returns the prompt tokens computed. Should the pass
/// fail, each chunk is tried in a pass of its own, so only a request whose own chunk fails
/// ends (a failed pass leaves every K/V as it was: positions count only once a pass is done).
fn prefill(model: &Model, seqs: &mut [Seq]) -> usize {
    let mut budget = PREFILL_CHUNK;
    let mut ends: Vec<Option<usize>> = vec![None; seqs.len()];
    for (seq, end) in seqs.iter().zip(ends.iter_mut()) {
        if budget == 0 {
            break;
        }
        if seq.prefilled() || seq.ended.is_some() {
            continue;
        }
        *end = seq.chunk_end(budget, budget == PREFILL_CHUNK);
        if let Some(e) = *end {
            budget -= (e - seq.computed).min(budget);
        }
    }
    let mut planned: Vec<(&mut Seq, usize)> = seqs
        .iter_mut()
        .zip(ends)
        .filter_map(|(seq, end)| end.map(|e| (seq, e)))
        .collect();
    let run = |group: &mut [(&mut Seq, usize)]| {
        let mut parts: Vec<(&[u32], &mut Kv)> = group
            .iter_mut()
            .map(|(seq, end)| {
                let Seq {
                    req, kv, computed, ..
                } = &mut **seq;
                (
                    req.prompt_tokens.get(*computed..*end).unwrap_or_default(),
                    kv,
                )
            })
            .collect();
        model.llama.forward_many(&mut parts)
    };
    // a pass's outcome recorded: each chunk done (its prompt tokens counted), or each of the
    // pass's requests ended with the error (also should a pass give a chunk no logits)
    let record = |group: &mut [(&mut Seq, usize)], result: Result<Vec<Tensor>, _>| -> usize {
        let logits = match result {
            Ok(logits) if logits.len() == group.len() => logits,
            other => {
                let e = other.err().map_or_else(
                    || "a prompt pass gave logits for another number of chunks".to_owned(),
                    |e: crate::Error| e.to_string(),
                );
                group
                    .iter_mut()
                    .for_each(|(seq, _)| seq.end(Err(failed(&e))));
                return 0;
            }
        };
        let mut tokens = 0;
        for ((seq, end), logits) in group.iter_mut().zip(logits) {
            let n = *end - seq.computed;
            match seq.chunk_done(*end, logits) {
                Ok(()) => tokens += n,
                Err(e) => seq.end(Err(e)),
            }
        }
        tokens
    };
    let result = run(&mut planned);
    if result.is_err() && planned.len() > 1 {
        planned
            .chunks_mut(1)
            .map(|one| {
                let result = run(one);
                record(one, result)
            })
            .sum()
    } else {
        record(&mut planned, result)
    }
}

fn admit(model: &Model, job: Job, seqs: &mut Vec<Seq>) {
    match cached_kv(model, &job.req) {
        Ok(kv) => seqs.push(Seq::new(job, kv)),
        Err(e) => {
            let _ = job.done.send(Err(e));
        }
    }
}

/// The K/V of the request's cached blocks, in one piece.
fn cached_kv(model: &Model, req: &GenerateRequest) -> Result<Kv, EngineError> {
    let cached: Vec<&Kv> = req.cached_kv.iter().map(|kv| &**kv).collect();
    let kv = match Kv::concat(&cached).map_err(failed)? {
        Some(kv) => kv,
        None => model.llama.empty_kv().map_err(failed)?,
    };
    if kv.len() != req.cached_tokens {
        return Err(failed(format!(
            "cache gave {} positions for {} cached tokens",
            kv.len(),
            req.cached_tokens
        )));
    }
    Ok(kv)
}

/// Runs each sequence's next token in one step and stores its new logits; a failed step ends
/// every sequence in it.
fn decode(model: &Model, batch: &mut [(u32, &mut Seq)]) {
    let mut steps: Vec<(u32, &mut Kv)> = batch
        .iter_mut()
        .map(|(token, seq)| (*token, &mut seq.kv))
        .collect();
    let result = model.llama.forward_batch(&mut steps);
    drop(steps);
    for (row, (_, seq)) in batch.iter_mut().enumerate() {
        match result.as_ref().map(|l| l.i(row)) {
            Ok(Ok(logits)) => seq.logits = Some(logits),
            Ok(Err(e)) => seq.end(Err(failed(e))),
            Err(e) => seq.end(Err(failed(e))),
        }
    }
}
