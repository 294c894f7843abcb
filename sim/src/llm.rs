//! The agent's LLM, simulated: it answers each decision with the generator's teacher's top
//! option (the first maximum), so it is right about 85 % of the time, unsure where the teacher is
//! unsure, and confidently wrong on the teacher's slice (it acts where the rules say to ask).
//! The same state always gets the same answer. Every answer is one call, with a price and a
//! latency.

use anyhow::{Result, bail};
use decision_data::State;

/// JevAgentHarness's median latency of a Gemini Flash call.
pub const DEFAULT_LATENCY_MS: f64 = 809.0;
/// Price of one call in the unit of a task's worth (a solved task is worth 1): about what a
/// Flash call with a few thousand tokens of agent context costs in dollars. An assumption, not
/// a measurement; `--price` sets it.
pub const DEFAULT_PRICE: f64 = 0.002;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llm {
    pub price_per_call: f64,
    pub latency_ms: f64,
}

impl Default for Llm {
    fn default() -> Self {
        Self {
            price_per_call: DEFAULT_PRICE,
            latency_ms: DEFAULT_LATENCY_MS,
        }
    }
}

impl Llm {
    /// The index of the candidate the LLM picks. A state without a teacher vector of the right
    /// length cannot be answered (every generated state has one).
    pub fn answer(&self, state: &State) -> Result<usize> {
        let Some(t) = state.teacher.as_deref() else {
            bail!(
                "state {}: no teacher probabilities to answer from",
                state.id
            );
        };
        if t.len() != state.candidates.len() || t.is_empty() {
            bail!(
                "state {}: {} teacher probabilities for {} candidates",
                state.id,
                t.len(),
                state.candidates.len()
            );
        }
        Ok(decision_data::stats::first_max(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decision_data::r#gen::{GenOptions, generate};

    #[test]
    fn the_llm_is_right_about_85_percent_of_the_time() {
        let states = generate(&GenOptions {
            tasks: 400,
            seed: 3,
            ..GenOptions::default()
        })
        .unwrap();
        let llm = Llm::default();
        let right = states
            .iter()
            .filter(|s| {
                let i = llm.answer(s).unwrap();
                s.answer.as_deref() == Some(s.candidates[i].id.as_str())
            })
            .count();
        let share = right as f64 / states.len() as f64;
        assert!((0.80..=0.92).contains(&share), "{share}");
        let mut s = states[0].clone();
        s.teacher = None;
        assert!(llm.answer(&s).unwrap_err().to_string().contains(&s.id));
    }
}
