//! `mlx-serve kv-quality`: what a KV-cache format costs in quality, on your
//! model and your text. One sequence per format (16-bit, `--kv-bits`, the
//! `--turbo-kv` presets) decodes in one batched model call — the engine's
//! caches hold rows of different kinds side by side — so every format sees
//! exactly the same tokens:
//! - teacher-forced over a text: the prefix prefilled at 16 bits (as the server
//!   prefills a prompt), compressed, then each later token fed one at a time as
//!   a decode step; per position the KL divergence of the next-token
//!   distribution from the 16-bit row's, the log-probability of the actual next
//!   token (perplexity) and whether the top token agrees;
//! - needle in a haystack: a number hidden at a depth of a long text, asked for
//!   at the end through the chat template (a base model without one gets the
//!   question as text, followed by the start of the answer for it to
//!   complete); each format greedily answers.

use std::path::Path;
use std::time::Instant;

use mlx_rs_safe::{eval, memory, ops, Array, Dtype};
use serde::Serialize;
use serde_json::json;

use crate::cli::KvQualityArgs;
use crate::error::{Error, Result};
use crate::kv::{bytes_per_token, KvCompression, ModelCache, Phase, TurboPreset};
use crate::models::{self, LanguageModel};
use crate::tokenizer::Tokenizer;

/// One KV format under test.
struct Format {
    name: String,
    policy: Option<KvCompression>,
}

fn format(name: &str) -> Result<Format> {
    let unknown = || Error::Config(format!("--formats: unknown KV format {name:?}; the formats are fp16, kv2..kv8, balanced, compact and paper"));
    let policy = match name {
        "fp16" => None,
        n if n.starts_with("kv") => Some(KvCompression::affine(n[2..].parse().map_err(|_| unknown())?, 64, 0)?),
        preset if TurboPreset::parse(preset).is_ok() => Some(KvCompression::turbo(preset, i32::MAX)?),
        _ => return Err(unknown()),
    };
    Ok(Format { name: name.to_string(), policy })
}

#[derive(Debug, Serialize)]
pub struct FormatQuality {
    pub format: String,
    pub bytes_per_token: f64,
    /// Mean KL(16-bit ‖ this) of the next-token distributions, nats.
    pub kl_mean: f64,
    /// The largest per-position KL.
    pub kl_max: f64,
    pub perplexity: f64,
    /// Perplexity change against the 16-bit row, in percent.
    pub perplexity_delta_pct: f64,
    /// Positions whose most likely token equals the 16-bit row's, in percent.
    pub top1_agreement_pct: f64,
    /// Needles found, of those hidden.
    pub needles_found: usize,
    pub needles: usize,
}

#[derive(Debug, Serialize)]
pub struct QualityReport {
    pub model: String,
    pub text_tokens: usize,
    pub prefix_tokens: usize,
    pub formats: Vec<FormatQuality>,
    pub needle_trials: Vec<serde_json::Value>,
    pub seconds: f64,
}

/// `tokens` as a [rows, L] int32 input, the same for every row.
fn input(tokens: &[u32], rows: usize) -> Result<Array> {
    let ids: Vec<i32> = (0..rows).flat_map(|_| tokens.iter().map(|&t| t as i32)).collect();
    Ok(Array::from_slice(&ids, &[rows as i32, tokens.len() as i32])?)
}

