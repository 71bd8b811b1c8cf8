//! Scheduling decisions as plain host logic over counts: how many waiting
//! requests start, and how much prompt each turn prefills. No MLX here, so
//! the rules are tested on their own.

/// The engine's scheduling limits.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Sequences generating or prefilling at once.
    pub max_concurrency: usize,
    /// Prompt tokens per prefill chunk, and per turn.
    pub prefill_size: usize,
    /// Tokens of KV the running sequences may reserve together (the memory
    /// plan's KV pool; `usize::MAX`: no bound).
    pub kv_tokens: usize,
    /// Whole prompts prefilled together in one model call, at most (1: each
    /// alone, also where the model's caches cannot be left-padded).
    pub prompts_together: usize,
}

impl Policy {
    /// How many of `queued` requests start now, with `running` sequences
    /// (decoding, prefilling or about to join) already taking slots.
    pub fn admissions(&self, running: usize, queued: usize) -> usize {
        self.max_concurrency.saturating_sub(running).min(queued)
    }

    /// Whether a request reserving `need` tokens of KV starts now beside
    /// running sequences reserving `reserved` each. A decode batch pads every
    /// row to its longest, so the batch may hold rows × the longest
    /// reservation: that must fit the pool. Alone, a request always starts
    /// (the API bounds it by the context, which the plan keeps within the pool).
    pub fn fits(&self, reserved: &[usize], need: usize) -> bool {
        let longest = reserved.iter().copied().max().unwrap_or(0).max(need);
        reserved.is_empty() || (reserved.len() + 1).saturating_mul(longest) <= self.kv_tokens
    }

    /// How many tokens this turn prefills of each admitted prompt, oldest
    /// first, given the tokens each still has to go: whole prompts while they
    /// fit the turn's budget of `prefill_size` tokens, and at most one chunk of
    /// `prefill_size` each, so a long prompt never stalls the decoding
    /// sequences for more than a chunk. A prompt is always cut at multiples of
    /// `prefill_size` from its start, whatever else runs, so its KV is computed
    /// in the same chunks as mlx-lm's (the chunking changes float rounding). A
    /// prompt with nothing left (one token) takes nothing from the budget.
    ///
    /// A `burst` (nothing decodes, and no admitted prompt has anything
    /// prefilled yet) takes a longer turn, which stalls no one: the budget is
    /// `prompts_together` chunks, so prompts arriving together at an idle
    /// server are prefilled in one turn (in shared calls) and start decoding
    /// together, rather than half of them a prefill, a join and a decode step
    /// later. Each call attends only over its own prompts then, so the calls
    /// queued at once hold little beside their activations. A prompt not
    /// finished this turn still ends it, so long prompts are prefilled one
    /// after another, oldest first, as before (advanced side by side, each
    /// would start decoding last).
    pub fn prefill(&self, remaining: &[usize], burst: bool) -> Vec<usize> {
        let chunk = self.prefill_size.max(1);
        let mut budget = self.turn_tokens(burst);
        let mut plan = Vec::new();
        for &left in remaining {
            if budget == 0 {
                break;
            }
            let n = left.min(chunk);
            plan.push(n);
            budget = budget.saturating_sub(n);
            if burst && n < left {
                break;
            }
        }
        plan
    }

    /// Whether a prompt-cache hit of `cached` tokens is taken for a prompt of
    /// `prompt` tokens. Where prompts are prefilled together, a prompt that
    /// starts from a hit prefills alone (its rows hold a history the others
    /// lack), so a short hit (a chat template's opening tokens, common to
    /// every chat) would cost the prompt its shared call to save less
    /// compute than that call saves: taken from a quarter chunk or 128
    /// tokens on, whichever is less (on an H200 eight ~128-token prompts
    /// cost 122 ms together against 208 alone, ~15 ms per 128 tokens of
    /// their shared call; what a call saves does not grow with the chunk
    /// size). A prompt longer than a chunk never shares a call, so it takes
    /// every hit, as does a prompt prefilled alone.
    pub fn takes_hit(&self, cached: usize, prompt: usize) -> bool {
        self.prompts_together <= 1 || prompt > self.prefill_size || cached >= (self.prefill_size / 4).min(128)
    }

