//! Generator tests: determinism, the contract's rules, the answer key, the v1/v2 difference, and
//! the shares the issue asks for, each within a stated band.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use super::*;
use crate::validate::check_state;

fn opts(rules: RulesVersion, tasks: usize, seed: u64) -> GenOptions {
    GenOptions {
        rules,
        tasks,
        seed,
        ..GenOptions::default()
    }
}

fn annotated(rules: RulesVersion, tasks: usize) -> Vec<Generated> {
    generate_annotated(&opts(rules, tasks, 7)).unwrap()
}

/// 2000 tasks of seed 7 per version (the demo's size), made once for the tests that measure
/// shares.
fn demo_size(rules: RulesVersion) -> &'static [Generated] {
    static V1: OnceLock<Vec<Generated>> = OnceLock::new();
    static V2: OnceLock<Vec<Generated>> = OnceLock::new();
    let cell = if rules == RulesVersion::V1 { &V1 } else { &V2 };
    cell.get_or_init(|| annotated(rules, 2000))
}

fn json_bytes(states: &[State]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in states {
        serde_json::to_writer(&mut out, s).unwrap();
        out.push(b'\n');
    }
    out
}

fn share(part: usize, whole: usize) -> f64 {
    part as f64 / whole as f64
}

fn argmax(p: &[f64]) -> usize {
    (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap()
}

/// Words as the word-level tokenizer splits them: `\w+|[^\w\s]+`.
fn words(text: &str) -> Vec<&str> {
    static WORD: OnceLock<regex::Regex> = OnceLock::new();
    let re = WORD.get_or_init(|| regex::Regex::new(r"\w+|[^\w\s]+").unwrap());
    re.find_iter(text).map(|m| m.as_str()).collect()
}

#[test]
fn same_seed_gives_identical_bytes_and_another_seed_does_not() {
    for rules in [RulesVersion::V1, RulesVersion::V2] {
        let a = json_bytes(&generate(&opts(rules, 150, 11)).unwrap());
        let b = json_bytes(&generate(&opts(rules, 150, 11)).unwrap());
        assert!(a == b, "{rules}: two runs with seed 11 differ");
        let c = json_bytes(&generate(&opts(rules, 150, 12)).unwrap());
        assert!(a != c, "{rules}: seeds 11 and 12 gave the same states");
    }
    // A task does not depend on how many tasks are generated.
    let few = generate(&opts(RulesVersion::V1, 20, 11)).unwrap();
    let many = generate(&opts(RulesVersion::V1, 150, 11)).unwrap();
    assert_eq!(few[..], many[..few.len()]);
}

#[test]
fn every_state_keeps_the_contract_and_the_answer_is_offered() {
    let mut ids = BTreeSet::new();
    let mut split_of_task: BTreeMap<String, String> = BTreeMap::new();
    for rules in [RulesVersion::V1, RulesVersion::V2] {
        for g in annotated(rules, 400) {
            let s = &g.state;
            let errors = check_state(s, 16);
            assert!(errors.is_empty(), "{}: {errors:?}", s.id);
            assert!(
                ids.insert(s.id.clone()),
                "duplicate id {} across v1 + v2",
                s.id
            );
            let answer = s.answer.as_deref().unwrap();
            assert!(
                s.candidates.iter().any(|c| c.id == answer),
                "{}: answer not offered",
                s.id
            );
            assert!(
                (4..=16).contains(&s.candidates.len()),
                "{}: {} options",
                s.id,
                s.candidates.len()
            );
            // The label is the id, or for an order the context shows, the id and its item.
            assert!(s.candidates.iter().all(|c| c.label == c.id
                || (s.point == "args"
                    && c.label.split_once(' ').is_some_and(|(id, item)| id == c.id
                        && !item.contains(' ')
                        && s.context.contains(id)))));
            assert!(
                ["tool", "args", "stop"].contains(&s.point.as_str()),
                "{}",
                s.point
            );
            assert_eq!(s.rules.as_deref(), Some(rules.as_str()));
            let teacher = s.teacher.as_ref().unwrap();
            assert_eq!(teacher.len(), s.candidates.len());
            assert!(
                (teacher.iter().sum::<f64>() - 1.0).abs() <= 1e-9,
                "{}: {teacher:?}",
                s.id
            );
            let answer_here = if rules == RulesVersion::V1 {
                &g.answer_v1
            } else {
                &g.answer_v2
            };
            assert_eq!(
                answer_here, answer,
                "{}: annotation disagrees with the answer",
                s.id
            );
            // A task is never in two splits, and v1 and v2 put a task in the same one.
            let split = s.split.clone().unwrap();
            let first = split_of_task
                .entry(s.task_id.clone())
                .or_insert_with(|| split.clone());
            assert_eq!(*first, split, "task {} in two splits", s.task_id);
        }
    }
}

#[test]
fn the_answer_is_decided_by_what_the_model_sees() {
    // No label noise: the same point and context never carry two different answers, and the
    // stop point only ever answers finish or continue.
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    for g in demo_size(RulesVersion::V1) {
        let s = g.state.clone();
        let answer = s.answer.unwrap();
        if s.point == "stop" {
            assert!(
                answer == "finish" || answer == "continue",
                "{}: {answer}",
                s.id
            );
        }
        if let Some(previous) = seen.insert((s.point, s.context.clone()), answer.clone()) {
            assert_eq!(
                previous, answer,
                "two answers for the context {:?}",
                s.context
            );
        }
    }
}

#[test]
fn v1_and_v2_differ_exactly_on_the_states_the_changed_rule_touches() {
    let tasks = 2000;
    let (v1, v2) = (demo_size(RulesVersion::V1), demo_size(RulesVersion::V2));
    let by_task = |gs: &[Generated]| {
        let mut m: BTreeMap<String, Vec<Generated>> = BTreeMap::new();
        for g in gs {
            m.entry(g.state.task_id.clone())
                .or_default()
                .push(g.clone());
        }
        m
    };
    let (t1, t2) = (by_task(v1), by_task(v2));
    assert_eq!(t1.len(), tasks);
    assert_eq!(t1.keys().collect::<Vec<_>>(), t2.keys().collect::<Vec<_>>());
    let (mut paired, mut paired_touched) = (0, 0);
    for (task, a) in &t1 {
        let b = &t2[task];
        // Walk both versions side by side while they show the agent the same thing.
        let mut diverged = false;
        for (x, y) in a.iter().zip(b) {
            let (sx, sy) = (&x.state, &y.state);
            if sx.point != sy.point || sx.context != sy.context {
                diverged = true;
                break;
            }
            paired += 1;
            assert_eq!(x.touched(), y.touched(), "{}: touched disagrees", sx.id);
            assert_eq!(
                (&x.answer_v1, &x.answer_v2),
                (&y.answer_v1, &y.answer_v2),
                "{}",
                sx.id
            );
            if x.touched() {
                paired_touched += 1;
                assert_ne!(
                    sx.answer, sy.answer,
                    "{} touched but both answer the same",
                    sx.id
                );
                // The other version's answer is offered, so a model that learnt it can be wrong.
                assert!(
                    sy.candidates
                        .iter()
                        .any(|c| Some(&c.id) == sx.answer.as_ref())
                );
            } else {
                // Untouched: everything but the rules tag and the id is the same.
                assert_eq!(
                    sx.answer, sy.answer,
                    "{}: answers differ but untouched",
                    sx.id
                );
                assert_eq!(sx.candidates, sy.candidates, "{}", sx.id);
                assert_eq!(sx.teacher, sy.teacher, "{}", sx.id);
                assert_eq!(sx.after_error, sy.after_error, "{}", sx.id);
            }
        }
        let touched_before = a.iter().take_while(|g| !g.touched()).count() < a.len();
        if diverged || a.len() != b.len() {
            // Histories only part after the changed rule decided something differently.
            assert!(
                touched_before,
                "task {task} diverged without a touched state"
            );
        }
        // Every touched state is about a shipped order that a customer wants cancelled or
        // re-addressed: the only situation the changed rule speaks to.
        for g in a.iter().chain(b).filter(|g| g.touched()) {
            assert!(
                matches!(g.intent, "cancel_order" | "change_address"),
                "{}",
                g.state.id
            );
            assert!(g.state.context.contains("status shipped"), "{}", g.state.id);
        }
        if !a.iter().chain(b).any(Generated::touched) {
            assert!(
                !diverged && a.len() == b.len(),
                "task {task} differs but nothing touched"
            );
        }
    }
    assert!(
        paired_touched > 100,
        "only {paired_touched} touched states were compared"
    );
    assert!(paired > v1.len() / 2);

    let touched_v2 = v2.iter().filter(|g| g.touched()).count();
    let touched_share = share(touched_v2, v2.len());
    eprintln!(
        "v2 states touched by the changed rule: {touched_v2} of {} = {touched_share:.3}",
        v2.len()
    );
    assert!(
        (0.15..=0.30).contains(&touched_share),
        "v2 touched share {touched_share:.3}"
    );
}

#[test]
fn touched_is_recovered_from_a_state_alone() {
    let v2 = annotated(RulesVersion::V2, 60);
    assert!(v2.iter().any(Generated::touched));
    for g in &v2 {
        assert_eq!(
            rule_change_group(&g.state) == Some("touched"),
            g.touched(),
            "{}",
            g.state.id
        );
        assert_eq!(replay(&g.state).as_ref(), Some(g));
    }
    let mut foreign = v2[0].state.clone();
    foreign.context.push_str(" tool finish -> ok .");
    assert_eq!(rule_change_group(&foreign), None);
    foreign.task_id = "episode-1".into();
    assert_eq!(rule_change_group(&foreign), None);
}

/// Figures over 2000 tasks of one version, as the report and the bands below use them.
struct Figures {
    states: usize,
    per_point: BTreeMap<String, usize>,
    after_error: usize,
    teacher_right: usize,
    options: (usize, usize),
    max_words: usize,
    max_prompt_tokens: usize,
}

fn figures(gs: &[Generated]) -> Figures {
    let mut f = Figures {
        states: gs.len(),
        per_point: BTreeMap::new(),
        after_error: 0,
        teacher_right: 0,
        options: (usize::MAX, 0),
        max_words: 0,
        max_prompt_tokens: 0,
    };
    for g in gs {
        let s = &g.state;
        *f.per_point.entry(s.point.clone()).or_default() += 1;
        f.after_error += usize::from(s.after_error);
        f.teacher_right +=
            usize::from(Some(argmax(s.teacher.as_ref().unwrap())) == s.answer_index());
        f.options = (
            f.options.0.min(s.candidates.len()),
            f.options.1.max(s.candidates.len()),
        );
        let context_words = words(&s.context).len();
        f.max_words = f.max_words.max(context_words);
        // Prompt: point, context, then `A . label` per option and a few template words.
        let prompt = 2 + context_words + 3 * s.candidates.len() + 4;
        f.max_prompt_tokens = f.max_prompt_tokens.max(prompt);
    }
    f
}

#[test]
fn shares_are_as_specified() {
    for rules in [RulesVersion::V1, RulesVersion::V2] {
        let f = figures(demo_size(rules));
        let per_point: Vec<String> = f
            .per_point
            .iter()
            .map(|(p, n)| format!("{p} {:.3}", share(*n, f.states)))
            .collect();
        let after_error = share(f.after_error, f.states);
        let teacher = share(f.teacher_right, f.states);
        eprintln!(
            "{rules}: {} states; {}; after_error {after_error:.3}; teacher right {teacher:.3}; \
             options {}..={}; context words <= {}; prompt tokens <= {}",
            f.states,
            per_point.join(", "),
            f.options.0,
            f.options.1,
            f.max_words,
            f.max_prompt_tokens
        );
        assert!(
            (0.27..=0.33).contains(&after_error),
            "{rules}: after_error share {after_error:.3}"
        );
        assert!(
            (0.82..=0.88).contains(&teacher),
            "{rules}: teacher accuracy {teacher:.3}"
        );
        assert_eq!(f.options, (4, 16), "{rules}: option counts span 4..=16");
        for point in ["tool", "args", "stop"] {
            let s = share(f.per_point[point], f.states);
            assert!(s >= 0.15, "{rules}: point {point} only {s:.3} of states");
        }
        assert!(
            f.max_prompt_tokens <= 200,
            "{rules}: a prompt of {} tokens",
            f.max_prompt_tokens
        );
    }
}

#[test]
fn the_teacher_is_confidently_wrong_where_it_should_ask() {
    let asks: Vec<&State> = demo_size(RulesVersion::V1)
        .iter()
        .filter(|g| matches!(g.intent, "cancel_order" | "cancel_subscription"))
        .map(|g| &g.state)
        .filter(|s| s.point == "tool" && s.answer.as_deref() == Some("ask_customer"))
        .collect();
    assert!(
        asks.len() > 30,
        "{} ask states in cancellations",
        asks.len()
    );
    for s in asks {
        let t = s.teacher.as_ref().unwrap();
        let top = argmax(t);
        assert!(
            s.candidates[top].id.starts_with("cancel_"),
            "{}: teacher picked {}",
            s.id,
            s.candidates[top].id
        );
        assert!(t[top] >= 0.69, "{}: not confident ({})", s.id, t[top]);
    }
}

#[test]
fn vocabulary_is_small_and_closed() {
    let mut vocab = BTreeSet::new();
    for rules in [RulesVersion::V1, RulesVersion::V2] {
        for s in demo_size(rules).iter().map(|g| &g.state) {
            vocab.extend(words(&s.context).into_iter().map(str::to_string));
            vocab.extend(
                s.candidates
                    .iter()
                    .flat_map(|c| words(&c.label))
                    .map(str::to_string),
            );
        }
    }
    eprintln!("distinct words over v1 + v2: {}", vocab.len());
    assert!(vocab.len() < 1500, "{} distinct words", vocab.len());
    assert!(vocab.iter().all(|w| {
        w.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_:,.?->".contains(c))
    }));
}

#[test]
fn bad_split_ratios_are_refused() {
    let mut o = opts(RulesVersion::V1, 5, 1);
    o.splits = SplitRatios {
        train: 0.8,
        valid: 0.1,
        test: 0.05,
    };
    assert!(generate(&o).is_err());
    o.splits = SplitRatios {
        train: 1.0,
        valid: 0.0,
        test: 0.0,
    };
    assert!(
        generate(&o)
            .unwrap()
            .iter()
            .all(|s| s.split.as_deref() == Some("train"))
    );
}

#[test]
fn after_an_error_the_answer_recovers() {
    // The state right after an injected mistake shows the failed call last and answers with the
    // plan's move, never the failed tool again.
    let gs = demo_size(RulesVersion::V2);
    let mut checked = 0;
    for pair in gs.windows(2) {
        let (before, after) = (&pair[0].state, &pair[1].state);
        if before.task_id != after.task_id || before.after_error || !after.after_error {
            continue;
        }
        checked += 1;
        assert_eq!(after.point, "tool", "{}", after.id);
        let last = after.context.rsplit(" tool ").next().unwrap();
        let failed = words(last)[0];
        assert!(
            last.contains("error")
                || last.contains("already told you")
                || last.contains("not solved")
                || last.starts_with("lookup_order"),
            "{}: {last}",
            after.id
        );
        if after.point == "tool" && failed != "lookup_order" {
            assert_ne!(after.answer.as_deref(), Some(failed), "{}", after.id);
        }
    }
    assert!(checked > 100, "{checked}");
}

/// The three rule-change groups against a direct comparison of the two versions' states: a
/// v1 state is `untouched` exactly when v2 has a state of the same task and point with the same
/// context and the same answer, `diverged` when no v2 state has its context, `touched` when the
/// answers differ.
#[test]
fn rule_change_groups_match_the_other_versions_states() {
    let v1 = annotated(RulesVersion::V1, 60);
    let v2 = annotated(RulesVersion::V2, 60);
    let key = |s: &State| (s.task_id.clone(), s.point.clone(), s.context.clone());
    let in_v2: std::collections::HashMap<_, String> = v2
        .iter()
        .map(|g| (key(&g.state), g.state.answer.clone().unwrap()))
        .collect();
    let mut seen = BTreeMap::new();
    for g in &v1 {
        let s = &g.state;
        let group = rule_change_group(s).unwrap();
        let expected = match in_v2.get(&key(s)) {
            _ if g.touched() => "touched",
            Some(answer) if Some(answer) == s.answer.as_ref() => "untouched",
            Some(_) => "touched",
            None => "diverged",
        };
        assert_eq!(group, expected, "{}", s.id);
        *seen.entry(group).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 3, "every group occurs in 60 tasks: {seen:?}");
}

/// Drive an episode with `policy` (state → chosen id) to its end.
fn drive(ep: &mut Episode, mut policy: impl FnMut(&Generated) -> String) -> End {
    while let Some(g) = ep.state() {
        let choice = policy(g);
        ep.act(&choice).unwrap();
    }
    ep.end().unwrap()
}

#[test]
fn an_episode_driven_by_the_answer_key_always_succeeds() {
    for rules in [RulesVersion::V1, RulesVersion::V2] {
        for index in 0..400 {
            let mut ep = Episode::new(rules, 31, index, "test");
            let end = drive(&mut ep, |g| g.state.answer.clone().unwrap());
            assert_eq!(end, End::Success, "{rules} task {index}");
            // The answer key's walk meets no error and stays well inside the budget.
            let trajectory = ep.trajectory();
            assert!(trajectory.iter().all(|g| !g.state.after_error));
            assert!(ep.steps() < MAX_STEPS / 2, "{} steps", ep.steps());
            assert_eq!(ep.choices().len(), ep.steps());
        }
    }
}

#[test]
fn a_wrong_irreversible_action_always_fails_the_task() {
    let mut tried = 0;
    for rules in [RulesVersion::V1, RulesVersion::V2] {
        for index in 0..300 {
            // Follow the key to the first tool state offering an irreversible tool that is not
            // the answer, then take it.
            let mut ep = Episode::new(rules, 32, index, "test");
            let mut wrong = None;
            while let Some(g) = ep.state() {
                let answer = g.state.answer.clone().unwrap();
                let bad = (g.state.point == "tool")
                    .then(|| {
                        g.state
                            .candidates
                            .iter()
                            .find(|c| irreversible(&c.id) && c.id != answer)
                    })
                    .flatten();
                match bad {
                    Some(c) => {
                        wrong = Some(c.id.clone());
                        ep.act(&c.id.clone()).unwrap();
                        break;
                    }
                    None => ep.act(&answer).unwrap(),
                }
            }
            if let Some(w) = wrong {
                tried += 1;
                assert_eq!(
                    ep.end(),
                    Some(End::Failure(Failure::IrreversibleTool)),
                    "{rules} task {index}: {w}"
                );
                assert!(ep.state().is_none() && ep.act(&w).is_err());
            }
        }
    }
    assert!(
        tried > 400,
        "only {tried} episodes offered a wrong irreversible tool"
    );

    // The right irreversible tool on the wrong order fails too; a lookup on it costs a step.
    let (mut wrong_order, mut wrong_lookup) = (0, 0);
    for lookup in [false, true] {
        for index in 0..300 {
            let mut ep = Episode::new(RulesVersion::V1, 33, index, "test");
            let mut last_tool = String::new();
            while let Some(g) = ep.state() {
                let s = &g.state;
                let answer = s.answer.clone().unwrap();
                let aim = if lookup {
                    last_tool == "lookup_order"
                } else {
                    irreversible(&last_tool)
                };
                if s.point == "args" && aim {
                    let other = s.candidates.iter().find(|c| c.id != answer).unwrap();
                    let other = other.id.clone();
                    ep.act(&other).unwrap();
                    if lookup {
                        wrong_lookup += 1;
                        let next = ep.state().expect("a wrong lookup costs a step");
                        assert!(next.state.after_error);
                        let line = format!("tool lookup_order {other} ->");
                        assert!(next.state.context.contains(&line), "{}", next.state.context);
                    } else {
                        wrong_order += 1;
                        let end = ep.end();
                        assert_eq!(end, Some(End::Failure(Failure::IrreversibleWrongOrder)));
                    }
                    break;
                }
                if s.point == "tool" {
                    last_tool = answer.clone();
                }
                ep.act(&answer).unwrap();
            }
        }
    }
    assert!(
        wrong_order > 50 && wrong_lookup > 50,
        "{wrong_order} {wrong_lookup}"
    );
}

#[test]
fn finishing_early_fails_and_never_finishing_runs_out_of_steps() {
    let mut early = 0;
    for index in 0..200 {
        let mut ep = Episode::new(RulesVersion::V2, 34, index, "test");
        let end = drive(&mut ep, |g| {
            let a = g.state.answer.clone().unwrap();
            if g.state.point == "stop" && a == "continue" {
                "finish".into()
            } else {
                a
            }
        });
        if ep
            .trajectory()
            .iter()
            .any(|g| g.state.answer.as_deref() == Some("continue"))
        {
            early += 1;
            assert_eq!(end, End::Failure(Failure::PrematureFinish), "task {index}");
        } else {
            assert_eq!(end, End::Success);
        }
        let mut ep = Episode::new(RulesVersion::V2, 34, index, "test");
        let end = drive(&mut ep, |g| {
            let a = g.state.answer.clone().unwrap();
            if a == "finish" { "continue".into() } else { a }
        });
        assert_eq!(end, End::Failure(Failure::StepBudget));
        assert_eq!(ep.steps(), MAX_STEPS);
        assert!(ep.trajectory().last().unwrap().state.after_error);
    }
    assert!(early > 50, "{early}");
}

#[test]
fn the_environment_shows_the_states_gen_states_records_for_the_same_history() {
    let (mut full, mut cut) = (0, 0);
    for rules in [RulesVersion::V1, RulesVersion::V2] {
        let opts = opts(rules, 500, 7);
        for index in 0..500u64 {
            let split = opts.splits.split_of_task(&task_id(7, index));
            let recorded = task_states(rules, 7, index, split.as_str());
            let (_, drafts, choices) = episode::walk_traced(rules, 7, index);
            assert_eq!(drafts.len(), recorded.len());
            assert_eq!(choices.len(), recorded.len(), "one choice per state");
            let mut ep = Episode::new(rules, 7, index, split.as_str());
            let mut n = 0;
            while let Some(g) = ep.state() {
                assert_eq!(g, &recorded[n], "{rules} task {index} state {n}");
                ep.act(&choices[n]).unwrap();
                n += 1;
            }
            if n == recorded.len() {
                full += 1;
                assert_eq!(ep.end(), Some(End::Success), "{rules} task {index}");
            } else {
                // The generator's agent survives mistakes the environment does not forgive:
                // a premature finish, an irreversible wrong tool.
                cut += 1;
                let fatal = &choices[n - 1];
                match ep.end() {
                    Some(End::Failure(Failure::PrematureFinish)) => assert_eq!(fatal, "finish"),
                    Some(End::Failure(Failure::IrreversibleTool)) => {
                        assert!(irreversible(fatal), "{fatal}")
                    }
                    other => panic!("{rules} task {index}: ended {other:?} at state {n}"),
                }
            }
        }
    }
    // Most recorded histories replay to the end, mistakes included.
    assert!(
        full > 800 && cut > 20,
        "{full} replayed in full, {cut} cut short"
    );
}
