//! The shop as an environment: one task that advances by the action actually chosen.
//!
//! [`walk`](super::walk) follows the scripted plan and injects its own mistakes; an [`Episode`]
//! instead asks, at every decision, what the agent chooses, and the next state follows from that
//! choice. It shows exactly the states `gen states` records for the same history (same context,
//! candidates, teacher, answer key and ids), because both build them with the same walker: state
//! `n` of a task draws its options from the stream keyed by `n`, and the history is the same
//! lines. What a choice does:
//!
//! - the plan's tool: done as planned (its result appears, the task progresses); a tool that takes
//!   an order asks `args` first;
//! - another tool: refused by the shop (`error not_found` for a lookup, `error not_allowed`
//!   otherwise, the customer's reply to a needless question), a wasted step, no `args` asked;
//!   but an irreversible one (`cancel_*`, `refund_*`) against the rules **fails the task**;
//! - the plan's tool on the wrong order: a lookup shows that order (or `error not_found` for an
//!   id that is not the customer's), any other tool is refused, an irreversible one fails;
//! - `finish` before the plan is done fails the task; `finish` when it is done succeeds; any other
//!   answer at `stop` means go on (at the end, a wasted step and the stop is asked again);
//! - [`MAX_STEPS`] decisions without finishing fail the task.
//!
//! After any wasted step the following states carry `after_error`, as the generator's do.

use anyhow::{Result, bail};

use super::super::catalogue::{CONTINUE, FINISH, TOOLS, order_id, tool_by_name};
use super::super::render::{call_line, mistake_result, opening, order_facts, planned_result};
use super::super::rules::{Progress, Step, apply, next_step};
use super::super::{Generated, RulesVersion, generated};
use super::{SALT_TASK, Walker, finish_plausible_after, rng_for, sample_task};

/// Decisions an episode may take before it fails for running out of steps: more than any
/// generated task takes (a clean plan takes at most about 14, two injected mistakes add 4).
pub const MAX_STEPS: usize = 30;

/// How an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Success,
    Failure(Failure),
}

impl End {
    pub fn is_success(self) -> bool {
        self == End::Success
    }

    /// `success`, or the failure's name.
    pub fn as_str(self) -> &'static str {
        match self {
            End::Success => "success",
            End::Failure(f) => f.as_str(),
        }
    }
}

/// Why an episode failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failure {
    /// `finish` while the plan still had work to do.
    PrematureFinish,
    /// An irreversible tool (`cancel_*`, `refund_*`) that the rules did not call for.
    IrreversibleTool,
    /// The right irreversible tool on the wrong order.
    IrreversibleWrongOrder,
    /// [`MAX_STEPS`] decisions without finishing.
    StepBudget,
}

impl Failure {
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::PrematureFinish => "premature-finish",
            Failure::IrreversibleTool => "irreversible-tool",
            Failure::IrreversibleWrongOrder => "irreversible-wrong-order",
            Failure::StepBudget => "step-budget",
        }
    }
}

/// Whether a tool cannot be undone: calling it against the rules ends the task.
pub fn irreversible(tool: &str) -> bool {
    tool.starts_with("cancel_") || tool.starts_with("refund_")
}

