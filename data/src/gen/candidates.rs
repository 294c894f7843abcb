//! What the host offers at each decision: a filtered, shuffled subset that always holds the
//! answer. Ids name the option (a tool name, an order id, `finish` / `continue`); the label is
//! what the model reads: the same short word, except that an order the context has shown is
//! labelled with its item as well (`ord_127 lamp`, set where the episode knows the items).

use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand_chacha::ChaCha8Rng;

use super::catalogue::{
    CONTINUE, FINISH, ORDER_ID_COUNT, ORDER_ID_FIRST, STOP_PADS, TOOLS, near_duplicates, order_id,
};
use crate::state::Candidate;

/// The host's cap on options.
pub(crate) const MAX_OPTIONS: usize = 16;
pub(crate) const MIN_OPTIONS: usize = 4;

fn candidate(word: &str) -> Candidate {
    Candidate {
        id: word.to_string(),
        label: word.to_string(),
    }
}

fn push_unique<'a>(list: &mut Vec<&'a str>, word: &'a str) {
    if !list.contains(&word) {
        list.push(word);
    }
}

/// Tools offered for a `tool` decision: the answer, the options that must be there (`must`), a
/// few near-duplicates of the answer, often `ask_customer` / `escalate_to_human`, and random
/// tools up to a size between 4 and 16. `finish` is never offered here: the `stop` point decides it.
pub(crate) fn tool_options(rng: &mut ChaCha8Rng, answer: &str, must: &[&str]) -> Vec<Candidate> {
    let size = rng.random_range(MIN_OPTIONS..=MAX_OPTIONS);
    let mut chosen = vec![answer];
    for &word in must {
        push_unique(&mut chosen, word);
    }
    let mut dups: Vec<&str> = near_duplicates(answer).collect();
    dups.shuffle(rng);
    let take = rng.random_range(1..=4);
    for &word in dups.iter().take(take) {
        push_unique(&mut chosen, word);
    }
    if rng.random_bool(0.5) {
        push_unique(&mut chosen, "ask_customer");
    }
    if rng.random_bool(0.3) {
        push_unique(&mut chosen, "escalate_to_human");
    }
    let mut pool: Vec<&str> = TOOLS
        .iter()
        .map(|t| t.name)
        .filter(|&n| n != FINISH)
        .collect();
    pool.shuffle(rng);
    for word in pool {
        if chosen.len() >= size {
            break;
        }
        push_unique(&mut chosen, word);
    }
    debug_assert!(chosen.len() <= MAX_OPTIONS);
    chosen.shuffle(rng);
    chosen.into_iter().map(candidate).collect()
}

/// Options for a `stop` decision: `finish`, `continue` and two to four plausible other moves,
/// none of them the plan's next tool (`avoid`), so only `finish` or `continue` can be right.
pub(crate) fn stop_options(rng: &mut ChaCha8Rng, avoid: &[&str]) -> Vec<Candidate> {
    let mut pads: Vec<&str> = STOP_PADS
        .iter()
        .copied()
        .filter(|p| !avoid.contains(p))
        .collect();
    pads.shuffle(rng);
    let take = rng.random_range(2..=4).min(pads.len());
    let mut chosen = vec![FINISH, CONTINUE];
    chosen.extend(pads.into_iter().take(take));
    chosen.shuffle(rng);
    chosen.into_iter().map(candidate).collect()
}

/// Order ids offered for an `args` decision: every id the context shows, padded with other ids
/// of the pool to between 4 and 8 options.
pub(crate) fn order_options(rng: &mut ChaCha8Rng, seen: &[u16]) -> Vec<Candidate> {
    let size = rng.random_range(MIN_OPTIONS..=8).max(seen.len());
    let mut chosen: Vec<u16> = seen.to_vec();
    let pool: Vec<u16> = (ORDER_ID_FIRST..ORDER_ID_FIRST + ORDER_ID_COUNT).collect();
    while chosen.len() < size {
        let num = *pool.choose(rng).expect("non-empty pool");
        if !chosen.contains(&num) {
            chosen.push(num);
        }
    }
    chosen.shuffle(rng);
    chosen
        .into_iter()
        .map(|n| candidate(&order_id(n)))
        .collect()
}
