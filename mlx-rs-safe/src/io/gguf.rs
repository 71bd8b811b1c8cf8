//! A GGUF reader (llama.cpp's model file format, version 2 and 3) that
//! validates the whole header before any tensor is read and makes MLX arrays
//! from file regions.
//!
//! Written here rather than taken from MLX's own GGUF loader because that
//! loader opens files read-write (a read-only model file fails), aborts the
//! process on some malformed headers, reads every tensor eagerly and drops
//! tensors of types it does not know without an error. Here every length and
//! offset is checked against the file's size, errors name the file and the
//! field, and tensors stay lazy where MLX can take their bytes as they are:
//! F32, F16 and BF16 become [`pread_into`] arrays (read when evaluated).
//! Q4_0, Q4_1 and Q8_0 blocks are repacked into MLX's affine quantization
//! (group size 32: a packed uint32 matrix, float16 scales and biases), which
//! represents them exactly. Q5_0, Q5_1 and the K-quants (Q2_K..Q6_K), which
//! MLX's quantization cannot hold exactly (Q6_K has 16-value sub-blocks, the
//! K-quants two levels of scales), are dequantized at load into float arrays
//! (gguf_dequant.rs). Other types are refused by name.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use super::gguf_dequant::{self, FromF32};
use super::gguf_type::GgufType;
use crate::array::Array;
use crate::dtype::{Dtype, Element};
use crate::error::{Error, Result};
use crate::ext::pread_into;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type (u8..u64) and bool (0 or 1).
    Uint(u64),
    /// Any signed integer type.
    Int(i64),
    /// float32 or float64.
    Float(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::Uint(v) => Some(v),
            GgufValue::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::Float(v) => Some(v),
            GgufValue::Uint(v) => Some(v as f64),
            GgufValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// One tensor's place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub ggml_type: GgufType,
    /// Row-major shape (GGUF lists dimensions innermost first; this is reversed).
    pub shape: Vec<i32>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data, where the type is one this reader knows.
    pub nbytes: Option<u64>,
}

/// A tensor as MLX arrays.
pub enum GgufTensor {
    /// Values as stored (F32, F16, BF16), read when evaluated; or the
    /// dequantized values of a type MLX cannot hold exactly.
    Plain(Array),
    /// MLX affine quantization of a Q4_0/Q4_1/Q8_0 matrix: packed uint32
    /// `[.., cols * bits / 32]`, float16 scales and biases `[.., cols / 32]`.
    Quantized { weight: Array, scales: Array, biases: Array, bits: i32, group_size: i32 },
}

/// An open GGUF file with its header read and checked.
pub struct GgufFile {
    path: PathBuf,
    file: File,
    version: u32,
    metadata: HashMap<String, GgufValue>,
    /// Tensor names in file order.
    names: Vec<String>,
    tensors: HashMap<String, GgufTensorInfo>,
}

/// Header fields past this size are refused (no real model comes near them;
/// a corrupt length would otherwise ask for gigabytes).
const MAX_STRING: u64 = 1 << 30;
const MAX_DIMS: u32 = 8;

/// The float types tensors are dequantized to.
fn check_float(float: Dtype) -> Result<()> {
    match float {
        Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 => Ok(()),
        other => Err(Error::InvalidArgument(format!("GGUF tensors are dequantized to Float32, Float16 or Bfloat16, not {other:?}"))),
    }
}

/// Reads the header, counting bytes against the file's size.
struct Header<R> {
    r: R,
    pos: u64,
    len: u64,
    path: String,
}

