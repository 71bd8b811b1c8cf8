//! Logits processing and sampling, following mlx-lm's `sample_utils`: logit
//! bias, repetition / presence / frequency penalties, then greedy or
//! temperature sampling filtered, in mlx-lm's order, by top-p, min-p, XTC and
//! top-k. Random draws use an explicit key split per step, so a seed
//! reproduces a whole generation.

use std::collections::HashMap;

use mlx_rs_safe::{ops, random, Array, Dtype};

use crate::error::{Error, Result};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability adds up to top_p
    /// (1 or 0 = off, as in mlx-lm).
    pub top_p: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: i32,
    /// Drop tokens less likely than min_p × the top probability (0 = off).
    pub min_p: f32,
    /// Divide positive / multiply negative logits of recent tokens (1 or 0 =
    /// off, as in mlx-lm).
    pub repetition_penalty: f32,
    pub repetition_context_size: usize,
    /// Subtracted once from the logit of every token among the last
    /// `presence_context_size` (prompt and generated; mlx-lm's semantics).
    pub presence_penalty: f32,
    pub presence_context_size: usize,
    /// Subtracted per occurrence of every token among the last
    /// `frequency_context_size`.
    pub frequency_penalty: f32,
    pub frequency_context_size: usize,
    pub logit_bias: HashMap<u32, f32>,
    pub seed: Option<u64>,
    /// XTC ("exclude top choices"): at each step, with this probability,
    /// drop every token more likely than the least likely one above
    /// `xtc_threshold` (0 = off).
    pub xtc_probability: f32,
    pub xtc_threshold: f32,
    /// Tokens XTC never drops (mlx_lm.server: "\n" and the end tokens).
    pub xtc_special_tokens: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_context_size: 20,
            presence_penalty: 0.0,
            presence_context_size: 20,
            frequency_penalty: 0.0,
            frequency_context_size: 20,
            logit_bias: HashMap::new(),
            seed: None,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            xtc_special_tokens: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Rejects values no sampler can use, naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |param: &'static str, message: String| Err(Error::InvalidParam { param, message });
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("top_p", format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if self.top_k < 0 {
            return bad("top_k", format!("top_k must be >= 0, got {}", self.top_k));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty >= 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", format!("repetition_penalty must be >= 0 (0 or 1: off), got {}", self.repetition_penalty));
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return bad("xtc_probability", format!("xtc_probability must be in [0, 1], got {}", self.xtc_probability));
        }
        // mlx-lm's apply_xtc refuses thresholds above 0.5 (two tokens cannot both exceed it).
        if !(0.0..=0.5).contains(&self.xtc_threshold) {
            return bad("xtc_threshold", format!("xtc_threshold must be in [0, 0.5], got {}", self.xtc_threshold));
        }
        Ok(())
    }

    /// Whether the repetition penalty acts (mlx-lm skips 0 as well as 1).
    fn penalizes_repetition(&self) -> bool {
        self.repetition_penalty != 1.0 && self.repetition_penalty != 0.0
    }
}

pub struct Sampler {
    params: SamplingParams,
    key: Array,
}

const NEG_INF: f32 = f32::NEG_INFINITY;

