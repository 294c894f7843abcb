//! The simulated shop's fixed vocabulary: its tools (with their near-duplicates), the customer
//! intents, the items and order ids, and the handful of values each fact can take.
//!
//! Everything here is a closed list so that a word-level tokenizer built from the generated data
//! stays small, and every fact a rule reads takes only a few distinct values.

/// What a tool is about. Tools that share a family are the near-duplicates a model must tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Lookup,
    Cancel,
    Refund,
    Address,
    Shipping,
    Return,
    Subscription,
    Account,
    Talk,
}

/// One tool of the shop: its name (one `snake_case` word), whether it acts on an order id, and
/// the families it belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tool {
    pub name: &'static str,
    pub takes_order: bool,
    pub families: &'static [Family],
}

use Family::*;

const fn tool(name: &'static str, takes_order: bool, families: &'static [Family]) -> Tool {
    Tool {
        name,
        takes_order,
        families,
    }
}

/// The catalogue: 48 tools, `finish` last.
pub(crate) const TOOLS: &[Tool] = &[
    tool("lookup_order", true, &[Lookup]),
    tool("list_orders", false, &[Lookup]),
    tool("lookup_customer", false, &[Lookup, Account]),
    tool("lookup_shipment", true, &[Lookup, Shipping]),
    tool("lookup_payment", true, &[Lookup, Refund]),
    tool("lookup_return", true, &[Lookup, Return]),
    tool("lookup_subscription", false, &[Lookup, Subscription]),
    tool("lookup_invoice", true, &[Lookup, Refund]),
    tool("track_shipment", true, &[Lookup, Shipping]),
    tool("search_products", false, &[Lookup]),
    tool("check_inventory", true, &[Lookup, Return]),
    tool("get_policy", false, &[Lookup]),
    tool("cancel_order", true, &[Cancel]),
    tool("cancel_shipment", true, &[Cancel, Shipping]),
    tool("cancel_subscription", false, &[Cancel, Subscription]),
    tool("cancel_item", true, &[Cancel]),
    tool("cancel_return", true, &[Cancel, Return]),
    tool("refund_order", true, &[Refund, Cancel]),
    tool("refund_partial", true, &[Refund]),
    tool("refund_shipping", true, &[Refund, Shipping]),
    tool("issue_store_credit", false, &[Refund]),
    tool("issue_coupon", false, &[Refund]),
    tool("update_address", true, &[Address]),
    tool("update_billing_address", false, &[Address, Account]),
    tool("validate_address", false, &[Address]),
    tool("redirect_shipment", true, &[Address, Shipping]),
    tool("hold_shipment", true, &[Shipping]),
    tool("expedite_shipment", true, &[Shipping]),
    tool("reship_order", true, &[Shipping, Refund]),
    tool("create_return", true, &[Return]),
    tool("create_exchange", true, &[Return]),
    tool("send_return_label", true, &[Return]),
    tool("schedule_pickup", true, &[Return, Shipping]),
    tool("pause_subscription", false, &[Subscription]),
    tool("resume_subscription", false, &[Subscription]),
    tool("change_plan", false, &[Subscription]),
    tool("skip_delivery", false, &[Subscription, Shipping]),
    tool("verify_identity", false, &[Account]),
    tool("update_payment_method", false, &[Account, Refund]),
    tool("update_email", false, &[Account]),
    tool("reset_password", false, &[Account]),
    tool("close_account", false, &[Account, Cancel]),
    tool("send_message", false, &[Talk]),
    tool("ask_customer", false, &[Talk]),
    tool("escalate_to_human", false, &[Talk]),
    tool("add_note", false, &[Talk]),
    tool("create_ticket", false, &[Talk]),
    tool("finish", false, &[Talk]),
];

pub(crate) const FINISH: &str = "finish";
/// The stop point's second answer: keep working.
pub(crate) const CONTINUE: &str = "continue";

/// Options a host plausibly offers beside `finish` / `continue` at a stop point; never the
/// stop point's answer.
pub(crate) const STOP_PADS: &[&str] = &[
    "ask_customer",
    "escalate_to_human",
    "add_note",
    "create_ticket",
    "send_message",
];

pub(crate) fn tool_by_name(name: &str) -> &'static Tool {
    TOOLS
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("tool {name} is not in the catalogue"))
}

/// Tools sharing a family with `name` (its near-duplicates), in catalogue order, `finish` excluded.
pub(crate) fn near_duplicates(name: &str) -> impl Iterator<Item = &'static str> {
    let families = tool_by_name(name).families;
    TOOLS
        .iter()
        .filter(move |t| {
            t.name != name && t.name != FINISH && t.families.iter().any(|f| families.contains(f))
        })
        .map(|t| t.name)
}

/// What the customer wants. Weights (per 100 tasks) lean on order changes, as a real queue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    CancelOrder,
    ChangeAddress,
    RefundDamaged,
    RefundMissing,
    ReturnItem,
    WhereIsOrder,
    CancelSubscription,
    ExchangeItem,
    UpdatePayment,
}

