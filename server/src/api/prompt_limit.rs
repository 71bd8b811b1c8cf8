//! Prompts that cannot fit the model's context are refused before the costly
//! steps: a text from its length in bytes (the tokenizer's bytes-per-token
//! bound), token ids from their count.

use super::error::ApiError;

#[derive(Debug, Clone, Copy)]
pub struct PromptLimit {
    /// Prompt + completion tokens the model takes, if known.
    pub context: Option<usize>,
    /// The most bytes of text one token stands for, if the tokenizer bounds it.
    pub max_bytes_per_token: Option<usize>,
}

impl PromptLimit {
    /// The longest text (bytes) whose tokens could still fit the context.
    pub fn max_text_bytes(&self) -> Option<usize> {
        self.context?.checked_mul(self.max_bytes_per_token?)
    }

    /// 400 naming `param` when `text_bytes` of text cannot fit the context.
    pub fn check_text(&self, text_bytes: usize, param: &str) -> Result<(), ApiError> {
        match (self.max_text_bytes(), self.context, self.max_bytes_per_token) {
            (Some(max), Some(context), Some(per_token)) if text_bytes > max => Err(ApiError::bad_param(
                param,
                format!(
                    "This model's maximum context length is {context} tokens; the prompt's {text_bytes} bytes \
                     make more tokens than that (a token holds at most {per_token} bytes)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// 400 naming `param` when a prompt of `tokens` leaves no room to generate.
    pub fn check_tokens(&self, tokens: usize, param: &str) -> Result<(), ApiError> {
        match self.context {
            Some(context) if tokens >= context => Err(ApiError::bad_param(
                param,
                format!("This model's maximum context length is {context} tokens; the prompt has {tokens} tokens"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_longer_than_context_times_the_longest_token_is_refused() {
        let limit = PromptLimit { context: Some(100), max_bytes_per_token: Some(8) };
        assert!(limit.check_text(800, "prompt").is_ok());
        let e = limit.check_text(801, "prompt").unwrap_err();
        assert_eq!((e.status.as_u16(), e.body()["error"]["param"].as_str()), (400, Some("prompt")));
        assert!(limit.check_tokens(99, "prompt").is_ok());
        assert!(limit.check_tokens(100, "prompt").is_err());
        let unbounded = PromptLimit { context: Some(100), max_bytes_per_token: None };
        assert!(unbounded.check_text(usize::MAX, "prompt").is_ok(), "no bound: the tokenizer counts");
    }
}
