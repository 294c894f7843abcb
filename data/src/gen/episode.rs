//! One task from start to finish: draw its facts, follow the scripted plan, inject mistakes, and
//! record a decision state at every choice the agent makes on the way.
//!
//! Everything random about a task comes from generators seeded by `(seed, task index, purpose)`,
//! never from the rules version, so `v1` and `v2` draw the same tasks, the same mistakes and the
//! same option sets, and their states stay identical until the changed rule first matters.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::RulesVersion;
use super::candidates::{order_options, stop_options, tool_options};
use super::catalogue::{
    AMOUNTS, CONTINUE, DAYS_SINCE_DELIVERY, FINISH, Family, HOURS_SINCE_SHIP, INTENTS, ITEMS,
    Intent, ORDER_ID_COUNT, ORDER_ID_FIRST, TOOLS, Tier, order_id, tool_by_name,
};
use super::render::{
    EARLY_FINISH_REPLY, call_line, mistake_result, opening, order_facts, pending_call,
    planned_result,
};
use super::rules::{Order, Progress, Status, Step, Task, Track, apply, next_step};
use super::teacher::{TeacherView, teacher_probs};
use crate::state::Candidate;

pub mod env;

/// Chance that a task carries an injected mistake, and that it carries a second one.
const P_MISTAKE: f64 = 0.39;
const P_SECOND_MISTAKE: f64 = 0.25;
/// The teacher's chance of ranking the answer first outside its wrong slice, per point; lower
/// after an error, where the history is confusing.
const TEACHER_RIGHT: f64 = 0.91;
const TEACHER_RIGHT_ARGS: f64 = 0.95;
const TEACHER_RIGHT_AFTER_ERROR_DROP: f64 = 0.08;

/// Generator purposes, so that no two uses share a stream.
const SALT_TASK: u64 = 1;
const SALT_STATE: u64 = 2;
const SALT_MISTAKE: u64 = 3;

/// A decision point this generator emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Point {
    Tool,
    Args,
    Stop,
}

impl Point {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Point::Tool => "tool",
            Point::Args => "args",
            Point::Stop => "stop",
        }
    }
}

/// A decision state before it gets its ids, with the answer under each rules version.
pub(crate) struct Draft {
    pub point: Point,
    pub context: String,
    pub candidates: Vec<Candidate>,
    pub answer: String,
    pub teacher: Vec<f64>,
    pub after_error: bool,
    pub answer_v1: String,
    pub answer_v2: String,
}

/// SplitMix64: a fixed, well-mixed hash of a 64-bit value.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A 64-bit key for `(seed, task index, purpose, n)`.
fn key(seed: u64, task: u64, salt: u64, n: u64) -> u64 {
    splitmix(splitmix(splitmix(splitmix(seed) ^ task) ^ salt) ^ n)
}

fn rng_for(seed: u64, task: u64, salt: u64, n: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(key(seed, task, salt, n))
}

fn pick_weighted<T: Copy>(rng: &mut ChaCha8Rng, items: &[(T, u32)]) -> T {
    let total: u32 = items.iter().map(|&(_, w)| w).sum();
    let mut roll = rng.random_range(0..total);
    for &(item, weight) in items {
        if roll < weight {
            return item;
        }
        roll -= weight;
    }
    unreachable!("roll below total weight")
}

fn pick<T: Copy>(rng: &mut ChaCha8Rng, items: &[T]) -> T {
    *items.choose(rng).expect("non-empty list")
}

fn random_status(rng: &mut ChaCha8Rng, weights: [u32; 3]) -> Status {
    match pick_weighted(rng, &[(0, weights[0]), (1, weights[1]), (2, weights[2])]) {
        0 => Status::Processing,
        1 => Status::Shipped {
            hours: pick(rng, HOURS_SINCE_SHIP),
        },
        _ => Status::Delivered {
            days: pick(rng, DAYS_SINCE_DELIVERY),
        },
    }
}

