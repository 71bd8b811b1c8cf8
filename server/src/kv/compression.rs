//! When and how a sequence's cache is compressed as it grows.

use super::store::KvKind;
use super::turbo::{KeyCode, TurboFormat, SINKS};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCompression {
    /// `--kv-bits`: affine quantization once a sequence holds `start` tokens
    /// (mlx-lm's `quantized_kv_start`); sliding-window layers stay as they are.
    Affine { bits: i32, group_size: i32, start: i32 },
    /// `--turbo-kv`: TurboQuant when decoding starts, or chunk by chunk during
    /// the prefill of a prompt longer than `prefill_threshold` tokens (so a long
    /// prompt never holds its whole uncompressed KV). Sliding-window layers
    /// stay as they are. Values take `value_bits` (set for the model's head
    /// dimension by [`KvCompression::for_model`]).
    Turbo { preset: TurboPreset, prefill_threshold: i32, value_bits: u8 },
}

/// The TurboQuant presets (`--turbo-kv PRESET`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurboPreset {
    /// K 8-bit affine after the rotation, V 3-bit codebook.
    Balanced,
    /// K 4-bit codebook, V 3-bit; the first and last 2 layers keep 8-bit K.
    Compact,
    /// K 3-bit codebook + 1-bit QJL residual, V 3-bit: the recipe the seed
    /// system published, kept so it can be measured against the others.
    Paper,
}

impl TurboPreset {
    pub const ALL: [TurboPreset; 3] = [TurboPreset::Balanced, TurboPreset::Compact, TurboPreset::Paper];

    pub fn parse(name: &str) -> Result<TurboPreset> {
        TurboPreset::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
            Error::Config(format!("--turbo-kv takes one of balanced, compact, paper; got {name:?}"))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            TurboPreset::Balanced => "balanced",
            TurboPreset::Compact => "compact",
            TurboPreset::Paper => "paper",
        }
    }

    /// The format of the `layer`-th of a model's `layers` full-attention
    /// layers (those that keep every position: sliding-window and recurrent
    /// layers are not counted), values at `value_bits`.
    pub fn format(self, layer: usize, layers: usize, value_bits: u8) -> TurboFormat {
        let key = match self {
            TurboPreset::Balanced => KeyCode::Affine8,
            TurboPreset::Compact if layer < 2 || layer + 2 >= layers => KeyCode::Affine8,
            TurboPreset::Compact => KeyCode::Codebook(4),
            TurboPreset::Paper => KeyCode::CodebookQjl(3),
        };
        TurboFormat { key, value_bits }
    }
}

/// When a compression decision is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// After a prefill chunk.
    Prefill,
    /// When decoding starts, and after each decode step.
    Decode,
}

/// Where a compression decision is made: which full-attention layer of how
/// many (see [`attention_ranks`]), and when.
#[derive(Debug, Clone, Copy)]
pub struct CompressAt {
    pub layer: usize,
    pub layers: usize,
    pub phase: Phase,
}

/// Bit widths MLX's affine quantization takes.
pub const AFFINE_BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine quantization takes.
pub const AFFINE_GROUP_SIZES: [i32; 3] = [32, 64, 128];

impl KvCompression {
    /// `--kv-bits`/`--kv-group-size`/`--quantized-kv-start`, checked.
    pub fn affine(bits: i32, group_size: i32, start: i32) -> Result<KvCompression> {
        if !AFFINE_BITS.contains(&bits) {
            return Err(Error::Config(format!("--kv-bits must be one of 2, 3, 4, 5, 6, 8; got {bits}")));
        }
        if !AFFINE_GROUP_SIZES.contains(&group_size) {
            return Err(Error::Config(format!("--kv-group-size must be 32, 64 or 128; got {group_size}")));
        }
        if start < 0 {
            return Err(Error::Config(format!("--quantized-kv-start must be >= 0; got {start}")));
        }
        Ok(KvCompression::Affine { bits, group_size, start })
    }

    /// `--turbo-kv PRESET` with its prefill threshold, checked.
    pub fn turbo(preset: &str, prefill_threshold: i32) -> Result<KvCompression> {
        if prefill_threshold < SINKS {
            return Err(Error::Config(format!("--turbo-kv-prefill-threshold must be at least {SINKS}; got {prefill_threshold}")));
        }
        Ok(KvCompression::Turbo { preset: TurboPreset::parse(preset)?, prefill_threshold, value_bits: 3 })
    }

    /// Prompt tokens a 16-bit store holds before this policy converts it
    /// during the prefill (its compressed store holds the rest).
    pub fn converts_after(&self) -> i32 {
        match *self {
            KvCompression::Affine { start, .. } => start,
            KvCompression::Turbo { prefill_threshold, .. } => prefill_threshold,
        }
    }

