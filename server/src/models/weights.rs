//! The weights of a model folder: single or sharded safetensors, read lazily
//! (each tensor is a pread-backed array, read when first evaluated).
//!
//! Layers take their tensors out by name; whatever is left at the end is an
//! error, as mlx-lm's strict loading is, so a misnamed or unexpected tensor is
//! never silently ignored.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx_rs_safe::distributed::Group;
use mlx_rs_safe::ext::pread_blocks_into;
use mlx_rs_safe::io::{SafetensorsFile, TensorMeta};
use mlx_rs_safe::{ops, Array, Dtype};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::experts::ExpertStream;

/// Where a tensor's bytes lie: the file and the tensor's place in it.
#[derive(Debug, Clone)]
pub struct TensorSource {
    pub file: Arc<PathBuf>,
    pub meta: TensorMeta,
}

/// How a tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Float values.
    Float,
    /// A quantized matrix's packed integers.
    Packed,
    /// Float values checked when they are read (streamed experts), not at load.
    FloatUnread,
    /// The one-byte scales of the float quantization modes (mxfp4's e8m0
    /// exponents, nvfp4's e4m3 values): every byte is a valid scale.
    ByteScales,
}

pub struct Weights {
    tensors: HashMap<String, Array>,
    /// Which file each tensor came from, for error messages.
    origin: HashMap<String, String>,
    /// Gemma's RMS norm weights are stored as 1 + w already (llama.cpp's
    /// converter adds the one), so the model takes them as they are.
    norms_hold_one: bool,
    /// Where each safetensors tensor lies (none for GGUF, whose blocks are
    /// repacked at load): what expert streaming reads from.
    sources: HashMap<String, TensorSource>,
    /// Set with --stream-experts: MoE layers index their routed experts
    /// instead of taking them.
    streaming: Option<Arc<ExpertStream>>,
    /// How this process shares the model with the other ranks of its group.
    sharding: Sharding,
    /// Bytes of tensor data the model's arrays will read from the files
    /// (whole tensors, or a rank's part of them).
    read_bytes: u64,
}

/// How the model is split over the ranks of a distributed group.
#[derive(Debug, Clone, Default)]
pub enum Sharding {
    /// This process holds the whole model.
    #[default]
    Whole,
    /// Every rank holds every layer's part: attention heads, MLP columns and
    /// each expert's columns are split over the ranks, the partial outputs
    /// summed (mlx-lm's `shard`).
    Tensor(Group),
    /// Every rank holds whole layers, a run of them each (mlx-lm's
    /// `pipeline`), handing its output on as `Transfer` says.
    Pipeline(Group, super::pipeline::Transfer),
}

impl Sharding {
    /// The group the model is shared over, if any.
    pub fn group(&self) -> Option<&Group> {
        match self {
            Sharding::Whole => None,
            Sharding::Tensor(g) | Sharding::Pipeline(g, _) => Some(g),
        }
    }
}

/// Which part of a `[..., out, in]` weight (or its `[out]` bias) a rank holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// All of it (replicated on every rank).
    Whole,
    /// A run of output rows (attention heads, MLP columns): the layer's input
    /// is whole, its output this rank's part.
    Rows,
    /// A run of input columns: the layer takes this rank's part of its input
    /// and gives a partial sum of its output, summed over the ranks.
    Cols,
}

/// A model's weight bytes by where they sit (see [`Weights::footprint`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightFootprint {
    /// Each decoder layer's weights, its routed experts included.
    pub layers: Vec<u64>,
    /// Of each layer's bytes, its routed experts'.
    pub routed: Vec<u64>,
    /// The embedding, final norm and output head.
    pub other: u64,
    /// Bits of an activation, and so of an uncompressed KV cache's element:
    /// the embedding's output dtype (its scales' where quantized), 32 for
    /// float32 models, else 16.
    pub activation_bits: u32,
}

