//! The model library: everything needed to load, run, adapt and save a Qwen3 decision model,
//! and nothing of training. The trainer, export, eval and `decision score` are its clients.
//!
//! - [`config`]: Qwen3's `config.json`; [`qwen3`]: the network in Burn;
//! - [`weights`]: safetensors in and out (sharded, bf16/f16/f32), one tensor at a time;
//!   [`hub`]: Hugging Face Hub ids and the local cache; [`random_checkpoint`]: random
//!   checkpoints laid out as a download (tests, benchmarks);
//! - [`lora`]: LoRA adapters on the projections (Burn side) and [`peft`]: their PEFT files;
//! - [`backend`]: CPU (flex) and GPU (wgpu) devices and precisions; `gpu_watch`: a GPU runtime
//!   thread's panic ends the process with an error, not a hang; [`f16_safety`]: finite
//!   checks of f16 products; `flash`: attention in tiles on the CPU (forward and backward);
//!   `blocked_attention`: attention in blocks of query rows on any backend (a GPU's);
//!   `cpu_ops`: the untaped forward's element-wise work on the CPU, fused; `bf16_gemm`: products
//!   with a frozen bf16 weight by AVX512_BF16;
//! - [`decision_model`]: a model with its tokenizer and decision config;
//!   [`score`]: option logits and probabilities.

pub mod backend;
#[cfg(target_arch = "x86_64")]
pub(crate) mod bf16_gemm;
pub(crate) mod blocked_attention;
pub mod config;
pub(crate) mod cpu_ops;
pub(crate) mod decision_model;
pub(crate) mod f16_safety;
pub(crate) mod flash;
pub(crate) mod gpu_watch;
pub mod host_memory;
pub mod hub;
pub mod lora;
pub mod peft;
pub mod qwen3;
pub mod random_checkpoint;
pub(crate) mod reduce;
pub mod score;
pub mod weights;