    /// The kind a row of `kind` holding `tokens` tokens converts to now, if any.
    pub fn target(&self, kind: &KvKind, tokens: i32, at: CompressAt) -> Option<KvKind> {
        match (*self, kind) {
            (KvCompression::Affine { bits, group_size, start }, KvKind::Dense) if tokens >= start => {
                Some(KvKind::Affine { group_size, bits })
            }
            // A row needs its sinks before anything is compressed.
            (KvCompression::Turbo { preset, prefill_threshold, value_bits }, KvKind::Dense)
                if tokens >= SINKS && (at.phase == Phase::Decode || tokens >= prefill_threshold) =>
            {
                Some(KvKind::Turbo(preset.format(at.layer, at.layers, value_bits)))
            }
            _ => None,
        }
    }

    /// The policy for a model of head dimension `head_dim` (whose attention
    /// has learned sinks when `sinks`), checked at start-up. TurboQuant values
    /// take 4 bits at d ≤ 64, where 3-bit codes cost markedly more (the brief:
    /// d = 64 is the fragile case), else 3.
    pub fn for_model(self, head_dim: i32, sinks: bool, fixed: Option<&str>) -> Result<KvCompression> {
        if let Some(why) = fixed {
            return Err(Error::Config(format!("--kv-bits and --turbo-kv do not apply: {why}")));
        }
        match self {
            KvCompression::Turbo { .. } if sinks => Err(Error::Config(
                "--turbo-kv: this model's attention has learned sinks (gpt-oss), which TurboQuant's attention does not take; use --kv-bits instead".into(),
            )),
            KvCompression::Affine { group_size, .. } if head_dim % group_size != 0 => Err(Error::Config(format!(
                "--kv-group-size {group_size} does not divide the model's head dimension {head_dim}"
            ))),
            // The rotation is a Hadamard transform (powers of two); 8-bit keys are one
            // affine group per head, and MLX's smallest group is 32.
            KvCompression::Turbo { .. } if !(head_dim.count_ones() == 1 && (32..=512).contains(&head_dim)) => Err(Error::Config(format!(
                "--turbo-kv needs a power-of-two head dimension between 32 and 512; this model's is {head_dim}"
            ))),
            KvCompression::Turbo { preset, prefill_threshold, .. } => {
                Ok(KvCompression::Turbo { preset, prefill_threshold, value_bits: if head_dim <= 64 { 4 } else { 3 } })
            }
            affine => Ok(affine),
        }
    }

    /// The bits per dimension (keys, values) layer `layer` of `layers` stores
    /// in its kind `kind` under this policy, for activations of
    /// `element_bits`; None when the layer is not compressed.
    fn bits_per_dim(&self, kind: &KvKind, layer: usize, layers: usize, head_dim: i32, element_bits: u32) -> Option<(f64, f64)> {
        match (*self, kind) {
            (KvCompression::Affine { bits, group_size, .. }, KvKind::Dense) => {
                // A scale and a bias per group, in the activations' dtype.
                let b = bits as f64 + 2.0 * element_bits as f64 / group_size as f64;
                Some((b, b))
            }
            (KvCompression::Turbo { preset, value_bits, .. }, KvKind::Dense) => {
                Some(preset.format(layer, layers, value_bits).bits_per_dim(head_dim))
            }
            _ => None,
        }
    }

    /// The `--kv-bits` setting, for /health.
    pub fn affine_bits(&self) -> Option<i32> {
        match *self {
            KvCompression::Affine { bits, .. } => Some(bits),
            KvCompression::Turbo { .. } => None,
        }
    }

    /// The `--turbo-kv` preset, for /health and /metrics.
    pub fn turbo_preset(&self) -> Option<TurboPreset> {
        match *self {
            KvCompression::Turbo { preset, .. } => Some(preset),
            KvCompression::Affine { .. } => None,
        }
    }
}

/// KV bytes per token of a model whose layers hold `kinds` (before
/// compression), `kv_heads` × `head_dim` each, with activations of
/// `element_bits` (16, or 32 for float32 models): nominal (values of that
/// size uncompressed; TurboQuant's 16-bit norms and scales compressed;
/// sliding-window layers count in full, though they stop growing at their
/// window).
pub fn bytes_per_token(policy: Option<&KvCompression>, kinds: &[KvKind], kv_heads: i32, head_dim: i32, element_bits: u32) -> f64 {
    let (ranks, layers) = attention_ranks(kinds.iter().map(KvKind::keeps_every_position));
    let per_layer = |layer: usize, kind: &KvKind| {
        if let KvKind::Recurrent { .. } = kind {
            // A fixed-size state per sequence, not per token.
            return 0.0;
        }
        let uncompressed = element_bits as f64;
        let (k, v) = policy.and_then(|p| p.bits_per_dim(kind, layer, layers, head_dim, element_bits)).unwrap_or((uncompressed, uncompressed));
        kv_heads as f64 * head_dim as f64 * (k + v) / 8.0
    };
    kinds.iter().zip(ranks).map(|(k, rank)| per_layer(rank, k)).sum()
}

