//! Generates the ONNX message types from `proto/onnx.proto` (our own minimal subset of the spec).
//! `protox` compiles the .proto in pure Rust, so no system `protoc` is needed.
//! Also the Core ML message types from `proto/coreml/*.proto` (our subset of Apple's Model.proto,
//! FeatureTypes.proto and MIL.proto), with ordered maps so a model file's bytes are reproducible.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let descriptors = protox::compile(["proto/onnx.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;

    println!("cargo:rerun-if-changed=proto/coreml");
    let coreml = protox::compile(["Model.proto"], ["proto/coreml"])?;
    let mut config = prost_build::Config::new();
    config.btree_map(["."]);
    config.compile_fds(coreml)?;
    Ok(())
}
