//! The facts of a Qwen3 `config.json` that the exported graph depends on.
//!
//! Both spellings of the RoPE base are accepted: `rope_theta` at the top level (the Hub's Qwen3
//! checkpoints) and `rope_parameters.rope_theta` (what transformers 5 writes). Anything the graph
//! cannot reproduce exactly (another `model_type`, RoPE scaling, sliding-window layers, an activation
//! other than SiLU) is refused with a message that names the field.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The architecture hyper-parameters of a Qwen3 decoder (`Qwen3ForCausalLM`).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head width; need not equal `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// Whether q/k/v/o projections carry a bias (`attention_bias`, false for released Qwen3).
    pub attention_bias: bool,
    pub max_position_embeddings: usize,
}

impl Qwen3Config {
    /// Read `config.json` from a model folder (or the file itself).
    pub fn load(path: &Path) -> Result<Self> {
        let file = if path.is_dir() {
            path.join("config.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", file.display()))?;
        Self::from_json(&value)
            .with_context(|| format!("{}: not a usable Qwen3 config", file.display()))
    }

    pub fn from_json(v: &Value) -> Result<Self> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "qwen3" {
            bail!("field `model_type` is {model_type:?}; only \"qwen3\" can be exported");
        }
        let usize_field = |name: &str| -> Result<usize> {
            v.get(name)
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .with_context(|| format!("field `{name}` is missing or not a non-negative integer"))
        };
        let hidden_size = usize_field("hidden_size")?;
        let num_attention_heads = usize_field("num_attention_heads")?;
        let num_key_value_heads = match v.get("num_key_value_heads") {
            Some(Value::Null) | None => num_attention_heads,
            Some(_) => usize_field("num_key_value_heads")?,
        };
        let head_dim = match v.get("head_dim") {
            Some(Value::Null) | None => hidden_size / num_attention_heads.max(1),
            Some(_) => usize_field("head_dim")?,
        };
        let rope = v.get("rope_parameters").filter(|r| !r.is_null());
        let rope_theta = v
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| {
                rope.and_then(|r| r.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10_000.0);
        let rope_type = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if rope_type != "default" {
            bail!(
                "field `rope_parameters.rope_type` is {rope_type:?}; only default RoPE is exported"
            );
        }
        if let Some(scaling) = v.get("rope_scaling").filter(|s| !s.is_null()) {
            bail!("field `rope_scaling` is {scaling}; RoPE scaling is not exported");
        }
        if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            bail!("field `use_sliding_window` is true; sliding-window attention is not exported");
        }
        if let Some(types) = v.get("layer_types").and_then(Value::as_array)
            && let Some(bad) = types
                .iter()
                .position(|t| t.as_str() != Some("full_attention"))
        {
            bail!(
                "field `layer_types[{bad}]` is {}; only full attention is exported",
                types[bad]
            );
        }
        let act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            bail!("field `hidden_act` is {act:?}; only \"silu\" is exported");
        }
        let cfg = Self {
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            attention_bias: v
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            max_position_embeddings: v
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(32_768) as usize,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            bail!("`num_attention_heads` and `num_key_value_heads` must be positive");
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "`num_attention_heads` ({}) is not a multiple of `num_key_value_heads` ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            bail!(
                "`head_dim` ({}) must be even and positive for rotary embedding",
                self.head_dim
            );
        }
        Ok(())
    }

    /// Number of parameters of the model as stored (tied embeddings counted once).
    pub fn parameter_count(&self) -> u64 {
        let (h, i, v) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
        );
        let q = (self.num_attention_heads * self.head_dim) as u64;
        let kv = (self.num_key_value_heads * self.head_dim) as u64;
        let bias = if self.attention_bias {
            q + 2 * kv + h
        } else {
            0
        };
        let attn = h * q + 2 * h * kv + q * h + bias + 2 * self.head_dim as u64;
        let mlp = 3 * h * i;
        let layer = attn + mlp + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers as u64 * layer + h + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 8, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
               "rope_parameters": {"rope_theta": 5000.0, "rope_type": "default"}})
    }

    #[test]
    fn reads_both_rope_spellings_and_refuses_what_it_cannot_export() {
        let cfg = Qwen3Config::from_json(&base()).unwrap();
        assert_eq!(cfg.rope_theta, 5000.0);
        let mut top = base();
        top["rope_theta"] = json!(1e6);
        top.as_object_mut().unwrap().remove("rope_parameters");
        assert_eq!(Qwen3Config::from_json(&top).unwrap().rope_theta, 1e6);

        let mut llama = base();
        llama["model_type"] = json!("llama");
        let err = Qwen3Config::from_json(&llama).unwrap_err().to_string();
        assert!(err.contains("model_type") && err.contains("llama"), "{err}");

        let mut scaled = base();
        scaled["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        assert!(
            Qwen3Config::from_json(&scaled)
                .unwrap_err()
                .to_string()
                .contains("rope_scaling")
        );

        let mut odd = base();
        odd["num_key_value_heads"] = json!(3);
        assert!(
            Qwen3Config::from_json(&odd)
                .unwrap_err()
                .to_string()
                .contains("multiple")
        );
    }
}
