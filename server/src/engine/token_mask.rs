//! A batch's grammar masks on the device: the host sends each row's allowed
//! tokens as bits (vocab / 32 words: 16 KB a row for a 128k vocabulary, where
//! a byte per token would be 128 KB to fill and copy each step); the device
//! expands them and masks the logits.
//!
//! Rows are kept on the device by content ([`MaskRows`]): a grammar's masks
//! repeat (every string body, every object key, every comma allows the same
//! tokens as the last one did), and on CUDA an upload of host data goes
//! through MLX's managed memory, whose recycled pages cost ~25 µs each to
//! write: more than llguidance takes to compute the mask.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use mlx_rs_safe::compile::Compiled;
use mlx_rs_safe::{ops, Array, Dtype};
use rustc_hash::FxHasher;

use crate::error::Result;
use crate::models::compiled::call_compiled;

/// Device memory the kept rows may take: ~1000 rows of a 128k vocabulary,
/// more distinct masks than a few concurrent schemas produce.
pub const KEPT_ROWS_BYTES: usize = 16 << 20;

/// Words a row's bits take for a vocabulary of `vocab` tokens.
pub fn words_per_row(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// How a batch's mask rows reached the device.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RowSources {
    /// Rows copied from the host this step.
    pub uploaded: usize,
    /// Rows already on the device from an earlier step (or an earlier row).
    pub reused: usize,
}

/// One row kept on the device, with the host bits it was made from (compared
/// in full on a hash match, so a collision can never pick the wrong mask).
struct Kept {
    bits: Box<[u32]>,
    row: Array,
    last_used: u64,
}

/// Mask rows on the device, keyed by their bits, least recently used evicted.
pub struct MaskRows {
    budget_bytes: usize,
    width: usize,
    kept: HashMap<u64, Vec<Kept>, BuildHasherDefault<FxHasher>>,
    len: usize,
    clock: u64,
}

impl MaskRows {
    /// An empty store whose rows take at most `budget_bytes` (at least one row
    /// is always kept).
    pub fn new(budget_bytes: usize) -> MaskRows {
        MaskRows { budget_bytes, width: 0, kept: HashMap::default(), len: 0, clock: 0 }
    }

    /// Rows on the device now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// The [B, width] device array of `words` (B rows of `width` words each),
    /// uploading only the rows not already kept.
    pub fn device_rows(&mut self, words: &[u32], width: usize) -> Result<(Array, RowSources)> {
        if width == 0 || words.is_empty() || !words.len().is_multiple_of(width) {
            return Err(crate::error::Error::Internal("grammar mask rows of a width that does not divide them"));
        }
        if width != self.width {
            self.kept.clear();
            self.len = 0;
            self.width = width;
        }
        let mut sources = RowSources::default();
        let mut rows = Vec::with_capacity(words.len() / width);
        for bits in words.chunks(width) {
            self.clock += 1;
            let key = content_key(bits);
            if let Some(k) = self.kept.get_mut(&key).and_then(|same| same.iter_mut().find(|k| *k.bits == *bits)) {
                k.last_used = self.clock;
                rows.push(k.row.clone());
                sources.reused += 1;
                continue;
            }
            let row = Array::from_slice(bits, &[1, width as i32])?;
            self.make_room();
            self.kept.entry(key).or_default().push(Kept { bits: bits.into(), row: row.clone(), last_used: self.clock });
            self.len += 1;
            rows.push(row);
            sources.uploaded += 1;
        }
        let batch = match rows.as_slice() {
            [one] => one.clone(),
            _ => ops::concatenate(&rows.iter().collect::<Vec<_>>(), 0)?,
        };
        Ok((batch, sources))
    }

    /// Evicts the least recently used row when one more would pass the budget.
    fn make_room(&mut self) {
        let capacity = (self.budget_bytes / (self.width * 4).max(1)).max(1);
        if self.len < capacity {
            return;
        }
        let oldest = self
            .kept
            .iter()
            .flat_map(|(&key, same)| same.iter().enumerate().map(move |(i, k)| (k.last_used, key, i)))
            .min();
        if let Some((_, key, i)) = oldest {
            if let Some(same) = self.kept.get_mut(&key) {
                same.swap_remove(i);
                if same.is_empty() {
                    self.kept.remove(&key);
                }
                self.len -= 1;
            }
        }
    }
}

