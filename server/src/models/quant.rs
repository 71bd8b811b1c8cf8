//! MLX affine quantization settings of a model (`quantization` in config.json),
//! with per-layer overrides as mlx-lm writes them.

use serde_json::Value;

use crate::error::{Error, Result};

/// How one layer's weight is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    pub group_size: i32,
    pub bits: i32,
}

/// The `quantization` section: defaults plus overrides keyed by layer path.
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    default: Option<QuantParams>,
    overrides: serde_json::Map<String, Value>,
}

impl QuantConfig {
    /// Parses config.json's `quantization` (or `quantization_config` in MLX form).
    pub fn from_config(config: &Value) -> Result<QuantConfig> {
        let Some(q) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
            return Ok(QuantConfig::default());
        };
        let obj = q.as_object().ok_or_else(|| bad("`quantization` must be an object"))?;
        let mode = obj.get("mode").and_then(Value::as_str).unwrap_or("affine");
        if mode != "affine" {
            return Err(bad(&format!("quantization mode {mode:?} is not supported (only \"affine\")")));
        }
        let default = match (obj.get("group_size"), obj.get("bits")) {
            (Some(g), Some(b)) => Some(QuantParams { group_size: int(g, "group_size")?, bits: int(b, "bits")? }),
            (None, None) => None,
            _ => return Err(bad("`quantization` needs both group_size and bits")),
        };
        let overrides = obj
            .iter()
            .filter(|(_, v)| v.is_object() || v.is_boolean())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(QuantConfig { default, overrides })
    }

    pub fn is_quantized(&self) -> bool {
        self.default.is_some()
    }

    /// The parameters of layer `path` (e.g. "model.layers.0.mlp.gate_proj"),
    /// used when the weights hold `{path}.scales`.
    pub fn for_layer(&self, path: &str) -> Result<QuantParams> {
        if let Some(Value::Object(o)) = self.overrides.get(path) {
            let base = self.default.unwrap_or(QuantParams { group_size: 64, bits: 4 });
            return Ok(QuantParams {
                group_size: o.get("group_size").map(|v| int(v, "group_size")).transpose()?.unwrap_or(base.group_size),
                bits: o.get("bits").map(|v| int(v, "bits")).transpose()?.unwrap_or(base.bits),
            });
        }
        self.default.ok_or_else(|| bad(&format!("{path} is quantized but config.json has no quantization settings")))
    }

    /// This config with `params` for every layer it does not name
    /// (`--quantize` at load).
    pub fn with_default(self, params: QuantParams) -> QuantConfig {
        QuantConfig { default: Some(params), overrides: self.overrides }
    }
}

fn int(v: &Value, field: &str) -> Result<i32> {
    v.as_i64()
        .and_then(|x| i32::try_from(x).ok())
        .ok_or_else(|| bad(&format!("quantization.{field} must be an integer, got {v}")))
}

fn bad(message: &str) -> Error {
    Error::ModelFile { file: "config.json".into(), message: message.to_string() }
}
