//! Named weights, read one tensor at a time: the training crate's one safetensors reader and
//! [`WeightSource`] trait (a writer asks the source for each tensor, as f32, when it writes it).
//! A Hugging Face checkpoint is memory-mapped ([`SafetensorsDir`]); LoRA merging wraps a source
//! ([`crate::lora::MergedSource`]); tests and derived tensors use [`MemorySource`].

pub use decision_train::weights::{
    Checkpoint as SafetensorsDir, MemorySource, WeightSource, decode_f32,
};
