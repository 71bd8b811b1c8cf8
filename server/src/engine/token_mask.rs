//! A batch's grammar masks on the device: the host sends each row's allowed
//! tokens as bits (vocab / 32 words: 4 KB a row for a 128k vocabulary, where
//! a byte per token would be 128 KB to fill and copy each step); the device
//! expands them and masks the logits.

use mlx_rs_safe::{ops, Array, Dtype};

use crate::error::Result;

/// Words a row's bits take for a vocabulary of `vocab` tokens.
pub fn words_per_row(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// `logits` ([B, vocab]) with -inf where the row's bit in `words`
/// ([B × words_per_row], token t at bit t % 32 of word t / 32) is clear.
/// Each token's word and bit are derived on the device (an upload of host
/// data costs far more than the arange).
pub fn apply(words: &[u32], logits: &Array) -> Result<Array> {
    let vocab = logits.dim(-1)?;
    let width = words_per_row(vocab as usize);
    let rows = (words.len() / width) as i32;
    let words = Array::from_slice(words, &[rows, width as i32])?;
    let token = ops::arange(0.0, vocab as f64, 1.0, Dtype::Uint32)?;
    let word = ops::right_shift(&token, &Array::scalar(5u32))?;
    let bit = ops::bitwise_and(&token, &Array::scalar(31u32))?;
    let per_token = ops::right_shift(&ops::take(&words, &word, 1)?, &bit)?;
    let allowed = ops::astype(&ops::bitwise_and(&per_token, &Array::scalar(1u32))?, Dtype::Bool)?;
    Ok(ops::where_(&allowed, logits, &Array::scalar(f32::NEG_INFINITY))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_bits_keep_their_logits_and_clear_ones_become_minus_infinity() {
        let vocab = 40;
        // Row 0 allows tokens 0, 5 and 33; row 1 every token.
        let words = [1 | 1 << 5, 1 << 1, u32::MAX, u32::MAX];
        let logits: Vec<f32> = (0..2 * vocab).map(|i| i as f32).collect();
        let logits = Array::from_slice(&logits, &[2, vocab as i32]).unwrap();
        let out = apply(&words, &logits).unwrap().to_vec::<f32>().unwrap();
        let kept: Vec<usize> = (0..vocab).filter(|&t| out[t].is_finite()).collect();
        assert_eq!(kept, vec![0, 5, 33]);
        assert_eq!(out[5], 5.0);
        assert!(out[vocab..].iter().enumerate().all(|(t, &v)| v == (vocab + t) as f32));
    }
}
