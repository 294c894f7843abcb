//! A folder's files and their hashes, as the bundle manifest names them: paths relative to the
//! folder with `/` between parts, sorted; SHA-256 read in constant memory. Written by `decision
//! export`, checked by `decision bundle verify` and by decision-worker.

use std::path::Path;

use anyhow::{Context, Result};

/// Every file under `dir`, as `/`-separated paths relative to it, sorted.
pub fn relative_files(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                walk(root, &path, out)?;
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// Size and SHA-256 (lowercase hex) of a file.
pub fn hash_file(path: &Path) -> Result<(u64, String)> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (hex, n) = crate::stable_hash::sha256_hex(file)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok((n, hex))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_relative_slash_separated_and_sorted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b/c")).unwrap();
        std::fs::write(dir.path().join("b/c/x.bin"), b"abc").unwrap();
        std::fs::write(dir.path().join("a.txt"), b"").unwrap();
        assert_eq!(
            relative_files(dir.path()).unwrap(),
            vec!["a.txt".to_string(), "b/c/x.bin".to_string()]
        );
        let (n, h) = hash_file(&dir.path().join("b/c/x.bin")).unwrap();
        assert_eq!(n, 3);
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
