//! Tokenizer folders as transformers lays them out: tokenizer.json,
//! tokenizer_config.json (special tokens, chat template), chat_template.jinja,
//! eos ids from config.json / generation_config.json; and streaming
//! detokenization that never emits a broken UTF-8 sequence.

mod common;

use std::path::Path;
use std::process::Command;

use mlx_serve::tokenizer::reasoning::{prompt_thinking, template_thinks, THINK_TAGS};
use mlx_serve::tokenizer::tool_calls::ToolCallFormat;
use mlx_serve::tokenizer::{ChatRender, Tokenizer};
use serde_json::{json, Value};

/// GPT-2's byte → printable-character table of byte-level BPE vocabularies.
fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).unwrap();
            n += 1;
        }
    }
    chars
}

/// A byte-level BPE tokenizer with no merges (one token per byte) and three specials.
fn write_tokenizer(dir: &Path) {
    let vocab: serde_json::Map<String, Value> =
        byte_chars().iter().enumerate().map(|(i, c)| (c.to_string(), json!(i))).collect();
    let specials = ["<|start|>", "<|end|>", "<|eot|>"];
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                             "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|start|>": {"id": "<|start|>", "ids": [256], "tokens": ["<|start|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}

fn write_config(dir: &Path, template: &str) {
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"bos_token": "<|start|>", "eos_token": {"content": "<|end|>", "special": true},
               "chat_template": template})
        .to_string(),
    )
    .unwrap();
}

const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";

#[test]
fn special_tokens_eos_ids_and_chat_template_come_from_the_folder() {
    let d = tempfile::tempdir().unwrap();
    write_tokenizer(d.path());
    write_config(d.path(), TEMPLATE);
    std::fs::write(d.path().join("generation_config.json"), json!({"eos_token_id": [258, 9]}).to_string()).unwrap();
    let t = Tokenizer::load(d.path(), None).unwrap();
    // eos: the config's eos_token plus generation_config's list.
    assert_eq!(t.eos_ids().iter().copied().collect::<Vec<_>>(), vec![9, 257, 258]);
    // encode adds what the post-processor adds (BOS); decode skips specials.
    let ids = t.encode("hi", true).unwrap();
    assert_eq!(ids, vec![256, b'h' as u32, b'i' as u32]);
    assert_eq!(t.decode(&ids, true).unwrap(), "hi");
    // The chat prompt holds its specials already and is tokenized without adding more.
    let msgs = json!([{"role": "user", "content": "yo"}]);
    assert_eq!(t.apply_chat_template(&msgs, None, true).unwrap(), "<|start|>[user]yo[assistant]");
    let chat = t.encode_chat(&msgs, None).unwrap();
    assert_eq!(chat[0], 256);
    assert_eq!(chat.iter().filter(|&&i| i == 256).count(), 1);
}

#[test]
fn chat_template_jinja_file_and_override_take_precedence() {
    let d = tempfile::tempdir().unwrap();
    write_tokenizer(d.path());
    write_config(d.path(), TEMPLATE);
    std::fs::write(d.path().join("chat_template.jinja"), "FILE:{{ messages[0].content }}").unwrap();
    let msgs = json!([{"role": "user", "content": "x"}]);
    assert_eq!(Tokenizer::load(d.path(), None).unwrap().apply_chat_template(&msgs, None, true).unwrap(), "FILE:x");
    let t = Tokenizer::load(d.path(), Some("OVERRIDE:{{ messages|length }}")).unwrap();
    assert_eq!(t.apply_chat_template(&msgs, None, true).unwrap(), "OVERRIDE:1");
}

#[test]
fn a_template_that_raises_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    write_tokenizer(d.path());
    write_config(d.path(), "{% if messages[0].role != 'system' %}{{ raise_exception('System message required') }}{% endif %}");
    let t = Tokenizer::load(d.path(), None).unwrap();
    let e = t.apply_chat_template(&json!([{"role": "user", "content": "x"}]), None, true).unwrap_err().to_string();
    assert_eq!(e, "chat template: System message required");
    std::fs::write(d.path().join("tokenizer_config.json"), "{ not json").unwrap();
    let e = Tokenizer::load(d.path(), None).err().unwrap().to_string();
    assert!(e.contains("tokenizer_config.json") && e.contains("invalid JSON"), "{e}");
}