impl<R: Read> Header<R> {
    fn bad(&self, message: String) -> Error {
        Error::Weights { path: self.path.clone(), message }
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>> {
        if n > self.len.saturating_sub(self.pos) {
            return Err(self.bad(format!("{what}: {n} bytes at offset {} run past the end of the file ({} bytes): truncated?", self.pos, self.len)));
        }
        let mut buf = vec![0u8; n as usize];
        self.r.read_exact(&mut buf).map_err(|e| Error::Io { context: format!("reading {} ({what})", self.path), source: e })?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&b);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return Err(self.bad(format!("{what}: a string of {n} bytes")));
        }
        let b = self.bytes(n, what)?;
        String::from_utf8(b).map_err(|_| self.bad(format!("{what}: not UTF-8")))
    }

    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::Uint(self.array::<1>(what)?[0] as u64),
            1 => GgufValue::Int(self.array::<1>(what)?[0] as i8 as i64),
            2 => GgufValue::Uint(u16::from_le_bytes(self.array(what)?) as u64),
            3 => GgufValue::Int(i16::from_le_bytes(self.array(what)?) as i64),
            4 => GgufValue::Uint(self.u32(what)? as u64),
            5 => GgufValue::Int(i32::from_le_bytes(self.array(what)?) as i64),
            6 => GgufValue::Float(f32::from_le_bytes(self.array(what)?) as f64),
            7 => GgufValue::Bool(self.array::<1>(what)?[0] != 0),
            8 => GgufValue::String(self.string(what)?),
            9 if depth == 0 => {
                let elem = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least one byte: a count beyond the
                // bytes left is corrupt, whatever the element type.
                if n > self.len.saturating_sub(self.pos) {
                    return Err(self.bad(format!("{what}: an array of {n} elements in {} bytes left", self.len - self.pos)));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, what, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::Uint(self.u64(what)?),
            11 => GgufValue::Int(i64::from_le_bytes(self.array(what)?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.bad(format!("{what}: value type {other} is not a GGUF type{}", if other == 9 { " here (nested array)" } else { "" }))),
        })
    }
}

