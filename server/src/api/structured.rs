//! What a request's output must be: JSON of a schema (`response_format` on
//! chat, `text.format` on Responses) or calls of its tools (`tool_choice`
//! `required` / a named function, Anthropic's `any` / `tool`), compiled into
//! the grammar the engine enforces token by token. Bad schemas, keywords the
//! grammar engine does not implement and unknown tool names are 400s naming
//! the field.

use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::structured::{CallSchema, GrammarError, Guide, GuideSpec, Output};
use crate::tokenizer::tool_calls::ToolCallFormat;

/// Whether (and which) tool calls the output must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ToolChoice {
    Auto,
    None,
    /// At least one call of any tool.
    Required,
    /// A call of this function.
    Named(String),
}

impl ToolChoice {
    /// OpenAI's `tool_choice`: `auto` / `none` / `required`, or a function by
    /// name (chat: `{"type": "function", "function": {"name"}}`, Responses:
    /// `{"type": "function", "name"}`).
    pub fn openai(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
        let bad = || ApiError::bad_param("tool_choice", "tool_choice must be `auto`, `none`, `required` or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        match v {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                _ => Err(bad()),
            },
            Some(o @ Value::Object(_)) if o["type"] == "function" => {
                let name = o["function"]["name"].as_str().or(o["name"].as_str()).ok_or_else(bad)?;
                Ok(ToolChoice::Named(name.to_string()))
            }
            Some(_) => Err(bad()),
        }
    }
}

/// The schema a `response_format` (chat) or `text.format` (Responses) asks
/// for: None for text, any object for `json_object`, the given schema for
/// `json_schema` (chat nests it in `json_schema`, Responses does not).
pub(super) fn format_schema(format: Option<&Value>, param: &str) -> Result<Option<Value>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => {
            let (holder, at) = match format.get("json_schema") {
                Some(inner) => (inner, format!("{param}.json_schema")),
                None => (format, param.to_string()),
            };
            match &holder["schema"] {
                s @ (Value::Object(_) | Value::Bool(true)) => Ok(Some(s.clone())),
                Value::Null => Err(ApiError::bad_param(&format!("{at}.schema"), format!("`{at}.schema` is required for type json_schema"))),
                _ => Err(ApiError::bad_param(&format!("{at}.schema"), "the schema must be a JSON Schema object")),
            }
        }
        other => Err(ApiError::bad_param(
            &format!("{param}.type"),
            format!("{param}.type must be `text`, `json_object` or `json_schema`, got {}", other.map_or("nothing".into(), |t| format!("`{t}`"))),
        )),
    }
}

/// The functions of chat-form `tools` (`[{"type": "function", "function": {name, parameters}}]`).
fn functions(tools: Option<&Value>) -> Vec<CallSchema> {
    let list = tools.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    list.iter()
        .filter_map(|t| {
            let f = &t["function"];
            let parameters = if f["parameters"].is_null() { json!({"type": "object"}) } else { f["parameters"].clone() };
            Some(CallSchema { name: f["name"].as_str()?.to_string(), parameters })
        })
        .collect()
}

/// What the output must be (None: free text), before the prompt is rendered:
/// the tool calls `choice` forces over the active chat-form `tools` (in the
/// model's tool-call `format`), else JSON of `schema`.
pub(super) fn wanted_output(
    choice: &ToolChoice,
    tools: Option<&Value>,
    format: Option<ToolCallFormat>,
    parallel: bool,
    schema: Option<Value>,
) -> Result<Option<Output>, ApiError> {
    let available = functions(tools);
    let forced = match choice {
        ToolChoice::Auto | ToolChoice::None => None,
        ToolChoice::Required if available.is_empty() => {
            return Err(ApiError::bad_param("tool_choice", "tool_choice `required` needs at least one tool in `tools`"))
        }
        ToolChoice::Required => Some(available),
        ToolChoice::Named(name) => match available.iter().find(|f| &f.name == name) {
            Some(f) => Some(vec![f.clone()]),
            None => {
                let names: Vec<&str> = available.iter().map(|f| f.name.as_str()).collect();
                return Err(ApiError::bad_param("tool_choice", format!("tool_choice names `{name}`, which is not among the tools ({})", names.join(", "))));
            }
        },
    };
    match (forced, format) {
        (Some(functions), Some(format)) => Ok(Some(Output::Calls { format, functions, parallel })),
        (Some(_), None) => Err(ApiError::bad_param(
            "tool_choice",
            "forcing a tool call needs the model's tool-call format, which its chat template does not show: start the server with --tool-call-parser",
        )),
        (None, _) => Ok(schema.map(Output::Json)),
    }
}