/// Draw a task's facts. The target order's status follows the intent (returns are about
/// delivered orders, missing parcels about shipped ones); the customer's other orders are random.
pub(crate) fn sample_task(rng: &mut ChaCha8Rng) -> Task {
    let intent = pick_weighted(rng, INTENTS);
    let count = rng.random_range(2..=4);
    let mut nums: Vec<u16> = (ORDER_ID_FIRST..ORDER_ID_FIRST + ORDER_ID_COUNT).collect();
    nums.shuffle(rng);
    let mut items = ITEMS.to_vec();
    items.shuffle(rng);
    let mut orders: Vec<Order> = (0..count)
        .map(|i| Order {
            num: nums[i],
            item: items[i],
            status: random_status(rng, [1, 1, 1]),
            amount: pick(rng, AMOUNTS),
        })
        .collect();
    let target = rng.random_range(0..count);
    orders[target].status = match intent {
        Intent::CancelOrder => random_status(rng, [15, 70, 15]),
        Intent::ChangeAddress => random_status(rng, [20, 65, 15]),
        Intent::WhereIsOrder => random_status(rng, [30, 50, 20]),
        Intent::RefundMissing => Status::Shipped {
            hours: pick(rng, &[30, 48, 72]),
        },
        _ => random_status(rng, [0, 0, 1]),
    };
    let track = if intent == Intent::RefundMissing {
        if rng.random_bool(0.6) {
            Track::Lost
        } else {
            Track::InTransit
        }
    } else if rng.random_bool(0.5) {
        Track::Delayed
    } else {
        Track::InTransit
    };
    Task {
        intent,
        opening: rng.random_range(0..intent.openings().len()),
        by_item: rng.random_bool(0.5),
        tier: pick(rng, &Tier::ALL),
        track,
        identity_ok: rng.random_bool(0.75),
        in_stock: rng.random_bool(0.6),
        yearly_plan: rng.random_bool(0.5),
        wants_pause: rng.random_bool(0.5),
        orders,
        target,
    }
}

/// After these results the agent could plausibly stop, so the host asks `stop`.
fn finish_plausible_after(tool: &str) -> bool {
    !tool_by_name(tool).families.contains(&Family::Lookup) && tool != "verify_identity"
}

/// The plan without mistakes: the tools it calls and how many decisions (tool choices and
/// stop-or-continue choices) it takes.
fn clean_plan(rules: RulesVersion, task: &Task) -> (Vec<&'static str>, usize) {
    let mut p = Progress::default();
    let mut tools = Vec::new();
    let mut decisions = 0;
    let mut stop_pending = false;
    while let Step::Call(tool) = next_step(rules, task, &p) {
        decisions += 1 + usize::from(stop_pending);
        tools.push(tool);
        apply(task, &mut p, tool);
        stop_pending = finish_plausible_after(tool);
        assert!(
            tools.len() < 32,
            "plan for {:?} does not finish",
            task.intent
        );
    }
    (tools, decisions)
}

/// The tool the agent wrongly calls instead of `right`: a near-duplicate that the task's plan
/// never uses (so the shop refuses it), or a needless question.
fn wrong_tool(rng: &mut ChaCha8Rng, right: &str, plan_tools: &[&str]) -> &'static str {
    let never = [
        "finish",
        "send_message",
        "escalate_to_human",
        "lookup_order",
        "list_orders",
    ];
    let usable =
        |name: &&str| !plan_tools.contains(name) && !never.contains(name) && *name != right;
    let mut pool: Vec<&'static str> = super::catalogue::near_duplicates(right)
        .filter(usable)
        .collect();
    if usable(&"ask_customer") {
        pool.push("ask_customer");
    }
    if pool.is_empty() {
        pool = TOOLS.iter().map(|t| t.name).filter(usable).collect();
    }
    pick(rng, &pool)
}

/// For an `ask_customer` answer where the customer asked for an action, the action the teacher
/// wrongly prefers (it acts where it should ask).
fn slice_action(task: &Task) -> Option<&'static str> {
    match task.intent {
        Intent::CancelOrder => Some("cancel_order"),
        Intent::ChangeAddress => Some("update_address"),
        Intent::ReturnItem => Some("create_return"),
        Intent::ExchangeItem => Some("create_exchange"),
        Intent::CancelSubscription => Some("cancel_subscription"),
        _ => None,
    }
}

fn stop_answer(step: Step) -> &'static str {
    match step {
        Step::Finish => FINISH,
        Step::Call(_) => CONTINUE,
    }
}

struct Walker {
    rules: RulesVersion,
    seed: u64,
    index: u64,
    task: Task,
    history: Vec<String>,
    /// Order ids the context shows, in order of appearance.
    seen: Vec<u16>,
    after_error: bool,
    drafts: Vec<Draft>,
    /// What the agent chose at each recorded state, in order (the history that led here).
    choices: Vec<String>,
}

impl Walker {
    fn see(&mut self, num: u16) {
        if !self.seen.contains(&num) {
            self.seen.push(num);
        }
    }

    fn context(&self) -> String {
        self.history.join(" ")
    }

    fn state_rng(&self) -> ChaCha8Rng {
        rng_for(self.seed, self.index, SALT_STATE, self.drafts.len() as u64)
    }

