//! The shop's rules: a task's hidden facts, what the agent has done so far, and the scripted plan
//! that says what comes next. The plan is a function of the rules version, the facts and the
//! progress, so the answer key is known at every reachable state, including after a detour.
//!
//! The two versions differ in one rule, the **shipped-order rule**, which decides how an order
//! that has already shipped is cancelled or re-addressed:
//!
//! - `v1`: an order shipped at most 24 hours ago is still changed like an unshipped one
//!   (`cancel_order`, `update_address`); later than that, the agent asks the customer.
//! - `v2`: a shipped order is changed through the carrier up to 48 hours after shipping
//!   (`cancel_shipment`, then `refund_order`; or `redirect_shipment`), and the customer is told
//!   with `send_message`; later than that, ask.
//!
//! Every other rule is shared.

use super::RulesVersion;
use super::catalogue::{Intent, Tier};

/// Hours after shipping during which `v1` still treats a shipped order as changeable.
pub(crate) const V1_SHIPPED_WINDOW_HOURS: u32 = 24;
/// Hours after shipping during which `v2` lets the carrier stop or redirect a parcel.
pub(crate) const V2_CARRIER_WINDOW_HOURS: u32 = 48;
/// Return window in days (gold customers get twice as long).
pub(crate) const RETURN_WINDOW_DAYS: u32 = 30;
/// Damaged items up to this amount are refunded without a return.
pub(crate) const REFUND_WITHOUT_RETURN_MAX: u32 = 60;
/// Address changes on orders of at least this amount need the customer's identity verified.
pub(crate) const VERIFY_ADDRESS_MIN_AMOUNT: u32 = 150;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Processing,
    Shipped { hours: u32 },
    Delivered { days: u32 },
}

#[derive(Debug, Clone)]
pub(crate) struct Order {
    /// Number of the id: `ord_{num}`.
    pub num: u16,
    pub item: &'static str,
    pub status: Status,
    pub amount: u32,
}

/// What tracking a parcel reveals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Track {
    InTransit,
    Delayed,
    Lost,
}

/// A ticket: the customer's intent and every fact the plan may read. Facts reach the agent only
/// through tool results.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub intent: Intent,
    pub orders: Vec<Order>,
    /// Index into `orders` of the order the ticket is about.
    pub target: usize,
    /// The customer names the order by its item ("the lamp order") rather than by its id.
    pub by_item: bool,
    /// Which of the intent's opening messages the customer uses.
    pub opening: usize,
    pub tier: Tier,
    pub track: Track,
    pub identity_ok: bool,
    pub in_stock: bool,
    pub yearly_plan: bool,
    /// Offered a pause instead of a cancellation, the customer takes it.
    pub wants_pause: bool,
}

impl Task {
    pub(crate) fn target_order(&self) -> &Order {
        &self.orders[self.target]
    }
}

/// What the agent has achieved so far. Only successful planned calls change it; an injected
/// mistake leaves it as it was.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    pub listed: bool,
    pub looked_up: bool,
    pub identity: Option<bool>,
    pub tracked: bool,
    pub stock_checked: bool,
    pub subscription_looked_up: bool,
    pub asked: bool,
    pub escalated: bool,
    /// Successful actions, in order.
    pub done: Vec<&'static str>,
}

impl Progress {
    fn did(&self, tool: &str) -> bool {
        self.done.contains(&tool)
    }
}

/// The plan's next move: call a tool (on the target order when the tool takes one) or finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Call(&'static str),
    Finish,
}

impl Step {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Step::Call(tool) => tool,
            Step::Finish => super::catalogue::FINISH,
        }
    }
}

use Step::{Call, Finish};

