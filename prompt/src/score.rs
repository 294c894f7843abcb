//! The arithmetic from label logits to probabilities, shared by `decision score` (Burn logits)
//! and `decision-worker` (model.onnx logits), so both calibrate alike.

/// Softmax of `logits / t`, computed in f64; returns the probabilities and the scaled logits.
pub fn softmax_t(logits: &[f64], t: f64) -> (Vec<f64>, Vec<f64>) {
    let scaled: Vec<f64> = logits.iter().map(|l| l / t).collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scaled.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    (exps.iter().map(|e| e / sum).collect(), scaled)
}
