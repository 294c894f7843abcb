//! The model architecture, read from a Hugging Face `config.json` (`Qwen3ForCausalLM`) and written
//! back in the same shape so that `transformers` loads what we save.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// More layers than any released decoder has (Qwen3's largest has 94).
pub(crate) const MAX_LAYERS: usize = 1024;
/// More weights (2^40, about 1.1 trillion) than any model this project trains or exports.
pub(crate) const MAX_PARAMETERS: usize = 1 << 40;

/// The architecture of a Qwen3 decoder. Field names follow Hugging Face's `Qwen3Config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head size; need not equal `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Biases on the q/k/v/o projections (false for every released Qwen3).
    #[serde(default)]
    pub attention_bias: bool,
}

impl Qwen3Config {
    /// Read `config.json` (the file, or a model folder holding it); anything that is not a plain
    /// Qwen3 decoder is refused with the reason. The training crate and the exporters share this
    /// reader, so what trains is exactly what exports.
    pub fn from_file(path: &Path) -> Result<Self> {
        let joined;
        let path = if path.is_dir() {
            joined = path.join("config.json");
            joined.as_path()
        } else {
            path
        };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
        Self::from_json(&value)
            .with_context(|| format!("{}: unsupported model config", path.display()))
    }

    /// Parse a `config.json` value. Accepts both the `rope_theta` key of transformers 4 and the
    /// `rope_parameters` object of transformers 5.
    pub fn from_json(v: &Value) -> Result<Self> {
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("<missing>");
        if model_type != "qwen3" {
            bail!(
                "model_type is {model_type:?}; only \"qwen3\" (Qwen3ForCausalLM) is supported. \
                 Qwen2, Qwen3-MoE and other architectures differ in ways this decoder does not model"
            );
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
            None | Some(Value::Null) => num_attention_heads,
            Some(_) => usize_field("num_key_value_heads")?,
        };
        let head_dim = match v.get("head_dim") {
            None | Some(Value::Null) => {
                if num_attention_heads == 0 {
                    bail!("field `num_attention_heads` is 0");
                }
                hidden_size / num_attention_heads
            }
            Some(_) => usize_field("head_dim")?,
        };
        let f64_field = |name: &str, default: Option<f64>| -> Result<f64> {
            match v.get(name) {
                None | Some(Value::Null) => {
                    default.with_context(|| format!("field `{name}` is missing"))
                }
                Some(x) => x
                    .as_f64()
                    .with_context(|| format!("field `{name}` is not a number")),
            }
        };
        let rope_theta = rope_theta(v)?;
        let act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            bail!("hidden_act is {act:?}; Qwen3's MLP uses \"silu\"");
        }
        if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            bail!("use_sliding_window is true; sliding-window attention is not supported");
        }
        if let Some(types) = v.get("layer_types").and_then(Value::as_array)
            && let Some(bad) = types
                .iter()
                .position(|t| t.as_str() != Some("full_attention"))
        {
            bail!(
                "field `layer_types[{bad}]` is {}; only full attention is supported",
                types[bad]
            );
        }
        let config = Qwen3Config {
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f64_field("rms_norm_eps", Some(1e-6))?,
            rope_theta,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            max_position_embeddings: match v.get("max_position_embeddings") {
                None | Some(Value::Null) => 32768,
                Some(_) => usize_field("max_position_embeddings")?,
            },
            attention_bias: v
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }

    /// Structural checks that the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        for (name, n) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if n == 0 {
                bail!("field `{name}` is 0");
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!(
                "head_dim ({}) must be even for rotary embeddings",
                self.head_dim
            );
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.rms_norm_eps) || !positive(self.rope_theta) {
            bail!("rms_norm_eps and rope_theta must be positive");
        }
        // Sizes beyond any model this decoder can hold: the tensor list, the parameter count
        // and the memory plan are computed from them before a weight is read.
        if self.num_hidden_layers > MAX_LAYERS {
            bail!(
                "num_hidden_layers is {}; more than {MAX_LAYERS} layers is not a model this decoder \
                 can hold",
                self.num_hidden_layers
            );
        }
        match self.checked_parameter_count() {
            Some(n) if n <= MAX_PARAMETERS => {}
            _ => bail!(
                "the sizes (vocab_size {}, hidden_size {}, intermediate_size {}, {} layers, {} x {} \
                 query and {} key/value heads) make more than {MAX_PARAMETERS} weights; not a model \
                 this decoder can hold",
                self.vocab_size,
                self.hidden_size,
                self.intermediate_size,
                self.num_hidden_layers,
                self.num_attention_heads,
                self.head_dim,
                self.num_key_value_heads
            ),
        }
        Ok(())
    }

    /// The `config.json` that `transformers` reads back as this architecture. Both spellings of
    /// the RoPE base are written so that transformers 4 and 5 agree.
    pub fn to_hf_json(&self) -> Value {
        json!({
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "use_sliding_window": false,
            "sliding_window": null,
            "torch_dtype": "float32",
        })
    }

    /// Number of weights (embedding counted once when tied); `usize::MAX` for sizes that
    /// [`Qwen3Config::validate`] refuses because the count overflows.
    pub fn parameter_count(&self) -> usize {
        self.checked_parameter_count().unwrap_or(usize::MAX)
    }

    fn checked_parameter_count(&self) -> Option<usize> {
        let h = self.hidden_size;
        let q = self.num_attention_heads.checked_mul(self.head_dim)?;
        let kv = self.num_key_value_heads.checked_mul(self.head_dim)?;
        let bias = if self.attention_bias {
            q.checked_add(kv.checked_mul(2)?)?.checked_add(h)?
        } else {
            0
        };
        let attn = [
            h.checked_mul(q)?,
            h.checked_mul(kv)?.checked_mul(2)?,
            q.checked_mul(h)?,
            bias,
            self.head_dim.checked_mul(2)?,
        ]
        .into_iter()
        .try_fold(0usize, usize::checked_add)?;
        let mlp = h.checked_mul(self.intermediate_size)?.checked_mul(3)?;
        let layer = attn.checked_add(mlp)?.checked_add(h.checked_mul(2)?)?;
        let embed = self.vocab_size.checked_mul(h)?;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed
            .checked_add(head)?
            .checked_add(self.num_hidden_layers.checked_mul(layer)?)?
            .checked_add(h)
    }
}

