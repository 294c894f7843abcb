//! How a task looks to the agent: the customer's message and one terse line per tool call with
//! its result. The format is regular and word-level friendly (ids and tool names are single
//! words, punctuation stands apart):
//!
//! `customer : i want to cancel the lamp order . tool list_orders -> ord_117 lamp , ord_142 kettle .
//! tool lookup_order ord_117 -> status shipped hours_since_ship 12 amount 40 tier gold .`

use super::catalogue::{Family, Intent, order_id, tool_by_name};
use super::rules::{Order, Status, Task, Track};

/// What the customer answers when an injected mistake asks them something needless.
pub(crate) const NEEDLESS_ASK_REPLY: &str = "customer : i already told you , please go ahead";
/// What the customer answers when the agent finishes too early.
pub(crate) const EARLY_FINISH_REPLY: &str = "customer : my problem is not solved yet";

/// The opening of every context: the customer's message.
pub(crate) fn opening(task: &Task) -> String {
    let template = task.intent.openings()[task.opening];
    let order = task.target_order();
    let reference = if task.by_item {
        format!("the {} order", order.item)
    } else {
        format!("order {}", order_id(order.num))
    };
    format!("customer : {}", template.replace("{ref}", &reference))
}

/// One history line: `tool NAME [ORDER] -> RESULT .`
pub(crate) fn call_line(tool: &str, order: Option<u16>, result: &str) -> String {
    match order {
        Some(num) => format!("tool {tool} {} -> {result} .", order_id(num)),
        None => format!("tool {tool} -> {result} ."),
    }
}

/// The pending call an `args` decision completes: `tool NAME ?`.
pub(crate) fn pending_call(tool: &str) -> String {
    format!("tool {tool} ?")
}

/// What `lookup_order` shows for an order.
pub(crate) fn order_facts(order: &Order, task: &Task) -> String {
    let status = match order.status {
        Status::Processing => "status processing".to_string(),
        Status::Shipped { hours } => format!("status shipped hours_since_ship {hours}"),
        Status::Delivered { days } => format!("status delivered days_since_delivery {days}"),
    };
    format!("{status} amount {} tier {}", order.amount, task.tier.name())
}

/// The result of a successful planned call on the task's target order.
pub(crate) fn planned_result(task: &Task, tool: &str) -> String {
    match tool {
        "list_orders" => task
            .orders
            .iter()
            .map(|o| format!("{} {}", order_id(o.num), o.item))
            .collect::<Vec<_>>()
            .join(" , "),
        "lookup_order" => order_facts(task.target_order(), task),
        "verify_identity" => (if task.identity_ok {
            "verified"
        } else {
            "not_verified"
        })
        .into(),
        "track_shipment" => match task.track {
            Track::InTransit => "in_transit",
            Track::Delayed => "delayed",
            Track::Lost => "lost",
        }
        .into(),
        "check_inventory" => (if task.in_stock {
            "in_stock"
        } else {
            "out_of_stock"
        })
        .into(),
        "lookup_subscription" => {
            format!(
                "plan {} status active",
                if task.yearly_plan {
                    "yearly"
                } else {
                    "monthly"
                }
            )
        }
        "ask_customer" => ask_reply(task).into(),
        "escalate_to_human" => "ok ticket_open".into(),
        "send_message" => "ok sent".into(),
        _ => "ok".into(),
    }
}

/// The customer's answer to a question the plan asks.
fn ask_reply(task: &Task) -> &'static str {
    match task.intent {
        Intent::CancelOrder => match task.target_order().status {
            Status::Delivered { .. } => "customer : ok , i will send it back",
            _ => "customer : ok , i will return it when it arrives",
        },
        Intent::ChangeAddress => "customer : ok , i will pick it up there",
        Intent::CancelSubscription if task.wants_pause => "customer : ok , pause it instead",
        Intent::CancelSubscription => "customer : no , please cancel it",
        _ => "customer : ok , i understand",
    }
}

/// The result of a wrong tool the agent called by mistake: the shop refuses it.
pub(crate) fn mistake_result(tool: &str) -> String {
    if tool == "ask_customer" {
        NEEDLESS_ASK_REPLY.into()
    } else if tool_by_name(tool).families.contains(&Family::Lookup) {
        "error not_found".into()
    } else {
        "error not_allowed".into()
    }
}
