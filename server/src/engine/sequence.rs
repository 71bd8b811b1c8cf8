//! One request's state while it generates: its sampler, stop matcher and
//! detokenizer, the tokens so far, and the channel its events go to.

use std::time::Instant;


use super::request::{Event, Generation, Request, TokenLogprob, Usage};
use super::sampler::Sampler;
use super::stop::{FinishReason, StopMatcher};
use crate::kv::KV_STEP;
use crate::metrics::Metrics;
use crate::structured::Guide;
use crate::error::Result;
use crate::tokenizer::{StreamingDetokenizer, Tokenizer};

pub struct Sequence {
    pub request: Request,
    pub sampler: Sampler,
    stop: StopMatcher,
    detok: StreamingDetokenizer,
    /// Prompt and generated tokens: penalties read them; the prompt cache
    /// stores their KV when the sequence ends.
    pub history: Vec<u32>,
    generated: usize,
    /// Tokens it may generate: max_tokens, within the context.
    max_new_tokens: usize,
    /// Tokens of KV it may hold (see [`Sequence::reservation`]).
    reserved: usize,
    pub cached_tokens: usize,
    /// The prompt-cache entry this sequence started from: its own entry replaces it.
    pub cache_source: Option<u64>,
    last_token_at: Option<Instant>,
    /// Set once the sequence has ended (finished, cancelled or failed).
    pub finished: bool,
    /// The grammar its output follows: the decode step masks its logits with it.
    pub guide: Option<Guide>,
}

/// The `n` most likely tokens of a [vocab] log-probability row, best first.
/// A log-probability as the APIs report it: -9999 for a token that cannot be
/// drawn (masked by a grammar, -inf), as OpenAI reports it; JSON has no
/// infinity, and `null` breaks clients that type the field as a number.
fn reportable(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        -9999.0
    }
}

fn top_logprobs(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(idx.len());
    if n == 0 {
        return Vec::new();
    }
    let by_logprob = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]);
    idx.select_nth_unstable_by(n - 1, by_logprob);
    idx.truncate(n);
    idx.sort_by(by_logprob);
    idx.into_iter().map(|i| (i, reportable(row[i as usize]))).collect()
}

impl Sequence {
    pub fn new(mut request: Request, sampler: Sampler, tokenizer: &Tokenizer, cached_tokens: usize, context: Option<usize>) -> Sequence {
        let eos = if request.params.ignore_eos { Default::default() } else { tokenizer.eos_ids().clone() };
        Sequence {
            max_new_tokens: Sequence::max_new_tokens(&request.params, context),
            reserved: Sequence::reservation(&request.params, context),
            stop: StopMatcher::new(eos, request.params.stop.clone(), |s| tokenizer.special_token_id(s)),
            detok: StreamingDetokenizer::new(!request.params.keep_special_tokens),
            history: request.params.prompt.clone(),
            generated: 0,
            cached_tokens,
            cache_source: None,
            last_token_at: None,
            finished: false,
            guide: request.params.guide.take(),
            sampler,
            request,
        }
    }

    /// Tokens a request may generate: its max_tokens, within `context`
    /// tokens in all (a prompt that fills the context was refused before).
    fn max_new_tokens(params: &Generation, context: Option<usize>) -> usize {
        match context {
            Some(c) => params.max_tokens.min(c.saturating_sub(params.prompt.len()).max(1)),
            None => params.max_tokens,
        }
    }

    /// Tokens of KV a request may hold: its prompt and what it may generate,
    /// rounded up to the cache's allocation step.
    pub fn reservation(params: &Generation, context: Option<usize>) -> usize {
        let tokens = params.prompt.len().saturating_add(Sequence::max_new_tokens(params, context));
        tokens.div_ceil(KV_STEP).saturating_mul(KV_STEP)
    }

    /// Tokens of KV this sequence may hold (see [`Sequence::reservation`]).
    pub fn reserved_tokens(&self) -> usize {
        self.reserved
    }

    /// Whether the client is still listening.
    pub fn is_connected(&self) -> bool {
        !self.request.events.is_closed()
    }

    /// Sends an event; false if the client has gone away.
    pub fn send(&self, event: Event) -> bool {
        self.request.events.send(event).is_ok()
    }