    fn answers(&self, p: &Progress, f: impl Fn(Step) -> String) -> (String, String) {
        (
            f(next_step(RulesVersion::V1, &self.task, p)),
            f(next_step(RulesVersion::V2, &self.task, p)),
        )
    }

    fn push(
        &mut self,
        point: Point,
        context: String,
        candidates: Vec<Candidate>,
        rng: &mut ChaCha8Rng,
        (answer_v1, answer_v2): (String, String),
        slice: Option<&str>,
    ) {
        let (answer, other) = match self.rules {
            RulesVersion::V1 => (answer_v1.clone(), &answer_v2),
            RulesVersion::V2 => (answer_v2.clone(), &answer_v1),
        };
        let answer_at = candidates
            .iter()
            .position(|c| c.id == answer)
            .expect("answer offered");
        let index_of = |word: &str| candidates.iter().position(|c| c.id == word);
        let slice_pick = slice.and_then(index_of);
        let mut plausible: Vec<usize> = Vec::new();
        if let Some(i) = index_of(other).filter(|&i| i != answer_at) {
            plausible.push(i);
        }
        if point == Point::Args {
            // A wrong pick of an order id is one the context shows, not a random one.
            for &num in &self.seen {
                plausible.extend(index_of(&order_id(num)).filter(|&i| i != answer_at));
            }
        }
        if point == Point::Stop {
            let opposite = if answer == FINISH { CONTINUE } else { FINISH };
            plausible.extend(index_of(opposite));
        }
        if point == Point::Tool {
            for dup in super::catalogue::near_duplicates(&answer) {
                if let Some(i) = index_of(dup) {
                    plausible.push(i);
                }
            }
        }
        let base = if point == Point::Args {
            TEACHER_RIGHT_ARGS
        } else {
            TEACHER_RIGHT
        };
        let p_right = base
            - if self.after_error {
                TEACHER_RIGHT_AFTER_ERROR_DROP
            } else {
                0.0
            };
        let view = TeacherView {
            options: candidates.len(),
            answer: answer_at,
            slice_pick,
            plausible: &plausible,
            p_right,
        };
        let teacher = teacher_probs(rng, &view);
        self.drafts.push(Draft {
            point,
            context,
            candidates,
            answer,
            teacher,
            after_error: self.after_error,
            answer_v1,
            answer_v2,
        });
    }

    fn push_stop(&mut self, p: &Progress, answer: &str) {
        let answers = self.answers(p, |s| stop_answer(s).to_string());
        let own = if self.rules == RulesVersion::V1 {
            &answers.0
        } else {
            &answers.1
        };
        debug_assert_eq!(own, answer);
        let next_tools: Vec<&str> = [RulesVersion::V1, RulesVersion::V2]
            .into_iter()
            .filter_map(|r| match next_step(r, &self.task, p) {
                Step::Call(tool) => Some(tool),
                Step::Finish => None,
            })
            .collect();
        let mut rng = self.state_rng();
        let candidates = stop_options(&mut rng, &next_tools);
        self.push(
            Point::Stop,
            self.context(),
            candidates,
            &mut rng,
            answers,
            None,
        );
    }

    fn push_tool(&mut self, p: &Progress, tool: &'static str) {
        let answers = self.answers(p, |s| s.name().to_string());
        let mut must: Vec<&str> = Vec::new();
        for other in [&answers.0, &answers.1] {
            if other != tool && other != FINISH {
                must.push(tool_by_name(other).name);
            }
        }
        let slice = (tool == "ask_customer")
            .then(|| slice_action(&self.task))
            .flatten();
        if let Some(action) = slice {
            must.push(action);
        }
        let mut rng = self.state_rng();
        let candidates = tool_options(&mut rng, tool, &must);
        self.push(
            Point::Tool,
            self.context(),
            candidates,
            &mut rng,
            answers,
            slice,
        );
    }

    fn push_args(&mut self, tool: &str) {
        let target = order_id(self.task.target_order().num);
        let context = format!("{} {}", self.context(), pending_call(tool));
        let mut rng = self.state_rng();
        let mut candidates = order_options(&mut rng, &self.seen);
        // As a host would summarise them: an order the context has shown is offered with its
        // item ("ord_127 lamp"); an id the context never showed is offered bare.
        for c in &mut candidates {
            if let Some(o) = self
                .task
                .orders
                .iter()
                .find(|o| order_id(o.num) == c.id && self.seen.contains(&o.num))
            {
                c.label = format!("{} {}", c.id, o.item);
            }
        }
        let answers = (target.clone(), target.clone());
        self.push(Point::Args, context, candidates, &mut rng, answers, None);
    }
}

