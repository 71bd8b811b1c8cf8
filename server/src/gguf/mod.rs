//! Models stored as one GGUF file (llama.cpp, Ollama, LM Studio): found in
//! place of a model folder, and turned into what a folder gives — config.json,
//! weights under their Hugging Face names, the tokenizer and chat template.
//!
//! Q4_0, Q4_1 and Q8_0 tensors stay quantized (MLX affine, group 32, exactly
//! the same values); float tensors are taken as stored; other block types are
//! dequantized at load by the reader, and the log says so.

mod arch;
mod tokenizer;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs_safe::io::{GgufFile, GgufTensor, GgufType, GgufValue};
use mlx_rs_safe::{ops, Array, Dtype};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::models::weights::Weights;
pub use arch::Arch;
pub use tokenizer::TokenizerParts;

/// The GGUF file `path` stands for, if any: `path` itself when it is a file
/// (which must then be GGUF), or the one `*.gguf` file of a folder that has
/// no config.json. None: a model folder.
pub fn locate(path: &Path) -> Result<Option<PathBuf>> {
    if path.is_file() {
        let mut magic = [0u8; 4];
        let read = std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
        return match read {
            // A later shard of a split file stands for the whole: its first shard.
            Ok(()) if &magic == b"GGUF" => Ok(Some(split_name(path).map_or_else(|| path.to_path_buf(), |(prefix, _, n)| shard_path(&prefix, 1, n)))),
            Ok(()) | Err(_) if path.extension().is_some_and(|e| e == "gguf") => {
                Err(Error::model_file(path, "not a GGUF file (no GGUF magic at its start)"))
            }
            _ => Err(Error::model_file(path, "is a file; expected a model folder (config.json, *.safetensors, tokenizer) or a .gguf file")),
        };
    }
    if !path.is_dir() || path.join("config.json").exists() {
        return Ok(None);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| Error::model_file(path, e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    found.sort();
    // The shards of one split file count as one file: its first shard.
    let first = found.first().and_then(|p| split_name(p));
    if let Some((prefix, 1, n)) = first {
        if found.len() == n as usize && found.iter().all(|p| split_name(p).is_some_and(|(q, _, m)| q == prefix && m == n)) {
            return Ok(Some(found.swap_remove(0)));
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(Error::model_file(
            path,
            format!(
                "holds {} .gguf files and no config.json: pass the one to serve ({})",
                found.len(),
                found.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// llama.cpp's name for shard k of n: `{prefix}-{k:05}-of-{n:05}.gguf`.
fn shard_path(prefix: &Path, k: u32, n: u32) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!("-{k:05}-of-{n:05}.gguf"));
    PathBuf::from(name)
}

/// (prefix, k, n) of a shard's path, if it is named as one.
fn split_name(path: &Path) -> Option<(PathBuf, u32, u32)> {
    let text = path.to_str()?;
    let stem = text.strip_suffix(".gguf")?;
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (prefix, k) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(k) || !digits(n) {
        return None;
    }
    let (k, n) = (k.parse().ok()?, n.parse().ok()?);
    (k >= 1 && k <= n).then(|| (PathBuf::from(prefix), k, n))
}

/// A GGUF file's metadata, read with errors that name the file and the key.
pub struct Metadata<'a> {
    file: &'a GgufFile,
    /// `general.architecture`.
    arch: String,
}

impl<'a> Metadata<'a> {
    pub fn new(file: &'a GgufFile) -> Result<Metadata<'a>> {
        let arch = file
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| Error::model_file(file.path(), "missing metadata general.architecture"))?
            .to_string();
        Ok(Metadata { file, arch })
    }

    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::model_file(self.file.path(), message)
    }

    pub fn missing(&self, key: &str) -> Error {
        self.error(format!("missing metadata {}.{key}", self.arch))
    }

    fn typed<T>(&self, key: &str, what: &str, get: impl Fn(&GgufValue) -> Option<T>) -> Result<Option<T>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => get(v).map(Some).ok_or_else(|| self.error(format!("metadata {key} is {}, expected {what}", arch::describe(v)))),
        }
    }

    pub fn opt_int(&self, key: &str) -> Result<Option<i64>> {
        self.typed(key, "an integer", |v| v.as_u64().and_then(|x| i64::try_from(x).ok()))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<String>> {
        self.typed(key, "a string", |v| v.as_str().map(str::to_string))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a boolean", |v| match v {
            GgufValue::Bool(b) => Some(*b),
            GgufValue::Uint(x) if *x <= 1 => Some(*x == 1),
            _ => None,
        })
    }

    /// A string array (vocabularies, merges).
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let file: &'a GgufFile = self.file;
        match file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(GgufValue::as_str).collect::<Option<Vec<_>>>())
                .map(Some)
                .ok_or_else(|| self.error(format!("metadata {key} is not an array of strings"))),
        }
    }

    /// A numeric array (token types, scores; flags as 0 and 1).
    pub fn numbers(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let number = |v: &GgufValue| match v {
            GgufValue::Bool(b) => Some(f64::from(u8::from(*b))),
            v => v.as_f64(),
        };
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(number).collect::<Option<Vec<_>>>())
                .map(Some)
                .ok_or_else(|| self.error(format!("metadata {key} is not an array of numbers"))),
        }
    }

    fn arch_key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    pub fn arch_opt_int(&self, key: &str) -> Result<Option<i64>> {
        self.opt_int(&self.arch_key(key))
    }

    pub fn arch_int(&self, key: &str) -> Result<i64> {
        self.arch_opt_int(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn arch_int_or(&self, key: &str, default: i64) -> Result<i64> {
        Ok(self.arch_opt_int(key)?.unwrap_or(default))
    }

    pub fn arch_opt_float(&self, key: &str) -> Result<Option<f64>> {
        self.typed(&self.arch_key(key), "a number", GgufValue::as_f64)
    }

    pub fn arch_float(&self, key: &str) -> Result<f64> {
        self.arch_opt_float(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn arch_opt_str(&self, key: &str) -> Result<Option<String>> {
        self.opt_str(&self.arch_key(key))
    }
}

/// An open GGUF model: its architecture known and supported; one file, or
/// the shards of a split one (llama.cpp's `gguf-split`: the metadata in the
/// first, the tensors spread over all).
pub struct GgufModel {
    /// The first (or only) file: the metadata.
    file: GgufFile,
    /// The other shards, in order.
    more: Vec<GgufFile>,
    arch: Arch,
}

/// Tensors whose values go into the config rather than a layer.
const ROPE_FACTORS: [&str; 2] = ["rope_freqs.weight", "rope_factors_long.weight"];
const UNUSED: [&str; 1] = ["rope_factors_short.weight"];

impl GgufModel {
    pub fn open(path: &Path) -> Result<GgufModel> {
        let file = GgufFile::open(path)?;
        let meta = Metadata::new(&file)?;
        let arch = Arch::find(&meta.arch).ok_or_else(|| {
            meta.error(format!(
                "general.architecture {:?} is not supported; supported: {}",
                meta.arch,
                Arch::supported()
            ))
        })?;
        let more = Self::other_shards(&file, &meta)?;
        Ok(GgufModel { file, more, arch })
    }

    /// Shards 2..n of a split file (none for a single file), each checked to
    /// be the shard it is named as.
    fn other_shards(file: &GgufFile, meta: &Metadata) -> Result<Vec<GgufFile>> {
        let count = meta.opt_int("split.count")?.unwrap_or(1);
        if count <= 1 {
            return Ok(Vec::new());
        }
        let (prefix, k, n) = split_name(file.path())
            .ok_or_else(|| meta.error(format!("split.count is {count}, but the file is not named as a shard (NAME-00001-of-{count:05}.gguf)")))?;
        if k != 1 || i64::from(n) != count {
            return Err(meta.error(format!("named shard {k} of {n}, but split.count is {count} and the metadata is in shard 1")));
        }
        (2..=n)
            .map(|i| {
                let path = shard_path(&prefix, i, n);
                let shard = GgufFile::open(&path)?;
                match shard.get("split.no").and_then(GgufValue::as_u64) {
                    Some(no) if no + 1 == u64::from(i) => Ok(shard),
                    other => Err(Error::model_file(&path, format!("split.no is {other:?}, expected {} for shard {i} of {n}", i - 1))),
                }
            })
            .collect()
    }

    /// Every shard, the metadata's first.
    fn shards(&self) -> impl Iterator<Item = &GgufFile> {
        std::iter::once(&self.file).chain(&self.more)
    }

    /// The shard holding tensor `name`.
    fn shard_of(&self, name: &str) -> Option<&GgufFile> {
        self.shards().find(|f| f.info(name).is_some())
    }

    /// Every tensor name with its shard, in file order.
    fn tensors(&self) -> impl Iterator<Item = (&GgufFile, &String)> {
        self.shards().flat_map(|f| f.names().iter().map(move |n| (f, n)))
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    fn meta(&self) -> Metadata<'_> {
        Metadata { file: &self.file, arch: self.arch.gguf.to_string() }
    }

    /// The per-pair rotary factors the file stores, if any.
    fn rope_factors(&self) -> Result<Option<Vec<f32>>> {
        let Some((file, name)) = ROPE_FACTORS.iter().find_map(|n| Some((self.shard_of(n)?, n))) else {
            return Ok(None);
        };
        let a = match file.load(name)? {
            GgufTensor::Plain(a) => ops::astype(&a, Dtype::Float32)?,
            GgufTensor::Quantized { .. } => return Err(self.meta().error(format!("tensor {name} is quantized; rotary factors are floats"))),
        };
        Ok(Some(a.to_vec::<f32>()?))
    }

    /// config.json's equivalent, with the `quantization` section describing
    /// the tensors that stay quantized.
    pub fn config(&self) -> Result<Value> {
        let meta = self.meta();
        let embed = self.shard_of("token_embd.weight").and_then(|f| f.info("token_embd.weight")).ok_or_else(|| meta.error("no tensor token_embd.weight"))?;
        let vocab = embed.shape[0] as i64;
        let mut config = self.arch.config(&meta, self.shard_of("output.weight").is_some(), vocab, self.rope_factors()?)?;
        let quantized = self.quantized_layers(&meta);
        if !quantized.is_empty() {
            // Every quantized layer is named (so that `--quantize` can give
            // the dequantized ones another default); the most common kind is
            // also the default, as mlx-lm writes it.
            let mut counts: BTreeMap<(i32, i32), usize> = BTreeMap::new();
            for q in quantized.values() {
                *counts.entry(*q).or_default() += 1;
            }
            let (&(bits, group), _) = counts.iter().max_by_key(|(_, n)| **n).expect("not empty");
            let mut section = Map::new();
            section.insert("group_size".into(), json!(group));
            section.insert("bits".into(), json!(bits));
            for (layer, &(b, g)) in &quantized {
                section.insert(layer.clone(), json!({"group_size": g, "bits": b}));
            }
            config["quantization"] = Value::Object(section);
        }
        Ok(config)
    }

    /// HF layer path → (bits, group size) of each tensor that stays quantized.
    fn quantized_layers(&self, meta: &Metadata) -> BTreeMap<String, (i32, i32)> {
        self.tensors()
            .filter_map(|(file, name)| {
                let bits = match file.info(name)?.ggml_type {
                    GgufType::Q4_0 | GgufType::Q4_1 => 4,
                    GgufType::Q8_0 => 8,
                    _ => return None,
                };
                let hf = self.arch.hf_name(name, meta)?;
                Some((hf.strip_suffix(".weight")?.to_string(), (bits, 32)))
            })
            .collect()
    }

    /// Every tensor under its Hugging Face name, q/k rows put back in Hugging
    /// Face order (Gemma's norms stay 1 + w, as stored: see `Weights`).
    /// Tensors of block types MLX cannot hold are dequantized to `float`.
    pub fn weights(&self) -> Result<Weights> {
        let meta = self.meta();
        let heads = meta.arch_int("attention.head_count")? as i32;
        let kv_heads = meta.arch_int_or("attention.head_count_kv", heads as i64)? as i32;
        let mut tensors = HashMap::new();
        let mut converted: BTreeMap<String, usize> = BTreeMap::new();
        for (file, name) in self.tensors() {
            if ROPE_FACTORS.contains(&name.as_str()) || UNUSED.contains(&name.as_str()) {
                continue;
            }
            let hf = self.arch.hf_name(name, &meta).ok_or_else(|| {
                meta.error(format!("tensor {name} is not one a {} model has", self.arch.gguf))
            })?;
            if tensors.contains_key(&hf) {
                return Err(Error::model_file(file.path(), format!("tensor {name} is in two shards")));
            }
            let info = file.info(name).expect("listed by the file");
            // Rows of q and k in llama.cpp's order: heads for q, KV heads for k.
            let permute = match () {
                _ if !self.arch.permute_qk => None,
                _ if hf.contains(".self_attn.q_proj.") => Some(heads),
                _ if hf.contains(".self_attn.k_proj.") => Some(kv_heads),
                _ => None,
            };
            let unpermute = |a: Array| -> Result<Array> {
                match permute {
                    Some(n) => unpermute_rows(&a, n).map_err(|e| meta.error(format!("tensor {name}: {e}"))),
                    None => Ok(a),
                }
            };
            if !info.ggml_type.exact_in_mlx() {
                *converted.entry(info.ggml_type.name()).or_default() += 1;
            }
            match file.load(name)? {
                GgufTensor::Plain(a) => {
                    tensors.insert(hf, unpermute(a)?);
                }
                GgufTensor::Quantized { weight, scales, biases, .. } => {
                    let stem = hf.strip_suffix(".weight").ok_or_else(|| meta.error(format!("tensor {name} is quantized but not a weight")))?;
                    tensors.insert(format!("{stem}.scales"), unpermute(scales)?);
                    tensors.insert(format!("{stem}.biases"), unpermute(biases)?);
                    tensors.insert(hf, unpermute(weight)?);
                }
            }
        }
        if !converted.is_empty() {
            let kinds: Vec<String> = converted.iter().map(|(k, n)| format!("{n} {k}")).collect();
            log::info!(
                "{}: dequantized {} tensor(s) to bfloat16 at load (MLX holds only Q4_0, Q4_1 and Q8_0 blocks exactly)",
                self.path().display(),
                kinds.join(", ")
            );
        }
        let origin = self.path().display().to_string();
        Ok(Weights::from_tensors(tensors, &origin, self.arch.norms_hold_one))
    }

    /// The tokenizer, its special tokens and chat template.
    pub fn tokenizer(&self) -> Result<TokenizerParts> {
        tokenizer::build(&self.meta())
    }
}

/// Undoes llama.cpp's permutation of q/k rows for `heads` heads: each head's
/// rows were reordered from (pair half, index) to (index, pair half).
fn unpermute_rows(a: &Array, heads: i32) -> std::result::Result<Array, String> {
    let shape = a.shape();
    let rows = shape[0];
    if heads <= 0 || rows % (2 * heads) != 0 {
        return Err(format!("{rows} rows do not split into {heads} heads of rotary pairs"));
    }
    let mut split = vec![heads, rows / heads / 2, 2];
    split.extend_from_slice(&shape[1..]);
    let r = ops::reshape(a, &split).map_err(|e| e.to_string())?;
    let r = ops::swapaxes(&r, 1, 2).map_err(|e| e.to_string())?;
    ops::reshape(&r, &shape).map_err(|e| e.to_string())
}
