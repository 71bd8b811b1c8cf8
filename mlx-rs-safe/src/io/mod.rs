//! Weights I/O.

mod safetensors;

pub use self::safetensors::{SafetensorsFile, TensorMeta};