impl WeightFootprint {
    pub fn total(&self) -> u64 {
        self.layers.iter().sum::<u64>() + self.other
    }

    pub fn routed_experts(&self) -> u64 {
        self.routed.iter().sum()
    }

    /// Bytes layers `range` keep in memory: all, or without their routed
    /// experts when those are streamed from disk.
    pub fn resident(&self, range: std::ops::Range<usize>, streamed: bool) -> u64 {
        let end = range.end.min(self.layers.len());
        let start = range.start.min(end);
        (start..end).map(|i| self.layers[i] - if streamed { self.routed[i] } else { 0 }).sum()
    }
}

/// This rank's rows of `a` when its first axis is `segments` laid end to end
/// (e.g. a fused projection's query, key and value rows) and each segment is
/// split over the group's ranks: the rank's run of every segment, in order.
pub fn row_segments_part(a: &Array, segments: &[i32], group: &Group) -> Result<Array> {
    let (rank, size) = (group.rank() as i32, group.size() as i32);
    if segments.iter().sum::<i32>() != a.dim(0)? {
        return Err(Error::Internal("row segments that do not add up to the tensor's rows"));
    }
    let mut parts = Vec::with_capacity(segments.len());
    let mut start = 0;
    for &len in segments {
        if len % size != 0 {
            return Err(Error::Config(format!(
                "tensor parallelism over {size} ranks: a segment of {len} rows does not divide among the ranks; use --distributed pipeline"
            )));
        }
        let n = len / size;
        parts.push(ops::slice_axis(a, 0, start + rank * n, start + (rank + 1) * n)?);
        start += len;
    }
    Ok(ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0)?)
}

