//! The layers every architecture shares: linear (dense or quantized), embedding
//! (dense or quantized, usable as the tied output head) and RMS norm. Each does
//! exactly what its mlx.nn counterpart does, op for op, so outputs match mlx-lm.

use mlx_rs_safe::distributed::Group;
use mlx_rs_safe::{fast, ops, quantized, Array};

use super::quant::{scales_stored, QuantConfig, QuantSpec};
use super::{prompt_matmul, quant_kernel};
use super::weights::{row_segments_part, Split, Weights};
use crate::error::Result;

/// The KV heads each of `ranks` tensor-parallel ranks holds of `n_kv`: its
/// share where they divide among the ranks, one (repeated on the ranks that
/// share it) where they divide the ranks; None where neither.
pub fn kv_heads_per_rank(n_kv: i32, ranks: i32) -> Option<i32> {
    if n_kv > 0 && n_kv % ranks == 0 {
        Some(n_kv / ranks)
    } else if n_kv > 0 && ranks % n_kv == 0 {
        Some(1)
    } else {
        None
    }
}

/// A quantized weight: packed values, per-group scales, and per-group biases
/// in the affine mode (the float modes have none).
#[derive(Clone)]
pub struct QuantizedWeight {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
    pub params: QuantSpec,
}

impl QuantizedWeight {
    /// Takes `{prefix}.scales/.weight/.biases` if the layer is quantized, checking
    /// them against the float shape `[rows, cols]` the config implies.
    fn take(w: &mut Weights, prefix: &str, rows: i32, cols: i32, split: Split, quant: &QuantConfig) -> Result<Option<QuantizedWeight>> {
        QuantizedWeight::take_stacked(w, prefix, &[], rows, cols, split, quant)
    }

    /// Like `take`, for stacked matrices `[lead..., rows, cols]` (`lead`:
    /// `[experts]` for a MoE switch layer). A split of the columns splits the
    /// packed words and the groups alike, so each rank's part stays whole groups.
    pub fn take_stacked(
        w: &mut Weights,
        prefix: &str,
        lead: &[i32],
        rows: i32,
        cols: i32,
        split: Split,
        quant: &QuantConfig,
    ) -> Result<Option<QuantizedWeight>> {
        if !w.contains(&format!("{prefix}.scales")) {
            return Ok(None);
        }
        let params = quant.for_layer(prefix)?;
        let (packed, groups) = (cols * params.bits / 32, cols / params.group_size);
        let shape = |last: i32| [lead, &[rows, last]].concat();
        Ok(Some(QuantizedWeight {
            weight: w.take_packed_split(&format!("{prefix}.weight"), &shape(packed), split)?,
            scales: w.take_stored_split(&format!("{prefix}.scales"), &shape(groups), split, scales_stored(params))?,
            biases: match params.mode.has_biases() {
                true => Some(w.take_split(&format!("{prefix}.biases"), &shape(groups), split)?),
                false => None,
            },
            params,
        }))
    }

    /// x @ W.T with W dequantized on the fly: by the decode kernel where it
    /// applies (CUDA, decode steps of 1 to 32 rows), for a layer dequantized
    /// whole and multiplied where a prompt's rows make that pay (CUDA), else
    /// by MLX.
    fn matmul_t(&self, x: &Array, product: Product) -> Result<Array> {
        if let Some(y) = quant_kernel::matmul(x, &self.weight, &self.scales, self.biases.as_ref(), self.params)? {
            return Ok(y);
        }
        if product == Product::Layer {
            if let Some(y) = prompt_matmul::matmul(x, &self.weight, &self.scales, self.biases.as_ref(), self.params)? {
                return Ok(y);
            }
        }
        Ok(quantized::quantized_matmul_with(x, &self.weight, &self.scales, self.biases.as_ref(), true, self.params)?)
    }