pub(crate) const INTENTS: &[(Intent, u32)] = &[
    (Intent::CancelOrder, 32),
    (Intent::ChangeAddress, 22),
    (Intent::RefundDamaged, 7),
    (Intent::RefundMissing, 6),
    (Intent::ReturnItem, 9),
    (Intent::WhereIsOrder, 9),
    (Intent::CancelSubscription, 7),
    (Intent::ExchangeItem, 4),
    (Intent::UpdatePayment, 4),
];

impl Intent {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Intent::CancelOrder => "cancel_order",
            Intent::ChangeAddress => "change_address",
            Intent::RefundDamaged => "refund_damaged",
            Intent::RefundMissing => "refund_missing",
            Intent::ReturnItem => "return_item",
            Intent::WhereIsOrder => "where_is_order",
            Intent::CancelSubscription => "cancel_subscription",
            Intent::ExchangeItem => "exchange_item",
            Intent::UpdatePayment => "update_payment",
        }
    }

    /// Whether the task is about one of the customer's orders (and so starts by finding it).
    pub(crate) fn about_order(self) -> bool {
        !matches!(self, Intent::CancelSubscription | Intent::UpdatePayment)
    }

    /// The customer's opening message; `{ref}` stands for how the order is named.
    pub(crate) fn openings(self) -> &'static [&'static str] {
        match self {
            Intent::CancelOrder => &[
                "i want to cancel {ref} .",
                "please cancel {ref} , i do not need it anymore .",
                "can you cancel {ref} for me ?",
            ],
            Intent::ChangeAddress => &[
                "please change the delivery address for {ref} , i moved .",
                "i need {ref} sent to my new address .",
            ],
            Intent::RefundDamaged => &[
                "{ref} arrived damaged , i want my money back .",
                "{ref} came broken , please refund it .",
            ],
            Intent::RefundMissing => &[
                "{ref} never arrived , i want a refund .",
                "i did not get {ref} , please refund me .",
            ],
            Intent::ReturnItem => &[
                "i want to return {ref} .",
                "i do not like {ref} , can i send it back ?",
            ],
            Intent::WhereIsOrder => &["where is {ref} ?", "when will {ref} arrive ?"],
            Intent::CancelSubscription => &[
                "please cancel my subscription .",
                "i want to stop my subscription .",
            ],
            Intent::ExchangeItem => &[
                "{ref} is the wrong size , i want to exchange it .",
                "can i swap {ref} for another size ?",
            ],
            Intent::UpdatePayment => &[
                "my card expired , please update my payment method .",
                "i want to change the card on my account .",
            ],
        }
    }
}

/// What a customer buys; a task refers to an order by its id or by its item.
pub(crate) const ITEMS: &[&str] = &[
    "lamp",
    "kettle",
    "chair",
    "desk",
    "jacket",
    "shoes",
    "blender",
    "headphones",
    "backpack",
    "mug",
    "rug",
    "clock",
    "mirror",
    "pillow",
    "toaster",
    "watch",
];

/// Order ids come from a small pool: `ord_101` ..= `ord_160`.
pub(crate) const ORDER_ID_FIRST: u16 = 101;
pub(crate) const ORDER_ID_COUNT: u16 = 60;

pub(crate) fn order_id(n: u16) -> String {
    format!("ord_{n}")
}

/// Hours since an order shipped: a handful of values around the 24 h and 48 h windows.
pub(crate) const HOURS_SINCE_SHIP: &[u32] = &[2, 5, 12, 20, 30, 48, 72];
/// Days since delivery, around the 30-day (60 for gold) return window.
pub(crate) const DAYS_SINCE_DELIVERY: &[u32] = &[2, 6, 12, 20, 35, 50, 90];
/// Order amounts; rules look at `<= 60` and `>= 150`.
pub(crate) const AMOUNTS: &[u32] = &[15, 25, 40, 60, 90, 150, 300];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    Basic,
    Silver,
    Gold,
}

impl Tier {
    pub(crate) const ALL: [Tier; 3] = [Tier::Basic, Tier::Silver, Tier::Gold];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Tier::Basic => "basic",
            Tier::Silver => "silver",
            Tier::Gold => "gold",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_has_forty_tools_with_unique_single_word_names() {
        assert!(TOOLS.len() >= 40, "{} tools", TOOLS.len());
        let mut names: Vec<_> = TOOLS.iter().map(|t| t.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TOOLS.len(), "duplicate tool names");
        for name in names {
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
        }
        for required in [
            "cancel_order",
            "cancel_shipment",
            "cancel_subscription",
            "refund_order",
        ] {
            tool_by_name(required);
        }
        assert!(INTENTS.len() >= 6);
    }

    #[test]
    fn near_duplicates_share_a_family() {
        let dups: Vec<_> = near_duplicates("cancel_order").collect();
        assert!(dups.contains(&"cancel_shipment") && dups.contains(&"cancel_subscription"));
        assert!(!dups.contains(&"cancel_order") && !dups.contains(&"finish"));
    }
}