fn content_key(bits: &[u32]) -> u64 {
    let mut h = FxHasher::default();
    bits.hash(&mut h);
    h.finish()
}

/// `logits` ([B, vocab]) with -inf where the row's bit in `rows` ([B,
/// words_per_row] uint32, token t at bit t % 32 of word t / 32) is clear.
///
/// The logits are viewed as [B, words, 32] (padded with -inf to a whole last
/// word), so bit j of word w lines up with token 32w + j by broadcasting alone:
/// one fused elementwise kernel, where a gather of each token's word took
/// eight ops, and on CUDA each op's launch is host time on a host-bound step.
pub fn apply(rows: &Array, logits: &Array) -> Result<Array> {
    let (batch, vocab) = (logits.dim(0)?, logits.dim(-1)?);
    let width = words_per_row(vocab as usize) as i32;
    let padded = width * 32;
    let whole = if padded == vocab {
        logits.clone()
    } else {
        let minus_inf = ops::scalar_as(f32::NEG_INFINITY, logits.dtype())?;
        ops::pad(logits, &[1], &[0], &[padded - vocab], &minus_inf)?
    };
    let inputs = [
        ops::reshape(rows, &[batch, width, 1])?,
        BIT_POSITIONS.with(|b| b.clone()).ok_or(crate::error::Error::Internal("no bit positions for the mask"))?,
        ops::reshape(&whole, &[batch, width, 32])?,
    ];
    let masked = call_compiled(&MASK, mask_graph, &inputs.iter().collect::<Vec<_>>())?;
    let masked = ops::reshape(&masked, &[batch, padded])?;
    Ok(if padded == vocab { masked } else { ops::slice(&masked, &[0, 0], &[batch, vocab], &[1, 1])? })
}

/// where(bit j of word w is set, logits[b, w, j], -inf) for rows [B, W, 1],
/// bit positions [32] and logits [B, W, 32].
fn mask_graph(a: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    let bit = ops::bitwise_and(&ops::right_shift(&a[0], &a[1])?, &Array::scalar(1u32))?;
    let minus_inf = ops::scalar_as(f32::NEG_INFINITY, a[2].dtype())?;
    Ok(vec![ops::where_(&ops::astype(&bit, Dtype::Bool)?, &a[2], &minus_inf)?])
}