    /// The tensors as the decode kernel takes them.
    pub fn packed(&self) -> quant_kernel::Packed<'_> {
        quant_kernel::Packed { w: &self.weight, scales: &self.scales, biases: self.biases.as_ref() }
    }

    /// x [..., 1, in] through the stacked experts `indices` picks → [..., 1, out]
    /// (MLX's gather_qmm): by the decode kernel where it applies, and, where
    /// `dequantize`, a prompt chunk's sorted pairs by the dequantized stack
    /// where that pays.
    pub fn gather_t(&self, x: &Array, indices: &Array, sorted: bool, dequantize: bool) -> Result<Array> {
        if let Some(y) = quant_kernel::gather(x, &self.weight, &self.scales, self.biases.as_ref(), indices, self.params)? {
            return Ok(y);
        }
        if sorted && dequantize {
            if let Some(y) = prompt_matmul::gather(x, &self.weight, &self.scales, self.biases.as_ref(), indices, self.params)? {
                return Ok(y);
            }
        }
        let (w, s, b) = (&self.weight, &self.scales, self.biases.as_ref());
        Ok(quantized::gather_qmm_with(x, w, s, b, None, Some(indices), true, self.params, sorted)?)
    }
}

/// Whose product a quantized matmul computes. A prefill chunk's logits are
/// built and dropped (the engine evaluates its cache, as mlx-lm does), so the
/// output head's prompt-sized product keeps MLX's quantized_matmul: the
/// prompt path's pacing starts products as it goes, and would compute the
/// head, the model's largest weight dequantized (Llama-3.1-8B's: 1 GB at 16
/// bits), for logits nobody reads.
#[derive(Clone, Copy, PartialEq)]
enum Product {
    Layer,
    Head,
}

#[derive(Clone)]
enum LinearWeight {
    Dense(Array),
    Quantized(QuantizedWeight),
}

#[derive(Clone)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Array>,
    /// Set when the layer holds a run of its input columns (tensor
    /// parallelism): its output is a partial sum, summed over this group
    /// before the bias is added (mlx-lm's sharded-to-all linear).
    reduce: Option<Group>,
}

impl Linear {
    /// Loads `{prefix}.weight` of a `in_dim → out_dim` layer (+ `.scales`/`.biases`
    /// when quantized, `.bias` when `bias` is set), checking shapes.
    pub fn load(w: &mut Weights, prefix: &str, in_dim: i32, out_dim: i32, bias: bool, quant: &QuantConfig) -> Result<Linear> {
        Linear::load_split(w, prefix, in_dim, out_dim, bias, Split::Whole, quant)
    }

    /// [`Linear::load`] of this rank's part of the layer (see [`Split`]);
    /// without tensor parallelism, the whole layer. `in_dim`/`out_dim` are
    /// the whole layer's.
    pub fn load_split(w: &mut Weights, prefix: &str, in_dim: i32, out_dim: i32, bias: bool, split: Split, quant: &QuantConfig) -> Result<Linear> {
        let reduce = match split {
            Split::Cols => w.tensor_parallel().cloned(),
            Split::Rows | Split::Whole => None,
        };
        let b = if bias { Some(w.take_split(&format!("{prefix}.bias"), &[out_dim], split)?) } else { None };
        let weight = match QuantizedWeight::take(w, prefix, out_dim, in_dim, split, quant)? {
            Some(q) => LinearWeight::Quantized(q),
            None => LinearWeight::Dense(w.take_split(&format!("{prefix}.weight"), &[out_dim, in_dim], split)?),
        };
        Ok(Linear { weight, bias: b, reduce })
    }

    /// This rank's output rows of a whole layer whose outputs are `segments`
    /// end to end, each split over `group` (see [`row_segments_part`]): a
    /// fused projection under tensor parallelism.
    pub fn rows_by_segments(self, segments: &[i32], group: &Group) -> Result<Linear> {
        self.map_rows(|a| row_segments_part(a, segments, group))
    }

    /// The layer's output rows `start .. start + len`.
    fn rows_range(self, start: i32, len: i32) -> Result<Linear> {
        self.map_rows(|a| Ok(ops::slice_axis(a, 0, start, start + len)?))
    }