/// Walk one task under `rules`: its intent and every decision state on the way, in order.
pub(crate) fn walk(rules: RulesVersion, seed: u64, index: u64) -> (Intent, Vec<Draft>) {
    let (intent, drafts, _) = walk_traced(rules, seed, index);
    (intent, drafts)
}

/// As [`walk`], with what the generator's agent chose at each state (the answer, or the injected
/// mistake): the history an [`Episode`] replays to reach the same states.
pub(crate) fn walk_traced(
    rules: RulesVersion,
    seed: u64,
    index: u64,
) -> (Intent, Vec<Draft>, Vec<String>) {
    let mut task_rng = rng_for(seed, index, SALT_TASK, 0);
    let task = sample_task(&mut task_rng);
    let (tools_v1, decisions_v1) = clean_plan(RulesVersion::V1, &task);
    let (tools_v2, decisions_v2) = clean_plan(RulesVersion::V2, &task);
    let plan_tools: Vec<&str> = tools_v1.iter().chain(&tools_v2).copied().collect();
    // Mistake slots are drawn from the decisions both versions share, so both versions inject
    // them at the same moments.
    let shared_decisions = decisions_v1.min(decisions_v2);
    let mut mistakes = Vec::new();
    if task_rng.random_bool(P_MISTAKE) {
        mistakes.push(task_rng.random_range(0..shared_decisions));
        if task_rng.random_bool(P_SECOND_MISTAKE) {
            mistakes.push(task_rng.random_range(0..shared_decisions));
        }
    }

    let target = task.target_order().num;
    let mut walker = Walker {
        rules,
        seed,
        index,
        task: task.clone(),
        history: vec![opening(&task)],
        seen: Vec::new(),
        after_error: false,
        drafts: Vec::new(),
        choices: Vec::new(),
    };
    if task.intent.about_order() && !task.by_item {
        walker.see(target);
    }
    let mut p = Progress::default();
    let mut decision = 0usize;
    let mut stop_pending = false;
    for _ in 0..64 {
        let tool = match next_step(rules, &task, &p) {
            Step::Finish => {
                walker.push_stop(&p, FINISH);
                walker.choices.push(FINISH.into());
                return (task.intent, walker.drafts, walker.choices);
            }
            Step::Call(tool) => tool,
        };
        if stop_pending {
            stop_pending = false;
            walker.push_stop(&p, CONTINUE);
            let d = decision;
            decision += 1;
            if mistakes.contains(&d) {
                walker
                    .history
                    .push(call_line(FINISH, None, EARLY_FINISH_REPLY));
                walker.after_error = true;
                walker.choices.push(FINISH.into());
            } else {
                walker.choices.push(CONTINUE.into());
            }
        }
        walker.push_tool(&p, tool);
        let d = decision;
        decision += 1;
        let takes_order = tool_by_name(tool).takes_order;
        if mistakes.contains(&d) {
            let mut rng = rng_for(seed, index, SALT_MISTAKE, d as u64);
            let others: Vec<&Order> = task.orders.iter().filter(|o| o.num != target).collect();
            if tool == "lookup_order" && p.listed && rng.random_bool(0.5) {
                // The right tool on the wrong order: the agent picked another listed id.
                walker.choices.push(tool.into());
                walker.push_args(tool);
                let other = pick(&mut rng, &others);
                walker.choices.push(order_id(other.num));
                walker
                    .history
                    .push(call_line(tool, Some(other.num), &order_facts(other, &task)));
                walker.see(other.num);
            } else {
                let wrong = wrong_tool(&mut rng, tool, &plan_tools);
                walker.choices.push(wrong.into());
                let on = tool_by_name(wrong).takes_order.then_some(target);
                walker
                    .history
                    .push(call_line(wrong, on, &mistake_result(wrong)));
                if on.is_some() {
                    walker.see(target);
                }
            }
            walker.after_error = true;
            continue;
        }
        walker.choices.push(tool.into());
        if takes_order {
            walker.push_args(tool);
            walker.choices.push(order_id(target));
            walker.see(target);
        }
        walker.history.push(call_line(
            tool,
            takes_order.then_some(target),
            &planned_result(&task, tool),
        ));
        if tool == "list_orders" {
            for order in &task.orders {
                walker.see(order.num);
            }
        }
        apply(&task, &mut p, tool);
        stop_pending = finish_plausible_after(tool);
    }
    panic!("task {index} of seed {seed} did not finish within 64 steps");
}
