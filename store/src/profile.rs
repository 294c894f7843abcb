//! The AWS shared profile files, which object_store does not read: when the environment names
//! no access key, the key, secret and session token of profile `AWS_PROFILE` (else `default`)
//! come from `AWS_SHARED_CREDENTIALS_FILE` (else `~/.aws/credentials`), and the region, when the
//! environment names none, from `AWS_CONFIG_FILE` (else `~/.aws/config`). Without either,
//! object_store goes on to instance metadata.

use std::collections::HashMap;
use std::path::PathBuf;

use object_store::aws::AmazonS3Builder;

/// The `key = value` pairs of section `[name]` of an INI file.
fn section(text: &str, name: &str) -> HashMap<String, String> {
    let mut inside = false;
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = s.trim() == name;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

fn file(var: &str, default: &str) -> Option<String> {
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?).join(default),
    };
    std::fs::read_to_string(path).ok()
}

fn set(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty())
}

/// `builder` (already filled from the environment) with what the profile files add.
pub(crate) fn aws(mut builder: AmazonS3Builder) -> AmazonS3Builder {
    let name = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    if !set("AWS_ACCESS_KEY_ID")
        && let Some(text) = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials")
    {
        let s = section(&text, &name);
        if let (Some(k), Some(v)) = (s.get("aws_access_key_id"), s.get("aws_secret_access_key")) {
            builder = builder.with_access_key_id(k).with_secret_access_key(v);
            if let Some(t) = s.get("aws_session_token") {
                builder = builder.with_token(t);
            }
        }
    }
    if !set("AWS_REGION")
        && !set("AWS_DEFAULT_REGION")
        && let Some(text) = file("AWS_CONFIG_FILE", ".aws/config")
    {
        let header = if name == "default" {
            name.clone()
        } else {
            format!("profile {name}")
        };
        if let Some(r) = section(&text, &header).get("region") {
            builder = builder.with_region(r);
        }
    }
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_read_and_others_are_not() {
        let text = "# c\n[default]\naws_access_key_id = AK\naws_secret_access_key=SK \n\n\
                    [profile work]\nregion = eu-west-1\n[other]\naws_access_key_id = X\n";
        let d = section(text, "default");
        assert_eq!(d.get("aws_access_key_id").map(String::as_str), Some("AK"));
        assert_eq!(
            d.get("aws_secret_access_key").map(String::as_str),
            Some("SK")
        );
        assert_eq!(d.len(), 2);
        let w = section(text, "profile work");
        assert_eq!(w.get("region").map(String::as_str), Some("eu-west-1"));
        assert!(section(text, "missing").is_empty());
    }
}