    /// The layer with `part` applied to every tensor indexed by output row.
    fn map_rows(self, part: impl Fn(&Array) -> Result<Array>) -> Result<Linear> {
        let weight = match self.weight {
            LinearWeight::Dense(w) => LinearWeight::Dense(part(&w)?),
            LinearWeight::Quantized(q) => LinearWeight::Quantized(QuantizedWeight {
                weight: part(&q.weight)?,
                scales: part(&q.scales)?,
                biases: q.biases.as_ref().map(&part).transpose()?,
                params: q.params,
            }),
        };
        Ok(Linear { weight, bias: self.bias.as_ref().map(&part).transpose()?, reduce: self.reduce })
    }

    /// One layer computing `parts`' outputs end to end (their output rows
    /// stacked): one matmul where they took one each, so a decode step
    /// launches fewer kernels (q/k/v, gate/up). Each output row is the same
    /// dot product as before. None where they cannot be stacked: weights of
    /// other kinds, dtypes or quantization, a bias on some only, or partial
    /// sums of tensor parallelism. The stacked tensors are evaluated here, on
    /// the caller's stream (the layer's device), so the parts' memory is
    /// freed as each layer loads rather than held until the first step.
    /// `MLX_SERVE_STACK_PROJECTIONS=0` keeps them separate (to compare).
    pub fn stack_rows(parts: &[&Linear]) -> Result<Option<Linear>> {
        let Some((first, rest)) = parts.split_first() else { return Ok(None) };
        if rest.is_empty() || !stacking_enabled() || !parts.iter().all(|p| first.stacks_with(p)) {
            return Ok(None);
        }
        let tensors: Vec<[Option<Array>; 4]> = parts.iter().map(|p| p.row_tensors()).collect();
        let mut stacked: [Option<Array>; 4] = Default::default();
        for (i, slot) in stacked.iter_mut().enumerate() {
            let column: Option<Vec<&Array>> = tensors.iter().map(|t| t[i].as_ref()).collect();
            *slot = column.map(|c| ops::concatenate(&c, 0)).transpose()?;
        }
        mlx_rs_safe::eval(&stacked.iter().flatten().collect::<Vec<_>>())?;
        let [weight, scales, biases, bias] = stacked;
        let missing = || crate::error::Error::Internal("a stacked layer lost its weight");
        let weight = match &first.weight {
            LinearWeight::Dense(_) => LinearWeight::Dense(weight.ok_or_else(missing)?),
            LinearWeight::Quantized(q) => LinearWeight::Quantized(QuantizedWeight {
                weight: weight.ok_or_else(missing)?,
                scales: scales.ok_or_else(missing)?,
                biases,
                params: q.params,
            }),
        };
        Ok(Some(Linear { weight, bias, reduce: None }))
    }

    /// Whether `other`'s output rows can be stacked under this layer's (see
    /// [`Linear::stack_rows`]).
    fn stacks_with(&self, other: &Linear) -> bool {
        let same_weight = match (&self.weight, &other.weight) {
            (LinearWeight::Dense(a), LinearWeight::Dense(b)) => a.dtype() == b.dtype() && a.ndim() == 2 && b.ndim() == 2 && a.dim(1).ok() == b.dim(1).ok(),
            (LinearWeight::Quantized(a), LinearWeight::Quantized(b)) => {
                a.params == b.params
                    && a.weight.dtype() == b.weight.dtype()
                    && a.scales.dtype() == b.scales.dtype()
                    && a.biases.is_some() == b.biases.is_some()
                    && a.weight.ndim() == 2
                    && b.weight.ndim() == 2
                    && a.weight.dim(1).ok() == b.weight.dim(1).ok()
            }
            _ => false,
        };
        let same_bias = match (&self.bias, &other.bias) {
            (Some(a), Some(b)) => a.dtype() == b.dtype(),
            (None, None) => true,
            _ => false,
        };
        same_weight && same_bias && self.reduce.is_none() && other.reduce.is_none()
    }