/// A batch with one row per format, each holding `prompt` (prefilled once at
/// 16 bits in chunks of `chunk`, then compressed as decoding starts).
fn batch_of_formats(model: &dyn LanguageModel, prompt: &[u32], formats: &[Format], chunk: usize) -> Result<ModelCache> {
    let mut dense = ModelCache::new(&model.kv_layout().kinds)?;
    for part in prompt.chunks(chunk.max(1)) {
        model.forward(&input(part, 1)?, &mut dense)?;
        eval(&dense.state().iter().collect::<Vec<_>>())?;
        memory::clear_cache()?;
    }
    let snapshot = dense.snapshot(0)?;
    let mut rows = formats
        .iter()
        .map(|f| {
            let mut row = ModelCache::restore(&snapshot)?;
            row.compress(f.policy.as_ref(), Phase::Decode)?;
            Ok(row)
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter();
    let mut batch = rows.next().ok_or_else(|| Error::Config("no KV formats to compare".into()))?;
    batch.extend(rows)?;
    Ok(batch)
}

/// log_softmax of the last position's logits, float32: [rows, vocab].
fn log_probs(logits: &Array) -> Result<Array> {
    let s = logits.shape();
    let last = ops::reshape(&ops::slice_axis(logits, 1, s[1] - 1, s[1])?, &[s[0], s[2]])?;
    let last = ops::astype(&last, Dtype::Float32)?;
    Ok(ops::subtract(&last, &ops::logsumexp(&last, &[-1], true)?)?)
}

struct Totals {
    kl: Vec<f64>,
    kl_max: Vec<f64>,
    nll: Vec<f64>,
    agree: Vec<usize>,
    positions: usize,
}

/// Teacher-forces `text[prefix..]` through one row per format.
fn teacher_forced(model: &dyn LanguageModel, text: &[u32], prefix: usize, formats: &[Format], chunk: usize) -> Result<Totals> {
    let rows = formats.len();
    let mut cache = batch_of_formats(model, &text[..prefix - 1], formats, chunk)?;
    let mut t = Totals { kl: vec![0.0; rows], kl_max: vec![0.0; rows], nll: vec![0.0; rows], agree: vec![0; rows], positions: 0 };
    for pos in prefix - 1..text.len() - 1 {
        let lp = log_probs(&model.forward(&input(&text[pos..pos + 1], rows)?, &mut cache)?)?;
        let reference = ops::slice_axis(&lp, 0, 0, 1)?;
        let kl = ops::sum(&ops::multiply(&ops::exp(&reference)?, &ops::subtract(&reference, &lp)?)?, &[-1], false)?;
        let next = Array::from_slice(&[text[pos + 1] as i32], &[1, 1])?;
        let next = ops::broadcast_to(&next, &[rows as i32, 1])?;
        let nll = ops::negative(&ops::take_along_axis(&lp, &next, -1)?)?;
        let top = ops::argmax(&lp, -1, false)?;
        eval(&[&kl, &nll, &top])?;
        let (kl, nll, top) = (kl.to_vec::<f32>()?, nll.to_vec::<f32>()?, top.to_vec::<u32>()?);
        for r in 0..rows {
            t.kl[r] += kl[r].max(0.0) as f64;
            t.kl_max[r] = t.kl_max[r].max(kl[r] as f64);
            t.nll[r] += nll[r] as f64;
            t.agree[r] += usize::from(top[r] == top[0]);
        }
        t.positions += 1;
        if t.positions.is_multiple_of(256) {
            memory::clear_cache()?;
            log::info!("kv-quality: {} of {} positions", t.positions, text.len() - prefix);
        }
    }
    Ok(t)
}

/// The number hidden in trial (length `i`, depth `j`): five digits mixed from
/// the trial's place (splitmix64), none of them zero, so that no trial's
/// answer is a round number a model might say unprompted (the first trial's
/// was 10000).
fn needle_number(i: usize, j: usize) -> u32 {
    let mut z = ((i as u64) << 32 | j as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (0..5).fold(0, |n, k| n * 10 + 1 + ((z >> (8 * k)) % 9) as u32)
}

/// A haystack of `len` tokens cut from `filler`, with `needle` at `depth` (0..1).
fn haystack(tok: &Tokenizer, filler: &str, len: usize, depth: f64, needle: &str) -> Result<String> {
    let ids = tok.encode(filler, false)?;
    let mut cycled = Vec::with_capacity(len);
    while cycled.len() < len {
        cycled.extend(ids.iter().take(len - cycled.len()));
    }
    let at = ((len as f64) * depth) as usize;
    let before = tok.decode(&cycled[..at], true)?;
    let after = tok.decode(&cycled[at..], true)?;
    // At the next sentence end, so the needle reads as a sentence of its own.
    let cut = before.rfind(". ").map(|i| i + 2).unwrap_or(before.len());
    Ok(format!("{}{} {}{}", &before[..cut], needle, &before[cut..], after))
}

/// Greedy answers of every format to `prompt`, `max_tokens` long.
fn answers(model: &dyn LanguageModel, tok: &Tokenizer, prompt: &[u32], formats: &[Format], chunk: usize, max_tokens: usize) -> Result<Vec<String>> {
    let rows = formats.len();
    let mut cache = batch_of_formats(model, &prompt[..prompt.len() - 1], formats, chunk)?;
    let mut last: Vec<u32> = vec![prompt[prompt.len() - 1]; rows];
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); rows];
    for _ in 0..max_tokens {
        let ids: Vec<i32> = last.iter().map(|&t| t as i32).collect();
        let logits = model.forward(&Array::from_slice(&ids, &[rows as i32, 1])?, &mut cache)?;
        let top = ops::argmax(&log_probs(&logits)?, -1, false)?;
        last = ops::astype(&top, Dtype::Uint32)?.to_vec::<u32>()?;
        for (o, &t) in out.iter_mut().zip(&last) {
            o.push(t);
        }
    }
    out.iter().map(|ids| tok.decode(ids, true)).collect()
}

pub fn run(args: &KvQualityArgs) -> Result<QualityReport> {
    let start = Instant::now();
    let formats: Vec<Format> = args.formats.split(',').map(str::trim).filter(|s| !s.is_empty()).map(format).collect::<Result<_>>()?;
    if formats.first().map(|f| f.name.as_str()) != Some("fp16") {
        return Err(Error::Config("--formats must start with fp16 (the reference row)".into()));
    }
    let model = models::load(&args.model)?.model;
    let layout = model.kv_layout();
    let formats: Vec<Format> = formats
        .into_iter()
        .map(|f| Ok(Format { policy: f.policy.map(|p| p.for_model(layout.head_dim, layout.attention_sinks, layout.fixed_kv)).transpose()?, name: f.name }))
        .collect::<Result<_>>()?;
    let tok = Tokenizer::load(&args.model, None)?;
    let text = std::fs::read_to_string(&args.text).map_err(|e| Error::Config(format!("{}: {e}", args.text.display())))?;
    let ids = tok.encode(&text, true)?;
    if ids.len() < args.prefix + 2 {
        return Err(Error::Config(format!("{} has {} tokens; --prefix {} needs more", args.text.display(), ids.len(), args.prefix)));
    }
    let ids = &ids[..ids.len().min(args.tokens)];
    let totals = teacher_forced(model.as_ref(), ids, args.prefix, &formats, args.prefill_size)?;
    let mut needles = vec![0usize; formats.len()];
    let mut trials = Vec::new();
    for (i, &len) in args.niah_lengths.iter().enumerate() {
        for (j, &depth) in args.niah_depths.iter().enumerate() {
            let number = needle_number(i, j);
            let needle = format!("The special magic number is {number}.");
            let body = haystack(&tok, &text, len, depth, &needle)?;
            let question = "What is the special magic number mentioned in the text above? Answer with the number only.";
            let prompt = if tok.has_chat_template() {
                tok.encode_chat(&json!([{"role": "user", "content": format!("{body}\n\n{question}")}]), None)?
            } else {
                tok.encode(&format!("{body}\n\n{question}\nThe special magic number mentioned in the text above is"), true)?
            };
            // Room for a lead-in and five digits (many tokenizers spell numbers digit by digit).
            let said = answers(model.as_ref(), &tok, &prompt, &formats, args.prefill_size, 32)?;
            for (r, s) in said.iter().enumerate() {
                needles[r] += usize::from(s.contains(&number.to_string()));
            }
            log::info!("kv-quality: needle at {depth} of {len} tokens: {said:?}");
            trials.push(json!({"tokens": prompt.len(), "depth": depth, "number": number,
                               "answers": formats.iter().zip(&said).map(|(f, s)| json!({"format": f.name, "answer": s})).collect::<Vec<_>>()}));
        }
    }
    let n = totals.positions as f64;
    let ppl0 = (totals.nll[0] / n).exp();
    let formats = formats
        .iter()
        .enumerate()
        .map(|(r, f)| {
            let ppl = (totals.nll[r] / n).exp();
            FormatQuality {
                format: f.name.clone(),
                // Nominal sizes, as the formats' names say (fp16: 16-bit values).
                bytes_per_token: bytes_per_token(f.policy.as_ref(), &layout.kinds, layout.kv_heads, layout.head_dim, 16),
                kl_mean: totals.kl[r] / n,
                kl_max: totals.kl_max[r],
                perplexity: ppl,
                perplexity_delta_pct: 100.0 * (ppl / ppl0 - 1.0),
                top1_agreement_pct: 100.0 * totals.agree[r] as f64 / n,
                needles_found: needles[r],
                needles: trials.len(),
            }
        })
        .collect();
    Ok(QualityReport {
        model: args.model.display().to_string(),
        text_tokens: ids.len(),
        prefix_tokens: args.prefix,
        formats,
        needle_trials: trials,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The report as a Markdown table.
pub fn table(r: &QualityReport) -> String {
    let mut s = format!(
        "{} — {} tokens teacher-forced after a {}-token prefix; needles: {}\n\n| format | bytes/token | KL mean | KL max | perplexity | Δppl | top-1 agree | needles |\n|---|---|---|---|---|---|---|---|\n",
        Path::new(&r.model).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default(),
        r.text_tokens - r.prefix_tokens,
        r.prefix_tokens,
        r.needle_trials.len()
    );
    for f in &r.formats {
        s.push_str(&format!(
            "| {} | {:.0} | {:.5} | {:.3} | {:.3} | {:+.2}% | {:.1}% | {}/{} |\n",
            f.format, f.bytes_per_token, f.kl_mean, f.kl_max, f.perplexity, f.perplexity_delta_pct, f.top1_agreement_pct, f.needles_found, f.needles
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::needle_number;

    #[test]
    fn needle_numbers_have_five_nonzero_digits_and_differ_between_trials() {
        let numbers: Vec<u32> = (0..4).flat_map(|i| (0..5).map(move |j| needle_number(i, j))).collect();
        for n in &numbers {
            assert!((11_111..=99_999).contains(n), "{n}");
            assert!(!n.to_string().contains('0'), "{n} has a zero digit");
        }
        let mut distinct = numbers.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), numbers.len(), "every trial its own number: {numbers:?}");
        assert_eq!(needle_number(2, 3), needle_number(2, 3), "the same trial, the same number");
    }
}