/// The scripted plan: what the rules say to do next for this task, given the progress.
pub(crate) fn next_step(rules: RulesVersion, task: &Task, p: &Progress) -> Step {
    if p.escalated {
        return Finish;
    }
    if task.intent.about_order() && !p.looked_up {
        return if task.by_item && !p.listed {
            Call("list_orders")
        } else {
            Call("lookup_order")
        };
    }
    let order = task.target_order();
    match task.intent {
        Intent::CancelOrder => cancel_order(rules, order, p),
        Intent::ChangeAddress => change_address(rules, task, p),
        Intent::RefundDamaged => {
            if p.did("refund_order") || p.did("send_return_label") {
                Finish
            } else if p.did("create_return") {
                Call("send_return_label")
            } else if task.tier == Tier::Gold || order.amount <= REFUND_WITHOUT_RETURN_MAX {
                Call("refund_order")
            } else {
                Call("create_return")
            }
        }
        Intent::RefundMissing => {
            if p.did("refund_order") || p.did("reship_order") || p.did("send_message") {
                Finish
            } else if !p.tracked {
                Call("track_shipment")
            } else if task.track == Track::Lost {
                Call(if task.tier == Tier::Gold {
                    "reship_order"
                } else {
                    "refund_order"
                })
            } else {
                Call("send_message")
            }
        }
        Intent::ReturnItem => {
            if p.asked || p.did("send_return_label") {
                Finish
            } else if p.did("create_return") {
                Call("send_return_label")
            } else if within_return_window(task) {
                Call("create_return")
            } else {
                Call("ask_customer")
            }
        }
        Intent::WhereIsOrder => {
            if p.did("send_message") {
                Finish
            } else if !matches!(order.status, Status::Shipped { .. }) {
                Call("send_message")
            } else if !p.tracked {
                Call("track_shipment")
            } else if task.track == Track::Delayed
                && task.tier == Tier::Gold
                && !p.did("expedite_shipment")
            {
                Call("expedite_shipment")
            } else {
                Call("send_message")
            }
        }
        Intent::CancelSubscription => {
            if p.did("cancel_subscription") || p.did("pause_subscription") {
                Finish
            } else if !p.subscription_looked_up {
                Call("lookup_subscription")
            } else if !task.yearly_plan {
                Call("cancel_subscription")
            } else if !p.asked {
                Call("ask_customer")
            } else if task.wants_pause {
                Call("pause_subscription")
            } else {
                Call("cancel_subscription")
            }
        }
        Intent::ExchangeItem => {
            if p.asked || p.did("create_exchange") || p.did("send_return_label") {
                Finish
            } else if p.did("create_return") {
                Call("send_return_label")
            } else if !within_return_window(task) {
                Call("ask_customer")
            } else if !p.stock_checked {
                Call("check_inventory")
            } else if task.in_stock {
                Call("create_exchange")
            } else {
                Call("create_return")
            }
        }
        Intent::UpdatePayment => {
            if p.did("update_payment_method") {
                Finish
            } else {
                match p.identity {
                    None => Call("verify_identity"),
                    Some(true) => Call("update_payment_method"),
                    Some(false) => Call("escalate_to_human"),
                }
            }
        }
    }
}

fn within_return_window(task: &Task) -> bool {
    let window = if task.tier == Tier::Gold {
        2 * RETURN_WINDOW_DAYS
    } else {
        RETURN_WINDOW_DAYS
    };
    matches!(task.target_order().status, Status::Delivered { days } if days <= window)
}

fn cancel_order(rules: RulesVersion, order: &Order, p: &Progress) -> Step {
    if p.asked {
        return Finish;
    }
    if p.did("cancel_order") || p.did("cancel_shipment") {
        // v2 stops the parcel, refunds separately and tells the customer; a cancelled order
        // refunds itself.
        return carrier_follow_up(
            rules,
            p,
            "cancel_shipment",
            &["refund_order", "send_message"],
        );
    }
    match order.status {
        Status::Processing => Call("cancel_order"),
        Status::Shipped { hours } => {
            shipped_change(rules, hours, "cancel_order", "cancel_shipment")
        }
        Status::Delivered { .. } => Call("ask_customer"),
    }
}

fn change_address(rules: RulesVersion, task: &Task, p: &Progress) -> Step {
    if p.asked || p.did("update_address") {
        return Finish;
    }
    if p.did("redirect_shipment") {
        return carrier_follow_up(rules, p, "redirect_shipment", &["send_message"]);
    }
    let order = task.target_order();
    if order.amount >= VERIFY_ADDRESS_MIN_AMOUNT {
        match p.identity {
            None => return Call("verify_identity"),
            Some(false) => return Call("escalate_to_human"),
            Some(true) => {}
        }
    }
    match order.status {
        Status::Processing => Call("update_address"),
        Status::Shipped { hours } => {
            shipped_change(rules, hours, "update_address", "redirect_shipment")
        }
        Status::Delivered { .. } => Call("ask_customer"),
    }
}

/// After a change to a shipped order: under `v2`, a carrier action is followed by its
/// follow-ups (refund, message to the customer) in order; otherwise the work is done.
fn carrier_follow_up(
    rules: RulesVersion,
    p: &Progress,
    carrier_tool: &str,
    follow_ups: &[&'static str],
) -> Step {
    if rules == RulesVersion::V2
        && p.did(carrier_tool)
        && let Some(&next) = follow_ups.iter().find(|&&t| !p.did(t))
    {
        return Call(next);
    }
    Finish
}

/// The one rule the versions disagree on: how to change an order that has shipped.
fn shipped_change(
    rules: RulesVersion,
    hours: u32,
    order_tool: &'static str,
    carrier_tool: &'static str,
) -> Step {
    match rules {
        RulesVersion::V1 if hours <= V1_SHIPPED_WINDOW_HOURS => Call(order_tool),
        RulesVersion::V2 if hours <= V2_CARRIER_WINDOW_HOURS => Call(carrier_tool),
        _ => Call("ask_customer"),
    }
}

/// Record a successful planned call.
pub(crate) fn apply(task: &Task, p: &mut Progress, tool: &'static str) {
    match tool {
        "list_orders" => p.listed = true,
        "lookup_order" => p.looked_up = true,
        "verify_identity" => p.identity = Some(task.identity_ok),
        "track_shipment" => p.tracked = true,
        "check_inventory" => p.stock_checked = true,
        "lookup_subscription" => p.subscription_looked_up = true,
        "ask_customer" => p.asked = true,
        "escalate_to_human" => p.escalated = true,
        _ => p.done.push(tool),
    }
}