/// The seed of a request that names none: the clock's nanoseconds.
pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(fresh_seed);
        Ok(Sampler { key: random::key(seed)?, params })
    }

    pub fn greedy() -> Sampler {
        // Default params always validate; the key of seed 0 is a constant.
        Sampler::new(SamplingParams { seed: Some(0), ..Default::default() }).expect("default params are valid")
    }

    /// Greedy with no logits processing: a batch of such rows samples with one
    /// argmax over all of them.
    pub fn is_plain_greedy(&self) -> bool {
        self.params.temperature == 0.0 && self.params.logit_bias.is_empty() && !self.uses_history()
    }

    /// Whether processing needs the tokens generated so far.
    pub fn uses_history(&self) -> bool {
        self.params.penalizes_repetition()
            || self.params.presence_penalty != 0.0
            || self.params.frequency_penalty != 0.0
    }

    /// Applies logit bias and penalties to `logits` ([1, vocab]).
    pub fn process_logits(&self, history: &[u32], logits: &Array) -> Result<Array> {
        let mut logits = logits.clone();
        let p = &self.params;
        if !p.logit_bias.is_empty() {
            let (ids, bias): (Vec<i32>, Vec<f32>) = p.logit_bias.iter().map(|(&t, &b)| (t as i32, b)).unzip();
            let idx = Array::from_slice(&ids, &[1, ids.len() as i32])?;
            let cur = ops::take_along_axis(&logits, &idx, -1)?;
            let add = ops::astype(&Array::from_slice(&bias, &[1, bias.len() as i32])?, logits.dtype())?;
            logits = ops::put_along_axis(&logits, &idx, &ops::add(&cur, &add)?, -1)?;
        }
        if p.penalizes_repetition() && !history.is_empty() {
            let start = history.len().saturating_sub(p.repetition_context_size);
            let ids: Vec<i32> = history[start..].iter().map(|&t| t as i32).collect();
            let idx = Array::from_slice(&ids, &[1, ids.len() as i32])?;
            let sel = ops::take_along_axis(&logits, &idx, -1)?;
            let pen = Array::scalar(p.repetition_penalty);
            let sel = ops::where_(
                &ops::less(&sel, &Array::scalar(0.0f32))?,
                &ops::multiply(&sel, &pen)?,
                &ops::divide(&sel, &pen)?,
            )?;
            logits = ops::put_along_axis(&logits, &idx, &ops::astype(&sel, logits.dtype())?, -1)?;
        }
        // As mlx-lm applies them: presence, then frequency, each over its own
        // window of the newest tokens.
        let recent = |n: usize| -> Vec<i32> { history[history.len().saturating_sub(n)..].iter().map(|&t| t as i32).collect() };
        if p.presence_penalty != 0.0 && !history.is_empty() && p.presence_context_size > 0 {
            // Each token seen once, however often it occurs.
            let mut ids = recent(p.presence_context_size);
            ids.sort_unstable();
            ids.dedup();
            let idx = Array::from_slice(&ids, &[1, ids.len() as i32])?;
            let cur = ops::take_along_axis(&logits, &idx, -1)?;
            let pen = ops::astype(&Array::scalar(p.presence_penalty), logits.dtype())?;
            logits = ops::put_along_axis(&logits, &idx, &ops::subtract(&cur, &pen)?, -1)?;
        }
        if p.frequency_penalty != 0.0 && !history.is_empty() && p.frequency_context_size > 0 {
            // Once per occurrence: a scatter-add accumulates repeated ids.
            let ids = recent(p.frequency_context_size);
            let idx = Array::from_slice(&ids, &[1, ids.len() as i32])?;
            let minus = ops::astype(&Array::from_slice(&vec![-p.frequency_penalty; ids.len()], &[1, ids.len() as i32])?, logits.dtype())?;
            logits = ops::scatter_add_axis(&logits, &idx, &minus, -1)?;
        }
        Ok(logits)
    }

    /// Draws a token ([1]) from `logprobs` ([1, vocab]).
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        if self.params.temperature == 0.0 {
            return Ok(ops::argmax(logprobs, -1, false)?);
        }
        let (next_key, draw_key) = random::split2(&self.key)?;
        self.key = next_key;
        // XTC's coin gets a key of its own; without XTC the draws stay as they were.
        let (xtc_key, draw_key) = if self.params.xtc_probability > 0.0 { random::split2(&draw_key)? } else { (draw_key.clone(), draw_key) };
        let lp = self.filtered(logprobs, &xtc_key)?;
        let scaled = ops::multiply(&lp, &Array::scalar(1.0 / self.params.temperature))?;
        Ok(random::categorical(&scaled, -1, &draw_key)?)
    }

    /// `logprobs` with the tokens the filters drop at -inf, in mlx-lm's
    /// order (top-p, min-p, XTC, top-k: they do not commute, e.g. top-p
    /// measures the mass top-k would have dropped).
    fn filtered(&self, logprobs: &Array, xtc_key: &Array) -> Result<Array> {
        let p = &self.params;
        let mut lp = logprobs.clone();
        if p.top_p > 0.0 && p.top_p < 1.0 {
            lp = apply_top_p(&lp, p.top_p)?;
        }
        if p.min_p > 0.0 {
            lp = apply_min_p(&lp, p.min_p)?;
        }
        if p.xtc_probability > 0.0 {
            lp = apply_xtc(&lp, p.xtc_probability, p.xtc_threshold, &p.xtc_special_tokens, xtc_key)?;
        }
        if p.top_k > 0 {
            lp = apply_top_k(&lp, p.top_k)?;
        }
        Ok(lp)
    }
}