thread_local! {
    // Compiled once per thread (the engine thread), shapeless: MLX fuses the
    // shift, the and and the select into one kernel for every batch size.
    static MASK: Option<Compiled> = Compiled::new(mask_graph, true).ok();
    // 0..32, made once: an upload of host data each step costs more than the step's mask.
    static BIT_POSITIONS: Option<Array> = ops::arange(0.0, 32.0, 1.0, Dtype::Uint32).ok();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_rows(store: &mut MaskRows, words: &[u32], width: usize) -> (Vec<u32>, RowSources) {
        let (rows, sources) = store.device_rows(words, width).unwrap();
        assert_eq!(rows.shape(), vec![(words.len() / width) as i32, width as i32]);
        (rows.to_vec::<u32>().unwrap(), sources)
    }

    #[test]
    fn set_bits_keep_their_logits_and_clear_ones_become_minus_infinity() {
        let vocab = 40;
        // Row 0 allows tokens 0, 5 and 33; row 1 every token.
        let words = [1 | 1 << 5, 1 << 1, u32::MAX, u32::MAX];
        let logits: Vec<f32> = (0..2 * vocab).map(|i| i as f32).collect();
        let logits = Array::from_slice(&logits, &[2, vocab as i32]).unwrap();
        let (rows, _) = MaskRows::new(KEPT_ROWS_BYTES).device_rows(&words, words_per_row(vocab)).unwrap();
        let out = apply(&rows, &logits).unwrap().to_vec::<f32>().unwrap();
        let kept: Vec<usize> = (0..vocab).filter(|&t| out[t].is_finite()).collect();
        assert_eq!(kept, vec![0, 5, 33]);
        assert_eq!(out[5], 5.0);
        assert!(out[vocab..].iter().enumerate().all(|(t, &v)| v == (vocab + t) as f32));
    }

    #[test]
    fn a_vocabulary_of_whole_words_is_masked_in_the_logits_own_dtype() {
        let (rows, vocab) = (3usize, 64usize);
        // Row b allows the tokens t with t % 3 == b.
        let mut words = vec![0u32; rows * 2];
        for b in 0..rows {
            for t in (b..vocab).step_by(3) {
                words[b * 2 + t / 32] |= 1 << (t % 32);
            }
        }
        let logits: Vec<f32> = (0..rows * vocab).map(|i| (i % 7) as f32).collect();
        let logits = ops::astype(&Array::from_slice(&logits, &[rows as i32, vocab as i32]).unwrap(), Dtype::Bfloat16).unwrap();
        let (device, _) = MaskRows::new(KEPT_ROWS_BYTES).device_rows(&words, words_per_row(vocab)).unwrap();
        let out = apply(&device, &logits).unwrap();
        assert_eq!((out.dtype(), out.shape()), (Dtype::Bfloat16, vec![rows as i32, vocab as i32]));
        let out = ops::astype(&out, Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        for (i, v) in out.iter().enumerate() {
            let (b, t) = (i / vocab, i % vocab);
            if t % 3 == b {
                assert_eq!(*v, (i % 7) as f32, "row {b} token {t}");
            } else {
                assert_eq!(*v, f32::NEG_INFINITY, "row {b} token {t}");
            }
        }
    }

    #[test]
    fn a_row_seen_before_is_reused_and_new_rows_are_uploaded() {
        let mut store = MaskRows::new(KEPT_ROWS_BYTES);
        let (a, b, c) = ([1u32, 2], [3u32, 4], [5u32, 6]);
        let first: Vec<u32> = [a, b, a].concat();
        let (got, sources) = kept_rows(&mut store, &first, 2);
        assert_eq!(got, first);
        // The third row matches the first one of the same step.
        assert_eq!(sources, RowSources { uploaded: 2, reused: 1 });
        let second: Vec<u32> = [c, b].concat();
        let (got, sources) = kept_rows(&mut store, &second, 2);
        assert_eq!(got, second);
        assert_eq!(sources, RowSources { uploaded: 1, reused: 1 });
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn rows_with_equal_keys_but_other_bits_are_told_apart() {
        let mut store = MaskRows::new(KEPT_ROWS_BYTES);
        let (a, b) = ([7u32, 8], [9u32, 10]);
        store.device_rows(&a, 2).unwrap();
        // Force b under a's key, as a hash collision would.
        let key = content_key(&a);
        let row = Array::from_slice(&b, &[1, 2]).unwrap();
        store.kept.get_mut(&key).unwrap().push(Kept { bits: b.into(), row, last_used: 0 });
        store.len += 1;
        let (got, sources) = kept_rows(&mut store, &a, 2);
        assert_eq!((got, sources.reused), (a.to_vec(), 1));
        // b under its own key is not found: uploaded, never confused with a.
        let (got, sources) = kept_rows(&mut store, &b, 2);
        assert_eq!((got, sources.uploaded), (b.to_vec(), 1));
    }

    #[test]
    fn the_least_recently_used_row_goes_when_the_budget_is_full() {
        // Room for two rows of two words.
        let mut store = MaskRows::new(16);
        let (a, b, c) = ([1u32, 1], [2u32, 2], [3u32, 3]);
        store.device_rows(&a, 2).unwrap();
        store.device_rows(&b, 2).unwrap();
        store.device_rows(&a, 2).unwrap(); // a is now newer than b
        store.device_rows(&c, 2).unwrap(); // evicts b
        assert_eq!(store.len(), 2);
        assert_eq!(kept_rows(&mut store, &a, 2).1.reused, 1);
        assert_eq!(kept_rows(&mut store, &c, 2).1.reused, 1);
        assert_eq!(kept_rows(&mut store, &b, 2).1.uploaded, 1);
    }

    #[test]
    fn another_row_width_starts_afresh() {
        let mut store = MaskRows::new(KEPT_ROWS_BYTES);
        store.device_rows(&[1, 2], 2).unwrap();
        let (got, sources) = kept_rows(&mut store, &[1, 2], 1);
        assert_eq!((got, sources.uploaded), (vec![1, 2], 2));
        assert_eq!(store.len(), 2);
    }
}