#[test]
fn streaming_detokenization_never_splits_a_character() {
    let d = tempfile::tempdir().unwrap();
    write_tokenizer(d.path());
    let t = Tokenizer::load(d.path(), None).unwrap();
    let text = "héllo 東京 🙂 ok";
    let ids = t.encode(text, false).unwrap();
    assert_eq!(ids.len(), text.len(), "one token per byte");
    let mut detok = t.new_detokenizer();
    let mut out = String::new();
    let mut held_back = 0;
    for &id in &ids {
        let piece = detok.push(t.inner(), id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "emitted a broken character: {piece:?}");
        if piece.is_empty() {
            held_back += 1;
        }
        out.push_str(&piece);
    }
    out.push_str(&detok.finish(t.inner()).unwrap());
    assert_eq!(out, text);
    // é (2 bytes), 東 京 (3 each) and 🙂 (4) are held back for 1+2+2+3 tokens.
    assert_eq!(held_back, 8);
}

/// `text` with the date after "Current date: " (gpt-oss's template writes
/// today's) blanked: the two renderings may straddle midnight.
fn without_date(text: &str) -> String {
    match text.find("Current date: ") {
        Some(i) => {
            let at = i + "Current date: ".len();
            format!("{}YYYY-MM-DD{}", &text[..at], text.get(at + 10..).unwrap_or(""))
        }
        None => text.to_string(),
    }
}

// The chat templates Qwen3.5, Qwen3-Coder, Qwen3-Next (Instruct and Thinking),
// Gemma 4 and gpt-oss checkpoints publish render exactly as transformers
// renders them: a plain chat, tools with a call and its result, reasoning with
// template arguments (`enable_thinking`, `reasoning_effort`). The templates are
// llama.cpp's and Xinference's copies, from PyPI packages
// (parity/render_templates.py; no model hub here).
#[test]
fn published_templates_of_the_new_families_render_as_transformers_renders_them() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chat-templates");
    let out = root.join("rendered.json");
    let run = Command::new(common::python())
        .arg(common::repo().join("parity/render_templates.py"))
        .arg(root.join("wheels"))
        .arg(&out)
        .current_dir(common::repo().join("parity"))
        .output()
        .unwrap();
    assert!(run.status.success(), "render_templates.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
    let rendered: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let cases = rendered["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 18);
    for case in cases {
        let d = tempfile::tempdir().unwrap();
        write_tokenizer(d.path());
        let config = json!({"bos_token": case["bos_token"], "eos_token": case["eos_token"], "chat_template": case["template"]});
        std::fs::write(d.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        let t = Tokenizer::load(d.path(), None).unwrap();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let how = ChatRender { tools, add_generation_prompt: true, kwargs: Some(&case["kwargs"]) };
        let ours = t.render_chat(&case["messages"], &how).unwrap();
        let name = format!("{} / {}", case["template_name"], case["case"]);
        assert_eq!(without_date(&ours), without_date(case["rendered"].as_str().unwrap()), "{name}");
        // Qwen3-Next writes Hermes calls; its Thinking model's prompt opens the
        // reasoning block, so the whole answer starts as reasoning.
        let template = case["template"].as_str().unwrap();
        match case["template_name"].as_str().unwrap() {
            "qwen3_next" => {
                assert_eq!(ToolCallFormat::detect(template), Some(ToolCallFormat::Hermes), "{name}");
                assert_eq!(prompt_thinking(&ours, THINK_TAGS), Some(false), "{name}");
            }
            "qwen3_next_thinking" => {
                assert_eq!(ToolCallFormat::detect(template), Some(ToolCallFormat::Hermes), "{name}");
                assert!(template_thinks(template, THINK_TAGS), "{name}");
                assert_eq!(prompt_thinking(&ours, THINK_TAGS), Some(true), "{name}");
            }
            _ => {}
        }
    }
}
