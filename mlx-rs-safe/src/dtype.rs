//! Element types, and the Rust types that map onto them.

use mlx_sys as sys;

/// An MLX element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
    Complex64,
}

impl Dtype {
    pub(crate) fn to_sys(self) -> sys::mlx_dtype {
        match self {
            Dtype::Bool => sys::MLX_BOOL,
            Dtype::Uint8 => sys::MLX_UINT8,
            Dtype::Uint16 => sys::MLX_UINT16,
            Dtype::Uint32 => sys::MLX_UINT32,
            Dtype::Uint64 => sys::MLX_UINT64,
            Dtype::Int8 => sys::MLX_INT8,
            Dtype::Int16 => sys::MLX_INT16,
            Dtype::Int32 => sys::MLX_INT32,
            Dtype::Int64 => sys::MLX_INT64,
            Dtype::Float16 => sys::MLX_FLOAT16,
            Dtype::Float32 => sys::MLX_FLOAT32,
            Dtype::Float64 => sys::MLX_FLOAT64,
            Dtype::Bfloat16 => sys::MLX_BFLOAT16,
            Dtype::Complex64 => sys::MLX_COMPLEX64,
        }
    }

    pub(crate) fn from_sys(d: sys::mlx_dtype) -> Dtype {
        match d {
            sys::MLX_BOOL => Dtype::Bool,
            sys::MLX_UINT8 => Dtype::Uint8,
            sys::MLX_UINT16 => Dtype::Uint16,
            sys::MLX_UINT32 => Dtype::Uint32,
            sys::MLX_UINT64 => Dtype::Uint64,
            sys::MLX_INT8 => Dtype::Int8,
            sys::MLX_INT16 => Dtype::Int16,
            sys::MLX_INT32 => Dtype::Int32,
            sys::MLX_INT64 => Dtype::Int64,
            sys::MLX_FLOAT16 => Dtype::Float16,
            sys::MLX_FLOAT32 => Dtype::Float32,
            sys::MLX_FLOAT64 => Dtype::Float64,
            sys::MLX_BFLOAT16 => Dtype::Bfloat16,
            // The enum is closed; complex64 is the last member.
            _ => Dtype::Complex64,
        }
    }

    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
            Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
        }
    }

    pub fn is_floating(self) -> bool {
        matches!(
            self,
            Dtype::Float16 | Dtype::Float32 | Dtype::Float64 | Dtype::Bfloat16
        )
    }

    /// The dtype of a safetensors / Hugging Face dtype name ("BF16", "F32", ...).
    pub fn from_safetensors(name: &str) -> Option<Dtype> {
        Some(match name {
            "BOOL" => Dtype::Bool,
            "U8" => Dtype::Uint8,
            "U16" => Dtype::Uint16,
            "U32" => Dtype::Uint32,
            "U64" => Dtype::Uint64,
            "I8" => Dtype::Int8,
            "I16" => Dtype::Int16,
            "I32" => Dtype::Int32,
            "I64" => Dtype::Int64,
            "F16" => Dtype::Float16,
            "BF16" => Dtype::Bfloat16,
            "F32" => Dtype::Float32,
            "F64" => Dtype::Float64,
            "C64" => Dtype::Complex64,
            _ => return None,
        })
    }
}

/// A Rust type with the same bytes as one element of an MLX dtype.
///
/// Sealed: the crate copies raw bytes between MLX buffers and `&[T]`, so only
/// types whose layout equals the MLX element's may implement it.
pub trait Element: Copy + Default + 'static + sealed::Sealed {
    const DTYPE: Dtype;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: Dtype = Dtype::$d; }
    )*};
}

element!(
    bool => Bool, u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64,
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    half::f16 => Float16, half::bf16 => Bfloat16, f32 => Float32, f64 => Float64,
);