    /// Prompt tokens a turn prefills: a chunk, or in a `burst` a chunk for
    /// each prompt a call may share.
    fn turn_tokens(&self, burst: bool) -> usize {
        let chunk = self.prefill_size.max(1);
        if burst {
            chunk.saturating_mul(self.prompts_together.max(1))
        } else {
            chunk
        }
    }

    /// Which of the whole prompts about to be prefilled from nothing (their
    /// token counts in `lengths`) share a model call: groups of two or more
    /// (indices into `lengths`), longest first, each at most
    /// `prompts_together` prompts whose left-padded call (prompts × the
    /// longest, at most twice their own tokens) stays within the turn's
    /// tokens (a chunk, or in a `burst` the chunks the turn queues at once,
    /// whose activations it holds together either way). Prompts in no group
    /// are prefilled alone.
    pub fn prefill_groups(&self, lengths: &[usize], burst: bool) -> Vec<Vec<usize>> {
        let budget = self.turn_tokens(burst);
        let mut order: Vec<usize> = (0..lengths.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group: Vec<usize> = Vec::new();
        let mut tokens = 0;
        for i in order {
            // Sorted longest first: the group's first prompt is its longest.
            let longest = group.first().map_or(lengths[i], |&g| lengths[g]);
            let padded = (group.len() + 1) * longest;
            // No more padding than prompt: a short prompt padded to a long
            // one's length would cost the call more than a call of its own.
            if group.len() >= self.prompts_together || padded > budget || padded > 2 * (tokens + lengths[i]) {
                groups.push(std::mem::take(&mut group));
                tokens = 0;
            }
            group.push(i);
            tokens += lengths[i];
        }
        groups.push(group);
        groups.retain(|g| g.len() > 1);
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::Policy;

    fn policy() -> Policy {
        Policy { max_concurrency: 4, prefill_size: 512, kv_tokens: 1000, prompts_together: 4 }
    }

    #[test]
    fn requests_start_while_their_kv_fits_the_pool() {
        let p = policy();
        assert!(p.fits(&[], 5000), "alone, a request always starts");
        assert!(p.fits(&[500], 400));
        assert!(!p.fits(&[500], 501), "two rows of the longest");
        assert!(!p.fits(&[600], 10), "a short request pads to the longest row");
        assert!(p.fits(&[100, 200, 240], 240));
        assert!(!p.fits(&[usize::MAX - 1], 2), "no overflow");
    }

    #[test]
    fn admission_fills_free_slots_only() {
        let p = policy();
        assert_eq!(p.admissions(0, 10), 4);
        assert_eq!(p.admissions(3, 10), 1);
        assert_eq!(p.admissions(4, 10), 0);
        assert_eq!(p.admissions(6, 10), 0);
        assert_eq!(p.admissions(1, 2), 2);
    }

    #[test]
    fn short_prompts_share_one_turn_up_to_the_budget() {
        assert_eq!(policy().prefill(&[100, 200, 150, 300], false), vec![100, 200, 150, 300]);
        assert_eq!(policy().prefill(&[100, 200, 150, 300, 9], false), vec![100, 200, 150, 300]);
    }

    #[test]
    fn a_burst_at_an_idle_server_takes_a_chunk_for_each_prompt_a_call_may_share() {
        let p = policy();
        // Eight prompts of 143 tokens: two turns while others decode, one as a burst at an idle server.
        assert_eq!(p.prefill(&[143; 8], false), vec![143; 4]);
        assert_eq!(p.prefill(&[143; 8], true), vec![143; 8]);
        // Still one chunk a prompt, and a prompt going on past the turn ends it.
        assert_eq!(p.prefill(&[143, 5000, 10], true), vec![143, 512]);
        assert_eq!(p.prefill(&[5000, 5000], true), vec![512]);
        // Prompts each alone keep the one-chunk turn.
        assert_eq!(Policy { prompts_together: 1, ..p }.prefill(&[143; 8], true), vec![143; 4]);
    }

    #[test]
    fn a_long_prompt_advances_one_chunk_per_turn() {
        assert_eq!(policy().prefill(&[2000, 10], false), vec![512]);
        assert_eq!(policy().prefill(&[300, 2000, 10], false), vec![300, 512]);
    }

    #[test]
    fn one_token_prompts_cost_nothing_and_never_block() {
        assert_eq!(policy().prefill(&[0, 0, 600], false), vec![0, 0, 512]);
        assert_eq!(policy().prefill(&[], false), Vec::<usize>::new());
    }

    #[test]
    fn whole_prompts_share_calls_within_a_chunks_tokens_longest_first() {
        let p = policy();
        // 4 x 127 = 508 tokens fit a 512-token chunk; the fifth goes alone.
        assert_eq!(p.prefill_groups(&[127, 127, 127, 127, 127], false), vec![vec![0, 1, 2, 3]]);
        // Padded to the longest: 300 + 10 is 600 tokens once padded, so the
        // short prompts pair up instead.
        assert_eq!(p.prefill_groups(&[10, 300, 20], false), vec![vec![2, 0]]);
        // At most `prompts_together` a call.
        assert_eq!(p.prefill_groups(&[5; 9], false), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(Policy { prompts_together: 1, ..p }.prefill_groups(&[5, 5, 5], false), Vec::<Vec<usize>>::new());
        assert_eq!(p.prefill_groups(&[], false), Vec::<Vec<usize>>::new());
        assert_eq!(p.prefill_groups(&[600, 5], false), Vec::<Vec<usize>>::new());
    }

    #[test]
    fn short_prompt_cache_hits_are_left_where_prompts_share_calls() {
        let p = policy();
        assert!(!p.takes_hit(8, 200), "a template's opening tokens");
        assert!(!p.takes_hit(127, 200));
        assert!(p.takes_hit(128, 200));
        assert!(p.takes_hit(500, 5000));
        // A prompt longer than a chunk never shares a call: its hits are all taken.
        assert!(p.takes_hit(8, p.prefill_size + 1));
        // A larger chunk does not make longer hits not worth taking.
        let wide = Policy { prefill_size: 8192, ..p };
        assert!(wide.takes_hit(128, 4000) && !wide.takes_hit(127, 4000));
        let alone = Policy { prompts_together: 1, ..p };
        assert!(alone.takes_hit(1, 200) && alone.takes_hit(8, 200));
    }

    #[test]
    fn a_burst_shares_calls_within_the_turns_tokens() {
        let p = Policy { prompts_together: 8, ..policy() };
        // Eight prompts of 143 tokens: 1144 once padded, more than a chunk but
        // within a burst's turn of eight chunks, so one call, as its turn plans.
        assert_eq!(p.prefill(&[143; 8], true), vec![143; 8]);
        assert_eq!(p.prefill_groups(&[143; 8], true), vec![(0..8).collect::<Vec<_>>()]);
        // While others decode, a turn (and so a call) keeps to one chunk.
        assert_eq!(p.prefill_groups(&[143; 3], false), vec![vec![0, 1, 2]]);
        assert_eq!(p.prefill_groups(&[143; 4], false), vec![vec![0, 1, 2]]);
        // No more padding than prompt tokens in a call: the long prompt takes
        // one short one, the other short ones share a call of their own.
        assert_eq!(p.prefill_groups(&[600, 5, 5, 5, 5, 5, 5, 5], true), vec![vec![0, 1], vec![2, 3, 4, 5, 6, 7]]);
        assert_eq!(p.prefill_groups(&[600, 300, 5, 5], true), vec![vec![0, 1, 2]]);
        // Within the turn's tokens: 8 x 600 is past 8 x 512.
        assert_eq!(p.prefill_groups(&[600; 8], true), vec![(0..6).collect::<Vec<_>>(), vec![6, 7]]);
        assert_eq!(p.prefill_groups(&[500; 8], true), vec![(0..8).collect::<Vec<_>>()]);
    }

    #[test]
    fn a_zero_chunk_size_still_makes_progress() {
        let p = Policy { max_concurrency: 1, prefill_size: 0, kv_tokens: usize::MAX, prompts_together: 1 };
        assert_eq!(p.prefill(&[5, 5], false), vec![1]);
    }
}
