//! Weights I/O.

mod gguf;
mod gguf_dequant;
mod gguf_type;
mod safetensors;
pub mod uncached;

pub use self::gguf::{GgufFile, GgufTensor, GgufTensorInfo, GgufValue};
pub use self::gguf_type::GgufType;
pub use self::safetensors::{SafetensorsFile, TensorMeta};