    /// Where the layer is a plain quantized product (no bias, no partial sum
    /// of tensor parallelism): its weight's first and second halves of output
    /// rows, each as a weight of its own sharing this one's memory (evaluated
    /// here, so the views cost no copy). A stacked or fused gate/up
    /// projection's gate and up, for the gated decode kernel.
    pub fn quantized_halves(&self) -> Result<Option<(QuantizedWeight, QuantizedWeight)>> {
        let LinearWeight::Quantized(q) = &self.weight else { return Ok(None) };
        let rows = q.weight.dim(0)?;
        if self.bias.is_some() || self.reduce.is_some() || q.weight.ndim() != 2 || rows % 2 != 0 {
            return Ok(None);
        }
        let half = |start: i32| -> Result<QuantizedWeight> {
            let part = |a: &Array| -> Result<Array> { Ok(ops::slice_axis(a, 0, start, start + rows / 2)?) };
            let h = QuantizedWeight { weight: part(&q.weight)?, scales: part(&q.scales)?, biases: q.biases.as_ref().map(part).transpose()?, params: q.params };
            mlx_rs_safe::eval(&[&h.weight, &h.scales].into_iter().chain(h.biases.as_ref()).collect::<Vec<_>>())?;
            Ok(h)
        };
        Ok(Some((half(0)?, half(rows / 2)?)))
    }

    /// The quantized weight of a plain quantized product (no bias, no
    /// partial sum), for kernels that fuse it with its neighbours.
    pub fn plain_quantized(&self) -> Option<&QuantizedWeight> {
        match &self.weight {
            LinearWeight::Quantized(q) if self.bias.is_none() && self.reduce.is_none() => Some(q),
            _ => None,
        }
    }

    /// The tensors indexed by output row: the weight (packed when
    /// quantized), its scales and biases, the layer's bias.
    fn row_tensors(&self) -> [Option<Array>; 4] {
        match &self.weight {
            LinearWeight::Dense(w) => [Some(w.clone()), None, None, self.bias.clone()],
            LinearWeight::Quantized(q) => [Some(q.weight.clone()), Some(q.scales.clone()), q.biases.clone(), self.bias.clone()],
        }
    }

    /// A key or value projection of `n_kv` heads of `head_dim` features:
    /// whole without tensor parallelism; under it, this rank's run of the
    /// heads where they divide among the ranks, else (more ranks than heads,
    /// a multiple of them) the one head this rank's queries attend to, held
    /// by every rank that shares it (mlx-lm's Qwen3.5 `shard` repeats such
    /// heads).
    pub fn load_kv_heads(w: &mut Weights, prefix: &str, in_dim: i32, n_kv: i32, head_dim: i32, bias: bool, quant: &QuantConfig) -> Result<Linear> {
        let (rank, ranks) = w.tensor_parallel().map_or((0, 1), |g| (g.rank() as i32, g.size() as i32));
        match kv_heads_per_rank(n_kv, ranks) {
            None => Err(crate::error::Error::Config(format!(
                "tensor parallelism over {ranks} ranks: {n_kv} KV heads neither divide among the ranks nor divide them; use --distributed pipeline"
            ))),
            Some(_) if n_kv % ranks == 0 => Linear::load_split(w, prefix, in_dim, n_kv * head_dim, bias, Split::Rows, quant),
            Some(_) => {
                let head = rank / (ranks / n_kv);
                Linear::load(w, prefix, in_dim, n_kv * head_dim, bias, quant)?.rows_range(head * head_dim, head_dim)
            }
        }
    }

