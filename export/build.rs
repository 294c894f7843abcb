//! Generates the ONNX message types from `proto/onnx.proto` (our own minimal subset of the spec).
//! `protox` compiles the .proto in pure Rust, so no system `protoc` is needed.
//! Also the Core ML message types from `proto/coreml/*.proto` (our subset of Apple's Model.proto,
//! FeatureTypes.proto and MIL.proto), with ordered maps so a model file's bytes are reproducible.
//! And `TRACT_ONNX_VERSION`, the tract-onnx the workspace's Cargo.lock resolved, which the parity
//! gate names as its runtime.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let descriptors = protox::compile(["proto/onnx.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;

    println!("cargo:rerun-if-changed=proto/coreml");
    let coreml = protox::compile(["Model.proto"], ["proto/coreml"])?;
    let mut config = prost_build::Config::new();
    config.btree_map(["."]);
    config.compile_fds(coreml)?;

    println!("cargo:rerun-if-changed=../Cargo.lock");
    let lock = std::fs::read_to_string("../Cargo.lock")
        .map_err(|e| format!("reading the workspace's Cargo.lock for tract-onnx's version: {e}"))?;
    println!(
        "cargo:rustc-env=TRACT_ONNX_VERSION={}",
        locked_version(&lock, "tract-onnx")?
    );
    Ok(())
}

/// The one version of `name` a Cargo.lock holds (`[[package]]`, `name = "…"`, `version = "…"`).
fn locked_version(lock: &str, name: &str) -> Result<String, String> {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines().map(str::trim);
    let mut found = Vec::new();
    while let Some(line) = lines.next() {
        if line == wanted
            && let Some(v) = lines
                .next()
                .and_then(|l| l.strip_prefix("version = \""))
                .and_then(|l| l.strip_suffix('"'))
        {
            found.push(v.to_string());
        }
    }
    match found.as_slice() {
        [v] => Ok(v.clone()),
        [] => Err(format!("Cargo.lock has no package {name}")),
        many => Err(format!(
            "Cargo.lock has {name} at several versions: {many:?}"
        )),
    }
}
