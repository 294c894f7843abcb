//! `bundle verify` runs the bundle's own model on the probe states the export stored
//! (`probes.jsonl`) and holds it to the recorded answers: a bundle whose weights were rewritten
//! fails even when its manifest's hashes and parity claims were rewritten to match.

use std::path::Path;

use decision_export::onnx::probes::{PROBES_FILE, ProbeFile};
use decision_export::onnx::{self, pb, read_model};
use decision_export::verify::verify;
use decision_export::{ExportOptions, run};
use prost::Message;
use serde_json::Value;

#[path = "support/options.rs"]
mod support;
use support::options;

fn export(out: &Path, external_data: bool) {
    run(&ExportOptions {
        external_data,
        ..options("tiny", out)
    })
    .unwrap();
}

/// Update the manifest's size and hash of `file`, as someone covering their tracks would.
fn rehash(bundle: &Path, file: &str) {
    let path = bundle.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (bytes, sha) = decision_export::bundle::hash_file(&bundle.join(file)).unwrap();
    let entry = m["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["path"] == file)
        .unwrap_or_else(|| panic!("{file} not in the manifest"));
    entry["bytes"] = bytes.into();
    entry["sha256"] = sha.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// The model's MLP weight matrices (the tensors a rewrite below negates).
fn mlp_weights(model: &pb::ModelProto) -> Vec<usize> {
    let g = model.graph.as_ref().unwrap();
    let picked: Vec<usize> = (0..g.initializer.len())
        .filter(|&i| {
            let t = &g.initializer[i];
            t.name.contains("mlp") && t.dims.len() == 2 && !t.name.starts_with("const/")
        })
        .collect();
    assert!(!picked.is_empty(), "no MLP weights in model.onnx");
    picked
}

fn negate_f32(bytes: &mut [u8]) {
    for c in bytes.chunks_exact_mut(4) {
        let x = -f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        c.copy_from_slice(&x.to_le_bytes());
    }
}

/// Every problem is the probe check's, and it names a probe that missed.
fn assert_only_the_probes_caught_it(bundle: &Path) {
    let v = verify(bundle);
    assert!(!v.ok(), "a rewritten model verified");
    assert!(
        v.problems.iter().all(|p| p.starts_with("probes.jsonl: ")),
        "{:?}",
        v.problems
    );
    assert!(
        v.problems
            .iter()
            .any(|p| p.contains("probe probe-") && p.contains("max |Δp|")),
        "{:?}",
        v.problems
    );
}

#[test]
fn verify_reruns_the_probes_and_catches_weights_rewritten_with_their_hashes() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("bundle");
    export(&out, false);
    let v = verify(&out);
    assert!(v.ok(), "{:?}", v.problems);

    // The probes reach the widest decision the model takes (the tiny model's default 26).
    // JSON Lines: a header line, then a probe a line
    let bytes = std::fs::read(out.join(PROBES_FILE)).unwrap();
    let probes = ProbeFile::parse(&bytes).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(text.lines().count(), 1 + probes.probes.len());
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["schema"], "decision-probes/1");
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("decision.json")).unwrap()).unwrap();
    let max_options = spec["max_options"].as_u64().unwrap() as usize;
    assert!(max_options > 6);
    let widths: std::collections::BTreeSet<usize> = probes
        .probes
        .iter()
        .map(|p| p.option_token_ids.len())
        .collect();
    assert_eq!(widths.first(), Some(&2));
    assert_eq!(widths.last(), Some(&max_options));
    assert!(probes.probes.iter().any(|p| p.id == "probe-tool-26"));

    // Negated MLP weights in model.onnx, the manifest's hash and size updated to match; the
    // manifest still claims the parity check passed.
    let path = out.join(onnx::MODEL_FILE);
    let original = std::fs::read(&path).unwrap();
    let mut model = read_model(&path).unwrap();
    for i in mlp_weights(&model) {
        let t = &mut model.graph.as_mut().unwrap().initializer[i];
        assert!(!t.raw_data.is_empty(), "{} has no raw data", t.name);
        negate_f32(&mut t.raw_data);
    }
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    rehash(&out, onnx::MODEL_FILE);
    assert_only_the_probes_caught_it(&out);
    std::fs::write(&path, &original).unwrap();
    rehash(&out, onnx::MODEL_FILE);
    assert!(verify(&out).ok());

    // Probes that stop at 6 options, rehashed: too narrow for max_options.
    let probes_path = out.join(PROBES_FILE);
    let mut narrow = probes.clone();
    narrow.probes.retain(|p| p.option_token_ids.len() <= 6);
    std::fs::write(&probes_path, narrow.to_jsonl().unwrap()).unwrap();
    rehash(&out, PROBES_FILE);
    let v = verify(&out);
    assert_eq!(
        v.problems,
        [format!(
            "probes.jsonl: the widest probe has 6 options; decision.json's max_options is \
             {max_options}"
        )]
    );

    // A line that is not a probe is named.
    let mut torn = narrow.to_jsonl().unwrap();
    torn.extend_from_slice(b"{\"id\": \"probe-x\"\n");
    std::fs::write(&probes_path, &torn).unwrap();
    rehash(&out, PROBES_FILE);
    let v = verify(&out);
    let last = 2 + narrow.probes.len();
    assert!(
        v.problems.len() == 1 && v.problems[0].contains(&format!("line {last}: not a probe")),
        "{:?}",
        v.problems
    );

    // A bundle exported before the probe file was JSON Lines: told to export again.
    let mpath = out.join("manifest.json");
    let original_manifest = std::fs::read(&mpath).unwrap();
    let mut m: Value = serde_json::from_slice(&original_manifest).unwrap();
    for f in m["files"].as_array_mut().unwrap() {
        if f["path"] == PROBES_FILE {
            f["path"] = "probes.json".into();
        }
    }
    std::fs::rename(&probes_path, out.join("probes.json")).unwrap();
    std::fs::write(&mpath, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let v = verify(&out);
    assert!(
        v.problems.iter().any(|p| p
            .starts_with("probes.jsonl: missing: the bundle holds probes.json")
            && p.contains("export it again")),
        "{:?}",
        v.problems
    );
    std::fs::rename(out.join("probes.json"), &probes_path).unwrap();
    std::fs::write(&mpath, &original_manifest).unwrap();

    // No probes at all (file and manifest entry gone): refused, not skipped.
    std::fs::remove_file(&probes_path).unwrap();
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
    m["files"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["path"] != PROBES_FILE);
    std::fs::write(&mpath, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let v = verify(&out);
    assert_eq!(v.problems.len(), 1, "{:?}", v.problems);
    assert!(
        v.problems[0].starts_with("probes.jsonl: missing"),
        "{:?}",
        v.problems
    );
}

#[test]
fn verify_catches_rewritten_external_data_with_its_hash() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("bundle");
    export(&out, true);
    assert!(verify(&out).ok());
    let model = read_model(&out.join(onnx::MODEL_FILE)).unwrap();
    let data_path = out.join(onnx::DATA_FILE);
    let mut data = std::fs::read(&data_path).unwrap();
    let g = model.graph.as_ref().unwrap();
    for i in mlp_weights(&model) {
        let t = &g.initializer[i];
        let get = |k: &str| -> usize {
            t.external_data
                .iter()
                .find(|e| e.key == k)
                .map(|e| e.value.parse().unwrap())
                .unwrap_or(0)
        };
        let (offset, length) = (get("offset"), get("length"));
        assert!(length > 0, "{} is not in the external data", t.name);
        negate_f32(&mut data[offset..offset + length]);
    }
    std::fs::write(&data_path, &data).unwrap();
    rehash(&out, onnx::DATA_FILE);
    assert_only_the_probes_caught_it(&out);
}
