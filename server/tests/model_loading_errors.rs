//! Bad model folders give clear errors naming the file, field or tensor — never
//! a panic. A tiny llama is written here with the safetensors crate, then
//! broken one way at a time.

use std::collections::HashMap;
use std::path::Path;

use mlx_serve::models;
use mlx_serve::tokenizer::Tokenizer;
use safetensors::tensor::TensorView;
use serde_json::{json, Value};

fn config() -> Value {
    json!({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 16,
           "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "vocab_size": 16,
           "tie_word_embeddings": true})
}

fn shapes() -> Vec<(&'static str, Vec<usize>)> {
    let p = "model.layers.0";
    vec![
        ("model.embed_tokens.weight", vec![16, 8]),
        ("model.norm.weight", vec![8]),
        (Box::leak(format!("{p}.input_layernorm.weight").into_boxed_str()), vec![8]),
        (Box::leak(format!("{p}.post_attention_layernorm.weight").into_boxed_str()), vec![8]),
        (Box::leak(format!("{p}.self_attn.q_proj.weight").into_boxed_str()), vec![8, 8]),
        (Box::leak(format!("{p}.self_attn.k_proj.weight").into_boxed_str()), vec![4, 8]),
        (Box::leak(format!("{p}.self_attn.v_proj.weight").into_boxed_str()), vec![4, 8]),
        (Box::leak(format!("{p}.self_attn.o_proj.weight").into_boxed_str()), vec![8, 8]),
        (Box::leak(format!("{p}.mlp.gate_proj.weight").into_boxed_str()), vec![16, 8]),
        (Box::leak(format!("{p}.mlp.up_proj.weight").into_boxed_str()), vec![16, 8]),
        (Box::leak(format!("{p}.mlp.down_proj.weight").into_boxed_str()), vec![8, 16]),
    ]
}

fn write_weights(path: &Path, tensors: &[(&str, Vec<usize>)]) {
    write_weights_edited(path, tensors, |_, _, _| {});
}

/// Writes float32 tensors, letting `edit` change one's dtype or bytes first.
fn write_weights_edited(path: &Path, tensors: &[(&str, Vec<usize>)], edit: impl Fn(&str, &mut safetensors::Dtype, &mut Vec<u8>)) {
    let data: Vec<(String, Vec<usize>, safetensors::Dtype, Vec<u8>)> = tensors
        .iter()
        .enumerate()
        .map(|(i, (n, s))| {
            let count: usize = s.iter().product();
            let mut bytes = (0..count).flat_map(|j| (((i * 7 + j) % 13) as f32 * 0.01).to_le_bytes()).collect();
            let mut dtype = safetensors::Dtype::F32;
            edit(n, &mut dtype, &mut bytes);
            (n.to_string(), s.clone(), dtype, bytes)
        })
        .collect();
    let views: Vec<(String, TensorView)> =
        data.iter().map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A complete, loadable model folder.
fn good_model(dir: &Path) {
    std::fs::write(dir.join("config.json"), config().to_string()).unwrap();
    write_weights(&dir.join("model.safetensors"), &shapes());
}

fn load_err(dir: &Path) -> String {
    match models::load(dir) {
        Ok(_) => panic!("loaded a broken model"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_untouched_model_loads_and_runs() {
    let d = tempfile::tempdir().unwrap();
    good_model(d.path());
    let model = models::load(d.path()).unwrap().model;
    let mut cache = mlx_serve::kv::ModelCache::new(&model.kv_layout().kinds).unwrap();
    let ids = mlx_rs_safe::Array::from_slice(&[1i32, 2, 3], &[1, 3]).unwrap();
    let logits = model.forward(&ids, &mut cache).unwrap();
    assert_eq!(logits.shape(), vec![1, 3, 16]);
}

#[test]
fn config_problems_name_the_file_and_field() {
    let d = tempfile::tempdir().unwrap();
    good_model(d.path());
    let cfg = d.path().join("config.json");

    std::fs::remove_file(&cfg).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("config.json") && e.contains("cannot read"), "{e}");

    std::fs::write(&cfg, "{\"model_type\": ").unwrap();
    let e = load_err(d.path());
    assert!(e.contains("config.json") && e.contains("invalid JSON"), "{e}");

    let mut c = config();
    c.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(&cfg, c.to_string()).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("missing field `hidden_size`"), "{e}");

    let mut c = config();
    c["num_attention_heads"] = json!("two");
    std::fs::write(&cfg, c.to_string()).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("config.json") && e.contains("field `num_attention_heads`") && e.contains("invalid type"), "{e}");

    let mut c = config();
    c["model_type"] = json!("gpt-j-9000");
    std::fs::write(&cfg, c.to_string()).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("\"gpt-j-9000\" is not supported") && e.contains("llama, mistral, qwen2, qwen3, qwen3_moe, qwen2_moe, mixtral, olmoe, phi3, gemma3_text"), "{e}");

    let mut c = config();
    c.as_object_mut().unwrap().remove("model_type");
    std::fs::write(&cfg, c.to_string()).unwrap();
    assert!(load_err(d.path()).contains("missing field `model_type`"));
}

