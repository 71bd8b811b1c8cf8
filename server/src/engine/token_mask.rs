//! A batch's grammar masks on the device: the host sends each row's allowed
//! tokens as bits (vocab / 32 words: 4 KB a row for a 128k vocabulary, where
//! a byte per token would be 128 KB to fill and copy each step); the device
//! expands them and masks the logits.

use mlx_rs_safe::{ops, Array, Dtype};

use crate::error::Result;

/// The expansion's constants for one vocabulary size: each token's word and bit.
pub struct TokenMask {
    vocab: usize,
    /// [vocab] int32: token t's word, t / 32.
    word: Array,
    /// [vocab] uint32: token t's bit in its word, t % 32.
    bit: Array,
}

impl TokenMask {
    pub fn new(vocab: usize) -> Result<TokenMask> {
        let word: Vec<i32> = (0..vocab as i32).map(|t| t / 32).collect();
        let bit: Vec<u32> = (0..vocab as u32).map(|t| t % 32).collect();
        Ok(TokenMask { vocab, word: Array::from_slice(&word, &[vocab as i32])?, bit: Array::from_slice(&bit, &[vocab as i32])? })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Words a row's bits take.
    pub fn words_per_row(&self) -> usize {
        self.vocab.div_ceil(32)
    }

    /// `logits` ([B, vocab]) with -inf where the row's bit in `words`
    /// ([B × words_per_row], token t at bit t % 32 of word t / 32) is clear.
    pub fn apply(&self, words: &[u32], logits: &Array) -> Result<Array> {
        let rows = (words.len() / self.words_per_row()) as i32;
        let words = Array::from_slice(words, &[rows, self.words_per_row() as i32])?;
        let per_token = ops::right_shift(&ops::take(&words, &self.word, 1)?, &self.bit)?;
        let allowed = ops::astype(&ops::bitwise_and(&per_token, &Array::scalar(1u32))?, Dtype::Bool)?;
        Ok(ops::where_(&allowed, logits, &Array::scalar(f32::NEG_INFINITY))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_bits_keep_their_logits_and_clear_ones_become_minus_infinity() {
        let vocab = 40;
        let mask = TokenMask::new(vocab).unwrap();
        // Row 0 allows tokens 0, 5 and 33; row 1 every token.
        let words = [1 | 1 << 5, 1 << 1, u32::MAX, u32::MAX];
        let logits: Vec<f32> = (0..2 * vocab).map(|i| i as f32).collect();
        let logits = Array::from_slice(&logits, &[2, vocab as i32]).unwrap();
        let out = mask.apply(&words, &logits).unwrap().to_vec::<f32>().unwrap();
        let kept: Vec<usize> = (0..vocab).filter(|&t| out[t].is_finite()).collect();
        assert_eq!(kept, vec![0, 5, 33]);
        assert_eq!(out[5], 5.0);
        assert!(out[vocab..].iter().enumerate().all(|(t, &v)| v == (vocab + t) as f32));
    }
}
