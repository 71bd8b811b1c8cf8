//! A safetensors reader that makes lazy MLX arrays from file regions.
//!
//! Only the header is read when the file is opened (parsed and validated by the
//! `safetensors` crate); each tensor becomes a [`pread_into`] array, so its bytes
//! are read when the array is evaluated — straight into MLX's buffer, no mmap and
//! no intermediate copy. This is the base for sharded loading and, later, for
//! streaming MoE experts from disk.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::Metadata;

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ext::pread_into;

/// Where one tensor lives in the file, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub dtype: Dtype,
    pub shape: Vec<i32>,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: u64,
    pub nbytes: u64,
}

/// An open safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    /// Tensor names in file order.
    names: Vec<String>,
    tensors: HashMap<String, TensorMeta>,
    user_metadata: HashMap<String, String>,
}

/// Headers larger than this are refused (the safetensors crate's own bound).
const MAX_HEADER_BYTES: u64 = 100_000_000;

impl SafetensorsFile {
    /// Opens `path` and validates its header against the file's size.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let bad = |message: String| Error::Weights { path: shown.clone(), message };
        let io = |context: &str, source| Error::Io { context: format!("{context} {shown}"), source };

        let mut file = File::open(&path).map_err(|e| io("opening", e))?;
        let file_len = file.metadata().map_err(|e| io("reading the size of", e))?.len();
        let mut len_bytes = [0u8; 8];
        file.read_exact(&mut len_bytes)
            .map_err(|_| bad(format!("file of {file_len} bytes is too short for a safetensors header")))?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
            return Err(bad(format!(
                "header length {header_len} does not fit in a file of {file_len} bytes"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header).map_err(|e| io("reading the header of", e))?;
        let metadata: Metadata = serde_json::from_slice(&header)
            .map_err(|e| bad(format!("invalid safetensors header: {e}")))?;

        let data_start = 8 + header_len;
        let data_end = data_start + metadata.data_len() as u64;
        if data_end > file_len {
            return Err(bad(format!(
                "tensor data ends at byte {data_end}, past the end of the file ({file_len} bytes): truncated?"
            )));
        }

        let names = metadata.offset_keys();
        let mut tensors = HashMap::with_capacity(names.len());
        for name in &names {
            // `offset_keys` lists exactly the names `info` knows.
            let info = metadata.info(name).expect("name from offset_keys");
            let dtype = Dtype::from_safetensors(&format!("{:?}", info.dtype)).ok_or_else(|| {
                bad(format!("tensor {name}: dtype {:?} is not supported by MLX", info.dtype))
            })?;
            let shape = info
                .shape
                .iter()
                .map(|&d| i32::try_from(d))
                .collect::<std::result::Result<Vec<i32>, _>>()
                .map_err(|_| bad(format!("tensor {name}: dimension too large in {:?}", info.shape)))?;
            let (begin, end) = info.data_offsets;
            tensors.insert(
                name.clone(),
                TensorMeta { dtype, shape, offset: data_start + begin as u64, nbytes: (end - begin) as u64 },
            );
        }
        let user_metadata = metadata.metadata().clone().unwrap_or_default();
        Ok(SafetensorsFile { path, file, names, tensors, user_metadata })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names in the order their data appears in the file.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn info(&self, name: &str) -> Option<&TensorMeta> {
        self.tensors.get(name)
    }

    /// The free-form `__metadata__` map (e.g. `{"format": "mlx"}`).
    pub fn user_metadata(&self) -> &HashMap<String, String> {
        &self.user_metadata
    }

    /// A lazy array of tensor `name`; its bytes are read when it is evaluated.
    pub fn load(&self, name: &str) -> Result<Array> {
        let meta = self.tensors.get(name).ok_or_else(|| Error::Weights {
            path: self.path.display().to_string(),
            message: format!("no tensor named {name}"),
        })?;
        pread_into(&self.file, meta.offset, &meta.shape, meta.dtype)
    }

    /// Every tensor, in file order, as lazy arrays.
    pub fn load_all(&self) -> Result<Vec<(String, Array)>> {
        self.names.iter().map(|n| Ok((n.clone(), self.load(n)?))).collect()
    }
}
