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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_published_vectors() {
        // Reference values of the FNV specification (draft-eastlake-fnv).
        assert_eq!(fnv1a_128(b""), FNV128_OFFSET);
        assert_eq!(fnv1a_128(b"a"), 0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964);
        assert_ne!(fnv1a_128(b"id-1"), fnv1a_128(b"id-2"));
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
