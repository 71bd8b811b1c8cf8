//! Multi-head attention with grouped KV heads, rotary positions, an optional
//! per-head q/k RMS norm (Qwen3), and a KV cache — the attention of mlx-lm's
//! llama/qwen2/qwen3 files, op for op.

use mlx_rs_safe::{ops, Array};

use super::layers::{kv_heads_per_rank, Linear, RmsNorm};
use super::quant::QuantConfig;
use super::rope::Rope;
use super::weights::{Split, Weights};
use crate::error::{Error, Result};
use crate::kv::{AttendArgs, LayerCache, StepMemo};

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
        let (q, k, v) = match &self.proj {
            Projections::Separate { q, k, v } => {
                let normed = norm.map(|n| n.forward(x)).transpose()?;
                let x = normed.as_ref().unwrap_or(x);
                (q.forward(x)?, k.forward(x)?, v.forward(x)?)
            }
            Projections::Fused(qkv) => {
                let q_pos = self.spec.n_heads * self.spec.head_dim;
                let k_end = q_pos + self.spec.n_kv_heads * self.spec.head_dim;
                let qkv = match norm {
                    Some(n) => qkv.forward_normed(x, n)?,
                    None => qkv.forward(x)?,
                };
                let mut parts = ops::split_sections(&qkv, &[q_pos, k_end], -1)?.into_iter();
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(q), Some(k), Some(v)) => (q, k, v),
                    _ => return Err(Error::Internal("the fused qkv projection did not split in three")),
                }
            }
        };
        let q = heads(q, self.spec.n_heads, self.q_norm.as_ref())?;
        let k = heads(k, self.spec.n_kv_heads, self.k_norm.as_ref())?;
        let v = heads(v, self.spec.n_kv_heads, None)?;

        let positions = cache.positions(masks)?;
        let q = self.rope.forward(&q, &positions)?;
        let k = self.rope.forward(&k, &positions)?;
        let out = cache.attend(&q, &k, &v, &AttendArgs { scale: self.scale, window, sinks: self.sinks.as_ref(), keep: false }, masks)?;
        Ok(ops::reshape(&ops::transpose_axes(&out, &[0, 2, 1, 3])?, &[b, l, -1])?)
    }
}
