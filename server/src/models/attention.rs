//! Multi-head attention with grouped KV heads, rotary positions, an optional
//! per-head q/k RMS norm (Qwen3), and a KV cache — the attention of mlx-lm's
//! llama/qwen2/qwen3 files, op for op.

use mlx_rs_safe::{ops, Array};

use super::layers::{kv_heads_per_rank, Linear, RmsNorm};
use super::quant::QuantConfig;
use super::rope::Rope;
use super::weights::{Split, Weights};
use crate::error::{Error, Result};
use crate::kv::{AttendArgs, LayerCache, Positions, StepMemo};

/// The shape and options of one attention block.
#[derive(Debug, Clone)]
pub struct AttentionSpec {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    pub qk_norm: QkNorm,
    /// Softmax scale; default head_dim^-0.5.
    pub scale: Option<f32>,
    /// One `qkv_proj` producing queries, keys and values side by side (Phi-3).
    pub fused_qkv: bool,
    /// Learned attention sinks, one logit per head (`sinks`; gpt-oss).
    pub sinks: bool,
}

impl AttentionSpec {
    /// One rank's share of the heads when `ranks` ranks split them (tensor
    /// parallelism): an error where the layer cannot be split so.
    pub fn sharded(&self, ranks: i32) -> Result<AttentionSpec> {
        let refuse = |why: String| Err(Error::Config(format!("tensor parallelism over {ranks} ranks: {why}; use --distributed pipeline")));
        if self.fused_qkv {
            return refuse("this model's fused qkv projection is not split (Phi-3)".into());
        }
        if matches!(self.qk_norm, QkNorm::Full(_)) {
            return refuse("this model normalizes queries and keys over all heads at once (OLMoE)".into());
        }
        match kv_heads_per_rank(self.n_kv_heads, ranks) {
            Some(n_kv_heads) if self.n_heads % ranks == 0 => Ok(AttentionSpec { n_heads: self.n_heads / ranks, n_kv_heads, ..self.clone() }),
            _ => refuse(format!("{} query heads and {} KV heads do not divide among the ranks", self.n_heads, self.n_kv_heads)),
        }
    }
}

/// The input projections: separate, or one fused matmul split afterwards
/// (Phi-3's `qkv_proj`, or q/k/v stacked at load).
enum Projections {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// RMS normalisation of queries and keys before rope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QkNorm {
    None,
    /// Over each head's features (Qwen3): weights of size head_dim.
    PerHead(f32),
    /// Over the whole projection before splitting heads (OLMoE).
    Full(f32),
    /// Per head, with Gemma's (1 + weight) scaling.
    PerHeadPlusOne(f32),
}

pub struct Attention {
    spec: AttentionSpec,
    scale: f32,
    proj: Projections,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// This rank's heads' sink logits.
    sinks: Option<Array>,
    rope: Rope,
}

