//! Weights I/O.

mod gguf;
mod safetensors;

pub use self::gguf::{GgufFile, GgufTensor, GgufTensorInfo, GgufType, GgufValue};
pub use self::safetensors::{SafetensorsFile, TensorMeta};
