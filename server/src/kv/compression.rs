//! When and how a sequence's cache is compressed as it grows.

use super::store::KvKind;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCompression {
    /// `--kv-bits`: affine quantization once a sequence holds `start` tokens
    /// (mlx-lm's `quantized_kv_start`); sliding-window layers stay as they are.
    Affine { bits: i32, group_size: i32, start: i32 },
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

    /// The kind a row of `kind` holding `tokens` tokens converts to now, if any.
    pub fn target(&self, kind: &KvKind, tokens: i32) -> Option<KvKind> {
        match (*self, kind) {
            (KvCompression::Affine { bits, group_size, start }, KvKind::Dense) if tokens >= start => {
                Some(KvKind::Affine { group_size, bits })
            }
            _ => None,
        }
    }

    /// Checks the policy against a model's head dimension at start-up.
    pub fn check_head_dim(&self, head_dim: i32) -> Result<()> {
        match *self {
            KvCompression::Affine { group_size, .. } if head_dim % group_size != 0 => Err(Error::Config(format!(
                "--kv-group-size {group_size} does not divide the model's head dimension {head_dim}"
            ))),
            _ => Ok(()),
        }
    }

    /// Bits per stored value, for /health.
    pub fn bits(&self) -> i32 {
        match *self {
            KvCompression::Affine { bits, .. } => bits,
        }
    }
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

    #[test]
    fn only_dense_rows_past_the_start_are_quantized() {
        let c = KvCompression::affine(4, 64, 100).unwrap();
        assert_eq!(c.target(&KvKind::Dense, 99), None);
        assert_eq!(c.target(&KvKind::Dense, 100), Some(KvKind::Affine { group_size: 64, bits: 4 }));
        assert_eq!(c.target(&KvKind::Rotating { max_size: 512 }, 1000), None);
        assert_eq!(c.target(&KvKind::Affine { group_size: 64, bits: 4 }, 1000), None);
    }

    #[test]
    fn a_group_size_the_head_dim_cannot_take_is_refused() {
        let c = KvCompression::affine(8, 64, 0).unwrap();
        assert!(c.check_head_dim(128).is_ok());
        assert!(c.check_head_dim(96).unwrap_err().to_string().contains("head dimension 96"));
    }
}
