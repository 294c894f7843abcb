//! The wgpu backend runs the same model as the CPU backend. On a machine without a GPU this uses
//! Mesa's lavapipe Vulkan driver (`.ci/run` installs `mesa-vulkan-drivers`). On a machine with no
//! Vulkan adapter at all the test says NOT RUN and passes, unless `$DECISION_REQUIRE_CHECKERS`
//! names `vulkan` (as `.ci/run` does), where it fails.
#![cfg(feature = "wgpu")]

use std::path::Path;

use decision_data::State;
use decision_train::{Backend, DecisionModel, LoadOptions};

#[path = "../../tests/support/checkers.rs"]
mod checkers;

fn state(id: &str, context: &str, options: &[&str]) -> State {
    let candidates = options.iter().map(|o| (o.to_string(), o.to_string()));
    State::unlabelled(id, "tool", context, candidates)
}

#[test]
fn wgpu_scores_like_the_cpu_backend() {
    if std::env::var_os("CUBECL_AUTOTUNE_LEVEL").is_none() {
        // Kernel autotuning on a software driver costs far more than it saves for a tiny model.
        // SAFETY: this test binary holds this one test; nothing else reads the environment yet.
        unsafe { std::env::set_var("CUBECL_AUTOTUNE_LEVEL", "minimal") };
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model/untied-gqa3");
    let src = dir.to_str().unwrap();
    let cpu = DecisionModel::load(src, &LoadOptions::default()).unwrap();
    let gpu = match DecisionModel::load(
        src,
        &LoadOptions {
            backend: Backend::Wgpu,
            ..Default::default()
        },
    ) {
        Ok(m) => m,
        Err(e) if format!("{e:#}").contains("no usable GPU adapter") => {
            checkers::not_run(
                "wgpu_scores_like_the_cpu_backend",
                "vulkan",
                &format!("{e:#}"),
            );
            return;
        }
        Err(e) => panic!("loading the model on wgpu: {e:#}"),
    };
    let states = vec![
        state(
            "a",
            "user asks to cancel order ord_117",
            &["lookup_order", "cancel_order"],
        ),
        state(
            "b",
            "the agent called search_docs and got 3 results",
            &["refund_order", "ask_user", "stop"],
        ),
        state("c", "cancel", &["cancel_order", "lookup_order"]),
    ];
    let want = cpu.score(&states, 3).unwrap();
    let got = gpu.score(&states, 3).unwrap();
    let mut worst = 0f64;
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.pick_index, g.pick_index);
        assert_eq!(w.logits.len(), g.logits.len());
        for (a, b) in w.logits.iter().zip(&g.logits) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("wgpu vs cpu: max |Δlogit| {worst:.2e}");
    // Different kernels and summation orders in f32: 1e-4 on O(1) logits.
    assert!(worst < 1e-4, "wgpu logits differ from cpu by {worst}");
}
