//! Expected calibration error, the one computation behind training's metrics and plots and the
//! refit's per-point report: over confidence bins, `Σ n_b / N · |accuracy_b − confidence_b|`.

/// ECE from bins given as `(n, accuracy, confidence)`: how many picks fell in the bin, the share
/// of them that were right and their mean confidence. Empty bins weigh nothing; `None` when no
/// bin holds a pick.
pub fn expected_calibration_error(bins: impl IntoIterator<Item = (u64, f64, f64)>) -> Option<f64> {
    let bins: Vec<(u64, f64, f64)> = bins.into_iter().filter(|(n, _, _)| *n > 0).collect();
    let total: u64 = bins.iter().map(|(n, _, _)| n).sum();
    (total > 0).then(|| {
        bins.iter()
            .map(|&(n, acc, conf)| n as f64 / total as f64 * (acc - conf).abs())
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two bins: 30 picks at confidence 0.9 of which 60 % right, 10 at 0.5 all right:
    /// (30·0.3 + 10·0.5) / 40.
    #[test]
    fn weighs_each_bin_by_its_share_of_picks() {
        let e = expected_calibration_error([(30, 0.6, 0.9), (0, 0.0, 0.0), (10, 1.0, 0.5)]);
        assert!((e.unwrap() - (30.0 * 0.3 + 10.0 * 0.5) / 40.0).abs() < 1e-12);
        assert_eq!(expected_calibration_error([(0, 0.0, 0.3)]), None);
        assert_eq!(expected_calibration_error([(5, 0.7, 0.7)]), Some(0.0));
    }
}