    /// The tokens whose KV a cache of `held` positions holds once the
    /// sequence ends: all but the last sampled token, or all of them when a
    /// step queued ahead has fed it back.
    pub fn held_history(&self, held: usize) -> &[u32] {
        &self.history[..held.min(self.history.len())]
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.request.params.prompt.len(),
            completion_tokens: self.generated,
            cached_tokens: self.cached_tokens,
        }
    }

    /// Takes one sampled token (with its step's [vocab] log-probabilities when
    /// the request asked for them). Returns whether the sequence has ended.
    pub fn accept(&mut self, token: u32, logprobs: Option<&[f32]>, tokenizer: &Tokenizer, metrics: &Metrics) -> Result<bool> {
        let now = Instant::now();
        match self.last_token_at {
            None => metrics.observe_ttft(now.duration_since(self.request.arrived).as_secs_f64()),
            Some(t) => metrics.observe_inter_token(now.duration_since(t).as_secs_f64()),
        }
        self.last_token_at = Some(now);
        self.history.push(token);
        if self.stop.is_eos(token) {
            return self.finish(FinishReason::Stop, None, tokenizer, true);
        }
        if let Some(stop) = self.stop.stop_token(token) {
            let stop = stop.to_string();
            return self.finish(FinishReason::Stop, Some(stop), tokenizer, true);
        }
        if let Some(guide) = self.guide.as_mut() {
            if let Err(e) = guide.advance(token) {
                self.fail(&e);
                return Ok(true);
            }
        }
        self.generated += 1;
        metrics.add_generated_tokens(1);
        let logprob = match (self.request.params.logprobs, logprobs) {
            (Some(n), Some(row)) => {
                let lp = row.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
                Some(TokenLogprob { token, logprob: reportable(lp), top: top_logprobs(row, n) })
            }
            _ => None,
        };
        let piece = self.stop.push(&self.detok.push(tokenizer.inner(), token)?);
        if !self.send(Event::Token { token, text: piece.emit, logprob }) {
            // The client left after the step checked it was there: cancelled
            // here, as the step would have counted it a token later.
            metrics.record_cancelled();
            self.finished = true;
            return Ok(true);
        }
        if piece.stop.is_some() {
            return self.finish(FinishReason::Stop, piece.stop, tokenizer, false);
        }
        if self.guide.as_ref().is_some_and(Guide::is_done) {
            // The grammar is complete and nothing may follow: the end token it
            // would force next is not worth a step.
            return self.finish(FinishReason::Stop, None, tokenizer, true);
        }
        if self.generated >= self.max_new_tokens {
            return self.finish(FinishReason::Length, None, tokenizer, true);
        }
        Ok(false)
    }

    /// Ends the sequence: the held-back text goes out with the finish reason
    /// (and the stop string that ended it, if one did).
    fn finish(&mut self, reason: FinishReason, stop: Option<String>, tokenizer: &Tokenizer, flush: bool) -> Result<bool> {
        let mut text = String::new();
        let (mut reason, mut stop) = (reason, stop);
        if flush {
            let out = self.stop.push(&self.detok.finish(tokenizer.inner())?);
            text = out.emit;
            if out.stop.is_some() {
                (reason, stop) = (FinishReason::Stop, out.stop);
            } else {
                text.push_str(&self.stop.flush());
            }
        }
        self.send(Event::Done { text, finish_reason: reason, stop_sequence: stop, usage: self.usage() });
        self.finished = true;
        Ok(true)
    }

    /// Ends the sequence with an error message for its client.
    pub fn fail(&mut self, message: &str) {
        self.send(Event::Error(message.to_string()));
        self.finished = true;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{top_logprobs, Sequence};
    use crate::engine::request::{Generation, Request};
    use crate::engine::sampler::{Sampler, SamplingParams};
    use crate::metrics::{counter_value, Metrics};
    use crate::tokenizer::Tokenizer;

    /// A client that leaves between the step's check and its token's send
    /// ends the sequence as cancelled, as one gone before the check does.
    #[test]
    fn a_client_gone_before_its_token_is_sent_is_counted_cancelled() {
        let tokenizer = Tokenizer::two_words();
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        let params = Generation {
            prompt: vec![0],
            sampling: SamplingParams::default(),
            max_tokens: 8,
            stop: vec![],
            logprobs: None,
            ignore_eos: true,
            keep_special_tokens: false,
            guide: None,
            progress: false,
            checkpoints: vec![],
        };
        let mut seq = Sequence::new(Request { params, arrived: Instant::now(), events }, Sampler::greedy(), &tokenizer, 0, None);
        let metrics = Metrics::new();
        assert!(!seq.accept(1, None, &tokenizer, &metrics).unwrap(), "a listened-to token ended the sequence");
        drop(receiver);
        assert!(seq.accept(1, None, &tokenizer, &metrics).unwrap(), "a token no one receives should end the sequence");
        assert!(seq.finished);
        assert_eq!(counter_value(&metrics.render(), "mlx_serve_cancelled_total"), Some(1.0));
    }

    #[test]
    fn top_logprobs_are_the_largest_in_descending_order() {
        let row = [-3.0, -0.5, -2.0, -0.1, -9.0];
        assert_eq!(top_logprobs(&row, 3), vec![(3, -0.1), (1, -0.5), (2, -2.0)]);
        assert_eq!(top_logprobs(&row, 0), vec![]);
        assert_eq!(top_logprobs(&row, 10).len(), 5);
        // Tokens a grammar masked (-inf) are reported as -9999, never as null.
        let masked = [f32::NEG_INFINITY, -0.2, f32::NEG_INFINITY];
        let mut top = top_logprobs(&masked, 3);
        assert_eq!(top[0], (1, -0.2));
        top[1..].sort_by_key(|&(t, _)| t);
        assert_eq!(top[1..], [(0, -9999.0), (2, -9999.0)]);
    }
}