// The newer families' own fields (gpt-oss, Gemma 4) and quantization modes:
// refused before any weight is read, saying what is wrong.
#[test]
fn bad_fields_of_the_newer_families_are_named() {
    let d = tempfile::tempdir().unwrap();
    good_model(d.path());
    let cfg = d.path().join("config.json");
    let gpt_oss = json!({"model_type": "gpt_oss", "hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 8,
                         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16,
                         "num_local_experts": 2, "num_experts_per_tok": 1});
    let gemma4 = json!({"model_type": "gemma4_text", "hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 8,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "global_head_dim": 4,
                        "vocab_size": 16, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0});
    let qwen3_next = json!({"model_type": "qwen3_next", "hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 8,
                            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16,
                            "linear_num_value_heads": 2, "linear_num_key_heads": 1, "linear_key_head_dim": 4,
                            "linear_value_head_dim": 4, "rope_theta": 10000.0, "partial_rotary_factor": 0.5});
    let qwen3_5 = |text: Value| json!({"model_type": "qwen3_5", "text_config": text});
    let with = |base: &Value, field: &str, v: Value| {
        let mut c = base.clone();
        c[field] = v;
        c
    };
    for (c, expected) in [
        (with(&gpt_oss, "layer_types", json!(["sliding_attention"])), "layer_types has 1 entries for 2 layers"),
        (with(&gpt_oss, "layer_types", json!(["sliding_attention", "local"])), "\"local\" is neither"),
        (with(&gpt_oss, "rope_scaling", json!({"rope_type": "yarn"})), "needs a numeric factor"),
        (with(&gemma4, "enable_moe_block", json!(true)), "enable_moe_block needs num_experts"),
        (with(&gemma4, "layer_types", json!(["sliding_attention", "global"])), "\"global\" is neither"),
        (with(&gemma4, "num_kv_shared_layers", json!(2)), "no earlier layer of its type"),
        (with(&qwen3_next, "linear_num_key_heads", json!(3)), "must be a multiple of linear_num_key_heads (3)"),
        (with(&qwen3_next, "full_attention_interval", json!(0)), "full_attention_interval must be at least 1"),
        (with(&with(&qwen3_next, "num_experts", json!(4)), "num_experts_per_tok", json!(5)), "between 1 and num_experts (4)"),
        (with(&qwen3_next, "partial_rotary_factor", Value::Null), "needs rope_theta and partial_rotary_factor"),
        (qwen3_5(with(&qwen3_next, "linear_conv_kernel_dim", json!(1))), "linear_conv_kernel_dim must be at least 2"),
        (qwen3_5(json!(7)), "`text_config` must be an object"),
        (with(&config(), "quantization", json!({"group_size": 32, "bits": 4, "mode": "fp3"})), "mode \"fp3\" is not supported"),
    ] {
        std::fs::write(&cfg, c.to_string()).unwrap();
        let e = load_err(d.path());
        assert!(e.contains(expected), "{c}: {e}");
    }
}