    /// `residual + forward(x)`, as a layer's `h + proj(...)` computes it: in
    /// one kernel where the decode kernel's residual form applies (a plain
    /// quantized product on CUDA), else the product, then MLX's add.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        if let Some(q) = self.plain_quantized() {
            if let Some(y) = quant_kernel::matmul_add(x, q.packed(), residual, q.params)? {
                return Ok(y);
            }
        }
        Ok(ops::add(residual, &self.forward(x)?)?)
    }

    /// `forward(norm.forward(x))`: in one kernel where the decode kernel's
    /// normed form applies (a plain quantized product on CUDA), x being the
    /// residual stream the norm reads.
    pub fn forward_normed(&self, x: &Array, norm: &RmsNorm) -> Result<Array> {
        if let Some(q) = self.plain_quantized() {
            if let Some(y) = quant_kernel::matmul_normed(x, norm.kernel_norm(), q.packed(), q.params)? {
                return Ok(y);
            }
        }
        self.forward(&norm.forward(x)?)
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.project(x, Product::Layer)
    }

    fn project(&self, x: &Array, product: Product) -> Result<Array> {
        let bias = if self.reduce.is_some() { None } else { self.bias.as_ref() };
        let y = match &self.weight {
            // nn.Linear: addmm(bias, x, W.T) with a bias, x @ W.T without.
            LinearWeight::Dense(weight) => {
                let wt = ops::transpose(weight)?;
                match bias {
                    Some(b) => ops::addmm(b, x, &wt, 1.0, 1.0)?,
                    None => ops::matmul(x, &wt)?,
                }
            }
            LinearWeight::Quantized(q) => {
                let y = q.matmul_t(x, product)?;
                match bias {
                    Some(b) => ops::add(&y, b)?,
                    None => y,
                }
            }
        };
        let Some(group) = &self.reduce else { return Ok(y) };
        let y = group.all_sum(&y)?;
        Ok(match &self.bias {
            Some(b) => ops::add(&y, b)?,
            None => y,
        })
    }
}

pub enum Embedding {
    Dense(Array),
    Quantized(QuantizedWeight),
}

impl Embedding {
    /// Loads a `[vocab, dim]` table (quantized or not).
    pub fn load(w: &mut Weights, prefix: &str, vocab: i32, dim: i32, quant: &QuantConfig) -> Result<Embedding> {
        Ok(match QuantizedWeight::take(w, prefix, vocab, dim, Split::Whole, quant)? {
            Some(q) => Embedding::Quantized(q),
            None => Embedding::Dense(w.take_shaped(&format!("{prefix}.weight"), &[vocab, dim])?),
        })
    }

    /// Rows of the table for `ids`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(table) => Ok(ops::take(table, ids, 0)?),
            Embedding::Quantized(q) => {
                let w = ops::take(&q.weight, ids, 0)?;
                let s = ops::take(&q.scales, ids, 0)?;
                let b = q.biases.as_ref().map(|b| ops::take(b, ids, 0)).transpose()?;
                Ok(quantized::dequantize_with(&w, &s, b.as_ref(), q.params, None)?)
            }
        }
    }

    /// Logits of `x`: its own output head where the model has one, else the
    /// tied embedding.
    pub fn logits(&self, head: Option<&Linear>, x: &Array) -> Result<Array> {
        match head {
            Some(head) => head.project(x, Product::Head),
            None => self.as_linear(x),
        }
    }

    /// The tied output head: x @ table.T.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(table) => Ok(ops::matmul(x, &ops::transpose(table)?)?),
            Embedding::Quantized(q) => q.matmul_t(x, Product::Head),
        }
    }
}

pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: w.take_shaped(&format!("{prefix}.weight"), &[dim])?, eps })
    }

    /// Gemma's norm: rms_norm(x, 1 + weight), the sum taken once at load (the
    /// same array mlx-lm computes at every call), or stored so (GGUF files).
    pub fn load_plus_one(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        let weight = w.take_shaped(&format!("{prefix}.weight"), &[dim])?;
        if w.norms_hold_one() {
            return Ok(RmsNorm { weight, eps });
        }
        let one = ops::scalar_as(1.0f32, weight.dtype())?;
        Ok(RmsNorm { weight: ops::add(&one, &weight)?, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }

    /// The norm as the decode kernel applies it before a product.
    pub fn kernel_norm(&self) -> quant_kernel::Norm<'_> {
        quant_kernel::Norm { weight: &self.weight, eps: self.eps }
    }
}

/// Whether [`Linear::stack_rows`] stacks: on unless `MLX_SERVE_STACK_PROJECTIONS=0`,
/// read once (a benchmark compares the two in one run).
fn stacking_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| !crate::kernel_check::turned_off("MLX_SERVE_STACK_PROJECTIONS", "q/k/v and gate/up stay separate matmuls"))
}

