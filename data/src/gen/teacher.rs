//! A simulated teacher: the probabilities an LLM such as Jev would give the options. Usually
//! right and sure of itself, sometimes wrong and hesitant, and confidently wrong on one slice:
//! it acts (cancels, returns, re-addresses) where the rules say to ask the customer first.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// How the teacher sees one state.
pub(crate) struct TeacherView<'a> {
    /// Number of options.
    pub options: usize,
    /// Index of the answer.
    pub answer: usize,
    /// Index of the option the teacher systematically prefers here, when the state is in the
    /// confidently-wrong slice.
    pub slice_pick: Option<usize>,
    /// Indices of the most plausible wrong options (near-duplicates of the answer), best first.
    pub plausible: &'a [usize],
    /// Chance of ranking the answer first outside the slice.
    pub p_right: f64,
}

/// A probability per option, rounded to 4 decimals, each in [0, 1], summing to 1.
pub(crate) fn teacher_probs(rng: &mut ChaCha8Rng, view: &TeacherView<'_>) -> Vec<f64> {
    let n = view.options;
    debug_assert!(n >= 3 && view.answer < n);
    let pick_wrong = |rng: &mut ChaCha8Rng| -> usize {
        match view.plausible.first() {
            Some(&i) if rng.random_bool(0.7) => i,
            _ => {
                let i = rng.random_range(0..n - 1);
                if i >= view.answer { i + 1 } else { i }
            }
        }
    };
    // (top option, its probability, runner-up option)
    let (top, p_top, second) = match view.slice_pick {
        Some(pick) => (pick, 0.70 + 0.25 * rng.random::<f64>(), view.answer),
        None if rng.random_bool(view.p_right) => {
            let u: f64 = rng.random();
            (view.answer, 0.99 - 0.49 * u * u, pick_wrong(rng))
        }
        None => {
            let wrong = pick_wrong(rng);
            (wrong, 0.5 + 0.35 * rng.random::<f64>(), view.answer)
        }
    };
    let rest = 1.0 - p_top;
    let p_second = rest * (0.5 + 0.4 * rng.random::<f64>());
    let others: Vec<usize> = (0..n).filter(|&i| i != top && i != second).collect();
    let weights: Vec<f64> = others
        .iter()
        .map(|_| rng.random::<f64>().powi(3) + 1e-3)
        .collect();
    let total: f64 = weights.iter().sum();
    let mut probs = vec![0.0; n];
    probs[second] = p_second;
    for (&i, w) in others.iter().zip(&weights) {
        probs[i] = (rest - p_second) * w / total;
    }
    // Round for compact files; the top option absorbs the rounding so the sum stays 1.
    for (i, p) in probs.iter_mut().enumerate() {
        if i != top {
            *p = ((*p * 1e4).round() / 1e4).max(1e-4);
        }
    }
    let others_sum: f64 = probs
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != top)
        .map(|(_, p)| p)
        .sum();
    probs[top] = ((1.0 - others_sum) * 1e4).round() / 1e4;
    probs
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn argmax(p: &[f64]) -> usize {
        (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap()
    }

    #[test]
    fn sums_to_one_and_follows_the_slice() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut right = 0;
        for k in 0..2000 {
            let n = 4 + k % 13;
            let slice_pick = (k % 10 == 0).then_some(n - 1);
            let view = TeacherView {
                options: n,
                answer: 0,
                slice_pick,
                plausible: &[1],
                p_right: 0.9,
            };
            let p = teacher_probs(&mut rng, &view);
            assert_eq!(p.len(), n);
            assert!(p.iter().all(|&x| (0.0..=1.0).contains(&x)), "{p:?}");
            assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-3, "{p:?}");
            if let Some(pick) = slice_pick {
                assert_eq!(argmax(&p), pick);
                assert!(p[pick] >= 0.69, "slice picks are confident: {p:?}");
            } else if argmax(&p) == 0 {
                right += 1;
            }
        }
        // 1800 non-slice states at p_right 0.9: expect 1620, binomial sd ~13.
        assert!((1560..=1680).contains(&right), "{right}");
    }
}