/// Keeps the `k` largest log-probabilities.
fn apply_top_k(lp: &Array, k: i32) -> Result<Array> {
    let v = lp.dim(-1)?;
    if k >= v {
        return Ok(lp.clone());
    }
    let neg = ops::negative(lp)?;
    let part = ops::argpartition(&neg, k - 1, -1)?;
    let drop = ops::slice(&part, &[0, k], &[1, v], &[1, 1])?;
    let fill = ops::full(&drop.shape(), &Array::scalar(NEG_INF), lp.dtype())?;
    Ok(ops::put_along_axis(lp, &drop, &fill, -1)?)
}

/// Keeps the most likely tokens until their probability reaches `top_p` of
/// the mass left (mlx-lm's apply_top_p: from the least likely up, a token
/// goes while the mass above it is at least top_p of the whole; ties with
/// the first kept token stay).
fn apply_top_p(lp: &Array, top_p: f32) -> Result<Array> {
    let sorted = ops::sort(lp, -1)?;
    let probs = ops::exp(&ops::astype(&sorted, Dtype::Float32)?)?;
    let mass_above = ops::cumsum(&probs, -1, true, false)?;
    let v = lp.dim(-1)?;
    let first = |a: &Array| -> Result<Array> { Ok(ops::slice(a, &[0, 0], &[1, 1], &[1, 1])?) };
    let total = ops::add(&first(&mass_above)?, &first(&probs)?)?;
    let dropped = ops::greater_equal(&mass_above, &ops::multiply(&Array::scalar(top_p), &total)?)?;
    let n_dropped = ops::sum(&ops::astype(&dropped, Dtype::Int32)?, &[-1], true)?;
    // Every token dropped (a zero top-p mass) leaves the most likely one.
    let n_dropped = ops::minimum(&n_dropped, &Array::scalar(v - 1))?;
    let threshold = ops::take_along_axis(&sorted, &n_dropped, -1)?;
    Ok(ops::where_(&ops::less(lp, &threshold)?, &Array::scalar(NEG_INF), lp)?)
}

/// mlx-lm's apply_xtc: with probability `probability` (one draw from
/// `key`), drops every token more likely than the least likely token above
/// `threshold`, except `special` ones; when none is above it, none goes.
fn apply_xtc(lp: &Array, probability: f32, threshold: f32, special: &[u32], key: &Array) -> Result<Array> {
    let probs = ops::softmax(lp, &[-1], false)?;
    let above = ops::where_(&ops::greater(&probs, &Array::scalar(threshold))?, &probs, &Array::scalar(f32::INFINITY))?;
    let least_above = ops::min(&above, &[-1], true)?;
    let mut drop = ops::greater(&probs, &least_above)?;
    // Ids past the logits (a tokenizer larger than the model's vocabulary) cannot be drawn anyway.
    let vocab = lp.dim(-1)?;
    let ids: Vec<i32> = special.iter().map(|&t| t as i32).filter(|&t| t < vocab).collect();
    if !ids.is_empty() {
        let idx = Array::from_slice(&ids, &[1, ids.len() as i32])?;
        let keep = ops::full(&idx.shape(), &Array::scalar(false), Dtype::Bool)?;
        drop = ops::put_along_axis(&drop, &idx, &keep, -1)?;
    }
    let coin = random::uniform(&Array::scalar(0.0f32), &Array::scalar(1.0f32), &[], Dtype::Float32, key)?;
    let dropped = ops::where_(&drop, &Array::scalar(NEG_INF), lp)?;
    Ok(ops::where_(&ops::greater(&coin, &Array::scalar(probability))?, lp, &dropped)?)
}