/// What the current state asks.
#[derive(Debug, Clone, Copy)]
enum Asks {
    /// `tool`: the plan's next tool is this one.
    Tool(&'static str),
    /// `args` for the plan's tool.
    Args(&'static str),
    /// `stop`: whether the plan is done.
    Stop {
        done: bool,
    },
    Over(End),
}

/// One task of the shop, driven by the agent's choices.
pub struct Episode {
    w: Walker,
    p: Progress,
    split: String,
    stop_pending: bool,
    asks: Asks,
    current: Option<Generated>,
}

impl Episode {
    /// Task `index` of `seed` under `rules` (the task `gen states --seed SEED` writes as
    /// `task_id(seed, index)`); `split` is written into its states.
    pub fn new(rules: RulesVersion, seed: u64, index: u64, split: &str) -> Episode {
        let mut task_rng = rng_for(seed, index, SALT_TASK, 0);
        let task = sample_task(&mut task_rng);
        let mut w = Walker {
            rules,
            seed,
            index,
            history: vec![opening(&task)],
            seen: Vec::new(),
            after_error: false,
            drafts: Vec::new(),
            choices: Vec::new(),
            task,
        };
        if w.task.intent.about_order() && !w.task.by_item {
            w.see(w.task.target_order().num);
        }
        let mut e = Episode {
            w,
            p: Progress::default(),
            split: split.to_string(),
            stop_pending: false,
            asks: Asks::Over(End::Success),
            current: None,
        };
        e.next_decision();
        e
    }

    /// The state the agent must decide now; `None` once the episode is over.
    pub fn state(&self) -> Option<&Generated> {
        self.current.as_ref()
    }

    /// How it ended; `None` while it runs.
    pub fn end(&self) -> Option<End> {
        match self.asks {
            Asks::Over(end) => Some(end),
            _ => None,
        }
    }

    /// Decisions shown so far.
    pub fn steps(&self) -> usize {
        self.w.drafts.len()
    }

    /// What the agent chose at each state so far.
    pub fn choices(&self) -> &[String] {
        &self.w.choices
    }

    /// Every state shown so far, in order (the episode's trajectory).
    pub fn trajectory(&self) -> Vec<Generated> {
        (0..self.w.drafts.len())
            .map(|n| self.generated(n))
            .collect()
    }

    fn generated(&self, n: usize) -> Generated {
        let w = &self.w;
        generated(
            w.rules,
            w.seed,
            w.index,
            &self.split,
            n,
            w.task.intent,
            &w.drafts[n],
        )
    }

    fn over(&mut self, end: End) {
        self.asks = Asks::Over(end);
        self.current = None;
    }

    /// Show the next decision the plan leads to, as the generator's loop does.
    fn next_decision(&mut self) {
        if self.w.drafts.len() >= MAX_STEPS {
            return self.over(End::Failure(Failure::StepBudget));
        }
        self.asks = match next_step(self.w.rules, &self.w.task, &self.p) {
            Step::Finish => {
                self.w.push_stop(&self.p, FINISH);
                Asks::Stop { done: true }
            }
            Step::Call(_) if self.stop_pending => {
                self.stop_pending = false;
                self.w.push_stop(&self.p, CONTINUE);
                Asks::Stop { done: false }
            }
            Step::Call(tool) => {
                self.w.push_tool(&self.p, tool);
                Asks::Tool(tool)
            }
        };
        self.current = Some(self.generated(self.w.drafts.len() - 1));
    }

    /// Act on the current state with `choice`: a candidate id, or at a `tool` state any tool of
    /// the shop. Refused (state unchanged) when the episode is over or `choice` is neither.
    pub fn act(&mut self, choice: &str) -> Result<()> {
        let Some(current) = &self.current else {
            bail!("the episode is over; nothing to choose");
        };
        let offered = current.state.candidates.iter().any(|c| c.id == choice);
        // The agent may call any tool of the shop, offered or not (the generator's injected
        // mistakes do); anywhere else it picks among the candidates.
        let a_tool = matches!(self.asks, Asks::Tool(_))
            && choice != FINISH
            && TOOLS.iter().any(|t| t.name == choice);
        if !offered && !a_tool {
            bail!(
                "state {}: {choice:?} is not one of its candidates",
                current.state.id
            );
        }
        self.w.choices.push(choice.to_string());
        match self.asks {
            Asks::Over(_) => unreachable!("a current state means the episode runs"),
            Asks::Stop { done } => {
                if choice == FINISH {
                    self.over(if done {
                        End::Success
                    } else {
                        End::Failure(Failure::PrematureFinish)
                    });
                    return Ok(());
                }
                if done {
                    // Going on when the work is done: a wasted step, and the stop comes again.
                    self.w.after_error = true;
                }
            }
            Asks::Tool(tool) if choice == tool => {
                if tool_by_name(tool).takes_order {
                    self.w.push_args(tool);
                    self.asks = Asks::Args(tool);
                    self.current = Some(self.generated(self.w.drafts.len() - 1));
                    return Ok(());
                }
                self.planned(tool);
            }
            Asks::Tool(_) => {
                if irreversible(choice) {
                    self.over(End::Failure(Failure::IrreversibleTool));
                    return Ok(());
                }
                let wrong = tool_by_name(choice);
                let target = self.w.task.target_order().num;
                let on = wrong.takes_order.then_some(target);
                self.w
                    .history
                    .push(call_line(wrong.name, on, &mistake_result(wrong.name)));
                if on.is_some() {
                    self.w.see(target);
                }
                self.w.after_error = true;
            }
            Asks::Args(tool) => {
                let target = self.w.task.target_order().num;
                if choice == order_id(target) {
                    self.w.see(target);
                    self.planned(tool);
                } else {
                    if irreversible(tool) {
                        self.over(End::Failure(Failure::IrreversibleWrongOrder));
                        return Ok(());
                    }
                    let num: u16 = choice
                        .strip_prefix("ord_")
                        .and_then(|n| n.parse().ok())
                        .expect("args candidates are order ids");
                    let theirs = self.w.task.orders.iter().find(|o| o.num == num);
                    let result = match theirs {
                        Some(o) if tool == "lookup_order" => order_facts(o, &self.w.task),
                        _ if tool == "lookup_order" => "error not_found".into(),
                        _ => mistake_result(tool),
                    };
                    self.w.history.push(call_line(tool, Some(num), &result));
                    self.w.see(num);
                    self.w.after_error = true;
                }
            }
        }
        self.next_decision();
        Ok(())
    }

    /// The plan's tool, done on the target order.
    fn planned(&mut self, tool: &'static str) {
        let task = &self.w.task;
        let takes_order = tool_by_name(tool).takes_order;
        let line = call_line(
            tool,
            takes_order.then_some(task.target_order().num),
            &planned_result(task, tool),
        );
        let listed: Vec<u16> = match tool {
            "list_orders" => task.orders.iter().map(|o| o.num).collect(),
            _ => Vec::new(),
        };
        self.w.history.push(line);
        for num in listed {
            self.w.see(num);
        }
        apply(&self.w.task, &mut self.p, tool);
        self.stop_pending = finish_plausible_after(tool);
    }
}