impl Attention {
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        hidden: i32,
        spec: AttentionSpec,
        rope: Rope,
        quant: &QuantConfig,
    ) -> Result<Attention> {
        let p = |n: &str| format!("{prefix}.{n}");
        let hd = spec.head_dim;
        // The whole layer's projection sizes (what the files hold).
        let (q_out, kv_out) = (spec.n_heads * hd, spec.n_kv_heads * hd);
        // Under tensor parallelism this rank runs a run of the heads.
        let spec = match w.tensor_parallel().map(|g| g.size() as i32) {
            Some(ranks) => spec.sharded(ranks)?,
            None => spec,
        };
        let norm = |w: &mut Weights, n: &str, full: i32| -> Result<Option<RmsNorm>> {
            match spec.qk_norm {
                QkNorm::None => Ok(None),
                QkNorm::PerHead(eps) => RmsNorm::load(w, &p(n), hd, eps).map(Some),
                QkNorm::PerHeadPlusOne(eps) => RmsNorm::load_plus_one(w, &p(n), hd, eps).map(Some),
                QkNorm::Full(eps) => RmsNorm::load(w, &p(n), full, eps).map(Some),
            }
        };
        Ok(Attention {
            scale: spec.scale.unwrap_or((hd as f32).powf(-0.5)),
            proj: if spec.fused_qkv {
                Projections::Fused(Linear::load(w, &p("qkv_proj"), hidden, q_out + 2 * kv_out, spec.qkv_bias, quant)?)
            } else {
                let q = Linear::load_split(w, &p("q_proj"), hidden, q_out, spec.qkv_bias, Split::Rows, quant)?;
                let k = Linear::load_kv_heads(w, &p("k_proj"), hidden, kv_out / hd, hd, spec.qkv_bias, quant)?;
                let v = Linear::load_kv_heads(w, &p("v_proj"), hidden, kv_out / hd, hd, spec.qkv_bias, quant)?;
                // One matmul for the three where their weights stack: fewer kernels a step.
                match Linear::stack_rows(&[&q, &k, &v])? {
                    Some(qkv) => Projections::Fused(qkv),
                    None => Projections::Separate { q, k, v },
                }
            },
            o_proj: Linear::load_split(w, &p("o_proj"), q_out, hidden, spec.o_bias, Split::Cols, quant)?,
            q_norm: norm(w, "q_norm", q_out)?,
            k_norm: norm(w, "k_norm", kv_out)?,
            sinks: if spec.sinks { Some(w.take_split(&p("sinks"), &[q_out / hd], Split::Rows)?) } else { None },
            rope,
            spec,
        })
    }

    /// `x`: [B, L, hidden] → [B, L, hidden]. `window` limits how far back a
    /// token attends (sliding-window layers).
    pub fn forward(&self, x: &Array, cache: &mut LayerCache, masks: &StepMemo, window: Option<i32>) -> Result<Array> {
        self.o_proj.forward(&self.attend(x, None, cache, masks, window)?)
    }

    /// `h + forward(norm.forward(h), ...)`: the residual stream `h` after
    /// the layer's attention, the norm before it applied by the q/k/v
    /// product's kernel and the sum added by the output projection's, where
    /// they apply.
    pub fn forward_normed_add(&self, h: &Array, norm: &RmsNorm, cache: &mut LayerCache, masks: &StepMemo, window: Option<i32>) -> Result<Array> {
        self.o_proj.forward_add(&self.attend(h, Some(norm), cache, masks, window)?, h)
    }

    /// The heads' attention outputs side by side, before the output
    /// projection; with `norm`, of norm.forward(x).
    fn attend(&self, x: &Array, norm: Option<&RmsNorm>, cache: &mut LayerCache, masks: &StepMemo, window: Option<i32>) -> Result<Array> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let full_norm = matches!(self.spec.qk_norm, QkNorm::Full(_));
        let heads = |a: Array, n: i32, norm: Option<&RmsNorm>| -> Result<Array> {
            let a = match norm {
                Some(nm) if full_norm => nm.forward(&a)?,
                _ => a,
            };
            let a = ops::reshape(&a, &[b, l, n, -1])?;
            let a = match norm {
                Some(nm) if !full_norm => nm.forward(&a)?,
                _ => a,
            };
            Ok(ops::transpose_axes(&a, &[0, 2, 1, 3])?)
        };
        let positions = cache.positions(masks)?;
        let (q, k, v) = match &self.proj {
            // Queries and keys side by side in the product: one rope call
            // turns both (a kernel a layer fewer than two calls).
            Projections::Fused(qkv) if self.spec.qk_norm == QkNorm::None => rope_queries_and_keys(&self.rope, &self.spec, &normed_product(qkv, x, norm)?, &positions)?,
            _ => {
                let (q, k, v) = self.project(x, norm)?;
                let q = heads(q, self.spec.n_heads, self.q_norm.as_ref())?;
                let k = heads(k, self.spec.n_kv_heads, self.k_norm.as_ref())?;
                (self.rope.forward(&q, &positions)?, self.rope.forward(&k, &positions)?, heads(v, self.spec.n_kv_heads, None)?)
            }
        };
        let out = cache.attend(&q, &k, &v, &AttendArgs { scale: self.scale, window, sinks: self.sinks.as_ref(), keep: false }, masks)?;
        Ok(ops::reshape(&ops::transpose_axes(&out, &[0, 2, 1, 3])?, &[b, l, -1])?)
    }

    /// The queries, keys and values as the projections write them ([B, L, heads·D] each).
    fn project(&self, x: &Array, norm: Option<&RmsNorm>) -> Result<(Array, Array, Array)> {
        match &self.proj {
            Projections::Separate { q, k, v } => {
                let normed = norm.map(|n| n.forward(x)).transpose()?;
                let x = normed.as_ref().unwrap_or(x);
                Ok((q.forward(x)?, k.forward(x)?, v.forward(x)?))
            }
            Projections::Fused(qkv) => {
                let q_pos = self.spec.n_heads * self.spec.head_dim;
                let k_end = q_pos + self.spec.n_kv_heads * self.spec.head_dim;
                let [q, k, v] = ops::split_sections_into(&normed_product(qkv, x, norm)?, &[q_pos, k_end], -1)?;
                Ok((q, k, v))
            }
        }
    }
}