/// Drops tokens with probability below `min_p` × the top probability.
fn apply_min_p(lp: &Array, min_p: f32) -> Result<Array> {
    let top = ops::max(lp, &[-1], true)?;
    let threshold = ops::add(&top, &Array::scalar(min_p.ln()))?;
    Ok(ops::where_(&ops::less(lp, &threshold)?, &Array::scalar(NEG_INF), lp)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(v: &[f32]) -> Array {
        Array::from_slice(v, &[1, v.len() as i32]).unwrap()
    }

    fn token(a: &Array) -> u32 {
        ops::astype(a, Dtype::Uint32).unwrap().item::<u32>().unwrap()
    }

    /// Draws from the log-probabilities of `l` (what the generator passes).
    fn draws(params: SamplingParams, l: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params).unwrap();
        let x = logits(l);
        let lp = ops::subtract(&x, &ops::logsumexp(&x, &[-1], true).unwrap()).unwrap();
        (0..n).map(|_| token(&s.sample(&lp).unwrap())).collect()
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::greedy();
        assert_eq!(token(&s.sample(&logits(&[0.1, 2.0, -1.0, 1.9])).unwrap()), 1);
    }

    #[test]
    fn same_seed_same_draws_other_seed_other_draws() {
        let p = |seed| SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() };
        let flat = [0.0f32; 16];
        let a = draws(p(7), &flat, 32);
        assert_eq!(a, draws(p(7), &flat, 32));
        assert_ne!(a, draws(p(8), &flat, 32));
        assert!(a.iter().collect::<std::collections::BTreeSet<_>>().len() > 4, "{a:?}");
    }

    #[test]
    fn top_k_top_p_and_min_p_restrict_the_candidates() {
        let l = [3.0f32, 2.9, 0.0, -1.0, -2.0];
        let base = SamplingParams { temperature: 1.0, seed: Some(1), ..Default::default() };
        let k2 = draws(SamplingParams { top_k: 2, ..base.clone() }, &l, 200);
        assert!(k2.iter().all(|&t| t < 2) && k2.contains(&0) && k2.contains(&1));
        // exp(3)/(sum) ≈ 0.49, exp(2.9) ≈ 0.44: top_p 0.6 keeps exactly these two.
        let p = draws(SamplingParams { top_p: 0.6, ..base.clone() }, &l, 200);
        assert!(p.iter().all(|&t| t < 2) && p.contains(&1));
        let m = draws(SamplingParams { min_p: 0.5, ..base.clone() }, &l, 200);
        assert!(m.iter().all(|&t| t < 2));
        let all = draws(base, &l, 400);
        assert!(all.iter().any(|&t| t >= 2), "without filters every token can be drawn");
    }

    #[test]
    fn logit_bias_and_penalties_move_the_greedy_choice() {
        let l = logits(&[1.0, 0.5, 0.2]);
        let with = |p: SamplingParams, hist: &[u32]| {
            let mut s = Sampler::new(p).unwrap();
            let processed = s.process_logits(hist, &l).unwrap();
            token(&s.sample(&processed).unwrap())
        };
        let bias = HashMap::from([(2u32, 5.0f32)]);
        assert_eq!(with(SamplingParams { logit_bias: bias, ..Default::default() }, &[]), 2);
        // 1.0 / 3 < 0.5: the repeated token 0 loses to token 1.
        assert_eq!(with(SamplingParams { repetition_penalty: 3.0, ..Default::default() }, &[0, 0]), 1);
        assert_eq!(with(SamplingParams { presence_penalty: 0.6, ..Default::default() }, &[0]), 1);
        // frequency: 0.3 per occurrence × 2 = 0.6 off token 0.
        assert_eq!(with(SamplingParams { frequency_penalty: 0.3, ..Default::default() }, &[0, 0]), 1);
        assert_eq!(with(SamplingParams { frequency_penalty: 0.3, ..Default::default() }, &[0]), 0);
    }

    #[test]
    fn presence_and_frequency_penalties_count_only_their_windows_as_mlx_lm_does() {
        // Values and penalties in eighths: every sum exact.
        let l = logits(&[1.0, 0.5, 0.375]);
        let processed = |p: SamplingParams, hist: &[u32]| {
            let s = Sampler::new(p).unwrap();
            s.process_logits(hist, &l).unwrap().to_vec::<f32>().unwrap()
        };
        // Token 0 fifty times long ago, then 20 other tokens: outside the default window of 20.
        let mut hist = vec![0u32; 50];
        hist.extend([1u32, 2].repeat(10));
        let presence = SamplingParams { presence_penalty: 0.25, ..Default::default() };
        assert_eq!(processed(presence.clone(), &hist), vec![1.0, 0.25, 0.125]);
        let frequency = SamplingParams { frequency_penalty: 0.125, ..Default::default() };
        // 10 occurrences each of 1 and 2 in the window.
        assert_eq!(processed(frequency.clone(), &hist), vec![1.0, -0.75, -0.875]);
        // A wider window reaches token 0; presence counts it once, frequency per occurrence.
        assert_eq!(processed(SamplingParams { presence_context_size: 21, ..presence }, &hist)[0], 0.75);
        assert_eq!(processed(SamplingParams { frequency_context_size: 22, ..frequency.clone() }, &hist)[0], 0.75);
        assert_eq!(processed(SamplingParams { frequency_context_size: 0, ..frequency }, &hist), vec![1.0, 0.5, 0.375]);
    }

    /// The tokens `params`' filters leave of the distribution `probs`.
    fn kept(params: SamplingParams, probs: &[f32]) -> Vec<usize> {
        let s = Sampler::new(params).unwrap();
        let lp = ops::log(&logits(probs)).unwrap();
        let out = s.filtered(&lp, &random::key(3).unwrap()).unwrap().to_vec::<f32>().unwrap();
        out.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, _)| i).collect()
    }

    /// Each set below is what mlx-lm 0.32.2's sample_utils leave of the same
    /// distribution, in make_sampler's order (checked against it).
    #[test]
    fn filters_act_in_mlx_lms_order_with_its_arithmetic() {
        let probs = [0.4f32, 0.3, 0.2, 0.1];
        let base = SamplingParams { temperature: 1.0, ..Default::default() };
        assert_eq!(kept(SamplingParams { top_p: 0.5, ..base.clone() }, &probs), [0, 1]);
        assert_eq!(kept(SamplingParams { top_p: 0.75, ..base.clone() }, &probs), [0, 1, 2]);
        // top-p before top-k: top-k first would leave only token 0.
        assert_eq!(kept(SamplingParams { top_p: 0.5, top_k: 2, ..base.clone() }, &probs), [0, 1]);
        // XTC (applied at every step here) drops what is more likely than the
        // least likely token above the threshold, never a special token, and
        // nothing when no token is above it.
        let xtc = SamplingParams { xtc_probability: 1.0, xtc_threshold: 0.25, ..base.clone() };
        assert_eq!(kept(xtc.clone(), &probs), [1, 2, 3]);
        assert_eq!(kept(SamplingParams { xtc_special_tokens: vec![0], ..xtc.clone() }, &probs), [0, 1, 2, 3]);
        assert_eq!(kept(SamplingParams { xtc_threshold: 0.45, ..xtc.clone() }, &probs), [0, 1, 2, 3]);
        // After min-p, XTC measures the renormalized rest.
        assert_eq!(kept(SamplingParams { min_p: 0.6, ..xtc.clone() }, &probs), [1]);
        // A coin that never comes up leaves everything.
        assert_eq!(kept(SamplingParams { xtc_probability: 0.0, ..xtc }, &probs), [0, 1, 2, 3]);
    }

    #[test]
    fn xtc_drops_the_top_choice_at_about_its_probability() {
        let l = [3.0f32, 2.9, 0.0, -1.0, -2.0];
        let p = SamplingParams { temperature: 0.01, xtc_probability: 0.5, xtc_threshold: 0.3, seed: Some(5), ..Default::default() };
        // Nearly greedy: token 0, unless XTC dropped it (then token 1).
        let d = draws(p, &l, 400);
        let dropped = d.iter().filter(|&&t| t == 1).count();
        assert!(d.iter().all(|&t| t < 2), "{d:?}");
        assert!((140..=260).contains(&dropped), "XTC at 0.5 dropped the top choice {dropped} times in 400");
    }

    /// mlx_lm.server's own defaults, sent explicitly, turn the filters off.
    #[test]
    fn top_p_and_repetition_penalty_of_zero_are_off_as_in_mlx_lm() {
        let l = [3.0f32, 2.9, 0.0, -1.0, -2.0];
        let p = SamplingParams { temperature: 1.0, seed: Some(1), top_p: 0.0, repetition_penalty: 0.0, ..Default::default() };
        assert!(!Sampler::new(p.clone()).unwrap().uses_history());
        let all = draws(p, &l, 400);
        assert!(all.iter().any(|&t| t >= 2), "top_p 0 filtered: {all:?}");
    }

    #[test]
    fn invalid_values_are_rejected_with_the_field_name() {
        let bad = [
            SamplingParams { temperature: -1.0, ..Default::default() },
            SamplingParams { top_p: 1.5, ..Default::default() },
            SamplingParams { top_k: -3, ..Default::default() },
            SamplingParams { min_p: 1.5, ..Default::default() },
            SamplingParams { repetition_penalty: -1.0, ..Default::default() },
            SamplingParams { presence_penalty: 2.5, ..Default::default() },
            SamplingParams { xtc_probability: 1.5, ..Default::default() },
            SamplingParams { xtc_threshold: 0.6, ..Default::default() },
        ];
        let fields = ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "xtc_probability", "xtc_threshold"];
        for (p, f) in bad.into_iter().zip(fields) {
            let e = Sampler::new(p).err().unwrap().to_string();
            assert!(e.contains(f), "{e}");
        }
    }
}