/// The axis `split` cuts in a tensor of `shape`: rows are the second-to-last
/// axis of a matrix (the only axis of a bias), columns the last.
fn split_axis(shape: &[i32], split: Split) -> Option<usize> {
    match (split, shape.len()) {
        (Split::Whole, _) | (_, 0) => None,
        (Split::Rows, 1) => Some(0),
        (Split::Cols, 1) => None,
        (Split::Rows, n) => Some(n - 2),
        (Split::Cols, n) => Some(n - 1),
    }
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl Weights {
    /// Reads `model.safetensors.index.json` (or, without one, every `*.safetensors`).
    pub fn load(dir: &Path) -> Result<Weights> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<String> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| Error::model_file(&index_path, e.to_string()))?;
            let index: ShardIndex = serde_json::from_str(&text)
                .map_err(|e| Error::model_file(&index_path, format!("invalid index: {e}")))?;
            let mut files: Vec<String> = index.weight_map.into_values().collect();
            files.sort();
            files.dedup();
            files
        } else {
            let mut files: Vec<String> = std::fs::read_dir(dir)
                .map_err(|e| Error::model_file(dir, e.to_string()))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            files.sort();
            files
        };
        if files.is_empty() {
            return Err(Error::model_file(dir, "no .safetensors weights in the model folder"));
        }
        let mut tensors = HashMap::new();
        let mut origin = HashMap::new();
        let mut sources = HashMap::new();
        for file in files {
            let path = dir.join(&file);
            if !path.exists() {
                return Err(Error::model_file(&path, "missing shard (listed in model.safetensors.index.json)"));
            }
            let st = SafetensorsFile::open(&path)?;
            let shared_path = Arc::new(path.clone());
            for (name, array) in st.load_all()? {
                if let Some(meta) = st.info(&name) {
                    sources.insert(name.clone(), TensorSource { file: shared_path.clone(), meta: meta.clone() });
                }
                origin.insert(name.clone(), file.clone());
                tensors.insert(name, array);
            }
        }
        Ok(Weights { tensors, origin, norms_hold_one: false, sources, streaming: None, sharding: Sharding::Whole, read_bytes: 0 })
    }

    /// Tensors already named as Hugging Face names them, all from `origin`
    /// (a GGUF file); `norms_hold_one`: Gemma norms stored as 1 + w.
    pub fn from_tensors(tensors: HashMap<String, Array>, origin: &str, norms_hold_one: bool) -> Weights {
        let origin = tensors.keys().map(|k| (k.clone(), origin.to_string())).collect();
        Weights { tensors, origin, norms_hold_one, sources: HashMap::new(), streaming: None, sharding: Sharding::Whole, read_bytes: 0 }
    }

    /// Renames every tensor by `rename` (None drops it): a wrapper checkpoint's
    /// text tower under the names its text model reads (Gemma 4's).
    pub fn rename(&mut self, rename: impl Fn(&str) -> Option<String>) {
        let names: Vec<String> = self.tensors.keys().cloned().collect();
        for old in names {
            let Some(a) = self.tensors.remove(&old) else { continue };
            let origin = self.origin.remove(&old);
            let source = self.sources.remove(&old);
            let Some(new) = rename(&old) else { continue };
            self.tensors.insert(new.clone(), a);
            if let Some(o) = origin {
                self.origin.insert(new.clone(), o);
            }
            if let Some(s) = source {
                self.sources.insert(new, s);
            }
        }
    }

    /// Whether a tensor named `name` is a routed expert's (stacked
    /// `switch_mlp.*` or, in gpt-oss, `experts.{gate,up,down}_proj.*`, in Gemma 4
    /// `experts.switch_glu.*`; or
    /// per-expert `experts.{e}.*`; not a shared expert).
    pub fn is_routed_expert(name: &str) -> bool {
        let after_experts = name.split(".experts.").nth(1).and_then(|rest| rest.split('.').next());
        name.contains(".switch_mlp.")
            || name.contains(".experts.switch_glu.")
            || after_experts.is_some_and(|e| {
                (!e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
                    || ["gate_proj", "up_proj", "down_proj"].contains(&e)
                    // openai's gpt-oss layout: gate_up_proj_blocks, down_proj_scales, ...
                    || e.starts_with("gate_up_proj")
                    || e.starts_with("down_proj_")
            })
    }

    /// Bytes of (routed-expert tensors, all other tensors) as stored in the
    /// safetensors files.
    pub fn stored_bytes(&self) -> (u64, u64) {
        self.sources.iter().fold((0, 0), |(experts, rest), (name, src)| {
            if Weights::is_routed_expert(name) {
                (experts + src.meta.nbytes, rest)
            } else {
                (experts, rest + src.meta.nbytes)
            }
        })
    }

    /// Where the weights' bytes sit, for the memory plan: per decoder layer
    /// (`model.layers.{i}.`), elsewhere (embedding, final norm, output head),
    /// and the routed experts (counted apart: `--stream-experts` keeps them on
    /// disk). Sizes as MLX will hold them (after `--quantize`).
    pub fn footprint(&self) -> WeightFootprint {
        let mut f = WeightFootprint { activation_bits: self.activation_bits(), ..Default::default() };
        for (name, a) in &self.tensors {
            let bytes = a.nbytes() as u64;
            let layer = name.strip_prefix("model.layers.").and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
            match layer {
                Some(i) => {
                    if f.layers.len() <= i {
                        f.layers.resize(i + 1, 0);
                        f.routed.resize(i + 1, 0);
                    }
                    f.layers[i] += bytes;
                    if Weights::is_routed_expert(name) {
                        f.routed[i] += bytes;
                    }
                }
                None => f.other += bytes,
            }
        }
        f
    }

    /// Bits of the model's activations: those of the token embedding's
    /// output (`model.embed_tokens`: its weight's dtype, or its scales' where
    /// quantized), 16 where there is none.
    fn activation_bits(&self) -> u32 {
        let float_bits = |name: &str| self.tensors.get(name).map(|a| a.dtype()).filter(|d| d.is_floating()).map(|d| d.size_of() as u32 * 8);
        float_bits("model.embed_tokens.weight").or_else(|| float_bits("model.embed_tokens.scales")).unwrap_or(16)
    }

    /// The safetensors files the tensors come from.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.sources.values().map(|s| s.file.as_ref().clone()).collect();
        files.sort();
        files.dedup();
        files
    }

    /// MoE layers stream their routed experts through `stream` from now on.
    pub fn stream_experts(&mut self, stream: Arc<ExpertStream>) {
        self.streaming = Some(stream);
    }

    pub fn streaming(&self) -> Option<Arc<ExpertStream>> {
        self.streaming.clone()
    }

    /// The model is split over a distributed group from now on.
    pub fn shard(&mut self, sharding: Sharding) {
        self.sharding = sharding;
    }

    pub fn sharding(&self) -> &Sharding {
        &self.sharding
    }

    /// The group tensor-parallel layers split over (None: whole layers).
    pub fn tensor_parallel(&self) -> Option<&Group> {
        match &self.sharding {
            Sharding::Tensor(g) if g.size() > 1 => Some(g),
            _ => None,
        }
    }

    /// Whether Gemma-style (1 + w) norm weights are stored with the one added.
    pub fn norms_hold_one(&self) -> bool {
        self.norms_hold_one
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shape of tensor `name`, if there is one (nothing is read).
    pub fn shape_of(&self, name: &str) -> Option<Vec<i32>> {
        self.tensors.get(name).map(Array::shape)
    }

    /// Removes tensor `name`, unchecked.
    fn remove(&mut self, name: &str) -> Result<Array> {
        self.sources.remove(name);
        self.tensors.remove(name).ok_or_else(|| Error::ModelFile {
            file: "weights".into(),
            message: format!("missing tensor {name}"),
        })
    }

    fn error(&self, name: &str, message: String) -> Error {
        Error::ModelFile { file: self.origin.get(name).cloned().unwrap_or_else(|| "weights".into()), message }
    }

    /// Refuses a tensor that cannot be what the model takes: a float tensor
    /// must be float16/bfloat16/float32 and finite (a NaN or infinity would
    /// turn every answer into garbage, far from its cause); a quantized
    /// matrix is packed as uint32.
    fn check(&self, name: &str, a: &Array, stored: Stored) -> Result<()> {
        let dtype = a.dtype();
        match stored {
            Stored::Packed if dtype != Dtype::Uint32 => {
                Err(self.error(name, format!("tensor {name} is {dtype:?}; a quantized weight is packed as Uint32")))
            }
            Stored::Packed => Ok(()),
            Stored::ByteScales if dtype != Dtype::Uint8 => {
                Err(self.error(name, format!("tensor {name} is {dtype:?}; the scales of this quantization mode are Uint8")))
            }
            Stored::ByteScales => Ok(()),
            Stored::Float | Stored::FloatUnread if !matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32) => Err(self.error(
                name,
                format!("tensor {name} is {dtype:?}; expected Float16, Bfloat16 or Float32"),
            )),
            Stored::FloatUnread => Ok(()),
            Stored::Float => {
                // Reads the tensor now rather than at the first request.
                if ops::all_all(&ops::isfinite(a)?, false)?.item::<bool>()? {
                    Ok(())
                } else {
                    Err(self.error(name, format!("tensor {name} holds NaN or infinite values")))
                }
            }
        }
    }

    /// Removes tensor `name` without checking it: parts stacked into a tensor
    /// that is checked when taken.
    pub fn take_unchecked(&mut self, name: &str) -> Result<Array> {
        if let Some(src) = self.sources.get(name) {
            self.read_bytes += src.meta.nbytes;
        }
        self.remove(name)
    }

    /// Removes float tensor `name`, checking its shape and values.
    pub fn take_shaped(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        self.take_stored(name, shape, Stored::Float)
    }

    /// Removes the packed (uint32) matrix of a quantized layer, checking its shape.
    pub fn take_packed(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        self.take_stored(name, shape, Stored::Packed)
    }

    fn take_stored(&mut self, name: &str, shape: &[i32], stored: Stored) -> Result<Array> {
        self.take_part(name, shape, Split::Whole, stored)
    }

    /// Removes float tensor `name` of (whole) shape `shape`, keeping the part
    /// `split` gives this rank (all of it without tensor parallelism).
    pub fn take_split(&mut self, name: &str, shape: &[i32], split: Split) -> Result<Array> {
        self.take_part(name, shape, split, Stored::Float)
    }

    /// [`Weights::take_split`] for the packed (uint32) matrix of a quantized layer.
    pub fn take_packed_split(&mut self, name: &str, shape: &[i32], split: Split) -> Result<Array> {
        self.take_part(name, shape, split, Stored::Packed)
    }

    /// Removes tensor `name` stored as `stored`, keeping this rank's part.
    pub fn take_stored_split(&mut self, name: &str, shape: &[i32], split: Split, stored: Stored) -> Result<Array> {
        self.take_part(name, shape, split, stored)
    }

    fn take_part(&mut self, name: &str, shape: &[i32], split: Split, stored: Stored) -> Result<Array> {
        let source = self.sources.get(name).cloned();
        let a = self.remove(name)?;
        if a.shape() != shape {
            return Err(self.error(name, format!("tensor {name} has shape {:?}, the config implies {shape:?}", a.shape())));
        }
        let part = match (self.tensor_parallel().cloned(), split_axis(shape, split)) {
            (Some(group), Some(axis)) => self.part_of(name, a, source.as_ref(), axis, &group)?,
            _ => {
                if let Some(src) = &source {
                    self.read_bytes += src.meta.nbytes;
                }
                a
            }
        };
        self.check(name, &part, stored)?;
        Ok(part)
    }

    /// This rank's part of `a` along `axis`: read straight from the file
    /// (only the part's bytes), or sliced from `a` where it lies in no file.
    fn part_of(&mut self, name: &str, a: Array, source: Option<&TensorSource>, axis: usize, group: &Group) -> Result<Array> {
        let shape = a.shape();
        let (rank, size) = (group.rank() as i32, group.size() as i32);
        if shape[axis] % size != 0 {
            return Err(self.error(
                name,
                format!("tensor {name} ({shape:?}) cannot be split over {size} ranks: its axis {axis} ({}) is not a multiple of {size}", shape[axis]),
            ));
        }
        let n = shape[axis] / size;
        let mut part_shape = shape.clone();
        part_shape[axis] = n;
        match source {
            Some(src) => {
                let elem = src.meta.dtype.size_of() as u64;
                let inner: u64 = shape[axis + 1..].iter().map(|&d| d as u64).product::<u64>() * elem;
                let (block, stride) = (n as u64 * inner, shape[axis] as u64 * inner);
                let file = std::fs::File::open(src.file.as_ref()).map_err(|e| Error::model_file(src.file.as_ref(), e.to_string()))?;
                let part = pread_blocks_into(&file, src.meta.offset + rank as u64 * block, block, stride, &part_shape, src.meta.dtype)?;
                self.read_bytes += part.nbytes() as u64;
                Ok(part)
            }
            None => {
                let mut start = vec![0; shape.len()];
                start[axis] = rank * n;
                let mut stop = shape.clone();
                stop[axis] = (rank + 1) * n;
                Ok(ops::slice(&a, &start, &stop, &vec![1; shape.len()])?)
            }
        }
    }

    /// Removes tensor `name` without reading it, returning where its bytes lie
    /// (a streamed expert tensor): its shape and dtype are checked as `take_shaped`
    /// (`packed`: `take_packed`) would; its values are checked when read.
    pub fn take_source(&mut self, name: &str, shape: &[i32], stored: Stored) -> Result<TensorSource> {
        let Some(src) = self.sources.get(name).cloned() else {
            return Err(self.error(
                name,
                format!("tensor {name} has no place in a safetensors file: --stream-experts reads safetensors models (a GGUF file is repacked at load)"),
            ));
        };
        self.take_stored(name, shape, stored)?;
        // Read when streamed, not at load.
        self.read_bytes -= src.meta.nbytes;
        Ok(src)
    }

    /// Drops every tensor whose name matches `unused` (e.g. rotary buffers).
    pub fn discard(&mut self, unused: impl Fn(&str) -> bool) {
        self.tensors.retain(|k, _| !unused(k));
        self.sources.retain(|k, _| !unused(k));
    }

    /// Adds a tensor computed at load (it lies in no file).
    pub fn insert(&mut self, name: String, a: Array) {
        self.sources.remove(&name);
        self.tensors.insert(name, a);
    }

    /// Quantizes every weight matrix (≥ 2-D, floating, last axis a multiple of
    /// the group size) in place: `X.weight` becomes packed `X.weight` plus
    /// `X.scales` and `X.biases` — what mlx-lm's `quantize_model` does to each
    /// Linear, Embedding and switch layer.
    pub fn quantize_in_place(&mut self, group_size: i32, bits: i32) -> Result<usize> {
        let names: Vec<String> = self
            .tensors
            .iter()
            .filter(|(n, a)| {
                n.ends_with(".weight")
                    && a.ndim() >= 2
                    && a.dtype().is_floating()
                    && a.shape().last().is_some_and(|&d| d % group_size == 0)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in &names {
            let prefix = &name[..name.len() - ".weight".len()];
            // Listed from the map just above.
            let w = self.tensors.remove(name).expect("listed above");
            self.sources.remove(name);
            let (q, s, b) = mlx_rs_safe::quantized::quantize(&w, group_size, bits)?;
            self.tensors.insert(name.clone(), q);
            self.tensors.insert(format!("{prefix}.scales"), s);
            self.tensors.insert(format!("{prefix}.biases"), b);
        }
        Ok(names.len())
    }

    /// Errors if tensors are left that no layer took.
    pub fn finish(self) -> Result<()> {
        if self.tensors.is_empty() {
            match &self.sharding {
                Sharding::Whole => log::debug!("weights: {} bytes to read from the files", self.read_bytes),
                Sharding::Tensor(g) | Sharding::Pipeline(g, _) => log::info!(
                    "weights: rank {} of {} reads {} bytes from the files (its part)",
                    g.rank(),
                    g.size(),
                    self.read_bytes
                ),
            }
            return Ok(());
        }
        let mut left: Vec<&String> = self.tensors.keys().collect();
        left.sort();
        let shown: Vec<&str> = left.iter().take(8).map(|s| s.as_str()).collect();
        Err(Error::ModelFile {
            file: "weights".into(),
            message: format!(
                "{} tensor(s) not used by the model: {}{}",
                left.len(),
                shown.join(", "),
                if left.len() > 8 { ", ..." } else { "" }
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Weights;

    #[test]
    fn routed_experts_are_told_from_shared_ones_in_every_layout() {
        for name in [
            "model.layers.0.mlp.switch_mlp.gate_proj.weight",
            "model.layers.3.mlp.experts.17.down_proj.scales",
            "model.layers.0.mlp.experts.up_proj.bias", // gpt-oss: stacked under `experts`
            "model.layers.1.experts.switch_glu.down_proj.weight", // Gemma 4
            "model.layers.2.mlp.experts.gate_up_proj_blocks", // openai's gpt-oss
        ] {
            assert!(Weights::is_routed_expert(name), "{name}");
        }
        for name in [
            "model.layers.0.mlp.shared_expert.gate_proj.weight",
            "model.layers.0.mlp.shared_experts.gate_proj.weight",
            "model.layers.0.mlp.router.weight",
            "model.layers.0.mlp.gate.weight",
            "model.layers.0.self_attn.sinks",
        ] {
            assert!(!Weights::is_routed_expert(name), "{name}");
        }
    }
}
