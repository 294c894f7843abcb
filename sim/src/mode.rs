//! Who decides: the modes of `decision sim --modes`.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// The LLM decides everything.
    Llm,
    /// The decision model decides everything it can answer, no threshold.
    Model,
    /// The model decides when its confidence is at least this; the LLM otherwise.
    Fixed(f64),
    /// The model decides when its confidence clears the point's fitted threshold.
    Cascade,
    /// The LLM acts; the model's answer is only recorded.
    Shadow,
}

impl Mode {
    /// Whether the model is consulted at all.
    pub fn uses_model(self) -> bool {
        self != Mode::Llm
    }

    /// Whether the mode writes receipts.
    pub fn writes_receipts(self) -> bool {
        matches!(self, Mode::Cascade | Mode::Shadow)
    }

    /// Parse a comma-separated list, refusing duplicates.
    pub fn parse_list(s: &str) -> Result<Vec<Mode>> {
        let mut out: Vec<Mode> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let m: Mode = part.parse()?;
            if out.contains(&m) {
                bail!("--modes: {m} is given twice");
            }
            out.push(m);
        }
        if out.is_empty() {
            bail!("--modes: no mode given (llm, model, fixed:T, cascade, shadow)");
        }
        Ok(out)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Llm => f.write_str("llm"),
            Mode::Model => f.write_str("model"),
            Mode::Fixed(t) => write!(f, "fixed:{t}"),
            Mode::Cascade => f.write_str("cascade"),
            Mode::Shadow => f.write_str("shadow"),
        }
    }
}

impl FromStr for Mode {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Mode> {
        Ok(match s {
            "llm" => Mode::Llm,
            "model" => Mode::Model,
            "cascade" => Mode::Cascade,
            "shadow" => Mode::Shadow,
            _ => match s.strip_prefix("fixed:").map(str::parse::<f64>) {
                Some(Ok(t)) if (0.0..=1.0).contains(&t) => Mode::Fixed(t),
                Some(_) => bail!("mode {s:?}: fixed:T needs a threshold T in [0, 1]"),
                None => bail!(
                    "unknown mode {s:?}: expected llm, model, fixed:T (T in [0, 1]), cascade or shadow"
                ),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_back() {
        let m = Mode::parse_list("llm,model,fixed:0.5,cascade,shadow").unwrap();
        assert_eq!(
            m,
            [
                Mode::Llm,
                Mode::Model,
                Mode::Fixed(0.5),
                Mode::Cascade,
                Mode::Shadow
            ]
        );
        let shown: Vec<String> = m.iter().map(Mode::to_string).collect();
        assert_eq!(shown.join(","), "llm,model,fixed:0.5,cascade,shadow");
        for (bad, why) in [
            ("fixed:1.5", "[0, 1]"),
            ("fixed:x", "[0, 1]"),
            ("always", "unknown mode"),
            ("llm,llm", "twice"),
            ("", "no mode"),
        ] {
            let e = Mode::parse_list(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