/// `qkv` ([B, L, (heads + 2·KV heads)·D]) as [B, heads, L, D] queries and
/// [B, KV heads, L, D] keys and values, queries and keys rotated by one
/// rope call over both: rope turns each head alike, so each element comes
/// out as two calls would give it, from views of the product (no copy).
fn rope_queries_and_keys(rope: &Rope, spec: &AttentionSpec, qkv: &Array, positions: &Positions) -> Result<(Array, Array, Array)> {
    let shape = qkv.shape();
    let (nq, nkv) = (spec.n_heads, spec.n_kv_heads);
    let all = ops::transpose_axes(&ops::reshape(qkv, &[shape[0], shape[1], nq + 2 * nkv, spec.head_dim])?, &[0, 2, 1, 3])?;
    let [qk, v] = ops::split_sections_into(&all, &[nq + nkv], 1)?;
    let [q, k] = ops::split_sections_into(&rope.forward(&qk, positions)?, &[nq], 1)?;
    Ok((q, k, v))
}

/// `linear` over `x`, or over `norm.forward(x)` (the norm applied by the
/// product's kernel where it can).
fn normed_product(linear: &Linear, x: &Array, norm: Option<&RmsNorm>) -> Result<Array> {
    match norm {
        Some(n) => linear.forward_normed(x, n),
        None => linear.forward(x),
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs_safe::{ops, random, Array, Dtype};

    use super::*;
    use crate::models::config::RopeScaling;
    use crate::models::decoder::RopeSpec;

    /// Every element as f32 (exact for 16-bit floats), in row-major order.
    fn values(a: &Array) -> Vec<f32> {
        ops::astype(a, Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
    }

    /// One rope call over queries and keys together gives each element as a
    /// call for each would: base and Llama 3 frequencies, full and partial
    /// rotation, one start for the batch and one per row, 32 and 16 bits.
    #[test]
    fn one_rope_call_over_queries_and_keys_equals_a_call_for_each() {
        let (nq, nkv, d, b, l) = (4, 2, 16, 2, 3);
        let spec = AttentionSpec {
            n_heads: nq,
            n_kv_heads: nkv,
            head_dim: d,
            qkv_bias: false,
            o_bias: false,
            qk_norm: QkNorm::None,
            scale: None,
            fused_qkv: true,
            sinks: false,
        };
        let llama3 = RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 32.0 };
        let mut checked = 0;
        for (scaling, dims, traditional) in [(RopeScaling::Default, d, false), (RopeScaling::Default, d / 2, true), (llama3, d, false)] {
            let rope = Rope::new(&RopeSpec { theta: 10000.0, traditional, scaling, dims }).unwrap();
            for dtype in [Dtype::Float32, Dtype::Bfloat16] {
                let qkv = random::normal(&[b, l, (nq + 2 * nkv) * d], dtype, 0.0, 1.0, &random::key(7).unwrap()).unwrap();
                for positions in [Positions::Scalar(5), Positions::PerRow(Array::from_vec(&[3i32, 700]).unwrap())] {
                    let (q, k, v) = rope_queries_and_keys(&rope, &spec, &qkv, &positions).unwrap();
                    let parts: [Array; 3] = ops::split_sections_into(&qkv, &[nq * d, (nq + nkv) * d], -1).unwrap();
                    let heads = |a: &Array, n: i32| ops::transpose_axes(&ops::reshape(a, &[b, l, n, d]).unwrap(), &[0, 2, 1, 3]).unwrap();
                    let want = [
                        rope.forward(&heads(&parts[0], nq), &positions).unwrap(),
                        rope.forward(&heads(&parts[1], nkv), &positions).unwrap(),
                        heads(&parts[2], nkv),
                    ];
                    for (got, want) in [q, k, v].iter().zip(&want) {
                        assert_eq!(got.shape(), want.shape());
                        assert_eq!(values(got), values(want), "{dtype:?}, {dims} rotated features");
                    }
                    // The keys did turn (the comparison would hold for a rope that did nothing otherwise).
                    assert_ne!(values(&want[1]), values(&heads(&parts[1], nkv)));
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 12);
    }
}