#[test]
fn weight_problems_name_the_file_or_tensor() {
    let d = tempfile::tempdir().unwrap();
    good_model(d.path());
    let st = d.path().join("model.safetensors");

    // Truncated file.
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() - 40]).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model.safetensors") && e.contains("past the end"), "{e}");

    // A tensor of the wrong shape.
    let mut s = shapes();
    s[4].1 = vec![8, 4];
    write_weights(&st, &s);
    let e = load_err(d.path());
    assert!(e.contains("model.layers.0.self_attn.q_proj.weight") && e.contains("[8, 4]") && e.contains("[8, 8]"), "{e}");

    // A missing tensor, then an unexpected one.
    let mut s = shapes();
    s.remove(1);
    write_weights(&st, &s);
    assert!(load_err(d.path()).contains("missing tensor model.norm.weight"));
    let mut s = shapes();
    s.push(("model.layers.7.mystery.weight", vec![2]));
    write_weights(&st, &s);
    let e = load_err(d.path());
    assert!(e.contains("not used by the model") && e.contains("model.layers.7.mystery.weight"), "{e}");

    // An index naming a shard that is not there.
    write_weights(&st, &shapes());
    let map: HashMap<String, String> =
        shapes().iter().map(|(n, _)| (n.to_string(), "model-00002-of-00002.safetensors".to_string())).collect();
    std::fs::write(d.path().join("model.safetensors.index.json"), json!({"weight_map": map}).to_string()).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model-00002-of-00002.safetensors") && e.contains("missing shard"), "{e}");
    std::fs::remove_file(d.path().join("model.safetensors.index.json")).unwrap();

    // No weights at all.
    std::fs::remove_file(&st).unwrap();
    assert!(load_err(d.path()).contains("no .safetensors weights"));
}

#[test]
fn nan_and_wrongly_typed_weights_are_refused_at_load_naming_the_tensor() {
    let d = tempfile::tempdir().unwrap();
    good_model(d.path());
    let st = d.path().join("model.safetensors");
    let set_value = |target: &'static str, value: f32| {
        move |name: &str, _: &mut safetensors::Dtype, bytes: &mut Vec<u8>| {
            if name == target {
                bytes[4..8].copy_from_slice(&value.to_le_bytes());
            }
        }
    };
    write_weights_edited(&st, &shapes(), set_value("model.layers.0.mlp.up_proj.weight", f32::NAN));
    let e = load_err(d.path());
    assert!(e.contains("model.safetensors") && e.contains("model.layers.0.mlp.up_proj.weight") && e.contains("NaN"), "{e}");
    write_weights_edited(&st, &shapes(), set_value("model.norm.weight", f32::INFINITY));
    let e = load_err(d.path());
    assert!(e.contains("model.norm.weight") && e.contains("infinite"), "{e}");

    // The right shape and byte count, the wrong type: int32 where floats belong.
    write_weights_edited(&st, &shapes(), |name, dtype, _| {
        if name == "model.layers.0.self_attn.k_proj.weight" {
            *dtype = safetensors::Dtype::I32;
        }
    });
    let e = load_err(d.path());
    assert!(e.contains("model.layers.0.self_attn.k_proj.weight") && e.contains("Int32") && e.contains("Float32"), "{e}");
}

#[test]
fn tokenizer_problems_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    let e = Tokenizer::load(d.path(), None).err().unwrap().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("missing"), "{e}");
    std::fs::write(d.path().join("tokenizer.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    let e = Tokenizer::load(d.path(), None).err().unwrap().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("cannot load"), "{e}");
}
