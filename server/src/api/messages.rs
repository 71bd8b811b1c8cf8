//! Chat messages as clients send them (OpenAI's chat format), typed, and the
//! form chat templates read: text content, tool calls with object arguments.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// Llama 3.1's role for tool output; older OpenAI function results.
    Ipython,
    Function,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Ipython => "ipython",
            Role::Function => "function",
        }
    }
}

/// A message's content: a string, or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part. The non-text kinds are recognised so a request using
/// them gets a clear refusal; this server serves text models.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    ImageUrl {},
    InputAudio {},
    File {},
    #[serde(other)]
    Other,
}

impl ContentPart {
    /// The `type` of a part other than text.
    fn unsupported(&self) -> Option<&'static str> {
        match self {
            ContentPart::Text { .. } => None,
            ContentPart::ImageUrl {} => Some("image_url"),
            ContentPart::InputAudio {} => Some("input_audio"),
            ContentPart::File {} => Some("file"),
            ContentPart::Other => Some("this kind"),
        }
    }
}

/// A tool call an assistant message made earlier in the conversation.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCall {
    pub id: Option<String>,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text (OpenAI) or an object.
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    /// Every other field (e.g. `reasoning_content` of an earlier assistant
    /// turn, which thinking models' templates render): handed to the
    /// template as sent, as mlx_lm.server hands the whole message.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// The content as one string (text parts joined), or None for an
    /// assistant turn that only calls tools. Missing or null content is
    /// empty, as mlx_lm.server reads it (it answers an empty reply with
    /// `content: null`, which clients send back in the history).
    fn text(&self, i: usize) -> Result<Option<String>, ApiError> {
        let param = format!("messages[{i}].content");
        let calls = self.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
        match &self.content {
            Some(Content::Text(s)) => Ok(Some(s.clone())),
            None if self.role == Role::Assistant && calls => Ok(None),
            None => Ok(Some(String::new())),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (part, part.unsupported()) {
                        (ContentPart::Text { text: t }, _) => text.push_str(t),
                        (_, Some(kind)) => {
                            return Err(ApiError::bad_param(
                                &format!("{param}[{j}].type"),
                                format!("content parts of type {kind:?} are not supported: this server serves text models"),
                            ))
                        }
                        (_, None) => {}
                    }
                }
                Ok(Some(text))
            }
        }
    }

    /// The message as chat templates read it.
    fn to_template(&self, i: usize) -> Result<Value, ApiError> {
        let mut msg = Map::new();
        msg.insert("role".into(), json!(self.role.as_str()));
        msg.insert("content".into(), json!(self.text(i)?));
        if let Some(calls) = self.tool_calls.as_ref().filter(|c| !c.is_empty()) {
            msg.insert("tool_calls".into(), Value::Array(calls.iter().map(template_tool_call).collect()));
        }
        if let Some(name) = &self.name {
            msg.insert("name".into(), json!(name));
        }
        if let Some(id) = &self.tool_call_id {
            msg.insert("tool_call_id".into(), json!(id));
        }
        for (key, value) in &self.extra {
            msg.entry(key.clone()).or_insert_with(|| value.clone());
        }
        Ok(Value::Object(msg))
    }
}

/// A tool call with `arguments` JSON text turned into an object: HF templates
/// serialise them with `tojson` themselves.
fn template_tool_call(call: &ToolCall) -> Value {
    let arguments = match &call.function.arguments {
        Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or_else(|_| Value::String(s.clone())),
        other => other.clone(),
    };
    json!({"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}})
}

/// Validates the messages and rewrites them into what chat templates read.
pub fn template_messages(messages: &[ChatMessage]) -> Result<Value, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must contain at least one message"));
    }
    Ok(Value::Array(messages.iter().enumerate().map(|(i, m)| m.to_template(i)).collect::<Result<_, _>>()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Vec<ChatMessage> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn messages_are_validated_and_tool_call_arguments_become_objects() {
        let msgs = parse(json!([
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"}
        ]));
        let out = template_messages(&msgs).unwrap();
        assert_eq!(out[0]["content"], "ab");
        assert!(out[1]["content"].is_null());
        assert_eq!(out[1]["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(out[2]["tool_call_id"], "c1");
    }

    #[test]
    fn missing_content_is_empty_and_non_text_parts_name_the_field() {
        // As mlx_lm.server reads them; other fields go to the template as sent.
        let out = template_messages(&parse(json!([{"role": "user"}, {"role": "assistant", "content": null, "reasoning_content": "r"}]))).unwrap();
        assert_eq!(out, json!([{"role": "user", "content": ""}, {"role": "assistant", "content": "", "reasoning_content": "r"}]));
        let image = json!([{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]);
        let e = template_messages(&parse(image)).unwrap_err();
        assert_eq!(e.body()["error"]["param"], "messages[1].content[0].type");
        assert!(e.message.contains("input_audio"), "{}", e.message);
        let other = json!([{"role": "user", "content": [{"type": "hologram"}]}]);
        assert_eq!(template_messages(&parse(other)).unwrap_err().status.as_u16(), 400);
        assert!(serde_json::from_value::<Vec<ChatMessage>>(json!([{"role": "user", "content": 5}])).is_err());
        assert!(template_messages(&[]).is_err());
    }
}