fn rope_theta(v: &Value) -> Result<f64> {
    // transformers 5: {"rope_parameters": {"rope_type": "default", "rope_theta": ...}};
    // transformers 4: "rope_theta" with an optional "rope_scaling" object.
    let scaling = match v.get("rope_parameters") {
        Some(Value::Object(p)) => Some(p),
        _ => match v.get("rope_scaling") {
            Some(Value::Object(p)) => Some(p),
            _ => None,
        },
    };
    if let Some(p) = scaling {
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" {
            bail!("RoPE scaling {kind:?} is not supported (only the default rotary embedding)");
        }
        if let Some(theta) = p.get("rope_theta").and_then(Value::as_f64) {
            return Ok(theta);
        }
    }
    match v.get("rope_theta") {
        None | Some(Value::Null) => Ok(10000.0),
        Some(x) => x.as_f64().context("field `rope_theta` is not a number"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "model_type": "qwen3", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
            "head_dim": 12, "rms_norm_eps": 1e-6, "rope_theta": 5000.0,
            "tie_word_embeddings": true, "max_position_embeddings": 512
        })
    }

    /// Found by the fuzzer (fuzz/corpus/model-config/finding-*.json): sizes whose parameter
    /// count overflows panicked in `parameter_count` (debug builds; wrapped in release), and
    /// `num_hidden_layers: 2147483647` made `expected_tensors` list 25 billion tensors before a
    /// weight was read.
    #[test]
    fn sizes_past_any_model_are_refused() {
        let with = |k: &str, v: Value| {
            let mut j = base();
            j[k] = v;
            Qwen3Config::from_json(&j)
        };
        let huge_layers = with("num_hidden_layers", json!(2147483647u64)).unwrap_err();
        assert!(format!("{huge_layers:#}").contains("num_hidden_layers is 2147483647"));
        for (k, v) in [
            ("vocab_size", json!(u64::MAX)),
            ("hidden_size", json!(1u64 << 40)),
            ("intermediate_size", json!(u64::MAX / 2)),
            ("head_dim", json!(1u64 << 62)),
        ] {
            let e = with(k, v).unwrap_err();
            assert!(format!("{e:#}").contains("weights"), "{k}: {e:#}");
        }
        // The largest sizes still pass.
        let mut big = base();
        big["num_hidden_layers"] = json!(MAX_LAYERS);
        assert!(Qwen3Config::from_json(&big).is_ok());
    }

    #[test]
    fn reads_both_rope_spellings_and_round_trips() {
        let c = Qwen3Config::from_json(&base()).unwrap();
        assert_eq!(c.head_dim, 12);
        assert_eq!(c.rope_theta, 5000.0);
        let mut v5 = base();
        v5.as_object_mut().unwrap().remove("rope_theta");
        v5["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6});
        assert_eq!(Qwen3Config::from_json(&v5).unwrap().rope_theta, 1e6);
        assert_eq!(Qwen3Config::from_json(&c.to_hf_json()).unwrap(), c);
    }

    #[test]
    fn refuses_other_architectures_and_bad_shapes() {
        let mut v = base();
        v["model_type"] = json!("llama");
        let e = format!("{:#}", Qwen3Config::from_json(&v).unwrap_err());
        assert!(e.contains("\"llama\"") && e.contains("qwen3"), "{e}");

        let mut v = base();
        v["num_key_value_heads"] = json!(4);
        let e = format!("{:#}", Qwen3Config::from_json(&v).unwrap_err());
        assert!(e.contains("not a multiple"), "{e}");

        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let e = format!("{:#}", Qwen3Config::from_json(&v).unwrap_err());
        assert!(e.contains("yarn"), "{e}");

        let mut v = base();
        v.as_object_mut().unwrap().remove("vocab_size");
        let e = format!("{:#}", Qwen3Config::from_json(&v).unwrap_err());
        assert!(e.contains("vocab_size"), "{e}");

        let mut v = base();
        v["layer_types"] = json!(["full_attention", "sliding_attention"]);
        let e = format!("{:#}", Qwen3Config::from_json(&v).unwrap_err());
        assert!(e.contains("layer_types[1]"), "{e}");
        v["layer_types"] = json!(["full_attention", "full_attention"]);
        assert!(Qwen3Config::from_json(&v).is_ok());

        let mut v = base();
        v["hidden_act"] = json!("gelu");
        let e = format!("{:#}", Qwen3Config::from_json(&v).unwrap_err());
        assert!(e.contains("gelu"), "{e}");

        let mut v = base();
        v["use_sliding_window"] = json!(true);
        let e = format!("{:#}", Qwen3Config::from_json(&v).unwrap_err());
        assert!(e.contains("sliding"), "{e}");
    }

    #[test]
    fn parameter_count_matches_qwen3_0_6b() {
        // Qwen/Qwen3-0.6B: 596,049,920 weights (tied embeddings).
        let c = Qwen3Config {
            vocab_size: 151936,
            hidden_size: 1024,
            intermediate_size: 3072,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            tie_word_embeddings: true,
            max_position_embeddings: 40960,
            attention_bias: false,
        };
        assert_eq!(c.parameter_count(), 596_049_920);
    }
}