/// Each layer's place among the full-attention layers (`attention`: whether
/// each layer is one), and how many there are: what a preset that treats the
/// first and last attention layers apart (`compact`) counts by, so hybrid and
/// sliding-window models protect their first and last attention layers, not
/// whatever layers come first. A layer that is not one gets the place of the
/// next that is. (A pipeline stage counts its own layers.)
pub fn attention_ranks(attention: impl Iterator<Item = bool>) -> (Vec<usize>, usize) {
    let mut count = 0;
    let ranks = attention
        .map(|a| {
            let rank = count;
            count += usize::from(a);
            rank
        })
        .collect();
    (ranks, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_settings_are_checked_and_name_the_flag() {
        assert!(KvCompression::affine(8, 64, 0).is_ok());
        assert!(KvCompression::affine(7, 64, 0).unwrap_err().to_string().contains("--kv-bits"));
        assert!(KvCompression::affine(4, 48, 0).unwrap_err().to_string().contains("--kv-group-size"));
        assert!(KvCompression::affine(4, 64, -1).unwrap_err().to_string().contains("--quantized-kv-start"));
    }

    fn at(layer: usize, phase: Phase) -> CompressAt {
        CompressAt { layer, layers: 8, phase }
    }

    #[test]
    fn only_dense_rows_past_the_start_are_quantized() {
        let c = KvCompression::affine(4, 64, 100).unwrap();
        let now = at(0, Phase::Prefill);
        assert_eq!(c.target(&KvKind::Dense, 99, now), None);
        assert_eq!(c.target(&KvKind::Dense, 100, now), Some(KvKind::Affine { group_size: 64, bits: 4 }));
        assert_eq!(c.target(&KvKind::Rotating { max_size: 512 }, 1000, now), None);
        assert_eq!(c.target(&KvKind::Affine { group_size: 64, bits: 4 }, 1000, now), None);
    }

    #[test]
    fn turbo_compresses_when_decoding_starts_or_past_the_prefill_threshold() {
        let c = KvCompression::turbo("balanced", 8192).unwrap().for_model(128, false, None).unwrap();
        let balanced = Some(KvKind::Turbo(TurboFormat { key: KeyCode::Affine8, value_bits: 3 }));
        assert_eq!(c.target(&KvKind::Dense, 5000, at(3, Phase::Prefill)), None);
        assert_eq!(c.target(&KvKind::Dense, 8192, at(3, Phase::Prefill)), balanced);
        assert_eq!(c.target(&KvKind::Dense, 6, at(3, Phase::Decode)), balanced);
        // Sinks first: a row holding fewer tokens waits.
        assert_eq!(c.target(&KvKind::Dense, SINKS - 1, at(3, Phase::Decode)), None);
        assert_eq!(c.target(&KvKind::Rotating { max_size: 512 }, 9000, at(3, Phase::Decode)), None);
    }

    #[test]
    fn compact_keeps_8_bit_keys_in_the_first_and_last_two_layers() {
        let keys: Vec<KeyCode> = (0..8).map(|l| TurboPreset::Compact.format(l, 8, 3).key).collect();
        let a8 = KeyCode::Affine8;
        let c4 = KeyCode::Codebook(4);
        assert_eq!(keys, vec![a8, a8, c4, c4, c4, c4, a8, a8]);
        assert_eq!(TurboPreset::Paper.format(0, 8, 3), TurboFormat { key: KeyCode::CodebookQjl(3), value_bits: 3 });
    }

    /// The layers a `compact` model keeps 8-bit keys in, among `kinds`.
    fn eight_bit_key_layers(kinds: &[KvKind]) -> Vec<usize> {
        let c = KvCompression::turbo("compact", 8192).unwrap().for_model(128, false, None).unwrap();
        let (ranks, layers) = attention_ranks(kinds.iter().map(KvKind::keeps_every_position));
        let at = |layer| CompressAt { layer, layers, phase: Phase::Decode };
        let eight = |(i, (k, r)): (usize, (&KvKind, usize))| match c.target(k, 100, at(r)) {
            Some(KvKind::Turbo(f)) if f.key == KeyCode::Affine8 => Some(i),
            _ => None,
        };
        kinds.iter().zip(ranks).enumerate().filter_map(eight).collect()
    }

    #[test]
    fn compact_counts_only_full_attention_layers_for_its_first_and_last_two() {
        // Qwen3-Next / Qwen3.5: full attention every 4th layer, linear between.
        let hybrid: Vec<KvKind> = (0..48).map(|i| if (i + 1) % 4 == 0 { KvKind::Dense } else { KvKind::Recurrent { state_bytes: 1 } }).collect();
        assert_eq!(eight_bit_key_layers(&hybrid), vec![3, 7, 43, 47]);
        // Gemma 3: a global layer after every 5 sliding-window ones.
        let windowed: Vec<KvKind> = (0..62).map(|i| if (i + 1) % 6 == 0 { KvKind::Dense } else { KvKind::Rotating { max_size: 1024 } }).collect();
        assert_eq!(eight_bit_key_layers(&windowed), vec![5, 11, 53, 59]);
        // What a token costs counts the same way: 52 window layers at 16 bits,
        // 4 global layers with 8-bit keys, 6 with 4-bit codebook keys.
        let c = KvCompression::turbo("compact", 8192).unwrap().for_model(128, false, None).unwrap();
        let layer_bytes = |(k, v): (f64, f64)| 8.0 * 128.0 * (k + v) / 8.0;
        let (a8, c4) = (TurboPreset::Compact.format(0, 10, 3).bits_per_dim(128), TurboPreset::Compact.format(2, 10, 3).bits_per_dim(128));
        let want = 52.0 * layer_bytes((16.0, 16.0)) + 4.0 * layer_bytes(a8) + 6.0 * layer_bytes(c4);
        assert_eq!(bytes_per_token(Some(&c), &windowed, 8, 128, 16), want);
        // A plain decoder: the model's first and last two layers.
        assert_eq!(eight_bit_key_layers(&[KvKind::Dense; 8]), vec![0, 1, 6, 7]);
        // Layers already compressed count as full attention too.
        let mut mixed = [KvKind::Dense; 6];
        mixed[0] = KvKind::Turbo(TurboPreset::Compact.format(0, 6, 3));
        assert_eq!(attention_ranks(mixed.iter().map(KvKind::keeps_every_position)), ((0..6).collect(), 6));
    }

    #[test]
    fn presets_meet_their_compression_on_llama_3_1_8b_shapes() {
        // 32 layers, 8 KV heads of 128: fp16 is 128 KiB a token.
        let kinds = vec![KvKind::Dense; 32];
        let fp16 = bytes_per_token(None, &kinds, 8, 128, 16);
        assert_eq!(fp16, 131072.0);
        let policy = |preset: &str| KvCompression::turbo(preset, 8192).unwrap().for_model(128, false, None).unwrap();
        let ratio = |preset: &str| bytes_per_token(Some(&policy(preset)), &kinds, 8, 128, 16) / fp16;
        assert!(ratio("balanced") <= 0.36, "balanced {}", ratio("balanced"));
        assert!(ratio("compact") <= 0.25, "compact {}", ratio("compact"));
        assert!(ratio("paper") < ratio("balanced"));
        // Sliding-window layers stay 16-bit.
        let mixed = [KvKind::Dense, KvKind::Rotating { max_size: 512 }];
        let b = bytes_per_token(Some(&policy("balanced")), &mixed, 1, 128, 16);
        assert!(b > 512.0 && b < 512.0 + 256.0);
    }

    #[test]
    fn bad_turbo_settings_name_the_flag() {
        assert!(KvCompression::turbo("tiny", 8192).unwrap_err().to_string().contains("balanced, compact, paper"));
        assert!(KvCompression::turbo("compact", 2).unwrap_err().to_string().contains("--turbo-kv-prefill-threshold"));
        let c = KvCompression::turbo("compact", 8192).unwrap();
        assert!(c.for_model(128, false, None).is_ok());
        assert!(c.for_model(96, false, None).unwrap_err().to_string().contains("power-of-two head dimension"));
        assert!(c.for_model(16, false, None).is_err());
        // Learned attention sinks (gpt-oss): refused, naming the way out.
        assert!(c.for_model(128, true, None).unwrap_err().to_string().contains("learned sinks"));
        assert!(KvCompression::affine(8, 64, 0).unwrap().for_model(128, true, None).is_ok());
        // Values take 4 bits at head dimension 64, 3 above.
        let bits = |d| match c.for_model(d, false, None).unwrap() {
            KvCompression::Turbo { value_bits, .. } => value_bits,
            _ => 0,
        };
        assert_eq!((bits(64), bits(128), bits(256)), (4, 3, 3));
    }

    #[test]
    fn a_group_size_the_head_dim_cannot_take_is_refused() {
        let c = KvCompression::affine(8, 64, 0).unwrap();
        assert!(c.for_model(128, false, None).is_ok());
        assert!(c.for_model(96, false, None).unwrap_err().to_string().contains("head dimension 96"));
    }
}
