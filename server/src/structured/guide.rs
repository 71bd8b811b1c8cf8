//! One request's grammar state in the engine: which tokens may come next, and
//! the tokens it has taken.

use llguidance::Matcher;

pub struct Guide {
    matcher: Matcher,
    /// The Lark grammar it was compiled from: what another rank of a
    /// distributed group compiles to run the same request.
    source: String,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide").field("done", &self.is_done()).finish()
    }
}

impl Clone for Guide {
    fn clone(&self) -> Guide {
        Guide { matcher: self.matcher.deep_clone(), source: self.source.clone() }
    }
}

impl Guide {
    pub(super) fn new(matcher: Matcher, source: String) -> Guide {
        Guide { matcher, source }
    }

    /// The grammar, for [`super::Grammars::compile_source`].
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Sets bit t % 32 of `row[t / 32]` where token t may come next, and
    /// clears the others (ids past the tokenizer's vocabulary, which a model's
    /// padded embedding may have, never may). Once the grammar is complete only
    /// end tokens may.
    pub fn fill_allowed(&mut self, row: &mut [u32]) -> Result<(), String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        let words = mask.as_slice();
        let n = words.len().min(row.len());
        row[..n].copy_from_slice(&words[..n]);
        row[n..].fill(0);
        Ok(())
    }

    /// Takes the sampled token.
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| format!("the output left its grammar: {e}"))
    }

    /// Whether the grammar is complete and nothing may follow: the output ends.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
