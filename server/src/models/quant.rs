//! MLX quantization settings of a model (`quantization` in config.json), with
//! per-layer overrides as mlx-lm writes them: the affine scheme, or one of the
//! microscaling float modes (mxfp4 as gpt-oss ships its experts, mxfp8, nvfp4).

pub use mlx_rs_safe::quantized::{QuantMode, QuantSpec};
use serde_json::Value;

use super::weights::Stored;
use crate::error::{Error, Result};

/// How the scales of `spec` are stored: floats (affine), or bytes (the float modes).
pub fn scales_stored(spec: QuantSpec) -> Stored {
    if spec.mode.has_biases() {
        Stored::Float
    } else {
        Stored::ByteScales
    }
}

/// The `quantization` section: defaults plus overrides keyed by layer path.
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    default: Option<QuantSpec>,
    overrides: serde_json::Map<String, Value>,
}

/// MLX's quantization mode named `name`.
fn mode(name: &str) -> Result<QuantMode> {
    QuantMode::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = QuantMode::ALL.iter().map(|m| m.as_str()).collect();
        bad(&format!("quantization mode {name:?} is not supported ({})", names.join(", ")))
    })
}

impl QuantConfig {
    /// Parses config.json's `quantization` (or `quantization_config` in MLX form).
    pub fn from_config(config: &Value) -> Result<QuantConfig> {
        let Some(q) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
            return Ok(QuantConfig::default());
        };
        let obj = q.as_object().ok_or_else(|| bad("`quantization` must be an object"))?;
        // Hugging Face's microscaling checkpoints (openai/gpt-oss-*): the mode's
        // one group size and width, for every layer that carries scales (as mlx-lm).
        if config.get("quantization").is_none() {
            if let Some(method @ ("mxfp4" | "mxfp8")) = obj.get("quant_method").and_then(Value::as_str) {
                return Ok(QuantConfig { default: Some(QuantSpec::default_for(mode(method)?)), overrides: Default::default() });
            }
        }
        let mode = mode(obj.get("mode").and_then(Value::as_str).unwrap_or("affine"))?;
        let default = match (obj.get("group_size"), obj.get("bits")) {
            (Some(g), Some(b)) => Some(QuantSpec { group_size: int(g, "group_size")?, bits: int(b, "bits")?, mode }),
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

    /// Whether any layer may be affine-quantized (the default's mode, or an
    /// override's), the only scheme the CUDA quantized-matmul kernel takes.
    pub fn has_affine_layers(&self) -> bool {
        let affine = |m: Result<QuantMode>| m.is_ok_and(|m| m == QuantMode::Affine);
        self.default.is_some_and(|d| d.mode == QuantMode::Affine)
            || self.overrides.values().any(|v| matches!(v, Value::Object(o) if affine(override_mode(o))))
    }

    /// The parameters of layer `path` (e.g. "model.layers.0.mlp.gate_proj"),
    /// used when the weights hold `{path}.scales`. An override is a layer's
    /// own `to_quantized` arguments, so its mode is affine unless it names one
    /// (gpt-oss's 8-bit router beside mxfp4 experts).
    pub fn for_layer(&self, path: &str) -> Result<QuantSpec> {
        if let Some(Value::Object(o)) = self.overrides.get(path) {
            let mode = override_mode(o)?;
            let base = QuantSpec::default_for(mode);
            return Ok(QuantSpec {
                group_size: o.get("group_size").map(|v| int(v, "group_size")).transpose()?.unwrap_or(base.group_size),
                bits: o.get("bits").map(|v| int(v, "bits")).transpose()?.unwrap_or(base.bits),
                mode,
            });
        }
        self.default.ok_or_else(|| bad(&format!("{path} is quantized but config.json has no quantization settings")))
    }

    /// This config with its per-layer overrides renamed as the weights were
    /// (see `Weights::rename`).
    pub fn rename(self, rename: impl Fn(&str) -> Option<String>) -> QuantConfig {
        let overrides = self.overrides.into_iter().filter_map(|(k, v)| Some((rename(&k)?, v))).collect();
        QuantConfig { default: self.default, overrides }
    }

    /// This config with `params` for every layer it does not name
    /// (`--quantize` at load).
    pub fn with_default(self, params: QuantSpec) -> QuantConfig {
        QuantConfig { default: Some(params), overrides: self.overrides }
    }
}

/// An override's mode: affine unless it names one.
fn override_mode(o: &serde_json::Map<String, Value>) -> Result<QuantMode> {
    mode(o.get("mode").and_then(Value::as_str).unwrap_or("affine"))
}

fn int(v: &Value, field: &str) -> Result<i32> {
    v.as_i64()
        .and_then(|x| i32::try_from(x).ok())
        .ok_or_else(|| bad(&format!("quantization.{field} must be an integer, got {v}")))
}

fn bad(message: &str) -> Error {
    Error::ModelFile { file: "config.json".into(), message: message.to_string() }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::QuantConfig;

    fn affine(config: serde_json::Value) -> bool {
        QuantConfig::from_config(&config).unwrap().has_affine_layers()
    }

    #[test]
    fn affine_layers_are_found_in_the_default_or_an_override() {
        assert!(affine(json!({"quantization": {"group_size": 64, "bits": 4}})));
        assert!(!affine(json!({})), "a float model");
        assert!(!affine(json!({"quantization_config": {"quant_method": "mxfp4"}})), "mxfp4 everywhere");
        assert!(!affine(json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})));
        // gpt-oss as mlx-lm converts it: mxfp4 experts, an 8-bit affine router.
        let router = json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4", "model.layers.0.mlp.router": {"group_size": 64, "bits": 8}}});
        assert!(affine(router));
        let named = json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4", "model.layers.0.mlp.router": {"mode": "mxfp8"}}});
        assert!(!affine(named), "an override naming a float mode");
    }
}