#[cfg(test)]
mod tests {
    use mlx_rs_safe::quantized::{quantize_with, QuantSpec};
    use mlx_rs_safe::{ops, random, Array, Dtype};

    use super::{Linear, LinearWeight, QuantizedWeight};

    fn normal(shape: &[i32], seed: u64) -> Array {
        random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed).unwrap()).unwrap()
    }

    fn quantized(out: i32, seed: u64, bits: i32) -> Linear {
        let params = QuantSpec::affine(64, bits);
        let (weight, scales, biases) = quantize_with(&normal(&[out, 128], seed), params).unwrap();
        Linear { weight: LinearWeight::Quantized(QuantizedWeight { weight, scales, biases, params }), bias: Some(normal(&[out], seed + 100)), reduce: None }
    }

    fn values(a: &Array) -> Vec<f32> {
        a.to_vec::<f32>().unwrap()
    }

    #[test]
    fn stacked_rows_give_each_layers_outputs_side_by_side() {
        let x = normal(&[3, 1, 128], 7);
        let dense = |out, seed| Linear { weight: LinearWeight::Dense(normal(&[out, 128], seed)), bias: None, reduce: None };
        for parts in [vec![quantized(64, 1, 4), quantized(32, 2, 4), quantized(32, 3, 4)], vec![dense(96, 4), dense(96, 5)]] {
            let refs: Vec<&Linear> = parts.iter().collect();
            let stacked = Linear::stack_rows(&refs).unwrap().expect("these layers stack");
            let separate: Vec<Array> = parts.iter().map(|p| p.forward(&x).unwrap()).collect();
            let expected = ops::concatenate(&separate.iter().collect::<Vec<_>>(), -1).unwrap();
            assert_eq!(values(&stacked.forward(&x).unwrap()), values(&expected));
        }
    }

    /// The gated kernel's gate and up weights: the halves of a stacked
    /// projection are the two layers' own weights, unchanged.
    #[test]
    fn a_stacked_projections_halves_are_its_parts() {
        let plain = |seed| Linear { bias: None, ..quantized(64, seed, 4) };
        let (gate, up) = (plain(1), plain(2));
        let stacked = Linear::stack_rows(&[&gate, &up]).unwrap().expect("these layers stack");
        let (g, u) = stacked.quantized_halves().unwrap().expect("a plain quantized stack halves");
        for (half, part) in [(g, &gate), (u, &up)] {
            let want = part.plain_quantized().expect("a plain quantized layer");
            assert_eq!(half.weight.to_vec::<u32>().unwrap(), want.weight.to_vec::<u32>().unwrap());
            assert_eq!(values(&half.scales), values(&want.scales));
            assert_eq!(values(half.biases.as_ref().unwrap()), values(want.biases.as_ref().unwrap()));
            assert_eq!(half.params, want.params);
        }
        // A bias after the product: no halves (the kernel would skip it).
        let biased = Linear::stack_rows(&[&quantized(64, 3, 4), &quantized(64, 4, 4)]).unwrap().expect("these layers stack");
        assert!(biased.quantized_halves().unwrap().is_none());
        assert!(biased.plain_quantized().is_none());
    }

    #[test]
    fn layers_of_other_kinds_do_not_stack() {
        let (a, b) = (quantized(64, 1, 4), quantized(64, 2, 8));
        assert!(Linear::stack_rows(&[&a, &b]).unwrap().is_none(), "4-bit and 8-bit stacked");
        let mut c = quantized(64, 3, 4);
        c.bias = None;
        assert!(Linear::stack_rows(&[&a, &c]).unwrap().is_none(), "a bias on one only");
        let d = Linear { weight: LinearWeight::Dense(normal(&[64, 128], 4)), bias: Some(normal(&[64], 5)), reduce: None };
        assert!(Linear::stack_rows(&[&a, &d]).unwrap().is_none(), "quantized and dense stacked");
        assert!(Linear::stack_rows(&[&a]).unwrap().is_none(), "one layer is not a stack");
    }
}