impl GgufFile {
    /// Opens `path` and reads and checks its whole header: metadata, tensor
    /// names, shapes, types and that every tensor's data lies inside the file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let mut file = File::open(&path).map_err(|e| Error::Io { context: format!("opening {shown}"), source: e })?;
        let len = file.metadata().map_err(|e| Error::Io { context: format!("reading the size of {shown}"), source: e })?.len();
        let mut h = Header { r: BufReader::new(&mut file), pos: 0, len, path: shown.clone() };
        if h.array::<4>("magic")? != *b"GGUF" {
            return Err(h.bad("not a GGUF file (no GGUF magic at its start)".into()));
        }
        let version = h.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(h.bad(format!("GGUF version {version}; versions 2 and 3 are read")));
        }
        let n_tensors = h.u64("tensor count")?;
        let n_kv = h.u64("metadata count")?;
        let mut metadata = HashMap::new();
        for i in 0..n_kv {
            let key = h.string(&format!("metadata key {i}"))?;
            let ty = h.u32(&key)?;
            let value = h.value(ty, &key, 0)?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::new();
        for i in 0..n_tensors {
            let name = h.string(&format!("tensor name {i}"))?;
            let n_dims = h.u32(&name)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(h.bad(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(h.u64(&name)?);
            }
            let ty = GgufType::from_id(h.u32(&name)?);
            let offset = h.u64(&name)?;
            infos.push((name, dims, ty, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => v.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| h.bad(format!("general.alignment {v:?} is not a power of two")))?,
        };
        let data_start = h.pos.div_ceil(alignment) * alignment;
        let mut names = Vec::with_capacity(infos.len());
        let mut tensors = HashMap::with_capacity(infos.len());
        for (name, dims, ty, rel) in infos {
            let shape: Vec<i32> = dims
                .iter()
                .rev()
                .map(|&d| i32::try_from(d).ok().filter(|&d| d > 0))
                .collect::<Option<_>>()
                .ok_or_else(|| h.bad(format!("tensor {name}: dimensions {dims:?}")))?;
            let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(|| h.bad(format!("tensor {name}: dimensions {dims:?}")))?;
            let offset = data_start.checked_add(rel).ok_or_else(|| h.bad(format!("tensor {name}: offset {rel}")))?;
            let nbytes = match ty.block() {
                Some((per, bytes)) => {
                    if dims[0] % per != 0 {
                        return Err(h.bad(format!("tensor {name}: {} rows of {} values are not whole blocks of {per}", ty.name(), dims[0])));
                    }
                    let n = elements / per * bytes;
                    if offset.checked_add(n).is_none_or(|end| end > len) {
                        return Err(h.bad(format!("tensor {name}: {n} bytes at offset {offset} run past the end of the file ({len} bytes): truncated?")));
                    }
                    Some(n)
                }
                None => None,
            };
            if tensors.insert(name.clone(), GgufTensorInfo { ggml_type: ty, shape, offset, nbytes }).is_some() {
                return Err(h.bad(format!("tensor {name} is listed twice")));
            }
            names.push(name);
        }
        drop(h);
        Ok(GgufFile { path, file, version, metadata, names, tensors })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &HashMap<String, GgufValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// Tensor names in file order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.get(name)
    }

    fn bad(&self, message: String) -> Error {
        Error::Weights { path: self.path.display().to_string(), message }
    }

    fn tensor(&self, name: &str) -> Result<&GgufTensorInfo> {
        self.tensors.get(name).ok_or_else(|| self.bad(format!("no tensor named {name}")))
    }

    /// Tensor `name` as MLX arrays (see [`GgufTensor`]): the types MLX holds
    /// exactly as they are, the others dequantized to bfloat16.
    pub fn load(&self, name: &str) -> Result<GgufTensor> {
        self.load_as(name, Dtype::Bfloat16)
    }

    /// As [`load`](Self::load), with the types that are not
    /// [exact in MLX](GgufType::exact_in_mlx) dequantized to `float`
    /// (Float32, Float16 or Bfloat16) as a [`GgufTensor::Plain`] array.
    pub fn load_as(&self, name: &str, float: Dtype) -> Result<GgufTensor> {
        let info = self.tensor(name)?;
        check_float(float)?;
        let plain = |dtype| Ok(GgufTensor::Plain(pread_into(&self.file, info.offset, &info.shape, dtype)?));
        match info.ggml_type {
            GgufType::F32 => plain(Dtype::Float32),
            GgufType::F16 => plain(Dtype::Float16),
            GgufType::Bf16 => plain(Dtype::Bfloat16),
            GgufType::Q4_0 | GgufType::Q4_1 | GgufType::Q8_0 => self.repack(name, info),
            _ => Ok(GgufTensor::Plain(self.dequantize(name, float)?)),
        }
    }

    /// Any readable tensor (the exact types included) as `float` values
    /// (Float32, Float16 or Bfloat16), computed as ggml computes them in f32
    /// and rounded to nearest-even. Memory: the tensor's bytes and its values
    /// in `float`, then MLX's copy of the values.
    pub fn dequantize(&self, name: &str, float: Dtype) -> Result<Array> {
        let info = self.tensor(name)?;
        check_float(float)?;
        let raw = self.read(name, info)?;
        match float {
            Dtype::Float32 => self.decode::<f32>(name, info, raw),
            Dtype::Float16 => self.decode::<f16>(name, info, raw),
            // check_float lets only Bfloat16 through besides those two.
            _ => self.decode::<bf16>(name, info, raw),
        }
    }

    fn unsupported(&self, name: &str, ty: GgufType) -> Error {
        self.bad(format!(
            "tensor {name}: {} is not supported (readable: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
            ty.name()
        ))
    }

    /// The tensor's bytes, as stored.
    fn read(&self, name: &str, info: &GgufTensorInfo) -> Result<Vec<u8>> {
        let nbytes = info.nbytes.ok_or_else(|| self.unsupported(name, info.ggml_type))?;
        let mut raw = vec![0u8; nbytes as usize];
        self.file
            .read_exact_at(&mut raw, info.offset)
            .map_err(|e| Error::Io { context: format!("reading tensor {name} of {}", self.path.display()), source: e })?;
        Ok(raw)
    }

    fn decode<T: FromF32 + Element>(&self, name: &str, info: &GgufTensorInfo, raw: Vec<u8>) -> Result<Array> {
        let elements: usize = info.shape.iter().map(|&d| d as usize).product();
        let mut values = vec![T::default(); elements];
        gguf_dequant::dequantize(info.ggml_type, &raw, &mut values).map_err(|m| self.bad(format!("tensor {name}: {m}")))?;
        drop(raw);
        Array::from_slice(&values, &info.shape)
    }

    /// Q4_0/Q4_1/Q8_0 blocks as MLX affine quantization, exactly: a block's
    /// scale d and minimum (Q4_1: m; Q4_0: -8d; Q8_0: -128d, the int8 codes
    /// shifted to 0..255) become one group's scale and bias.
    fn repack(&self, name: &str, info: &GgufTensorInfo) -> Result<GgufTensor> {
        let ty = info.ggml_type;
        let raw = self.read(name, info)?;
        let block_bytes = ty.block().map(|(_, bytes)| bytes as usize).ok_or_else(|| self.unsupported(name, ty))?;
        let bits = if ty == GgufType::Q8_0 { 8 } else { 4 };
        let blocks = raw.len() / block_bytes;
        let words_per_block = bits as usize; // 32 codes of `bits` bits = `bits` words
        let mut words = vec![0u32; blocks * words_per_block];
        let mut scales = vec![f16::ZERO; blocks];
        let mut biases = vec![f16::ZERO; blocks];
        // Blocks are independent: large tensors are split across threads.
        let threads = gguf_dequant::threads_for(blocks, REPACK_BLOCKS_PER_THREAD);
        let per = blocks.div_ceil(threads);
        std::thread::scope(|scope| {
            let parts = raw
                .chunks(per * block_bytes)
                .zip(words.chunks_mut(per * words_per_block))
                .zip(scales.chunks_mut(per).zip(biases.chunks_mut(per)));
            for ((raw, words), (scales, biases)) in parts {
                scope.spawn(move || repack_blocks(ty, block_bytes, raw, words, scales, biases));
            }
        });
        let mut shape = info.shape.clone();
        let cols = *shape.last().unwrap_or(&0);
        let last = shape.len() - 1;
        shape[last] = cols * bits / 32;
        let weight = Array::from_slice(&words, &shape)?;
        shape[last] = cols / 32;
        Ok(GgufTensor::Quantized {
            weight,
            scales: Array::from_slice(&scales, &shape)?,
            biases: Array::from_slice(&biases, &shape)?,
            bits,
            group_size: 32,
        })
    }
}

/// Below this many blocks per thread, splitting costs more than it saves.
const REPACK_BLOCKS_PER_THREAD: usize = 1 << 14;

/// Eight 4-bit codes held one per byte (low nibbles of `x`'s bytes, in
/// order) as one word, code i at bits 4i: MLX's 4-bit packing.
fn pack_nibbles(x: u64) -> u32 {
    let x = x & 0x0F0F_0F0F_0F0F_0F0F;
    let x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
    let x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    ((x | (x >> 16)) & 0xFFFF_FFFF) as u32
}

/// Q4_0/Q4_1/Q8_0 blocks → MLX affine words, scales and biases (one group of
/// 32 per block): a block's scale d and minimum (Q4_1: m; Q4_0: -8d; Q8_0:
/// -128d, the int8 codes shifted to 0..255) become the group's scale and bias.
fn repack_blocks(ty: GgufType, block_bytes: usize, raw: &[u8], words: &mut [u32], scales: &mut [f16], biases: &mut [f16]) {
    let u64_at = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    for (b, block) in raw.chunks_exact(block_bytes).enumerate() {
        let d = f16::from_le_bytes([block[0], block[1]]);
        scales[b] = d;
        biases[b] = match ty {
            GgufType::Q4_1 => f16::from_le_bytes([block[2], block[3]]),
            GgufType::Q4_0 => f16::from_f32(-8.0 * d.to_f32()),
            _ => f16::from_f32(-128.0 * d.to_f32()),
        };
        match ty {
            GgufType::Q8_0 => {
                for (w, codes) in words[b * 8..b * 8 + 8].iter_mut().zip(block[2..].chunks_exact(4)) {
                    *w = u32::from_le_bytes(codes.try_into().expect("4 bytes")) ^ 0x8080_8080;
                }
            }
            _ => {
                // Values 0..15 are the low nibbles of the 16 bytes, 16..31 the high ones.
                let qs = &block[block_bytes - 16..];
                let (lo, hi) = (u64_at(qs), u64_at(&qs[8..]));
                let w = &mut words[b * 4..b * 4 + 4];
                w[0] = pack_nibbles(lo);
                w[1] = pack_nibbles(hi);
                w[2] = pack_nibbles(lo >> 4);
                w[3] = pack_nibbles(hi >> 4);
            }
        }
    }
}