/// The compiled guide of `output` after the template's reasoning (`thinking`,
/// as `encode_prompt` found it). Compile errors name `format_param` (where the
/// request's schema came from) or `tools`.
pub(super) async fn guide(state: &AppState, output: Option<Output>, thinking: Option<bool>, format_param: &'static str) -> Result<Option<Guide>, ApiError> {
    let Some(output) = output else { return Ok(None) };
    let param = match output {
        Output::Json(_) => format_param,
        Output::Calls { .. } => "tools",
    };
    let spec = GuideSpec { output, thinking, markers: state.tokenizer.think_markers() };
    let grammars = state.grammars.clone();
    let size = spec_bytes(&spec);
    let compiled = state.tokenize_pool.run(size, move || Ok::<_, ApiError>(grammars.compile(&spec))).await?;
    match compiled {
        Ok(guide) => Ok(Some(guide)),
        Err(e @ GrammarError::Unavailable(_)) => Err(ApiError::bad_param(param, e.to_string())),
        Err(GrammarError::Invalid(e)) => Err(ApiError::bad_param(param, format!("invalid {param}: {e}"))),
    }
}

/// Bytes of the schemas in `spec` (what compiling it reads).
fn spec_bytes(spec: &GuideSpec) -> usize {
    match &spec.output {
        Output::Json(schema) => schema.to_string().len(),
        Output::Calls { functions, .. } => functions.iter().map(|f| f.parameters.to_string().len() + f.name.len()).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}, {"type": "function", "function": {"name": "b"}}])
    }

    #[test]
    fn response_formats_map_to_schemas_and_bad_ones_name_their_field() {
        assert_eq!(format_schema(None, "response_format").unwrap(), None);
        assert_eq!(format_schema(Some(&json!({"type": "text"})), "response_format").unwrap(), None);
        assert_eq!(format_schema(Some(&json!({"type": "json_object"})), "response_format").unwrap(), Some(json!({"type": "object"})));
        let chat = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}});
        assert_eq!(format_schema(Some(&chat), "response_format").unwrap(), Some(json!({"type": "array"})));
        let responses = json!({"type": "json_schema", "name": "x", "schema": {"type": "array"}});
        assert_eq!(format_schema(Some(&responses), "text.format").unwrap(), Some(json!({"type": "array"})));
        let e = format_schema(Some(&json!({"type": "json_schema", "json_schema": {"name": "x"}})), "response_format").unwrap_err();
        assert_eq!(e.body()["error"]["param"], "response_format.json_schema.schema");
        let e = format_schema(Some(&json!({"type": "yaml"})), "response_format").unwrap_err();
        assert_eq!(e.body()["error"]["param"], "response_format.type");
    }

    #[test]
    fn tool_choice_forces_calls_of_the_named_or_all_tools() {
        let t = tools();
        assert_eq!(ToolChoice::openai(Some(&json!({"type": "function", "function": {"name": "b"}}))).unwrap(), ToolChoice::Named("b".into()));
        assert_eq!(ToolChoice::openai(Some(&json!({"type": "function", "name": "b"}))).unwrap(), ToolChoice::Named("b".into()));
        assert!(ToolChoice::openai(Some(&json!("sometimes"))).is_err());
        let named = wanted_output(&ToolChoice::Named("b".into()), Some(&t), Some(ToolCallFormat::Hermes), true, None).unwrap();
        let Some(Output::Calls { functions, .. }) = named else { panic!("{named:?}") };
        assert_eq!((functions.len(), functions[0].parameters.clone()), (1, json!({"type": "object"})));
        let all = wanted_output(&ToolChoice::Required, Some(&t), Some(ToolCallFormat::Hermes), false, Some(json!({})));
        assert!(matches!(all, Ok(Some(Output::Calls { parallel: false, ref functions, .. })) if functions.len() == 2));
        let unknown = wanted_output(&ToolChoice::Named("zz".into()), Some(&t), Some(ToolCallFormat::Hermes), true, None).unwrap_err();
        assert!(unknown.message.contains("`zz`") && unknown.message.contains("a, b"), "{}", unknown.message);
        assert!(wanted_output(&ToolChoice::Required, None, Some(ToolCallFormat::Hermes), true, None).is_err());
        assert!(wanted_output(&ToolChoice::Required, Some(&t), None, true, None).is_err());
        assert_eq!(wanted_output(&ToolChoice::Auto, Some(&t), None, true, Some(json!({}))).unwrap(), Some(Output::Json(json!({}))));
    }
}
