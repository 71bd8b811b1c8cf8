//! ggml's tensor types as GGUF files name them: ids, names, block sizes.

/// How a tensor's values are stored (ggml's type ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    /// A type this reader cannot read (IQ*, TQ*, Q8_K, integers, ...); see
    /// [`GgufType::name`].
    Other(u32),
}

/// Names of the ggml type ids this reader does not read, as gguf-py 0.19.0
/// (`GGMLQuantizationType`) lists them. Ids 4, 5, 31..=33 and 36..=38 were
/// types that ggml has since removed.
const OTHER_NAMES: &[(u32, &str)] = &[
    (9, "Q8_1"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

impl GgufType {
    /// The type of ggml type id `id` (ids it does not read are `Other(id)`).
    pub fn from_id(id: u32) -> GgufType {
        match id {
            0 => GgufType::F32,
            1 => GgufType::F16,
            2 => GgufType::Q4_0,
            3 => GgufType::Q4_1,
            6 => GgufType::Q5_0,
            7 => GgufType::Q5_1,
            8 => GgufType::Q8_0,
            10 => GgufType::Q2K,
            11 => GgufType::Q3K,
            12 => GgufType::Q4K,
            13 => GgufType::Q5K,
            14 => GgufType::Q6K,
            30 => GgufType::Bf16,
            other => GgufType::Other(other),
        }
    }

    /// ggml's name of the type ("Q4_K", "BF16", "IQ2_XS"), or "type N" for
    /// an id ggml does not (or no longer) define.
    pub fn name(self) -> String {
        let known = match self {
            GgufType::F32 => "F32",
            GgufType::F16 => "F16",
            GgufType::Bf16 => "BF16",
            GgufType::Q4_0 => "Q4_0",
            GgufType::Q4_1 => "Q4_1",
            GgufType::Q5_0 => "Q5_0",
            GgufType::Q5_1 => "Q5_1",
            GgufType::Q8_0 => "Q8_0",
            GgufType::Q2K => "Q2_K",
            GgufType::Q3K => "Q3_K",
            GgufType::Q4K => "Q4_K",
            GgufType::Q5K => "Q5_K",
            GgufType::Q6K => "Q6_K",
            GgufType::Other(id) => match OTHER_NAMES.iter().find(|&&(i, _)| i == id) {
                Some(&(_, name)) => name,
                None => return format!("type {id}"),
            },
        };
        known.to_string()
    }

    /// Whether MLX holds the values exactly as stored: as a plain float
    /// array (F32, F16, BF16) or as affine quantization with group size 32
    /// (Q4_0, Q4_1, Q8_0). The other readable types are dequantized at load.
    pub fn exact_in_mlx(self) -> bool {
        matches!(self, GgufType::F32 | GgufType::F16 | GgufType::Bf16 | GgufType::Q4_0 | GgufType::Q4_1 | GgufType::Q8_0)
    }

    /// (elements, bytes) of one storage block; None for types not read here.
    pub(crate) fn block(self) -> Option<(u64, u64)> {
        Some(match self {
            GgufType::F32 => (1, 4),
            GgufType::F16 | GgufType::Bf16 => (1, 2),
            GgufType::Q4_0 => (32, 18),
            GgufType::Q4_1 => (32, 20),
            GgufType::Q5_0 => (32, 22),
            GgufType::Q5_1 => (32, 24),
            GgufType::Q8_0 => (32, 34),
            GgufType::Q2K => (256, 84),
            GgufType::Q3K => (256, 110),
            GgufType::Q4K => (256, 144),
            GgufType::Q5K => (256, 176),
            GgufType::Q6K => (256, 210),
            GgufType::Other(_) => return None,
        })
    }
}
