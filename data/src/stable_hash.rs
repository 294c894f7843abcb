//! Hashes that never change between runs, machines or Rust versions (unlike std's
//! `DefaultHasher`). Splits and duplicate detection depend on them, so a change here would move
//! tasks between splits: the tests pin known values.

use sha2::{Digest, Sha256};

const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// FNV-1a, 128 bits: wide enough that two different ids colliding is not a practical concern
/// (about 1e-25 for ten million ids), so a set of these stands in for a set of the strings.
pub fn fnv1a_128(bytes: &[u8]) -> u128 {
    bytes.iter().fold(FNV128_OFFSET, |h, &b| {
        (h ^ u128::from(b)).wrapping_mul(FNV128_PRIME)
    })
}

/// A string placed on `[0, 1)`: the first 8 bytes of its SHA-256 (big-endian), top 53 bits.
/// Easy to reproduce elsewhere:
/// `int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big") >> 11) / 2**53` in Python.
/// (FNV's high bits barely move with the last byte, so `task-1`, `task-2`, ... would cluster.)
pub fn unit_interval(s: &str) -> f64 {
    let digest = Sha256::digest(s.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64
}

/// SHA-256 of everything `reader` yields, as lowercase hex, with the number of bytes read. Reads
/// in 1 MiB pieces, so a file of any size is hashed in constant memory.
pub fn sha256_hex(mut reader: impl std::io::Read) -> std::io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                hasher.update(&buf[..k]);
                n += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((hex, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn fnv_matches_published_vectors() {
        // Reference values of the FNV specification (draft-eastlake-fnv).
        assert_eq!(fnv1a_128(b""), FNV128_OFFSET);
        assert_eq!(fnv1a_128(b"a"), 0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964);
        assert_ne!(fnv1a_128(b"id-1"), fnv1a_128(b"id-2"));
    }

    #[test]
    fn sha256_matches_published_vectors() {
        // FIPS 180-2 examples: "abc", and a million "a"s streamed from a reader.
        assert_eq!(
            sha256_hex(&b"abc"[..]).unwrap(),
            (
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".to_string(),
                3
            )
        );
        let million = std::io::repeat(b'a').take(1_000_000);
        assert_eq!(
            sha256_hex(million).unwrap(),
            (
                "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0".to_string(),
                1_000_000
            )
        );
    }

    #[test]
    fn unit_interval_matches_python_reference() {
        // Values from the Python one-liner in the doc comment.
        for (s, u) in [
            ("task-0", 0.375_020_251_111_399_03),
            ("order-1", 0.045_652_516_498_032_036),
            ("", 0.889_415_994_891_337_3),
        ] {
            assert!(
                (unit_interval(s) - u).abs() < 1e-15,
                "{s}: {} vs {u}",
                unit_interval(s)
            );
        }
    }
}
