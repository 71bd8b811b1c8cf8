//! `--expert-cache-bytes`: how much memory the expert slot pools may take, as
//! bytes or as a share of all routed experts, turned into slots per layer.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheBudget {
    Bytes(u64),
    /// A share (0, 1] of every routed expert's bytes.
    Share(f64),
}

impl CacheBudget {
    /// `--expert-cache-bytes`: "4000000000", "4g" / "512m" / "64k" (powers of 1024), or "25%".
    pub fn parse(s: &str) -> Result<CacheBudget> {
        CacheBudget::parse_for("--expert-cache-bytes", "of the experts", s)
    }

    /// [`CacheBudget::parse`] for flag `flag`, whose shares are `of_what`.
    pub fn parse_for(flag: &str, of_what: &str, s: &str) -> Result<CacheBudget> {
        let bad = || Error::Config(format!("{flag} takes bytes (e.g. 4000000000, 4g, 512m) or a share {of_what} (e.g. 25%), got {s:?}"));
        let t = s.trim().to_ascii_lowercase();
        if let Some(p) = t.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(Error::Config(format!("{flag} {s}: a share must be above 0% and at most 100%")));
            }
            return Ok(CacheBudget::Share(p / 100.0));
        }
        let t = t.strip_suffix("ib").or_else(|| t.strip_suffix('b')).unwrap_or(&t);
        let (digits, scale) = match t.chars().last() {
            Some('k') => (&t[..t.len() - 1], 1u64 << 10),
            Some('m') => (&t[..t.len() - 1], 1 << 20),
            Some('g') => (&t[..t.len() - 1], 1 << 30),
            Some('t') => (&t[..t.len() - 1], 1 << 40),
            _ => (t, 1),
        };
        let n: u64 = digits.trim().parse().map_err(|_| bad())?;
        n.checked_mul(scale).map(CacheBudget::Bytes).ok_or_else(bad)
    }

    /// Slots per layer of `experts` each, when all layers' routed experts take
    /// `total_bytes`: the same share of every layer (a per-layer split tuned on
    /// traces does not hold on new prompts), rounded down so the pools never
    /// exceed the budget.
    pub fn slots(self, experts: usize, total_bytes: u64) -> usize {
        let share = match self {
            CacheBudget::Share(s) => s,
            CacheBudget::Bytes(_) if total_bytes == 0 => 1.0,
            CacheBudget::Bytes(b) => b as f64 / total_bytes as f64,
        };
        // The small epsilon keeps an exact share (25% of 64 = 16) from rounding down.
        ((share.min(1.0) * experts as f64 + 1e-9).floor() as usize).min(experts)
    }

    pub fn describe(self) -> String {
        match self {
            CacheBudget::Bytes(b) => format!("{b} bytes"),
            CacheBudget::Share(s) => format!("{}% of the experts", s * 100.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bytes_suffixes_and_shares() {
        assert_eq!(CacheBudget::parse("4000").unwrap(), CacheBudget::Bytes(4000));
        assert_eq!(CacheBudget::parse("4g").unwrap(), CacheBudget::Bytes(4 << 30));
        assert_eq!(CacheBudget::parse("512MiB").unwrap(), CacheBudget::Bytes(512 << 20));
        assert_eq!(CacheBudget::parse("25%").unwrap(), CacheBudget::Share(0.25));
        for bad in ["", "abc", "0%", "101%", "-5", "4x"] {
            assert!(CacheBudget::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn slots_never_exceed_the_budget_or_the_experts() {
        assert_eq!(CacheBudget::Share(0.25).slots(64, 0), 16);
        assert_eq!(CacheBudget::Share(0.1).slots(64, 0), 6);
        assert_eq!(CacheBudget::Share(1.0).slots(64, 0), 64);
        // 1000 bytes of 4000: a quarter.
        assert_eq!(CacheBudget::Bytes(1000).slots(64, 4000), 16);
        assert_eq!(CacheBudget::Bytes(999).slots(64, 4000), 15);
        assert_eq!(CacheBudget::Bytes(u64::MAX).slots(64, 4000), 64);
    }
}
